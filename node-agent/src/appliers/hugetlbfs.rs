//! The hugetlbfs applier: a hugetlbfs mounted at a spec's `mountPath` for the user-space stack.
//!
//! The target is the mount point (an absolute path, under the host root). Its value is what is
//! there, as read from `<proc-root>/self/mountinfo`:
//! - `absent`: the directory does not exist;
//! - `unmounted`: the directory exists and nothing is mounted on it;
//! - `hugetlbfs pagesize=2M` (or `1G`): a hugetlbfs of that page size is mounted on it;
//! - any other file system's type (`tmpfs`): something else is mounted on it.
//!
//! Setting `hugetlbfs pagesize=P` creates the directory when it is absent (its parent must
//! exist) and mounts a hugetlbfs on it (over whatever is there); restoring any other value
//! unmounts the hugetlbfs and, for `absent`, removes the directory again. Mounting goes through
//! mount(2), never a shell.

use std::fs;
use std::io;
use std::path::{Component, Path};

use hoststack_crds::HugepageSize;

use super::Applier;
use crate::host::{Host, Mounts, Port, Roots};
use crate::model::{invalid, Reading};

/// The applier of [`Kind::Hugetlbfs`](crate::model::Kind::Hugetlbfs).
#[derive(Clone, Copy, Debug)]
pub struct Hugetlbfs;

impl Applier for Hugetlbfs {
    fn ports(&self) -> &'static [Port] {
        &[Port::Mounts]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host.roots(), target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host.roots(), host.mounts()?, target, value)
    }
}

/// The value of a mount point with nothing mounted on it.
pub const UNMOUNTED: &str = "unmounted";
/// The value of a mount point whose directory does not exist.
pub const ABSENT: &str = "absent";

/// The value of a hugetlbfs of `size` mounted.
pub fn mounted_value(size: HugepageSize) -> String {
    format!("hugetlbfs pagesize={}", pagesize_option(size))
}

/// The `pagesize=` mount option of a page size.
fn pagesize_option(size: HugepageSize) -> &'static str {
    match size {
        HugepageSize::Size2Mi => "2M",
        HugepageSize::Size1Gi => "1G",
    }
}

/// Checks that a mount point is a plain absolute path: no `.` or `..`, no empty segment, no
/// whitespace or control characters.
pub fn check_mount_path(path: &str) -> Result<(), String> {
    let plain = path.starts_with('/')
        && path.len() > 1
        && !path.ends_with('/')
        && path[1..].split('/').all(crate::sysfs::plain_name)
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(format!(
            "mountPath {path:?} is not a plain absolute path (no '.', '..' or empty segments)"
        ))
    }
}

/// A `pagesize=` option as printed in mountinfo (`2M`, `1024M`) in the form this agent writes
/// (`2M`, `1G`).
fn normalize_pagesize(option: &str) -> String {
    let (digits, unit) = option.split_at(option.len().saturating_sub(1));
    let factor: u64 = match unit {
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => return option.to_string(),
    };
    match digits.parse::<u64>() {
        Ok(n) => {
            let bytes = n * factor;
            if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
                format!("{}G", bytes >> 30)
            } else if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
                format!("{}M", bytes >> 20)
            } else {
                format!("{}K", bytes >> 10)
            }
        }
        Err(_) => option.to_string(),
    }
}

/// Decodes the octal escapes (`\040`) mountinfo uses in paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What mountinfo says is mounted on `dir` (the topmost mount): `hugetlbfs pagesize=P`, another
/// file system's type, or `None`.
pub fn mounted_on(mountinfo: &str, dir: &str) -> Option<String> {
    mountinfo.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let point = unescape(left.split_whitespace().nth(4)?);
        if point != dir {
            return None;
        }
        let mut fields = right.split_whitespace();
        let fstype = fields.next()?;
        if fstype != "hugetlbfs" {
            return Some(fstype.to_string());
        }
        let options = fields.nth(1).unwrap_or("");
        let pagesize = options
            .split(',')
            .find_map(|o| o.strip_prefix("pagesize="))
            .map(normalize_pagesize)
            .unwrap_or_else(|| "default".into());
        Some(format!("hugetlbfs pagesize={pagesize}"))
    })
}

