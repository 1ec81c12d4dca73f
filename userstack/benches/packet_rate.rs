//! Packet rate of one stack instance on one core, the way user-space stacks are measured: a
//! generator of pre-built frames plays 1,024 remote peers (it crafts their SYNs and final ACKs
//! itself, reading the stack's SYN-ACKs for the ISNs) and feeds the stack batches of 32 frames,
//! with one clock read per batch; whatever the stack transmits is parsed by the generator and
//! its buffers are recycled (a transmit completion). The figure is frames processed (in + out)
//! per CPU second of this thread (`CLOCK_THREAD_CPUTIME_ID`) and per wall second,
//! min/median/max over rounds interleaved across all scenarios, printed as one JSON document.
//! Each scenario's clock stops while the others run, so that no timer fires for the gap.
//!
//! Workloads: `discard_64` and `discard_1448` (in-order data segments to a discard service
//! that reads everything; the stack ACKs as it likes), `echo_64` (the application writes back
//! what it reads; the generator answers the echoed data with pure ACKs), `bulk_acks` (the
//! application keeps every send buffer full; the generator ACKs every second data segment and
//! any odd one left at the end of a batch, as GRO plus delayed ACKs would). Each runs with
//! software checksums (the generator fills in correct TCP checksums incrementally; the stack
//! verifies and computes them) and with TCP checksum offload (userstack's
//! `rx_checksum_offload`/`tx_checksum_offload`, smoltcp's `ChecksumCapabilities::tcp`; the
//! generator then writes no TCP checksum). The IPv4 header checksum is software on both sides.
//!
//! Frames are built once per connection as 66-byte header templates (Ethernet, IPv4, TCP with
//! the timestamps option) and a fixed ring of 32 data and 32 ACK buffers whose payload is
//! written once; per frame the generator copies the template, patches sequence, ACK and
//! timestamp words, and adds those words to a precomputed one's-complement sum for the
//! checksum. Its own cost is measured alone (the same code fed with recorded userstack output)
//! and reported separately; the frame rates include it.
//!
//! The two stacks: userstack (`Stack::ingress`/`egress`, buffers through `Stack::buffer_pool`,
//! the application driven by `poll_events`) and smoltcp (`Interface::poll` on a device whose
//! receive tokens lend the generator's frames and whose transmit tokens fill pooled buffers;
//! one listening socket per connection; the application visits the sockets of the flows the
//! batch reached, as smoltcp has no readiness events). Both use copying socket calls, 64 KiB
//! socket buffers, Nagle, a 40 ms delayed ACK, timestamps and the same MSS. What still differs
//! between them: smoltcp visits every socket on each poll and looks sockets up by a linear
//! scan (its design; `PACKET_RATE_CONNECTIONS` shows how that scales), has no congestion
//! control built in here (the crate's `socket-tcp-cubic` feature is off) where userstack runs
//! CUBIC, does not act on received SACK blocks, and ACKs on its own policy. What differs from a NIC-driven stack:
//! frames sit in warm caches, every connection gets one frame per visit (round-robin, so no
//! two frames of a batch hit the same connection), and a transmit pass is not capped at 32.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does one tiny round on 64
//! connections and checks that data moved and no checksum failed; it never asserts on speed.
//! `cargo bench -p userstack --bench packet_rate -- NAME` runs only the scenarios whose label
//! (`stack/workload/checksums`, e.g. `userstack/discard_64/offload`) contains NAME;
//! `PACKET_RATE_CONNECTIONS` changes the number of connections (default 1,024).

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Instant as WallClock;
use userstack::counters::Counter;
use userstack::stack::{BufferPool, Event, SocketHandle, Stack, StackConfig};
use userstack::tcp::Config;
use userstack::time::Instant;
use userstack::wire::{
    checksum, ethertype, ipv4, EthernetAddress, EthernetRepr, Ipv4Repr, SeqNumber, TcpFlags,
    TcpOptions, TcpRepr,
};

const STACK_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const GEN_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const GEN_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The generator's port for flow `i` is `GEN_PORT_BASE + i`.
const GEN_PORT_BASE: u16 = 20_000;
/// Ethernet (14) + IPv4 (20) + TCP (20) + NOP NOP timestamps (12).
const HDR: usize = 66;
const SEQ_AT: usize = 38;
const ACK_AT: usize = 42;
const CSUM_AT: usize = 50;
const TSVAL_AT: usize = 58;
const TSECR_AT: usize = 62;
/// New frames (data, or ACKs for `bulk_acks`) per `ingress`; `echo_64` adds up to as many ACKs.
const BATCH: usize = 32;
/// The stack pool's buffer size (14 + MTU 1500): a smaller buffer would be dropped by it.
const FRAME_CAPACITY: usize = 1514;
/// Transmit completions stop refilling the stack's pool here, below its cap of 4,096 spares,
/// so that the generator's own frames, put there by `ingress`, are never dropped.
const POOL_KEEP: usize = 4096 - 2 * BATCH;
const PAYLOAD_BYTE: u8 = b'x';
/// Advertised by the generator (with window scale 7: 8 MiB, never the limit).
const GEN_WINDOW: u16 = 0xffff;
/// Socket buffers of the stack's connections.
const SOCKET_BUFFER: usize = 64 * 1024;

/// What the application on the stack does and what the generator sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Workload {
    /// In-order data segments of this many bytes; the application reads and drops them.
    Discard(usize),
    /// 64-byte requests written back by the application; the generator ACKs the answers.
    Echo,
    /// The application keeps its send buffers full; the generator only ACKs.
    BulkAcks,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::Discard(64),
        Workload::Discard(1448),
        Workload::Echo,
        Workload::BulkAcks,
    ];

    fn name(self) -> String {
        match self {
            Workload::Discard(n) => format!("discard_{n}"),
            Workload::Echo => "echo_64".to_string(),
            Workload::BulkAcks => "bulk_acks".to_string(),
        }
    }

    fn port(self) -> u16 {
        match self {
            Workload::Discard(_) => 9,
            Workload::Echo => 7,
            Workload::BulkAcks => 19,
        }
    }

    /// Payload of the generator's data frames (0: it sends none).
    fn payload(self) -> usize {
        match self {
            Workload::Discard(n) => n,
            Workload::Echo => 64,
            Workload::BulkAcks => 0,
        }
    }
}

