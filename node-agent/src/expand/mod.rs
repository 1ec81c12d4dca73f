//! Expansion: turns a revision's node config into the goal of its transaction, given what
//! discovery found on the host (interfaces, queue IRQs, routes, IOMMU groups).
//!
//! [`Discovery::read`] is the I/O ([`discovery`]); [`expand`] is pure: (revision, config,
//! discovery) → the goal's target values and the refusals (requests this host cannot carry out,
//! each failing the revision before any write). [`cores`] is the plan step of
//! `userspaceStack`, which takes the stack's cores out of the CPU masks the other parts set.

pub mod cores;
pub mod discovery;

use std::collections::{BTreeMap, BTreeSet};

use hoststack_crds::{check_interface_glob, ItemResult, ItemState, NodeConfig};

use crate::appliers::{applier, dpdk, firewall, hugepages, irq, matching, nic, rps, xdp};
use crate::cpus::parse_list;
use crate::journal::Applied;
use crate::model::{Refusal, Setting, Wants};
use crate::transaction::{Goal, TargetValues};
use cores::dedicate;
pub use discovery::Discovery;

/// What a revision asks of this host: the goal of its transaction, and what stands in its way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expansion {
    /// The revision and the target value of each of its settings.
    pub goal: Goal,
    /// Requests refused on this host; any of them fails the revision before any write.
    pub refused: Vec<Refusal>,
}

impl Expansion {
    /// The expansion of a revert: every managed setting restored, nothing refused.
    pub fn revert() -> Self {
        Expansion::default()
    }

    /// The refused requests as status items in `state` (Failed, or WouldFail in Plan mode).
    pub fn blockers(&self, state: ItemState) -> Vec<ItemResult> {
        self.refused
            .iter()
            .map(|r| ItemResult {
                kind: r.kind.clone(),
                target: r.target.clone(),
                original: None,
                desired: None,
                actual: None,
                state,
                message: Some(r.message.clone()),
            })
            .collect()
    }
}

