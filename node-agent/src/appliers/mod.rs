//! Appliers: one module per kind of host setting. Each reads and writes the current value of one
//! setting; the transaction decides what to write and in which order.
//!
//! Every setting is a [`Setting`] (a [`Kind`] and a target within it) whose value is a string,
//! so the journal, the plan and the undo treat all kinds alike. The kinds are declared in the
//! agent's apply order (hugepages, sysctls, NIC, IRQ affinity, RPS/XPS, nftables, XDP, DPDK
//! binding): the plan sets settings in [`Setting`] order, and a revert restores them in reverse.
//!
//! Reads of files go straight to the files under the configured roots, reads over netlink or
//! bpf (NIC, nftables, XDP) go through the [`Kernel`], and every change goes through the
//! [`Kernel`], so that tests can put a fake kernel (one that behaves like sysfs: rounds,
//! refuses, rebinds) behind a fake tree.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub mod dpdk;
pub mod firewall;
pub mod hugepages;
pub mod hugetlbfs;
pub mod irq;
pub mod matching;
pub mod nic;
pub mod rps;
pub mod sysctl;
pub mod xdp;

/// The kinds of host setting the agent manages, in apply order; the journal records each value
/// with its kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A hugepage count: `2Mi` (system-wide) or `node0/2Mi` (one NUMA node).
    #[serde(rename = "hugepages")]
    Hugepages,
    /// A hugetlbfs mount, named by its mount point.
    #[serde(rename = "hugetlbfs")]
    Hugetlbfs,
    /// A kernel parameter under `<proc-root>/sys`, named by its dotted key.
    #[serde(rename = "sysctl")]
    Sysctl,
    /// A channel count of an interface, named `IF/combined`, `IF/rx` or `IF/tx`.
    #[serde(rename = "channels")]
    Channels,
    /// An offload feature of an interface (`on`/`off`), named `IF/<kernel feature name>`.
    #[serde(rename = "offload")]
    Offload,
    /// A ring size of an interface, named `IF/rx` or `IF/tx`.
    #[serde(rename = "ring")]
    Ring,
    /// The MTU of an interface, named by the interface.
    #[serde(rename = "mtu")]
    Mtu,
    /// The CPUs of one IRQ (`<proc-root>/irq/N/smp_affinity_list`), named by its number.
    #[serde(rename = "irqAffinity")]
    IrqAffinity,
    /// The RPS CPU mask of one rx queue, named `IF/rx-N`.
    #[serde(rename = "rpsCpus")]
    RpsCpus,
    /// The RFS flow count of one rx queue, named `IF/rx-N`.
    #[serde(rename = "rpsFlowCnt")]
    RpsFlowCnt,
    /// The XPS CPU mask of one tx queue, named `IF/tx-N`.
    #[serde(rename = "xpsCpus")]
    XpsCpus,
    /// The agent's nftables table, named `inet/hoststack`; its value describes the whole table
    /// (`absent` when there is none).
    #[serde(rename = "nftables")]
    Nftables,
    /// The source prefixes of an interface's XDP blocklist maps, named by the interface.
    #[serde(rename = "xdpBlocklist")]
    XdpBlocklist,
    /// The XDP program attached to an interface (`none`, `blocklist/native`, ...), named by the
    /// interface.
    #[serde(rename = "xdpProgram")]
    XdpProgram,
    /// The driver a PCI device is bound to, named `ADDR/IF/NETDRIVER`.
    #[serde(rename = "pciDriver")]
    PciDriver,
}

