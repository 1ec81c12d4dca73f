//! hoststack's API: group `hoststack.dev`, version `v1alpha1`.
//!
//! - [`NetworkTuning`] (cluster-scoped): what the user writes.
//! - [`NodeTuning`] (cluster-scoped, one per node): the operator's instruction to one node's
//!   agent, and the agent's report.
//!
//! `crdgen` writes the CRD YAML generated from these types; a test fails when the committed
//! YAML differs.

pub mod manifests;
pub mod network_tuning;
pub mod node_config;
pub mod node_tuning;

pub use network_tuning::*;
pub use node_config::*;
pub use node_tuning::*;

/// The API group.
pub const GROUP: &str = "hoststack.dev";

/// Field manager of the operator's server-side applies.
pub const OPERATOR_FIELD_MANAGER: &str = "hoststack-operator";

/// Field manager of the agents' status writes.
pub const AGENT_FIELD_MANAGER: &str = "hoststack-agent";

/// Finalizer the operator puts on every NetworkTuning, so that deleting one reverts its nodes.
pub const FINALIZER: &str = "hoststack.dev/revert";

/// Label the operator sets on nodes that need an agent; the agent DaemonSet selects it.
pub const AGENT_NODE_LABEL: &str = "hoststack.dev/agent";

/// Label that prefers a node for the canary wave of every rollout (`"true"`).
pub const CANARY_LABEL: &str = "hoststack.dev/canary";

/// Prefix of the Lease each agent renews in the operator's namespace (`hoststack-agent-<node>`),
/// so that the operator never rolls a revision onto a node whose agent has gone silent.
pub const AGENT_LEASE_PREFIX: &str = "hoststack-agent-";

/// The name of `node`'s agent heartbeat Lease.
pub fn agent_lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

/// Annotation on a NetworkTuning that promotes a wave by hand. Its value is the wave's id
/// ([`wave_id`]: revision and index), so that an annotation left from an earlier wave or
/// revision never promotes another one.
pub const PROMOTE_ANNOTATION: &str = "hoststack.dev/promote";

/// Annotation on a NetworkTuning that aborts a rollout: its value is the revision whose rollout
/// rolls back at once, so that a stale annotation never aborts the next revision.
pub const ABORT_ANNOTATION: &str = "hoststack.dev/abort";

/// The id of wave `index` (0 is the canary) of `revision`: `<revision>-wave<index>`. It names
/// the wave's health request and is the value of [`PROMOTE_ANNOTATION`] that promotes it.
pub fn wave_id(revision: &str, index: usize) -> String {
    format!("{revision}-wave{index}")
}
