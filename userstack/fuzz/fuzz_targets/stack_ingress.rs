//! A stack with a listener receiving frames built from arbitrary bytes. Most frames are
//! well-formed (valid checksums, addressed to the stack) so that the fuzzer reaches the
//! listener, the SYN and accept queues and the connections; some are raw bytes. No panic,
//! bounded table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use userstack::stack::{Stack, StackConfig};
use userstack::time::Instant;
use userstack::wire::{
    ethernet, ethertype, ipv4, ArpOperation, ArpRepr, EthernetAddress, EthernetRepr, Ipv4Repr,
    SackBlocks, SeqNumber, TcpFlags, TcpOptions, TcpRepr,
};

const OUR_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
const OUR_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const PEER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);

fn u32_at(d: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([0, 1, 2, 3].map(|k| *d.get(i + k).unwrap_or(&0)))
}

fn tcp_frame(rec: &[u8], payload: &[u8]) -> Vec<u8> {
    let peer = Ipv4Addr::new(198, 18, 0, 1 + rec[1] % 4);
    let mut sack_blocks = SackBlocks::default();
    if rec[2] & 1 == 1 {
        sack_blocks.push(SeqNumber(u32_at(rec, 3)), SeqNumber(u32_at(rec, 7)));
    }
    let options = TcpOptions {
        mss: (rec[2] & 2 != 0).then_some(u16::from_le_bytes([rec[11], rec[12]])),
        window_scale: (rec[2] & 4 != 0).then_some(rec[13] % 16),
        sack_permitted: rec[2] & 8 != 0,
        timestamps: (rec[2] & 16 != 0).then(|| (u32_at(rec, 3), u32_at(rec, 7))),
        sack_blocks,
    };
    let tcp = TcpRepr {
        src_port: 40000 + u16::from(rec[14] % 8),
        dst_port: if rec[15] & 1 == 0 {
            80
        } else {
            u16::from(rec[15])
        },
        seq_number: SeqNumber(u32_at(rec, 16)),
        ack_number: SeqNumber(u32_at(rec, 20)),
        flags: TcpFlags(rec[24]),
        window_len: u16::from_le_bytes([rec[25], rec[26]]),
        urgent_pointer: 0,
        options,
        payload,
    };
    let ip = Ipv4Repr {
        src_addr: peer,
        dst_addr: OUR_IP,
        protocol: ipv4::protocol::TCP,
        payload_len: tcp.buffer_len(),
        ttl: 64,
        tos: 0,
        ident: 0,
        dont_fragment: true,
    };
    let mut frame = vec![0u8; ethernet::HEADER_LEN + ipv4::HEADER_LEN + tcp.buffer_len()];
    EthernetRepr {
        src_addr: PEER_MAC,
        dst_addr: OUR_MAC,
        ethertype: ethertype::IPV4,
    }
    .emit(&mut frame);
    ip.emit(&mut frame[ethernet::HEADER_LEN..]);
    tcp.emit(
        &mut frame[ethernet::HEADER_LEN + ipv4::HEADER_LEN..],
        peer,
        OUR_IP,
    );
    frame
}

fn arp_frame(rec: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; ethernet::HEADER_LEN + 28];
    EthernetRepr {
        src_addr: PEER_MAC,
        dst_addr: EthernetAddress::BROADCAST,
        ethertype: ethertype::ARP,
    }
    .emit(&mut frame);
    ArpRepr {
        operation: if rec[1] & 1 == 0 {
            ArpOperation::Request
        } else {
            ArpOperation::Reply
        },
        sender_hardware_addr: PEER_MAC,
        sender_protocol_addr: Ipv4Addr::new(198, 18, 0, 1 + rec[2] % 4),
        target_hardware_addr: OUR_MAC,
        target_protocol_addr: OUR_IP,
    }
    .emit(&mut frame[ethernet::HEADER_LEN..]);
    frame
}

fuzz_target!(|data: &[u8]| {
    let mut config = StackConfig::new(OUR_MAC, OUR_IP, 24);
    config.syn_backlog = 64;
    config.tcp.recv_buffer = 16 * 1024;
    config.tcp.send_buffer = 16 * 1024;
    let mut stack = Stack::new(config, Instant::ZERO);
    stack.listen(80, 16).unwrap();
    let mut out = Vec::new();
    let mut now = Instant::ZERO;
    let mut rest = data;
    let mut buf = [0u8; 4096];
    while rest.len() >= 28 {
        let (rec, tail) = rest.split_at(28);
        let len = usize::from(rec[27]).min(tail.len());
        let (payload, tail) = tail.split_at(len);
        rest = tail;
        let frame = match rec[0] % 8 {
            0 => arp_frame(rec),
            1 => payload.to_vec(),
            _ => tcp_frame(rec, payload),
        };
        now = now + core::time::Duration::from_millis(u64::from(rec[26] % 64) * 20);
        stack.ingress(now, &mut vec![frame]);
        stack.poll_timers(now);
        while let Some(h) = stack.accept(80) {
            let _ = stack.send(h, b"hello");
            if rec[25] & 1 == 1 {
                let _ = stack.close(h);
            } else {
                let _ = stack.recv(h, &mut buf);
            }
        }
        stack.egress(now, &mut out);
        out.clear();
        let mut events = Vec::new();
        stack.poll_events(&mut events);
        assert!(stack.connection_count() <= 64 + 16 + 16);
    }
    let _ = stack.counters();
});
