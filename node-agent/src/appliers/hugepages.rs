//! The hugepages applier: a count of pages of one size, system-wide
//! (`<sys>/kernel/mm/hugepages/hugepages-<n>kB/nr_hugepages`) or on one NUMA node
//! (`<sys>/devices/system/node/node<N>/hugepages/hugepages-<n>kB/nr_hugepages`).
//!
//! Targets are `2Mi` (system-wide) or `node0/2Mi`. The kernel may allocate fewer pages than
//! asked (memory is fragmented or short); the read-back then differs and the item fails with
//! "asked N, got M" (see [`Hugepages`]), and the transaction restores the count.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use hoststack_crds::{HugepageReservation, HugepageSize};

use super::{hugetlbfs, Applier};
use crate::host::{Files, Host, Port, Roots};
use crate::model::{invalid, read_value, same_number, Kind, Reading, Setting, Wants};

/// The applier of [`Kind::Hugepages`]: counts compare as numbers, and a count that does not read
/// back is the kernel's shortage of memory.
#[derive(Clone, Copy, Debug)]
pub struct Hugepages;

impl Applier for Hugepages {
    fn ports(&self) -> &'static [Port] {
        &[Port::Files]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host.roots(), target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host.roots(), host.files()?, target, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_number(a, b)
    }

    fn mismatch(&self, wrote: &str, read: &str) -> String {
        format!(
            "asked {}, got {}: the kernel could not allocate that many pages",
            wrote.trim(),
            read.trim()
        )
    }
}

/// The status name of a page size (`2Mi`, `1Gi`).
pub fn size_name(size: HugepageSize) -> &'static str {
    match size {
        HugepageSize::Size2Mi => "2Mi",
        HugepageSize::Size1Gi => "1Gi",
    }
}

/// A page size's directory name under `hugepages/` from its status name.
fn size_dir(name: &str) -> Option<&'static str> {
    match name {
        "2Mi" => Some("hugepages-2048kB"),
        "1Gi" => Some("hugepages-1048576kB"),
        _ => None,
    }
}

/// The target of a reservation: `2Mi`, or `node0/2Mi` on a NUMA node.
pub fn target(size: HugepageSize, numa_node: Option<u32>) -> String {
    match numa_node {
        Some(n) => format!("node{n}/{}", size_name(size)),
        None => size_name(size).to_string(),
    }
}

/// The `nr_hugepages` file of a target and a description for when it is missing.
fn path(roots: &Roots, target: &str) -> Result<(PathBuf, String), String> {
    let bad = || format!("hugepage target {target:?} is not SIZE or nodeN/SIZE");
    let (node, size) = match target.split_once('/') {
        Some((node, size)) => {
            let n: u32 = node
                .strip_prefix("node")
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?;
            (Some(n), size)
        }
        None => (None, target),
    };
    let dir = size_dir(size).ok_or_else(bad)?;
    Ok(match node {
        None => (
            roots
                .sys_root
                .join("kernel/mm/hugepages")
                .join(dir)
                .join("nr_hugepages"),
            format!("this kernel offers no {size} hugepages"),
        ),
        Some(n) => (
            roots
                .sys_root
                .join(format!("devices/system/node/node{n}/hugepages"))
                .join(dir)
                .join("nr_hugepages"),
            format!("no {size} hugepages on NUMA node {n} (no such node, or no such page size)"),
        ),
    })
}

/// Reads a target's page count.
pub fn read(roots: &Roots, target: &str) -> Reading {
    match path(roots, target) {
        Ok((path, missing)) => read_value(&path, &missing),
        Err(e) => Reading::Unreadable(e),
    }
}

/// Asks the kernel for `value` pages.
pub fn write(roots: &Roots, files: &dyn Files, target: &str, value: &str) -> io::Result<()> {
    let (path, _) = path(roots, target).map_err(invalid)?;
    files.write(&path, format!("{}\n", value.trim()).as_bytes())
}

