//! The runner's `--config` file: what the agent asks the runner to run. camelCase fields;
//! enum values as the runner's contract spells them (`afXdp`, `newReno`), with the CRD's
//! spellings (`AfXdp`, `NewReno`) accepted too, and services spelled as the CRD spells them.
//! Read with `deny_unknown_fields` (see the crate doc).

use serde::{Deserialize, Serialize};

/// The graceful stop's deadline when the config names none.
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 2000;

/// The whole runner configuration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunnerConfig {
    /// The NIC whose queues the stack takes (or the TAP device to create).
    pub interface: String,
    /// Packet I/O backend.
    pub backend: Backend,
    /// One shard per core, pinned; shard i takes queue i.
    pub cores: Vec<u32>,
    /// The stack's IPv4 address with prefix length, e.g. `198.18.1.50/24`.
    pub address: String,
    /// Next hop off the subnet, an IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// TCP options; absent ones keep the engine's Linux defaults.
    #[serde(default)]
    pub tcp: TcpOptions,
    /// The services.
    #[serde(default)]
    pub services: Vec<ServiceConfig>,
    /// Graceful-stop deadline in milliseconds ([`DEFAULT_DRAIN_TIMEOUT_MS`] when absent).
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// DPDK settings, for backend `dpdk` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpdk: Option<DpdkConfig>,
    /// The NIC's RSS key and table, read by the agent through ethtool netlink (backend
    /// `afXdp` on a device that hashes with Toeplitz); absent, the runner spreads its
    /// configured key over the shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<RssConfig>,
    /// Connections the stack opens itself (the evaluation's bulk senders; the agent
    /// configures none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientConfig>,
    /// What a shard does when it has nothing to do ([`IdlePolicy::Park`] when absent).
    #[serde(default, skip_serializing_if = "IdlePolicy::is_park")]
    pub idle: IdlePolicy,
}

/// What a shard does once its loop has found nothing to do for a while.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdlePolicy {
    /// Sleep in poll(2) on the device until a frame arrives or the next millisecond, so an
    /// idle runner gives its core back; the first frame after a sleep waits for the shard to
    /// wake.
    #[default]
    #[serde(rename = "park", alias = "Park")]
    Park,
    /// Never sleep: poll the device on every turn, as a DPDK application does. No frame waits
    /// for a wake-up; the core is the stack's whether traffic flows or not.
    #[serde(rename = "spin", alias = "Spin")]
    Spin,
}

impl IdlePolicy {
    /// Whether this is [`IdlePolicy::Park`], the default (left out of the JSON).
    pub fn is_park(&self) -> bool {
        *self == IdlePolicy::Park
    }
}

impl std::str::FromStr for IdlePolicy {
    type Err = String;

    /// The contract's spelling, `park` or `spin`.
    fn from_str(s: &str) -> Result<IdlePolicy, String> {
        match s {
            "park" => Ok(IdlePolicy::Park),
            "spin" => Ok(IdlePolicy::Spin),
            other => Err(format!("{other:?}: park or spin")),
        }
    }
}

fn default_drain_timeout_ms() -> u64 {
    DEFAULT_DRAIN_TIMEOUT_MS
}

/// Packet I/O backends.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AF_XDP sockets on the interface's queues.
    #[serde(rename = "afXdp", alias = "AfXdp")]
    AfXdp,
    /// A TAP device named by `interface`, created by the runner.
    #[serde(rename = "tap", alias = "Tap")]
    Tap,
    /// DPDK on a PCI device bound to vfio-pci (needs a runner built with its `dpdk` feature).
    #[serde(rename = "dpdk", alias = "Dpdk")]
    Dpdk,
}

/// TCP options; absent ones keep the engine's Linux defaults.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpOptions {
    /// Selective acknowledgements (D-SACK follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sack: Option<bool>,
    /// Timestamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamps: Option<bool>,
    /// Window scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_scaling: Option<bool>,
    /// Congestion control.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<CongestionControl>,
    /// Delayed-ACK timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delayed_ack_ms: Option<u32>,
    /// Minimum retransmission timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rto_ms: Option<u32>,
    /// Nagle's algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nagle: Option<bool>,
}

/// Congestion control algorithms.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CongestionControl {
    /// CUBIC (RFC 9438).
    #[serde(rename = "cubic", alias = "Cubic")]
    Cubic,
    /// NewReno (RFC 6582).
    #[serde(rename = "newReno", alias = "NewReno")]
    NewReno,
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

/// Services, spelled as the CRD's `ServiceKind` serialises.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceKind {
    /// Echoes what it receives.
    Echo,
    /// Reads and discards.
    Discard,
    /// HTTP/1.1 with keep-alive and a static body.
    Http,
}

/// Connections the stack opens to one remote endpoint.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    /// What each connection does.
    pub kind: ClientKind,
    /// The remote endpoint, `a.b.c.d:port`.
    pub remote: String,
    /// How many connections, opened at start and spread over the shards.
    pub connections: u32,
}

/// What a client connection does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    /// Sends as fast as the connection takes, until the runner stops; discards what it
    /// receives.
    #[serde(rename = "bulk")]
    Bulk,
}

/// DPDK settings (backend `dpdk` only).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DpdkConfig {
    /// The device's PCI address; the device is bound to vfio-pci.
    pub pci_address: String,
    /// The hugetlbfs mount DPDK's EAL takes its memory from.
    pub hugepage_dir: String,
    /// Mbufs in the mempool.
    pub mempool_mbufs: u32,
}

