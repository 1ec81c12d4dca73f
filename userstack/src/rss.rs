//! Receive-side scaling: the Toeplitz hash that NICs use (Microsoft's RSS specification,
//! "Verifying the RSS Hash Calculation"): for every set bit of the input, the 32-bit window
//! of the key starting at that bit is XORed into the result. The NIC then picks the queue
//! from the hash's low bits through its indirection table ([`RssTable`]).
//!
//! Pure and OS-free, so that whoever must predict a NIC's queue choice (a runtime steering
//! flows to its shards, a test checking a real NIC) takes it from here. Connections a stack
//! opens on one queue take a source port that hashes back to that queue
//! ([`RssTable::connect`]). Keys are written as hex without separators ([`to_hex`],
//! [`from_hex`]).

use crate::stack::{Error, SocketHandle, Stack};
use std::net::SocketAddrV4;

/// Microsoft's sample key (the verification suite's and many drivers' default).
pub const MICROSOFT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// The Toeplitz hash of `input` under `key` (the key must be at least 4 bytes longer than
/// the input; missing key bits count as zero).
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |i: usize| -> u64 {
        key.get(i / 8)
            .map_or(0, |byte| u64::from(byte >> (7 - i % 8) & 1))
    };
    // A 64-bit window: the top 32 bits are the key bits at the current input bit.
    let mut window: u64 = (0..64).fold(0, |w, i| w << 1 | key_bit(i));
    let mut next_key_bit = 64;
    let mut hash = 0u32;
    for &byte in input {
        for bit in (0..8).rev() {
            if byte >> bit & 1 == 1 {
                hash ^= (window >> 32) as u32;
            }
            window = window << 1 | key_bit(next_key_bit);
            next_key_bit += 1;
        }
    }
    hash
}

/// The RSS input for a TCP/IPv4 packet as the NIC receives it: source address, destination
/// address, source port, destination port, all in network order. For a flow of ours the
/// NIC's "source" is the remote end.
pub fn tcp4_input(remote: SocketAddrV4, local: SocketAddrV4) -> [u8; 12] {
    let mut input = [0u8; 12];
    input[..4].copy_from_slice(&remote.ip().octets());
    input[4..8].copy_from_slice(&local.ip().octets());
    input[8..10].copy_from_slice(&remote.port().to_be_bytes());
    input[10..].copy_from_slice(&local.port().to_be_bytes());
    input
}

/// A NIC's RSS configuration: the hash key and the indirection table (hash → queue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RssTable {
    /// The Toeplitz key.
    pub key: Vec<u8>,
    /// Queue by `hash % len`.
    pub indirection: Vec<u32>,
}

/// Entries of a configured table: the size ethtool and most drivers (virtio-net, ixgbe's
/// 82599, mlx5) use.
pub const DEFAULT_INDIRECTION_SIZE: u32 = 128;

impl RssTable {
    /// A configured table: `key`, and queues 0..`queues` spread round-robin over 128 entries
    /// (the ethtool default, `ethtool -X equal N`).
    pub fn spread(key: &[u8], queues: u32) -> RssTable {
        RssTable::spread_over(key, queues, DEFAULT_INDIRECTION_SIZE)
    }

    /// Like [`RssTable::spread`] over `entries` entries (a DPDK port's `reta_size`).
    pub fn spread_over(key: &[u8], queues: u32, entries: u32) -> RssTable {
        RssTable {
            key: key.to_vec(),
            indirection: (0..entries.max(1)).map(|i| i % queues.max(1)).collect(),
        }
    }

    /// The queue the NIC puts a TCP/IPv4 flow from `remote` to `local` on.
    pub fn queue(&self, remote: SocketAddrV4, local: SocketAddrV4) -> u32 {
        if self.indirection.is_empty() {
            return 0;
        }
        let hash = toeplitz(&self.key, &tcp4_input(remote, local));
        self.indirection[hash as usize % self.indirection.len()]
    }

    /// The first port of `ports` that a flow from `local`'s address to `remote` can use so
    /// that the replies land on `queue`, skipping ports `taken` says are in use.
    pub fn port_for_queue(
        &self,
        queue: u32,
        local: std::net::Ipv4Addr,
        remote: SocketAddrV4,
        ports: impl IntoIterator<Item = u16>,
        mut taken: impl FnMut(u16) -> bool,
    ) -> Option<u16> {
        ports.into_iter().find(|&port| {
            self.queue(remote, SocketAddrV4::new(local, port)) == queue && !taken(port)
        })
    }

    /// Opens a connection from `stack` (the shard on `queue`) to `remote`, from the first free
    /// port of the stack's ephemeral range whose replies the NIC puts on `queue`. This is how
    /// anything running on a shard opens connections (an active open through
    /// [`Stack::connect`] would take the next port whatever queue its replies land on).
    pub fn connect(
        &self,
        stack: &mut Stack,
        queue: u32,
        remote: SocketAddrV4,
    ) -> Result<SocketHandle, Error> {
        let (first, last) = stack.config().ephemeral_ports;
        let local = stack.config().ip;
        let port = self
            .port_for_queue(queue, local, remote, first..=last, |p| {
                stack.port_in_use(p, remote)
            })
            .ok_or(Error::NoPortAvailable)?;
        let tcp = stack.config().tcp;
        stack.connect_from(port, remote, tcp)
    }
}

