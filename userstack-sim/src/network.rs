//! The discrete-event engine: hosts running stacks, gateways, links and the event queue.

use crate::frame_pool::{FrameId, FramePool};
use crate::link::{Fate, LinkDirection};
use crate::metrics::NetworkReport;
use crate::queue::{EventQueue, Stamp};
use crate::rng::Rng;
use crate::traffic::{App, AppContext};
use core::hash::{BuildHasherDefault, Hasher};
use core::time::Duration;
use std::collections::{HashMap, VecDeque};
use userstack::stack::{Event as StackEvent, Stack};
use userstack::time::Instant;
use userstack::wire::{ethernet, ethertype, ipv4, EthernetAddress};

/// A host: a stack instance plus its applications.
#[derive(Debug)]
pub struct Host {
    /// The stack under test.
    pub stack: Stack,
    /// Applications on this host.
    pub apps: Vec<App>,
    wake: Option<Instant>,
    /// Spare frame buffers the stack keeps between turns: the most frames it has sent in one
    /// turn (capped by the pool), so that after warm-up it never allocates one.
    lend: usize,
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    events: Vec<StackEvent>,
}

/// A gateway: forwards by destination MAC (static table), decrements the IPv4 TTL with an
/// incremental checksum update, and queues on its output links (drop-tail).
#[derive(Debug, Default)]
pub struct Gateway {
    /// Destination MAC to output port.
    pub table: HashMap<EthernetAddress, usize, BuildHasherDefault<MacHasher>>,
}

/// The gateways' table hash: the simulation picks its own addresses, so a keyed hash buys
/// nothing, and a multiply is several times cheaper per forwarded frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct MacHasher(u64);

impl Hasher for MacHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

/// A node of the network.
#[derive(Debug)]
pub enum Node {
    /// An end host.
    Host(Box<Host>),
    /// A forwarding gateway.
    Gateway(Gateway),
}

#[derive(Debug)]
struct Link {
    direction: LinkDirection,
    to: (usize, usize),
    /// Frames on the wire of an in-order link (no jitter, no reordering), each with its place
    /// in the event order; only the first has an event in the queue.
    arrivals: VecDeque<(Stamp, FrameId)>,
}

/// What happens at an instant; frames are named, not carried, so an event is two words.
#[derive(Clone, Copy, Debug)]
enum EventKind {
    /// A frame from a link that may reorder arrives.
    Arrive {
        node: u32,
        port: u32,
        frame: FrameId,
    },
    /// The first frame on the wire of an in-order link arrives.
    LinkArrival {
        link: u32,
    },
    TransmitDone {
        link: u32,
    },
    Wake {
        node: u32,
    },
    Sample,
}

/// The whole simulated network.
#[derive(Debug)]
pub struct Network {
    now: Instant,
    rng: Rng,
    events: EventQueue<EventKind>,
    frames: FramePool,
    nodes: Vec<Node>,
    links: Vec<Link>,
    ports: Vec<Vec<usize>>,
    /// Counters of the application layer.
    pub ctx: AppContext,
    /// Loss and drop counters.
    pub stats: NetworkReport,
    digest: u64,
    packets: u64,
    sample_interval: Option<Duration>,
}

/// Whether an Ethernet frame carries a TCP segment with payload.
pub fn carries_tcp_data(frame: &[u8]) -> bool {
    let Ok(eth) = ethernet::Frame::new_checked(frame) else {
        return false;
    };
    if eth.ethertype() != ethertype::IPV4 {
        return false;
    }
    let Ok(ip) = ipv4::Packet::new_checked(eth.payload()) else {
        return false;
    };
    if ip.protocol() != ipv4::protocol::TCP {
        return false;
    }
    let Ok(tcp) = userstack::wire::tcp::Packet::new_checked(ip.payload()) else {
        return false;
    };
    !tcp.payload().is_empty()
}

/// Bytes of each arriving frame that go into the digest (all the headers of a TCP segment
/// with options).
const DIGEST_PREFIX: usize = 80;

/// Folds one 64-bit word into the run's digest (multiply by the golden-ratio constant, then
/// xor-shift): a word at a time, not a byte.
fn digest_word(h: u64, word: u64) -> u64 {
    let h = (h ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 29)
}

