//! The model: the vocabulary every layer above speaks. A host setting is a [`Setting`] (a
//! [`Kind`] and a target within it) whose value is a string, so the journal, the plan and the
//! undo treat all kinds alike; reading one gives a [`Reading`]; a plan step of a config section
//! says what it [`Wants`], or why it is refused ([`Refusal`]).
//!
//! The kinds are declared in the agent's apply order (hugepages, sysctls, NIC, IRQ affinity,
//! RPS/XPS, nftables, XDP, DPDK binding): the plan sets settings in [`Setting`] order, and a
//! revert restores them in reverse. How each kind is read, written and compared is its
//! applier's business (`crate::appliers`).

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};

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

/// Whether two values are the same setting: equal once runs of whitespace are collapsed and the
/// ends trimmed (the kernel prints `tcp_rmem` with tabs; users write spaces).
pub fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// Whether two counts are the same setting: equal as numbers (`0010` is `10`), or as
/// [`same_value`] when either is no number.
pub fn same_number(a: &str, b: &str) -> bool {
    match (a.trim().parse::<u64>(), b.trim().parse::<u64>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => same_value(a, b),
    }
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
