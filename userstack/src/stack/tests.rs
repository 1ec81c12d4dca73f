//! Two stack instances joined back to back.

use super::*;
use crate::wire::checksum;
use core::time::Duration;

const MAC_A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
const MAC_B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const IP_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fn pair() -> (Stack, Stack) {
    let mut a = StackConfig::new(MAC_A, IP_A, 24);
    a.secret = 1;
    let mut b = StackConfig::new(MAC_B, IP_B, 24);
    b.secret = 2;
    (Stack::new(a, Instant::ZERO), Stack::new(b, Instant::ZERO))
}

/// Exchanges frames and runs timers until both sides are idle or `until` passes.
fn pump(a: &mut Stack, b: &mut Stack, mut now: Instant, until: Instant) -> Instant {
    let mut frames_ab = Vec::new();
    let mut frames_ba = Vec::new();
    loop {
        for _ in 0..10_000 {
            a.egress(now, &mut frames_ab);
            b.egress(now, &mut frames_ba);
            if frames_ab.is_empty() && frames_ba.is_empty() {
                break;
            }
            b.ingress(now, &mut frames_ab);
            a.ingress(now, &mut frames_ba);
        }
        let next = [a.poll_timeout(), b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if t <= until => {
                now = now.max(t);
                a.poll_timers(now);
                b.poll_timers(now);
            }
            _ => return now,
        }
    }
}

#[test]
fn arp_handshake_transfer_and_close() {
    let (mut a, mut b) = pair();
    b.listen(80, 16).unwrap();
    let client = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let mut events = Vec::new();
    b.poll_events(&mut events);
    assert!(events.contains(&Event::Acceptable(80)));
    let server = b.accept(80).expect("accepted");
    assert_eq!(b.connection(server).unwrap().state(), State::Established);
    let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    let mut now = now;
    let mut buf = vec![0u8; 65536];
    while got.len() < data.len() {
        sent += a.send(client, &data[sent..]).unwrap();
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
        loop {
            let n = b.recv(server, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        now += Duration::from_millis(1);
    }
    assert_eq!(got, data);
    a.close(client).unwrap();
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(10));
    assert!(b.connection(server).unwrap().is_recv_finished());
    b.close(server).unwrap();
    pump(&mut a, &mut b, now, now + Duration::from_secs(120));
    assert_eq!(a.connection_count(), 0);
    assert_eq!(b.connection_count(), 0);
    let ca = a.counters();
    assert_eq!(ca.get(Counter::ActiveOpens), 1);
    assert!(ca.get(Counter::OutSegs) > 100);
    assert_eq!(b.counters().get(Counter::PassiveOpens), 1);
    assert_eq!(b.counters().get(Counter::CurrEstab), 0);
    assert!(
        a.connection(client).is_none(),
        "handle is stale after release"
    );
}

#[test]
fn an_idle_stack_gives_its_slot_table_back_and_old_handles_stay_stale() {
    // 50 connections opened and closed through TIME-WAIT: the slot table kept their peak's
    // capacity (1.5 kB a slot) before; now it is released once the last one is gone.
    let (mut a, mut b) = pair();
    b.listen(80, 256).unwrap();
    let handles: Vec<SocketHandle> = (0..50)
        .map(|_| a.connect(SocketAddrV4::new(IP_B, 80)).unwrap())
        .collect();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let accepted: Vec<SocketHandle> = std::iter::from_fn(|| b.accept(80)).collect();
    assert_eq!(accepted.len(), 50);
    assert!(a.slots.capacity() >= 50);
    for &h in &handles {
        a.close(h).unwrap();
    }
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(10));
    for &h in &accepted {
        b.close(h).unwrap();
    }
    let now = pump(&mut a, &mut b, now, now + Duration::from_secs(120));
    assert_eq!(a.connection_count(), 0);
    assert_eq!(a.slots.capacity(), 0, "the slot table was kept");
    assert_eq!(b.slots.capacity(), 0, "the slot table was kept");
    // A new connection takes slot 0 again, under a newer generation than the old handle's.
    let again = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let old = handles.iter().find(|h| h.index == again.index).unwrap();
    assert!(again.generation > old.generation);
    assert!(
        a.connection(*old).is_none(),
        "an old handle reaches the new connection"
    );
    pump(&mut a, &mut b, now, now + Duration::from_millis(10));
    assert!(b.accept(80).is_some());
}

