//! The cores of the user-space stack: the checks before the agent dedicates them, and the CPU
//! masks they are taken out of.
//!
//! [`CoreFacts::read`] is the I/O; [`dedicate`] is pure: (the stack's spec, online CPUs,
//! interfaces, the agent's affinity, the base value of every mask) → refusals, or the target
//! values extended so that no queue IRQ, no RPS mask and no XPS mask names a dedicated core.
//! The masks are ordinary settings of the IRQ and RPS/XPS appliers, so the transaction journals
//! their originals and a revert gives the cores back exactly.

use std::collections::{BTreeMap, BTreeSet};

use hoststack_crds::{InterfaceFacts, StackBackend, UserspaceStack};

use crate::appliers;
use crate::appliers::irq::QueueIrq;
use crate::cpus::{cpus_to_mask, format_list, mask_cpus, parse_list};
use crate::host::Host;
use crate::journal::Journal;
use crate::model::{Kind, Reading, Refusal, Setting};
use crate::transaction::TargetValues;

/// The item kind of refusals about the user-space stack.
pub const KIND: &str = "userspaceStack";

/// What the plan needs to know of the host's CPUs beyond the host facts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CoreFacts {
    /// The CPUs the agent itself may run on (its scheduler affinity).
    pub agent_cpus: BTreeSet<u32>,
    /// The base value of every CPU mask the stack's cores are taken out of — each queue IRQ's
    /// affinity, each rx queue's `rps_cpus` and each tx queue's `xps_cpus` — as the journal's
    /// original where hoststack already manages the setting, else as read now. Subtracting
    /// from the original keeps a change of cores from losing the cores of the last revision.
    pub masks: BTreeMap<Setting, String>,
}

impl CoreFacts {
    /// Reads the agent's affinity and the masks of `interfaces` (queue IRQs in `irqs`).
    /// Masks that cannot be read are left out: there is nothing to take a core out of.
    pub fn read(
        host: &Host,
        interfaces: &[InterfaceFacts],
        irqs: &BTreeMap<String, Vec<QueueIrq>>,
        journal: &Journal,
    ) -> Self {
        let mut settings: Vec<Setting> = irqs
            .values()
            .flatten()
            .map(|q| Setting::new(Kind::IrqAffinity, q.irq.to_string()))
            .collect();
        for i in interfaces {
            settings.extend(
                (0..i.rx_queues).map(|q| Setting::new(Kind::RpsCpus, format!("{}/rx-{q}", i.name))),
            );
            settings.extend(
                (0..i.tx_queues).map(|q| Setting::new(Kind::XpsCpus, format!("{}/tx-{q}", i.name))),
            );
        }
        let masks = settings
            .into_iter()
            .filter_map(|s| {
                let base = match journal.original(&s) {
                    Some(original) => original.to_string(),
                    None => match appliers::read(host, &s) {
                        Reading::Value(v) => v,
                        Reading::Missing(_) | Reading::Unreadable(_) => return None,
                    },
                };
                Some((s, base))
            })
            .collect();
        CoreFacts {
            agent_cpus: agent_affinity(),
            masks,
        }
    }
}

/// The CPUs this process may run on (`sched_getaffinity`); empty when it cannot be read.
pub fn agent_affinity() -> BTreeSet<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable cpu_set_t of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return BTreeSet::new();
    }
    let max = u32::try_from(size * 8).unwrap_or(u32::MAX);
    // SAFETY: CPU_ISSET reads `set` at an index below its size in bits.
    (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &set) })
        .collect()
}

/// The dedicated cores of `stack`, parsed; an error names what is wrong.
pub fn parse_cores(stack: &UserspaceStack) -> Result<BTreeSet<u32>, String> {
    match parse_list(&stack.cores) {
        Some(cores) if !cores.is_empty() => Ok(cores),
        Some(_) => Err("userspaceStack.cores: no core given; the stack needs at least one".into()),
        None => Err(format!(
            "userspaceStack.cores: {:?} is not a CPU list (e.g. 2-3,6)",
            stack.cores
        )),
    }
}

