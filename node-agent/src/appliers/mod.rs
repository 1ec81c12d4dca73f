//! Appliers: one module per kind of host setting, each with the plan step of its part of the
//! spec (spec → [`Wants`](crate::model::Wants)) and an [`Applier`] that reads, writes and
//! compares its values; the transaction decides what to write and in which order.
//!
//! [`applier`] is the one table from a [`Kind`] to its applier: a new knob is a kind, an
//! applier module and a row there.
//!
//! Reads of files go straight to the files under the configured roots, reads over netlink or
//! bpf (NIC, nftables, XDP) go through the [`Kernel`], and every change goes through the
//! [`Kernel`], so that tests can put a fake kernel (one that behaves like sysfs: rounds,
//! refuses, rebinds) behind a fake tree.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::{Kind, Reading, Setting};

mod applier;
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

pub use applier::Applier;

/// The applier of each kind: the one table a new knob adds its row to.
pub fn applier(kind: Kind) -> &'static dyn Applier {
    match kind {
        Kind::Hugepages => &hugepages::Hugepages,
        Kind::Hugetlbfs => &hugetlbfs::Hugetlbfs,
        Kind::Sysctl => &sysctl::Sysctl,
        Kind::Channels => &nic::Nic(Kind::Channels),
        Kind::Offload => &nic::Nic(Kind::Offload),
        Kind::Ring => &nic::Nic(Kind::Ring),
        Kind::Mtu => &nic::Nic(Kind::Mtu),
        Kind::IrqAffinity => &irq::Affinity,
        Kind::RpsCpus => &rps::Queue(Kind::RpsCpus),
        Kind::RpsFlowCnt => &rps::Queue(Kind::RpsFlowCnt),
        Kind::XpsCpus => &rps::Queue(Kind::XpsCpus),
        Kind::Nftables => &firewall::Table,
        Kind::XdpBlocklist => &xdp::Blocklists,
        Kind::XdpProgram => &xdp::Programs,
        Kind::PciDriver => &dpdk::PciDriver,
    }
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
        applier(setting.kind).read(self, &setting.target)
    }

    /// Writes one setting. The error is what the kernel said (e.g. EINVAL when it refuses the
    /// value).
    pub fn write(&self, setting: &Setting, value: &str) -> io::Result<()> {
        applier(setting.kind).write(self, &setting.target, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert_eq!(
                applier(*kind).same_value(a, b),
                *same,
                "{kind:?} {a:?} {b:?}"
            );
        }
        assert_eq!(
            applier(Kind::Hugepages).mismatch("512", "100"),
            "asked 512, got 100: the kernel could not allocate that many pages"
        );
    }
}
