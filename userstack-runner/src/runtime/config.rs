//! The runner's reading of its configuration: the agent's [`RunnerConfig`] (crate
//! hoststack-runner-api, the JSON of `hoststack-userstack run --config FILE`), parsed, checked
//! for what serde cannot check (every error names the field), and mapped onto what the engine
//! and the devices take: the engine's [`tcp::Config`], the [`Steering`] and, with the cargo
//! feature `dpdk`, the DPDK device's own `PortConfig`.

use super::steering::Steering;
use hoststack_runner_api::{Backend, CongestionControl, RunnerConfig, SteeringSource, TcpOptions};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;
use userstack::rss::{from_hex, RssTable, MICROSOFT_KEY};
use userstack::tcp::{self, CongestionAlgorithm};

/// The smallest key that hashes a TCP/IPv4 flow (12 bytes of input + 4).
const MIN_KEY_BYTES: usize = 16;

/// Parses and checks a configuration: every error names the field.
pub fn from_json(text: &str) -> Result<RunnerConfig, String> {
    let config: RunnerConfig = serde_json::from_str(text).map_err(|e| format!("config: {e}"))?;
    validate(&config)?;
    Ok(config)
}

/// Checks what serde cannot: names, addresses, cores, ports, the backend's settings.
pub fn validate(config: &RunnerConfig) -> Result<(), String> {
    if config.interface.is_empty() || config.interface.len() > 15 {
        return Err(format!(
            "interface {:?} is not a valid name",
            config.interface
        ));
    }
    parse_address(&config.address)?;
    gateway(config)?;
    if config.cores.is_empty() {
        return Err("cores: at least one core is needed".into());
    }
    let mut cores = config.cores.clone();
    cores.sort_unstable();
    if cores.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("cores {:?}: a core is listed twice", config.cores));
    }
    let mut ports = service_ports(config);
    ports.sort_unstable();
    if ports.windows(2).any(|w| w[0] == w[1]) {
        return Err("services: two services on one port".into());
    }
    if let Some(service) = config.services.iter().find(|s| s.port == 0) {
        return Err(format!("services: {:?} on port 0", service.kind));
    }
    client_connections(config)?;
    if config.backend == Backend::Dpdk && config.dpdk.is_none() {
        return Err("backend dpdk needs the dpdk settings".into());
    }
    steering(config)?;
    Ok(())
}

/// The most connections the clients may open (the ephemeral range has 28,232 ports).
const MAX_CLIENT_CONNECTIONS: u32 = 10_000;

/// The remote endpoint of every connection the clients open, one entry per connection.
pub fn client_connections(config: &RunnerConfig) -> Result<Vec<SocketAddrV4>, String> {
    let mut connections = Vec::new();
    for client in &config.clients {
        let remote: SocketAddrV4 = client.remote.parse().map_err(|_| {
            format!(
                "clients: remote {:?} is not an IPv4 address and port",
                client.remote
            )
        })?;
        if remote.port() == 0 {
            return Err(format!("clients: remote {remote} has port 0"));
        }
        connections.extend(std::iter::repeat_n(remote, client.connections as usize));
    }
    if connections.len() > MAX_CLIENT_CONNECTIONS as usize {
        return Err(format!(
            "clients: {} connections, at most {MAX_CLIENT_CONNECTIONS}",
            connections.len()
        ));
    }
    Ok(connections)
}

/// The address and prefix length of `text` (`a.b.c.d/n`).
pub fn parse_address(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let (ip, prefix) = text
        .split_once('/')
        .ok_or_else(|| format!("address {text:?} lacks a /prefix length"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("address {text:?}: {ip:?} is not an IPv4 address"))?;
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| (1..=32).contains(p))
        .ok_or_else(|| format!("address {text:?}: prefix length must be 1..=32"))?;
    Ok((ip, prefix))
}

/// The next hop off the subnet, when the config names one.
pub fn gateway(config: &RunnerConfig) -> Result<Option<Ipv4Addr>, String> {
    config
        .gateway
        .as_deref()
        .map(|text| {
            text.parse()
                .map_err(|_| format!("gateway {text:?} is not an IPv4 address"))
        })
        .transpose()
}

