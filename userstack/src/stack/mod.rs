//! A per-core stack instance: Ethernet, ARP, IPv4, ICMP echo and TCP over a flow table, with
//! listeners, a timer wheel, buffer pools, batched rx/tx and a socket-like API.
//!
//! Payload copies: the in-place socket calls ([`Stack::send_with`], [`Stack::recv_with`],
//! [`Stack::recv_send_with`]) let the application work in the connection's rings, so a byte
//! is copied once on each side, by the stack: send ring → frame when a segment is built
//! (`Connection::poll_transmit`; a retransmission copies again), and frame → receive ring when
//! the segment arrives. Both are inherent with these rings: sent bytes must stay until ACKed while
//! the frame goes to the device, and received frames go back to the pool at once, in order or
//! not, while the bytes wait for the application. The copying [`Stack::send`] and
//! [`Stack::recv`] add one copy each on top.

mod arp_cache;
mod buffer_pool;
mod flow_table;
mod listener;
mod timer_wheel;

pub use arp_cache::ArpCache;
pub use buffer_pool::BufferPool;
pub use flow_table::{FlowTable, FourTuple, KeyedHasherBuilder};
pub use listener::Listener;
pub use timer_wheel::TimerWheel;

use crate::counters::{Counter, Counters};
use crate::tcp::{self, Connection, State};
use crate::time::Instant;
use crate::wire::template::Ipv4Template;
use crate::wire::{
    arp, ethernet, ethertype, icmp, ipv4, tcp as tcp_wire, ArpOperation, ArpRepr, EthernetAddress,
    EthernetRepr, IcmpRepr, Ipv4Repr, ParseError, SeqNumber, TcpFlags, TcpRepr,
};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};

/// Headers in front of a TCP segment in a frame: Ethernet II and a 20-byte IPv4 header.
const TCP_OFFSET: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
/// The default IP MTU (Ethernet).
pub const DEFAULT_MTU: usize = 1500;

/// Configuration of one stack instance.
#[derive(Clone, Copy, Debug)]
pub struct StackConfig {
    /// Our MAC address.
    pub mac: EthernetAddress,
    /// Our IPv4 address.
    pub ip: Ipv4Addr,
    /// Prefix length of our subnet.
    pub prefix_len: u8,
    /// Next hop for destinations outside the subnet.
    pub gateway: Option<Ipv4Addr>,
    /// Defaults for new connections.
    pub tcp: tcp::Config,
    /// Secret for ISS generation (RFC 6528) and flow hashing.
    pub secret: u64,
    /// SYN queue bound per listener (`net.ipv4.tcp_max_syn_backlog`, Linux 4096 on big hosts).
    pub syn_backlog: usize,
    /// Cap on a listener's accept queue (`net.core.somaxconn` = 4096).
    pub somaxconn: usize,
    /// Ephemeral port range (`net.ipv4.ip_local_port_range` = 32768 60999).
    pub ephemeral_ports: (u16, u16),
    /// IP MTU of the device; frames are at most 14 + `mtu` bytes and every connection's MSS
    /// is capped at `mtu` − 40.
    pub mtu: usize,
    /// The device verified TCP checksums of received frames (NIC rx checksum offload).
    pub rx_checksum_offload: bool,
    /// The device completes TCP checksums of transmitted segments (NIC tx checksum offload).
    pub tx_checksum_offload: bool,
}

impl StackConfig {
    /// A configuration with Linux defaults for the given addresses.
    pub fn new(mac: EthernetAddress, ip: Ipv4Addr, prefix_len: u8) -> StackConfig {
        StackConfig {
            mac,
            ip,
            prefix_len,
            gateway: None,
            tcp: tcp::Config::default(),
            secret: 0x5eed,
            syn_backlog: 4096,
            somaxconn: 4096,
            ephemeral_ports: (32768, 60999),
            mtu: DEFAULT_MTU,
            rx_checksum_offload: false,
            tx_checksum_offload: false,
        }
    }
}

/// Names a connection: a slot index plus a generation, so a stale handle never reaches a
/// slot's next occupant.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SocketHandle {
    index: u32,
    generation: u32,
}

/// Readiness of a connection, as reported by events.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Readiness {
    /// `recv` returns data or end of stream.
    pub readable: bool,
    /// `send` accepts data.
    pub writable: bool,
    /// The connection reached CLOSED.
    pub closed: bool,
}

/// Something the application may want to act on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// The listener on this port has a connection to accept.
    Acceptable(u16),
    /// A connection's readiness changed.
    Ready(SocketHandle, Readiness),
}

/// Why an API call failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Error {
    /// The handle names no live connection.
    InvalidHandle,
    /// The port already has a listener.
    AddressInUse,
    /// No free ephemeral port toward this destination.
    NoPortAvailable,
}

/// Who holds a connection: the application, or a listener's SYN or accept queue.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Owner {
    User,
    SynQueue(u16),
    AcceptQueue(u16),
}

