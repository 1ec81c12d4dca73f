//! IPv4 headers (RFC 791).

use super::{checksum, ParseError};
use std::net::Ipv4Addr;

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = 20;

/// IP protocol numbers this stack understands.
pub mod protocol {
    /// Internet Control Message Protocol (RFC 792).
    pub const ICMP: u8 = 1;
    /// Transmission Control Protocol (RFC 9293).
    pub const TCP: u8 = 6;
}

/// A zero-copy view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` after checking that the version is 4, the header length is sane and the
    /// total length fits in the buffer (trailing link padding is allowed).
    pub fn new_checked(buffer: T) -> Result<Packet<T>, ParseError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let packet = Packet { buffer };
        if packet.version() != 4 {
            return Err(ParseError::BadVersion);
        }
        let header_len = packet.header_len();
        if header_len < HEADER_LEN {
            return Err(ParseError::BadHeaderLength);
        }
        let total_len = usize::from(packet.total_len());
        if total_len < header_len {
            return Err(ParseError::BadLength);
        }
        if total_len > len {
            return Err(ParseError::Truncated);
        }
        Ok(packet)
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.bytes()[at], self.bytes()[at + 1]])
    }

    /// Version, 4 (RFC 791 section 3.1 "Version").
    pub fn version(&self) -> u8 {
        self.bytes()[0] >> 4
    }

    /// Header length in bytes, from the 32-bit-word IHL field (RFC 791 section 3.1 "IHL").
    pub fn header_len(&self) -> usize {
        usize::from(self.bytes()[0] & 0x0f) * 4
    }

    /// DSCP and ECN bits (RFC 791 "Type of Service", redefined by RFC 2474 and RFC 3168).
    pub fn tos(&self) -> u8 {
        self.bytes()[1]
    }

    /// Total length of header and payload (RFC 791 section 3.1 "Total Length").
    pub fn total_len(&self) -> u16 {
        self.u16_at(2)
    }

    /// Identification (RFC 791 section 3.1, RFC 6864).
    pub fn ident(&self) -> u16 {
        self.u16_at(4)
    }

    /// The Don't Fragment flag (RFC 791 section 3.1 "Flags", bit 1).
    pub fn dont_fragment(&self) -> bool {
        self.bytes()[6] & 0x40 != 0
    }

    /// The More Fragments flag (RFC 791 section 3.1 "Flags", bit 2).
    pub fn more_fragments(&self) -> bool {
        self.bytes()[6] & 0x20 != 0
    }

    /// Fragment offset in bytes (RFC 791 section 3.1 "Fragment Offset", in 8-byte units).
    pub fn fragment_offset(&self) -> u16 {
        (self.u16_at(6) & 0x1fff) * 8
    }

    /// Whether this packet is a fragment of a larger datagram.
    pub fn is_fragment(&self) -> bool {
        self.more_fragments() || self.fragment_offset() != 0
    }

    /// Time to live (RFC 791 section 3.1 "Time to Live").
    pub fn ttl(&self) -> u8 {
        self.bytes()[8]
    }

    /// Payload protocol number (RFC 791 section 3.1 "Protocol").
    pub fn protocol(&self) -> u8 {
        self.bytes()[9]
    }

    /// Header checksum (RFC 791 section 3.1 "Header Checksum").
    pub fn header_checksum(&self) -> u16 {
        self.u16_at(10)
    }

    /// Source address (RFC 791 section 3.1 "Source Address").
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = self.bytes();
        Ipv4Addr::new(b[12], b[13], b[14], b[15])
    }

    /// Destination address (RFC 791 section 3.1 "Destination Address").
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = self.bytes();
        Ipv4Addr::new(b[16], b[17], b[18], b[19])
    }

    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::accumulate(0, &self.bytes()[..self.header_len()])) == 0xffff
    }

    /// The payload, bounded by the total-length field.
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Decrements the TTL and patches the header checksum incrementally (RFC 1624), as a
    /// forwarding gateway does. Returns the new TTL.
    pub fn decrement_ttl(&mut self) -> u8 {
        let b = self.buffer.as_mut();
        let old_word = u16::from_be_bytes([b[8], b[9]]);
        b[8] = b[8].saturating_sub(1);
        let new_word = u16::from_be_bytes([b[8], b[9]]);
        let old_sum = u16::from_be_bytes([b[10], b[11]]);
        let new_sum = checksum::update(old_sum, old_word, new_word);
        b[10..12].copy_from_slice(&new_sum.to_be_bytes());
        b[8]
    }
}

