//! What a device needs to honour TCP checksum offload on whole Ethernet frames: checking the
//! TCP checksum of a received frame the hardware did not vouch for ([`tcp_checksum`]), and
//! telling a transmitted segment whose checksum field holds only the pseudo-header sum (left
//! by [`super::tcp::fill_partial_checksum`] for the device to complete) from one whose
//! checksum is already whole ([`partial_tcp_checksum`]).
//!
//! Only unfragmented IPv4/TCP in untagged Ethernet II frames is looked at; anything else is
//! "not TCP" here and left to the stack, which checks (or drops) it itself.

use super::{checksum, ethernet, ipv4, tcp};

/// Offset of the checksum field within the TCP header (RFC 9293 section 3.1).
pub const TCP_CHECKSUM_OFFSET: usize = 16;

/// The TCP checksum of a received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpChecksum {
    /// Not an unfragmented IPv4/TCP frame, or too malformed to say: the stack decides.
    NotTcp,
    /// The checksum over the pseudo-header and segment verifies.
    Good,
    /// It does not: the frame is corrupt.
    Bad,
}

/// Where a device completes a partial TCP checksum: it sums the frame from `start` to the
/// end of the IP packet and stores the complement at `start + offset` (the layout of Linux's
/// `virtio_net_hdr` `csum_start`/`csum_offset`, and of DPDK's `l2_len + l3_len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialChecksum {
    /// Offset of the TCP header in the frame (Ethernet header plus IP header length).
    pub start: usize,
    /// Offset of the checksum field in the TCP header, [`TCP_CHECKSUM_OFFSET`].
    pub offset: usize,
    /// Length of the IP header (DPDK's `l3_len`).
    pub ip_header_len: usize,
}

/// The IPv4 packet of an unfragmented IPv4/TCP frame, with its TCP segment (bounded by the
/// IP total length, so link padding is left out).
fn ipv4_tcp(frame: &[u8]) -> Option<(ipv4::Packet<&[u8]>, &[u8])> {
    let ether = ethernet::Frame::new_checked(frame).ok()?;
    if ether.ethertype() != ethernet::ethertype::IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]).ok()?;
    if ip.protocol() != ipv4::protocol::TCP || ip.is_fragment() {
        return None;
    }
    let start = ethernet::HEADER_LEN + ip.header_len();
    let end = ethernet::HEADER_LEN + usize::from(ip.total_len());
    let segment = &frame[start..end];
    if segment.len() < tcp::HEADER_LEN {
        return None;
    }
    Some((ip, segment))
}

/// Checks the TCP checksum of an Ethernet frame, for a device that hands the stack only
/// frames whose checksums are right (the stack's `rx_checksum_offload`).
pub fn tcp_checksum(frame: &[u8]) -> TcpChecksum {
    let Some((ip, segment)) = ipv4_tcp(frame) else {
        return TcpChecksum::NotTcp;
    };
    let acc = checksum::pseudo_header(
        ip.src_addr(),
        ip.dst_addr(),
        ipv4::protocol::TCP,
        segment.len() as u16,
    );
    if checksum::fold(checksum::accumulate(acc, segment)) == 0xffff {
        TcpChecksum::Good
    } else {
        TcpChecksum::Bad
    }
}

/// Where the device must complete the TCP checksum of a frame to transmit, or `None` when
/// the frame is not IPv4/TCP or its checksum field does not hold the folded pseudo-header sum
/// (the checksum is whole already). A whole checksum that happens to equal that sum is
/// completed to the same value, so the answer is never wrong.
pub fn partial_tcp_checksum(frame: &[u8]) -> Option<PartialChecksum> {
    let (ip, segment) = ipv4_tcp(frame)?;
    let pseudo = checksum::fold(checksum::pseudo_header(
        ip.src_addr(),
        ip.dst_addr(),
        ipv4::protocol::TCP,
        segment.len() as u16,
    ));
    let field = u16::from_be_bytes([
        segment[TCP_CHECKSUM_OFFSET],
        segment[TCP_CHECKSUM_OFFSET + 1],
    ]);
    (field == pseudo).then_some(PartialChecksum {
        start: ethernet::HEADER_LEN + ip.header_len(),
        offset: TCP_CHECKSUM_OFFSET,
        ip_header_len: ip.header_len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tcp::{complete_partial_checksum, fill_partial_checksum, TcpRepr};
    use crate::wire::{EthernetAddress, EthernetRepr, Ipv4Repr};
    use std::net::Ipv4Addr;

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    /// An Ethernet/IPv4/TCP frame carrying `payload`, with a whole checksum.
    fn frame(payload: &[u8]) -> Vec<u8> {
        let repr = TcpRepr {
            src_port: 40000,
            dst_port: 80,
            payload,
            ..TcpRepr::default()
        };
        let ip_start = ethernet::HEADER_LEN;
        let tcp_start = ip_start + ipv4::HEADER_LEN;
        let mut frame = vec![0u8; tcp_start + repr.buffer_len()];
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: ethernet::ethertype::IPV4,
        }
        .emit(&mut frame);
        Ipv4Repr {
            src_addr: SRC,
            dst_addr: DST,
            protocol: ipv4::protocol::TCP,
            payload_len: repr.buffer_len(),
            ttl: 64,
            tos: 0,
            ident: 1,
            dont_fragment: true,
        }
        .emit(&mut frame[ip_start..]);
        repr.emit(&mut frame[tcp_start..], SRC, DST);
        frame
    }

    #[test]
    fn whole_checksums_verify_and_a_flipped_bit_does_not() {
        for len in [0, 1, 64, 1448] {
            let mut f = frame(&vec![0x5a; len]);
            assert_eq!(tcp_checksum(&f), TcpChecksum::Good, "len {len}");
            let last = f.len() - 1;
            f[last] ^= 0x10;
            assert_eq!(tcp_checksum(&f), TcpChecksum::Bad, "len {len}");
        }
    }

    #[test]
    fn link_padding_is_not_summed() {
        let mut f = frame(b"");
        f.extend_from_slice(&[0xee; 6]);
        assert_eq!(tcp_checksum(&f), TcpChecksum::Good);
    }

    #[test]
    fn other_frames_are_left_to_the_stack() {
        let f = frame(b"x");
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&ethernet::ethertype::ARP.to_be_bytes());
        let mut icmp = f.clone();
        icmp[ethernet::HEADER_LEN + 9] = ipv4::protocol::ICMP;
        let mut fragment = f.clone();
        fragment[ethernet::HEADER_LEN + 6] |= 0x20;
        for other in [&arp[..], &icmp, &fragment, &f[..30], &[]] {
            assert_eq!(tcp_checksum(other), TcpChecksum::NotTcp);
            assert_eq!(partial_tcp_checksum(other), None);
        }
    }

    #[test]
    fn a_partial_checksum_is_found_and_completing_it_gives_the_whole_one() {
        let whole = frame(b"offloaded");
        assert_eq!(partial_tcp_checksum(&whole), None);
        let mut partial = whole.clone();
        let start = ethernet::HEADER_LEN + ipv4::HEADER_LEN;
        fill_partial_checksum(&mut partial[start..], SRC, DST);
        assert_ne!(tcp_checksum(&partial), TcpChecksum::Good);
        assert_eq!(
            partial_tcp_checksum(&partial),
            Some(PartialChecksum {
                start,
                offset: TCP_CHECKSUM_OFFSET,
                ip_header_len: ipv4::HEADER_LEN,
            })
        );
        complete_partial_checksum(&mut partial[start..]);
        assert_eq!(partial, whole);
    }
}