impl Kind {
    /// The name used in status items (`ItemResult.kind`) and in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Hugepages => "hugepages",
            Kind::Hugetlbfs => "hugetlbfs",
            Kind::Sysctl => "sysctl",
            Kind::Channels => "channels",
            Kind::Offload => "offload",
            Kind::Ring => "ring",
            Kind::Mtu => "mtu",
            Kind::IrqAffinity => "irqAffinity",
            Kind::RpsCpus => "rpsCpus",
            Kind::RpsFlowCnt => "rpsFlowCnt",
            Kind::XpsCpus => "xpsCpus",
            Kind::Nftables => "nftables",
            Kind::XdpBlocklist => "xdpBlocklist",
            Kind::XdpProgram => "xdpProgram",
            Kind::PciDriver => "pciDriver",
        }
    }

    /// Whether two values of this kind are the same setting: sysctls compare with whitespace
    /// runs collapsed, CPU lists and masks as sets of CPUs, counts as numbers, the rest exactly
    /// (up to surrounding whitespace).
    pub fn same_value(self, a: &str, b: &str) -> bool {
        match self {
            Kind::Sysctl => same_value(a, b),
            Kind::Channels | Kind::Offload | Kind::Ring | Kind::Mtu => nic::same_value(self, a, b),
            Kind::IrqAffinity => match (crate::cpus::parse_list(a), crate::cpus::parse_list(b)) {
                (Some(x), Some(y)) => x == y,
                _ => same_value(a, b),
            },
            Kind::RpsCpus | Kind::XpsCpus => {
                match (crate::cpus::mask_cpus(a), crate::cpus::mask_cpus(b)) {
                    (Some(x), Some(y)) => x == y,
                    _ => same_value(a, b),
                }
            }
            Kind::Hugepages | Kind::RpsFlowCnt => {
                match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
                    (Ok(x), Ok(y)) => x == y,
                    _ => same_value(a, b),
                }
            }
            Kind::XdpBlocklist => xdp::same_blocklist(a, b),
            Kind::XdpProgram => xdp::same_program(a, b),
            Kind::Hugetlbfs | Kind::PciDriver | Kind::Nftables => same_value(a, b),
        }
    }

    /// Why a write of `wrote` that read back as `read` did not take.
    pub fn mismatch(self, wrote: &str, read: &str) -> String {
        match self {
            Kind::Hugepages => format!(
                "asked {}, got {}: the kernel could not allocate that many pages",
                wrote.trim(),
                read.trim()
            ),
            _ => format!("wrote {wrote:?} but read back {read:?}"),
        }
    }
}

/// One host setting: its kind and its name within that kind (a sysctl's dotted key).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Setting {
    /// Which applier owns it.
    pub kind: Kind,
    /// Its name, e.g. `net.ipv4.tcp_sack`.
    pub target: String,
}

impl Setting {
    /// A setting of `kind` named `target`.
    pub fn new(kind: Kind, target: impl Into<String>) -> Self {
        Setting {
            kind,
            target: target.into(),
        }
    }

    /// A sysctl by its dotted key.
    pub fn sysctl(key: impl Into<String>) -> Self {
        Setting::new(Kind::Sysctl, key)
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.target)
    }
}

/// What reading a setting from the host gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Its current value, as the kernel prints it (without the trailing newline).
    Value(String),
    /// It does not exist on this host; the text says so with the path.
    Missing(String),
    /// It exists but could not be read (or its name is unsafe); the text says why.
    Unreadable(String),
}

