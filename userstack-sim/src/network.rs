//! The discrete-event engine: hosts running stacks, gateways, links and the event queue.

use crate::link::{Fate, LinkDirection};
use crate::metrics::NetworkReport;
use crate::rng::Rng;
use crate::traffic::{App, AppContext};
use core::cmp::Ordering;
use core::time::Duration;
use std::collections::{BinaryHeap, HashMap};
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
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    events: Vec<StackEvent>,
}

/// A gateway: forwards by destination MAC (static table), decrements the IPv4 TTL with an
/// incremental checksum update, and queues on its output links (drop-tail).
#[derive(Debug, Default)]
pub struct Gateway {
    /// Destination MAC to output port.
    pub table: HashMap<EthernetAddress, usize>,
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
}

#[derive(Debug)]
enum EventKind {
    Arrive {
        node: usize,
        port: usize,
        frame: Vec<u8>,
    },
    TransmitDone {
        link: usize,
    },
    Wake {
        node: usize,
    },
    Sample,
}

#[derive(Debug)]
struct Event {
    at: Instant,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Event) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Event) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and we want the earliest first.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The whole simulated network.
#[derive(Debug)]
pub struct Network {
    now: Instant,
    rng: Rng,
    events: BinaryHeap<Event>,
    seq: u64,
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

const FNV_PRIME: u64 = 0x0100_0000_01b3;

impl Network {
    /// An empty network with its RNG seeded.
    pub fn new(seed: u64) -> Network {
        Network {
            now: Instant::ZERO,
            rng: Rng::new(seed),
            events: BinaryHeap::new(),
            seq: 0,
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

    /// FNV-1a digest of all arrivals so far.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    fn schedule(&mut self, at: Instant, kind: EventKind) {
        self.seq += 1;
        self.events.push(Event {
            at,
            seq: self.seq,
            kind,
        });
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
                self.schedule(self.now, EventKind::Wake { node });
            }
        }
    }

    /// Runs events until `end`; `on_sample` is called at each sample tick.
    pub fn run_until(&mut self, end: Instant, mut on_sample: impl FnMut(&mut Network)) {
        while let Some(event) = self.events.peek() {
            if event.at > end {
                break;
            }
            let event = self.events.pop().expect("peeked");
            self.now = event.at;
            match event.kind {
                EventKind::Arrive { node, port, frame } => {
                    self.packets += 1;
                    self.digest_frame(&frame);
                    self.arrive(node, port, frame);
                }
                EventKind::TransmitDone { link } => self.transmit_done(link),
                EventKind::Wake { node } => {
                    if let Node::Host(host) = &mut self.nodes[node] {
                        if host.wake == Some(self.now) {
                            host.wake = None;
                            self.run_host(node);
                        }
                    }
                }
                EventKind::Sample => {
                    on_sample(self);
                    if let Some(interval) = self.sample_interval {
                        self.schedule(self.now + interval, EventKind::Sample);
                    }
                }
            }
        }
        self.now = end;
    }

    fn digest_frame(&mut self, frame: &[u8]) {
        let mut h = self.digest;
        for b in self
            .now
            .as_nanos()
            .to_le_bytes()
            .iter()
            .chain(frame.iter().take(80))
        {
            h = (h ^ u64::from(*b)).wrapping_mul(FNV_PRIME);
        }
        self.digest = h;
    }

    fn arrive(&mut self, node: usize, port: usize, mut frame: Vec<u8>) {
        match &mut self.nodes[node] {
            Node::Host(host) => {
                host.rx.push(frame);
                self.run_host(node);
            }
            Node::Gateway(gateway) => {
                if frame.len() < ethernet::HEADER_LEN {
                    return;
                }
                let mut dst = [0u8; 6];
                dst.copy_from_slice(&frame[..6]);
                let dst = EthernetAddress(dst);
                if u16::from_be_bytes([frame[12], frame[13]]) == ethertype::IPV4 {
                    if let Ok(mut ip) =
                        ipv4::Packet::new_checked(&mut frame[ethernet::HEADER_LEN..])
                    {
                        if ip.decrement_ttl() == 0 {
                            return;
                        }
                    }
                }
                if dst.is_broadcast() {
                    for out in 0..self.ports[node].len() {
                        if out != port {
                            self.send(node, out, frame.clone());
                        }
                    }
                } else if let Some(&out) = gateway.table.get(&dst) {
                    self.send(node, out, frame);
                }
            }
        }
    }

    /// Hands `frame` to the link on `port` of `node`.
    fn send(&mut self, node: usize, port: usize, frame: Vec<u8>) {
        let Some(&link) = self.ports[node].get(port) else {
            return;
        };
        self.stats.frames_offered += 1;
        let data = carries_tcp_data(&frame);
        let direction = &mut self.links[link].direction;
        match direction.enqueue(frame) {
            Ok(()) => {
                if !direction.busy {
                    direction.busy = true;
                    let len = direction.queue.front().map_or(0, Vec::len);
                    let done = self.now + direction.config.transmission_time(len);
                    self.schedule(done, EventKind::TransmitDone { link });
                }
            }
            Err(_) => {
                self.stats.queue_drops += 1;
                self.stats.data_segments_lost += u64::from(data);
            }
        }
    }

    fn transmit_done(&mut self, link: usize) {
        let now = self.now;
        let (to, fate, frame, next) = {
            let l = &mut self.links[link];
            let frame = l
                .direction
                .queue
                .pop_front()
                .expect("busy link has a frame");
            let fate = l.direction.fate(now, &mut self.rng);
            let next = l
                .direction
                .queue
                .front()
                .map(|f| l.direction.config.transmission_time(f.len()));
            if next.is_none() {
                l.direction.busy = false;
            }
            (l.to, fate, frame, next)
        };
        if let Some(duration) = next {
            self.schedule(now + duration, EventKind::TransmitDone { link });
        }
        match fate {
            Fate::Lost => {
                self.stats.wire_losses += 1;
                self.stats.data_segments_lost += u64::from(carries_tcp_data(&frame));
            }
            Fate::Arrives(at, duplicate) => {
                if let Some(again) = duplicate {
                    self.stats.duplicates += 1;
                    self.schedule(
                        again,
                        EventKind::Arrive {
                            node: to.0,
                            port: to.1,
                            frame: frame.clone(),
                        },
                    );
                }
                self.schedule(
                    at,
                    EventKind::Arrive {
                        node: to.0,
                        port: to.1,
                        frame,
                    },
                );
            }
        }
    }

    fn run_host(&mut self, node: usize) {
        let now = self.now;
        let Node::Host(host) = &mut self.nodes[node] else {
            return;
        };
        let host = host.as_mut();
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
            self.send(node, 0, frame);
        }
        if let Node::Host(host) = &mut self.nodes[node] {
            host.tx = tx;
        }
        if let Some(at) = wake {
            self.schedule(at, EventKind::Wake { node });
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
