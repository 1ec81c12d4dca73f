//! The transaction against a fake /proc tree in a temporary directory: all-or-nothing, undo on
//! refusal, recovery after a kill, and the law "apply then revert is the identity", also as a
//! property over random revisions and random kill points.

mod common;

use common::{killed, Killed};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::panic;
use std::path::{Path, PathBuf};

use hoststack_agent::failures::SpecGeneration;
use hoststack_agent::hooks::Hooks;
use hoststack_agent::host::Host;
use hoststack_agent::intent::Intent;
use hoststack_agent::journal::{Applied, Entry, Journal, JournalStore};
use hoststack_agent::model::{same_value, Setting};
use hoststack_agent::reconciler::{Next, Reconciler};
use hoststack_agent::transaction::{Goal, Outcome, Progress, Transactor};
use hoststack_crds::{
    ItemState, Mode, NodeConfig, NodeState, NodeTuning, NodeTuningSpec, SysctlValue, UserspaceStack,
};
use proptest::prelude::*;

/// A fake procfs (only `sys/`) and a state dir, both temporary.
struct FakeHost {
    proc_dir: tempfile::TempDir,
    state_dir: tempfile::TempDir,
}

impl FakeHost {
    /// A host with these sysctls, each file holding the value and a newline as the kernel
    /// prints it.
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

    fn put(&self, key: &str, value: &str) {
        let path = self.path(key);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, format!("{value}\n")).expect("write");
    }

    /// Makes `key` a link to `target`, e.g. a file the kernel refuses writes to.
    fn link(&self, key: &str, target: &str) {
        let path = self.path(key);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        symlink(target, path).expect("symlink");
    }

    fn get(&self, key: &str) -> String {
        let raw = fs::read_to_string(self.path(key)).expect("read");
        raw.strip_suffix('\n').unwrap_or(&raw).to_string()
    }

    /// Every regular file under sys/, byte for byte.
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for entry in fs::read_dir(dir).expect("readdir") {
                let path = entry.expect("entry").path();
                let meta = fs::symlink_metadata(&path).expect("meta");
                if meta.is_dir() {
                    walk(&path, out);
                } else if meta.is_file() {
                    out.insert(path.clone(), fs::read(&path).expect("read"));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.proc_dir.path().join("sys"), &mut out);
        out
    }

    fn store(&self) -> JournalStore {
        JournalStore::new(self.state_dir.path())
    }

    fn journal(&self) -> Journal {
        self.store().load().expect("journal")
    }

    fn transactor(&self) -> Transactor {
        Transactor::new(
            Host::new(self.proc_dir.path(), self.proc_dir.path()),
            self.store(),
        )
    }
}

fn goal(revision: &str, sysctls: &[(&str, &str)]) -> Goal {
    Goal {
        target: Some(Applied {
            tuning: "edge".into(),
            revision: revision.into(),
        }),
        values: sysctls
            .iter()
            .map(|(k, v)| (Setting::sysctl(*k), v.to_string()))
            .collect(),
    }
}

fn no_pause() -> impl FnMut(Progress<'_>) {
    |_| {}
}

fn run(host: &FakeHost, goal: &Goal) -> Outcome {
    host.transactor()
        .execute(goal, &mut no_pause())
        .expect("transaction")
}

fn item<'a>(outcome: &'a Outcome, key: &str) -> &'a hoststack_crds::ItemResult {
    outcome
        .items
        .iter()
        .find(|i| i.target == key)
        .unwrap_or_else(|| panic!("no item {key} in {outcome:?}"))
}

/// A pause that "kills" the agent right after its `n`th host write (1-based).
fn kill_after(n: usize) -> impl FnMut(Progress<'_>) {
    let mut writes = 0;
    move |progress| {
        if !matches!(progress, Progress::Wrote { .. }) {
            return;
        }
        writes += 1;
        if writes == n {
            panic::panic_any(Killed);
        }
    }
}