/// The calls that change the host. The real one writes files and calls mount(2)/umount(2);
/// tests put a fake kernel behind a fake tree.
pub trait Kernel: fmt::Debug + Send + Sync {
    /// Writes `bytes` to the existing file `path` in one write (never creates it).
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Mounts a hugetlbfs with the given `pagesize` option (e.g. `2M`) on the directory `dir`.
    fn mount_hugetlbfs(&self, dir: &Path, pagesize: &str) -> io::Result<()>;
    /// Unmounts the file system mounted on `dir`.
    fn unmount(&self, dir: &Path) -> io::Result<()>;
    /// The channel counts of interface `iface` (ethtool netlink `CHANNELS_GET`).
    fn nic_channels(&self, iface: &str) -> io::Result<nic::ChannelInfo> {
        Err(nic_unsupported(iface))
    }
    /// Sets channel counts of `iface` (`CHANNELS_SET`).
    fn set_nic_channels(&self, iface: &str, counts: &nic::ChannelCounts) -> io::Result<()> {
        let _ = counts;
        Err(nic_unsupported(iface))
    }
    /// The ring sizes of `iface` (`RINGS_GET`).
    fn nic_rings(&self, iface: &str) -> io::Result<nic::RingInfo> {
        Err(nic_unsupported(iface))
    }
    /// Sets ring sizes of `iface` (`RINGS_SET`).
    fn set_nic_rings(&self, iface: &str, sizes: &nic::RingSizes) -> io::Result<()> {
        let _ = sizes;
        Err(nic_unsupported(iface))
    }
    /// The offload features of `iface` (`STRSET_GET` and `FEATURES_GET`).
    fn nic_features(&self, iface: &str) -> io::Result<nic::Features> {
        Err(nic_unsupported(iface))
    }
    /// Sets the wanted state of the named features of `iface` (`FEATURES_SET`).
    fn set_nic_features(
        &self,
        iface: &str,
        wanted: &std::collections::BTreeMap<String, bool>,
    ) -> io::Result<()> {
        let _ = wanted;
        Err(nic_unsupported(iface))
    }
    /// The MTU of `iface` (rtnetlink `RTM_GETLINK`).
    fn mtu(&self, iface: &str) -> io::Result<u32> {
        Err(nic_unsupported(iface))
    }
    /// Sets the MTU of `iface` (`RTM_SETLINK` with `IFLA_MTU`).
    fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()> {
        let _ = mtu;
        Err(nic_unsupported(iface))
    }
    /// Whether `iface` is administratively up (rtnetlink `RTM_GETLINK`, `IFF_UP`).
    fn link_up(&self, iface: &str) -> io::Result<bool> {
        Err(nic_unsupported(iface))
    }
    /// Sets `iface` administratively up or down (`RTM_SETLINK` changing only `IFF_UP`).
    fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()> {
        let _ = up;
        Err(nic_unsupported(iface))
    }
    /// What is attached to `iface`'s XDP hook (nothing when the interface is gone), and what
    /// hoststack pinned for it in `pins`.
    fn xdp_query(&self, iface: &str, pins: &xdp::Pins) -> io::Result<xdp::XdpState> {
        let _ = (iface, pins);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Loads a built-in program, attaches it to `iface` in `mode` through a BPF link, and pins
    /// link and program in `pins` (the blocklist program uses the maps pinned there, creating
    /// and pinning missing ones empty).
    fn xdp_attach(
        &self,
        iface: &str,
        pins: &xdp::Pins,
        program: xdp::Program,
        mode: xdp::AttachMode,
    ) -> io::Result<()> {
        let _ = (iface, pins, program, mode);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Replaces hoststack's program attached through the link pinned in `pins` by `program`,
    /// atomically (`bpf_link_update`), and pins it in place of the old one.
    fn xdp_replace(&self, pins: &xdp::Pins, program: xdp::Program) -> io::Result<()> {
        let _ = (pins, program);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Unpins the program and link of `pins`, which detaches the program.
    fn xdp_detach(&self, pins: &xdp::Pins) -> io::Result<()> {
        let _ = pins;
        Err(io::ErrorKind::Unsupported.into())
    }
    /// What the blocklist maps pinned in `pins` hold.
    fn xdp_blocklist(&self, pins: &xdp::Pins) -> io::Result<xdp::Blocklist> {
        let _ = pins;
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Creates and pins the blocklist maps in `pins` if needed, and makes them hold exactly
    /// `prefixes`.
    fn xdp_set_blocklist(&self, pins: &xdp::Pins, prefixes: &[xdp::Prefix]) -> io::Result<()> {
        let _ = (pins, prefixes);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Unpins the blocklist maps of `pins`.
    fn xdp_unpin_blocklist(&self, pins: &xdp::Pins) -> io::Result<()> {
        let _ = pins;
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Lists the agent's nftables table (`inet hoststack`) in the agent's network namespace.
    fn read_nft_table(&self) -> io::Result<firewall::Observed> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no nftables calls",
        ))
    }
    /// Replaces the agent's nftables table with one implementing `ruleset`, in one batch.
    fn replace_nft_table(&self, ruleset: &firewall::Ruleset) -> io::Result<()> {
        let _ = ruleset;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no nftables calls",
        ))
    }
    /// Deletes the agent's nftables table; nothing when there is none.
    fn delete_nft_table(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this kernel has no nftables calls",
        ))
    }
}

/// The error of a kernel without NIC calls (the default of [`Kernel`]'s netlink methods).
fn nic_unsupported(iface: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("this kernel has no netlink calls for {iface}"),
    )
}

/// The running kernel.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealKernel;