/// The pure expansion of `revision`'s config (see the module doc).
pub fn expand(revision: Applied, config: &NodeConfig, d: &Discovery) -> Expansion {
    let mut wants = hugepages::desired(&config.hugepages);
    for (key, value) in &config.sysctls {
        wants.set(Setting::sysctl(key.clone()), value.0.clone());
    }
    let online = parse_list(&d.facts.cpus_online).unwrap_or_default();
    let mut flow_entries: Option<u64> = None;
    // Interfaces bound to DPDK, and interfaces tuned otherwise, with the entry doing it.
    let mut bound: BTreeMap<String, String> = BTreeMap::new();
    let mut tuned: BTreeMap<String, String> = BTreeMap::new();
    // RPS and XPS plan for the queues there are once the channel counts are set.
    let interfaces = nic::interfaces_after(config, &d.facts.interfaces, &d.nic);
    for (i, entry) in config.interfaces.iter().enumerate() {
        let field = format!("interfaces[{i}]");
        let m = &entry.match_;
        // A glob an older schema let through is refused, and never matched.
        if let Some(Err(problem)) = m.name.as_deref().map(check_interface_glob) {
            wants.refuse(
                "interfaces",
                &field,
                format!("{field}.match.name: {problem}"),
            );
            continue;
        }
        let mut matched = matching::select(m, &interfaces);
        if m.name.is_none() && m.driver.is_none() {
            matched.extend(matching::select(m, &d.unattached));
        }
        if matched.is_empty() {
            let have: Vec<&str> = d.facts.interfaces.iter().map(|i| i.name.as_str()).collect();
            wants.refuse(
                "interfaces",
                &field,
                format!(
                    "{field}: match {} matched no interface (have: {})",
                    matching::describe(&entry.match_),
                    have.join(", ")
                ),
            );
            continue;
        }
        for iface in matched {
            let name = &iface.name;
            let nic_wants = nic::desired(&field, name, entry, d.nic.get(name));
            let nic_tuned = !nic_wants.settings.is_empty() || !nic_wants.refused.is_empty();
            wants.extend(nic_wants);
            if let Some(aff) = &entry.irq_affinity {
                let irqs = d.irqs.get(name).map(Vec::as_slice).unwrap_or_default();
                wants.extend(irq::desired(
                    &format!("{field}.irqAffinity"),
                    name,
                    aff,
                    irqs,
                    &online,
                ));
            }
            if let Some(r) = &entry.rps {
                let (w, flows) = rps::desired_rps(&format!("{field}.rps"), iface, r, &online);
                wants.extend(w);
                if r.flow_entries.is_some() {
                    *flow_entries.get_or_insert(0) += flows;
                }
            }
            if let Some(x) = &entry.xps {
                wants.extend(rps::desired_xps(&format!("{field}.xps"), iface, x, &online));
            }
            if let Some(x) = &entry.xdp {
                wants.extend(xdp::desired(
                    &format!("{field}.xdp"),
                    iface,
                    x,
                    &d.dpdk.management,
                ));
            }
            if entry.irq_affinity.is_some()
                || entry.rps.is_some()
                || entry.xps.is_some()
                || entry.xdp.is_some()
                || nic_tuned
            {
                tuned.entry(name.clone()).or_insert_with(|| field.clone());
            }
            if let Some(binding) = &entry.dpdk {
                wants.extend(dpdk::desired(
                    &format!("{field}.dpdk"),
                    iface,
                    binding,
                    &d.dpdk,
                ));
                bound.entry(name.clone()).or_insert_with(|| field.clone());
            }
        }
    }
    for (name, by) in &bound {
        if let Some(other) = tuned.get(name) {
            wants.refuse(
                "interfaces",
                other,
                format!(
                    "{other}: {name} is bound to DPDK by {by}; a bound device has no netdev whose \
                     IRQs or queues could be tuned"
                ),
            );
        }
    }
    if let Some(total) = flow_entries.filter(|t| *t > 0) {
        wants.set(
            Setting::sysctl(rps::SOCK_FLOW_ENTRIES),
            rps::sock_flow_entries(total),
        );
    }
    if let Some(spec) = &config.firewall {
        wants.extend(firewall::desired(spec, d.api_server));
    }
    let (mut values, mut refused) = merge(wants);
    if let Some(stack) = &config.userspace_stack {
        // Last: the stack's cores leave the masks the parts above asked for as well.
        refused.extend(dedicate(
            stack,
            &online,
            &d.facts.interfaces,
            &d.cores,
            &mut values,
        ));
    }
    Expansion {
        goal: Goal {
            target: Some(revision),
            values,
        },
        refused,
    }
}

/// The settings of `wants` as one map; a setting asked twice with different values is refused.
fn merge(wants: Wants) -> (TargetValues, Vec<Refusal>) {
    let mut values = TargetValues::new();
    let mut refused = wants.refused;
    let mut clashing: BTreeSet<Setting> = BTreeSet::new();
    for (setting, value) in wants.settings {
        match values.get(&setting) {
            Some(v) if !applier(setting.kind).same_value(v, &value) => {
                refused.push(Refusal {
                    kind: setting.kind.as_str().into(),
                    target: setting.target.clone(),
                    message: format!(
                        "{setting} is asked to be both {v:?} and {value:?} (two parts of the \
                         spec set it)"
                    ),
                });
                clashing.insert(setting);
            }
            Some(_) => {}
            None => {
                values.insert(setting, value);
            }
        }
    }
    for s in clashing {
        values.remove(&s);
    }
    (values, refused)
}

#[cfg(test)]
mod tests {
    use hoststack_crds::{
        DpdkBinding, Firewall, HugepageReservation, InterfaceMatch, InterfaceTuning, IrqAffinity,
        IrqPolicy, Rps, SysctlValue, UserspaceStack, Xps,
    };

    use hoststack_crds::{HostFacts, InterfaceFacts};

    use super::cores::CoreFacts;
    use super::*;
    use crate::appliers::irq::QueueIrq;
    use crate::host::ethtool::{ChannelInfo, Features};
    use crate::model::Kind;

    fn revision() -> Applied {
        Applied {
            tuning: "edge".into(),
            revision: "r1".into(),
        }
    }