/// A parsed IPv4 header without options. Options of received packets are skipped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Payload protocol.
    pub protocol: u8,
    /// Payload length in bytes.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// DSCP and ECN.
    pub tos: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_fragment: bool,
}

impl Ipv4Repr {
    /// Parses `packet`, verifying the header checksum and rejecting fragments.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Ipv4Repr, ParseError> {
        if !packet.verify_checksum() {
            return Err(ParseError::BadChecksum);
        }
        if packet.is_fragment() {
            return Err(ParseError::Fragment);
        }
        Ok(Ipv4Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            ttl: packet.ttl(),
            tos: packet.tos(),
            ident: packet.ident(),
            dont_fragment: packet.dont_fragment(),
        })
    }

    /// Writes the 20-byte header, with its checksum, into the start of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) {
        let total = (HEADER_LEN + self.payload_len) as u16;
        buffer[0] = 0x45;
        buffer[1] = self.tos;
        buffer[2..4].copy_from_slice(&total.to_be_bytes());
        buffer[4..6].copy_from_slice(&self.ident.to_be_bytes());
        buffer[6] = if self.dont_fragment { 0x40 } else { 0 };
        buffer[7] = 0;
        buffer[8] = self.ttl;
        buffer[9] = self.protocol;
        buffer[10..12].copy_from_slice(&[0, 0]);
        buffer[12..16].copy_from_slice(&self.src_addr.octets());
        buffer[16..20].copy_from_slice(&self.dst_addr.octets());
        let sum = checksum::checksum(&buffer[..HEADER_LEN]);
        buffer[10..12].copy_from_slice(&sum.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Ipv4Repr {
        Ipv4Repr {
            src_addr: Ipv4Addr::new(198, 18, 0, 1),
            dst_addr: Ipv4Addr::new(198, 18, 0, 2),
            protocol: protocol::TCP,
            payload_len: 4,
            ttl: 64,
            tos: 0,
            ident: 7,
            dont_fragment: true,
        }
    }

    #[test]
    fn roundtrip_and_checksum() {
        let mut buf = [0u8; 24];
        sample().emit(&mut buf);
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&packet), Ok(sample()));
        assert_eq!(
            packet.header_checksum(),
            checksum::checksum(&{
                let mut h = buf[..HEADER_LEN].to_vec();
                h[10] = 0;
                h[11] = 0;
                h
            })
        );
        buf[15] ^= 1;
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&packet), Err(ParseError::BadChecksum));
    }

    #[test]
    fn fragments_are_rejected() {
        let mut buf = [0u8; 24];
        let mut repr = sample();
        repr.dont_fragment = false;
        repr.emit(&mut buf);
        buf[6] |= 0x20;
        buf[10..12].copy_from_slice(&[0, 0]);
        let sum = checksum::checksum(&buf[..20]);
        buf[10..12].copy_from_slice(&sum.to_be_bytes());
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&packet), Err(ParseError::Fragment));
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        let mut buf = [0u8; 24];
        sample().emit(&mut buf);
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        assert_eq!(packet.decrement_ttl(), 63);
        assert!(packet.verify_checksum());
    }

    #[test]
    fn bad_lengths_are_rejected() {
        let mut buf = [0u8; 24];
        sample().emit(&mut buf);
        assert_eq!(
            Packet::new_checked(&buf[..22]).unwrap_err(),
            ParseError::Truncated
        );
        buf[0] = 0x44;
        assert_eq!(
            Packet::new_checked(&buf[..]).unwrap_err(),
            ParseError::BadHeaderLength
        );
        buf[0] = 0x65;
        assert_eq!(
            Packet::new_checked(&buf[..]).unwrap_err(),
            ParseError::BadVersion
        );
    }
}