/// Which of a connection's rings a socket call used, for the readiness bookkeeping.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rings {
    Send,
    Recv,
    Both,
}

#[derive(Debug)]
struct Slot {
    conn: Connection,
    /// The IPv4 header of the connection's segments, patched per packet.
    ip_template: Ipv4Template,
    generation: u32,
    timer_generation: u32,
    scheduled: Option<Instant>,
    owner: Owner,
    released: bool,
    dirty: bool,
    event_queued: bool,
    last_readiness: Readiness,
}

/// One stack instance. Drive it with [`Stack::ingress`], [`Stack::poll_timers`] and
/// [`Stack::egress`]; use the socket calls in between.
#[derive(Debug)]
pub struct Stack {
    config: StackConfig,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<u32>,
    generations: Vec<u32>,
    flows: FlowTable,
    listeners: HashMap<u16, Listener>,
    arp: ArpCache,
    wheel: TimerWheel,
    pool: BufferPool,
    tx_queue: Vec<Vec<u8>>,
    dirty: Vec<u32>,
    /// Connections whose readiness may have changed, each queued at most once, so the
    /// queue is bounded by the number of connections even if events are never polled.
    ready: Vec<SocketHandle>,
    /// Listeners with connections to accept, each at most once.
    acceptable: Vec<u16>,
    expired: Vec<(u32, u32)>,
    counters: Counters,
    retired: Counters,
    next_port: u16,
    ip_ident: u16,
    now: Instant,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Stack {
    /// A stack whose clock starts at `now`.
    pub fn new(config: StackConfig, now: Instant) -> Stack {
        Stack {
            flows: FlowTable::with_hasher(KeyedHasherBuilder::new(mix(config.secret))),
            slots: Vec::new(),
            free_slots: Vec::new(),
            generations: Vec::new(),
            listeners: HashMap::new(),
            arp: ArpCache::new(),
            wheel: TimerWheel::new(1_000_000, now),
            pool: BufferPool::new(ethernet::HEADER_LEN + config.mtu.max(576), 4096),
            tx_queue: Vec::new(),
            dirty: Vec::new(),
            ready: Vec::new(),
            acceptable: Vec::new(),
            expired: Vec::new(),
            counters: Counters::default(),
            retired: Counters::default(),
            next_port: config.ephemeral_ports.0,
            ip_ident: 0,
            now,
            config,
        }
    }

    /// This instance's configuration.
    pub fn config(&self) -> &StackConfig {
        &self.config
    }

    /// Adds a static neighbour entry (as `ip neigh add ... nud permanent` would).
    pub fn add_neighbor(&mut self, ip: Ipv4Addr, mac: EthernetAddress) {
        let frames = self.arp.learn(ip, mac, Instant::from_nanos(u64::MAX / 2));
        self.tx_queue.extend(frames);
    }

    // ------------------------------------------------------------------ socket API

    /// Opens a listener on `port` with an accept queue of `backlog` (capped by somaxconn).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<(), Error> {
        self.listen_with(port, backlog, self.config.tcp)
    }

    /// Like [`Stack::listen`] with a per-listener TCP configuration.
    pub fn listen_with(
        &mut self,
        port: u16,
        backlog: usize,
        config: tcp::Config,
    ) -> Result<(), Error> {
        if self.listeners.contains_key(&port) {
            return Err(Error::AddressInUse);
        }
        let backlog = backlog.clamp(1, self.config.somaxconn);
        let config = self.fit_to_mtu(config);
        self.listeners.insert(
            port,
            Listener::new(config, backlog, self.config.syn_backlog),
        );
        Ok(())
    }

    /// Closes the listener on `port`; connections not yet accepted are reset.
    pub fn unlisten(&mut self, port: u16) {
        if let Some(listener) = self.listeners.remove(&port) {
            for handle in listener.accept_queue {
                let _ = self.abort(handle);
            }
        }
    }

    /// Takes one established connection from the listener on `port`.
    pub fn accept(&mut self, port: u16) -> Option<SocketHandle> {
        let handle = self.listeners.get_mut(&port)?.accept_queue.pop_front()?;
        if let Some(slot) = self.slot_mut(handle) {
            slot.owner = Owner::User;
        }
        Some(handle)
    }

    /// Active open to `remote` from an ephemeral port.
    pub fn connect(&mut self, remote: SocketAddrV4) -> Result<SocketHandle, Error> {
        self.connect_with(remote, self.config.tcp)
    }

    /// Like [`Stack::connect`] with a per-connection TCP configuration.
    pub fn connect_with(
        &mut self,
        remote: SocketAddrV4,
        config: tcp::Config,
    ) -> Result<SocketHandle, Error> {
        let (low, high) = self.config.ephemeral_ports;
        let span = u32::from(high - low) + 1;
        for _ in 0..span {
            let port = self.next_port;
            self.next_port = if port >= high { low } else { port + 1 };
            if let Ok(handle) = self.connect_from(port, remote, config) {
                return Ok(handle);
            }
        }
        Err(Error::NoPortAvailable)
    }