impl Network {
    /// An empty network with its RNG seeded.
    pub fn new(seed: u64) -> Network {
        Network {
            now: Instant::ZERO,
            rng: Rng::new(seed),
            events: EventQueue::new(),
            frames: FramePool::new(),
            nodes: Vec::new(),
            links: Vec::new(),
            ports: Vec::new(),
            ctx: AppContext::default(),
            stats: NetworkReport::default(),
            digest: 0xcbf2_9ce4_8422_2325,
            packets: 0,
            sample_interval: None,
        }
    }

    /// Current simulated time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Adds a host; returns its node index.
    pub fn add_host(&mut self, stack: Stack) -> usize {
        self.nodes.push(Node::Host(Box::new(Host {
            stack,
            apps: Vec::new(),
            wake: None,
            lend: 0,
            rx: Vec::new(),
            tx: Vec::new(),
            events: Vec::new(),
        })));
        self.ports.push(Vec::new());
        self.nodes.len() - 1
    }

    /// Adds a gateway; returns its node index.
    pub fn add_gateway(&mut self) -> usize {
        self.nodes.push(Node::Gateway(Gateway::default()));
        self.ports.push(Vec::new());
        self.nodes.len() - 1
    }

    /// Adds a one-way link from a new port of `from` to a port `to_port` of `to`; returns the
    /// new port number on `from`.
    pub fn add_link(
        &mut self,
        from: usize,
        to: usize,
        to_port: usize,
        direction: LinkDirection,
    ) -> usize {
        self.links.push(Link {
            direction,
            to: (to, to_port),
            arrivals: VecDeque::new(),
        });
        self.ports[from].push(self.links.len() - 1);
        self.ports[from].len() - 1
    }

    /// The node at `index`.
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    /// The node at `index`, mutably.
    pub fn node_mut(&mut self, index: usize) -> &mut Node {
        &mut self.nodes[index]
    }

