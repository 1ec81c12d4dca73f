//! The names the operator, the agents, the plugin and the lab share: the API group, field
//! managers, the finalizer, labels, annotations, the operator's namespace and the agents'
//! metrics port. Each is spelled here once, so that two sides cannot drift apart; a test that
//! asserts on the literal does so on purpose.

/// The API group.
pub const GROUP: &str = "hoststack.dev";

/// The namespace the operator, its Lease, the agent DaemonSet, the agents' heartbeat Leases and
/// the revision history live in unless `--namespace` (or `POD_NAMESPACE`) says otherwise.
pub const DEFAULT_NAMESPACE: &str = "hoststack-system";

/// The port of each agent's /metrics endpoint (its default `--metrics-bind-address`), on the
/// host's network.
pub const AGENT_METRICS_PORT: u16 = 9478;

/// The Lease that elects the one active operator replica (the operator's default
/// `--lease-name`, in its namespace).
pub const OPERATOR_LEASE: &str = "hoststack-operator";

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

/// Label of a revision-history ControllerRevision naming its tuning (`<tuning>`).
pub const HISTORY_TUNING_LABEL: &str = "hoststack.dev/tuning";

/// Label of a revision-history ControllerRevision carrying its revision hash.
pub const HISTORY_REVISION_LABEL: &str = "hoststack.dev/revision";

/// Label of a revision-history ControllerRevision that is another tuning's revision
/// (`<tuning>`), kept because nodes taken over from that tuning may return to it.
pub const HISTORY_FROM_LABEL: &str = "hoststack.dev/from-tuning";

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
