//! userstack against kernel TCP on the same veth pair, with the same thread model, in one run:
//! the `hoststack-userstack` runner (AF_XDP, copy mode, one shard on the last core) and a
//! kernel server (ONE thread pinned to the same core, running an epoll event loop over
//! non-blocking sockets) in the node namespace; kernel TCP clients pinned to core 0 in the
//! client namespace. Three figures per side:
//!
//! - `rr`: 64-byte request/response transactions per second on one connection (echo);
//! - `bulk`: Gbit/s of one connection writing 64 KiB chunks to discard;
//! - `connections`: connections per second: connect, 1-byte echo, close, one after another.
//!
//! Rounds interleave the sides (runner, kernel, runner, kernel, …): while the kernel is
//! measured the runner is paused with SIGSTOP (its XDP program stays attached, so the kernel's
//! frames still pass it, as they do while the runner runs), and while the runner is measured
//! the kernel server sleeps in `epoll_wait` with nothing to do. Each figure gives its rate per
//! wall second and per server CPU second — the server's own CPU time: the runner process, or
//! the kernel server thread (`/proc/self/task/TID/stat`, read before and after each figure) —
//! with the busy shares of the server core and of the client core (/proc/stat), and the rate
//! per busy second of both cores. The JSON has every round and min/median/max over them.
//!
//! What still differs between the sides:
//! - the runner busy-polls its AF_XDP rings (it parks in poll(2) only after 4096 empty turns),
//!   so it holds its core at 100% under any load; the kernel server sleeps in `epoll_wait`
//!   and is woken per event. Per server CPU second therefore favours the kernel at low load
//!   (one latency-bound connection), per wall second it favours the runner;
//! - the kernel's own receive work does not run in its server thread: on a veth, a frame's
//!   receive path (including the XDP program and, for the runner, the copy into its UMEM) runs
//!   in softirq on the *sending* core, so the kernel's TCP receive for the client's frames lands
//!   on core 0 and is charged to the client thread or to softirq there, never to the server
//!   thread; the runner's receive work (TCP) runs in its own process and is charged to it. The
//!   other way round, the clients' receive of what the server sends runs on the server core
//!   inside the runner's `sendto` or the kernel server's `write`, charged to each alike. The
//!   per-busy-core-second figure counts both cores to compare like with like;
//! - the cores' busy shares come from /proc/stat, which samples on the scheduler tick, while a
//!   task's CPU time is exact: a server that sleeps and wakes tens of thousands of times per
//!   second can show more CPU seconds than its core's busy share;
//! - AF_XDP on veth is copy mode: every frame is copied by the kernel into or out of the UMEM,
//!   and every transmit batch costs the runner a `sendto`; the kernel side copies between
//!   socket buffers and user memory in `read`/`write` instead;
//! - with an XDP program on the veth the peer's TSO is off, so both sides see 1500-byte frames
//!   (no GSO/GRO aggregates), and the kernel's frames pass the redirect program too;
//! - the kernel's accepted sockets inherit TCP_NODELAY from the listener; the runner runs with
//!   Nagle off; the kernel autotunes its receive buffers, the runner does not (a known gap).
//!
//! `cargo bench -p userstack-runner --bench veth` measures 3 rounds of 5 s per figure and side;
//! without `--bench` (as `cargo test --all-targets` runs it) 2 rounds of 0.3 s, to prove it
//! works. Needs root (namespaces and XDP), like the interop tests. Figures go to
//! docs/userstack.md, never into assertions.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{
    as_client, busy_share, cpu_times, in_namespaces, pin, sh, shard_core, spread, task_cpu,
    thread_id, veth, Epoll, Runner,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 50);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 1);
const ECHO: u16 = 7;
const DISCARD: u16 = 9;
/// The core the clients run on (the server core is [`shard_core`]).
const CLIENT_CORE: usize = 0;

/// How long each figure runs, and how many rounds per side.
fn plan() -> (Duration, usize) {
    if common::full_run() {
        (Duration::from_secs(5), 3)
    } else {
        (Duration::from_millis(300), 2)
    }
}

fn main() {
    // Records `--bench` for the child re-run under unshare.
    common::full_run();
    in_namespaces("veth", run);
}

