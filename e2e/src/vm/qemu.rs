//! The qemu command line of a VM node (the recipe of LAB-FACTS section 3).
//!
//! q35 under TCG (KVM hangs at boot on this machine), an Intel IOMMU with interrupt remapping
//! and device IOTLB (created before the devices behind it), 2 vCPUs and 2 GiB split over 2 NUMA
//! nodes, the serial console to a file, the human monitor on a unix socket (read by the lab's
//! diagnostics: `info jit`), and:
//! - `00:02.0` the management NIC (virtio-net, tap `tapm`);
//! - `00:03.0` the data NIC: modern-only virtio-net with `iommu_platform=on,ats=on` (without
//!   iommu_platform the device bypasses the IOMMU and DPDK hangs at "Configuring Port 0"),
//!   4 queue pairs on the multi-queue tap `tapd`, 10 MSI-X vectors (one per queue, config,
//!   control), and `rss=on`: the device offers VIRTIO_NET_F_RSS, so the guest's virtio_net
//!   programs a Toeplitz key and a 128-entry indirection table (readable and settable with
//!   `ethtool -x/-X`, and through `ETHTOOL_MSG_RSS_GET`) and qemu spreads received flows over
//!   the queues by them (in an eBPF steering program on the tap where it can load one, in
//!   software otherwise — the same hash either way);
//! - the host root read-only (`host`) and the node's share read-write (`share`) over 9p.

use std::path::PathBuf;

/// vCPUs of a VM node (the host has 2 cores).
pub(crate) const CPUS: u32 = 2;
/// Guest memory in MiB, half on each NUMA node.
pub(crate) const MEMORY_MIB: u32 = 2048;
/// Queue pairs of the data NIC.
pub(crate) const DATA_QUEUES: u32 = 4;
/// The management NIC's PCI address in the guest.
pub const MGMT_PCI: &str = "0000:00:02.0";
/// The data NIC's PCI address in the guest.
pub const DATA_PCI: &str = "0000:00:03.0";
/// The management tap in the node's namespace.
pub(crate) const MGMT_TAP: &str = "tapm";
/// The data tap (multi-queue) in the node's namespace.
pub(crate) const DATA_TAP: &str = "tapd";

/// What varies between VM nodes.
#[derive(Clone, Debug)]
pub(crate) struct QemuSpec {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub console_log: PathBuf,
    pub monitor: PathBuf,
    pub share: PathBuf,
    pub mgmt_mac: String,
    pub data_mac: String,
}

/// The kernel command line. `norandmaps` turns address-space randomization off in the guest:
/// TCG keys its translated code by physical page *and* virtual address, so a shared library
/// mapped at a new random address by every process gets translated anew each time (about 2,250
/// blocks per `chroot /host /bin/true`, against 20 without randomization). The blocks pile up on
/// the pages of libraries that stay cached (libc, while the agent runs), and when such a page is
/// freed and zeroed, qemu 7.2 removes each of its blocks from a linked list it walks from the
/// head: the guest's `rep stosb` then cleared 28 bytes per second and the vCPU soft-locked for
/// 43 s (docs/vm-node.md, "Why guest commands stalled").
///
/// `no_timer_check` skips the boot-time test of the IO-APIC timer route, which counts timer
/// ticks during a 10-tick busy wait on the TSC. Under TCG the TSC follows the host's clock while
/// the ticks come from qemu's main loop, so on a busy host fewer than five arrive in time; with
/// interrupt remapping on (the vIOMMU that vfio needs) the kernel then panics ("timer doesn't
/// work through Interrupt-remapped IO-APIC") instead of trying another route. qemu's PIT is
/// routed correctly, which is all the test would establish.
///
/// `nokaslr` keeps the kernel's symbols at the same addresses at every boot, so that the
/// symbols one guest listed name the vCPUs' places of another that does not come up (see
/// [`super::vcpus`]).
pub(crate) const APPEND: &str =
    "console=ttyS0 intel_iommu=on panic=-1 loglevel=5 norandmaps no_timer_check nokaslr";

