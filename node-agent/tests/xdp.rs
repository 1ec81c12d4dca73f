//! The XDP applier inside the agent's transaction, against a fake kernel that keeps XDP hooks,
//! programs, links and pinned maps in memory the way the real one does: a link pin holds the
//! program attached, unpinning the last reference detaches it, an interface takes one program
//! per hook, the blocklist program reuses its pinned maps (creating missing ones empty), and one
//! interface offers only generic mode. One interface carries a program hoststack did not attach.
//!
//! Laws: all-or-nothing (a failing interface undoes the others); a kill at any kernel call or
//! after any write ends, after recovery, fully applied or fully reverted; apply then revert is
//! the identity; a restarted agent changes nothing; a new blocklist goes through the map without
//! detaching.

mod common;

use common::{killed, Killed};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hoststack_agent::appliers::dpdk;
use hoststack_agent::expand::{expand, Discovery};
use hoststack_agent::host::bpf::{
    AttachMode, AttachedProgram, Blocklist, Pins, Prefix, Program, XdpState,
};
use hoststack_agent::host::{Bpf, Host, Roots};
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::transaction::{Goal, Outcome, Progress, Transactor};
use hoststack_crds::{
    HostFacts, InterfaceFacts, InterfaceMatch, InterfaceTuning, ItemState, NodeConfig, NodeState,
    Xdp, XdpMode, XdpProgram,
};

/// The interface that offers only generic XDP (like a dummy device).
const GENERIC_ONLY: &str = "vlan9";
/// The interface with a program hoststack did not attach.
const FOREIGN: &str = "eth2";
/// The id of that program.
const FOREIGN_ID: u32 = 5;

/// The in-memory kernel state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    /// Programs attached, by interface.
    attached: BTreeMap<String, AttachedProgram>,
    /// Link pins: path → (interface, program id).
    links: BTreeMap<PathBuf, (String, u32)>,
    /// Program pins: path → program id.
    programs: BTreeMap<PathBuf, u32>,
    /// Map pins: path → prefixes (the blocklist tries) or nothing (the counters).
    maps: BTreeMap<PathBuf, BTreeSet<Prefix>>,
    /// Interfaces removed (their programs went with them).
    removed: BTreeSet<String>,
    /// The changing calls, in order.
    ops: Vec<&'static str>,
    next_id: u32,
}

impl State {
    /// The state without program ids, which every attach renews.
    fn shape(&self) -> String {
        let attached: BTreeMap<&String, (&String, AttachMode)> = self
            .attached
            .iter()
            .map(|(i, p)| (i, (&p.name, p.mode)))
            .collect();
        format!(
            "attached {attached:?} links {:?} programs {:?} maps {:?}",
            self.links.keys().collect::<Vec<_>>(),
            self.programs.keys().collect::<Vec<_>>(),
            self.maps
        )
    }
}

/// The bpf port of the fake host.
#[derive(Debug)]
struct FakeKernel {
    state: Arc<Mutex<State>>,
    /// The agent "dies" (SIGKILL) just before this call to the kernel (1-based; 0: never).
    kill_at: usize,
    calls: AtomicUsize,
    /// Calls that change something.
    writes: AtomicUsize,
}

impl FakeKernel {
    fn state(&self, write: bool) -> std::sync::MutexGuard<'_, State> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at {
            panic::panic_any(Killed);
        }
        if write {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn exists(s: &State, iface: &str) -> io::Result<()> {
    if ["veth1", "veth2", GENERIC_ONLY, FOREIGN].contains(&iface) && !s.removed.contains(iface) {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::NotFound, "No such device"))
    }
}

impl Bpf for FakeKernel {
    fn query_hook(&self, iface: &str, pins: &Pins) -> io::Result<XdpState> {
        let s = self.state(false);
        Ok(XdpState {
            interface_gone: exists(&s, iface).is_err(),
            attached: s.attached.get(iface).cloned().into_iter().collect(),
            link_program: s.links.get(&pins.link()).map(|(_, id)| *id),
            program_pinned: s.programs.contains_key(&pins.program()),
        })
    }