#[test]
fn closed_port_answers_rst_and_connect_fails() {
    let (mut a, mut b) = pair();
    let client = a.connect(SocketAddrV4::new(IP_B, 81)).unwrap();
    pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    assert_eq!(
        a.connection(client).unwrap().error(),
        Some(tcp::ConnectionError::Refused)
    );
    assert_eq!(b.counters().get(Counter::OutRsts), 1);
    let mut events = Vec::new();
    a.poll_events(&mut events);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Ready(h, r) if *h == client && r.closed)));
}

#[test]
fn accept_queue_overflow_counts_listen_drops() {
    let (mut a, mut b) = pair();
    b.listen(80, 2).unwrap();
    for _ in 0..4 {
        a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    }
    pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(500));
    let counters = b.counters();
    assert!(counters.get(Counter::ListenOverflows) >= 2);
    assert!(counters.get(Counter::ListenDrops) >= 2);
    assert!(b.accept(80).is_some());
    assert!(b.accept(80).is_some());
    assert!(b.accept(80).is_none());
}

#[test]
fn echo_request_is_answered_and_fragments_counted() {
    let (mut a, mut b) = pair();
    a.add_neighbor(IP_B, MAC_B);
    b.add_neighbor(IP_A, MAC_A);
    let echo = IcmpRepr::EchoRequest {
        ident: 7,
        seq_no: 1,
        data: b"ping",
    };
    let mut frame = vec![0u8; TCP_OFFSET + echo.buffer_len()];
    EthernetRepr {
        src_addr: MAC_A,
        dst_addr: MAC_B,
        ethertype: ethertype::IPV4,
    }
    .emit(&mut frame);
    let ip = Ipv4Repr {
        src_addr: IP_A,
        dst_addr: IP_B,
        protocol: ipv4::protocol::ICMP,
        payload_len: echo.buffer_len(),
        ttl: 64,
        tos: 0,
        ident: 1,
        dont_fragment: false,
    };
    ip.emit(&mut frame[ethernet::HEADER_LEN..]);
    echo.emit(&mut frame[TCP_OFFSET..]);
    let mut fragment = frame.clone();
    fragment[ethernet::HEADER_LEN + 6] |= 0x20;
    fragment[ethernet::HEADER_LEN + 10..ethernet::HEADER_LEN + 12].copy_from_slice(&[0, 0]);
    let sum = checksum::checksum(&fragment[ethernet::HEADER_LEN..TCP_OFFSET]);
    fragment[ethernet::HEADER_LEN + 10..ethernet::HEADER_LEN + 12]
        .copy_from_slice(&sum.to_be_bytes());
    b.ingress(Instant::ZERO, &mut vec![frame, fragment, vec![1, 2, 3]]);
    let mut out = Vec::new();
    b.egress(Instant::ZERO, &mut out);
    assert_eq!(out.len(), 1);
    let reply = ethernet::Frame::new_checked(&out[0][..]).unwrap();
    let packet = ipv4::Packet::new_checked(reply.payload()).unwrap();
    assert_eq!(packet.dst_addr(), IP_A);
    let icmp_packet = icmp::Packet::new_checked(packet.payload()).unwrap();
    assert_eq!(
        IcmpRepr::parse(&icmp_packet),
        Ok(IcmpRepr::EchoReply {
            ident: 7,
            seq_no: 1,
            data: b"ping"
        })
    );
    let counters = b.counters();
    assert_eq!(counters.get(Counter::IpReasmReqds), 1);
    assert_eq!(counters.get(Counter::IcmpOutEchoReps), 1);
}

