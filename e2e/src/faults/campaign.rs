//! A fault campaign on a real lab: for each seeded [`Schedule`], a rollout script over four
//! process nodes (or three and a VM node, [`vm_lab_config`], for the VM reboot) while the
//! schedule's faults are injected ([`super::inject`]); then the schedule's whole
//! [`super::history::History`], read from the lab's records ([`super::record`]), is checked
//! against the invariants ([`super::invariants::check`]).
//!
//! The script, on tuning [`TUNING`] (canary 1, maxUnavailable 1): apply revision A, change it
//! to B (which adds the agent's nftables table and an XDP program on eth0), change it to C,
//! which the kernel refuses at its last write (so the canary fails after writing the others,
//! and the rollout goes back to B), then delete the tuning. The revisions keep the default
//! probes: each applied revision is provisional (the dead-man window) until the agent's
//! API-server read-back confirms it, within [`super::inject::CONFIRM_TIMEOUT`]. After each step the campaign waits
//! until the rollout and every agent have settled, and reads the hosts: a quiet point of the
//! history. A step that does not settle within [`SETTLE`] is a failure of its own (liveness),
//! and so is anything left behind after the delete: a journal entry, the nftables table, a
//! pinned BPF object ([`leftovers`]), and any host write not journaled first
//! ([`record::unjournaled_writes`]).

use super::history::{Event, History, Outcome, Purpose, Values};
use super::inject::{self, micros, Injected};
use super::invariants::{self, Violation};
use super::record::{self, Timed};
use super::schedule::{Fault, FaultKind, Schedule, Script};
use crate::vm::GUEST_BPFFS_ROOT;
use crate::{Lab, LabConfig, NodeSpec};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant, SystemTime};

/// The tuning the campaign rolls out.
pub const TUNING: &str = "faults";

/// The script's shape: four steps over four nodes, three faults a schedule, each up to 4 s into
/// its step.
pub const SCRIPT: Script = Script {
    steps: 4,
    nodes: 4,
    faults: 3,
    max_delay_ms: 4000,
};

/// The fault kinds a process-node lab can take: all but the VM reboot, which comes last.
pub const KINDS: &[FaultKind] = FaultKind::ALL.split_at(FaultKind::ALL.len() - 1).0;

/// The fault kinds of the campaign on [`vm_lab_config`]'s lab: the VM reboot (the others are
/// the process-node campaign's).
pub const VM_KINDS: &[FaultKind] = &[FaultKind::VmReboot];

/// The VM node of [`vm_lab_config`].
pub const VM_NODE: &str = "vm-a";

/// How long a step may take to settle once its faults are healed.
pub const SETTLE: Duration = Duration::from_secs(240);

/// The revisions' sysctls, in script order. Fresh network namespaces hold 4096, 60, 7200 and 6.
const REVISIONS: [&[(&str, &str)]; 3] = [
    &[
        ("net.core.somaxconn", "1024"),
        ("net.ipv4.tcp_fin_timeout", "30"),
        ("net.ipv4.tcp_keepalive_time", "600"),
    ],
    &[
        ("net.core.somaxconn", "2048"),
        ("net.ipv4.tcp_fin_timeout", "25"),
        ("net.ipv4.tcp_keepalive_time", "900"),
    ],
    // tcp_syn_retries takes at most 127: the kernel refuses this last write of the transaction.
    &[
        ("net.core.somaxconn", "3072"),
        ("net.ipv4.tcp_fin_timeout", "20"),
        ("net.ipv4.tcp_keepalive_time", "1200"),
        ("net.ipv4.tcp_syn_retries", "200"),
    ],
];

/// What revision B adds beside its sysctls: the agent's nftables table and an XDP program
/// (the pass program, which the agent allows on the interface of the default route).
const B_EXTRAS: &str = "  firewall:\n    blockedPrefixes: [192.0.2.0/24]\n  interfaces:\n  - match:\n      name: eth0\n    xdp:\n      program: Pass\n      mode: Generic\n";

/// The script's last step, the delete.
const DELETE_STEP: usize = 3;

