//! The runner's scaling from one shard to two: the `hoststack-userstack` runner over AF_XDP
//! (copy mode) on a veth pair with one receive/transmit queue per shard (`ip link add …
//! numrxqueues N numtxqueues N`), serving echo and discard to many kernel TCP connections
//! from the client namespace. Two figures per shard count:
//!
//! - `rr`: aggregate 64-byte request/response transactions per second, [`RR_CONNECTIONS`]
//!   connections each with one transaction in flight;
//! - `bulk`: aggregate Gbit/s of [`BULK_CONNECTIONS`] connections writing 64 KiB chunks to
//!   discard;
//!
//! and the scaling efficiency rate(2) / (2 × rate(1)) per wall second, with the ratio of the
//! rates per runner CPU second (two shards against one). Rounds interleave the shard counts
//! (1, 2, 1, 2, …; the veth and the runner are made afresh for each); the JSON has every round
//! and min/median/max over them, both cores' busy shares, the runner's, each shard's and the
//! clients' CPU seconds, and each shard's connections and frames.
//!
//! Steering: a veth has no RSS. It hands a frame to the peer's receive queue numbered like the
//! queue the sender transmitted it on (the skb's queue mapping; a frame mapped past the peer's
//! receive queues takes the non-NAPI path and skips its XDP program), and the XDP program
//! redirects it to the AF_XDP socket of that queue. So the clients' kernel steers, by its
//! choice of transmit queue: XPS where set, else the socket's random flow hash. Found here
//! (kernel 6.18):
//! - by hash, the connections do spread over both queues, but a shard learns a neighbour only
//!   from ARP it receives, and the client's ARP requests and replies always leave on the same
//!   queue (their hash is fixed): the other shard never learns the client's address, its
//!   SYN-ACKs wait for ARP, and its connections only come up when a SYN retransmission (which
//!   re-rolls the hash) lands on the first shard — 4 of 32 connections on queue 0, connects
//!   taking seconds or timing out;
//! - XPS by receive queue (`xps_rxqs`) sends every socket to queue 0: a veth passes the
//!   sender's queue mapping through, so the receiver records queue q - 1 (none for queue 0),
//!   and shard 0 resets the flows of shard 1;
//! - so the clients' end gets XPS by CPU (what is sent on core C leaves on the queue of the
//!   shard on core C) and a permanent neighbour entry for the stack's address (otherwise the
//!   first SYN waits for ARP and leaves from the core that received the reply, on the wrong
//!   queue). The connections then split by client thread, evenly, not by hash; the report gives
//!   each shard's connections and frames. A client segment sent from the other core (a timer
//!   that fires there) would still reach the wrong shard and be reset; none was seen.
//!
//! The runner only answers these connections (it opens none), so its own steering table is not
//! used.
//!
//! What bounds the result on a 2-core machine: there is no free core to add. The two client
//! threads (one pinned to each core, the same in both cases) and the kernel's softirq work for
//! the veth (the XDP program and the copy into the UMEM run on the sending core; the clients'
//! receive runs on the shard's core, inside the runner's `sendto`) share the cores with the
//! busy-polling shards, and the scheduler splits a core between a shard and a client thread.
//! With one shard (core 1), core 0 holds only client thread 0 and softirq work and is partly
//! idle while core 1 is full; with two, both cores are full. So rate(2) shows how the same two
//! cores are divided, not what a second core adds: request/response is bounded by the clients'
//! kernel TCP (about half of all CPU time), bulk by the one shard's share of core 1 (which is
//! why its efficiency can exceed 1). Per runner CPU second is no cleaner, since a busy-polling
//! shard spends whatever CPU the scheduler gives it. Only a machine with cores to spare for the
//! clients measures the shards themselves.
//!
//! `cargo bench -p userstack-runner --bench shards` measures 3 rounds of 5 s per figure and
//! shard count; without `--bench` (as `cargo test --all-targets` runs it) 1 round of 0.3 s, to
//! prove it works. Needs root (namespaces and XDP). Figures go to docs/userstack.md, never
//! into assertions.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{
    as_client, busy_share, cpu_times, in_client, in_namespaces, pin, sh, spread, task_cpu,
    thread_id, veth_with_queues, Epoll, Runner,
};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 67, 50);
const SUBNET: u8 = 67;
const NODE_IF: &str = "uss0";
const CLIENT_IF: &str = "uss1";
const ECHO: u16 = 7;
const DISCARD: u16 = 9;
/// Request/response connections, spread over the client threads.
const RR_CONNECTIONS: usize = 64;
/// Bulk connections, spread over the client threads.
const BULK_CONNECTIONS: usize = 8;
/// Request and response size.
const MESSAGE: usize = 64;
/// A bulk write.
const CHUNK: usize = 64 * 1024;
/// Shard counts compared, in each round's order.
const SHARD_COUNTS: [usize; 2] = [1, 2];