    /// Frame arrivals processed so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Digest of every arrival so far: its time, length and first 80 bytes.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    fn schedule(&mut self, at: Instant, kind: EventKind) {
        self.events.push(at, kind);
    }

    /// Starts the periodic metrics sample every `interval`.
    pub fn sample_every(&mut self, interval: Duration) {
        self.sample_interval = Some(interval);
        self.schedule(self.now + interval, EventKind::Sample);
    }

    /// Wakes every host at the current time (to start applications).
    pub fn wake_all(&mut self) {
        for node in 0..self.nodes.len() {
            if let Node::Host(host) = &mut self.nodes[node] {
                host.wake = Some(self.now);
                self.schedule(self.now, EventKind::Wake { node: node as u32 });
            }
        }
    }

    /// Runs events until `end`; `on_sample` is called at each sample tick.
    pub fn run_until(&mut self, end: Instant, mut on_sample: impl FnMut(&mut Network)) {
        while let Some((at, kind)) = self.events.peek() {
            if at > end {
                break;
            }
            self.now = at;
            match kind {
                EventKind::Arrive { node, port, frame } => {
                    self.events.pop();
                    self.packets += 1;
                    self.digest_frame(frame);
                    self.arrive(node as usize, port as usize, frame);
                }
                EventKind::LinkArrival { link } => {
                    let l = &mut self.links[link as usize];
                    let Some((_, frame)) = l.arrivals.pop_front() else {
                        self.events.pop();
                        continue;
                    };
                    // The wire's next frame takes this event's place in the queue.
                    match l.arrivals.front() {
                        Some(&(next, _)) => self.events.replace_next(next, kind),
                        None => {
                            self.events.pop();
                        }
                    }
                    let (node, port) = l.to;
                    self.packets += 1;
                    self.digest_frame(frame);
                    self.arrive(node, port, frame);
                }
                EventKind::TransmitDone { link } => self.transmit_done(link as usize),
                EventKind::Wake { node } => {
                    self.events.pop();
                    if let Node::Host(host) = &mut self.nodes[node as usize] {
                        if host.wake == Some(self.now) {
                            host.wake = None;
                            self.run_host(node as usize);
                        }
                    }
                }
                EventKind::Sample => {
                    self.events.pop();
                    on_sample(self);
                    if let Some(interval) = self.sample_interval {
                        self.schedule(self.now + interval, EventKind::Sample);
                    }
                }
            }
        }
        self.now = end;
    }

    fn digest_frame(&mut self, frame: FrameId) {
        let bytes = self.frames.get(frame);
        let prefix = &bytes[..bytes.len().min(DIGEST_PREFIX)];
        // Two independent lanes (even and odd words), joined at the end, so that the
        // multiplications of one frame overlap instead of waiting on each other.
        let mut even = digest_word(self.digest, self.now.as_nanos());
        let mut odd = digest_word(!self.digest, prefix.len() as u64);
        let mut pairs = prefix.chunks_exact(16);
        let mut word = [0u8; 8];
        for pair in &mut pairs {
            word.copy_from_slice(&pair[..8]);
            even = digest_word(even, u64::from_le_bytes(word));
            word.copy_from_slice(&pair[8..]);
            odd = digest_word(odd, u64::from_le_bytes(word));
        }
        let mut rest = [0u8; 16];
        let tail = pairs.remainder();
        if !tail.is_empty() {
            rest[..tail.len()].copy_from_slice(tail);
            word.copy_from_slice(&rest[..8]);
            even = digest_word(even, u64::from_le_bytes(word));
            word.copy_from_slice(&rest[8..]);
            odd = digest_word(odd, u64::from_le_bytes(word));
        }
        self.digest = digest_word(even, odd);
    }

    fn arrive(&mut self, node: usize, port: usize, frame: FrameId) {
        if let Node::Host(host) = &mut self.nodes[node] {
            host.rx.push(self.frames.remove(frame));
            self.run_host(node);
            return;
        }
        let bytes = self.frames.get_mut(frame);
        if bytes.len() < ethernet::HEADER_LEN {
            self.frames.release(frame);
            return;
        }
        let mut dst = [0u8; 6];
        dst.copy_from_slice(&bytes[..6]);
        let dst = EthernetAddress(dst);
        if u16::from_be_bytes([bytes[12], bytes[13]]) == ethertype::IPV4 {
            if let Ok(mut ip) = ipv4::Packet::new_checked(&mut bytes[ethernet::HEADER_LEN..]) {
                if ip.decrement_ttl() == 0 {
                    self.frames.release(frame);
                    return;
                }
            }
        }
        if dst.is_broadcast() {
            for out in 0..self.ports[node].len() {
                if out != port {
                    let copy = self.frames.duplicate(frame);
                    self.send(node, out, copy);
                }
            }
            self.frames.release(frame);
            return;
        }
        let out = match &self.nodes[node] {
            Node::Gateway(gateway) => gateway.table.get(&dst).copied(),
            Node::Host(_) => None,
        };
        match out {
            Some(out) => self.send(node, out, frame),
            None => self.frames.release(frame),
        }
    }

    /// Hands `frame` to the link on `port` of `node`.
    fn send(&mut self, node: usize, port: usize, frame: FrameId) {
        let Some(&link) = self.ports[node].get(port) else {
            self.frames.release(frame);
            return;
        };
        self.stats.frames_offered += 1;
        let len = self.frames.get(frame).len();
        let direction = &mut self.links[link].direction;
        match direction.enqueue(frame, len) {
            Ok(()) => {
                if !direction.busy {
                    direction.busy = true;
                    let len = direction.queue.front().map_or(0, |&(_, len)| len);
                    let done = self.now + direction.serialization_time(len);
                    self.schedule(done, EventKind::TransmitDone { link: link as u32 });
                }
            }
            Err(frame) => {
                self.stats.queue_drops += 1;
                self.stats.data_segments_lost +=
                    u64::from(carries_tcp_data(self.frames.get(frame)));
                self.frames.release(frame);
            }
        }
    }

    /// The serializer of `link` finished its front frame: the event being handled (still
    /// first in the queue) becomes the link's next end of serialization, if any.
    fn transmit_done(&mut self, link: usize) {
        let now = self.now;
        let l = &mut self.links[link];
        let Some((frame, _)) = l.direction.queue.pop_front() else {
            l.direction.busy = false;
            self.events.pop();
            return;
        };
        let fate = l.direction.fate(now, &mut self.rng);
        match l.direction.queue.front() {
            Some(&(_, len)) => {
                let done = self.events.stamp(now + l.direction.serialization_time(len));
                self.events
                    .replace_next(done, EventKind::TransmitDone { link: link as u32 });
            }
            None => {
                l.direction.busy = false;
                self.events.pop();
            }
        }
        match fate {
            Fate::Lost => {
                self.stats.wire_losses += 1;
                self.stats.data_segments_lost +=
                    u64::from(carries_tcp_data(self.frames.get(frame)));
                self.frames.release(frame);
            }
            Fate::Arrives(at, duplicate) => {
                if let Some(again) = duplicate {
                    self.stats.duplicates += 1;
                    let copy = self.frames.duplicate(frame);
                    self.deliver(link, again, copy);
                }
                self.deliver(link, at, frame);
            }
        }
    }

    /// Puts `frame` on the wire of `link`, to arrive at `at`.
    fn deliver(&mut self, link: usize, at: Instant, frame: FrameId) {
        let l = &mut self.links[link];
        let config = &l.direction.config;
        if config.jitter.is_zero() && config.reorder <= 0.0 {
            // In order: arrival times never decrease, so the wire is a FIFO.
            let key = self.events.stamp(at);
            debug_assert!(l.arrivals.back().is_none_or(|&(last, _)| last < key));
            if l.arrivals.is_empty() {
                self.events
                    .push_stamped(key, EventKind::LinkArrival { link: link as u32 });
            }
            l.arrivals.push_back((key, frame));
        } else {
            let (node, port) = (l.to.0 as u32, l.to.1 as u32);
            self.schedule(at, EventKind::Arrive { node, port, frame });
        }
    }

    fn run_host(&mut self, node: usize) {
        let now = self.now;
        let Node::Host(host) = &mut self.nodes[node] else {
            return;
        };
        let host = host.as_mut();
        self.frames.lend(host.stack.buffer_pool(), host.lend);
        host.stack.ingress(now, &mut host.rx);
        host.stack.poll_timers(now);
        // Egress settles the connections that input and timers touched, which is what queues
        // their readiness events: so transmit first, then let the applications see the
        // events, then transmit what they wrote (the runner's loop does the same).
        let mut tx = core::mem::take(&mut host.tx);
        host.stack.egress(now, &mut tx);
        host.events.clear();
        host.stack.poll_events(&mut host.events);
        let mut next_app: Option<Instant> = None;
        for app in &mut host.apps {
            if let Some(t) = app.run(now, &mut host.stack, &host.events, &mut self.ctx) {
                next_app = Some(next_app.map_or(t, |n| n.min(t)));
            }
        }
        host.stack.egress(now, &mut tx);
        self.frames.reclaim(host.stack.buffer_pool(), host.lend);
        host.lend = host.lend.max(tx.len());
        let next = [host.stack.poll_timeout(), next_app]
            .into_iter()
            .flatten()
            .min();
        let mut wake = None;
        if let Some(next) = next {
            let next = next.max(now + Duration::from_nanos(1));
            if host.wake.is_none_or(|w| next < w || w <= now) {
                host.wake = Some(next);
                wake = Some(next);
            }
        }
        for frame in tx.drain(..) {
            let frame = self.frames.insert(frame);
            self.send(node, 0, frame);
        }
        if let Node::Host(host) = &mut self.nodes[node] {
            host.tx = tx;
        }
        if let Some(at) = wake {
            self.schedule(at, EventKind::Wake { node: node as u32 });
        }
    }

    /// Every host's stack.
    pub fn stacks(&self) -> impl Iterator<Item = &Stack> {
        self.nodes.iter().filter_map(|node| match node {
            Node::Host(host) => Some(&host.stack),
            Node::Gateway(_) => None,
        })
    }

    /// The stack of host `node`.
    pub fn stack(&self, node: usize) -> Option<&Stack> {
        match &self.nodes[node] {
            Node::Host(host) => Some(&host.stack),
            Node::Gateway(_) => None,
        }
    }
}
