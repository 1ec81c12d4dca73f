//! The runtime that puts stacks on real packets: one [`shard::Shard`] per dedicated core,
//! each pinned with sched_setaffinity and serving one device queue, the [`services`] on
//! their listeners, a graceful stop, and the [`stats`] the runner publishes. Flows reach
//! their shard through the NIC's RSS ([`userstack::rss`]): the runtime steers by the NIC's own key
//! and table when the config has them (`rss`, read by the agent), by the configured key
//! otherwise ([`Runtime::steering`], [`steering`]); an active open picks a source port that
//! hashes back to its own queue ([`userstack::rss::RssTable::connect`]). Each shard's stack
//! skips the TCP checksum work its device does ([`crate::device::Device::checksum_offload`]).

pub mod config;
pub mod interface;
pub mod services;
pub mod shard;
pub mod stats;
pub mod steering;

use crate::device::af_xdp::XdpSocket;
use crate::device::tap::Tap;
use crate::device::xdp_redirect::{RedirectProgram, RedirectRules};
use crate::device::Device;
use hoststack_runner_api::{
    Backend, ChecksumOffloadStats, RunState, RunnerConfig, RunnerStats, RxStamps, ServiceKind,
    ServiceStats, ShardStats, SteeringStats, StopStats,
};
use services::{HttpResponses, ServiceSpec};
use shard::{Control, Shard, ShardFigures};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;
use steering::Steering;
use userstack::counters::Counter;
use userstack::rss::to_hex;
use userstack::stack::{Stack, StackConfig};
use userstack::tcp;
use userstack::time::Instant;

/// Running shards and what keeps their traffic flowing (the XDP program).
#[derive(Debug)]
pub struct Runtime {
    control: Arc<Control>,
    shards: Vec<(u32, Arc<ShardFigures>)>,
    threads: Vec<JoinHandle<()>>,
    /// Detached when dropped, after the shards stopped.
    redirect: Option<RedirectProgram>,
    backend: Backend,
    mode: &'static str,
    services: Vec<ServiceStats>,
    steering: Steering,
    /// What every shard's device does for its stack.
    checksum_offload: ChecksumOffloadStats,
}

/// Pins the calling thread to `core`.
pub fn pin_to_core(core: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if core >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return Err(format!("core {core} does not exist"));
    }
    // SAFETY: core is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: set is a valid cpu_set_t of the given size; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "core {core}: sched_setaffinity: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Checks that every core is online and allowed to this process.
fn check_cores(cores: &[u32]) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t, filled by the kernel.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: allowed is a valid cpu_set_t of the given size.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    for core in cores.iter().map(|&core| core as usize) {
        // SAFETY: CPU_ISSET reads inside the set for core < CPU_SETSIZE.
        let present = core < 8 * std::mem::size_of::<libc::cpu_set_t>()
            && unsafe { libc::CPU_ISSET(core, &allowed) };
        if !present {
            return Err(format!(
                "core {core} does not exist or is not allowed to this process"
            ));
        }
    }
    Ok(())
}

/// A secret for ISNs and flow hashing, different per run.
fn secret() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n == 8 {
        u64::from_ne_bytes(bytes)
    } else {
        u64::from(std::process::id()) << 32
            ^ std::time::UNIX_EPOCH
                .elapsed()
                .map_or(0, |d| d.as_nanos() as u64)
    }
}

