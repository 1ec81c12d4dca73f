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
