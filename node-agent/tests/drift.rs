//! Drift over a fake /proc tree: a setting of the applied revision changed behind the agent's
//! back is found on the next reconcile, reported as the Drifted condition, and written again
//! (policy Reapply) or left as it is (policy Report); a revert restores the journal's originals
//! either way — also as a property over random drift.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use hoststack_agent::failures::SpecGeneration;
use hoststack_agent::hooks::Hooks;
use hoststack_agent::host::Host;
use hoststack_agent::intent::Intent;
use hoststack_agent::journal::{Entry, Journal, JournalStore};
use hoststack_agent::model::Setting;
use hoststack_agent::reconciler::{Next, Reconciler};
use hoststack_agent::report::{self, StatusInput, DRIFTED};
use hoststack_agent::transaction::{Outcome, Transactor};
use hoststack_crds::{
    DriftPolicy, ItemResult, Mode, NodeConfig, NodeState, NodeTuningStatus, SysctlValue,
};
use proptest::prelude::*;

/// A fake procfs (only `sys/`) and a state dir, both temporary.
struct FakeHost {
    proc_dir: tempfile::TempDir,
    state_dir: tempfile::TempDir,
}

impl FakeHost {
    fn new(sysctls: &[(&str, &str)]) -> Self {
        let host = FakeHost {
            proc_dir: tempfile::tempdir().expect("tempdir"),
            state_dir: tempfile::tempdir().expect("tempdir"),
        };
        for (key, value) in sysctls {
            host.put(key, value);
        }
        host
    }

    fn path(&self, key: &str) -> PathBuf {
        self.proc_dir
            .path()
            .join("sys")
            .join(key.split('.').collect::<PathBuf>())
    }

    /// Writes a value as the kernel prints it: the agent's own writes, or someone else's.
    fn put(&self, key: &str, value: &str) {
        let path = self.path(key);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, format!("{value}\n")).expect("write");
    }

    /// The files of the BASE sysctls, byte for byte.
    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        BASE.iter()
            .map(|(key, _)| {
                let bytes = fs::read(self.path(key)).unwrap_or_default();
                (key.to_string(), bytes)
            })
            .collect()
    }

    fn get(&self, key: &str) -> String {
        let raw = fs::read_to_string(self.path(key)).expect("read");
        raw.strip_suffix('\n').unwrap_or(&raw).to_string()
    }

    fn journal(&self) -> Journal {
        JournalStore::new(self.state_dir.path())
            .load()
            .expect("journal")
    }

    fn reconciler(&self) -> Reconciler {
        Reconciler::new(
            Transactor::new(
                Host::new(self.proc_dir.path(), self.proc_dir.path()),
                JournalStore::new(self.state_dir.path()),
            ),
            Hooks::default(),
        )
    }
}

const BASE: &[(&str, &str)] = &[
    ("net.ipv4.tcp_sack", "1"),
    ("net.core.somaxconn", "4096"),
    ("net.ipv4.tcp_rmem", "4096\t131072\t6291456"),
];

fn node_tuning(revision: &str, sysctls: &[(&str, &str)], policy: Option<DriftPolicy>) -> Intent {
    let mut config = NodeConfig {
        drift_policy: policy,
        ..NodeConfig::default()
    };
    for (k, v) in sysctls {
        config
            .sysctls
            .insert(k.to_string(), SysctlValue(v.to_string()));
    }
    // Named as the test names it: the check that a spec's config hashes to its revision is
    // `Intent::of`'s (node-agent/src/intent.rs), and these tests are about what comes after.
    Intent::Revision {
        tuning: "edge".into(),
        revision: revision.into(),
        config: Box::new(config),
        mode: Mode::default(),
    }
}

/// One reconcile as the controller runs it: whether a transaction ran, and the outcome.
fn reconcile(r: &mut Reconciler, desired: &Intent) -> (bool, Outcome) {
    match r.next(desired, &SpecGeneration::default()).expect("next") {
        Next::Report(outcome) => (false, outcome),
        Next::Transaction { .. } => (true, r.transact(desired, &SpecGeneration::default())),
    }
}

fn item<'a>(outcome: &'a Outcome, key: &str) -> &'a ItemResult {
    outcome
        .items
        .iter()
        .find(|i| i.target == key)
        .unwrap_or_else(|| panic!("no item {key} in {outcome:?}"))
}

