//! Every parser on arbitrary bytes: no panic, and a parsed TCP segment re-emits identically
//! once canonicalised.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use userstack::wire::{
    arp, ethernet, icmp, ipv4, tcp, ArpRepr, IcmpRepr, Ipv4Repr, TcpOptions, TcpRepr,
};

const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = ethernet::Frame::new_checked(data) {
        if let Ok(packet) = ipv4::Packet::new_checked(frame.payload()) {
            let _ = Ipv4Repr::parse(&packet);
            let _ = packet.payload();
        }
        if let Ok(packet) = arp::Packet::new_checked(frame.payload()) {
            let _ = ArpRepr::parse(&packet);
        }
    }
    if let Ok(packet) = icmp::Packet::new_checked(data) {
        let _ = IcmpRepr::parse(&packet);
    }
    let _ = TcpOptions::parse(data);
    if let Ok(packet) = tcp::Packet::new_checked(data) {
        if let Ok(repr) = TcpRepr::parse_unchecked(&packet) {
            if repr.options.buffer_len() <= 40 {
                let mut first = vec![0u8; repr.buffer_len()];
                repr.emit(&mut first, SRC, DST);
                let reparsed =
                    TcpRepr::parse(&tcp::Packet::new_checked(&first[..]).unwrap(), SRC, DST)
                        .unwrap();
                assert_eq!(reparsed, repr);
                let mut second = vec![0u8; reparsed.buffer_len()];
                reparsed.emit(&mut second, SRC, DST);
                assert_eq!(first, second);
            }
        }
    }
});
