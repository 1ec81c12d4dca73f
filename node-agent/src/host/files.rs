//! The files and mounts ports: writes to procfs and sysfs files (sysctls, hugepage counts, IRQ
//! affinity, queue masks, PCI driver binding), and hugetlbfs mounts through mount(2) and
//! umount(2), never a shell. Reads of those files need no port: they go straight to the files
//! under the host's roots.

use std::ffi::CString;
use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::Path;

use super::RealKernel;

/// Writes to existing kernel files.
pub trait Files: fmt::Debug + Send + Sync {
    /// Writes `bytes` to the existing file `path` in one write (never creates it).
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
}

/// hugetlbfs mounts.
pub trait Mounts: fmt::Debug + Send + Sync {
    /// Mounts a hugetlbfs with the given `pagesize` option (e.g. `2M`) on the directory `dir`.
    fn mount_hugetlbfs(&self, dir: &Path, pagesize: &str) -> io::Result<()>;
    /// Unmounts the file system mounted on `dir`.
    fn unmount(&self, dir: &Path) -> io::Result<()>;
}

impl Files for RealKernel {
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        write_existing(path, bytes)
    }
}

impl Mounts for RealKernel {
    fn mount_hugetlbfs(&self, dir: &Path, pagesize: &str) -> io::Result<()> {
        let target = c_path(dir)?;
        let options = CString::new(format!("pagesize={pagesize}"))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                c"hugetlbfs".as_ptr(),
                target.as_ptr(),
                c"hugetlbfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn unmount(&self, dir: &Path) -> io::Result<()> {
        let target = c_path(dir)?;
        // SAFETY: `target` is a NUL-terminated string that outlives the call.
        let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// A path as a C string.
pub fn c_path(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Writes `bytes` to an existing file in one write, as `echo V > F` does.
pub fn write_existing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).truncate(true).open(path)?;
    file.write_all(bytes)
}
