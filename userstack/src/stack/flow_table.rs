//! The connection table: 4-tuple to socket slot in O(1), with a keyed hash.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddrV4;

/// A connection's identity: our address and port, the peer's address and port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct FourTuple {
    /// Our side.
    pub local: SocketAddrV4,
    /// The peer's side.
    pub remote: SocketAddrV4,
}

/// A fast multiplicative hasher keyed with a per-stack secret, so that remote peers cannot
/// aim collisions at one bucket without knowing the key.
#[derive(Clone, Copy, Debug)]
pub struct KeyedHasherBuilder {
    key: u64,
}

impl KeyedHasherBuilder {
    /// A builder keyed with `key`.
    pub fn new(key: u64) -> KeyedHasherBuilder {
        KeyedHasherBuilder { key }
    }
}

/// The hasher state of [`KeyedHasherBuilder`].
#[derive(Clone, Copy, Debug)]
pub struct KeyedHasher {
    state: u64,
}

impl Hasher for KeyedHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.state = (self.state.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u16(&mut self, value: u16) {
        self.write_u64(u64::from(value));
    }

    fn write_u8(&mut self, value: u8) {
        self.write_u64(u64::from(value));
    }

    fn finish(&self) -> u64 {
        // Final avalanche (splitmix64's finaliser).
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl BuildHasher for KeyedHasherBuilder {
    type Hasher = KeyedHasher;
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { state: self.key }
    }
}

/// 4-tuple to slot index.
pub type FlowTable = HashMap<FourTuple, u32, KeyedHasherBuilder>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn lookup_by_tuple() {
        let mut table = FlowTable::with_hasher(KeyedHasherBuilder::new(42));
        for port in 0..1000u16 {
            let tuple = FourTuple {
                local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 80),
                remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), port),
            };
            table.insert(tuple, u32::from(port));
        }
        let probe = FourTuple {
            local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 80),
            remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 777),
        };
        assert_eq!(table.get(&probe), Some(&777));
    }
}
