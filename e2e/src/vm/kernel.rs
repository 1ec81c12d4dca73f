//! The guest kernel: Debian's, from the package that `linux-image-amd64` depends on, fetched
//! with `apt-get download`, unpacked with `dpkg-deb -x` and cached per kernel release under
//! `${HOSTSTACK_CACHE:-/var/cache/hoststack}/vm-kernel-<release>/`, outside the repository
//! (like the control plane).

use crate::command::{cmd, run};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Default cache directory; `HOSTSTACK_CACHE` overrides it.
const CACHE_DEFAULT: &str = "/var/cache/hoststack";

/// The meta package whose dependency names the current kernel package.
const META_PACKAGE: &str = "linux-image-amd64";

/// An unpacked kernel package.
#[derive(Clone, Debug)]
pub(crate) struct GuestKernel {
    /// The kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The compressed kernel image (`boot/vmlinuz-<release>`).
    pub image: PathBuf,
    /// `lib/modules/<release>` of the package.
    pub modules: PathBuf,
    /// The kernel's text symbols as a guest listed them (`kallsyms`, in System.map's format),
    /// once one has been ready (Debian's `boot/System.map` is a placeholder).
    pub kallsyms: PathBuf,
}

/// The kernel package `linux-image-amd64` depends on (`linux-image-6.1.0-57-amd64`), from the
/// output of `apt-cache depends`.
pub(crate) fn kernel_package(depends: &str) -> Option<String> {
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p != &META_PACKAGE)
        .map(str::to_string)
}

/// The release of a kernel package: `linux-image-6.1.0-57-amd64` → `6.1.0-57-amd64`.
pub(crate) fn release_of(package: &str) -> Option<&str> {
    package
        .strip_prefix("linux-image-")
        .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

/// The cache root: `HOSTSTACK_CACHE`, else /var/cache/hoststack.
pub(crate) fn cache_root() -> PathBuf {
    std::env::var_os("HOSTSTACK_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CACHE_DEFAULT))
}

/// The cached kernel, downloaded and unpacked first when the cache does not have it yet.
pub(crate) fn ensure() -> Result<GuestKernel> {
    let depends = run(&mut cmd("apt-cache", &["depends", META_PACKAGE]), None)?;
    let package = kernel_package(&depends).ok_or_else(|| {
        Error::Setup(format!(
            "`apt-cache depends {META_PACKAGE}` names no kernel package:\n{depends}"
        ))
    })?;
    let release = release_of(&package)
        .ok_or_else(|| Error::Setup(format!("{package} is not linux-image-<release>")))?
        .to_string();
    let dir = cache_root().join(format!("vm-kernel-{release}"));
    let kernel = GuestKernel {
        image: dir.join("boot").join(format!("vmlinuz-{release}")),
        modules: dir.join("lib/modules").join(&release),
        kallsyms: dir.join("kallsyms"),
        release,
    };
    if kernel.image.is_file() && kernel.modules.is_dir() {
        return Ok(kernel);
    }
    download_and_unpack(&package, &dir)?;
    if !kernel.image.is_file() || !kernel.modules.is_dir() {
        return Err(Error::Setup(format!(
            "{package} unpacked into {} has no {} or no {}",
            dir.display(),
            kernel.image.display(),
            kernel.modules.display()
        )));
    }
    Ok(kernel)
}

/// `apt-get download` of `package` and `dpkg-deb -x` into a scratch directory beside `dir`,
/// renamed to `dir` at the end, so a crash never leaves a half-unpacked cache (and of two
/// labs unpacking at once, the second keeps the first one's copy).
fn download_and_unpack(package: &str, dir: &Path) -> Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| Error::Setup(format!("{} has no parent", dir.display())))?;
    let scratch = parent.join(format!(
        ".{}.partial-{}",
        dir.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| Error::io(format!("creating {}", scratch.display()), e))?;
    let result = (|| {
        let mut download = cmd("apt-get", &["download", "-q", package]);
        download.current_dir(&scratch);
        run(&mut download, None)?;
        let deb = std::fs::read_dir(&scratch)
            .map_err(|e| Error::io(format!("listing {}", scratch.display()), e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| Error::Setup(format!("apt-get download {package} left no .deb")))?;
        let root = scratch.join("root");
        let mut unpack = cmd("dpkg-deb", &["-x"]);
        unpack.arg(&deb).arg(&root);
        run(&mut unpack, None)?;
        match std::fs::rename(&root, dir) {
            Ok(()) => Ok(()),
            Err(_) if dir.is_dir() => Ok(()),
            Err(e) => Err(Error::io(
                format!("moving the kernel to {}", dir.display()),
                e,
            )),
        }
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_package_comes_from_the_meta_package() {
        let depends = "linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n";
        let package = kernel_package(depends).expect("a package");
        assert_eq!(package, "linux-image-6.1.0-57-amd64");
        assert_eq!(release_of(&package), Some("6.1.0-57-amd64"));
        assert_eq!(kernel_package("linux-image-amd64\n"), None);
        assert_eq!(release_of("linux-image-amd64"), None);
    }
}
