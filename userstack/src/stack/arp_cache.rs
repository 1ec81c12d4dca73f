//! The neighbour table: IPv4 to MAC, with expiry and a small queue of frames awaiting
//! resolution.

use crate::time::Instant;
use crate::wire::EthernetAddress;
use core::time::Duration;
use std::collections::HashMap;
use std::net::Ipv4Addr;

/// How long a learned entry stays valid (Linux `base_reachable_time` is 30 s; stale entries
/// are re-probed, we simply re-resolve).
pub const ENTRY_LIFETIME: Duration = Duration::from_secs(60);
/// Minimum gap between two requests for the same address.
pub const REQUEST_INTERVAL: Duration = Duration::from_secs(1);
/// Frames held while waiting for replies, over all addresses (Linux `unres_qlen` is per
/// neighbour; one bound keeps memory fixed).
pub const MAX_PENDING: usize = 64;
/// Most neighbours remembered (Linux `gc_thresh3` = 1024), so ARP floods cannot grow memory.
pub const MAX_ENTRIES: usize = 1024;

/// IPv4-to-Ethernet mappings learned from ARP.
#[derive(Debug, Default)]
pub struct ArpCache {
    entries: HashMap<Ipv4Addr, (EthernetAddress, Instant)>,
    /// The last successful lookup: nearly every frame goes to the same next hop.
    last: Option<(Ipv4Addr, EthernetAddress, Instant)>,
    last_request: HashMap<Ipv4Addr, Instant>,
    pending: Vec<(Ipv4Addr, Vec<u8>)>,
}

impl ArpCache {
    /// An empty cache.
    pub fn new() -> ArpCache {
        ArpCache::default()
    }

    /// The MAC for `ip`, if known and fresh.
    pub fn lookup(&mut self, ip: Ipv4Addr, now: Instant) -> Option<EthernetAddress> {
        if let Some((last_ip, mac, expires)) = self.last {
            if last_ip == ip && expires > now {
                return Some(mac);
            }
        }
        let (mac, expires) = *self
            .entries
            .get(&ip)
            .filter(|(_, expires)| *expires > now)?;
        self.last = Some((ip, mac, expires));
        Some(mac)
    }

    /// Learns `ip` is at `mac`; returns frames that were waiting for it.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: EthernetAddress, now: Instant) -> Vec<Vec<u8>> {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&ip) {
            self.entries.retain(|_, (_, expires)| *expires > now);
        }
        if self.entries.len() < MAX_ENTRIES || self.entries.contains_key(&ip) {
            self.entries.insert(ip, (mac, now + ENTRY_LIFETIME));
        }
        self.last = None;
        self.last_request.remove(&ip);
        // In the order held, as Linux's neighbour queue: a burst of SYNs leaves in the order
        // its connections were opened.
        let mut ready = Vec::new();
        self.pending.retain_mut(|(to, frame)| {
            if *to == ip {
                ready.push(std::mem::take(frame));
            }
            *to != ip
        });
        ready
    }

    /// Holds `frame` until `ip` resolves; returns false (frame dropped) when the queue is full.
    pub fn hold(&mut self, ip: Ipv4Addr, frame: Vec<u8>) -> bool {
        if self.pending.len() >= MAX_PENDING {
            return false;
        }
        self.pending.push((ip, frame));
        true
    }

    /// Whether a request for `ip` should go out now (rate-limited per address).
    pub fn should_request(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        match self.last_request.get(&ip) {
            Some(&at) if now - at < REQUEST_INTERVAL => false,
            _ => {
                self.last_request.insert(ip, now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_bounded() {
        let mut cache = ArpCache::new();
        for i in 0..5000u32 {
            cache.learn(
                Ipv4Addr::from(0x0a00_0000 + i),
                EthernetAddress::default(),
                Instant::ZERO,
            );
        }
        assert_eq!(cache.entries.len(), MAX_ENTRIES);
        // Once entries expire they make room again.
        cache.learn(
            Ipv4Addr::new(192, 0, 2, 1),
            EthernetAddress::default(),
            Instant::ZERO + ENTRY_LIFETIME,
        );
        assert_eq!(cache.entries.len(), 1);
    }

    #[test]
    fn learn_expire_and_flush_pending() {
        let mut cache = ArpCache::new();
        let ip = Ipv4Addr::new(198, 18, 0, 9);
        let mac = EthernetAddress([2, 0, 0, 0, 0, 9]);
        assert!(cache.should_request(ip, Instant::ZERO));
        assert!(!cache.should_request(ip, Instant::from_millis(10)));
        assert!(cache.hold(ip, vec![1, 2, 3]));
        let ready = cache.learn(ip, mac, Instant::ZERO);
        assert_eq!(ready, vec![vec![1, 2, 3]]);
        assert_eq!(cache.lookup(ip, Instant::from_millis(5)), Some(mac));
        assert_eq!(cache.lookup(ip, Instant::ZERO + ENTRY_LIFETIME), None);
    }

    #[test]
    fn held_frames_leave_in_the_order_they_were_held() {
        let mut cache = ArpCache::new();
        let (gateway, other) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        for frame in 0..5u8 {
            assert!(cache.hold(gateway, vec![frame]));
            assert!(cache.hold(other, vec![100 + frame]));
        }
        let ready = cache.learn(gateway, EthernetAddress([2, 0, 0, 0, 0, 1]), Instant::ZERO);
        assert_eq!(ready, (0..5u8).map(|f| vec![f]).collect::<Vec<_>>());
        let ready = cache.learn(other, EthernetAddress([2, 0, 0, 0, 0, 2]), Instant::ZERO);
        assert_eq!(ready, (100..105u8).map(|f| vec![f]).collect::<Vec<_>>());
    }
}