const BASE: &[(&str, &str)] = &[
    ("net.ipv4.tcp_sack", "1"),
    ("net.ipv4.tcp_dsack", "1"),
    ("net.ipv4.tcp_congestion_control", "cubic"),
    ("net.ipv4.tcp_rmem", "4096\t131072\t6291456"),
    ("net.core.somaxconn", "4096"),
];

#[test]
fn apply_then_revert_is_the_identity() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let r1 = goal(
        "r1",
        &[
            ("net.ipv4.tcp_sack", "0"),
            ("net.ipv4.tcp_congestion_control", "bbr"),
            ("net.ipv4.tcp_rmem", "4096 131072  6291456"),
        ],
    );
    let outcome = run(&host, &r1);
    assert_eq!(outcome.state, NodeState::Applied, "{outcome:?}");
    assert_eq!(host.get("net.ipv4.tcp_sack"), "0");
    assert_eq!(host.get("net.ipv4.tcp_congestion_control"), "bbr");
    // Same value up to whitespace: recorded, never written.
    assert_eq!(host.get("net.ipv4.tcp_rmem"), "4096\t131072\t6291456");
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").state,
        ItemState::Applied
    );
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").original.as_deref(),
        Some("1")
    );
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").actual.as_deref(),
        Some("0")
    );
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_rmem").state,
        ItemState::Unchanged
    );
    let journal = host.journal();
    assert_eq!(journal.applied, r1.target);
    assert_eq!(journal.transaction, None);
    assert_eq!(
        journal.originals,
        vec![
            Entry::new(&Setting::sysctl("net.ipv4.tcp_congestion_control"), "cubic"),
            Entry::new(
                &Setting::sysctl("net.ipv4.tcp_rmem"),
                "4096\t131072\t6291456"
            ),
            Entry::new(&Setting::sysctl("net.ipv4.tcp_sack"), "1"),
        ]
    );

    // Applying the same revision again is a no-op that reports the same.
    let again = run(&host, &r1);
    assert_eq!(again, outcome);

    let reverted = run(&host, &Goal::revert());
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:?}");
    assert!(reverted
        .items
        .iter()
        .all(|i| i.state == ItemState::Reverted));
    assert_eq!(reverted.applied, None);
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

#[test]
fn a_missing_key_fails_the_transaction_before_any_write() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let outcome = run(
        &host,
        &goal(
            "r1",
            &[
                ("net.ipv4.tcp_sack", "0"),
                ("net.ipv4.tcp_no_such_thing", "1"),
            ],
        ),
    );
    assert_eq!(outcome.state, NodeState::Failed);
    let message = outcome.message.clone().expect("message");
    assert!(message.contains("net.ipv4.tcp_no_such_thing"), "{message}");
    assert!(
        message.contains("no such sysctl on this kernel"),
        "{message}"
    );
    assert!(message.contains("tcp_no_such_thing)"), "{message}");
    let failed = item(&outcome, "net.ipv4.tcp_no_such_thing");
    assert_eq!(failed.state, ItemState::Failed);
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").state,
        ItemState::Pending
    );
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

#[test]
fn a_refused_value_restores_every_earlier_write() {
    let host = FakeHost::new(BASE);
    // The "kernel" refuses every write to this key (EIO), as a real one refuses a bad value.
    host.link("net.ipv4.tcp_zz_refuses", "/proc/version");
    let r1 = goal("r1", &[("net.ipv4.tcp_sack", "0")]);
    run(&host, &r1);
    let before = host.snapshot();
    let journal_before = host.journal();

    let outcome = run(
        &host,
        &goal(
            "r2",
            &[
                ("net.core.somaxconn", "8192"),
                ("net.ipv4.tcp_dsack", "0"),
                ("net.ipv4.tcp_zz_refuses", "1"),
            ],
        ),
    );
    assert_eq!(outcome.state, NodeState::Failed, "{outcome:?}");
    let message = outcome.message.clone().expect("message");
    assert!(message.contains("net.ipv4.tcp_zz_refuses"), "{message}");
    assert!(message.contains("refused"), "{message}");
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_zz_refuses").state,
        ItemState::Failed
    );
    assert_eq!(
        item(&outcome, "net.core.somaxconn").state,
        ItemState::RolledBack
    );
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_dsack").state,
        ItemState::RolledBack
    );
    // The host and the journal are exactly as before the transaction: r1 applied.
    assert_eq!(host.snapshot(), before);
    assert_eq!(host.journal(), journal_before);
    assert_eq!(outcome.applied, r1.target);
}

