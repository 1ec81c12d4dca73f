//! userstack against kernel TCP on the same veth pair, in one run: the `hoststack-userstack`
//! runner (AF_XDP, copy mode, one shard on the last core) and kernel servers (threads pinned
//! to the same core) in the node namespace, clients (kernel TCP, pinned to core 0) in the
//! client namespace. Three measurements per side:
//!
//! - `rrPerSecond`: 64-byte request/response transactions on one connection (echo);
//! - `bulkGbitPerSecond`: one connection writing 64 KiB chunks to discard;
//! - `connectionsPerSecond`: connect, 1-byte echo, close, one after the other.
//!
//! With the busy CPU of core 0 (clients, and the kernel's softirq work of the client side and,
//! on veth, of whichever side sends) and of the server core from /proc/stat, and the server's
//! own CPU time (the runner process, or the kernel server threads). Prints one JSON document.
//!
//! `cargo bench -p userstack --bench veth` measures 5 s per figure; without `--bench` (as
//! `cargo test --all-targets` runs it) 0.3 s, to prove it works. Needs root (namespaces and
//! XDP), like the interop tests. Figures go to docs/userstack.md, never into assertions.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{as_client, in_namespaces, sh, shard_core, veth, Runner};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 50);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 1);
const ECHO: u16 = 7;
const DISCARD: u16 = 9;
/// Where the parent tells the re-run child how long to measure.
const SECONDS_ENV: &str = "USERSTACK_BENCH_SECONDS";

fn main() {
    if std::env::var(common::CHILD).is_err() {
        let seconds = if std::env::args().any(|a| a == "--bench") {
            "5"
        } else {
            "0.3"
        };
        std::env::set_var(SECONDS_ENV, seconds);
    }
    in_namespaces("veth", run);
}

fn measure_for() -> Duration {
    let seconds: f64 = std::env::var(SECONDS_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.3);
    Duration::from_secs_f64(seconds)
}

/// Busy and total jiffies per CPU, from /proc/stat.
fn cpu_times() -> Vec<(u64, u64)> {
    std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            let idle = v[3] + v[4];
            let total: u64 = v.iter().take(8).sum();
            (total - idle, total)
        })
        .collect()
}

/// CPU seconds (user + system) of a task, from /proc/<path>/stat.
fn task_cpu(stat_path: &str) -> f64 {
    let text = std::fs::read_to_string(stat_path).unwrap();
    let after = &text[text.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after "pid (comm) ".
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

fn pin(core: usize) {
    // SAFETY: a zeroed set with one CPU; sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One figure with the CPU it cost.
fn measured(server_cpu: &dyn Fn() -> f64, work: impl FnOnce(Duration) -> (f64, f64)) -> Value {
    let duration = measure_for();
    let (cpu_before, server_before) = (cpu_times(), server_cpu());
    let (value, seconds) = work(duration);
    let (cpu_after, server_after) = (cpu_times(), server_cpu());
    let busy = |core: usize| {
        let (b0, t0) = cpu_before[core];
        let (b1, t1) = cpu_after[core];
        (b1 - b0) as f64 / (t1 - t0).max(1) as f64
    };
    let server_seconds = server_after - server_before;
    json!({
        "value": value,
        "seconds": seconds,
        "clientCoreBusy": busy(0),
        "serverCoreBusy": busy(shard_core()),
        "serverCpuSeconds": server_seconds,
        "perServerCpuSecond": if server_seconds > 0.0 { value * seconds / server_seconds } else { 0.0 },
    })
}

/// 64-byte transactions on one connection; (transactions per second, seconds).
fn request_response(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(0);
        let mut s = TcpStream::connect(to).unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = [7u8; 64];
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            s.write_all(&buf).unwrap();
            s.read_exact(&mut buf).unwrap();
            n += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        (n as f64 / seconds, seconds)
    })
}

/// One connection writing to discard; (Gbit/s, seconds).
fn bulk(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(0);
        let mut s = TcpStream::connect(to).unwrap();
        let chunk = vec![0x5au8; 65536];
        let start = Instant::now();
        let mut bytes = 0u64;
        while start.elapsed() < duration {
            s.write_all(&chunk).unwrap();
            bytes += chunk.len() as u64;
        }
        let seconds = start.elapsed().as_secs_f64();
        (bytes as f64 * 8.0 / seconds / 1e9, seconds)
    })
}