/// How long each figure runs, and how many rounds.
fn plan() -> (Duration, usize) {
    if common::full_run() {
        (Duration::from_secs(5), 3)
    } else {
        (Duration::from_millis(300), 1)
    }
}

fn main() {
    // Records `--bench` for the child re-run under unshare.
    common::full_run();
    in_namespaces("shards", run);
}

/// The machine's cores: one client thread is pinned to each.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The cores of `shards` shards: the last ones.
fn shard_cores(shards: usize) -> Vec<usize> {
    (cores().saturating_sub(shards)..cores()).collect()
}

/// What the clients do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Figure {
    /// 64-byte request/response on echo.
    Rr,
    /// 64 KiB writes to discard.
    Bulk,
}

impl Figure {
    fn name(self) -> &'static str {
        match self {
            Figure::Rr => "rr",
            Figure::Bulk => "bulk",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Figure::Rr => "transactions/s",
            Figure::Bulk => "Gbit/s",
        }
    }

    fn connections(self) -> usize {
        match self {
            Figure::Rr => RR_CONNECTIONS,
            Figure::Bulk => BULK_CONNECTIONS,
        }
    }

    fn port(self) -> u16 {
        match self {
            Figure::Rr => ECHO,
            Figure::Bulk => DISCARD,
        }
    }

    /// The rate of `units` (transactions or bytes) over `seconds`.
    fn rate(self, units: u64, seconds: f64) -> f64 {
        match self {
            Figure::Rr => units as f64 / seconds,
            Figure::Bulk => units as f64 * 8.0 / seconds / 1e9,
        }
    }
}

/// What one client thread did: transactions or bytes, seconds, its own CPU seconds.
struct ClientResult {
    units: u64,
    seconds: f64,
    cpu_seconds: f64,
}

/// One client thread on `core`: opens `connections` connections, says so on `ready` (the
/// runner's stats are read then), waits at `start`, then drives them for `duration`.
fn client(
    figure: Figure,
    core: usize,
    connections: usize,
    (ready, start): (mpsc::Sender<()>, &Barrier),
    duration: Duration,
) -> ClientResult {
    pin(core);
    let to = SocketAddrV4::new(STACK_IP, figure.port());
    let streams: Vec<TcpStream> = (0..connections)
        .map(|_| {
            let s = TcpStream::connect(to).expect("connecting to the runner");
            s.set_nodelay(true).expect("TCP_NODELAY");
            s.set_nonblocking(true).expect("non-blocking");
            s
        })
        .collect();
    let epoll = Epoll::new();
    let interest = match figure {
        Figure::Rr => libc::EPOLLIN,
        Figure::Bulk => libc::EPOLLOUT,
    };
    for (token, s) in streams.iter().enumerate() {
        epoll.add(std::os::fd::AsRawFd::as_raw_fd(s), token as u64, interest);
    }
    let stat = format!("/proc/self/task/{}/stat", thread_id());
    let _ = ready.send(());
    drop(ready);
    start.wait();
    let cpu_before = task_cpu(&stat);
    let start = Instant::now();
    let units = match figure {
        Figure::Rr => request_response(&epoll, &streams, start + duration),
        Figure::Bulk => bulk(&epoll, &streams, start + duration),
    };
    let seconds = start.elapsed().as_secs_f64();
    ClientResult {
        units,
        seconds,
        cpu_seconds: task_cpu(&stat) - cpu_before,
    }
}

