//! hoststack's cluster operator.
//!
//! For every NetworkTuning it selects the matching Nodes, resolves overlaps (one tuning governs a
//! node), computes the revision, writes each governed node's NodeTuning.spec with server-side
//! apply, withdraws the spec from nodes that stop matching, aggregates the agents' reports into
//! the tuning's status, and on deletion waits for every node to revert. It also owns the agent
//! DaemonSet and labels the nodes that need an agent.

pub mod config;
pub mod controller;
pub mod daemonset;
pub mod leader;
pub mod metrics;
pub mod rollout;
pub mod selection;
pub mod status;

/// Everything that can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer helper failed to add or remove the finalizer, or our handler failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// A deleted tuning still has nodes that have not confirmed their revert.
    #[error("waiting for nodes to revert: {}", .0.join(", "))]
    WaitingForRevert(Vec<String>),
    /// The leader-election task panicked or was cancelled.
    #[error("leader election task: {0}")]
    LeaseTask(String),
    /// The metrics endpoint could not be served.
    #[error("metrics endpoint: {0}")]
    Metrics(#[source] std::io::Error),
    /// The caches of nodes and node tunings never became ready.
    #[error("caches not ready: {0}")]
    CacheNotReady(String),
}

/// The operator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
