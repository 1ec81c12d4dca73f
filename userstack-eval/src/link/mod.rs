//! The evaluation on real packets: each row on a netem link ([`topology`]) between Linux's TCP
//! ([`linux`]) and userstack's runner ([`runner`]), in the three pairings, measured over a
//! window after a warm-up. Runs as root on a kernel with netem, veth and XDP: the VM node's
//! guest (`hoststack-lab evaluate`).

pub mod cpu;
pub mod linux;
pub mod runner;
pub mod topology;

use crate::report::{moved, Counters, Load, Measurement, Pairing};
use crate::rows::Row;
use cpu::CpuTime;
use hoststack_runner_api::{IdlePolicy, QueueDrops, RunnerStats, RxStamps, RxWait};
use linux::{SendLimits, Senders, Sink};
use runner::{Role, Runner};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use topology::{
    Topology, RECEIVER_GATEWAY, RECEIVER_IF, RECEIVER_LINUX, RECEIVER_NS, RECEIVER_USERSTACK,
    SENDER_GATEWAY, SENDER_IF, SENDER_NS, SENDER_USERSTACK,
};

/// How each run is made.
#[derive(Clone, Debug)]
pub struct Options {
    /// The runner binary, `hoststack-userstack`.
    pub runner: PathBuf,
    /// The whole run, warm-up included.
    pub duration: Duration,
    /// The start of the run left out of the figures.
    pub warmup: Duration,
    /// The core the runner's shard is pinned to.
    pub core: u32,
    /// Where the runner's config and stats files go.
    pub dir: PathBuf,
    /// A core to keep busy with a spinning thread for the whole run, whatever the pairing:
    /// with the runner's core, Linux → Linux gets the CPUs the runner's busy poll leaves the
    /// kernel in the other pairings (a control for a CPU-bound guest).
    pub spin_core: Option<u32>,
    /// Keep the kernel's packet work off `core` in every pairing (RPS on every veth), as a
    /// user-space stack's dedicated core is kept free of it.
    pub steer: bool,
    /// Whether the runner's shard sleeps when idle or polls without pause.
    pub runner_idle: IdlePolicy,
}

