//! A stack with a listener receiving arbitrary frames: no panic, bounded table.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use userstack::stack::{Stack, StackConfig};
use userstack::time::Instant;
use userstack::wire::EthernetAddress;

fuzz_target!(|data: &[u8]| {
    let mut config = StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 2]), Ipv4Addr::new(198, 18, 0, 2), 24);
    config.syn_backlog = 64;
    let mut stack = Stack::new(config, Instant::ZERO);
    stack.listen(80, 16).unwrap();
    let mut out = Vec::new();
    for (i, chunk) in data.split(|&b| b == 0xff).enumerate() {
        let mut frames = vec![chunk.to_vec()];
        let now = Instant::from_millis(i as u64 * 50);
        stack.ingress(now, &mut frames);
        stack.poll_timers(now);
        stack.egress(now, &mut out);
        out.clear();
        assert!(stack.connection_count() <= 64 + 16);
    }
});