#[test]
fn a_value_that_does_not_read_back_is_undone() {
    let host = FakeHost::new(BASE);
    // Writes succeed, but the value never shows: the kernel ignored it.
    host.link("net.ipv4.tcp_zz_ignores", "/dev/null");
    let before = host.snapshot();
    let outcome = run(
        &host,
        &goal(
            "r1",
            &[("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_zz_ignores", "1")],
        ),
    );
    assert_eq!(outcome.state, NodeState::Failed);
    let message = outcome.message.expect("message");
    assert!(message.contains("read back"), "{message}");
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

#[test]
fn a_revision_change_is_one_transaction() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    run(
        &host,
        &goal(
            "r1",
            &[("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_dsack", "0")],
        ),
    );
    let r2 = goal(
        "r2",
        &[("net.ipv4.tcp_dsack", "1 "), ("net.core.somaxconn", "8192")],
    );
    let outcome = run(&host, &r2);
    assert_eq!(outcome.state, NodeState::Applied, "{outcome:?}");
    // Only in r1: back to its original, and no longer managed.
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").state,
        ItemState::Reverted
    );
    // In both: the r2 value, with the original from before r1 kept.
    assert_eq!(host.get("net.ipv4.tcp_dsack"), "1 ");
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_dsack").state,
        ItemState::Unchanged
    );
    assert_eq!(host.get("net.core.somaxconn"), "8192");
    let journal = host.journal();
    assert_eq!(journal.applied, r2.target);
    assert_eq!(
        journal.originals,
        vec![
            Entry::new(&Setting::sysctl("net.ipv4.tcp_dsack"), "1"),
            Entry::new(&Setting::sysctl("net.core.somaxconn"), "4096"),
        ]
    );
    run(&host, &Goal::revert());
    assert_eq!(host.snapshot(), before);
}

#[test]
fn a_killed_transaction_is_undone_on_restart_and_originals_survive() {
    let host = FakeHost::new(BASE);
    let pristine = host.snapshot();
    run(&host, &goal("r1", &[("net.ipv4.tcp_sack", "0")]));
    let after_r1 = host.snapshot();
    let journal_r1 = host.journal();

    let r2 = goal(
        "r2",
        &[
            ("net.core.somaxconn", "8192"),
            ("net.ipv4.tcp_dsack", "0"),
            ("net.ipv4.tcp_sack", "1"),
        ],
    );
    // Killed right after the second write of three.
    assert!(killed(|| {
        let _ = host.transactor().execute(&r2, &mut kill_after(2));
    }));
    assert_eq!(host.get("net.core.somaxconn"), "8192");
    let journal = host.journal();
    let tx = journal.transaction.clone().expect("in-flight transaction");
    assert_eq!(tx.target, r2.target);
    assert_eq!(journal.applied, journal_r1.applied);

    // A restarted agent undoes it first: the host is on r1 again, originals intact.
    assert!(host.transactor().recover(&mut no_pause()).expect("recover"));
    assert_eq!(host.snapshot(), after_r1);
    assert_eq!(host.journal(), journal_r1);
    assert!(!host.transactor().recover(&mut no_pause()).expect("recover"));

    // Then reconciles normally, and a revert still finds the true originals.
    assert_eq!(run(&host, &r2).state, NodeState::Applied);
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    run(&host, &Goal::revert());
    assert_eq!(host.snapshot(), pristine);
}

