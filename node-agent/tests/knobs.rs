//! Every host knob of the agent (hugepages, hugetlbfs, sysctls, IRQ affinity, RPS/XPS, DPDK
//! binding) against fake /proc and /sys trees with a fake kernel behind them: a kernel that
//! rounds flow counts, normalizes CPU lists and masks, allocates at most a fixed number of
//! hugepages, rebinds PCI devices on driver_override + unbind + drivers_probe (the netdev goes
//! and comes back), and records hugetlbfs mounts in mountinfo.
//!
//! Laws: apply then revert leaves every file and link byte for byte as it was (also as a
//! property over random specs); a kill at any write ends, after recovery, fully applied or
//! fully reverted, and touches no mount the goal keeps; refusals (the default-route interface,
//! no vfio-pci) change nothing.
//!
//! Mountinfo is compared as the mounts it lists, not as its line order (see
//! [`mounts_by_mount_point`]): a mount that a transaction took away and its undo put back is a
//! new mount, which a real kernel lists after every older one.

mod common;

use common::{killed, Killed};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::panic;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hoststack_agent::appliers;
use hoststack_agent::cpus::{cpus_to_mask, format_list, mask_cpus, parse_list};
use hoststack_agent::failures::SpecGeneration;
use hoststack_agent::hooks::Hooks;
use hoststack_agent::host::files::write_existing;
use hoststack_agent::host::{Files, Host, Mounts, Roots};
use hoststack_agent::intent::Intent;
use hoststack_agent::journal::{Journal, JournalStore};
use hoststack_agent::model::{Kind, Reading};
use hoststack_agent::reconciler::{Next, Reconciler};
use hoststack_agent::transaction::{Goal, Outcome, Progress, Transactor};
use hoststack_crds::{
    DpdkBinding, HugepageReservation, HugepageSize, InterfaceMatch, InterfaceTuning, IrqAffinity,
    IrqPolicy, ItemResult, ItemState, Mode, NodeConfig, NodeState, NodeTuning, NodeTuningSpec, Rps,
    SysctlValue, Xps,
};
use proptest::prelude::*;

/// CPUs of the fake machine.
const CPUS: u32 = 4;
/// Most hugepages of one pool the fake kernel can allocate.
const HUGEPAGE_LIMIT: u64 = 1000;

/// The files and mounts ports of the fake tree: what sysfs and procfs do with writes, and
/// hugetlbfs mounts recorded in mountinfo.
#[derive(Debug)]
struct FakeKernel {
    sys: PathBuf,
    proc_: PathBuf,
    /// Each PCI device's own driver and its netdev.
    native: BTreeMap<String, (String, String)>,
    /// The agent "dies" (SIGKILL) just before this call to the kernel (1-based; 0: never).
    kill_at: usize,
    calls: AtomicUsize,
    /// Every directory a hugetlbfs was mounted on or unmounted from, in call order (shared by
    /// all kernels of one node).
    mount_calls: Arc<Mutex<Vec<PathBuf>>>,
}

fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc_einval())
}

fn libc_einval() -> i32 {
    22
}

impl FakeKernel {
    /// Counts a call, dying before it when it is the fatal one.
    fn call(&self) {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at {
            panic::panic_any(Killed);
        }
    }

    fn device(&self, pci: &str) -> PathBuf {
        self.sys.join("bus/pci/devices").join(pci)
    }

    fn stash(&self) -> PathBuf {
        self.sys.join("stash")
    }
}

impl Files for FakeKernel {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.call();
        let text = String::from_utf8_lossy(bytes).trim().to_string();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !path.exists() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        match name {
            "smp_affinity_list" => {
                let cpus = parse_list(&text).ok_or_else(einval)?;
                if cpus.is_empty() || cpus.iter().any(|c| *c >= CPUS) {
                    return Err(einval());
                }
                fs::write(path, format!("{}\n", format_list(&cpus)))
            }
            "rps_cpus" | "xps_cpus" => {
                let cpus = mask_cpus(&text).ok_or_else(einval)?;
                if cpus.iter().any(|c| *c >= CPUS) {
                    return Err(einval());
                }
                fs::write(path, format!("{}\n", cpus_to_mask(&cpus)))
            }
            "rps_flow_cnt" => {
                let n: u64 = text.parse().map_err(|_| einval())?;
                let n = if n == 0 { 0 } else { n.next_power_of_two() };
                fs::write(path, format!("{n}\n"))
            }
            "nr_hugepages" => {
                let n: u64 = text.parse().map_err(|_| einval())?;
                fs::write(path, format!("{}\n", n.min(HUGEPAGE_LIMIT)))
            }
            "driver_override" => {
                let v = if text.is_empty() { "(null)" } else { &text };
                fs::write(path, format!("{v}\n"))
            }
            "unbind" => {
                let dev = self.device(&text);
                fs::remove_file(dev.join("driver"))?;
                let (_, netdev) = &self.native[&text];
                let live = self.sys.join("class/net").join(netdev);
                if live.exists() {
                    fs::create_dir_all(self.stash())?;
                    fs::rename(live, self.stash().join(netdev))?;
                }
                Ok(())
            }
            "drivers_probe" => {
                let dev = self.device(&text);
                if dev.join("driver").exists() {
                    return Ok(());
                }
                let over = fs::read_to_string(dev.join("driver_override"))?;
                let (native, netdev) = &self.native[&text];
                let driver = match over.trim() {
                    "(null)" => native.clone(),
                    o => o.to_string(),
                };
                let dir = self.sys.join("bus/pci/drivers").join(&driver);
                if !dir.is_dir() {
                    return Ok(());
                }
                symlink(&dir, dev.join("driver"))?;
                if driver == *native {
                    let stashed = self.stash().join(netdev);
                    if stashed.exists() {
                        fs::rename(stashed, self.sys.join("class/net").join(netdev))?;
                        // Leave no trace of the stash once it is empty.
                        let _ = fs::remove_dir(self.stash());
                    }
                }
                Ok(())
            }
            _ => write_existing(path, bytes),
        }
    }
}