/// One remote peer as the generator sees it.
struct Flow {
    /// Data frame header with sequence, ACK, timestamps and TCP checksum zeroed.
    data_hdr: [u8; HDR],
    /// One's-complement sum of the data frame's pseudo-header, header and payload, without
    /// the words patched per frame.
    data_sum: u32,
    /// The same for a pure ACK.
    ack_hdr: [u8; HDR],
    ack_sum: u32,
    /// Next sequence number the generator sends.
    snd_nxt: u32,
    /// Next sequence number expected from the stack (what the generator ACKs).
    rcv_nxt: u32,
    /// The stack's latest TSval, echoed in TSecr.
    ts_recent: u32,
    /// Data segments seen and not yet ACKed.
    unacked: u8,
}

/// Which ring buffer a frame of the current batch came from.
#[derive(Clone, Copy)]
enum SlotRef {
    Data(usize),
    Ack(usize),
}

/// The frame generator: per-flow templates, a ring of pre-filled buffers, pending ACKs.
struct Generator {
    flows: Vec<Flow>,
    /// Payload bytes of a data frame (0: the workload sends none).
    payload: usize,
    /// Fill in TCP checksums (off when the stack offloads them).
    checksums: bool,
    /// The ring: `BATCH` data frames with their payload in place, and their addresses, by
    /// which a buffer coming back from the stack is recognised.
    data_slots: Vec<Vec<u8>>,
    data_ptrs: Vec<usize>,
    /// The same for pure ACKs.
    ack_slots: Vec<Vec<u8>>,
    ack_ptrs: Vec<usize>,
    /// The ring slot of each frame of the current batch, in batch order.
    order: Vec<SlotRef>,
    /// ACKs owed to the stack: flow and ACK number, oldest first.
    acks: VecDeque<(u32, u32)>,
    /// Flows with one data segment not yet ACKed, seen in the current transmit batch.
    touched: Vec<u32>,
    /// Flows that got a frame in the current batch (the smoltcp side's readiness list).
    sent: Vec<u32>,
    /// The next flow to get a data frame (round-robin).
    next_flow: usize,
    /// The TSval of this batch's frames: the batch clock in milliseconds.
    tsval: u32,
    /// Buffers that did not come back from the stack's pool and had to be refilled.
    refilled: u64,
}

/// `count` buffers of `len` bytes filled with the payload byte, and their addresses.
fn ring(count: usize, len: usize) -> (Vec<Vec<u8>>, Vec<usize>) {
    let slots: Vec<Vec<u8>> = (0..count)
        .map(|_| {
            let mut buf = Vec::with_capacity(FRAME_CAPACITY);
            buf.resize(len, PAYLOAD_BYTE);
            buf
        })
        .collect();
    let ptrs = slots.iter().map(|b| b.as_ptr() as usize).collect();
    (slots, ptrs)
}

/// A complete frame from the generator to the stack, built with the library's emitters.
fn build_frame(port: u16, dst_port: u16, seg: &TcpRepr<'_>) -> Vec<u8> {
    let tcp_len = seg.buffer_len();
    let mut frame = vec![0u8; 34 + tcp_len];
    EthernetRepr {
        src_addr: GEN_MAC,
        dst_addr: STACK_MAC,
        ethertype: ethertype::IPV4,
    }
    .emit(&mut frame);
    Ipv4Repr {
        src_addr: GEN_IP,
        dst_addr: STACK_IP,
        protocol: ipv4::protocol::TCP,
        payload_len: tcp_len,
        ttl: 64,
        tos: 0,
        ident: 0,
        dont_fragment: true,
    }
    .emit(&mut frame[14..]);
    let seg = TcpRepr {
        src_port: port,
        dst_port,
        ..*seg
    };
    seg.emit(&mut frame[34..], GEN_IP, STACK_IP);
    frame
}

/// A header template (variable words and checksum zeroed) and the sum of the rest.
fn template(port: u16, dst_port: u16, flags: u8, payload: &[u8]) -> ([u8; HDR], u32) {
    let seg = TcpRepr {
        flags: TcpFlags(flags),
        window_len: GEN_WINDOW,
        options: TcpOptions {
            timestamps: Some((0, 0)),
            ..TcpOptions::default()
        },
        payload,
        ..TcpRepr::default()
    };
    let mut frame = build_frame(port, dst_port, &seg);
    frame[CSUM_AT..CSUM_AT + 2].copy_from_slice(&[0, 0]);
    let tcp_len = (frame.len() - 34) as u16;
    let pseudo = checksum::pseudo_header(GEN_IP, STACK_IP, ipv4::protocol::TCP, tcp_len);
    let sum = checksum::accumulate(pseudo, &frame[34..]);
    let mut hdr = [0u8; HDR];
    hdr.copy_from_slice(&frame[..HDR]);
    (hdr, sum)
}

fn put_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

fn get_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

/// Writes a template into `buf` and patches its variable words and, if asked, its checksum.
fn stamp(buf: &mut [u8], hdr: &[u8; HDR], sum: u32, words: [u32; 4], checksums: bool) {
    buf[..HDR].copy_from_slice(hdr);
    let [seq, ack, tsval, tsecr] = words;
    put_u32(buf, SEQ_AT, seq);
    put_u32(buf, ACK_AT, ack);
    put_u32(buf, TSVAL_AT, tsval);
    put_u32(buf, TSECR_AT, tsecr);
    if checksums {
        let mut acc = sum;
        for word in words {
            acc += (word >> 16) + (word & 0xffff);
        }
        let value = !checksum::fold(acc);
        buf[CSUM_AT..CSUM_AT + 2].copy_from_slice(&value.to_be_bytes());
    }
}

/// Fields of a stack frame the generator acts on.
struct Seen {
    flow: usize,
    seq: u32,
    len: u32,
    flags: u8,
    tsval: Option<u32>,
}

