//! The hoststack-fleet binary: N real agents in one process (see the crate's docs).
//!
//! `hoststack-fleet --root DIR --prefix fleet- --first 0 --count 100` runs the agents of nodes
//! fleet-00000..fleet-00099 with the kubeconfig of `KUBECONFIG`, until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use hoststack_agent::duration::parse_nonzero_duration;
use hoststack_fleet::fleet::{self, FleetConfig};
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;

/// Runs many hoststack agents in one process, each on a host tree of its own.
#[derive(Parser, Debug)]
#[command(name = "hoststack-fleet", about)]
struct Flags {
    /// Where the host trees are.
    #[arg(long)]
    root: PathBuf,
    /// The nodes' name prefix; node i is `<prefix><i, five digits>`.
    #[arg(long, default_value = "fleet-")]
    prefix: String,
    /// The first node's number.
    #[arg(long, default_value_t = 0)]
    first: usize,
    /// How many nodes.
    #[arg(long)]
    count: usize,
    /// Agents per HTTP/2 connection.
    #[arg(long, default_value_t = 200)]
    agents_per_connection: usize,
    /// Each agent's resync interval.
    #[arg(long, default_value = "5m", value_parser = parse_nonzero_duration)]
    resync_interval: Duration,
    /// Each agent's heartbeat interval.
    #[arg(long, default_value = "10s", value_parser = parse_nonzero_duration)]
    heartbeat_interval: Duration,
    /// The agents' heartbeat namespace.
    #[arg(long, default_value = hoststack_crds::DEFAULT_NAMESPACE)]
    namespace: String,
    /// How often the hosts' TCP counters move.
    #[arg(long, default_value = "2s", value_parser = parse_nonzero_duration)]
    tick: Duration,
    /// Agents started per second.
    #[arg(long, default_value_t = 100)]
    start_rate: u32,
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .init();
    let nodes = (flags.first..flags.first + flags.count)
        .map(|i| format!("{}{i:05}", flags.prefix))
        .collect();
    let config = FleetConfig {
        root: flags.root,
        nodes,
        agents_per_connection: flags.agents_per_connection,
        resync_interval: flags.resync_interval,
        heartbeat_interval: flags.heartbeat_interval,
        namespace: flags.namespace,
        tick: flags.tick,
        start_rate: flags.start_rate,
    };
    let kube_config = match kube::Config::infer().await {
        Ok(c) => hoststack_crds::api_client::bounded(c),
        Err(e) => {
            tracing::error!(error = %e, "no kubeconfig");
            return ExitCode::FAILURE;
        }
    };
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        let _ = stop.send(true);
    });
    match fleet::run(config, kube_config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "the fleet failed");
            ExitCode::FAILURE
        }
    }
}
