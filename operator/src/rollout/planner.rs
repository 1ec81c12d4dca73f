//! The rollout planner: a pure function from (strategy, what the nodes run and report, the
//! rollout's progress so far, the analysis verdict, now) to what each node should run next and
//! the rollout's new progress. No cluster, no clock, no I/O: every transition is a table test.
//!
//! A rollout moves a tuning's nodes onto its current revision in waves: the canary first
//! (nodes labelled hoststack.dev/canary=true preferred), then waves of at most
//! `maxUnavailable` nodes. A node's baseline is what it runs now ([`Holding`]): the tuning's
//! stable revision, an earlier one, another tuning's revision (a takeover), or nothing. Nodes
//! outside the waves keep it; each wave moves its nodes from it to the revision in one step
//! and remembers where they came from. A wave is done when every node in it applied the
//! revision, its pause has elapsed and it was judged (or promoted by hand). A node that fails,
//! or a failed analysis, returns every node of the waves to where it came from (or halts,
//! without autoRollback); only a new revision tries again. An inconclusive analysis pauses; it
//! never counts as a pass. A complete rollout whose tuning is handed nodes that run something
//! else (another tuning's revision) starts a new round of waves for them, canary first.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

/// What the rollout settings resolve to for a given number of matched nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strategy {
    /// Nodes in the canary wave (at least 1, at most `max_unavailable`).
    pub canary: usize,
    /// Most nodes changing at once (at least 1).
    pub max_unavailable: usize,
    /// Wait after the canary applied, before it may be promoted.
    pub pause_after_canary: Duration,
    /// Wait after each later wave applied.
    pub pause_between_waves: Duration,
    /// Roll back on failure (else halt).
    pub auto_rollback: bool,
    /// Hold where it is.
    pub paused: bool,
    /// Every wave needs a verdict (analysis or promotion by hand) before the next one.
    pub judged: bool,
}

/// A count or a percentage of `total`, rounded up, at least 1 and at most `total.max(1)`.
pub fn resolve_count(value: Option<&str>, total: usize, default: usize) -> Result<usize, String> {
    let n = match value {
        None => default,
        Some(v) => match v.strip_suffix('%') {
            Some(p) => {
                let p: usize = p
                    .parse()
                    .map_err(|_| format!("{v:?} is not a percentage"))?;
                if p > 100 {
                    return Err(format!("{v:?} is over 100%"));
                }
                (total * p).div_ceil(100)
            }
            None => v
                .parse()
                .map_err(|_| format!("{v:?} is neither a count nor a percentage"))?,
        },
    };
    Ok(n.clamp(1, total.max(1)))
}

/// A node as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Labelled hoststack.dev/canary=true.
    pub canary_label: bool,
    /// Its agent has reported recently; unavailable nodes are never rolled onto.
    pub available: bool,
    /// What its agent reports about the current revision.
    pub report: Report,
    /// What its NodeTuning spec holds now.
    pub holding: Holding,
}

/// What a node runs, as one tuning's rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holding {
    /// Nothing of hoststack's.
    Nothing,
    /// A revision of the tuning being rolled out.
    Own(String),
    /// A revision of another tuning: the nodes were taken over from it.
    Other {
        /// The other tuning.
        tuning: String,
        /// Its revision.
        revision: String,
    },
}

impl Holding {
    /// What a node of a rollout whose stable revision is `stable` ran when its wave does not
    /// say otherwise.
    pub fn stable(stable: Option<&str>) -> Holding {
        stable.map_or(Holding::Nothing, |s| Holding::Own(s.into()))
    }

    /// The revision held, of whichever tuning.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Holding::Nothing => None,
            Holding::Own(r) | Holding::Other { revision: r, .. } => Some(r),
        }
    }
}

/// An agent's report about one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// Not applied (yet).
    Pending,
    /// Applied and verified.
    Applied,
    /// Failed, with the reason.
    Failed(String),
}

