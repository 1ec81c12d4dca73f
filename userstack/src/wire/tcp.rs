//! TCP segments (RFC 9293 section 3.1) and their options (RFC 9293 3.2, RFC 7323, RFC 2018).

use super::{checksum, ParseError};
use core::cmp::Ordering;
use core::fmt;
use core::ops::{Add, Sub};
use std::net::Ipv4Addr;

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = 20;
/// Largest TCP header: the data offset field counts at most 15 words.
pub const MAX_HEADER_LEN: usize = 60;

/// A 32-bit sequence number compared modulo 2^32 (RFC 9293 section 3.4).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SeqNumber(pub u32);

impl SeqNumber {
    /// The later of two sequence numbers.
    pub fn max(self, other: SeqNumber) -> SeqNumber {
        if self > other {
            self
        } else {
            other
        }
    }

    /// The earlier of two sequence numbers.
    pub fn min(self, other: SeqNumber) -> SeqNumber {
        if self < other {
            self
        } else {
            other
        }
    }

    /// Bytes from `earlier` to `self`; zero if `earlier` is later.
    pub fn distance_from(self, earlier: SeqNumber) -> u32 {
        let d = self.0.wrapping_sub(earlier.0);
        if (d as i32) < 0 {
            0
        } else {
            d
        }
    }
}

impl fmt::Debug for SeqNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Add<u32> for SeqNumber {
    type Output = SeqNumber;
    fn add(self, rhs: u32) -> SeqNumber {
        SeqNumber(self.0.wrapping_add(rhs))
    }
}

impl Sub<u32> for SeqNumber {
    type Output = SeqNumber;
    fn sub(self, rhs: u32) -> SeqNumber {
        SeqNumber(self.0.wrapping_sub(rhs))
    }
}

impl PartialOrd for SeqNumber {
    fn partial_cmp(&self, other: &SeqNumber) -> Option<Ordering> {
        Some((self.0.wrapping_sub(other.0) as i32).cmp(&0))
    }
}

/// The control bits (RFC 9293 section 3.1 "Control Bits").
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No more data from sender.
    pub const FIN: u8 = 0x01;
    /// Synchronize sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push function.
    pub const PSH: u8 = 0x08;
    /// Acknowledgment field is significant.
    pub const ACK: u8 = 0x10;
    /// Urgent pointer field is significant.
    pub const URG: u8 = 0x20;
    /// ECN-Echo (RFC 3168).
    pub const ECE: u8 = 0x40;
    /// Congestion Window Reduced (RFC 3168).
    pub const CWR: u8 = 0x80;

    /// Whether every bit of `bits` is set.
    pub fn has(self, bits: u8) -> bool {
        self.0 & bits == bits
    }
    /// FIN bit.
    pub fn fin(self) -> bool {
        self.has(Self::FIN)
    }
    /// SYN bit.
    pub fn syn(self) -> bool {
        self.has(Self::SYN)
    }
    /// RST bit.
    pub fn rst(self) -> bool {
        self.has(Self::RST)
    }
    /// ACK bit.
    pub fn ack(self) -> bool {
        self.has(Self::ACK)
    }
}

impl fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = ["FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"];
        let mut first = true;
        for (bit, name) in names.iter().enumerate() {
            if self.0 & (1 << bit) != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// Option kinds (IANA "TCP Option Kind Numbers").
pub mod option_kind {
    /// End of option list (RFC 9293 3.2).
    pub const END: u8 = 0;
    /// No-operation (RFC 9293 3.2).
    pub const NOP: u8 = 1;
    /// Maximum segment size (RFC 9293 3.2).
    pub const MSS: u8 = 2;
    /// Window scale (RFC 7323 section 2).
    pub const WINDOW_SCALE: u8 = 3;
    /// SACK permitted (RFC 2018 section 2).
    pub const SACK_PERMITTED: u8 = 4;
    /// SACK blocks (RFC 2018 section 3).
    pub const SACK: u8 = 5;
    /// Timestamps (RFC 7323 section 3).
    pub const TIMESTAMPS: u8 = 8;
}

/// Up to four SACK blocks (RFC 2018 section 3), left edge inclusive, right edge exclusive.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct SackBlocks {
    blocks: [(SeqNumber, SeqNumber); 4],
    len: u8,
}