/// A thread spinning on one core until dropped.
struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(core: u32) -> Result<Spinner, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it for a core
                // below CPU_SETSIZE, checked first.
                let pinned = unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    if (core as usize) < 8 * std::mem::size_of::<libc::cpu_set_t>() {
                        libc::CPU_SET(core as usize, &mut set);
                    }
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
                };
                let _ = ready_tx.send(pinned);
                while pinned && !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            }
        });
        match ready_rx.recv() {
            Ok(true) => Ok(Spinner {
                stop,
                thread: Some(thread),
            }),
            _ => Err(format!("--spin-core {core}: cannot pin a thread there")),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

enum Receiver {
    Linux(Sink),
    Userstack(Runner),
}

enum Sender {
    Linux(Senders),
    Userstack(Runner),
}

/// What one look at both ends saw.
struct Sample {
    at: Instant,
    flows: Vec<u64>,
    sender: Counters,
    receiver: Counters,
    cpus: Vec<CpuTime>,
    /// The Linux sender's chronograph.
    limits: Option<SendLimits>,
    /// The runner's loop, queue and receive waits, summed over shards.
    runner: Option<RunnerLoad>,
    /// The router's data-direction drops.
    path: topology::Drops,
}

/// Runs `row` once with `pairing` on a fresh link and measures the window after the warm-up.
pub fn measure(row: &Row, pairing: Pairing, options: &Options) -> Result<Measurement, String> {
    if options.warmup >= options.duration {
        return Err("the warm-up must be shorter than the run".into());
    }
    let rps = options.steer.then(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        topology::rps_mask(cpus, options.core)
    });
    let _topology = Topology::up(row, rps.as_deref())?;
    let _spinner = options.spin_core.map(Spinner::start).transpose()?;
    let receiver_ip = if pairing.userstack_receives() {
        RECEIVER_USERSTACK
    } else {
        RECEIVER_LINUX
    };
    let targets: Vec<SocketAddrV4> = (0..row.flows)
        .map(|i| SocketAddrV4::new(receiver_ip, row.port(i)))
        .collect();
    let ports: Vec<u16> = row.ports().iter().map(|&(port, _)| port).collect();
    let receiver = if pairing.userstack_receives() {
        Receiver::Userstack(start_userstack(options, row.sack, Role::Receive(ports))?)
    } else {
        Receiver::Linux(Sink::start(RECEIVER_NS, &ports).map_err(|e| format!("sink: {e}"))?)
    };
    let sender = if pairing.userstack_sends() {
        Sender::Userstack(start_userstack(options, row.sack, Role::Send(targets))?)
    } else {
        Sender::Linux(Senders::start(SENDER_NS, &targets).map_err(|e| format!("senders: {e}"))?)
    };
    std::thread::sleep(options.warmup);
    let first = sample(row, &sender, &receiver)?;
    let window = options.duration - options.warmup;
    let ping = Ping::start(receiver_ip, window)?;
    let sender_rtt_ms = watch_sender_rtt(&sender, window)?;
    let last = sample(row, &sender, &receiver)?;
    let ping_rtt_ms = ping.average_ms()?;
    drop(sender);
    drop(receiver);
    let seconds = (last.at - first.at).as_secs_f64();
    let flow_mbps = first
        .flows
        .iter()
        .zip(&last.flows)
        .map(|(a, b)| b.saturating_sub(*a) as f64 * 8.0 / seconds / 1e6)
        .collect();
    Ok(Measurement {
        row: row.label.to_string(),
        pairing,
        spin_core: options.spin_core,
        steered: options.steer,
        runner_idle: if pairing == Pairing::LinuxToLinux {
            IdlePolicy::default()
        } else {
            options.runner_idle
        },
        seconds,
        flow_mbps,
        sender: moved(&first.sender, &last.sender),
        receiver: moved(&first.receiver, &last.receiver),
        load: Load {
            sender_rtt_ms,
            ping_rtt_ms,
            ..load(&first, &last)
        },
    })
}

/// `ping` from the sender's namespace to the receiver's address for the measured window, five
/// echoes a second: the round trip of the same path and queue as the data's, answered by the
/// receiving host itself (Linux's softirq, or the runner through AF_XDP) with no TCP in it.
struct Ping(std::process::Child);

impl Ping {
    fn start(to: std::net::Ipv4Addr, window: Duration) -> Result<Ping, String> {
        let seconds = window.as_secs().max(1).to_string();
        let address = to.to_string();
        std::process::Command::new("ip")
            .args(["netns", "exec", SENDER_NS, "ping", "-q", "-n", "-i", "0.2"])
            .args(["-w", seconds.as_str(), address.as_str()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map(Ping)
            .map_err(|e| format!("ping: {e}"))
    }

    /// The echoes' mean round trip, in milliseconds (`None` when none came back).
    fn average_ms(self) -> Result<Option<f64>, String> {
        let out = self
            .0
            .wait_with_output()
            .map_err(|e| format!("ping: {e}"))?;
        Ok(ping_average_ms(&String::from_utf8_lossy(&out.stdout)))
    }
}

/// The mean of iputils ping's summary line `rtt min/avg/max/mdev = 20.1/21.4/25.0/0.9 ms`.
fn ping_average_ms(summary: &str) -> Option<f64> {
    let line = summary.lines().find(|l| l.contains("min/avg/max"))?;
    let values = line.split('=').nth(1)?.trim();
    values.split('/').nth(1)?.trim().parse().ok()
}

/// Waits `window`; when Linux sends, returns its connections' mean smoothed RTT in
/// milliseconds, averaged over a look every second (the delay its ACK clock runs on).
fn watch_sender_rtt(sender: &Sender, window: Duration) -> Result<Option<f64>, String> {
    let Sender::Linux(senders) = sender else {
        std::thread::sleep(window);
        return Ok(None);
    };
    let end = Instant::now() + window;
    let mut means = Vec::new();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_secs(1)));
        let rtts = senders
            .smoothed_rtts()
            .map_err(|e| format!("TCP_INFO: {e}"))?;
        if !rtts.is_empty() {
            means.push(rtts.iter().map(|&us| f64::from(us)).sum::<f64>() / rtts.len() as f64 / 1e3);
        }
    }
    Ok((!means.is_empty()).then(|| means.iter().sum::<f64>() / means.len() as f64))
}