/// One 64-byte transaction in flight per connection until `deadline`; transactions done.
fn request_response(epoll: &Epoll, streams: &[TcpStream], deadline: Instant) -> u64 {
    let request = [7u8; MESSAGE];
    let mut buf = [0u8; 4 * MESSAGE];
    // Response bytes received per connection for the transaction in flight.
    let mut received = vec![0usize; streams.len()];
    for mut s in streams {
        s.write_all(&request).expect("first request");
    }
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; streams.len()];
    let mut transactions = 0u64;
    while Instant::now() < deadline {
        let ready = epoll.wait(&mut events, 10);
        for event in &events[..ready] {
            let i = event.u64 as usize;
            let mut s = &streams[i];
            match s.read(&mut buf) {
                Ok(0) => panic!("the runner closed an echo connection"),
                Ok(n) => received[i] += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("echo read: {e}"),
            }
            while received[i] >= MESSAGE {
                received[i] -= MESSAGE;
                transactions += 1;
                // 64 bytes always fit an empty send buffer.
                s.write_all(&request).expect("request");
            }
        }
    }
    transactions
}

/// Writes 64 KiB chunks on every writable connection until `deadline`; bytes written.
fn bulk(epoll: &Epoll, streams: &[TcpStream], deadline: Instant) -> u64 {
    let chunk = vec![0x5au8; CHUNK];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; streams.len()];
    let mut bytes = 0u64;
    while Instant::now() < deadline {
        let ready = epoll.wait(&mut events, 10);
        for event in &events[..ready] {
            let mut s = &streams[event.u64 as usize];
            match s.write(&chunk) {
                Ok(n) => bytes += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("bulk write: {e}"),
            }
        }
    }
    bytes
}

/// The runner's per-shard figures: (core, queue, connections, rx frames, tx frames).
fn shard_figures(stats: &Value) -> Vec<[u64; 5]> {
    stats["shards"]
        .as_array()
        .map(|shards| {
            shards
                .iter()
                .map(|s| {
                    let f = |name: &str| s[name].as_u64().unwrap_or(0);
                    [
                        f("core"),
                        f("queue"),
                        f("connections"),
                        f("rxPackets"),
                        f("txPackets"),
                    ]
                })
                .collect()
        })
        .unwrap_or_default()
}

/// CPU seconds of each shard thread of runner `pid` (named `userstack-CORE`), by core.
fn shard_cpu(pid: u64) -> Vec<(u64, f64)> {
    let mut shards: Vec<(u64, f64)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|task| {
                    let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
                    let core = comm.trim().strip_prefix("userstack-")?.parse().ok()?;
                    let stat = task.path().join("stat");
                    Some((core, task_cpu(stat.to_str()?)))
                })
                .collect()
        })
        .unwrap_or_default();
    shards.sort_by_key(|&(core, _)| core);
    shards
}

