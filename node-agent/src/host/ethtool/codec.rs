//! The ethtool generic-netlink messages of the ethtool port, as a thin layer over
//! netlink-packet-core's attribute types and netlink-packet-generic's family trait.
//!
//! The `ethtool` crate of the same family reads channels, rings and features but cannot set
//! features or rings (its bitset encoder is `todo!()`), and it needs an async runtime; so the
//! agent encodes the few messages it needs here, from the kernel's uAPI
//! (`include/uapi/linux/ethtool_netlink.h`):
//!
//! - `CHANNELS_GET`/`CHANNELS_SET`: `ETHTOOL_A_CHANNELS_{RX,TX,OTHER,COMBINED}_{MAX,COUNT}`.
//! - `RINGS_GET`/`RINGS_SET`: `ETHTOOL_A_RINGS_{RX,TX}[_MAX]`.
//! - `FEATURES_GET`/`FEATURES_SET`: the `HW` (changeable), `WANTED` and `ACTIVE` bitsets, in the
//!   verbose form that names every bit; a SET sends `WANTED` with a mask of the named bits only.
//! - `STRSET_GET` of `ETH_SS_FEATURES`: every feature name this kernel knows, so that a name can
//!   be told unknown from fixed.
//! - `RSS_GET` (Linux 6.2 and later; [`super::rxfh`] reads the same through the ioctl on older
//!   kernels): the hash function (`ETHTOOL_A_RSS_HFUNC`, a bitmap of `ETH_RSS_HASH_*`), the
//!   indirection table (`ETHTOOL_A_RSS_INDIR`, binary: u32 queue numbers in host order) and the
//!   hash key (`ETHTOOL_A_RSS_HKEY`, binary) of the default context.
//!
//! Every message starts with `ETHTOOL_A_*_HEADER` (attribute 1): the device name and flags.

use std::collections::{BTreeMap, BTreeSet};

use netlink_packet_core::{
    parse_string, parse_u32, DecodeError, Emitable, Nla, NlaBuffer, NlasIterator,
    ParseableParametrized, NLA_F_NESTED, NLA_TYPE_MASK,
};
use netlink_packet_generic::{GenlFamily, GenlHeader};

use super::{ChannelCounts, ChannelInfo, Features, RingInfo, RingSizes};

/// The generic-netlink family name.
pub const FAMILY: &str = "ethtool";
/// `ETHTOOL_GENL_VERSION`.
const VERSION: u8 = 1;

/// Ethtool commands (`ETHTOOL_MSG_*`, user to kernel, and the kernel's replies).
pub mod cmd {
    /// `ETHTOOL_MSG_STRSET_GET` (its reply has the same number).
    pub const STRSET_GET: u8 = 1;
    /// `ETHTOOL_MSG_FEATURES_GET` (its reply has the same number).
    pub const FEATURES_GET: u8 = 11;
    /// `ETHTOOL_MSG_FEATURES_SET`.
    pub const FEATURES_SET: u8 = 12;
    /// `ETHTOOL_MSG_RINGS_GET`.
    pub const RINGS_GET: u8 = 15;
    /// `ETHTOOL_MSG_RINGS_SET`.
    pub const RINGS_SET: u8 = 16;
    /// `ETHTOOL_MSG_RINGS_GET_REPLY`.
    pub const RINGS_GET_REPLY: u8 = 16;
    /// `ETHTOOL_MSG_CHANNELS_GET`.
    pub const CHANNELS_GET: u8 = 17;
    /// `ETHTOOL_MSG_CHANNELS_SET`.
    pub const CHANNELS_SET: u8 = 18;
    /// `ETHTOOL_MSG_CHANNELS_GET_REPLY`.
    pub const CHANNELS_GET_REPLY: u8 = 18;
    /// `ETHTOOL_MSG_RSS_GET` (its reply has the same number).
    pub const RSS_GET: u8 = 38;
}

/// `ETHTOOL_A_*_HEADER`: the first attribute of every ethtool message.
const A_HEADER: u16 = 1;
/// `ETHTOOL_A_HEADER_DEV_NAME`.
const A_HEADER_DEV_NAME: u16 = 2;
/// `ETHTOOL_A_HEADER_FLAGS`.
const A_HEADER_FLAGS: u16 = 3;
/// `ETHTOOL_FLAG_OMIT_REPLY`: a SET answers with an ack only.
const FLAG_OMIT_REPLY: u32 = 1 << 1;