/// Where the time between two samples went.
fn load(first: &Sample, last: &Sample) -> Load {
    let (cpu_busy, cpu_softirq) = cpu::shares(&first.cpus, &last.cpus);
    let share = |part: u64, whole: u64| part as f64 / whole.max(1) as f64;
    let sending = first.limits.zip(last.limits).map(|(a, b)| {
        let busy = b.busy_us.saturating_sub(a.busy_us);
        (
            share(b.rwnd_limited_us.saturating_sub(a.rwnd_limited_us), busy),
            share(
                b.sndbuf_limited_us.saturating_sub(a.sndbuf_limited_us),
                busy,
            ),
        )
    });
    let runner = first.runner.as_ref().zip(last.runner.as_ref());
    Load {
        cpu_busy,
        cpu_softirq,
        rwnd_limited: sending.map(|s| s.0),
        sndbuf_limited: sending.map(|s| s.1),
        runner_busy: runner.map(|(a, b)| {
            share(
                b.busy_nanos.saturating_sub(a.busy_nanos),
                b.run_nanos.saturating_sub(a.run_nanos),
            )
        }),
        runner_drops: runner.map(|(a, b)| b.drops.combine(a.drops, u64::saturating_sub)),
        runner_rx_wait: runner
            .filter(|(_, b)| b.rx_stamps_unavailable.is_none())
            .map(|(a, b)| b.rx_wait.combine(&a.rx_wait, u64::saturating_sub)),
        runner_rx_stamps_unavailable: runner.and_then(|(_, b)| b.rx_stamps_unavailable.clone()),
        path_losses: Some(last.path.lost.saturating_sub(first.path.lost)),
        queue_drops: Some(last.path.overflowed.saturating_sub(first.path.overflowed)),
        sender_rtt_ms: None,
        ping_rtt_ms: None,
    }
}

/// The runner's loop time, busy and in all, its queue drops and how long received frames
/// waited, summed over its shards, and why its frames carried no stamps to measure the wait.
#[derive(Default)]
struct RunnerLoad {
    busy_nanos: u64,
    run_nanos: u64,
    drops: QueueDrops,
    rx_wait: RxWait,
    rx_stamps_unavailable: Option<String>,
}

fn runner_load(stats: &RunnerStats) -> RunnerLoad {
    let rx_stamps_unavailable = match &stats.rx_stamps {
        Some(RxStamps::Unavailable { reason }) => Some(reason.clone()),
        _ => None,
    };
    stats.shards.iter().fold(
        RunnerLoad {
            rx_stamps_unavailable,
            ..RunnerLoad::default()
        },
        |load, shard| RunnerLoad {
            busy_nanos: load.busy_nanos + shard.busy_nanos,
            run_nanos: load.run_nanos + shard.run_nanos,
            drops: load
                .drops
                .combine(shard.drops.unwrap_or_default(), |a, b| a + b),
            rx_wait: match &shard.rx_wait {
                Some(wait) => load.rx_wait.combine(wait, |a, b| a + b),
                None => load.rx_wait,
            },
            rx_stamps_unavailable: load.rx_stamps_unavailable,
        },
    )
}

