//! The IRQ affinity applier: the CPUs that handle one interrupt, written to
//! `<proc-root>/irq/N/smp_affinity_list` in the kernel's list format (`0-3,8`).
//!
//! Discovery finds each queue's IRQs of an interface: the IRQs the device owns
//! (`<sys>/class/net/IF/device/msi_irqs`, or its PCI parent's for virtio) named in
//! `<proc-root>/interrupts` after the interface or its device with a queue number
//! (`virtio0-input.0`, `virtio0-output.0`, `eth0-TxRx-0`, `eth0-rx-1`). [`desired`] then places
//! them: `Spread` gives queue i the CPU at position i mod n of the list, `Pin` the CPU of the
//! explicit map. irqbalance moves IRQs behind the agent's back, so status warns when it runs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::Path;

use hoststack_crds::{IrqAffinity, IrqPolicy};

use super::Applier;
use crate::cpus::{format_list, parse_list};
use crate::host::{Files, Host, Port, Roots};
use crate::model::{invalid, read_value, same_value, Kind, Reading, Setting, Wants};
use crate::sysfs::{dir_names, link_name, plain_name};

/// The applier of [`Kind::IrqAffinity`]: CPU lists compare as sets of CPUs.
#[derive(Clone, Copy, Debug)]
pub struct Affinity;

impl Applier for Affinity {
    fn ports(&self) -> &'static [Port] {
        &[Port::Files]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host.roots(), target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host.roots(), host.files()?, target, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        match (parse_list(a), parse_list(b)) {
            (Some(x), Some(y)) => x == y,
            _ => same_value(a, b),
        }
    }
}

/// One queue interrupt of an interface.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueIrq {
    /// The queue index.
    pub queue: u32,
    /// The IRQ number.
    pub irq: u32,
    /// Its name in /proc/interrupts.
    pub name: String,
}

/// The queue number in an interrupt's name, when the name belongs to one of `owners` (the
/// interface's name, or its device's such as `virtio0`) and names a queue:
/// `virtio0-input.3`, `virtio0-output.3`, `eth0-TxRx-3`, `eth0-rx-3`, `eth0-3`.
pub fn queue_of(name: &str, owners: &[&str]) -> Option<u32> {
    let rest = owners
        .iter()
        .find_map(|o| name.strip_prefix(o)?.strip_prefix('-'))?;
    let digits_at = rest
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    let (head, digits) = rest.split_at(digits_at);
    if digits.is_empty() {
        return None;
    }
    let queue_word = head.is_empty()
        || head.ends_with('.') && !head[..head.len() - 1].contains(['.', '-'])
        || head.ends_with('-') && !head[..head.len() - 1].contains(['.', '-']);
    queue_word.then(|| digits.parse().ok()).flatten()
}

/// Parses /proc/interrupts into (IRQ, name) pairs; lines without a number (NMI, LOC) are
/// skipped.
pub fn parse_interrupts(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|line| {
            let (irq, rest) = line.trim_start().split_once(':')?;
            let irq: u32 = irq.parse().ok()?;
            let name = rest.split_whitespace().last()?;
            Some((irq, name.to_string()))
        })
        .collect()
}

/// The queue IRQs of interface `iface`, ordered by queue then IRQ.
pub fn discover(roots: &Roots, iface: &str) -> Vec<QueueIrq> {
    if !plain_name(iface) {
        return Vec::new();
    }
    let device = roots.sys_root.join("class/net").join(iface).join("device");
    let mut owned: BTreeSet<u32> = BTreeSet::new();
    let mut msi_known = false;
    let parent = fs::canonicalize(&device)
        .ok()
        .and_then(|d| d.parent().map(Path::to_path_buf));
    for dir in [Some(device.clone()), parent].into_iter().flatten() {
        let msi = dir.join("msi_irqs");
        if msi.is_dir() {
            msi_known = true;
            owned.extend(dir_names(&msi).iter().filter_map(|n| n.parse::<u32>().ok()));
        }
    }
    let device_name = link_name(&device);
    let mut owners = vec![iface];
    if let Some(d) = device_name.as_deref() {
        owners.push(d);
    }
    let text = fs::read_to_string(roots.proc_root.join("interrupts")).unwrap_or_default();
    let mut out: Vec<QueueIrq> = parse_interrupts(&text)
        .into_iter()
        .filter(|(irq, _)| !msi_known || owned.contains(irq))
        .filter_map(|(irq, name)| {
            let queue = queue_of(&name, &owners)?;
            Some(QueueIrq { queue, irq, name })
        })
        .collect();
    out.sort();
    out
}

/// Whether a process named irqbalance runs (`<proc-root>/N/comm`).
pub fn irqbalance_running(proc_root: &Path) -> bool {
    dir_names(proc_root)
        .iter()
        .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        .any(|pid| {
            fs::read_to_string(proc_root.join(pid).join("comm"))
                .is_ok_and(|c| c.trim() == "irqbalance")
        })
}