/// The status the controller would write for this outcome and the reconciler's drift.
fn status_of(r: &Reconciler, desired: &Intent, outcome: &Outcome) -> NodeTuningStatus {
    report::status(&StatusInput {
        outcome,
        observed_revision: desired.revision(),
        drifted: r.drifted(),
        facts: None,
        health: None,
        previous: None,
        generation: Some(1),
        now: report::now(),
    })
}

fn drifted_condition(status: &NodeTuningStatus) -> (String, String, String) {
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == DRIFTED)
        .expect("a Drifted condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn originals() -> Vec<Entry> {
    vec![
        Entry::new(&Setting::sysctl("net.core.somaxconn"), "4096"),
        Entry::new(
            &Setting::sysctl("net.ipv4.tcp_rmem"),
            "4096\t131072\t6291456",
        ),
        Entry::new(&Setting::sysctl("net.ipv4.tcp_sack"), "1"),
    ]
}

const R1: &[(&str, &str)] = &[
    ("net.ipv4.tcp_sack", "0"),
    ("net.core.somaxconn", "8192"),
    ("net.ipv4.tcp_rmem", "4096 131072  6291456"),
];

#[test]
fn reapply_writes_the_desired_values_again_and_keeps_the_originals() {
    for policy in [None, Some(DriftPolicy::Reapply)] {
        let host = FakeHost::new(BASE);
        let mut r = host.reconciler();
        let desired = node_tuning("r1", R1, policy);
        let (ran, applied) = reconcile(&mut r, &desired);
        assert!(ran);
        assert_eq!(applied.state, NodeState::Applied);
        assert!(r.drifted().is_empty());
        let (status, reason, _) = drifted_condition(&status_of(&r, &desired, &applied));
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NoDrift"));

        // Someone sets a value of the revision back, another to a third value; the whitespace
        // of tcp_rmem does not count.
        host.put("net.ipv4.tcp_sack", "1");
        host.put("net.core.somaxconn", "1024");
        host.put("net.ipv4.tcp_rmem", "4096 131072 6291456");
        let Next::Transaction { applying } =
            r.next(&desired, &SpecGeneration::default()).expect("next")
        else {
            panic!("{policy:?}: drift must be re-applied");
        };
        let applying = applying.expect("an Applying status first");
        let (status, reason, message) = drifted_condition(&status_of(&r, &desired, &applying));
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Drifted"));
        assert_eq!(
            message,
            "sysctl net.core.somaxconn: desired 8192, found 1024; \
             sysctl net.ipv4.tcp_sack: desired 0, found 1"
        );
        let fixed = r.transact(&desired, &SpecGeneration::default());
        assert_eq!(fixed.state, NodeState::Applied, "{fixed:?}");
        assert_eq!(host.get("net.ipv4.tcp_sack"), "0");
        assert_eq!(host.get("net.core.somaxconn"), "8192");
        assert!(r.drifted().is_empty());
        assert_eq!(
            item(&fixed, "net.core.somaxconn").actual.as_deref(),
            Some("8192")
        );
        let (status, reason, _) = drifted_condition(&status_of(&r, &desired, &fixed));
        assert_eq!((status.as_str(), reason.as_str()), ("False", "NoDrift"));
        // The originals are the ones from before the first transaction, not the drifted values.
        assert_eq!(host.journal().originals, originals());

        // The revert restores the originals.
        let (_, reverted) = reconcile(&mut r, &Intent::Withdrawn);
        assert_eq!(reverted.state, NodeState::Reverted);
        for (key, value) in BASE {
            assert_eq!(host.get(key), *value, "{key}");
        }
        assert!(host.journal().is_empty());
    }
}