    fn discovery() -> Discovery {
        let eth = |name: &str, pci: &str, rx: u32| InterfaceFacts {
            name: name.into(),
            driver: Some("virtio_net".into()),
            pci_address: Some(pci.into()),
            mtu: Some(1500),
            rx_queues: rx,
            tx_queues: rx,
        };
        let q = |queue: u32, irq: u32| QueueIrq {
            queue,
            irq,
            name: format!("virtio-input.{queue}"),
        };
        Discovery {
            facts: HostFacts {
                cpus_online: "0-3".into(),
                cpu_count: 4,
                interfaces: vec![
                    eth("eth0", "0000:00:03.0", 1),
                    eth("eth1", "0000:00:04.0", 2),
                ],
                vfio_available: true,
                ..HostFacts::default()
            },
            irqs: [
                ("eth0".to_string(), vec![q(0, 30)]),
                ("eth1".to_string(), vec![q(0, 40), q(1, 41)]),
            ]
            .into(),
            dpdk: dpdk::Context {
                vfio_available: true,
                management: [(
                    "eth0".to_string(),
                    "it carries the default route".to_string(),
                )]
                .into(),
                iommu_groups: [
                    ("0000:00:04.0".to_string(), "9".to_string()),
                    ("0000:00:06.0".to_string(), "11".to_string()),
                ]
                .into(),
            },
            unattached: vec![InterfaceFacts {
                name: "0000:00:06.0".into(),
                pci_address: Some("0000:00:06.0".into()),
                ..InterfaceFacts::default()
            }],
            nic: BTreeMap::new(),
            api_server: Some("198.18.1.1".parse().unwrap()),
            cores: CoreFacts::default(),
        }
    }

    #[test]
    fn nic_parts_plan_with_aliases_and_the_queues_after_the_channels() {
        let mut d = discovery();
        let known: Vec<String> = [
            "rx-gro",
            "rx-lro",
            "tx-tcp-segmentation",
            "tx-tcp6-segmentation",
        ]
        .map(String::from)
        .to_vec();
        d.nic.insert(
            "eth1".into(),
            nic::NicFacts {
                features: Ok(Features {
                    changeable: ["rx-gro", "tx-tcp-segmentation", "tx-tcp6-segmentation"]
                        .map(String::from)
                        .into(),
                    active: ["tx-tcp-segmentation", "tx-tcp6-segmentation"]
                        .map(String::from)
                        .into(),
                    known,
                }),
                channels: Ok(ChannelInfo {
                    combined: 2,
                    combined_max: 2,
                    ..ChannelInfo::default()
                }),
            },
        );
        let mut c = NodeConfig::default();
        let mut e = entry("eth1");
        e.channels = Some(hoststack_crds::Channels {
            combined: Some(1),
            rx: None,
            tx: None,
        });
        e.offloads = [("tso".to_string(), false), ("gro".to_string(), true)].into();
        e.mtu = Some(9000);
        e.rps = Some(Rps {
            cpus: "1".into(),
            flow_entries: None,
        });
        c.interfaces.push(e);
        let x = expand(revision(), &c, &d);
        assert!(x.refused.is_empty(), "{:?}", x.refused);
        assert_eq!(
            keys(&x),
            [
                "channels eth1/combined=1",
                "offload eth1/rx-gro=on",
                "offload eth1/tx-tcp-segmentation=off",
                "offload eth1/tx-tcp6-segmentation=off",
                "mtu eth1=9000",
                // One combined channel left: RPS for rx-0 only.
                "rpsCpus eth1/rx-0=2",
            ]
        );
        // eth0's features were not read: its offloads are refused with the reason.
        let mut c = NodeConfig::default();
        let mut e = entry("eth0");
        e.offloads = [("lro".to_string(), true)].into();
        c.interfaces.push(e);
        let x = expand(revision(), &c, &d);
        assert_eq!(
            x.refused[0].message,
            "interfaces[0].offloads: the offload features of eth0 were not read"
        );
    }

