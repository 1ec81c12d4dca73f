//! The runner's configuration (`hoststack-userstack run --config FILE`), in the JSON the
//! agent's dataplane supervisor writes: camelCase fields, enum values spelled as the
//! hoststack CRDs serialise them (the contract's lower-camel spellings are accepted too).

use super::steering::{Steering, SteeringSource};
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::time::Duration;
use userstack::rss::{from_hex, RssTable, MICROSOFT_KEY};
use userstack::tcp::{self, CongestionAlgorithm};

/// Packet I/O backends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_XDP sockets on the interface's queues.
    #[serde(rename = "afXdp", alias = "AfXdp")]
    AfXdp,
    /// A TAP device named by `interface`, created by the runner.
    #[serde(rename = "tap", alias = "Tap")]
    Tap,
    /// DPDK (needs the `dpdk` cargo feature, which this build may lack).
    #[serde(rename = "dpdk", alias = "Dpdk")]
    Dpdk,
}

impl Backend {
    /// The spelling in the stats file.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::AfXdp => "afXdp",
            Backend::Tap => "tap",
            Backend::Dpdk => "dpdk",
        }
    }
}

/// Services, spelled as `hoststack_crds::ServiceKind` serialises.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// Echoes what it receives.
    Echo,
    /// Reads and discards.
    Discard,
    /// HTTP/1.1 with keep-alive and a static body.
    Http,
}

/// One service on one port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceConfig {
    /// What it does.
    pub kind: ServiceKind,
    /// The TCP port it listens on.
    pub port: u16,
    /// The static body of an `Http` service (empty when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// Congestion control, spelled as `hoststack_crds::CongestionControl` serialises.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// CUBIC.
    #[serde(rename = "cubic", alias = "Cubic")]
    Cubic,
    /// NewReno.
    #[serde(rename = "newReno", alias = "NewReno")]
    NewReno,
}

/// TCP options; absent ones keep the engine's Linux defaults.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpOptions {
    /// Selective acknowledgements.
    pub sack: Option<bool>,
    /// Timestamps.
    pub timestamps: Option<bool>,
    /// Window scaling.
    pub window_scaling: Option<bool>,
    /// Congestion control.
    pub congestion_control: Option<Congestion>,
    /// Delayed-ACK timeout in milliseconds.
    pub delayed_ack_ms: Option<u32>,
    /// Minimum retransmission timeout in milliseconds.
    pub min_rto_ms: Option<u32>,
    /// Nagle's algorithm.
    pub nagle: Option<bool>,
}

impl TcpOptions {
    /// The engine configuration with these options applied.
    pub fn apply(&self, mut config: tcp::Config) -> tcp::Config {
        if let Some(sack) = self.sack {
            config.sack = sack;
            config.dsack = sack;
        }
        if let Some(timestamps) = self.timestamps {
            config.timestamps = timestamps;
        }
        if let Some(scaling) = self.window_scaling {
            config.window_scaling = scaling;
        }
        if let Some(congestion) = self.congestion_control {
            config.congestion = match congestion {
                Congestion::Cubic => CongestionAlgorithm::Cubic,
                Congestion::NewReno => CongestionAlgorithm::NewReno,
            };
        }
        if let Some(ms) = self.delayed_ack_ms {
            config.delayed_ack = Duration::from_millis(u64::from(ms));
        }
        if let Some(ms) = self.min_rto_ms {
            config.rto_min = Duration::from_millis(u64::from(ms));
        }
        if let Some(nagle) = self.nagle {
            config.nagle = nagle;
        }
        config
    }
}

/// DPDK settings (backend `dpdk` only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DpdkConfig {
    /// The device's PCI address.
    pub pci_address: String,
    /// The hugetlbfs mount.
    pub hugepage_dir: String,
    /// Mbufs in the mempool.
    pub mempool_mbufs: u32,
}

/// The NIC's receive-side scaling, as the agent read it through ethtool netlink.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RssConfig {
    /// The Toeplitz key, hex without separators (at least 16 bytes: a TCP/IPv4 flow hashes
    /// 12 bytes of input, each needing the 32 key bits from its position on).
    pub key: String,
    /// The indirection table: entry `hash % len` is the queue.
    pub indirection: Vec<u32>,
}

/// The smallest key that hashes a TCP/IPv4 flow (12 bytes of input + 4).
const MIN_KEY_BYTES: usize = 16;

