//! What the operator writes to its nodes' objects, as values: the NodeTuning spec that puts a
//! node on a revision or withdraws it, and which nodes' agent label is to change. Pure; the
//! effects send them.

use hoststack_crds::{Mode, NodeConfig, NodeTuningSpec, AGENT_NODE_LABEL};

use super::snapshot::Snapshot;
use crate::daemonset::needs_agent;
use crate::rollout::nodes::NodePlan;

/// The NodeTuning spec by which `governor` puts a node on `revision` (with its `config`) of
/// `tuning` (the governor itself, or the tuning it took the node over from); without a
/// revision, the node carries the tuning's name and phase but nothing to apply.
pub fn node_spec(
    governor: &str,
    tuning: &str,
    revision: Option<(&str, &NodeConfig)>,
    plan: &NodePlan,
) -> NodeTuningSpec {
    NodeTuningSpec {
        tuning: Some(tuning.to_string()),
        governed_by: Some(governor.to_string()),
        revision: revision.map(|(r, _)| r.to_string()),
        config: revision.map(|(_, c)| c.clone()),
        mode: Some(Mode::Apply),
        rollout_phase: Some(plan.phase),
        health_request: plan.health_request.clone(),
        preview: None,
    }
}

/// The spec of a node no tuning governs: no tuning, revision or config, which asks its agent to
/// revert. `mode` stays, so that the operator keeps owning a field of `spec` and server-side
/// apply does not drop the whole (required) object.
pub fn withdrawn_spec() -> NodeTuningSpec {
    NodeTuningSpec {
        mode: Some(Mode::Apply),
        ..Default::default()
    }
}

/// A change of one node's agent label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentLabel {
    /// The node.
    pub node: String,
    /// Whether the node gets the label (`true`) or loses it.
    pub wanted: bool,
}

/// The nodes whose agent label does not match whether they need an agent.
pub fn agent_labels(snap: &Snapshot) -> Vec<AgentLabel> {
    snap.nodes
        .iter()
        .filter_map(|node| {
            let nt = snap.node_tunings.get(&node.name);
            let wanted = needs_agent(
                snap.assignment.governor.contains_key(&node.name),
                nt.and_then(|nt| nt.spec.tuning.as_deref()),
                nt.and_then(|nt| nt.status.as_ref())
                    .and_then(|s| s.applied_revision.as_deref()),
            );
            let has = node.labels.get(AGENT_NODE_LABEL).map(String::as_str) == Some("true");
            (wanted != has).then(|| AgentLabel {
                node: node.name.clone(),
                wanted,
            })
        })
        .collect()
}