impl Kernel for RealKernel {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        write_existing(path, bytes)
    }

    fn mount_hugetlbfs(&self, dir: &Path, pagesize: &str) -> io::Result<()> {
        let target = c_path(dir)?;
        let options = std::ffi::CString::new(format!("pagesize={pagesize}"))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                c"hugetlbfs".as_ptr(),
                target.as_ptr(),
                c"hugetlbfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn unmount(&self, dir: &Path) -> io::Result<()> {
        let target = c_path(dir)?;
        // SAFETY: `target` is a NUL-terminated string that outlives the call.
        let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn xdp_query(&self, iface: &str, pins: &xdp::Pins) -> io::Result<xdp::XdpState> {
        xdp::real::query(iface, pins)
    }

    fn nic_channels(&self, iface: &str) -> io::Result<nic::ChannelInfo> {
        nic::socket::channels(iface)
    }

    fn set_nic_channels(&self, iface: &str, counts: &nic::ChannelCounts) -> io::Result<()> {
        nic::socket::set_channels(iface, counts)
    }

    fn nic_rings(&self, iface: &str) -> io::Result<nic::RingInfo> {
        nic::socket::rings(iface)
    }

    fn set_nic_rings(&self, iface: &str, sizes: &nic::RingSizes) -> io::Result<()> {
        nic::socket::set_rings(iface, sizes)
    }

    fn nic_features(&self, iface: &str) -> io::Result<nic::Features> {
        nic::socket::features(iface)
    }

    fn set_nic_features(
        &self,
        iface: &str,
        wanted: &std::collections::BTreeMap<String, bool>,
    ) -> io::Result<()> {
        nic::socket::set_features(iface, wanted)
    }

    fn mtu(&self, iface: &str) -> io::Result<u32> {
        nic::socket::mtu(iface)
    }

    fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()> {
        nic::socket::set_mtu(iface, mtu)
    }

    fn link_up(&self, iface: &str) -> io::Result<bool> {
        nic::socket::link_up(iface)
    }

    fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()> {
        nic::socket::set_link_up(iface, up)
    }

    fn xdp_attach(
        &self,
        iface: &str,
        pins: &xdp::Pins,
        program: xdp::Program,
        mode: xdp::AttachMode,
    ) -> io::Result<()> {
        xdp::real::attach(iface, pins, program, mode)
    }

    fn xdp_replace(&self, pins: &xdp::Pins, program: xdp::Program) -> io::Result<()> {
        xdp::real::replace(pins, program)
    }

    fn xdp_detach(&self, pins: &xdp::Pins) -> io::Result<()> {
        xdp::real::detach(pins)
    }

    fn xdp_blocklist(&self, pins: &xdp::Pins) -> io::Result<xdp::Blocklist> {
        xdp::real::blocklist(pins)
    }

    fn xdp_set_blocklist(&self, pins: &xdp::Pins, prefixes: &[xdp::Prefix]) -> io::Result<()> {
        xdp::real::set_blocklist(pins, prefixes)
    }

    fn xdp_unpin_blocklist(&self, pins: &xdp::Pins) -> io::Result<()> {
        xdp::real::unpin_blocklist(pins)
    }

    fn read_nft_table(&self) -> io::Result<firewall::Observed> {
        firewall::netlink::read()
    }

    fn replace_nft_table(&self, ruleset: &firewall::Ruleset) -> io::Result<()> {
        firewall::netlink::replace(ruleset)
    }

    fn delete_nft_table(&self) -> io::Result<()> {
        firewall::netlink::delete()
    }
}

/// A path as a C string.
fn c_path(path: &Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Writes `bytes` to an existing file in one write, as `echo V > F` does.
pub fn write_existing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(bytes)
}

/// Where the host is: procfs, sysfs, and the root under which mount points and /dev lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// procfs (`/proc`).
    pub proc_root: PathBuf,
    /// sysfs (`/sys`).
    pub sys_root: PathBuf,
    /// The file system root for hugetlbfs mount points and `/dev/vfio` (`/`).
    pub fs_root: PathBuf,
}

impl Roots {
    /// procfs and sysfs at these roots, mount points under `/`.
    pub fn new(proc_root: &Path, sys_root: &Path) -> Self {
        Roots {
            proc_root: proc_root.to_path_buf(),
            sys_root: sys_root.to_path_buf(),
            fs_root: PathBuf::from("/"),
        }
    }

    /// An absolute host path (e.g. a spec's mountPath) under `fs_root`.
    pub fn host_path(&self, absolute: &str) -> PathBuf {
        self.fs_root.join(absolute.trim_start_matches('/'))
    }
}

/// The host as the appliers see it: every setting reachable under the configured roots.
#[derive(Clone, Debug)]
pub struct Host {
    roots: Roots,
    kernel: Arc<dyn Kernel>,
    bpffs_root: PathBuf,
}

