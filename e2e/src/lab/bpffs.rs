//! The lab's bpffs: an instance of its own at `<lab dir>/bpffs`, mounted before any agent
//! starts so that every agent's mount namespace (`ip netns exec` makes one per agent) shares it
//! and pins outlive agents. Each agent pins under a directory of its own on it; unmounting it
//! drops every pin, detaching the agents' XDP programs.

use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The bpffs mount point of the lab in `lab_dir`.
fn mount_point(lab_dir: &Path) -> PathBuf {
    lab_dir.join("bpffs")
}

/// `node`'s agent's `--bpffs-root`: `<lab dir>/bpffs/<node>`.
pub(crate) fn agent_root(lab_dir: &Path, node: &str) -> PathBuf {
    mount_point(lab_dir).join(node)
}

/// Mounts a bpffs (a new instance, private to the lab) at `<lab dir>/bpffs`.
pub(crate) fn mount(lab_dir: &Path) -> Result<()> {
    let dir = mount_point(lab_dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| Error::Setup(format!("{}: {e}", dir.display())))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c.as_ptr(),
            c"bpf".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0700".as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(Error::io(
            format!("mounting a bpffs at {}", dir.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Unmounts the bpffs of the lab in `lab_dir`, if mounted; the failure, if any.
pub(crate) fn unmount(lab_dir: &Path) -> Option<String> {
    let dir = mount_point(lab_dir);
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return None;
    }
    let e = std::io::Error::last_os_error();
    // EINVAL: not a mount point; ENOENT: never made.
    match e.raw_os_error() {
        Some(libc::EINVAL) | Some(libc::ENOENT) => None,
        _ => Some(format!("unmounting {}: {e}", dir.display())),
    }
}
