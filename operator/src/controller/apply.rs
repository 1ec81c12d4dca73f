//! The decision for a live tuning: one planning step of its rollout, each governed node's
//! spec, the specs withdrawn from nodes no tuning selects any more, the agent labels, the
//! status and the events. Pure: [`prepare`] reads the snapshot and says what the reconcile
//! needs from outside (the revision history to sync, the analysis gate to ask), and
//! [`Apply::decide`] turns those answers into a [`Decision`]. The rollout planner
//! ([`crate::rollout::planner`]) makes the step; this module gathers its input and writes its
//! outcome down.

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_crds::{
    AnalysisStatus, NetworkTuning, NetworkTuningStatus, NodeConfig, NodeTuning, NodeTuningSpec,
    Phase, ABORT_ANNOTATION, CANARY_LABEL, PROMOTE_ANNOTATION,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::decision::{Announcement, Decision, Gauges, Next, SpecWrite, Why};
use super::snapshot::Snapshot;
use super::writes::{agent_labels, node_spec, withdrawn_spec};
use crate::rollout::history::{Borrowed, History};
use crate::rollout::nodes;
use crate::rollout::planner::{self, Holding, NodeView, Progress, Report, State, Verdict};
use crate::rollout::progress;
use crate::rollout::prometheus_endpoints::PrometheusEndpoints;
use crate::rollout::strategy::{self, Gate, Resolved};
use crate::rollout::{gate, prometheus};
use crate::selection::TuningNodes;
use crate::status::{aggregate, condition, node_applied, node_failure, set_condition, Observed};

/// How often a settled tuning is reconciled anyway.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often a rollout whose wave is being judged looks again.
pub const JUDGING_POLL: Duration = Duration::from_secs(2);

/// The gate's answer about the wave in flight: the verdict and the analysis its status shows.
pub type Judgement = (Verdict, Option<AnalysisStatus>);

/// A live tuning's reconcile, prepared from the snapshot.
pub struct Apply<'a> {
    tuning: &'a NetworkTuning,
    snap: &'a Snapshot,
    name: String,
    mine: TuningNodes,
    revision: String,
    resolved: Resolved,
    restored: Progress,
}

/// Prepares the reconcile of `tuning`; an invalid rollout section is decided at once (Degraded,
/// nothing changes on any node).
pub fn prepare<'a>(
    tuning: &'a NetworkTuning,
    snap: &'a Snapshot,
) -> Result<Apply<'a>, Box<Decision>> {
    let mine = snap.assignment.nodes_of(tuning, &snap.nodes);
    let revision = tuning.spec.config.revision();
    let resolved = strategy::resolve(tuning.spec.rollout.as_ref(), mine.governed.len())
        .map_err(|message| Box::new(invalid_rollout(tuning, &snap.now, message)))?;
    let restored = progress::restore(
        tuning.status.as_ref(),
        &tuning.name_any(),
        &revision,
        tuning.metadata.generation,
    );
    Ok(Apply {
        tuning,
        snap,
        name: tuning.name_any(),
        mine,
        revision,
        resolved,
        restored,
    })
}

impl<'a> Apply<'a> {
    /// The revision of the tuning's spec (the one the history records).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The revisions the history must keep besides the current one: the stable one, and every
    /// other a node runs now or may return to (of this tuning or, as a copy, of another).
    pub fn kept(&self) -> Vec<String> {
        // What the governed nodes' specs hold (without the rest of their planner views).
        let held = self.mine.governed.iter().filter_map(|n| {
            let nt = self.snap.node_tunings.get(n)?;
            Some(holding(&self.name, &nt.spec))
        });
        // A complete rollout returns no node anywhere.
        let live = self.restored.state != State::Complete;
        let origins = self
            .restored
            .origins()
            .into_values()
            .filter(|_| live)
            .collect::<Vec<_>>();
        let mut kept: Vec<String> = held
            .chain(origins)
            .filter_map(|h| h.revision().map(String::from))
            .chain(self.restored.stable.clone())
            .collect();
        kept.sort();
        kept.dedup();
        kept
    }

    /// The other tunings' revisions that governed nodes run now, which a rollback may return
    /// them to: the history records a copy of each before any wave moves a node off it.
    pub fn borrowed(&self) -> Vec<Borrowed> {
        let mut borrowed: Vec<Borrowed> = self
            .mine
            .governed
            .iter()
            .filter_map(|n| {
                let spec = &self.snap.node_tunings.get(n)?.spec;
                let from = spec.tuning.as_ref().filter(|t| **t != self.name)?;
                let (revision, config) = trusted_content(spec)?;
                Some(Borrowed {
                    revision: revision.to_string(),
                    tuning: from.clone(),
                    config: config.clone(),
                })
            })
            .collect();
        borrowed.sort_by(|a, b| a.revision.cmp(&b.revision));
        borrowed.dedup_by(|a, b| a.revision == b.revision);
        borrowed
    }

    /// What the gate is to judge, when the rollout is live (progressing or paused), asking only
    /// the Prometheus `endpoints` the installer allows; a finished one keeps the judgement it
    /// ended with.
    pub fn gate<'e>(&'e self, endpoints: &'e PrometheusEndpoints) -> Option<gate::Input<'e>> {
        let live = matches!(self.restored.state, State::Progressing | State::Paused(_));
        live.then(|| gate::Input {
            name: &self.name,
            resolved: &self.resolved,
            analysis: self.analysis(),
            progress: &self.restored,
            governed: &self.mine.governed,
            node_tunings: &self.snap.node_tunings,
            promote: self
                .tuning
                .annotations()
                .get(PROMOTE_ANNOTATION)
                .map(String::as_str),
            now: self.snap.now_secs(),
            prometheus_endpoints: endpoints,
            prometheus_secret: None,
        })
    }

