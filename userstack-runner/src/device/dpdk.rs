//! DPDK (cargo feature `dpdk`): the stack's frames on a PCI device bound to vfio-pci, polled
//! from user space with DPDK's poll-mode driver. One process initialises DPDK's EAL once
//! ([`eal_args`]), configures the port with one rx/tx queue pair per shard, takes mbufs from
//! one mempool sized from its [`PortConfig`] ([`check_mempool`]) and hands each shard a
//! [`DpdkQueue`]. Frames are copied between mbufs and the [`Device`] trait's buffers. The
//! device takes its own [`PortConfig`]; the runtime fills it from the runner's config.
//!
//! TCP checksum offload where the port offers it (virtio's PMD does when the host device
//! negotiates `VIRTIO_NET_F_GUEST_CSUM` and `VIRTIO_NET_F_CSUM`, as QEMU's tap netdev does):
//! - receive (`RTE_ETH_RX_OFFLOAD_TCP_CKSUM` in `rx_offload_capa`, enabled in
//!   `rxmode.offloads`): each mbuf's `RTE_MBUF_F_RX_L4_CKSUM_*` flag decides — GOOD, and NONE
//!   (the data is valid, the checksum was never filled in: virtio's NEEDS_CSUM), hand the
//!   frame over; BAD drops and counts it; UNKNOWN has it checked in software first. The stack
//!   then checks no TCP checksum. Without the capability every flag would be UNKNOWN, so the
//!   stack checks them itself.
//! - transmit (`RTE_ETH_TX_OFFLOAD_TCP_CKSUM` in `tx_offload_capa`, enabled in
//!   `txmode.offloads`): an IPv4/TCP frame whose checksum field holds the pseudo-header sum
//!   (the stack's tx offload, which is what DPDK expects there) goes out with
//!   `RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_TCP_CKSUM`, `l2_len` and `l3_len`.
//!
//! The bindings are generated at build time (bindgen over `dpdk/shim.h` against `pkg-config
//! libdpdk`); DPDK's inline burst and mbuf functions and its flag macros come through the C
//! shim `dpdk/shim.c`.

use super::{ChecksumOffload, Device, RxChecksum};
use hoststack_runner_api::QueueDrops;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use userstack::wire::{offload, EthernetAddress};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/dpdk_bindings.rs"));
}

/// DPDK's driver plugins, found by build.rs (`<libdir>/dpdk/pmds-<ABI>`).
pub const PMD_DIR: &str = env!("HOSTSTACK_DPDK_PMD_DIR");
/// The plugins the device loads with `-d`: the virtio-net PMD and the ring mempool handler
/// (Debian's shared DPDK loads no driver by itself, and without a mempool handler no pool
/// can be created).
pub const PLUGINS: [&str; 2] = ["librte_net_virtio.so", "librte_mempool_ring.so"];
/// Receive descriptors per queue (each holds an mbuf from the pool while posted).
pub const RX_DESCRIPTORS: u16 = 256;
/// Transmit descriptors per queue (each holds an mbuf until the NIC is done with it).
pub const TX_DESCRIPTORS: u16 = 256;
/// Frames moved per burst call.
const BURST: usize = 32;
/// Tries to hand a burst to a full transmit ring before the rest is dropped.
const TX_TRIES: usize = 64;
/// Largest frame copied out of an mbuf chain.
const MAX_FRAME: usize = 9216;
/// Spare frame buffers kept per queue.
const SPARE_BUFFERS: usize = 1024;

/// What [`open`] sets up: the device, the cores whose shards poll it and its memory. The
/// error messages name the runner config's fields these come from (`dpdk.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// One queue pair per core; the first core is EAL's main lcore.
    pub cores: Vec<usize>,
    /// The device's PCI address; the device is bound to vfio-pci.
    pub pci_address: String,
    /// The hugetlbfs mount EAL takes its memory from.
    pub hugepage_dir: String,
    /// Mbufs in the mempool.
    pub mempool_mbufs: u32,
}