impl Mounts for FakeKernel {
    fn mount_hugetlbfs(&self, dir: &Path, pagesize: &str) -> io::Result<()> {
        self.call();
        self.mount_calls
            .lock()
            .expect("log")
            .push(dir.to_path_buf());
        if !dir.is_dir() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let info = self.proc_.join("self/mountinfo");
        let mut text = fs::read_to_string(&info)?;
        text.push_str(&format!(
            "99 22 0:99 / {} rw,relatime - hugetlbfs none rw,pagesize={pagesize}\n",
            dir.display()
        ));
        fs::write(info, text)
    }

    fn unmount(&self, dir: &Path) -> io::Result<()> {
        self.call();
        self.mount_calls
            .lock()
            .expect("log")
            .push(dir.to_path_buf());
        let info = self.proc_.join("self/mountinfo");
        let text = fs::read_to_string(&info)?;
        let mut lines: Vec<&str> = text.lines().collect();
        let needle = format!(" {} ", dir.display());
        let at = lines
            .iter()
            .rposition(|l| l.contains(&needle))
            .ok_or_else(einval)?;
        lines.remove(at);
        let mut out = lines.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        fs::write(info, out)
    }
}

/// A fake node: procfs, sysfs, a file system root and a state dir, all temporary.
struct FakeNode {
    dir: tempfile::TempDir,
    state: tempfile::TempDir,
    /// The mount points the node's kernels mounted on or unmounted from.
    mount_calls: Arc<Mutex<Vec<PathBuf>>>,
}

fn put(path: &Path, content: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, content).expect("write");
}

/// eth0: virtio at 0000:00:03.0, 2+2 queues, the default route; eth1: ixgbe at 0000:00:04.0,
/// 2+2 queues, on 198.18.0.0/16 where the API server lives; eth2: ixgbe at 0000:00:05.0, 1+1
/// queues, a data NIC.
const NICS: &[(&str, &str, &str, &str, u32)] = &[
    ("eth0", "0000:00:03.0", "virtio-pci", "virtio_net", 30),
    ("eth1", "0000:00:04.0", "ixgbe", "ixgbe", 40),
    ("eth2", "0000:00:05.0", "ixgbe", "ixgbe", 50),
];

impl FakeNode {
    fn new() -> Self {
        Self::with_vfio(true)
    }

    fn with_vfio(vfio: bool) -> Self {
        let node = FakeNode {
            dir: tempfile::tempdir().expect("tempdir"),
            state: tempfile::tempdir().expect("tempdir"),
            mount_calls: Arc::default(),
        };
        let (p, s) = (node.proc_(), node.sys());
        put(&s.join("devices/system/cpu/online"), "0-3\n");
        put(&s.join("devices/system/node/online"), "0-1\n");
        for size in ["hugepages-2048kB", "hugepages-1048576kB"] {
            put(
                &s.join("kernel/mm/hugepages")
                    .join(size)
                    .join("nr_hugepages"),
                "0\n",
            );
            for n in ["node0", "node1"] {
                put(
                    &s.join("devices/system/node")
                        .join(n)
                        .join("hugepages")
                        .join(size)
                        .join("nr_hugepages"),
                    "0\n",
                );
            }
        }
        let mut interrupts = String::from("           CPU0       CPU1       CPU2       CPU3\n");
        let drivers: &[&str] = if vfio {
            &["virtio-pci", "ixgbe", "vfio-pci"]
        } else {
            &["virtio-pci", "ixgbe"]
        };
        for d in drivers {
            put(&s.join("bus/pci/drivers").join(d).join("unbind"), "");
        }
        put(&s.join("bus/pci/drivers_probe"), "");
        for (i, (name, pci, driver, netdriver, irq0)) in NICS.iter().enumerate() {
            let dev = s.join("bus/pci/devices").join(pci);
            put(&dev.join("driver_override"), "(null)\n");
            symlink(s.join("bus/pci/drivers").join(driver), dev.join("driver")).expect("ln");
            let group = s.join("kernel/iommu_groups").join((7 + i).to_string());
            fs::create_dir_all(&group).expect("mkdir");
            symlink(&group, dev.join("iommu_group")).expect("ln");
            let net = s.join("class/net").join(name);
            put(&net.join("mtu"), "1500\n");
            let queues = if *name == "eth2" { 1 } else { 2 };
            let owner = if *netdriver == "virtio_net" {
                // virtio: the netdev's device is virtioN below the PCI function, which owns the
                // MSI IRQs; IRQs are named after virtioN.
                let v = dev.join("virtio0");
                fs::create_dir_all(&v).expect("mkdir");
                symlink(
                    s.join("bus/pci/drivers").join("virtio-pci"),
                    v.join("driver"),
                )
                .ok();
                symlink(&v, net.join("device")).expect("ln");
                "virtio0".to_string()
            } else {
                symlink(&dev, net.join("device")).expect("ln");
                name.to_string()
            };
            for q in 0..queues {
                put(&net.join(format!("queues/rx-{q}/rps_cpus")), "0\n");
                put(&net.join(format!("queues/rx-{q}/rps_flow_cnt")), "0\n");
                put(&net.join(format!("queues/tx-{q}/xps_cpus")), "0\n");
                let names: Vec<String> = if owner == "virtio0" {
                    vec![format!("virtio0-input.{q}"), format!("virtio0-output.{q}")]
                } else {
                    vec![format!("{owner}-TxRx-{q}")]
                };
                for (j, irq_name) in names.iter().enumerate() {
                    let irq = irq0 + 2 * q + j as u32;
                    put(&dev.join("msi_irqs").join(irq.to_string()), "msix\n");
                    put(&p.join(format!("irq/{irq}/smp_affinity_list")), "0-3\n");
                    interrupts.push_str(&format!(
                        " {irq}:  0  0  0  0  PCI-MSIX-{pci}  {q}-edge  {irq_name}\n"
                    ));
                }
            }
            // A config IRQ that is no queue's.
            let cfg = irq0 + 9;
            put(&dev.join("msi_irqs").join(cfg.to_string()), "msix\n");
            put(&p.join(format!("irq/{cfg}/smp_affinity_list")), "0-3\n");
            interrupts.push_str(&format!(
                " {cfg}: 0 0 0 0 PCI-MSIX-{pci} 9-edge {owner}-config\n"
            ));
        }
        // 0000:00:06.0: a network function with no driver and no netdev.
        let bare = s.join("bus/pci/devices/0000:00:06.0");
        put(&bare.join("class"), "0x020000\n");
        put(&bare.join("driver_override"), "(null)\n");
        let group = s.join("kernel/iommu_groups/12");
        fs::create_dir_all(&group).expect("mkdir");
        symlink(&group, bare.join("iommu_group")).expect("ln");
        put(&p.join("interrupts"), &interrupts);
        put(
            &p.join("net/route"),
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
             eth1\t000012C6\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n",
        );
        put(&p.join("net/ipv6_route"), "");
        put(
            &p.join("self/mountinfo"),
            "22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw\n",
        );
        put(&p.join("sys/net/core/rps_sock_flow_entries"), "0\n");
        put(&p.join("sys/net/ipv4/tcp_sack"), "1\n");
        put(&p.join("sys/kernel/osrelease"), "6.18.0-fake\n");
        fs::create_dir_all(node.fs().join("mnt")).expect("mkdir");
        fs::create_dir_all(node.fs().join("dev/vfio")).expect("mkdir");
        node
    }