/// `bytes` as lowercase hex without separators (the config's and the stats' spelling).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lowercase or uppercase hex without separators.
pub fn from_hex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err(format!("{text:?} is not hex bytes (odd length)"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("{text:?} is not hex bytes (at {i})"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// An address and port as the suite writes them.
    type Endpoint = (&'static str, u16);

    /// Microsoft's verification suite, IPv4 with TCP ports: (destination, source, hash).
    const VECTORS: [(Endpoint, Endpoint, u32); 5] = [
        (
            ("161.142.100.80", 1766),
            ("66.9.149.187", 2794),
            0x51cc_c178,
        ),
        (("65.69.140.83", 4739), ("199.92.111.2", 14230), 0xc626_b0ea),
        (
            ("12.22.207.184", 38024),
            ("24.19.198.95", 12898),
            0x5c2b_394a,
        ),
        (
            ("209.142.163.6", 2217),
            ("38.27.205.30", 48228),
            0xafc7_327f,
        ),
        (
            ("202.188.127.2", 1303),
            ("153.39.163.191", 44251),
            0x10e8_28a2,
        ),
    ];

    /// The same suite without ports (IPv4 only).
    const VECTORS_IP: [(&str, &str, u32); 5] = [
        ("161.142.100.80", "66.9.149.187", 0x323e_8fc2),
        ("65.69.140.83", "199.92.111.2", 0xd718_262a),
        ("12.22.207.184", "24.19.198.95", 0xd2d0_a5de),
        ("209.142.163.6", "38.27.205.30", 0x8298_9176),
        ("202.188.127.2", "153.39.163.191", 0x5d18_09c5),
    ];

    fn addr((ip, port): (&str, u16)) -> SocketAddrV4 {
        SocketAddrV4::new(ip.parse().unwrap(), port)
    }

    #[test]
    fn matches_the_microsoft_tcp_ipv4_vectors() {
        for (destination, source, hash) in VECTORS {
            let input = tcp4_input(addr(source), addr(destination));
            assert_eq!(
                toeplitz(&MICROSOFT_KEY, &input),
                hash,
                "{source:?} -> {destination:?}"
            );
        }
    }

    #[test]
    fn matches_the_microsoft_ipv4_vectors() {
        for (destination, source, hash) in VECTORS_IP {
            let source: Ipv4Addr = source.parse().unwrap();
            let destination: Ipv4Addr = destination.parse().unwrap();
            let input = [source.octets(), destination.octets()].concat();
            assert_eq!(toeplitz(&MICROSOFT_KEY, &input), hash);
        }
    }

    #[test]
    fn a_chosen_port_hashes_back_to_its_queue() {
        let table = RssTable::spread(&MICROSOFT_KEY, 4);
        let local: Ipv4Addr = "198.19.64.50".parse().unwrap();
        let remote = addr(("198.19.64.2", 80));
        for queue in 0..4 {
            let port = table
                .port_for_queue(queue, local, remote, 32768..=60999, |p| p % 2 == 0)
                .expect("a port for every queue");
            assert_eq!(port % 2, 1, "taken ports are skipped");
            assert_eq!(table.queue(remote, SocketAddrV4::new(local, port)), queue);
        }
        let single = RssTable::spread(&MICROSOFT_KEY, 1);
        assert_eq!(
            single.port_for_queue(0, local, remote, [40000], |_| false),
            Some(40000)
        );
        assert_eq!(
            single.port_for_queue(1, local, remote, 32768..=60999, |_| false),
            None
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(to_hex(&MICROSOFT_KEY[..4]), "6d5a56da");
        assert_eq!(from_hex("6d5A56da").unwrap(), MICROSOFT_KEY[..4]);
        assert_eq!(from_hex(&to_hex(&MICROSOFT_KEY)).unwrap(), MICROSOFT_KEY);
        assert!(from_hex("6d5").unwrap_err().contains("odd length"));
        assert!(from_hex("6d:5a").unwrap_err().contains("not hex"));
        assert!(from_hex("zz").unwrap_err().contains("not hex"));
        let over = RssTable::spread_over(&MICROSOFT_KEY, 3, 64);
        assert_eq!(over.indirection.len(), 64);
        assert_eq!(over.indirection[..4], [0, 1, 2, 0]);
    }

    #[test]
    fn a_stack_connects_from_a_port_whose_replies_reach_its_queue() {
        use crate::stack::StackConfig;
        use crate::time::Instant;
        use crate::wire::EthernetAddress;
        let local: Ipv4Addr = "198.19.64.50".parse().unwrap();
        let remote = addr(("198.19.64.2", 80));
        let mut stack = Stack::new(
            StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), local, 24),
            Instant::ZERO,
        );
        let table = RssTable::spread(&MICROSOFT_KEY, 4);
        for queue in [3, 3, 1] {
            let handle = table.connect(&mut stack, queue, remote).unwrap();
            let port = stack.connection(handle).unwrap().local().port();
            assert_eq!(table.queue(remote, SocketAddrV4::new(local, port)), queue);
        }
        assert_eq!(
            stack.connection_count(),
            3,
            "two opens on queue 3 took two ports"
        );
        assert!(matches!(
            RssTable::spread(&MICROSOFT_KEY, 1).connect(&mut stack, 1, remote),
            Err(Error::NoPortAvailable)
        ));
    }
}
