//! ARP for IPv4 over Ethernet (RFC 826).

use super::{EthernetAddress, ParseError};
use std::net::Ipv4Addr;

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;

/// A zero-copy view of an ARP packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` after checking it holds a whole Ethernet/IPv4 ARP packet.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, ParseError> {
        if buffer.as_ref().len() < PACKET_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn u16_at(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// Hardware type, 1 for Ethernet (RFC 826 "ar$hrd").
    pub fn hardware_type(&self) -> u16 {
        self.u16_at(0)
    }

    /// Protocol type, 0x0800 for IPv4 (RFC 826 "ar$pro").
    pub fn protocol_type(&self) -> u16 {
        self.u16_at(2)
    }

    /// Hardware address length (RFC 826 "ar$hln").
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[4]
    }

    /// Protocol address length (RFC 826 "ar$pln").
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[5]
    }

    /// Operation: 1 request, 2 reply (RFC 826 "ar$op").
    pub fn operation(&self) -> u16 {
        self.u16_at(6)
    }

    /// Sender hardware address (RFC 826 "ar$sha").
    pub fn sender_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[8..14]);
        EthernetAddress(a)
    }

    /// Sender protocol address (RFC 826 "ar$spa").
    pub fn sender_protocol_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[14], b[15], b[16], b[17])
    }

    /// Target hardware address (RFC 826 "ar$tha").
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0; 6];
        a.copy_from_slice(&self.buffer.as_ref()[18..24]);
        EthernetAddress(a)
    }

    /// Target protocol address (RFC 826 "ar$tpa").
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        let b = self.buffer.as_ref();
        Ipv4Addr::new(b[24], b[25], b[26], b[27])
    }
}

/// ARP operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ArpOperation {
    /// Who has `target_protocol_addr`?
    Request,
    /// `sender_protocol_addr` is at `sender_hardware_addr`.
    Reply,
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender MAC.
    pub sender_hardware_addr: EthernetAddress,
    /// Sender IPv4 address.
    pub sender_protocol_addr: Ipv4Addr,
    /// Target MAC (zero in requests).
    pub target_hardware_addr: EthernetAddress,
    /// Target IPv4 address.
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Parses `packet`, rejecting anything but Ethernet/IPv4 requests and replies.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<ArpRepr, ParseError> {
        if packet.hardware_type() != 1
            || packet.protocol_type() != super::ethertype::IPV4
            || packet.hardware_len() != 6
            || packet.protocol_len() != 4
        {
            return Err(ParseError::Unsupported);
        }
        let operation = match packet.operation() {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            _ => return Err(ParseError::Unsupported),
        };
        Ok(ArpRepr {
            operation,
            sender_hardware_addr: packet.sender_hardware_addr(),
            sender_protocol_addr: packet.sender_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// Writes the packet into the first [`PACKET_LEN`] bytes of `buffer`.
    pub fn emit(&self, buffer: &mut [u8]) {
        buffer[0..2].copy_from_slice(&1u16.to_be_bytes());
        buffer[2..4].copy_from_slice(&super::ethertype::IPV4.to_be_bytes());
        buffer[4] = 6;
        buffer[5] = 4;
        let op: u16 = match self.operation {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
        };
        buffer[6..8].copy_from_slice(&op.to_be_bytes());
        buffer[8..14].copy_from_slice(&self.sender_hardware_addr.0);
        buffer[14..18].copy_from_slice(&self.sender_protocol_addr.octets());
        buffer[18..24].copy_from_slice(&self.target_hardware_addr.0);
        buffer[24..28].copy_from_slice(&self.target_protocol_addr.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejects_other_families() {
        let repr = ArpRepr {
            operation: ArpOperation::Request,
            sender_hardware_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            sender_protocol_addr: Ipv4Addr::new(198, 18, 0, 1),
            target_hardware_addr: EthernetAddress::default(),
            target_protocol_addr: Ipv4Addr::new(198, 18, 0, 2),
        };
        let mut buf = [0u8; PACKET_LEN];
        repr.emit(&mut buf);
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&buf[..]).unwrap()),
            Ok(repr)
        );
        buf[7] = 9;
        assert_eq!(
            ArpRepr::parse(&Packet::new_checked(&buf[..]).unwrap()),
            Err(ParseError::Unsupported)
        );
    }
}
