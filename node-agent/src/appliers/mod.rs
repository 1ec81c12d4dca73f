//! Appliers: one module per kind of host setting. Each reads and writes the current value of one
//! setting; the transaction decides what to write and in which order.
//!
//! Only sysctls exist so far. Later kinds (hugepages, NIC, IRQ affinity, ...) add a [`Kind`]
//! variant and a module, and [`Host`] dispatches to them.

use std::fmt;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub mod sysctl;

/// The kinds of host setting the agent manages; the journal records each value with its kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A kernel parameter under `<proc-root>/sys`, named by its dotted key.
    #[serde(rename = "sysctl")]
    Sysctl,
}

impl Kind {
    /// The name used in status items (`ItemResult.kind`) and in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sysctl => "sysctl",
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
    /// A sysctl by its dotted key.
    pub fn sysctl(key: impl Into<String>) -> Self {
        Setting {
            kind: Kind::Sysctl,
            target: key.into(),
        }
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

/// The host as the appliers see it: every setting reachable under the configured roots.
#[derive(Clone, Debug)]
pub struct Host {
    sysctls: sysctl::Sysctls,
}

impl Host {
    /// The host whose procfs is mounted at `proc_root`.
    pub fn new(proc_root: &Path) -> Self {
        Host {
            sysctls: sysctl::Sysctls::new(proc_root),
        }
    }

    /// Reads one setting.
    pub fn read(&self, setting: &Setting) -> Reading {
        match setting.kind {
            Kind::Sysctl => self.sysctls.read(&setting.target),
        }
    }

    /// Writes one setting. The error is what the kernel said (e.g. EINVAL when it refuses the
    /// value).
    pub fn write(&self, setting: &Setting, value: &str) -> io::Result<()> {
        match setting.kind {
            Kind::Sysctl => self.sysctls.write(&setting.target, value),
        }
    }
}

/// Whether two values are the same setting: equal once runs of whitespace are collapsed and the
/// ends trimmed (the kernel prints `tcp_rmem` with tabs; users write spaces).
pub fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
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
}