    fn attach(
        &self,
        iface: &str,
        pins: &Pins,
        program: Program,
        mode: AttachMode,
    ) -> io::Result<()> {
        let mut s = self.state(true);
        exists(&s, iface)?;
        if iface == GENERIC_ONLY && mode == AttachMode::Native {
            return Err(io::Error::other("Operation not supported (os error 95)"));
        }
        if s.attached.contains_key(iface) {
            return Err(io::Error::other("Device or resource busy (os error 16)"));
        }
        if program == Program::Blocklist {
            for m in Pins::MAPS {
                s.maps.entry(pins.map(m)).or_default();
            }
        }
        s.next_id += 1;
        let id = s.next_id;
        s.attached.insert(
            iface.to_string(),
            AttachedProgram {
                id,
                name: program.function().to_string(),
                mode,
            },
        );
        s.links.insert(pins.link(), (iface.to_string(), id));
        s.programs.insert(pins.program(), id);
        s.ops.push("attach");
        Ok(())
    }

    fn replace(&self, pins: &Pins, program: Program) -> io::Result<()> {
        let mut s = self.state(true);
        let Some((iface, old)) = s.links.get(&pins.link()).cloned() else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no pinned link"));
        };
        if program == Program::Blocklist {
            for m in Pins::MAPS {
                s.maps.entry(pins.map(m)).or_default();
            }
        }
        s.next_id += 1;
        let id = s.next_id;
        let hook = s.attached.get_mut(&iface).filter(|p| p.id == old);
        let hook = hook.ok_or_else(|| io::Error::other("the link is defunct"))?;
        hook.id = id;
        hook.name = program.function().to_string();
        s.links.insert(pins.link(), (iface, id));
        s.programs.insert(pins.program(), id);
        s.ops.push("replace");
        Ok(())
    }

    fn detach(&self, pins: &Pins) -> io::Result<()> {
        let mut s = self.state(true);
        s.ops.push("detach");
        s.programs.remove(&pins.program());
        if let Some((iface, id)) = s.links.remove(&pins.link()) {
            if s.attached.get(&iface).is_some_and(|p| p.id == id) {
                s.attached.remove(&iface);
            }
        }
        Ok(())
    }

    fn blocklist(&self, pins: &Pins) -> io::Result<Blocklist> {
        let s = self.state(false);
        let present = Pins::MAPS
            .iter()
            .filter(|m| s.maps.contains_key(&pins.map(m)))
            .count();
        Ok(match present {
            0 => Blocklist::Unpinned,
            3 => {
                let mut all: Vec<Prefix> = ["blocklist_v4", "blocklist_v6"]
                    .iter()
                    .flat_map(|m| s.maps[&pins.map(m)].iter().copied())
                    .collect();
                all.sort();
                Blocklist::Pinned(all)
            }
            _ => Blocklist::Incomplete,
        })
    }

    fn set_blocklist(&self, pins: &Pins, prefixes: &[Prefix]) -> io::Result<()> {
        let mut s = self.state(true);
        let v4 = prefixes.iter().filter(|p| p.addr().is_ipv4()).copied();
        let v6 = prefixes.iter().filter(|p| p.addr().is_ipv6()).copied();
        s.maps.insert(pins.map("blocklist_v4"), v4.collect());
        s.maps.insert(pins.map("blocklist_v6"), v6.collect());
        s.maps.entry(pins.map("drops")).or_default();
        s.ops.push("set_blocklist");
        Ok(())
    }

    fn unpin_blocklist(&self, pins: &Pins) -> io::Result<()> {
        let mut s = self.state(true);
        for m in Pins::MAPS {
            s.maps.remove(&pins.map(m));
        }
        s.ops.push("unpin_blocklist");
        Ok(())
    }
}

