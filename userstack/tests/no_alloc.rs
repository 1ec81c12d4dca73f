//! The fast path allocates nothing per packet: two stacks on one thread move 64 MiB in bulk
//! and 20,000 request/response transactions after a warm-up, and a counting global allocator
//! counts the allocations made meanwhile (the count is asserted, never a time).

use core::time::Duration;
use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicU64, Ordering};
use userstack::stack::{Event, SocketHandle, Stack, StackConfig};
use userstack::tcp::Config;
use userstack::time::Instant;
use userstack::wire::EthernetAddress;

/// Allocations made through the global allocator (reallocations included).
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

struct Counting;

// SAFETY: every call is forwarded unchanged to `System`; the counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);

/// Two stacks joined by a lossless in-memory link, as in benches/stack.rs.
struct Pair {
    a: Stack,
    b: Stack,
    now: Instant,
    ab: Vec<Vec<u8>>,
    ba: Vec<Vec<u8>>,
    events: Vec<Event>,
    frames: u64,
}

impl Pair {
    fn new() -> Pair {
        let tcp = Config {
            recv_buffer: 1 << 20,
            send_buffer: 1 << 20,
            ..Config::default()
        };
        let mut ca = StackConfig::new(MAC_A, IP_A, 24);
        ca.tcp = tcp;
        let mut cb = StackConfig::new(MAC_B, IP_B, 24);
        cb.tcp = tcp;
        cb.secret = 2;
        let mut a = Stack::new(ca, Instant::ZERO);
        let mut b = Stack::new(cb, Instant::ZERO);
        a.add_neighbor(IP_B, MAC_B);
        b.add_neighbor(IP_A, MAC_A);
        Pair {
            a,
            b,
            now: Instant::ZERO,
            ab: Vec::with_capacity(4096),
            ba: Vec::with_capacity(4096),
            events: Vec::with_capacity(64),
            frames: 0,
        }
    }

    /// One round on the link, with the readiness events polled as the runner polls them;
    /// buffers a frame used go back to its sender's pool.
    fn step(&mut self) {
        self.now += Duration::from_micros(5);
        self.a.poll_timers(self.now);
        self.b.poll_timers(self.now);
        self.a.egress(self.now, &mut self.ab);
        self.b.egress(self.now, &mut self.ba);
        let (to_b, to_a) = (self.ab.len(), self.ba.len());
        self.frames += (to_b + to_a) as u64;
        self.b.ingress(self.now, &mut self.ab);
        self.a.ingress(self.now, &mut self.ba);
        for stack in [&mut self.a, &mut self.b] {
            self.events.clear();
            stack.poll_events(&mut self.events);
        }
        let (from, to) = if to_b >= to_a {
            (&mut self.b, &mut self.a)
        } else {
            (&mut self.a, &mut self.b)
        };
        for _ in 0..to_b.abs_diff(to_a) {
            match from.buffer_pool().take_spare() {
                Some(buf) => to.buffer_pool().put(buf),
                None => break,
            }
        }
    }

    fn connect(&mut self, port: u16) -> (SocketHandle, SocketHandle) {
        self.b.listen(port, 16).expect("listen");
        let client = self
            .a
            .connect(SocketAddrV4::new(IP_B, port))
            .expect("connect");
        loop {
            self.step();
            if let Some(server) = self.b.accept(port) {
                self.step();
                return (client, server);
            }
        }
    }

    /// Moves `bytes` from a to b.
    fn bulk(
        &mut self,
        (client, server): (SocketHandle, SocketHandle),
        bytes: usize,
        data: &[u8],
        sink: &mut [u8],
    ) {
        let (mut sent, mut got) = (0, 0);
        while got < bytes {
            if sent < bytes {
                let n = (bytes - sent).min(data.len());
                sent += self.a.send(client, &data[..n]).unwrap();
            }
            self.step();
            while let Ok(n) = self.b.recv(server, sink) {
                if n == 0 {
                    break;
                }
                got += n;
            }
        }
    }

    /// `count` 64-byte requests answered by 64-byte responses.
    fn request_response(
        &mut self,
        (client, server): (SocketHandle, SocketHandle),
        count: u32,
        sink: &mut [u8],
    ) {
        let message = [7u8; 64];
        for _ in 0..count {
            self.a.send(client, &message).unwrap();
            let mut got = 0;
            while got < 64 {
                self.step();
                got += self.b.recv(server, sink).unwrap();
            }
            self.b.send(server, &message).unwrap();
            let mut back = 0;
            while back < 64 {
                self.step();
                back += self.a.recv(client, sink).unwrap();
            }
        }
    }
}

#[test]
fn steady_bulk_and_request_response_allocate_nothing_per_packet() {
    let mut pair = Pair::new();
    let data = vec![0x42u8; 256 * 1024];
    let mut sink = vec![0u8; 256 * 1024];
    let bulk = pair.connect(80);
    let rr = pair.connect(81);
    // Warm-up: buffers grow to their working size, the pools fill, the tables settle.
    pair.bulk(bulk, 16 << 20, &data, &mut sink);
    pair.request_response(rr, 2_000, &mut sink);
    // Two identical rounds: a growth that happens once (a queue reaching a new largest size)
    // may fall in the first; anything per packet shows in both.
    let mut rounds = Vec::new();
    for _ in 0..2 {
        let (allocations, frames) = (ALLOCATIONS.load(Ordering::Relaxed), pair.frames);
        pair.bulk(bulk, 64 << 20, &data, &mut sink);
        pair.request_response(rr, 20_000, &mut sink);
        rounds.push((
            pair.frames - frames,
            ALLOCATIONS.load(Ordering::Relaxed) - allocations,
        ));
    }
    println!("{{\"rounds\": {rounds:?}}}");
    for &(frames, allocations) in &rounds {
        assert!(frames > 80_000, "only {frames} frames moved");
        assert!(
            allocations <= 1,
            "{allocations} allocations over {frames} frames"
        );
    }
    assert_eq!(rounds[1].1, 0, "the second round allocated: {rounds:?}");
}
