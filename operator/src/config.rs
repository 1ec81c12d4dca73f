//! The operator's command-line flags.

use std::time::Duration;

use clap::Parser;

/// hoststack-operator: reconciles NetworkTunings into per-node NodeTunings.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Args {
    /// Namespace of the operator's Lease and of the agent DaemonSet.
    #[arg(long, env = "POD_NAMESPACE", default_value = hoststack_crds::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The operator's own Deployment, made the agent DaemonSet's owner so that deleting the
    /// Deployment (`helm uninstall`) garbage-collects the agents too. Unset: no owner.
    #[arg(long)]
    pub owner_deployment: Option<String>,
    /// What the installer chose for the agent DaemonSet's pods.
    #[command(flatten)]
    pub agent: crate::daemonset::AgentPod,
    /// The Prometheus endpoints the installer lets the rollout gate ask.
    #[command(flatten)]
    pub prometheus: crate::rollout::prometheus_endpoints::PrometheusEndpoints,
    /// How long a deleted tuning waits for its nodes to confirm their revert before it is let go
    /// with a Degraded condition naming them.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub revert_timeout: Duration,
    /// Name of the Lease that elects the one active replica.
    #[arg(long, default_value = hoststack_crds::OPERATOR_LEASE)]
    pub lease_name: String,
    /// Address of the /metrics endpoint (port 0 picks a free port, logged at start).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: std::net::SocketAddr,
    /// This replica's identity in leader election (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}
