//! hoststack's local lab: a real etcd and kube-apiserver, Node objects backed by network
//! namespaces, the operator in the root namespace and one agent per node inside its namespace.
//!
//! The end-to-end tests in `e2e/tests/` drive it through [`Lab`]; the `hoststack-lab` binary
//! runs it interactively. See `docs/lab.md` for the layout, addresses and the API.
//!
//! ```no_run
//! use hoststack_e2e::{Lab, LabConfig};
//! use std::time::Duration;
//!
//! let lab = Lab::start(LabConfig::default()).unwrap();
//! lab.apply_yaml("apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\n...").unwrap();
//! lab.wait_for("node-a to get SACK off", Duration::from_secs(30), || {
//!     (lab.sysctl("node-a", "net.ipv4.tcp_sack") == "0").then_some(())
//! });
//! // Dropping the lab (also on panic) stops every process and removes every namespace.
//! ```

pub mod clients;
mod command;
mod config;
pub mod dashboards;
pub mod evaluation;
pub mod faults;
mod lab;
mod process;
pub mod prometheus;
pub mod scale;
pub mod traffic;
pub mod vm;

pub use config::{LabConfig, NodeKind, NodeSpec, VM_BOOT_TIMEOUT};
pub use lab::kubelet::LAB_IMAGE;
pub use lab::sweep::{sweep, SweepReport};
pub use lab::{
    config_revision, control_plane_dir, Identity, Lab, AGENT_METRICS_PORT, NAMESPACE,
    PROMETHEUS_SECRET,
};
pub use process::Signal;

use std::time::Duration;

/// Everything that can go wrong while starting, driving or tearing down a lab.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An external command (ip, openssl, kubectl, helm, ...) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// The lab cannot start: a binary is missing, no subnet is free, a process died, ...
    #[error("{0}")]
    Setup(String),
    /// Something the lab waits for did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
    },
    /// A VM guest did not get something done within its budget of progress, or stopped
    /// answering (see `vm::progress`).
    #[error("{what}: {why}")]
    Guest {
        /// What the guest was asked.
        what: String,
        /// How the wait ended.
        why: vm::Exhausted,
    },
    /// Building a Kubernetes client from the lab's kubeconfig failed.
    #[error("kube client: {0}")]
    Kube(String),
    /// Teardown completed, but some steps failed.
    #[error("teardown incomplete: {}", .0.join("; "))]
    Teardown(Vec<String>),
}

/// Result with the lab's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