    /// `spec.rollout.analysis`.
    fn analysis(&self) -> Option<&'a hoststack_crds::Analysis> {
        self.tuning
            .spec
            .rollout
            .as_ref()
            .and_then(|r| r.analysis.as_ref())
    }

    /// One planning step with the recorded `history` and the gate's `judgement` (a pending
    /// verdict when [`Apply::gate`] had nothing to judge).
    pub fn decide(&self, history: &History, judgement: Judgement) -> Decision {
        let (tuning, snap, restored) = (self.tuning, self.snap, &self.restored);
        let (verdict, judged) = judgement;
        let views = self.views();
        // An agent that is alive but has not reported yet (its node just got a NodeTuning)
        // answers within moments: wait for it, so that the first wave is picked from every node
        // that can take part (a labelled canary among them).
        let discovering = self.mine.governed.iter().any(|n| {
            snap.alive.contains(n)
                && snap
                    .node_tunings
                    .get(n)
                    .is_none_or(|nt| nt.status.is_none())
        });
        let abort = tuning
            .annotations()
            .get(ABORT_ANNOTATION)
            .map(String::as_str);
        let step = if let Some(back) = gate::aborted(restored, abort) {
            // Rolled back by hand: every node to the stable revision at once.
            planner::hold(&back, &views)
        } else if !discovering && views.iter().any(|v| v.available) {
            planner::plan(
                &self.resolved.strategy,
                restored,
                &views,
                self.in_flight_elsewhere(),
                &verdict,
                snap.now_secs(),
            )
        } else {
            // Agents still to report (a new tuning, or new nodes): nothing moves; the nodes get
            // their NodeTuning and the rollout goes on once they answer.
            planner::Decision {
                requeue_after: Some(JUDGING_POLL.as_secs()),
                ..planner::hold(restored, &views)
            }
        };
        let sampling = match self.resolved.gate {
            Gate::Analysis if self.analysis().is_some_and(|a| !a.thresholds.is_empty()) => {
                nodes::health_request(&step.progress, self.resolved.window)
            }
            _ => None,
        };
        let plans = nodes::plan_nodes(&step, sampling.as_ref());
        let judged_wave = restored
            .waves
            .len()
            .checked_sub(1)
            .map(|i| restored.wave_index(i));
        let status = rollout_status(tuning, &self.mine, snap, &step, judged_wave, judged);

        let mut specs = Vec::new();
        let mut unknown_revisions = Vec::new();
        let config_of = |r: &str| -> Option<NodeConfig> {
            if r == self.revision {
                return Some(tuning.spec.config.clone());
            }
            history.get(r).map(|e| e.config.clone()).or_else(|| {
                snap.node_tunings
                    .values()
                    .filter_map(|nt| trusted_content(&nt.spec))
                    .find(|(revision, _)| *revision == r)
                    .map(|(_, config)| config.clone())
            })
        };
        for (node, plan) in &plans {
            let (owner, revision) = match &plan.target {
                Holding::Nothing => (self.name.as_str(), None),
                Holding::Own(r) => (self.name.as_str(), Some(r)),
                Holding::Other { tuning, revision } => (tuning.as_str(), Some(revision)),
            };
            let spec = match revision {
                None => node_spec(&self.name, owner, None, plan),
                Some(r) => match config_of(r) {
                    Some(c) => node_spec(&self.name, owner, Some((r, &c)), plan),
                    None => {
                        unknown_revisions.push((node.clone(), r.to_string()));
                        continue;
                    }
                },
            };
            // A preview (`kubectl hoststack plan`) is not the operator's: it neither sets nor
            // compares it, and its server-side apply leaves it alone.
            let current = snap
                .node_tunings
                .get(node)
                .map(|nt| nt.spec.without_preview());
            // Selected nodes are in the snapshot's nodes, uid and all.
            let Some(uid) = snap.node_uids.get(node) else {
                continue;
            };
            if current.as_ref() != Some(&spec) {
                specs.push(SpecWrite {
                    node: node.clone(),
                    node_uid: uid.clone(),
                    spec,
                    why: Why::Assign,
                });
            }
        }
        // Nodes that carry this tuning's revision, or a revision of a tuning that is gone, and
        // that no tuning governs any more get their spec withdrawn; nodes another tuning
        // governs are written by that tuning's reconcile.
        specs.extend(
            unselected(snap, &self.name)
                .into_iter()
                .map(|(node, node_uid)| SpecWrite {
                    node,
                    node_uid,
                    spec: withdrawn_spec(),
                    why: Why::Unselected,
                }),
        );

        let events = announce(tuning.status.as_ref(), &status);
        let requeue = match &step.progress.state {
            State::Progressing | State::Paused(_) if self.resolved.strategy.judged => JUDGING_POLL,
            _ => step
                .requeue_after
                .map(Duration::from_secs)
                .map_or(RESYNC, |d| d.min(RESYNC)),
        };
        Decision {
            status: Some(status),
            gauges: Gauges::Show,
            specs,
            unknown_revisions,
            agent_labels: agent_labels(snap),
            forget_history: false,
            events,
            next: Next::Requeue(requeue),
        }
    }

    /// The nodes the tuning does not govern that are in flight onto one of its revisions
    /// (another tuning took them before their agents answered).
    fn in_flight_elsewhere(&self) -> usize {
        let governed: std::collections::HashSet<&str> =
            self.mine.governed.iter().map(String::as_str).collect();
        self.snap
            .node_tunings
            .iter()
            .filter(|(node, nt)| {
                nt.spec.tuning.as_deref() == Some(self.name.as_str())
                    && !governed.contains(node.as_str())
                    && !settled(nt)
            })
            .count()
    }

    /// The governed nodes as the planner sees them.
    fn views(&self) -> Vec<NodeView> {
        let snap = self.snap;
        let labels: BTreeMap<&str, &BTreeMap<String, String>> = snap
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), &n.labels))
            .collect();
        self.mine
            .governed
            .iter()
            .map(|node| NodeView {
                name: node.clone(),
                canary_label: labels
                    .get(node.as_str())
                    .and_then(|l| l.get(CANARY_LABEL))
                    .is_some_and(|v| v == "true"),
                // An agent that never reported, or whose heartbeat expired, cannot apply or be
                // judged: it is not rolled onto.
                available: snap.alive.contains(node)
                    && snap
                        .node_tunings
                        .get(node)
                        .is_some_and(|nt| nt.status.is_some()),
                report: report(snap, node, &self.restored.revision),
                holding: snap
                    .node_tunings
                    .get(node)
                    .map_or(Holding::Nothing, |nt| holding(&self.name, &nt.spec)),
                settled: snap.node_tunings.get(node).is_none_or(|nt| settled(nt)),
            })
            .collect()
    }
}

