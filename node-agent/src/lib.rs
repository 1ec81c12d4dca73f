//! hoststack-agent: the per-node daemon that applies its node's `NodeTuning` to the host.
//!
//! The agent watches only its own NodeTuning. For each revision it runs one journaled,
//! all-or-nothing transaction over the host settings (hugepages, hugetlbfs mounts, sysctls, NIC
//! channels/offloads/rings/MTU, IRQ affinity, RPS/XPS, its nftables table, XDP programs, DPDK
//! binding), verifies every write by reading it back, and reports
//! per-item results, conditions and host facts in the NodeTuning's status. Withdrawing the spec
//! restores every original value from the journal.
//!
//! # Layers, leaves first
//!
//! A module may import the layers before its own in this list, never one after it, so the pure
//! core never reaches into the shells around it (`python3 /work/shared/tools/modcycles.py
//! node-agent/src --notests --nofamily` prints nothing):
//!
//! 1. Utilities, which import nothing of the agent: [`clock`] (the wall and the monotonic
//!    clock), [`duration`], [`cpus`] (CPU lists and
//!    masks), [`sysfs`] (names in procfs and sysfs trees), [`paths`] (the default bpffs root
//!    and runner), [`netlink`] (one synchronous netlink request).
//! 2. The model, [`model`]: [`model::Kind`], [`model::Setting`], [`model::Reading`],
//!    [`model::Wants`] and the value comparisons every layer below speaks.
//! 3. The host ports, [`host`]: [`host::Host`] and the narrow interfaces through which the
//!    appliers touch the host (files, mounts, ethtool, rtnetlink, bpf, nftables), each with its
//!    implementation on the running kernel.
//! 4. The appliers, [`appliers`] — one module per knob with its plan step (spec →
//!    [`model::Wants`]) and its [`appliers::Applier`], and [`appliers::applier`], the one table
//!    from a kind to its applier — and the host facts, [`facts`].
//! 5. The pure expansion, plan and journal: [`journal`], the crash-safe record of originals and
//!    in-flight transactions; [`expand`], discovery and the pure (config, discovery) → goal;
//!    [`transaction`], the pure [`transaction::plan`] and the [`transaction::Transactor`] that
//!    carries a plan out; [`drift`], settings that changed behind the agent's back.
//! 6. The reconciler, [`reconciler`]: for one [`intent::Intent`] (what the NodeTuning asks
//!    for), whether to plan, apply, revert or re-report, and [`confirmation`], the pure
//!    decisions of the dead-man window in which an applied revision stays provisional until
//!    its probes confirm it, [`targets`], its probe targets parsed, and [`destinations`], where
//!    the installer lets probes connect, with [`hooks`], the lab build's
//!    observers of its transactions, and [`failures`], the memory of
//!    failed revisions per spec generation; [`report`] turns outcomes into a `NodeTuningStatus`, [`preview`] answers
//!    `kubectl hoststack plan`.
//! 7. The dataplane supervisor, [`dataplane`]: the user-space stack's runner process.
//! 8. The agent's other shells: [`exporter`] serves `/metrics`, [`health`] measures TCP health
//!    samples over the windows the operator asks for, [`heartbeat`] renews the Lease that tells
//!    the operator this agent is alive, [`probe`] runs the post-apply probes on the node's own
//!    network path.
//! 9. The watch loop, [`controller`], with its flags, [`config`], and [`latest`], its copy of
//!    the NodeTuning, which never goes back in time: connects it all to the API server.

#![deny(missing_docs)]

use std::path::PathBuf;

pub mod appliers;
pub mod clock;
pub mod config;
pub mod confirmation;
pub mod controller;
pub mod cpus;
pub mod dataplane;
pub mod destinations;
pub mod drift;
pub mod duration;
pub mod expand;
pub mod exporter;
pub mod facts;
pub mod failures;
pub mod health;
pub mod heartbeat;
pub mod hooks;
pub mod host;
pub mod intent;
pub mod journal;
pub mod latest;
pub mod model;
pub mod netlink;
pub mod paths;
pub mod preview;
pub mod probe;
pub mod reconciler;
pub mod report;
pub mod sysfs;
pub mod targets;
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
    /// The revision's `probes` cannot be carried out (the API server's schema refuses most
    /// such specs first).
    #[error("{0}")]
    InvalidProbes(String),
}

/// The agent's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