/// A node: the fake kernel's state, the journal directory, and the host's description.
struct Node {
    state: Arc<Mutex<State>>,
    journal: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let mut state = State {
            next_id: 100,
            ..State::default()
        };
        state.attached.insert(
            FOREIGN.into(),
            AttachedProgram {
                id: FOREIGN_ID,
                name: "xdp_firewall".into(),
                mode: AttachMode::Native,
            },
        );
        Node {
            state: Arc::new(Mutex::new(state)),
            journal: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn kernel(&self, kill_at: usize) -> Arc<FakeKernel> {
        Arc::new(FakeKernel {
            state: self.state.clone(),
            kill_at,
            calls: AtomicUsize::new(0),
            writes: AtomicUsize::new(0),
        })
    }

    fn transactor_with(&self, kernel: Arc<FakeKernel>) -> Transactor {
        let roots = Roots::new(self.journal.path(), self.journal.path());
        let host = Host::at(roots)
            .with_bpf(kernel)
            .with_bpffs_root(Path::new("/bpf/hs"));
        Transactor::new(host, JournalStore::new(self.journal.path()))
    }

    fn transactor(&self) -> Transactor {
        self.transactor_with(self.kernel(0))
    }

    fn state(&self) -> State {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The host as discovery would describe it: `veth0` carries the default route.
fn discovery() -> Discovery {
    let eth = |name: &str| InterfaceFacts {
        name: name.into(),
        rx_queues: 1,
        tx_queues: 1,
        ..InterfaceFacts::default()
    };
    Discovery {
        facts: HostFacts {
            cpus_online: "0-1".into(),
            cpu_count: 2,
            interfaces: ["veth0", "veth1", "veth2", GENERIC_ONLY, FOREIGN]
                .map(eth)
                .to_vec(),
            ..HostFacts::default()
        },
        dpdk: dpdk::Context {
            management: [("veth0".into(), "it carries the default route".into())].into(),
            ..dpdk::Context::default()
        },
        ..Discovery::default()
    }
}

fn xdp_entry(
    iface: &str,
    program: XdpProgram,
    mode: XdpMode,
    prefixes: &[&str],
) -> InterfaceTuning {
    InterfaceTuning {
        match_: InterfaceMatch {
            name: Some(iface.into()),
            ..InterfaceMatch::default()
        },
        xdp: Some(Xdp {
            program,
            mode,
            blocked_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            allow_management_interface: false,
        }),
        ..InterfaceTuning::default()
    }
}

/// The goal of a revision with these interface entries.
fn goal(revision: &str, entries: Vec<InterfaceTuning>) -> Goal {
    let config = NodeConfig {
        interfaces: entries,
        ..NodeConfig::default()
    };
    let x = expand(applied(revision), &config, &discovery());
    assert!(x.refused.is_empty(), "{:?}", x.refused);
    x.goal
}

/// Revision `revision` of tuning `t`.
fn applied(revision: &str) -> Applied {
    Applied {
        tuning: "t".into(),
        revision: revision.into(),
    }
}

/// Blocklist natively on veth1, pass (auto) on veth2 and on the generic-only interface.
fn full() -> Goal {
    goal(
        "r1",
        vec![
            xdp_entry(
                "veth1",
                XdpProgram::Blocklist,
                XdpMode::Native,
                &["198.19.30.10/32", "2001:db8::/32"],
            ),
            xdp_entry("veth2", XdpProgram::Pass, XdpMode::Auto, &[]),
            xdp_entry(GENERIC_ONLY, XdpProgram::Pass, XdpMode::Auto, &[]),
        ],
    )
}

fn run(t: &Transactor, g: &Goal) -> Outcome {
    t.execute(g, &mut |_| {}).expect("transaction")
}

fn actual<'a>(o: &'a Outcome, kind: &str, target: &str) -> &'a str {
    o.items
        .iter()
        .find(|i| i.kind == kind && i.target == target)
        .and_then(|i| i.actual.as_deref())
        .unwrap_or_else(|| panic!("no {kind} {target} in {o:?}"))
}

#[test]
fn apply_reports_the_mode_used_and_revert_is_the_identity() {
    let node = Node::new();
    let before = node.state();
    let t = node.transactor();
    let applied = run(&t, &full());
    assert_eq!(applied.state, NodeState::Applied, "{applied:?}");
    assert_eq!(actual(&applied, "xdpProgram", "veth1"), "blocklist/native");
    assert_eq!(actual(&applied, "xdpProgram", "veth2"), "pass/native");
    // Auto fell back to generic where native is not offered, and says so.
    assert_eq!(actual(&applied, "xdpProgram", GENERIC_ONLY), "pass/generic");
    assert_eq!(
        actual(&applied, "xdpBlocklist", "veth1"),
        "198.19.30.10/32,2001:db8::/32"
    );
    let s = node.state();
    assert_eq!(s.attached.len(), 4, "three of ours and the foreign one");
    assert!(s.maps.contains_key(Path::new("/bpf/hs/veth1/drops")));

    let reverted = run(&t, &Goal::revert());
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:?}");
    assert_eq!(node.state().shape(), before.shape());
    assert_eq!(node.state().attached[FOREIGN].id, FOREIGN_ID);
}

