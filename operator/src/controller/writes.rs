//! What the operator writes to its nodes' objects, as values: the NodeTuning spec that puts a
//! node on a revision, hands it to an heir or withdraws it, and which nodes' agent label is to
//! change. Pure; the effects send them.

use hoststack_crds::{
    Mode, NetworkTuning, NodeConfig, NodeTuningSpec, RolloutPhase, AGENT_NODE_LABEL,
};
use kube::ResourceExt;

use super::snapshot::Snapshot;
use crate::daemonset::needs_agent;
use crate::rollout::nodes::NodePlan;

/// The NodeTuning spec that puts a node on `revision` (with its `config`) of `tuning`; without a
/// revision, the node carries the tuning's name and phase but nothing to apply.
pub fn node_spec(
    tuning: &str,
    revision: Option<(&str, &NodeConfig)>,
    plan: &NodePlan,
) -> NodeTuningSpec {
    NodeTuningSpec {
        tuning: Some(tuning.to_string()),
        revision: revision.map(|(r, _)| r.to_string()),
        config: revision.map(|(_, c)| c.clone()),
        mode: Some(Mode::Apply),
        rollout_phase: Some(plan.phase),
        health_request: plan.health_request.clone(),
        preview: None,
    }
}

/// The spec a node gets at once when its tuning is deleted and `heir` governs it now: the heir's
/// stable revision when it has one, its current one otherwise.
pub fn heir_spec(heir: &NetworkTuning) -> NodeTuningSpec {
    let stable = heir
        .status
        .as_ref()
        .and_then(|s| s.stable_revision.as_deref());
    let current = heir.spec.config.revision();
    let plan = NodePlan {
        revision: None,
        phase: RolloutPhase::Stable,
        health_request: None,
    };
    if stable.is_none_or(|s| s == current) {
        return node_spec(&heir.name_any(), Some((&current, &heir.spec.config)), &plan);
    }
    // The heir's stable config is on its nodes; until its own reconcile runs, the node waits
    // with nothing to apply.
    node_spec(&heir.name_any(), None, &plan)
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
