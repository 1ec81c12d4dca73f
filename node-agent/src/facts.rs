//! Host facts: what the agent finds on its host, read from procfs and sysfs under the configured
//! roots (like node_exporter's `--path.procfs`/`--path.sysfs`). Missing files give empty facts,
//! never an error: facts describe the host, they do not gate anything.

use std::fs;
use std::path::Path;

use hoststack_crds::{HostFacts, InterfaceFacts};

use crate::cpus::parse_list;
use crate::sysfs::{dir_names, is_pci_address, link_name};

/// Collects the facts of the host whose procfs and sysfs are mounted at the given roots.
pub fn collect(proc_root: &Path, sys_root: &Path) -> HostFacts {
    let cpus_online = read_trimmed(&sys_root.join("devices/system/cpu/online")).unwrap_or_default();
    let cpu_count =
        u32::try_from(parse_list(&cpus_online).unwrap_or_default().len()).unwrap_or(u32::MAX);
    let numa_nodes = read_trimmed(&sys_root.join("devices/system/node/online"))
        .and_then(|list| parse_list(&list))
        .filter(|nodes| !nodes.is_empty())
        .map(|nodes| nodes.into_iter().collect())
        .unwrap_or_else(|| vec![0]);
    HostFacts {
        kernel_release: read_trimmed(&proc_root.join("sys/kernel/osrelease")).unwrap_or_default(),
        cpus_online,
        cpu_count,
        numa_nodes,
        hugepage_sizes: hugepage_sizes(sys_root),
        interfaces: interfaces(sys_root),
        vfio_available: sys_root.join("bus/pci/drivers/vfio-pci").exists()
            || sys_root.join("module/vfio_pci").exists(),
        btf_available: sys_root.join("kernel/btf/vmlinux").exists(),
        bpf_jit_enabled: read_trimmed(&proc_root.join("sys/net/core/bpf_jit_enable"))
            .is_some_and(|v| v == "1" || v == "2"),
    }
}

/// A hugepage size as a Kubernetes quantity: 2048 kB is `2Mi`, 1048576 kB is `1Gi`.
pub fn hugepage_quantity(kb: u64) -> String {
    const MI: u64 = 1024;
    const GI: u64 = 1024 * 1024;
    if kb >= GI && kb.is_multiple_of(GI) {
        format!("{}Gi", kb / GI)
    } else if kb >= MI && kb.is_multiple_of(MI) {
        format!("{}Mi", kb / MI)
    } else {
        format!("{kb}Ki")
    }
}

