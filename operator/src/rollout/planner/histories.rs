//! The planner driven over whole histories of a small cluster, as the controller drives it: a
//! planning step now and then, and between them what the planner does not decide — agents
//! applying or refusing what their spec holds, another tuning taking a node and handing it
//! back, agents coming and going, nodes joining and leaving the pool, a new revision of the
//! tuning. After every event the laws of a rollout are checked against what the nodes really
//! run, not against the planner's own bookkeeping:
//!
//! - never more nodes in flight than `maxUnavailable`, the canary included (DESIGN.md,
//!   invariant 2). A node is in flight when its spec holds a revision that its agent has not
//!   applied yet. Not counted, as docs/rollouts.md allows: a node that ran nothing of
//!   hoststack's given the stable revision (a node joining the pool, even once a later
//!   revision is the stable one), a node sent back to where
//!   the rollout took it from (a rollback), and a spec withdrawn;
//! - no node is moved onto the revision without a verdict that passed, except the canary of a
//!   round (at most `canary` nodes), and no wave after a round's canary starts without one;
//! - the planner changes a spec only to put the node in a wave, to send it back where the
//!   rollout took it from, or to give a node that ran nothing the stable revision;
//! - after a rollback every node the rollout (this round of it, once it was complete) moved
//!   is back where it took it from.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::{any, prop_assert, prop_oneof, proptest, Just, ProptestConfig};
use proptest::strategy::Strategy as Generator;

use super::{hold, plan, Holding, NodeView, Progress, Report, State, Strategy, Verdict};

/// The other tuning that takes nodes now and then, and its revision.
fn other() -> Holding {
    Holding::Other {
        tuning: "core".into(),
        revision: "c1".into(),
    }
}

/// One node of the model.
#[derive(Clone, Debug)]
struct Node {
    name: String,
    canary_label: bool,
    /// Its agent's heartbeat is valid.
    available: bool,
    /// This tuning governs it (else another tuning does, and this rollout does not see it).
    governed: bool,
    /// What its NodeTuning spec holds.
    spec: Holding,
    /// What its agent last applied.
    runs: Holding,
    /// The spec its agent refused last (cleared when it applies one).
    refused: Option<Holding>,
    /// Where this rollout took it from, since it moved it onto its revision.
    origin: Option<Holding>,
    /// It ran nothing and its spec holds what was the stable revision when it was given.
    joining: bool,
}

impl Node {
    fn new(name: String, holding: Holding) -> Self {
        Node {
            canary_label: name.ends_with('1'),
            name,
            available: true,
            governed: true,
            spec: holding.clone(),
            runs: holding,
            refused: None,
            origin: None,
            joining: false,
        }
    }

    /// What its agent's status says about `revision` of the tuning.
    fn report(&self, revision: &str) -> Report {
        let own = Holding::Own(revision.into());
        match &self.refused {
            Some(r) if *r == own => Report::Failed("refused".into()),
            None if self.runs == own => Report::Applied,
            _ => Report::Pending,
        }
    }

    fn view(&self, revision: &str) -> NodeView {
        NodeView {
            name: self.name.clone(),
            canary_label: self.canary_label,
            available: self.available,
            report: self.report(revision),
            holding: self.spec.clone(),
            settled: !self.unanswered(),
        }
    }

    /// Its spec holds a revision its agent has neither applied nor refused.
    fn unanswered(&self) -> bool {
        self.spec.revision().is_some()
            && self.spec != self.runs
            && self.refused.as_ref() != Some(&self.spec)
    }

    /// In flight: told to run a revision its agent has not answered for, and neither joining
    /// the pool onto the stable revision nor sent back where the rollout took it from.
    fn in_flight(&self, stable: &Holding) -> bool {
        self.unanswered()
            && !(self.runs == Holding::Nothing && (self.joining || self.spec == *stable))
            && self.origin.as_ref() != Some(&self.spec)
    }
}

/// What happens between (and at) planning steps. Node indices are taken modulo the nodes.
#[derive(Clone, Debug)]
enum Event {
    /// A planning step with this verdict on the wave in flight.
    Plan(Verdict),
    /// A node's agent applies what its spec holds (when its agent is up).
    Apply(usize),
    /// Every available agent applies what its spec holds.
    ApplyAll,
    /// A node's agent refuses the revision of this tuning its spec holds.
    Refuse(usize),
    /// A tuning of higher priority takes the node, and moves it onto its revision or not.
    Take(usize, bool),
    /// The node is governed by this tuning again (the other one was deleted, or narrowed).
    Return(usize),
    /// The node's agent stops or starts renewing its heartbeat.
    Toggle(usize),
    /// A node joins the pool, running nothing of hoststack's or another tuning's revision.
    Join(bool),
    /// A node leaves the cluster.
    Leave(usize),
    /// The tuning's spec changes: a new revision.
    NewRevision,
}

