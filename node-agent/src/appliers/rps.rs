//! The RPS/XPS applier: per-queue packet steering under `<sys>/class/net/IF/queues/`:
//! `rx-N/rps_cpus` (a CPU mask), `rx-N/rps_flow_cnt` (receive flow steering entries, rounded up
//! to a power of two by the kernel) and `tx-N/xps_cpus` (a CPU mask). Targets are `IF/rx-N` and
//! `IF/tx-N`; the file follows from the kind.
//!
//! Masks are written in the kernel's format: hex, in comma-separated 32-bit groups, most
//! significant first (`ff,00000003` for CPUs 0, 1 and 32-39), and compared as CPU sets, since
//! the kernel pads them to its CPU count when it prints them.

use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;

use hoststack_crds::{InterfaceFacts, Rps, Xps};

use super::Applier;
use crate::cpus::{cpus_to_mask, format_list, mask_cpus, parse_list};
use crate::host::{Files, Host, Port, Roots};
use crate::model::{invalid, read_value, same_number, same_value, Kind, Reading, Setting, Wants};
use crate::sysfs::plain_name;

/// The sysctl that sizes the global RFS socket flow table.
pub const SOCK_FLOW_ENTRIES: &str = "net.core.rps_sock_flow_entries";

/// The applier of a queue setting, [`Kind::RpsCpus`], [`Kind::RpsFlowCnt`] or
/// [`Kind::XpsCpus`]: masks compare as sets of CPUs, flow counts as numbers.
#[derive(Clone, Copy, Debug)]
pub struct Queue(pub Kind);

impl Applier for Queue {
    fn ports(&self) -> &'static [Port] {
        &[Port::Files]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host.roots(), self.0, target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host.roots(), host.files()?, self.0, target, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        match self.0 {
            Kind::RpsFlowCnt => same_number(a, b),
            _ => match (mask_cpus(a), mask_cpus(b)) {
                (Some(x), Some(y)) => x == y,
                _ => same_value(a, b),
            },
        }
    }
}

/// The file of a queue setting.
fn path(roots: &Roots, kind: Kind, target: &str) -> Result<PathBuf, String> {
    let bad = || format!("queue target {target:?} is not IF/rx-N or IF/tx-N");
    let (iface, queue) = target.split_once('/').ok_or_else(bad)?;
    let (prefix, file) = match kind {
        Kind::RpsCpus => ("rx-", "rps_cpus"),
        Kind::RpsFlowCnt => ("rx-", "rps_flow_cnt"),
        Kind::XpsCpus => ("tx-", "xps_cpus"),
        _ => return Err(bad()),
    };
    let numbered = queue
        .strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !plain_name(iface) || !numbered {
        return Err(bad());
    }
    Ok(roots
        .sys_root
        .join("class/net")
        .join(iface)
        .join("queues")
        .join(queue)
        .join(file))
}

/// Reads a queue setting.
pub fn read(roots: &Roots, kind: Kind, target: &str) -> Reading {
    match path(roots, kind, target) {
        Ok(p) => read_value(&p, &format!("no such queue setting on this host: {target}")),
        Err(e) => Reading::Unreadable(e),
    }
}

/// Writes a queue setting.
pub fn write(
    roots: &Roots,
    files: &dyn Files,
    kind: Kind,
    target: &str,
    value: &str,
) -> io::Result<()> {
    let p = path(roots, kind, target).map_err(invalid)?;
    files.write(&p, format!("{}\n", value.trim()).as_bytes())
}

/// A CPU list of a spec, checked against the online CPUs.
fn cpus(field: &str, list: &str, online: &BTreeSet<u32>) -> Result<BTreeSet<u32>, String> {
    let cpus = parse_list(list).ok_or_else(|| format!("{field}: {list:?} is not a CPU list"))?;
    let bad: BTreeSet<u32> = cpus.difference(online).copied().collect();
    if bad.is_empty() {
        Ok(cpus)
    } else {
        Err(format!(
            "{field}: CPUs {} are not online (online: {})",
            format_list(&bad),
            format_list(online)
        ))
    }
}

/// The pure plan step of `rps` for one interface: the CPU mask of every rx queue, and with
/// `flowEntries` its flow count, rounded up to a power of two as the kernel does. Returns also
/// the socket flow entries this interface needs (flow count × rx queues), or 0.
pub fn desired_rps(
    field: &str,
    iface: &InterfaceFacts,
    rps: &Rps,
    online: &BTreeSet<u32>,
) -> (Wants, u64) {
    let mut wants = Wants::default();
    let set = match cpus(field, &rps.cpus, online) {
        Ok(set) => set,
        Err(e) => {
            wants.refuse(Kind::RpsCpus.as_str(), &iface.name, e);
            return (wants, 0);
        }
    };
    if iface.rx_queues == 0 {
        wants.refuse(
            Kind::RpsCpus.as_str(),
            &iface.name,
            format!("{field}: {} has no rx queues", iface.name),
        );
        return (wants, 0);
    }
    let mask = cpus_to_mask(&set);
    let flows = rps
        .flow_entries
        .map(|n| u64::from(n).next_power_of_two() * u64::from(n != 0));
    for q in 0..iface.rx_queues {
        let target = format!("{}/rx-{q}", iface.name);
        wants.set(Setting::new(Kind::RpsCpus, target.clone()), mask.clone());
        if let Some(flows) = flows {
            wants.set(Setting::new(Kind::RpsFlowCnt, target), flows.to_string());
        }
    }
    (wants, flows.unwrap_or(0) * u64::from(iface.rx_queues))
}

