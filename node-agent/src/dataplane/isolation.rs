//! Whether the stack's cores are isolated from the scheduler: listed in
//! `<sys-root>/devices/system/cpu/isolated` (the `isolcpus=` boot parameter) and in
//! `<sys-root>/devices/system/cpu/nohz_full` (no scheduler tick while one task runs). A shard
//! busy-polls its core; on a core that is not isolated the scheduler still places other tasks
//! and ticks there, which costs latency, so the agent warns but runs the stack anyway.

use std::collections::BTreeSet;
use std::path::Path;

use crate::cpus::{format_list, parse_list};

/// The CPUs the kernel keeps apart, as read from sysfs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Isolation {
    /// CPUs isolated from the scheduler's load balancing (`isolcpus=`).
    pub isolated: BTreeSet<u32>,
    /// CPUs without a periodic tick (`nohz_full=`).
    pub nohz_full: BTreeSet<u32>,
}

impl Isolation {
    /// Reads both lists under `sys_root`; a missing or unparsable file (a kernel without
    /// NO_HZ_FULL prints `(null)`) is no CPU.
    pub fn read(sys_root: &Path) -> Self {
        let list = |file: &str| {
            std::fs::read_to_string(sys_root.join("devices/system/cpu").join(file))
                .ok()
                .and_then(|text| parse_list(&text))
                .unwrap_or_default()
        };
        Isolation {
            isolated: list("isolated"),
            nohz_full: list("nohz_full"),
        }
    }

    /// The warning about `cores` that are not isolated, `None` when all of them are.
    pub fn warning(&self, cores: &BTreeSet<u32>) -> Option<String> {
        let not =
            |set: &BTreeSet<u32>| -> BTreeSet<u32> { cores.difference(set).copied().collect() };
        let (shared, ticking) = (not(&self.isolated), not(&self.nohz_full));
        let mut parts = Vec::new();
        if !shared.is_empty() {
            parts.push(format!(
                "cores {} are not isolated from the scheduler (add them to isolcpus=)",
                format_list(&shared)
            ));
        }
        if !ticking.is_empty() {
            parts.push(format!(
                "cores {} still get the scheduler tick (add them to nohz_full=)",
                format_list(&ticking)
            ));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "warning: {}; other tasks may share the stack's busy-polling cores",
                parts.join("; ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_lists_and_warns_about_each_missing_core() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpu = dir.path().join("devices/system/cpu");
        std::fs::create_dir_all(&cpu).expect("mkdir");
        std::fs::write(cpu.join("isolated"), "2-3\n").expect("write");
        std::fs::write(cpu.join("nohz_full"), "(null)\n").expect("write");
        let iso = Isolation::read(dir.path());
        assert_eq!(iso.isolated, [2, 3].into());
        assert!(iso.nohz_full.is_empty());
        assert_eq!(
            iso.warning(&[1, 2].into()).as_deref(),
            Some(
                "warning: cores 1 are not isolated from the scheduler (add them to isolcpus=); \
                 cores 1-2 still get the scheduler tick (add them to nohz_full=); other tasks \
                 may share the stack's busy-polling cores"
            )
        );
        let both = Isolation {
            isolated: [2, 3].into(),
            nohz_full: [2, 3].into(),
        };
        assert_eq!(both.warning(&[2, 3].into()), None);
        // Without the files (no sysfs entry at all): nothing is isolated.
        assert_eq!(
            Isolation::read(&dir.path().join("none")),
            Isolation::default()
        );
    }
}