/// Set once the EAL was initialised: DPDK allows it once per process.
static EAL_STARTED: AtomicBool = AtomicBool::new(false);

/// The mbufs one queue pair can hold at once: its posted receive descriptors, its transmit
/// ring and one burst in flight.
pub const fn mbufs_per_queue() -> u32 {
    RX_DESCRIPTORS as u32 + TX_DESCRIPTORS as u32 + BURST as u32
}

/// Checks that a pool of `mbufs` serves `queues` queue pairs without running dry while every
/// descriptor holds one.
pub fn check_mempool(mbufs: u32, queues: usize) -> Result<(), String> {
    let needed = mbufs_per_queue().saturating_mul(queues as u32);
    if mbufs < needed {
        return Err(format!(
            "dpdk.mempoolMbufs {mbufs} is too small for {queues} queue pair(s): each needs \
             {} ({RX_DESCRIPTORS} rx + {TX_DESCRIPTORS} tx descriptors + a burst of {BURST}), \
             at least {needed} in all",
            mbufs_per_queue()
        ));
    }
    Ok(())
}

/// The EAL arguments for `config` (argv[0] included): the cores as lcores with the first as
/// the main one, one memory channel, only the configured PCI device (`-a`), hugepages from
/// `hugepage_dir` (unlinked once mapped, so a killed runner leaves no files), a file prefix of
/// its own per instance (`pid`), the virtio PMD and the ring mempool from [`PMD_DIR`], no
/// telemetry socket.
pub fn eal_args(config: &PortConfig, pid: u32) -> Vec<String> {
    let lcores: Vec<String> = config.cores.iter().map(usize::to_string).collect();
    let mut args = vec![
        "hoststack-userstack".to_string(),
        "-l".into(),
        lcores.join(","),
        "--main-lcore".into(),
        lcores.first().cloned().unwrap_or_else(|| "0".into()),
        "-n".into(),
        "1".into(),
        "-a".into(),
        config.pci_address.clone(),
        "--huge-dir".into(),
        config.hugepage_dir.clone(),
        "--huge-unlink".into(),
        "--file-prefix".into(),
        format!("hoststack-userstack-{pid}"),
        "--no-telemetry".into(),
    ];
    for plugin in PLUGINS {
        args.push("-d".into());
        args.push(format!("{PMD_DIR}/{plugin}"));
    }
    args
}

/// The message of DPDK's `rte_errno`.
fn rte_error() -> String {
    // SAFETY: reads the calling thread's rte_errno.
    let errno = unsafe { sys::hs_errno() };
    // SAFETY: rte_strerror returns a static or thread-local C string.
    let text = unsafe { CStr::from_ptr(sys::rte_strerror(errno)) };
    format!("{} (rte_errno {errno})", text.to_string_lossy())
}

/// A DPDK error code (negative errno) as text.
fn code_error(code: i32) -> String {
    std::io::Error::from_raw_os_error(-code).to_string()
}

/// The calling thread's CPU affinity.
fn affinity() -> Result<libc::cpu_set_t, String> {
    // SAFETY: a zeroed cpu_set_t, filled by the kernel.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid cpu_set_t of the given size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc == 0 {
        Ok(set)
    } else {
        Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Initialises the EAL with `args`. rte_eal_init pins the calling thread to the main lcore;
/// the caller's affinity is put back afterwards (the shards pin themselves).
fn start_eal(args: &[String]) -> Result<(), String> {
    if EAL_STARTED.swap(true, Ordering::AcqRel) {
        return Err("DPDK's EAL is already initialised in this process".into());
    }
    let before = affinity()?;
    // EAL keeps pointers into argv (e.g. the plugin paths): the strings live for the process.
    let owned: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_str()).map_err(|_| format!("EAL argument {a:?} has a NUL")))
        .collect::<Result<_, _>>()?;
    let owned: &'static [CString] = Box::leak(owned.into_boxed_slice());
    let argv: &'static mut [*mut libc::c_char] = Box::leak(
        owned
            .iter()
            .map(|a| a.as_ptr().cast_mut())
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    // SAFETY: argv holds argc valid NUL-terminated strings that outlive the process's use.
    let rc = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
    if rc < 0 {
        return Err(format!(
            "rte_eal_init({}): {}",
            args[1..].join(" "),
            rte_error()
        ));
    }
    // SAFETY: before is a valid cpu_set_t; 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &before) };
    Ok(())
}

