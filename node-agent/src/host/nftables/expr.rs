//! The nf_tables expressions the agent's rules are made of, encoded as the kernel's netlink
//! attributes.
//!
//! rustables 0.9.0 has types for some of them (meta, payload, cmp, bitwise, lookup, counter,
//! immediate) but none for `limit`, `dynset` or `notrack`, and its raw-expression type cannot
//! be built outside the crate; so every expression of a rule is encoded here, from the
//! attribute numbers of the kernel headers (`rustables::sys`, generated from them). Each
//! constructor documents the `nft --debug=netlink` line it produces.

use rustables::sys;

use super::attr::{self, Attr};

/// The 16-byte register every rule here loads into and matches from.
const REG_1: u32 = sys::NFT_REG_1;
/// The verdict register.
const REG_VERDICT: u32 = sys::NFT_REG_VERDICT;
/// The verdict code `NF_DROP`.
const NF_DROP: u32 = libc::NF_DROP as u32;
/// The verdict code `NF_ACCEPT`.
const NF_ACCEPT: u32 = libc::NF_ACCEPT as u32;
/// The limit unit: one second.
const PER_SECOND: u64 = 1;

/// One expression: its name and its attributes (`NFTA_EXPR_NAME`, `NFTA_EXPR_DATA`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expr {
    /// The kernel's name for it (`meta`, `limit`, ...).
    pub name: &'static str,
    /// The attributes inside `NFTA_EXPR_DATA`.
    pub data: Vec<Attr>,
}

/// Which header a payload load reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base {
    /// The network header (IPv4/IPv6).
    Network,
    /// The transport header (TCP).
    Transport,
}

/// What a rule does with a packet that matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `drop`.
    Drop,
    /// `accept`.
    Accept,
}

impl Expr {
    /// The expression as `NFTA_EXPR_NAME` and (when it has attributes) `NFTA_EXPR_DATA`.
    pub fn attrs(&self) -> Vec<Attr> {
        let mut out = vec![Attr::Str(sys::NFTA_EXPR_NAME, self.name.into())];
        if !self.data.is_empty() {
            out.push(Attr::Nested(sys::NFTA_EXPR_DATA, self.data.clone()));
        }
        out
    }

    /// The expression as one element of a rule's expression list.
    pub fn list_elem(&self) -> Attr {
        Attr::Nested(sys::NFTA_LIST_ELEM, self.attrs())
    }

    /// `[ meta load KEY => reg 1 ]`, KEY one of `NFT_META_*`.
    pub fn meta(key: u32) -> Self {
        Expr {
            name: "meta",
            data: vec![
                Attr::U32(sys::NFTA_META_KEY, key),
                Attr::U32(sys::NFTA_META_DREG, REG_1),
            ],
        }
    }

    /// `[ cmp eq reg 1 VALUE ]`.
    pub fn cmp_eq(value: &[u8]) -> Self {
        Expr {
            name: "cmp",
            data: vec![
                Attr::U32(sys::NFTA_CMP_SREG, REG_1),
                Attr::U32(sys::NFTA_CMP_OP, sys::NFT_CMP_EQ),
                data_value(sys::NFTA_CMP_DATA, value),
            ],
        }
    }

    /// `[ payload load LEN b @ BASE header + OFFSET => reg 1 ]`.
    pub fn payload(base: Base, offset: u32, len: u32) -> Self {
        let base = match base {
            Base::Network => sys::NFT_PAYLOAD_NETWORK_HEADER,
            Base::Transport => sys::NFT_PAYLOAD_TRANSPORT_HEADER,
        };
        Expr {
            name: "payload",
            data: vec![
                Attr::U32(sys::NFTA_PAYLOAD_DREG, REG_1),
                Attr::U32(sys::NFTA_PAYLOAD_BASE, base),
                Attr::U32(sys::NFTA_PAYLOAD_OFFSET, offset),
                Attr::U32(sys::NFTA_PAYLOAD_LEN, len),
            ],
        }
    }

    /// `[ bitwise reg 1 = ( reg 1 & MASK ) ^ 0 ]`.
    pub fn and_mask(mask: &[u8]) -> Self {
        let len = u32::try_from(mask.len()).unwrap_or(u32::MAX);
        Expr {
            name: "bitwise",
            data: vec![
                Attr::U32(sys::NFTA_BITWISE_SREG, REG_1),
                Attr::U32(sys::NFTA_BITWISE_DREG, REG_1),
                Attr::U32(sys::NFTA_BITWISE_LEN, len),
                data_value(sys::NFTA_BITWISE_MASK, mask),
                data_value(sys::NFTA_BITWISE_XOR, &vec![0; mask.len()]),
            ],
        }
    }