/// Reads what is at a mount point.
pub fn read(roots: &Roots, target: &str) -> Reading {
    if let Err(e) = check_mount_path(target) {
        return Reading::Unreadable(e);
    }
    let dir = roots.host_path(target);
    let info = roots.proc_root.join("self/mountinfo");
    let mountinfo = match fs::read_to_string(&info) {
        Ok(text) => text,
        Err(e) => return Reading::Unreadable(format!("cannot read {}: {e}", info.display())),
    };
    let here = dir.to_string_lossy();
    match mounted_on(&mountinfo, &here) {
        Some(what) => Reading::Value(what),
        None if dir.is_dir() => Reading::Value(UNMOUNTED.into()),
        None if dir.exists() => Reading::Unreadable(format!("{here} exists and is no directory")),
        None => Reading::Value(ABSENT.into()),
    }
}

/// Makes a mount point hold `value` (see the module doc).
pub fn write(roots: &Roots, mounts: &dyn Mounts, target: &str, value: &str) -> io::Result<()> {
    check_mount_path(target).map_err(invalid)?;
    let dir = roots.host_path(target);
    let current = match read(roots, target) {
        Reading::Value(v) => v,
        Reading::Missing(e) | Reading::Unreadable(e) => return Err(io::Error::other(e)),
    };
    let value = value.trim();
    if value == current {
        return Ok(());
    }
    if current.starts_with("hugetlbfs") {
        mounts.unmount(&dir)?;
    }
    if let Some(pagesize) = value.strip_prefix("hugetlbfs pagesize=") {
        if current == ABSENT {
            fs::create_dir(&dir)?;
        }
        return mounts.mount_hugetlbfs(&dir, pagesize);
    }
    if value == ABSENT && dir.is_dir() {
        fs::remove_dir(&dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw
43 22 0:39 / /mnt/huge rw,relatime - hugetlbfs none rw,pagesize=2M
44 22 0:40 / /mnt/big rw,relatime - hugetlbfs none rw,pagesize=1024M
45 22 0:41 / /mnt/t rw - tmpfs tmpfs rw
46 45 0:42 / /mnt/t rw - hugetlbfs hugetlbfs rw,pagesize=2M
47 22 0:43 / /mnt/with\\040space rw - hugetlbfs none rw,pagesize=2M
";

    #[test]
    fn mounts_from_mountinfo() {
        let table: &[(&str, Option<&str>)] = &[
            ("/mnt/huge", Some("hugetlbfs pagesize=2M")),
            ("/mnt/big", Some("hugetlbfs pagesize=1G")),
            ("/mnt/t", Some("hugetlbfs pagesize=2M")),
            ("/", Some("ext4")),
            ("/mnt/with space", Some("hugetlbfs pagesize=2M")),
            ("/mnt", None),
        ];
        for (dir, want) in table {
            assert_eq!(mounted_on(INFO, dir).as_deref(), *want, "{dir}");
        }
        assert_eq!(
            mounted_value(HugepageSize::Size1Gi),
            "hugetlbfs pagesize=1G"
        );
        assert_eq!(normalize_pagesize("2048K"), "2M");
    }

    #[test]
    fn mount_paths() {
        assert!(check_mount_path("/mnt/huge").is_ok());
        assert!(check_mount_path("/dev/hugepages-1G").is_ok());
        for bad in [
            "",
            "/",
            "mnt",
            "/mnt/",
            "/mnt//x",
            "/mnt/../etc",
            "/./x",
            "/a b",
        ] {
            assert!(check_mount_path(bad).is_err(), "{bad:?}");
        }
    }
}
