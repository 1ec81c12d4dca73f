//! What each governed node is told: its revision (from the planner), its part in the rollout
//! (the `phase` label of its metrics), and whether its agent should sample its health: the
//! wave being judged does, and so does a bounded sample of the baseline ([`baseline_sample`]),
//! so that judging a wave writes to as many nodes whatever the size of the pool. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hoststack_crds::{wave_id, HealthRequest, RolloutPhase};

use super::planner::{Decision, Holding, Progress, State};

/// One node's instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    /// What to run: a revision of this tuning, what it ran before (another tuning's revision),
    /// or nothing.
    pub target: Holding,
    /// Its part in the rollout.
    pub phase: RolloutPhase,
    /// Health sampling asked of its agent.
    pub health_request: Option<HealthRequest>,
}

/// The health request of the wave in flight, when it is judged by health samples: its id names
/// the revision and the wave, so samples of an earlier wave never count. It goes out with the
/// wave's revision, in the same write (a window during which the agent ran the transaction is
/// not steady and never counts, and the gate judges only once the wave applied): one write per
/// node fewer than asking once the wave has applied.
pub fn health_request(progress: &Progress, window: Duration) -> Option<HealthRequest> {
    let judging = matches!(progress.state, State::Progressing | State::Paused(_));
    progress.waves.last()?;
    judging.then(|| HealthRequest {
        id: wave_id(
            &progress.revision,
            progress.wave_index(progress.waves.len() - 1),
        ),
        window: format!("{}ms", window.as_millis()),
    })
}

/// How many baseline nodes sample the health of a wave being judged: enough for a steady
/// ratio over a window, and a bound on the writes judging a wave costs (asking every baseline
/// node made each wave write to the whole pool: O(nodes) per wave, O(nodes²) per rollout).
pub const BASELINE_SAMPLE: usize = 50;

/// The baseline nodes that sample a wave's health: of `candidates` (the governed nodes in no
/// wave of the round), the [`BASELINE_SAMPLE`] whose names hash lowest. The same candidates
/// give the same sample in every reconcile, to the planner and the gate alike, spread over
/// the pool rather than the next nodes by name; a node joining or leaving changes it only when
/// it is (or displaces) one of them.
pub fn baseline_sample<'a>(candidates: impl IntoIterator<Item = &'a str>) -> BTreeSet<&'a str> {
    let mut hashed: Vec<(u64, &str)> = candidates.into_iter().map(|n| (fnv1a(n), n)).collect();
    if hashed.len() > BASELINE_SAMPLE {
        hashed.select_nth_unstable(BASELINE_SAMPLE - 1);
        hashed.truncate(BASELINE_SAMPLE);
    }
    hashed.into_iter().map(|(_, n)| n).collect()
}