/// One figure against a running runner with `shards` shards.
fn measure(runner: &mut Runner, shards: usize, figure: Figure, duration: Duration) -> Value {
    // Shown only when the run fails (the parent prints the child's stderr then).
    eprintln!("measuring {} with {shards} shard(s)", figure.name());
    let pid = runner.stats()["pid"].as_u64().expect("the runner's pid");
    let threads = cores();
    let start = Arc::new(Barrier::new(threads + 1));
    let (ready_tx, ready_rx) = mpsc::channel();
    let clients = {
        let start = start.clone();
        std::thread::spawn(move || {
            as_client(move || {
                std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..threads)
                        .map(|core| {
                            // Connections split evenly; the first threads take the remainder.
                            let count = figure.connections() / threads
                                + usize::from(core < figure.connections() % threads);
                            let sync = (ready_tx.clone(), &*start);
                            scope.spawn(move || client(figure, core, count, sync, duration))
                        })
                        .collect();
                    drop(ready_tx);
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("client thread"))
                        .collect::<Vec<_>>()
                })
            })
        })
    };
    // A client that fails drops its sender without a word: waiting ends either way.
    for _ in 0..threads {
        ready_rx
            .recv_timeout(common::PATIENCE)
            .expect("the clients connect (a client thread failed or hung)");
    }
    // Every connection is up: the runner's stats show where each landed.
    let total = figure.connections() as u64;
    let before = runner.wait_for(|s| {
        shard_figures(s).iter().map(|f| f[2]).sum::<u64>() == total && s["shards"].is_array()
    });
    let (cpu_before, runner_before, shard_cpu_before) = (
        cpu_times(),
        task_cpu(&format!("/proc/{pid}/stat")),
        shard_cpu(pid),
    );
    start.wait();
    let results = clients
        .join()
        .unwrap_or_else(|_| panic!("a client failed; the runner's stats: {}", runner.stats()));
    let (cpu_after, runner_after, shard_cpu_after) = (
        cpu_times(),
        task_cpu(&format!("/proc/{pid}/stat")),
        shard_cpu(pid),
    );
    // The runner publishes every 100 ms: wait for figures from after the run.
    std::thread::sleep(Duration::from_millis(250));
    let after = runner.stats();
    let units: u64 = results.iter().map(|r| r.units).sum();
    let seconds = results.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let value = figure.rate(units, seconds);
    let runner_seconds = runner_after - runner_before;
    let shard_rows: Vec<Value> = shard_figures(&before)
        .iter()
        .zip(shard_figures(&after))
        .map(|(b, a)| {
            let cpu = |list: &[(u64, f64)]| {
                list.iter()
                    .find(|(core, _)| *core == b[0])
                    .map_or(0.0, |&(_, s)| s)
            };
            json!({
                "core": b[0],
                "queue": b[1],
                "connections": b[2],
                "rxPackets": a[3] - b[3],
                "txPackets": a[4] - b[4],
                "cpuSeconds": cpu(&shard_cpu_after) - cpu(&shard_cpu_before),
            })
        })
        .collect();
    let busy: Vec<f64> = (0..cores())
        .map(|core| busy_share(&cpu_before, &cpu_after, core))
        .collect();
    let busy_core_seconds: f64 = busy.iter().sum::<f64>() * seconds;
    json!({
        "shards": shards,
        "value": value,
        "perBusyCoreSecond": if busy_core_seconds > 0.0 { value * seconds / busy_core_seconds } else { 0.0 },
        "seconds": seconds,
        "runnerCpuSeconds": runner_seconds,
        "perRunnerCpuSecond": if runner_seconds > 0.0 { value * seconds / runner_seconds } else { 0.0 },
        "clientCpuSeconds": results.iter().map(|r| r.cpu_seconds).sum::<f64>(),
        "coreBusy": busy,
        "perShard": shard_rows,
    })
}

/// Steers the client's frames to the shard on the sending core: XPS on the client end (what
/// is sent on core C leaves on the queue of the shard on core C), and a permanent neighbour
/// entry for the stack's address, so that no SYN waits for an ARP reply and then leaves from
/// the core that received the reply. See the top for why hashing does not work here.
fn steer_by_client_core(shards: usize) {
    let link = sh(&["ip", "-o", "link", "show", "dev", NODE_IF]);
    let mac = link
        .split_whitespace()
        .skip_while(|&word| word != "link/ether")
        .nth(1)
        .expect("the node end's MAC address");
    in_client(&[
        "ip",
        "neigh",
        "replace",
        &STACK_IP.to_string(),
        "lladdr",
        mac,
        "dev",
        CLIENT_IF,
        "nud",
        "permanent",
    ]);
    if shards < 2 {
        return;
    }
    for (queue, core) in shard_cores(shards).into_iter().enumerate() {
        let path = format!("/sys/class/net/{CLIENT_IF}/queues/tx-{queue}/xps_cpus");
        in_client(&["sh", "-c", &format!("echo {:x} > {path}", 1u64 << core)]);
    }
}

