//! The fault injectors: each [`FaultKind`] done to a running lab, and healed
//! again before [`inject`] returns (a panic heals too: the guards undo what they did on drop).
//!
//! - `OperatorKill`: SIGKILL of the operator, which dies holding its lease; started again at
//!   once (the same identity takes the lease back). It *hit* when the operator led at the kill
//!   and the lease was held again after it ([`aim::lease_passed_on`]).
//! - `AgentKillInTransaction` / `AgentKillInRevert`: SIGKILL of the first agent seen in the
//!   middle of a transaction to a revision (or of a revert), read from the agents' write logs:
//!   a journal save with a transaction in flight, then the fault's offset into it. The agent is
//!   started again at once and must finish the job from its journal. It *hit* when the journal
//!   on disk still held the transaction, i.e. the kill landed inside it
//!   ([`aim::inside_transaction`]).
//! - `ApiserverRestart`: SIGTERM of kube-apiserver, started again with the same flags.
//! - `EtcdRestart`: SIGKILL of etcd, started again on the same data directory and ports.
//!   Either restart is aimed at a rollout in flight: it comes as soon as a process node's write
//!   log shows a transaction or a revert (up to 200 ms after, by the fault's delay). It *hit*
//!   when, as the audit log read after it shows, a node had an assignment it had not answered
//!   yet as the control plane went down ([`aim::rollout_in_flight`]).
//! - `AgentCutOff`: an nftables table in the node's namespace drops its packets to the API
//!   server for [`CUT_OFF`], longer than the heartbeat's validity, then is deleted. It *hit*
//!   when the audit log shows the node's heartbeat Lease expired inside the cut-off
//!   ([`aim::heartbeat_expired`]).
//! - `AgentKillInWindow`: SIGKILL of the first agent whose write log shows a revision applied
//!   and not confirmed yet (the journal's `provisional` record: the dead-man window), at the
//!   fault's offset into it; started again at once, it must undo the revision on startup and
//!   apply it again. It *hit* when the journal on disk still held the revision provisional
//!   ([`aim::inside_window`]).
//! - `AgentCutOffInWindow`: the first agent seen in its dead-man window cut off as `AgentCutOff`
//!   is, at once, for [`WINDOW_CUT_OFF`], longer than `confirmTimeout`: it must undo the
//!   revision by itself at the deadline, and report it once healed. It *hit* when a journal save
//!   inside the cut-off undid the revision ([`aim::undone_unconfirmed`]).
//! - `StateDirUnwritable`: the state directory of the first agent seen applying a revision
//!   (its write log shows the transaction) made read-only at once (`chattr +i`, which binds
//!   root too) or full (a full tmpfs mounted over it in the agent's mount namespace: ENOSPC),
//!   by the parity of the fault's delay, for [`UNWRITABLE`]; the agent must not report a
//!   revision Failed (its own error is no verdict on the revision: it reports Applying,
//!   Degraded with reason AgentError, and retries), and every host write must have been
//!   journaled first (checked for every write, [`super::record::unjournaled_writes`]). It *hit*
//!   when the agent reported a journal it could not save inside the window
//!   ([`aim::journal_save_refused`]).
//! - `VmReboot`: the power of the first VM node seen in a transaction or a revert cut at the
//!   fault's offset into it (qemu killed: the guest, its agent and any write in flight stop at
//!   once), and the node powered on again: its host back at boot-time values, its agent started
//!   by the guest's init on the journal it had. It *hit* when the journal held the transaction.
//!
//! No fault hits by assumption: each *hit* is decided from the lab's records ([`super::aim`]).