/// The arguments of `qemu-system-x86_64` (without the program).
pub(crate) fn args(spec: &QemuSpec) -> Vec<String> {
    let half = MEMORY_MIB / 2;
    let mut args: Vec<String> = [
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-vga",
        "none",
        "-no-reboot",
        "-machine",
        "q35,accel=tcg,kernel-irqchip=split",
        "-cpu",
        "max",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut push = |items: &[String]| args.extend(items.iter().cloned());
    push(&[
        // One socket per NUMA node, so no CPU shares a cache with one on the other node.
        "-smp".into(),
        format!("{CPUS},sockets={CPUS},cores=1,threads=1"),
        "-m".into(),
        format!("{MEMORY_MIB}M"),
        "-object".into(),
        format!("memory-backend-ram,id=mem0,size={half}M"),
        "-object".into(),
        format!("memory-backend-ram,id=mem1,size={half}M"),
        "-numa".into(),
        "node,nodeid=0,cpus=0,memdev=mem0".into(),
        "-numa".into(),
        "node,nodeid=1,cpus=1,memdev=mem1".into(),
        "-device".into(),
        "intel-iommu,intremap=on,device-iotlb=on".into(),
        "-kernel".into(),
        spec.kernel.display().to_string(),
        "-initrd".into(),
        spec.initramfs.display().to_string(),
        "-append".into(),
        APPEND.into(),
        "-serial".into(),
        format!("file:{}", spec.console_log.display()),
        "-monitor".into(),
        format!("unix:{},server=on,wait=off", spec.monitor.display()),
        "-netdev".into(),
        format!("tap,id=mgmt,ifname={MGMT_TAP},script=no,downscript=no"),
        "-device".into(),
        format!("virtio-net-pci,netdev=mgmt,mac={},addr=0x2", spec.mgmt_mac),
        "-netdev".into(),
        format!("tap,id=data,ifname={DATA_TAP},script=no,downscript=no,queues={DATA_QUEUES}"),
        "-device".into(),
        format!(
            "virtio-net-pci,netdev=data,mac={},addr=0x3,disable-legacy=on,iommu_platform=on,\
             ats=on,mq=on,rss=on,vectors={}",
            spec.data_mac,
            2 * DATA_QUEUES + 2
        ),
        "-virtfs".into(),
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap".into(),
        "-virtfs".into(),
        format!(
            "local,path={},mount_tag=share,security_model=none,multidevs=remap",
            spec.share.display()
        ),
    ]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iommu_comes_before_the_nics_and_the_data_nic_sits_behind_it() {
        let spec = QemuSpec {
            kernel: "/k".into(),
            initramfs: "/i".into(),
            console_log: "/c".into(),
            monitor: "/m".into(),
            share: "/s".into(),
            mgmt_mac: "52:54:00:12:01:00".into(),
            data_mac: "52:54:00:13:01:00".into(),
        };
        let args = args(&spec);
        let at = |needle: &str| {
            args.iter()
                .position(|a| a.contains(needle))
                .unwrap_or_else(|| panic!("no {needle} in {args:?}"))
        };
        assert!(at("intel-iommu") < at("virtio-net-pci,netdev=mgmt"));
        let data = &args[at("virtio-net-pci,netdev=data")];
        for flag in [
            "iommu_platform=on",
            "ats=on",
            "mq=on",
            "rss=on",
            "vectors=10",
            "disable-legacy=on",
        ] {
            assert!(data.contains(flag), "{data}");
        }
        assert!(args[at("tap,id=data")].contains("queues=4"));
        assert!(args.contains(&"q35,accel=tcg,kernel-irqchip=split".to_string()));
        assert!(!args.iter().any(|a| a.starts_with("user")));
    }
}