/// The hugepage sizes the kernel offers (`<sys>/kernel/mm/hugepages/hugepages-<n>kB`), smallest
/// first.
fn hugepage_sizes(sys_root: &Path) -> Vec<String> {
    let mut sizes: Vec<u64> = dir_names(&sys_root.join("kernel/mm/hugepages"))
        .iter()
        .filter_map(|name| {
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes.into_iter().map(hugepage_quantity).collect()
}

/// The network interfaces of the agent's network namespace (`<sys>/class/net/*`), by name.
fn interfaces(sys_root: &Path) -> Vec<InterfaceFacts> {
    let net = sys_root.join("class/net");
    dir_names(&net)
        .into_iter()
        .map(|name| {
            let dir = net.join(&name);
            let queues = dir_names(&dir.join("queues"));
            let count = |prefix: &str| {
                u32::try_from(queues.iter().filter(|q| q.starts_with(prefix)).count())
                    .unwrap_or(u32::MAX)
            };
            InterfaceFacts {
                driver: link_name(&dir.join("device/driver")),
                pci_address: pci_address(&dir.join("device")),
                mtu: read_trimmed(&dir.join("mtu")).and_then(|m| m.parse().ok()),
                rx_queues: count("rx-"),
                tx_queues: count("tx-"),
                name,
            }
        })
        .collect()
}

/// The PCI address of an interface's device: the device link's own name when it is one
/// (`0000:00:03.0`), or its parent's (a virtio device sits below its PCI function).
fn pci_address(device: &Path) -> Option<String> {
    if let Some(name) = link_name(device).filter(|n| is_pci_address(n)) {
        return Some(name);
    }
    let parent = fs::canonicalize(device)
        .ok()?
        .parent()?
        .file_name()?
        .to_str()?
        .to_string();
    is_pci_address(&parent).then_some(parent)
}

/// A small file's content, trimmed.
fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn hugepage_quantities() {
        assert_eq!(hugepage_quantity(2048), "2Mi");
        assert_eq!(hugepage_quantity(1_048_576), "1Gi");
        assert_eq!(hugepage_quantity(64), "64Ki");
    }

    fn put(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, content).expect("write");
    }

    #[test]
    fn facts_from_a_fake_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let proc_root = dir.path().join("proc");
        let sys = dir.path().join("sys");
        put(&proc_root.join("sys/kernel/osrelease"), "6.18.0-test\n");
        put(&sys.join("devices/system/cpu/online"), "0-3\n");
        fs::create_dir_all(sys.join("kernel/mm/hugepages/hugepages-1048576kB")).expect("mkdir");
        fs::create_dir_all(sys.join("kernel/mm/hugepages/hugepages-2048kB")).expect("mkdir");
        fs::create_dir_all(sys.join("bus/pci/drivers/vfio-pci")).expect("mkdir");
        put(&sys.join("kernel/btf/vmlinux"), "");
        put(&proc_root.join("sys/net/core/bpf_jit_enable"), "1\n");
        // eth0: a virtio NIC below PCI function 0000:00:03.0, 2 queues each way.
        let pci = sys.join("devices/pci0000:00/0000:00:03.0");
        fs::create_dir_all(pci.join("virtio0")).expect("mkdir");
        fs::create_dir_all(sys.join("bus/virtio/drivers/virtio_net")).expect("mkdir");
        symlink(
            sys.join("bus/virtio/drivers/virtio_net"),
            pci.join("virtio0/driver"),
        )
        .expect("symlink");
        let eth0 = sys.join("class/net/eth0");
        put(&eth0.join("mtu"), "1500\n");
        symlink(pci.join("virtio0"), eth0.join("device")).expect("symlink");
        for q in ["rx-0", "rx-1", "tx-0", "tx-1"] {
            fs::create_dir_all(eth0.join("queues").join(q)).expect("mkdir");
        }
        // veth0: no device.
        let veth = sys.join("class/net/veth0");
        put(&veth.join("mtu"), "9000\n");
        fs::create_dir_all(veth.join("queues/rx-0")).expect("mkdir");
        fs::create_dir_all(veth.join("queues/tx-0")).expect("mkdir");

        let facts = collect(&proc_root, &sys);
        assert_eq!(facts.kernel_release, "6.18.0-test");
        assert_eq!(facts.cpus_online, "0-3");
        assert_eq!(facts.cpu_count, 4);
        assert_eq!(facts.numa_nodes, vec![0]);
        assert_eq!(facts.hugepage_sizes, vec!["2Mi", "1Gi"]);
        assert!(facts.vfio_available);
        assert!(facts.btf_available && facts.bpf_jit_enabled);
        assert_eq!(
            facts.interfaces,
            vec![
                InterfaceFacts {
                    name: "eth0".into(),
                    driver: Some("virtio_net".into()),
                    pci_address: Some("0000:00:03.0".into()),
                    mtu: Some(1500),
                    rx_queues: 2,
                    tx_queues: 2,
                },
                InterfaceFacts {
                    name: "veth0".into(),
                    driver: None,
                    pci_address: None,
                    mtu: Some(9000),
                    rx_queues: 1,
                    tx_queues: 1,
                },
            ]
        );
    }

    #[test]
    fn an_empty_host_has_empty_facts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let facts = collect(dir.path(), dir.path());
        assert_eq!(facts.cpu_count, 0);
        assert_eq!(facts.numa_nodes, vec![0]);
        assert!(facts.interfaces.is_empty());
        assert!(!facts.vfio_available);
        assert!(!facts.btf_available && !facts.bpf_jit_enabled);
    }

    #[test]
    fn facts_of_this_machine_are_plausible() {
        let facts = collect(Path::new("/proc"), Path::new("/sys"));
        assert!(!facts.kernel_release.is_empty());
        assert!(facts.cpu_count >= 1);
        assert!(facts.interfaces.iter().any(|i| i.name == "lo"));
    }
}
