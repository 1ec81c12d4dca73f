//! userstack beside smoltcp 0.14 in one in-memory harness: two stack instances on one thread
//! joined by a lossless link whose virtual clock advances 5 µs a round. Prints one JSON
//! document. Benchmarks, each with interleaved rounds (userstack, smoltcp, userstack, …) after
//! one unmeasured warm-up round per side:
//! - `bulk_checksum`: 4 MiB socket buffers, one long-lived connection, MiB moved a → b with
//!   TCP checksums computed and verified in software on both sides;
//! - `bulk_checksum_offload`: the same with TCP checksums left to the (imaginary) NIC on both
//!   sides (userstack `rx/tx_checksum_offload`, smoltcp `ChecksumCapabilities::tcp = None`);
//!   the IPv4 header checksum stays in software on both;
//! - `bulk_in_place`: as `bulk_checksum`, with the application writing its data straight into
//!   the send ring and taking it where it lies in the receive ring (userstack's `send_with` /
//!   `recv_with`, smoltcp's `send` / `recv` closures): no socket copy on either side;
//! - `rr_64`: 64-byte request, 64-byte response, Nagle off, 64 KiB buffers, software checksums;
//!   a third side runs Linux's TCP over loopback in the same shape (both ends in this thread),
//!   the per-core yardstick of user-space stacks;
//! - `churn`, userstack only: open, handshake and close both ways with 10,000 live
//!   connections in the table.
//!
//! Per round: wall time and the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`); reported as
//! min/median/max of units per wall second and per CPU second, frames per wall and per CPU
//! second, frames and link rounds ("polls") per unit, and the userstack/smoltcp ratio of the
//! medians. Run without `--bench` (as `cargo test --all-targets` does) it does one tiny round
//! of each and asserts only that data moved. Names after `--` select benchmarks by substring
//! (`cargo bench -p userstack --bench stack -- rr_64`).
//!
//! What both sides share: 1514-byte frames carrying 1448-byte payloads (MSS 1460 less the
//! 12-byte timestamps option; both negotiate timestamps, window scaling and SACK), the same
//! socket buffer sizes, CUBIC congestion control, Nagle (on for bulk, off for `rr_64`), and
//! one ACK policy: delayed ACKs with a 40 ms timer, an ACK at the latest after every second
//! full-sized segment (userstack's `Config` default; smoltcp's `ack_delay` set to 40 ms, whose
//! timer is forced once more than one MSS is unacknowledged). Both send at most one ACK per
//! round for all the segments received in it. Both copy through their socket buffers
//! (`send`/`recv` against `send_slice`/`recv_slice`), except in `bulk_in_place`, where both
//! lend their rings to the application (which fills what it sends and only looks at what it
//! receives, the same on both sides). The polling pattern is the same: in each
//! round a runs its timers, receives everything pending and transmits everything it may, then
//! b does the same (userstack: `Pair::poll_round`, i.e. `poll_timers`, `ingress`, `egress`;
//! smoltcp: `Interface::poll`, which loops ingress then egress until idle). Frame buffers come
//! from per-side pools on both: smoltcp's transmit token takes a pooled buffer and its receive
//! token returns the buffer to the sender's pool after use, as userstack's `BufferPool` and
//! the pair's transmit completions do; neither allocates per frame in steady state.
//!
//! What still differs:
//! - userstack with offload still writes the pseudo-header sum into the TCP checksum field
//!   (CHECKSUM_PARTIAL, as a NIC expects); smoltcp with `Checksum::None` writes nothing.
//! - smoltcp looks its one socket up in a `SocketSet` and visits every socket on each poll;
//!   userstack dispatches through a flow table and visits only connections with work. With one
//!   connection per pair this favours neither much.
//! - userstack's timers live on a timer wheel polled every round; smoltcp derives its
//!   deadlines from the socket on each poll.
//! - Loss recovery: userstack keeps a SACK scoreboard and runs RACK loss detection on every
//!   ACK, arms tail loss probes, and runs HyStart++ and PRR with its CUBIC; smoltcp 0.14 has
//!   none of these (it sends SACK blocks but ignores received ones; its CUBIC is the bare
//!   curve). Nothing is lost on this link, but userstack pays the per-ACK bookkeeping (a few
//!   per cent of `rr_64` in a profile).
//! - The receive-window update rules differ (smoltcp ACKs when the window doubles; userstack
//!   as Linux); the frames per unit printed show any difference in frames moved.
//! - TCP timestamps: userstack derives TSval from its clock; smoltcp calls a plain `fn` that
//!   reads the link clock (milliseconds) from a static.
//! - `churn` has no smoltcp counterpart (smoltcp has no listener backlog or connection table);
//!   it uses `Pair::step` (both transmit, then both receive), as its published figures did.
//!
//! Figures go to docs/userstack.md, never into assertions.