/// The pure plan step of `userspaceStack` (see the module doc). The cores must exist and be
/// online, leave the agent at least one CPU of its affinity, and the interface must exist
/// (backend Tap: the runner creates it, and there must be exactly one core); otherwise the
/// refusals say why and `values` is left as it was.
pub fn dedicate(
    stack: &UserspaceStack,
    online: &BTreeSet<u32>,
    interfaces: &[InterfaceFacts],
    facts: &CoreFacts,
    values: &mut TargetValues,
) -> Vec<Refusal> {
    let refuse = |message: String| Refusal {
        kind: KIND.into(),
        target: KIND.into(),
        message,
    };
    let cores = match parse_cores(stack) {
        Ok(cores) => cores,
        Err(e) => return vec![refuse(e)],
    };
    let mut refused = Vec::new();
    let missing: BTreeSet<u32> = cores.difference(online).copied().collect();
    if !missing.is_empty() {
        refused.push(refuse(format!(
            "userspaceStack.cores: CPUs {} do not exist or are not online (online: {})",
            format_list(&missing),
            format_list(online)
        )));
    }
    if online.difference(&cores).next().is_none() {
        refused.push(refuse(format!(
            "userspaceStack.cores: {} are all the online CPUs; the host needs at least one",
            format_list(&cores)
        )));
    } else if !facts.agent_cpus.is_empty() && facts.agent_cpus.is_subset(&cores) {
        refused.push(refuse(format!(
            "userspaceStack.cores: {} include every CPU the agent may run on (its affinity: \
             {}); leave it one of its own",
            format_list(&cores),
            format_list(&facts.agent_cpus)
        )));
    }
    if stack.backend == StackBackend::Tap {
        // The runner creates the TAP device itself, with one queue for one shard.
        if cores.len() != 1 {
            refused.push(refuse(format!(
                "userspaceStack.cores: backend Tap runs exactly one shard; {} are {} cores",
                format_list(&cores),
                cores.len()
            )));
        }
    } else if !interfaces.iter().any(|i| {
        // Backend Dpdk may name the device by its PCI address (see `super::wanted`).
        i.name == stack.interface
            || (stack.backend == StackBackend::Dpdk
                && i.pci_address.as_deref() == Some(stack.interface.as_str()))
    }) {
        let have: Vec<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        refused.push(refuse(format!(
            "userspaceStack.interface: no interface {:?} on this host (have: {})",
            stack.interface,
            have.join(", ")
        )));
    }
    if !refused.is_empty() {
        return refused;
    }
    let rest: BTreeSet<u32> = online.difference(&cores).copied().collect();
    let spec_masks: Vec<(Setting, String)> = values
        .iter()
        .filter(|(s, _)| is_mask(s.kind))
        .map(|(s, v)| (s.clone(), v.clone()))
        .collect();
    for (setting, value) in spec_masks {
        if let Some(without) = without_cores(setting.kind, &value, &cores, &rest) {
            values.insert(setting, without);
        }
    }
    for (setting, base) in &facts.masks {
        if values.contains_key(setting) {
            continue;
        }
        let Some(cpus) = cpus_of(setting.kind, base) else {
            continue;
        };
        if cpus.is_disjoint(&cores) {
            continue;
        }
        if let Some(without) = without_cores(setting.kind, base, &cores, &rest) {
            values.insert(setting.clone(), without);
        }
    }
    refused
}

/// Whether settings of `kind` are CPU masks the stack's cores are taken out of.
fn is_mask(kind: Kind) -> bool {
    matches!(kind, Kind::IrqAffinity | Kind::RpsCpus | Kind::XpsCpus)
}

/// The CPUs of a mask value of `kind`: a list for IRQs, a hex mask for RPS/XPS.
fn cpus_of(kind: Kind, value: &str) -> Option<BTreeSet<u32>> {
    match kind {
        Kind::IrqAffinity => parse_list(value),
        _ => mask_cpus(value),
    }
}