const A_CHANNELS_RX_MAX: u16 = 2;
const A_CHANNELS_TX_MAX: u16 = 3;
const A_CHANNELS_OTHER_MAX: u16 = 4;
const A_CHANNELS_COMBINED_MAX: u16 = 5;
const A_CHANNELS_RX_COUNT: u16 = 6;
const A_CHANNELS_TX_COUNT: u16 = 7;
const A_CHANNELS_OTHER_COUNT: u16 = 8;
const A_CHANNELS_COMBINED_COUNT: u16 = 9;

const A_RINGS_RX_MAX: u16 = 2;
const A_RINGS_TX_MAX: u16 = 5;
const A_RINGS_RX: u16 = 6;
const A_RINGS_TX: u16 = 9;

const A_FEATURES_HW: u16 = 2;
const A_FEATURES_WANTED: u16 = 3;
const A_FEATURES_ACTIVE: u16 = 4;

/// `ETHTOOL_A_RSS_HFUNC`.
const A_RSS_HFUNC: u16 = 3;
/// `ETHTOOL_A_RSS_INDIR`.
const A_RSS_INDIR: u16 = 4;
/// `ETHTOOL_A_RSS_HKEY`.
const A_RSS_HKEY: u16 = 5;
/// `ETH_RSS_HASH_TOP` (bit `ETH_RSS_HASH_TOP_BIT` = 0): the Toeplitz hash.
pub const RSS_HASH_TOEPLITZ: u32 = 1;

/// `ETHTOOL_A_BITSET_NOMASK`: the bitset is a list of the bits that are set.
const A_BITSET_NOMASK: u16 = 1;
/// `ETHTOOL_A_BITSET_BITS`.
const A_BITSET_BITS: u16 = 3;
/// `ETHTOOL_A_BITSET_BITS_BIT`.
const A_BITSET_BITS_BIT: u16 = 1;
/// `ETHTOOL_A_BITSET_BIT_NAME`.
const A_BITSET_BIT_NAME: u16 = 2;
/// `ETHTOOL_A_BITSET_BIT_VALUE`.
const A_BITSET_BIT_VALUE: u16 = 3;

/// `ETHTOOL_A_STRSET_STRINGSETS`.
const A_STRSET_STRINGSETS: u16 = 2;
/// `ETHTOOL_A_STRINGSETS_STRINGSET`.
const A_STRINGSETS_STRINGSET: u16 = 1;
/// `ETHTOOL_A_STRINGSET_ID`.
const A_STRINGSET_ID: u16 = 1;
/// `ETHTOOL_A_STRINGSET_STRINGS`.
const A_STRINGSET_STRINGS: u16 = 3;
/// `ETHTOOL_A_STRINGS_STRING`.
const A_STRINGS_STRING: u16 = 1;
/// `ETHTOOL_A_STRING_INDEX`.
const A_STRING_INDEX: u16 = 1;
/// `ETHTOOL_A_STRING_VALUE`.
const A_STRING_VALUE: u16 = 2;
/// `ETH_SS_FEATURES`: the string set of feature names.
const ETH_SS_FEATURES: u32 = 4;

/// One netlink attribute: a number and either raw bytes or nested attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The attribute type, without the nested and byte-order flags.
    pub kind: u16,
    /// Its payload.
    pub value: Value,
}

/// The payload of an [`Attr`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Raw bytes (a number, a string, a flag's empty payload, or a nest not yet decoded).
    Bytes(Vec<u8>),
    /// Nested attributes (sent with `NLA_F_NESTED`).
    Nest(Vec<Attr>),
}

impl Attr {
    /// A u32 attribute (host byte order, as netlink carries it).
    pub fn u32(kind: u16, value: u32) -> Self {
        Attr {
            kind,
            value: Value::Bytes(value.to_ne_bytes().to_vec()),
        }
    }