#[test]
fn report_changes_nothing_and_reports_until_the_host_matches_again() {
    let host = FakeHost::new(BASE);
    let mut r = host.reconciler();
    let desired = node_tuning("r1", R1, Some(DriftPolicy::Report));
    let (ran, applied) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(applied.state, NodeState::Applied);
    let journal = host.journal();

    host.put("net.core.somaxconn", "1024");
    for _ in 0..3 {
        let (ran, outcome) = reconcile(&mut r, &desired);
        assert!(!ran, "Report never writes");
        assert_eq!(outcome.state, NodeState::Applied);
        assert_eq!(host.get("net.core.somaxconn"), "1024");
        assert_eq!(host.journal(), journal, "the journal is left as it was");
        let somaxconn = item(&outcome, "net.core.somaxconn");
        assert_eq!(somaxconn.actual.as_deref(), Some("1024"));
        assert_eq!(somaxconn.desired.as_deref(), Some("8192"));
        assert_eq!(somaxconn.original.as_deref(), Some("4096"));
        let status = status_of(&r, &desired, &outcome);
        let (s, reason, message) = drifted_condition(&status);
        assert_eq!((s.as_str(), reason.as_str()), ("True", "Drifted"));
        assert_eq!(
            message,
            "sysctl net.core.somaxconn: desired 8192, found 1024"
        );
    }

    // The host matches again (someone put the value back): NoDrift, actual up to date.
    host.put("net.core.somaxconn", "8192");
    let (ran, outcome) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert!(r.drifted().is_empty());
    assert_eq!(
        item(&outcome, "net.core.somaxconn").actual.as_deref(),
        Some("8192")
    );
    let (s, reason, _) = drifted_condition(&status_of(&r, &desired, &outcome));
    assert_eq!((s.as_str(), reason.as_str()), ("False", "NoDrift"));

    // A setting that vanished is drift too, not a failure.
    fs::remove_file(host.path("net.ipv4.tcp_sack")).expect("rm");
    let (ran, outcome) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(outcome.state, NodeState::Applied);
    let (_, _, message) = drifted_condition(&status_of(&r, &desired, &outcome));
    assert!(
        message.starts_with("sysctl net.ipv4.tcp_sack: desired 0, found nothing (no such sysctl"),
        "{message}"
    );
    host.put("net.ipv4.tcp_sack", "0");

    // Drifted again, then the spec changes: the new revision is applied in full, the
    // originals are the first ones.
    host.put("net.core.somaxconn", "1024");
    reconcile(&mut r, &desired);
    assert_eq!(r.drifted().len(), 1);
    let r2 = node_tuning(
        "r2",
        &[("net.core.somaxconn", "2048"), ("net.ipv4.tcp_sack", "0")],
        Some(DriftPolicy::Report),
    );
    let (ran, outcome) = reconcile(&mut r, &r2);
    assert!(ran);
    assert_eq!(outcome.state, NodeState::Applied);
    assert!(r.drifted().is_empty());
    assert_eq!(host.get("net.core.somaxconn"), "2048");
    assert_eq!(host.get("net.ipv4.tcp_rmem"), "4096\t131072\t6291456");
    assert_eq!(
        host.journal()
            .original(&Setting::sysctl("net.core.somaxconn")),
        Some("4096")
    );
}

#[test]
fn a_revert_restores_the_originals_of_a_drifted_host() {
    let host = FakeHost::new(BASE);
    let mut r = host.reconciler();
    let desired = node_tuning("r1", R1, Some(DriftPolicy::Report));
    reconcile(&mut r, &desired);
    host.put("net.core.somaxconn", "1024");
    host.put("net.ipv4.tcp_sack", "1");
    let (ran, _) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(r.drifted().len(), 2);

    let (ran, reverted) = reconcile(&mut r, &Intent::Withdrawn);
    assert!(ran);
    assert_eq!(reverted.state, NodeState::Reverted);
    assert!(r.drifted().is_empty());
    assert_eq!(
        host.get("net.core.somaxconn"),
        "4096",
        "the original, not 1024"
    );
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    assert_eq!(host.get("net.ipv4.tcp_rmem"), "4096\t131072\t6291456");
    assert!(host.journal().is_empty());
}

