//! The runner's configuration: `userspaceStack` of the CRD translated into the
//! [`RunnerConfig`] of the agent<->runner contract (crate hoststack-runner-api), the JSON that
//! `hoststack-userstack run --config FILE` reads (see docs/userstack.md). The CRD's types are
//! the user's API; the contract's are the runner's, and this module maps one onto the other.

use std::collections::BTreeSet;

use hoststack_crds::{
    CongestionControl, ServiceKind, StackBackend, StackTcpOptions, UserspaceStack,
};
use hoststack_runner_api as api;
/// The runner's `--config` file, as [`translate`] makes it.
pub use hoststack_runner_api::RunnerConfig;

use crate::host::ethtool::Rss;

/// What the runner steers by, from what the NIC reported (`None`: it has no RSS to read):
/// its key and table when it hashes with Toeplitz and shows both; otherwise nothing, and the
/// runner falls back to its configured key. Only backend `afXdp` runs on the NIC's own
/// queues as the kernel's driver programmed them (a DPDK runner programs its own key, a TAP
/// has one queue).
pub fn runner_rss(backend: StackBackend, nic: Option<&Rss>) -> Option<api::RssConfig> {
    let rss = nic.filter(|r| {
        backend == StackBackend::AfXdp
            && r.is_toeplitz()
            && !r.key.is_empty()
            && !r.indirection.is_empty()
    })?;
    Some(api::RssConfig {
        key: rss.key.iter().map(|b| format!("{b:02x}")).collect(),
        indirection: rss.indirection.clone(),
    })
}

/// The contract's backend for the CRD's.
fn backend(backend: StackBackend) -> api::Backend {
    match backend {
        StackBackend::AfXdp => api::Backend::AfXdp,
        StackBackend::Dpdk => api::Backend::Dpdk,
        StackBackend::Tap => api::Backend::Tap,
    }
}

/// The contract's TCP options for the CRD's.
fn tcp_options(tcp: &StackTcpOptions) -> api::TcpOptions {
    api::TcpOptions {
        sack: tcp.sack,
        timestamps: tcp.timestamps,
        window_scaling: tcp.window_scaling,
        congestion_control: tcp.congestion_control.map(|c| match c {
            CongestionControl::Cubic => api::CongestionControl::Cubic,
            CongestionControl::NewReno => api::CongestionControl::NewReno,
        }),
        delayed_ack_ms: tcp.delayed_ack_ms,
        min_rto_ms: tcp.min_rto_ms,
        nagle: tcp.nagle,
    }
}

/// The contract's service kind for the CRD's.
fn service_kind(kind: ServiceKind) -> api::ServiceKind {
    match kind {
        ServiceKind::Echo => api::ServiceKind::Echo,
        ServiceKind::Discard => api::ServiceKind::Discard,
        ServiceKind::Http => api::ServiceKind::Http,
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
    let dpdk = (stack.backend == StackBackend::Dpdk).then(|| api::DpdkConfig {
        pci_address: pci_address.unwrap_or_default().to_string(),
        hugepage_dir: "/dev/hugepages".into(),
        mempool_mbufs: 4096,
    });
    RunnerConfig {
        interface: stack.interface.clone(),
        backend: backend(stack.backend),
        cores: cores.iter().copied().collect(),
        address: stack.address.clone(),
        gateway: stack.gateway.clone(),
        tcp: stack.tcp.as_ref().map(tcp_options).unwrap_or_default(),
        services: stack
            .services
            .iter()
            .map(|s| api::ServiceConfig {
                kind: service_kind(s.kind),
                port: s.port,
                body: s.body.clone(),
            })
            .collect(),
        drain_timeout_ms: api::DEFAULT_DRAIN_TIMEOUT_MS,
        dpdk,
        rss: None,
        clients: Vec::new(),
        idle: api::IdlePolicy::Park,
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
    fn every_crd_value_maps_onto_the_contract_value_of_its_spelling() {
        // The contract also reads the CRD's spellings, so each mapping must agree with them.
        fn spelled<T: serde::Serialize, U: serde::de::DeserializeOwned>(crd: T) -> U {
            serde_json::from_value(serde_json::to_value(crd).expect("json")).expect("parses")
        }
        for b in [StackBackend::AfXdp, StackBackend::Dpdk, StackBackend::Tap] {
            assert_eq!(backend(b), spelled(b));
        }
        for k in [ServiceKind::Echo, ServiceKind::Discard, ServiceKind::Http] {
            assert_eq!(service_kind(k), spelled(k));
        }
        for c in [CongestionControl::Cubic, CongestionControl::NewReno] {
            let tcp = StackTcpOptions {
                congestion_control: Some(c),
                ..StackTcpOptions::default()
            };
            assert_eq!(tcp_options(&tcp).congestion_control, Some(spelled(c)));
        }
    }

    #[test]
    fn the_nics_toeplitz_key_and_table_go_to_an_af_xdp_runner_only() {
        let nic = Rss {
            hash_function: crate::host::ethtool::RSS_HASH_TOEPLITZ,
            key: vec![0x6d, 0x5a, 0x0f, 0x00],
            indirection: vec![0, 1, 2, 3],
        };
        assert_eq!(
            runner_rss(StackBackend::AfXdp, Some(&nic)),
            Some(api::RssConfig {
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