/// A started DPDK port and its mempool; stopped, closed and freed (and the EAL cleaned up)
/// when the last queue is dropped.
#[derive(Debug)]
struct Port {
    id: u16,
    pool: *mut sys::rte_mempool,
}

// SAFETY: the port id and pool pointer are process-wide DPDK objects; the mempool is
// thread-safe and each queue is polled by one thread only.
unsafe impl Send for Port {}
// SAFETY: as above; Port exposes no interior mutation.
unsafe impl Sync for Port {}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by open(); every queue user is gone (last Arc).
        unsafe {
            sys::rte_eth_dev_stop(self.id);
            sys::rte_eth_dev_close(self.id);
            sys::rte_mempool_free(self.pool);
            sys::rte_eal_cleanup();
        }
    }
}

/// One rx/tx queue pair of the port, polled by one shard.
#[derive(Debug)]
pub struct DpdkQueue {
    port: Arc<Port>,
    queue: u16,
    mbufs: [*mut sys::rte_mbuf; BURST],
    spare: Vec<Vec<u8>>,
    /// What the port does with TCP checksums (the same for every queue).
    offload: ChecksumOffload,
    /// Received TCP frames dropped for a bad checksum.
    checksum_errors: u64,
}

// SAFETY: a queue pair is used by the one thread that owns this value; the mbuf pointers
// are scratch space, empty between calls.
unsafe impl Send for DpdkQueue {}

/// What [`open`] sets up: one queue per shard, and the port's MAC address and MTU.
#[derive(Debug)]
pub struct Opened {
    /// One queue pair per core of the config, in order.
    pub queues: Vec<DpdkQueue>,
    /// The port's MAC address.
    pub mac: EthernetAddress,
    /// The port's IP MTU.
    pub mtu: usize,
    /// Entries of the port's RSS redirection table (its default spreads the queues
    /// round-robin).
    pub reta_size: u16,
}

/// Initialises the EAL from `config`, configures and starts the port at its PCI address
/// with one queue pair per core and a mempool of its `mempool_mbufs` mbufs; with more than
/// one queue, RSS hashes with `rss_key` (so the stack's steering is exactly the port's).
pub fn open(config: &PortConfig, rss_key: &[u8]) -> Result<Opened, String> {
    let queues = config.cores.len();
    check_mempool(config.mempool_mbufs, queues)?;
    if !std::path::Path::new(&config.hugepage_dir).is_dir() {
        return Err(format!(
            "dpdk.hugepageDir {}: no such directory (mount hugetlbfs there)",
            config.hugepage_dir
        ));
    }
    start_eal(&eal_args(config, std::process::id()))?;
    let name = CString::new(config.pci_address.as_str()).map_err(|_| "PCI address has a NUL")?;
    let mut id = 0u16;
    // SAFETY: name is a C string; id is written on success.
    let rc = unsafe { sys::rte_eth_dev_get_port_by_name(name.as_ptr(), &mut id) };
    if rc != 0 {
        return Err(format!(
            "no DPDK port for {} ({}): is it bound to vfio-pci, and did the PMD probe it?",
            config.pci_address,
            code_error(rc)
        ));
    }
    let (port, reta_size, offload) = configure(id, queues, config, rss_key)?;
    let port = Arc::new(port);
    let mut mac = sys::rte_ether_addr::default();
    // SAFETY: mac is a valid rte_ether_addr for the started port.
    let rc = unsafe { sys::rte_eth_macaddr_get(id, &mut mac) };
    if rc != 0 {
        return Err(format!("rte_eth_macaddr_get: {}", code_error(rc)));
    }
    let mut mtu = 0u16;
    // SAFETY: mtu is written on success.
    let rc = unsafe { sys::rte_eth_dev_get_mtu(id, &mut mtu) };
    if rc != 0 {
        return Err(format!("rte_eth_dev_get_mtu: {}", code_error(rc)));
    }
    let queues = (0..queues as u16)
        .map(|queue| DpdkQueue {
            port: port.clone(),
            queue,
            mbufs: [std::ptr::null_mut(); BURST],
            spare: Vec::with_capacity(SPARE_BUFFERS),
            offload,
            checksum_errors: 0,
        })
        .collect();
    Ok(Opened {
        queues,
        mac: EthernetAddress(mac.addr_bytes),
        mtu: usize::from(mtu),
        reta_size,
    })
}