/// Whether `nt`'s agent has answered for the revision its spec holds (applied and confirmed
/// it, or failed it); a spec that holds no revision asks for nothing to count.
fn settled(nt: &NodeTuning) -> bool {
    nt.spec
        .revision
        .as_deref()
        .is_none_or(|r| node_applied(Some(nt), r) || node_failure(Some(nt), r).is_some())
}

/// A node spec's revision and config, when the config hashes to the revision: one edited
/// under an unchanged revision is not that revision's content, and is never copied into the
/// history nor written to another node.
fn trusted_content(spec: &NodeTuningSpec) -> Option<(&str, &NodeConfig)> {
    let (revision, config) = (spec.revision.as_deref()?, spec.config.as_ref()?);
    match config.verify_revision(revision) {
        Ok(()) => Some((revision, config)),
        Err(mismatch) => {
            tracing::warn!(%mismatch, "a node's spec holds a config edited under its revision: not used");
            None
        }
    }
}

/// What a node's spec holds, as tuning `name`'s rollout sees it.
fn holding(name: &str, spec: &NodeTuningSpec) -> Holding {
    match (&spec.tuning, &spec.revision, &spec.config) {
        (Some(t), Some(r), Some(_)) if t == name => Holding::Own(r.clone()),
        (Some(t), Some(r), Some(_)) => Holding::Other {
            tuning: t.clone(),
            revision: r.clone(),
        },
        _ => Holding::Nothing,
    }
}

/// The nodes no tuning governs whose spec still names tuning `name` or a tuning that no longer
/// lives (deleted while another tuning kept its revision on the node), with their uids: their
/// specs are to be withdrawn. A node that left the cluster is not among them: its NodeTuning
/// goes with it (the garbage collector deletes what the Node owns), and a write would bring it
/// back as an orphan.
pub fn unselected(snap: &Snapshot, name: &str) -> Vec<(String, String)> {
    let live = |t: &str| {
        snap.tunings
            .iter()
            .any(|l| l.name_any() == t && l.metadata.deletion_timestamp.is_none())
    };
    snap.node_tunings
        .iter()
        .filter(|(node, _)| !snap.assignment.governor.contains_key(*node))
        .filter(|(_, nt)| {
            nt.spec
                .tuning
                .as_deref()
                .is_some_and(|t| t == name || !live(t))
        })
        .filter_map(|(node, _)| Some((node.clone(), snap.node_uids.get(node)?.clone())))
        .collect()
}

/// What `node`'s agent reports about `revision`.
fn report(snap: &Snapshot, node: &str, revision: &str) -> Report {
    let nt = snap.node_tunings.get(node).map(AsRef::as_ref);
    match node_failure(nt, revision) {
        Some(why) => Report::Failed(why),
        None if node_applied(nt, revision) => Report::Applied,
        None => Report::Pending,
    }
}

/// The tuning's status: the nodes' counts and conditions, with the rollout's phase, waves and
/// stable revision.
fn rollout_status(
    tuning: &NetworkTuning,
    mine: &TuningNodes,
    snap: &Snapshot,
    step: &planner::Decision,
    judged_wave: Option<usize>,
    judged: Option<AnalysisStatus>,
) -> NetworkTuningStatus {
    let now = &snap.now;
    let previous = tuning.status.as_ref();
    let revision = step.progress.revision.as_str();
    let mut status = aggregate(&Observed {
        generation: tuning.metadata.generation,
        revision,
        nodes: mine,
        node_tunings: &snap.node_tunings,
        previous,
        now: now.clone(),
    });
    let p = &step.progress;
    let (phase, message) = progress::phase_of(&p.state);
    let in_flight = p.waves.len().checked_sub(1);
    let same_rollout = previous.and_then(|s| s.current_revision.as_deref()) == Some(revision);
    let name = tuning.name_any();
    status.waves = progress::record_waves(
        &name,
        p,
        |node| report(snap, node, &p.revision),
        |i| {
            // The verdict was reached on the wave that was in flight before this step.
            if Some(i) == judged_wave && judged.is_some() {
                return judged.clone();
            }
            previous
                .filter(|_| same_rollout)
                .and_then(|s| s.waves.iter().find(|w| w.index as usize == i))
                .and_then(|w| w.analysis.clone())
        },
    );
    status.phase = Some(phase);
    status.message = message.clone();
    status.stable_revision = p.stable.clone();
    status.updated_nodes = match p.state {
        State::RolledBack(_) => 0,
        _ => p.updated().len() as i32,
    };
    let g = tuning.metadata.generation;
    let cond = |t: &str, s: bool, r: &str, m: String| condition(previous, t, s, r, m, g, now);
    let why = message.unwrap_or_default();
    match &p.state {
        State::Progressing => {
            if let (Some(i), Some(wave)) = (in_flight, p.waves.last()) {
                let what = if i == 0 { "canary" } else { "wave" };
                let m = format!(
                    "{what} {} of revision {revision} on {}",
                    p.wave_index(i),
                    wave.nodes.join(", ")
                );
                set_condition(
                    &mut status.conditions,
                    cond("Progressing", true, "RollingOut", m),
                );
            }
        }
        State::Complete => {}
        State::Paused(_) => {
            let reason = if why.starts_with("analysis inconclusive") {
                "AnalysisInconclusive"
            } else {
                "Paused"
            };
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, reason, why.clone()),
            );
        }
        State::RolledBack(_) => {
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, "RolledBack", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond("Degraded", true, "RolledBack", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond(
                    "Ready",
                    false,
                    "RolledBack",
                    format!(
                        "revision {revision} was rolled back; a new spec generation tries again"
                    ),
                ),
            );
        }
        State::Halted(_) => {
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, "Halted", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond("Degraded", true, "Halted", why.clone()),
            );
        }
    }
    if !matches!(p.state, State::Complete) {
        if let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == "Ready") {
            if ready.status == "True" {
                *ready = cond(
                    "Ready",
                    false,
                    "RollingOut",
                    format!("revision {revision} is not on every node yet"),
                );
            }
        }
    }
    // How the Prometheus gate's last query went, kept until the next one in the same rollout.
    let answered = match judged
        .as_ref()
        .and_then(|a| Some((a, a.prometheus_outcome.as_deref()?)))
    {
        Some((analysis, outcome)) => {
            let ok = outcome == prometheus::ANSWERED;
            let message = match &analysis.message {
                Some(m) if !ok => m.clone(),
                _ => format!("the query answered ({outcome})"),
            };
            Some(cond(PROMETHEUS_ANSWERED, ok, outcome, message))
        }
        None => previous
            .filter(|_| same_rollout)
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == PROMETHEUS_ANSWERED))
            .cloned(),
    };
    if let Some(answered) = answered {
        set_condition(&mut status.conditions, answered);
    }
    if mine.governed.is_empty() {
        governs_nothing(&mut status, previous, same_rollout, cond);
    }
    status
}