#[test]
fn a_provisional_revision_is_undone_exactly_unless_confirmed() {
    let host = FakeHost::new(BASE);
    let pristine = host.snapshot();
    run(&host, &goal("r1", &[("net.ipv4.tcp_sack", "0")]));
    let (after_r1, journal_r1) = (host.snapshot(), host.journal());
    let t = host.transactor();

    // r2 applied provisionally, then r3 before r2 was confirmed (r3 writes one more setting
    // and gives tcp_sack back): an undo goes back to r1, every setting.
    let r2 = goal(
        "r2",
        &[("net.ipv4.tcp_sack", "0"), ("net.core.somaxconn", "8192")],
    );
    let r3 = goal(
        "r3",
        &[("net.core.somaxconn", "8192"), ("net.ipv4.tcp_dsack", "0")],
    );
    for g in [&r2, &r3] {
        let outcome = t
            .execute_provisional(g, 1_800_000_000, &mut no_pause())
            .unwrap();
        assert_eq!(outcome.state, NodeState::Applied);
        assert_eq!(host.journal().applied, g.target);
        assert!(host.journal().provisional.is_some());
    }
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    let undone = t.abandon(&mut no_pause()).expect("abandon");
    assert_eq!(undone, r3.target);
    assert_eq!(host.snapshot(), after_r1);
    assert_eq!(host.journal(), journal_r1);
    assert_eq!(t.abandon(&mut no_pause()).expect("abandon"), None);

    // Confirmed, it stays: nothing undoes it any more, and a revert finds the originals.
    t.execute_provisional(&r2, 1_800_000_000, &mut no_pause())
        .unwrap();
    assert!(t.confirm(&mut no_pause()).expect("confirm"));
    assert!(!t.confirm(&mut no_pause()).expect("confirm"));
    assert_eq!(t.abandon(&mut no_pause()).expect("abandon"), None);
    assert_eq!(host.get("net.core.somaxconn"), "8192");
    run(&host, &Goal::revert());
    assert_eq!(host.snapshot(), pristine);
}

#[test]
fn an_agent_restarted_inside_the_window_reverts_the_unconfirmed_revision() {
    let host = FakeHost::new(BASE);
    let pristine = host.snapshot();
    let r1 = goal("r1", &[("net.ipv4.tcp_sack", "0")]);
    host.transactor()
        .execute_provisional(&r1, 1_800_000_000, &mut no_pause())
        .unwrap();
    // A new agent (a restart) starts by undoing it.
    let reconciler = Reconciler::new(host.transactor(), Hooks::default());
    assert!(reconciler.recover().expect("recover"));
    assert_eq!(host.snapshot(), pristine);
    assert!(host.journal().is_empty());
    // One confirmed before the restart stays.
    host.transactor()
        .execute_provisional(&r1, 1_800_000_000, &mut no_pause())
        .unwrap();
    host.transactor().confirm(&mut no_pause()).unwrap();
    assert!(!reconciler.recover().expect("recover"));
    assert_eq!(host.get("net.ipv4.tcp_sack"), "0");
}

