//! The decision for a deleted tuning: each of its nodes goes to the tuning that governs it now
//! or has its spec withdrawn, and the finalizer waits, bounded by the revert timeout, until
//! every node confirmed its revert; then the agent labels follow and the revision history goes.
//! Pure, like [`super::apply`].

use std::time::Duration;

use hoststack_crds::{NetworkTuning, NodeState};
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::decision::{Announcement, Decision, Gauges, Next, SpecWrite, Why};
use super::snapshot::Snapshot;
use super::writes::{agent_labels, heir_spec, withdrawn_spec};
use crate::status::{condition, set_condition};

/// What deleting `tuning` does next, when its nodes get `revert_timeout` to confirm.
pub fn decide(tuning: &NetworkTuning, snap: &Snapshot, revert_timeout: Duration) -> Decision {
    let name = tuning.name_any();
    let specs: Vec<SpecWrite> = snap
        .node_tunings
        .iter()
        .filter(|(_, nt)| nt.spec.tuning.as_deref() == Some(name.as_str()))
        .map(|(node, _)| {
            // A node another tuning now governs goes to that tuning at once.
            let heir = snap
                .assignment
                .governor
                .get(node)
                .and_then(|g| snap.tunings.iter().find(|t| t.name_any() == *g));
            SpecWrite {
                node: node.clone(),
                spec: heir.map(|t| heir_spec(t)).unwrap_or_else(withdrawn_spec),
                why: Why::Deleted,
            }
        })
        .collect();

    let pending: Vec<String> = snap
        .node_tunings
        .iter()
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