#[path = "../tests/support/pair.rs"]
mod pair;

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;
use core::time::Duration;
use pair::{Pair, IP_B};
use std::hint::black_box;
use std::net::SocketAddrV4;
use std::time::Instant as WallClock;
use userstack::tcp::Config;

const MIB: usize = 1 << 20;
/// Socket buffers of the bulk benchmarks, both directions, both sides.
const BULK_BUFFER: usize = 4 << 20;
/// Socket buffers of the request/response benchmark.
const RR_BUFFER: usize = 64 << 10;
/// Request and response size.
const RR_SIZE: usize = 64;
/// Bytes handed to `send` per call in the bulk benchmarks.
const CHUNK: usize = 256 << 10;
/// The delayed-ACK timer of both sides.
const DELAYED_ACK_MS: u64 = 40;

/// How much one run does.
struct Scale {
    /// Measured rounds per side.
    rounds: usize,
    bulk_mib: u64,
    transactions: u64,
    churn: u64,
    churn_live: usize,
}

const FULL: Scale = Scale {
    rounds: 15,
    bulk_mib: 256,
    transactions: 200_000,
    churn: 50_000,
    churn_live: 10_000,
};

const SMOKE: Scale = Scale {
    rounds: 1,
    bulk_mib: 1,
    transactions: 100,
    churn: 50,
    churn_live: 100,
};

/// What one round of one side did besides its units.
#[derive(Clone, Copy, Default)]
struct Work {
    /// Frames transmitted on the link (both directions).
    frames: u64,
    /// Link rounds.
    polls: u64,
    /// Allocations made during the round.
    allocations: u64,
}

impl Work {
    fn round(&mut self, frames: u64) {
        self.frames += frames;
        self.polls += 1;
    }
}

/// One measured round.
struct Sample {
    wall: f64,
    cpu: f64,
    work: Work,
}

/// One side of a benchmark: runs one round of the given number of units.
type Side<'a> = Box<dyn FnMut(u64) -> Work + 'a>;

struct Benchmark<'a> {
    name: &'static str,
    unit: &'static str,
    units: u64,
    sides: Vec<(&'static str, Side<'a>)>,
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    // Names after `--` select benchmarks by substring, as criterion's filter does.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with('-'))
        .collect();
    let selected =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let scale = if full { &FULL } else { &SMOKE };
    let load_before = loadavg();
    let mut benchmarks = vec![
        Benchmark {
            name: "bulk_checksum",
            unit: "MiB",
            units: scale.bulk_mib,
            sides: vec![
                ("userstack", Box::new(userstack_bulk(false))),
                ("smoltcp", Box::new(smoltcp_bulk(false))),
            ],
        },
        Benchmark {
            name: "bulk_checksum_offload",
            unit: "MiB",
            units: scale.bulk_mib,
            sides: vec![
                ("userstack", Box::new(userstack_bulk(true))),
                ("smoltcp", Box::new(smoltcp_bulk(true))),
            ],
        },
        Benchmark {
            name: "bulk_in_place",
            unit: "MiB",
            units: scale.bulk_mib,
            sides: vec![
                ("userstack", Box::new(userstack_bulk_in_place())),
                ("smoltcp", Box::new(smoltcp_bulk_in_place())),
            ],
        },
        Benchmark {
            name: "rr_64",
            unit: "transactions",
            units: scale.transactions,
            sides: vec![
                ("userstack", Box::new(userstack_rr())),
                ("smoltcp", Box::new(smoltcp_rr())),
                ("linux_loopback", Box::new(linux_loopback_rr())),
            ],
        },
        Benchmark {
            name: "churn",
            unit: "connections",
            units: scale.churn,
            sides: vec![("userstack", Box::new(userstack_churn(scale.churn_live)))],
        },
    ];
    benchmarks.retain(|benchmark| selected(benchmark.name));
    let mut reports = Vec::new();
    for benchmark in &mut benchmarks {
        let samples = measure(benchmark, scale.rounds);
        for (side, rounds) in benchmark.sides.iter().zip(&samples) {
            for sample in rounds {
                assert!(
                    sample.work.frames > 0,
                    "{} {}: no frames",
                    benchmark.name,
                    side.0
                );
            }
        }
        reports.push(report(benchmark, &samples));
    }
    println!(
        "{{\n  \"bench\": \"userstack/benches/stack.rs\",\n  \"mode\": \"{}\",\n  \
         \"rounds_per_side\": {},\n  \"loadavg_before\": \"{}\",\n  \"loadavg_after\": \"{}\",\n  \
         \"benchmarks\": [\n{}\n  ]\n}}",
        if full { "full" } else { "smoke" },
        scale.rounds,
        load_before,
        loadavg(),
        reports.join(",\n")
    );
}