/// The runner's config: echo and discard on `shards` shards.
fn config(shards: usize) -> Value {
    json!({
        "interface": NODE_IF,
        "backend": "afXdp",
        "cores": shard_cores(shards),
        "address": format!("{STACK_IP}/24"),
        "tcp": { "nagle": false },
        "services": [ { "kind": "Echo", "port": ECHO }, { "kind": "Discard", "port": DISCARD } ]
    })
}

fn run() {
    let (duration, rounds) = plan();
    let figures = [Figure::Rr, Figure::Bulk];
    // results[shard count index][figure index]: one measurement per round.
    let mut results = vec![vec![Vec::new(); figures.len()]; SHARD_COUNTS.len()];
    let mut modes = Vec::new();
    for _ in 0..rounds {
        for (i, &shards) in SHARD_COUNTS.iter().enumerate() {
            veth_with_queues(NODE_IF, CLIENT_IF, SUBNET, shards as u32);
            steer_by_client_core(shards);
            let mut runner = Runner::start(&config(shards));
            modes.push(runner.stats()["mode"].clone());
            for (j, &figure) in figures.iter().enumerate() {
                results[i][j].push(measure(&mut runner, shards, figure, duration));
            }
            runner.stop();
            sh(&["ip", "link", "del", NODE_IF]);
        }
    }
    let summary: serde_json::Map<String, Value> = figures
        .iter()
        .enumerate()
        .map(|(j, &figure)| {
            let of = |i: usize, field: &str| -> Value {
                let values: Vec<f64> = results[i][j]
                    .iter()
                    .filter_map(|r| r[field].as_f64())
                    .collect();
                spread(&values)
            };
            let median = |i: usize, field: &str| of(i, field)["median"].as_f64().unwrap_or(0.0);
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            let per_shard_count: serde_json::Map<String, Value> = SHARD_COUNTS
                .iter()
                .enumerate()
                .map(|(i, &shards)| {
                    let figures = json!({
                        "value": of(i, "value"),
                        "perRunnerCpuSecond": of(i, "perRunnerCpuSecond"),
                        "perBusyCoreSecond": of(i, "perBusyCoreSecond"),
                        "rounds": results[i][j],
                    });
                    (format!("shards{shards}"), figures)
                })
                .collect();
            let figures = json!({
                "unit": figure.unit(),
                "connections": figure.connections(),
                "byShards": per_shard_count,
                "efficiency": {
                    // rate(2) / (2 × rate(1)): what the second shard's core added.
                    "perWallSecond": ratio(median(1, "value"), 2.0 * median(0, "value")),
                    // (rate per runner CPU second with 2) / (the same with 1): whether a
                    // shard's CPU second does as much work when there are two.
                    "perRunnerCpuSecond": ratio(
                        median(1, "perRunnerCpuSecond"),
                        median(0, "perRunnerCpuSecond"),
                    ),
                },
            });
            (figure.name().to_string(), figures)
        })
        .collect();
    let report = json!({
        "path": "veth pair between two network namespaces, one queue per shard",
        "backend": "afXdp",
        "mode": modes.first().cloned().unwrap_or(Value::Null),
        "secondsPerFigure": duration.as_secs_f64(),
        "rounds": rounds,
        "clientThreads": cores(),
        "figures": summary,
        "loadAverage": sh(&["cat", "/proc/loadavg"]).trim(),
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("the report as JSON")
    );
}