fn event() -> impl Generator<Value = Event> {
    let verdict = prop_oneof![
        1 => Just(Verdict::Fail("worse".into())),
        1 => Just(Verdict::Inconclusive("empty".into())),
        2 => Just(Verdict::Pending),
        6 => Just(Verdict::Pass),
    ];
    prop_oneof![
        10 => verdict.prop_map(Event::Plan),
        4 => any::<usize>().prop_map(Event::Apply),
        4 => Just(Event::ApplyAll),
        1 => any::<usize>().prop_map(Event::Refuse),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, moved)| Event::Take(i, moved)),
        2 => any::<usize>().prop_map(Event::Return),
        1 => any::<usize>().prop_map(Event::Toggle),
        1 => any::<bool>().prop_map(Event::Join),
        1 => any::<usize>().prop_map(Event::Leave),
        1 => Just(Event::NewRevision),
    ]
}

/// The cluster as one tuning's controller sees and drives it.
struct Cluster {
    strategy: Strategy,
    progress: Progress,
    nodes: Vec<Node>,
    /// Revisions made so far (the next one is `r<revisions>`).
    revisions: usize,
    /// Nodes ever created (names are never reused).
    created: usize,
    /// The tuning governs no node: its next plan starts a new round (as `progress::restore`
    /// does for a superseded tuning).
    superseded: bool,
    now: u64,
}

impl Cluster {
    fn stable(&self) -> Holding {
        Holding::stable(self.progress.stable.as_deref())
    }

    fn in_flight(&self) -> Vec<&str> {
        let stable = self.stable();
        self.nodes
            .iter()
            .filter(|n| n.governed && n.in_flight(&stable))
            .map(|n| n.name.as_str())
            .collect()
    }

    fn node(&mut self, i: usize) -> Option<&mut Node> {
        let len = self.nodes.len();
        (len > 0).then(|| &mut self.nodes[i % len])
    }

    /// Runs one event and checks the laws; the error says which broke.
    fn run(&mut self, event: &Event) -> Result<(), String> {
        self.now += 1;
        match event {
            Event::Plan(verdict) => return self.plan(verdict),
            Event::Apply(i) => {
                if let Some(n) = self.node(*i).filter(|n| n.available) {
                    apply(n);
                }
            }
            Event::ApplyAll => self
                .nodes
                .iter_mut()
                .filter(|n| n.available)
                .for_each(apply),
            Event::Refuse(i) => {
                if let Some(n) = self.node(*i) {
                    if n.available && n.spec != n.runs && matches!(n.spec, Holding::Own(_)) {
                        n.refused = Some(n.spec.clone());
                    }
                }
            }
            Event::Take(i, moved) => {
                if let Some(n) = self.node(*i).filter(|n| n.governed) {
                    n.governed = false;
                    if *moved {
                        // Another tuning's revision: the rollout's move is undone.
                        n.origin = None;
                        n.spec = other();
                        n.joining = false;
                        n.runs = other();
                        n.refused = None;
                    }
                }
            }
            Event::Return(i) => {
                if let Some(n) = self.node(*i) {
                    n.governed = true;
                }
            }
            Event::Toggle(i) => {
                if let Some(n) = self.node(*i) {
                    n.available = !n.available;
                }
            }
            Event::Join(runs_other) => {
                self.created += 1;
                let holding = if *runs_other {
                    other()
                } else {
                    Holding::Nothing
                };
                self.nodes
                    .push(Node::new(format!("j{:02}", self.created), holding));
            }
            Event::Leave(i) => {
                if !self.nodes.is_empty() {
                    let len = self.nodes.len();
                    self.nodes.remove(i % len);
                }
            }
            Event::NewRevision => {
                self.revisions += 1;
                // As `progress::restore`: a complete rollout's revision is the new stable one.
                let stable = match self.progress.state {
                    State::Complete => Some(self.progress.revision.clone()),
                    _ => self.progress.stable.clone(),
                };
                self.progress = Progress::start(&format!("r{}", self.revisions), stable.as_deref());
                self.forget_origins();
            }
        }
        self.check_in_flight()
    }