    /// A NUL-terminated string attribute.
    pub fn string(kind: u16, value: &str) -> Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        Attr {
            kind,
            value: Value::Bytes(bytes),
        }
    }

    /// A flag attribute (present means true).
    pub fn flag(kind: u16) -> Self {
        Attr {
            kind,
            value: Value::Bytes(Vec::new()),
        }
    }

    /// A nest of attributes.
    pub fn nest(kind: u16, children: Vec<Attr>) -> Self {
        Attr {
            kind,
            value: Value::Nest(children),
        }
    }

    /// Decodes a run of attributes: those flagged `NLA_F_NESTED` as nests, the rest as bytes
    /// ([`Attr::children`] decodes those too, for a nest sent without the flag).
    pub fn decode_all(bytes: &[u8]) -> Result<Vec<Attr>, DecodeError> {
        NlasIterator::new(bytes)
            .map(|nla| {
                let nla: NlaBuffer<&[u8]> = nla?;
                let value = if nla.nested_flag() {
                    Value::Nest(Attr::decode_all(nla.value())?)
                } else {
                    Value::Bytes(nla.value().to_vec())
                };
                Ok(Attr {
                    kind: nla.kind() & NLA_TYPE_MASK,
                    value,
                })
            })
            .collect()
    }

    /// The attributes nested in this one.
    pub fn children(&self) -> Result<Vec<Attr>, DecodeError> {
        match &self.value {
            Value::Nest(children) => Ok(children.clone()),
            Value::Bytes(bytes) => Attr::decode_all(bytes),
        }
    }

    /// Its payload as a u32.
    pub fn as_u32(&self) -> Result<u32, DecodeError> {
        match &self.value {
            Value::Bytes(b) => parse_u32(b),
            Value::Nest(_) => Err(DecodeError::from("a nest is not a u32")),
        }
    }

    /// Its payload as a string (up to the NUL).
    pub fn as_string(&self) -> Result<String, DecodeError> {
        match &self.value {
            Value::Bytes(b) => parse_string(b),
            Value::Nest(_) => Err(DecodeError::from("a nest is not a string")),
        }
    }
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match &self.value {
            Value::Bytes(b) => b.len(),
            Value::Nest(children) => children.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self.value {
            Value::Bytes(_) => self.kind,
            Value::Nest(_) => self.kind | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match &self.value {
            Value::Bytes(b) => buffer[..b.len()].copy_from_slice(b),
            Value::Nest(children) => children.as_slice().emit(buffer),
        }
    }
}

/// The first attribute of `attrs` of type `kind`.
fn find(attrs: &[Attr], kind: u16) -> Option<&Attr> {
    attrs.iter().find(|a| a.kind == kind)
}

/// The u32 attribute `kind` of `attrs`, 0 when absent (the kernel leaves out what the driver
/// does not report).
fn u32_or_zero(attrs: &[Attr], kind: u16) -> Result<u32, DecodeError> {
    find(attrs, kind).map_or(Ok(0), Attr::as_u32)
}

/// One ethtool message: a command and its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The `ETHTOOL_MSG_*` command.
    pub cmd: u8,
    /// Its attributes, the header first.
    pub attrs: Vec<Attr>,
}

impl GenlFamily for Message {
    fn family_name() -> &'static str {
        FAMILY
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        VERSION
    }
}

impl Emitable for Message {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for Message {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Message {
            cmd: header.cmd,
            attrs: Attr::decode_all(buf)?,
        })
    }
}

/// The request header naming the device.
fn header(dev: &str, flags: u32) -> Attr {
    Attr::nest(
        A_HEADER,
        vec![
            Attr::string(A_HEADER_DEV_NAME, dev),
            Attr::u32(A_HEADER_FLAGS, flags),
        ],
    )
}

/// Checks that a reply is the one expected.
fn expect(reply: &Message, cmd: u8) -> Result<(), DecodeError> {
    if reply.cmd == cmd {
        Ok(())
    } else {
        Err(DecodeError::from(format!(
            "expected ethtool reply {cmd}, got {}",
            reply.cmd
        )))
    }
}

/// `CHANNELS_GET` of `dev`.
pub fn channels_get(dev: &str) -> Message {
    Message {
        cmd: cmd::CHANNELS_GET,
        attrs: vec![header(dev, 0)],
    }
}