    fn proc_(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    fn fs(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn read(&self, path: &Path) -> String {
        fs::read_to_string(path).expect("read").trim().to_string()
    }

    fn host(&self) -> Host {
        self.host_killed_at(0)
    }

    /// The host of an agent that dies just before its `kill_at`th kernel call.
    fn host_killed_at(&self, kill_at: usize) -> Host {
        let native = NICS
            .iter()
            .map(|(name, pci, driver, _, _)| {
                (pci.to_string(), (driver.to_string(), name.to_string()))
            })
            .chain([(
                "0000:00:06.0".to_string(),
                ("ixgbe".to_string(), "no-netdev".to_string()),
            )])
            .collect();
        let kernel = FakeKernel {
            sys: self.sys(),
            proc_: self.proc_(),
            native,
            kill_at,
            calls: AtomicUsize::new(0),
            mount_calls: Arc::clone(&self.mount_calls),
        };
        let roots = Roots {
            proc_root: self.proc_(),
            sys_root: self.sys(),
            fs_root: self.fs(),
        };
        let kernel = Arc::new(kernel);
        Host::at(roots)
            .with_files(kernel.clone())
            .with_mounts(kernel)
    }

    fn transactor(&self) -> Transactor {
        Transactor::new(self.host(), JournalStore::new(self.state.path()))
    }

    fn reconciler(&self) -> Reconciler {
        let mut r = Reconciler::new(self.transactor(), Hooks::default());
        r.set_api_server(Some("198.18.0.1".parse().expect("ip")));
        r
    }

    /// Every regular file (its bytes), link (its target) and directory under the tree; the
    /// mountinfo file as [`mounts_by_mount_point`].
    fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
            let mut entries: Vec<PathBuf> = fs::read_dir(dir)
                .expect("readdir")
                .map(|e| e.expect("entry").path())
                .collect();
            entries.sort();
            for path in entries {
                let meta = fs::symlink_metadata(&path).expect("meta");
                if meta.file_type().is_symlink() {
                    let target = fs::read_link(&path).expect("link");
                    out.insert(path, format!("-> {}", target.display()));
                } else if meta.is_dir() {
                    if fs::read_dir(&path).expect("readdir").next().is_some() {
                        walk(&path, out);
                    } else {
                        out.insert(path, "<empty dir>".into());
                    }
                } else {
                    let bytes = fs::read(&path).expect("read");
                    out.insert(path, String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.dir.path(), &mut out);
        if let Some(info) = out.get_mut(&self.proc_().join("self/mountinfo")) {
            *info = mounts_by_mount_point(info);
        }
        out
    }

    /// Takes the list of mount points mounted on or unmounted from since the last call.
    fn take_mount_calls(&self) -> Vec<PathBuf> {
        std::mem::take(&mut *self.mount_calls.lock().expect("log"))
    }

    /// The host directories of the hugetlbfs mount points whose value before a transaction to
    /// `goal` already is the goal's (the desired value, or for a managed one the goal releases,
    /// its original in `journal`): neither that transaction nor the undo of it may mount or
    /// unmount anything there.
    fn mounts_the_goal_keeps(&self, goal: &Goal, journal: &Journal) -> BTreeSet<PathBuf> {
        let host = self.host();
        let released = journal
            .originals
            .iter()
            .filter(|e| !goal.values.contains_key(&e.setting()))
            .map(|e| (e.setting(), e.value.clone()));
        goal.values
            .clone()
            .into_iter()
            .chain(released)
            .filter(|(s, value)| {
                s.kind == Kind::Hugetlbfs
                    && appliers::read(&host, s) == Reading::Value(value.clone())
            })
            .map(|(s, _)| self.fs().join(s.target.trim_start_matches('/')))
            .collect()
    }

    fn journal_is_empty(&self) -> bool {
        JournalStore::new(self.state.path())
            .load()
            .expect("journal")
            .is_empty()
    }
}

/// Mountinfo as the mounts it lists: its lines in a stable order of their mount point (field
/// 5), so that lines of one mount point keep their order (the last one is the mount on top).
///
/// The order of lines across mount points is not host state the agent can keep: the kernel
/// lists mounts in the order they were made, so a hugetlbfs that a transaction unmounted and
/// whose undo (after a kill) mounted it again comes after every other mount — checked on this
/// machine's kernel (6.18) with `unshare -m`: mount A, mount B, umount A, mount A lists B
/// before A. Keeping the old order would take unmounting every later mount too, needless and,
/// for a hugetlbfs in use, destructive. That the agent never does such needless work is
/// checked separately: the kill properties assert it mounts and unmounts nothing where the
/// goal keeps the mount ([`FakeNode::mounts_the_goal_keeps`]).
fn mounts_by_mount_point(mountinfo: &str) -> String {
    let mut lines: Vec<&str> = mountinfo.lines().collect();
    lines.sort_by_key(|line| line.split(' ').nth(4).unwrap_or(""));
    lines.iter().map(|line| format!("{line}\n")).collect()
}

fn node_tuning(config: NodeConfig, mode: Mode) -> NodeTuning {
    NodeTuning::new(
        "node-a",
        NodeTuningSpec {
            tuning: Some("edge".into()),
            revision: Some(config.revision()),
            config: Some(config),
            mode: Some(mode),
            ..NodeTuningSpec::default()
        },
    )
}

fn withdrawn() -> NodeTuning {
    NodeTuning::new("node-a", NodeTuningSpec::default())
}

fn reconcile(r: &mut Reconciler, object: &NodeTuning) -> Outcome {
    let desired = Intent::of(Some(object));
    match r.next(&desired, &SpecGeneration::default()).expect("next") {
        Next::Report(outcome) => outcome,
        Next::Transaction { .. } => r.transact(&desired, &SpecGeneration::default()),
    }
}

fn items<'a>(outcome: &'a Outcome, kind: &str) -> Vec<&'a ItemResult> {
    outcome.items.iter().filter(|i| i.kind == kind).collect()
}

fn item<'a>(outcome: &'a Outcome, kind: &str, target: &str) -> &'a ItemResult {
    outcome
        .items
        .iter()
        .find(|i| i.kind == kind && i.target == target)
        .unwrap_or_else(|| panic!("no item {kind} {target} in {:#?}", outcome.items))
}

