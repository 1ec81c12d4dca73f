//! Names in procfs and sysfs trees: what a directory lists, what a symlink points at, and the
//! checks that keep a name read from the host or a spec from leaving the directory it is
//! joined to. Missing or unreadable entries give nothing, never an error.

use std::fs;
use std::path::Path;

/// Whether `name` is a plain file name: no `/`, not `.` or `..`, no whitespace or control
/// characters, so that joining it to a directory stays inside it.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c != '/' && !c.is_whitespace() && !c.is_control())
}

/// Whether `s` is a PCI address, `dddd:bb:dd.f` in hex.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b':',
            10 => *c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The names in a directory, sorted; none when it cannot be read.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// The last component of a symlink's target.
pub fn link_name(link: &Path) -> Option<String> {
    let target = fs::read_link(link).ok()?;
    Some(target.file_name()?.to_str()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names() {
        for ok in ["eth0", "rx-0", "0000:00:03.0", "a.b"] {
            assert!(plain_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", "a\n"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn pci_addresses() {
        assert!(is_pci_address("0000:00:03.0"));
        assert!(is_pci_address("0000:af:1f.7"));
        assert!(!is_pci_address("virtio0"));
        assert!(!is_pci_address("0000:00:03"));
    }
}