/// `CHANNELS_SET` of `dev`: only the counts given change.
pub fn channels_set(dev: &str, counts: &ChannelCounts) -> Message {
    let mut attrs = vec![header(dev, FLAG_OMIT_REPLY)];
    let given = [
        (A_CHANNELS_RX_COUNT, counts.rx),
        (A_CHANNELS_TX_COUNT, counts.tx),
        (A_CHANNELS_COMBINED_COUNT, counts.combined),
    ];
    attrs.extend(
        given
            .into_iter()
            .filter_map(|(kind, n)| Some(Attr::u32(kind, n?))),
    );
    Message {
        cmd: cmd::CHANNELS_SET,
        attrs,
    }
}

/// The channel counts of a `CHANNELS_GET` reply.
pub fn decode_channels(reply: &Message) -> Result<ChannelInfo, DecodeError> {
    expect(reply, cmd::CHANNELS_GET_REPLY)?;
    let a = &reply.attrs;
    Ok(ChannelInfo {
        rx: u32_or_zero(a, A_CHANNELS_RX_COUNT)?,
        tx: u32_or_zero(a, A_CHANNELS_TX_COUNT)?,
        other: u32_or_zero(a, A_CHANNELS_OTHER_COUNT)?,
        combined: u32_or_zero(a, A_CHANNELS_COMBINED_COUNT)?,
        rx_max: u32_or_zero(a, A_CHANNELS_RX_MAX)?,
        tx_max: u32_or_zero(a, A_CHANNELS_TX_MAX)?,
        other_max: u32_or_zero(a, A_CHANNELS_OTHER_MAX)?,
        combined_max: u32_or_zero(a, A_CHANNELS_COMBINED_MAX)?,
    })
}

/// `RINGS_GET` of `dev`.
pub fn rings_get(dev: &str) -> Message {
    Message {
        cmd: cmd::RINGS_GET,
        attrs: vec![header(dev, 0)],
    }
}

/// `RINGS_SET` of `dev`: only the sizes given change.
pub fn rings_set(dev: &str, sizes: &RingSizes) -> Message {
    let mut attrs = vec![header(dev, FLAG_OMIT_REPLY)];
    let given = [(A_RINGS_RX, sizes.rx), (A_RINGS_TX, sizes.tx)];
    attrs.extend(
        given
            .into_iter()
            .filter_map(|(kind, n)| Some(Attr::u32(kind, n?))),
    );
    Message {
        cmd: cmd::RINGS_SET,
        attrs,
    }
}

/// The ring sizes of a `RINGS_GET` reply.
pub fn decode_rings(reply: &Message) -> Result<RingInfo, DecodeError> {
    expect(reply, cmd::RINGS_GET_REPLY)?;
    let a = &reply.attrs;
    Ok(RingInfo {
        rx: u32_or_zero(a, A_RINGS_RX)?,
        tx: u32_or_zero(a, A_RINGS_TX)?,
        rx_max: u32_or_zero(a, A_RINGS_RX_MAX)?,
        tx_max: u32_or_zero(a, A_RINGS_TX_MAX)?,
    })
}

/// `FEATURES_GET` of `dev`, asking for verbose bitsets (every bit named).
pub fn features_get(dev: &str) -> Message {
    Message {
        cmd: cmd::FEATURES_GET,
        attrs: vec![header(dev, 0)],
    }
}

/// `FEATURES_SET` of `dev`: the named features become wanted on (true) or off (false); the
/// bitset carries a mask of exactly those bits, so no other feature changes.
pub fn features_set(dev: &str, wanted: &BTreeMap<String, bool>) -> Message {
    let bits = wanted
        .iter()
        .map(|(name, on)| {
            let mut bit = vec![Attr::string(A_BITSET_BIT_NAME, name)];
            if *on {
                bit.push(Attr::flag(A_BITSET_BIT_VALUE));
            }
            Attr::nest(A_BITSET_BITS_BIT, bit)
        })
        .collect();
    Message {
        cmd: cmd::FEATURES_SET,
        attrs: vec![
            header(dev, FLAG_OMIT_REPLY),
            Attr::nest(A_FEATURES_WANTED, vec![Attr::nest(A_BITSET_BITS, bits)]),
        ],
    }
}