/// Configures port `id` with `queues` queue pairs (RSS over IPv4/TCP with `rss_key` when more
/// than one: left unset, the PMD picks its own key — virtio's is random — and the stack
/// could not predict the queues) and the TCP checksum offloads it offers (see the module
/// doc), creates the mempool, sets the queues up and starts the port. Also returns the size
/// of its RSS redirection table and the checksum offloads enabled.
fn configure(
    id: u16,
    queues: usize,
    config: &PortConfig,
    rss_key: &[u8],
) -> Result<(Port, u16, ChecksumOffload), String> {
    let mut info = sys::rte_eth_dev_info::default();
    // SAFETY: info is a valid rte_eth_dev_info.
    let rc = unsafe { sys::rte_eth_dev_info_get(id, &mut info) };
    if rc != 0 {
        return Err(format!("rte_eth_dev_info_get: {}", code_error(rc)));
    }
    let most = usize::from(info.max_rx_queues.min(info.max_tx_queues));
    if queues > most {
        return Err(format!(
            "{} has {most} queue pair(s); {queues} cores need one each",
            config.pci_address
        ));
    }
    let mut conf = sys::rte_eth_conf::default();
    if queues > 1 {
        // SAFETY: returns a constant.
        let wanted = unsafe { sys::hs_rss_ipv4_tcp() };
        let hashes = wanted & info.flow_type_rss_offloads;
        if hashes == 0 {
            return Err(format!(
                "{} offers no RSS over IPv4/TCP, so flows cannot be spread over {queues} \
                 shards: give one core",
                config.pci_address
            ));
        }
        if usize::from(info.hash_key_size) != rss_key.len() {
            return Err(format!(
                "{} takes an RSS key of {} bytes, the stack's configured key has {}: the \
                 queues could not be predicted, give one core",
                config.pci_address,
                info.hash_key_size,
                rss_key.len()
            ));
        }
        conf.rxmode.mq_mode = sys::rte_eth_rx_mq_mode_RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_hf = hashes;
        // DPDK copies the key during rte_eth_dev_configure; it is never written through.
        conf.rx_adv_conf.rss_conf.rss_key = rss_key.as_ptr().cast_mut();
        conf.rx_adv_conf.rss_conf.rss_key_len = info.hash_key_size;
    }
    // SAFETY: return constants.
    let (rx_tcp, tx_tcp) = unsafe {
        (
            sys::hs_rx_offload_tcp_cksum(),
            sys::hs_tx_offload_tcp_cksum(),
        )
    };
    let offload = ChecksumOffload {
        rx_verified: info.rx_offload_capa & rx_tcp != 0,
        tx_completes: info.tx_offload_capa & tx_tcp != 0,
    };
    if offload.rx_verified {
        conf.rxmode.offloads |= rx_tcp;
    }
    if offload.tx_completes {
        conf.txmode.offloads |= tx_tcp;
    }
    // SAFETY: conf is a valid rte_eth_conf; the port is not started.
    let rc = unsafe { sys::rte_eth_dev_configure(id, queues as u16, queues as u16, &conf) };
    if rc != 0 {
        return Err(format!("rte_eth_dev_configure: {}", code_error(rc)));
    }
    // SAFETY: plain query; -1 (unknown) is SOCKET_ID_ANY.
    let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
    let pool_name = CString::new(format!("hs_pool_{id}")).expect("no NUL");
    // SAFETY: pool_name is a C string; no per-lcore cache (the shards are not EAL threads).
    let pool = unsafe {
        sys::rte_pktmbuf_pool_create(
            pool_name.as_ptr(),
            config.mempool_mbufs,
            0,
            0,
            sys::hs_default_buf_size(),
            socket,
        )
    };
    if pool.is_null() {
        // SAFETY: the port was configured, not started.
        unsafe { sys::rte_eth_dev_close(id) };
        return Err(format!(
            "a mempool of {} mbufs: {} (are there enough hugepages in {}?)",
            config.mempool_mbufs,
            rte_error(),
            config.hugepage_dir
        ));
    }
    // From here on, dropping `port` stops and closes the port and frees the pool.
    let port = Port { id, pool };
    let socket_id = socket as u32;
    for queue in 0..queues as u16 {
        // SAFETY: the port is configured with this many queues; null conf = the defaults.
        let rc = unsafe {
            sys::rte_eth_rx_queue_setup(
                id,
                queue,
                RX_DESCRIPTORS,
                socket_id,
                std::ptr::null(),
                pool,
            )
        };
        if rc != 0 {
            return Err(format!("rx queue {queue}: {}", code_error(rc)));
        }
        // SAFETY: as above.
        let rc = unsafe {
            sys::rte_eth_tx_queue_setup(id, queue, TX_DESCRIPTORS, socket_id, std::ptr::null())
        };
        if rc != 0 {
            return Err(format!("tx queue {queue}: {}", code_error(rc)));
        }
    }
    // SAFETY: every queue is set up.
    let rc = unsafe { sys::rte_eth_dev_start(id) };
    if rc != 0 {
        return Err(format!("rte_eth_dev_start: {}", code_error(rc)));
    }
    Ok((port, info.reta_size, offload))
}