/// Reads the header fields of a frame from the stack; `None` if it is not TCP over IPv4.
fn parse_seen(frame: &[u8]) -> Option<Seen> {
    if frame.len() < 54 || get_u16(frame, 12) != ethertype::IPV4 || frame[23] != 6 {
        return None;
    }
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    let tcp = 14 + ihl;
    let doff = usize::from(*frame.get(tcp + 12)? >> 4) * 4;
    let total = usize::from(get_u16(frame, 16));
    let flow = usize::from(get_u16(frame, tcp + 2).wrapping_sub(GEN_PORT_BASE));
    let options = frame.get(tcp + 20..tcp + doff)?;
    let mut tsval = None;
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            0 => break,
            1 => at += 1,
            kind => {
                let len = usize::from(*options.get(at + 1)?).max(2);
                if kind == 8 && len == 10 && at + 10 <= options.len() {
                    tsval = Some(get_u32(options, at + 2));
                }
                at += len;
            }
        }
    }
    Some(Seen {
        flow,
        seq: get_u32(frame, tcp + 4),
        len: total.checked_sub(ihl + doff)? as u32,
        flags: frame[tcp + 13],
        tsval,
    })
}

impl Generator {
    fn new(connections: usize, workload: Workload, checksums: bool) -> Generator {
        let payload = vec![PAYLOAD_BYTE; workload.payload()];
        let flows = (0..connections)
            .map(|i| {
                let port = GEN_PORT_BASE + i as u16;
                let (data_hdr, data_sum) = template(
                    port,
                    workload.port(),
                    TcpFlags::ACK | TcpFlags::PSH,
                    &payload,
                );
                let (ack_hdr, ack_sum) = template(port, workload.port(), TcpFlags::ACK, &[]);
                Flow {
                    data_hdr,
                    data_sum,
                    ack_hdr,
                    ack_sum,
                    snd_nxt: 1_000_000 * i as u32,
                    rcv_nxt: 0,
                    ts_recent: 0,
                    unacked: 0,
                }
            })
            .collect();
        let (data_slots, data_ptrs) = ring(BATCH, HDR + payload.len());
        let (ack_slots, ack_ptrs) = ring(BATCH, HDR);
        Generator {
            flows,
            payload: payload.len(),
            checksums,
            data_slots,
            data_ptrs,
            ack_slots,
            ack_ptrs,
            order: Vec::with_capacity(2 * BATCH),
            acks: VecDeque::with_capacity(1 << 16),
            touched: Vec::with_capacity(1 << 12),
            sent: Vec::with_capacity(2 * BATCH),
            next_flow: 0,
            tsval: 1,
            refilled: 0,
        }
    }

    /// The SYN of flow `i` (MSS 1460, SACK permitted, timestamps, window scale 7).
    fn syn(&self, i: usize, port: u16) -> Vec<u8> {
        let seg = TcpRepr {
            seq_number: SeqNumber(self.flows[i].snd_nxt.wrapping_sub(1)),
            flags: TcpFlags(TcpFlags::SYN),
            window_len: GEN_WINDOW,
            options: TcpOptions {
                mss: Some(1460),
                window_scale: Some(7),
                sack_permitted: true,
                timestamps: Some((self.tsval, 0)),
                ..TcpOptions::default()
            },
            ..TcpRepr::default()
        };
        build_frame(GEN_PORT_BASE + i as u16, port, &seg)
    }

    /// Appends one batch: owed ACKs (at most `BATCH`), then, with `data` and if the workload
    /// sends data, `BATCH` data frames.
    fn fill(&mut self, out: &mut Vec<Vec<u8>>, data: bool) {
        self.order.clear();
        self.sent.clear();
        let mut acks = 0;
        while acks < BATCH {
            let Some((flow, ack)) = self.acks.pop_front() else {
                break;
            };
            let f = &self.flows[flow as usize];
            let mut buf = std::mem::take(&mut self.ack_slots[acks]);
            let words = [f.snd_nxt, ack, self.tsval, f.ts_recent];
            stamp(&mut buf, &f.ack_hdr, f.ack_sum, words, self.checksums);
            out.push(buf);
            self.order.push(SlotRef::Ack(acks));
            self.sent.push(flow);
            acks += 1;
        }
        if !data || self.payload == 0 {
            return;
        }
        for slot in 0..BATCH {
            let index = self.next_flow;
            self.next_flow = if index + 1 == self.flows.len() {
                0
            } else {
                index + 1
            };
            let f = &mut self.flows[index];
            let mut buf = std::mem::take(&mut self.data_slots[slot]);
            let words = [f.snd_nxt, f.rcv_nxt, self.tsval, f.ts_recent];
            stamp(&mut buf, &f.data_hdr, f.data_sum, words, self.checksums);
            f.snd_nxt = f.snd_nxt.wrapping_add(self.payload as u32);
            out.push(buf);
            self.order.push(SlotRef::Data(slot));
            self.sent.push(index as u32);
        }
    }

    /// Puts `buf` back into the ring slot `slot`; a buffer that is not the slot's own is
    /// refilled (payload rewritten) first.
    fn restore(&mut self, slot: SlotRef, buf: Option<Vec<u8>>) {
        let (slots, ptrs, index, len) = match slot {
            SlotRef::Data(i) => (
                &mut self.data_slots,
                &mut self.data_ptrs,
                i,
                HDR + self.payload,
            ),
            SlotRef::Ack(i) => (&mut self.ack_slots, &mut self.ack_ptrs, i, HDR),
        };
        let buf = match buf {
            Some(buf) if buf.as_ptr() as usize == ptrs[index] => buf,
            other => {
                self.refilled += 1;
                let mut buf = other
                    .filter(|b| b.capacity() >= FRAME_CAPACITY)
                    .unwrap_or_else(|| Vec::with_capacity(FRAME_CAPACITY));
                buf.clear();
                buf.resize(len, PAYLOAD_BYTE);
                ptrs[index] = buf.as_ptr() as usize;
                buf
            }
        };
        slots[index] = buf;
    }

