//! Lab directories, their ownership, and sweeping what a dead lab left behind.
//!
//! Each lab lives in `<root>/lab-<k>` (root: env `HOSTSTACK_LAB_ROOT`, else
//! `$TMPDIR/hoststack-lab`), where k is the lab index that also names its network. The
//! directory holds an `owner` file (pid and start time of the process that runs the lab);
//! every process the lab starts carries `HOSTSTACK_LAB_DIR=<dir>` in its environment. A lab
//! whose owner is gone is stale: its processes are found by that variable and killed, its
//! namespaces and devices are found by name and deleted, and its directory is removed.

use super::{bpffs, kubelet, network};
use crate::process::kill_processes_of;
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What [`sweep`] did.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Lab directories removed (stale labs, and kept ones).
    pub removed: Vec<PathBuf>,
    /// Labs left alone because their owner still runs.
    pub live: Vec<PathBuf>,
    /// Processes killed.
    pub killed: usize,
    /// Lab indices whose orphaned namespaces or devices were deleted.
    pub orphans: Vec<u8>,
    /// Steps that failed.
    pub errors: Vec<String>,
}

/// Removes every stale lab (its owner is dead), every kept lab directory
/// (`HOSTSTACK_KEEP_LAB=1`) and every orphaned lab namespace or device; with `all`, also stops
/// and removes labs whose owner still runs. This is `hoststack-lab down`.
pub fn sweep(all: bool) -> Result<SweepReport> {
    let root = lab_root();
    let mut report = SweepReport::default();
    for (k, dir) in lab_dirs(&root)? {
        if !all && owner_alive(&dir) != Some(false) {
            report.live.push(dir);
            continue;
        }
        sweep_lab(k, &dir, &mut report);
    }
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("kept-lab-") {
                let path = entry.path();
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => report.removed.push(path),
                    Err(e) => report
                        .errors
                        .push(format!("removing {}: {e}", path.display())),
                }
            }
        }
    }
    sweep_orphans(&root, &mut report)?;
    Ok(report)
}

/// The root under which lab directories are made.
fn lab_root() -> PathBuf {
    std::env::var_os("HOSTSTACK_LAB_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("hoststack-lab"))
}

/// Sweeps stale labs and orphans, then claims the lowest free lab index: creates
/// `<root>/lab-<k>` with an owner file naming this process. Errors of the sweep are returned
/// as warnings.
pub(crate) fn allocate() -> Result<(u8, PathBuf, Vec<String>)> {
    let root = lab_root();
    std::fs::create_dir_all(&root)
        .map_err(|e| Error::io(format!("creating {}", root.display()), e))?;
    let mut report = SweepReport::default();
    for (k, dir) in lab_dirs(&root)? {
        if owner_alive(&dir) == Some(false) {
            sweep_lab(k, &dir, &mut report);
        }
    }
    sweep_orphans(&root, &mut report)?;
    for k in network::INDICES {
        let dir = root.join(format!("lab-{k}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(format!("creating {}", dir.display()), e)),
        }
        let me = std::process::id();
        let owner = format!("{me} {}\n", start_time(me).unwrap_or_default());
        std::fs::write(dir.join("owner"), owner)
            .map_err(|e| Error::io(format!("writing {}/owner", dir.display()), e))?;
        if network::in_use(k)? {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        return Ok((k, dir, report.errors));
    }
    Err(Error::Setup(format!(
        "no free lab index in {}: run `hoststack-lab down`",
        root.display()
    )))
}

/// Removes the directory of lab k, whose processes, mounts and network are gone: or, with
/// `HOSTSTACK_KEEP_LAB=1`, keeps it as `kept-lab-<k>-<time>` (which [`sweep`] removes later).
/// The failure, if any.
pub(crate) fn release(k: u8, dir: &Path) -> Option<String> {
    let keep = std::env::var("HOSTSTACK_KEEP_LAB").is_ok_and(|v| v == "1");
    if !keep {
        return std::fs::remove_dir_all(dir)
            .err()
            .map(|e| format!("removing {}: {e}", dir.display()));
    }
    let kept = dir.with_file_name(format!("kept-lab-{k}-{}", crate::process::unix_time()));
    match std::fs::rename(dir, &kept) {
        Ok(()) => {
            let _ = std::fs::remove_file(kept.join("owner"));
            eprintln!(
                "hoststack-lab: kept the lab directory at {}",
                kept.display()
            );
            None
        }
        Err(e) => Some(format!("keeping {}: {e}", dir.display())),
    }
}

/// Kills lab k's processes, deletes its network and removes its directory.
fn sweep_lab(k: u8, dir: &Path, report: &mut SweepReport) {
    report.killed += kill_processes_of(dir);
    report.errors.extend(kubelet::sweep(k, dir));
    report.errors.extend(bpffs::unmount(dir));
    report.errors.extend(network::remove(k));
    match std::fs::remove_dir_all(dir) {
        Ok(()) => report.removed.push(dir.to_path_buf()),
        Err(e) => report
            .errors
            .push(format!("removing {}: {e}", dir.display())),
    }
}

/// Deletes namespaces and devices of lab indices that have no lab directory (their lab was
/// removed, so nobody is tearing them down).
fn sweep_orphans(root: &Path, report: &mut SweepReport) -> Result<()> {
    for k in network::indices_present()? {
        if !root.join(format!("lab-{k}")).exists() {
            report.errors.extend(network::remove(k));
            report.orphans.push(k);
        }
    }
    Ok(())
}

/// `(k, <root>/lab-<k>)` for every lab directory.
fn lab_dirs(root: &Path) -> Result<Vec<(u8, PathBuf)>> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", root.display()), e)),
    };
    let mut dirs: Vec<(u8, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let k = e.file_name().to_str()?.strip_prefix("lab-")?.parse().ok()?;
            Some((k, e.path()))
        })
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Whether the lab in `dir` has a live owner: `None` while that cannot be told yet (a lab
/// created in the last minute without an owner file is still starting).
fn owner_alive(dir: &Path) -> Option<bool> {
    let Ok(text) = std::fs::read_to_string(dir.join("owner")) else {
        let young = std::fs::metadata(dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < Duration::from_secs(60));
        return if young { None } else { Some(false) };
    };
    let mut parts = text.split_whitespace();
    let pid: Option<u32> = parts.next().and_then(|p| p.parse().ok());
    let started: Option<u64> = parts.next().and_then(|p| p.parse().ok());
    let Some(pid) = pid else {
        return Some(false);
    };
    Some(start_time(pid).is_some() && start_time(pid) == started)
}

/// The start time of process `pid` (field 22 of /proc/pid/stat), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::running;

    #[test]
    fn this_process_is_alive_and_has_a_start_time() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert!(running(me));
    }

    #[test]
    fn a_lab_without_a_live_owner_is_stale() {
        let dir = std::env::temp_dir().join(format!("hoststack-e2e-owner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(owner_alive(&dir), None, "young and without owner: starting");
        let me = std::process::id();
        std::fs::write(
            dir.join("owner"),
            format!("{me} {}", start_time(me).unwrap()),
        )
        .unwrap();
        assert_eq!(owner_alive(&dir), Some(true));
        std::fs::write(dir.join("owner"), format!("{me} 1")).unwrap();
        assert_eq!(
            owner_alive(&dir),
            Some(false),
            "pid reused by another process"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