/// One warm-up round per side, then `rounds` interleaved measured rounds.
fn measure(benchmark: &mut Benchmark, rounds: usize) -> Vec<Vec<Sample>> {
    for (_, side) in &mut benchmark.sides {
        side(benchmark.units);
    }
    let mut samples: Vec<Vec<Sample>> = benchmark.sides.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for ((_, side), out) in benchmark.sides.iter_mut().zip(&mut samples) {
            let allocations = counting_alloc::allocations();
            let (wall, cpu) = (WallClock::now(), thread_cpu());
            let mut work = side(benchmark.units);
            let cpu = (thread_cpu() - cpu).as_secs_f64();
            work.allocations = counting_alloc::allocations() - allocations;
            out.push(Sample {
                wall: wall.elapsed().as_secs_f64(),
                cpu,
                work,
            });
        }
    }
    samples
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

// ------------------------------------------------------------------ report

/// Min, median and max.
struct Spread {
    min: f64,
    median: f64,
    max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Spread {
            min: values[0],
            median,
            max: values[n - 1],
        }
    }

    fn json(&self) -> String {
        format!(
            "{{\"min\": {}, \"median\": {}, \"max\": {}}}",
            number(self.min),
            number(self.median),
            number(self.max)
        )
    }
}

/// A JSON number, rounded for reading.
fn number(x: f64) -> String {
    if !x.is_finite() {
        "null".to_owned()
    } else if x.abs() >= 1000.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.3}")
    }
}

fn report(benchmark: &Benchmark, samples: &[Vec<Sample>]) -> String {
    let units = benchmark.units as f64;
    let mut sides = Vec::new();
    let mut medians = Vec::new();
    for ((name, _), rounds) in benchmark.sides.iter().zip(samples) {
        let rate = |f: &dyn Fn(&Sample) -> f64| Spread::of(rounds.iter().map(f).collect());
        let per_wall = rate(&|s| units / s.wall);
        let per_cpu = rate(&|s| units / s.cpu);
        let frames_wall = rate(&|s| s.work.frames as f64 / s.wall);
        let frames_cpu = rate(&|s| s.work.frames as f64 / s.cpu);
        let total_units = units * rounds.len() as f64;
        let frames: u64 = rounds.iter().map(|s| s.work.frames).sum();
        let polls: u64 = rounds.iter().map(|s| s.work.polls).sum();
        let allocations: u64 = rounds.iter().map(|s| s.work.allocations).sum();
        let cpu_share = rate(&|s| s.cpu / s.wall);
        sides.push(format!(
            "        \"{name}\": {{\n          \"frames_per_unit\": {},\n          \
             \"polls_per_unit\": {},\n          \"allocations_per_unit\": {},\n          \
             \"per_wall_second\": {},\n          \
             \"per_cpu_second\": {},\n          \"frames_per_wall_second\": {},\n          \
             \"frames_per_cpu_second\": {},\n          \"cpu_over_wall\": {}\n        }}",
            number(frames as f64 / total_units),
            number(polls as f64 / total_units),
            number(allocations as f64 / total_units),
            per_wall.json(),
            per_cpu.json(),
            frames_wall.json(),
            frames_cpu.json(),
            cpu_share.json()
        ));
        medians.push((per_wall.median, per_cpu.median));
    }
    let (user_wall, user_cpu) = medians[0];
    let ratio: String = benchmark.sides[1..]
        .iter()
        .zip(&medians[1..])
        .map(|((name, _), (wall, cpu))| {
            format!(
                ",\n      \"userstack_over_{name}\": {{\"per_wall_second\": {}, \
                 \"per_cpu_second\": {}}}",
                number(user_wall / wall),
                number(user_cpu / cpu)
            )
        })
        .collect();
    format!(
        "    {{\n      \"name\": \"{}\",\n      \"unit\": \"{}\",\n      \
         \"units_per_round\": {},\n      \"sides\": {{\n{}\n      }}{}\n    }}",
        benchmark.name,
        benchmark.unit,
        benchmark.units,
        sides.join(",\n"),
        ratio
    )
}