#[test]
fn a_kill_during_the_undo_of_a_failure_is_finished_on_restart() {
    let host = FakeHost::new(BASE);
    host.link("net.ipv4.tcp_zz_refuses", "/proc/version");
    let before = host.snapshot();
    let failing = goal(
        "r1",
        &[
            ("net.core.somaxconn", "1"),
            ("net.ipv4.tcp_sack", "0"),
            ("net.ipv4.tcp_zz_refuses", "1"),
        ],
    );
    // Writes: somaxconn, tcp_sack, the refused one; then the undo writes tcp_sack: killed there.
    assert!(killed(|| {
        let _ = host.transactor().execute(&failing, &mut kill_after(4));
    }));
    assert!(host.journal().transaction.is_some());
    assert_ne!(host.snapshot(), before);
    host.transactor().recover(&mut no_pause()).expect("recover");
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

#[test]
fn an_undo_that_fails_stays_in_the_journal_and_is_retried() {
    let host = FakeHost::new(BASE);
    host.link("net.ipv4.tcp_zz_refuses", "/proc/version");
    let before = host.snapshot();
    let g = goal(
        "r1",
        &[
            ("net.core.somaxconn", "8192"),
            ("net.ipv4.tcp_zz_refuses", "1"),
        ],
    );
    // After the first write, somaxconn starts refusing writes too, so its restore fails.
    let mut writes = 0;
    let mut break_somaxconn = |progress: Progress<'_>| {
        if !matches!(progress, Progress::Wrote { .. }) {
            return;
        }
        writes += 1;
        if writes == 1 {
            fs::remove_file(host.path("net.core.somaxconn")).expect("rm");
            host.link("net.core.somaxconn", "/proc/version");
        }
    };
    let outcome = host
        .transactor()
        .execute(&g, &mut break_somaxconn)
        .expect("transaction");
    assert_eq!(outcome.state, NodeState::Failed);
    let message = outcome.message.expect("message");
    assert!(
        message.contains("undoing it failed, will retry"),
        "{message}"
    );
    assert!(host.journal().transaction.is_some());

    // Once the setting is writable again, the next recovery finishes the undo.
    fs::remove_file(host.path("net.core.somaxconn")).expect("rm");
    host.put("net.core.somaxconn", "8192");
    assert!(host.transactor().recover(&mut no_pause()).expect("recover"));
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

#[test]
fn a_preview_changes_nothing() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let g = goal(
        "r1",
        &[
            ("net.ipv4.tcp_sack", "0"),
            ("net.core.somaxconn", "4096"),
            ("net.ipv4.nope", "1"),
        ],
    );
    let prepared = host
        .transactor()
        .prepare(&g, &mut no_pause())
        .expect("prepare");
    let preview = prepared.preview(&g);
    assert_eq!(preview.state, NodeState::Planned);
    assert_eq!(
        item(&preview, "net.ipv4.tcp_sack").state,
        ItemState::WouldChange
    );
    assert_eq!(
        item(&preview, "net.ipv4.tcp_sack").actual.as_deref(),
        Some("1")
    );
    assert_eq!(
        item(&preview, "net.core.somaxconn").state,
        ItemState::Unchanged
    );
    assert_eq!(item(&preview, "net.ipv4.nope").state, ItemState::WouldFail);
    assert!(preview
        .message
        .expect("message")
        .starts_with("would fail: "));
    assert_eq!(host.snapshot(), before);
    assert!(host.journal().is_empty());
}

// --- The reconciler over the same fake host. ---

/// What the reconciler is asked for by `nt`, its revision named as the test names it: the check
/// that a spec's config hashes to its revision is `Intent::of`'s (node-agent/src/intent.rs and
/// reconciler.rs test it); these tests are about what comes after.
fn intent_of(nt: &NodeTuning) -> Intent {
    match (&nt.spec.tuning, &nt.spec.config, &nt.spec.revision) {
        (Some(tuning), Some(config), Some(revision)) => Intent::Revision {
            tuning: tuning.clone(),
            revision: revision.clone(),
            config: Box::new(config.clone()),
            mode: nt.spec.mode.unwrap_or_default(),
        },
        _ => Intent::of(Some(nt)),
    }
}

fn node_tuning(revision: &str, sysctls: &[(&str, &str)], mode: Mode) -> NodeTuning {
    let mut config = NodeConfig::default();
    for (k, v) in sysctls {
        config
            .sysctls
            .insert(k.to_string(), SysctlValue(v.to_string()));
    }
    NodeTuning::new(
        "node-a",
        NodeTuningSpec {
            tuning: Some("edge".into()),
            revision: Some(revision.into()),
            config: Some(config),
            mode: Some(mode),
            ..NodeTuningSpec::default()
        },
    )
}

fn reconcile(r: &mut Reconciler, desired: &Intent) -> (bool, Outcome) {
    match r.next(desired, &SpecGeneration::default()).expect("next") {
        Next::Report(outcome) => (false, outcome),
        Next::Transaction { applying } => {
            if let Some(applying) = applying {
                assert_eq!(applying.state, NodeState::Applying);
                assert!(applying.items.iter().all(|i| i.state == ItemState::Pending));
            }
            (true, r.transact(desired, &SpecGeneration::default()))
        }
    }
}

