//! One TCP connection's state machine (RFC 9293 section 3.10), sans-IO: the caller hands in
//! segments and the current time, and polls for segments to send and the next deadline.

use super::assembler::{Added, Assembler};
use super::config::Config;
use super::congestion::{new_controller, CongestionControl};
use super::hystart::{Growth, HyStart};
use super::rack::Rack;
use super::ring_buffer::{copy_prefix, RingBuffer};
use super::rtt::RttEstimator;
use super::scoreboard::{Scoreboard, SentSegment};
use crate::counters::{Counter, Counters};
use crate::time::Instant;
use crate::wire::tcp::{emit_header, fill_checksum, fill_partial_checksum};
use crate::wire::template::{TcpChecksum, TcpFields, TcpTemplate};
use crate::wire::{SackBlocks, SeqNumber, TcpFlags, TcpOptions, TcpRepr};
use core::time::Duration;
use std::net::SocketAddrV4;

/// Connection states of RFC 9293 section 3.3.2 (LISTEN lives in the stack's listener).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    /// No connection; terminal.
    Closed,
    /// Our SYN is out, waiting for the peer's.
    SynSent,
    /// SYN received and SYN-ACK sent, waiting for the final ACK.
    SynReceived,
    /// Data flows both ways.
    Established,
    /// We closed; our FIN is queued or unacknowledged.
    FinWait1,
    /// Our FIN is acknowledged; waiting for the peer's.
    FinWait2,
    /// The peer closed; we may still send.
    CloseWait,
    /// Both closed simultaneously; waiting for the ACK of our FIN.
    Closing,
    /// The peer closed first, then we did; waiting for the ACK of our FIN.
    LastAck,
    /// Both FINs acknowledged; lingering 2·MSL for stray segments.
    TimeWait,
}

impl State {
    /// Whether the handshake completed (RFC 9293 "synchronized" states).
    pub fn is_synchronized(self) -> bool {
        !matches!(self, State::Closed | State::SynSent | State::SynReceived)
    }
}

/// Why a connection ended abnormally.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ConnectionError {
    /// The peer answered our SYN with a RST.
    Refused,
    /// The peer reset the connection.
    Reset,
    /// Retransmissions or keepalive probes went unanswered.
    TimedOut,
}

/// Per-connection statistics beyond the Linux counters (for the simulator's metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Payload bytes acknowledged by the peer.
    pub bytes_acked: u64,
    /// Payload bytes delivered in order to the application's buffer.
    pub bytes_received: u64,
    /// Segments carrying payload sent, retransmissions included.
    pub data_segments_sent: u64,
    /// Segments retransmitted.
    pub retransmissions: u64,
    /// Retransmissions proven unnecessary by D-SACK (RFC 2883 section 4).
    pub spurious_retransmissions: u64,
    /// Congestion responses undone.
    pub undos: u64,
}

/// A loss-recovery episode (RFC 6675 section 5, RFC 6582, or after an RTO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recovery {
    /// RecoveryPoint: the episode ends when SND.UNA passes it.
    recover: SeqNumber,
    /// Entered by the retransmission timer rather than by duplicate ACKs or SACK.
    after_timeout: bool,
}

/// What one ACK's SACK blocks told the sender.
#[derive(Clone, Copy, Debug, Default)]
struct SackOutcome {
    /// Bytes newly SACKed.
    newly_sacked_bytes: u32,
    /// A D-SACK reported a duplicate of a retransmission other than a loss probe.
    dsack: bool,
}

/// What is needed to undo a congestion response (RFC 2883 section 4, Linux's undo_retrans).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UndoRecord {
    /// Retransmissions of the episode not yet proven spurious.
    retransmissions: u32,
    /// Any retransmission made at all.
    retransmitted: bool,
    /// The episode began with an RTO.
    after_timeout: bool,
}

/// RFC 6937 bookkeeping of one recovery episode (bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Prr {
    /// prr_delivered: data delivered to the receiver since recovery began.
    delivered: u32,
    /// prr_out: data sent since recovery began.
    out: u32,
    /// RecoverFS: the flight size when recovery began.
    recover_fs: u32,
    /// The window PRR allows now: pipe + sndcnt.
    cwnd: u32,
}

/// Which probe the persist or keepalive timer asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    None,
    ZeroWindow,
    Keepalive,
}

/// Timestamp ticks a segment may lag TS.Recent and still pass PAWS (Linux's `TCP_PAWS_WINDOW`).
const PAWS_WINDOW: i32 = 1;

/// How far beyond TS.Recent a timestamp may be stale before PAWS ignores it (RFC 7323 5.5).
const PAWS_IDLE: Duration = Duration::from_secs(24 * 24 * 3600);

/// Room for the TCP header and timestamps that every output buffer must have beyond one MSS.
const MIN_HEADER_ROOM: usize = 32;

/// The MSS assumed when the peer sends none (RFC 9293 section 3.7.1).
const DEFAULT_MSS: u32 = 536;
/// The most data segments quick-ACK mode ACKs at once (Linux's `TCP_MAX_QUICKACKS`).
const QUICK_ACKS: u32 = 16;

/// One TCP connection.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    state: State,
    local: SocketAddrV4,
    remote: SocketAddrV4,
    error: Option<ConnectionError>,

    iss: SeqNumber,
    snd_una: SeqNumber,
    snd_nxt: SeqNumber,
    snd_wnd: u32,
    snd_wl1: SeqNumber,
    snd_wl2: SeqNumber,
    max_snd_wnd: u32,
    snd_wscale: u8,
    rcv_wscale: u8,
    wscale_ok: bool,
    send_mss: u32,
    send_buffer: RingBuffer,
    fin_queued: bool,
    fin_seq: Option<SeqNumber>,

    irs: SeqNumber,
    rcv_nxt: SeqNumber,
    rcv_adv: SeqNumber,
    rcv_mss: u32,
    recv_buffer: RingBuffer,
    assembler: Assembler,
    peer_fin: Option<SeqNumber>,
    fin_received: bool,
    user_closed: bool,

    sack_ok: bool,
    ts_ok: bool,
    ts_recent: u32,
    ts_recent_stamp: Instant,
    ts_offset: u32,
    last_ack_sent: SeqNumber,
    zero_window_advertised: bool,

    ack_now: bool,
    /// Duplicate ACKs owed, one per out-of-order or duplicate segment, so that a batch of
    /// arrivals still yields one ACK each (the sender counts them, RFC 5681 section 4.2).
    dupacks_owed: u32,
    /// Data segments still to be ACKed at once (Linux's quick-ACK mode, `icsk_ack.quick`).
    quick_acks: u32,
    /// When data last arrived (Linux's `icsk_ack.lrcvtime`).
    last_data_at: Option<Instant>,
    delack_deadline: Option<Instant>,
    dsack: Option<(SeqNumber, SeqNumber)>,
    reset_to_send: Option<(SeqNumber, Option<SeqNumber>)>,
    send_syn: bool,
    syn_sent_at: Option<Instant>,
    syn_retransmitted: bool,

    rtt: RttEstimator,
    rto_deadline: Option<Instant>,
    /// Probe timeout of RFC 8985 section 7.2.
    tlp_deadline: Option<Instant>,
    /// The PTO fired: the next transmit opportunity sends a probe.
    tlp_due: bool,
    /// A probe is outstanding until SND.UNA passes this (RFC 8985 TLP.end_seq).
    tlp_end: Option<SeqNumber>,
    /// The range a probe retransmitted, so a D-SACK for it is not taken as proof that an
    /// earlier recovery episode was spurious.
    tlp_retransmitted: Option<(SeqNumber, SeqNumber)>,
    timeouts: u32,
    persist_deadline: Option<Instant>,
    persist_backoff: u32,
    keepalive_deadline: Option<Instant>,
    keepalive_probes_sent: u32,
    time_wait_deadline: Option<Instant>,
    probe: Probe,
    last_send: Instant,

    scoreboard: Scoreboard,
    recovery: Option<Recovery>,
    undo: Option<UndoRecord>,
    dupacks: u32,
    cwnd_blocked: bool,
    /// RACK loss detection (RFC 8985 section 6).
    rack: Rack,
    /// RACK's reordering timer: segments wait out their reordering window until then.
    reorder_deadline: Option<Instant>,
    /// TSval of the earliest retransmission still outstanding (Linux's `retrans_stamp`): an
    /// ACK echoing an older TSval was sent for an original transmission (Eifel, RFC 3522).
    retrans_stamp: Option<u32>,
    hystart: HyStart,
    /// Proportional rate reduction state during SACK recovery (RFC 6937).
    prr: Option<Prr>,
    cc: Box<dyn CongestionControl>,

    counters: Counters,
    stats: ConnectionStats,
    /// The device completes TCP checksums of data segments (see `set_tx_checksum_offload`).
    tx_checksum_offload: bool,
    /// The header of data and ACK segments without SACK blocks, patched per segment.
    template: TcpTemplate,
}