impl SackBlocks {
    /// The most blocks an option can carry (40 option bytes).
    pub const CAPACITY: usize = 4;

    /// Appends a block; returns false when full.
    pub fn push(&mut self, left: SeqNumber, right: SeqNumber) -> bool {
        if usize::from(self.len) == Self::CAPACITY {
            return false;
        }
        self.blocks[usize::from(self.len)] = (left, right);
        self.len += 1;
        true
    }

    /// The blocks in wire order.
    pub fn as_slice(&self) -> &[(SeqNumber, SeqNumber)] {
        &self.blocks[..usize::from(self.len)]
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops blocks beyond the first `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len as u8);
    }
}

/// The TCP options this stack reads and writes; unknown options are skipped when parsing.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct TcpOptions {
    /// Maximum segment size (RFC 9293 3.7.1), SYN only.
    pub mss: Option<u16>,
    /// Window scale shift count (RFC 7323 section 2.2), SYN only.
    pub window_scale: Option<u8>,
    /// SACK permitted (RFC 2018 section 2), SYN only.
    pub sack_permitted: bool,
    /// SACK blocks (RFC 2018 section 3); D-SACK (RFC 2883) puts the duplicate first.
    pub sack_blocks: SackBlocks,
    /// TSval and TSecr (RFC 7323 section 3.2).
    pub timestamps: Option<(u32, u32)>,
}

impl TcpOptions {
    /// Parses an option list, skipping NOPs and unknown kinds and stopping at EOL.
    pub fn parse(mut data: &[u8]) -> Result<TcpOptions, ParseError> {
        let mut options = TcpOptions::default();
        while let Some(&kind) = data.first() {
            match kind {
                option_kind::END => break,
                option_kind::NOP => {
                    data = &data[1..];
                    continue;
                }
                _ => {}
            }
            let len = usize::from(*data.get(1).ok_or(ParseError::BadOption)?);
            if len < 2 || len > data.len() {
                return Err(ParseError::BadOption);
            }
            let body = &data[2..len];
            match (kind, len) {
                (option_kind::MSS, 4) => options.mss = Some(u16::from_be_bytes([body[0], body[1]])),
                (option_kind::WINDOW_SCALE, 3) => options.window_scale = Some(body[0]),
                (option_kind::SACK_PERMITTED, 2) => options.sack_permitted = true,
                (option_kind::SACK, _) if (len - 2) % 8 == 0 && len > 2 => {
                    for block in body.chunks_exact(8) {
                        let left = u32::from_be_bytes([block[0], block[1], block[2], block[3]]);
                        let right = u32::from_be_bytes([block[4], block[5], block[6], block[7]]);
                        options.sack_blocks.push(SeqNumber(left), SeqNumber(right));
                    }
                }
                (option_kind::TIMESTAMPS, 10) => {
                    let tsval = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                    let tsecr = u32::from_be_bytes([body[4], body[5], body[6], body[7]]);
                    options.timestamps = Some((tsval, tsecr));
                }
                (option_kind::MSS | option_kind::WINDOW_SCALE, _)
                | (option_kind::SACK_PERMITTED | option_kind::SACK, _)
                | (option_kind::TIMESTAMPS, _) => return Err(ParseError::BadOption),
                _ => {}
            }
            data = &data[len..];
        }
        Ok(options)
    }

    /// Length of the options as [`TcpOptions::emit`] lays them out (always a multiple of 4).
    pub fn buffer_len(&self) -> usize {
        let mut len = 0;
        if self.mss.is_some() {
            len += 4;
        }
        if self.timestamps.is_some() {
            len += 12;
        } else if self.sack_permitted {
            len += 4;
        }
        if self.window_scale.is_some() {
            len += 4;
        }
        if !self.sack_blocks.is_empty() {
            len += 4 + 8 * self.sack_blocks.len();
        }
        len
    }

    /// Writes the options in Linux's layout: MSS, SACK-permitted + timestamps, NOP + window
    /// scale, NOP NOP + SACK blocks. `buffer` must be at least [`TcpOptions::buffer_len`] long.
    pub fn emit(&self, buffer: &mut [u8]) -> usize {
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            buffer[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        if let Some(mss) = self.mss {
            put(&[option_kind::MSS, 4]);
            put(&mss.to_be_bytes());
        }
        match (self.sack_permitted, self.timestamps) {
            (true, Some(_)) => put(&[option_kind::SACK_PERMITTED, 2]),
            (false, Some(_)) => put(&[option_kind::NOP, option_kind::NOP]),
            (true, None) => put(&[
                option_kind::NOP,
                option_kind::NOP,
                option_kind::SACK_PERMITTED,
                2,
            ]),
            (false, None) => {}
        }
        if let Some((tsval, tsecr)) = self.timestamps {
            put(&[option_kind::TIMESTAMPS, 10]);
            put(&tsval.to_be_bytes());
            put(&tsecr.to_be_bytes());
        }
        if let Some(shift) = self.window_scale {
            put(&[option_kind::NOP, option_kind::WINDOW_SCALE, 3, shift]);
        }
        if !self.sack_blocks.is_empty() {
            let len = 2 + 8 * self.sack_blocks.len() as u8;
            put(&[option_kind::NOP, option_kind::NOP, option_kind::SACK, len]);
            for (left, right) in self.sack_blocks.as_slice() {
                put(&left.0.to_be_bytes());
                put(&right.0.to_be_bytes());
            }
        }
        at
    }
}

/// A zero-copy view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` after checking the data offset lies within it.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, ParseError> {
        let len = buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        let packet = Packet { buffer };
        let header_len = packet.header_len();
        if header_len < HEADER_LEN {
            return Err(ParseError::BadHeaderLength);
        }
        if header_len > len {
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

    fn u32_at(&self, at: usize) -> u32 {
        let b = self.bytes();
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Source port (RFC 9293 section 3.1 "Source Port").
    pub fn src_port(&self) -> u16 {
        self.u16_at(0)
    }

    /// Destination port (RFC 9293 section 3.1 "Destination Port").
    pub fn dst_port(&self) -> u16 {
        self.u16_at(2)
    }

    /// Sequence number (RFC 9293 section 3.1 "Sequence Number").
    pub fn seq_number(&self) -> SeqNumber {
        SeqNumber(self.u32_at(4))
    }

    /// Acknowledgment number (RFC 9293 section 3.1 "Acknowledgment Number").
    pub fn ack_number(&self) -> SeqNumber {
        SeqNumber(self.u32_at(8))
    }

    /// Header length in bytes from the data offset (RFC 9293 section 3.1 "Data Offset").
    pub fn header_len(&self) -> usize {
        usize::from(self.bytes()[12] >> 4) * 4
    }

    /// Control bits (RFC 9293 section 3.1 "Control Bits").
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.bytes()[13])
    }

    /// Unscaled window (RFC 9293 section 3.1 "Window"; scaled per RFC 7323 section 2.3).
    pub fn window_len(&self) -> u16 {
        self.u16_at(14)
    }

    /// Checksum (RFC 9293 section 3.1 "Checksum").
    pub fn checksum(&self) -> u16 {
        self.u16_at(16)
    }

    /// Urgent pointer (RFC 9293 section 3.1 "Urgent Pointer").
    pub fn urgent_pointer(&self) -> u16 {
        self.u16_at(18)
    }

    /// Raw option bytes (RFC 9293 section 3.1 "Options").
    pub fn options(&self) -> &[u8] {
        &self.bytes()[HEADER_LEN..self.header_len()]
    }

    /// Segment data after the header.
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[self.header_len()..]
    }

    /// Whether the checksum over the pseudo-header and segment verifies.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let len = self.bytes().len() as u16;
        let acc = checksum::pseudo_header(src, dst, super::ipv4::protocol::TCP, len);
        checksum::fold(checksum::accumulate(acc, self.bytes())) == 0xffff
    }
}

