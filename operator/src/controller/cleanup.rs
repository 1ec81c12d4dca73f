//! The decision for a deleted tuning: each of its nodes that no tuning governs now has its spec
//! withdrawn, and the finalizer waits, bounded by the revert timeout, until every such node
//! confirmed its revert; then the agent labels follow and the revision history goes. A node
//! another tuning governs now keeps what it runs: that tuning's reconcile hands it over as a
//! staged rollout, canary first (its history keeps a copy of the revision the node runs, for a
//! rollback). A node that left the cluster is not waited for. Pure, like [`super::apply`].

use std::time::Duration;

use hoststack_crds::{NetworkTuning, NodeState};
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::apply::unselected;
use super::decision::{Announcement, Decision, Gauges, Next, SpecWrite, Why};
use super::snapshot::Snapshot;
use super::writes::{agent_labels, withdrawn_spec};
use crate::status::{condition, set_condition};

/// What deleting `tuning` does next, when its nodes get `revert_timeout` to confirm.
pub fn decide(tuning: &NetworkTuning, snap: &Snapshot, revert_timeout: Duration) -> Decision {
    let name = tuning.name_any();
    let specs: Vec<SpecWrite> = unselected(snap, &name)
        .into_iter()
        .filter(|(node, _)| {
            // Already withdrawn: nothing to write.
            snap.node_tunings
                .get(node)
                .is_some_and(|nt| nt.spec.without_preview() != withdrawn_spec())
        })
        .map(|(node, node_uid)| SpecWrite {
            node,
            node_uid,
            spec: withdrawn_spec(),
            why: Why::Deleted,
        })
        .collect();

    // A node that left the cluster (its Node object deleted) has no agent to confirm a revert.
    let pending: Vec<String> = snap
        .node_tunings
        .iter()
        .filter(|(node, _)| snap.node_uids.contains_key(*node))
        .filter(|(node, _)| !snap.assignment.governor.contains_key(*node))
        .filter(|(_, nt)| {
            let spec_ours = nt.spec.tuning.as_deref() == Some(name.as_str());
            let status = nt.status.as_ref();
            let applied_ours = status
                .and_then(|s| s.applied_tuning.as_deref())
                .is_some_and(|t| t == name);
            // An agent in the middle of a transaction may be applying this tuning's revision.
            let applying = status.is_some_and(|s| s.state == Some(NodeState::Applying));
            spec_ours || applied_ours || applying
        })
        .map(|(node, _)| node.clone())
        .collect();
    if pending.is_empty() {
        return Decision {
            status: None,
            gauges: Gauges::Keep,
            specs,
            unknown_revisions: Vec::new(),
            agent_labels: agent_labels(snap),
            forget_history: true,
            events: vec![Announcement::reconcile(
                EventType::Normal,
                "Reverted",
                "every node reverted".into(),
            )],
            next: Next::AwaitChange,
        };
    }

    let since = tuning
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| snap.now.0.duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let mut status = tuning.status.clone().unwrap_or_default();
    let nodes = pending.join(", ");
    let cond = |type_: &str, reason: &str, message: String| {
        condition(
            tuning.status.as_ref(),
            type_,
            true,
            reason,
            message,
            tuning.metadata.generation,
            &snap.now,
        )
    };
    if since >= revert_timeout {
        let message = format!(
            "deleted, but {nodes} did not confirm their revert within {}s; the tuning is let go and those hosts may still carry its settings",
            revert_timeout.as_secs()
        );
        set_condition(
            &mut status.conditions,
            cond("Degraded", "RevertTimeout", message.clone()),
        );
        return Decision {
            gauges: Gauges::Forget,
            specs,
            events: vec![Announcement::reconcile(
                EventType::Warning,
                "RevertTimeout",
                message,
            )],
            ..Decision::report(status)
        };
    }
    set_condition(
        &mut status.conditions,
        cond(
            "Progressing",
            "Reverting",
            format!("deleted; waiting for {nodes} to revert"),
        ),
    );
    Decision {
        specs,
        next: Next::WaitForRevert(pending),
        ..Decision::report(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{deleted, node, node_tuning, spec_on, tuning, World};
    use crate::controller::writes::AgentLabel;
    use hoststack_crds::{Mode, NodeTuningSpec, RolloutPhase};
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    const TIMEOUT: Duration = Duration::from_secs(120);

    fn snapshot(world: World, now: Timestamp) -> Snapshot {
        world.snapshot_at(now)
    }

    fn condition<'a>(d: &'a Decision, type_: &str) -> (&'a str, &'a str) {
        let c = d
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
            .unwrap_or_else(|| panic!("no {type_} condition: {d:?}"));
        (c.reason.as_str(), c.message.as_str())
    }

    #[test]
    fn a_deleted_tuning_waits_for_its_nodes_then_lets_go() {
        let deleted_at = Timestamp::from_second(10_000).unwrap();
        let edge = deleted(tuning("edge", "edge", "1"), deleted_at);
        let r = edge.spec.config.revision();
        let applied = node_tuning(
            "a",
            spec_on("edge", Some((&r, "1")), RolloutPhase::Stable),
            Some((NodeState::Applied, "edge", &r)),
        );
        let withdrawn = NodeTuningSpec {
            mode: Some(Mode::Apply),
            ..NodeTuningSpec::default()
        };
        let world = |nt| World {
            tunings: vec![edge.clone()],
            nodes: vec![node("a", "edge", true, false)],
            node_tunings: vec![nt],
            ..World::default()
        };
        let at = |secs| deleted_at + SignedDuration::from_secs(secs);

        // Still applied: withdrawn, and the finalizer waits.
        let d = decide(&edge, &snapshot(world(applied.clone()), at(5)), TIMEOUT);
        assert_eq!(d.specs.len(), 1);
        assert_eq!(
            (d.specs[0].node.as_str(), &d.specs[0].spec, d.specs[0].why),
            ("a", &withdrawn, Why::Deleted)
        );
        assert_eq!(d.next, Next::WaitForRevert(vec!["a".into()]));
        assert_eq!(
            condition(&d, "Progressing"),
            ("Reverting", "deleted; waiting for a to revert")
        );
        assert!(d.events.is_empty() && !d.forget_history && d.agent_labels.is_empty());

        // Past the timeout: let go, Degraded, the gauges go.
        let d = decide(&edge, &snapshot(world(applied), at(120)), TIMEOUT);
        assert_eq!(d.next, Next::AwaitChange);
        assert_eq!(d.gauges, Gauges::Forget);
        assert_eq!(
            d.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["RevertTimeout"]
        );
        let (reason, message) = condition(&d, "Degraded");
        assert_eq!(reason, "RevertTimeout");
        assert!(
            message.starts_with("deleted, but a did not confirm their revert within 120s"),
            "{message}"
        );

        // Reverted: the agent label and the history go.
        let reverted = node_tuning("a", withdrawn, Some((NodeState::Reverted, "", &r)));
        let d = decide(&edge, &snapshot(world(reverted), at(5)), TIMEOUT);
        assert!(d.specs.is_empty() && d.status.is_none());
        assert_eq!(
            d.agent_labels,
            [AgentLabel {
                node: "a".into(),
                wanted: false
            }]
        );
        assert!(d.forget_history);
        assert_eq!(
            d.events
                .iter()
                .map(|e| (e.reason, e.note.as_str()))
                .collect::<Vec<_>>(),
            [("Reverted", "every node reverted")]
        );
        assert_eq!(d.next, Next::AwaitChange);

        // An agent in the middle of a transaction may still be applying it.
        let applying = node_tuning(
            "a",
            NodeTuningSpec::default(),
            Some((NodeState::Applying, "", &r)),
        );
        let d = decide(&edge, &snapshot(world(applying.clone()), at(5)), TIMEOUT);
        assert_eq!(d.next, Next::WaitForRevert(vec!["a".into()]));

        // A node that left the cluster (its NodeTuning stays: nothing deletes it in a cluster
        // without garbage collection) has no agent to wait for.
        let left = World {
            nodes: Vec::new(),
            ..world(applying)
        };
        let d = decide(&edge, &snapshot(left, at(5)), TIMEOUT);
        assert_eq!(d.next, Next::AwaitChange);
        assert!(d.forget_history);
    }

    #[test]
    fn a_node_another_tuning_governs_keeps_what_it_runs_for_that_tunings_rollout() {
        let edge = deleted(
            tuning("edge", "edge", "1"),
            Timestamp::from_second(10_000).unwrap(),
        );
        let r = edge.spec.config.revision();
        let heir = tuning("heir", "edge", "0");
        let on_edge = |n: &str| {
            node_tuning(
                n,
                spec_on("edge", Some((&r, "1")), RolloutPhase::Stable),
                Some((NodeState::Applied, "edge", &r)),
            )
        };
        let world = World {
            tunings: vec![edge.clone(), heir],
            // a is in the heir's pool; b in no tuning's any more.
            nodes: vec![
                node("a", "edge", true, false),
                node("b", "core", true, false),
            ],
            node_tunings: vec![on_edge("a"), on_edge("b")],
            ..World::default()
        };
        let d = decide(
            &edge,
            &snapshot(world, Timestamp::from_second(10_001).unwrap()),
            TIMEOUT,
        );
        // Nothing written to a, and only b is waited for.
        let written: Vec<&str> = d.specs.iter().map(|w| w.node.as_str()).collect();
        assert_eq!(written, ["b"]);
        assert_eq!(d.next, Next::WaitForRevert(vec!["b".into()]));
    }
}