/// One measured figure: (rate, seconds it ran).
type Work = fn(SocketAddrV4, Duration) -> (f64, f64);

/// The figures each side measures: name, unit, server port, client.
const FIGURES: [(&str, &str, u16, Work); 3] = [
    ("rr", "transactions/s", ECHO, request_response),
    ("bulk", "Gbit/s", DISCARD, bulk),
    ("connections", "connections/s", ECHO, connections),
];

/// One figure with the CPU it cost; `server_cpu` reads the server's CPU seconds.
fn measured(server_cpu: &dyn Fn() -> f64, work: impl FnOnce() -> (f64, f64)) -> Value {
    let (cpu_before, server_before) = (cpu_times(), server_cpu());
    let (value, seconds) = work();
    let (cpu_after, server_after) = (cpu_times(), server_cpu());
    let server_busy = busy_share(&cpu_before, &cpu_after, shard_core());
    let client_busy = busy_share(&cpu_before, &cpu_after, CLIENT_CORE);
    let server_seconds = server_after - server_before;
    let per = |cpu_seconds: f64| {
        if cpu_seconds > 0.0 {
            value * seconds / cpu_seconds
        } else {
            0.0
        }
    };
    json!({
        "value": value,
        "seconds": seconds,
        "serverCpuSeconds": server_seconds,
        "perServerCpuSecond": per(server_seconds),
        "serverCoreBusy": server_busy,
        "clientCoreBusy": client_busy,
        "perBusyCoreSecond": per((server_busy + client_busy) * seconds),
    })
}

/// 64-byte transactions on one connection; (transactions per second, seconds).
fn request_response(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(CLIENT_CORE);
        let mut s = TcpStream::connect(to).expect("connecting for request/response");
        s.set_nodelay(true).expect("TCP_NODELAY");
        let mut buf = [7u8; 64];
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < duration {
            s.write_all(&buf).expect("request");
            s.read_exact(&mut buf).expect("response");
            n += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        (n as f64 / seconds, seconds)
    })
}

/// One connection writing to discard; (Gbit/s, seconds).
fn bulk(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(CLIENT_CORE);
        let mut s = TcpStream::connect(to).expect("connecting for bulk");
        let chunk = vec![0x5au8; 65536];
        let start = Instant::now();
        let mut bytes = 0u64;
        while start.elapsed() < duration {
            s.write_all(&chunk).expect("bulk write");
            bytes += chunk.len() as u64;
        }
        let seconds = start.elapsed().as_secs_f64();
        (bytes as f64 * 8.0 / seconds / 1e9, seconds)
    })
}

/// Connect, 1-byte echo, close, in a loop; (connections per second, seconds).
fn connections(to: SocketAddrV4, duration: Duration) -> (f64, f64) {
    as_client(move || {
        pin(CLIENT_CORE);
        let start = Instant::now();
        let mut n = 0u64;
        let mut buf = [1u8; 1];
        while start.elapsed() < duration {
            let mut s = TcpStream::connect(to).expect("connecting");
            s.write_all(&buf).expect("request");
            s.read_exact(&mut buf).expect("response");
            n += 1;
        }
        let seconds = start.elapsed().as_secs_f64();
        (n as f64 / seconds, seconds)
    })
}

/// The kernel's echo and discard servers: one thread pinned to the server core, one epoll
/// instance, non-blocking sockets; stopped and joined on drop.
struct KernelServer {
    stop: std::os::fd::OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `/proc/self/task/TID/stat` of the server thread.
    stat: String,
}

/// The token of the stop eventfd; listeners' tokens are their indices, connections' their
/// descriptors offset by [`CONNECTION_TOKENS`].
const STOP_TOKEN: u64 = u64::MAX;
const CONNECTION_TOKENS: u64 = 1 << 32;
/// The server's read buffer.
const READ_BUFFER: usize = 256 * 1024;