impl Host {
    /// The running host, with procfs at `proc_root` and sysfs at `sys_root`.
    pub fn new(proc_root: &Path, sys_root: &Path) -> Self {
        Host::with_kernel(Roots::new(proc_root, sys_root), Arc::new(RealKernel))
    }

    /// A host at `roots` whose changes go through `kernel`.
    pub fn with_kernel(roots: Roots, kernel: Arc<dyn Kernel>) -> Self {
        Host {
            roots,
            kernel,
            bpffs_root: PathBuf::from(crate::paths::DEFAULT_BPFFS_ROOT),
        }
    }

    /// The same host, pinning its BPF objects under `bpffs_root` (default
    /// [`crate::paths::DEFAULT_BPFFS_ROOT`]).
    pub fn with_bpffs_root(mut self, bpffs_root: &Path) -> Self {
        self.bpffs_root = bpffs_root.to_path_buf();
        self
    }

    /// The directory under which the host's BPF objects are pinned.
    pub fn bpffs_root(&self) -> &Path {
        &self.bpffs_root
    }

    /// Where the host is.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The kernel its changes (and its netlink reads) go through.
    pub fn kernel(&self) -> &dyn Kernel {
        self.kernel.as_ref()
    }

    /// Reads one setting.
    pub fn read(&self, setting: &Setting) -> Reading {
        let t = &setting.target;
        let r = &self.roots;
        match setting.kind {
            Kind::Sysctl => sysctl::Sysctls::new(&r.proc_root).read(t),
            Kind::Channels | Kind::Offload | Kind::Ring | Kind::Mtu => {
                nic::read(self.kernel.as_ref(), setting.kind, t)
            }
            Kind::Hugepages => hugepages::read(r, t),
            Kind::Hugetlbfs => hugetlbfs::read(r, t),
            Kind::IrqAffinity => irq::read(r, t),
            Kind::RpsCpus | Kind::RpsFlowCnt | Kind::XpsCpus => rps::read(r, setting.kind, t),
            Kind::Nftables => firewall::read(self.kernel.as_ref(), t),
            Kind::XdpBlocklist => xdp::read_blocklist(self.kernel.as_ref(), &self.bpffs_root, t),
            Kind::XdpProgram => xdp::read_program(self.kernel.as_ref(), &self.bpffs_root, t),
            Kind::PciDriver => dpdk::read(r, self.kernel.as_ref(), t),
        }
    }

    /// Writes one setting. The error is what the kernel said (e.g. EINVAL when it refuses the
    /// value).
    pub fn write(&self, setting: &Setting, value: &str) -> io::Result<()> {
        let t = &setting.target;
        let r = &self.roots;
        let k = self.kernel.as_ref();
        match setting.kind {
            Kind::Sysctl => sysctl::Sysctls::new(&r.proc_root).write_with(k, t, value),
            Kind::Channels | Kind::Offload | Kind::Ring | Kind::Mtu => {
                nic::write(k, setting.kind, t, value)
            }
            Kind::Hugepages => hugepages::write(r, k, t, value),
            Kind::Hugetlbfs => hugetlbfs::write(r, k, t, value),
            Kind::IrqAffinity => irq::write(r, k, t, value),
            Kind::RpsCpus | Kind::RpsFlowCnt | Kind::XpsCpus => {
                rps::write(r, k, setting.kind, t, value)
            }
            Kind::Nftables => firewall::write(k, t, value),
            Kind::XdpBlocklist => xdp::write_blocklist(k, &self.bpffs_root, t, value),
            Kind::XdpProgram => xdp::write_program(k, &self.bpffs_root, t, value),
            Kind::PciDriver => dpdk::write(r, k, t, value),
        }
    }
}

/// Whether two values are the same setting: equal once runs of whitespace are collapsed and the
/// ends trimmed (the kernel prints `tcp_rmem` with tabs; users write spaces).
pub fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// Longest value read from a procfs or sysfs file; the kernel prints at most a page.
const MAX_VALUE_BYTES: u64 = 64 * 1024;

