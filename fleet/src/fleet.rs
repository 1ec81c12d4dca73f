//! The fleet: N agents as tasks of one process, and the traffic their hosts see.
//!
//! Every `tick` each host sends [`SEGMENTS_PER_TICK`] more segments, [`BASE_RETRANSMIT_RATIO`]
//! of them again; the nodes named in the file `<root>/regressed` (one per line, read every
//! tick) retransmit [`REGRESSED_RETRANSMIT_RATIO`] instead, which is how a scale run makes a
//! canary regress.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hoststack_agent::controller::NodeAgent;
use hoststack_agent::Config;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clients::Clients;
use crate::host::FleetHost;

/// Segments each host sends per tick.
pub const SEGMENTS_PER_TICK: u64 = 10_000;
/// The share of segments a healthy host retransmits.
pub const BASE_RETRANSMIT_RATIO: f64 = 0.001;
/// The share a regressed host retransmits.
pub const REGRESSED_RETRANSMIT_RATIO: f64 = 0.05;

/// What one fleet runs.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Where the host trees are (`<root>/<node>/...`) and the `regressed` file.
    pub root: PathBuf,
    /// The nodes' names.
    pub nodes: Vec<String>,
    /// How many agents share one HTTP/2 connection.
    pub agents_per_connection: usize,
    /// Each agent's `--resync-interval`.
    pub resync_interval: Duration,
    /// Each agent's `--heartbeat-interval`.
    pub heartbeat_interval: Duration,
    /// The agents' heartbeat namespace.
    pub namespace: String,
    /// How often the hosts' counters move.
    pub tick: Duration,
    /// Agents started per second: a pool's nodes come up over time, and thousands of agents
    /// listing, watching and creating their Leases in the same second time out on the API
    /// server and retry, again all at once.
    pub start_rate: u32,
}

impl FleetConfig {
    /// The agent flags of `node` on `host`.
    fn agent(&self, node: &str, host: &FleetHost) -> Config {
        Config {
            node_name: node.to_string(),
            proc_root: host.proc_root(),
            sys_root: host.sys_root(),
            state_dir: host.state_dir(),
            resync_interval: self.resync_interval,
            step_delay: Duration::ZERO,
            write_log: None,
            metrics_bind_address: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            bpffs_root: host.bpffs_root(),
            namespace: self.namespace.clone(),
            heartbeat_interval: self.heartbeat_interval,
            userstack_binary: None,
            probe_allowed_destinations: Default::default(),
        }
    }
}

/// Errors of a fleet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A host tree could not be made or written.
    #[error("host {node}: {source}")]
    Host {
        /// The node.
        node: String,
        /// Why.
        source: std::io::Error,
    },
    /// A client could not be built.
    #[error("client: {0}")]
    Client(#[from] kube::Error),
    /// An agent stopped with an error.
    #[error("agent {node}: {message}")]
    Agent {
        /// The node.
        node: String,
        /// Its error.
        message: String,
    },
}

/// Runs the fleet until `shutdown` turns true: makes every host, starts every agent (each
/// first recovers from its journal, as a restarted agent does), moves the counters every tick,
/// then stops the agents between reconciles and waits for them.
pub async fn run(
    config: FleetConfig,
    kube_config: kube::Config,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let mut hosts = Vec::with_capacity(config.nodes.len());
    for node in &config.nodes {
        let host = FleetHost::create(&config.root, node).map_err(|source| Error::Host {
            node: node.clone(),
            source,
        })?;
        hosts.push((node.clone(), host));
    }
    let mut clients = Clients::new(kube_config.clone(), config.agents_per_connection);
    let mut agents = JoinSet::new();
    let mut pace = tokio::time::interval(Duration::from_secs(1) / config.start_rate.max(1));
    for (node, host) in &hosts {
        pace.tick().await;
        let mut agent = NodeAgent::new(config.agent(node, host));
        let client = clients.next_agent()?;
        let kube_config = kube_config.clone();
        let mut stop = shutdown.clone();
        let node = node.clone();
        agents.spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            let result = match agent.recover() {
                Ok(()) => agent.run(client, Some(kube_config), stopped).await,
                Err(e) => Err(e),
            };
            result.map_err(|e| Error::Agent {
                node,
                message: e.to_string(),
            })
        });
    }
    tracing::warn!(
        agents = hosts.len(),
        connections = clients.connections(),
        "the fleet runs"
    );
    let mut tick = tokio::time::interval(config.tick);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            _ = tick.tick() => {
                let regressed = regressed(&config.root);
                for (node, host) in &mut hosts {
                    let ratio = if regressed.contains(node.as_str()) {
                        REGRESSED_RETRANSMIT_RATIO
                    } else {
                        BASE_RETRANSMIT_RATIO
                    };
                    host.advance(SEGMENTS_PER_TICK, ratio).map_err(|source| Error::Host {
                        node: node.clone(),
                        source,
                    })?;
                }
            }
            Some(ended) = agents.join_next() => {
                if let Ok(Err(e)) = ended {
                    return Err(e);
                }
            }
        }
    }
    while let Some(ended) = agents.join_next().await {
        if let Ok(Err(e)) = ended {
            tracing::error!(error = %e, "an agent failed");
        }
    }
    Ok(())
}

/// The nodes named in `<root>/regressed` (none when it does not exist).
pub fn regressed(root: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(root.join("regressed"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}