#[test]
fn many_connections_are_found_by_tuple() {
    let (mut a, mut b) = pair();
    b.listen(80, 4096).unwrap();
    let mut handles = Vec::new();
    for _ in 0..300 {
        handles.push(a.connect(SocketAddrV4::new(IP_B, 80)).unwrap());
    }
    // 64 SYNs wait for ARP; the rest are dropped and retransmitted a second later.
    pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(1500));
    assert_eq!(b.connection_count(), 300);
    assert_eq!(b.counters().get(Counter::CurrEstab), 300);
    let mut accepted = 0;
    while b.accept(80).is_some() {
        accepted += 1;
    }
    assert_eq!(accepted, 300);
    for h in &handles {
        assert_eq!(a.connection(*h).unwrap().state(), State::Established);
    }
}

#[test]
fn readiness_events_are_coalesced_per_connection() {
    let (mut a, mut b) = pair();
    b.listen(80, 16).unwrap();
    let client = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let mut now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let server = b.accept(80).unwrap();
    let mut buf = [0u8; 64];
    // Many readable/unreadable toggles without polling events.
    for _ in 0..200 {
        a.send(client, b"ping").unwrap();
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
        b.recv(server, &mut buf).unwrap();
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
    }
    let mut events = Vec::new();
    b.poll_events(&mut events);
    let for_server = events
        .iter()
        .filter(|e| matches!(e, Event::Ready(h, _) if *h == server))
        .count();
    assert!(
        for_server <= 1,
        "{for_server} events queued for one connection"
    );
}

#[test]
fn abort_resets_the_peer_and_unlisten_resets_the_unaccepted() {
    let (mut a, mut b) = pair();
    b.listen(80, 16).unwrap();
    let first = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let second = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let server = b.accept(80).unwrap();
    // Abort: the peer sees a reset; the handle is released once the RST is out.
    b.abort(server).unwrap();
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(10));
    assert_eq!(b.send(server, b"x"), Err(Error::InvalidHandle));
    assert_eq!(
        a.connection(first).unwrap().error(),
        Some(tcp::ConnectionError::Reset)
    );
    // Closing the listener resets the connection still in its accept queue.
    b.unlisten(80);
    pump(&mut a, &mut b, now, now + Duration::from_millis(10));
    assert_eq!(
        a.connection(second).unwrap().error(),
        Some(tcp::ConnectionError::Reset)
    );
    assert_eq!(b.connection_count(), 0);
    assert!(b.counters().get(Counter::OutRsts) >= 2);
}

#[test]
fn shutdown_half_closes_through_the_stack() {
    let (mut a, mut b) = pair();
    b.listen(80, 16).unwrap();
    let client = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let server = b.accept(80).unwrap();
    a.send(client, b"request").unwrap();
    a.shutdown(client).unwrap();
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(100));
    let mut buf = [0u8; 32];
    assert_eq!(b.recv(server, &mut buf).unwrap(), 7);
    assert!(b.connection(server).unwrap().is_recv_finished());
    b.send(server, b"response").unwrap();
    b.close(server).unwrap();
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(100));
    assert_eq!(a.recv(client, &mut buf).unwrap(), 8);
    assert_eq!(&buf[..8], b"response");
    a.close(client).unwrap();
    pump(&mut a, &mut b, now, now + Duration::from_secs(61));
    assert_eq!(a.connection_count() + b.connection_count(), 0);
}