/// The `smp_affinity_list` file of an IRQ.
fn path(roots: &Roots, target: &str) -> Result<std::path::PathBuf, String> {
    target
        .parse::<u32>()
        .map(|n| {
            roots
                .proc_root
                .join("irq")
                .join(n.to_string())
                .join("smp_affinity_list")
        })
        .map_err(|_| format!("IRQ {target:?} is not a number"))
}

/// Reads an IRQ's CPU list.
pub fn read(roots: &Roots, target: &str) -> Reading {
    match path(roots, target) {
        Ok(p) => read_value(&p, &format!("no IRQ {target} on this host")),
        Err(e) => Reading::Unreadable(e),
    }
}

/// Writes an IRQ's CPU list.
pub fn write(roots: &Roots, files: &dyn Files, target: &str, value: &str) -> io::Result<()> {
    let p = path(roots, target).map_err(invalid)?;
    files.write(&p, format!("{}\n", value.trim()).as_bytes())
}

/// The pure plan step of `irqAffinity` for one interface: the CPU list of each queue IRQ.
/// Refused: no queue IRQs (a virtual interface has none), a Spread without CPUs, a Pin of a queue
/// without IRQs, CPUs that are not online.
pub fn desired(
    field: &str,
    iface: &str,
    affinity: &IrqAffinity,
    irqs: &[QueueIrq],
    online: &BTreeSet<u32>,
) -> Wants {
    let mut wants = Wants::default();
    let kind = Kind::IrqAffinity.as_str();
    if irqs.is_empty() {
        wants.refuse(
            kind,
            iface,
            format!("{field}: {iface} has no queue interrupts (a virtual interface has none)"),
        );
        return wants;
    }
    let offline = |cpus: &BTreeSet<u32>| -> Option<String> {
        let bad: BTreeSet<u32> = cpus.difference(online).copied().collect();
        (!bad.is_empty()).then(|| {
            format!(
                "{field}: CPUs {} are not online (online: {})",
                format_list(&bad),
                format_list(online)
            )
        })
    };
    let mut place: BTreeMap<u32, u32> = BTreeMap::new();
    match affinity.policy {
        IrqPolicy::Spread => {
            let Some(cpus) = affinity.cpus.as_deref().and_then(parse_list) else {
                wants.refuse(
                    kind,
                    iface,
                    format!("{field}: Spread needs a CPU list in cpus"),
                );
                return wants;
            };
            if let Some(e) = offline(&cpus)
                .or_else(|| cpus.is_empty().then(|| format!("{field}: cpus is empty")))
            {
                wants.refuse(kind, iface, e);
                return wants;
            }
            let list: Vec<u32> = cpus.into_iter().collect();
            for q in irqs {
                place.insert(q.irq, list[q.queue as usize % list.len()]);
            }
        }
        IrqPolicy::Pin => {
            let cpus: BTreeSet<u32> = affinity.pin.values().copied().collect();
            if let Some(e) = offline(&cpus) {
                wants.refuse(kind, iface, e);
                return wants;
            }
            for (queue, cpu) in &affinity.pin {
                let Ok(queue) = queue.parse::<u32>() else {
                    wants.refuse(
                        kind,
                        iface,
                        format!("{field}: pin key {queue:?} is not a queue number"),
                    );
                    continue;
                };
                let of_queue: Vec<&QueueIrq> = irqs.iter().filter(|q| q.queue == queue).collect();
                if of_queue.is_empty() {
                    wants.refuse(
                        kind,
                        iface,
                        format!("{field}: {iface} has no interrupt for queue {queue}"),
                    );
                }
                for q in of_queue {
                    place.insert(q.irq, *cpu);
                }
            }
        }
    }
    for (irq, cpu) in place {
        wants.set(
            Setting::new(Kind::IrqAffinity, irq.to_string()),
            cpu.to_string(),
        );
    }
    wants
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        let table: &[(&str, &[&str], Option<u32>)] = &[
            ("virtio2-input.0", &["eth0", "virtio2"], Some(0)),
            ("virtio2-output.3", &["eth0", "virtio2"], Some(3)),
            ("virtio2-config", &["eth0", "virtio2"], None),
            ("virtio3-rx", &["virtio3"], None),
            ("virtio12-input.0", &["virtio1"], None),
            ("eth0-TxRx-7", &["eth0"], Some(7)),
            ("eth0-rx-1", &["eth0"], Some(1)),
            ("eth0-2", &["eth0"], Some(2)),
            ("eth1-TxRx-0", &["eth0"], None),
            ("eth0-a-b-1", &["eth0"], None),
        ];
        for (name, owners, want) in table {
            assert_eq!(queue_of(name, owners), *want, "{name}");
        }
        let text = "           CPU0       CPU1\n 38:  0  1  PCI-MSIX-0000:00:03.0  1-edge  virtio2-input.0\nNMI:  0  0  Non-maskable interrupts\n";
        assert_eq!(
            parse_interrupts(text),
            vec![(38, "virtio2-input.0".to_string())]
        );
    }

    fn q(queue: u32, irq: u32) -> QueueIrq {
        QueueIrq {
            queue,
            irq,
            name: format!("q{queue}"),
        }
    }

    #[test]
    fn desired_table() {
        let online: BTreeSet<u32> = (0..4).collect();
        // Two queues, each with an rx and a tx IRQ.
        let irqs = vec![q(0, 30), q(0, 31), q(1, 32), q(1, 33), q(2, 34)];
        let spread = |cpus: &str| IrqAffinity {
            policy: IrqPolicy::Spread,
            cpus: Some(cpus.into()),
            pin: BTreeMap::new(),
        };
        let pin = |m: &[(&str, u32)]| IrqAffinity {
            policy: IrqPolicy::Pin,
            cpus: None,
            pin: m.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        };
        type Case<'a> = (
            &'a str,
            IrqAffinity,
            &'a [QueueIrq],
            Vec<(u32, u32)>,
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                "spread round-robin by queue",
                spread("2-3"),
                &irqs,
                vec![(30, 2), (31, 2), (32, 3), (33, 3), (34, 2)],
                &[],
            ),
            (
                "spread over one CPU",
                spread("1"),
                &irqs[..2],
                vec![(30, 1), (31, 1)],
                &[],
            ),
            (
                "pin some queues",
                pin(&[("1", 0)]),
                &irqs,
                vec![(32, 0), (33, 0)],
                &[],
            ),
            (
                "pin a queue without IRQs",
                pin(&[("9", 0), ("0", 1)]),
                &irqs,
                vec![(30, 1), (31, 1)],
                &["no interrupt for queue 9"],
            ),
            (
                "offline CPUs",
                spread("2-5"),
                &irqs,
                vec![],
                &["CPUs 4-5 are not online"],
            ),
            (
                "spread without CPUs",
                IrqAffinity::default(),
                &irqs,
                vec![],
                &["Spread needs a CPU list"],
            ),
            (
                "no IRQs",
                spread("0"),
                &[],
                vec![],
                &["has no queue interrupts"],
            ),
        ];
        for (name, aff, irqs, want, refused) in cases {
            let w = desired("interfaces[0].irqAffinity", "eth0", &aff, irqs, &online);
            let want: Vec<(Setting, String)> = want
                .into_iter()
                .map(|(i, c)| {
                    (
                        Setting::new(Kind::IrqAffinity, i.to_string()),
                        c.to_string(),
                    )
                })
                .collect();
            assert_eq!(w.settings, want, "{name}");
            assert_eq!(w.refused.len(), refused.len(), "{name}: {:?}", w.refused);
            for (r, text) in w.refused.iter().zip(refused) {
                assert!(r.message.contains(text), "{name}: {r:?}");
            }
        }
    }

    #[test]
    fn discovery_on_a_fake_tree() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Roots::new(&dir.path().join("proc"), &dir.path().join("sys"));
        let pci = roots.sys_root.join("devices/pci0000:00/0000:00:03.0");
        fs::create_dir_all(pci.join("virtio2")).expect("mkdir");
        fs::create_dir_all(pci.join("msi_irqs")).expect("mkdir");
        for irq in ["37", "38", "39"] {
            fs::write(pci.join("msi_irqs").join(irq), "msix\n").expect("w");
        }
        fs::create_dir_all(roots.sys_root.join("class/net/eth0")).expect("mkdir");
        symlink(
            pci.join("virtio2"),
            roots.sys_root.join("class/net/eth0/device"),
        )
        .expect("ln");
        fs::create_dir_all(&roots.proc_root).expect("mkdir");
        fs::write(
            roots.proc_root.join("interrupts"),
            "  CPU0 CPU1\n 37: 0 0 PCI-MSIX 0-edge virtio2-config\n 38: 0 0 PCI-MSIX 1-edge virtio2-input.0\n 39: 0 0 PCI-MSIX 2-edge virtio2-output.0\n 40: 0 0 PCI-MSIX 1-edge virtio2-input.1\n",
        )
        .expect("w");
        let found = discover(&roots, "eth0");
        assert_eq!(
            found.iter().map(|q| (q.queue, q.irq)).collect::<Vec<_>>(),
            vec![(0, 38), (0, 39)],
            "40 is not among the device's MSI IRQs"
        );
        assert!(discover(&roots, "lo").is_empty());
        assert!(!irqbalance_running(&roots.proc_root));
        fs::create_dir_all(roots.proc_root.join("4242")).expect("mkdir");
        fs::write(roots.proc_root.join("4242/comm"), "irqbalance\n").expect("w");
        assert!(irqbalance_running(&roots.proc_root));
    }
}