// ------------------------------------------------------------- Linux loopback

/// Linux's TCP over loopback in the same shape as the in-memory pairs: both ends in this one
/// thread (non-blocking sockets, `TCP_NODELAY`, each read retried until the 64 bytes are in),
/// so that one core runs both stacks, as in `rr_64`'s other sides; the kernel's loopback
/// softirq runs in this thread's system calls. Only the two data segments of a transaction are
/// counted as frames (the kernel's ACKs are not visible here).
fn linux_loopback_rr() -> impl FnMut(u64) -> Work {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut client = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
    let (mut server, _) = listener.accept().expect("accept");
    for stream in [&client, &server] {
        stream.set_nodelay(true).expect("TCP_NODELAY");
        stream.set_nonblocking(true).expect("non-blocking");
    }
    let exchange = |from: &mut TcpStream, to: &mut TcpStream, buf: &mut [u8; RR_SIZE]| {
        assert_eq!(from.write(&buf[..]).expect("write"), RR_SIZE);
        let mut got = 0;
        while got < RR_SIZE {
            match to.read(&mut buf[got..]) {
                Ok(0) => panic!("loopback connection closed"),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => panic!("read: {e}"),
            }
        }
    };
    let mut buf = [7u8; RR_SIZE];
    move |transactions| {
        let mut work = Work::default();
        for _ in 0..transactions {
            exchange(&mut client, &mut server, &mut buf);
            exchange(&mut server, &mut client, &mut buf);
            work.round(2);
        }
        black_box(buf);
        work
    }
}

// ------------------------------------------------------------------ userstack

fn userstack_config(buffer: usize, nagle: bool) -> Config {
    Config {
        recv_buffer: buffer,
        send_buffer: buffer,
        nagle,
        delayed_ack: Duration::from_millis(DELAYED_ACK_MS),
        ack_every_segments: 2,
        ..Config::default()
    }
}

fn userstack_bulk(offload: bool) -> impl FnMut(u64) -> Work {
    let mut pair = Pair::with_offload(userstack_config(BULK_BUFFER, true), offload);
    pair.b.listen(80, 16).expect("listen");
    let (client, server) = pair.connect(80);
    let data = vec![0x42u8; CHUNK];
    let mut sink = vec![0u8; CHUNK];
    move |mib| {
        let bytes = mib as usize * MIB;
        let mut work = Work::default();
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            if sent < bytes {
                let n = data.len().min(bytes - sent);
                sent += pair.a.send(client, &data[..n]).expect("send");
            }
            work.round(pair.poll_round() as u64);
            loop {
                let n = pair.b.recv(server, &mut sink).expect("recv");
                if n == 0 {
                    break;
                }
                got += n;
            }
        }
        black_box(got);
        work
    }
}

/// `bulk_checksum` with the rings lent to the application: per round it queues up to
/// `CHUNK` bytes written in place, and takes everything received where it lies.
fn userstack_bulk_in_place() -> impl FnMut(u64) -> Work {
    let mut pair = Pair::with_offload(userstack_config(BULK_BUFFER, true), false);
    pair.b.listen(80, 16).expect("listen");
    let (client, server) = pair.connect(80);
    move |mib| {
        let bytes = mib as usize * MIB;
        let mut work = Work::default();
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            queue_round(&mut sent, bytes, |left| {
                pair.a
                    .send_with(client, |space| produce(space, left))
                    .expect("send")
            });
            work.round(pair.poll_round() as u64);
            loop {
                let n = pair.b.recv_with(server, consume).expect("recv");
                if n == 0 {
                    break;
                }
                got += n;
            }
        }
        black_box(got);
        work
    }
}

