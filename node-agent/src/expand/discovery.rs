//! Discovery: what the plan steps need to know of the host beyond its settings, read once per
//! decision: host facts, queue IRQs, NIC features and channels, routes, IOMMU groups, and the
//! CPU masks a user-space stack's cores are taken out of.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hoststack_crds::{HostFacts, InterfaceFacts};

use super::cores::CoreFacts;
use crate::appliers::irq::{self, QueueIrq};
use crate::appliers::{dpdk, nic};
use crate::host::Host;
use crate::journal::Journal;
use crate::model::Kind;

/// What the plan steps need to know of the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Discovery {
    /// Host facts; `interfaces` also holds the interfaces hoststack bound to DPDK (their netdev
    /// is gone, the journal remembers them).
    pub facts: HostFacts,
    /// The queue IRQs of each interface.
    pub irqs: BTreeMap<String, Vec<QueueIrq>>,
    /// What DPDK binding needs: vfio, management interfaces, IOMMU groups.
    pub dpdk: dpdk::Context,
    /// PCI network devices without a netdev (unbound, or bound to a user-space driver by
    /// someone else), named by their PCI address: only an entry that matches by `pciAddress`
    /// alone (no name, no driver) selects them, for DPDK binding.
    pub unattached: Vec<InterfaceFacts>,
    /// Each interface's offload features and channel counts, read through netlink.
    pub nic: BTreeMap<String, nic::NicFacts>,
    /// The API server's address: the firewall must not block it.
    pub api_server: Option<IpAddr>,
    /// The agent's affinity and the CPU masks a user-space stack's cores are taken out of.
    pub cores: CoreFacts,
}

impl Discovery {
    /// Reads the host. `api_server` is the API server's address (its route is protected from
    /// DPDK binding); `journal` names the devices hoststack bound.
    pub fn read(host: &Host, api_server: Option<IpAddr>, journal: &Journal) -> Self {
        let roots = host.roots();
        let mut facts = crate::facts::collect(&roots.proc_root, &roots.sys_root);
        for entry in journal
            .originals
            .iter()
            .filter(|e| e.kind == Kind::PciDriver)
        {
            if let Some((pci, name, driver)) = dpdk::parse_target(&entry.target) {
                if !facts.interfaces.iter().any(|i| i.name == name) {
                    facts.interfaces.push(InterfaceFacts {
                        name: name.to_string(),
                        driver: driver.map(str::to_string),
                        pci_address: Some(pci.to_string()),
                        ..InterfaceFacts::default()
                    });
                }
            }
        }
        let unattached = dpdk::unattached_devices(roots, &facts.interfaces);
        let nic = facts
            .interfaces
            .iter()
            .map(|i| {
                let facts = match host.ethtool() {
                    Ok(ethtool) => nic::NicFacts::read(ethtool, &i.name),
                    Err(missing) => nic::NicFacts::unreadable(&missing.to_string()),
                };
                (i.name.clone(), facts)
            })
            .collect();
        let irqs = facts
            .interfaces
            .iter()
            .map(|i| (i.name.clone(), irq::discover(roots, &i.name)))
            .collect();
        let read = |p: &str| std::fs::read_to_string(roots.proc_root.join(p)).unwrap_or_default();
        let iommu_groups = facts
            .interfaces
            .iter()
            .chain(&unattached)
            .filter_map(|i| i.pci_address.clone())
            .filter_map(|pci| Some((pci.clone(), dpdk::iommu_group(roots, &pci)?)))
            .collect();
        let dpdk = dpdk::Context {
            vfio_available: facts.vfio_available,
            management: dpdk::management_interfaces(
                &read("net/route"),
                &read("net/ipv6_route"),
                api_server,
            ),
            iommu_groups,
        };
        let cores = CoreFacts::read(host, &facts.interfaces, &irqs, journal);
        Discovery {
            facts,
            irqs,
            dpdk,
            unattached,
            nic,
            api_server,
            cores,
        }
    }
}