impl Connection {
    fn new(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
        entropy: u64,
        now: Instant,
    ) -> Connection {
        let jitter_nanos = config.initial_rto_jitter.as_nanos() as u64;
        let jitter = if jitter_nanos == 0 {
            Duration::ZERO
        } else {
            Duration::from_nanos((entropy >> 32) % jitter_nanos)
        };
        let rtt = RttEstimator::new(config.initial_rto + jitter, config.rto_min, config.rto_max);
        Connection {
            state: State::Closed,
            local,
            remote,
            error: None,
            iss,
            snd_una: iss,
            snd_nxt: iss,
            snd_wnd: 0,
            snd_wl1: SeqNumber(0),
            snd_wl2: iss,
            max_snd_wnd: 0,
            snd_wscale: 0,
            rcv_wscale: config.recv_window_shift(),
            wscale_ok: false,
            send_mss: DEFAULT_MSS,
            send_buffer: RingBuffer::new(config.send_buffer),
            fin_queued: false,
            fin_seq: None,
            irs: SeqNumber(0),
            rcv_nxt: SeqNumber(0),
            rcv_adv: SeqNumber(0),
            rcv_mss: u32::from(config.mss),
            recv_buffer: RingBuffer::new(config.recv_buffer),
            assembler: Assembler::new(config.max_ooo_ranges),
            peer_fin: None,
            fin_received: false,
            user_closed: false,
            sack_ok: false,
            ts_ok: false,
            ts_recent: 0,
            ts_recent_stamp: now,
            ts_offset: entropy as u32,
            last_ack_sent: SeqNumber(0),
            zero_window_advertised: false,
            ack_now: false,
            dupacks_owed: 0,
            quick_acks: 0,
            last_data_at: None,
            delack_deadline: None,
            dsack: None,
            reset_to_send: None,
            send_syn: false,
            syn_sent_at: None,
            syn_retransmitted: false,
            rtt,
            rto_deadline: None,
            tlp_deadline: None,
            tlp_due: false,
            tlp_end: None,
            tlp_retransmitted: None,
            timeouts: 0,
            persist_deadline: None,
            persist_backoff: 0,
            keepalive_deadline: None,
            keepalive_probes_sent: 0,
            time_wait_deadline: None,
            probe: Probe::None,
            last_send: now,
            scoreboard: Scoreboard::new(),
            recovery: None,
            undo: None,
            dupacks: 0,
            cwnd_blocked: false,
            rack: Rack::new(config.dupthresh),
            reorder_deadline: None,
            retrans_stamp: None,
            hystart: HyStart::new(config.hystart),
            prr: None,
            cc: new_controller(
                config.congestion,
                u32::from(config.mss),
                config.initial_window,
            ),
            counters: Counters::default(),
            stats: ConnectionStats::default(),
            tx_checksum_offload: false,
            template: TcpTemplate::new(local, remote),
            config,
        }
    }

    /// Active open (RFC 9293 3.10.1): a connection in SYN-SENT whose SYN `poll_transmit` emits.
    /// `iss` should come from RFC 6528's generator; `entropy` seeds the timestamp offset and the
    /// initial-RTO jitter.
    pub fn connect(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
        entropy: u64,
        now: Instant,
    ) -> Connection {
        let mut conn = Connection::new(config, local, remote, iss, entropy, now);
        conn.state = State::SynSent;
        conn.snd_nxt = iss + 1;
        conn.send_syn = true;
        conn.counters.bump(Counter::ActiveOpens);
        conn
    }

    /// Passive open: a connection in SYN-RECEIVED created from the peer's `syn` (RFC 9293
    /// 3.10.7.2), negotiating options and queueing the SYN-ACK.
    pub fn accept(
        config: Config,
        local: SocketAddrV4,
        remote: SocketAddrV4,
        iss: SeqNumber,
        entropy: u64,
        now: Instant,
        syn: &TcpRepr<'_>,
    ) -> Connection {
        let mut conn = Connection::new(config, local, remote, iss, entropy, now);
        conn.state = State::SynReceived;
        conn.snd_nxt = iss + 1;
        conn.take_peer_syn(syn, now);
        conn.send_syn = true;
        conn.counters.bump(Counter::PassiveOpens);
        conn
    }

    /// Records the peer's SYN: IRS, RCV.NXT and the options both sides agreed on.
    fn take_peer_syn(&mut self, syn: &TcpRepr<'_>, now: Instant) {
        self.irs = syn.seq_number;
        self.rcv_nxt = syn.seq_number + 1;
        self.rcv_adv = self.rcv_nxt;
        self.last_ack_sent = self.rcv_nxt;
        let options = &syn.options;
        self.sack_ok = self.config.sack && options.sack_permitted;
        match (self.config.window_scaling, options.window_scale) {
            (true, Some(shift)) => {
                self.snd_wscale = shift.min(14);
                self.wscale_ok = true;
            }
            _ => {
                self.snd_wscale = 0;
                self.rcv_wscale = 0;
            }
        }
        if let (true, Some((tsval, _))) = (self.config.timestamps, options.timestamps) {
            self.ts_ok = true;
            self.ts_recent = tsval;
            self.ts_recent_stamp = now;
        }
        let peer_mss = options.mss.map_or(DEFAULT_MSS, u32::from);
        let overhead = if self.ts_ok { 12 } else { 0 };
        self.send_mss = (peer_mss.min(u32::from(self.config.mss)))
            .saturating_sub(overhead)
            .max(64);
        // Linux's tcp_initialize_rcv_mss: no more than 536 until larger segments arrive.
        self.rcv_mss = u32::from(self.config.mss)
            .saturating_sub(overhead)
            .min(DEFAULT_MSS);
        // The window in a SYN is never scaled (RFC 7323 section 2.2).
        self.snd_wnd = u32::from(syn.window_len);
        self.max_snd_wnd = self.snd_wnd;
        self.snd_wl1 = syn.seq_number;
        self.cc = new_controller(
            self.config.congestion,
            self.send_mss,
            self.config.initial_window,
        );
    }

    // ---------------------------------------------------------------- accessors