#[test]
fn the_reconciler_applies_settles_and_reverts() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let mut r = Reconciler::new(host.transactor(), Hooks::default());
    let nt = node_tuning("r1", &[("net.ipv4.tcp_sack", "0")], Mode::Apply);
    let desired = intent_of(&nt);
    let (ran, applied) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(applied.state, NodeState::Applied);
    // A resync with nothing changed reports the same without a transaction.
    let (ran, again) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(again, applied);
    // Drift is corrected by a new transaction.
    host.put("net.ipv4.tcp_sack", "1");
    let (ran, fixed) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(fixed.state, NodeState::Applied);
    assert_eq!(host.get("net.ipv4.tcp_sack"), "0");

    let mut withdrawn = nt.clone();
    withdrawn.spec = NodeTuningSpec {
        mode: Some(Mode::Apply),
        ..NodeTuningSpec::default()
    };
    let desired = intent_of(&withdrawn);
    assert_eq!(desired, Intent::Withdrawn);
    let (ran, reverted) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(reverted.state, NodeState::Reverted);
    assert_eq!(host.snapshot(), before);
    let (ran, still) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(still, reverted);
    // A fresh agent with an empty journal reports Reverted too.
    let mut fresh = Reconciler::new(host.transactor(), Hooks::default());
    let (ran, fresh_outcome) = reconcile(&mut fresh, &desired);
    assert!(!ran);
    assert_eq!(fresh_outcome.state, NodeState::Reverted);
}

#[test]
fn a_failed_revision_is_not_retried_until_the_spec_changes() {
    let host = FakeHost::new(BASE);
    let mut r = Reconciler::new(host.transactor(), Hooks::default());
    let nt = node_tuning(
        "r1",
        &[("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_later", "1")],
        Mode::Apply,
    );
    let desired = intent_of(&nt);
    let (_, failed) = reconcile(&mut r, &desired);
    assert_eq!(failed.state, NodeState::Failed);
    // The key appears, but the failed revision is not retried...
    host.put("net.ipv4.tcp_later", "0");
    let (ran, still) = reconcile(&mut r, &desired);
    assert!(!ran);
    assert_eq!(still, failed);
    assert_eq!(host.get("net.ipv4.tcp_sack"), "1");
    // ...while a restarted agent retries once,
    let mut restarted = Reconciler::new(host.transactor(), Hooks::default());
    let (ran, retried) = reconcile(&mut restarted, &desired);
    assert!(ran);
    assert_eq!(retried.state, NodeState::Applied);
    // and a new spec is tried at once.
    let nt2 = node_tuning("r2", &[("net.ipv4.tcp_sack", "1")], Mode::Apply);
    let (ran, r2) = reconcile(&mut r, &intent_of(&nt2));
    assert!(ran);
    assert_eq!(r2.state, NodeState::Applied);
}

#[test]
fn a_refused_userspace_stack_fails_the_revision_and_changes_nothing() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let mut r = Reconciler::new(host.transactor(), Hooks::default());
    let mut nt = node_tuning("r1", &[("net.ipv4.tcp_sack", "0")], Mode::Apply);
    if let Some(config) = nt.spec.config.as_mut() {
        config.userspace_stack = Some(UserspaceStack::default());
    }
    let (ran, outcome) = reconcile(&mut r, &intent_of(&nt));
    assert!(!ran);
    assert_eq!(outcome.state, NodeState::Failed);
    let hp = item(&outcome, "userspaceStack");
    assert_eq!(hp.kind, "userspaceStack");
    assert_eq!(hp.state, ItemState::Failed);
    assert_eq!(
        hp.message.as_deref(),
        Some("userspaceStack.cores: no core given; the stack needs at least one")
    );
    assert_eq!(
        item(&outcome, "net.ipv4.tcp_sack").state,
        ItemState::Pending
    );
    assert_eq!(
        outcome.message.as_deref(),
        Some("userspaceStack.cores: no core given; the stack needs at least one")
    );
    assert_eq!(host.snapshot(), before);

    // In Plan mode the same spec is Planned, with the reason it would fail.
    let mut plan = nt.clone();
    plan.spec.mode = Some(Mode::Plan);
    let (ran, planned) = reconcile(&mut r, &intent_of(&plan));
    assert!(!ran);
    assert_eq!(planned.state, NodeState::Planned);
    assert_eq!(
        item(&planned, "net.ipv4.tcp_sack").state,
        ItemState::WouldChange
    );
    assert_eq!(
        planned.message.as_deref(),
        Some("would fail: userspaceStack.cores: no core given; the stack needs at least one")
    );
    assert_eq!(host.snapshot(), before);
}

