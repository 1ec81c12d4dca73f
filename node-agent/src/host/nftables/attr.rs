//! Netlink attributes as nf_tables uses them: a tree of type-length-value entries, integers in
//! network byte order, strings NUL-terminated, every entry padded to 4 bytes.
//!
//! [`Attr`] builds the tree that [`Attr::encode`] writes; [`parse`] reads a buffer back into
//! `(type, payload)` pairs without interpreting them. Parsing never panics: a truncated or
//! malformed buffer gives `None`.

/// The flag the kernel sets on (and expects of) attributes that hold attributes.
const NLA_F_NESTED: u16 = 0x8000;
/// The bits of `nla_type` that are the type (the rest are flags).
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Size of `struct nlattr`.
const HEADER: usize = 4;

/// One netlink attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attr {
    /// A 32-bit integer, big-endian.
    U32(u16, u32),
    /// A 64-bit integer, big-endian.
    U64(u16, u64),
    /// A string, written with its terminating NUL.
    Str(u16, String),
    /// Raw bytes (a key, a register value).
    Bytes(u16, Vec<u8>),
    /// Attributes inside an attribute.
    Nested(u16, Vec<Attr>),
}

impl Attr {
    /// The attribute's type.
    pub fn kind(&self) -> u16 {
        match self {
            Attr::U32(t, _)
            | Attr::U64(t, _)
            | Attr::Str(t, _)
            | Attr::Bytes(t, _)
            | Attr::Nested(t, _) => *t,
        }
    }

    /// The payload, without header or padding.
    pub fn payload(&self) -> Vec<u8> {
        match self {
            Attr::U32(_, v) => v.to_be_bytes().to_vec(),
            Attr::U64(_, v) => v.to_be_bytes().to_vec(),
            Attr::Str(_, s) => {
                let mut b = s.as_bytes().to_vec();
                b.push(0);
                b
            }
            Attr::Bytes(_, b) => b.clone(),
            Attr::Nested(_, inner) => encode_all(inner),
        }
    }

    /// Appends the attribute (header, payload, padding) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let payload = self.payload();
        let flags = if matches!(self, Attr::Nested(..)) {
            NLA_F_NESTED
        } else {
            0
        };
        let len = u16::try_from(HEADER + payload.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&(self.kind() | flags).to_ne_bytes());
        out.extend_from_slice(&payload);
        out.resize(align(out.len()), 0);
    }
}

/// The attributes, one after the other.
pub fn encode_all(attrs: &[Attr]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in attrs {
        a.encode(&mut out);
    }
    out
}

/// `n` rounded up to the netlink alignment (4).
pub fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes in `buf` as `(type, payload)`, flags stripped from the type; `None` when the
/// buffer is not a whole number of well-formed attributes.
pub fn parse(buf: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let len = usize::from(u16::from_ne_bytes([*rest.first()?, *rest.get(1)?]));
        let kind = u16::from_ne_bytes([*rest.get(2)?, *rest.get(3)?]) & NLA_TYPE_MASK;
        if len < HEADER {
            return None;
        }
        out.push((kind, rest.get(HEADER..len)?));
        rest = rest.get(align(len).min(rest.len())..)?;
    }
    Some(out)
}

/// The payload of the first attribute of type `kind`.
pub fn find<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// A big-endian 32-bit payload.
pub fn be32(payload: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(payload.try_into().ok()?))
}

/// A big-endian 64-bit payload.
pub fn be64(payload: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(payload.try_into().ok()?))
}

/// A NUL-terminated string payload.
pub fn string(payload: &[u8]) -> Option<String> {
    let text = payload.strip_suffix(&[0]).unwrap_or(payload);
    String::from_utf8(text.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_integers_big_endian_strings_with_nul_and_pads() {
        let bytes = encode_all(&[
            Attr::U32(1, 0x0102_0304),
            Attr::Str(2, "ab".into()),
            Attr::U64(3, 5),
        ]);
        assert_eq!(
            bytes,
            [
                8, 0, 1, 0, 1, 2, 3, 4, // u32
                7, 0, 2, 0, b'a', b'b', 0, 0, // "ab\0" + 1 pad byte
                12, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 5, // u64
            ]
        );
    }

    #[test]
    fn nested_attributes_carry_the_nested_flag_and_parse_back() {
        let tree = Attr::Nested(7, vec![Attr::U32(1, 9), Attr::Bytes(2, vec![0xaa])]);
        let mut bytes = Vec::new();
        tree.encode(&mut bytes);
        assert_eq!(&bytes[..4], &[20, 0, 7, 0x80]);
        let outer = parse(&bytes).expect("parses");
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, 7, "the nested flag is stripped");
        let inner = parse(outer[0].1).expect("inner parses");
        assert_eq!(find(&inner, 1).and_then(be32), Some(9));
        assert_eq!(find(&inner, 2), Some(&[0xaa][..]));
    }

    proptest::proptest! {
        /// Parsing never panics, and what parses re-encodes to the same attributes.
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Some(attrs) = parse(&bytes) {
                for (kind, payload) in attrs {
                    let _ = parse(payload);
                    let again = encode_all(&[Attr::Bytes(kind, payload.to_vec())]);
                    proptest::prop_assert_eq!(parse(&again), Some(vec![(kind, payload)]));
                }
            }
        }
    }

    #[test]
    fn malformed_buffers_do_not_parse() {
        for bad in [&[1u8][..], &[3, 0, 1, 0], &[9, 0, 1, 0, 1, 2, 3, 4]] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse(&[]), Some(vec![]));
        assert_eq!(string(b"x\0"), Some("x".into()));
        assert_eq!(be32(&[1, 2]), None);
    }
}