impl DpdkQueue {
    /// The queue number on the port.
    pub fn queue(&self) -> u16 {
        self.queue
    }
}

impl Device for DpdkQueue {
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize) {
        let mut left = max;
        while left > 0 {
            let want = left.min(BURST);
            // SAFETY: mbufs has room for `want` pointers; the queue belongs to this thread.
            let got = usize::from(unsafe {
                sys::hs_rx_burst(
                    self.port.id,
                    self.queue,
                    self.mbufs.as_mut_ptr(),
                    want as u16,
                )
            });
            for &mbuf in &self.mbufs[..got] {
                // Without rx offload the stack checks every checksum itself.
                let checksum = self.offload.rx_verified.then(|| {
                    // SAFETY: mbuf was just received.
                    match unsafe { sys::hs_mbuf_rx_l4_cksum(mbuf) } {
                        0 => RxChecksum::Unknown,
                        flag if flag < 0 => RxChecksum::Bad,
                        _ => RxChecksum::Verified,
                    }
                });
                let mut buffer = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(MAX_FRAME));
                buffer.resize(MAX_FRAME, 0);
                // SAFETY: mbuf was just received; buffer has MAX_FRAME bytes.
                let len =
                    unsafe { sys::hs_mbuf_copy_out(mbuf, buffer.as_mut_ptr(), MAX_FRAME as u32) };
                // SAFETY: the mbuf is ours and no longer used.
                unsafe { sys::hs_mbuf_free(mbuf) };
                match usize::try_from(len) {
                    Ok(len) => {
                        buffer.truncate(len);
                        if checksum.is_none_or(|c| c.admits(&buffer)) {
                            batch.push(buffer);
                        } else {
                            self.checksum_errors += 1;
                            self.spare.push(buffer);
                        }
                    }
                    Err(_) => self.spare.push(buffer),
                }
            }
            left -= got;
            if got < want {
                break;
            }
        }
    }

    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>) {
        let mut frames = batch.drain(..).peekable();
        while frames.peek().is_some() {
            let mut filled = 0;
            for frame in frames.by_ref().take(BURST) {
                // SAFETY: frame is a valid buffer of its length; the pool is the port's.
                let mbuf = unsafe {
                    sys::hs_mbuf_from(self.port.pool, frame.as_ptr(), frame.len() as u32)
                };
                if !mbuf.is_null() {
                    if self.offload.tx_completes {
                        if let Some(partial) = offload::partial_tcp_checksum(&frame) {
                            // SAFETY: mbuf is ours; both lengths are below 128.
                            unsafe {
                                sys::hs_mbuf_tx_tcp_cksum(
                                    mbuf,
                                    (partial.start - partial.ip_header_len) as u16,
                                    partial.ip_header_len as u16,
                                )
                            };
                        }
                    }
                    self.mbufs[filled] = mbuf;
                    filled += 1;
                }
                if self.spare.len() < SPARE_BUFFERS {
                    let mut frame = frame;
                    frame.clear();
                    self.spare.push(frame);
                }
            }
            let mut sent = 0;
            for _ in 0..TX_TRIES {
                if sent == filled {
                    break;
                }
                // SAFETY: mbufs[sent..filled] are ours; the queue belongs to this thread.
                sent += usize::from(unsafe {
                    sys::hs_tx_burst(
                        self.port.id,
                        self.queue,
                        self.mbufs[sent..].as_mut_ptr(),
                        (filled - sent) as u16,
                    )
                });
            }
            // What a full ring did not take is dropped, as a NIC drops on overflow.
            for &mbuf in &self.mbufs[sent..filled] {
                // SAFETY: not handed to the driver, still ours.
                unsafe { sys::hs_mbuf_free(mbuf) };
            }
        }
    }

    fn drops(&self) -> Option<QueueDrops> {
        Some(QueueDrops {
            checksum_errors: self.checksum_errors,
            ..QueueDrops::default()
        })
    }

    fn checksum_offload(&self) -> ChecksumOffload {
        self.offload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mbufs: u32) -> PortConfig {
        PortConfig {
            cores: vec![1, 3],
            pci_address: "0000:00:03.0".into(),
            hugepage_dir: "/dev/hugepages".into(),
            mempool_mbufs: mbufs,
        }
    }

    #[test]
    fn eal_args_name_the_cores_device_hugepages_prefix_and_plugins() {
        let args = eal_args(&settings(4096), 77);
        let line = args.join(" ");
        assert!(
            line.starts_with("hoststack-userstack -l 1,3 --main-lcore 1 -n 1 "),
            "{line}"
        );
        assert!(line.contains(" -a 0000:00:03.0 "), "{line}");
        assert!(
            line.contains(" --huge-dir /dev/hugepages --huge-unlink "),
            "{line}"
        );
        assert!(
            line.contains(" --file-prefix hoststack-userstack-77 "),
            "{line}"
        );
        assert!(
            line.contains(&format!(" -d {PMD_DIR}/librte_net_virtio.so")),
            "{line}"
        );
        assert!(
            line.ends_with(&format!(" -d {PMD_DIR}/librte_mempool_ring.so")),
            "{line}"
        );
    }

    #[test]
    fn the_plugins_exist_where_the_build_found_them() {
        for plugin in PLUGINS {
            let path = format!("{PMD_DIR}/{plugin}");
            assert!(std::path::Path::new(&path).exists(), "{path} is missing");
        }
    }

    #[test]
    fn a_mempool_must_cover_every_descriptor_of_every_queue() {
        assert!(check_mempool(mbufs_per_queue(), 1).is_ok());
        assert!(check_mempool(4096, 2).is_ok());
        let e = check_mempool(1000, 2).unwrap_err();
        assert!(
            e.contains("dpdk.mempoolMbufs 1000 is too small for 2 queue pair(s)"),
            "{e}"
        );
        assert!(e.contains("at least 1088"), "{e}");
    }

    #[test]
    fn a_second_eal_start_is_refused() {
        // The flag alone, without DPDK: the first start of this process claims it.
        EAL_STARTED.store(true, Ordering::Release);
        let e = start_eal(&["x".into()]).unwrap_err();
        assert!(e.contains("already initialised"), "{e}");
    }
}