#[test]
fn a_reapply_the_kernel_refuses_fails_all_or_nothing_until_the_host_matches_again() {
    let host = FakeHost::new(BASE);
    let mut r = host.reconciler();
    let desired = node_tuning("r1", R1, None);
    reconcile(&mut r, &desired);
    host.put("net.ipv4.tcp_sack", "1");
    // From now on the "kernel" refuses writes to somaxconn (EIO), and someone changed it.
    let path = host.path("net.core.somaxconn");
    fs::remove_file(&path).expect("rm");
    std::os::unix::fs::symlink("/proc/version", &path).expect("symlink");
    let journal = host.journal();
    let (ran, failed) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(failed.state, NodeState::Failed, "{failed:?}");
    // All or nothing: somaxconn (written first) failed, so tcp_sack was never written.
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    assert_eq!(host.journal(), journal);
    assert!(!r.drifted().is_empty());
    let (s, _, message) = drifted_condition(&status_of(&r, &desired, &failed));
    assert_eq!(s, "True");
    assert!(
        message.contains("net.ipv4.tcp_sack: desired 0, found 1"),
        "{message}"
    );

    // Like any failed revision it is not retried; the drift is reported as it is now.
    host.put("net.ipv4.tcp_sack", "2");
    let (ran, still) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(still.state, NodeState::Failed);
    let (_, _, message) = drifted_condition(&status_of(&r, &desired, &still));
    assert!(
        message.contains("net.ipv4.tcp_sack: desired 0, found 2"),
        "{message}"
    );

    // Someone puts the values back by hand: the revision holds again, with nothing written.
    fs::remove_file(&path).expect("rm");
    host.put("net.core.somaxconn", "8192");
    host.put("net.ipv4.tcp_sack", "0");
    let (ran, settled) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(settled.state, NodeState::Applied, "{settled:?}");
    assert!(r.drifted().is_empty());
    assert_eq!(host.journal(), journal);
    // A later drift is re-applied again.
    host.put("net.ipv4.tcp_sack", "1");
    let (ran, fixed) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(fixed.state, NodeState::Applied);
    assert_eq!(host.get("net.ipv4.tcp_sack"), "0");
}

/// The keys random drift changes, and the values it writes (originals, desired and others).
const DRIFTING: [&str; 2] = ["net.ipv4.tcp_sack", "net.core.somaxconn"];
const DRIFT_VALUES: [&str; 6] = ["0", "1", "2", "1024", "4096", "8192"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever drifts: every drifted setting is reported, Report writes nothing, Reapply puts
    /// back exactly the applied bytes, and the revert afterwards restores the pristine host.
    #[test]
    fn whatever_drifts_the_policy_holds_and_a_revert_restores_the_originals(
        drift in prop::collection::vec(
            (0..DRIFTING.len(), prop::sample::select(&DRIFT_VALUES[..])),
            0..5,
        ),
        report in any::<bool>(),
    ) {
        let host = FakeHost::new(BASE);
        let pristine = host.snapshot();
        let mut r = host.reconciler();
        let policy = if report { DriftPolicy::Report } else { DriftPolicy::Reapply };
        let desired = node_tuning("r1", R1, Some(policy));
        let (_, applied) = reconcile(&mut r, &desired);
        prop_assert_eq!(applied.state, NodeState::Applied);
        let on_revision = host.snapshot();
        let journal = host.journal();

        for (key, value) in &drift {
            host.put(DRIFTING[*key], value);
        }
        let drifted_host = host.snapshot();
        let mut want: Vec<String> = R1
            .iter()
            .filter(|(key, value)| DRIFTING.contains(key) && host.get(key) != *value)
            .map(|(key, _)| key.to_string())
            .collect();
        want.sort();

        // What the reconcile finds, before it acts.
        let next = r.next(&desired, &SpecGeneration::default()).expect("next");
        let found: Vec<String> = r.drifted().iter().map(|d| d.setting.target.clone()).collect();
        prop_assert_eq!(&found, &want);
        let (ran, outcome) = match next {
            Next::Report(outcome) => (false, outcome),
            Next::Transaction { .. } => (true, r.transact(&desired, &SpecGeneration::default())),
        };
        let (s, _, message) = drifted_condition(&status_of(&r, &desired, &outcome));
        let still = report && !want.is_empty();
        prop_assert_eq!(s == "True", still);
        for key in &want {
            prop_assert_eq!(message.contains(&format!("sysctl {key}: desired ")), still);
        }
        prop_assert_eq!(outcome.state, NodeState::Applied);
        prop_assert_eq!(host.journal(), journal);
        if report || want.is_empty() {
            prop_assert!(!ran);
            prop_assert_eq!(host.snapshot(), drifted_host);
        } else {
            prop_assert!(ran);
            prop_assert_eq!(host.snapshot(), on_revision);
            prop_assert!(r.drifted().is_empty());
        }

        let (_, reverted) = reconcile(&mut r, &Intent::Withdrawn);
        prop_assert_eq!(reverted.state, NodeState::Reverted);
        prop_assert_eq!(host.snapshot(), pristine);
        prop_assert!(host.journal().is_empty());
    }
}
