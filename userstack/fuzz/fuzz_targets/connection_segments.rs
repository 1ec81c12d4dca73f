//! An established connection fed arbitrary segments and timer expiries: no panic, bounded
//! memory.
#![no_main]

use core::time::Duration;
use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, SocketAddrV4};
use userstack::tcp::{Config, Connection};
use userstack::time::Instant;
use userstack::wire::tcp::Packet;
use userstack::wire::{SackBlocks, SeqNumber, TcpFlags, TcpOptions, TcpRepr};

const A: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000);
const B: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 80);

fn u32_at(d: &[u8], i: usize) -> u32 {
    let mut b = [0u8; 4];
    for (k, slot) in b.iter_mut().enumerate() {
        *slot = *d.get(i + k).unwrap_or(&0);
    }
    u32::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let config = Config {
        recv_buffer: 32 * 1024,
        send_buffer: 32 * 1024,
        ..Config::default()
    };
    let mut client = Connection::connect(config, A, B, SeqNumber(1000), 1, Instant::ZERO);
    let mut buf = vec![0u8; 2048];
    let n = client.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let syn = buf[..n].to_vec();
    let syn = TcpRepr::parse(&Packet::new_checked(&syn[..]).unwrap(), *A.ip(), *B.ip()).unwrap();
    let mut server = Connection::accept(config, B, A, SeqNumber(5000), 2, Instant::ZERO, &syn);
    let base = server.rcv_nxt();
    server.send(&[1u8; 20_000]);
    let mut now = Instant::ZERO;
    // Each record: 24 bytes of header fields, then a payload length byte and payload.
    let mut rest = data;
    while rest.len() >= 24 {
        let (head, tail) = rest.split_at(24);
        let payload_len =
            usize::from(*tail.first().unwrap_or(&0)).min(tail.len().saturating_sub(1));
        let payload = &tail[1.min(tail.len())..1.min(tail.len()) + payload_len];
        rest = &tail[(1 + payload_len).min(tail.len())..];
        let steer = head[0] & 1 == 1;
        let seq = if steer {
            base + (u32_at(head, 1) % 70_000)
        } else {
            SeqNumber(u32_at(head, 1))
        };
        let ack = if steer {
            SeqNumber(5001 + u32_at(head, 5) % 30_000)
        } else {
            SeqNumber(u32_at(head, 5))
        };
        let mut blocks = SackBlocks::default();
        for k in 0..usize::from(head[9] % 4) {
            let l = u32_at(head, 10 + k);
            blocks.push(
                SeqNumber(5001 + l % 30_000),
                SeqNumber(5001 + l % 30_000 + u32::from(head[13 + k])),
            );
        }
        let repr = TcpRepr {
            src_port: A.port(),
            dst_port: B.port(),
            seq_number: seq,
            ack_number: ack,
            flags: TcpFlags(head[17]),
            window_len: u16::from_le_bytes([head[18], head[19]]),
            urgent_pointer: 0,
            options: TcpOptions {
                timestamps: (head[20] & 1 == 1).then(|| (u32_at(head, 20), u32_at(head, 1))),
                sack_blocks: blocks,
                ..TcpOptions::default()
            },
            payload,
        };
        now += Duration::from_micros(u64::from(head[22]) * 100);
        server.handle_segment(now, &repr);
        if head[23] & 3 == 0 {
            if let Some(deadline) = server.poll_timeout() {
                now = now.max(deadline);
                server.handle_timeout(now);
            }
        }
        let mut emitted = 0;
        while server.poll_transmit(now, &mut buf).is_some() {
            emitted += 1;
            assert!(emitted < 10_000, "transmitter does not settle");
        }
        let mut read = [0u8; 4096];
        while server.recv(&mut read) > 0 {}
        assert!(server.memory_footprint() < 2 * 32 * 1024 + 128 * 1024);
    }
});