    /// A reconcile: the planner's step (or a hold, as the controller does it), its targets
    /// written to the specs of the governed nodes.
    fn plan(&mut self, verdict: &Verdict) -> Result<(), String> {
        let revision = self.progress.revision.clone();
        let views: Vec<NodeView> = self
            .nodes
            .iter()
            .filter(|n| n.governed)
            .map(|n| n.view(&revision))
            .collect();
        if views.is_empty() {
            self.superseded = true;
            return Ok(());
        }
        if std::mem::take(&mut self.superseded) {
            self.progress = Progress {
                first_wave: self.progress.first_wave + self.progress.waves.len(),
                ..Progress::start(&revision, self.progress.stable.as_deref())
            };
            // The new round does not know where the earlier ones took a node from: a node
            // still on the revision goes back to the stable one if this round rolls back.
            let own = Holding::Own(revision.clone());
            let stable = self.stable();
            for n in self.nodes.iter_mut().filter(|n| n.spec == own) {
                if n.origin.is_some() {
                    n.origin = Some(stable.clone());
                }
            }
        }
        let round = (self.progress.first_wave, self.progress.waves.len());
        let d = if views.iter().any(|v| v.available) {
            let elsewhere = self
                .nodes
                .iter()
                .filter(|n| !n.governed && matches!(n.spec, Holding::Own(_)) && n.unanswered())
                .count();
            plan(
                &self.strategy,
                &self.progress,
                &views,
                elsewhere,
                verdict,
                self.now,
            )
        } else {
            hold(&self.progress, &views)
        };
        let own = Holding::Own(revision.clone());
        let stable = Holding::stable(d.progress.stable.as_deref());
        let mut moved = Vec::new();
        for n in self.nodes.iter_mut().filter(|n| n.governed) {
            let target = &d.targets[&n.name];
            if *target == n.spec {
                continue;
            }
            // A node that ran nothing given the stable revision: joining the pool, not moved.
            let joining = n.spec == Holding::Nothing && *target == stable;
            if !joining && *target == own {
                moved.push(n.name.clone());
                n.origin.get_or_insert_with(|| n.spec.clone());
            } else if !joining && n.origin.as_ref() != Some(target) {
                return Err(format!(
                    "{} moved from {:?} to {target:?}: neither into a wave, nor back where the rollout took it from, nor a joining node onto the stable revision",
                    n.name, n.spec
                ));
            }
            n.joining = joining;
            n.spec = target.clone();
        }
        if *verdict != Verdict::Pass {
            let canary = self.strategy.canary.min(self.strategy.max_unavailable);
            if moved.len() > canary {
                return Err(format!(
                    "{moved:?} moved onto {revision} on {verdict:?}: only a canary of {canary} may go without a verdict that passed"
                ));
            }
            let (first_wave, waves) = round;
            if d.progress.first_wave == first_wave && waves > 0 && d.progress.waves.len() > waves {
                return Err(format!(
                    "wave {} of {revision} started on {verdict:?}",
                    first_wave + waves
                ));
            }
        }
        if let State::RolledBack(_) = d.progress.state {
            for n in self.nodes.iter().filter(|n| n.governed) {
                if let Some(origin) = n.origin.as_ref().filter(|o| **o != n.spec) {
                    return Err(format!(
                        "rolled back, but {} is on {:?}, not back on {origin:?}",
                        n.name, n.spec
                    ));
                }
            }
        }
        if d.progress.state == State::Complete {
            // The revision is the stable one: a later round's rollback returns only its own
            // nodes.
            self.forget_origins();
        }
        self.progress = d.progress;
        self.check_in_flight()
    }

    /// A new rollout (a new revision, or the revision become the stable one) starts afresh:
    /// it took no node from anywhere, except that nodes on their way back from a rollback
    /// stay so.
    fn forget_origins(&mut self) {
        for n in &mut self.nodes {
            if n.origin.as_ref() != Some(&n.spec) {
                n.origin = None;
            }
        }
    }

    fn check_in_flight(&self) -> Result<(), String> {
        let in_flight = self.in_flight();
        if in_flight.len() > self.strategy.max_unavailable {
            return Err(format!(
                "{} nodes in flight ({in_flight:?}), maxUnavailable {}",
                in_flight.len(),
                self.strategy.max_unavailable
            ));
        }
        Ok(())
    }
}

/// The agent applies what its spec holds (or reverts, when it holds nothing).
fn apply(n: &mut Node) {
    if n.refused.as_ref() != Some(&n.spec) {
        n.runs = n.spec.clone();
        n.refused = None;
    }
}

/// What node `i` runs before the history starts: the stable revision, an earlier one of the
/// tuning, another tuning's revision, or nothing.
fn before(i: usize) -> Holding {
    match i % 4 {
        0 => Holding::Own("r0".into()),
        1 => other(),
        2 => Holding::Own("older".into()),
        _ => Holding::Nothing,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The laws of the module's doc hold after every event of any history.
    #[test]
    fn rollout_laws_hold_over_whole_histories(
        n in 1usize..7,
        canary in 1usize..4,
        max_unavailable in 1usize..4,
        auto_rollback in any::<bool>(),
        first in any::<bool>(),
        events in proptest::collection::vec(event(), 1..80),
    ) {
        let stable = (!first).then_some("r0");
        let mut cluster = Cluster {
            strategy: Strategy {
                canary,
                max_unavailable,
                pause_after_canary: Duration::from_secs(2),
                pause_between_waves: Duration::from_secs(1),
                auto_rollback,
                paused: false,
                judged: true,
            },
            progress: Progress::start("r1", stable),
            nodes: (0..n).map(|i| Node::new(format!("n{i:02}"), before(i))).collect(),
            revisions: 1,
            created: 0,
            superseded: false,
            now: 0,
        };
        for (i, e) in events.iter().enumerate() {
            if let Err(broken) = cluster.run(e) {
                let nodes: BTreeMap<&str, (&Holding, &Holding, bool)> = cluster
                    .nodes
                    .iter()
                    .map(|n| (n.name.as_str(), (&n.spec, &n.runs, n.governed)))
                    .collect();
                prop_assert!(
                    false,
                    "event {i} {e:?}: {broken}\nnodes (spec, runs, governed): {nodes:?}\nprogress: {:?}",
                    cluster.progress
                );
            }
        }
    }
}