/// The names of the bits that are set in a verbose bitset: every listed bit of a list
/// (`NOMASK`), or the listed bits carrying `VALUE` of a value/mask pair.
pub fn decode_bitset(bitset: &Attr) -> Result<BTreeSet<String>, DecodeError> {
    let attrs = bitset.children()?;
    let list = find(&attrs, A_BITSET_NOMASK).is_some();
    let mut set = BTreeSet::new();
    let Some(bits) = find(&attrs, A_BITSET_BITS) else {
        return Err(DecodeError::from(
            "the bitset is compact (no ETHTOOL_A_BITSET_BITS); the agent asks for names",
        ));
    };
    for bit in bits
        .children()?
        .iter()
        .filter(|b| b.kind == A_BITSET_BITS_BIT)
    {
        let fields = bit.children()?;
        let Some(name) = find(&fields, A_BITSET_BIT_NAME) else {
            continue;
        };
        if list || find(&fields, A_BITSET_BIT_VALUE).is_some() {
            set.insert(name.as_string()?);
        }
    }
    Ok(set)
}

/// The changeable and active features of a `FEATURES_GET` reply; `known` is every feature name
/// of the kernel (from [`decode_feature_names`]).
pub fn decode_features(reply: &Message, known: Vec<String>) -> Result<Features, DecodeError> {
    expect(reply, cmd::FEATURES_GET)?;
    let bitset = |kind: u16, what: &str| {
        find(&reply.attrs, kind)
            .ok_or_else(|| DecodeError::from(format!("FEATURES_GET reply without {what}")))
            .and_then(decode_bitset)
    };
    Ok(Features {
        known,
        changeable: bitset(A_FEATURES_HW, "HW")?,
        active: bitset(A_FEATURES_ACTIVE, "ACTIVE")?,
    })
}

/// `STRSET_GET` of the feature names (a global string set: an empty header, no device).
pub fn feature_names_get() -> Message {
    Message {
        cmd: cmd::STRSET_GET,
        attrs: vec![
            Attr::nest(A_HEADER, Vec::new()),
            Attr::nest(
                A_STRSET_STRINGSETS,
                vec![Attr::nest(
                    A_STRINGSETS_STRINGSET,
                    vec![Attr::u32(A_STRINGSET_ID, ETH_SS_FEATURES)],
                )],
            ),
        ],
    }
}

/// The feature names of a `STRSET_GET` reply, in bit order.
pub fn decode_feature_names(reply: &Message) -> Result<Vec<String>, DecodeError> {
    expect(reply, cmd::STRSET_GET)?;
    let sets = find(&reply.attrs, A_STRSET_STRINGSETS)
        .ok_or_else(|| DecodeError::from("STRSET_GET reply without string sets"))?
        .children()?;
    for set in sets.iter().filter(|s| s.kind == A_STRINGSETS_STRINGSET) {
        let fields = set.children()?;
        if find(&fields, A_STRINGSET_ID)
            .map(Attr::as_u32)
            .transpose()?
            != Some(ETH_SS_FEATURES)
        {
            continue;
        }
        let mut names: BTreeMap<u32, String> = BTreeMap::new();
        if let Some(strings) = find(&fields, A_STRINGSET_STRINGS) {
            for s in strings
                .children()?
                .iter()
                .filter(|s| s.kind == A_STRINGS_STRING)
            {
                let f = s.children()?;
                let (Some(i), Some(v)) = (find(&f, A_STRING_INDEX), find(&f, A_STRING_VALUE))
                else {
                    continue;
                };
                names.insert(i.as_u32()?, v.as_string()?);
            }
        }
        return Ok(names.into_values().collect());
    }
    Err(DecodeError::from(
        "STRSET_GET reply without the feature names",
    ))
}

/// A NIC's receive-side scaling: how it hashes a flow and which queue each hash goes to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rss {
    /// The hash function, a bitmap of `ETH_RSS_HASH_*` ([`RSS_HASH_TOEPLITZ`] for Toeplitz;
    /// 0 when the driver does not say).
    pub hash_function: u32,
    /// The hash key (empty when the driver has none to show).
    pub key: Vec<u8>,
    /// The indirection table: entry `hash % len` is the queue.
    pub indirection: Vec<u32>,
}

impl Rss {
    /// Whether the NIC hashes with Toeplitz (which the user-space stack can compute).
    pub fn is_toeplitz(&self) -> bool {
        self.hash_function == RSS_HASH_TOEPLITZ
    }
}

/// `RSS_GET` of `dev`'s default context.
pub fn rss_get(dev: &str) -> Message {
    Message {
        cmd: cmd::RSS_GET,
        attrs: vec![header(dev, 0)],
    }
}