/// The lab a campaign runs on: four process nodes in pool=edge whose agents keep write logs,
/// renew their heartbeat every second and pause 150 ms after each host write (so that a kill
/// can land inside a transaction).
pub fn lab_config() -> LabConfig {
    let mut config = LabConfig::with_nodes(SCRIPT.nodes);
    config.nodes = config
        .nodes
        .iter()
        .map(|n| NodeSpec::process(n.name.clone()).label("pool", "edge"))
        .collect();
    config.agent_args = ["--heartbeat-interval", "1s", "--step-delay", "150ms"]
        .map(String::from)
        .to_vec();
    config.record_writes = true;
    config
}

/// The lab of the VM campaign: [`lab_config`]'s with its last process node replaced by VM node
/// [`VM_NODE`], which comes last in each rollout.
pub fn vm_lab_config() -> LabConfig {
    let mut config = lab_config();
    config.nodes.pop();
    config
        .nodes
        .push(NodeSpec::vm(VM_NODE).label("pool", "edge"));
    config
}

/// The step a fault fires in: a kill in a revert fires in the delete (no other step reverts),
/// a kill in a transaction and an unwritable state directory (aimed at a transaction's journal
/// saves) in one of the three applies, a kill or a cut-off in the dead-man window in A or B
/// (C's transaction fails: it is never provisional, nor is a revert), a power cut in a step where the VM node runs a
/// transaction (not C's, which the canary fails before the VM node's turn).
pub fn step_of(fault: &Fault) -> usize {
    match fault.kind {
        FaultKind::AgentKillInRevert => DELETE_STEP,
        FaultKind::AgentKillInTransaction | FaultKind::StateDirUnwritable => {
            fault.step % DELETE_STEP
        }
        FaultKind::AgentKillInWindow | FaultKind::AgentCutOffInWindow => fault.step % 2,
        FaultKind::VmReboot => [0, 1, DELETE_STEP][fault.step % 3],
        _ => fault.step % SCRIPT.steps,
    }
}

/// What one schedule did and found.
#[derive(Debug)]
pub struct ScheduleReport {
    /// The schedule.
    pub schedule: Schedule,
    /// Each injection.
    pub injected: Vec<Injected>,
    /// The invariants its history broke.
    pub violations: Vec<Violation>,
    /// Steps that did not settle, and faults' own findings.
    pub failures: Vec<String>,
    /// Its history, as checked.
    pub history: History,
    /// How long it took.
    pub took: Duration,
}

impl ScheduleReport {
    /// Whether the schedule found nothing wrong.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.failures.is_empty()
    }
}

/// A campaign's reports.
#[derive(Debug, Default)]
pub struct Report {
    /// One per schedule, in the order run.
    pub schedules: Vec<ScheduleReport>,
}

impl Report {
    /// Faults of `kind` injected, and how many of them hit what they aim at.
    pub fn injected(&self, kind: FaultKind) -> (usize, usize) {
        let of_kind = self
            .schedules
            .iter()
            .flat_map(|s| &s.injected)
            .filter(|i| i.fault.kind == kind);
        of_kind.fold((0, 0), |(n, hit), i| (n + 1, hit + usize::from(i.hit)))
    }

    /// How many events of the checked histories `kind` names (as [`event_kind`] does).
    pub fn events(&self, kind: &str) -> usize {
        self.schedules
            .iter()
            .flat_map(|s| &s.history.events)
            .filter(|e| event_kind(e) == kind)
            .count()
    }

    /// The schedules that found something wrong.
    pub fn failed(&self) -> Vec<&ScheduleReport> {
        self.schedules.iter().filter(|s| !s.passed()).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let events: usize = self.schedules.iter().map(|s| s.history.events.len()).sum();
        let took: Duration = self.schedules.iter().map(|s| s.took).sum();
        writeln!(
            f,
            "{} schedules, {events} events checked, {:.0} s",
            self.schedules.len(),
            took.as_secs_f64()
        )?;
        let kinds = EVENT_KINDS.map(|k| format!("{k} {}", self.events(k)));
        writeln!(f, "events: {}", kinds.join(", "))?;
        writeln!(f, "{:<24} {:>8} {:>5}", "fault", "injected", "hit")?;
        for kind in FaultKind::ALL {
            let (n, hit) = self.injected(kind);
            if n > 0 {
                writeln!(f, "{:<24} {n:>8} {hit:>5}", format!("{kind:?}"))?;
            }
        }
        let failed = self.failed();
        writeln!(f, "schedules that found something wrong: {}", failed.len())?;
        for s in failed {
            writeln!(f, "{}", s.schedule)?;
            for v in &s.violations {
                writeln!(f, "  {v}")?;
            }
            for failure in &s.failures {
                writeln!(f, "  {failure}")?;
            }
        }
        Ok(())
    }
}