/// The condition type that says how the Prometheus gate's last query went.
pub const PROMETHEUS_ANSWERED: &str = "PrometheusAnswered";

/// The status of a tuning that governs no node: Superseded when other tunings govern the nodes
/// it matches, Pending when it matches none. Its rollout's waves and stable revision stay as
/// they were, for when it governs nodes again.
fn governs_nothing(
    status: &mut NetworkTuningStatus,
    previous: Option<&NetworkTuningStatus>,
    same_rollout: bool,
    cond: impl Fn(&str, bool, &str, String) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition,
) {
    let (phase, reason, message) = match &status.superseded_by {
        Some(by) => (
            Phase::Superseded,
            "Superseded",
            format!("every node it matches is governed by {by}; it changes nothing until it governs a node again"),
        ),
        None => (
            Phase::Pending,
            "NoNodesMatched",
            "the node selector matches no node".to_string(),
        ),
    };
    status.phase = Some(phase);
    status.message = (phase == Phase::Superseded).then(|| message.clone());
    status.updated_nodes = 0;
    if let Some(previous) = previous.filter(|_| same_rollout) {
        status.waves = previous.waves.clone();
        status.stable_revision = previous.stable_revision.clone();
    }
    for type_ in ["Ready", "Progressing"] {
        set_condition(
            &mut status.conditions,
            cond(type_, false, reason, message.clone()),
        );
    }
    status
        .conditions
        .retain(|c| c.type_ != "Degraded" || c.status == "False");
}

/// The decision for an invalid rollout section: Degraded, nothing changes on any node.
fn invalid_rollout(tuning: &NetworkTuning, now: &Time, message: String) -> Decision {
    let mut status = tuning.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        condition(
            tuning.status.as_ref(),
            "Degraded",
            true,
            "InvalidRollout",
            message.clone(),
            tuning.metadata.generation,
            now,
        ),
    );
    let changed = tuning.status.as_ref() != Some(&status);
    let mut decision = Decision::report(status);
    if changed {
        decision.events.push(Announcement::reconcile(
            EventType::Warning,
            "InvalidRollout",
            message,
        ));
    }
    decision
}

/// Events for what changed from `previous` to `status`: a wave started, a pause, a rollback, a
/// halt, completion, a conflict.
fn announce(
    previous: Option<&NetworkTuningStatus>,
    status: &NetworkTuningStatus,
) -> Vec<Announcement> {
    let mut events = Vec::new();
    let message_of = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    let revision = status.current_revision.as_deref().unwrap_or_default();
    let same_rollout =
        previous.and_then(|s| s.current_revision.as_ref()) == status.current_revision.as_ref();
    let waves_before = previous
        .filter(|_| same_rollout)
        .map_or(0, |s| s.waves.len());
    if status.waves.len() > waves_before && status.phase == Some(Phase::Progressing) {
        let wave = &status.waves[status.waves.len() - 1];
        events.push(Announcement {
            type_: EventType::Normal,
            reason: "WaveStarted",
            action: format!("Rollout/{revision}/wave{}", wave.index),
            note: format!(
                "wave {} of revision {revision} started on {}",
                wave.index,
                wave.nodes.join(", ")
            ),
        });
    }
    // Each wave's analysis when it reaches a verdict, with the values it was judged on.
    let before = previous
        .filter(|_| same_rollout)
        .map_or(&[][..], |s| &s.waves[..]);
    for wave in &status.waves {
        let Some(analysis) = &wave.analysis else {
            continue;
        };
        let (type_, reason) = match analysis.verdict.as_str() {
            "Pass" => (EventType::Normal, "AnalysisPassed"),
            "Fail" => (EventType::Warning, "AnalysisFailed"),
            "Inconclusive" => (EventType::Warning, "AnalysisInconclusive"),
            _ => continue,
        };
        let was = before
            .iter()
            .find(|w| w.index == wave.index)
            .and_then(|w| w.analysis.as_ref());
        if was.is_some_and(|a| a.verdict == analysis.verdict) {
            continue;
        }
        events.push(Announcement {
            type_,
            reason,
            action: format!("Analysis/{revision}/wave{}", wave.index),
            note: analysis_note(revision, wave.index, analysis),
        });
    }
    let message = status.message.clone().unwrap_or_default();
    if status.phase != previous.and_then(|s| s.phase) {
        let event = match status.phase {
            Some(Phase::Complete) => Some((EventType::Normal, "Applied", message_of("Ready"))),
            Some(Phase::RolledBack) => Some((EventType::Warning, "RolledBack", message)),
            Some(Phase::Failed) => Some((EventType::Warning, "Halted", message)),
            Some(Phase::Paused) => Some((EventType::Normal, "Paused", message)),
            _ => None,
        };
        if let Some((type_, reason, note)) = event {
            events.push(Announcement {
                type_,
                reason,
                action: format!("Rollout/{revision}"),
                note,
            });
        }
    }
    let had_conflict = previous.is_some_and(|s| !s.conflicts.is_empty());
    if !status.conflicts.is_empty() && !had_conflict {
        events.push(Announcement::reconcile(
            EventType::Warning,
            "Conflict",
            message_of("Conflict"),
        ));
    }
    events
}