#[test]
fn mss_follows_the_device_mtu() {
    let mut small = StackConfig::new(MAC_A, IP_A, 24);
    small.mtu = 1000;
    small.tcp.mss = 9000;
    let mut a = Stack::new(small, Instant::ZERO);
    let mut big = StackConfig::new(MAC_B, IP_B, 24);
    big.mtu = 9000;
    big.tcp.mss = 8960;
    big.secret = 2;
    let mut b = Stack::new(big, Instant::ZERO);
    b.listen(80, 4).unwrap();
    let client = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let server = b.accept(80).unwrap();
    assert_eq!(a.connection(client).unwrap().send_mss(), 960 - 12);
    assert_eq!(b.connection(server).unwrap().send_mss(), 960 - 12);
    let data = vec![3u8; 20_000];
    b.send(server, &data).unwrap();
    pump(&mut a, &mut b, now, now + Duration::from_millis(200));
    let mut buf = vec![0u8; 30_000];
    assert_eq!(a.recv(client, &mut buf).unwrap(), 20_000);
}

#[test]
fn data_arriving_after_a_drain_is_reported_even_between_polls() {
    // Found on real packets: readable → the application reads everything → new data
    // arrives before the next poll. Compared with the last report ("readable"), nothing
    // seemed to change and the application never heard of the new bytes.
    let (mut a, mut b) = pair();
    b.listen(80, 16).unwrap();
    let client = a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
    let mut now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let server = b.accept(80).unwrap();
    let mut events = Vec::new();
    let mut buf = [0u8; 64];
    a.send(client, b"one").unwrap();
    now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
    b.poll_events(&mut events);
    assert!(events
        .iter()
        .any(|e| matches!(e, Event::Ready(h, r) if *h == server && r.readable)));
    assert_eq!(b.recv(server, &mut buf).unwrap(), 3);
    a.send(client, b"two").unwrap();
    pump(&mut a, &mut b, now, now + Duration::from_millis(1));
    events.clear();
    b.poll_events(&mut events);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Ready(h, r) if *h == server && r.readable)),
        "no event for the second batch: {events:?}"
    );
    assert_eq!(b.recv(server, &mut buf).unwrap(), 3);
    assert_eq!(&buf[..3], b"two");
}

// ------------------------------------------------------------------ in-place socket calls

/// A connection from `a` to `b` with the given TCP configurations, established.
fn connected(
    client: tcp::Config,
    server: tcp::Config,
) -> (Stack, Stack, SocketHandle, SocketHandle, Instant) {
    let (mut a, mut b) = pair();
    b.listen_with(80, 16, server).unwrap();
    let c = a.connect_with(SocketAddrV4::new(IP_B, 80), client).unwrap();
    let now = pump(&mut a, &mut b, Instant::ZERO, Instant::from_millis(10));
    let s = b.accept(80).expect("accepted");
    (a, b, c, s, now)
}

fn small_buffers(send_buffer: usize, recv_buffer: usize) -> tcp::Config {
    tcp::Config {
        send_buffer,
        recv_buffer,
        ..tcp::Config::default()
    }
}

#[test]
fn in_place_calls_carry_a_stream_across_ring_wrap_around_and_partial_reads() {
    // Rings of 8 KiB and 4 KiB, filled in odd pieces and read 777 bytes at most per call:
    // both rings wrap many times, and the in-place slices stop where the memory ends.
    let (mut a, mut b, client, server, mut now) =
        connected(small_buffers(8192, 8192), small_buffers(8192, 4096));
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let (mut sent, mut got) = (0, Vec::new());
    let (mut send_split, mut recv_split) = (false, false);
    while got.len() < data.len() {
        loop {
            let queued = a.connection(client).unwrap().send_queue();
            let n = a
                .send_with(client, |space| {
                    send_split |= space.len() < 8192 - queued;
                    let n = space.len().min(1000).min(data.len() - sent);
                    space[..n].copy_from_slice(&data[sent..sent + n]);
                    n
                })
                .unwrap();
            if n == 0 {
                break;
            }
            sent += n;
        }
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
        loop {
            let held = b.connection(server).unwrap().recv_queue();
            let n = b
                .recv_with(server, |input| {
                    recv_split |= input.len() < held;
                    let n = input.len().min(777);
                    got.extend_from_slice(&input[..n]);
                    n
                })
                .unwrap();
            if n == 0 {
                break;
            }
        }
        now += Duration::from_millis(1);
    }
    assert_eq!(got, data);
    assert!(
        send_split,
        "the send ring never handed out a split free space"
    );
    assert!(recv_split, "the receive ring never wrapped");
}