/// One round's sending in `bulk_in_place`: queues up to `CHUNK` of the `bytes` not yet
/// `sent` through `send_in_place` (given how many bytes it may write, returns how many it
/// wrote in place), until that is done or the send ring is full.
fn queue_round(sent: &mut usize, bytes: usize, mut send_in_place: impl FnMut(usize) -> usize) {
    let mut queued = 0;
    while *sent < bytes && queued < CHUNK {
        let n = send_in_place((bytes - *sent).min(CHUNK - queued));
        if n == 0 {
            break;
        }
        *sent += n;
        queued += n;
    }
}

/// The application's side of an in-place send: fills up to `left` bytes of the ring's free
/// space; how many it wrote.
fn produce(space: &mut [u8], left: usize) -> usize {
    let n = space.len().min(left);
    space[..n].fill(0x42);
    n
}

/// The application's side of an in-place receive: looks at the bytes where they lie and
/// takes them all.
fn consume(data: &[u8]) -> usize {
    black_box(data);
    data.len()
}

fn userstack_rr() -> impl FnMut(u64) -> Work {
    let mut pair = Pair::new(userstack_config(RR_BUFFER, false));
    pair.b.listen(80, 16).expect("listen");
    let (client, server) = pair.connect(80);
    let request = [7u8; RR_SIZE];
    let mut buf = [0u8; RR_SIZE];
    move |transactions| {
        let mut work = Work::default();
        for _ in 0..transactions {
            assert_eq!(pair.a.send(client, &request).expect("send"), RR_SIZE);
            let mut got = 0;
            while got < RR_SIZE {
                work.round(pair.poll_round() as u64);
                got += pair.b.recv(server, &mut buf[got..]).expect("recv");
            }
            assert_eq!(pair.b.send(server, &buf).expect("send"), RR_SIZE);
            let mut back = 0;
            while back < RR_SIZE {
                work.round(pair.poll_round() as u64);
                back += pair.a.recv(client, &mut buf[back..]).expect("recv");
            }
        }
        black_box(buf);
        work
    }
}

fn userstack_churn(live: usize) -> impl FnMut(u64) -> Work {
    let config = Config {
        recv_buffer: 4096,
        send_buffer: 4096,
        msl: Duration::from_micros(5),
        ..Config::default()
    };
    let mut pair = Pair::new(config);
    pair.b.listen(80, 4096).expect("listen");
    pair.b.listen(81, 16).expect("listen");
    for _ in 0..live {
        pair.a
            .connect(SocketAddrV4::new(IP_B, 80))
            .expect("connect");
        if pair.a.connection_count().is_multiple_of(512) {
            while pair.step() > 0 {}
            while pair.b.accept(80).is_some() {}
        }
    }
    while pair.step() > 0 {}
    while pair.b.accept(80).is_some() {}
    assert!(
        pair.b.connection_count() >= live,
        "{} live",
        pair.b.connection_count()
    );
    move |connections| {
        let mut work = Work::default();
        for _ in 0..connections {
            let client = pair
                .a
                .connect(SocketAddrV4::new(IP_B, 81))
                .expect("connect");
            let server = loop {
                work.round(pair.step() as u64);
                if let Some(server) = pair.b.accept(81) {
                    break server;
                }
            };
            work.round(pair.step() as u64);
            pair.a.close(client).expect("close");
            work.round(pair.step() as u64);
            pair.b.close(server).expect("close");
            loop {
                let frames = pair.step() as u64;
                work.round(frames);
                if frames == 0 {
                    break;
                }
            }
            pair.now += Duration::from_micros(20);
            pair.a.poll_timers(pair.now);
        }
        work
    }
}

// ------------------------------------------------------------------ smoltcp

fn smoltcp_bulk(offload: bool) -> impl FnMut(u64) -> Work {
    let mut pair = smol::Pair::new(BULK_BUFFER, true, offload);
    let data = vec![0x42u8; CHUNK];
    let mut sink = vec![0u8; CHUNK];
    move |mib| {
        let bytes = mib as usize * MIB;
        let mut work = Work::default();
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            if sent < bytes {
                let n = data.len().min(bytes - sent);
                sent += pair.client().send_slice(&data[..n]).expect("send");
            }
            work.round(pair.poll_round());
            let server = pair.server();
            while server.can_recv() {
                got += server.recv_slice(&mut sink).expect("recv");
            }
        }
        black_box(got);
        work
    }
}