/// The judgement of the wave in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not judged yet (the window is still open, or nobody promoted).
    Pending,
    /// Judged good (analysis passed, or promoted by hand).
    Pass,
    /// Judged bad.
    Fail(String),
    /// The measurement was empty or failed: pause, never promote.
    Inconclusive(String),
}

/// Where the rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Waves are being applied or judged.
    Progressing,
    /// Held: by `paused`, or by an inconclusive analysis (the reason says which).
    Paused(String),
    /// Every available node runs the revision.
    Complete,
    /// Updated nodes went back to the stable revision (the reason says why).
    RolledBack(String),
    /// A failure without autoRollback: nothing moves until a new revision.
    Halted(String),
}

/// One wave: its nodes, where they came from and when it finished applying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wave {
    /// The nodes changed in this wave.
    pub nodes: Vec<String>,
    /// When every node of the wave had applied (the start of its pause), in seconds.
    pub applied_at: Option<u64>,
    /// What its nodes ran before, for those that did not run the rollout's stable revision
    /// ([`Holding::stable`]): where a rollback returns them.
    pub from: BTreeMap<String, Holding>,
}

impl Wave {
    /// A wave of `nodes` that all came from the stable revision, not applied yet.
    pub fn of(nodes: Vec<String>) -> Self {
        Wave {
            nodes,
            applied_at: None,
            from: BTreeMap::new(),
        }
    }
}

/// The rollout's memory, kept in the tuning's status between reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The revision being rolled out.
    pub revision: String,
    /// The last revision of this tuning that every node it governed applied (absent before
    /// its first rollout completed).
    pub stable: Option<String>,
    /// The waves of this round so far; the last one is in flight unless the rollout ended.
    /// The first is the canary.
    pub waves: Vec<Wave>,
    /// The index of `waves[0]` among every wave of the revision: 0, or past the waves of the
    /// earlier rounds (a handover restarts a complete rollout), so that a wave's id
    /// ([`hoststack_crds::wave_id`]) is never reused for the same revision.
    pub first_wave: usize,
    /// Where the rollout stands.
    pub state: State,
}

impl Progress {
    /// A fresh rollout of `revision` from `stable`.
    pub fn start(revision: &str, stable: Option<&str>) -> Self {
        Progress {
            revision: revision.into(),
            stable: stable.map(Into::into),
            waves: Vec::new(),
            first_wave: 0,
            state: State::Progressing,
        }
    }

    /// A new round of the same revision after this one: no wave yet, numbered after this
    /// round's waves.
    pub fn next_round(&self) -> Self {
        Progress {
            revision: self.revision.clone(),
            stable: self.stable.clone(),
            waves: Vec::new(),
            first_wave: self.first_wave + self.waves.len(),
            state: State::Progressing,
        }
    }

    /// Nodes put on the revision by some wave.
    pub fn updated(&self) -> BTreeSet<&str> {
        self.waves
            .iter()
            .flat_map(|w| w.nodes.iter().map(String::as_str))
            .collect()
    }

    /// The index among every wave of the revision of this round's wave `i`.
    pub fn wave_index(&self, i: usize) -> usize {
        self.first_wave + i
    }

    /// Where each node of the waves came from.
    pub fn origins(&self) -> BTreeMap<&str, Holding> {
        let stable = Holding::stable(self.stable.as_deref());
        self.waves
            .iter()
            .flat_map(|w| {
                w.nodes.iter().map(|n| {
                    let from = w.from.get(n).cloned().unwrap_or_else(|| stable.clone());
                    (n.as_str(), from)
                })
            })
            .collect()
    }
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What each node should run: the rollout's revision, or what it ran before (the stable
    /// revision, an earlier one, another tuning's, or nothing).
    pub targets: BTreeMap<String, Holding>,
    /// The rollout's new memory.
    pub progress: Progress,
    /// When to look again at the latest (a pause ends), in seconds from now.
    pub requeue_after: Option<u64>,
}