    /// `[ lookup reg 1 set SET ]`. The set is named, not numbered: the kernel finds a set
    /// added earlier in the same batch by its name.
    pub fn lookup(set: &str) -> Self {
        Expr {
            name: "lookup",
            data: vec![
                Attr::Str(sys::NFTA_LOOKUP_SET, set.into()),
                Attr::U32(sys::NFTA_LOOKUP_SREG, REG_1),
            ],
        }
    }

    /// `[ counter pkts 0 bytes 0 ]`.
    pub fn counter() -> Self {
        Expr {
            name: "counter",
            data: vec![
                Attr::U64(sys::NFTA_COUNTER_BYTES, 0),
                Attr::U64(sys::NFTA_COUNTER_PACKETS, 0),
            ],
        }
    }

    /// `[ immediate reg 0 drop ]` or `... accept`.
    pub fn verdict(verdict: Verdict) -> Self {
        let code = match verdict {
            Verdict::Drop => NF_DROP,
            Verdict::Accept => NF_ACCEPT,
        };
        Expr {
            name: "immediate",
            data: vec![
                Attr::U32(sys::NFTA_IMMEDIATE_DREG, REG_VERDICT),
                Attr::Nested(
                    sys::NFTA_IMMEDIATE_DATA,
                    vec![Attr::Nested(
                        sys::NFTA_DATA_VERDICT,
                        vec![Attr::U32(sys::NFTA_VERDICT_CODE, code)],
                    )],
                ),
            ],
        }
    }

    /// `[ limit rate RATE/second burst BURST type packets flags 0x1 ]`: matches while packets
    /// come faster than `rate` per second after a burst of `burst` (flag 0x1 = `over`).
    pub fn limit_over(rate: u64, burst: u32) -> Self {
        Expr {
            name: "limit",
            data: vec![
                Attr::U64(sys::NFTA_LIMIT_RATE, rate),
                Attr::U64(sys::NFTA_LIMIT_UNIT, PER_SECOND),
                Attr::U32(sys::NFTA_LIMIT_BURST, burst),
                Attr::U32(sys::NFTA_LIMIT_TYPE, sys::NFT_LIMIT_PKTS),
                Attr::U32(sys::NFTA_LIMIT_FLAGS, sys::NFT_LIMIT_F_INV),
            ],
        }
    }

    /// `[ dynset update reg_key 1 set SET expr [ EXPR ] ]`: adds the key in register 1 to the
    /// dynamic set (or refreshes its timeout) and evaluates `expr` with that element's state, so
    /// that `expr` (a limit) is kept per key.
    pub fn dynset_update(set: &str, expr: &Expr) -> Self {
        Expr {
            name: "dynset",
            data: vec![
                Attr::Str(sys::NFTA_DYNSET_SET_NAME, set.into()),
                Attr::U32(sys::NFTA_DYNSET_OP, sys::NFT_DYNSET_OP_UPDATE),
                Attr::U32(sys::NFTA_DYNSET_SREG_KEY, REG_1),
                Attr::Nested(sys::NFTA_DYNSET_EXPR, expr.attrs()),
            ],
        }
    }

    /// `[ notrack ]`: the packet skips connection tracking.
    pub fn notrack() -> Self {
        Expr {
            name: "notrack",
            data: Vec::new(),
        }
    }

    /// Whether the kernel's dump of an expression (`name`, `NFTA_EXPR_DATA` payload) is this
    /// expression: same name, and every attribute written here read back with the same value,
    /// except a counter's running totals. Attributes the kernel adds (defaults it fills in) are
    /// ignored.
    pub fn matches_dump(&self, name: &str, data: &[u8]) -> bool {
        self.name == name
            && attr::parse(data).is_some_and(|dumped| {
                self.data.iter().all(|want| {
                    let Some(got) = attr::find(&dumped, want.kind()) else {
                        return false;
                    };
                    self.name == "counter" || same_attr(want, got)
                })
            })
    }
}

/// Whether `got` (a dumped payload) holds what `want` wrote; nested attributes (a verdict, the
/// limit inside a dynset) are compared attribute by attribute, in the same way.
fn same_attr(want: &Attr, got: &[u8]) -> bool {
    match want {
        Attr::Nested(_, inner) => attr::parse(got).is_some_and(|dumped| {
            inner
                .iter()
                .all(|w| attr::find(&dumped, w.kind()).is_some_and(|g| same_attr(w, g)))
        }),
        _ => want.payload() == got,
    }
}

