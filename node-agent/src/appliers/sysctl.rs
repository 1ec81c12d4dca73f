//! The sysctl applier: kernel parameters as files under `<proc-root>/sys`, named by dotted keys
//! (`net.ipv4.tcp_sack` is `<proc-root>/sys/net/ipv4/tcp_sack`).
//!
//! Keys were validated by the API server already; [`key_path`] checks them again, so that no key
//! can ever name a file outside `<proc-root>/sys`.

use std::io;
use std::path::{Path, PathBuf};

use super::Applier;
use crate::host::{Files, Host, Port};
use crate::model::{read_value, Reading};
use crate::{Error, Result};

/// The applier of [`Kind::Sysctl`](crate::model::Kind::Sysctl).
#[derive(Clone, Copy, Debug)]
pub struct Sysctl;

impl Applier for Sysctl {
    fn ports(&self) -> &'static [Port] {
        &[Port::Files]
    }

    fn read(&self, host: &Host, key: &str) -> Reading {
        read(&host.roots().proc_root, key)
    }

    fn write(&self, host: &Host, key: &str, value: &str) -> io::Result<()> {
        write(host.files()?, &host.roots().proc_root, key, value)
    }
}

/// The relative path of a sysctl key under `<proc-root>/sys`: its dot-separated segments, each
/// non-empty and free of `/`, whitespace and control characters.
pub fn key_path(key: &str) -> Result<PathBuf> {
    let plain = !key.is_empty()
        && !key.contains("..")
        && key.split('.').all(|segment| {
            !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c != '/' && !c.is_whitespace() && !c.is_control())
        });
    if !plain {
        return Err(Error::UnsafeKey(key.to_string()));
    }
    Ok(key.split('.').collect())
}

/// The file of a key under the procfs at `proc_root`.
pub fn path(proc_root: &Path, key: &str) -> Result<PathBuf> {
    Ok(proc_root.join("sys").join(key_path(key)?))
}

/// Reads a key's current value without its trailing newline.
pub fn read(proc_root: &Path, key: &str) -> Reading {
    let path = match path(proc_root, key) {
        Ok(path) => path,
        Err(e) => return Reading::Unreadable(e.to_string()),
    };
    read_value(&path, "no such sysctl on this kernel")
}

/// Writes `value` and a newline to a key's file in one write, as `sysctl -w` does.
pub fn write(files: &dyn Files, proc_root: &Path, key: &str, value: &str) -> io::Result<()> {
    let path = path(proc_root, key)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    // Never create a file: a key that does not exist is not a sysctl.
    files.write(&path, format!("{value}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_paths_and_unsafe_keys_are_refused() {
        assert_eq!(
            key_path("net.ipv4.tcp_sack").ok(),
            Some(PathBuf::from("net/ipv4/tcp_sack"))
        );
        assert_eq!(
            key_path("net.ipv4.conf.eth-1.rp_filter").ok(),
            Some(PathBuf::from("net/ipv4/conf/eth-1/rp_filter"))
        );
        for bad in [
            "",
            ".",
            "net..ipv4",
            "net.ipv4.",
            ".net",
            "net/ipv4/tcp_sack",
            "net.ipv4.../../etc",
            "net.ipv4.tcp sack",
            "net.ipv4.tcp_sack\n",
            "net.\u{7f}",
        ] {
            assert!(key_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn read_write_and_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("sys/net/ipv4");
        std::fs::create_dir_all(&base).expect("mkdir");
        std::fs::write(base.join("tcp_rmem"), "4096\t131072\t6291456\n").expect("write");
        let p = dir.path();
        let kernel = crate::host::RealKernel;
        assert_eq!(
            read(p, "net.ipv4.tcp_rmem"),
            Reading::Value("4096\t131072\t6291456".into())
        );
        write(&kernel, p, "net.ipv4.tcp_rmem", "1 2 3").expect("write");
        assert_eq!(
            std::fs::read_to_string(base.join("tcp_rmem")).expect("read"),
            "1 2 3\n"
        );
        match read(p, "net.ipv4.nope") {
            Reading::Missing(m) => assert!(m.contains("no such sysctl") && m.contains("nope")),
            other => panic!("{other:?}"),
        }
        // Writing never creates a sysctl.
        assert!(write(&kernel, p, "net.ipv4.nope", "1").is_err());
        assert!(!base.join("nope").exists());
        assert!(matches!(read(p, "net/../x"), Reading::Unreadable(_)));
    }
}