/// The 64-bit FNV-1a hash of `text`: fixed across builds and platforms, unlike std's hasher.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Every node's instruction. `sampling` is the health request of the wave being judged (from
/// [`health_request`]); it goes to the wave's nodes and to the baseline sample (of the nodes in
/// no wave of this round, whatever they run: [`baseline_sample`]).
pub fn plan_nodes(
    decision: &Decision,
    sampling: Option<&HealthRequest>,
) -> BTreeMap<String, NodePlan> {
    let progress = &decision.progress;
    let wave_of: BTreeMap<&str, usize> = progress
        .waves
        .iter()
        .enumerate()
        .flat_map(|(i, w)| w.nodes.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let in_flight = progress.waves.len().checked_sub(1);
    let settled = matches!(progress.state, State::Complete | State::RolledBack(_));
    let baseline = baseline_sample(
        decision
            .targets
            .keys()
            .map(String::as_str)
            .filter(|n| !wave_of.contains_key(n)),
    );
    decision
        .targets
        .iter()
        .map(|(node, target)| {
            let wave = wave_of.get(node.as_str()).copied();
            // A node in no wave keeps `stable`: the nodes not changed yet are the baseline, and
            // labelling them so would cost a write to every one of them per rollout.
            let phase = match wave {
                _ if settled => RolloutPhase::Stable,
                Some(0) => RolloutPhase::Canary,
                Some(_) => RolloutPhase::Wave,
                None => RolloutPhase::Stable,
            };
            let sampled = !settled
                && match wave {
                    None => baseline.contains(node.as_str()),
                    Some(_) => wave == in_flight,
                };
            let plan = NodePlan {
                target: target.clone(),
                phase,
                health_request: sampling.filter(|_| sampled).cloned(),
            };
            (node.clone(), plan)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::planner::Wave;

    fn decision(state: State, applied: Option<u64>) -> Decision {
        let mut progress = Progress::start("r2", Some("r1"));
        progress.state = state;
        progress.waves = vec![
            Wave {
                applied_at: Some(5),
                ..Wave::of(vec!["a".into()])
            },
            Wave {
                applied_at: applied,
                ..Wave::of(vec!["b".into()])
            },
        ];
        let targets = [("a", "r2"), ("b", "r2"), ("c", "r1")]
            .into_iter()
            .map(|(n, r)| (n.to_string(), Holding::Own(r.to_string())))
            .collect();
        Decision {
            targets,
            progress,
            requeue_after: None,
        }
    }

    #[test]
    fn phases_and_sampling_follow_the_wave_in_flight() {
        let d = decision(State::Progressing, Some(9));
        let request = health_request(&d.progress, Duration::from_secs(20)).unwrap();
        assert_eq!(request.id, "r2-wave1");
        assert_eq!(request.window, "20000ms");
        let plans = plan_nodes(&d, Some(&request));
        let phase = |n: &str| plans[n].phase;
        assert_eq!(
            [phase("a"), phase("b"), phase("c")],
            [
                RolloutPhase::Canary,
                RolloutPhase::Wave,
                RolloutPhase::Stable
            ]
        );
        // The wave being judged and the baseline sample; the canary, judged before, does not.
        let sampled: Vec<&str> = plans
            .iter()
            .filter(|(_, p)| p.health_request.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(sampled, ["b", "c"]);
        assert_eq!(plans["c"].target, Holding::Own("r1".into()));
    }

    #[test]
    fn the_baseline_sample_is_bounded_steady_and_spread() {
        let names: Vec<String> = (0..5_000).map(|i| format!("node-{i:05}")).collect();
        let all = baseline_sample(names.iter().map(String::as_str));
        assert_eq!(all.len(), BASELINE_SAMPLE);
        // The same candidates in another order: the same sample.
        let again = baseline_sample(names.iter().rev().map(String::as_str));
        assert_eq!(all, again);
        // Spread over the pool, not the first nodes by name.
        let first_tenth = all.iter().filter(|n| **n < "node-00500").count();
        assert!(first_tenth < BASELINE_SAMPLE / 2, "{all:?}");
        // A node leaving that is not in the sample changes nothing.
        let outside = names.iter().find(|n| !all.contains(n.as_str())).unwrap();
        let without = baseline_sample(names.iter().map(String::as_str).filter(|n| n != outside));
        assert_eq!(without, all);
        // Fewer candidates than the sample: all of them.
        assert_eq!(baseline_sample(["a", "b"]).len(), 2);
    }

    #[test]
    fn only_the_baseline_sample_of_a_large_pool_is_asked_to_sample() {
        let mut d = decision(State::Progressing, Some(9));
        for i in 0..200 {
            d.targets
                .insert(format!("z{i:03}"), Holding::Own("r1".into()));
        }
        let request = health_request(&d.progress, Duration::from_secs(20)).unwrap();
        let plans = plan_nodes(&d, Some(&request));
        let sampled: Vec<&str> = plans
            .iter()
            .filter(|(_, p)| p.health_request.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        // The wave being judged, and BASELINE_SAMPLE of the 201 baseline nodes.
        assert!(sampled.contains(&"b"));
        assert!(!sampled.contains(&"a"));
        assert_eq!(sampled.len(), 1 + BASELINE_SAMPLE);
        let candidates: Vec<&str> = plans
            .keys()
            .map(String::as_str)
            .filter(|n| !["a", "b"].contains(n))
            .collect();
        let sample = baseline_sample(candidates);
        assert!(sampled
            .iter()
            .filter(|n| **n != "b")
            .all(|n| sample.contains(n)));
    }

    #[test]
    fn the_request_goes_out_with_the_wave_and_nothing_is_sampled_after_the_end() {
        // Not applied yet: the wave's nodes are asked with their revision, in one write.
        let d = decision(State::Progressing, None);
        let request = health_request(&d.progress, Duration::from_secs(1)).unwrap();
        let plans = plan_nodes(&d, Some(&request));
        assert_eq!(plans["b"].health_request.as_ref(), Some(&request));
        assert_eq!(plans["b"].target, Holding::Own("r2".into()));
        for state in [State::Complete, State::RolledBack("x".into())] {
            let d = decision(state, Some(9));
            assert_eq!(health_request(&d.progress, Duration::from_secs(1)), None);
            let r = HealthRequest::default();
            let plans = plan_nodes(&d, Some(&r));
            assert!(plans
                .values()
                .all(|p| p.phase == RolloutPhase::Stable && p.health_request.is_none()));
        }
        let d = decision(State::Paused("inconclusive".into()), Some(9));
        assert!(health_request(&d.progress, Duration::from_secs(1)).is_some());
    }
}