/// The pure plan step of the `hugepages` section: one count setting per reservation, and one
/// hugetlbfs mount per `mountPath`. Refused: the same size and node twice, a size reserved both
/// system-wide and per node (the two files describe one pool), and two sizes on one mount point.
pub fn desired(reservations: &[HugepageReservation]) -> Wants {
    let mut wants = Wants::default();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut mounts: BTreeMap<String, (usize, HugepageSize)> = BTreeMap::new();
    for (i, r) in reservations.iter().enumerate() {
        let t = target(r.size, r.numa_node);
        let field = format!("hugepages[{i}]");
        if let Some(j) = counts.insert(t.clone(), i) {
            wants.refuse(
                "hugepages",
                &field,
                format!("{t} is reserved twice (hugepages[{j}] and hugepages[{i}])"),
            );
            continue;
        }
        let size = size_name(r.size);
        let other = reservations
            .iter()
            .position(|o| o.size == r.size && o.numa_node.is_some() != r.numa_node.is_some());
        if let (Some(j), true) = (other, r.numa_node.is_none()) {
            wants.refuse(
                "hugepages",
                &field,
                format!(
                    "{size} is reserved both system-wide (hugepages[{i}]) and per NUMA node \
                     (hugepages[{j}]); the per-node counts make up the system-wide one, use one form"
                ),
            );
            continue;
        }
        wants.set(Setting::new(Kind::Hugepages, t), r.count.to_string());
        if let Some(mount) = &r.mount_path {
            match mounts.get(mount) {
                Some((_, s)) if *s == r.size => {}
                Some((j, _)) => wants.refuse(
                    "hugetlbfs",
                    mount,
                    format!("hugepages[{j}] and hugepages[{i}] mount different page sizes here"),
                ),
                None => {
                    mounts.insert(mount.clone(), (i, r.size));
                    match hugetlbfs::check_mount_path(mount) {
                        Ok(()) => wants.set(
                            Setting::new(Kind::Hugetlbfs, mount.clone()),
                            hugetlbfs::mounted_value(r.size),
                        ),
                        Err(e) => wants.refuse("hugetlbfs", mount, e),
                    }
                }
            }
        }
    }
    wants
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(
        size: HugepageSize,
        count: u32,
        node: Option<u32>,
        mount: Option<&str>,
    ) -> HugepageReservation {
        HugepageReservation {
            size,
            count,
            numa_node: node,
            mount_path: mount.map(str::to_string),
        }
    }

    #[test]
    fn targets_and_paths() {
        assert_eq!(target(HugepageSize::Size2Mi, None), "2Mi");
        assert_eq!(target(HugepageSize::Size1Gi, Some(1)), "node1/1Gi");
        let roots = Roots::new("/p".as_ref(), "/s".as_ref());
        assert_eq!(
            path(&roots, "2Mi").expect("path").0,
            PathBuf::from("/s/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        );
        assert_eq!(
            path(&roots, "node1/1Gi").expect("path").0,
            PathBuf::from(
                "/s/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages"
            )
        );
        for bad in ["4Mi", "node/2Mi", "nodex/2Mi", "node0/../2Mi", "../2Mi"] {
            assert!(path(&roots, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn desired_table() {
        use HugepageSize::{Size1Gi as G, Size2Mi as M};
        let h = |t: &str| Setting::new(Kind::Hugepages, t);
        let m = |t: &str| Setting::new(Kind::Hugetlbfs, t);
        struct Case {
            name: &'static str,
            input: Vec<HugepageReservation>,
            settings: Vec<(Setting, &'static str)>,
            refused: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "system-wide and per-node counts of different sizes, a mount",
                input: vec![
                    res(M, 512, None, Some("/mnt/huge")),
                    res(G, 2, Some(0), None),
                ],
                settings: vec![
                    (h("2Mi"), "512"),
                    (m("/mnt/huge"), "hugetlbfs pagesize=2M"),
                    (h("node0/1Gi"), "2"),
                ],
                refused: &[],
            },
            Case {
                name: "the same size and node twice",
                input: vec![res(M, 1, Some(0), None), res(M, 2, Some(0), None)],
                settings: vec![(h("node0/2Mi"), "1")],
                refused: &["node0/2Mi is reserved twice"],
            },
            Case {
                name: "a size both system-wide and per node",
                input: vec![res(M, 8, Some(1), None), res(M, 8, None, None)],
                settings: vec![(h("node1/2Mi"), "8")],
                refused: &["2Mi is reserved both system-wide"],
            },
            Case {
                name: "two sizes on one mount point",
                input: vec![
                    res(M, 8, None, Some("/mnt/h")),
                    res(G, 1, None, Some("/mnt/h")),
                ],
                settings: vec![
                    (h("2Mi"), "8"),
                    (m("/mnt/h"), "hugetlbfs pagesize=2M"),
                    (h("1Gi"), "1"),
                ],
                refused: &["mount different page sizes"],
            },
            Case {
                name: "a mount point that is not a plain absolute path",
                input: vec![res(G, 1, Some(0), Some("/mnt/../etc"))],
                settings: vec![(h("node0/1Gi"), "1")],
                refused: &["plain absolute path"],
            },
        ];
        for case in cases {
            let w = desired(&case.input);
            let want: Vec<(Setting, String)> = case
                .settings
                .into_iter()
                .map(|(s, v)| (s, v.to_string()))
                .collect();
            assert_eq!(w.settings, want, "{}", case.name);
            assert_eq!(
                w.refused.len(),
                case.refused.len(),
                "{}: {:?}",
                case.name,
                w.refused
            );
            for (r, text) in w.refused.iter().zip(case.refused) {
                assert!(r.message.contains(text), "{}: {r:?}", case.name);
            }
        }
    }
}