    /// Takes the batch's buffers back from the stack's pool, where `ingress` put them last.
    fn take_back(&mut self, pool: &mut BufferPool) {
        for i in (0..self.order.len()).rev() {
            let buf = pool.take_spare();
            self.restore(self.order[i], buf);
        }
    }

    /// Takes the batch's buffers back directly, in batch order (smoltcp's device, or the
    /// generator timed alone); frames past the batch (an ARP reply) are dropped.
    fn take_back_direct(&mut self, batch: &mut Vec<Vec<u8>>) {
        for (i, buf) in batch.drain(..).enumerate() {
            if let Some(&slot) = self.order.get(i) {
                self.restore(slot, Some(buf));
            }
        }
    }

    /// Reads the stack's frames: remembers its TSval and sequence numbers and owes ACKs for
    /// its data, one per two segments plus one for an odd segment left at the end.
    fn consume(&mut self, frames: &[Vec<u8>]) {
        for frame in frames {
            let Some(seen) = parse_seen(frame) else {
                continue;
            };
            let Some(f) = self.flows.get_mut(seen.flow) else {
                continue;
            };
            if let Some(tsval) = seen.tsval {
                f.ts_recent = tsval;
            }
            let len = seen.len + u32::from(seen.flags & (TcpFlags::SYN | TcpFlags::FIN) != 0);
            if len == 0 {
                continue;
            }
            let end = seen.seq.wrapping_add(len);
            if (end.wrapping_sub(f.rcv_nxt) as i32) > 0 {
                f.rcv_nxt = end;
            }
            f.unacked += 1;
            if f.unacked == 1 {
                self.touched.push(seen.flow as u32);
            } else {
                f.unacked = 0;
                self.acks.push_back((seen.flow as u32, f.rcv_nxt));
            }
        }
        for flow in self.touched.drain(..) {
            let f = &mut self.flows[flow as usize];
            if f.unacked > 0 {
                f.unacked = 0;
                self.acks.push_back((flow, f.rcv_nxt));
            }
        }
    }
}

/// Thread CPU time in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A stack's clock: wall time since its scenario began, stopped while other scenarios run,
/// so that interleaved rounds do not make every timer fire when a scenario resumes.
struct Clock {
    epoch: WallClock,
    stopped_ns: u64,
    stopped_at: Option<u64>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: WallClock::now(),
            stopped_ns: 0,
            stopped_at: None,
        }
    }

    fn raw_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Nanoseconds of running time.
    fn now_ns(&self) -> u64 {
        self.raw_ns() - self.stopped_ns
    }

    fn stop(&mut self) {
        self.stopped_at = Some(self.raw_ns());
    }

    fn resume(&mut self) {
        if let Some(at) = self.stopped_at.take() {
            self.stopped_ns += self.raw_ns().saturating_sub(at);
        }
    }
}

/// How long a measurement runs: at least `batches` batches and at least `seconds`.
#[derive(Clone, Copy)]
struct Span {
    batches: u64,
    seconds: f64,
}

/// One timed run.
#[derive(Clone, Copy, Default)]
struct Sample {
    frames_in: u64,
    frames_out: u64,
    cpu_ns: u64,
    wall_ns: u64,
}

impl Sample {
    fn per_cpu_second(&self) -> f64 {
        (self.frames_in + self.frames_out) as f64 * 1e9 / self.cpu_ns.max(1) as f64
    }

    fn per_wall_second(&self) -> f64 {
        (self.frames_in + self.frames_out) as f64 * 1e9 / self.wall_ns.max(1) as f64
    }

    fn cpu_ns_per_frame(&self) -> f64 {
        self.cpu_ns as f64 / (self.frames_in + self.frames_out).max(1) as f64
    }
}

/// Runs `step` (which returns frames in and out) for `span`, timing CPU and wall.
fn timed(span: Span, mut step: impl FnMut() -> (usize, usize)) -> Sample {
    let wall = WallClock::now();
    let cpu = thread_cpu_ns();
    let mut sample = Sample::default();
    let mut batches = 0u64;
    loop {
        for _ in 0..64 {
            let (i, o) = step();
            sample.frames_in += i as u64;
            sample.frames_out += o as u64;
        }
        batches += 64;
        if batches >= span.batches && wall.elapsed().as_secs_f64() >= span.seconds {
            break;
        }
    }
    sample.cpu_ns = thread_cpu_ns().saturating_sub(cpu);
    sample.wall_ns = wall.elapsed().as_nanos() as u64;
    sample
}

/// A stack under test with its application, driven batch by batch by the generator.
trait Target {
    /// "userstack" or "smoltcp".
    fn stack(&self) -> &'static str;
    fn workload(&self) -> Workload;
    fn checksums(&self) -> bool;
    /// One batch; returns frames in and out.
    fn step(&mut self) -> (usize, usize);
    /// The clock the stack is driven by.
    fn clock(&mut self) -> &mut Clock;
    /// Checks that the run moved data and failed nothing; returns extra JSON fields.
    fn finish(&mut self, rounds: usize, gen_span: Span) -> Result<String, String>;
}

/// A userstack `Stack`, its application and the generator for one workload and checksum
/// policy.
struct Scenario {
    workload: Workload,
    checksums: bool,
    stack: Stack,
    gen: Generator,
    handles: Vec<SocketHandle>,
    events: Vec<Event>,
    batch: Vec<Vec<u8>>,
    out: Vec<Vec<u8>>,
    sink: Vec<u8>,
    chunk: Vec<u8>,
    clock: Clock,
    app_bytes: u64,
    /// Stack output kept for timing the generator alone.
    recorded: Vec<Vec<Vec<u8>>>,
    recording: bool,
}