/// The hash function, key and indirection table of an `RSS_GET` reply.
pub fn decode_rss(reply: &Message) -> Result<Rss, DecodeError> {
    expect(reply, cmd::RSS_GET)?;
    let bytes = |kind: u16| match find(&reply.attrs, kind).map(|a| &a.value) {
        None => Ok(Vec::new()),
        Some(Value::Bytes(b)) => Ok(b.clone()),
        Some(Value::Nest(_)) => Err(DecodeError::from(format!(
            "RSS_GET reply: attribute {kind} is a nest, not binary"
        ))),
    };
    let table = bytes(A_RSS_INDIR)?;
    if table.len() % 4 != 0 {
        return Err(DecodeError::from(format!(
            "RSS_GET reply: an indirection table of {} bytes is not a u32 array",
            table.len()
        )));
    }
    Ok(Rss {
        hash_function: u32_or_zero(&reply.attrs, A_RSS_HFUNC)?,
        key: bytes(A_RSS_HKEY)?,
        indirection: table
            .chunks_exact(4)
            .map(|q| u32::from_ne_bytes([q[0], q[1], q[2], q[3]]))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(m: &Message) -> Vec<u8> {
        let mut buf = vec![0; m.buffer_len()];
        m.emit(&mut buf);
        buf
    }

    fn decode(cmd: u8, bytes: &[u8]) -> Message {
        Message::parse_with_param(bytes, GenlHeader { cmd, version: 1 }).expect("decodes")
    }

    #[test]
    fn a_channels_set_carries_the_header_and_only_the_given_counts() {
        let m = channels_set(
            "veth0",
            &ChannelCounts {
                rx: Some(2),
                ..ChannelCounts::default()
            },
        );
        let bytes = encode(&m);
        #[rustfmt::skip]
        let expected: Vec<u8> = [
            // HEADER (nested): len 24 = 4 + DEV_NAME (4 + "veth0\0" padded to 8) + FLAGS (8).
            &[24, 0, 0x01, 0x80][..],
            &[10, 0, 2, 0], b"veth0\0", &[0, 0],
            &[8, 0, 3, 0], &2u32.to_ne_bytes(),
            // RX_COUNT = 2.
            &[8, 0, 6, 0], &2u32.to_ne_bytes(),
        ]
        .concat();
        assert_eq!(bytes, expected);
        let back = decode(cmd::CHANNELS_SET, &bytes);
        assert_eq!(back.attrs.len(), 2);
        let h = back.attrs[0].children().expect("header");
        assert_eq!(h[0].as_string().expect("name"), "veth0");
        assert_eq!(h[1].as_u32().expect("flags"), FLAG_OMIT_REPLY);
        assert_eq!(back.attrs[1].kind, A_CHANNELS_RX_COUNT);
        assert_eq!(back.attrs[1].as_u32().expect("rx"), 2);
    }

    #[test]
    fn a_features_set_masks_exactly_the_named_bits() {
        let wanted: BTreeMap<String, bool> = [
            ("rx-gro".to_string(), true),
            ("tx-tcp-segmentation".to_string(), false),
        ]
        .into();
        let bytes = encode(&features_set("eth1", &wanted));
        let m = decode(cmd::FEATURES_SET, &bytes);
        assert_eq!(m.attrs[1].kind, A_FEATURES_WANTED);
        let set = m.attrs[1].children().expect("bitset");
        assert!(find(&set, A_BITSET_NOMASK).is_none(), "a mask, not a list");
        let bits = find(&set, A_BITSET_BITS)
            .expect("bits")
            .children()
            .expect("bits");
        let named: Vec<(String, bool)> = bits
            .iter()
            .map(|b| {
                let f = b.children().expect("bit");
                (
                    find(&f, A_BITSET_BIT_NAME)
                        .expect("name")
                        .as_string()
                        .expect("name"),
                    find(&f, A_BITSET_BIT_VALUE).is_some(),
                )
            })
            .collect();
        assert_eq!(
            named,
            [
                ("rx-gro".to_string(), true),
                ("tx-tcp-segmentation".to_string(), false)
            ]
        );
        assert_eq!(
            decode_bitset(&m.attrs[1]).expect("set"),
            ["rx-gro".to_string()].into()
        );
        // The SET round-trips byte for byte.
        assert_eq!(encode(&m), bytes);
    }

    #[test]
    fn rings_set_and_get_requests() {
        let m = rings_set(
            "eth0",
            &RingSizes {
                rx: Some(512),
                tx: Some(1024),
            },
        );
        let back = decode(cmd::RINGS_SET, &encode(&m));
        assert_eq!(back.attrs[1], Attr::u32(A_RINGS_RX, 512));
        assert_eq!(back.attrs[2], Attr::u32(A_RINGS_TX, 1024));
        assert_eq!(rings_get("eth0").attrs.len(), 1);
    }

    /// The attributes of a `CHANNELS_GET` reply for veth `v0` (4+4 queues, 2 rx in use), as
    /// this kernel (6.18) sent them to `ethtool -l v0` (recorded with strace): only the non-zero
    /// counts are present.
    const CHANNELS_REPLY: &[u8] = &[
        0x14, 0x00, 0x01, 0x80, // HEADER (nested, 20 bytes)
        0x08, 0x00, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00, // DEV_INDEX 3
        0x07, 0x00, 0x02, 0x00, 0x76, 0x30, 0x00, 0x00, // DEV_NAME "v0"
        0x08, 0x00, 0x02, 0x00, 0x04, 0x00, 0x00, 0x00, // RX_MAX 4
        0x08, 0x00, 0x06, 0x00, 0x02, 0x00, 0x00, 0x00, // RX_COUNT 2
        0x08, 0x00, 0x03, 0x00, 0x04, 0x00, 0x00, 0x00, // TX_MAX 4
        0x08, 0x00, 0x07, 0x00, 0x04, 0x00, 0x00, 0x00, // TX_COUNT 4
    ];

    #[test]
    fn a_recorded_channels_reply_decodes() {
        let m = decode(cmd::CHANNELS_GET_REPLY, CHANNELS_REPLY);
        assert_eq!(
            decode_channels(&m).expect("channels"),
            ChannelInfo {
                rx: 2,
                tx: 4,
                rx_max: 4,
                tx_max: 4,
                ..ChannelInfo::default()
            }
        );
        assert!(decode_channels(&decode(cmd::RINGS_GET_REPLY, CHANNELS_REPLY)).is_err());
    }

    /// A verbose list bitset, as the kernel sends HW and ACTIVE: only the set bits, by index and
    /// name.
    fn list(kind: u16, names: &[(u32, &str)]) -> Attr {
        let bits = names
            .iter()
            .map(|(i, n)| {
                Attr::nest(
                    A_BITSET_BITS_BIT,
                    vec![Attr::u32(1, *i), Attr::string(A_BITSET_BIT_NAME, n)],
                )
            })
            .collect();
        Attr::nest(
            kind,
            vec![
                Attr::flag(A_BITSET_NOMASK),
                Attr::u32(2, 64),
                Attr::nest(A_BITSET_BITS, bits),
            ],
        )
    }

    #[test]
    fn features_and_names_decode() {
        let reply = Message {
            cmd: cmd::FEATURES_GET,
            attrs: vec![
                header("v0", 0),
                list(
                    A_FEATURES_HW,
                    &[(0, "tx-scatter-gather"), (16, "tx-tcp-segmentation")],
                ),
                list(A_FEATURES_WANTED, &[(0, "tx-scatter-gather")]),
                list(
                    A_FEATURES_ACTIVE,
                    &[(0, "tx-scatter-gather"), (15, "rx-lro")],
                ),
            ],
        };
        let bytes = encode(&reply);
        let f = decode_features(&decode(cmd::FEATURES_GET, &bytes), vec!["x".into()])
            .expect("features");
        assert_eq!(
            f.changeable,
            [
                "tx-scatter-gather".to_string(),
                "tx-tcp-segmentation".to_string()
            ]
            .into()
        );
        assert_eq!(
            f.active,
            ["rx-lro".to_string(), "tx-scatter-gather".to_string()].into()
        );
        let strings = |names: &[(u32, &str)]| {
            names
                .iter()
                .map(|(i, n)| {
                    Attr::nest(
                        A_STRINGS_STRING,
                        vec![
                            Attr::u32(A_STRING_INDEX, *i),
                            Attr::string(A_STRING_VALUE, n),
                        ],
                    )
                })
                .collect()
        };
        let strset = Message {
            cmd: cmd::STRSET_GET,
            attrs: vec![Attr::nest(
                A_STRSET_STRINGSETS,
                vec![Attr::nest(
                    A_STRINGSETS_STRINGSET,
                    vec![
                        Attr::u32(A_STRINGSET_ID, ETH_SS_FEATURES),
                        Attr::u32(2, 2),
                        Attr::nest(
                            A_STRINGSET_STRINGS,
                            strings(&[(1, "tx-scatter-gather-fraglist"), (0, "tx-scatter-gather")]),
                        ),
                    ],
                )],
            )],
        };
        let names = decode_feature_names(&decode(cmd::STRSET_GET, &encode(&strset)));
        assert_eq!(
            names.expect("names"),
            ["tx-scatter-gather", "tx-scatter-gather-fraglist"]
        );
        // The request asks for the feature string set with an empty header (no device), as
        // `ethtool -k` sends it (recorded with strace).
        assert_eq!(
            encode(&feature_names_get()),
            [
                0x04, 0x00, 0x01, 0x80, 0x10, 0x00, 0x02, 0x80, 0x0c, 0x00, 0x01, 0x80, 0x08, 0x00,
                0x01, 0x00, 0x04, 0x00, 0x00, 0x00
            ]
        );
    }

    #[test]
    fn an_rss_get_names_the_device_only() {
        let bytes = encode(&rss_get("eth1"));
        #[rustfmt::skip]
        let expected: Vec<u8> = [
            // HEADER (nested): DEV_NAME "eth1\0" padded to 8, FLAGS 0.
            &[24, 0, 0x01, 0x80][..],
            &[9, 0, 2, 0], b"eth1\0", &[0, 0, 0],
            &[8, 0, 3, 0], &0u32.to_ne_bytes(),
        ]
        .concat();
        assert_eq!(bytes, expected);
        assert_eq!(rss_get("eth1").cmd, 38);
    }

    /// An `RSS_GET` reply as a 4-queue virtio-net sends it (Linux 6.1): header, HFUNC,
    /// INDIR (8 entries here instead of 128) and a 40-byte key.
    fn rss_reply(table: &[u32], key: &[u8]) -> Vec<u8> {
        let attr = |kind: u16, value: &[u8]| {
            let mut a = Vec::new();
            a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(value);
            while a.len() % 4 != 0 {
                a.push(0);
            }
            a
        };
        let table: Vec<u8> = table.iter().flat_map(|q| q.to_ne_bytes()).collect();
        [
            attr(A_HEADER | NLA_F_NESTED, &attr(A_HEADER_DEV_NAME, b"eth1\0")),
            attr(A_RSS_HFUNC, &RSS_HASH_TOEPLITZ.to_ne_bytes()),
            attr(A_RSS_INDIR, &table),
            attr(A_RSS_HKEY, key),
        ]
        .concat()
    }

    #[test]
    fn an_rss_reply_decodes_into_function_key_and_table() {
        let key: Vec<u8> = (0..40).map(|i| 0x10 + i).collect();
        let table = [0, 1, 2, 3, 0, 1, 2, 3];
        let rss = decode_rss(&decode(cmd::RSS_GET, &rss_reply(&table, &key))).expect("rss");
        assert_eq!(
            rss,
            Rss {
                hash_function: RSS_HASH_TOEPLITZ,
                key: key.clone(),
                indirection: table.to_vec(),
            }
        );
        assert!(rss.is_toeplitz());
        // A driver that reports no key: an empty key, not an error.
        let bare = decode_rss(&decode(cmd::RSS_GET, &rss_reply(&[0; 4], &[]))).expect("rss");
        assert!(bare.key.is_empty() && bare.indirection == [0; 4]);
        // A table that is not a u32 array, and a reply of another command, are refused.
        let mut torn = decode(cmd::RSS_GET, &rss_reply(&table, &[1; 40]));
        for a in &mut torn.attrs {
            if a.kind == A_RSS_INDIR {
                a.value = Value::Bytes(vec![0; 6]);
            }
        }
        let error = decode_rss(&torn).unwrap_err().to_string();
        assert!(error.contains("not a u32 array"), "{error}");
        assert!(decode_rss(&decode(cmd::CHANNELS_GET_REPLY, &rss_reply(&table, &key))).is_err());
    }
}