    /// Leaves the checksum of data and ACK segments to the device: the field holds the
    /// pseudo-header sum for the NIC to complete (Linux CHECKSUM_PARTIAL). SYNs and RSTs are
    /// always summed in full.
    pub fn set_tx_checksum_offload(&mut self, enabled: bool) {
        self.tx_checksum_offload = enabled;
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Our address and port.
    pub fn local(&self) -> SocketAddrV4 {
        self.local
    }

    /// The peer's address and port.
    pub fn remote(&self) -> SocketAddrV4 {
        self.remote
    }

    /// Why the connection failed, if it did.
    pub fn error(&self) -> Option<ConnectionError> {
        self.error
    }

    /// This connection's counters (summed by the stack).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Takes the counters accumulated so far, leaving zeros.
    pub fn take_counters(&mut self) -> Counters {
        core::mem::take(&mut self.counters)
    }

    /// Statistics for metrics.
    pub fn stats(&self) -> &ConnectionStats {
        &self.stats
    }

    /// Congestion window in bytes (during SACK recovery, the one PRR allows).
    pub fn cwnd(&self) -> u32 {
        self.effective_cwnd()
    }

    /// Slow-start threshold in bytes.
    pub fn ssthresh(&self) -> u32 {
        self.cc.ssthresh()
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// Current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// The peer's advertised window in bytes (SND.WND).
    pub fn snd_wnd(&self) -> u32 {
        self.snd_wnd
    }

    /// Our receive window: free space in the receive buffer (RCV.WND).
    pub fn rcv_wnd(&self) -> u32 {
        self.recv_buffer.free().min(u32::MAX as usize) as u32
    }

    /// SND.UNA.
    pub fn snd_una(&self) -> SeqNumber {
        self.snd_una
    }

    /// SND.NXT.
    pub fn snd_nxt(&self) -> SeqNumber {
        self.snd_nxt
    }

    /// RCV.NXT.
    pub fn rcv_nxt(&self) -> SeqNumber {
        self.rcv_nxt
    }

    /// Payload bytes per full-sized segment we send (MSS minus option overhead).
    pub fn send_mss(&self) -> u32 {
        self.send_mss
    }

    /// Whether SACK was negotiated.
    pub fn sack_enabled(&self) -> bool {
        self.sack_ok
    }

    /// Whether timestamps were negotiated.
    pub fn timestamps_enabled(&self) -> bool {
        self.ts_ok
    }

    /// Whether a loss-recovery episode is in progress.
    pub fn in_recovery(&self) -> bool {
        self.recovery.is_some()
    }

    /// Memory held by the buffers and bookkeeping, in bytes (for bounded-memory checks).
    pub fn memory_footprint(&self) -> usize {
        self.send_buffer.allocated()
            + self.recv_buffer.allocated()
            + self.scoreboard.len() * core::mem::size_of::<SentSegment>()
            + self.assembler.ranges().len() * 8
    }

    /// Bytes the application can read now.
    pub fn recv_queue(&self) -> usize {
        self.recv_buffer.len()
    }

    /// Bytes queued for sending and not yet acknowledged.
    pub fn send_queue(&self) -> usize {
        self.send_buffer.len()
    }

    /// Whether `recv` would return data or end-of-stream, or the connection failed.
    pub fn is_readable(&self) -> bool {
        !self.recv_buffer.is_empty() || self.fin_received || self.error.is_some()
    }

    /// Whether `send` would accept bytes.
    pub fn is_writable(&self) -> bool {
        self.can_send() && self.send_buffer.free() > 0
    }

    /// Whether the peer finished sending and every byte has been read.
    pub fn is_recv_finished(&self) -> bool {
        self.fin_received && self.recv_buffer.is_empty()
    }

    fn can_send(&self) -> bool {
        matches!(
            self.state,
            State::SynSent | State::SynReceived | State::Established | State::CloseWait
        ) && !self.fin_queued
    }

    // ---------------------------------------------------------------- user calls

    /// Lends the send buffer's free space to `write`, which fills a prefix of it in place and
    /// returns how many bytes it wrote; those are queued for sending (RFC 9293 3.10.2 SEND).
    /// The space is the buffer's contiguous part only (up to where its memory wraps around),
    /// so a caller with more to send calls again; it holds stale bytes, not zeros. `write` is
    /// not called when nothing can be queued (buffer full, or our side closed); a count past
    /// the slice's end is cut to it. Returns the bytes queued.
    pub fn send_with<F: FnOnce(&mut [u8]) -> usize>(&mut self, write: F) -> usize {
        if !self.can_send() {
            return 0;
        }
        let space = self.send_buffer.writable();
        if space.is_empty() {
            return 0;
        }
        let room = space.len();
        let n = write(space).min(room);
        self.send_buffer.commit(n);
        n
    }

    /// Queues a copy of `data` for sending (RFC 9293 3.10.2), through
    /// [`Connection::send_with`]; returns how many bytes fitted in the send buffer.
    pub fn send(&mut self, data: &[u8]) -> usize {
        let mut taken = 0;
        while taken < data.len() {
            let rest = &data[taken..];
            let n = self.send_with(|space| copy_prefix(rest, space));
            if n == 0 {
                break;
            }
            taken += n;
        }
        taken
    }

    /// Lends the received bytes to `read` in place, which returns how many it consumed; those leave
    /// the receive buffer (RFC 9293 3.10.3 RECEIVE). The bytes are the buffer's contiguous part
    /// only (up to where its memory wraps around), so a caller that consumed them all calls again
    /// for the rest. `read` is not called when there is nothing to read; a count past the slice's
    /// end is cut to it. Returns the bytes consumed.
    ///
    /// When reading opens a window that had closed to half the buffer or less to at least twice
    /// what is left of it, a window update goes out at once, as Linux's `tcp_cleanup_rbuf` does; an
    /// open window travels on the next ACK. (ACKing every read that frees a segment's room, as RFC
    /// 1122 4.2.3.3 permits, made a receiver that reads as it receives ACK nearly every segment:
    /// 1.2 segments per ACK on the evaluation's link against Linux's 2.2.)
    pub fn recv_with<F: FnOnce(&[u8]) -> usize>(&mut self, read: F) -> usize {
        let data = self.recv_buffer.readable();
        if data.is_empty() {
            return 0;
        }
        let available = data.len();
        let n = read(data).min(available);
        self.consume_received(n);
        n
    }

    /// Drops `n` bytes the application read and schedules a window update when due (see
    /// [`Connection::recv_with`]).
    fn consume_received(&mut self, n: usize) {
        self.recv_buffer.consume(n);
        if n > 0 && self.state.is_synchronized() {
            let advertised = self.rcv_adv.distance_from(self.rcv_nxt) as usize;
            let free = self.recv_buffer.free();
            // Receiver SWS avoidance (RFC 1122 4.2.3.3): never for less than min(buffer/2, MSS).
            let threshold = (self.recv_buffer.capacity() / 2).min(self.rcv_mss as usize);
            let was_closing = 2 * advertised <= self.recv_buffer.capacity();
            if was_closing && free >= 2 * advertised && free >= advertised + threshold.max(1) {
                self.ack_now = true;
            }
        }
    }

    /// [`Connection::recv_with`] and [`Connection::send_with`] at once, for a reply made
    /// straight from the input: `serve` gets the received bytes and the send buffer's free
    /// space (each its contiguous part; the space is empty when nothing can be queued) and
    /// returns (consumed, written). Not called when there is nothing to read; counts past a
    /// slice's end are cut to it. Returns (consumed, queued).
    pub fn recv_send_with<F>(&mut self, serve: F) -> (usize, usize)
    where
        F: FnOnce(&[u8], &mut [u8]) -> (usize, usize),
    {
        let can_send = self.can_send();
        let input = self.recv_buffer.readable();
        if input.is_empty() {
            return (0, 0);
        }
        let space: &mut [u8] = if can_send {
            self.send_buffer.writable()
        } else {
            &mut []
        };
        let (available, room) = (input.len(), space.len());
        let (consumed, written) = serve(input, space);
        let (consumed, written) = (consumed.min(available), written.min(room));
        self.send_buffer.commit(written);
        self.consume_received(consumed);
        (consumed, written)
    }

    /// Copies received bytes into `out` (RFC 9293 3.10.3), through
    /// [`Connection::recv_with`], so the window reopens the same way; returns the bytes read.
    pub fn recv(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        while done < out.len() {
            let rest = &mut out[done..];
            let n = self.recv_with(|data| copy_prefix(data, rest));
            if n == 0 {
                break;
            }
            done += n;
        }
        done
    }

    /// Closes our direction (RFC 9293 3.10.4): the FIN follows the queued data.
    ///
    /// In SYN-SENT with nothing queued the connection is simply deleted (RFC 9293); with data
    /// queued, the FIN waits for the handshake and follows the data.
    pub fn shutdown(&mut self) {
        match self.state {
            State::SynSent if self.send_buffer.is_empty() => self.state_closed(),
            State::SynSent => self.fin_queued = true,
            State::SynReceived | State::Established => {
                self.state = State::FinWait1;
                self.fin_queued = true;
            }
            State::CloseWait => {
                self.state = State::LastAck;
                self.fin_queued = true;
            }
            _ => {}
        }
    }

    /// Closes the connection: a RST if unread data would be lost (RFC 9293 3.10.4, Linux's
    /// TCPAbortOnClose), else a FIN; data arriving afterwards is answered with a RST.
    pub fn close(&mut self) {
        if !self.recv_buffer.is_empty() && self.state.is_synchronized() {
            self.counters.bump(Counter::TCPAbortOnClose);
            self.abort();
            return;
        }
        self.user_closed = true;
        self.shutdown();
    }

    /// Aborts with a RST (RFC 9293 3.10.5).
    pub fn abort(&mut self) {
        if matches!(
            self.state,
            State::SynReceived
                | State::Established
                | State::FinWait1
                | State::FinWait2
                | State::CloseWait
        ) {
            self.reset_to_send = Some((self.snd_nxt, Some(self.rcv_nxt)));
        }
        self.state_closed();
    }

    fn state_closed(&mut self) {
        self.state = State::Closed;
        self.rto_deadline = None;
        self.reorder_deadline = None;
        self.delack_deadline = None;
        self.persist_deadline = None;
        self.keepalive_deadline = None;
        self.time_wait_deadline = None;
        self.send_syn = false;
        self.ack_now = false;
    }

    fn fail(&mut self, error: ConnectionError) {
        if matches!(self.state, State::Established | State::CloseWait)
            && error == ConnectionError::Reset
        {
            self.counters.bump(Counter::EstabResets);
        }
        if matches!(self.state, State::SynSent | State::SynReceived) {
            self.counters.bump(Counter::AttemptFails);
        }
        self.error = Some(error);
        self.state_closed();
    }

    // ---------------------------------------------------------------- input

    /// Processes one arriving segment (RFC 9293 3.10.7). The caller has verified the checksum
    /// and matched the 4-tuple.
    pub fn handle_segment(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        match self.state {
            State::Closed => {}
            State::SynSent => self.on_segment_syn_sent(now, seg),
            _ => self.on_segment_synchronized(now, seg),
        }
        self.update_timers(now);
    }

    fn on_segment_syn_sent(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        let flags = seg.flags;
        if flags.ack() && (seg.ack_number <= self.iss || seg.ack_number > self.snd_nxt) {
            if !flags.rst() {
                self.reset_to_send = Some((seg.ack_number, None));
            }
            return;
        }
        if flags.rst() {
            if flags.ack() {
                self.fail(ConnectionError::Refused);
            }
            return;
        }
        if !flags.syn() {
            return;
        }
        self.take_peer_syn(seg, now);
        if flags.ack() {
            self.snd_una = seg.ack_number;
            self.snd_wl2 = seg.ack_number;
            if let (Some(sent), false) = (self.syn_sent_at, self.syn_retransmitted) {
                self.rtt.sample(now - sent, self.snd_una, self.snd_nxt);
                self.rack.on_rtt_sample(now, now - sent);
            }
            self.enter_established();
            self.ack_now = true;
        } else {
            // Simultaneous open (RFC 9293 3.10.7.3, figure 8).
            self.state = State::SynReceived;
            self.send_syn = true;
        }
    }

    fn enter_established(&mut self) {
        self.state = State::Established;
        self.rto_deadline = None;
        self.timeouts = 0;
        self.send_syn = false;
        if self.fin_queued {
            self.state = State::FinWait1;
        }
    }

    fn is_acceptable(&self, seg: &TcpRepr<'_>) -> bool {
        let seg_len = seg.segment_len();
        let rcv_wnd = self.rcv_wnd();
        let seq = seg.seq_number;
        let in_window = |s: SeqNumber| self.rcv_nxt <= s && s < self.rcv_nxt + rcv_wnd;
        match (seg_len, rcv_wnd) {
            (0, 0) => seq == self.rcv_nxt,
            (0, _) => in_window(seq),
            (_, 0) => false,
            (_, _) => in_window(seq) || in_window(seq + seg_len - 1),
        }
    }

    fn on_segment_synchronized(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        let flags = seg.flags;
        self.keepalive_probes_sent = 0;

        if self.state == State::SynReceived && flags.syn() && seg.seq_number == self.irs {
            if !flags.ack() {
                // A retransmitted SYN: repeat the SYN-ACK.
                self.send_syn = true;
            } else if self.snd_una < seg.ack_number && seg.ack_number <= self.snd_nxt {
                // Simultaneous open: the peer's SYN-ACK acknowledges ours (RFC 9293 figure 8).
                self.snd_una = seg.ack_number;
                self.snd_wl2 = seg.ack_number;
                self.enter_established();
            }
            return;
        }

        // PAWS (RFC 7323 section 5.3), with Linux's one-tick tolerance (TCP_PAWS_WINDOW):
        // a retransmission stamped a tick after new data may overtake it on the path, and
        // must not get that data dropped.
        if let (true, Some((tsval, _))) = (self.ts_ok, seg.options.timestamps) {
            let stale = (tsval.wrapping_sub(self.ts_recent) as i32) < -PAWS_WINDOW;
            if stale && !flags.rst() && now - self.ts_recent_stamp <= PAWS_IDLE {
                self.counters.bump(Counter::PAWSEstab);
                self.ack_now = true;
                return;
            }
        }

        // Sequence number check (RFC 9293 3.10.7.4 first).
        if !self.is_acceptable(seg) {
            if flags.rst() {
                return;
            }
            let end = seg.seq_number + seg.payload.len() as u32;
            if !seg.payload.is_empty() && end <= self.rcv_nxt {
                if self.config.dsack && self.sack_ok {
                    self.dsack = Some((seg.seq_number, end));
                    self.counters.bump(Counter::TCPDSACKOldSent);
                }
                // As for a partly old segment (process_data): the sender is retransmitting.
                self.enter_quick_ack(QUICK_ACKS);
            }
            if self.state == State::TimeWait && flags.fin() {
                // A retransmitted FIN: ACK it again and restart the 2·MSL wait.
                self.time_wait_deadline = Some(now + self.config.msl * 2);
            }
            self.ack_now = true;
            return;
        }

        // RST (RFC 5961 section 3.2): only an exact match resets; in-window draws a challenge.
        if flags.rst() {
            if seg.seq_number == self.rcv_nxt {
                self.fail(ConnectionError::Reset);
            } else {
                self.challenge_ack();
            }
            return;
        }

        // SYN in a synchronized state (RFC 5961 section 4): challenge ACK.
        if flags.syn() {
            self.counters.bump(Counter::TCPSYNChallenge);
            self.challenge_ack();
            return;
        }

        if !flags.ack() {
            return;
        }

        if self.state == State::SynReceived {
            if self.snd_una < seg.ack_number && seg.ack_number <= self.snd_nxt {
                if let (Some(sent), false) = (self.syn_sent_at, self.syn_retransmitted) {
                    self.rtt.sample(now - sent, seg.ack_number, self.snd_nxt);
                    self.rack.on_rtt_sample(now, now - sent);
                }
                self.snd_una = seg.ack_number;
                self.snd_wnd = u32::from(seg.window_len) << self.snd_wscale;
                self.max_snd_wnd = self.max_snd_wnd.max(self.snd_wnd);
                self.snd_wl1 = seg.seq_number;
                self.snd_wl2 = seg.ack_number;
                self.enter_established();
            } else {
                self.reset_to_send = Some((seg.ack_number, None));
                return;
            }
        }

        // ACK field checks (RFC 9293 3.10.7.4 fifth, RFC 5961 section 5.2).
        if seg.ack_number > self.snd_nxt {
            self.ack_now = true;
            return;
        }
        if seg.ack_number < self.snd_una - self.max_snd_wnd.max(1) {
            self.challenge_ack();
            return;
        }

        // TS.Recent update (RFC 7323 section 4.3).
        if let (true, Some((tsval, _))) = (self.ts_ok, seg.options.timestamps) {
            if seg.seq_number <= self.last_ack_sent
                && (tsval.wrapping_sub(self.ts_recent) as i32) >= 0
            {
                self.ts_recent = tsval;
                self.ts_recent_stamp = now;
            }
        }

        self.process_ack(now, seg);
        if self.state == State::Closed {
            return;
        }

        // Our FIN acknowledged?
        let fin_acked = self.fin_seq.is_some_and(|f| self.snd_una > f);
        if fin_acked {
            match self.state {
                State::FinWait1 => self.state = State::FinWait2,
                State::Closing => self.enter_time_wait(now),
                State::LastAck => {
                    self.state_closed();
                    return;
                }
                _ => {}
            }
        }

        if !seg.payload.is_empty() {
            match self.state {
                State::Established | State::FinWait1 | State::FinWait2 => {
                    if self.user_closed {
                        // Nobody will read it: RST (RFC 9293 3.10.4, Linux TCPAbortOnData).
                        self.counters.bump(Counter::TCPAbortOnData);
                        self.abort();
                        return;
                    }
                    self.process_data(now, seg);
                }
                _ => {}
            }
        } else {
            self.counters.bump(Counter::TCPPureAcks);
        }

        if flags.fin() && !self.fin_received {
            let fin = seg.seq_number + seg.payload.len() as u32;
            if self.peer_fin.is_none() && fin >= self.rcv_nxt {
                self.peer_fin = Some(fin);
            }
        }
        self.consume_peer_fin(now);
    }

    fn consume_peer_fin(&mut self, now: Instant) {
        if self.fin_received || self.peer_fin != Some(self.rcv_nxt) {
            return;
        }
        self.fin_received = true;
        self.rcv_nxt = self.rcv_nxt + 1;
        self.ack_now = true;
        match self.state {
            State::Established => self.state = State::CloseWait,
            State::FinWait1 => {
                if self.fin_seq.is_some_and(|f| self.snd_una > f) {
                    self.enter_time_wait(now);
                } else {
                    self.state = State::Closing;
                }
            }
            State::FinWait2 => self.enter_time_wait(now),
            _ => {}
        }
    }

    fn enter_time_wait(&mut self, now: Instant) {
        self.state = State::TimeWait;
        self.time_wait_deadline = Some(now + self.config.msl * 2);
        self.rto_deadline = None;
        self.reorder_deadline = None;
        self.persist_deadline = None;
        self.keepalive_deadline = None;
    }

    fn owe_dupack(&mut self) {
        self.dupacks_owed = (self.dupacks_owed + 1).min(16);
    }

    fn challenge_ack(&mut self) {
        self.counters.bump(Counter::TCPChallengeACK);
        self.ack_now = true;
    }

    /// The congestion window in force: PRR's during SACK recovery, the controller's otherwise.
    fn effective_cwnd(&self) -> u32 {
        match self.prr {
            Some(prr) => prr.cwnd,
            None => self.cc.cwnd(),
        }
    }

    fn flight_size(&self) -> u32 {
        self.snd_nxt.distance_from(self.snd_una)
    }

    /// RFC 6675 pipe, or for NewReno in fast recovery the flight minus segments that left via
    /// duplicate ACKs.
    fn pipe(&self) -> u32 {
        match self.recovery {
            None => self.flight_size(),
            // After a timeout every outstanding segment already counts as lost (Linux's Loss
            // state): duplicate ACKs release nothing more.
            Some(recovery) if self.sack_ok || recovery.after_timeout => self.scoreboard.pipe(),
            Some(_) => {
                // Without SACK each duplicate ACK stands for one segment that left the network
                // (the RFC 6582 window inflation, expressed as a smaller pipe).
                let left = self.dupacks.saturating_mul(self.send_mss);
                self.scoreboard.pipe().saturating_sub(left)
            }
        }
    }

    fn process_ack(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        let ack = seg.ack_number;
        let flight_before = self.flight_size();

        // Window update (RFC 9293 3.10.7.4, SND.WL1/SND.WL2 rule).
        let mut window_changed = false;
        if self.snd_wl1 < seg.seq_number || (self.snd_wl1 == seg.seq_number && self.snd_wl2 <= ack)
        {
            let wnd = u32::from(seg.window_len) << self.snd_wscale;
            window_changed = wnd != self.snd_wnd;
            self.snd_wnd = wnd;
            self.max_snd_wnd = self.max_snd_wnd.max(wnd);
            self.snd_wl1 = seg.seq_number;
            self.snd_wl2 = ack;
        }

        let prior_fack = self.rack.fack();
        let mut sacks = SackOutcome::default();
        if self.sack_ok && !seg.options.sack_blocks.is_empty() {
            sacks = self.process_sack_blocks(now, &seg.options.sack_blocks, ack);
        }
        let mut delivered = sacks.newly_sacked_bytes;

        if ack > self.snd_una {
            // An ACK of new data restarts the probe timer (RFC 8985 section 7.2) and ends a
            // probe episode once it covers the probe.
            self.tlp_deadline = None;
            if self.tlp_end.is_some_and(|end| ack >= end) {
                self.tlp_end = None;
            }
            let acked = ack.distance_from(self.snd_una);
            delivered += acked;
            let data_acked = (acked as usize).min(self.send_buffer.len());
            self.send_buffer.consume(data_acked);
            self.stats.bytes_acked += data_acked as u64;
            let (rack, mss) = (&mut self.rack, self.send_mss);
            let mut reordered = 0;
            let removed = self.scoreboard.acknowledge(ack, |s| {
                if !s.sacked {
                    rack.on_delivered(now, s.sent_at, s.end, s.retransmitted);
                    reordered += u64::from(rack.on_cumulatively_acked(
                        s.end,
                        s.retransmitted,
                        prior_fack,
                        mss,
                    ));
                }
            });
            self.counters.add(Counter::TCPSACKReorder, reordered);
            // RTT: timestamps (RFC 7323 section 4) or Karn's rule (RFC 6298 section 3).
            let ts_sample = match (self.ts_ok, seg.options.timestamps) {
                (true, Some((_, tsecr))) if tsecr != 0 => {
                    let elapsed = self.ts_now(now).wrapping_sub(tsecr);
                    (elapsed < 0x7fff_ffff).then(|| Duration::from_millis(u64::from(elapsed)))
                }
                _ => None,
            };
            let rtt_sample = ts_sample.or(removed.rtt_sent_at.map(|sent| now - sent));
            if let Some(rtt) = rtt_sample {
                self.rtt.sample(rtt, ack, self.snd_nxt);
                self.rack.on_rtt_sample(now, rtt);
            }
            let tsecr = seg.options.timestamps.map(|(_, tsecr)| tsecr);
            let delayed = self.ts_ok
                && tsecr.is_some_and(|e| {
                    e != 0
                        && self
                            .retrans_stamp
                            .is_some_and(|s| (e.wrapping_sub(s) as i32) < 0)
                });
            if !self.scoreboard.any_retransmitted() {
                self.retrans_stamp = None;
            }
            if delayed {
                self.undo_for_delayed_original(ack);
            }
            self.snd_una = ack;
            self.timeouts = 0;
            self.dupacks = 0;
            self.persist_backoff = 0;
            self.rto_deadline = if self.snd_una == self.snd_nxt {
                None
            } else {
                Some(now + self.rtt.rto())
            };
            if self.sack_ok && self.scoreboard.first_is_sacked() {
                self.counters.bump(Counter::TCPSACKReneging);
                self.scoreboard.clear_sacks();
            }
            let cwnd_limited =
                self.cwnd_blocked || flight_before.saturating_mul(2) >= self.cc.cwnd();
            self.cwnd_blocked = false;
            match self.recovery {
                Some(recovery) if ack >= recovery.recover => {
                    self.recovery = None;
                    self.prr = None;
                    self.rack.on_recovery_end();
                    if !recovery.after_timeout {
                        let ssthresh = self.cc.ssthresh();
                        self.cc.set_cwnd(ssthresh);
                    }
                }
                Some(recovery) => {
                    if recovery.after_timeout {
                        self.cc
                            .on_ack(now, acked, self.rtt.srtt().unwrap_or_default(), true);
                    } else if !self.sack_ok {
                        // RFC 6582 section 3.2 step 3: a partial ACK retransmits the next hole.
                        self.scoreboard.mark_first_lost();
                    }
                }
                None => {
                    let srtt = self.rtt.srtt().unwrap_or_default();
                    let growth = if self.cc.cwnd() < self.cc.ssthresh() {
                        self.hystart
                            .on_ack(ack, self.snd_nxt, acked, self.send_mss, rtt_sample)
                    } else {
                        Growth::Unchanged
                    };
                    match growth {
                        Growth::SlowStart(n) | Growth::Conservative(n) => {
                            self.cc.on_ack(now, n, srtt, cwnd_limited)
                        }
                        Growth::ExitSlowStart => self.cc.exit_slow_start(),
                        Growth::Unchanged => self.cc.on_ack(now, acked, srtt, cwnd_limited),
                    }
                }
            }
        } else if ack == self.snd_una
            && seg.payload.is_empty()
            && !seg.flags.syn()
            && !seg.flags.fin()
            && !window_changed
            && self.snd_nxt > self.snd_una
        {
            // A duplicate ACK (RFC 5681 section 2).
            self.dupacks += 1;
        }

        if self.sack_ok {
            self.rack.on_ack(sacks.dsack, self.snd_una, self.snd_nxt);
            if delivered > 0 || self.recovery.is_some() {
                self.detect_losses(now);
            }
        } else if self.recovery.is_none() && self.dupacks == self.config.dupthresh {
            self.scoreboard.mark_first_lost();
            self.enter_recovery(now, Counter::TCPRenoRecovery);
        }
        self.proportional_rate_reduction(delivered);
    }

    /// RFC 6937 per-ACK step: spread the window reduction over the recovery episode, sending
    /// ssthresh/RecoverFS segments per segment delivered while pipe exceeds ssthresh, and
    /// slow-starting back up to ssthresh (PRR-SSRB) when pipe falls below it.
    fn proportional_rate_reduction(&mut self, delivered: u32) {
        let Some(mut prr) = self.prr else { return };
        if self.recovery.is_none_or(|r| r.after_timeout) {
            self.prr = None;
            return;
        }
        prr.delivered = prr.delivered.saturating_add(delivered);
        let pipe = self.scoreboard.pipe();
        let ssthresh = self.cc.ssthresh();
        let sndcnt = if pipe > ssthresh {
            let target = (u64::from(prr.delivered) * u64::from(ssthresh))
                .div_ceil(u64::from(prr.recover_fs.max(1)));
            (target as u32).saturating_sub(prr.out)
        } else {
            let limit = prr.delivered.saturating_sub(prr.out).max(delivered) + self.send_mss;
            (ssthresh - pipe).min(limit)
        };
        prr.cwnd = pipe + sndcnt;
        self.prr = Some(prr);
    }

    fn enter_recovery(&mut self, now: Instant, counter: Counter) {
        self.counters.bump(counter);
        if self.config.prr && self.sack_ok {
            let recover_fs = self.flight_size();
            self.prr = Some(Prr {
                delivered: 0,
                out: 0,
                recover_fs,
                cwnd: 0,
            });
        }
        self.hystart.stop();
        self.tlp_deadline = None;
        self.tlp_due = false;
        self.recovery = Some(Recovery {
            recover: self.snd_nxt,
            after_timeout: false,
        });
        self.undo = Some(UndoRecord {
            retransmissions: 0,
            retransmitted: false,
            after_timeout: false,
        });
        self.cc.on_congestion_event(now, self.flight_size());
    }

    /// RACK (RFC 8985 section 6): marks what time shows lost, arms the reordering timer for
    /// what is still within its window, and enters recovery when something is lost. Linux
    /// with `tcp_recovery` = 1 does the same and no longer counts duplicate ACKs with SACK.
    fn detect_losses(&mut self, now: Instant) {
        let srtt = self.rtt.srtt().unwrap_or_default();
        let sacked = self.scoreboard.sacked_segments();
        let reo_wnd = self.rack.reo_wnd(self.recovery.is_some(), sacked, srtt);
        let rack = &self.rack;
        let found = self
            .scoreboard
            .detect_losses(now, |s| rack.lost_at(s.sent_at, s.end, reo_wnd));
        self.counters.add(
            Counter::TCPLostRetransmit,
            u64::from(found.lost_retransmissions),
        );
        self.reorder_deadline = found.pending_until;
        if self.recovery.is_none() && (found.newly_lost > 0 || self.scoreboard.first_is_lost()) {
            self.enter_recovery(now, Counter::TCPSackRecovery);
        }
    }

    /// Applies SACK blocks (RFC 2018) after recognising a leading D-SACK (RFC 2883 section 4).
    fn process_sack_blocks(
        &mut self,
        now: Instant,
        blocks: &SackBlocks,
        ack: SeqNumber,
    ) -> SackOutcome {
        let blocks = blocks.as_slice();
        let mut outcome = SackOutcome::default();
        let mut skip_first = false;
        if let Some(&(left, right)) = blocks.first() {
            let below_ack = right <= ack || left < ack;
            let inside_second = blocks
                .get(1)
                .is_some_and(|&(l2, r2)| l2 <= left && right <= r2);
            if below_ack || inside_second {
                skip_first = true;
                self.counters.bump(if below_ack {
                    Counter::TCPDSACKRecv
                } else {
                    Counter::TCPDSACKOfoRecv
                });
                let segments = right
                    .distance_from(left)
                    .div_ceil(self.send_mss.max(1))
                    .max(1);
                self.counters
                    .add(Counter::TCPDSACKRecvSegs, u64::from(segments));
                let for_probe = self
                    .tlp_retransmitted
                    .is_some_and(|(l, r)| l <= left && right <= r);
                if for_probe {
                    // The probe was unnecessary (RFC 8985 7.4.1); nothing to undo.
                    self.tlp_retransmitted = None;
                } else {
                    outcome.dsack = true;
                    self.on_dsack(segments);
                }
            }
        }
        // In sequence order, as Linux sorts them (tcp_sacktag_write_queue): blocks come most
        // recent first, and a lower block applied after a higher one would look reordered.
        let fresh = &blocks[usize::from(skip_first)..];
        let mut sorted = [(SeqNumber(0), SeqNumber(0)); SackBlocks::CAPACITY];
        let sorted = &mut sorted[..fresh.len()];
        sorted.copy_from_slice(fresh);
        // Within one window, so the wrapping comparison is a total order here.
        sorted.sort_unstable_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(core::cmp::Ordering::Equal));
        let mut reordered = 0;
        for &(left, right) in sorted.iter() {
            if left >= right || left < self.snd_una || right > self.snd_nxt {
                self.counters.bump(Counter::TCPSACKDiscard);
                continue;
            }
            let (rack, mss) = (&mut self.rack, self.send_mss);
            let update = self.scoreboard.sack(left, right, |s| {
                rack.on_delivered(now, s.sent_at, s.end, s.retransmitted);
                reordered += u64::from(rack.on_sacked(s.end, s.retransmitted, mss));
            });
            outcome.newly_sacked_bytes += update.newly_sacked_bytes;
        }
        self.counters.add(Counter::TCPSACKReorder, reordered);
        outcome
    }

    fn on_dsack(&mut self, segments: u32) {
        if !self.config.dsack {
            return;
        }
        let Some(mut undo) = self.undo else { return };
        if !undo.retransmitted || undo.retransmissions == 0 {
            return;
        }
        let proven = segments.min(undo.retransmissions);
        self.stats.spurious_retransmissions += u64::from(proven);
        undo.retransmissions -= proven;
        self.undo = Some(undo);
        if undo.retransmissions == 0 && self.config.undo_spurious {
            // Every retransmission of the episode was unnecessary: undo the response.
            self.counters.bump(Counter::TCPDSACKUndo);
            if undo.after_timeout {
                self.counters.bump(Counter::TCPSpuriousRTOs);
            }
            self.undo_episode(undo);
        }
    }

    /// Eifel detection (RFC 3522, Linux's `tcp_packet_delayed`): this ACK of new data echoes
    /// a TSval older than the earliest retransmission outstanding, so it was sent for an
    /// original transmission. As Linux (`tcp_try_undo_recovery`, `tcp_try_undo_partial`,
    /// `tcp_try_undo_loss`), the episode is undone when it began with an RTO, when this ACK
    /// completes it, or on a partial ACK once no retransmission is left in flight.
    fn undo_for_delayed_original(&mut self, ack: SeqNumber) {
        let (Some(undo), Some(recovery)) = (self.undo, self.recovery) else {
            return;
        };
        if !self.config.undo_spurious {
            return;
        }
        if recovery.after_timeout || ack >= recovery.recover {
            self.undo_episode(undo);
        } else if !self.scoreboard.any_retransmit_in_flight() {
            self.counters.bump(Counter::TCPPartialUndo);
            self.undo_episode(undo);
        }
    }

    /// Undoes the congestion response of an episode proven spurious (Linux's
    /// `tcp_undo_cwnd_reduction`): the controller's state before it, the loss marks cleared
    /// (RACK judges those segments anew), and the recovery ended. Counts TCPLossUndo after an
    /// RTO and TCPFullUndo after a fast retransmit, as Linux does.
    fn undo_episode(&mut self, undo: UndoRecord) {
        self.cc.undo();
        self.undo = None;
        self.stats.undos += 1;
        self.counters.bump(if undo.after_timeout {
            Counter::TCPLossUndo
        } else {
            Counter::TCPFullUndo
        });
        if self.recovery.take().is_some() {
            self.prr = None;
            self.scoreboard.unmark_lost();
        }
    }

    fn process_data(&mut self, now: Instant, seg: &TcpRepr<'_>) {
        let mut seq = seg.seq_number;
        let mut data = seg.payload;
        if seq < self.rcv_nxt {
            let dup = self.rcv_nxt.distance_from(seq) as usize;
            if self.config.dsack && self.sack_ok {
                self.dsack = Some((seq, self.rcv_nxt.min(seq + data.len() as u32)));
                self.counters.bump(Counter::TCPDSACKOldSent);
            }
            data = &data[dup.min(data.len())..];
            seq = self.rcv_nxt;
            self.ack_now = true;
            // Linux's tcp_data_queue: data the receiver already holds means the sender is
            // retransmitting; ACK the next segments at once.
            self.enter_quick_ack(QUICK_ACKS);
        }
        if data.is_empty() {
            return;
        }
        self.note_data_arrival(now);
        let offset = seq.distance_from(self.rcv_nxt) as usize;
        let had_holes = !self.assembler.is_empty();
        let written = self.recv_buffer.write_at(offset, data);
        if offset == 0 && !had_holes {
            // Fast path: in order with nothing queued behind it.
            self.recv_buffer.commit(written);
            self.rcv_nxt = self.rcv_nxt + written as u32;
            self.stats.bytes_received += written as u64;
            self.rcv_mss = self
                .rcv_mss
                .max(data.len() as u32)
                .min(u32::from(self.config.mss));
            self.schedule_ack(now, data.len(), written);
            return;
        }
        self.rcv_mss = self
            .rcv_mss
            .max(data.len() as u32)
            .min(u32::from(self.config.mss));
        match self.assembler.add(offset as u32, (offset + written) as u32) {
            Added::Full => {
                self.counters.bump(Counter::TCPOFODrop);
                self.ack_now = true;
                return;
            }
            Added::Duplicate if offset > 0 => {
                if self.config.dsack && self.sack_ok {
                    self.dsack = Some((seq, seq + written as u32));
                    self.counters.bump(Counter::TCPDSACKOfoSent);
                }
                self.owe_dupack();
                return;
            }
            _ => {}
        }
        let contiguous = self.assembler.take_contiguous();
        self.recv_buffer.commit(contiguous as usize);
        self.rcv_nxt = self.rcv_nxt + contiguous;
        self.stats.bytes_received += u64::from(contiguous);
        if offset > 0 {
            // Out of order: ACK at once so the sender sees the hole (RFC 5681 section 4.2).
            self.counters.bump(Counter::TCPOFOQueue);
            self.owe_dupack();
        } else if had_holes {
            // A hole was (partly) filled: ACK at once.
            self.ack_now = true;
        } else {
            self.schedule_ack(now, data.len(), written);
        }
    }

    /// Linux's `tcp_event_data_recv`: the first data, and data after a silence longer than
    /// the RTO (the sender restarting after a timeout or an idle time), put the receiver in
    /// quick-ACK mode, so that a sender starting from a small window is not held by delayed
    /// ACKs.
    fn note_data_arrival(&mut self, now: Instant) {
        let silent = self
            .last_data_at
            .is_none_or(|last| now - last > self.rtt.rto());
        if silent {
            self.enter_quick_ack(QUICK_ACKS);
        }
        self.last_data_at = Some(now);
    }

    /// Linux's `tcp_incr_quickack`: ACK up to `segments` data segments at once, no more than
    /// half the advertised window's worth (at least 2).
    fn enter_quick_ack(&mut self, segments: u32) {
        let window = self.rcv_adv.distance_from(self.rcv_nxt);
        let half_window = (window / (2 * self.rcv_mss.max(1))).max(2);
        self.quick_acks = self.quick_acks.max(segments.min(half_window));
    }

    /// In-order data: ACK once more than `ack_every_segments` − 1 full-sized segments' worth
    /// of bytes is unacknowledged — every second full-sized segment (RFC 5681 4.2), or, as
    /// Linux's `__tcp_ack_snd_check` counts bytes against its estimate of the peer's segment
    /// size, every ninth 64-byte one — else arm the delayed-ACK timer (RFC 1122 4.2.3.2); ACK
    /// at once when data was cut off or in quick-ACK mode.
    fn schedule_ack(&mut self, now: Instant, len: usize, written: usize) {
        let unacked = self.rcv_nxt.distance_from(self.last_ack_sent);
        let due = unacked > self.config.ack_every_segments.saturating_sub(1) * self.rcv_mss;
        if self.quick_acks > 0 {
            self.quick_acks -= 1;
            self.ack_now = true;
        } else if due || written < len {
            self.ack_now = true;
        } else if self.delack_deadline.is_none() {
            self.delack_deadline = Some(now + self.config.delayed_ack);
        }
    }

    // ---------------------------------------------------------------- timers

    /// The earliest instant at which [`Connection::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let earliest = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, None) | (None, x) => x,
        };
        let t = earliest(self.rto_deadline, self.delack_deadline);
        let t = earliest(t, self.persist_deadline);
        let t = earliest(t, self.tlp_deadline);
        let t = earliest(t, self.reorder_deadline);
        let t = earliest(t, self.keepalive_deadline);
        earliest(t, self.time_wait_deadline)
    }

    /// Runs every timer that expired at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.time_wait_deadline.is_some_and(|d| d <= now) {
            self.state_closed();
            return;
        }
        if self.delack_deadline.is_some_and(|d| d <= now) {
            self.delack_deadline = None;
            self.counters.bump(Counter::DelayedACKs);
            self.ack_now = true;
        }
        if self.reorder_deadline.is_some_and(|d| d <= now) {
            self.reorder_deadline = None;
            if self.sack_ok && self.state.is_synchronized() {
                self.detect_losses(now);
            }
        }
        if self.tlp_deadline.is_some_and(|d| d <= now) {
            // The probe goes out instead of an RTO due at the same time; the RTO is re-armed
            // behind it (RFC 8985 section 7.3).
            self.tlp_deadline = None;
            if self.recovery.is_none() && self.snd_nxt > self.snd_una {
                self.tlp_due = true;
                self.rto_deadline = Some(now + self.rtt.rto());
            }
        }
        if self.rto_deadline.is_some_and(|d| d <= now) {
            self.tlp_deadline = None;
            self.on_retransmission_timeout(now);
        }
        if self.persist_deadline.is_some_and(|d| d <= now) {
            self.persist_deadline = None;
            self.persist_backoff += 1;
            self.probe = Probe::ZeroWindow;
        }
        if self.keepalive_deadline.is_some_and(|d| d <= now) {
            self.keepalive_deadline = None;
            if self.keepalive_probes_sent >= self.config.keepalive_probes {
                self.fail(ConnectionError::TimedOut);
                return;
            }
            self.probe = Probe::Keepalive;
        }
        self.update_timers(now);
    }

    fn on_retransmission_timeout(&mut self, now: Instant) {
        self.rto_deadline = None;
        self.timeouts += 1;
        self.rtt.back_off();
        match self.state {
            State::SynSent | State::SynReceived => {
                let limit = if self.state == State::SynSent {
                    self.config.syn_retries
                } else {
                    self.config.synack_retries
                };
                if self.timeouts > limit {
                    self.fail(ConnectionError::TimedOut);
                    return;
                }
                self.counters.bump(Counter::TCPSynRetrans);
                self.counters.bump(Counter::RetransSegs);
                self.syn_retransmitted = true;
                self.send_syn = true;
            }
            _ if self.snd_nxt > self.snd_una => {
                if self.timeouts > self.config.retries {
                    self.counters.bump(Counter::TCPAbortOnTimeout);
                    self.fail(ConnectionError::TimedOut);
                    return;
                }
                self.counters.bump(Counter::TCPTimeouts);
                self.hystart.stop();
                self.prr = None;
                let flight = self.flight_size();
                self.cc.on_retransmission_timeout(now, flight);
                self.scoreboard.mark_all_lost();
                self.dupacks = 0;
                let undo = match self.undo {
                    // A timeout inside an episode keeps the oldest undo state.
                    Some(undo) if self.recovery.is_some() => UndoRecord {
                        after_timeout: true,
                        ..undo
                    },
                    _ => UndoRecord {
                        retransmissions: 0,
                        retransmitted: false,
                        after_timeout: true,
                    },
                };
                self.undo = Some(undo);
                self.recovery = Some(Recovery {
                    recover: self.snd_nxt,
                    after_timeout: true,
                });
            }
            _ => {}
        }
    }

    /// Re-derives the timers that depend on the connection's state after any event.
    fn update_timers(&mut self, now: Instant) {
        if !self.state.is_synchronized()
            && !matches!(self.state, State::SynSent | State::SynReceived)
        {
            return;
        }
        let outstanding = self.snd_nxt > self.snd_una;
        if outstanding && self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        self.arm_tail_loss_probe(now);
        // Persist timer (RFC 9293 3.8.6.1): data waits but the window is closed.
        let unsent = self.unsent_len();
        let window_closed = self.snd_wnd == 0;
        if self.state.is_synchronized() && window_closed && unsent > 0 && !outstanding {
            if self.persist_deadline.is_none() && self.probe == Probe::None {
                let backoff = 1u32
                    .checked_shl(self.persist_backoff.min(16))
                    .unwrap_or(u32::MAX);
                let interval = self
                    .rtt
                    .rto()
                    .saturating_mul(backoff)
                    .min(self.config.rto_max);
                self.persist_deadline = Some(now + interval);
            }
        } else {
            self.persist_deadline = None;
            if !window_closed {
                self.persist_backoff = 0;
            }
        }
        // Keepalive (RFC 1122 4.2.3.6).
        if self.config.keepalive && self.state == State::Established && !outstanding {
            if self.keepalive_deadline.is_none() {
                let wait = if self.keepalive_probes_sent == 0 {
                    self.config.keepalive_time
                } else {
                    self.config.keepalive_interval
                };
                self.keepalive_deadline = Some(now + wait);
            }
        } else {
            self.keepalive_deadline = None;
        }
    }

    /// Arms the probe timeout when a tail could be lost silently (RFC 8985 section 7.2):
    /// SACK in use, data outstanding, no recovery and no probe outstanding. PTO = 2·SRTT, plus
    /// the worst-case delayed ACK when one segment is in flight; never later than the RTO.
    fn arm_tail_loss_probe(&mut self, now: Instant) {
        let eligible = self.config.tail_loss_probe
            && self.sack_ok
            && matches!(
                self.state,
                State::Established
                    | State::CloseWait
                    | State::FinWait1
                    | State::Closing
                    | State::LastAck
            )
            && self.snd_nxt > self.snd_una
            && self.recovery.is_none()
            && self.tlp_end.is_none()
            && !self.tlp_due;
        let Some(srtt) = self.rtt.srtt().filter(|_| eligible) else {
            self.tlp_deadline = None;
            return;
        };
        if self.tlp_deadline.is_some() {
            return;
        }
        let mut pto = srtt * 2;
        if self.flight_size() <= self.send_mss {
            pto += Duration::from_millis(200);
        }
        // Never later than the RTO it stands in for (RFC 8985 section 7.2).
        let deadline = now + pto.max(Duration::from_millis(10));
        self.tlp_deadline = Some(self.rto_deadline.map_or(deadline, |rto| deadline.min(rto)));
    }

    /// Sends the tail loss probe: one new segment if the window allows, else the last
    /// segment again (RFC 8985 section 7.3).
    fn send_tail_loss_probe(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        self.tlp_due = false;
        let unsent = self.unsent_len();
        let usable = (self.snd_una + self.snd_wnd).distance_from(self.snd_nxt) as usize;
        let mss = (self.send_mss as usize).min(buffer.len() - self.header_len_estimate());
        if unsent > 0 && usable > 0 {
            let len = unsent.min(mss).min(usable);
            let seq = self.snd_nxt;
            let offset = seq.distance_from(self.snd_una) as usize;
            let n = self.emit_segment(now, buffer, seq, TcpFlags::ACK | TcpFlags::PSH, offset, len);
            self.scoreboard.push(SentSegment {
                start: seq,
                end: seq + len as u32,
                fin: false,
                sent_at: now,
                retransmitted: false,
                sacked: false,
                lost: false,
                retransmit_in_flight: false,
            });
            self.snd_nxt = seq + len as u32;
            self.counters.bump(Counter::TCPOrigDataSent);
            self.counters.bump(Counter::TCPLossProbes);
            self.stats.data_segments_sent += 1;
            self.tlp_end = Some(self.snd_nxt);
            return Some(n);
        }
        // The highest segment the peer has not SACKed.
        let index = (0..self.scoreboard.len())
            .rev()
            .find(|&i| self.scoreboard.get(i).is_some_and(|s| !s.sacked))?;
        let segment = *self.scoreboard.get(index)?;
        self.counters.bump(Counter::TCPLossProbes);
        let len = segment.len() - u32::from(segment.fin);
        let offset = segment.start.distance_from(self.snd_una) as usize;
        let mut flags = TcpFlags::ACK;
        if segment.fin {
            flags |= TcpFlags::FIN;
        }
        let n = self.emit_segment(now, buffer, segment.start, flags, offset, len as usize);
        self.scoreboard.mark_retransmitted(index, now);
        self.counters.bump(Counter::RetransSegs);
        self.stats.retransmissions += 1;
        self.stats.data_segments_sent += u64::from(len > 0);
        self.tlp_end = Some(self.snd_nxt);
        self.tlp_retransmitted = Some((segment.start, segment.end));
        Some(n)
    }

    fn unsent_len(&self) -> usize {
        let in_flight_data = self.snd_nxt.distance_from(self.snd_una) as usize;
        let in_flight_data = in_flight_data
            .saturating_sub(usize::from(self.fin_seq.is_some_and(|f| self.snd_nxt > f)));
        self.send_buffer.len().saturating_sub(in_flight_data)
    }

    // ---------------------------------------------------------------- output

    fn ts_now(&self, now: Instant) -> u32 {
        (now.as_millis() as u32).wrapping_add(self.ts_offset)
    }

    /// Writes the next segment to send into `buffer` (TCP header, options, payload, checksum)
    /// and returns its length, or `None` when there is nothing to send now. `buffer` must hold
    /// at least 60 bytes plus one MSS. Call repeatedly until `None`.
    pub fn poll_transmit(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        if buffer.len() < MIN_HEADER_ROOM + self.send_mss as usize {
            return None;
        }
        if let Some((seq, ack)) = self.reset_to_send.take() {
            let flags = if ack.is_some() {
                TcpFlags::RST | TcpFlags::ACK
            } else {
                TcpFlags::RST
            };
            self.counters.bump(Counter::OutRsts);
            let repr = TcpRepr {
                src_port: self.local.port(),
                dst_port: self.remote.port(),
                seq_number: seq,
                ack_number: ack.unwrap_or_default(),
                flags: TcpFlags(flags),
                ..TcpRepr::default()
            };
            self.counters.bump(Counter::OutSegs);
            repr.emit(buffer, *self.local.ip(), *self.remote.ip());
            return Some(repr.buffer_len());
        }
        match self.state {
            State::Closed => return None,
            State::SynSent | State::SynReceived if self.send_syn => {
                return Some(self.emit_syn(now, buffer))
            }
            State::SynSent => return None,
            _ => {}
        }
        if let Some(n) = self.transmit_data(now, buffer) {
            return Some(n);
        }
        let probe = core::mem::replace(&mut self.probe, Probe::None);
        if probe != Probe::None && self.state.is_synchronized() {
            // Zero-window and keepalive probes carry an old sequence number and no data, which
            // makes the peer answer with its current ACK and window.
            let counter = if probe == Probe::ZeroWindow {
                Counter::TCPWinProbe
            } else {
                Counter::TCPKeepAlive
            };
            self.counters.bump(counter);
            if probe == Probe::Keepalive {
                self.keepalive_probes_sent += 1;
            }
            let seq = self.snd_una - 1;
            let n = self.emit_segment(now, buffer, seq, TcpFlags::ACK, 0, 0);
            self.update_timers(now);
            return Some(n);
        }
        if self.dupacks_owed > 0 && self.state.is_synchronized() {
            self.dupacks_owed -= 1;
            let ack_now = self.ack_now;
            let n = self.emit_segment(now, buffer, self.snd_nxt, TcpFlags::ACK, 0, 0);
            // Keep owing the final ACK while more duplicates are due.
            self.ack_now = ack_now && self.dupacks_owed > 0;
            return Some(n);
        }
        if self.ack_now && self.state != State::SynReceived {
            return Some(self.emit_segment(now, buffer, self.snd_nxt, TcpFlags::ACK, 0, 0));
        }
        None
    }

    fn emit_syn(&mut self, now: Instant, buffer: &mut [u8]) -> usize {
        self.send_syn = false;
        if self.syn_sent_at.is_some() && !self.syn_retransmitted {
            // A SYN-ACK repeated on request of a retransmitted SYN: no RTT sample from it.
            self.syn_retransmitted = true;
        }
        self.syn_sent_at = Some(now);
        let passive = self.state == State::SynReceived;
        let offering = |enabled: bool, peer: bool| enabled && (!passive || peer);
        let options = TcpOptions {
            mss: Some(self.config.mss),
            window_scale: offering(self.config.window_scaling, self.wscale_ok)
                .then_some(self.rcv_wscale),
            sack_permitted: offering(self.config.sack, self.sack_ok),
            timestamps: offering(self.config.timestamps, self.ts_ok)
                .then(|| (self.ts_now(now), if passive { self.ts_recent } else { 0 })),
            sack_blocks: SackBlocks::default(),
        };
        let flags = if passive {
            TcpFlags::SYN | TcpFlags::ACK
        } else {
            TcpFlags::SYN
        };
        let window = self.recv_buffer.free().min(0xffff) as u16;
        let repr = TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq_number: self.iss,
            ack_number: if passive { self.rcv_nxt } else { SeqNumber(0) },
            flags: TcpFlags(flags),
            window_len: window,
            urgent_pointer: 0,
            options,
            payload: &[],
        };
        if passive {
            self.rcv_adv = self.rcv_nxt + u32::from(window);
        }
        repr.emit(buffer, *self.local.ip(), *self.remote.ip());
        self.counters.bump(Counter::OutSegs);
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        repr.buffer_len()
    }

    /// Chooses a retransmission or new data per RFC 6675 NextSeg / RFC 5681, honouring cwnd,
    /// the peer's window, Nagle and sender SWS avoidance.
    fn transmit_data(&mut self, now: Instant, buffer: &mut [u8]) -> Option<usize> {
        if !matches!(
            self.state,
            State::Established
                | State::CloseWait
                | State::FinWait1
                | State::Closing
                | State::LastAck
        ) {
            return None;
        }
        if self.tlp_due {
            if let Some(n) = self.send_tail_loss_probe(now, buffer) {
                return Some(n);
            }
        }
        let cwnd = self.effective_cwnd();
        let pipe = self.pipe();
        // Loss recovery first (RFC 6675 NextSeg rule 1). The first retransmission after fast
        // retransmit is sent regardless of cwnd (RFC 5681 3.2 step 4).
        if self.recovery.is_some() {
            if let Some(index) = self.scoreboard.next_lost() {
                let first_retransmission = self.undo.is_some_and(|u| !u.retransmitted);
                if pipe < cwnd || first_retransmission {
                    return Some(self.retransmit(now, buffer, index));
                }
                self.cwnd_blocked = true;
                return None;
            }
        }
        // Restart after idle (RFC 5681 section 4.1, Linux tcp_slow_start_after_idle).
        if self.snd_nxt == self.snd_una && now - self.last_send > self.rtt.rto() {
            let restart = self.config.initial_window * self.send_mss;
            if self.cc.cwnd() > restart {
                self.cc.set_cwnd(restart);
            }
        }
        let cwnd = self.effective_cwnd();
        let unsent = self.unsent_len();
        let fin_pending = self.fin_queued && self.fin_seq.is_none();
        if unsent == 0 && !fin_pending {
            return None;
        }
        let window_right = self.snd_una + self.snd_wnd;
        let usable_window = window_right.distance_from(self.snd_nxt) as usize;
        // Limited transmit (RFC 3042): each of the first two duplicate ACKs lets one new
        // segment out beyond cwnd.
        let limited_transmit = if self.recovery.is_none() {
            self.dupacks.min(2) * self.send_mss
        } else {
            0
        };
        let cwnd_room = (cwnd + limited_transmit).saturating_sub(pipe) as usize;
        // Segments carrying SACK blocks have less room for data (Linux tcp_current_mss).
        let mss = (self.send_mss as usize).min(buffer.len() - self.header_len_estimate());
        let len = unsent.min(mss).min(usable_window).min(cwnd_room);
        if unsent > 0 && len == 0 {
            if cwnd_room == 0 {
                self.cwnd_blocked = true;
            }
            return None;
        }
        let in_flight = self.snd_nxt > self.snd_una;
        if len < mss && len < unsent {
            // Sender SWS avoidance (RFC 9293 3.8.6.2.1): only a full segment, everything
            // queued, or at least half the peer's largest window.
            if len < (self.max_snd_wnd as usize) / 2 || cwnd_room < mss {
                if cwnd_room < mss {
                    self.cwnd_blocked = true;
                }
                return None;
            }
        }
        if len > 0 && len < mss && len == unsent && in_flight && self.config.nagle && !fin_pending {
            // Nagle (RFC 9293 3.7.4): hold a small tail while data is unacknowledged.
            return None;
        }
        let with_fin = fin_pending && len == unsent;
        if len == 0 && !with_fin {
            return None;
        }
        let seq = self.snd_nxt;
        let offset = seq.distance_from(self.snd_una) as usize;
        let mut flags = TcpFlags::ACK;
        if len > 0 && len == unsent {
            flags |= TcpFlags::PSH;
        }
        if with_fin {
            flags |= TcpFlags::FIN;
        }
        let n = self.emit_segment(now, buffer, seq, flags, offset, len);
        let end = seq + len as u32 + u32::from(with_fin);
        if with_fin {
            self.fin_seq = Some(seq + len as u32);
        }
        self.scoreboard.push(SentSegment {
            start: seq,
            end,
            fin: with_fin,
            sent_at: now,
            retransmitted: false,
            sacked: false,
            lost: false,
            retransmit_in_flight: false,
        });
        self.snd_nxt = end;
        if let Some(prr) = &mut self.prr {
            prr.out = prr.out.saturating_add(end.distance_from(seq));
        }
        if len > 0 {
            self.counters.bump(Counter::TCPOrigDataSent);
            self.stats.data_segments_sent += 1;
        }
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        self.keepalive_deadline = None;
        Some(n)
    }

    fn sack_blocks_pending(&self) -> usize {
        if !self.sack_ok {
            return 0;
        }
        let limit = if self.ts_ok { 3 } else { 4 };
        (usize::from(self.dsack.is_some()) + self.assembler.ranges().len()).min(limit)
    }

    fn header_len_estimate(&self) -> usize {
        let blocks = self.sack_blocks_pending();
        let sack = if blocks > 0 { 4 + 8 * blocks } else { 0 };
        20 + if self.ts_ok { 12 } else { 0 } + sack
    }

    fn retransmit(&mut self, now: Instant, buffer: &mut [u8], index: usize) -> usize {
        let segment = *self.scoreboard.get(index).expect("index from next_lost");
        let len = segment.len() - u32::from(segment.fin);
        let offset = segment.start.distance_from(self.snd_una) as usize;
        let mut flags = TcpFlags::ACK;
        if segment.fin {
            flags |= TcpFlags::FIN;
        }
        let n = self.emit_segment(now, buffer, segment.start, flags, offset, len as usize);
        self.scoreboard.mark_retransmitted(index, now);
        self.counters.bump(Counter::RetransSegs);
        self.stats.retransmissions += 1;
        self.stats.data_segments_sent += u64::from(len > 0);
        if let Some(prr) = &mut self.prr {
            prr.out = prr.out.saturating_add(segment.len());
        }
        let after_timeout = self.recovery.is_some_and(|r| r.after_timeout);
        self.retrans_stamp.get_or_insert(self.ts_now(now));
        if let Some(undo) = &mut self.undo {
            if after_timeout && undo.retransmitted {
                self.counters.bump(Counter::TCPSlowStartRetrans);
            } else if !after_timeout {
                self.counters.bump(Counter::TCPFastRetrans);
            }
            undo.retransmitted = true;
            undo.retransmissions += 1;
        }
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rtt.rto());
        }
        n
    }

    /// Emits one segment with the current ACK, window and options; payload comes straight
    /// from the send buffer at `offset`.
    fn emit_segment(
        &mut self,
        now: Instant,
        buffer: &mut [u8],
        seq: SeqNumber,
        flags: u8,
        offset: usize,
        len: usize,
    ) -> usize {
        // The window is computed as the segment leaves, never earlier (RFC 9293 3.8.6.2.2).
        let window_len = self.window_to_advertise();
        let fields = TcpFields {
            seq_number: seq,
            ack_number: self.rcv_nxt,
            flags: TcpFlags(flags),
            window_len,
            timestamps: self.ts_ok.then(|| (self.ts_now(now), self.ts_recent)),
        };
        let mut sack_blocks = SackBlocks::default();
        if self.sack_ok {
            let limit = if self.ts_ok { 3 } else { 4 };
            if let Some((left, right)) = self.dsack.take() {
                sack_blocks.push(left, right);
            }
            for (start, end) in self.assembler.recent_ranges() {
                if sack_blocks.len() >= limit {
                    break;
                }
                sack_blocks.push(self.rcv_nxt + start, self.rcv_nxt + end);
            }
        }
        // Without SACK blocks the header is the connection's template (timestamps or no
        // options), patched; SACK blocks take the general emitter.
        let templated = sack_blocks.is_empty();
        let header_len = if templated {
            fields.header_len()
        } else {
            self.emit_sack_header(buffer, &fields, sack_blocks, len)
        };
        let copied = self
            .send_buffer
            .peek(offset, &mut buffer[header_len..header_len + len]);
        debug_assert_eq!(copied, len);
        let segment = &mut buffer[..header_len + len];
        let (local, remote) = (*self.local.ip(), *self.remote.ip());
        match (templated, self.tx_checksum_offload) {
            (true, false) => self.template.emit(segment, &fields, TcpChecksum::Full),
            (true, true) => self.template.emit(segment, &fields, TcpChecksum::Partial),
            (false, false) => fill_checksum(segment, local, remote),
            (false, true) => fill_partial_checksum(segment, local, remote),
        }
        self.last_ack_sent = self.rcv_nxt;
        self.ack_now = false;
        if flags & TcpFlags::SYN == 0 && self.dupacks_owed > 0 && len > 0 {
            // A data segment carries the ACK too.
            self.dupacks_owed -= 1;
        }
        self.delack_deadline = None;
        self.last_send = now;
        self.counters.bump(Counter::OutSegs);
        header_len + len
    }

    /// The window field of the next segment (its unscaled value), recording the right edge
    /// advertised and the moves to and from a zero window.
    fn window_to_advertise(&mut self) -> u16 {
        let free = self.recv_buffer.free().min(0xffff << self.rcv_wscale) as u32;
        let right = (self.rcv_nxt + free).max(self.rcv_adv);
        let window = right.distance_from(self.rcv_nxt);
        let window_len = (window >> self.rcv_wscale).min(0xffff) as u16;
        self.rcv_adv = self
            .rcv_adv
            .max(self.rcv_nxt + (u32::from(window_len) << self.rcv_wscale));
        if window_len == 0 && !self.zero_window_advertised {
            self.zero_window_advertised = true;
            self.counters.bump(Counter::TCPToZeroWindowAdv);
        } else if window_len > 0 && self.zero_window_advertised {
            self.zero_window_advertised = false;
            self.counters.bump(Counter::TCPFromZeroWindowAdv);
        }
        window_len
    }

    /// Writes the header of a segment carrying `sack_blocks` with the general emitter (the
    /// template covers only the no-options and timestamps-only layouts), shedding blocks that
    /// would not fit with `len` bytes of payload; returns the header length.
    fn emit_sack_header(
        &self,
        buffer: &mut [u8],
        fields: &TcpFields,
        sack_blocks: SackBlocks,
        len: usize,
    ) -> usize {
        let mut repr = TcpRepr {
            src_port: self.local.port(),
            dst_port: self.remote.port(),
            seq_number: fields.seq_number,
            ack_number: fields.ack_number,
            flags: fields.flags,
            window_len: fields.window_len,
            urgent_pointer: 0,
            options: TcpOptions {
                timestamps: fields.timestamps,
                sack_blocks,
                ..TcpOptions::default()
            },
            payload: &[],
        };
        while repr.header_len() + len > buffer.len() && !repr.options.sack_blocks.is_empty() {
            // A retransmission sized before SACK blocks were due: shed blocks to fit.
            let keep = repr.options.sack_blocks.len() - 1;
            repr.options.sack_blocks.truncate(keep);
        }
        emit_header(&repr, buffer)
    }
}