#[test]
fn a_failing_interface_undoes_the_others() {
    let node = Node::new();
    let before = node.state();
    let t = node.transactor();
    // Native only on the interface that offers only generic: it fails after veth1 is attached.
    let g = goal(
        "r1",
        vec![
            xdp_entry(
                "veth1",
                XdpProgram::Blocklist,
                XdpMode::Auto,
                &["10.0.0.0/8"],
            ),
            xdp_entry(GENERIC_ONLY, XdpProgram::Pass, XdpMode::Native, &[]),
        ],
    );
    let failed = run(&t, &g);
    assert_eq!(failed.state, NodeState::Failed, "{failed:?}");
    let message = failed.message.expect("message");
    assert!(
        message.contains("attaching pass to vlan9 failed (native: Operation not supported"),
        "{message}"
    );
    let rolled_back: Vec<&str> = failed
        .items
        .iter()
        .filter(|i| i.state == ItemState::RolledBack)
        .map(|i| i.kind.as_str())
        .collect();
    assert_eq!(rolled_back, ["xdpBlocklist", "xdpProgram"]);
    assert_eq!(node.state().shape(), before.shape());
    assert!(t.journal().expect("journal").originals.is_empty());
}

#[test]
fn a_program_hoststack_did_not_attach_is_refused_before_any_write() {
    let node = Node::new();
    let before = node.state();
    let kernel = node.kernel(0);
    let t = node.transactor_with(kernel.clone());
    let g = goal(
        "r1",
        vec![
            xdp_entry(
                "veth1",
                XdpProgram::Blocklist,
                XdpMode::Auto,
                &["10.0.0.0/8"],
            ),
            xdp_entry(FOREIGN, XdpProgram::Pass, XdpMode::Auto, &[]),
        ],
    );
    let failed = run(&t, &g);
    assert_eq!(failed.state, NodeState::Failed, "{failed:?}");
    let message = failed.message.expect("message");
    assert!(
        message.contains(
            "eth2 already has an XDP program hoststack did not attach: program 5 \
             (\"xdp_firewall\") in native mode; refusing to replace or detach it"
        ),
        "{message}"
    );
    assert_eq!(kernel.writes.load(Ordering::SeqCst), 0);
    assert_eq!(node.state(), before);
}

#[test]
fn the_management_interface_is_refused_unless_allowed() {
    let mut entry = xdp_entry(
        "veth0",
        XdpProgram::Blocklist,
        XdpMode::Auto,
        &["10.0.0.0/8"],
    );
    let config = |e: &InterfaceTuning| NodeConfig {
        interfaces: vec![e.clone()],
        ..NodeConfig::default()
    };
    let refused = expand(applied("r1"), &config(&entry), &discovery());
    assert!(refused.goal.values.is_empty());
    assert!(
        refused.refused[0]
            .message
            .contains("refusing to attach the dropping blocklist program to veth0"),
        "{:?}",
        refused.refused
    );
    entry.xdp.as_mut().expect("xdp").allow_management_interface = true;
    let allowed = expand(applied("r1"), &config(&entry), &discovery());
    assert!(allowed.refused.is_empty(), "{:?}", allowed.refused);
    assert_eq!(allowed.goal.values.len(), 2);
}

#[test]
fn a_restarted_agent_changes_nothing_and_a_new_blocklist_keeps_the_program() {
    let node = Node::new();
    let first = run(&node.transactor(), &full());
    assert_eq!(first.state, NodeState::Applied, "{first:?}");
    let id = node.state().attached["veth1"].id;

    // A new agent (new host, same kernel and journal) reads the same values: no write at all.
    let kernel = node.kernel(0);
    let again = run(&node.transactor_with(kernel.clone()), &full());
    assert_eq!(again.state, NodeState::Applied, "{again:?}");
    assert_eq!(kernel.writes.load(Ordering::SeqCst), 0);

    // A new list: the maps change, the program stays attached (same id).
    let kernel = node.kernel(0);
    let r2 = goal(
        "r2",
        vec![
            xdp_entry(
                "veth1",
                XdpProgram::Blocklist,
                XdpMode::Native,
                &["198.19.30.20/32"],
            ),
            xdp_entry("veth2", XdpProgram::Pass, XdpMode::Auto, &[]),
            xdp_entry(GENERIC_ONLY, XdpProgram::Pass, XdpMode::Auto, &[]),
        ],
    );
    let updated = run(&node.transactor_with(kernel.clone()), &r2);
    assert_eq!(updated.state, NodeState::Applied, "{updated:?}");
    assert_eq!(kernel.writes.load(Ordering::SeqCst), 1, "one map write");
    let s = node.state();
    assert_eq!(s.attached["veth1"].id, id);
    assert_eq!(
        s.maps[Path::new("/bpf/hs/veth1/blocklist_v4")],
        ["198.19.30.20/32".parse().expect("prefix")].into()
    );
    assert!(s.maps[Path::new("/bpf/hs/veth1/blocklist_v6")].is_empty());
}