    /// Whether local port `port` toward `remote` is in use (by a flow or a listener).
    pub fn port_in_use(&self, port: u16, remote: SocketAddrV4) -> bool {
        let tuple = FourTuple {
            local: SocketAddrV4::new(self.config.ip, port),
            remote,
        };
        self.flows.contains_key(&tuple) || self.listeners.contains_key(&port)
    }

    /// Active open to `remote` from local port `port`, chosen by the caller (the runtime
    /// picks one whose replies the NIC's RSS steers to this instance's queue).
    pub fn connect_from(
        &mut self,
        port: u16,
        remote: SocketAddrV4,
        config: tcp::Config,
    ) -> Result<SocketHandle, Error> {
        if self.port_in_use(port, remote) {
            return Err(Error::AddressInUse);
        }
        let config = self.fit_to_mtu(config);
        let tuple = FourTuple {
            local: SocketAddrV4::new(self.config.ip, port),
            remote,
        };
        let iss = self.iss(&tuple);
        let entropy = mix(u64::from(iss.0) ^ self.config.secret.rotate_left(17));
        let conn = Connection::connect(config, tuple.local, remote, iss, entropy, self.now);
        Ok(self.insert(conn, Owner::User))
    }

    /// Lends the connection's send ring to `write` in place: `write` gets the ring's free
    /// space, fills a prefix of it and returns how many bytes it wrote, which are queued for
    /// sending. The space is the contiguous part only, up to where the ring's memory wraps
    /// around or ends (the memory grows once full, up to the buffer size): the rest comes on
    /// the next call, so a caller with more to send calls again until it returns 0. The slice holds stale bytes,
    /// not zeros. `write` is not called when nothing can be queued (the ring is full or our
    /// side is closed); a count past the slice's end is cut to it. Returns the bytes queued.
    pub fn send_with<F>(&mut self, handle: SocketHandle, write: F) -> Result<usize, Error>
    where
        F: FnOnce(&mut [u8]) -> usize,
    {
        self.socket_call(handle, Rings::Send, |conn| conn.send_with(write))
    }

    /// Lends the connection's receive ring to `read` in place: `read` gets received bytes
    /// and returns how many it consumed; the rest stay for the next call, and the receive
    /// window reopens exactly as with [`Stack::recv`]. The bytes are the contiguous part
    /// only: where the ring's memory wraps around the rest comes on the next call, so a
    /// caller that consumed everything calls again until it returns 0. `read` is not called
    /// when there is nothing to read (0 with `is_recv_finished` = end of stream); a count past
    /// the slice's end is cut to it. Returns the bytes consumed.
    pub fn recv_with<F>(&mut self, handle: SocketHandle, read: F) -> Result<usize, Error>
    where
        F: FnOnce(&[u8]) -> usize,
    {
        self.socket_call(handle, Rings::Recv, |conn| conn.recv_with(read))
    }

    /// [`Stack::recv_with`] and [`Stack::send_with`] at once, for a reply made straight from
    /// the input (an echo): `serve` gets the received bytes and the send ring's free space
    /// (each its contiguous part; the space is empty when nothing can be queued) and returns
    /// how many bytes it consumed and how many it wrote. It is not called when there is
    /// nothing to read. Returns (consumed, queued).
    pub fn recv_send_with<F>(
        &mut self,
        handle: SocketHandle,
        serve: F,
    ) -> Result<(usize, usize), Error>
    where
        F: FnOnce(&[u8], &mut [u8]) -> (usize, usize),
    {
        self.socket_call(handle, Rings::Both, |conn| conn.recv_send_with(serve))
    }

    /// Queues a copy of `data`; returns how many bytes were taken. A wrapper over the same
    /// path as [`Stack::send_with`].
    pub fn send(&mut self, handle: SocketHandle, data: &[u8]) -> Result<usize, Error> {
        self.socket_call(handle, Rings::Send, |conn| conn.send(data))
    }

    /// Copies received bytes into `out`; returns how many were read (0 with
    /// `is_recv_finished` = end). A wrapper over the same path as [`Stack::recv_with`].
    pub fn recv(&mut self, handle: SocketHandle, out: &mut [u8]) -> Result<usize, Error> {
        self.socket_call(handle, Rings::Recv, |conn| conn.recv(out))
    }

    /// Half-closes: our FIN follows the queued data.
    pub fn shutdown(&mut self, handle: SocketHandle) -> Result<(), Error> {
        let index = self.index_of(handle)?;
        self.slot_at(index).conn.shutdown();
        self.touch(index);
        Ok(())
    }

    /// Closes and releases the handle; the connection finishes its closing sequence alone.
    pub fn close(&mut self, handle: SocketHandle) -> Result<(), Error> {
        let index = self.index_of(handle)?;
        let slot = self.slot_at(index);
        slot.conn.close();
        slot.released = true;
        self.touch(index);
        Ok(())
    }

