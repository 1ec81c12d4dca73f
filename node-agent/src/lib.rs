//! hoststack-agent: the per-node daemon that applies its node's `NodeTuning` to the host.
//!
//! The agent watches only its own NodeTuning. For each desired state it runs one journaled,
//! all-or-nothing transaction over the host settings (hugepages, hugetlbfs mounts, sysctls, NIC
//! channels/offloads/rings/MTU, IRQ affinity, RPS/XPS, its nftables table, XDP programs, DPDK
//! binding), verifies every write by reading it back, and reports
//! per-item results, conditions and host facts in the NodeTuning's status. Withdrawing the spec
//! restores every original value from the journal.
//!
//! The layout follows "pure core, thin I/O shell":
//! - [`expand::expand`] turns a node config and what discovery found on the host into settings;
//!   [`transaction::plan`] decides what to write from (desired, journal, current values) and
//!   touches nothing; [`transaction::Transactor`] carries a plan out against the host.
//! - [`reconciler::Reconciler`] decides, for one desired state, whether to plan, apply, revert or
//!   re-report, and remembers failed revisions; [`drift`] finds applied settings that changed
//!   behind the agent's back; [`health`] measures TCP health samples over the windows the
//!   operator asks for; [`heartbeat`] renews the Lease that tells the operator this agent is
//!   alive; [`controller`] connects it all to the API server.
//! - [`journal`] is the crash-safe record of originals and in-flight transactions,
//!   [`appliers`] reads and writes host settings, [`facts`] describes the host, and [`report`]
//!   turns outcomes into a `NodeTuningStatus`; [`exporter`] serves `/metrics`.
//! - [`preview`] answers `kubectl hoststack plan`: another config in Plan mode, changing nothing.

#![deny(missing_docs)]

use std::path::PathBuf;

pub mod appliers;
pub mod config;
pub mod controller;
pub mod cpus;
pub mod dataplane;
pub mod drift;
pub mod duration;
pub mod expand;
pub mod exporter;
pub mod facts;
pub mod health;
pub mod heartbeat;
pub mod host;
pub mod journal;
pub mod model;
pub mod netlink;
pub mod paths;
pub mod preview;
pub mod reconciler;
pub mod report;
pub mod sysfs;
pub mod transaction;

pub use config::Config;
pub use controller::run;

/// Everything that can go wrong in the agent outside a single item's failure (an item's failure
/// is reported in status, not returned as an error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The journal could not be read, written or synced.
    #[error("journal {path}: {source}")]
    JournalIo {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The journal exists but does not parse; the agent refuses to guess at the host's history.
    #[error("journal {path} is not a valid journal: {reason}")]
    JournalCorrupt {
        /// The journal file.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// A sysctl key that would not map to a file under `<proc-root>/sys`.
    #[error("sysctl key {0:?} is not a plain dotted name")]
    UnsafeKey(String),
    /// Restoring values after a failure or an interrupted transaction failed; the in-flight
    /// transaction stays in the journal and is retried.
    #[error("restoring {target} to {value:?} failed: {reason}")]
    Restore {
        /// The setting that could not be restored.
        target: String,
        /// The value it should have got back.
        value: String,
        /// What the host said.
        reason: String,
    },
    /// A call to the Kubernetes API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The status could not be serialized.
    #[error("serializing status: {0}")]
    Serialize(#[from] serde_json::Error),
    /// A call to the API server took too long.
    #[error("{0}: timed out")]
    Timeout(&'static str),
    /// The /metrics endpoint could not be served.
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        /// The address it should listen on.
        addr: std::net::SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// A signal handler could not be installed.
    #[error("installing signal handler: {0}")]
    Signal(std::io::Error),
}

/// The agent's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