/// The names [`event_kind`] gives, in the report's order.
pub const EVENT_KINDS: [&str; 12] = [
    "assigned",
    "defined",
    "apply-write",
    "revert-write",
    "applied",
    "failed",
    "reverted",
    "journaled",
    "released",
    "rolled-back",
    "deleted",
    "quiet",
];

/// A short name of `event`'s kind, for counting ("applied", "failed" and "reverted" are
/// reports; "quiet" a quiet point).
pub fn event_kind(event: &Event) -> &'static str {
    match event {
        Event::Defined { .. } => "defined",
        Event::Baseline { .. } => "baseline",
        Event::Rollout { .. } => "rollout",
        Event::Assigned { .. } => "assigned",
        Event::HostWrite {
            purpose: Purpose::Apply(_),
            ..
        } => "apply-write",
        Event::HostWrite { .. } => "revert-write",
        Event::Reported { outcome, .. } => match outcome {
            Outcome::Applied => "applied",
            Outcome::Failed => "failed",
            Outcome::Reverted => "reverted",
        },
        Event::Journaled { .. } => "journaled",
        Event::Released { .. } => "released",
        Event::RolledBack { .. } => "rolled-back",
        Event::Deleted => "deleted",
        Event::Quiescent { .. } => "quiet",
    }
}

/// Runs every schedule on `lab` (made from [`lab_config`]), one after another, printing each
/// schedule's lines as it ends: its faults, whether each hit as the records show, and what it
/// found wrong.
pub fn run(lab: &Lab, schedules: &[Schedule]) -> Report {
    let mut report = Report::default();
    for schedule in schedules {
        let one = run_schedule(lab, schedule);
        eprintln!(
            "{} -> {} ({} events, {:.0} s)",
            one.schedule,
            if one.passed() { "ok" } else { "FAILED" },
            one.history.events.len(),
            one.took.as_secs_f64()
        );
        for injected in &one.injected {
            let node = injected.node.as_deref().unwrap_or("-");
            let hit = if injected.hit { "hit" } else { "missed" };
            eprintln!(
                "  {:?} {node} [{hit}]: {}",
                injected.fault.kind, injected.note
            );
        }
        for found in one.violations.iter().map(ToString::to_string) {
            eprintln!("  violation: {found}");
        }
        for failure in &one.failures {
            eprintln!("  failure: {failure}");
        }
        report.schedules.push(one);
    }
    report
}

/// Runs the script once under `schedule`'s faults and checks its history.
pub fn run_schedule(lab: &Lab, schedule: &Schedule) -> ScheduleReport {
    let begun = Instant::now();
    let started = SystemTime::now();
    let nodes = lab.node_names();
    let mut own = Vec::new();
    let at = |event: Event| Timed {
        micros: micros(SystemTime::now()),
        event,
    };
    for node in &nodes {
        let values = host(lab, node);
        own.push(at(Event::Baseline {
            node: node.clone(),
            values,
        }));
    }
    own.push(at(Event::Rollout {
        stable: None,
        max_unavailable: 1,
    }));
    let mut injected = Vec::new();
    let mut failures = Vec::new();
    for step in 0..SCRIPT.steps {
        let faults: Vec<Fault> = schedule
            .faults
            .iter()
            .filter(|f| step_of(f) == step)
            .copied()
            .collect();
        let (done, mut hits) = run_step(lab, step, &faults);
        failures.extend(hits.iter().filter_map(|i| i.violation.clone()));
        injected.append(&mut hits);
        let settled = done.and_then(|()| settle(lab, step));
        match settled {
            Ok(()) => {
                let hosts = nodes.iter().map(|n| (n.clone(), host(lab, n))).collect();
                own.push(at(Event::Quiescent { hosts }));
                if step == DELETE_STEP {
                    failures.extend(leftovers(lab));
                }
            }
            Err(why) => {
                failures.push(format!("step {step}: {why}"));
                clean_up(lab);
                break;
            }
        }
    }
    let logs: Vec<(String, String)> = nodes
        .iter()
        .map(|n| {
            let log = std::fs::read_to_string(lab.write_log(n)).unwrap_or_default();
            (n.clone(), log)
        })
        .collect();
    for (node, log) in &logs {
        failures.extend(record::unjournaled_writes(node, log, micros(started)));
    }
    let history = history(lab, own, &logs, started);
    ScheduleReport {
        schedule: schedule.clone(),
        injected,
        violations: invariants::check(&history),
        failures,
        history,
        took: begun.elapsed(),
    }
}

