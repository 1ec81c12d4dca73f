//! A tuning's status, aggregated from its nodes' reports: a pure function of what was observed.

use std::collections::BTreeMap;
use std::sync::Arc;

use hoststack_crds::{NetworkTuningStatus, NodeConflict, NodeState, NodeTuning, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::selection::TuningNodes;

/// What the status is computed from.
pub struct Observed<'a> {
    /// The tuning's generation.
    pub generation: Option<i64>,
    /// The revision of the tuning's current spec.
    pub revision: &'a str,
    /// Matched nodes, split by who governs them.
    pub nodes: &'a TuningNodes,
    /// NodeTuning of each node, by node name.
    pub node_tunings: &'a BTreeMap<String, Arc<NodeTuning>>,
    /// The status before this reconcile.
    pub previous: Option<&'a NetworkTuningStatus>,
    /// Now, for condition transition times.
    pub now: Time,
}

/// Whether a node's agent reports `revision` applied and confirmed (a provisional revision,
/// which the agent may still revert by itself, is not applied yet).
pub fn node_applied(nt: Option<&NodeTuning>, revision: &str) -> bool {
    nt.and_then(|nt| nt.status.as_ref()).is_some_and(|s| {
        s.state == Some(NodeState::Applied)
            && s.applied_revision.as_deref() == Some(revision)
            && s.confirmation.is_none()
    })
}

/// The failure message of a node whose agent failed `revision`, if it did.
pub fn node_failure(nt: Option<&NodeTuning>, revision: &str) -> Option<String> {
    let s = nt?.status.as_ref()?;
    (s.state == Some(NodeState::Failed) && s.observed_revision.as_deref() == Some(revision)).then(
        || {
            s.message
                .clone()
                .unwrap_or_else(|| "failed without a message".into())
        },
    )
}

/// Builds a condition, keeping the previous transition time when its status did not change.
pub fn condition(
    previous: Option<&NetworkTuningStatus>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.into(),
        status,
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Replaces or adds a condition of the same type.
pub fn set_condition(conditions: &mut Vec<Condition>, condition: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(c) => *c = condition,
        None => conditions.push(condition),
    }
}