impl Runtime {
    /// Sets up the devices and starts one pinned shard per core; returns once every shard
    /// listens. Any failure leaves nothing attached.
    pub fn start(config: &RunnerConfig) -> Result<Runtime, String> {
        config::validate(config)?;
        check_cores(&config.cores)?;
        let (ip, prefix_len) = config::parse_address(&config.address)?;
        #[cfg_attr(not(feature = "dpdk"), allow(unused_mut))]
        let mut steering = config::steering(config)?;
        let mut services = Vec::new();
        for service in &config.services {
            let spec = match service.kind {
                ServiceKind::Echo => ServiceSpec::Echo,
                ServiceKind::Discard => ServiceSpec::Discard,
                ServiceKind::Http => ServiceSpec::Http(Arc::new(HttpResponses::new(
                    service.body.as_deref().unwrap_or("").as_bytes(),
                ))),
            };
            services.push((service.port, spec));
        }
        let mut stack_config = StackConfig::new(interface::placeholder_mac(ip), ip, prefix_len);
        stack_config.gateway = config::gateway(config)?;
        stack_config.tcp = config::apply_tcp_options(&config.tcp, tcp::Config::default());
        stack_config.secret = secret();
        let (devices, redirect, mode): (Vec<Box<dyn Device + Send>>, _, _) = match config.backend {
            Backend::AfXdp => {
                stack_config.mac = interface::mac_address(&config.interface)?;
                stack_config.mtu = interface::mtu(&config.interface)?.min(FRAME_MTU);
                let mut sockets = Vec::new();
                for queue in 0..config.cores.len() as u32 {
                    let socket = XdpSocket::open(&config.interface, queue).map_err(|e| {
                        format!("AF_XDP socket on {} queue {queue}: {e}", config.interface)
                    })?;
                    sockets.push(socket);
                }
                let rules = RedirectRules {
                    address: ip,
                    ports: config::service_ports(config),
                    ephemeral_ports: stack_config.ephemeral_ports,
                };
                let mut program = RedirectProgram::attach(&config.interface, &rules)
                    .map_err(|e| format!("XDP on {}: {e}", config.interface))?;
                for (queue, socket) in sockets.iter().enumerate() {
                    program
                        .add_socket(queue as u32, socket)
                        .map_err(|e| format!("XDP on {}: {e}", config.interface))?;
                }
                let mode = sockets[0].mode().as_str();
                let devices = sockets
                    .into_iter()
                    .map(|s| Box::new(s) as Box<dyn Device + Send>)
                    .collect();
                (devices, Some(program), mode)
            }
            Backend::Tap => {
                if config.cores.len() != 1 {
                    return Err("backend tap has one queue: give exactly one core".into());
                }
                let tap = Tap::open(&config.interface)
                    .map_err(|e| format!("TAP {}: {e}", config.interface))?;
                (vec![Box::new(tap) as Box<dyn Device + Send>], None, "tap")
            }
            #[cfg(feature = "dpdk")]
            Backend::Dpdk => {
                let opened =
                    crate::device::dpdk::open(&config::dpdk_port(config)?, &steering.table.key)?;
                // The port hashes with the configured key (programmed by `open`) over its
                // default round-robin table of `reta_size` entries.
                steering.table = userstack::rss::RssTable::spread_over(
                    &steering.table.key,
                    config.cores.len() as u32,
                    u32::from(opened.reta_size),
                );
                stack_config.mac = opened.mac;
                stack_config.mtu = opened.mtu;
                let devices = opened
                    .queues
                    .into_iter()
                    .map(|q| Box::new(q) as Box<dyn Device + Send>)
                    .collect();
                (devices, None, "dpdk")
            }
            #[cfg(not(feature = "dpdk"))]
            Backend::Dpdk => {
                return Err(
                    "backend dpdk: this build has no DPDK support (build the runner \
                            with `--features dpdk`; see docs/userstack.md)"
                        .into(),
                )
            }
        };
        let control = Arc::new(Control::new(Duration::from_millis(config.drain_timeout_ms)));
        let epoch = std::time::Instant::now();
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut shards = Vec::new();
        let mut threads = Vec::new();
        let connections = config::client_connections(config)?;
        let shard_count = config.cores.len();
        let mut checksum_offload = ChecksumOffloadStats { rx: true, tx: true };
        for (queue, (&core, device)) in config.cores.iter().zip(devices).enumerate() {
            let figures = Arc::new(ShardFigures::default());
            let offload = device.checksum_offload();
            checksum_offload.rx &= offload.rx_verified;
            checksum_offload.tx &= offload.tx_completes;
            let mut stack = Stack::new(
                StackConfig {
                    rx_checksum_offload: offload.rx_verified,
                    tx_checksum_offload: offload.tx_completes,
                    ..stack_config
                },
                Instant::ZERO,
            );
            // Connection j opens on shard j mod shards, from a port whose replies the NIC
            // steers back to that shard's queue.
            let clients = connections
                .iter()
                .skip(queue)
                .step_by(shard_count)
                .map(|&remote| {
                    steering
                        .table
                        .connect(&mut stack, queue as u32, remote)
                        .map_err(|e| format!("clients: connecting to {remote}: {e:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let shard = Shard::new(stack, device, services.clone(), &clients, config.idle)?;
            let (control, thread_figures, ready) =
                (control.clone(), figures.clone(), ready_tx.clone());
            let thread = std::thread::Builder::new()
                .name(format!("userstack-{core}"))
                .spawn(move || {
                    let pinned = pin_to_core(core as usize);
                    let ok = pinned.is_ok();
                    let _ = ready.send(pinned);
                    if ok {
                        shard.run(&control, &thread_figures, epoch);
                    }
                })
                .map_err(|e| format!("starting the shard for core {core}: {e}"))?;
            shards.push((core, figures));
            threads.push(thread);
        }
        drop(ready_tx);
        let mut runtime = Runtime {
            control,
            shards,
            threads,
            redirect,
            backend: config.backend,
            mode,
            services: config
                .services
                .iter()
                .map(|s| ServiceStats {
                    kind: s.kind,
                    port: s.port,
                })
                .collect(),
            steering,
            checksum_offload,
        };
        for _ in 0..runtime.threads.len() {
            let answer = ready_rx
                .recv()
                .unwrap_or_else(|_| Err("a shard thread died while starting".into()));
            if let Err(e) = answer {
                runtime.stop();
                return Err(e);
            }
        }
        Ok(runtime)
    }

    /// The stats document in `state`. TCP frames a device dropped for a bad checksum count
    /// in `netstat` as well (`InCsumErrors`, `InErrs`), where Linux and the stack count them,
    /// so the counters read the same with checksum offload on or off. The shards report
    /// receive waits only where the XDP program stamps frames (`rxStamps`).
    pub fn stats(&self, state: RunState) -> RunnerStats {
        let rx_stamps = self.redirect.as_ref().map(|r| r.rx_stamps().clone());
        let stamped = rx_stamps == Some(RxStamps::Enabled);
        let mut counters = userstack::counters::Counters::default();
        let mut stop = StopStats::default();
        let mut shards = Vec::new();
        for (queue, (core, figures)) in self.shards.iter().enumerate() {
            if let Ok(c) = figures.counters.lock() {
                counters.merge(&c);
            }
            let drops = figures.drops.lock().ok().and_then(|d| *d);
            let checksum_errors = drops.map_or(0, |d| d.checksum_errors);
            counters.add(Counter::InCsumErrors, checksum_errors);
            counters.add(Counter::InErrs, checksum_errors);
            let s = figures.stop();
            stop.drained += s.drained;
            stop.reset += s.reset;
            shards.push(ShardStats {
                core: *core,
                queue: queue as u32,
                rx_packets: figures.rx_packets.load(Ordering::Relaxed),
                tx_packets: figures.tx_packets.load(Ordering::Relaxed),
                connections: figures.connections.load(Ordering::Relaxed),
                busy_nanos: figures.busy_nanos.load(Ordering::Relaxed),
                run_nanos: figures.run_nanos.load(Ordering::Relaxed),
                drops,
                rx_wait: stamped
                    .then(|| figures.rx_wait.lock().ok().and_then(|w| w.clone()))
                    .flatten(),
            });
        }
        RunnerStats {
            pid: std::process::id(),
            state,
            backend: Some(self.backend),
            mode: self.mode.to_string(),
            shards,
            services: self.services.clone(),
            steering: Some(SteeringStats {
                source: self.steering.source,
                key: to_hex(&self.steering.table.key),
                indirection_size: self.steering.table.indirection.len() as u32,
            }),
            checksum_offload: Some(self.checksum_offload),
            rx_stamps,
            netstat: stats::netstat(&counters),
            stop: matches!(state, RunState::Draining | RunState::Stopped).then_some(stop),
        }
    }

    /// The RSS key and table the shards steer by: shard *i* serves queue *i*, and whatever
    /// runs on it opens connections with [`userstack::rss::RssTable::connect`] on that queue.
    pub fn steering(&self) -> &Steering {
        &self.steering
    }

    /// Starts the graceful stop without waiting for it.
    pub fn begin_stop(&self) {
        self.control.drain();
    }

    /// Whether every shard has finished.
    pub fn is_stopped(&self) -> bool {
        self.shards
            .iter()
            .all(|(_, f)| f.finished.load(Ordering::Acquire))
    }

    /// Stops gracefully (drain, then reset at the deadline), waits for the shards and
    /// detaches the XDP program.
    pub fn stop(&mut self) {
        self.control.drain();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        self.redirect = None;
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The largest IP MTU a UMEM frame holds (2048-byte frames, Ethernet header and slack).
const FRAME_MTU: usize = 2048 - 64;