/// Reads a one-value kernel file without its trailing newline: `Missing` (with `what` and the
/// path) when it does not exist.
pub(crate) fn read_value(path: &Path, what: &str) -> Reading {
    let mut bytes = Vec::new();
    let read = File::open(path).and_then(|f| f.take(MAX_VALUE_BYTES).read_to_end(&mut bytes));
    match read {
        Ok(_) => {
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Reading::Value(String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Reading::Missing(format!("{what} ({})", path.display()))
        }
        Err(e) => Reading::Unreadable(format!("cannot read {}: {e}", path.display())),
    }
}

/// An error for a malformed setting name or value.
pub(crate) fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compare_with_whitespace_collapsed() {
        assert!(same_value("4096\t131072\t6291456", "4096 131072  6291456"));
        assert!(same_value(" 1 ", "1"));
        assert!(same_value("", "  "));
        assert!(!same_value("1", "0"));
        assert!(!same_value("4096 131072", "4096131072"));
        assert!(!same_value("a b", "ab"));
    }

    #[test]
    fn values_compare_by_kind() {
        let table: &[(Kind, &str, &str, bool)] = &[
            (Kind::IrqAffinity, "0-1", "0,1", true),
            (Kind::IrqAffinity, "0-3", "0,1", false),
            (Kind::RpsCpus, "00000000,00000003", "3", true),
            (Kind::XpsCpus, "0", "00", true),
            (Kind::XpsCpus, "1", "2", false),
            (Kind::Hugepages, "0010", "10", true),
            (Kind::RpsFlowCnt, "128", "64", false),
            (Kind::PciDriver, "driver=vfio-pci", "driver=vfio-pci ", true),
            (Kind::Sysctl, "1\t2", "1 2", true),
            (
                Kind::XdpProgram,
                "blocklist/auto",
                "blocklist/generic",
                true,
            ),
            (Kind::XdpProgram, "pass/native", "blocklist/native", false),
            (
                Kind::XdpBlocklist,
                "10.0.0.0/8,10.1.0.0/16",
                "10.1.0.0/16,10.0.0.0/8",
                true,
            ),
        ];
        for (kind, a, b, same) in table {
            assert_eq!(kind.same_value(a, b), *same, "{kind:?} {a:?} {b:?}");
        }
        assert_eq!(
            Kind::Hugepages.mismatch("512", "100"),
            "asked 512, got 100: the kernel could not allocate that many pages"
        );
    }

    #[test]
    fn kinds_sort_in_apply_order() {
        let mut kinds = vec![
            Kind::PciDriver,
            Kind::XdpProgram,
            Kind::Nftables,
            Kind::XpsCpus,
            Kind::XdpBlocklist,
            Kind::Mtu,
            Kind::Sysctl,
            Kind::Offload,
            Kind::IrqAffinity,
            Kind::Ring,
            Kind::Hugetlbfs,
            Kind::Channels,
            Kind::RpsCpus,
            Kind::Hugepages,
        ];
        kinds.sort();
        assert_eq!(
            kinds,
            [
                Kind::Hugepages,
                Kind::Hugetlbfs,
                Kind::Sysctl,
                Kind::Channels,
                Kind::Offload,
                Kind::Ring,
                Kind::Mtu,
                Kind::IrqAffinity,
                Kind::RpsCpus,
                Kind::XpsCpus,
                Kind::Nftables,
                Kind::XdpBlocklist,
                Kind::XdpProgram,
                Kind::PciDriver,
            ]
        );
    }
}

/// What one section of a config asks of the host, before anything is read: the settings with
/// their desired values, and what cannot be done at all (with the reason).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    /// Settings and their desired values, in the order found.
    pub settings: Vec<(Setting, String)>,
    /// Requests refused before any write.
    pub refused: Vec<Refusal>,
}

impl Wants {
    /// Adds a desired setting.
    pub fn set(&mut self, setting: Setting, value: impl Into<String>) {
        self.settings.push((setting, value.into()));
    }

    /// Refuses a request.
    pub fn refuse(&mut self, kind: &str, target: impl Into<String>, message: impl Into<String>) {
        self.refused.push(Refusal {
            kind: kind.to_string(),
            target: target.into(),
            message: message.into(),
        });
    }

    /// Appends everything `other` wants.
    pub fn extend(&mut self, other: Wants) {
        self.settings.extend(other.settings);
        self.refused.extend(other.refused);
    }
}

/// A request that cannot be carried out on this host; it fails the revision before any write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The status item kind (`hugepages`, `irqAffinity`, `pciDriver`, `interfaces`, ...).
    pub kind: String,
    /// What it is about (`interfaces[0]`, a PCI address, a mount point, ...).
    pub target: String,
    /// Why.
    pub message: String,
}