/// Starts step `step` and injects `faults` beside it; returns once both are done (the step's
/// action accepted, the faults healed), with what each injection did, in `faults`' order.
///
/// Faults on different parts ([`part`]) overlap, each at its own time; faults on one part take
/// turns in the schedule's order. So an agent kill watches for its transaction from the step's
/// start even while a cut-off or a restart of another part runs.
fn run_step(lab: &Lab, step: usize, faults: &[Fault]) -> (Result<(), String>, Vec<Injected>) {
    let started = SystemTime::now();
    let mut parts: BTreeMap<u8, Vec<(usize, Fault)>> = BTreeMap::new();
    for (i, fault) in faults.iter().enumerate() {
        parts.entry(part(fault.kind)).or_default().push((i, *fault));
    }
    std::thread::scope(|scope| {
        let injectors: Vec<_> = parts
            .into_values()
            .map(|turns| {
                scope.spawn(move || {
                    turns
                        .into_iter()
                        .map(|(i, fault)| {
                            // The faults that aim at a transaction watch for it from the
                            // step's start and take their delay, if any, from when they see it.
                            if !aims_at_a_transaction(fault.kind) {
                                let due = started + Duration::from_millis(fault.delay_ms);
                                if let Ok(wait) = due.duration_since(SystemTime::now()) {
                                    std::thread::sleep(wait);
                                }
                            }
                            (i, inject::inject(lab, fault, started))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let done = act(lab, step);
        let mut injected: Vec<(usize, Injected)> = injectors
            .into_iter()
            .flat_map(|t| t.join().expect("an injector thread panicked"))
            .collect();
        injected.sort_by_key(|(i, _)| *i);
        (done, injected.into_iter().map(|(_, inj)| inj).collect())
    })
}

/// Whether faults of `kind` watch for a transaction (or a revert) from their step's start and
/// fire when they see one, rather than at their delay into the step.
fn aims_at_a_transaction(kind: FaultKind) -> bool {
    !matches!(kind, FaultKind::OperatorKill | FaultKind::AgentCutOff)
}

/// The part of the lab a fault acts on: the operator, the agents' processes, the control plane,
/// the nodes' network, the state directories, the VM.
fn part(kind: FaultKind) -> u8 {
    match kind {
        FaultKind::OperatorKill => 0,
        FaultKind::AgentKillInTransaction
        | FaultKind::AgentKillInRevert
        | FaultKind::AgentKillInWindow => 1,
        FaultKind::ApiserverRestart | FaultKind::EtcdRestart => 2,
        FaultKind::AgentCutOff | FaultKind::AgentCutOffInWindow => 3,
        FaultKind::StateDirUnwritable => 4,
        FaultKind::VmReboot => 5,
    }
}

/// Step `step`'s action, retried while the API server cannot take it (a fault may have it down).
fn act(lab: &Lab, step: usize) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let result = match step {
            DELETE_STEP => {
                let out = lab.kubectl(&["delete", "networktuning", TUNING, "--wait=false"]);
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                if out.status.success() || stderr.contains("NotFound") {
                    Ok(String::new())
                } else {
                    Err(stderr)
                }
            }
            _ => lab.apply_yaml(&tuning_yaml(step)),
        };
        match result {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("its action was refused for {SETTLE:?}: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

/// The campaign's NetworkTuning at revision `index` (0 is A).
fn tuning_yaml(index: usize) -> String {
    let mut yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {TUNING}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  rollout:\n    canary: 1\n    maxUnavailable: 1\n  sysctls:\n"
    );
    for (key, value) in REVISIONS[index] {
        yaml.push_str(&format!("    {key}: \"{value}\"\n"));
    }
    if index == 1 {
        yaml.push_str(B_EXTRAS);
    }
    yaml
}

/// What the agents left behind after a delete settled: an nftables table `hoststack` in a
/// node's namespace (a VM node's guest), or a pinned BPF object under its bpffs root.
/// (Journal entries are part of settling.)
pub fn leftovers(lab: &Lab) -> Vec<String> {
    let mut found = Vec::new();
    for node in lab.node_names() {
        let (tables, pins): (String, Vec<String>) = if lab.is_vm(&node) {
            let vm = lab.vm(&node);
            let pins = vm.run(&format!(
                "find {GUEST_BPFFS_ROOT} -type f 2>/dev/null; true"
            ));
            (
                vm.run("nft list tables"),
                pins.lines().map(String::from).collect(),
            )
        } else {
            let tables = lab.exec_in_node(&node, &["nft", "list", "tables"]);
            let pins = walk(&lab.agent_bpffs_root(&node));
            let pins = pins.iter().map(|p| p.display().to_string()).collect();
            (String::from_utf8_lossy(&tables.stdout).into_owned(), pins)
        };
        if tables.lines().any(|l| l.trim() == "table inet hoststack") {
            found.push(format!("{node} kept the nftables table inet hoststack"));
        }
        if !pins.is_empty() {
            found.push(format!("{node} kept BPF pins: {pins:?}"));
        }
    }
    found
}

/// The files below `dir` (none when it does not exist).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .flat_map(|e| {
            let path = e.path();
            if path.is_dir() {
                walk(&path)
            } else {
                vec![path]
            }
        })
        .collect()
}

/// Waits until step `step` has settled: the rollout ended for the tuning's current spec (or,
/// after the delete, the tuning is gone), every agent answered its NodeTuning's current
/// generation and is not applying, and no journal holds a transaction (after the delete: every
/// journal is empty).
fn settle(lab: &Lab, step: usize) -> Result<(), String> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let Err(why) = settled(lab, step) else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(format!("did not settle within {SETTLE:?}: {why}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `Ok` when step `step` has settled ([`settle`]), else what it waits for.
fn settled(lab: &Lab, step: usize) -> Result<(), String> {
    let tuning = get(lab, &["get", "networktunings", "-o", "json"])?;
    let tuning = tuning["items"]
        .as_array()
        .and_then(|items| items.iter().find(|t| t["metadata"]["name"] == TUNING));
    match (step, tuning) {
        (DELETE_STEP, Some(_)) => return Err("the tuning is not gone yet".into()),
        (DELETE_STEP, None) => {}
        (_, None) => return Err("the tuning does not exist".into()),
        (_, Some(t)) => {
            let phase = t["status"]["phase"].as_str().unwrap_or_default();
            if t["status"]["observedGeneration"] != t["metadata"]["generation"]
                || !matches!(phase, "Complete" | "RolledBack" | "Failed")
            {
                return Err(format!("the rollout is {phase:?}"));
            }
        }
    }
    let node_tunings = get(lab, &["get", "nodetunings", "-o", "json"])?;
    let by_name: BTreeMap<&str, &Value> = node_tunings["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|nt| Some((nt["metadata"]["name"].as_str()?, nt)))
        .collect();
    for node in lab.node_names() {
        let journal = inject::journal(lab, &node);
        if !journal["transaction"].is_null() {
            return Err(format!("{node}'s journal holds a transaction"));
        }
        let nt = by_name.get(node.as_str());
        if step == DELETE_STEP {
            let originals = journal["originals"].as_array().map_or(0, Vec::len);
            if originals > 0 || !journal["applied"].is_null() {
                return Err(format!(
                    "{node}'s journal still manages {originals} settings"
                ));
            }
            if nt.is_some_and(|nt| !nt["spec"]["revision"].is_null()) {
                return Err(format!("{node} still has a revision"));
            }
            continue;
        }
        let Some(nt) = nt else {
            return Err(format!("{node} has no NodeTuning"));
        };
        let state = nt["status"]["state"].as_str().unwrap_or_default();
        let answered = nt["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["observedGeneration"].as_i64())
            .max();
        if !matches!(state, "Applied" | "Failed" | "Reverted")
            || answered < nt["metadata"]["generation"].as_i64()
        {
            return Err(format!(
                "{node} is {state:?} (answered generation {answered:?})"
            ));
        }
    }
    Ok(())
}

/// `kubectl <args>` as JSON, or why not.
fn get(lab: &Lab, args: &[&str]) -> Result<Value, String> {
    let out = lab.kubectl(args);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl {args:?}: {e}"))
}

/// Deletes the tuning after a step that did not settle, and waits for the delete to settle, so
/// that the next schedule starts from clean hosts.
fn clean_up(lab: &Lab) {
    if act(lab, DELETE_STEP).is_ok() {
        let _ = settle(lab, DELETE_STEP);
    }
}

/// `node`'s host: every sysctl any revision sets.
fn host(lab: &Lab, node: &str) -> Values {
    let mut keys: Vec<&str> = REVISIONS
        .iter()
        .flat_map(|r| r.iter().map(|(k, _)| *k))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_iter()
        .map(|key| (key.to_string(), lab.sysctl(node, key)))
        .collect()
}

/// The schedule's history since `started`: the campaign's own events (baselines, quiet points)
/// with the audit log's and those of every agent's write log in `logs` (node, log).
fn history(lab: &Lab, own: Vec<Timed>, logs: &[(String, String)], started: SystemTime) -> History {
    let since = micros(started);
    let mut parts = vec![own, record::from_audit(&lab.audit_events(), since, 1)];
    parts.extend(
        logs.iter()
            .map(|(node, log)| record::from_write_log(node, log)),
    );
    record::merge(parts, since)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_node_lab_takes_every_kind_but_the_vm_reboot() {
        assert_eq!(KINDS.len(), FaultKind::ALL.len() - 1);
        assert!(!KINDS.contains(&FaultKind::VmReboot));
    }

    #[test]
    fn the_vm_lab_has_the_script_s_nodes_with_the_vm_node_last() {
        let config = vm_lab_config();
        assert_eq!(config.nodes.len(), SCRIPT.nodes);
        assert_eq!(config.nodes.last().map(|n| n.name.as_str()), Some(VM_NODE));
        assert!(config.nodes.iter().all(|n| n.labels["pool"] == "edge"));
    }

    #[test]
    fn kills_fire_in_the_steps_that_have_what_they_aim_at() {
        let fault = |kind, step| Fault {
            kind,
            step,
            delay_ms: 0,
            node: 0,
        };
        assert_eq!(
            step_of(&fault(FaultKind::AgentKillInRevert, 0)),
            DELETE_STEP
        );
        assert_eq!(step_of(&fault(FaultKind::AgentKillInTransaction, 3)), 0);
        assert_eq!(step_of(&fault(FaultKind::AgentKillInTransaction, 2)), 2);
        assert_eq!(step_of(&fault(FaultKind::EtcdRestart, 3)), 3);
        assert_eq!(step_of(&fault(FaultKind::StateDirUnwritable, 3)), 0);
        assert_eq!(step_of(&fault(FaultKind::StateDirUnwritable, 2)), 2);
        assert_eq!(step_of(&fault(FaultKind::AgentKillInWindow, 2)), 0);
        assert_eq!(step_of(&fault(FaultKind::AgentCutOffInWindow, 3)), 1);
        let reboots: Vec<usize> = (0..6)
            .map(|step| step_of(&fault(FaultKind::VmReboot, step)))
            .collect();
        assert_eq!(reboots, [0, 1, DELETE_STEP, 0, 1, DELETE_STEP]);
    }

    #[test]
    fn the_tuning_rolls_one_node_at_a_time_and_b_adds_a_firewall_and_xdp() {
        let yaml = tuning_yaml(2);
        assert!(yaml.contains("    canary: 1\n    maxUnavailable: 1\n"));
        assert!(yaml.ends_with("    net.ipv4.tcp_syn_retries: \"200\"\n"));
        assert!(!yaml.contains("xdp"));
        let b = tuning_yaml(1);
        assert!(b.ends_with(B_EXTRAS) && b.contains("net.core.somaxconn: \"2048\""));
    }
}
