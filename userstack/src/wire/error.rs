//! Why a packet was rejected.

use core::fmt;

/// The reason a buffer could not be parsed as the expected packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ParseError {
    /// The buffer is shorter than the header, or than a length field says.
    Truncated,
    /// A version field has a value this stack does not speak.
    BadVersion,
    /// A header-length field is smaller than the minimum header.
    BadHeaderLength,
    /// A total-length field disagrees with the buffer.
    BadLength,
    /// The checksum does not verify.
    BadChecksum,
    /// The IPv4 packet is a fragment; fragments are dropped and counted, never reassembled.
    Fragment,
    /// A TCP option has an impossible length.
    BadOption,
    /// A field combination that is well-formed but not supported (e.g. an ARP for another
    /// protocol family, an ICMP type other than echo).
    Unsupported,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            ParseError::Truncated => "truncated packet",
            ParseError::BadVersion => "unsupported version",
            ParseError::BadHeaderLength => "bad header length",
            ParseError::BadLength => "length field disagrees with buffer",
            ParseError::BadChecksum => "bad checksum",
            ParseError::Fragment => "IPv4 fragment",
            ParseError::BadOption => "malformed option",
            ParseError::Unsupported => "unsupported packet",
        };
        f.write_str(text)
    }
}

impl std::error::Error for ParseError {}
