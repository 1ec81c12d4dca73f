//! ICMP echo request and reply (RFC 792).

use super::{checksum, ParseError};

/// Length of the echo header (type, code, checksum, identifier, sequence number).
pub const HEADER_LEN: usize = 8;

/// A zero-copy view of an ICMP message.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` after checking it holds a whole echo header.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, ParseError> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        Ok(Packet { buffer })
    }

    fn u16_at(&self, at: usize) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }

    /// Message type: 8 echo request, 0 echo reply (RFC 792 "Type").
    pub fn msg_type(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// Message code, 0 for echo (RFC 792 "Code").
    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// Checksum over the whole message (RFC 792 "Checksum").
    pub fn checksum(&self) -> u16 {
        self.u16_at(2)
    }

    /// Echo identifier (RFC 792 "Identifier").
    pub fn echo_ident(&self) -> u16 {
        self.u16_at(4)
    }

    /// Echo sequence number (RFC 792 "Sequence Number").
    pub fn echo_seq_no(&self) -> u16 {
        self.u16_at(6)
    }

    /// Echo data.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// Whether the checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::accumulate(0, self.buffer.as_ref())) == 0xffff
    }
}

/// A parsed ICMP echo message.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IcmpRepr<'a> {
    /// Type 8.
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data to be echoed.
        data: &'a [u8],
    },
    /// Type 0.
    EchoReply {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Echoed data.
        data: &'a [u8],
    },
}

impl<'a> IcmpRepr<'a> {
    /// Parses an echo message, verifying the checksum; other types are `Unsupported`.
    pub fn parse(packet: &Packet<&'a [u8]>) -> Result<IcmpRepr<'a>, ParseError> {
        if !packet.verify_checksum() {
            return Err(ParseError::BadChecksum);
        }
        let bytes: &'a [u8] = packet.buffer;
        let data = &bytes[HEADER_LEN..];
        match (packet.msg_type(), packet.msg_code()) {
            (8, 0) => Ok(IcmpRepr::EchoRequest {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            }),
            (0, 0) => Ok(IcmpRepr::EchoReply {
                ident: packet.echo_ident(),
                seq_no: packet.echo_seq_no(),
                data,
            }),
            _ => Err(ParseError::Unsupported),
        }
    }

    /// Length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        match self {
            IcmpRepr::EchoRequest { data, .. } | IcmpRepr::EchoReply { data, .. } => {
                HEADER_LEN + data.len()
            }
        }
    }

    /// Writes the message with its checksum into `buffer[..self.buffer_len()]`.
    pub fn emit(&self, buffer: &mut [u8]) {
        let (msg_type, ident, seq_no, data) = match *self {
            IcmpRepr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (8u8, ident, seq_no, data),
            IcmpRepr::EchoReply {
                ident,
                seq_no,
                data,
            } => (0u8, ident, seq_no, data),
        };
        buffer[0] = msg_type;
        buffer[1] = 0;
        buffer[2..4].copy_from_slice(&[0, 0]);
        buffer[4..6].copy_from_slice(&ident.to_be_bytes());
        buffer[6..8].copy_from_slice(&seq_no.to_be_bytes());
        buffer[HEADER_LEN..HEADER_LEN + data.len()].copy_from_slice(data);
        let sum = checksum::checksum(&buffer[..HEADER_LEN + data.len()]);
        buffer[2..4].copy_from_slice(&sum.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_roundtrip() {
        let repr = IcmpRepr::EchoRequest {
            ident: 1,
            seq_no: 2,
            data: b"ping",
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf);
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(IcmpRepr::parse(&packet), Ok(repr));
        let mut bad = buf.clone();
        bad[9] ^= 0xff;
        let packet = Packet::new_checked(&bad[..]).unwrap();
        assert_eq!(IcmpRepr::parse(&packet), Err(ParseError::BadChecksum));
    }
}
