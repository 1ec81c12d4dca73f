//! Laws that must hold for every input (proptest).

use core::time::Duration;
use proptest::prelude::*;
use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};
use userstack::tcp::{Config, Connection, State};
use userstack::time::Instant;
use userstack::wire::tcp::Packet;
use userstack::wire::{
    arp, ethernet, icmp, ipv4, ArpRepr, IcmpRepr, Ipv4Repr, SackBlocks, SeqNumber, TcpFlags,
    TcpOptions, TcpRepr,
};

const A: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000);
const B: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);

/// What the channel does to one segment.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Deliver,
    Drop,
    Duplicate,
    /// Held back and delivered after the next few segments.
    Delay(u8),
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        6 => Just(Fate::Deliver),
        2 => Just(Fate::Drop),
        1 => Just(Fate::Duplicate),
        1 => (1u8..6).prop_map(Fate::Delay),
    ]
}

fn config(sack: bool, timestamps: bool) -> Config {
    Config {
        sack,
        timestamps,
        recv_buffer: 16 * 1024,
        send_buffer: 16 * 1024,
        msl: Duration::from_millis(500),
        ..Config::default()
    }
}

struct Segment {
    bytes: Vec<u8>,
    to_b: bool,
    due: u32,
}

fn parse(bytes: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> TcpRepr<'_> {
    TcpRepr::parse(&Packet::new_checked(bytes).unwrap(), src, dst).unwrap()
}

