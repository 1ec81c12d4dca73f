//! The host ports: the narrow interfaces through which the appliers touch the host, one per
//! thing touched, each with the data it speaks and its implementation on the running kernel
//! ([`RealKernel`]) — [`Files`] and [`Mounts`] ([`files`]), [`Ethtool`] ([`ethtool`]),
//! [`Rtnetlink`] ([`rtnetlink`]), [`Bpf`] ([`bpf`]) and [`Nftables`] ([`nftables`]) — and
//! [`Host`]: where the host's trees are and which ports it has.
//!
//! Like node_exporter's collectors, each applier owns a small port, so a test fakes exactly the
//! ports its applier uses and nothing else: a host built without a port refuses the kinds that
//! need it, with a message naming the port ([`MissingPort`]), instead of answering for it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::model::Reading;

pub use bpf::Bpf;
pub use ethtool::Ethtool;
pub use files::{Files, Mounts};
pub use nftables::Nftables;
pub use rtnetlink::Rtnetlink;

pub mod bpf;
pub mod ethtool;
pub mod files;
pub mod nftables;
pub mod rtnetlink;

/// The running kernel: every port, in the agent's own network namespace.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealKernel;

/// One of the host ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Port {
    /// [`Files`].
    Files,
    /// [`Mounts`].
    Mounts,
    /// [`Ethtool`].
    Ethtool,
    /// [`Rtnetlink`].
    Rtnetlink,
    /// [`Bpf`].
    Bpf,
    /// [`Nftables`].
    Nftables,
}

impl Port {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Port::Files => "files",
            Port::Mounts => "mounts",
            Port::Ethtool => "ethtool",
            Port::Rtnetlink => "rtnetlink",
            Port::Bpf => "bpf",
            Port::Nftables => "nftables",
        }
    }

    /// What goes through it.
    fn carries(self) -> &'static str {
        match self {
            Port::Files => "writes to procfs and sysfs files",
            Port::Mounts => "hugetlbfs mounts",
            Port::Ethtool => "channels, offload features and rings through ethtool netlink",
            Port::Rtnetlink => "MTU and link state through rtnetlink",
            Port::Bpf => "XDP programs, links and pinned maps",
            Port::Nftables => "the agent's nftables table",
        }
    }
}

/// The answer of a host that was built without a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this host has no {} port ({})", .0.name(), .0.carries())]
pub struct MissingPort(pub Port);

impl From<MissingPort> for Reading {
    fn from(missing: MissingPort) -> Self {
        Reading::Unreadable(missing.to_string())
    }
}

impl From<MissingPort> for io::Error {
    fn from(missing: MissingPort) -> Self {
        io::Error::new(io::ErrorKind::Unsupported, missing)
    }
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

/// The host as the appliers see it: its trees, where its BPF objects are pinned, and the ports
/// it has.
#[derive(Clone, Debug)]
pub struct Host {
    roots: Roots,
    bpffs_root: PathBuf,
    files: Option<Arc<dyn Files>>,
    mounts: Option<Arc<dyn Mounts>>,
    ethtool: Option<Arc<dyn Ethtool>>,
    rtnetlink: Option<Arc<dyn Rtnetlink>>,
    bpf: Option<Arc<dyn Bpf>>,
    nftables: Option<Arc<dyn Nftables>>,
}

impl Host {
    /// The running host, with procfs at `proc_root`, sysfs at `sys_root` and every port.
    pub fn new(proc_root: &Path, sys_root: &Path) -> Self {
        Host::running(Roots::new(proc_root, sys_root))
    }

    /// The running host at `roots`, with every port.
    pub fn running(roots: Roots) -> Self {
        let kernel = Arc::new(RealKernel);
        Host::at(roots)
            .with_files(kernel.clone())
            .with_mounts(kernel.clone())
            .with_ethtool(kernel.clone())
            .with_rtnetlink(kernel.clone())
            .with_bpf(kernel.clone())
            .with_nftables(kernel)
    }