/// One planning step.
pub fn plan(
    strategy: &Strategy,
    previous: &Progress,
    nodes: &[NodeView],
    verdict: &Verdict,
    now: u64,
) -> Decision {
    let mut progress = previous.clone();
    let mut requeue_after = None;

    // A complete rollout handed nodes that run something else goes again for them.
    if progress.state == State::Complete
        && !strategy.paused
        && !candidates(&progress, nodes).is_empty()
    {
        progress = progress.next_round();
    }
    if matches!(progress.state, State::Progressing | State::Paused(_)) {
        step(
            strategy,
            &mut progress,
            nodes,
            verdict,
            now,
            &mut requeue_after,
        );
    }

    Decision {
        targets: targets(&progress, nodes),
        progress,
        requeue_after,
    }
}

/// The rollout held where it is: no step, each node on what `previous` gives it. For when
/// nothing can be judged (no agent has reported yet).
pub fn hold(previous: &Progress, nodes: &[NodeView]) -> Decision {
    Decision {
        targets: targets(previous, nodes),
        progress: previous.clone(),
        requeue_after: None,
    }
}

/// What each node runs at `progress`: the nodes of the waves the revision (or, rolled back,
/// where they came from); every other node what it holds, except that a node holding nothing
/// gets the stable revision at once (a node joining the pool).
fn targets(progress: &Progress, nodes: &[NodeView]) -> BTreeMap<String, Holding> {
    // As `Progress::origins`, hashed and borrowed: one lookup per node stays O(1).
    let stable = &Holding::stable(progress.stable.as_deref());
    let mut origins: HashMap<&str, &Holding> = HashMap::with_capacity(wave_node_count(progress));
    origins.extend(progress.waves.iter().flat_map(|w| {
        w.nodes
            .iter()
            .map(move |n| (n.as_str(), w.from.get(n).unwrap_or(stable)))
    }));
    let rolled_back = matches!(progress.state, State::RolledBack(_));
    nodes
        .iter()
        .map(|n| {
            let target = match origins.get(n.name.as_str()) {
                Some(&from) if rolled_back => from.clone(),
                Some(_) => Holding::Own(progress.revision.clone()),
                None if n.holding == Holding::Nothing => {
                    Holding::stable(progress.stable.as_deref())
                }
                None => n.holding.clone(),
            };
            (n.name.clone(), target)
        })
        .collect()
}

/// The nodes a next wave may take: available, in no wave yet, and running something other
/// than the revision (a node holding nothing only when there is no stable revision to give it
/// at once).
fn candidates<'a>(progress: &Progress, nodes: &'a [NodeView]) -> Vec<&'a NodeView> {
    let updated = wave_nodes(progress);
    let own = Holding::Own(progress.revision.clone());
    // The set lookup last: a node already on the revision needs none.
    nodes
        .iter()
        .filter(|n| n.available)
        .filter(|n| match &n.holding {
            Holding::Nothing => progress.stable.is_none(),
            held => *held != own,
        })
        .filter(|n| !updated.contains(n.name.as_str()))
        .collect()
}

/// The nodes of the waves, as [`Progress::updated`] but hashed: for lookups, in no order.
fn wave_nodes(progress: &Progress) -> HashSet<&str> {
    let mut set = HashSet::with_capacity(wave_node_count(progress));
    set.extend(
        progress
            .waves
            .iter()
            .flat_map(|w| w.nodes.iter().map(String::as_str)),
    );
    set
}

/// How many node entries the waves hold (a node in two waves counts twice): what to size a
/// lookup table by.
fn wave_node_count(progress: &Progress) -> usize {
    progress.waves.iter().map(|w| w.nodes.len()).sum()
}