fn iface(name: &str) -> InterfaceTuning {
    InterfaceTuning {
        match_: InterfaceMatch {
            name: Some(name.into()),
            ..InterfaceMatch::default()
        },
        ..InterfaceTuning::default()
    }
}

/// A config with every knob this agent implements.
fn everything() -> NodeConfig {
    let mut c = NodeConfig {
        hugepages: vec![
            HugepageReservation {
                size: HugepageSize::Size2Mi,
                count: 512,
                numa_node: None,
                mount_path: Some("/mnt/huge".into()),
            },
            HugepageReservation {
                size: HugepageSize::Size1Gi,
                count: 2,
                numa_node: Some(1),
                mount_path: None,
            },
        ],
        ..NodeConfig::default()
    };
    c.sysctls
        .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
    let mut e0 = iface("eth[01]");
    e0.irq_affinity = Some(IrqAffinity {
        policy: IrqPolicy::Spread,
        cpus: Some("2-3".into()),
        pin: BTreeMap::new(),
    });
    e0.rps = Some(Rps {
        cpus: "0-1".into(),
        flow_entries: Some(1000),
    });
    e0.xps = Some(Xps { cpus: "0-3".into() });
    let mut e2 = iface("eth2");
    e2.dpdk = Some(DpdkBinding::default());
    c.interfaces = vec![e0, e2];
    c
}