/// `value` without `cores`, in the format of `kind`. An IRQ needs at least one CPU: one left
/// with none gets every online CPU but the cores (`rest`). `None` when `value` does not parse.
fn without_cores(
    kind: Kind,
    value: &str,
    cores: &BTreeSet<u32>,
    rest: &BTreeSet<u32>,
) -> Option<String> {
    let left: BTreeSet<u32> = cpus_of(kind, value)?.difference(cores).copied().collect();
    Some(match kind {
        Kind::IrqAffinity if left.is_empty() => format_list(rest),
        Kind::IrqAffinity => format_list(&left),
        _ => cpus_to_mask(&left),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(cores: &str, iface: &str) -> UserspaceStack {
        UserspaceStack {
            cores: cores.into(),
            interface: iface.into(),
            address: "198.18.1.50/24".into(),
            ..UserspaceStack::default()
        }
    }

    fn ifaces() -> Vec<InterfaceFacts> {
        vec![InterfaceFacts {
            name: "eth1".into(),
            rx_queues: 2,
            tx_queues: 2,
            ..InterfaceFacts::default()
        }]
    }

    fn set(list: &str) -> BTreeSet<u32> {
        parse_list(list).expect("list")
    }

    fn facts() -> CoreFacts {
        CoreFacts {
            agent_cpus: set("0-3"),
            masks: [
                (Setting::new(Kind::IrqAffinity, "40"), "0-3".to_string()),
                (Setting::new(Kind::IrqAffinity, "41"), "2".to_string()),
                (Setting::new(Kind::IrqAffinity, "42"), "0".to_string()),
                (Setting::new(Kind::RpsCpus, "eth1/rx-0"), "f".to_string()),
                (Setting::new(Kind::RpsCpus, "eth1/rx-1"), "0".to_string()),
                (
                    Setting::new(Kind::XpsCpus, "eth1/tx-0"),
                    "00000004".to_string(),
                ),
            ]
            .into(),
        }
    }

    fn messages(refused: &[Refusal]) -> Vec<String> {
        refused.iter().map(|r| r.message.clone()).collect()
    }

    #[test]
    fn refuses_cores_the_host_or_the_agent_cannot_spare() {
        let online = set("0-3");
        let table: &[(&str, &str, &str)] = &[
            ("", "eth1", "userspaceStack.cores: no core given"),
            (
                "2-",
                "eth1",
                "userspaceStack.cores: \"2-\" is not a CPU list",
            ),
            (
                "3-5",
                "eth1",
                "userspaceStack.cores: CPUs 4-5 do not exist or are not online (online: 0-3)",
            ),
            (
                "0-3",
                "eth1",
                "userspaceStack.cores: 0-3 are all the online CPUs; the host needs at least one",
            ),
            (
                "2",
                "eth9",
                "userspaceStack.interface: no interface \"eth9\" on this host (have: eth1)",
            ),
        ];
        for (cores, iface, want) in table {
            let mut desired = TargetValues::new();
            let refused = dedicate(
                &stack(cores, iface),
                &online,
                &ifaces(),
                &facts(),
                &mut desired,
            );
            let got = messages(&refused);
            assert!(got.iter().any(|m| m.starts_with(want)), "{cores}: {got:?}");
            assert!(refused.iter().all(|r| r.kind == KIND && r.target == KIND));
            assert!(desired.is_empty(), "a refusal adds nothing: {desired:?}");
        }
        // An agent pinned to the cores it would give away.
        let mut pinned = facts();
        pinned.agent_cpus = set("2-3");
        let mut desired = TargetValues::new();
        let refused = dedicate(
            &stack("2-3", "eth1"),
            &online,
            &ifaces(),
            &pinned,
            &mut desired,
        );
        assert_eq!(
            messages(&refused),
            [
                "userspaceStack.cores: 2-3 include every CPU the agent may run on (its affinity: \
              2-3); leave it one of its own"
            ]
        );
        assert!(desired.is_empty());
        // Backend Tap: the runner creates the device, and runs one shard.
        let tap = |cores: &str| UserspaceStack {
            backend: StackBackend::Tap,
            ..stack(cores, "tap9")
        };
        let mut desired = TargetValues::new();
        let refused = dedicate(&tap("2-3"), &online, &ifaces(), &facts(), &mut desired);
        assert_eq!(
            messages(&refused),
            ["userspaceStack.cores: backend Tap runs exactly one shard; 2-3 are 2 cores"]
        );
        let refused = dedicate(&tap("2"), &online, &ifaces(), &facts(), &mut desired);
        assert!(refused.is_empty(), "{refused:?}");
        // Backend Dpdk may name its device by PCI address (bound to vfio-pci it has no netdev);
        // another backend may not.
        let mut bound = ifaces();
        bound[0].pci_address = Some("0000:00:03.0".into());
        let dpdk = UserspaceStack {
            backend: StackBackend::Dpdk,
            ..stack("2", "0000:00:03.0")
        };
        let refused = dedicate(&dpdk, &online, &bound, &facts(), &mut TargetValues::new());
        assert!(refused.is_empty(), "{refused:?}");
        let refused = dedicate(
            &stack("2", "0000:00:03.0"),
            &online,
            &bound,
            &facts(),
            &mut TargetValues::new(),
        );
        assert_eq!(refused.len(), 1, "{refused:?}");
    }

    #[test]
    fn takes_the_cores_out_of_every_mask_that_names_them() {
        let mut desired = TargetValues::new();
        let refused = dedicate(
            &stack("2", "eth1"),
            &set("0-3"),
            &ifaces(),
            &facts(),
            &mut desired,
        );
        assert!(refused.is_empty(), "{refused:?}");
        let want: TargetValues = [
            (Setting::new(Kind::IrqAffinity, "40"), "0-1,3".to_string()),
            // An IRQ left without a CPU gets every online CPU but the cores.
            (Setting::new(Kind::IrqAffinity, "41"), "0-1,3".to_string()),
            (Setting::new(Kind::RpsCpus, "eth1/rx-0"), "b".to_string()),
            (Setting::new(Kind::XpsCpus, "eth1/tx-0"), "0".to_string()),
        ]
        .into();
        // IRQ 42 and rx-1 do not name core 2: left alone, not managed.
        assert_eq!(desired, want);
    }

    #[test]
    fn the_spec_own_masks_lose_the_cores_too() {
        let mut desired: TargetValues = [
            (Setting::new(Kind::RpsCpus, "eth1/rx-1"), "c".to_string()),
            (Setting::new(Kind::IrqAffinity, "42"), "3".to_string()),
            (Setting::sysctl("net.ipv4.tcp_sack"), "1".to_string()),
        ]
        .into();
        let refused = dedicate(
            &stack("3", "eth1"),
            &set("0-3"),
            &ifaces(),
            &facts(),
            &mut desired,
        );
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(desired[&Setting::new(Kind::RpsCpus, "eth1/rx-1")], "4");
        assert_eq!(desired[&Setting::new(Kind::IrqAffinity, "42")], "0-2");
        assert_eq!(desired[&Setting::sysctl("net.ipv4.tcp_sack")], "1");
        // The base masks naming core 3 are taken care of as well.
        assert_eq!(desired[&Setting::new(Kind::IrqAffinity, "40")], "0-2");
        assert_eq!(desired[&Setting::new(Kind::RpsCpus, "eth1/rx-0")], "7");
    }
}
