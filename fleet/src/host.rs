//! A fleet host: the part of a node's procfs and sysfs the agent reads and writes, as a
//! directory tree of its own (`<root>/<node>/proc`, `sys`, `state`), so that thousands of
//! agents run on one machine without touching it. It holds the sysctls of [`SYSCTLS`], the
//! host facts the agent reports, and the TCP counters of `/proc/net/snmp` and
//! `/proc/net/netstat`, which [`FleetHost::advance`] moves on as traffic would.
//!
//! What a fleet host lacks: network interfaces, nftables, BPF and PCI devices (their kinds fail
//! on it, as on a host without them), hugepages and IRQs.

use std::io;
use std::path::{Path, PathBuf};

/// The sysctls a fleet host has, with the values a fresh host starts with.
pub const SYSCTLS: [(&str, &str); 4] = [
    ("net/core/somaxconn", "4096"),
    ("net/core/netdev_max_backlog", "1000"),
    ("net/ipv4/tcp_sack", "1"),
    ("net/ipv4/tcp_notsent_lowat", "4294967295"),
];

/// The TCP counters a health sample is made of, as the kernel's files hold them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpCounters {
    /// Tcp OutSegs.
    pub out_segs: u64,
    /// Tcp RetransSegs.
    pub retrans_segs: u64,
    /// TcpExt TCPSackRecovery.
    pub sack_recoveries: u64,
}

impl TcpCounters {
    /// The counters after `segments` more segments sent, `retransmit_ratio` of them again.
    pub fn advanced(self, segments: u64, retransmit_ratio: f64) -> TcpCounters {
        // Whole segments only: a ratio of 0.001 over 10,000 segments is 10 retransmissions.
        let retransmitted = (segments as f64 * retransmit_ratio).round() as u64;
        TcpCounters {
            out_segs: self.out_segs + segments,
            retrans_segs: self.retrans_segs + retransmitted,
            sack_recoveries: self.sack_recoveries + retransmitted / 4,
        }
    }

    /// `/proc/net/snmp`'s Tcp section.
    pub fn snmp(&self) -> String {
        format!(
            "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails \
             EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
             Tcp: 1 200 120000 -1 0 0 0 0 0 {} {} {} 0 0 0\n",
            self.out_segs, self.out_segs, self.retrans_segs
        )
    }

    /// `/proc/net/netstat`'s TcpExt section (the fields the agent reads).
    pub fn netstat(&self) -> String {
        format!(
            "TcpExt: TCPSackRecovery TCPDSACKRecv TCPTimeouts ListenDrops\n\
             TcpExt: {} 0 0 0\n",
            self.sack_recoveries
        )
    }
}

/// One node's host tree.
#[derive(Clone, Debug)]
pub struct FleetHost {
    dir: PathBuf,
    counters: TcpCounters,
}

impl FleetHost {
    /// Makes (or keeps) the host tree of `node` under `root`: a directory that already exists
    /// is a host that was running before (its sysctls and the agent's journal stay).
    pub fn create(root: &Path, node: &str) -> io::Result<FleetHost> {
        let dir = root.join(node);
        let host = FleetHost {
            dir,
            counters: TcpCounters::default(),
        };
        for (key, value) in SYSCTLS {
            let path = host.proc_root().join("sys").join(key);
            if !path.exists() {
                write(&path, &format!("{value}\n"))?;
            }
        }
        write(&host.proc_root().join("sys/kernel/osrelease"), "fleet\n")?;
        write(&host.sys_root().join("devices/system/cpu/online"), "0-1\n")?;
        std::fs::create_dir_all(host.state_dir())?;
        host.write_counters()?;
        Ok(host)
    }

    /// The agent's `--proc-root`.
    pub fn proc_root(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// The agent's `--sys-root`.
    pub fn sys_root(&self) -> PathBuf {
        self.dir.join("sys")
    }

    /// The agent's `--state-dir`.
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The agent's `--bpffs-root` (nothing is ever pinned there: a fleet host has no
    /// interfaces).
    pub fn bpffs_root(&self) -> PathBuf {
        self.dir.join("bpffs")
    }

    /// Sends `segments` more segments, `retransmit_ratio` of them again, and writes the
    /// counters.
    pub fn advance(&mut self, segments: u64, retransmit_ratio: f64) -> io::Result<()> {
        self.counters = self.counters.advanced(segments, retransmit_ratio);
        self.write_counters()
    }

    fn write_counters(&self) -> io::Result<()> {
        let net = self.proc_root().join("net");
        write(&net.join("snmp"), &self.counters.snmp())?;
        write(&net.join("netstat"), &self.counters.netstat())
    }
}

/// Writes `text` to `path` whole (a reader never sees half a file), making its directory.
fn write(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_agent::health::Counters;

    #[test]
    fn the_agent_reads_the_counters_a_fleet_host_writes() {
        let root = tempfile::tempdir().unwrap();
        let mut host = FleetHost::create(root.path(), "fleet-00001").unwrap();
        host.advance(10_000, 0.001).unwrap();
        host.advance(10_000, 0.05).unwrap();
        let read = Counters::read(&host.proc_root()).expect("the agent parses them");
        // OutSegs, RetransSegs, TCPSackRecovery, TCPDSACKRecv, TCPTimeouts, ListenDrops.
        assert_eq!(read.0, [20_000, 510, 127, 0, 0, 0]);
        let somaxconn = host.proc_root().join("sys/net/core/somaxconn");
        assert_eq!(std::fs::read_to_string(somaxconn).unwrap(), "4096\n");
    }

    #[test]
    fn a_host_that_exists_keeps_its_sysctls() {
        let root = tempfile::tempdir().unwrap();
        let host = FleetHost::create(root.path(), "n").unwrap();
        let somaxconn = host.proc_root().join("sys/net/core/somaxconn");
        std::fs::write(&somaxconn, "8192\n").unwrap();
        FleetHost::create(root.path(), "n").unwrap();
        assert_eq!(std::fs::read_to_string(somaxconn).unwrap(), "8192\n");
    }
}