#[test]
fn every_knob_applies_verifies_and_reverts_byte_for_byte() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let nt = node_tuning(everything(), Mode::Apply);
    let outcome = reconcile(&mut r, &nt);
    assert_eq!(outcome.state, NodeState::Applied, "{:#?}", outcome);
    let s = node.sys();
    let p = node.proc_();
    // Hugepages and the mount.
    assert_eq!(
        node.read(&s.join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")),
        "512"
    );
    assert_eq!(
        node.read(&s.join("devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages")),
        "2"
    );
    assert!(node
        .read(&p.join("self/mountinfo"))
        .contains("/mnt/huge rw,relatime - hugetlbfs none rw,pagesize=2M"));
    assert_eq!(
        item(&outcome, "hugetlbfs", "/mnt/huge").original.as_deref(),
        Some("absent")
    );
    // Sysctls, including the flow table: 1024 per queue × 4 rx queues.
    assert_eq!(node.read(&p.join("sys/net/ipv4/tcp_sack")), "0");
    assert_eq!(
        node.read(&p.join("sys/net/core/rps_sock_flow_entries")),
        "4096"
    );
    // IRQs of eth0 (virtio, rx and tx per queue) and eth1, spread over 2-3 by queue; config
    // IRQs untouched.
    for (irq, cpus) in [
        (30, "2"),
        (31, "2"),
        (32, "3"),
        (33, "3"),
        (40, "2"),
        (42, "3"),
        (39, "0-3"),
    ] {
        assert_eq!(
            node.read(&p.join(format!("irq/{irq}/smp_affinity_list"))),
            cpus,
            "IRQ {irq}"
        );
    }
    // RPS, RFS, XPS.
    for ifname in ["eth0", "eth1"] {
        let q = s.join("class/net").join(ifname).join("queues");
        assert_eq!(node.read(&q.join("rx-1/rps_cpus")), "3");
        assert_eq!(node.read(&q.join("rx-1/rps_flow_cnt")), "1024");
        assert_eq!(node.read(&q.join("tx-0/xps_cpus")), "5");
        assert_eq!(node.read(&q.join("tx-1/xps_cpus")), "a");
    }
    // DPDK: eth2 bound to vfio-pci, its netdev gone.
    let dev = s.join("bus/pci/devices/0000:00:05.0");
    assert_eq!(
        fs::read_link(dev.join("driver"))
            .expect("link")
            .file_name()
            .expect("name"),
        "vfio-pci"
    );
    assert_eq!(node.read(&dev.join("driver_override")), "vfio-pci");
    assert!(!s.join("class/net/eth2").exists());
    let bound = item(&outcome, "pciDriver", "0000:00:05.0/eth2/ixgbe");
    assert_eq!(bound.original.as_deref(), Some("driver=ixgbe"));
    assert_eq!(
        bound.actual.as_deref(),
        Some("driver=vfio-pci override=vfio-pci")
    );
    assert_eq!(
        bound.message.as_deref(),
        Some("IOMMU group 9; /dev/vfio/9 absent")
    );
    // Kinds in apply order.
    let kinds: Vec<&str> = outcome.items.iter().map(|i| i.kind.as_str()).collect();
    let mut dedup = kinds.clone();
    dedup.dedup();
    assert_eq!(
        dedup,
        [
            "hugepages",
            "hugetlbfs",
            "sysctl",
            "irqAffinity",
            "rpsCpus",
            "rpsFlowCnt",
            "xpsCpus",
            "pciDriver"
        ]
    );

    // A resync finds the host settled, although eth2's netdev is gone: the journal remembers it.
    let desired = Intent::of(Some(&nt));
    match r.next(&desired, &SpecGeneration::default()).expect("next") {
        Next::Report(again) => assert_eq!(again.state, NodeState::Applied, "{again:#?}"),
        Next::Transaction { .. } => panic!("a settled host needs no transaction"),
    }
    // A fresh agent (no memory but the journal) agrees.
    let mut fresh = node.reconciler();
    match fresh
        .next(&desired, &SpecGeneration::default())
        .expect("next")
    {
        Next::Report(again) => assert_eq!(again.state, NodeState::Applied, "{again:#?}"),
        Next::Transaction { .. } => panic!("a settled host needs no transaction"),
    }

    let reverted = reconcile(&mut r, &withdrawn());
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:#?}");
    assert!(reverted
        .items
        .iter()
        .all(|i| i.state == ItemState::Reverted));
    assert_eq!(node.snapshot(), pristine);
    assert!(node.journal_is_empty());
}

#[test]
fn a_kernel_that_allocates_fewer_hugepages_fails_the_revision_and_restores_everything() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let mut c = everything();
    c.hugepages[1].count = 5000;
    let outcome = reconcile(&mut r, &node_tuning(c, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Failed);
    let message = outcome.message.clone().expect("message");
    assert!(
        message.contains("hugepages node1/1Gi: asked 5000, got 1000"),
        "{message}"
    );
    assert_eq!(
        item(&outcome, "hugepages", "node1/1Gi").state,
        ItemState::Failed
    );
    assert_eq!(
        item(&outcome, "hugepages", "2Mi").state,
        ItemState::RolledBack
    );
    assert_eq!(node.snapshot(), pristine);
    assert!(node.journal_is_empty());
}

#[test]
fn dpdk_refuses_the_management_interfaces_unless_allowed() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    for (name, reason) in [
        ("eth0", "it carries the default route"),
        (
            "eth1",
            "it carries the route to the API server (198.18.0.1)",
        ),
    ] {
        let mut c = NodeConfig::default();
        c.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
        let mut e = iface(name);
        e.dpdk = Some(DpdkBinding::default());
        c.interfaces.push(e);
        let outcome = reconcile(&mut r, &node_tuning(c.clone(), Mode::Apply));
        assert_eq!(outcome.state, NodeState::Failed, "{outcome:#?}");
        let message = outcome.message.clone().expect("message");
        assert!(
            message.contains(&format!("refusing to bind {name}")),
            "{message}"
        );
        assert!(message.contains(reason), "{message}");
        assert!(message.contains("allowManagementInterface"), "{message}");
        assert_eq!(
            item(&outcome, "sysctl", "net.ipv4.tcp_sack").state,
            ItemState::Pending
        );
        assert_eq!(node.snapshot(), pristine, "a refusal changes nothing");

        // Plan mode says the same, as WouldFail.
        let planned = reconcile(&mut r, &node_tuning(c.clone(), Mode::Plan));
        assert_eq!(planned.state, NodeState::Planned);
        assert!(planned
            .items
            .iter()
            .any(|i| i.state == ItemState::WouldFail));

        // Allowed explicitly, it binds; the revert brings the netdev back.
        c.interfaces[0].dpdk = Some(DpdkBinding {
            allow_management_interface: true,
            ..DpdkBinding::default()
        });
        let allowed = reconcile(&mut r, &node_tuning(c, Mode::Apply));
        assert_eq!(allowed.state, NodeState::Applied, "{allowed:#?}");
        assert!(!node.sys().join("class/net").join(name).exists());
        assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
        assert_eq!(node.snapshot(), pristine);
    }
}