    /// Resets the connection and releases the handle.
    pub fn abort(&mut self, handle: SocketHandle) -> Result<(), Error> {
        let index = self.index_of(handle)?;
        let slot = self.slot_at(index);
        slot.conn.abort();
        slot.released = true;
        self.touch(index);
        Ok(())
    }

    /// The connection behind `handle`, for inspection (state, cwnd, counters...).
    pub fn connection(&self, handle: SocketHandle) -> Option<&Connection> {
        self.slots
            .get(handle.index as usize)?
            .as_ref()
            .filter(|s| s.generation == handle.generation)
            .map(|s| &s.conn)
    }

    /// Moves pending readiness events into `out`.
    pub fn poll_events(&mut self, out: &mut Vec<Event>) {
        for port in self.acceptable.drain(..) {
            out.push(Event::Acceptable(port));
        }
        // Drained in place, so that the queue keeps its capacity: a poll allocates nothing.
        let mut ready = core::mem::take(&mut self.ready);
        for handle in ready.drain(..) {
            let Some(Some(slot)) = self.slots.get_mut(handle.index as usize) else {
                continue;
            };
            if slot.generation != handle.generation {
                continue;
            }
            slot.event_queued = false;
            let readiness = Readiness {
                readable: slot.conn.is_readable(),
                writable: slot.conn.is_writable(),
                closed: slot.conn.state() == State::Closed,
            };
            if readiness != slot.last_readiness {
                slot.last_readiness = readiness;
                out.push(Event::Ready(handle, readiness));
            }
        }
        self.ready = ready;
    }

    /// Live connections in the flow table.
    pub fn connection_count(&self) -> usize {
        self.flows.len()
    }

    /// All counters: the stack's own, retired connections' and live connections'.
    pub fn counters(&self) -> Counters {
        let mut total = self.counters.clone();
        total.merge(&self.retired);
        let mut established = 0;
        for slot in self.slots.iter().flatten() {
            total.merge(slot.conn.counters());
            if matches!(slot.conn.state(), State::Established | State::CloseWait) {
                established += 1;
            }
        }
        total.set(Counter::CurrEstab, established);
        total
    }

    // ------------------------------------------------------------------ driving

    /// Processes a batch of received frames; the buffers are kept for reuse.
    pub fn ingress(&mut self, now: Instant, frames: &mut Vec<Vec<u8>>) {
        self.now = self.now.max(now);
        for frame in frames.drain(..) {
            self.receive_frame(&frame);
            self.pool.put(frame);
        }
    }

    /// Runs expired timers.
    pub fn poll_timers(&mut self, now: Instant) {
        self.now = self.now.max(now);
        let mut expired = core::mem::take(&mut self.expired);
        self.wheel.advance(self.now, &mut expired);
        for (index, generation) in expired.drain(..) {
            let Some(Some(slot)) = self.slots.get_mut(index as usize) else {
                continue;
            };
            if slot.timer_generation != generation {
                continue;
            }
            slot.scheduled = None;
            slot.conn.handle_timeout(self.now);
            self.touch(index);
        }
        self.expired = expired;
    }