/// The pure plan step of `xps` for one interface: CPU j of the list goes to tx queue j mod n, so
/// that every CPU uses one queue; with fewer CPUs than queues, queue i gets CPU i mod m.
pub fn desired_xps(
    field: &str,
    iface: &InterfaceFacts,
    xps: &Xps,
    online: &BTreeSet<u32>,
) -> Wants {
    let mut wants = Wants::default();
    let list: Vec<u32> = match cpus(field, &xps.cpus, online) {
        Ok(set) if !set.is_empty() => set.into_iter().collect(),
        Ok(_) => {
            wants.refuse(
                Kind::XpsCpus.as_str(),
                &iface.name,
                format!("{field}: cpus is empty"),
            );
            return wants;
        }
        Err(e) => {
            wants.refuse(Kind::XpsCpus.as_str(), &iface.name, e);
            return wants;
        }
    };
    let n = iface.tx_queues as usize;
    if n == 0 {
        wants.refuse(
            Kind::XpsCpus.as_str(),
            &iface.name,
            format!("{field}: {} has no tx queues", iface.name),
        );
        return wants;
    }
    for q in 0..n {
        let set: BTreeSet<u32> = if list.len() >= n {
            list.iter()
                .enumerate()
                .filter(|(j, _)| j % n == q)
                .map(|(_, c)| *c)
                .collect()
        } else {
            [list[q % list.len()]].into()
        };
        wants.set(
            Setting::new(Kind::XpsCpus, format!("{}/tx-{q}", iface.name)),
            cpus_to_mask(&set),
        );
    }
    wants
}

/// The value of `net.core.rps_sock_flow_entries` for a total of flow entries: rounded up to a
/// power of two, as the kernel rounds it.
pub fn sock_flow_entries(total: u64) -> String {
    if total == 0 {
        "0".into()
    } else {
        total.next_power_of_two().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let roots = Roots::new("/p".as_ref(), "/s".as_ref());
        assert_eq!(
            path(&roots, Kind::RpsCpus, "eth0/rx-3").ok(),
            Some(PathBuf::from("/s/class/net/eth0/queues/rx-3/rps_cpus"))
        );
        assert_eq!(
            path(&roots, Kind::XpsCpus, "eth0/tx-0").ok(),
            Some(PathBuf::from("/s/class/net/eth0/queues/tx-0/xps_cpus"))
        );
        for (kind, bad) in [
            (Kind::RpsCpus, "eth0/tx-0"),
            (Kind::XpsCpus, "eth0/rx-0"),
            (Kind::RpsCpus, "../rx-0"),
            (Kind::RpsCpus, "eth0/rx-"),
            (Kind::RpsCpus, "eth0"),
            (Kind::Sysctl, "eth0/rx-0"),
        ] {
            assert!(path(&roots, kind, bad).is_err(), "{kind:?} {bad}");
        }
    }

    fn iface(rx: u32, tx: u32) -> InterfaceFacts {
        InterfaceFacts {
            name: "eth0".into(),
            rx_queues: rx,
            tx_queues: tx,
            ..InterfaceFacts::default()
        }
    }

    fn values(w: &Wants) -> Vec<(String, String, String)> {
        w.settings
            .iter()
            .map(|(s, v)| (s.kind.as_str().to_string(), s.target.clone(), v.clone()))
            .collect()
    }

    #[test]
    fn rps_table() {
        let online: BTreeSet<u32> = (0..8).collect();
        let rps = |cpus: &str, flows: Option<u32>| Rps {
            cpus: cpus.into(),
            flow_entries: flows,
        };
        let (w, total) = desired_rps("rps", &iface(2, 2), &rps("0-3", None), &online);
        assert_eq!(
            values(&w),
            [
                ("rpsCpus".into(), "eth0/rx-0".into(), "f".into()),
                ("rpsCpus".into(), "eth0/rx-1".into(), "f".into()),
            ]
        );
        assert_eq!(total, 0);
        let (w, total) = desired_rps("rps", &iface(2, 2), &rps("1", Some(1000)), &online);
        assert_eq!(w.settings.len(), 4);
        assert_eq!(w.settings[1].1, "1024");
        assert_eq!(total, 2048);
        assert_eq!(sock_flow_entries(total), "2048");
        assert_eq!(sock_flow_entries(3000), "4096");
        let (w, total) = desired_rps("rps", &iface(1, 1), &rps("0", Some(0)), &online);
        assert_eq!(w.settings[1].1, "0");
        assert_eq!(total, 0);
        let (w, _) = desired_rps("rps", &iface(1, 1), &rps("7-9", None), &online);
        assert!(
            w.refused[0].message.contains("CPUs 8-9 are not online"),
            "{w:?}"
        );
        let (w, _) = desired_rps("rps", &iface(0, 0), &rps("1", None), &online);
        assert!(w.refused[0].message.contains("no rx queues"), "{w:?}");
    }

    #[test]
    fn xps_table() {
        let online: BTreeSet<u32> = (0..8).collect();
        let xps = |cpus: &str| Xps { cpus: cpus.into() };
        let masks = |w: Wants| w.settings.into_iter().map(|(_, v)| v).collect::<Vec<_>>();
        // More CPUs than queues: each CPU on one queue.
        assert_eq!(
            masks(desired_xps("xps", &iface(1, 4), &xps("0-7"), &online)),
            ["11", "22", "44", "88"]
        );
        // Fewer CPUs than queues: queues share CPUs.
        assert_eq!(
            masks(desired_xps("xps", &iface(1, 3), &xps("2,5"), &online)),
            ["4", "20", "4"]
        );
        let w = desired_xps("xps", &iface(1, 1), &xps("8"), &online);
        assert!(w.refused[0].message.contains("not online"), "{w:?}");
    }
}