#[test]
fn dpdk_without_vfio_pci_fails_clearly() {
    let node = FakeNode::with_vfio(false);
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let mut c = NodeConfig::default();
    let mut e = iface("eth2");
    e.dpdk = Some(DpdkBinding::default());
    c.interfaces.push(e);
    let outcome = reconcile(&mut r, &node_tuning(c, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Failed);
    let message = outcome.message.expect("message");
    assert!(
        message.contains("vfio-pci is not available on this host"),
        "{message}"
    );
    assert_eq!(node.snapshot(), pristine);
}

#[test]
fn plan_mode_covers_every_kind_and_changes_nothing() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let planned = reconcile(&mut r, &node_tuning(everything(), Mode::Plan));
    assert_eq!(planned.state, NodeState::Planned, "{planned:#?}");
    for kind in [
        "hugepages",
        "hugetlbfs",
        "sysctl",
        "irqAffinity",
        "rpsCpus",
        "rpsFlowCnt",
        "xpsCpus",
        "pciDriver",
    ] {
        let of_kind = items(&planned, kind);
        assert!(!of_kind.is_empty(), "{kind}");
        assert!(
            of_kind.iter().all(|i| i.state == ItemState::WouldChange),
            "{kind}: {of_kind:#?}"
        );
    }
    let irq = item(&planned, "irqAffinity", "30");
    assert_eq!(
        (irq.actual.as_deref(), irq.desired.as_deref()),
        (Some("0-3"), Some("2"))
    );
    assert_eq!(node.snapshot(), pristine);
    assert!(node.journal_is_empty());
}

