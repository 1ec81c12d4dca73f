//! Host-wide knobs against this machine's real kernel: the 2 MiB hugepage count (+2 pages), one
//! real IRQ's affinity and a real hugetlbfs mount, applied through the transaction, checked in
//! the kernel's own files, and reverted. A guard puts every value back even when an assertion
//! fails. Needs root.

use std::fs;
use std::path::{Path, PathBuf};

use hoststack_agent::cpus::{format_list, parse_list};
use hoststack_agent::host::{Host, Mounts, RealKernel, Roots};
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::model::{Kind, Setting};
use hoststack_agent::transaction::{Goal, Transactor};
use hoststack_crds::NodeState;

const NR_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// Puts back the host's values when dropped, whatever happened.
struct Restore {
    files: Vec<(PathBuf, String)>,
    mount: Option<PathBuf>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        if let Some(dir) = &self.mount {
            let mounted = fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .contains(&format!(" {} ", dir.display()));
            if mounted {
                if let Err(e) = RealKernel.unmount(dir) {
                    eprintln!("restoring: unmounting {}: {e}", dir.display());
                }
            }
        }
        for (path, value) in self.files.iter().rev() {
            let current = fs::read_to_string(path).map(|v| v.trim().to_string()).ok();
            if current.as_deref() != Some(value.as_str()) {
                if let Err(e) = fs::write(path, format!("{value}\n")) {
                    eprintln!("restoring {}: {e}", path.display());
                }
            }
        }
    }
}

/// An IRQ whose affinity can be written (rewriting its current value is accepted), with its
/// current CPU list and another valid one.
fn writable_irq(online: &[u32]) -> Option<(u32, String, String)> {
    let text = fs::read_to_string("/proc/interrupts").ok()?;
    for line in text.lines() {
        let Some((irq, _)) = line.trim_start().split_once(':') else {
            continue;
        };
        let Ok(irq) = irq.parse::<u32>() else {
            continue;
        };
        let path = format!("/proc/irq/{irq}/smp_affinity_list");
        let Ok(current) = fs::read_to_string(&path) else {
            continue;
        };
        let current = current.trim().to_string();
        let Some(cpus) = parse_list(&current) else {
            continue;
        };
        // Writing the same value back changes nothing and tells whether the IRQ is writable.
        if fs::write(&path, format!("{current}\n")).is_err() {
            continue;
        }
        let other = online
            .iter()
            .find(|c| cpus.len() > 1 || !cpus.contains(c))
            .map(|c| format_list(&[*c].into()))?;
        return Some((irq, current, other));
    }
    None
}

#[test]
fn real_hugepages_irq_affinity_and_hugetlbfs_apply_and_revert() {
    let root = fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    assert!(
        root && Path::new(NR_2M).exists(),
        "this test needs root and 2 MiB hugepages ({NR_2M})"
    );
    let online = parse_list(&read(Path::new("/sys/devices/system/cpu/online"))).unwrap_or_default();
    let online: Vec<u32> = online.into_iter().collect();
    let pages: u64 = read(Path::new(NR_2M)).parse().expect("count");
    let irq = writable_irq(&online);
    let mount_dir = tempfile::tempdir().expect("tempdir");
    let mount_point = mount_dir.path().join("huge");
    let mut guard = Restore {
        files: vec![(PathBuf::from(NR_2M), pages.to_string())],
        mount: Some(mount_point.clone()),
    };
    if let Some((n, current, _)) = &irq {
        guard.files.push((
            PathBuf::from(format!("/proc/irq/{n}/smp_affinity_list")),
            current.clone(),
        ));
    }

    let state = tempfile::tempdir().expect("tempdir");
    let host = Host::running(Roots::new(Path::new("/proc"), Path::new("/sys")));
    let transactor = Transactor::new(host, JournalStore::new(state.path()));
    let mut goal = Goal {
        target: Some(Applied {
            tuning: "real".into(),
            revision: "r1".into(),
        }),
        values: Default::default(),
    };
    let want_pages = pages + 2;
    goal.values
        .insert(Setting::new(Kind::Hugepages, "2Mi"), want_pages.to_string());
    let mount_target = mount_point.to_str().expect("utf-8 path").to_string();
    goal.values.insert(
        Setting::new(Kind::Hugetlbfs, mount_target.clone()),
        "hugetlbfs pagesize=2M".into(),
    );
    if let Some((n, _, other)) = &irq {
        goal.values.insert(
            Setting::new(Kind::IrqAffinity, n.to_string()),
            other.clone(),
        );
    }

    let outcome = transactor.execute(&goal, &mut |_| {}).expect("transaction");
    if outcome.state == NodeState::Failed {
        // Memory may be too fragmented for 2 more pages: then the agent must say so, and
        // have restored everything.
        let message = outcome.message.clone().unwrap_or_default();
        assert!(message.contains("asked"), "{outcome:#?}");
        assert_eq!(read(Path::new(NR_2M)), pages.to_string());
        eprintln!("the kernel could not allocate 2 more pages: {message}");
        return;
    }
    assert_eq!(outcome.state, NodeState::Applied, "{outcome:#?}");
    // The kernel's own files say so.
    assert_eq!(read(Path::new(NR_2M)), want_pages.to_string());
    assert_eq!(
        read(Path::new("/proc/sys/vm/nr_hugepages")),
        want_pages.to_string()
    );
    let mountinfo = read(Path::new("/proc/self/mountinfo"));
    assert!(
        mountinfo.contains(&format!(" {mount_target} ")) && mountinfo.contains("pagesize=2M"),
        "{mountinfo}"
    );
    match &irq {
        Some((n, current, other)) => {
            let now = read(Path::new(&format!("/proc/irq/{n}/smp_affinity_list")));
            assert_eq!(parse_list(&now), parse_list(other), "IRQ {n} was {current}");
            eprintln!("IRQ {n}: {current} -> {now}; 2 MiB pages: {pages} -> {want_pages}");
        }
        None => eprintln!("no writable IRQ here; only hugepages and the mount were tested"),
    }

    let reverted = transactor
        .execute(&Goal::revert(), &mut |_| {})
        .expect("revert");
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:#?}");
    assert_eq!(read(Path::new(NR_2M)), pages.to_string());
    assert!(!read(Path::new("/proc/self/mountinfo")).contains(&format!(" {mount_target} ")));
    assert!(
        !mount_point.exists(),
        "the mount point hoststack made is gone"
    );
    if let Some((n, current, _)) = &irq {
        assert_eq!(
            read(Path::new(&format!("/proc/irq/{n}/smp_affinity_list"))),
            *current
        );
    }
    drop(guard);
}