/// The engine configuration `config` with `options` applied (D-SACK follows SACK).
pub fn apply_tcp_options(options: &TcpOptions, mut config: tcp::Config) -> tcp::Config {
    if let Some(sack) = options.sack {
        config.sack = sack;
        config.dsack = sack;
    }
    if let Some(timestamps) = options.timestamps {
        config.timestamps = timestamps;
    }
    if let Some(scaling) = options.window_scaling {
        config.window_scaling = scaling;
    }
    if let Some(congestion) = options.congestion_control {
        config.congestion = match congestion {
            CongestionControl::Cubic => CongestionAlgorithm::Cubic,
            CongestionControl::NewReno => CongestionAlgorithm::NewReno,
        };
    }
    if let Some(ms) = options.delayed_ack_ms {
        config.delayed_ack = Duration::from_millis(u64::from(ms));
    }
    if let Some(ms) = options.min_rto_ms {
        config.rto_min = Duration::from_millis(u64::from(ms));
    }
    if let Some(nagle) = options.nagle {
        config.nagle = nagle;
    }
    config
}

/// What the shards steer by: the NIC's key and table from `rss`, or else
/// [`MICROSOFT_KEY`] spread round-robin over the shards' queues.
pub fn steering(config: &RunnerConfig) -> Result<Steering, String> {
    let Some(rss) = &config.rss else {
        return Ok(Steering {
            source: SteeringSource::Configured,
            table: RssTable::spread(&MICROSOFT_KEY, config.cores.len() as u32),
        });
    };
    let key = from_hex(&rss.key).map_err(|e| format!("rss.key: {e}"))?;
    if key.len() < MIN_KEY_BYTES {
        return Err(format!(
            "rss.key: {} bytes, a TCP/IPv4 hash needs at least {MIN_KEY_BYTES}",
            key.len()
        ));
    }
    if rss.indirection.is_empty() {
        return Err("rss.indirection: the table is empty".into());
    }
    Ok(Steering {
        source: SteeringSource::Nic,
        table: RssTable {
            key,
            indirection: rss.indirection.clone(),
        },
    })
}

/// The service ports.
pub fn service_ports(config: &RunnerConfig) -> Vec<u16> {
    config.services.iter().map(|s| s.port).collect()
}