/// A parsed TCP segment header plus a borrowed payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// SEG.SEQ.
    pub seq_number: SeqNumber,
    /// SEG.ACK (meaningful when the ACK flag is set).
    pub ack_number: SeqNumber,
    /// Control bits.
    pub flags: TcpFlags,
    /// SEG.WND as carried on the wire, before window scaling.
    pub window_len: u16,
    /// Urgent pointer (carried but not acted upon).
    pub urgent_pointer: u16,
    /// Options.
    pub options: TcpOptions,
    /// Segment data.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Parses `packet`, verifying the checksum against the IPv4 pseudo-header.
    pub fn parse(
        packet: &Packet<&'a [u8]>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<TcpRepr<'a>, ParseError> {
        if !packet.verify_checksum(src, dst) {
            return Err(ParseError::BadChecksum);
        }
        Self::parse_unchecked(packet)
    }

    /// Parses `packet` without checking the checksum (the NIC or the caller has).
    pub fn parse_unchecked(packet: &Packet<&'a [u8]>) -> Result<TcpRepr<'a>, ParseError> {
        let bytes: &'a [u8] = packet.buffer;
        Ok(TcpRepr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            seq_number: packet.seq_number(),
            ack_number: packet.ack_number(),
            flags: packet.flags(),
            window_len: packet.window_len(),
            urgent_pointer: packet.urgent_pointer(),
            options: TcpOptions::parse(packet.options())?,
            payload: &bytes[packet.header_len()..],
        })
    }

    /// Header length as emitted.
    pub fn header_len(&self) -> usize {
        HEADER_LEN + self.options.buffer_len()
    }

    /// Total emitted length.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len()
    }

    /// SEG.LEN: payload plus one for each of SYN and FIN (RFC 9293 section 3.4).
    pub fn segment_len(&self) -> u32 {
        self.payload.len() as u32 + u32::from(self.flags.syn()) + u32::from(self.flags.fin())
    }

    /// Writes header and payload into `buffer[..self.buffer_len()]` and fills in the checksum.
    pub fn emit(&self, buffer: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
        let header_len = self.header_len();
        emit_header(self, buffer);
        buffer[header_len..header_len + self.payload.len()].copy_from_slice(self.payload);
        fill_checksum(&mut buffer[..header_len + self.payload.len()], src, dst);
    }
}