use super::aim;
use super::history::Event;
use super::record;
use super::schedule::{Fault, FaultKind};
use crate::{Lab, Signal};
use hoststack_crds::{agent_lease_name, DEFAULT_NAMESPACE, OPERATOR_LEASE};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long an agent is cut off from the API server: the lab's agents renew their heartbeat
/// every second and it stays valid for three.
pub const CUT_OFF: Duration = Duration::from_secs(5);
/// The dead-man window of the campaign's revisions: the agent's default `confirmTimeout`, which
/// they keep.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an agent is cut off in its dead-man window: longer than [`CONFIRM_TIMEOUT`], whose
/// deadline is at most that long after the cut-off began (the revision was applied before).
pub const WINDOW_CUT_OFF: Duration = Duration::from_secs(65);
/// How long a state directory stays unwritable.
pub const UNWRITABLE: Duration = Duration::from_secs(4);
/// How long a kill, a restart or an unwritable state directory waits for a transaction to begin.
const TRANSACTION_WAIT: Duration = Duration::from_secs(20);
/// A restart comes at most this long after a transaction showed: less than the transaction's
/// shortest run in the lab (three host writes, 150 ms after each), so that its node has not
/// answered yet.
const RESTART_AIM: Duration = Duration::from_millis(200);
/// How long a power cut waits for a VM node's transaction to begin: a VM node comes last in
/// its rollout, after every process node's wave.
const VM_TRANSACTION_WAIT: Duration = Duration::from_secs(90);
/// How long an operator kill waits for the election Lease to be held again: longer than the
/// lease's 15 s and the operator's longest wait to join the election again (30 s).
const LEADER_WAIT: Duration = Duration::from_secs(50);
/// The nftables table of the cut-off (the agent's own is `hoststack`).
const CUT_OFF_TABLE: &str = "hoststack-fault";

/// What one injection did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injected {
    /// The fault as scheduled.
    pub fault: Fault,
    /// The node it hit, for a fault that hits one.
    pub node: Option<String>,
    /// Whether it landed where it was aimed, as the lab's records show ([`super::aim`]).
    pub hit: bool,
    /// What happened, for the report.
    pub note: String,
    /// Something the fault's own check found wrong (a host write while the journal could not be
    /// written).
    pub violation: Option<String>,
}

impl Injected {
    /// A fault that found nothing to hit (`note` says what it waited for).
    fn missed(fault: Fault, note: String) -> Injected {
        Injected {
            fault,
            node: None,
            hit: false,
            note,
            violation: None,
        }
    }
}

/// Injects `fault` into `lab`, whose agents keep write logs, and heals it; `started` is when
/// the step the fault belongs to began (the agent kills watch for transactions from then on).
pub fn inject(lab: &Lab, fault: Fault, started: SystemTime) -> Injected {
    let process_node = || {
        let nodes = process_nodes(lab);
        assert!(!nodes.is_empty(), "{:?} needs a process node", fault.kind);
        nodes[fault.node % nodes.len()].clone()
    };
    match fault.kind {
        FaultKind::OperatorKill => kill_operator(lab, fault),
        FaultKind::AgentKillInTransaction => kill_in_transaction(lab, fault, started, true),
        FaultKind::AgentKillInRevert => kill_in_transaction(lab, fault, started, false),
        FaultKind::AgentKillInWindow => kill_in_window(lab, fault, started),
        FaultKind::ApiserverRestart => restart_control_plane(lab, fault, started, "API server"),
        FaultKind::EtcdRestart => restart_control_plane(lab, fault, started, "etcd"),
        FaultKind::AgentCutOff => cut_off(lab, fault, process_node()),
        FaultKind::AgentCutOffInWindow => cut_off_in_window(lab, fault, started),
        FaultKind::StateDirUnwritable => unwritable(lab, fault, started),
        FaultKind::VmReboot => cut_power_in_transaction(lab, fault, started),
    }
}