/// [`userstack_bulk_in_place`] on smoltcp: its `send` and `recv` closures lend the rings.
fn smoltcp_bulk_in_place() -> impl FnMut(u64) -> Work {
    let mut pair = smol::Pair::new(BULK_BUFFER, true, false);
    move |mib| {
        let bytes = mib as usize * MIB;
        let mut work = Work::default();
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            queue_round(&mut sent, bytes, |left| {
                pair.client()
                    .send(|space| {
                        let n = produce(space, left);
                        (n, n)
                    })
                    .expect("send")
            });
            work.round(pair.poll_round());
            let server = pair.server();
            while server.can_recv() {
                got += server
                    .recv(|data| {
                        let n = consume(data);
                        (n, n)
                    })
                    .expect("recv");
            }
        }
        black_box(got);
        work
    }
}

fn smoltcp_rr() -> impl FnMut(u64) -> Work {
    let mut pair = smol::Pair::new(RR_BUFFER, false, false);
    let request = [7u8; RR_SIZE];
    let mut buf = [0u8; RR_SIZE];
    move |transactions| {
        let mut work = Work::default();
        for _ in 0..transactions {
            assert_eq!(pair.client().send_slice(&request).expect("send"), RR_SIZE);
            let mut got = 0;
            while got < RR_SIZE {
                work.round(pair.poll_round());
                got += pair.server().recv_slice(&mut buf[got..]).expect("recv");
            }
            assert_eq!(pair.server().send_slice(&buf).expect("send"), RR_SIZE);
            let mut back = 0;
            while back < RR_SIZE {
                work.round(pair.poll_round());
                back += pair.client().recv_slice(&mut buf[back..]).expect("recv");
            }
        }
        black_box(buf);
        work
    }
}

/// smoltcp in the same harness: two interfaces joined by in-memory wires with pooled frames.
mod smol {
    use super::DELAYED_ACK_MS;
    use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
    use smoltcp::phy::{self, Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
    use smoltcp::socket::tcp::{self, CongestionControl};
    use smoltcp::time::{Duration, Instant};
    use smoltcp::wire::{EthernetAddress, IpAddress, IpCidr};
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Ethernet frame size: 14 + IP MTU 1500, so MSS 1460 and 1448-byte payloads with
    /// timestamps, as userstack's.
    const FRAME: usize = 1514;

    /// The link clock in milliseconds, for TCP timestamps (smoltcp's generator is a `fn`).
    static CLOCK_MS: AtomicU32 = AtomicU32::new(0);

    fn tsval() -> u32 {
        CLOCK_MS.load(Ordering::Relaxed)
    }

    /// One direction of the link: frames in flight and the free buffers of its sender.
    #[derive(Default)]
    struct Wire {
        in_flight: VecDeque<Vec<u8>>,
        pool: Vec<Vec<u8>>,
        frames: u64,
    }

    /// One end's device while it polls: receives from one wire, transmits on the other.
    struct Port<'l> {
        rx: &'l mut Wire,
        tx: &'l mut Wire,
        caps: DeviceCapabilities,
    }