/// Advances a live rollout by at most one wave.
fn step(
    strategy: &Strategy,
    progress: &mut Progress,
    nodes: &[NodeView],
    verdict: &Verdict,
    now: u64,
    requeue_after: &mut Option<u64>,
) {
    let fail = |progress: &mut Progress, reason: String| {
        progress.state = if strategy.auto_rollback {
            State::RolledBack(reason)
        } else {
            State::Halted(reason)
        };
    };
    // The last view of each node by name (a hash map: one O(1) lookup per wave node).
    let reports: HashMap<&str, &NodeView> = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // A failure anywhere in the updated nodes ends the rollout; the first failed node by name
    // is the one reported.
    let failure = progress
        .waves
        .iter()
        .flat_map(|w| &w.nodes)
        .filter_map(|node| match reports.get(node.as_str()) {
            Some(NodeView {
                report: Report::Failed(why),
                ..
            }) => Some((node, why)),
            _ => None,
        })
        .min_by_key(|&(node, _)| node)
        .map(|(node, why)| format!("{node} failed to apply {}: {why}", progress.revision));
    if let Some(reason) = failure {
        fail(progress, reason);
        return;
    }
    if let Some(wave) = progress.waves.last_mut() {
        let applied = wave.nodes.iter().all(|n| {
            reports
                .get(n.as_str())
                .is_none_or(|v| v.report == Report::Applied)
        });
        if !applied {
            progress.state = State::Progressing;
            return;
        }
        let applied_at = *wave.applied_at.get_or_insert(now);
        let pause = if progress.waves.len() == 1 {
            strategy.pause_after_canary
        } else {
            strategy.pause_between_waves
        };
        let ready_at = applied_at + pause.as_secs();
        if now < ready_at {
            *requeue_after = Some(ready_at - now);
            progress.state = State::Progressing;
            return;
        }
        if strategy.judged {
            match verdict {
                Verdict::Pass => {}
                Verdict::Pending => {
                    progress.state = State::Progressing;
                    return;
                }
                Verdict::Fail(why) => {
                    fail(progress, format!("analysis failed: {why}"));
                    return;
                }
                Verdict::Inconclusive(why) => {
                    progress.state = State::Paused(format!("analysis inconclusive: {why}"));
                    return;
                }
            }
        }
    }
    if strategy.paused {
        progress.state = State::Paused("rollout.paused is set".into());
        return;
    }
    // The next wave: canaries (by label, then name) first.
    let candidates = candidates(progress, nodes);
    if candidates.is_empty() {
        // Every node that can run the revision does: it is the stable one from now on.
        progress.state = State::Complete;
        progress.stable = Some(progress.revision.clone());
        return;
    }
    let size = if progress.waves.is_empty() {
        strategy.canary.min(strategy.max_unavailable)
    } else {
        strategy.max_unavailable
    };
    let picked = first_by_canary_then_name(candidates, size);
    let stable = Holding::stable(progress.stable.as_deref());
    progress.waves.push(Wave {
        nodes: picked.iter().map(|n| n.name.clone()).collect(),
        applied_at: None,
        from: picked
            .iter()
            .filter(|n| n.holding != stable)
            .map(|n| (n.name.clone(), n.holding.clone()))
            .collect(),
    });
    progress.state = State::Progressing;
}