#[test]
fn an_in_place_read_reopens_the_receive_window_exactly_as_recv() {
    // Two identical pairs (nearly) fill the server's 8 KiB window; one reads with recv, the other
    // consumes the same amounts in place: the frames that follow are identical, among
    // them the window update once the window had closed.
    let setup = || {
        let (mut a, mut b, client, server, now) =
            connected(tcp::Config::default(), small_buffers(1 << 20, 8192));
        a.send(client, &[9u8; 20_000]).unwrap();
        let now = pump(&mut a, &mut b, now, now + Duration::from_millis(5));
        assert!(
            b.connection(server).unwrap().rcv_wnd() < 1448,
            "the window closed"
        );
        (b, server, now)
    };
    let (mut copying, server, now) = setup();
    let (mut in_place, same_server, _) = setup();
    assert_eq!(server, same_server);
    let mut buf = vec![0u8; 8192];
    let mut window_updates = 0;
    let held = copying.connection(server).unwrap().recv_queue();
    for amount in [1000, 3000, held - 4000] {
        assert_eq!(copying.recv(server, &mut buf[..amount]).unwrap(), amount);
        let mut consumed = 0;
        while consumed < amount {
            let n = in_place
                .recv_with(server, |input| input.len().min(amount - consumed))
                .unwrap();
            assert!(n > 0);
            consumed += n;
        }
        assert_eq!(
            copying.connection(server).unwrap().rcv_wnd(),
            in_place.connection(server).unwrap().rcv_wnd()
        );
        let (mut from_copying, mut from_in_place) = (Vec::new(), Vec::new());
        copying.egress(now, &mut from_copying);
        in_place.egress(now, &mut from_in_place);
        assert_eq!(from_copying, from_in_place, "after reading {amount}");
        window_updates += from_in_place.len();
    }
    assert!(window_updates > 0, "the closed window was never reopened");
}

#[test]
fn a_callback_that_writes_or_consumes_nothing_changes_nothing() {
    let (mut a, mut b, client, server, now) =
        connected(tcp::Config::default(), tcp::Config::default());
    assert_eq!(a.send_with(client, |_| 0), Ok(0));
    assert_eq!(a.connection(client).unwrap().send_queue(), 0);
    let mut frames = Vec::new();
    a.egress(now, &mut frames);
    assert!(
        frames.is_empty(),
        "nothing to send: {} frames",
        frames.len()
    );
    // A count past the slice is cut to it.
    let mut room = 0;
    let n = a
        .send_with(client, |space| {
            space[..5].copy_from_slice(b"hello");
            room = space.len();
            usize::MAX
        })
        .unwrap();
    assert_eq!(n, room);
    assert_eq!(a.connection(client).unwrap().send_queue(), room);
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(50));
    assert_eq!(b.connection(server).unwrap().recv_queue(), room);
    // Consuming nothing leaves the bytes in place, still readable, seen again next time.
    let mut first = Vec::new();
    assert_eq!(
        b.recv_with(server, |input| {
            first.extend_from_slice(&input[..5]);
            0
        }),
        Ok(0)
    );
    assert_eq!(first, b"hello");
    assert_eq!(b.connection(server).unwrap().recv_queue(), room);
    assert!(b.connection(server).unwrap().is_readable());
    let mut again = Vec::new();
    let n = b
        .recv_with(server, |input| {
            again.extend_from_slice(&input[..5]);
            usize::MAX
        })
        .unwrap();
    assert_eq!(again, b"hello");
    assert_eq!(n, room);
    assert_eq!(b.connection(server).unwrap().recv_queue(), 0);
    pump(&mut a, &mut b, now, now + Duration::from_millis(50));
}