/// `KIND { NFTA_DATA_VALUE bytes }`, how registers are compared and masked.
fn data_value(kind: u16, bytes: &[u8]) -> Attr {
    Attr::Nested(
        kind,
        vec![Attr::Bytes(sys::NFTA_DATA_VALUE, bytes.to_vec())],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::nftables::attr::encode_all;

    /// `len type` header of an attribute, as the bytes netlink puts on the wire (little-endian
    /// host).
    fn hdr(len: u16, kind: u16) -> Vec<u8> {
        [len.to_le_bytes(), kind.to_le_bytes()].concat()
    }

    #[test]
    fn limit_over_encodes_rate_unit_burst_type_and_the_over_flag() {
        let bytes = encode_all(&Expr::limit_over(10, 5).data);
        let want = [
            hdr(12, 1), // NFTA_LIMIT_RATE
            10u64.to_be_bytes().to_vec(),
            hdr(12, 2), // NFTA_LIMIT_UNIT: seconds
            1u64.to_be_bytes().to_vec(),
            hdr(8, 3), // NFTA_LIMIT_BURST
            5u32.to_be_bytes().to_vec(),
            hdr(8, 4), // NFTA_LIMIT_TYPE: packets
            0u32.to_be_bytes().to_vec(),
            hdr(8, 5), // NFTA_LIMIT_FLAGS: NFT_LIMIT_F_INV ("over")
            1u32.to_be_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(bytes, want);
    }

    #[test]
    fn dynset_update_nests_the_limit_as_an_expression() {
        let limit = Expr::limit_over(10, 5);
        let bytes = encode_all(&Expr::dynset_update("syn4", &limit).data);
        let limit_data = encode_all(&limit.data);
        let nested_expr = [
            hdr(10, 1), // NFTA_EXPR_NAME "limit\0" + 2 pad
            b"limit\0\0\0".to_vec(),
            hdr(4 + limit_data.len() as u16, 2 | 0x8000), // NFTA_EXPR_DATA, nested
            limit_data,
        ]
        .concat();
        let want = [
            hdr(9, 1), // NFTA_DYNSET_SET_NAME "syn4\0" + 3 pad
            b"syn4\0\0\0\0".to_vec(),
            hdr(8, 3), // NFTA_DYNSET_OP: update
            1u32.to_be_bytes().to_vec(),
            hdr(8, 4), // NFTA_DYNSET_SREG_KEY: reg 1
            1u32.to_be_bytes().to_vec(),
            hdr(4 + nested_expr.len() as u16, 7 | 0x8000), // NFTA_DYNSET_EXPR, nested
            nested_expr,
        ]
        .concat();
        assert_eq!(bytes, want);
    }

    #[test]
    fn notrack_is_a_name_without_data() {
        let mut bytes = Vec::new();
        Expr::notrack().list_elem().encode(&mut bytes);
        let want = [
            hdr(16, 1 | 0x8000), // NFTA_LIST_ELEM, nested
            hdr(12, 1),          // NFTA_EXPR_NAME "notrack\0"
            b"notrack\0".to_vec(),
        ]
        .concat();
        assert_eq!(bytes, want);
    }

    #[test]
    fn a_verdict_is_an_immediate_into_the_verdict_register() {
        let bytes = encode_all(&Expr::verdict(Verdict::Drop).data);
        let want = [
            hdr(8, 1), // NFTA_IMMEDIATE_DREG: reg 0
            0u32.to_be_bytes().to_vec(),
            hdr(16, 2 | 0x8000), // NFTA_IMMEDIATE_DATA
            hdr(12, 2 | 0x8000), // NFTA_DATA_VERDICT
            hdr(8, 1),           // NFTA_VERDICT_CODE: NF_DROP
            0u32.to_be_bytes().to_vec(),
        ]
        .concat();
        assert_eq!(bytes, want);
    }

    #[test]
    fn dumps_match_with_kernel_defaults_added_and_counters_running() {
        let counter = Expr::counter();
        let running = encode_all(&[
            Attr::U64(sys::NFTA_COUNTER_BYTES, 999),
            Attr::U64(sys::NFTA_COUNTER_PACKETS, 3),
        ]);
        assert!(counter.matches_dump("counter", &running));

        let lookup = Expr::lookup("blocked4");
        let mut dumped = encode_all(&lookup.data);
        Attr::U32(sys::NFTA_LOOKUP_FLAGS, 0).encode(&mut dumped);
        assert!(lookup.matches_dump("lookup", &dumped));
        assert!(!lookup.matches_dump("dynset", &dumped));
        let other = encode_all(&Expr::lookup("blocked6").data);
        assert!(!lookup.matches_dump("lookup", &other));

        let limit = Expr::limit_over(10, 5);
        let dynset = Expr::dynset_update("syn4", &limit);
        let dumped = encode_all(&dynset.data);
        assert!(dynset.matches_dump("dynset", &dumped));
        let faster = encode_all(&Expr::dynset_update("syn4", &Expr::limit_over(11, 5)).data);
        assert!(!dynset.matches_dump("dynset", &faster));
    }
}
