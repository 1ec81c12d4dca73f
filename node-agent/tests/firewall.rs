//! The nftables table in the agent's transaction, with a fake kernel behind a fake /proc tree:
//! the table is one setting among others, so a failed table write undoes the sysctls written
//! before it, a kill at any kernel call ends (after recovery) fully applied or fully reverted,
//! and apply then revert is the identity.

mod common;

use common::{killed, Killed};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hoststack_agent::appliers::firewall;
use hoststack_agent::host::files::write_existing;
use hoststack_agent::host::nftables::{Observed, Ruleset};
use hoststack_agent::host::{Files, Host, Nftables, Roots};
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::model::Setting;
use hoststack_agent::transaction::{Goal, Outcome, Transactor};
use hoststack_crds::{ItemState, NodeState};

/// What the fake kernel's nftables holds under the agent's table name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Table {
    Absent,
    Ours(Ruleset),
    /// A table of that name made by someone else.
    Theirs,
}

/// Files and nftables ports of a host whose sysctls are files and whose nftables is a value in
/// memory.
#[derive(Debug)]
struct FakeKernel {
    table: Arc<Mutex<Table>>,
    /// Replacing the table fails with this errno (0: never).
    replace_errno: i32,
    /// The agent "dies" (SIGKILL) just before this kernel call (1-based; 0: never).
    kill_at: usize,
    calls: AtomicUsize,
}

impl FakeKernel {
    /// Counts a call, dying before it when it is the fatal one.
    fn call(&self) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at {
            panic::panic_any(Killed);
        }
    }
}

impl Files for FakeKernel {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.call();
        write_existing(path, bytes)
    }
}

impl Nftables for FakeKernel {
    fn read_table(&self) -> io::Result<Observed> {
        Ok(match &*self.table.lock().unwrap() {
            Table::Absent => Observed::Absent,
            Table::Ours(r) => Observed::Ours(r.clone()),
            Table::Theirs => Observed::Foreign("no comment".into()),
        })
    }

    fn replace_table(&self, ruleset: &Ruleset) -> io::Result<()> {
        self.call();
        if self.replace_errno != 0 {
            return Err(io::Error::from_raw_os_error(self.replace_errno));
        }
        let mut table = self.table.lock().unwrap();
        if *table == Table::Theirs {
            return Err(io::ErrorKind::PermissionDenied.into());
        }
        *table = Table::Ours(ruleset.clone());
        Ok(())
    }

    fn delete_table(&self) -> io::Result<()> {
        self.call();
        let mut table = self.table.lock().unwrap();
        if *table == Table::Theirs {
            return Err(io::ErrorKind::PermissionDenied.into());
        }
        *table = Table::Absent;
        Ok(())
    }
}

/// The sysctls of the fake host, with their values as the kernel prints them.
const SYSCTLS: [(&str, &str); 2] = [("net.ipv4.tcp_sack", "1"), ("net.core.somaxconn", "4096")];

/// A fake node: /proc/sys with [`SYSCTLS`], the nftables table, a state dir.
struct FakeNode {
    proc_dir: tempfile::TempDir,
    state: tempfile::TempDir,
    table: Arc<Mutex<Table>>,
}

