//! What each governed node is told: its revision (from the planner), its part in the rollout
//! (the `phase` label of its metrics), and whether its agent should sample its health. Pure.

use std::collections::BTreeMap;
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

/// The health request of the wave in flight, when it is applied and judged by health samples:
/// its id names the revision and the wave, so samples of an earlier wave never count.
pub fn health_request(progress: &Progress, window: Duration) -> Option<HealthRequest> {
    let judging = matches!(progress.state, State::Progressing | State::Paused(_));
    let wave = progress.waves.last()?;
    (judging && wave.applied_at.is_some()).then(|| HealthRequest {
        id: wave_id(
            &progress.revision,
            progress.wave_index(progress.waves.len() - 1),
        ),
        window: format!("{}ms", window.as_millis()),
    })
}

/// Every node's instruction. `sampling` is the health request of the wave being judged (from
/// [`health_request`]); it goes to the wave's nodes and to the baseline (every node in no wave
/// of this round, whatever it runs).
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
    decision
        .targets
        .iter()
        .map(|(node, target)| {
            let wave = wave_of.get(node.as_str()).copied();
            let phase = match wave {
                _ if settled => RolloutPhase::Stable,
                Some(0) => RolloutPhase::Canary,
                Some(_) => RolloutPhase::Wave,
                None => RolloutPhase::Baseline,
            };
            let sampled = !settled && (wave.is_none() || wave == in_flight);
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
                RolloutPhase::Baseline
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
    fn nothing_is_sampled_before_the_wave_applied_or_after_the_end() {
        let d = decision(State::Progressing, None);
        assert_eq!(health_request(&d.progress, Duration::from_secs(1)), None);
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
