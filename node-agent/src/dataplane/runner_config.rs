//! The runner's configuration: `userspaceStack` of the CRD translated into the JSON that
//! `hoststack-userstack run --config FILE` reads (the fixed contract with the userstack
//! runtime, see docs/userstack.md).

use std::collections::BTreeSet;

use hoststack_crds::{CongestionControl, ServiceKind, StackBackend, UserspaceStack};
use serde::{Deserialize, Serialize};

use crate::appliers::nic::ethtool::Rss;

/// How long the runner may drain open connections when it is stopped.
pub const DRAIN_TIMEOUT_MS: u64 = 2000;

/// The runner's `--config` file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerConfig {
    /// The NIC whose queues the stack takes.
    pub interface: String,
    /// `afXdp`, `tap` or `dpdk`.
    pub backend: String,
    /// One shard per core.
    pub cores: Vec<u32>,
    /// The stack's IPv4 address with prefix length.
    pub address: String,
    /// Next hop off the subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// TCP options; absent ones take the runtime's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<RunnerTcp>,
    /// The services.
    pub services: Vec<RunnerService>,
    /// The graceful stop's deadline.
    pub drain_timeout_ms: u64,
    /// DPDK's settings, for backend `dpdk` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpdk: Option<RunnerDpdk>,
    /// The NIC's RSS key and indirection table, read through ethtool netlink (backend `afXdp`
    /// on a device that hashes with Toeplitz); absent, the runner uses its configured key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss: Option<RunnerRss>,
}

/// The NIC's receive-side scaling as the runner steers by it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerRss {
    /// The Toeplitz key, lowercase hex without separators.
    pub key: String,
    /// The indirection table: entry `hash % len` is the queue.
    pub indirection: Vec<u32>,
}

/// What the runner steers by, from what the NIC reported (`None`: it has no RSS to read):
/// its key and table when it hashes with Toeplitz and shows both; otherwise nothing, and the
/// runner falls back to its configured key. Only backend `afXdp` runs on the NIC's own
/// queues as the kernel's driver programmed them (a DPDK runner programs its own key, a TAP
/// has one queue).
pub fn runner_rss(backend: StackBackend, nic: Option<&Rss>) -> Option<RunnerRss> {
    let rss = nic.filter(|r| {
        backend == StackBackend::AfXdp
            && r.is_toeplitz()
            && !r.key.is_empty()
            && !r.indirection.is_empty()
    })?;
    Some(RunnerRss {
        key: rss.key.iter().map(|b| format!("{b:02x}")).collect(),
        indirection: rss.indirection.clone(),
    })
}

/// TCP options of the runner.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerTcp {
    /// Selective acknowledgements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sack: Option<bool>,
    /// Timestamps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamps: Option<bool>,
    /// Window scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_scaling: Option<bool>,
    /// `cubic` or `newReno`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<String>,
    /// Delayed-ACK timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delayed_ack_ms: Option<u32>,
    /// Minimum retransmission timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rto_ms: Option<u32>,
    /// Nagle's algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nagle: Option<bool>,
}

/// One service of the runner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerService {
    /// `Echo`, `Discard` or `Http`, spelled as the CRD spells them.
    pub kind: ServiceKind,
    /// Its TCP port.
    pub port: u16,
    /// The `Http` service's static body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// DPDK's settings of the runner.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerDpdk {
    /// The device, bound to vfio-pci.
    pub pci_address: String,
    /// The hugetlbfs mount EAL takes its memory from.
    pub hugepage_dir: String,
    /// Mbufs in the mempool.
    pub mempool_mbufs: u32,
}

/// The runner's spelling of a backend.
pub fn backend_name(backend: StackBackend) -> &'static str {
    match backend {
        StackBackend::AfXdp => "afXdp",
        StackBackend::Dpdk => "dpdk",
        StackBackend::Tap => "tap",
    }
}