/// The first `size` of `candidates` ordered canaries first, then by name (ties in the order
/// given, as a stable sort would leave them), and in that order. Only the picked ones are
/// sorted: O(n + size log size) rather than a sort of every candidate.
fn first_by_canary_then_name(candidates: Vec<&NodeView>, size: usize) -> Vec<&NodeView> {
    let mut ranked: Vec<(usize, &NodeView)> = candidates.into_iter().enumerate().collect();
    let order = |(i, a): &(usize, &NodeView), (j, b): &(usize, &NodeView)| {
        b.canary_label
            .cmp(&a.canary_label)
            .then(a.name.cmp(&b.name))
            .then(i.cmp(j))
    };
    let size = size.min(ranked.len());
    if size < ranked.len() {
        ranked.select_nth_unstable_by(size, order);
        ranked.truncate(size);
    }
    ranked.sort_unstable_by(order);
    ranked.into_iter().map(|(_, n)| n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{any, prop_assert, prop_assert_eq, proptest};

    fn strategy() -> Strategy {
        Strategy {
            canary: 1,
            max_unavailable: 2,
            pause_after_canary: Duration::from_secs(30),
            pause_between_waves: Duration::from_secs(0),
            auto_rollback: true,
            paused: false,
            judged: true,
        }
    }

    /// A node on revision r1 of the tuning.
    fn node(name: &str, report: Report) -> NodeView {
        NodeView {
            name: name.into(),
            canary_label: false,
            available: true,
            report,
            holding: Holding::Own("r1".into()),
        }
    }

    /// The nodes whose target is revision `rev` (of whichever tuning).
    fn on(d: &Decision, rev: Option<&str>) -> Vec<String> {
        d.targets
            .iter()
            .filter(|(_, t)| t.revision() == rev)
            .map(|(n, _)| n.clone())
            .collect()
    }

    #[test]
    fn counts_and_percentages_round_up_within_bounds() {
        let table = [
            (None, 10, 1, Ok(1)),
            (Some("3"), 10, 1, Ok(3)),
            (Some("25%"), 10, 1, Ok(3)),
            (Some("0"), 10, 1, Ok(1)),
            (Some("50"), 4, 1, Ok(4)),
            (Some("1%"), 0, 1, Ok(1)),
            (Some("x"), 10, 1, Err(())),
            (Some("120%"), 10, 1, Err(())),
        ];
        for (v, total, default, want) in table {
            assert_eq!(
                resolve_count(v, total, default).map_err(|_| ()),
                want,
                "{v:?} of {total}"
            );
        }
    }

    #[test]
    fn holding_keeps_every_node_where_the_rollout_put_it() {
        let mut p = Progress::start("r2", Some("r1"));
        p.waves.push(Wave::of(vec!["a".into()]));
        let nodes = [node("a", Report::Pending), node("b", Report::Pending)];
        let d = hold(&p, &nodes);
        assert_eq!(d.progress, p);
        assert_eq!(
            (on(&d, Some("r2")), on(&d, Some("r1"))),
            (vec!["a".into()], vec!["b".into()])
        );
    }

    #[test]
    fn canary_first_preferring_the_label() {
        let mut nodes = vec![
            node("a", Report::Pending),
            node("b", Report::Pending),
            node("c", Report::Pending),
        ];
        nodes[2].canary_label = true;
        let d = plan(
            &strategy(),
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        assert_eq!(on(&d, Some("r2")), vec!["c"]);
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
    }

    #[test]
    fn a_wave_waits_for_apply_pause_and_verdict() {
        let s = strategy();
        let mut nodes = vec![
            node("a", Report::Pending),
            node("b", Report::Pending),
            node("c", Report::Pending),
        ];
        let d = plan(
            &s,
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        assert_eq!(d.progress.waves.len(), 1);
        // Applied at t=10: the pause runs until t=40.
        nodes[0].report = Report::Applied;
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pass, 10);
        assert_eq!((d.progress.waves.len(), d.requeue_after), (1, Some(30)));
        // Pause over, not judged yet.
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pending, 40);
        assert_eq!(d.progress.waves.len(), 1);
        // Judged good: the next wave takes up to maxUnavailable nodes.
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pass, 41);
        assert_eq!(on(&d, Some("r2")), vec!["a", "b", "c"]);
        nodes[1].report = Report::Applied;
        nodes[2].report = Report::Applied;
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pass, 42);
        assert_eq!(d.progress.state, State::Complete);
    }

    #[test]
    fn a_failed_canary_rolls_back_and_others_are_never_touched() {
        let s = strategy();
        let mut nodes = vec![node("a", Report::Pending), node("b", Report::Pending)];
        let d = plan(
            &s,
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        nodes[0].report = Report::Failed("EINVAL".into());
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pending, 5);
        assert!(matches!(d.progress.state, State::RolledBack(ref r) if r.contains("a failed")));
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
        // It stays rolled back: only a new revision tries again.
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pass, 100);
        assert_eq!(on(&d, Some("r2")), Vec::<String>::new());
    }

    #[test]
    fn without_auto_rollback_a_failure_halts() {
        let s = Strategy {
            auto_rollback: false,
            ..strategy()
        };
        let mut nodes = vec![node("a", Report::Pending), node("b", Report::Pending)];
        let d = plan(
            &s,
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        nodes[0].report = Report::Failed("EINVAL".into());
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pass, 5);
        assert!(matches!(d.progress.state, State::Halted(_)));
        assert_eq!(on(&d, Some("r2")), vec!["a"]);
    }

    #[test]
    fn failed_or_inconclusive_analysis() {
        let s = Strategy {
            pause_after_canary: Duration::ZERO,
            ..strategy()
        };
        let nodes = vec![node("a", Report::Applied), node("b", Report::Pending)];
        let started = plan(
            &s,
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        let d = plan(
            &s,
            &started.progress,
            &nodes,
            &Verdict::Inconclusive("no samples".into()),
            1,
        );
        assert!(matches!(d.progress.state, State::Paused(ref r) if r.contains("inconclusive")));
        assert_eq!(on(&d, Some("r2")), vec!["a"]);
        let d = plan(
            &s,
            &started.progress,
            &nodes,
            &Verdict::Fail("retransmits 3x baseline".into()),
            1,
        );
        assert!(
            matches!(d.progress.state, State::RolledBack(ref r) if r.contains("analysis failed"))
        );
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
    }

    #[test]
    fn paused_holds_and_new_or_unavailable_nodes_get_stable() {
        let s = Strategy {
            paused: true,
            ..strategy()
        };
        let mut nodes = vec![node("a", Report::Pending), node("b", Report::Pending)];
        nodes[0].available = false;
        let d = plan(
            &s,
            &Progress::start("r2", Some("r1")),
            &nodes,
            &Verdict::Pending,
            0,
        );
        assert!(matches!(d.progress.state, State::Paused(_)));
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
        let s = Strategy { paused: false, ..s };
        let d = plan(&s, &d.progress, &nodes, &Verdict::Pending, 1);
        assert_eq!(
            on(&d, Some("r2")),
            vec!["b"],
            "the unavailable node is not rolled onto"
        );
    }

    #[test]
    fn a_complete_rollout_handed_other_nodes_goes_again_canary_first() {
        let s = strategy();
        let mut done = Progress::start("r2", Some("r2"));
        done.waves = vec![Wave::of(vec!["a".into()]), Wave::of(vec!["b".into()])];
        done.state = State::Complete;
        let core = Holding::Other {
            tuning: "core".into(),
            revision: "c1".into(),
        };
        let nodes = [
            NodeView {
                holding: Holding::Own("r2".into()),
                ..node("a", Report::Applied)
            },
            NodeView {
                holding: core.clone(),
                ..node("c", Report::Pending)
            },
            NodeView {
                holding: core.clone(),
                ..node("d", Report::Pending)
            },
            // A node joining with nothing gets the stable revision at once.
            NodeView {
                holding: Holding::Nothing,
                ..node("e", Report::Pending)
            },
        ];
        let d = plan(&s, &done, &nodes, &Verdict::Pending, 0);
        assert_eq!(d.progress.state, State::Progressing);
        assert_eq!(d.progress.first_wave, 2, "numbered after the first round");
        assert_eq!(
            d.progress.waves,
            [Wave {
                from: [("c".to_string(), core.clone())].into(),
                ..Wave::of(vec!["c".into()])
            }]
        );
        assert_eq!(on(&d, Some("r2")), ["a", "c", "e"]);
        assert_eq!(d.targets["d"], core);
        // Nothing else to hand over: it stays complete.
        let settled = [nodes[0].clone()];
        assert_eq!(
            plan(&s, &done, &settled, &Verdict::Pending, 0).progress,
            done
        );
    }

    /// What node `i` of a property run holds before the rollout: the stable revision, an
    /// earlier one of the tuning, another tuning's revision, or nothing.
    fn before(i: usize) -> Holding {
        match i % 4 {
            0 => Holding::Own("good".into()),
            1 => Holding::Other {
                tuning: "core".into(),
                revision: "c1".into(),
            },
            2 => Holding::Own("older".into()),
            _ => Holding::Nothing,
        }
    }

    proptest! {
        /// Never more than maxUnavailable nodes in flight; never a promotion past a failed or
        /// inconclusive analysis; nodes outside the waves never change what they run (one that
        /// ran nothing gets the stable revision at once); after a rollback every node runs what
        /// it ran before the rollout, whichever tuning that came from.
        #[test]
        fn rollout_invariants(
            n in 1usize..12,
            canary in 1usize..4,
            max_unavailable in 1usize..5,
            auto_rollback in any::<bool>(),
            first in any::<bool>(),
            steps in proptest::collection::vec((0u8..6, 0usize..12), 1..40),
        ) {
            let s = Strategy {
                canary,
                max_unavailable,
                pause_after_canary: Duration::from_secs(2),
                pause_between_waves: Duration::from_secs(1),
                auto_rollback,
                paused: false,
                judged: true,
            };
            // A first rollout has no stable revision: a node that ran nothing waits for a wave.
            let stable = (!first).then_some("good");
            let mut nodes: Vec<NodeView> = (0..n)
                .map(|i| NodeView {
                    holding: before(i),
                    ..node(&format!("n{i:02}"), Report::Pending)
                })
                .collect();
            let ran: BTreeMap<String, Holding> = nodes
                .iter()
                .map(|v| {
                    let held = match &v.holding {
                        Holding::Nothing => Holding::stable(stable),
                        held => held.clone(),
                    };
                    (v.name.clone(), held)
                })
                .collect();
            let mut progress = Progress::start("bad", stable);
            for (t, (event, pick)) in steps.into_iter().enumerate() {
                let now = t as u64;
                let verdict = match event {
                    0 => Verdict::Fail("worse".into()),
                    1 => Verdict::Inconclusive("empty".into()),
                    2 => Verdict::Pending,
                    _ => Verdict::Pass,
                };
                if event == 5 {
                    let i = pick % n;
                    nodes[i].report = Report::Failed("refused".into());
                }
                let before = progress.waves.len();
                let d = plan(&s, &progress, &nodes, &verdict, now);
                let in_flight = d.progress.waves.last().map_or(0, |w| w.nodes.len());
                prop_assert!(in_flight <= max_unavailable);
                if before > 0 && d.progress.waves.len() > before {
                    prop_assert!(matches!(verdict, Verdict::Pass), "promoted on {verdict:?}");
                }
                let updated: BTreeSet<String> =
                    d.progress.updated().into_iter().map(String::from).collect();
                for v in &nodes {
                    if !updated.contains(&v.name) {
                        prop_assert_eq!(&d.targets[&v.name], &ran[&v.name], "{} moved outside a wave", v.name);
                    }
                }
                if let State::RolledBack(_) = d.progress.state {
                    prop_assert_eq!(&d.targets, &ran);
                }
                // Agents apply what they were given, unless they failed; the spec holds it.
                for v in nodes.iter_mut() {
                    if updated.contains(&v.name) && v.report == Report::Pending {
                        v.report = Report::Applied;
                    }
                    v.holding = d.targets[&v.name].clone();
                }
                progress = d.progress;
            }
        }
    }
}