impl KernelServer {
    fn start() -> KernelServer {
        // SAFETY: eventfd has no preconditions.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(stop >= 0, "eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor nobody else owns.
        let stop: std::os::fd::OwnedFd = unsafe { std::os::fd::FromRawFd::from_raw_fd(stop) };
        let stop_fd = stop.as_raw_fd();
        let (tid_tx, tid_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            pin(shard_core());
            serve(stop_fd, &tid_tx);
        });
        let tid = tid_rx.recv().expect("the kernel server listens");
        KernelServer {
            stop,
            thread: Some(thread),
            stat: format!("/proc/self/task/{tid}/stat"),
        }
    }

    /// The server thread's CPU seconds so far.
    fn cpu(&self) -> f64 {
        task_cpu(&self.stat)
    }
}

impl Drop for KernelServer {
    fn drop(&mut self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The event loop: accepts on both listeners, echoes on echo connections, reads and drops on
/// discard connections, closes at end of stream; returns when `stop` becomes readable. Sends
/// its thread id on `listening` once it listens.
fn serve(stop: i32, listening: &mpsc::Sender<i32>) {
    let epoll = Epoll::new();
    let listeners: Vec<(TcpListener, u16)> = [ECHO, DISCARD]
        .into_iter()
        .enumerate()
        .map(|(index, port)| {
            let listener = TcpListener::bind((NODE_IP, port)).expect("kernel listener");
            listener
                .set_nonblocking(true)
                .expect("non-blocking listener");
            // Accepted sockets inherit TCP_NODELAY from their listener.
            set_nodelay(listener.as_raw_fd());
            epoll.add(listener.as_raw_fd(), index as u64, libc::EPOLLIN);
            (listener, port)
        })
        .collect();
    epoll.add(stop, STOP_TOKEN, libc::EPOLLIN);
    let _ = listening.send(thread_id());
    // Per connection: whether it echoes, and output the socket did not take yet.
    let mut connections: HashMap<i32, (bool, Vec<u8>)> = HashMap::new();
    let mut buf = vec![0u8; READ_BUFFER];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        let ready = epoll.wait(&mut events, -1);
        for event in &events[..ready] {
            let (token, flags) = (event.u64, event.events as i32);
            if token == STOP_TOKEN {
                for &fd in connections.keys() {
                    // SAFETY: closing descriptors this loop owns.
                    unsafe { libc::close(fd) };
                }
                drop(listeners);
                return;
            }
            if token < CONNECTION_TOKENS {
                let (listener, port) = &listeners[token as usize];
                if let Ok((stream, _)) = listener.accept() {
                    stream
                        .set_nonblocking(true)
                        .expect("non-blocking connection");
                    let fd = stream.into_raw_fd();
                    epoll.add(fd, CONNECTION_TOKENS + fd as u64, libc::EPOLLIN);
                    connections.insert(fd, (*port == ECHO, Vec::new()));
                }
                continue;
            }
            let fd = (token - CONNECTION_TOKENS) as i32;
            let Some((echo, pending)) = connections.get_mut(&fd) else {
                continue;
            };
            let open = if flags & libc::EPOLLOUT != 0 {
                flush(&epoll, fd, pending)
            } else {
                on_readable(&epoll, fd, *echo, pending, &mut buf)
            };
            if !open {
                connections.remove(&fd);
                // SAFETY: closing a descriptor this loop owns (epoll forgets it).
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// Reads what `fd` has (until a read comes back short); echoes it or drops it. Output the
/// socket does not take waits in `pending` for EPOLLOUT, and reading stops meanwhile. Whether
/// the connection stays open.
fn on_readable(epoll: &Epoll, fd: i32, echo: bool, pending: &mut Vec<u8>, buf: &mut [u8]) -> bool {
    loop {
        // SAFETY: reading into a valid buffer of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 {
            return false;
        }
        if n < 0 {
            return would_block();
        }
        let n = n as usize;
        if echo {
            let Some(sent) = write_some(fd, &buf[..n]) else {
                return false;
            };
            if sent < n {
                pending.extend_from_slice(&buf[sent..n]);
                epoll.modify(fd, CONNECTION_TOKENS + fd as u64, libc::EPOLLOUT);
                return true;
            }
        }
        if n < buf.len() {
            return true;
        }
    }
}

/// On EPOLLOUT: writes what is pending, and listens for input again once it is all out.
/// Whether the connection stays open.
fn flush(epoll: &Epoll, fd: i32, pending: &mut Vec<u8>) -> bool {
    let Some(sent) = write_some(fd, pending) else {
        return false;
    };
    pending.drain(..sent);
    if pending.is_empty() {
        epoll.modify(fd, CONNECTION_TOKENS + fd as u64, libc::EPOLLIN);
    }
    true
}

/// Writes as much of `data` as the socket takes; `None` when the connection failed.
fn write_some(fd: i32, data: &[u8]) -> Option<usize> {
    let mut sent = 0;
    while sent < data.len() {
        // SAFETY: writing from a valid buffer of its length.
        let n = unsafe { libc::write(fd, data[sent..].as_ptr().cast(), data.len() - sent) };
        if n < 0 {
            return would_block().then_some(sent);
        }
        sent += n as usize;
    }
    Some(sent)
}

fn would_block() -> bool {
    std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

fn set_nodelay(fd: i32) {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket and option value.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "TCP_NODELAY: {}", std::io::Error::last_os_error());
}

fn run() {
    let (duration, rounds) = plan();
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
    let pid = runner.stats()["pid"].as_u64().expect("the runner's pid");
    let runner_stat = format!("/proc/{pid}/stat");
    let runner_cpu = || task_cpu(&runner_stat);
    let kernel = KernelServer::start();
    let kernel_cpu = || kernel.cpu();
    // rounds[side][figure]: one measurement per round.
    let mut results: [Vec<Vec<Value>>; 2] = [vec![Vec::new(); 3], vec![Vec::new(); 3]];
    for _ in 0..rounds {
        for (side, ip) in [STACK_IP, NODE_IP].into_iter().enumerate() {
            let cpu: &dyn Fn() -> f64 = if side == 0 {
                runner.resume();
                &runner_cpu
            } else {
                runner.pause();
                &kernel_cpu
            };
            for (figure, &(_, _, port, work)) in FIGURES.iter().enumerate() {
                let to = SocketAddrV4::new(ip, port);
                results[side][figure].push(measured(cpu, || work(to, duration)));
            }
        }
    }
    runner.resume();
    drop(kernel);
    let stats = runner.stop();
    let summary = |side: usize| -> Value {
        FIGURES
            .iter()
            .enumerate()
            .map(|(figure, &(name, unit, _, _))| {
                let rounds = &results[side][figure];
                let of = |field: &str| -> Value {
                    let values: Vec<f64> =
                        rounds.iter().filter_map(|r| r[field].as_f64()).collect();
                    spread(&values)
                };
                let figures = json!({
                    "unit": unit,
                    "value": of("value"),
                    "perServerCpuSecond": of("perServerCpuSecond"),
                    "perBusyCoreSecond": of("perBusyCoreSecond"),
                    "serverCoreBusy": of("serverCoreBusy"),
                    "clientCoreBusy": of("clientCoreBusy"),
                    "rounds": rounds,
                });
                (name.to_string(), figures)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let (userstack, kernel) = (summary(0), summary(1));
    let ratios: serde_json::Map<String, Value> = FIGURES
        .iter()
        .map(|&(name, _, _, _)| {
            let ratio = |field: &str| {
                let median = |side: &Value| side[name][field]["median"].as_f64().unwrap_or(0.0);
                let k = median(&kernel);
                if k > 0.0 {
                    median(&userstack) / k
                } else {
                    0.0
                }
            };
            let ratios = json!({
                "perWallSecond": ratio("value"),
                "perServerCpuSecond": ratio("perServerCpuSecond"),
                "perBusyCoreSecond": ratio("perBusyCoreSecond"),
            });
            (name.to_string(), ratios)
        })
        .collect();
    let report = json!({
        "path": "veth pair between two network namespaces",
        "secondsPerFigure": duration.as_secs_f64(),
        "roundsPerSide": rounds,
        "serverCore": shard_core(),
        "clientCore": CLIENT_CORE,
        "userstack": {
            "backend": "afXdp",
            "mode": stats["mode"],
            "shards": 1,
            "figures": userstack,
            "tcp": stats["netstat"]["Tcp"],
        },
        "kernel": { "server": "one thread, epoll (level-triggered)", "figures": kernel },
        "userstackOverKernelMedians": ratios,
        "loadAverage": sh(&["cat", "/proc/loadavg"]).trim(),
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).expect("the report as JSON")
    );
}
