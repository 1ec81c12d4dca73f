//! hoststack's API: group `hoststack.dev`, version `v1alpha1`.
//!
//! - [`NetworkTuning`] (cluster-scoped): what the user writes.
//! - [`NodeTuning`] (cluster-scoped, one per node): the operator's instruction to one node's
//!   agent, and the agent's report.
//! - [`api_client`]: the timeouts every part's API client and watches use.
//! - [`names`]: the labels, annotations, namespace and port both sides share.
//! - [`resource_version`]: which of two copies of one object is the newer, the same for both
//!   sides.
//!
//! `crdgen` writes the CRD YAML generated from these types; a test fails when the committed
//! YAML differs.

pub mod api_client;
pub mod manifests;
pub mod names;
pub mod network_tuning;
pub mod node_config;
pub mod node_tuning;
pub mod resource_version;

pub use names::*;
pub use network_tuning::*;
pub use node_config::*;
pub use node_tuning::*;