    /// A host at `roots` without any port: it reads the files under its roots and refuses
    /// every kind that needs a port until one is given (`with_*`).
    pub fn at(roots: Roots) -> Self {
        Host {
            roots,
            bpffs_root: PathBuf::from(crate::paths::DEFAULT_BPFFS_ROOT),
            files: None,
            mounts: None,
            ethtool: None,
            rtnetlink: None,
            bpf: None,
            nftables: None,
        }
    }

    /// The same host, writing files through `files`.
    pub fn with_files(mut self, files: Arc<dyn Files>) -> Self {
        self.files = Some(files);
        self
    }

    /// The same host, mounting through `mounts`.
    pub fn with_mounts(mut self, mounts: Arc<dyn Mounts>) -> Self {
        self.mounts = Some(mounts);
        self
    }

    /// The same host, asking `ethtool` for NIC channels, features and rings.
    pub fn with_ethtool(mut self, ethtool: Arc<dyn Ethtool>) -> Self {
        self.ethtool = Some(ethtool);
        self
    }

    /// The same host, asking `rtnetlink` for MTUs and link states.
    pub fn with_rtnetlink(mut self, rtnetlink: Arc<dyn Rtnetlink>) -> Self {
        self.rtnetlink = Some(rtnetlink);
        self
    }

    /// The same host, attaching XDP programs and pinning BPF objects through `bpf`.
    pub fn with_bpf(mut self, bpf: Arc<dyn Bpf>) -> Self {
        self.bpf = Some(bpf);
        self
    }

    /// The same host, managing the agent's nftables table through `nftables`.
    pub fn with_nftables(mut self, nftables: Arc<dyn Nftables>) -> Self {
        self.nftables = Some(nftables);
        self
    }

    /// The same host, pinning its BPF objects under `bpffs_root` (default
    /// [`crate::paths::DEFAULT_BPFFS_ROOT`]).
    pub fn with_bpffs_root(mut self, bpffs_root: &Path) -> Self {
        self.bpffs_root = bpffs_root.to_path_buf();
        self
    }

    /// Where the host is.
    pub fn roots(&self) -> &Roots {
        &self.roots
    }

    /// The directory under which the host's BPF objects are pinned.
    pub fn bpffs_root(&self) -> &Path {
        &self.bpffs_root
    }

    /// The first of `ports` this host does not have.
    pub fn missing(&self, ports: &[Port]) -> Option<MissingPort> {
        ports
            .iter()
            .copied()
            .find(|port| match port {
                Port::Files => self.files.is_none(),
                Port::Mounts => self.mounts.is_none(),
                Port::Ethtool => self.ethtool.is_none(),
                Port::Rtnetlink => self.rtnetlink.is_none(),
                Port::Bpf => self.bpf.is_none(),
                Port::Nftables => self.nftables.is_none(),
            })
            .map(MissingPort)
    }

    /// The files port.
    pub fn files(&self) -> Result<&dyn Files, MissingPort> {
        self.files.as_deref().ok_or(MissingPort(Port::Files))
    }

    /// The mounts port.
    pub fn mounts(&self) -> Result<&dyn Mounts, MissingPort> {
        self.mounts.as_deref().ok_or(MissingPort(Port::Mounts))
    }

    /// The ethtool port.
    pub fn ethtool(&self) -> Result<&dyn Ethtool, MissingPort> {
        self.ethtool.as_deref().ok_or(MissingPort(Port::Ethtool))
    }

    /// The rtnetlink port.
    pub fn rtnetlink(&self) -> Result<&dyn Rtnetlink, MissingPort> {
        self.rtnetlink
            .as_deref()
            .ok_or(MissingPort(Port::Rtnetlink))
    }

    /// The bpf port.
    pub fn bpf(&self) -> Result<&dyn Bpf, MissingPort> {
        self.bpf.as_deref().ok_or(MissingPort(Port::Bpf))
    }

    /// The nftables port.
    pub fn nftables(&self) -> Result<&dyn Nftables, MissingPort> {
        self.nftables.as_deref().ok_or(MissingPort(Port::Nftables))
    }
}
