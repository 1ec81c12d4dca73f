//! Two stacks joined by a lossless in-memory link on one thread, shared by the benchmarks
//! (benches/stack.rs) and the allocation test (tests/no_alloc.rs).

use core::time::Duration;
use std::net::{Ipv4Addr, SocketAddrV4};
use userstack::stack::{SocketHandle, Stack, StackConfig};
use userstack::tcp::Config;
use userstack::time::Instant;
use userstack::wire::EthernetAddress;

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// Stack b's address, which a connects to.
pub const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

/// Two stacks and the frames in flight between them.
pub struct Pair {
    /// The client side.
    pub a: Stack,
    /// The server side.
    pub b: Stack,
    /// The link's clock, advanced 5 µs a round.
    pub now: Instant,
    ab: Vec<Vec<u8>>,
    ba: Vec<Vec<u8>>,
}

impl Pair {
    /// Both stacks with `tcp`, checksums computed in software.
    pub fn new(tcp: Config) -> Pair {
        Pair::with_offload(tcp, false)
    }

    /// `offload`: both stacks leave TCP checksums to the (here imaginary) NIC.
    pub fn with_offload(tcp: Config, offload: bool) -> Pair {
        let mut ca = StackConfig::new(MAC_A, IP_A, 24);
        ca.tcp = tcp;
        ca.rx_checksum_offload = offload;
        ca.tx_checksum_offload = offload;
        let mut cb = StackConfig::new(MAC_B, IP_B, 24);
        cb.tcp = tcp;
        cb.secret = 2;
        cb.rx_checksum_offload = offload;
        cb.tx_checksum_offload = offload;
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
        }
    }

    /// One round on the link: both sides transmit, then both receive, so frames in either
    /// direction arrive within the round; buffers flow back. Returns the frames moved.
    pub fn step(&mut self) -> usize {
        self.now += Duration::from_micros(5);
        self.a.poll_timers(self.now);
        self.b.poll_timers(self.now);
        self.a.egress(self.now, &mut self.ab);
        self.b.egress(self.now, &mut self.ba);
        let (to_b, to_a) = (self.ab.len(), self.ba.len());
        self.b.ingress(self.now, &mut self.ab);
        self.a.ingress(self.now, &mut self.ba);
        // Transmit completion: the net surplus of buffers goes back to the other side.
        let surplus = to_b.abs_diff(to_a);
        if to_b >= to_a {
            complete(&mut self.b, &mut self.a, surplus);
        } else {
            complete(&mut self.a, &mut self.b, surplus);
        }
        to_b + to_a
    }

    /// One round in the pattern of an event loop and of smoltcp's `Interface::poll`: a runs
    /// its timers, receives everything pending from b and transmits everything it may; then b
    /// does the same, receiving what a sent in this round. Frames b sends reach a in the next
    /// round. Buffers go back to their sender's pool as each frame is received. Returns the
    /// frames transmitted.
    pub fn poll_round(&mut self) -> usize {
        self.now += Duration::from_micros(5);
        let from_b = self.ba.len();
        self.a.poll_timers(self.now);
        self.a.ingress(self.now, &mut self.ba);
        complete(&mut self.a, &mut self.b, from_b);
        self.a.egress(self.now, &mut self.ab);
        let from_a = self.ab.len();
        self.b.poll_timers(self.now);
        self.b.ingress(self.now, &mut self.ab);
        complete(&mut self.b, &mut self.a, from_a);
        self.b.egress(self.now, &mut self.ba);
        from_a + self.ba.len()
    }

    /// Connects a to b's listener on `port`; the client's and the server's handles.
    pub fn connect(&mut self, port: u16) -> (SocketHandle, SocketHandle) {
        let client = self.a.connect(SocketAddrV4::new(IP_B, port)).expect("port");
        loop {
            self.step();
            if let Some(server) = self.b.accept(port) {
                self.step();
                return (client, server);
            }
        }
    }
}

/// Transmit completion: a stack keeps the buffers of the frames it received, so `frames` of
/// them go back to the pool of the stack that sent them, as its NIC would return them.
fn complete(receiver: &mut Stack, sender: &mut Stack, frames: usize) {
    for _ in 0..frames {
        match receiver.buffer_pool().take_spare() {
            Some(buf) => sender.buffer_pool().put(buf),
            None => break,
        }
    }
}