/// The whole runner configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// The NIC whose queues the stack takes (or the TAP device to create).
    pub interface: String,
    /// Packet I/O backend.
    pub backend: Backend,
    /// One shard per core, pinned; shard i takes queue i.
    pub cores: Vec<usize>,
    /// The stack's address with prefix length, e.g. `198.18.1.50/24`.
    pub address: String,
    /// Next hop off the subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// TCP options.
    #[serde(default)]
    pub tcp: TcpOptions,
    /// Services.
    #[serde(default)]
    pub services: Vec<ServiceConfig>,
    /// Graceful-stop deadline in milliseconds.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// DPDK settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpdk: Option<DpdkConfig>,
    /// The NIC's RSS key and table; absent, the configured key spread over the shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssConfig>,
}

fn default_drain_timeout_ms() -> u64 {
    2000
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

impl Config {
    /// Parses and checks a configuration: every error names the field.
    pub fn from_json(text: &str) -> Result<Config, String> {
        let config: Config = serde_json::from_str(text).map_err(|e| format!("config: {e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what serde cannot: addresses, cores, ports.
    pub fn validate(&self) -> Result<(), String> {
        if self.interface.is_empty() || self.interface.len() > 15 {
            return Err(format!(
                "interface {:?} is not a valid name",
                self.interface
            ));
        }
        parse_address(&self.address)?;
        if self.cores.is_empty() {
            return Err("cores: at least one core is needed".into());
        }
        let mut cores = self.cores.clone();
        cores.sort_unstable();
        if cores.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("cores {:?}: a core is listed twice", self.cores));
        }
        let mut ports: Vec<u16> = self.services.iter().map(|s| s.port).collect();
        ports.sort_unstable();
        if ports.windows(2).any(|w| w[0] == w[1]) {
            return Err("services: two services on one port".into());
        }
        if let Some(service) = self.services.iter().find(|s| s.port == 0) {
            return Err(format!("services: {:?} on port 0", service.kind));
        }
        if self.backend == Backend::Dpdk && self.dpdk.is_none() {
            return Err("backend dpdk needs the dpdk settings".into());
        }
        self.steering()?;
        Ok(())
    }

    /// What the shards steer by: the NIC's key and table from `rss`, or else
    /// [`MICROSOFT_KEY`] spread round-robin over the shards' queues.
    pub fn steering(&self) -> Result<Steering, String> {
        let Some(rss) = &self.rss else {
            return Ok(Steering {
                source: SteeringSource::Configured,
                table: RssTable::spread(&MICROSOFT_KEY, self.cores.len() as u32),
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
    pub fn ports(&self) -> Vec<u16> {
        self.services.iter().map(|s| s.port).collect()
    }

    /// The DPDK device's configuration: the shards' cores and the `dpdk` settings.
    #[cfg(feature = "dpdk")]
    pub fn dpdk_port(&self) -> Result<crate::device::dpdk::PortConfig, String> {
        let dpdk = self
            .dpdk
            .as_ref()
            .ok_or("backend dpdk needs the dpdk settings")?;
        Ok(crate::device::dpdk::PortConfig {
            cores: self.cores.clone(),
            pci_address: dpdk.pci_address.clone(),
            hugepage_dir: dpdk.hugepage_dir.clone(),
            mempool_mbufs: dpdk.mempool_mbufs,
        })
    }
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
        let config = Config::from_json(FULL).unwrap();
        assert_eq!(config.backend, Backend::AfXdp);
        assert_eq!(config.ports(), [80, 7, 9]);
        assert_eq!(config.gateway, Some(Ipv4Addr::new(198, 18, 1, 1)));
        assert_eq!(config.tcp.delayed_ack_ms, Some(40));
        let tcp = config.tcp.apply(tcp::Config::default());
        assert_eq!(tcp.delayed_ack, Duration::from_millis(40));
    }

    #[test]
    fn accepts_the_crd_spellings_and_defaults_the_drain_timeout() {
        let text = r#"{"interface":"t0","backend":"Tap","cores":[0],"address":"10.0.0.1/8",
                       "tcp":{"congestionControl":"NewReno"}}"#;
        let config = Config::from_json(text).unwrap();
        assert_eq!(config.backend, Backend::Tap);
        assert_eq!(config.tcp.congestion_control, Some(Congestion::NewReno));
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
            let error = Config::from_json(&text).unwrap_err();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
    }

    #[test]
    fn steers_by_the_nics_rss_when_given_and_by_the_configured_key_otherwise() {
        let configured = Config::from_json(FULL).unwrap().steering().unwrap();
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
        let nic = Config::from_json(&text).unwrap().steering().unwrap();
        assert_eq!(nic.source, SteeringSource::Nic);
        assert_eq!(
            nic.table,
            RssTable {
                key,
                indirection: vec![0, 1, 2, 3]
            }
        );
        let unknown = text.replace("\"indirection\"", "\"table\"");
        assert!(Config::from_json(&unknown)
            .unwrap_err()
            .contains("unknown field"));
    }
}