#[test]
fn irq_items_warn_while_irqbalance_runs() {
    let node = FakeNode::new();
    put(&node.proc_().join("777/comm"), "irqbalance\n");
    let mut r = node.reconciler();
    let mut c = NodeConfig::default();
    let mut e = iface("eth1");
    e.irq_affinity = Some(IrqAffinity {
        policy: IrqPolicy::Pin,
        cpus: None,
        pin: [("1".to_string(), 3)].into(),
    });
    c.interfaces.push(e);
    let outcome = reconcile(&mut r, &node_tuning(c, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Applied, "{outcome:#?}");
    let irq = item(&outcome, "irqAffinity", "42");
    assert_eq!(irq.actual.as_deref(), Some("3"));
    assert_eq!(
        irq.message.as_deref(),
        Some(
            "warning: irqbalance is running and may move this IRQ again; stop it or ban the IRQ \
             (IRQBALANCE_BANNED_CPUS/--banirq)"
        ),
        "{irq:?}"
    );
    assert_eq!(
        node.read(&node.proc_().join("irq/40/smp_affinity_list")),
        "0-3"
    );
    reconcile(&mut r, &withdrawn());
}

#[test]
fn interface_entries_that_match_nothing_fail_with_the_interfaces_there_are() {
    let node = FakeNode::new();
    let mut r = node.reconciler();
    let mut c = NodeConfig::default();
    let mut e = InterfaceTuning::default();
    e.match_.driver = Some("mlx5_core".into());
    e.rps = Some(Rps {
        cpus: "1".into(),
        flow_entries: None,
    });
    c.interfaces.push(e);
    let outcome = reconcile(&mut r, &node_tuning(c, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Failed);
    assert_eq!(
        item(&outcome, "interfaces", "interfaces[0]")
            .message
            .as_deref(),
        Some("interfaces[0]: match driver=mlx5_core matched no interface (have: eth0, eth1, eth2)")
    );
}

// --- Properties over random specs. ---

fn kill_after(n: usize) -> impl FnMut(Progress<'_>) {
    let mut writes = 0;
    move |progress| {
        if !matches!(progress, Progress::Wrote { .. }) {
            return;
        }
        writes += 1;
        if writes == n {
            panic::panic_any(Killed);
        }
    }
}

/// The hugetlbfs mount points of a mountinfo, in its line order.
fn hugetlbfs_mount_points(mountinfo: &str) -> Vec<String> {
    mountinfo
        .lines()
        .filter(|line| line.contains(" - hugetlbfs "))
        .filter_map(|line| line.split(' ').nth(4))
        .filter_map(|point| Path::new(point).file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_kill_after_unmounting_one_of_two_mounts_puts_it_back_and_leaves_the_other_alone() {
    // The case proptest found (knobs.proptest-regressions): the host has /mnt/huge1g and then
    // /mnt/huge2m mounted; the next revision keeps only /mnt/huge2m, and the agent dies right
    // after unmounting /mnt/huge1g (its first write).
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let mount = |size, path: &str| HugepageReservation {
        size,
        count: 1,
        numa_node: None,
        mount_path: Some(path.into()),
    };
    let both = NodeConfig {
        hugepages: vec![
            mount(HugepageSize::Size2Mi, "/mnt/huge2m"),
            mount(HugepageSize::Size1Gi, "/mnt/huge1g"),
        ],
        ..NodeConfig::default()
    };
    let applied = reconcile(&mut r, &node_tuning(both, Mode::Apply));
    assert_eq!(applied.state, NodeState::Applied, "{applied:#?}");
    let info = node.proc_().join("self/mountinfo");
    assert_eq!(
        hugetlbfs_mount_points(&node.read(&info)),
        ["huge1g", "huge2m"]
    );
    let before = node.snapshot();
    let journal = JournalStore::new(node.state.path())
        .load()
        .expect("journal");

    let one = NodeConfig {
        hugepages: vec![mount(HugepageSize::Size2Mi, "/mnt/huge2m")],
        ..NodeConfig::default()
    };
    let desired = Intent::of(Some(&node_tuning(one, Mode::Apply)));
    let goal = r.expand(&desired).expect("expand").goal;
    let kept = node.mounts_the_goal_keeps(&goal, &journal);
    assert_eq!(kept, BTreeSet::from([node.fs().join("mnt/huge2m")]));
    node.take_mount_calls();
    let transactor = node.transactor();
    assert!(killed(|| {
        let _ = transactor.execute(&goal, &mut kill_after(1));
    }));
    assert!(!node.fs().join("mnt/huge1g").exists());

    assert!(node.transactor().recover(&mut |_| {}).expect("recover"));
    // /mnt/huge1g went and came back; /mnt/huge2m was never touched.
    let huge1g = node.fs().join("mnt/huge1g");
    assert_eq!(node.take_mount_calls(), [huge1g.clone(), huge1g]);
    assert_eq!(node.snapshot(), before);
    // The mount made again is listed last, as a kernel lists a new mount.
    assert_eq!(
        hugetlbfs_mount_points(&node.read(&info)),
        ["huge2m", "huge1g"]
    );

    assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
    assert_eq!(node.snapshot(), pristine);
    assert!(node.journal_is_empty());
}

/// A CPU list of the fake machine (non-empty).
fn cpu_list() -> impl Strategy<Value = String> {
    prop::collection::btree_set(0..CPUS, 1..=CPUS as usize)
        .prop_map(|set: BTreeSet<u32>| format_list(&set))
}

/// A random spec over every knob.
fn spec() -> impl Strategy<Value = NodeConfig> {
    let hugepages = prop::collection::vec(
        (
            prop::sample::select(vec![HugepageSize::Size2Mi, HugepageSize::Size1Gi]),
            0u32..1500,
            prop::option::of(0u32..2),
            any::<bool>(),
        ),
        0..3,
    );
    let interface = (
        prop::sample::select(vec!["eth0", "eth1", "eth*"]),
        prop::option::of((
            any::<bool>(),
            cpu_list(),
            prop::collection::btree_map(0u32..2, 0..CPUS, 0..3),
        )),
        prop::option::of((cpu_list(), prop::option::of(0u32..3000))),
        prop::option::of(cpu_list()),
    );
    (
        hugepages,
        prop::collection::vec(interface, 0..3),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["0", "1"])),
    )
        .prop_map(|(hp, ifs, dpdk, sack)| {
            let mut c = NodeConfig::default();
            for (size, count, node, mount) in hp {
                c.hugepages.push(HugepageReservation {
                    size,
                    count: count.min(HUGEPAGE_LIMIT as u32),
                    numa_node: node,
                    mount_path: mount.then(|| match size {
                        HugepageSize::Size2Mi => "/mnt/huge2m".to_string(),
                        HugepageSize::Size1Gi => "/mnt/huge1g".to_string(),
                    }),
                });
            }
            for (name, irq, rps, xps) in ifs {
                let mut e = iface(name);
                e.irq_affinity = irq.map(|(spread, cpus, pin)| IrqAffinity {
                    policy: if spread {
                        IrqPolicy::Spread
                    } else {
                        IrqPolicy::Pin
                    },
                    cpus: Some(cpus),
                    pin: pin.into_iter().map(|(q, c)| (q.to_string(), c)).collect(),
                });
                e.rps = rps.map(|(cpus, flow_entries)| Rps { cpus, flow_entries });
                e.xps = xps.map(|cpus| Xps { cpus });
                c.interfaces.push(e);
            }
            if dpdk {
                let mut e = iface("eth2");
                e.dpdk = Some(DpdkBinding::default());
                c.interfaces.push(e);
            }
            if let Some(v) = sack {
                c.sysctls
                    .insert("net.ipv4.tcp_sack".into(), SysctlValue(v.into()));
            }
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn apply_then_revert_leaves_every_file_and_link_as_it_was(r1 in spec(), r2 in spec()) {
        let node = FakeNode::new();
        let pristine = node.snapshot();
        let mut r = node.reconciler();
        let first = reconcile(&mut r, &node_tuning(r1.clone(), Mode::Apply));
        // Random specs may be refused (two entries setting one queue differently); a refusal
        // changes nothing.
        if first.state != NodeState::Applied {
            prop_assert_eq!(first.state, NodeState::Failed);
            prop_assert_eq!(node.snapshot(), pristine.clone());
        }
        reconcile(&mut r, &node_tuning(r2, Mode::Apply));
        prop_assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
        prop_assert_eq!(node.snapshot(), pristine);
        prop_assert!(node.journal_is_empty());
    }

    #[test]
    fn a_kill_at_any_write_ends_fully_applied_or_fully_reverted(
        r1 in spec(),
        r2 in spec(),
        kill_at in 1usize..40,
        withdraw in any::<bool>(),
    ) {
        let node = FakeNode::new();
        let pristine = node.snapshot();
        let mut r = node.reconciler();
        reconcile(&mut r, &node_tuning(r1, Mode::Apply));
        let before = node.snapshot();
        let journal_before = JournalStore::new(node.state.path()).load().expect("journal");

        let next = if withdraw { withdrawn() } else { node_tuning(r2, Mode::Apply) };
        let desired = Intent::of(Some(&next));
        let goal: Goal = r.expand(&desired).expect("expand").goal;
        let blocked = !r.expand(&desired).expect("expand").refused.is_empty();
        if !blocked {
            let kept = node.mounts_the_goal_keeps(&goal, &journal_before);
            node.take_mount_calls();
            let transactor = node.transactor();
            killed(|| {
                let _ = transactor.execute(&goal, &mut kill_after(kill_at));
            });
            // The restarted agent recovers first.
            node.transactor().recover(&mut |_| {}).expect("recover");
            let touched = node.take_mount_calls();
            prop_assert!(touched.iter().all(|dir| !kept.contains(dir)), "{:?} {:?}", touched, kept);
            let journal = JournalStore::new(node.state.path()).load().expect("journal");
            prop_assert!(journal.transaction.is_none());
            if journal == journal_before {
                prop_assert_eq!(node.snapshot(), before);
            } else {
                // It finished: the host is settled on the new goal.
                let prepared = node.transactor().prepare(&goal, &mut |_| {}).expect("prepare");
                prop_assert!(prepared.is_settled(&goal), "{:?}", prepared.plan);
            }
        }
        prop_assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
        prop_assert_eq!(node.snapshot(), pristine);
    }

    #[test]
    fn a_kill_inside_any_kernel_call_sequence_ends_fully_applied_or_fully_reverted(
        r1 in spec(),
        r2 in spec(),
        kill_at in 1usize..60,
        withdraw in any::<bool>(),
    ) {
        // Finer than a kill after a setting's write: the agent dies before any single kernel
        // call, e.g. between driver_override and unbind, or between mkdir and mount.
        let node = FakeNode::new();
        let pristine = node.snapshot();
        let mut r = node.reconciler();
        reconcile(&mut r, &node_tuning(r1, Mode::Apply));
        let before = node.snapshot();
        let journal_before = JournalStore::new(node.state.path()).load().expect("journal");

        let next = if withdraw { withdrawn() } else { node_tuning(r2, Mode::Apply) };
        let expanded = r.expand(&Intent::of(Some(&next))).expect("expand");
        if expanded.refused.is_empty() {
            let goal = expanded.goal;
            let kept = node.mounts_the_goal_keeps(&goal, &journal_before);
            node.take_mount_calls();
            let dying = Transactor::new(
                node.host_killed_at(kill_at),
                JournalStore::new(node.state.path()),
            );
            killed(|| {
                let _ = dying.execute(&goal, &mut |_| {});
            });
            node.transactor().recover(&mut |_| {}).expect("recover");
            let touched = node.take_mount_calls();
            prop_assert!(touched.iter().all(|dir| !kept.contains(dir)), "{:?} {:?}", touched, kept);
            let journal = JournalStore::new(node.state.path()).load().expect("journal");
            prop_assert!(journal.transaction.is_none());
            if journal == journal_before {
                prop_assert_eq!(node.snapshot(), before);
            } else {
                let prepared = node.transactor().prepare(&goal, &mut |_| {}).expect("prepare");
                prop_assert!(prepared.is_settled(&goal), "{:?}", prepared.plan);
            }
        }
        prop_assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
        prop_assert_eq!(node.snapshot(), pristine);
    }
}

#[test]
fn dpdk_binds_a_device_without_netdev_selected_by_pci_address() {
    let node = FakeNode::new();
    let pristine = node.snapshot();
    let mut r = node.reconciler();
    let mut c = NodeConfig::default();
    let mut e = InterfaceTuning::default();
    e.match_.pci_address = Some("0000:00:06.0".into());
    e.dpdk = Some(DpdkBinding::default());
    c.interfaces.push(e);
    let outcome = reconcile(&mut r, &node_tuning(c, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Applied, "{outcome:#?}");
    let bound = item(&outcome, "pciDriver", "0000:00:06.0/0000:00:06.0/-");
    assert_eq!(bound.original.as_deref(), Some("driver=none"));
    assert_eq!(
        bound.message.as_deref(),
        Some("IOMMU group 12; /dev/vfio/12 absent")
    );
    let dev = node.sys().join("bus/pci/devices/0000:00:06.0");
    assert_eq!(
        fs::read_link(dev.join("driver"))
            .expect("link")
            .file_name()
            .expect("name"),
        "vfio-pci"
    );
    assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
    assert_eq!(node.snapshot(), pristine);
}

/// A user-space stack's cores leave every queue IRQ and every RPS/XPS mask that names them (the
/// spec's own RPS mask included) as journaled settings, and a revert gives them back byte for
/// byte. IRQs that are no queue's (a device's config IRQ) are left alone.
#[test]
fn a_userspace_stack_takes_its_cores_out_of_the_network_masks_and_revert_gives_them_back() {
    let node = FakeNode::new();
    // XPS of eth2 names every CPU before the tuning.
    let xps = node.sys().join("class/net/eth2/queues/tx-0/xps_cpus");
    put(&xps, "f\n");
    let pristine = node.snapshot();
    let mut config = NodeConfig::default();
    let mut eth1 = iface("eth1");
    eth1.rps = Some(Rps {
        cpus: "0-3".into(),
        flow_entries: None,
    });
    config.interfaces.push(eth1);
    config.userspace_stack = Some(hoststack_crds::UserspaceStack {
        cores: "3".into(),
        interface: "eth1".into(),
        address: "198.18.9.2/24".into(),
        ..hoststack_crds::UserspaceStack::default()
    });
    let mut r = node.reconciler();
    let outcome = reconcile(&mut r, &node_tuning(config, Mode::Apply));
    assert_eq!(outcome.state, NodeState::Applied, "{:?}", outcome.message);
    let affinity = |irq: u32| node.read(&node.proc_().join(format!("irq/{irq}/smp_affinity_list")));
    for irq in [30, 31, 32, 33, 40, 42, 50] {
        assert_eq!(affinity(irq), "0-2", "queue IRQ {irq}");
    }
    for irq in [39, 49, 59] {
        assert_eq!(affinity(irq), "0-3", "config IRQ {irq} is no queue's");
    }
    let cpus = |path: PathBuf| mask_cpus(&node.read(&path)).expect("a mask");
    let queues = node.sys().join("class/net");
    for q in ["rx-0", "rx-1"] {
        let rps = queues.join(format!("eth1/queues/{q}/rps_cpus"));
        assert_eq!(
            cpus(rps),
            [0, 1, 2].into(),
            "the spec's RPS mask without core 3"
        );
    }
    assert_eq!(cpus(xps.clone()), [0, 1, 2].into());
    assert_eq!(
        cpus(queues.join("eth0/queues/rx-0/rps_cpus")),
        BTreeSet::new()
    );
    let irq40 = item(&outcome, "irqAffinity", "40");
    assert_eq!(irq40.original.as_deref(), Some("0-3"));
    assert_eq!(irq40.state, ItemState::Applied);
    assert_eq!(
        item(&outcome, "xpsCpus", "eth2/tx-0").original.as_deref(),
        Some("f")
    );

    assert_eq!(reconcile(&mut r, &withdrawn()).state, NodeState::Reverted);
    assert_eq!(node.snapshot(), pristine);
}
