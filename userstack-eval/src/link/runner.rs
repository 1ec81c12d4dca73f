//! userstack as either end of the link: the runner `hoststack-userstack` started in the end's
//! namespace with AF_XDP on its veth (copy mode) on its own core, serving discard on the
//! row's ports or sending in bulk with its `clients`, and its counters read from its stats
//! file.

use super::topology::PREFIX;
use hoststack_runner_api::{
    Backend, ClientConfig, ClientKind, IdlePolicy, RunState, RunnerConfig, RunnerStats,
    ServiceConfig, ServiceKind, TcpOptions,
};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the runner may take to attach and serve.
const START: Duration = Duration::from_secs(60);
/// How long it may take to drain and exit after SIGTERM.
const STOP: Duration = Duration::from_secs(10);

/// What the runner is to do on the link.
#[derive(Clone, Debug)]
pub enum Role {
    /// Serve discard on each port.
    Receive(Vec<u16>),
    /// Open one bulk connection to each endpoint.
    Send(Vec<SocketAddrV4>),
}

/// The runner's configuration for `role` on `interface` with `address`, idling as `idle`.
pub fn config(
    interface: &str,
    address: Ipv4Addr,
    gateway: Ipv4Addr,
    core: u32,
    sack: bool,
    role: &Role,
    idle: IdlePolicy,
) -> RunnerConfig {
    let (services, clients) = match role {
        Role::Receive(ports) => (
            ports
                .iter()
                .map(|&port| ServiceConfig {
                    kind: ServiceKind::Discard,
                    port,
                    body: None,
                })
                .collect(),
            Vec::new(),
        ),
        Role::Send(targets) => (
            Vec::new(),
            targets
                .iter()
                .map(|to| ClientConfig {
                    kind: ClientKind::Bulk,
                    remote: to.to_string(),
                    connections: 1,
                })
                .collect(),
        ),
    };
    RunnerConfig {
        interface: interface.into(),
        backend: Backend::AfXdp,
        cores: vec![core],
        address: format!("{address}/{PREFIX}"),
        gateway: Some(gateway.to_string()),
        tcp: TcpOptions {
            sack: Some(sack),
            ..TcpOptions::default()
        },
        services,
        drain_timeout_ms: 1000,
        dpdk: None,
        rss: None,
        clients,
        idle,
    }
}

/// A running runner; dropping it stops it (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct Runner {
    child: Child,
    stats: PathBuf,
}

impl Runner {
    /// Starts `binary` in namespace `ns` with `config` (files in `dir`) and waits until it
    /// reports running.
    pub fn start(
        binary: &Path,
        ns: &str,
        config: &RunnerConfig,
        dir: &Path,
    ) -> Result<Runner, String> {
        let config_file = dir.join(format!("runner-{ns}-config.json"));
        let stats = dir.join(format!("runner-{ns}-stats.json"));
        let _ = std::fs::remove_file(&stats);
        let text = serde_json::to_string_pretty(config).map_err(|e| e.to_string())?;
        std::fs::write(&config_file, text)
            .map_err(|e| format!("writing {}: {e}", config_file.display()))?;
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(binary)
            .arg("run")
            .arg("--config")
            .arg(&config_file)
            .arg("--stats")
            .arg(&stats)
            .args(["--stats-interval-ms", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", binary.display()))?;
        let mut runner = Runner { child, stats };
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = runner.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut pipe) = runner.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                return Err(format!("the runner exited ({status}): {}", stderr.trim()));
            }
            if runner.stats().is_ok_and(|s| s.state == RunState::Running) {
                return Ok(runner);
            }
            if started.elapsed() > START {
                return Err(format!(
                    "the runner did not report running within {START:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The runner's stats document as last written (every 100 ms).
    pub fn stats(&self) -> Result<RunnerStats, String> {
        let text = std::fs::read_to_string(&self.stats)
            .map_err(|e| format!("reading {}: {e}", self.stats.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", self.stats.display()))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + STOP;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_serves_discard_and_a_sender_opens_one_bulk_connection_per_target() {
        let gw = Ipv4Addr::new(198, 19, 201, 1);
        let receive = config(
            "r0",
            Ipv4Addr::new(198, 19, 201, 3),
            gw,
            1,
            false,
            &Role::Receive(vec![5001, 5002]),
            IdlePolicy::Park,
        );
        assert_eq!(receive.services.len(), 2);
        assert!(receive.clients.is_empty());
        assert_eq!(receive.tcp.sack, Some(false));
        assert_eq!(receive.address, "198.19.201.3/24");
        let to = SocketAddrV4::new(Ipv4Addr::new(198, 19, 201, 2), 5001);
        let send = config(
            "s0",
            Ipv4Addr::new(198, 19, 200, 3),
            gw,
            1,
            true,
            &Role::Send(vec![to, to]),
            IdlePolicy::Park,
        );
        assert!(send.services.is_empty());
        assert_eq!(send.clients.len(), 2);
        assert_eq!(send.clients[0].remote, "198.19.201.2:5001");
    }
}
