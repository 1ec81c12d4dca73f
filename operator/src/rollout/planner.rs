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
    /// Its agent has answered for what the spec holds (applied it, failed it), or the spec
    /// holds no revision. A node that has not is in flight, whichever rollout (or revision of
    /// this one) put it there, and counts against `maxUnavailable` until it answers.
    pub settled: bool,
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

/// One planning step. `nodes` are the nodes the tuning governs; `elsewhere` counts the nodes
/// it does not govern (any more) that are in flight onto one of its revisions: another tuning
/// took them before their agents answered, and they count against `maxUnavailable` as much
/// as the governed ones, for they may come back.
pub fn plan(
    strategy: &Strategy,
    previous: &Progress,
    nodes: &[NodeView],
    elsewhere: usize,
    verdict: &Verdict,
    now: u64,
) -> Decision {
    let mut progress = previous.clone();
    forget_leavers(&mut progress, nodes);
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
            elsewhere,
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
    let mut progress = previous.clone();
    forget_leavers(&mut progress, nodes);
    Decision {
        targets: targets(&progress, nodes),
        progress,
        requeue_after: None,
    }
}

/// Takes out of their waves the nodes that left the rollout since a wave took them: their
/// spec holds neither the revision nor where the wave took them from, or, once the wave
/// applied (a rollout rolled back aside), any revision but the rollout's. Another tuning took
/// such a node and handed it back: it comes back as a new node
/// (docs/rollouts.md, "Nodes that come and go"), which keeps what it runs until a wave takes
/// it (one that runs nothing gets the stable revision), never the revision at once. Nodes
/// the rollout does not see (governed by another tuning) stay in their waves.
fn forget_leavers(progress: &mut Progress, nodes: &[NodeView]) {
    let held: HashMap<&str, &Holding> = nodes
        .iter()
        .map(|n| (n.name.as_str(), &n.holding))
        .collect();
    let own = Holding::Own(progress.revision.clone());
    let stable = Holding::stable(progress.stable.as_deref());
    let rolled_back = matches!(progress.state, State::RolledBack(_));
    let complete = progress.state == State::Complete;
    for wave in &mut progress.waves {
        let settled = !rolled_back && (complete || wave.applied_at.is_some());
        let Wave { nodes, from, .. } = wave;
        nodes.retain(|n| {
            let Some(&holding) = held.get(n.as_str()) else {
                return true;
            };
            let origin = from.get(n).unwrap_or(&stable);
            // A spec that holds nothing is not taken for a departure: the operator's own
            // write may not have landed yet.
            let left =
                *holding != own && *holding != Holding::Nothing && (settled || holding != origin);
            if left {
                from.remove(n);
            }
            !left
        });
    }
}