/// Translates `stack`, whose cores parsed to `cores`; `pci_address` is the interface's PCI
/// address (needed by the `dpdk` backend, which then takes its memory from /dev/hugepages).
/// `rss` stays empty: the NIC's part is added by the caller that read it ([`runner_rss`]).
pub fn translate(
    stack: &UserspaceStack,
    cores: &BTreeSet<u32>,
    pci_address: Option<&str>,
) -> RunnerConfig {
    let tcp = stack.tcp.as_ref().map(|t| RunnerTcp {
        sack: t.sack,
        timestamps: t.timestamps,
        window_scaling: t.window_scaling,
        congestion_control: t.congestion_control.map(|c| {
            match c {
                CongestionControl::Cubic => "cubic",
                CongestionControl::NewReno => "newReno",
            }
            .to_string()
        }),
        delayed_ack_ms: t.delayed_ack_ms,
        min_rto_ms: t.min_rto_ms,
        nagle: t.nagle,
    });
    let dpdk = (stack.backend == StackBackend::Dpdk).then(|| RunnerDpdk {
        pci_address: pci_address.unwrap_or_default().to_string(),
        hugepage_dir: "/dev/hugepages".into(),
        mempool_mbufs: 4096,
    });
    RunnerConfig {
        interface: stack.interface.clone(),
        backend: backend_name(stack.backend).into(),
        cores: cores.iter().copied().collect(),
        address: stack.address.clone(),
        gateway: stack.gateway.clone(),
        tcp,
        services: stack
            .services
            .iter()
            .map(|s| RunnerService {
                kind: s.kind,
                port: s.port,
                body: s.body.clone(),
            })
            .collect(),
        drain_timeout_ms: DRAIN_TIMEOUT_MS,
        dpdk,
        rss: None,
    }
}

#[cfg(test)]
mod tests {
    use hoststack_crds::{StackService, StackTcpOptions};

    use super::*;

    #[test]
    fn translates_a_stack_into_the_contract_json() {
        let stack = UserspaceStack {
            cores: "1,3".into(),
            interface: "veth0".into(),
            backend: StackBackend::AfXdp,
            address: "198.18.1.50/24".into(),
            gateway: Some("198.18.1.1".into()),
            tcp: Some(StackTcpOptions {
                sack: Some(true),
                congestion_control: Some(CongestionControl::NewReno),
                ..StackTcpOptions::default()
            }),
            services: vec![StackService {
                kind: ServiceKind::Http,
                port: 80,
                body: Some("hello\n".into()),
            }],
        };
        let json = serde_json::to_value(translate(&stack, &[1, 3].into(), None)).expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "interface": "veth0",
                "backend": "afXdp",
                "cores": [1, 3],
                "address": "198.18.1.50/24",
                "gateway": "198.18.1.1",
                "tcp": { "sack": true, "congestionControl": "newReno" },
                "services": [ { "kind": "Http", "port": 80, "body": "hello\n" } ],
                "drainTimeoutMs": 2000
            })
        );
        let dpdk = UserspaceStack {
            backend: StackBackend::Dpdk,
            ..stack
        };
        let json = serde_json::to_value(translate(&dpdk, &[1].into(), Some("0000:00:04.0")))
            .expect("json");
        assert_eq!(json["backend"], "dpdk");
        assert_eq!(
            json["dpdk"],
            serde_json::json!({
                "pciAddress": "0000:00:04.0", "hugepageDir": "/dev/hugepages", "mempoolMbufs": 4096
            })
        );
    }

    #[test]
    fn the_nics_toeplitz_key_and_table_go_to_an_af_xdp_runner_only() {
        let nic = Rss {
            hash_function: crate::appliers::nic::ethtool::RSS_HASH_TOEPLITZ,
            key: vec![0x6d, 0x5a, 0x0f, 0x00],
            indirection: vec![0, 1, 2, 3],
        };
        assert_eq!(
            runner_rss(StackBackend::AfXdp, Some(&nic)),
            Some(RunnerRss {
                key: "6d5a0f00".into(),
                indirection: vec![0, 1, 2, 3]
            })
        );
        let json = serde_json::to_value(runner_rss(StackBackend::AfXdp, Some(&nic))).expect("json");
        assert_eq!(
            json,
            serde_json::json!({ "key": "6d5a0f00", "indirection": [0, 1, 2, 3] })
        );
        // No RSS, another hash function, nothing to show, or not the NIC's own queues.
        assert_eq!(runner_rss(StackBackend::AfXdp, None), None);
        let xor = Rss {
            hash_function: 2,
            ..nic.clone()
        };
        assert_eq!(runner_rss(StackBackend::AfXdp, Some(&xor)), None);
        let keyless = Rss {
            key: Vec::new(),
            ..nic.clone()
        };
        assert_eq!(runner_rss(StackBackend::AfXdp, Some(&keyless)), None);
        assert_eq!(runner_rss(StackBackend::Dpdk, Some(&nic)), None);
        assert_eq!(runner_rss(StackBackend::Tap, Some(&nic)), None);
    }
}