impl Scenario {
    fn new(workload: Workload, checksums: bool, connections: usize) -> Result<Scenario, String> {
        let mut config = StackConfig::new(STACK_MAC, STACK_IP, 24);
        config.rx_checksum_offload = !checksums;
        config.tx_checksum_offload = !checksums;
        let mut stack = Stack::new(config, Instant::ZERO);
        stack.add_neighbor(GEN_IP, GEN_MAC);
        let tcp = Config {
            recv_buffer: SOCKET_BUFFER,
            send_buffer: SOCKET_BUFFER,
            ..Config::default()
        };
        stack
            .listen_with(workload.port(), connections, tcp)
            .map_err(|e| format!("listen: {e:?}"))?;
        let mut scenario = Scenario {
            workload,
            checksums,
            stack,
            gen: Generator::new(connections, workload, checksums),
            handles: Vec::with_capacity(connections),
            events: Vec::with_capacity(4 * connections),
            batch: Vec::with_capacity(4 * BATCH),
            out: Vec::with_capacity(1 << 14),
            sink: vec![0; SOCKET_BUFFER],
            chunk: vec![PAYLOAD_BYTE; SOCKET_BUFFER],
            clock: Clock::new(),
            app_bytes: 0,
            recorded: Vec::new(),
            recording: false,
        };
        scenario.handshake(connections)?;
        Ok(scenario)
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(self.clock.now_ns())
    }

    /// Opens every connection: SYNs, the stack's SYN-ACKs, final ACKs, accept.
    fn handshake(&mut self, connections: usize) -> Result<(), String> {
        let port = self.workload.port();
        for first in (0..connections).step_by(BATCH) {
            let now = self.now();
            for i in first..(first + BATCH).min(connections) {
                let syn = self.gen.syn(i, port);
                self.batch.push(syn);
            }
            self.stack.ingress(now, &mut self.batch);
            self.stack.egress(now, &mut self.out);
            for frame in self.out.drain(..) {
                let seen = parse_seen(&frame).ok_or("a frame other than TCP")?;
                let f = self
                    .gen
                    .flows
                    .get_mut(seen.flow)
                    .ok_or("a SYN-ACK to no flow")?;
                if seen.flags != TcpFlags::SYN | TcpFlags::ACK {
                    return Err(format!("expected a SYN-ACK, got flags {:#x}", seen.flags));
                }
                f.rcv_nxt = seen.seq.wrapping_add(1);
                f.ts_recent = seen.tsval.ok_or("no timestamps in the SYN-ACK")?;
                self.gen.acks.push_back((seen.flow as u32, f.rcv_nxt));
                self.stack.buffer_pool().put(frame);
            }
            // The final ACKs, sent by the batch machinery (at most `BATCH` per call).
            while !self.gen.acks.is_empty() {
                self.gen.fill(&mut self.batch, false);
                let now = self.now();
                self.stack.ingress(now, &mut self.batch);
                self.gen.take_back(self.stack.buffer_pool());
            }
            self.stack.egress(now, &mut self.out);
            if !self.out.is_empty() {
                return Err(format!("{} unexpected frames after ACKs", self.out.len()));
            }
        }
        while let Some(handle) = self.stack.accept(port) {
            self.handles.push(handle);
        }
        if self.handles.len() != connections {
            return Err(format!(
                "{} of {connections} connections accepted",
                self.handles.len()
            ));
        }
        if self.workload == Workload::BulkAcks {
            for i in 0..self.handles.len() {
                self.app_bytes += self.fill_send_buffer(self.handles[i]) as u64;
            }
        }
        Ok(())
    }

    fn fill_send_buffer(&mut self, handle: SocketHandle) -> usize {
        let mut total = 0;
        loop {
            let n = self.stack.send(handle, &self.chunk).unwrap_or(0);
            total += n;
            if n < self.chunk.len() {
                return total;
            }
        }
    }

    /// The application: drains readable connections (and writes back for echo), refills
    /// writable ones (bulk).
    fn app(&mut self) {
        self.events.clear();
        self.stack.poll_events(&mut self.events);
        for i in 0..self.events.len() {
            let Event::Ready(handle, ready) = self.events[i] else {
                continue;
            };
            match self.workload {
                Workload::Discard(_) | Workload::Echo if ready.readable => loop {
                    let n = self.stack.recv(handle, &mut self.sink).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    self.app_bytes += n as u64;
                    if self.workload == Workload::Echo {
                        let _ = self.stack.send(handle, &self.sink[..n]);
                    }
                },
                Workload::BulkAcks if ready.writable => {
                    self.app_bytes += self.fill_send_buffer(handle) as u64;
                }
                _ => {}
            }
        }
    }

    /// One batch: generate, ingress, take buffers back, timers, egress, consume, recycle,
    /// application. Returns frames in and out.
    fn batch(&mut self) -> (usize, usize) {
        let now = self.now();
        self.gen.tsval = now.as_millis() as u32 | 1;
        self.gen.fill(&mut self.batch, true);
        let frames_in = self.batch.len();
        self.stack.ingress(now, &mut self.batch);
        self.gen.take_back(self.stack.buffer_pool());
        self.stack.poll_timers(now);
        self.stack.egress(now, &mut self.out);
        let frames_out = self.out.len();
        self.gen.consume(&self.out);
        if self.recording {
            self.recorded.push(self.out.clone());
        }
        let pool = self.stack.buffer_pool();
        for buf in self.out.drain(..) {
            if pool.spare() < POOL_KEEP {
                pool.put(buf);
            }
        }
        self.app();
        (frames_in, frames_out)
    }

    /// Records the stack's output for `batches` batches, then times the generator alone on
    /// it: fill a batch, take its buffers straight back, consume one recorded output.
    fn time_generator(&mut self, batches: usize, span: Span) -> Sample {
        self.recording = true;
        for _ in 0..batches {
            self.batch();
        }
        self.recording = false;
        let recorded = std::mem::take(&mut self.recorded);
        let gen = &mut self.gen;
        let batch = &mut self.batch;
        let mut next = 0;
        if recorded.is_empty() {
            return Sample::default();
        }
        timed(span, || {
            gen.fill(batch, true);
            let frames_in = batch.len();
            gen.take_back_direct(batch);
            let out = &recorded[next];
            next = (next + 1) % recorded.len();
            gen.consume(out);
            (frames_in, out.len())
        })
    }
}