    /// A received frame; its buffer goes back to the sender's pool once read.
    struct Rx<'l> {
        frame: Vec<u8>,
        pool: &'l mut Vec<Vec<u8>>,
    }

    /// Room for one frame in a pooled buffer.
    struct Tx<'l> {
        wire: &'l mut Wire,
    }

    impl phy::RxToken for Rx<'_> {
        fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
            let Rx { frame, pool } = self;
            let r = f(&frame);
            pool.push(frame);
            r
        }
    }

    impl phy::TxToken for Tx<'_> {
        fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
            let mut frame = self.wire.pool.pop().unwrap_or_default();
            frame.resize(len, 0);
            let r = f(&mut frame);
            self.wire.in_flight.push_back(frame);
            self.wire.frames += 1;
            r
        }
    }

    impl Device for Port<'_> {
        type RxToken<'a>
            = Rx<'a>
        where
            Self: 'a;
        type TxToken<'a>
            = Tx<'a>
        where
            Self: 'a;

        fn receive(&mut self, _: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
            let frame = self.rx.in_flight.pop_front()?;
            Some((
                Rx {
                    frame,
                    pool: &mut self.rx.pool,
                },
                Tx { wire: self.tx },
            ))
        }

        fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
            Some(Tx { wire: self.tx })
        }

        fn capabilities(&self) -> DeviceCapabilities {
            self.caps.clone()
        }
    }

    struct End {
        iface: Interface,
        sockets: SocketSet<'static>,
        socket: SocketHandle,
    }

    fn end(host: u8, port: &mut Port, buffer: usize, nagle: bool) -> End {
        let mut config = Config::new(EthernetAddress([2, 0, 0, 0, 0, host]).into());
        config.random_seed = u64::from(host);
        let mut iface = Interface::new(config, port, Instant::ZERO);
        iface.update_ip_addrs(|addrs| {
            addrs
                .push(IpCidr::new(IpAddress::v4(198, 18, 0, host), 24))
                .expect("address");
        });
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buffer]),
            tcp::SocketBuffer::new(vec![0; buffer]),
        );
        socket.set_nagle_enabled(nagle);
        socket.set_ack_delay(Some(Duration::from_millis(DELAYED_ACK_MS)));
        socket.set_tsval_generator(Some(tsval));
        socket.set_congestion_control(CongestionControl::Cubic);
        let mut sockets = SocketSet::new(vec![]);
        let socket = sockets.add(socket);
        End {
            iface,
            sockets,
            socket,
        }
    }

    /// A connected client (a) and server (b).
    pub struct Pair {
        a: End,
        b: End,
        ab: Wire,
        ba: Wire,
        caps: DeviceCapabilities,
        now_micros: i64,
    }

    impl Pair {
        /// Both ends with `buffer`-byte socket buffers; `offload`: TCP checksums left to the
        /// NIC (the IPv4 header checksum stays in software, as in userstack).
        pub fn new(buffer: usize, nagle: bool, offload: bool) -> Pair {
            let mut caps = DeviceCapabilities::default();
            caps.medium = Medium::Ethernet;
            caps.max_transmission_unit = FRAME;
            if offload {
                caps.checksum = ChecksumCapabilities::default();
                caps.checksum.tcp = Checksum::None;
            }
            let (mut ab, mut ba) = (Wire::default(), Wire::default());
            let mut port_a = Port {
                rx: &mut ba,
                tx: &mut ab,
                caps: caps.clone(),
            };
            let a = end(1, &mut port_a, buffer, nagle);
            let mut port_b = Port {
                rx: &mut ab,
                tx: &mut ba,
                caps: caps.clone(),
            };
            let b = end(2, &mut port_b, buffer, nagle);
            let mut pair = Pair {
                a,
                b,
                ab,
                ba,
                caps,
                now_micros: 0,
            };
            pair.server().listen(80).expect("listen");
            let cx = pair.a.iface.context();
            pair.a
                .sockets
                .get_mut::<tcp::Socket>(pair.a.socket)
                .connect(cx, (IpAddress::v4(198, 18, 0, 2), 80), 40000)
                .expect("connect");
            while pair.client().state() != tcp::State::Established
                || pair.server().state() != tcp::State::Established
            {
                pair.poll_round();
            }
            pair
        }

        /// The client's socket.
        pub fn client(&mut self) -> &mut tcp::Socket<'static> {
            self.a.sockets.get_mut::<tcp::Socket>(self.a.socket)
        }

        /// The server's socket.
        pub fn server(&mut self) -> &mut tcp::Socket<'static> {
            self.b.sockets.get_mut::<tcp::Socket>(self.b.socket)
        }

        /// One round, as `Pair::poll_round` on the userstack side: a polls (receives what is
        /// pending, transmits what it may), then b. Returns the frames transmitted.
        pub fn poll_round(&mut self) -> u64 {
            self.now_micros += 5;
            CLOCK_MS.store((self.now_micros / 1000) as u32, Ordering::Relaxed);
            let now = Instant::from_micros(self.now_micros);
            let before = self.ab.frames + self.ba.frames;
            let mut port = Port {
                rx: &mut self.ba,
                tx: &mut self.ab,
                caps: self.caps.clone(),
            };
            self.a.iface.poll(now, &mut port, &mut self.a.sockets);
            let mut port = Port {
                rx: &mut self.ab,
                tx: &mut self.ba,
                caps: self.caps.clone(),
            };
            self.b.iface.poll(now, &mut port, &mut self.b.sockets);
            self.ab.frames + self.ba.frames - before
        }
    }
}