/// Writes the header of `repr` (not its payload, not the checksum) into `buffer`; returns the
/// header length. Used when the payload is already in place.
pub fn emit_header(repr: &TcpRepr<'_>, buffer: &mut [u8]) -> usize {
    let header_len = repr.header_len();
    buffer[0..2].copy_from_slice(&repr.src_port.to_be_bytes());
    buffer[2..4].copy_from_slice(&repr.dst_port.to_be_bytes());
    buffer[4..8].copy_from_slice(&repr.seq_number.0.to_be_bytes());
    buffer[8..12].copy_from_slice(&repr.ack_number.0.to_be_bytes());
    buffer[12] = ((header_len / 4) as u8) << 4;
    buffer[13] = repr.flags.0;
    buffer[14..16].copy_from_slice(&repr.window_len.to_be_bytes());
    buffer[16..18].copy_from_slice(&[0, 0]);
    buffer[18..20].copy_from_slice(&repr.urgent_pointer.to_be_bytes());
    repr.options.emit(&mut buffer[HEADER_LEN..header_len]);
    header_len
}

/// Stores only the folded pseudo-header sum in the checksum field, for a device that
/// completes the checksum over the segment (checksum offload, Linux CHECKSUM_PARTIAL).
pub fn fill_partial_checksum(segment: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    let acc = checksum::pseudo_header(src, dst, super::ipv4::protocol::TCP, segment.len() as u16);
    segment[16..18].copy_from_slice(&checksum::fold(acc).to_be_bytes());
}