/// The runner at its end of the link for `role`: the receiver's namespace and veth to
/// receive, the sender's to send.
fn start_userstack(options: &Options, sack: bool, role: Role) -> Result<Runner, String> {
    let (ns, interface, address, gateway) = match role {
        Role::Receive(_) => (
            RECEIVER_NS,
            RECEIVER_IF,
            RECEIVER_USERSTACK,
            RECEIVER_GATEWAY,
        ),
        Role::Send(_) => (SENDER_NS, SENDER_IF, SENDER_USERSTACK, SENDER_GATEWAY),
    };
    let config = runner::config(
        interface,
        address,
        gateway,
        options.core,
        sack,
        &role,
        options.runner_idle,
    );
    Runner::start(&options.runner, ns, &config, &options.dir)
}

/// Bytes per flow (padded with zeros to the row's flows: a flow that never connected moved
/// nothing) and both ends' counters.
fn sample(row: &Row, sender: &Sender, receiver: &Receiver) -> Result<Sample, String> {
    let at = Instant::now();
    let mut flows = match (sender, receiver) {
        (_, Receiver::Linux(sink)) => sink.delivered(),
        (Sender::Linux(senders), Receiver::Userstack(_)) => senders
            .acknowledged()
            .map_err(|e| format!("TCP_INFO: {e}"))?,
        (Sender::Userstack(_), Receiver::Userstack(_)) => {
            return Err("userstack on both ends is not a pairing".into())
        }
    };
    flows.resize(row.flows.max(flows.len()), 0);
    let tcp_only = |mut counters: Counters| {
        counters.retain(|section, _| section == "Tcp" || section == "TcpExt");
        counters
    };
    let cpus = cpu::read().map_err(|e| format!("/proc/stat: {e}"))?;
    let path = topology::drops()?;
    let mut runner = None;
    let (sender, limits) = match sender {
        Sender::Linux(senders) => (
            linux::counters(SENDER_NS).map_err(|e| format!("counters: {e}"))?,
            Some(senders.limits().map_err(|e| format!("TCP_INFO: {e}"))?),
        ),
        Sender::Userstack(r) => {
            let stats = r.stats()?;
            runner = Some(runner_load(&stats));
            (stats.netstat, None)
        }
    };
    let receiver = match receiver {
        Receiver::Linux(_) => linux::counters(RECEIVER_NS).map_err(|e| format!("counters: {e}"))?,
        Receiver::Userstack(r) => {
            let stats = r.stats()?;
            runner = Some(runner_load(&stats));
            stats.netstat
        }
    };
    Ok(Sample {
        at,
        flows,
        sender: tcp_only(sender),
        receiver: tcp_only(receiver),
        cpus,
        limits,
        runner,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_without_receive_stamps_gives_its_reason_and_no_wait() {
        let stats = |stamps: serde_json::Value| -> RunnerStats {
            serde_json::from_value(serde_json::json!({
                "pid": 1, "state": "running", "mode": "copy", "services": [], "netstat": {},
                "rxStamps": stamps,
                "shards": [ { "core": 1, "queue": 0, "rxPackets": 9, "txPackets": 9,
                              "connections": 1, "busyNanos": 5, "runNanos": 10 } ]
            }))
            .expect("a runner's stats")
        };
        let reason = "the kernel refuses bpf_xdp_adjust_meta to XDP programs";
        let load = runner_load(&stats(
            serde_json::json!({ "state": "unavailable", "reason": reason }),
        ));
        assert_eq!(load.rx_stamps_unavailable.as_deref(), Some(reason));
        assert_eq!((load.busy_nanos, load.rx_wait.frames), (5, 0));
        let load = runner_load(&stats(serde_json::json!({ "state": "enabled" })));
        assert_eq!(load.rx_stamps_unavailable, None);
    }

    #[test]
    fn the_mean_round_trip_is_read_from_pings_summary() {
        let summary = "--- 198.18.2.2 ping statistics ---\n\
            100 packets transmitted, 97 received, 3% packet loss, time 19800ms\n\
            rtt min/avg/max/mdev = 20.112/21.437/25.001/0.912 ms\n";
        assert_eq!(ping_average_ms(summary), Some(21.437));
        assert_eq!(
            ping_average_ms("100 packets transmitted, 0 received, 100% packet loss\n"),
            None
        );
    }
}