/// The tuning's status from its nodes' reports.
pub fn aggregate(o: &Observed) -> NetworkTuningStatus {
    let governed = &o.nodes.governed;
    let rev = o.revision;
    let applied: Vec<&String> = governed
        .iter()
        .filter(|n| node_applied(o.node_tunings.get(*n).map(AsRef::as_ref), rev))
        .collect();
    let failed: Vec<(&String, String)> = governed
        .iter()
        .filter_map(|n| node_failure(o.node_tunings.get(n).map(AsRef::as_ref), rev).map(|m| (n, m)))
        .collect();
    let waiting: Vec<&String> = governed
        .iter()
        .filter(|n| !applied.contains(n) && !failed.iter().any(|(f, _)| f == n))
        .collect();
    let matched = governed.len() + o.nodes.conflicts.len();

    let phase = if governed.is_empty() {
        Phase::Pending
    } else if !failed.is_empty() {
        Phase::Failed
    } else if waiting.is_empty() {
        Phase::Complete
    } else {
        Phase::Progressing
    };

    let prev = o.previous;
    let cond =
        |t: &str, s: bool, r: &str, m: String| condition(prev, t, s, r, m, o.generation, &o.now);
    let names = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    let ready = match phase {
        Phase::Complete => cond(
            "Ready",
            true,
            "AllApplied",
            format!(
                "{} of {} governed nodes applied revision {rev}",
                applied.len(),
                governed.len()
            ),
        ),
        Phase::Pending if matched == 0 => cond(
            "Ready",
            false,
            "NoNodesMatched",
            "the node selector matches no node".into(),
        ),
        Phase::Pending => cond(
            "Ready",
            false,
            "Superseded",
            "every matched node is governed by another tuning".into(),
        ),
        Phase::Failed => cond(
            "Ready",
            false,
            "ApplyFailed",
            format!(
                "{} of {} governed nodes failed revision {rev}",
                failed.len(),
                governed.len()
            ),
        ),
        _ => cond(
            "Ready",
            false,
            "Progressing",
            format!(
                "{} of {} governed nodes applied revision {rev}",
                applied.len(),
                governed.len()
            ),
        ),
    };
    let progressing = if waiting.is_empty() {
        cond(
            "Progressing",
            false,
            "NoNodeWaiting",
            "no node is waiting for its agent".into(),
        )
    } else {
        cond(
            "Progressing",
            true,
            "WaitingForAgents",
            format!(
                "waiting for the agents of {} to apply revision {rev}",
                names(&waiting)
            ),
        )
    };
    let degraded = if failed.is_empty() {
        cond("Degraded", false, "NoFailures", "no node failed".into())
    } else {
        let msgs: Vec<String> = failed.iter().map(|(n, m)| format!("{n}: {m}")).collect();
        cond("Degraded", true, "ApplyFailed", msgs.join("; "))
    };
    let conflict = if o.nodes.conflicts.is_empty() {
        cond(
            "Conflict",
            false,
            "NoConflict",
            "this tuning governs every node it matches".into(),
        )
    } else {
        let mut by_winner: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (node, winner) in &o.nodes.conflicts {
            by_winner.entry(winner).or_default().push(node);
        }
        let parts: Vec<String> = by_winner
            .iter()
            .map(|(w, ns)| format!("{} governed by {w}", ns.join(", ")))
            .collect();
        cond(
            "Conflict",
            true,
            "GovernedByAnotherTuning",
            format!(
                "matched nodes {} (higher priority, or equal priority and older)",
                parts.join("; ")
            ),
        )
    };

    NetworkTuningStatus {
        observed_generation: o.generation,
        current_revision: Some(rev.to_string()),
        stable_revision: if phase == Phase::Complete {
            Some(rev.to_string())
        } else {
            prev.and_then(|p| p.stable_revision.clone())
        },
        phase: Some(phase),
        conditions: vec![ready, progressing, degraded, conflict],
        matched_nodes: matched as i32,
        updated_nodes: governed.len() as i32,
        applied_nodes: applied.len() as i32,
        failed_nodes: failed.len() as i32,
        progress: Some(format!("{}/{}", applied.len(), governed.len())),
        superseded_by: {
            let mut by: Vec<&str> = o.nodes.conflicts.iter().map(|(_, t)| t.as_str()).collect();
            by.sort();
            by.dedup();
            (!by.is_empty()).then(|| by.join(", "))
        },
        conflicts: o
            .nodes
            .conflicts
            .iter()
            .map(|(node, by)| NodeConflict {
                node: node.clone(),
                governed_by: by.clone(),
            })
            .collect(),
        waves: prev.map(|p| p.waves.clone()).unwrap_or_default(),
        message: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NodeTuningSpec, NodeTuningStatus};
    use k8s_openapi::jiff::Timestamp;

    fn nt(
        state: NodeState,
        applied: Option<&str>,
        observed: &str,
        msg: Option<&str>,
    ) -> NodeTuning {
        let mut nt = NodeTuning::new("n", NodeTuningSpec::default());
        nt.status = Some(NodeTuningStatus {
            state: Some(state),
            applied_revision: applied.map(Into::into),
            observed_revision: Some(observed.into()),
            message: msg.map(Into::into),
            ..Default::default()
        });
        nt
    }

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn cond<'a>(s: &'a NetworkTuningStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn phases_from_node_reports() {
        let nodes = TuningNodes {
            governed: vec!["a".into(), "b".into()],
            conflicts: vec![("c".into(), "other".into())],
        };
        // (reports by node, expected phase, expected progress)
        type Case = (Vec<(&'static str, NodeTuning)>, Phase, &'static str);
        let table: Vec<Case> = vec![
            (vec![], Phase::Progressing, "0/2"),
            (
                vec![("a", nt(NodeState::Applied, Some("r1"), "r1", None))],
                Phase::Progressing,
                "1/2",
            ),
            (
                vec![
                    ("a", nt(NodeState::Applied, Some("r1"), "r1", None)),
                    ("b", nt(NodeState::Applied, Some("r1"), "r1", None)),
                ],
                Phase::Complete,
                "2/2",
            ),
            (
                // An old revision applied does not count.
                vec![
                    ("a", nt(NodeState::Applied, Some("r0"), "r0", None)),
                    ("b", nt(NodeState::Applied, Some("r1"), "r1", None)),
                ],
                Phase::Progressing,
                "1/2",
            ),
            (
                vec![
                    (
                        "a",
                        nt(
                            NodeState::Failed,
                            None,
                            "r1",
                            Some("net.ipv4.x: no such sysctl"),
                        ),
                    ),
                    ("b", nt(NodeState::Applied, Some("r1"), "r1", None)),
                ],
                Phase::Failed,
                "1/2",
            ),
        ];
        for (reports, phase, progress) in table {
            let node_tunings: BTreeMap<String, Arc<NodeTuning>> = reports
                .into_iter()
                .map(|(n, t)| (n.to_string(), Arc::new(t)))
                .collect();
            let s = aggregate(&Observed {
                generation: Some(3),
                revision: "r1",
                nodes: &nodes,
                node_tunings: &node_tunings,
                previous: None,
                now: now(10),
            });
            assert_eq!(s.phase, Some(phase), "{progress}");
            assert_eq!(s.progress.as_deref(), Some(progress));
            assert_eq!(s.matched_nodes, 3);
            assert_eq!(s.superseded_by.as_deref(), Some("other"));
            assert_eq!(cond(&s, "Conflict").status, "True");
            assert!(cond(&s, "Conflict").message.contains("c governed by other"));
            assert_eq!(
                cond(&s, "Degraded").status == "True",
                phase == Phase::Failed
            );
            if phase == Phase::Failed {
                assert!(cond(&s, "Degraded")
                    .message
                    .contains("a: net.ipv4.x: no such sysctl"));
            }
            assert_eq!(s.stable_revision.is_some(), phase == Phase::Complete);
        }
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let nodes = TuningNodes {
            governed: vec!["a".into()],
            conflicts: vec![],
        };
        let empty = BTreeMap::new();
        let first = aggregate(&Observed {
            generation: Some(1),
            revision: "r",
            nodes: &nodes,
            node_tunings: &empty,
            previous: None,
            now: now(10),
        });
        let second = aggregate(&Observed {
            generation: Some(1),
            revision: "r",
            nodes: &nodes,
            node_tunings: &empty,
            previous: Some(&first),
            now: now(20),
        });
        assert_eq!(first, second);
        let applied: BTreeMap<String, Arc<NodeTuning>> = [(
            "a".to_string(),
            Arc::new(nt(NodeState::Applied, Some("r"), "r", None)),
        )]
        .into();
        let third = aggregate(&Observed {
            generation: Some(1),
            revision: "r",
            nodes: &nodes,
            node_tunings: &applied,
            previous: Some(&second),
            now: now(30),
        });
        assert_eq!(cond(&third, "Ready").last_transition_time, now(30));
        assert_eq!(cond(&third, "Conflict").last_transition_time, now(10));
        assert_eq!(third.stable_revision.as_deref(), Some("r"));
    }
}