/// Runs a transfer of `data` from A to B (and `reply` from B to A) through a channel that
/// applies `fates` in order, then behaves; returns what each side read.
fn transfer(
    data: &[u8],
    reply: &[u8],
    fates: &[Fate],
    sack: bool,
    timestamps: bool,
) -> (Vec<u8>, Vec<u8>, State, State) {
    let mut now = Instant::ZERO;
    let mut a = Connection::connect(
        config(sack, timestamps),
        A,
        B,
        SeqNumber(0xffff_f000),
        1,
        now,
    );
    let mut b: Option<Connection> = None;
    let (mut sent_a, mut sent_b) = (0, 0);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut fates = fates.iter().copied();
    let mut in_flight: VecDeque<Segment> = VecDeque::new();
    let mut counter = 0u32;
    let mut buf = vec![0u8; 2048];
    let mut read = vec![0u8; 4096];
    for _round in 0..20_000 {
        // Applications.
        sent_a += a.send(&data[sent_a..]);
        if sent_a == data.len() {
            a.shutdown();
        }
        loop {
            let n = a.recv(&mut read);
            if n == 0 {
                break;
            }
            got_a.extend_from_slice(&read[..n]);
        }
        if let Some(b) = b.as_mut() {
            sent_b += b.send(&reply[sent_b..]);
            loop {
                let n = b.recv(&mut read);
                if n == 0 {
                    break;
                }
                got_b.extend_from_slice(&read[..n]);
            }
            if sent_b == reply.len() && b.is_recv_finished() {
                b.shutdown();
            }
        }
        // Transmit.
        let mut emitted = Vec::new();
        while let Some(n) = a.poll_transmit(now, &mut buf) {
            emitted.push((buf[..n].to_vec(), true));
        }
        if let Some(b) = b.as_mut() {
            while let Some(n) = b.poll_transmit(now, &mut buf) {
                emitted.push((buf[..n].to_vec(), false));
            }
        }
        for (bytes, to_b) in emitted {
            counter += 1;
            match fates.next().unwrap_or(Fate::Deliver) {
                Fate::Deliver => in_flight.push_back(Segment {
                    bytes,
                    to_b,
                    due: counter,
                }),
                Fate::Drop => {}
                Fate::Duplicate => {
                    in_flight.push_back(Segment {
                        bytes: bytes.clone(),
                        to_b,
                        due: counter,
                    });
                    in_flight.push_back(Segment {
                        bytes,
                        to_b,
                        due: counter,
                    });
                }
                Fate::Delay(k) => in_flight.push_back(Segment {
                    bytes,
                    to_b,
                    due: counter + u32::from(k),
                }),
            }
        }
        // Deliver what is due (delayed segments wait for later ones: reordering).
        let mut delivered_any = false;
        let mut keep = VecDeque::new();
        let horizon = counter;
        while let Some(seg) = in_flight.pop_front() {
            if seg.due > horizon && !in_flight.is_empty() {
                keep.push_back(seg);
                continue;
            }
            delivered_any = true;
            now += Duration::from_micros(100);
            if seg.to_b {
                let repr = parse(&seg.bytes, *A.ip(), *B.ip());
                match b.as_mut() {
                    Some(b) => b.handle_segment(now, &repr),
                    None if repr.flags.syn() && !repr.flags.ack() => {
                        b = Some(Connection::accept(
                            config(sack, timestamps),
                            B,
                            A,
                            SeqNumber(7),
                            2,
                            now,
                            &repr,
                        ));
                    }
                    None => {}
                }
            } else {
                a.handle_segment(now, &parse(&seg.bytes, *B.ip(), *A.ip()));
            }
        }
        in_flight = keep;
        if delivered_any || !in_flight.is_empty() {
            if in_flight.iter().all(|s| s.due > counter) && !delivered_any {
                counter += 1;
            }
            continue;
        }
        // Idle: jump to the next timer.
        let next = [a.poll_timeout(), b.as_ref().and_then(|b| b.poll_timeout())]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) => {
                now = now.max(t);
                a.handle_timeout(now);
                if let Some(b) = b.as_mut() {
                    b.handle_timeout(now);
                }
            }
            None => break,
        }
        if a.state() == State::Closed && b.as_ref().is_some_and(|b| b.state() == State::Closed) {
            break;
        }
    }
    let b_state = b.as_ref().map_or(State::Closed, |b| b.state());
    (got_a, got_b, a.state(), b_state)
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Bounded for CI; raise with PROPTEST_CASES for a long local run.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    /// Under any loss, reordering and duplication the byte streams arrive exactly once and in
    /// order, and both ends reach CLOSED.
    #[test]
    fn streams_survive_any_channel(
        len in 0usize..40_000,
        reply_len in 0usize..5_000,
        fates in proptest::collection::vec(fate(), 0..400),
        sack in any::<bool>(),
        timestamps in any::<bool>(),
    ) {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let reply: Vec<u8> = (0..reply_len).map(|i| (i * 17 % 253) as u8).collect();
        let (got_a, got_b, state_a, state_b) = transfer(&data, &reply, &fates, sack, timestamps);
        prop_assert_eq!(got_b.len(), data.len());
        prop_assert!(got_b == data);
        prop_assert!(got_a == reply);
        prop_assert_eq!(state_a, State::Closed);
        prop_assert_eq!(state_b, State::Closed);
    }

    /// Arbitrary segments never panic an established connection nor grow it without bound.
    #[test]
    fn arbitrary_segments_are_harmless(
        segments in proptest::collection::vec(
            (any::<u32>(), any::<u32>(), any::<u8>(), any::<u16>(), proptest::collection::vec(any::<u8>(), 0..1500),
             proptest::option::of((any::<u32>(), any::<u32>())), proptest::collection::vec((any::<u32>(), any::<u32>()), 0..4)),
            1..60),
        steer in any::<bool>(),
    ) {
        let now = Instant::from_millis(1);
        let mut client = Connection::connect(config(true, true), A, B, SeqNumber(1000), 1, Instant::ZERO);
        let mut buf = vec![0u8; 2048];
        let n = client.poll_transmit(Instant::ZERO, &mut buf).unwrap();
        let syn = buf[..n].to_vec();
        let mut server = Connection::accept(config(true, true), B, A, SeqNumber(5000), 2, Instant::ZERO, &parse(&syn, *A.ip(), *B.ip()));
        let rcv_nxt = server.rcv_nxt();
        for (i, (seq, ack, flags, window, payload, ts, blocks)) in segments.iter().enumerate() {
            let mut sack_blocks = SackBlocks::default();
            for (l, r) in blocks {
                sack_blocks.push(SeqNumber(*l), SeqNumber(*r));
            }
            // Steer half the cases near the live sequence space so deep paths are reached.
            let (seq, ack) = if steer { (rcv_nxt + (seq % 70_000), SeqNumber(5001).max(SeqNumber(5000 + ack % 3))) } else { (SeqNumber(*seq), SeqNumber(*ack)) };
            let repr = TcpRepr {
                src_port: A.port(),
                dst_port: B.port(),
                seq_number: seq,
                ack_number: ack,
                flags: TcpFlags(*flags),
                window_len: *window,
                urgent_pointer: 0,
                options: TcpOptions { timestamps: *ts, sack_blocks, ..TcpOptions::default() },
                payload,
            };
            let t = now + Duration::from_millis(i as u64);
            server.handle_segment(t, &repr);
            while server.poll_transmit(t, &mut buf).is_some() {}
            server.handle_timeout(t + Duration::from_secs(1));
            while server.poll_transmit(t, &mut buf).is_some() {}
            prop_assert!(server.memory_footprint() <= 2 * 16 * 1024 + 64 * 1024);
        }
        let _ = client.poll_timeout();
    }

    /// Emitting a parsed segment reproduces it byte for byte.
    #[test]
    fn tcp_emit_parse_roundtrip(
        seq in any::<u32>(), ack in any::<u32>(), flags in any::<u8>(), window in any::<u16>(),
        mss in proptest::option::of(any::<u16>()), wscale in proptest::option::of(0u8..15),
        sack_permitted in any::<bool>(), ts in proptest::option::of((any::<u32>(), any::<u32>())),
        blocks in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..3),
        payload in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut sack_blocks = SackBlocks::default();
        for (l, r) in &blocks {
            sack_blocks.push(SeqNumber(*l), SeqNumber(*r));
        }
        let options = TcpOptions { mss, window_scale: wscale, sack_permitted, timestamps: ts, sack_blocks };
        prop_assume!(options.buffer_len() <= 40);
        let repr = TcpRepr {
            src_port: 1, dst_port: 2, seq_number: SeqNumber(seq), ack_number: SeqNumber(ack),
            flags: TcpFlags(flags), window_len: window, urgent_pointer: 0, options, payload: &payload,
        };
        let mut bytes = vec![0u8; repr.buffer_len()];
        repr.emit(&mut bytes, *A.ip(), *B.ip());
        let parsed = parse(&bytes, *A.ip(), *B.ip());
        prop_assert_eq!(parsed, repr);
        let mut again = vec![0u8; parsed.buffer_len()];
        parsed.emit(&mut again, *A.ip(), *B.ip());
        prop_assert_eq!(again, bytes);
    }

    /// IPv4 headers round-trip too.
    #[test]
    fn ipv4_emit_parse_roundtrip(ident in any::<u16>(), ttl in any::<u8>(), tos in any::<u8>(), df in any::<bool>(), len in 0usize..100, protocol in any::<u8>()) {
        let repr = Ipv4Repr { src_addr: *A.ip(), dst_addr: *B.ip(), protocol, payload_len: len, ttl, tos, ident, dont_fragment: df };
        let mut bytes = vec![0u8; ipv4::HEADER_LEN + len];
        repr.emit(&mut bytes);
        let packet = ipv4::Packet::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(Ipv4Repr::parse(&packet), Ok(repr));
    }

    /// No parser panics on any input.
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        if let Ok(frame) = ethernet::Frame::new_checked(&bytes[..]) {
            let _ = frame.payload();
        }
        if let Ok(packet) = arp::Packet::new_checked(&bytes[..]) {
            let _ = ArpRepr::parse(&packet);
        }
        if let Ok(packet) = ipv4::Packet::new_checked(&bytes[..]) {
            let _ = Ipv4Repr::parse(&packet);
            let _ = packet.payload();
        }
        if let Ok(packet) = icmp::Packet::new_checked(&bytes[..]) {
            let _ = IcmpRepr::parse(&packet);
        }
        if let Ok(packet) = Packet::new_checked(&bytes[..]) {
            let _ = TcpRepr::parse(&packet, *A.ip(), *B.ip());
            let _ = TcpRepr::parse_unchecked(&packet);
        }
        let _ = TcpOptions::parse(&bytes);
    }
}
