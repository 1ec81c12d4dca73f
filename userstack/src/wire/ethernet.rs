//! Ethernet II frames (IEEE 802.3 clause 3.2 with the DIX EtherType).

use super::ParseError;
use core::fmt;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);

    /// Whether frames to this address reach every station.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// EtherType values this stack understands.
pub mod ethertype {
    /// Internet Protocol version 4 (RFC 894).
    pub const IPV4: u16 = 0x0800;
    /// Address Resolution Protocol (RFC 826).
    pub const ARP: u16 = 0x0806;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = 14;

/// A zero-copy view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` after checking it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, ParseError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(Frame { buffer })
    }

    /// Destination address (octets 0-5).
    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[0..6]);
        EthernetAddress(a)
    }

    /// Source address (octets 6-11).
    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[6..12]);
        EthernetAddress(a)
    }

    /// EtherType of the payload (octets 12-13).
    pub fn ethertype(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[12], b[13]])
    }

    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// The parsed Ethernet II header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src_addr: EthernetAddress,
    /// Destination MAC.
    pub dst_addr: EthernetAddress,
    /// EtherType of the payload.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses the header of `frame`.
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> EthernetRepr {
        EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) {
        buffer[0..6].copy_from_slice(&self.dst_addr.0);
        buffer[6..12].copy_from_slice(&self.src_addr.0);
        buffer[12..14].copy_from_slice(&self.ethertype.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let repr = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress::BROADCAST,
            ethertype: ethertype::ARP,
        };
        let mut buf = [0u8; 20];
        repr.emit(&mut buf);
        let frame = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&frame), repr);
        assert_eq!(frame.payload().len(), 6);
        assert_eq!(
            Frame::new_checked(&buf[..13]).unwrap_err(),
            ParseError::Truncated
        );
    }
}