/// Completes a checksum started by [`fill_partial_checksum`], as an offloading NIC does.
pub fn complete_partial_checksum(segment: &mut [u8]) {
    let sum = !checksum::fold(checksum::accumulate(0, segment));
    segment[16..18].copy_from_slice(&sum.to_be_bytes());
}

/// Computes and stores the checksum of the whole segment in `segment`.
pub fn fill_checksum(segment: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    segment[16..18].copy_from_slice(&[0, 0]);
    let acc = checksum::pseudo_header(src, dst, super::ipv4::protocol::TCP, segment.len() as u16);
    let sum = !checksum::fold(checksum::accumulate(acc, segment));
    segment[16..18].copy_from_slice(&sum.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    #[test]
    fn partial_checksum_completed_by_the_device_verifies() {
        let repr = TcpRepr {
            src_port: 1,
            dst_port: 2,
            payload: b"offloaded",
            ..TcpRepr::default()
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, SRC, DST);
        let full = buf.clone();
        fill_partial_checksum(&mut buf, SRC, DST);
        complete_partial_checksum(&mut buf);
        assert_eq!(buf, full);
    }

    #[test]
    fn sequence_numbers_wrap() {
        assert!(SeqNumber(u32::MAX) < SeqNumber(1));
        assert_eq!(SeqNumber(2).distance_from(SeqNumber(u32::MAX)), 3);
        assert_eq!(SeqNumber(u32::MAX).distance_from(SeqNumber(2)), 0);
    }

    #[test]
    fn syn_options_use_linux_layout() {
        let options = TcpOptions {
            mss: Some(1460),
            window_scale: Some(7),
            sack_permitted: true,
            timestamps: Some((1, 0)),
            ..TcpOptions::default()
        };
        let mut buf = [0u8; 40];
        let len = options.emit(&mut buf);
        assert_eq!(len, 20);
        assert_eq!(&buf[..4], &[2, 4, 0x05, 0xb4]);
        assert_eq!(&buf[4..6], &[4, 2]);
        assert_eq!(&buf[6..8], &[8, 10]);
        assert_eq!(&buf[16..20], &[1, 3, 3, 7]);
        assert_eq!(TcpOptions::parse(&buf[..len]), Ok(options));
    }

    #[test]
    fn unknown_options_are_skipped_and_bad_lengths_rejected() {
        let data = [1, 1, 30, 4, 0xaa, 0xbb, 2, 4, 0x05, 0xb4, 0, 9, 9];
        let options = TcpOptions::parse(&data).unwrap();
        assert_eq!(options.mss, Some(1460));
        assert_eq!(TcpOptions::parse(&[2, 4, 5]), Err(ParseError::BadOption));
        assert_eq!(TcpOptions::parse(&[30, 1]), Err(ParseError::BadOption));
        assert_eq!(TcpOptions::parse(&[2, 3, 0]), Err(ParseError::BadOption));
        assert_eq!(
            TcpOptions::parse(&[5, 6, 0, 0, 0, 0]),
            Err(ParseError::BadOption)
        );
    }

    #[test]
    fn segment_roundtrip_with_sack_blocks() {
        let mut blocks = SackBlocks::default();
        blocks.push(SeqNumber(100), SeqNumber(200));
        blocks.push(SeqNumber(300), SeqNumber(400));
        let repr = TcpRepr {
            src_port: 1234,
            dst_port: 80,
            seq_number: SeqNumber(7),
            ack_number: SeqNumber(9),
            flags: TcpFlags(TcpFlags::ACK | TcpFlags::PSH),
            window_len: 512,
            urgent_pointer: 0,
            options: TcpOptions {
                timestamps: Some((5, 6)),
                sack_blocks: blocks,
                ..TcpOptions::default()
            },
            payload: b"hello",
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf, SRC, DST);
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(TcpRepr::parse(&packet, SRC, DST), Ok(repr));
        assert_eq!(
            TcpRepr::parse(&packet, DST, DST),
            Err(ParseError::BadChecksum)
        );
    }
}