/// What each node runs at `progress`: the nodes of the waves the revision (or, rolled back,
/// where they came from); every other node what it holds, except that a node holding nothing
/// gets the stable revision at once (a node joining the pool), and, rolled back, a node on
/// the revision that no wave of this round took (an earlier round did, before another tuning
/// took the node and handed it back) goes back to the stable revision: no node stays on a
/// revision that was rolled back, and where an earlier round took it from is not known.
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
    let own = Holding::Own(progress.revision.clone());
    nodes
        .iter()
        .map(|n| {
            let target = match origins.get(n.name.as_str()) {
                Some(&from) if rolled_back => from.clone(),
                Some(_) => own.clone(),
                None if n.holding == Holding::Nothing || (rolled_back && n.holding == own) => {
                    stable.clone()
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
    elsewhere: usize,
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
    // Nodes still in flight (a wave of an earlier revision whose agents have not answered)
    // take their share of maxUnavailable: the next wave gets the room left, or waits.
    let unsettled = nodes.iter().filter(|n| !n.settled).count() + elsewhere;
    let room = strategy.max_unavailable.saturating_sub(unsettled);
    let size = if progress.waves.is_empty() {
        strategy.canary.min(room)
    } else {
        room
    };
    if size == 0 {
        progress.state = State::Progressing;
        return;
    }
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
mod histories;

#[cfg(test)]
mod tests {
    use super::*;

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
            settled: true,
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
            0,
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
            0,
            &Verdict::Pending,
            0,
        );
        assert_eq!(d.progress.waves.len(), 1);
        // The operator wrote r2 to the canary's spec; applied at t=10: the pause runs until
        // t=40.
        nodes[0].holding = Holding::Own("r2".into());
        nodes[0].report = Report::Applied;
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 10);
        assert_eq!((d.progress.waves.len(), d.requeue_after), (1, Some(30)));
        // Pause over, not judged yet.
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pending, 40);
        assert_eq!(d.progress.waves.len(), 1);
        // Judged good: the next wave takes up to maxUnavailable nodes.
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 41);
        assert_eq!(on(&d, Some("r2")), vec!["a", "b", "c"]);
        for n in &mut nodes[1..] {
            n.holding = Holding::Own("r2".into());
            n.report = Report::Applied;
        }
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 42);
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
            0,
            &Verdict::Pending,
            0,
        );
        nodes[0].report = Report::Failed("EINVAL".into());
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pending, 5);
        assert!(matches!(d.progress.state, State::RolledBack(ref r) if r.contains("a failed")));
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
        // It stays rolled back: only a new revision tries again.
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 100);
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
            0,
            &Verdict::Pending,
            0,
        );
        nodes[0].report = Report::Failed("EINVAL".into());
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 5);
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
            0,
            &Verdict::Pending,
            0,
        );
        let d = plan(
            &s,
            &started.progress,
            &nodes,
            0,
            &Verdict::Inconclusive("no samples".into()),
            1,
        );
        assert!(matches!(d.progress.state, State::Paused(ref r) if r.contains("inconclusive")));
        assert_eq!(on(&d, Some("r2")), vec!["a"]);
        let d = plan(
            &s,
            &started.progress,
            &nodes,
            0,
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
            0,
            &Verdict::Pending,
            0,
        );
        assert!(matches!(d.progress.state, State::Paused(_)));
        assert_eq!(on(&d, Some("r1")), vec!["a", "b"]);
        let s = Strategy { paused: false, ..s };
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pending, 1);
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
        let d = plan(&s, &done, &nodes, 0, &Verdict::Pending, 0);
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
            plan(&s, &done, &settled, 0, &Verdict::Pending, 0).progress,
            done
        );
    }

    /// Issue 39's case: B governs n1..n3 and is complete; C, of higher priority, took n2 and n3
    /// and put its revision there; C is deleted and hands them back to B. They come back as
    /// new nodes to roll onto: a canary first, the other only after a verdict that passed.
    #[test]
    fn nodes_returning_to_a_complete_rollout_go_canary_first_and_wait_for_a_verdict() {
        let s = strategy();
        let mut done = Progress::start("rb", Some("rb"));
        done.waves = vec![
            Wave::of(vec!["n1".into()]),
            Wave::of(vec!["n2".into(), "n3".into()]),
        ];
        done.state = State::Complete;
        let c = Holding::Other {
            tuning: "c".into(),
            revision: "rc".into(),
        };
        let b = Holding::Own("rb".into());
        let mut nodes = [
            NodeView {
                holding: b.clone(),
                ..node("n1", Report::Applied)
            },
            NodeView {
                holding: c.clone(),
                ..node("n2", Report::Pending)
            },
            NodeView {
                holding: c.clone(),
                ..node("n3", Report::Pending)
            },
        ];
        let d = plan(&s, &done, &nodes, 0, &Verdict::Pending, 0);
        assert_eq!(d.progress.state, State::Progressing);
        assert_eq!(d.progress.first_wave, 2, "numbered after the first round");
        assert_eq!(
            d.progress.waves,
            [Wave {
                from: [("n2".to_string(), c.clone())].into(),
                ..Wave::of(vec!["n2".into()])
            }],
            "n2 alone is the canary"
        );
        assert_eq!(
            (&d.targets["n1"], &d.targets["n2"], &d.targets["n3"]),
            (&b, &b, &c),
            "n3 keeps C's revision until a wave takes it"
        );
        // The canary applied at t=1; its pause runs until t=31; no verdict yet: n3 waits.
        nodes[1].holding = b.clone();
        nodes[1].report = Report::Applied;
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pending, 1);
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pending, 40);
        assert_eq!(d.targets["n3"], c, "no verdict, no next wave");
        let d = plan(&s, &d.progress, &nodes, 0, &Verdict::Pass, 41);
        assert_eq!(d.targets["n3"], b, "judged good: n3 is the next wave");
        assert_eq!(d.progress.waves.len(), 2);
    }
}