impl Target for Scenario {
    fn stack(&self) -> &'static str {
        "userstack"
    }

    fn workload(&self) -> Workload {
        self.workload
    }

    fn checksums(&self) -> bool {
        self.checksums
    }

    fn step(&mut self) -> (usize, usize) {
        self.batch()
    }

    fn clock(&mut self) -> &mut Clock {
        &mut self.clock
    }

    fn finish(&mut self, rounds: usize, gen_span: Span) -> Result<String, String> {
        let counters = self.stack.counters();
        let csum_errors = counters.get(Counter::InCsumErrors);
        let in_errors = counters.get(Counter::InErrs);
        if self.app_bytes == 0 || csum_errors > 0 || in_errors > 0 {
            return Err(format!(
                "userstack {}: application moved {} bytes, {csum_errors} checksum errors, \
                 {in_errors} bad segments",
                self.workload.name(),
                self.app_bytes
            ));
        }
        let gen_samples: Vec<Sample> = (0..rounds)
            .map(|_| self.time_generator(256, gen_span))
            .collect();
        Ok(format!(
            "\"app_bytes\": {}, \"generator_buffers_refilled\": {},\n      \
             \"stack_retransmits\": {}, \"stack_timeouts\": {}, \"stack_loss_probes\": {}, \
             \"stack_fast_retransmits\": {},\n      \
             \"generator_alone_cpu_ns_per_frame\": {},\n      \
             \"generator_alone_frames_per_cpu_second\": {}",
            self.app_bytes,
            self.gen.refilled,
            counters.get(Counter::RetransSegs),
            counters.get(Counter::TCPTimeouts),
            counters.get(Counter::TCPLossProbes),
            counters.get(Counter::TCPFastRetrans),
            spread(
                gen_samples.iter().map(Sample::cpu_ns_per_frame).collect(),
                2
            ),
            spread(gen_samples.iter().map(Sample::per_cpu_second).collect(), 0),
        ))
    }
}

/// Min, median and max as a JSON object, with `decimals` digits after the point.
fn spread(mut values: Vec<f64>, decimals: usize) -> String {
    values.sort_by(f64::total_cmp);
    let pick = |i: usize| values.get(i).copied().unwrap_or(0.0);
    format!(
        "{{\"min\": {:.*}, \"median\": {:.*}, \"max\": {:.*}}}",
        decimals,
        pick(0),
        decimals,
        pick(values.len() / 2),
        decimals,
        pick(values.len().saturating_sub(1))
    )
}

/// The checksum policy's name: the stack verifies and computes checksums, or offloads them.
fn policy(checksums: bool) -> &'static str {
    if checksums {
        "software"
    } else {
        "offload"
    }
}