    #[test]
    fn a_device_without_netdev_is_selected_by_pci_address_alone() {
        let mut c = NodeConfig::default();
        let mut by_pci = InterfaceTuning::default();
        by_pci.match_.pci_address = Some("0000:00:06.0".into());
        by_pci.dpdk = Some(DpdkBinding::default());
        c.interfaces.push(by_pci);
        // A glob never selects it.
        let mut glob = entry("*");
        glob.rps = Some(Rps {
            cpus: "1".into(),
            flow_entries: None,
        });
        c.interfaces.push(glob);
        let x = expand(revision(), &c, &discovery());
        assert!(x.refused.is_empty(), "{:?}", x.refused);
        assert_eq!(
            x.goal
                .values
                .get(&Setting::new(
                    Kind::PciDriver,
                    "0000:00:06.0/0000:00:06.0/-"
                ))
                .map(String::as_str),
            Some("driver=vfio-pci override=vfio-pci")
        );
        assert_eq!(
            keys(&x).iter().filter(|k| k.starts_with("rpsCpus")).count(),
            3,
            "eth0 rx-0, eth1 rx-0 and rx-1 only"
        );
    }

    #[test]
    fn a_glob_the_api_refuses_fails_the_revision_naming_the_field() {
        let mut c = NodeConfig::default();
        for glob in [
            format!("eth{}", "[0-9]".repeat(13)),
            "eth\u{1}".to_string(),
            "e th0".to_string(),
            "*e*t*h*0*".to_string(),
        ] {
            let mut e = entry(&glob);
            e.mtu = Some(9000);
            c.interfaces.push(e);
        }
        let mut fine = entry("eth[!0]");
        fine.mtu = Some(1500);
        c.interfaces.push(fine);
        let x = expand(revision(), &c, &discovery());
        let messages: Vec<&str> = x.refused.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "interfaces[0].match.name: is 68 bytes long; an interface name glob has 1 to 64 \
                 bytes",
                "interfaces[1].match.name: holds '\\u{1}'; an interface name glob is printable \
                 ASCII, without whitespace or control characters",
                "interfaces[2].match.name: holds ' '; an interface name glob is printable ASCII, \
                 without whitespace or control characters",
                "interfaces[3].match.name: holds 5 '*'; an interface name glob holds at most 4 '*'",
            ]
        );
        // The refused entries select nothing; the others are planned as ever (and the revision
        // fails on the refusals before any write).
        assert_eq!(keys(&x), ["mtu eth1=1500"]);
    }

    fn entry(name: &str) -> InterfaceTuning {
        InterfaceTuning {
            match_: InterfaceMatch {
                name: Some(name.into()),
                ..InterfaceMatch::default()
            },
            ..InterfaceTuning::default()
        }
    }

    fn keys(e: &Expansion) -> Vec<String> {
        e.goal
            .values
            .iter()
            .map(|(s, v)| format!("{} {}={v}", s.kind.as_str(), s.target))
            .collect()
    }

    #[test]
    fn a_full_config_in_apply_order() {
        let mut c = NodeConfig::default();
        c.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("1".into()));
        c.hugepages.push(HugepageReservation {
            count: 4,
            mount_path: Some("/mnt/huge".into()),
            ..HugepageReservation::default()
        });
        let mut e = entry("eth*");
        e.irq_affinity = Some(IrqAffinity {
            policy: IrqPolicy::Spread,
            cpus: Some("2-3".into()),
            pin: BTreeMap::new(),
        });
        e.rps = Some(Rps {
            cpus: "0-1".into(),
            flow_entries: Some(100),
        });
        e.xps = Some(Xps { cpus: "0-3".into() });
        c.interfaces.push(e);
        let x = expand(revision(), &c, &discovery());
        assert!(x.refused.is_empty(), "{:?}", x.refused);
        assert_eq!(
            keys(&x),
            [
                "hugepages 2Mi=4",
                "hugetlbfs /mnt/huge=hugetlbfs pagesize=2M",
                "sysctl net.core.rps_sock_flow_entries=512",
                "sysctl net.ipv4.tcp_sack=1",
                "irqAffinity 30=2",
                "irqAffinity 40=2",
                "irqAffinity 41=3",
                "rpsCpus eth0/rx-0=3",
                "rpsCpus eth1/rx-0=3",
                "rpsCpus eth1/rx-1=3",
                "rpsFlowCnt eth0/rx-0=128",
                "rpsFlowCnt eth1/rx-0=128",
                "rpsFlowCnt eth1/rx-1=128",
                "xpsCpus eth0/tx-0=f",
                "xpsCpus eth1/tx-0=5",
                "xpsCpus eth1/tx-1=a",
            ]
        );
    }

    #[test]
    fn refusals_and_unsupported_parts() {
        let d = discovery();
        let mut c = NodeConfig::default();
        // No such interface.
        c.interfaces.push(entry("eth9"));
        // DPDK on the default-route interface, and on eth1 which another entry tunes.
        let mut mgmt = entry("eth0");
        mgmt.dpdk = Some(DpdkBinding::default());
        c.interfaces.push(mgmt);
        let mut bind = entry("eth1");
        bind.dpdk = Some(DpdkBinding::default());
        bind.mtu = Some(9000);
        c.interfaces.push(bind);
        let mut rps_a = entry("eth1");
        rps_a.rps = Some(Rps {
            cpus: "1".into(),
            flow_entries: None,
        });
        c.interfaces.push(rps_a);
        // Two entries set eth0's rx-0 differently.
        let mut x1 = entry("eth0");
        x1.rps = Some(Rps {
            cpus: "1".into(),
            flow_entries: None,
        });
        let mut x2 = entry("eth*");
        x2.rps = Some(Rps {
            cpus: "2".into(),
            flow_entries: None,
        });
        c.interfaces.push(x1);
        c.interfaces.push(x2);
        c.firewall = Some(Firewall {
            blocked_prefixes: vec!["10.0.0.1/8".into()],
            ..Firewall::default()
        });
        c.userspace_stack = Some(UserspaceStack::default());
        let x = expand(revision(), &c, &d);
        let messages: Vec<&str> = x.refused.iter().map(|r| r.message.as_str()).collect();
        let has = |text: &str| messages.iter().any(|m| m.contains(text));
        assert!(
            has("interfaces[0]: match name=eth9 matched no interface (have: eth0, eth1)"),
            "{messages:?}"
        );
        assert!(
            has("refusing to bind eth0 (0000:00:03.0) to vfio-pci: it carries the default route"),
            "{messages:?}"
        );
        assert!(
            has("eth1 is bound to DPDK by interfaces[2]"),
            "{messages:?}"
        );
        assert!(has("rpsCpus eth0/rx-0 is asked to be both"), "{messages:?}");
        assert!(!x
            .goal
            .values
            .contains_key(&Setting::new(Kind::RpsCpus, "eth0/rx-0")));
        assert!(
            has("userspaceStack.cores: no core given; the stack needs at least one"),
            "{messages:?}"
        );
        assert!(
            has("firewall.blockedPrefixes[0]: \"10.0.0.1/8\" has host bits set"),
            "{messages:?}"
        );
        assert!(!x.goal.values.contains_key(&firewall::setting()));
        // The MTU of a device bound to DPDK is refused with the binding.
        assert!(
            has("interfaces[2]: eth1 is bound to DPDK by interfaces[2]"),
            "{messages:?}"
        );
    }

    #[test]
    fn a_firewall_is_one_table_set_after_rps_and_xps() {
        let mut c = NodeConfig::default();
        let mut e = entry("eth1");
        e.xps = Some(Xps { cpus: "0".into() });
        c.interfaces.push(e);
        c.firewall = Some(Firewall {
            blocked_prefixes: vec!["198.19.20.0/24".into()],
            syn_rate_limit: None,
            notrack_ports: vec![80],
        });
        let x = expand(revision(), &c, &discovery());
        assert!(x.refused.is_empty(), "{:?}", x.refused);
        let settings: Vec<&Setting> = x.goal.values.keys().collect();
        assert_eq!(settings.last(), Some(&&firewall::setting()));
        assert_eq!(
            x.goal.values[&firewall::setting()],
            "blocked 198.19.20.0/24; syn-limit none; notrack 80"
        );
    }

    #[test]
    fn a_sysctl_that_clashes_with_flow_entries_is_refused() {
        let mut c = NodeConfig::default();
        c.sysctls
            .insert(rps::SOCK_FLOW_ENTRIES.into(), SysctlValue("4096".into()));
        let mut e = entry("eth0");
        e.rps = Some(Rps {
            cpus: "0".into(),
            flow_entries: Some(64),
        });
        c.interfaces.push(e);
        let x = expand(revision(), &c, &discovery());
        assert_eq!(x.refused.len(), 1, "{:?}", x.refused);
        assert!(x.refused[0].message.contains("both"));
    }
}