impl FakeNode {
    fn new() -> Self {
        let node = FakeNode {
            proc_dir: tempfile::tempdir().expect("tempdir"),
            state: tempfile::tempdir().expect("tempdir"),
            table: Arc::new(Mutex::new(Table::Absent)),
        };
        for (key, value) in SYSCTLS {
            let path = node.sysctl_path(key);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, format!("{value}\n")).unwrap();
        }
        node
    }

    fn sysctl_path(&self, key: &str) -> PathBuf {
        self.proc_dir
            .path()
            .join("sys")
            .join(key.split('.').collect::<PathBuf>())
    }

    fn kernel(&self, replace_errno: i32, kill_at: usize) -> Arc<FakeKernel> {
        Arc::new(FakeKernel {
            table: self.table.clone(),
            replace_errno,
            kill_at,
            calls: AtomicUsize::new(0),
        })
    }

    fn transactor_with(&self, kernel: Arc<FakeKernel>) -> Transactor {
        let roots = Roots::new(self.proc_dir.path(), self.proc_dir.path());
        Transactor::new(
            Host::at(roots)
                .with_files(kernel.clone())
                .with_nftables(kernel),
            JournalStore::new(self.state.path()),
        )
    }

    fn transactor(&self) -> Transactor {
        self.transactor_with(self.kernel(0, 0))
    }

    /// Every sysctl and the table.
    fn snapshot(&self) -> (BTreeMap<String, String>, Table) {
        let sysctls = SYSCTLS
            .iter()
            .map(|(k, _)| {
                let v = fs::read_to_string(self.sysctl_path(k)).unwrap();
                (k.to_string(), v)
            })
            .collect();
        (sysctls, self.table.lock().unwrap().clone())
    }
}

fn goal(revision: &str, sysctls: &[(&str, &str)], table: &str) -> Goal {
    let mut desired: BTreeMap<Setting, String> = sysctls
        .iter()
        .map(|(k, v)| (Setting::sysctl(*k), v.to_string()))
        .collect();
    desired.insert(firewall::setting(), table.to_string());
    Goal {
        target: Some(Applied {
            tuning: "t".into(),
            revision: revision.into(),
        }),
        values: desired,
    }
}

const R1: &str = "blocked 198.19.20.2/32; syn-limit 10/second burst 5; notrack none";
const R2: &str = "blocked 10.0.0.0/8 2001:db8::/32; syn-limit none; notrack 80 443";

fn ruleset(description: &str) -> Ruleset {
    Ruleset::parse(description).expect("a description")
}

fn state_of<'a>(outcome: &'a Outcome, target: &str) -> &'a ItemState {
    &outcome
        .items
        .iter()
        .find(|i| i.target == target)
        .unwrap_or_else(|| panic!("no item {target}: {outcome:#?}"))
        .state
}

fn run(tx: &Transactor, g: &Goal) -> Outcome {
    tx.execute(g, &mut |_| {}).expect("transaction")
}

#[test]
fn a_failing_table_write_restores_the_sysctls_written_before_it() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let failing = node.transactor_with(node.kernel(libc_enospc(), 0));
    let out = run(
        &failing,
        &goal(
            "r1",
            &[("net.ipv4.tcp_sack", "0"), ("net.core.somaxconn", "8192")],
            R1,
        ),
    );
    assert_eq!(out.state, NodeState::Failed, "{out:#?}");
    assert_eq!(state_of(&out, firewall::TARGET), &ItemState::Failed);
    assert_eq!(state_of(&out, "net.ipv4.tcp_sack"), &ItemState::RolledBack);
    assert_eq!(state_of(&out, "net.core.somaxconn"), &ItemState::RolledBack);
    let message = out.message.unwrap_or_default();
    assert!(
        message.starts_with("nftables inet/hoststack: the kernel refused"),
        "{message}"
    );
    assert_eq!(node.snapshot(), pristine);
    let journal = JournalStore::new(node.state.path()).load().unwrap();
    assert!(journal.originals.is_empty() && journal.transaction.is_none());

    // With R1 applied, a failing R2 leaves R1's table and sysctls in place.
    assert_eq!(
        run(
            &node.transactor(),
            &goal("r1", &[("net.ipv4.tcp_sack", "0")], R1)
        )
        .state,
        NodeState::Applied
    );
    let on_r1 = node.snapshot();
    assert_eq!(on_r1.1, Table::Ours(ruleset(R1)));
    let out = run(
        &failing,
        &goal(
            "r2",
            &[("net.ipv4.tcp_sack", "1"), ("net.core.somaxconn", "8192")],
            R2,
        ),
    );
    assert_eq!(out.state, NodeState::Failed);
    assert_eq!(node.snapshot(), on_r1);
    assert_eq!(
        run(&node.transactor(), &Goal::revert()).state,
        NodeState::Reverted
    );
    assert_eq!(node.snapshot(), pristine);
}