/// `PACKET_RATE_CONNECTIONS` if set, from 1 to 4,096 (the stack's accept queue cap), else
/// `default`. Fewer connections show the cost of state that no longer fits the caches, and of
/// smoltcp's scans over every socket per packet and per poll.
fn connections(default: usize) -> usize {
    std::env::var("PACKET_RATE_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| (1..=4096).contains(&n))
        .unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned();
    let (connections, rounds, span, warmup, gen_span) = if bench {
        let round = Span {
            batches: 64,
            seconds: 1.0,
        };
        let warmup = Span {
            batches: 64,
            seconds: 0.5,
        };
        let gen_span = Span {
            batches: 64,
            seconds: 0.3,
        };
        (connections(1024), 5, round, warmup, gen_span)
    } else {
        let tiny = Span {
            batches: 64,
            seconds: 0.0,
        };
        (connections(64), 1, tiny, tiny, tiny)
    };
    let load_before = loadavg();
    let mut scenarios: Vec<(Box<dyn Target>, Vec<Sample>)> = Vec::new();
    for workload in Workload::ALL {
        for checksums in [true, false] {
            for stack in ["userstack", "smoltcp"] {
                let label = format!("{stack}/{}/{}", workload.name(), policy(checksums));
                if filter.as_ref().is_some_and(|f| !label.contains(f.as_str())) {
                    continue;
                }
                let mut target: Box<dyn Target> = if stack == "smoltcp" {
                    Box::new(smol::SmolScenario::new(workload, checksums, connections)?)
                } else {
                    Box::new(Scenario::new(workload, checksums, connections)?)
                };
                timed(warmup, || target.step());
                target.clock().stop();
                scenarios.push((target, Vec::new()));
            }
        }
    }
    // Interleaved rounds: drift on a shared machine spreads over every scenario alike.
    for _ in 0..rounds {
        for (target, samples) in scenarios.iter_mut() {
            target.clock().resume();
            samples.push(timed(span, || target.step()));
            target.clock().stop();
        }
    }
    let mut results = Vec::new();
    for (target, samples) in scenarios.iter_mut() {
        target.clock().resume();
        let extra = target.finish(rounds, gen_span)?;
        let frames_in: u64 = samples.iter().map(|s| s.frames_in).sum();
        let frames_out: u64 = samples.iter().map(|s| s.frames_out).sum();
        results.push(format!(
            "    {{\"stack\": \"{}\", \"workload\": \"{}\", \"checksums\": \"{}\", \
             \"connections\": {connections}, \"batch\": {BATCH}, \"rounds\": {rounds},\n      \
             \"frames_in\": {frames_in}, \"frames_out\": {frames_out},\n      \
             \"frames_per_cpu_second\": {},\n      \"frames_per_wall_second\": {},\n      \
             \"cpu_ns_per_frame\": {},\n      {extra}}}",
            target.stack(),
            target.workload().name(),
            policy(target.checksums()),
            spread(samples.iter().map(Sample::per_cpu_second).collect(), 0),
            spread(samples.iter().map(Sample::per_wall_second).collect(), 0),
            spread(samples.iter().map(Sample::cpu_ns_per_frame).collect(), 2),
        ));
    }
    println!(
        "{{\"benchmark\": \"packet_rate\", \"mode\": \"{}\", \
         \"loadavg_before\": \"{load_before}\", \"loadavg_after\": \"{}\",\n  \"results\": [\n{}\n  ]\n}}",
        if bench { "bench" } else { "smoke" },
        loadavg(),
        results.join(",\n")
    );
    Ok(())
}

/// The same generator against smoltcp: an `Interface` with one listening socket per
/// connection, on a device whose receive side hands out the generator's frames (returned to
/// it afterwards) and whose transmit side fills pooled buffers.
mod smol {
    use super::{
        Clock, Generator, Span, Target, Workload, BATCH, FRAME_CAPACITY, GEN_IP, GEN_MAC,
        GEN_PORT_BASE, PAYLOAD_BYTE, SOCKET_BUFFER, STACK_IP, STACK_MAC,
    };
    use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
    use smoltcp::phy::{Checksum, Device, DeviceCapabilities, Medium, RxToken, TxToken};
    use smoltcp::socket::tcp;
    use smoltcp::time::{Duration, Instant};
    use smoltcp::wire::{EthernetAddress, IpAddress, IpCidr};
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicU32, Ordering};
    use userstack::wire::{arp, ethertype, ArpOperation, ArpRepr, EthernetRepr};

    /// The TSval smoltcp writes: the batch clock in milliseconds, as the generator's.
    static TSVAL: AtomicU32 = AtomicU32::new(1);

    fn tsval() -> u32 {
        TSVAL.load(Ordering::Relaxed)
    }

    /// The in-memory NIC.
    struct BenchDevice {
        rx: VecDeque<Vec<u8>>,
        /// Received frames smoltcp is done with, in order, for the generator to take back.
        rx_done: Vec<Vec<u8>>,
        tx: Vec<Vec<u8>>,
        pool: Vec<Vec<u8>>,
        checksums: bool,
    }

    struct Rx<'a> {
        frame: Vec<u8>,
        done: &'a mut Vec<Vec<u8>>,
    }

    struct Tx<'a> {
        out: &'a mut Vec<Vec<u8>>,
        pool: &'a mut Vec<Vec<u8>>,
    }

    impl RxToken for Rx<'_> {
        fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
            let Rx { frame, done } = self;
            let result = f(&frame);
            done.push(frame);
            result
        }
    }

    impl TxToken for Tx<'_> {
        fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
            let mut buf = self
                .pool
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(FRAME_CAPACITY));
            buf.resize(len, 0);
            let result = f(&mut buf);
            self.out.push(buf);
            result
        }
    }

    impl Device for BenchDevice {
        type RxToken<'a> = Rx<'a>;
        type TxToken<'a> = Tx<'a>;

        fn receive(&mut self, _: Instant) -> Option<(Rx<'_>, Tx<'_>)> {
            let frame = self.rx.pop_front()?;
            let rx = Rx {
                frame,
                done: &mut self.rx_done,
            };
            let tx = Tx {
                out: &mut self.tx,
                pool: &mut self.pool,
            };
            Some((rx, tx))
        }

        fn transmit(&mut self, _: Instant) -> Option<Tx<'_>> {
            Some(Tx {
                out: &mut self.tx,
                pool: &mut self.pool,
            })
        }

        fn capabilities(&self) -> DeviceCapabilities {
            let mut caps = DeviceCapabilities::default();
            caps.medium = Medium::Ethernet;
            caps.max_transmission_unit = FRAME_CAPACITY;
            // As userstack's offload: TCP checksums only; the IPv4 header's stays in software.
            if !self.checksums {
                caps.checksum.tcp = Checksum::None;
            }
            caps
        }
    }

    /// An ARP packet from the generator to the stack.
    fn arp_frame(operation: ArpOperation) -> Vec<u8> {
        let mut frame = vec![0u8; 14 + arp::PACKET_LEN];
        EthernetRepr {
            src_addr: GEN_MAC,
            dst_addr: STACK_MAC,
            ethertype: ethertype::ARP,
        }
        .emit(&mut frame);
        ArpRepr {
            operation,
            sender_hardware_addr: GEN_MAC,
            sender_protocol_addr: GEN_IP,
            target_hardware_addr: STACK_MAC,
            target_protocol_addr: STACK_IP,
        }
        .emit(&mut frame[14..]);
        frame
    }

    fn is_arp(frame: &[u8]) -> bool {
        frame.len() >= 14 && u16::from_be_bytes([frame[12], frame[13]]) == ethertype::ARP
    }

    /// smoltcp, its application and the generator for one workload and checksum policy.
    pub struct SmolScenario {
        workload: Workload,
        checksums: bool,
        iface: Interface,
        sockets: SocketSet<'static>,
        device: BenchDevice,
        gen: Generator,
        /// The socket serving each generator flow.
        by_flow: Vec<SocketHandle>,
        batch: Vec<Vec<u8>>,
        out: Vec<Vec<u8>>,
        sink: Vec<u8>,
        chunk: Vec<u8>,
        clock: Clock,
        app_bytes: u64,
        /// smoltcp asked for the generator's MAC (its neighbour entries expire after 60 s).
        arp_owed: bool,
    }

    impl SmolScenario {
        pub fn new(
            workload: Workload,
            checksums: bool,
            connections: usize,
        ) -> Result<SmolScenario, String> {
            let mut device = BenchDevice {
                rx: VecDeque::with_capacity(4 * BATCH),
                rx_done: Vec::with_capacity(4 * BATCH),
                tx: Vec::with_capacity(1 << 14),
                pool: Vec::with_capacity(1 << 14),
                checksums,
            };
            let mut config = Config::new(EthernetAddress(STACK_MAC.0).into());
            config.random_seed = 0x5eed;
            let mut iface = Interface::new(config, &mut device, Instant::ZERO);
            let [a, b, c, d] = STACK_IP.octets();
            iface.update_ip_addrs(|addrs| {
                let _ = addrs.push(IpCidr::new(IpAddress::v4(a, b, c, d), 24));
            });
            let mut sockets = SocketSet::new(Vec::with_capacity(connections));
            let mut handles = Vec::with_capacity(connections);
            for _ in 0..connections {
                let mut socket = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                );
                // userstack's delayed-ACK timeout (smoltcp's default is 10 ms).
                socket.set_ack_delay(Some(Duration::from_millis(40)));
                socket.set_tsval_generator(Some(tsval));
                socket
                    .listen(workload.port())
                    .map_err(|e| format!("smoltcp listen: {e:?}"))?;
                handles.push(sockets.add(socket));
            }
            let mut scenario = SmolScenario {
                workload,
                checksums,
                iface,
                sockets,
                device,
                gen: Generator::new(connections, workload, checksums),
                by_flow: handles.clone(),
                batch: Vec::with_capacity(4 * BATCH),
                out: Vec::with_capacity(1 << 14),
                sink: vec![0; SOCKET_BUFFER],
                chunk: vec![PAYLOAD_BYTE; SOCKET_BUFFER],
                clock: Clock::new(),
                app_bytes: 0,
                arp_owed: false,
            };
            scenario.handshake(connections, &handles)?;
            Ok(scenario)
        }

        fn now(&self) -> Instant {
            Instant::from_micros((self.clock.now_ns() / 1000) as i64)
        }

        fn poll(&mut self) {
            let now = self.now();
            self.iface.poll(now, &mut self.device, &mut self.sockets);
        }

        /// An ARP request (smoltcp learns neighbours only from ARP), then SYNs, SYN-ACKs,
        /// final ACKs; then each flow's socket is found by its remote port.
        fn handshake(
            &mut self,
            connections: usize,
            handles: &[SocketHandle],
        ) -> Result<(), String> {
            self.device.rx.push_back(arp_frame(ArpOperation::Request));
            self.poll();
            self.device.rx_done.clear();
            self.device.pool.append(&mut self.device.tx);
            let port = self.workload.port();
            for first in (0..connections).step_by(BATCH) {
                for i in first..(first + BATCH).min(connections) {
                    let syn = self.gen.syn(i, port);
                    self.device.rx.push_back(syn);
                }
                self.poll();
                self.device.rx_done.clear();
                for frame in self.device.tx.drain(..) {
                    let seen = super::parse_seen(&frame).ok_or("smoltcp sent a non-TCP frame")?;
                    let f = self
                        .gen
                        .flows
                        .get_mut(seen.flow)
                        .ok_or("smoltcp sent a SYN-ACK to no flow")?;
                    f.rcv_nxt = seen.seq.wrapping_add(1);
                    f.ts_recent = seen.tsval.ok_or("no timestamps in smoltcp's SYN-ACK")?;
                    self.gen.acks.push_back((seen.flow as u32, f.rcv_nxt));
                    self.device.pool.push(frame);
                }
                while !self.gen.acks.is_empty() {
                    self.gen.fill(&mut self.batch, false);
                    self.device.rx.extend(self.batch.drain(..));
                    self.poll();
                    self.gen.take_back_direct(&mut self.device.rx_done);
                    self.device.pool.append(&mut self.device.tx);
                }
            }
            for &handle in handles {
                let socket = self.sockets.get::<tcp::Socket>(handle);
                if socket.state() != tcp::State::Established {
                    return Err(format!("a smoltcp socket is {}", socket.state()));
                }
                let remote = socket.remote_endpoint().ok_or("no remote endpoint")?;
                let flow = usize::from(remote.port.wrapping_sub(GEN_PORT_BASE));
                let slot = self.by_flow.get_mut(flow).ok_or("a socket of no flow")?;
                *slot = handle;
            }
            if self.workload == Workload::BulkAcks {
                for flow in 0..connections {
                    self.serve(flow);
                }
            }
            Ok(())
        }

        /// The application's turn on one flow's socket: as userstack's application does.
        fn serve(&mut self, flow: usize) {
            let socket = self.sockets.get_mut::<tcp::Socket>(self.by_flow[flow]);
            match self.workload {
                Workload::Discard(_) | Workload::Echo => {
                    while socket.can_recv() {
                        let n = socket.recv_slice(&mut self.sink).unwrap_or(0);
                        if n == 0 {
                            break;
                        }
                        self.app_bytes += n as u64;
                        if self.workload == Workload::Echo {
                            let _ = socket.send_slice(&self.sink[..n]);
                        }
                    }
                }
                Workload::BulkAcks => {
                    while socket.can_send() {
                        let n = socket.send_slice(&self.chunk).unwrap_or(0);
                        self.app_bytes += n as u64;
                        if n < self.chunk.len() {
                            break;
                        }
                    }
                }
            }
        }
    }

    impl Target for SmolScenario {
        fn stack(&self) -> &'static str {
            "smoltcp"
        }

        fn workload(&self) -> Workload {
            self.workload
        }

        fn checksums(&self) -> bool {
            self.checksums
        }

        /// One batch: generate, poll (ingress and egress), take buffers back, application on
        /// the flows the batch reached (smoltcp has no readiness events), consume, recycle.
        fn step(&mut self) -> (usize, usize) {
            let now = self.now();
            let ms = now.total_millis() as u32 | 1;
            TSVAL.store(ms, Ordering::Relaxed);
            self.gen.tsval = ms;
            self.gen.fill(&mut self.batch, true);
            if self.arp_owed {
                self.arp_owed = false;
                self.batch.push(arp_frame(ArpOperation::Reply));
            }
            let frames_in = self.batch.len();
            self.device.rx.extend(self.batch.drain(..));
            self.iface.poll(now, &mut self.device, &mut self.sockets);
            self.gen.take_back_direct(&mut self.device.rx_done);
            for i in 0..self.gen.sent.len() {
                self.serve(self.gen.sent[i] as usize);
            }
            std::mem::swap(&mut self.out, &mut self.device.tx);
            let frames_out = self.out.len();
            self.gen.consume(&self.out);
            self.arp_owed |= self.out.iter().any(|f| is_arp(f));
            self.device.pool.append(&mut self.out);
            (frames_in, frames_out)
        }

        fn clock(&mut self) -> &mut Clock {
            &mut self.clock
        }

        fn finish(&mut self, _rounds: usize, _gen_span: Span) -> Result<String, String> {
            if self.app_bytes == 0 {
                return Err(format!(
                    "smoltcp {}: the application moved no data",
                    self.workload.name()
                ));
            }
            Ok(format!("\"app_bytes\": {}", self.app_bytes))
        }
    }
}