#[test]
fn plan_mode_never_writes() {
    let host = FakeHost::new(BASE);
    let mut r = Reconciler::new(host.transactor(), Hooks::default());
    let applied = node_tuning("r1", &[("net.ipv4.tcp_sack", "0")], Mode::Apply);
    reconcile(&mut r, &intent_of(&applied));
    let before = host.snapshot();
    let plan = node_tuning("r2", &[("net.ipv4.tcp_dsack", "0")], Mode::Plan);
    let (ran, planned) = reconcile(&mut r, &intent_of(&plan));
    assert!(!ran);
    assert_eq!(planned.state, NodeState::Planned);
    assert_eq!(
        item(&planned, "net.ipv4.tcp_dsack").state,
        ItemState::WouldChange
    );
    // r1's key would go back to its original.
    let sack = item(&planned, "net.ipv4.tcp_sack");
    assert_eq!(sack.state, ItemState::WouldChange);
    assert_eq!(sack.desired.as_deref(), Some("1"));
    assert_eq!(planned.applied.map(|a| a.revision).as_deref(), Some("r1"));
    assert_eq!(host.snapshot(), before);
}

// --- Properties. ---

/// Keys of the fake kernel.
const KEYS: &[&str] = &[
    "net.core.somaxconn",
    "net.core.rmem_max",
    "net.ipv4.tcp_sack",
    "net.ipv4.tcp_dsack",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_congestion_control",
    "net.ipv6.conf.all.forwarding",
    "net.unix.max_dgram_qlen",
];

/// Values as the kernel prints them.
fn kernel_value() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "0",
        "1",
        "2",
        "cubic",
        "bbr",
        "4096",
        "4096\t131072\t6291456",
        "212992",
    ])
    .prop_map(str::to_string)
}

/// Values as users write them.
fn user_value() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "0",
        "1",
        "2",
        "bbr",
        "cubic",
        "8192",
        "4096 131072 6291456",
        "4096  87380   16777216",
        "16777216",
    ])
    .prop_map(str::to_string)
}

/// A revision: some of the keys, each with a value.
fn revision() -> impl Strategy<Value = Vec<(usize, String)>> {
    prop::collection::btree_map(0..KEYS.len(), user_value(), 0..=KEYS.len())
        .prop_map(|m| m.into_iter().collect())
}

fn goal_of(name: &str, revision: &[(usize, String)]) -> Goal {
    let pairs: Vec<(&str, &str)> = revision
        .iter()
        .map(|(i, v)| (KEYS[*i], v.as_str()))
        .collect();
    goal(name, &pairs)
}

fn host_of(initial: &[String]) -> FakeHost {
    let pairs: Vec<(&str, &str)> = KEYS
        .iter()
        .zip(initial)
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    FakeHost::new(&pairs)
}