fn libc_enospc() -> i32 {
    28
}

#[test]
fn apply_then_revert_is_the_identity() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let tx = node.transactor();
    for (rev, table) in [("r1", R1), ("r2", R2), ("r1", R1)] {
        let out = run(&tx, &goal(rev, &[("net.ipv4.tcp_sack", "0")], table));
        assert_eq!(out.state, NodeState::Applied, "{out:#?}");
        let item = out
            .items
            .iter()
            .find(|i| i.target == firewall::TARGET)
            .unwrap();
        assert_eq!(item.original.as_deref(), Some("absent"));
        assert_eq!(item.actual.as_deref(), Some(table));
        assert_eq!(node.snapshot().1, Table::Ours(ruleset(table)));
    }
    let out = run(&tx, &Goal::revert());
    assert_eq!(out.state, NodeState::Reverted);
    assert_eq!(state_of(&out, firewall::TARGET), &ItemState::Reverted);
    assert_eq!(node.snapshot(), pristine);
}

#[test]
fn a_table_the_agent_did_not_make_fails_the_revision_before_any_write() {
    let node = FakeNode::new();
    *node.table.lock().unwrap() = Table::Theirs;
    let before = node.snapshot();
    let kernel = node.kernel(0, 0);
    let tx = node.transactor_with(kernel.clone());
    let out = run(&tx, &goal("r1", &[("net.ipv4.tcp_sack", "0")], R1));
    assert_eq!(out.state, NodeState::Failed);
    assert!(
        out.message
            .as_deref()
            .unwrap_or_default()
            .contains("hoststack did not make it"),
        "{out:#?}"
    );
    assert_eq!(kernel.calls.load(Ordering::SeqCst), 0, "no write at all");
    assert_eq!(node.snapshot(), before);
}

#[test]
fn a_kill_at_each_kernel_call_ends_fully_applied_or_fully_reverted() {
    let from = goal("r1", &[("net.ipv4.tcp_sack", "0")], R1);
    let cases = [
        ("apply on a clean host", None, from.clone()),
        (
            "replace R1 by R2",
            Some(from.clone()),
            goal(
                "r2",
                &[("net.ipv4.tcp_sack", "1"), ("net.core.somaxconn", "8192")],
                R2,
            ),
        ),
        ("revert", Some(from.clone()), Goal::revert()),
    ];
    for (name, first, next) in cases {
        let mut kill_at = 1;
        loop {
            let node = FakeNode::new();
            let pristine = node.snapshot();
            if let Some(first) = &first {
                assert_eq!(run(&node.transactor(), first).state, NodeState::Applied);
            }
            let before = node.snapshot();
            let journal_before = JournalStore::new(node.state.path()).load().unwrap();
            let dying = node.transactor_with(node.kernel(0, kill_at));
            let died = killed(|| {
                let _ = dying.execute(&next, &mut |_| {});
            });
            node.transactor().recover(&mut |_| {}).expect("recover");
            let journal = JournalStore::new(node.state.path()).load().unwrap();
            assert!(journal.transaction.is_none());
            if journal == journal_before {
                assert_eq!(node.snapshot(), before, "{name}, kill at {kill_at}: undone");
            } else {
                let prepared = node.transactor().prepare(&next, &mut |_| {}).unwrap();
                assert!(
                    prepared.is_settled(&next),
                    "{name}, kill at {kill_at}: {:?}",
                    prepared.plan
                );
            }
            assert_eq!(
                run(&node.transactor(), &Goal::revert()).state,
                NodeState::Reverted
            );
            assert_eq!(node.snapshot(), pristine, "{name}, kill at {kill_at}");
            if !died {
                // The transaction made fewer calls than kill_at: every call was covered.
                assert!(kill_at > 1, "{name}: no kernel call at all");
                break;
            }
            kill_at += 1;
        }
    }
}
