//! The stats file the runner keeps for the agent's supervisor, a [`RunnerStats`] (crate
//! hoststack-runner-api): one JSON document, replaced atomically (written to a temporary file
//! beside it, then renamed over it).

use hoststack_runner_api::RunnerStats;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;
use userstack::counters::Counters;

/// Counters grouped as the kernel's files group them (`Tcp`, `TcpExt`, `Ip`, `Icmp`). The
/// contract's values are signed (the kernel's `MaxConn` is -1); a counter past `i64::MAX`
/// reads as `i64::MAX`.
pub fn netstat(counters: &Counters) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut sections: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (section, field, value) in counters.fields() {
        sections
            .entry(section.to_string())
            .or_default()
            .insert(field.to_string(), i64::try_from(value).unwrap_or(i64::MAX));
    }
    sections
}

/// Writes `stats` to `path` atomically.
pub fn write(path: &Path, stats: &RunnerStats) -> io::Result<()> {
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
    use hoststack_runner_api::{
        Backend, ChecksumOffloadStats, RunState, ServiceKind, ServiceStats, ShardStats,
        SteeringSource, SteeringStats, StopStats,
    };
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
        let stats = RunnerStats {
            pid: 7,
            state: RunState::Running,
            backend: Some(Backend::AfXdp),
            mode: "copy".into(),
            shards: vec![ShardStats {
                core: 1,
                queue: 0,
                rx_packets: 5,
                tx_packets: 4,
                connections: 1,
                busy_nanos: 3,
                run_nanos: 9,
                drops: None,
                rx_wait: None,
            }],
            services: vec![ServiceStats {
                kind: ServiceKind::Http,
                port: 80,
            }],
            steering: Some(SteeringStats {
                source: SteeringSource::Nic,
                key: "6d5a56da".into(),
                indirection_size: 128,
            }),
            checksum_offload: Some(ChecksumOffloadStats { rx: true, tx: true }),
            rx_stamps: None,
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
            value["checksumOffload"],
            serde_json::json!({ "rx": true, "tx": true })
        );
        assert_eq!(
            value["steering"],
            serde_json::json!({ "source": "nic", "key": "6d5a56da", "indirectionSize": 128 })
        );
    }
}