#[test]
fn the_pins_of_an_interface_that_went_away_are_removed_by_the_revert() {
    let node = Node::new();
    let before = node.state();
    let t = node.transactor();
    assert_eq!(run(&t, &full()).state, NodeState::Applied);
    {
        let mut s = node.state.lock().expect("state");
        s.removed.insert("veth1".into());
        s.attached.remove("veth1");
    }
    let r = run(&t, &Goal::revert());
    assert_eq!(r.state, NodeState::Reverted, "{r:?}");
    let mut after = node.state();
    after.removed.clear();
    assert_eq!(after.shape(), before.shape(), "no pin left");
}

#[test]
fn a_new_program_in_the_same_mode_replaces_the_old_one_through_its_link() {
    let node = Node::new();
    assert_eq!(run(&node.transactor(), &full()).state, NodeState::Applied);
    let ops = node.state().ops.len();
    // veth2: pass (native) becomes the blocklist (auto admits native): no detach.
    let r2 = goal(
        "r2",
        vec![
            xdp_entry(
                "veth1",
                XdpProgram::Blocklist,
                XdpMode::Native,
                &["198.19.30.10/32", "2001:db8::/32"],
            ),
            xdp_entry(
                "veth2",
                XdpProgram::Blocklist,
                XdpMode::Auto,
                &["10.0.0.0/8"],
            ),
            xdp_entry(GENERIC_ONLY, XdpProgram::Pass, XdpMode::Auto, &[]),
        ],
    );
    let o = run(&node.transactor(), &r2);
    assert_eq!(o.state, NodeState::Applied, "{o:?}");
    assert_eq!(actual(&o, "xdpProgram", "veth2"), "blocklist/native");
    let s = node.state();
    assert_eq!(s.ops[ops..], ["set_blocklist", "replace"]);
    // And back: the list is released first, then the program replaced again.
    let o = run(&node.transactor(), &full());
    assert_eq!(o.state, NodeState::Applied, "{o:?}");
    assert_eq!(
        node.state().ops[s.ops.len()..],
        ["unpin_blocklist", "replace"]
    );
}

/// Runs `to` from the state `from` leaves, killed at every kernel call in turn and after every
/// write in turn; after each kill the restarted agent recovers, which must leave the state of
/// `from` exactly, and then reaches `to`.
fn every_kill_point(from: &Goal, to: &Goal) {
    let mut kills = 0;
    for by_write in [false, true] {
        for point in 1.. {
            let node = Node::new();
            assert_eq!(run(&node.transactor(), from).state, expected(from));
            let start = node.state().shape();
            let was_killed = if by_write {
                let t = node.transactor();
                let mut writes = 0;
                killed(|| {
                    let _ = t.execute(to, &mut |progress| {
                        if !matches!(progress, Progress::Wrote { .. }) {
                            return;
                        }
                        writes += 1;
                        if writes == point {
                            panic::panic_any(Killed);
                        }
                    });
                })
            } else {
                let t = node.transactor_with(node.kernel(point));
                killed(|| {
                    let _ = t.execute(to, &mut |_| {});
                })
            };
            if !was_killed {
                break;
            }
            kills += 1;
            let restarted = node.transactor();
            restarted.recover(&mut |_| {}).expect("recover");
            assert_eq!(
                node.state().shape(),
                start,
                "killed at {} {point}: recovery restores the state before",
                if by_write { "write" } else { "call" }
            );
            let done = run(&restarted, to);
            assert_eq!(done.state, expected(to), "{done:?}");
        }
    }
    assert!(kills > 4, "only {kills} kill points");
    eprintln!("{kills} kill points, each recovered and completed");
}

fn expected(g: &Goal) -> NodeState {
    if g.target.is_some() {
        NodeState::Applied
    } else {
        NodeState::Reverted
    }
}

#[test]
fn a_kill_at_any_point_of_an_apply_ends_fully_applied_or_fully_reverted() {
    every_kill_point(&Goal::revert(), &full());
}

#[test]
fn a_kill_at_any_point_of_a_revert_ends_fully_applied_or_fully_reverted() {
    every_kill_point(&full(), &Goal::revert());
}

#[test]
fn a_kill_at_any_point_of_a_change_of_program_and_list() {
    let r2 = goal(
        "r2",
        vec![
            xdp_entry("veth1", XdpProgram::Pass, XdpMode::Generic, &[]),
            xdp_entry(
                "veth2",
                XdpProgram::Blocklist,
                XdpMode::Auto,
                &["10.0.0.0/8"],
            ),
        ],
    );
    every_kill_point(&full(), &r2);
}
