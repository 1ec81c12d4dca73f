//! The agent's command-line flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::destinations::Destinations;
#[cfg(feature = "test-hooks")]
use crate::duration::parse_duration;
use crate::duration::parse_nonzero_duration;

/// hoststack-agent: applies this node's NodeTuning to the host and reports back.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(name = "hoststack-agent", version, about)]
pub struct Config {
    /// Name of this node; the agent watches the NodeTuning of that name.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Where procfs is mounted; sysctls are the files under its sys/ directory.
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where sysfs is mounted; host facts are read from it.
    #[arg(long, default_value = "/sys")]
    pub sys_root: PathBuf,
    /// Directory of the journal (journal.json); must survive agent restarts.
    #[arg(long, default_value = "/var/lib/hoststack")]
    pub state_dir: PathBuf,
    /// How often to reconcile without an event (e.g. 30s, 1m, 500ms). Every reconcile re-reads
    /// the host, so this is also how often drift is checked.
    #[arg(long, default_value = "30s", value_parser = parse_nonzero_duration)]
    pub resync_interval: Duration,
    /// Pause after each host write (e.g. 200ms), so that a test can interrupt a transaction.
    /// A test hook: only a build with the `test-hooks` feature (the lab's) has the flag; in any
    /// other build it is zero.
    #[cfg_attr(
        feature = "test-hooks",
        arg(long, default_value = "0ms", value_parser = parse_duration)
    )]
    #[cfg_attr(not(feature = "test-hooks"), arg(skip))]
    pub step_delay: Duration,
    /// Append every host write and journal save to this file, one JSON line each
    /// (hoststack_agent::hooks), for the lab's fault harness. A test hook like `--step-delay`.
    #[cfg_attr(feature = "test-hooks", arg(long))]
    #[cfg_attr(not(feature = "test-hooks"), arg(skip))]
    pub write_log: Option<PathBuf>,
    /// Address of the /metrics endpoint (port 0 picks a free port, logged at start).
    #[arg(long, default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], hoststack_crds::AGENT_METRICS_PORT)))]
    pub metrics_bind_address: std::net::SocketAddr,
    /// bpffs directory under which the agent pins its XDP programs, links and maps, one
    /// directory per interface; pins outlive the agent, so a restart finds them. The agent
    /// mounts a bpffs at /sys/fs/bpf when the root lies under it and none is mounted there.
    #[arg(long, default_value = crate::paths::DEFAULT_BPFFS_ROOT)]
    pub bpffs_root: PathBuf,
    /// Namespace of the agent's heartbeat Lease (the operator's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = hoststack_crds::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// How often the agent renews its heartbeat Lease (only while its watch loop goes round);
    /// it stays valid for three intervals.
    #[arg(long, default_value = "10s", value_parser = parse_nonzero_duration)]
    pub heartbeat_interval: Duration,
    /// Where the probes of a tuning's targets may connect: comma-separated CIDR prefixes (a
    /// bare address is one host). Loopback, link-local and 0.0.0.0/8 are refused unless a
    /// listed prefix lies inside them; a target outside the list fails the revision before
    /// anything changes (an address) or its probe before anything connects (a name, judged at
    /// every address it resolves to).
    #[arg(long, default_value = crate::destinations::DEFAULT_DESTINATIONS)]
    pub probe_allowed_destinations: Destinations,
    /// The user-space stack's runner, started for `userspaceStack`; by default
    /// `hoststack-userstack` next to the agent's own executable.
    #[arg(long)]
    pub userstack_binary: Option<PathBuf>,
}

impl Config {
    /// The test hooks these flags ask for (none, in a build without the `test-hooks` feature).
    pub fn hooks(&self) -> crate::hooks::Hooks {
        crate::hooks::Hooks {
            step_delay: self.step_delay,
            write_log: self.write_log.clone(),
        }
    }

    /// The runner binary: `--userstack-binary`, else the one next to this executable.
    pub fn userstack_binary(&self) -> PathBuf {
        self.userstack_binary
            .clone()
            .unwrap_or_else(crate::paths::runner_next_to_agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_as_the_lab_passes_them() {
        let c = Config::try_parse_from([
            "hoststack-agent",
            "--node-name",
            "node-a",
            "--proc-root",
            "/host/proc",
            "--sys-root",
            "/host/sys",
            "--state-dir",
            "/tmp/s",
            "--resync-interval",
            "5s",
            "--bpffs-root",
            "/tmp/bpffs/node-a",
        ])
        .expect("flags parse");
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.proc_root, PathBuf::from("/host/proc"));
        assert_eq!(c.resync_interval, Duration::from_secs(5));
        assert_eq!(c.bpffs_root, PathBuf::from("/tmp/bpffs/node-a"));
        assert_eq!(c.step_delay, Duration::ZERO);
        assert_eq!(c.write_log, None);
        assert_eq!(c.probe_allowed_destinations, Destinations::default());
    }

    #[test]
    fn the_probes_allowed_destinations_are_a_list_of_prefixes() {
        let parse = |list: &str| {
            Config::try_parse_from([
                "hoststack-agent",
                "--node-name=n",
                &format!("--probe-allowed-destinations={list}"),
            ])
        };
        let c = parse("198.18.0.0/15,fd00::/8").expect("flags parse");
        assert_eq!(
            c.probe_allowed_destinations.to_string(),
            "198.18.0.0/15,fd00::/8"
        );
        let e = parse("198.18.0.1/15").unwrap_err().to_string();
        assert!(
            e.contains("--probe-allowed-destinations") && e.contains("has host bits set"),
            "{e}"
        );
    }

    /// Any other build refuses the flag: tests/test_hooks.rs, on the binary.
    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_test_hooks_build_takes_a_step_delay_and_a_write_log() {
        let c = Config::try_parse_from([
            "hoststack-agent",
            "--node-name",
            "n",
            "--step-delay",
            "300ms",
            "--write-log",
            "/tmp/writes.jsonl",
        ])
        .expect("flags parse");
        assert_eq!(c.step_delay, Duration::from_millis(300));
        assert_eq!(c.write_log, Some(PathBuf::from("/tmp/writes.jsonl")));
    }
}