/// An analysis event's note: each metric's judged value against its baseline and limit, and
/// why when it was not a pass; at most [`NOTE_LIMIT`] bytes, as the API server allows.
fn analysis_note(revision: &str, wave: u32, analysis: &AnalysisStatus) -> String {
    let mut note = format!("wave {wave} of revision {revision}:");
    for (i, m) in analysis.metrics.iter().enumerate() {
        let value = |v: &Option<String>| v.as_deref().unwrap_or("-").to_string();
        let mut line = format!(
            "{} {} {} (limit {}",
            if i == 0 { "" } else { ";" },
            m.metric,
            value(&m.judged),
            value(&m.limit)
        );
        if let Some(baseline) = &m.baseline {
            line.push_str(&format!(", baseline {baseline}"));
        }
        line.push_str(if m.passed { ") passed" } else { ") failed" });
        note.push_str(&line);
    }
    if analysis.verdict != "Pass" {
        if let Some(message) = &analysis.message {
            note.push_str(&format!(" — {message}"));
        }
    }
    if note.len() > NOTE_LIMIT {
        let mut end = NOTE_LIMIT - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// The longest event note the API server accepts (events.k8s.io/v1: 1 kB).
const NOTE_LIMIT: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decision::Why;
    use crate::controller::fixtures::{
        config, heartbeat, node, node_tuning, spec_on, tuning, World, UID,
    };
    use crate::controller::snapshot::StatusWrite;
    use crate::rollout::history::Entry;
    use hoststack_crds::{NodeState, NodeTuning, Rollout, RolloutPhase, WaveStatus};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use k8s_openapi::jiff::Timestamp;

    /// The snapshot of `world` now (the heartbeats are renewed now).
    fn snapshot(world: World) -> Snapshot {
        world.snapshot_at(Timestamp::now())
    }

    /// The history recording each `(revision, sack)`.
    fn history(revisions: &[(&str, &str)]) -> History {
        revisions
            .iter()
            .enumerate()
            .map(|(i, (revision, sack))| {
                let entry = Entry {
                    name: format!("edge-{revision}"),
                    sequence: i as i64 + 1,
                    config: config(sack),
                    from: None,
                };
                (revision.to_string(), entry)
            })
            .collect()
    }

    /// What a decision writes to each node: (node, revision, phase, why).
    fn writes(d: &Decision) -> Vec<(&str, Option<&str>, Option<RolloutPhase>, Why)> {
        d.specs
            .iter()
            .map(|w| {
                (
                    w.node.as_str(),
                    w.spec.revision.as_deref(),
                    w.spec.rollout_phase,
                    w.why,
                )
            })
            .collect()
    }

    fn reasons(d: &Decision) -> Vec<&str> {
        d.events.iter().map(|e| e.reason).collect()
    }

    fn phase(d: &Decision) -> Option<Phase> {
        d.status.as_ref().and_then(|s| s.phase)
    }

    /// A status in the middle of rolling `current` out from `stable`, wave 0 on `canary`.
    fn rolling(current: &str, stable: &str, canary: &str) -> NetworkTuningStatus {
        NetworkTuningStatus {
            observed_generation: Some(1),
            current_revision: Some(current.into()),
            stable_revision: Some(stable.into()),
            phase: Some(Phase::Progressing),
            waves: vec![WaveStatus {
                index: 0,
                nodes: vec![canary.into()],
                ..WaveStatus::default()
            }],
            ..NetworkTuningStatus::default()
        }
    }

    #[test]
    fn one_planning_step_decides_specs_events_status_and_requeue() {
        let edge = tuning("edge", "edge", "1");
        let r2 = edge.spec.config.revision();
        let r1 = tuning("edge", "edge", "0").spec.config.revision();
        let reported = |n: &str, state, revision: &str| {
            let spec = spec_on("edge", None, RolloutPhase::Stable);
            node_tuning(n, spec, Some((state, "edge", revision)))
        };
        let two_nodes = vec![
            node("a", "edge", true, false),
            node("b", "edge", true, true),
        ];
        let alive = vec![heartbeat("a"), heartbeat("b")];
        let with = |status: Option<NetworkTuningStatus>, annotation: Option<&str>| {
            let mut t = edge.clone();
            t.status = status;
            if let Some(revision) = annotation {
                t.metadata.annotations =
                    Some([(ABORT_ANNOTATION.to_string(), revision.to_string())].into());
            }
            t
        };
        type Writes<'a> = Vec<(&'a str, Option<&'a str>, Option<RolloutPhase>, Why)>;
        // (what, tuning, world but the tuning, history, writes, events, phase, next)
        type Case<'a> = (
            &'a str,
            NetworkTuning,
            World,
            History,
            Writes<'a>,
            Vec<&'a str>,
            Phase,
            Next,
        );
        let table: Vec<Case> = vec![
            (
                "agents yet to report: specs without a revision, look again soon",
                with(None, None),
                World {
                    nodes: two_nodes.clone(),
                    ..World::default()
                },
                history(&[]),
                vec![
                    ("a", None, Some(RolloutPhase::Stable), Why::Assign),
                    ("b", None, Some(RolloutPhase::Stable), Why::Assign),
                ],
                vec![],
                Phase::Progressing,
                Next::Requeue(JUDGING_POLL),
            ),
            (
                "every agent reported: the labelled canary goes first",
                with(None, None),
                World {
                    nodes: two_nodes.clone(),
                    node_tunings: vec![
                        reported("a", NodeState::Idle, ""),
                        reported("b", NodeState::Idle, ""),
                    ],
                    heartbeats: alive.clone(),
                    ..World::default()
                },
                history(&[(&r2, "1")]),
                vec![("b", Some(&r2), Some(RolloutPhase::Canary), Why::Assign)],
                vec!["WaveStarted"],
                Phase::Progressing,
                Next::Requeue(RESYNC),
            ),
            (
                "the canary failed: every node back on the stable revision",
                with(Some(rolling(&r2, &r1, "b")), None),
                World {
                    nodes: two_nodes.clone(),
                    node_tunings: vec![
                        reported("a", NodeState::Applied, &r1),
                        reported("b", NodeState::Failed, &r2),
                    ],
                    heartbeats: alive.clone(),
                    ..World::default()
                },
                history(&[(&r1, "0"), (&r2, "1")]),
                vec![
                    ("a", Some(&r1), Some(RolloutPhase::Stable), Why::Assign),
                    ("b", Some(&r1), Some(RolloutPhase::Stable), Why::Assign),
                ],
                vec!["RolledBack"],
                Phase::RolledBack,
                Next::Requeue(RESYNC),
            ),
            (
                "aborted by hand: rolled back though nothing failed",
                with(Some(rolling(&r2, &r1, "b")), Some(&r2)),
                World {
                    nodes: two_nodes.clone(),
                    node_tunings: vec![
                        reported("a", NodeState::Applied, &r1),
                        reported("b", NodeState::Applied, &r2),
                    ],
                    heartbeats: alive.clone(),
                    ..World::default()
                },
                history(&[(&r1, "0"), (&r2, "1")]),
                vec![
                    ("a", Some(&r1), Some(RolloutPhase::Stable), Why::Assign),
                    ("b", Some(&r1), Some(RolloutPhase::Stable), Why::Assign),
                ],
                vec!["RolledBack"],
                Phase::RolledBack,
                Next::Requeue(RESYNC),
            ),
            (
                "a node that left the pool has its spec withdrawn",
                with(None, None),
                World {
                    nodes: vec![
                        node("a", "edge", true, false),
                        node("c", "core", true, false),
                    ],
                    node_tunings: vec![
                        reported("a", NodeState::Idle, ""),
                        reported("c", NodeState::Idle, ""),
                    ],
                    heartbeats: alive.clone(),
                    ..World::default()
                },
                history(&[(&r2, "1")]),
                vec![
                    ("a", Some(&r2), Some(RolloutPhase::Canary), Why::Assign),
                    ("c", None, None, Why::Unselected),
                ],
                vec!["WaveStarted"],
                Phase::Progressing,
                Next::Requeue(RESYNC),
            ),
            (
                "a node that left the cluster is not written: its NodeTuning goes with it",
                with(None, None),
                World {
                    nodes: vec![node("a", "edge", true, false)],
                    node_tunings: vec![
                        reported("a", NodeState::Idle, ""),
                        reported("gone", NodeState::Idle, ""),
                    ],
                    heartbeats: alive.clone(),
                    ..World::default()
                },
                history(&[(&r2, "1")]),
                vec![("a", Some(&r2), Some(RolloutPhase::Canary), Why::Assign)],
                vec!["WaveStarted"],
                Phase::Progressing,
                Next::Requeue(RESYNC),
            ),
            (
                "another tuning governs the node: a conflict, nothing written",
                with(None, None),
                World {
                    tunings: vec![{
                        let mut high = tuning("high", "edge", "1");
                        high.spec.priority = 9;
                        high
                    }],
                    nodes: vec![node("a", "edge", true, false)],
                    ..World::default()
                },
                history(&[(&r2, "1")]),
                vec![],
                vec!["Conflict"],
                Phase::Superseded,
                Next::Requeue(JUDGING_POLL),
            ),
        ];
        for (what, t, mut world, history, want_writes, want_events, want_phase, want_next) in table
        {
            world.tunings.insert(0, t.clone());
            let snap = snapshot(world);
            let step = prepare(&t, &snap).unwrap_or_else(|_| panic!("{what}: a valid rollout"));
            assert_eq!(step.revision(), r2, "{what}");
            let judgement = match step.gate(&PrometheusEndpoints::default()) {
                Some(_) => (Verdict::Pending, None),
                None => panic!("{what}: the rollout is live"),
            };
            let d = step.decide(&history, judgement);
            assert_eq!(writes(&d), want_writes, "{what}");
            assert_eq!(reasons(&d), want_events, "{what}");
            assert_eq!(phase(&d), Some(want_phase), "{what}");
            assert_eq!(d.next, want_next, "{what}");
            assert_eq!(d.gauges, Gauges::Show, "{what}");
            assert!(
                d.unknown_revisions.is_empty() && !d.forget_history,
                "{what}"
            );
        }
    }

    #[test]
    fn a_node_planned_onto_an_unrecorded_revision_keeps_its_spec() {
        let mut edge = tuning("edge", "edge", "1");
        let r2 = edge.spec.config.revision();
        edge.status = Some(rolling(&r2, "gone", "b"));
        let world = World {
            tunings: vec![edge.clone()],
            nodes: vec![
                node("a", "edge", true, false),
                node("b", "edge", true, false),
            ],
            node_tunings: vec![
                node_tuning(
                    "a",
                    spec_on("edge", None, RolloutPhase::Stable),
                    Some((NodeState::Idle, "", "")),
                ),
                node_tuning(
                    "b",
                    spec_on("edge", Some((&r2, "1")), RolloutPhase::Canary),
                    Some((NodeState::Failed, "edge", &r2)),
                ),
            ],
            heartbeats: vec![heartbeat("a"), heartbeat("b")],
        };
        let snap = snapshot(world);
        let d = prepare(&edge, &snap)
            .ok()
            .unwrap()
            .decide(&history(&[(&r2, "1")]), (Verdict::Pending, None));
        assert_eq!(
            d.unknown_revisions,
            [
                ("a".to_string(), "gone".to_string()),
                ("b".to_string(), "gone".to_string())
            ]
        );
        assert!(d.specs.is_empty(), "{:?}", d.specs);
    }

    #[test]
    fn an_invalid_rollout_is_reported_once_and_changes_no_node() {
        let mut edge = tuning("edge", "edge", "1");
        edge.spec.rollout = Some(Rollout {
            max_unavailable: Some(IntOrString::String("150%".into())),
            ..Rollout::default()
        });
        let snap = snapshot(World {
            tunings: vec![edge.clone()],
            nodes: vec![node("a", "edge", false, false)],
            ..World::default()
        });
        let Err(d) = prepare(&edge, &snap) else {
            panic!("an invalid rollout")
        };
        assert_eq!(reasons(&d), ["InvalidRollout"]);
        assert!(d.specs.is_empty() && d.agent_labels.is_empty());
        assert_eq!(
            (d.next.clone(), d.gauges),
            (Next::AwaitChange, Gauges::Keep)
        );
        let status = d.status.clone().unwrap();
        let degraded = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        assert_eq!(degraded.reason, "InvalidRollout");
        assert!(
            degraded.message.starts_with("rollout.maxUnavailable: "),
            "{}",
            degraded.message
        );
        // Reported already: the same status again, without a second event.
        edge.status = Some(status.clone());
        let Err(again) = prepare(&edge, &snap) else {
            panic!("an invalid rollout")
        };
        assert_eq!(again.status, Some(status));
        assert!(again.events.is_empty());
    }

    #[test]
    fn a_cache_that_lags_the_own_rolled_back_write_puts_no_node_back_on_the_failed_revision() {
        let mut edge = tuning("edge", "edge", "1");
        let r2 = edge.spec.config.revision();
        let r1 = tuning("edge", "edge", "0").spec.config.revision();
        // The cache: the canary b's wave in flight (version 10). The operator's own write
        // (version 12): rolled back. The canary has since reverted and applied the stable one.
        edge.metadata.resource_version = Some("10".into());
        edge.status = Some(rolling(&r2, &r1, "b"));
        let rolled_back = NetworkTuningStatus {
            phase: Some(Phase::RolledBack),
            message: Some("b failed to apply".into()),
            ..rolling(&r2, &r1, "b")
        };
        let on_stable = |n: &str| {
            let spec = spec_on("edge", Some((&r1, "0")), RolloutPhase::Stable);
            node_tuning(n, spec, Some((NodeState::Applied, "edge", &r1)))
        };
        let world = || World {
            tunings: vec![edge.clone()],
            nodes: vec![
                node("a", "edge", true, false),
                node("b", "edge", true, true),
            ],
            node_tunings: vec![on_stable("a"), on_stable("b")],
            heartbeats: vec![heartbeat("a"), heartbeat("b")],
        };
        let recorded = history(&[(&r1, "0"), (&r2, "1")]);
        let decide = |snap: &Snapshot| {
            let newest = snap.newest(&edge);
            let step = prepare(&newest, snap).unwrap_or_else(|_| panic!("a valid rollout"));
            step.decide(&recorded, (Verdict::Pending, None))
        };

        // From the cache alone the wave goes on: the canary back on the failed revision (a, in
        // no wave, keeps its spec).
        let stale = decide(&snapshot(world()));
        assert_eq!(
            writes(&stale),
            [(
                "b",
                Some(r2.as_str()),
                Some(RolloutPhase::Canary),
                Why::Assign
            )]
        );

        // From the newer own write: still rolled back, no node goes anywhere.
        let written = StatusWrite {
            resource_version: Some("12".into()),
            status: rolled_back,
        };
        let snap = snapshot(world()).with_status_writes([(UID.to_string(), written)].into());
        let d = decide(&snap);
        assert_eq!(writes(&d), []);
        assert_eq!(phase(&d), Some(Phase::RolledBack));
        assert_eq!(reasons(&d), Vec::<&str>::new());
        let status = d.status.expect("a status");
        assert_eq!(status.stable_revision.as_deref(), Some(r1.as_str()));
        assert_eq!(status.waves[0].result, "RolledBack");
    }

    /// Issue 39: a node's spec whose config was edited under an unchanged revision is not
    /// content of that revision: a takeover records no copy of it (a rollback would push the
    /// edited config as the other tuning's revision).
    #[test]
    fn a_node_spec_whose_config_does_not_hash_to_its_revision_is_never_copied_nor_used() {
        let sack = tuning("edge-sack", "edge", "1");
        let rs = sack.spec.config.revision();
        let mut newbie = tuning("newbie", "edge", "0");
        newbie.spec.priority = 900;
        // b's spec says edge-sack's revision, but its config was edited to sack 2.
        let edited = spec_on("edge-sack", Some((&rs, "2")), RolloutPhase::Stable);
        let world = World {
            tunings: vec![newbie.clone(), sack.clone()],
            nodes: vec![node("b", "edge", true, false)],
            node_tunings: vec![node_tuning(
                "b",
                edited,
                Some((NodeState::Applied, "edge-sack", &rs)),
            )],
            heartbeats: vec![heartbeat("b")],
        };
        let snap = snapshot(world);
        let step = prepare(&newbie, &snap).unwrap_or_else(|_| panic!("a valid rollout"));
        let borrowed: Vec<String> = step
            .borrowed()
            .into_iter()
            .map(|b| format!("{} of {}", b.revision, b.tuning))
            .collect();
        assert!(
            borrowed.is_empty(),
            "a config that hashes to {} copied as {borrowed:?}",
            config("2").revision()
        );
    }

    #[test]
    fn a_takeover_keeps_the_other_tunings_revision_outside_the_waves_and_returns_to_it() {
        // edge-sack (sack 1) runs on a and b; newbie (sack 0, higher priority) takes over.
        let sack = tuning("edge-sack", "edge", "1");
        let rs = sack.spec.config.revision();
        let mut newbie = tuning("newbie", "edge", "0");
        newbie.spec.priority = 900;
        let rn = newbie.spec.config.revision();
        let on_sack = |n: &str| {
            let spec = spec_on("edge-sack", Some((&rs, "1")), RolloutPhase::Stable);
            node_tuning(n, spec, Some((NodeState::Applied, "edge-sack", &rs)))
        };
        let world = |newbie: &NetworkTuning, nts: Vec<NodeTuning>| World {
            tunings: vec![newbie.clone(), sack.clone()],
            nodes: vec![
                node("a", "edge", true, true),
                node("b", "edge", true, false),
            ],
            node_tunings: nts,
            heartbeats: vec![heartbeat("a"), heartbeat("b")],
        };
        let snap = snapshot(world(&newbie, vec![on_sack("a"), on_sack("b")]));
        let step = prepare(&newbie, &snap).unwrap_or_else(|_| panic!("a valid rollout"));
        // The history records a copy of edge-sack's revision before any node leaves it.
        let borrowed = step.borrowed();
        assert_eq!(
            borrowed
                .iter()
                .map(|b| (b.revision.as_str(), b.tuning.as_str()))
                .collect::<Vec<_>>(),
            [(rs.as_str(), "edge-sack")]
        );
        assert_eq!(step.kept(), std::slice::from_ref(&rs));
        let mut recorded = history(&[(&rn, "0")]);
        recorded.insert(
            rs.clone(),
            Entry {
                name: format!("newbie-{rs}"),
                sequence: 2,
                config: config("1"),
                from: Some("edge-sack".into()),
            },
        );
        let d = step.decide(&recorded, (Verdict::Pending, None));
        // The canary moves from edge-sack's revision to newbie's; b keeps edge-sack's.
        let spec_of = |d: &Decision, n: &str| {
            d.specs
                .iter()
                .find(|w| w.node == n)
                .map(|w| w.spec.clone())
                .unwrap_or_else(|| panic!("{n} written: {:?}", d.specs))
        };
        let a = spec_of(&d, "a");
        assert_eq!(
            (a.tuning.as_deref(), a.revision.as_deref(), a.rollout_phase),
            (
                Some("newbie"),
                Some(rn.as_str()),
                Some(RolloutPhase::Canary)
            )
        );
        // b, in no wave, keeps edge-sack's revision, now governed by newbie.
        let b = spec_of(&d, "b");
        assert_eq!(
            (
                b.tuning.as_deref(),
                b.governed_by.as_deref(),
                b.revision.as_deref(),
                b.rollout_phase
            ),
            (
                Some("edge-sack"),
                Some("newbie"),
                Some(rs.as_str()),
                Some(RolloutPhase::Stable)
            )
        );
        assert_eq!(b.config, Some(config("1")));
        let status = d.status.clone().unwrap();
        assert_eq!(status.waves[0].from.len(), 1);
        assert_eq!(status.waves[0].from[0].tuning.as_deref(), Some("edge-sack"));

        // The canary fails: it goes back to edge-sack's revision, from the copy.
        newbie.status = Some(status);
        let failed = node_tuning(
            "a",
            spec_on("newbie", Some((&rn, "0")), RolloutPhase::Canary),
            Some((NodeState::Failed, "newbie", &rn)),
        );
        let mut b_governed = on_sack("b");
        b_governed.spec = b.clone();
        let snap = snapshot(world(&newbie, vec![failed, b_governed]));
        let step = prepare(&newbie, &snap).unwrap_or_else(|_| panic!("a valid rollout"));
        assert!(
            step.kept().contains(&rs),
            "the copy is kept while a may return"
        );
        let d = step.decide(&recorded, (Verdict::Pending, None));
        assert_eq!(phase(&d), Some(Phase::RolledBack));
        let a = spec_of(&d, "a");
        assert_eq!(
            (a.tuning.as_deref(), a.revision.as_deref(), a.config),
            (Some("edge-sack"), Some(rs.as_str()), Some(config("1")))
        );
        assert!(
            d.specs.iter().all(|w| w.node != "b"),
            "b never moved, and is not written: {:?}",
            d.specs
        );

        // edge-sack, meanwhile, governs nothing: Superseded, and it writes nothing.
        let snap = snapshot(world(&newbie, vec![on_sack("a"), on_sack("b")]));
        let d = prepare(&sack, &snap)
            .unwrap_or_else(|_| panic!("a valid rollout"))
            .decide(&history(&[]), (Verdict::Pending, None));
        assert_eq!(writes(&d), []);
        let status = d.status.unwrap();
        assert_eq!(status.phase, Some(Phase::Superseded));
        assert_eq!(status.superseded_by.as_deref(), Some("newbie"));
        assert_eq!(status.progress.as_deref(), Some("0/0"));
    }

    #[test]
    fn an_analysis_verdict_is_announced_once_with_its_values() {
        use hoststack_crds::MetricResult;
        let judged = |verdict: &str| NetworkTuningStatus {
            current_revision: Some("r2".into()),
            phase: Some(Phase::Paused),
            waves: vec![WaveStatus {
                index: 0,
                analysis: Some(AnalysisStatus {
                    verdict: verdict.into(),
                    message: Some("Prometheus answered 401 Unauthorized".into()),
                    metrics: vec![MetricResult {
                        metric: "RetransmitRatio".into(),
                        judged: Some("0.03".into()),
                        baseline: Some("0.001".into()),
                        limit: Some("0.002".into()),
                        passed: false,
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let events = announce(Some(&judged("Pending")), &judged("Inconclusive"));
        let event = events
            .iter()
            .find(|e| e.reason == "AnalysisInconclusive")
            .expect("the verdict is announced");
        assert_eq!(event.action, "Analysis/r2/wave0");
        assert_eq!(
            event.note,
            "wave 0 of revision r2: RetransmitRatio 0.03 (limit 0.002, baseline 0.001) failed \
             — Prometheus answered 401 Unauthorized"
        );
        // The same verdict again is not news; a pass is, without the message.
        let again = announce(Some(&judged("Inconclusive")), &judged("Inconclusive"));
        assert!(again.iter().all(|e| !e.reason.starts_with("Analysis")));
        let passed = announce(Some(&judged("Inconclusive")), &judged("Pass"));
        let event = passed
            .iter()
            .find(|e| e.reason == "AnalysisPassed")
            .unwrap();
        assert!(!event.note.contains("401"), "{}", event.note);
        // A long note is cut to what the API server takes.
        let mut long = judged("Fail");
        long.waves[0].analysis.as_mut().unwrap().message = Some("é".repeat(600));
        let events = announce(None, &long);
        let note = &events
            .iter()
            .find(|e| e.reason == "AnalysisFailed")
            .unwrap()
            .note;
        assert!(
            note.len() <= NOTE_LIMIT && note.ends_with("..."),
            "{}",
            note.len()
        );
    }
}
