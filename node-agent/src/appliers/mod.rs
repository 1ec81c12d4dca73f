//! Appliers: one module per kind of host setting, each with the plan step of its part of the
//! spec (spec → [`Wants`](crate::model::Wants)) and an [`Applier`] that reads, writes and
//! compares its values; the transaction decides what to write and in which order.
//!
//! [`applier`] is the one table from a [`Kind`] to its applier: a new knob is a kind, an
//! applier module and a row there.
//!
//! Every applier says which host ports it goes through ([`Applier::ports`]); [`read()`] and
//! [`write()`] are the one place that refuses a kind on a host without them. Reads of files go
//! straight to the files under the host's roots; every change, and every read over netlink or
//! bpf, goes through a port, so that tests can put fake ports (ones that behave like sysfs:
//! round, refuse, rebind) behind a fake tree.

use std::io;

use crate::host::Host;
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

/// Reads one setting from `host`; a kind whose ports the host does not have reads as
/// unreadable, naming the missing port, so that a plan with it fails before any write.
pub fn read(host: &Host, setting: &Setting) -> Reading {
    let applier = applier(setting.kind);
    match host.missing(applier.ports()) {
        Some(missing) => missing.into(),
        None => applier.read(host, &setting.target),
    }
}

/// Writes one setting on `host`. The error is what the kernel said (e.g. EINVAL when it
/// refuses the value), or the port the host does not have.
pub fn write(host: &Host, setting: &Setting, value: &str) -> io::Result<()> {
    let applier = applier(setting.kind);
    match host.missing(applier.ports()) {
        Some(missing) => Err(missing.into()),
        None => applier.write(host, &setting.target, value),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::{RealKernel, Roots};

    #[test]
    fn a_host_without_a_port_refuses_the_kinds_that_need_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sack_file = dir.path().join("sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack_file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&sack_file, "1\n").expect("write");
        let roots = Roots::new(dir.path(), dir.path());
        let sack = Setting::sysctl("net.ipv4.tcp_sack");

        let bare = Host::at(roots.clone());
        assert_eq!(
            read(&bare, &sack),
            Reading::Unreadable(
                "this host has no files port (writes to procfs and sysfs files)".into()
            )
        );
        let refused = write(&bare, &sack, "0").expect_err("no files port");
        assert_eq!(refused.kind(), io::ErrorKind::Unsupported);
        assert!(refused.to_string().contains("no files port"), "{refused}");
        assert_eq!(std::fs::read_to_string(&sack_file).expect("read"), "1\n");

        let files = Host::at(roots.clone()).with_files(Arc::new(RealKernel));
        assert_eq!(read(&files, &sack), Reading::Value("1".into()));
        // The MTU goes through rtnetlink: an ethtool port alone does not do.
        let ethtool = Host::at(roots).with_ethtool(Arc::new(RealKernel));
        match read(&ethtool, &Setting::new(Kind::Mtu, "lo")) {
            Reading::Unreadable(m) => assert!(m.contains("no rtnetlink port"), "{m}"),
            other => panic!("{other:?}"),
        }
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