    /// The earliest time [`Stack::poll_timers`] may have work (a lower bound).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.wheel.next_expiry()
    }

    /// Appends every frame ready to leave to `out`.
    pub fn egress(&mut self, now: Instant, out: &mut Vec<Vec<u8>>) {
        self.now = self.now.max(now);
        out.append(&mut self.tx_queue);
        let mut dirty = core::mem::take(&mut self.dirty);
        // One buffer goes from connection to connection until one of them fills it: a
        // connection with nothing to send costs no trip to the pool (and no re-zeroing).
        let mut spare = None;
        for &index in &dirty {
            self.transmit_connection(index, out, &mut spare);
        }
        if let Some(frame) = spare {
            self.pool.put(frame);
        }
        for index in dirty.drain(..) {
            self.settle(index);
        }
        // Settling may touch connections again (e.g. to let a RST out): keep those.
        dirty.append(&mut self.dirty);
        self.dirty = dirty;
        self.release_idle_tables();
    }

    /// With no connection left (the last TIME-WAIT over), gives back the slot table, which
    /// keeps the capacity of its busiest moment at about 1.5 kB a slot (78 MB after 32,000
    /// connections), the flow table's, and the timer wheel's (whose entries are all stale
    /// then): an idle stack returns to its idle footprint. Handles stay unique, as the slots'
    /// generations are kept.
    fn release_idle_tables(&mut self) {
        if self.flows.is_empty() && self.slots.capacity() > 0 {
            self.slots = Vec::new();
            self.free_slots = Vec::new();
            self.dirty.clear();
            self.flows.shrink_to_fit();
            self.wheel.clear();
        }
    }

    /// The frame-buffer pool (a device backend or a memory link may move buffers between
    /// pools to model transmit completions).
    pub fn buffer_pool(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    // ------------------------------------------------------------------ internals

    /// Caps the MSS so a full segment fits the device MTU (IPv4 and TCP headers: 40 bytes).
    fn fit_to_mtu(&self, mut config: tcp::Config) -> tcp::Config {
        let limit = self.config.mtu.max(576) - 40;
        config.mss = config.mss.min(u16::try_from(limit).unwrap_or(u16::MAX));
        config
    }

    fn iss(&self, tuple: &FourTuple) -> SeqNumber {
        // RFC 6528: ISN = M + F(4-tuple, secret), M a 4-microsecond clock.
        let mut h = self.config.secret;
        h = mix(h ^ u64::from(u32::from(*tuple.local.ip())));
        h = mix(h ^ (u64::from(tuple.local.port()) << 16 | u64::from(tuple.remote.port())));
        h = mix(h ^ u64::from(u32::from(*tuple.remote.ip())));
        let m = (self.now.as_nanos() / 4000) as u32;
        SeqNumber((h as u32).wrapping_add(m))
    }

    fn insert(&mut self, mut conn: Connection, owner: Owner) -> SocketHandle {
        conn.set_tx_checksum_offload(self.config.tx_checksum_offload);
        let tuple = FourTuple {
            local: conn.local(),
            remote: conn.remote(),
        };
        let index = match self.free_slots.pop() {
            Some(index) => index,
            None => {
                self.slots.push(None);
                // After the table was given back, the generations of its indices remain.
                if self.generations.len() < self.slots.len() {
                    self.generations.push(0);
                }
                (self.slots.len() - 1) as u32
            }
        };
        let generation = self.generations[index as usize].wrapping_add(1);
        self.generations[index as usize] = generation;
        let ip_template = Ipv4Template::new(&Ipv4Repr {
            src_addr: *tuple.local.ip(),
            dst_addr: *tuple.remote.ip(),
            protocol: ipv4::protocol::TCP,
            payload_len: 0,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_fragment: true,
        });
        self.slots[index as usize] = Some(Slot {
            conn,
            ip_template,
            generation,
            timer_generation: 0,
            scheduled: None,
            owner,
            released: false,
            dirty: false,
            event_queued: false,
            last_readiness: Readiness::default(),
        });
        self.flows.insert(tuple, index);
        self.touch(index);
        SocketHandle { index, generation }
    }

    fn index_of(&self, handle: SocketHandle) -> Result<u32, Error> {
        match self.slots.get(handle.index as usize) {
            Some(Some(slot)) if slot.generation == handle.generation => Ok(handle.index),
            _ => Err(Error::InvalidHandle),
        }
    }

    /// Runs a socket call on the connection behind `handle`, then does its readiness
    /// bookkeeping and marks the connection for the next egress.
    fn socket_call<R>(
        &mut self,
        handle: SocketHandle,
        rings: Rings,
        call: impl FnOnce(&mut Connection) -> R,
    ) -> Result<R, Error> {
        let index = self.index_of(handle)?;
        let slot = self.slot_at(index);
        let result = call(&mut slot.conn);
        // The caller saw the send ring fill: the next time it has room is a change to
        // report, even if room appears and is used up again between two polls.
        if rings != Rings::Recv && !slot.conn.is_writable() {
            slot.last_readiness.writable = false;
        }
        // The caller saw the receive ring drain: new data is a change to report, even if it
        // arrives before the next poll (otherwise readable → read all → refilled looks like
        // "still readable" and no event comes).
        if rings != Rings::Send && !slot.conn.is_readable() {
            slot.last_readiness.readable = false;
        }
        self.touch(index);
        Ok(result)
    }

    fn slot_at(&mut self, index: u32) -> &mut Slot {
        self.slots[index as usize].as_mut().expect("live slot")
    }

    fn slot_mut(&mut self, handle: SocketHandle) -> Option<&mut Slot> {
        self.slots
            .get_mut(handle.index as usize)?
            .as_mut()
            .filter(|s| s.generation == handle.generation)
    }

    fn touch(&mut self, index: u32) {
        let slot = self.slot_at(index);
        if !slot.dirty {
            slot.dirty = true;
            self.dirty.push(index);
        }
    }

    /// Emits every segment the connection at `index` has to send; `spare` is a frame buffer
    /// taken from the pool and not yet filled, handed on to the next connection.
    fn transmit_connection(
        &mut self,
        index: u32,
        out: &mut Vec<Vec<u8>>,
        spare: &mut Option<Vec<u8>>,
    ) {
        let now = self.now;
        loop {
            let mut frame = spare.take().unwrap_or_else(|| self.pool.get());
            let Some(slot) = self.slots[index as usize].as_mut() else {
                *spare = Some(frame);
                return;
            };
            let Some(len) = slot.conn.poll_transmit(now, &mut frame[TCP_OFFSET..]) else {
                *spare = Some(frame);
                return;
            };
            let remote = *slot.conn.remote().ip();
            frame.truncate(TCP_OFFSET + len);
            self.counters.bump(Counter::IpOutRequests);
            self.ip_ident = self.ip_ident.wrapping_add(1);
            slot.ip_template
                .emit(&mut frame[ethernet::HEADER_LEN..], len, self.ip_ident);
            self.send_ip_frame(frame, remote, out);
        }
    }

    /// Fills in the Ethernet header toward `dst` and queues the frame, or holds it for ARP.
    fn send_ip_frame(&mut self, mut frame: Vec<u8>, dst: Ipv4Addr, out: &mut Vec<Vec<u8>>) {
        let next_hop = self.next_hop(dst);
        match self.arp.lookup(next_hop, self.now) {
            Some(mac) => {
                EthernetRepr {
                    src_addr: self.config.mac,
                    dst_addr: mac,
                    ethertype: ethertype::IPV4,
                }
                .emit(&mut frame);
                out.push(frame);
            }
            None => {
                if !self.arp.hold(next_hop, frame) {
                    self.counters.bump(Counter::IpOutNoRoutes);
                }
                if self.arp.should_request(next_hop, self.now) {
                    let request = self.arp_frame(
                        ArpOperation::Request,
                        EthernetAddress::BROADCAST,
                        EthernetAddress::default(),
                        next_hop,
                    );
                    out.push(request);
                }
            }
        }
    }

    fn next_hop(&self, dst: Ipv4Addr) -> Ipv4Addr {
        let mask = if self.config.prefix_len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.config.prefix_len.min(32)))
        };
        let local = u32::from(self.config.ip) & mask == u32::from(dst) & mask;
        match (local, self.config.gateway) {
            (false, Some(gateway)) => gateway,
            _ => dst,
        }
    }

    fn arp_frame(
        &mut self,
        operation: ArpOperation,
        eth_dst: EthernetAddress,
        target_mac: EthernetAddress,
        target_ip: Ipv4Addr,
    ) -> Vec<u8> {
        let mut frame = self.pool.get();
        frame.truncate(ethernet::HEADER_LEN + arp::PACKET_LEN);
        EthernetRepr {
            src_addr: self.config.mac,
            dst_addr: eth_dst,
            ethertype: ethertype::ARP,
        }
        .emit(&mut frame);
        ArpRepr {
            operation,
            sender_hardware_addr: self.config.mac,
            sender_protocol_addr: self.config.ip,
            target_hardware_addr: target_mac,
            target_protocol_addr: target_ip,
        }
        .emit(&mut frame[ethernet::HEADER_LEN..]);
        frame
    }

    /// After a connection was touched: schedule its timer, report readiness, hand it to its
    /// listener once established, and free it once closed and released.
    fn settle(&mut self, index: u32) {
        let now = self.now;
        let Some(slot) = self.slots[index as usize].as_mut() else {
            return;
        };
        slot.dirty = false;
        let state = slot.conn.state();
        // Timer: only (re)insert when the deadline moved earlier; a later deadline is caught
        // when the old entry fires early and finds nothing due. A cancelled timer keeps its
        // entry the same way: cancelling and re-arming on every transaction (a request
        // answered before its RTO) would otherwise leave a stale entry per transaction in the
        // wheel, whose slots then grow and allocate.
        if let Some(deadline) = slot.conn.poll_timeout() {
            if slot.scheduled.is_none_or(|s| deadline < s) {
                slot.timer_generation = slot.timer_generation.wrapping_add(1);
                slot.scheduled = Some(deadline);
                self.wheel
                    .insert(deadline.max(now), index, slot.timer_generation);
            }
        }
        // A passive connection leaves the SYN queue when its handshake ends either way.
        if let (Owner::SynQueue(port), false) = (slot.owner, state == State::SynReceived) {
            let handle = SocketHandle {
                index,
                generation: slot.generation,
            };
            let listener = self.listeners.get_mut(&port);
            let slot = self.slots[index as usize].as_mut().expect("live slot");
            match listener {
                Some(listener) => {
                    listener.syn_queue_len = listener.syn_queue_len.saturating_sub(1);
                    if state.is_synchronized() && !listener.accept_queue_full() {
                        listener.accept_queue.push_back(handle);
                        slot.owner = Owner::AcceptQueue(port);
                        if !self.acceptable.contains(&port) {
                            self.acceptable.push(port);
                        }
                    } else {
                        if state.is_synchronized() {
                            self.counters.bump(Counter::ListenOverflows);
                            self.counters.bump(Counter::ListenDrops);
                            slot.conn.abort();
                        }
                        slot.owner = Owner::User;
                        slot.released = true;
                    }
                }
                None => {
                    slot.conn.abort();
                    slot.owner = Owner::User;
                    slot.released = true;
                }
            }
            if slot.conn.state() == State::Closed {
                // Let the RST go out first; the slot is freed on the next settle.
                self.touch(index);
                return;
            }
        }
        let slot = self.slots[index as usize].as_mut().expect("live slot");
        if state == State::Closed && (slot.released || slot.owner != Owner::User) {
            self.remove(index);
            return;
        }
        if slot.owner == Owner::User && !slot.released && !slot.event_queued {
            slot.event_queued = true;
            self.ready.push(SocketHandle {
                index,
                generation: slot.generation,
            });
        }
    }

    fn remove(&mut self, index: u32) {
        let Some(mut slot) = self.slots[index as usize].take() else {
            return;
        };
        let tuple = FourTuple {
            local: slot.conn.local(),
            remote: slot.conn.remote(),
        };
        self.flows.remove(&tuple);
        self.retired.merge(&slot.conn.take_counters());
        match slot.owner {
            Owner::SynQueue(port) => {
                if let Some(listener) = self.listeners.get_mut(&port) {
                    listener.syn_queue_len = listener.syn_queue_len.saturating_sub(1);
                }
            }
            Owner::AcceptQueue(port) => {
                if let Some(listener) = self.listeners.get_mut(&port) {
                    listener.accept_queue.retain(|h| h.index != index);
                }
            }
            Owner::User => {}
        }
        self.free_slots.push(index);
    }

    fn receive_frame(&mut self, bytes: &[u8]) {
        let Ok(frame) = ethernet::Frame::new_checked(bytes) else {
            return;
        };
        let eth = EthernetRepr::parse(&frame);
        if eth.dst_addr != self.config.mac && !eth.dst_addr.is_broadcast() {
            return;
        }
        match eth.ethertype {
            ethertype::ARP => self.receive_arp(frame.payload()),
            ethertype::IPV4 => self.receive_ipv4(frame.payload()),
            _ => {}
        }
    }

    fn receive_arp(&mut self, bytes: &[u8]) {
        let Ok(packet) = arp::Packet::new_checked(bytes) else {
            return;
        };
        let Ok(repr) = ArpRepr::parse(&packet) else {
            return;
        };
        if repr.target_protocol_addr != self.config.ip {
            return;
        }
        let ready = self.arp.learn(
            repr.sender_protocol_addr,
            repr.sender_hardware_addr,
            self.now,
        );
        for mut frame in ready {
            EthernetRepr {
                src_addr: self.config.mac,
                dst_addr: repr.sender_hardware_addr,
                ethertype: ethertype::IPV4,
            }
            .emit(&mut frame);
            self.tx_queue.push(frame);
        }
        if repr.operation == ArpOperation::Request {
            let reply = self.arp_frame(
                ArpOperation::Reply,
                repr.sender_hardware_addr,
                repr.sender_hardware_addr,
                repr.sender_protocol_addr,
            );
            self.tx_queue.push(reply);
        }
    }

    fn receive_ipv4(&mut self, bytes: &[u8]) {
        self.counters.bump(Counter::IpInReceives);
        let packet = match ipv4::Packet::new_checked(bytes) {
            Ok(packet) => packet,
            Err(_) => {
                self.counters.bump(Counter::IpInHdrErrors);
                return;
            }
        };
        let repr = match Ipv4Repr::parse(&packet) {
            Ok(repr) => repr,
            Err(ParseError::Fragment) => {
                self.counters.bump(Counter::IpReasmReqds);
                self.counters.bump(Counter::IpReasmFails);
                return;
            }
            Err(_) => {
                self.counters.bump(Counter::IpInHdrErrors);
                return;
            }
        };
        if repr.dst_addr != self.config.ip {
            self.counters.bump(Counter::IpInAddrErrors);
            return;
        }
        match repr.protocol {
            ipv4::protocol::TCP => {
                self.counters.bump(Counter::IpInDelivers);
                self.receive_tcp(&repr, packet.payload());
            }
            ipv4::protocol::ICMP => {
                self.counters.bump(Counter::IpInDelivers);
                self.receive_icmp(&repr, packet.payload());
            }
            _ => self.counters.bump(Counter::IpInUnknownProtos),
        }
    }

    fn receive_icmp(&mut self, ip: &Ipv4Repr, bytes: &[u8]) {
        let Ok(packet) = icmp::Packet::new_checked(bytes) else {
            return;
        };
        let Ok(IcmpRepr::EchoRequest {
            ident,
            seq_no,
            data,
        }) = IcmpRepr::parse(&packet)
        else {
            return;
        };
        self.counters.bump(Counter::IcmpInEchos);
        let reply = IcmpRepr::EchoReply {
            ident,
            seq_no,
            data,
        };
        let mut frame = self.pool.get();
        if TCP_OFFSET + reply.buffer_len() > frame.len() {
            self.pool.put(frame);
            return;
        }
        frame.truncate(TCP_OFFSET + reply.buffer_len());
        reply.emit(&mut frame[TCP_OFFSET..]);
        self.ip_ident = self.ip_ident.wrapping_add(1);
        Ipv4Repr {
            src_addr: self.config.ip,
            dst_addr: ip.src_addr,
            protocol: ipv4::protocol::ICMP,
            payload_len: reply.buffer_len(),
            ttl: 64,
            tos: 0,
            ident: self.ip_ident,
            dont_fragment: false,
        }
        .emit(&mut frame[ethernet::HEADER_LEN..]);
        self.counters.bump(Counter::IcmpOutEchoReps);
        self.counters.bump(Counter::IpOutRequests);
        let mut out = core::mem::take(&mut self.tx_queue);
        self.send_ip_frame(frame, ip.src_addr, &mut out);
        self.tx_queue = out;
    }

    fn receive_tcp(&mut self, ip: &Ipv4Repr, bytes: &[u8]) {
        let Ok(packet) = tcp_wire::Packet::new_checked(bytes) else {
            self.counters.bump(Counter::InErrs);
            return;
        };
        let parsed = if self.config.rx_checksum_offload {
            TcpRepr::parse_unchecked(&packet)
        } else {
            TcpRepr::parse(&packet, ip.src_addr, ip.dst_addr)
        };
        // Borrowed, not moved out of the result: the representation is about 100 bytes.
        let seg = match &parsed {
            Ok(seg) => seg,
            Err(ParseError::BadChecksum) => {
                self.counters.bump(Counter::InCsumErrors);
                self.counters.bump(Counter::InErrs);
                return;
            }
            Err(_) => {
                self.counters.bump(Counter::InErrs);
                return;
            }
        };
        self.counters.bump(Counter::InSegs);
        let tuple = FourTuple {
            local: SocketAddrV4::new(ip.dst_addr, seg.dst_port),
            remote: SocketAddrV4::new(ip.src_addr, seg.src_port),
        };
        if let Some(&index) = self.flows.get(&tuple) {
            let now = self.now;
            let slot = self.slot_at(index);
            slot.conn.handle_segment(now, seg);
            self.touch(index);
            return;
        }
        let flags = seg.flags;
        if flags.syn() && !flags.ack() && !flags.rst() {
            if let Some(listener) = self.listeners.get(&seg.dst_port) {
                if listener.accept_queue_full() {
                    self.counters.bump(Counter::ListenOverflows);
                    self.counters.bump(Counter::ListenDrops);
                    return;
                }
                if listener.syn_queue_full() {
                    self.counters.bump(Counter::ListenDrops);
                    return;
                }
                let config = listener.config;
                let iss = self.iss(&tuple);
                let entropy = mix(u64::from(iss.0) ^ self.config.secret.rotate_left(29));
                let conn = Connection::accept(
                    config,
                    tuple.local,
                    tuple.remote,
                    iss,
                    entropy,
                    self.now,
                    seg,
                );
                if let Some(listener) = self.listeners.get_mut(&seg.dst_port) {
                    listener.syn_queue_len += 1;
                }
                self.insert(conn, Owner::SynQueue(seg.dst_port));
                return;
            }
        }
        if !flags.rst() {
            self.send_reset(ip, seg);
        }
    }

    /// Answers a segment for no connection with a RST (RFC 9293 3.10.7.1).
    fn send_reset(&mut self, ip: &Ipv4Repr, seg: &TcpRepr<'_>) {
        let (seq, ack, flags) = if seg.flags.ack() {
            (seg.ack_number, SeqNumber(0), TcpFlags::RST)
        } else {
            (
                SeqNumber(0),
                seg.seq_number + seg.segment_len(),
                TcpFlags::RST | TcpFlags::ACK,
            )
        };
        let rst = TcpRepr {
            src_port: seg.dst_port,
            dst_port: seg.src_port,
            seq_number: seq,
            ack_number: ack,
            flags: TcpFlags(flags),
            ..TcpRepr::default()
        };
        let mut frame = self.pool.get();
        frame.truncate(TCP_OFFSET + rst.buffer_len());
        rst.emit(&mut frame[TCP_OFFSET..], ip.dst_addr, ip.src_addr);
        self.ip_ident = self.ip_ident.wrapping_add(1);
        Ipv4Repr {
            src_addr: ip.dst_addr,
            dst_addr: ip.src_addr,
            protocol: ipv4::protocol::TCP,
            payload_len: rst.buffer_len(),
            ttl: 64,
            tos: 0,
            ident: self.ip_ident,
            dont_fragment: true,
        }
        .emit(&mut frame[ethernet::HEADER_LEN..]);
        self.counters.bump(Counter::OutRsts);
        self.counters.bump(Counter::OutSegs);
        self.counters.bump(Counter::IpOutRequests);
        let mut out = core::mem::take(&mut self.tx_queue);
        self.send_ip_frame(frame, ip.src_addr, &mut out);
        self.tx_queue = out;
    }
}

#[cfg(test)]
mod tests;