/// Connect, 1-byte echo, close, in a loop; (connections per second, seconds).
fn connections(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(0);
        let start = Instant::now();
        let mut n = 0u64;
        let mut buf = [1u8; 1];
        while start.elapsed() < duration {
            let mut s = TcpStream::connect(to).unwrap();
            s.write_all(&buf).unwrap();
            s.read_exact(&mut buf).unwrap();
            n += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        (n as f64 / seconds, seconds)
    })
}

/// Kernel echo and discard servers on the node's address, one thread per connection, all
/// pinned to the server core; returns the flag that stops them and their CPU time.
fn kernel_servers() -> (Arc<AtomicBool>, Arc<dyn Fn() -> f64 + Send + Sync>) {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let finished = Arc::new(std::sync::Mutex::new(0.0f64));
    for (port, echo) in [(ECHO, true), (DISCARD, false)] {
        let listener = TcpListener::bind((NODE_IP, port)).unwrap();
        let (stop, tasks, finished) = (stop.clone(), tasks.clone(), finished.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let mut s = stream.unwrap();
                let (tasks, finished) = (tasks.clone(), finished.clone());
                std::thread::spawn(move || {
                    pin(shard_core());
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    let path = format!("/proc/self/task/{tid}/stat");
                    tasks.lock().unwrap().push(path.clone());
                    s.set_nodelay(true).unwrap();
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || (echo && s.write_all(&buf[..n]).is_err()) {
                            break;
                        }
                    }
                    let spent = task_cpu(&path);
                    let mut tasks = tasks.lock().unwrap();
                    tasks.retain(|p| *p != path);
                    *finished.lock().unwrap() += spent;
                });
            }
        });
    }
    let cpu = move || {
        let live: f64 = tasks
            .lock()
            .unwrap()
            .iter()
            .map(|p| std::fs::read_to_string(p).map_or(0.0, |_| task_cpu(p)))
            .sum();
        live + *finished.lock().unwrap()
    };
    (stop, Arc::new(cpu))
}

fn run() {
    veth("usv0", "usv1", 64);
    common::in_client(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"]);
    let config = json!({
        "interface": "usv0",
        "backend": "afXdp",
        "cores": [shard_core()],
        "address": format!("{STACK_IP}/24"),
        "tcp": { "nagle": false },
        "services": [ { "kind": "Echo", "port": ECHO }, { "kind": "Discard", "port": DISCARD } ]
    });
    let runner = Runner::start(&config);
    let pid = runner.stats()["pid"].as_u64().unwrap();
    let runner_cpu = move || task_cpu(&format!("/proc/{pid}/stat"));
    let (stop, kernel_cpu) = kernel_servers();
    let kernel_cpu = move || kernel_cpu();
    let side = |ip: Ipv4Addr, cpu: &dyn Fn() -> f64| {
        json!({
            "rrPerSecond": measured(cpu, |d| request_response(SocketAddrV4::new(ip, ECHO), d)),
            "bulkGbitPerSecond": measured(cpu, |d| bulk(SocketAddrV4::new(ip, DISCARD), d)),
            "connectionsPerSecond": measured(cpu, |d| connections(SocketAddrV4::new(ip, ECHO), d)),
        })
    };
    let userstack = side(STACK_IP, &runner_cpu);
    let kernel = side(NODE_IP, &kernel_cpu);
    let mode = runner.stats()["mode"].clone();
    let netstat = runner.stats()["netstat"]["Tcp"].clone();
    stop.store(true, Ordering::Relaxed);
    runner.stop();
    let report = json!({
        "path": "veth pair between two network namespaces",
        "seconds": measure_for().as_secs_f64(),
        "userstack": { "backend": "afXdp", "mode": mode, "shards": 1, "figures": userstack, "tcp": netstat },
        "kernel": { "figures": kernel },
        "loadAverage": sh(&["cat", "/proc/loadavg"]).trim(),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}