/// The DPDK device's configuration: the shards' cores and the `dpdk` settings.
#[cfg(feature = "dpdk")]
pub fn dpdk_port(config: &RunnerConfig) -> Result<crate::device::dpdk::PortConfig, String> {
    let dpdk = config
        .dpdk
        .as_ref()
        .ok_or("backend dpdk needs the dpdk settings")?;
    Ok(crate::device::dpdk::PortConfig {
        cores: config.cores.iter().map(|&core| core as usize).collect(),
        pci_address: dpdk.pci_address.clone(),
        hugepage_dir: dpdk.hugepage_dir.clone(),
        mempool_mbufs: dpdk.mempool_mbufs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"{
        "interface": "veth0", "backend": "afXdp", "cores": [1],
        "address": "198.18.1.50/24", "gateway": "198.18.1.1",
        "tcp": { "sack": true, "timestamps": true, "windowScaling": true,
                 "congestionControl": "cubic", "delayedAckMs": 40 },
        "services": [ { "kind": "Http", "port": 80, "body": "hello\n" },
                      { "kind": "Echo", "port": 7 }, { "kind": "Discard", "port": 9 } ],
        "drainTimeoutMs": 2000
    }"#;

    #[test]
    fn reads_the_contract_example() {
        let config = from_json(FULL).unwrap();
        assert_eq!(config.backend, Backend::AfXdp);
        assert_eq!(service_ports(&config), [80, 7, 9]);
        assert_eq!(gateway(&config), Ok(Some(Ipv4Addr::new(198, 18, 1, 1))));
        assert_eq!(config.tcp.delayed_ack_ms, Some(40));
        let tcp = apply_tcp_options(&config.tcp, tcp::Config::default());
        assert_eq!(tcp.delayed_ack, Duration::from_millis(40));
    }

    #[test]
    fn clients_expand_to_one_remote_per_connection_and_bad_ones_name_the_field() {
        let with = |clients: &str| {
            from_json(&FULL.replace(
                r#""drainTimeoutMs": 2000"#,
                &format!(r#""drainTimeoutMs": 2000, "clients": {clients}"#),
            ))
        };
        let config = with(
            r#"[{"kind": "bulk", "remote": "198.18.2.1:5001", "connections": 2},
                {"kind": "bulk", "remote": "198.18.2.1:5002", "connections": 1}]"#,
        )
        .unwrap();
        let remotes: Vec<String> = client_connections(&config)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            remotes,
            ["198.18.2.1:5001", "198.18.2.1:5001", "198.18.2.1:5002"]
        );
        for (clients, error) in [
            (
                r#"[{"kind": "bulk", "remote": "198.18.2.1", "connections": 1}]"#,
                "not an IPv4 address and port",
            ),
            (
                r#"[{"kind": "bulk", "remote": "198.18.2.1:0", "connections": 1}]"#,
                "port 0",
            ),
            (
                r#"[{"kind": "bulk", "remote": "198.18.2.1:9", "connections": 10001}]"#,
                "at most 10000",
            ),
        ] {
            let e = with(clients).unwrap_err();
            assert!(e.starts_with("clients: ") && e.contains(error), "{e}");
        }
    }

    #[test]
    fn accepts_the_crd_spellings_and_defaults_the_drain_timeout() {
        let text = r#"{"interface":"t0","backend":"Tap","cores":[0],"address":"10.0.0.1/8",
                       "tcp":{"congestionControl":"NewReno"}}"#;
        let config = from_json(text).unwrap();
        assert_eq!(config.backend, Backend::Tap);
        assert_eq!(
            config.tcp.congestion_control,
            Some(CongestionControl::NewReno)
        );
        assert_eq!(config.drain_timeout_ms, 2000);
    }

    #[test]
    fn bad_configs_name_what_is_wrong() {
        let cases = [
            (
                FULL.replace("198.18.1.50/24", "198.18.1.50"),
                "lacks a /prefix",
            ),
            (
                FULL.replace("198.18.1.50/24", "198.18.1.500/24"),
                "not an IPv4",
            ),
            (
                FULL.replace("198.18.1.1\"", "198.18.1.256\""),
                "gateway \"198.18.1.256\" is not an IPv4",
            ),
            (FULL.replace("[1]", "[]"), "at least one core"),
            (FULL.replace("[1]", "[1, 1]"), "listed twice"),
            (FULL.replace("\"port\": 7", "\"port\": 80"), "two services"),
            (FULL.replace("afXdp", "rdma"), "unknown variant"),
            (
                FULL.replace("\"veth0\"", "\"an-interface-name-too-long\""),
                "not a valid name",
            ),
            (
                FULL.replace("drainTimeoutMs", "drainTimeout"),
                "unknown field",
            ),
            (
                FULL.replace(
                    "\"drainTimeoutMs\"",
                    r#""rss": {"key": "6d5a", "indirection": [0]}, "drainTimeoutMs""#,
                ),
                "at least 16",
            ),
            (
                FULL.replace(
                    "\"drainTimeoutMs\"",
                    r#""rss": {"key": "6d5x", "indirection": [0]}, "drainTimeoutMs""#,
                ),
                "rss.key",
            ),
            (
                FULL.replace(
                    "\"drainTimeoutMs\"",
                    &format!(
                        r#""rss": {{"key": "{}", "indirection": []}}, "drainTimeoutMs""#,
                        "00".repeat(40)
                    ),
                ),
                "table is empty",
            ),
        ];
        for (text, expected) in cases {
            let error = from_json(&text).unwrap_err();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
    }

    #[test]
    fn steers_by_the_nics_rss_when_given_and_by_the_configured_key_otherwise() {
        let configured = steering(&from_json(FULL).unwrap()).unwrap();
        assert_eq!(configured.source, SteeringSource::Configured);
        assert_eq!(configured.table, RssTable::spread(&MICROSOFT_KEY, 1));
        let key: Vec<u8> = (1..=40).collect();
        let text = FULL.replace(
            "\"drainTimeoutMs\"",
            &format!(
                r#""rss": {{"key": "{}", "indirection": [0, 1, 2, 3]}}, "drainTimeoutMs""#,
                userstack::rss::to_hex(&key)
            ),
        );
        let nic = steering(&from_json(&text).unwrap()).unwrap();
        assert_eq!(nic.source, SteeringSource::Nic);
        assert_eq!(
            nic.table,
            RssTable {
                key,
                indirection: vec![0, 1, 2, 3]
            }
        );
        let unknown = text.replace("\"indirection\"", "\"table\"");
        assert!(from_json(&unknown).unwrap_err().contains("unknown field"));
    }
}
