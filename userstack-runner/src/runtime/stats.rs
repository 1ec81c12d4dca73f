//! The stats file the runner keeps for the agent's supervisor: one JSON document, replaced
//! atomically (written to a temporary file beside it, then renamed over it).

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use userstack::counters::Counters;

/// The runner's lifecycle.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RunState {
    /// Setting up devices and shards.
    Starting,
    /// Every shard is up and serving.
    Running,
    /// Stopping: no new connections, open ones finishing.
    Draining,
    /// Stopped; the last document.
    Stopped,
}

/// One shard's figures.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShardStats {
    /// The core it is pinned to.
    pub core: usize,
    /// The device queue it serves.
    pub queue: u32,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Open connections.
    pub connections: u64,
}

/// A service being served.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct ServiceStats {
    /// `Echo`, `Discard` or `Http`.
    pub kind: super::ServiceKind,
    /// Its port.
    pub port: u16,
}

/// How a graceful stop went.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopStats {
    /// Connections closed in both directions before the deadline.
    pub drained: u64,
    /// Connections reset at the deadline.
    pub reset: u64,
}

/// What the shards steer by (see [`super::steering::Steering`]).
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SteeringStats {
    /// `nic` or `configured`.
    pub source: &'static str,
    /// The Toeplitz key in hex.
    pub key: String,
    /// Entries in the indirection table.
    pub indirection_size: usize,
}

/// The whole document.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// The runner's process id.
    pub pid: u32,
    /// Where it is in its life.
    pub state: RunState,
    /// `afXdp`, `tap` or `dpdk`.
    pub backend: &'static str,
    /// `copy`, `zeroCopy`, `tap` or `dpdk`.
    pub mode: &'static str,
    /// Per shard.
    pub shards: Vec<ShardStats>,
    /// What is served.
    pub services: Vec<ServiceStats>,
    /// The RSS key and table flows are steered by.
    pub steering: SteeringStats,
    /// Counters of all shards, by /proc/net/{snmp,netstat} section and field name.
    pub netstat: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    /// Present once stopping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopStats>,
}

/// Counters grouped as the kernel's files group them (`Tcp`, `TcpExt`, `Ip`, `Icmp`).
pub fn netstat(counters: &Counters) -> BTreeMap<&'static str, BTreeMap<&'static str, u64>> {
    let mut sections: BTreeMap<_, BTreeMap<_, _>> = BTreeMap::new();
    for (section, field, value) in counters.fields() {
        sections.entry(section).or_default().insert(field, value);
    }
    sections
}

/// Writes `stats` to `path` atomically.
pub fn write(path: &Path, stats: &Stats) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = std::fs::File::create(&tmp)?;
    serde_json::to_writer_pretty(&mut file, stats)?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use userstack::counters::Counter;

    #[test]
    fn netstat_groups_by_section_with_the_kernel_names() {
        let mut counters = Counters::default();
        counters.add(Counter::RetransSegs, 3);
        counters.add(Counter::TCPSackRecovery, 2);
        let sections = netstat(&counters);
        assert_eq!(sections["Tcp"]["RetransSegs"], 3);
        assert_eq!(sections["TcpExt"]["TCPSackRecovery"], 2);
        assert_eq!(sections["TcpExt"]["TCPDSACKUndo"], 0);
    }

    #[test]
    fn writes_atomically_and_in_the_contract_shape() {
        let dir = std::env::temp_dir().join(format!("userstack-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.json");
        let stats = Stats {
            pid: 7,
            state: RunState::Running,
            backend: "afXdp",
            mode: "copy",
            shards: vec![ShardStats {
                core: 1,
                queue: 0,
                rx_packets: 5,
                tx_packets: 4,
                connections: 1,
            }],
            services: vec![ServiceStats {
                kind: super::super::ServiceKind::Http,
                port: 80,
            }],
            steering: SteeringStats {
                source: "nic",
                key: "6d5a56da".into(),
                indirection_size: 128,
            },
            netstat: netstat(&Counters::default()),
            stop: Some(StopStats {
                drained: 1,
                reset: 2,
            }),
        };
        write(&path, &stats).unwrap();
        let value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(value["state"], "running");
        assert_eq!(value["shards"][0]["rxPackets"], 5);
        assert_eq!(value["services"][0]["kind"], "Http");
        assert_eq!(value["netstat"]["Tcp"]["OutSegs"], 0);
        assert_eq!(value["stop"]["reset"], 2);
        assert_eq!(
            value["steering"],
            serde_json::json!({ "source": "nic", "key": "6d5a56da", "indirectionSize": 128 })
        );
    }
}