/// Kills the operator and starts it again; waits up to [`LEADER_WAIT`] for the election Lease
/// to be held again.
fn kill_operator(lab: &Lab, fault: Fault) -> Injected {
    lab.kill_operator(Signal::Kill);
    let killed = micros(SystemTime::now());
    lab.start_operator();
    let deadline = Instant::now() + LEADER_WAIT;
    let hit = loop {
        let writes = aim::lease_writes(&lab.audit_events(), OPERATOR_LEASE);
        if aim::lease_passed_on(&writes, killed) || Instant::now() >= deadline {
            break aim::lease_passed_on(&writes, killed);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let note = if hit {
        "operator killed while it led, started again; the lease was held again".to_string()
    } else {
        format!("operator killed and started again; it did not lead at the kill, or the lease was not held again within {LEADER_WAIT:?}")
    };
    Injected {
        fault,
        node: None,
        hit,
        note,
        violation: None,
    }
}

/// Restarts the API server or etcd (`what`) as soon as a process node is seen in a
/// transaction or a revert since `started` (from `fault.node` on, within [`TRANSACTION_WAIT`];
/// at once when none is), `fault.delay_ms` (modulo [`RESTART_AIM`]) after it showed. Whether a
/// rollout was in flight as it went down (a node's assignment since `started` not answered yet)
/// is read from the audit log once the control plane is back, which then holds every answer
/// given before it went down.
fn restart_control_plane(lab: &Lab, fault: Fault, started: SystemTime, what: &str) -> Injected {
    let since = micros(started);
    let seen = first_in_flight(
        lab,
        &process_nodes(lab),
        fault.node,
        since,
        None,
        TRANSACTION_WAIT,
        |_| true,
    );
    if seen.is_some() {
        std::thread::sleep(Duration::from_millis(
            fault.delay_ms % RESTART_AIM.as_millis() as u64,
        ));
    }
    let down = micros(SystemTime::now());
    let begun = Instant::now();
    match fault.kind {
        FaultKind::EtcdRestart => lab.restart_etcd(),
        _ => lab.restart_apiserver(),
    }
    let back = begun.elapsed();
    let events = lab.audit_events();
    let assigned: Vec<(u64, String, i64)> = record::from_audit(&events, since, 1)
        .into_iter()
        .filter_map(|t| match t.event {
            Event::Assigned {
                node, generation, ..
            } => Some((t.micros, node, generation)),
            _ => None,
        })
        .collect();
    let hit = aim::rollout_in_flight(&assigned, &record::answers(&events, since), down);
    let aimed = match &seen {
        Some(node) => format!("{node} was seen in a transaction"),
        None => format!("no node began a transaction within {TRANSACTION_WAIT:?}"),
    };
    let when = if hit {
        "while a node's assignment was unanswered"
    } else {
        "with no assignment unanswered"
    };
    Injected {
        fault,
        node: None,
        hit,
        note: format!("{what} restarted {when} ({aimed}); back in {back:.1?}"),
        violation: None,
    }
}

/// Cuts `node` off from the API server for [`CUT_OFF`], noting whether its heartbeat expired
/// meanwhile (its Lease's renewals in the audit log, against the duration the Lease states).
fn cut_off(lab: &Lab, fault: Fault, node: String) -> Injected {
    let from = micros(SystemTime::now());
    let cut = CutOff::new(lab, &node);
    std::thread::sleep(CUT_OFF);
    let until = micros(SystemTime::now());
    drop(cut);
    let lease = agent_lease_name(&node);
    let renewals: Vec<u64> = aim::lease_writes(&lab.audit_events(), &lease)
        .iter()
        .map(|w| w.micros)
        .collect();
    let out = lab.kubectl(&[
        "get",
        "lease",
        "-n",
        DEFAULT_NAMESPACE,
        &lease,
        "-o",
        "json",
    ]);
    let valid_secs = serde_json::from_slice::<Value>(&out.stdout)
        .ok()
        .and_then(|l| l["spec"]["leaseDurationSeconds"].as_u64());
    let hit =
        valid_secs.is_some_and(|s| aim::heartbeat_expired(&renewals, s * 1_000_000, from, until));
    let expired = match (hit, valid_secs) {
        (true, _) => "its heartbeat expired meanwhile".to_string(),
        (false, Some(s)) => format!("its heartbeat (valid {s} s) did not expire"),
        (false, None) => format!("its Lease {lease} could not be read"),
    };
    Injected {
        fault,
        node: Some(node),
        hit,
        note: format!("cut off for {CUT_OFF:?}; {expired}"),
        violation: None,
    }
}

/// The lab's process nodes, which every fault but the VM reboot aims at (a VM node's agent is
/// no lab process, and its traffic is bridged past its namespace's nftables).
fn process_nodes(lab: &Lab) -> Vec<String> {
    let mut nodes = lab.node_names();
    nodes.retain(|n| !lab.is_vm(n));
    nodes
}

/// The first of `nodes` (from `first` on, cyclically) whose write log shows `what` in flight
/// since `since` (`Some(true)`: a transaction to a revision, `Some(false)`: a revert, `None`:
/// either) and for which `alive` holds, within `wait`.
fn first_in_flight(
    lab: &Lab,
    nodes: &[String],
    first: usize,
    since: u64,
    what: Option<bool>,
    wait: Duration,
    alive: impl Fn(&str) -> bool,
) -> Option<String> {
    first_seen(nodes, first, wait, |node| {
        in_flight_since(&lab.write_log(node), since)
            .is_some_and(|to_revision| what.is_none_or(|w| w == to_revision))
            && alive(node)
    })
}

/// The first of `nodes` (from `first` on, cyclically) whose agent runs and whose write log's
/// last journal save since `since` holds a revision applied and not confirmed yet, within
/// `wait`.
fn first_in_window(lab: &Lab, nodes: &[String], first: usize, since: u64) -> Option<String> {
    first_seen(nodes, first, TRANSACTION_WAIT, |node| {
        last_save_since(&lab.write_log(node), since)
            .is_some_and(|j| j["transaction"].is_null() && aim::inside_window(&j))
            && lab.agent_pid(node).is_some()
    })
}

/// The first of `nodes` (from `first` on, cyclically) for which `seen` holds, polled every
/// 10 ms for up to `wait`.
fn first_seen(
    nodes: &[String],
    first: usize,
    wait: Duration,
    seen: impl Fn(&str) -> bool,
) -> Option<String> {
    let order: Vec<&String> = nodes
        .iter()
        .cycle()
        .skip(first % nodes.len().max(1))
        .take(nodes.len())
        .collect();
    let deadline = Instant::now() + wait;
    loop {
        if let Some(node) = order.iter().find(|node| seen(node)) {
            return Some((*node).clone());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Cuts the power of the first VM node seen in a transaction or a revert, `fault.delay_ms`
/// (modulo 400 ms) after its journal showed it, and powers it on again.
fn cut_power_in_transaction(lab: &Lab, fault: Fault, started: SystemTime) -> Injected {
    let vms: Vec<String> = lab
        .node_names()
        .into_iter()
        .filter(|n| lab.is_vm(n))
        .collect();
    assert!(
        !vms.is_empty(),
        "a VM reboot needs a VM node; this lab has none"
    );
    let since = micros(started);
    let found = first_in_flight(
        lab,
        &vms,
        fault.node,
        since,
        None,
        VM_TRANSACTION_WAIT,
        |_| true,
    );
    let Some(node) = found else {
        let note = format!("no VM node began a transaction within {VM_TRANSACTION_WAIT:?}");
        return Injected::missed(fault, note);
    };
    std::thread::sleep(Duration::from_millis(fault.delay_ms % 400));
    lab.cut_vm_power(&node);
    let cut = journal(lab, &node);
    let hit = aim::inside_transaction(&cut);
    let booted = lab.power_on_vm(&node);
    let what = match &cut["transaction"] {
        Value::Null => "after its transaction ended".to_string(),
        t if t["target"].is_null() => "in a revert".to_string(),
        t => format!("in a transaction to {}", t["target"]["revision"]),
    };
    Injected {
        fault,
        node: Some(node),
        hit,
        note: format!("power cut {what}; ready again in {booted:.1?}"),
        violation: None,
    }
}

/// Kills the first agent seen in a transaction (`to_revision`) or a revert, from `fault.node`
/// on, `fault.delay_ms` (modulo 400 ms) after its journal showed the transaction.
fn kill_in_transaction(
    lab: &Lab,
    fault: Fault,
    started: SystemTime,
    to_revision: bool,
) -> Injected {
    let processes = process_nodes(lab);
    let since = micros(started);
    let what = if to_revision {
        "a transaction"
    } else {
        "a revert"
    };
    let found = first_in_flight(
        lab,
        &processes,
        fault.node,
        since,
        Some(to_revision),
        TRANSACTION_WAIT,
        |node| lab.agent_pid(node).is_some(),
    );
    let Some(node) = found else {
        let note = format!("no agent began {what} within {TRANSACTION_WAIT:?}");
        return Injected::missed(fault, note);
    };
    std::thread::sleep(Duration::from_millis(fault.delay_ms % 400));
    lab.kill_agent(&node, Signal::Kill);
    let hit = aim::inside_transaction(&journal(lab, &node));
    lab.start_agent(&node, &[]);
    let note = if hit {
        format!("killed in {what}")
    } else {
        format!("killed just after {what} ended")
    };
    Injected {
        fault,
        node: Some(node),
        hit,
        note,
        violation: None,
    }
}

/// Whether the last journal save in the write log at `path` (at or after `since`) has a
/// transaction in flight: `Some(true)` to a revision, `Some(false)` a revert, `None` none.
fn in_flight_since(path: &Path, since: u64) -> Option<bool> {
    let last = last_save_since(path, since)?;
    let transaction = &last["transaction"];
    (!transaction.is_null()).then(|| !transaction["target"].is_null())
}

/// The journal as the last save in the write log at `path` left it, if that save came at or
/// after `since`.
fn last_save_since(path: &Path, since: u64) -> Option<Value> {
    let log = std::fs::read_to_string(path).ok()?;
    let mut last = log
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|entry| entry.get("journal").is_some())
        .filter(|entry| entry["micros"].as_u64().is_some_and(|m| m >= since))?;
    Some(last["journal"].take())
}

/// Kills the first agent seen with a revision applied and not confirmed yet, from `fault.node`
/// on, `fault.delay_ms` (modulo 400 ms) after its journal showed it, and starts it again at
/// once: it must undo the revision on startup (the journal's provisional record) and apply it
/// again with a new window.
fn kill_in_window(lab: &Lab, fault: Fault, started: SystemTime) -> Injected {
    let Some(node) = first_in_window(lab, &process_nodes(lab), fault.node, micros(started)) else {
        let note =
            format!("no agent's revision waited for its confirmation within {TRANSACTION_WAIT:?}");
        return Injected::missed(fault, note);
    };
    std::thread::sleep(Duration::from_millis(fault.delay_ms % 400));
    lab.kill_agent(&node, Signal::Kill);
    let hit = aim::inside_window(&journal(lab, &node));
    lab.start_agent(&node, &[]);
    let note = if hit {
        "killed between its transaction and its confirmation"
    } else {
        "killed just after its revision was confirmed"
    };
    Injected {
        fault,
        node: Some(node),
        hit,
        note: note.to_string(),
        violation: None,
    }
}

/// Cuts the first agent seen with a revision applied and not confirmed yet (from `fault.node`
/// on) off from the API server at once, for [`WINDOW_CUT_OFF`]: it cannot confirm, and must
/// undo the revision by itself at its deadline. It hit when a journal save inside the cut-off
/// undid the revision ([`aim::undone_unconfirmed`]).
fn cut_off_in_window(lab: &Lab, fault: Fault, started: SystemTime) -> Injected {
    let Some(node) = first_in_window(lab, &process_nodes(lab), fault.node, micros(started)) else {
        let note =
            format!("no agent's revision waited for its confirmation within {TRANSACTION_WAIT:?}");
        return Injected::missed(fault, note);
    };
    let from = micros(SystemTime::now());
    let cut = CutOff::new(lab, &node);
    std::thread::sleep(WINDOW_CUT_OFF);
    let until = micros(SystemTime::now());
    drop(cut);
    let log = std::fs::read_to_string(lab.write_log(&node)).unwrap_or_default();
    let hit = aim::undone_unconfirmed(&log, from, until);
    let undone = if hit {
        "it undid its unconfirmed revision meanwhile"
    } else {
        "it undid no unconfirmed revision meanwhile"
    };
    Injected {
        fault,
        node: Some(node),
        hit,
        note: format!("cut off in its dead-man window for {WINDOW_CUT_OFF:?}; {undone}"),
        violation: None,
    }
}

/// Makes the state directory of the first process node seen in a transaction to a revision
/// since `started` (from `fault.node` on, within [`TRANSACTION_WAIT`]; `fault.node`'s when none
/// is) unwritable at once, for [`UNWRITABLE`]: its next journal save, before its next write or
/// at the transaction's end, falls inside the window. Checks that the agent reported no
/// revision Failed meanwhile (its own error is no verdict on a revision); it hit when a report
/// meanwhile was the error of a journal save ([`aim::journal_save_refused`]). That every host
/// write meanwhile was journaled first is the campaign's check of every write
/// ([`record::unjournaled_writes`]).
fn unwritable(lab: &Lab, fault: Fault, started: SystemTime) -> Injected {
    let nodes = process_nodes(lab);
    let seen = first_in_flight(
        lab,
        &nodes,
        fault.node,
        micros(started),
        Some(true),
        TRANSACTION_WAIT,
        |node| lab.agent_pid(node).is_some(),
    );
    let aimed = if seen.is_some() {
        "as it applied a revision"
    } else {
        "with no transaction seen"
    };
    let node = seen.unwrap_or_else(|| nodes[fault.node % nodes.len()].clone());
    let from = micros(SystemTime::now());
    let dir = lab.agent_state_dir(&node);
    // An odd delay makes the directory read-only, an even one full (when the agent runs: the
    // full directory is mounted in its own mount namespace).
    let full = fault
        .delay_ms
        .is_multiple_of(2)
        .then(|| lab.agent_pid(&node))
        .flatten()
        .and_then(|pid| Full::new(pid, dir));
    let how = if full.is_some() { "full" } else { "read-only" };
    let immutable = full.is_none().then(|| Immutable::new(dir));
    std::thread::sleep(UNWRITABLE);
    let until = micros(SystemTime::now());
    drop((immutable, full));
    let reports: Vec<(u64, String, String)> =
        record::from_audit_reports(&lab.audit_events(), &node)
            .into_iter()
            .filter(|(m, _, _)| *m > from && *m < until)
            .collect();
    let hit = aim::journal_save_refused(&reports, from, until);
    let violation = reports
        .iter()
        .find(|(_, state, _)| state == "Failed")
        .map(|(_, _, m)| {
            format!("{node} reported a revision Failed while its journal could not be saved: {m}")
        });
    let saves = if hit {
        "a journal save failed meanwhile"
    } else {
        "no journal save was tried meanwhile"
    };
    Injected {
        fault,
        node: Some(node.clone()),
        hit,
        note: format!("state directory {how} for {UNWRITABLE:?} {aimed}; {saves}"),
        violation,
    }
}

/// `node`'s journal as it is on disk (null when it is missing or unreadable).
pub fn journal(lab: &Lab, node: &str) -> Value {
    std::fs::read_to_string(lab.agent_state_dir(node).join("journal.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

/// Microseconds since the epoch.
pub fn micros(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A node cut off from the API server until dropped.
pub struct CutOff<'a> {
    lab: &'a Lab,
    node: String,
}

impl<'a> CutOff<'a> {
    /// Drops every packet `node` sends to the API server.
    pub fn new(lab: &'a Lab, node: &str) -> CutOff<'a> {
        let url = lab.api_url();
        let authority = url.trim_start_matches("https://");
        let (host, port) = authority
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("the API server's URL {url} has no port"));
        let rules = format!(
            "add table ip {CUT_OFF_TABLE}; add chain ip {CUT_OFF_TABLE} out {{ type filter hook output priority 0; }}; add rule ip {CUT_OFF_TABLE} out ip daddr {host} tcp dport {port} drop"
        );
        let out = lab.exec_in_node(node, &["nft", &rules]);
        assert!(
            out.status.success(),
            "cutting {node} off: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        CutOff {
            lab,
            node: node.to_string(),
        }
    }
}

impl Drop for CutOff<'_> {
    fn drop(&mut self) {
        let out = self
            .lab
            .exec_in_node(&self.node, &["nft", "delete", "table", "ip", CUT_OFF_TABLE]);
        if !out.status.success() {
            eprintln!(
                "healing {}'s cut-off: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A directory made immutable (`chattr +i`) until dropped: nothing can be created, renamed or
/// removed in it, by root either.
struct Immutable {
    dir: PathBuf,
}

impl Immutable {
    fn new(dir: &Path) -> Immutable {
        chattr(dir, "+i");
        Immutable {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr(&self.dir, "-i");
    }
}

/// A full state directory: in the agent's mount namespace (process `pid`), a 64 KiB tmpfs that
/// holds a copy of the directory and a filler taking the rest of its space is bind-mounted over
/// it, so that the agent's next journal save fails with ENOSPC. Dropping it unmounts both; the
/// directory below was never written meanwhile. A killed agent takes the mounts with its
/// namespace.
struct Full {
    pid: u32,
    dir: PathBuf,
    tmpfs: PathBuf,
}

impl Full {
    /// `None` when the mounts could not be made (the agent exited meanwhile).
    fn new(pid: u32, dir: &Path) -> Option<Full> {
        let tmpfs = dir.with_file_name("state-full");
        std::fs::create_dir_all(&tmpfs).ok()?;
        let (d, t) = (dir.display(), tmpfs.display());
        let script = format!(
            "set -e; mount -t tmpfs -o size=64k hoststack-full '{t}'; cp -a '{d}/.' '{t}/'; \
             dd if=/dev/zero of='{t}/filler' bs=4k 2>/dev/null || true; \
             mount --bind '{t}' '{d}'"
        );
        let full = Full {
            pid,
            dir: dir.to_path_buf(),
            tmpfs,
        };
        full.in_namespace(&script).then_some(full)
    }

    /// Runs `script` with sh in the agent's mount namespace; whether it succeeded.
    fn in_namespace(&self, script: &str) -> bool {
        std::process::Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-m", "sh", "-c", script])
            .output()
            .is_ok_and(|out| out.status.success())
    }
}

impl Drop for Full {
    fn drop(&mut self) {
        let (d, t) = (self.dir.display(), self.tmpfs.display());
        self.in_namespace(&format!("umount '{d}'; umount '{t}'"));
        let _ = std::fs::remove_dir(&self.tmpfs);
    }
}

fn chattr(dir: &Path, flag: &str) {
    let out = std::process::Command::new("chattr")
        .arg(flag)
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running chattr: {e}"));
    assert!(
        out.status.success(),
        "chattr {flag} {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_journal_save_since_a_time_tells_what_is_in_flight() {
        let dir = std::env::temp_dir().join(format!("hoststack-inject-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("writes.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"micros\": 5, \"journal\": {\"transaction\": {\"target\": {\"revision\": \"r\"}}}}\n",
                "{\"micros\": 6, \"wrote\": {\"target\": \"a\"}}\n",
            ),
        )
        .unwrap();
        assert_eq!(in_flight_since(&path, 0), Some(true));
        assert_eq!(in_flight_since(&path, 6), None);
        std::fs::write(
            &path,
            "{\"micros\": 7, \"journal\": {\"transaction\": {\"before\": []}}}\n",
        )
        .unwrap();
        assert_eq!(in_flight_since(&path, 0), Some(false));
        std::fs::write(&path, "{\"micros\": 8, \"journal\": {\"originals\": []}}\n").unwrap();
        assert_eq!(in_flight_since(&path, 0), None);
        assert_eq!(in_flight_since(&dir.join("none"), 0), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