fn assert_applied(host: &FakeHost, revision: &[(usize, String)]) {
    for (i, v) in revision {
        assert!(same_value(&host.get(KEYS[*i]), v), "{} != {v:?}", KEYS[*i]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn apply_then_revert_leaves_every_file_as_it_was(
        initial in prop::collection::vec(kernel_value(), KEYS.len()),
        r1 in revision(),
        r2 in revision(),
    ) {
        let host = host_of(&initial);
        let pristine = host.snapshot();

        let g1 = goal_of("r1", &r1);
        prop_assert_eq!(run(&host, &g1).state, NodeState::Applied);
        assert_applied(&host, &r1);
        prop_assert_eq!(run(&host, &Goal::revert()).state, NodeState::Reverted);
        prop_assert_eq!(host.snapshot(), pristine.clone());
        prop_assert!(host.journal().is_empty());

        prop_assert_eq!(run(&host, &g1).state, NodeState::Applied);
        let g2 = goal_of("r2", &r2);
        prop_assert_eq!(run(&host, &g2).state, NodeState::Applied);
        assert_applied(&host, &r2);
        for (i, _) in &r1 {
            if !r2.iter().any(|(j, _)| j == i) {
                prop_assert_eq!(host.get(KEYS[*i]), initial[*i].clone());
            }
        }
        prop_assert_eq!(run(&host, &Goal::revert()).state, NodeState::Reverted);
        prop_assert_eq!(host.snapshot(), pristine);
        prop_assert!(host.journal().is_empty());
    }

    #[test]
    fn a_kill_at_any_write_ends_fully_applied_or_fully_reverted(
        initial in prop::collection::vec(kernel_value(), KEYS.len()),
        r1 in revision(),
        r2 in revision(),
        kill_at in 1usize..=2 * KEYS.len(),
        withdraw in any::<bool>(),
    ) {
        let host = host_of(&initial);
        let pristine = host.snapshot();
        let g1 = goal_of("r1", &r1);
        prop_assert_eq!(run(&host, &g1).state, NodeState::Applied);
        let after_r1 = host.snapshot();
        let journal_r1 = host.journal();

        let next = if withdraw { Goal::revert() } else { goal_of("r2", &r2) };
        let was_killed = killed(|| {
            let _ = host.transactor().execute(&next, &mut kill_after(kill_at));
        });
        // After the restart's recovery: either the transaction finished before the kill, or
        // the host and journal are exactly as before it.
        host.transactor().recover(&mut no_pause()).expect("recover");
        let journal = host.journal();
        prop_assert!(journal.transaction.is_none());
        if journal.applied == journal_r1.applied && !(withdraw && journal.is_empty()) {
            prop_assert!(was_killed);
            prop_assert_eq!(host.snapshot(), after_r1);
            prop_assert_eq!(journal, journal_r1);
        } else if withdraw {
            prop_assert_eq!(host.snapshot(), pristine.clone());
        } else {
            assert_applied(&host, &r2);
        }
        // Reconciling on, then reverting, always restores the true originals.
        run(&host, &next);
        prop_assert_eq!(run(&host, &Goal::revert()).state, NodeState::Reverted);
        prop_assert_eq!(host.snapshot(), pristine);
    }
}

/// A state directory made immutable (`chattr +i`: root cannot create or rename in it) until
/// dropped.
struct Immutable<'a>(&'a Path);

impl<'a> Immutable<'a> {
    fn new(dir: &'a Path) -> Self {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(dir)
            .status()
            .expect("chattr runs")
            .success();
        assert!(ok, "chattr +i {}", dir.display());
        Immutable(dir)
    }
}

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(self.0)
            .status();
    }
}

#[test]
fn an_unwritable_state_dir_changes_nothing_is_no_verdict_and_the_revision_applies_once_writable() {
    let host = FakeHost::new(BASE);
    let before = host.snapshot();
    let mut r = Reconciler::new(host.transactor(), Hooks::default());
    let nt = node_tuning("r1", &[("net.ipv4.tcp_sack", "0")], Mode::Apply);
    let desired = intent_of(&nt);
    let failed = {
        let _immutable = Immutable::new(host.state_dir.path());
        reconcile(&mut r, &desired).1
    };
    // Journal first: with no journal, no write. And no verdict on the revision: still Applying,
    // with the reason, and a retry soon.
    assert_eq!(host.snapshot(), before);
    assert_eq!(failed.state, NodeState::Applying);
    assert!(r.retry_soon());
    let message = failed.message.expect("a message");
    assert!(
        message.starts_with("agent error: journal ") && message.contains("not permitted"),
        "{message}"
    );
    // The agent's own failure is not the revision's: once the directory is writable again the
    // same assignment applies.
    let (ran, applied) = reconcile(&mut r, &desired);
    assert!(ran);
    assert_eq!(applied.state, NodeState::Applied);
    assert!(!r.retry_soon());
    assert_eq!(host.get("net.ipv4.tcp_sack"), "0");
}