#[test]
fn in_place_calls_on_closed_sides_and_invalid_handles_call_nothing() {
    let (mut a, mut b, client, server, now) =
        connected(tcp::Config::default(), tcp::Config::default());
    let mut called = false;
    // Nothing to read: the callback is not called.
    assert_eq!(
        b.recv_with(server, |_| {
            called = true;
            1
        }),
        Ok(0)
    );
    assert_eq!(
        b.recv_send_with(server, |_, _| {
            called = true;
            (1, 1)
        }),
        Ok((0, 0))
    );
    // Our side closed: nothing more can be queued.
    a.shutdown(client).unwrap();
    assert_eq!(
        a.send_with(client, |_| {
            called = true;
            1
        }),
        Ok(0)
    );
    let now = pump(&mut a, &mut b, now, now + Duration::from_millis(50));
    // The peer's end of stream: 0 and finished.
    assert_eq!(
        b.recv_with(server, |_| {
            called = true;
            1
        }),
        Ok(0)
    );
    assert!(b.connection(server).unwrap().is_recv_finished());
    assert!(!called);
    // A released handle is invalid for every call.
    b.abort(server).unwrap();
    pump(&mut a, &mut b, now, now + Duration::from_millis(50));
    assert_eq!(
        b.send_with(server, |_| {
            called = true;
            1
        }),
        Err(Error::InvalidHandle)
    );
    assert_eq!(
        b.recv_with(server, |_| {
            called = true;
            1
        }),
        Err(Error::InvalidHandle)
    );
    assert_eq!(
        b.recv_send_with(server, |_, _| {
            called = true;
            (1, 1)
        }),
        Err(Error::InvalidHandle)
    );
    assert!(!called);
}

#[test]
fn an_echo_served_ring_to_ring_is_held_back_by_a_full_send_ring() {
    // The server echoes with one copy, receive ring to send ring; its send ring (4 KiB) is
    // smaller than the stream, so it consumes only what fits and the rest waits.
    let (mut a, mut b, client, server, mut now) =
        connected(tcp::Config::default(), small_buffers(4096, 1 << 16));
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 241) as u8).collect();
    let (mut sent, mut echoed) = (0, Vec::new());
    let mut held_back = false;
    let mut buf = vec![0u8; 65536];
    while echoed.len() < data.len() {
        sent += a.send(client, &data[sent..]).unwrap();
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
        loop {
            let (consumed, queued) = b
                .recv_send_with(server, |input, space| {
                    held_back |= space.len() < input.len();
                    let n = input.len().min(space.len());
                    space[..n].copy_from_slice(&input[..n]);
                    (n, n)
                })
                .unwrap();
            assert_eq!(consumed, queued);
            if consumed == 0 {
                break;
            }
        }
        now = pump(&mut a, &mut b, now, now + Duration::from_millis(1));
        loop {
            let n = a.recv(client, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            echoed.extend_from_slice(&buf[..n]);
        }
        now += Duration::from_millis(1);
    }
    assert_eq!(echoed, data);
    assert!(held_back, "the send ring never limited the echo");
}

#[test]
fn filling_the_send_ring_in_place_reports_writable_again_once_acked() {
    let (mut a, mut b, client, _server, now) =
        connected(small_buffers(8192, 1 << 20), tcp::Config::default());
    let mut events = Vec::new();
    a.poll_events(&mut events);
    while a.send_with(client, |space| space.len()).unwrap() > 0 {}
    assert!(!a.connection(client).unwrap().is_writable());
    pump(&mut a, &mut b, now, now + Duration::from_millis(50));
    events.clear();
    a.poll_events(&mut events);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Ready(h, r) if *h == client && r.writable)),
        "no writable event after the ring drained: {events:?}"
    );
}
