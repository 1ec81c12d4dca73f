//! What real nodes change on the host itself, and putting it back: the host-wide sysctls the
//! kubelet sets on start, and each node's cgroup root in every cgroup hierarchy.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Host-wide settings the kubelet changes when it starts (`vm.overcommit_memory` 0→1,
/// `kernel.panic` →10, `kernel.panic_on_oops` →1).
pub(crate) const KUBELET_SYSCTLS: [&str; 3] = [
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
];

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

/// The current values of [`KUBELET_SYSCTLS`] as `key=value` lines (the lab saves them in its
/// directory before the first kubelet starts).
pub(crate) fn save_sysctls() -> Result<String, String> {
    let mut saved = String::new();
    for key in KUBELET_SYSCTLS {
        let path = sysctl_path(key);
        let value = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        saved.push_str(&format!("{key}={}\n", value.trim()));
    }
    Ok(saved)
}

/// Writes back what [`save_sysctls`] saved; the failures.
pub(crate) fn restore_sysctls(saved: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for line in saved.lines() {
        let Some((key, value)) = line.split_once('=') else {
            errors.push(format!("saved sysctl line {line:?} has no '='"));
            continue;
        };
        if !KUBELET_SYSCTLS.contains(&key) {
            errors.push(format!(
                "refusing to restore {key}: not one the kubelet changes"
            ));
            continue;
        }
        let path = sysctl_path(key);
        if let Err(e) = std::fs::write(&path, value) {
            errors.push(format!("restoring {key}={value}: {e}"));
        }
    }
    errors
}

/// The mount points of every cgroup hierarchy (v1 controllers, name=systemd, the v2 unified
/// one), from /proc/self/mountinfo.
pub(crate) fn cgroup_hierarchies() -> Result<Vec<PathBuf>, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let fstype = fs.split_whitespace().next()?;
            let point = mount.split_whitespace().nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(point))
        })
        .collect())
}

/// Creates `root` (e.g. `/hoststack-lab3-node-a`) in every hierarchy; in cpuset, copies the
/// parent's cpus and mems in, which a new cpuset cgroup lacks.
pub(crate) fn create_cgroup_root(root: &str) -> Result<(), String> {
    for hierarchy in cgroup_hierarchies()? {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let parent = hierarchy.join(file);
            if parent.exists() && dir.join(file).exists() {
                let value = std::fs::read_to_string(&parent)
                    .map_err(|e| format!("reading {}: {e}", parent.display()))?;
                std::fs::write(dir.join(file), value.trim())
                    .map_err(|e| format!("writing {}/{file}: {e}", dir.display()))?;
            }
        }
    }
    Ok(())
}

/// Kills every process in `root`'s cgroups (the node's pods and containers), then removes the
/// cgroups deepest first; the failures.
pub(crate) fn remove_cgroup_root(root: &str) -> Vec<String> {
    let hierarchies = match cgroup_hierarchies() {
        Ok(h) => h,
        Err(e) => return vec![e],
    };
    let dirs: Vec<PathBuf> = hierarchies
        .iter()
        .map(|h| h.join(root.trim_start_matches('/')))
        .filter(|d| d.exists())
        .collect();
    // Processes may fork while being killed: repeat until the trees are empty.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids: Vec<i32> = dirs.iter().flat_map(|d| tree_pids(d)).collect();
        if pids.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return vec![format!(
                "processes {pids:?} survived SIGKILL in cgroup {root}"
            )];
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut errors = Vec::new();
    for dir in dirs {
        let mut tree = subdirs(&dir);
        // Deepest first.
        tree.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        tree.push(dir);
        for cgroup in tree {
            if let Err(e) = rmdir_retrying(&cgroup) {
                errors.push(format!("removing cgroup {}: {e}", cgroup.display()));
            }
        }
    }
    errors
}

/// Whether any hierarchy still has a cgroup named `root`.
pub(crate) fn cgroup_root_exists(root: &str) -> bool {
    cgroup_hierarchies().is_ok_and(|hs| {
        hs.iter()
            .any(|h| h.join(root.trim_start_matches('/')).exists())
    })
}

/// A cgroup's directory lingers for a moment after its last process is reaped.
fn rmdir_retrying(dir: &Path) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let path = entry.path();
                found.extend(subdirs(&path));
                found.push(path);
            }
        }
    }
    found
}

/// Every pid in the cgroup at `dir` and below.
fn tree_pids(dir: &Path) -> Vec<i32> {
    let mut cgroups = subdirs(dir);
    cgroups.push(dir.to_path_buf());
    cgroups
        .iter()
        .filter_map(|c| std::fs::read_to_string(c.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kubelets_sysctls_are_restored() {
        let errors = restore_sysctls("net.ipv4.ip_forward=1\nnonsense\n");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("refusing to restore net.ipv4.ip_forward"));
        assert!(errors[1].contains("no '='"));
    }

    #[test]
    fn hierarchies_are_found_in_mountinfo() {
        // Every Linux host this runs on has at least one cgroup hierarchy mounted.
        let hierarchies = cgroup_hierarchies().unwrap();
        assert!(!hierarchies.is_empty());
        assert!(hierarchies.iter().all(|h| h.is_absolute()));
    }
}