/// The NIC's receive-side scaling, as the agent read it through ethtool netlink.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RssConfig {
    /// The Toeplitz key, lowercase hex without separators (the runner also reads uppercase).
    pub key: String,
    /// The indirection table: entry `hash % len` is the queue.
    pub indirection: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A config with every field set, in the JSON the agent writes.
    fn full() -> (RunnerConfig, serde_json::Value) {
        let config = RunnerConfig {
            interface: "eth1".into(),
            backend: Backend::Dpdk,
            cores: vec![1, 3],
            address: "198.18.1.50/24".into(),
            gateway: Some("198.18.1.1".into()),
            tcp: TcpOptions {
                sack: Some(true),
                timestamps: Some(false),
                window_scaling: Some(true),
                congestion_control: Some(CongestionControl::NewReno),
                delayed_ack_ms: Some(40),
                min_rto_ms: Some(200),
                nagle: Some(false),
            },
            services: vec![
                ServiceConfig {
                    kind: ServiceKind::Http,
                    port: 80,
                    body: Some("hello\n".into()),
                },
                ServiceConfig {
                    kind: ServiceKind::Echo,
                    port: 7,
                    body: None,
                },
                ServiceConfig {
                    kind: ServiceKind::Discard,
                    port: 9,
                    body: None,
                },
            ],
            drain_timeout_ms: 2000,
            dpdk: Some(DpdkConfig {
                pci_address: "0000:00:04.0".into(),
                hugepage_dir: "/dev/hugepages".into(),
                mempool_mbufs: 4096,
            }),
            rss: Some(RssConfig {
                key: "6d5a56da".into(),
                indirection: vec![0, 1, 0, 1],
            }),
            clients: vec![ClientConfig {
                kind: ClientKind::Bulk,
                remote: "198.18.2.1:9".into(),
                connections: 4,
            }],
            idle: IdlePolicy::Spin,
        };
        let json = json!({
            "interface": "eth1",
            "backend": "dpdk",
            "cores": [1, 3],
            "address": "198.18.1.50/24",
            "gateway": "198.18.1.1",
            "tcp": {
                "sack": true, "timestamps": false, "windowScaling": true,
                "congestionControl": "newReno", "delayedAckMs": 40, "minRtoMs": 200,
                "nagle": false
            },
            "services": [
                { "kind": "Http", "port": 80, "body": "hello\n" },
                { "kind": "Echo", "port": 7 },
                { "kind": "Discard", "port": 9 }
            ],
            "drainTimeoutMs": 2000,
            "dpdk": {
                "pciAddress": "0000:00:04.0", "hugepageDir": "/dev/hugepages",
                "mempoolMbufs": 4096
            },
            "rss": { "key": "6d5a56da", "indirection": [0, 1, 0, 1] },
            "clients": [{ "kind": "bulk", "remote": "198.18.2.1:9", "connections": 4 }],
            "idle": "spin"
        });
        (config, json)
    }

    #[test]
    fn a_full_config_is_pinned_and_round_trips() {
        let (config, json) = full();
        assert_eq!(serde_json::to_value(&config).unwrap(), json);
        let back: RunnerConfig = serde_json::from_value(json).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let config: RunnerConfig = serde_json::from_value(json!({
            "interface": "t0", "backend": "tap", "cores": [0], "address": "10.0.0.1/8"
        }))
        .unwrap();
        assert_eq!(config.tcp, TcpOptions::default());
        assert!(config.services.is_empty());
        assert!(config.clients.is_empty());
        assert_eq!(config.drain_timeout_ms, DEFAULT_DRAIN_TIMEOUT_MS);
        assert_eq!(config.idle, IdlePolicy::Park);
        assert_eq!("spin".parse(), Ok(IdlePolicy::Spin));
        assert!("sleep".parse::<IdlePolicy>().is_err());
        assert_eq!(
            (config.gateway, config.dpdk, config.rss),
            (None, None, None)
        );
    }

    #[test]
    fn the_crd_spellings_of_backend_and_congestion_control_are_accepted() {
        for (backend, expected) in [
            ("AfXdp", Backend::AfXdp),
            ("Tap", Backend::Tap),
            ("Dpdk", Backend::Dpdk),
        ] {
            assert_eq!(
                serde_json::from_value::<Backend>(json!(backend)).unwrap(),
                expected
            );
        }
        for (name, expected) in [
            ("Cubic", CongestionControl::Cubic),
            ("cubic", CongestionControl::Cubic),
            ("NewReno", CongestionControl::NewReno),
        ] {
            assert_eq!(
                serde_json::from_value::<CongestionControl>(json!(name)).unwrap(),
                expected
            );
        }
    }

    #[test]
    fn a_renamed_or_unknown_field_fails_at_every_level() {
        let (_, json) = full();
        let renames = [
            ("drainTimeoutMs", "drainTimeout"),
            ("windowScaling", "windowScale"),
            ("pciAddress", "pci"),
            ("indirection", "table"),
            ("\"port\":80", "\"listen\":80"),
            ("connections", "flows"),
        ];
        let text = json.to_string();
        for (from, to) in renames {
            assert!(text.contains(from), "{from} is not in {text}");
            let renamed = text.replace(from, to);
            let error = serde_json::from_str::<RunnerConfig>(&renamed).unwrap_err();
            assert!(
                error.to_string().contains("unknown field")
                    || error.to_string().contains("missing field"),
                "{from} -> {to}: {error}"
            );
        }
    }
}
