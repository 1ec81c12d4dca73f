//! The table as nftables objects: which sets, elements, chains and rules a [`Ruleset`] makes
//! ([`layout`]), and the way back, from what the kernel lists to the ruleset it implements
//! ([`observe`]). Both are pure; `netlink` does the I/O.
//!
//! ```text
//! table inet hoststack {                       comment "managed by hoststack-agent"
//!   set blocked4 / blocked6                    interval sets of the blocked prefixes
//!   set syn4 / syn6                            dynamic sets: one limit per source address
//!   set notrack_ports                          the notrack ports
//!   chain prerouting  (filter, hook prerouting, priority raw = -300)
//!     blocked-ipv4, blocked-ipv6, syn-limit-ipv4, syn-limit-ipv6, notrack-in
//!   chain output      (filter, hook output, priority raw; only with notrack ports)
//!     notrack-out
//! }
//! ```

use std::collections::BTreeMap;

use rustables::sys;

use super::expr::{Base, Expr, Verdict};
use super::ruleset::{cover, Family, Range, Ruleset, SynLimit};

/// The table's name.
pub const TABLE: &str = "hoststack";
/// The comment (table userdata) that marks the table as the agent's.
pub const MARK: &str = "managed by hoststack-agent";
/// Chain priority `raw`: before connection tracking, so drops and notrack cost no conntrack
/// entry.
pub const PRIORITY_RAW: i32 = -300;
/// How long a source stays in a SYN-limit set after its last SYN.
pub const METER_TIMEOUT_MS: u64 = 60_000;
/// How many sources a SYN-limit set holds; SYNs of sources beyond it are not limited.
pub const METER_SIZE: u32 = 65_535;

/// nft's data type of an IPv4 address key (what `nft list` shows as the set's `type`).
const TYPE_IPV4_ADDR: u32 = 7;
/// nft's data type of an IPv6 address key.
const TYPE_IPV6_ADDR: u32 = 8;
/// nft's data type of a port key.
const TYPE_INET_SERVICE: u32 = 13;

/// The layer-4 protocol number of TCP.
const TCP: u8 = libc::IPPROTO_TCP as u8;
/// The TCP flags a SYN is told apart by: fin, syn, rst, ack.
const TCP_FLAGS_MASK: u8 = 0x17;
/// Those flags in a SYN: syn alone.
const TCP_SYN: u8 = 0x02;

/// The hooks the table's chains attach to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// `NF_INET_PRE_ROUTING`.
    Prerouting,
    /// `NF_INET_LOCAL_OUT`.
    Output,
}

impl Hook {
    /// The kernel's hook number.
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => libc::NF_INET_PRE_ROUTING as u32,
            Hook::Output => libc::NF_INET_LOCAL_OUT as u32,
        }
    }
}

/// A base chain (type filter, policy accept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainSpec {
    /// Its name.
    pub name: &'static str,
    /// Where it hooks.
    pub hook: Hook,
    /// Its priority.
    pub priority: i32,
}

/// What a set holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetKind {
    /// Address ranges (`flags interval`).
    Interval,
    /// Exact keys.
    Plain,
    /// Filled by the rules themselves (`flags dynamic,timeout`), one limit per key.
    Meter,
}

/// A set and its elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetSpec {
    /// Its name.
    pub name: &'static str,
    /// What it holds.
    pub kind: SetKind,
    /// nft's data type of the key.
    pub key_type: u32,
    /// Key length in bytes.
    pub key_len: u32,
    /// The elements, in order (none for a meter).
    pub elements: Vec<Element>,
}

impl SetSpec {
    /// The set's `NFTA_SET_FLAGS`.
    pub fn flags(&self) -> u32 {
        match self.kind {
            SetKind::Interval => sys::NFT_SET_INTERVAL,
            SetKind::Plain => 0,
            SetKind::Meter => sys::NFT_SET_EVAL | sys::NFT_SET_TIMEOUT,
        }
    }
}

/// A set element: its key and whether it ends an interval (the first address past it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    /// The key, in network byte order.
    pub key: Vec<u8>,
    /// `NFT_SET_ELEM_INTERVAL_END`.
    pub interval_end: bool,
}

/// A rule: its chain, its comment (which names it, in `nft list` and in the metrics) and its
/// expressions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    /// The chain it is in.
    pub chain: &'static str,
    /// Its name, stored as the rule's comment.
    pub comment: &'static str,
    /// Whether it drops what it matches (and so counts drops).
    pub drops: bool,
    /// What it does.
    pub exprs: Vec<Expr>,
}

/// Everything in the table, in the order it is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Sets, before the rules that use them.
    pub sets: Vec<SetSpec>,
    /// Base chains.
    pub chains: Vec<ChainSpec>,
    /// Rules, in chain order.
    pub rules: Vec<RuleSpec>,
}

/// The names of the rules that drop, in the order they run: the metrics report these.
pub const DROP_RULES: [&str; 4] = [
    "blocked-ipv4",
    "blocked-ipv6",
    "syn-limit-ipv4",
    "syn-limit-ipv6",
];

/// What one family's rules need to know.
struct FamilyParts {
    /// The address family.
    family: Family,
    /// Its `meta nfproto` value.
    nfproto: u8,
    /// Where the source address is in its header.
    saddr_offset: u32,
    /// nft's data type of its addresses.
    key_type: u32,
    /// The interval set of its blocked prefixes, and the rule that drops them.
    blocked_set: &'static str,
    blocked_rule: &'static str,
    /// The dynamic set of its SYN limits, and the rule that keeps and applies them.
    meter_set: &'static str,
    meter_rule: &'static str,
}

/// IPv4 and IPv6.
const FAMILIES: [FamilyParts; 2] = [
    FamilyParts {
        family: Family::V4,
        nfproto: libc::NFPROTO_IPV4 as u8,
        saddr_offset: 12,
        key_type: TYPE_IPV4_ADDR,
        blocked_set: "blocked4",
        blocked_rule: DROP_RULES[0],
        meter_set: "syn4",
        meter_rule: DROP_RULES[2],
    },
    FamilyParts {
        family: Family::V6,
        nfproto: libc::NFPROTO_IPV6 as u8,
        saddr_offset: 8,
        key_type: TYPE_IPV6_ADDR,
        blocked_set: "blocked6",
        blocked_rule: DROP_RULES[1],
        meter_set: "syn6",
        meter_rule: DROP_RULES[3],
    },
];

/// The set of the notrack ports.
const PORTS_SET: &str = "notrack_ports";
/// The rule for packets to a notrack port.
const NOTRACK_IN: &str = "notrack-in";
/// The rule for the local service's packets from a notrack port.
const NOTRACK_OUT: &str = "notrack-out";
/// The chain on the prerouting hook.
const PREROUTING: &str = "prerouting";
/// The chain on the output hook (only with notrack ports).
const OUTPUT: &str = "output";

impl FamilyParts {
    fn key_len(&self) -> u32 {
        self.family.bits() / 8
    }

    /// `ip saddr` / `ip6 saddr` into register 1 (nft shows the nfproto check as implied).
    fn saddr(&self) -> [Expr; 3] {
        [
            Expr::meta(sys::NFT_META_NFPROTO),
            Expr::cmp_eq(&[self.nfproto]),
            Expr::payload(Base::Network, self.saddr_offset, self.key_len()),
        ]
    }
}

/// `meta l4proto tcp`.
fn is_tcp() -> [Expr; 2] {
    [Expr::meta(sys::NFT_META_L4PROTO), Expr::cmp_eq(&[TCP])]
}

/// The objects that implement `ruleset`.
pub fn layout(ruleset: &Ruleset) -> Layout {
    let mut sets = Vec::new();
    let mut rules = Vec::new();
    for f in &FAMILIES {
        let prefixes: Vec<_> = ruleset.blocked(f.family).copied().collect();
        if prefixes.is_empty() {
            continue;
        }
        sets.push(SetSpec {
            name: f.blocked_set,
            kind: SetKind::Interval,
            key_type: f.key_type,
            key_len: f.key_len(),
            elements: interval_elements(f.family, &super::ruleset::ranges(&prefixes)),
        });
        let mut exprs = f.saddr().to_vec();
        exprs.extend([
            Expr::lookup(f.blocked_set),
            Expr::counter(),
            Expr::verdict(Verdict::Drop),
        ]);
        rules.push(RuleSpec {
            chain: PREROUTING,
            comment: f.blocked_rule,
            drops: true,
            exprs,
        });
    }
    if let Some(SynLimit { per_second, burst }) = ruleset.syn_limit {
        for f in &FAMILIES {
            sets.push(SetSpec {
                name: f.meter_set,
                kind: SetKind::Meter,
                key_type: f.key_type,
                key_len: f.key_len(),
                elements: Vec::new(),
            });
            let mut exprs = is_tcp().to_vec();
            exprs.extend([
                Expr::payload(Base::Transport, 13, 1),
                Expr::and_mask(&[TCP_FLAGS_MASK]),
                Expr::cmp_eq(&[TCP_SYN]),
            ]);
            exprs.extend(f.saddr());
            exprs.extend([
                Expr::dynset_update(f.meter_set, &Expr::limit_over(u64::from(per_second), burst)),
                Expr::counter(),
                Expr::verdict(Verdict::Drop),
            ]);
            rules.push(RuleSpec {
                chain: PREROUTING,
                comment: f.meter_rule,
                drops: true,
                exprs,
            });
        }
    }
    let mut chains = vec![ChainSpec {
        name: PREROUTING,
        hook: Hook::Prerouting,
        priority: PRIORITY_RAW,
    }];
    if !ruleset.notrack_ports.is_empty() {
        sets.push(SetSpec {
            name: PORTS_SET,
            kind: SetKind::Plain,
            key_type: TYPE_INET_SERVICE,
            key_len: 2,
            elements: ruleset
                .notrack_ports
                .iter()
                .map(|p| Element {
                    key: p.to_be_bytes().to_vec(),
                    interval_end: false,
                })
                .collect(),
        });
        chains.push(ChainSpec {
            name: OUTPUT,
            hook: Hook::Output,
            priority: PRIORITY_RAW,
        });
        // Incoming packets to the port, and the local service's packets from it.
        for (chain, comment, port_offset) in [(PREROUTING, NOTRACK_IN, 2), (OUTPUT, NOTRACK_OUT, 0)]
        {
            let mut exprs = is_tcp().to_vec();
            exprs.extend([
                Expr::payload(Base::Transport, port_offset, 2),
                Expr::lookup(PORTS_SET),
                Expr::notrack(),
                Expr::counter(),
                Expr::verdict(Verdict::Accept),
            ]);
            rules.push(RuleSpec {
                chain,
                comment,
                drops: false,
                exprs,
            });
        }
    }
    Layout {
        sets,
        chains,
        rules,
    }
}

/// The elements of an interval set holding `ranges`: each range's first address, and the
/// address after its last flagged as an interval end (none when the range runs to the top).
pub fn interval_elements(family: Family, ranges: &[Range]) -> Vec<Element> {
    let mut out = Vec::new();
    for r in ranges.iter().filter(|r| r.family == family) {
        out.push(Element {
            key: family.key(r.first),
            interval_end: false,
        });
        if r.last < family.max() {
            out.push(Element {
                key: family.key(r.last + 1),
                interval_end: true,
            });
        }
    }
    out
}

/// The ranges an interval set's elements describe; `None` when they do not describe ranges
/// (a key of the wrong length, two starts in a row).
pub fn ranges_of(family: Family, elements: &[Element]) -> Option<Vec<Range>> {
    let mut keyed: Vec<(u128, bool)> = elements
        .iter()
        .map(|e| Some((family.from_key(&e.key)?, !e.interval_end)))
        .collect::<Option<_>>()?;
    // At one address an end sorts before a start (false < true).
    keyed.sort_unstable();
    let mut out = Vec::new();
    let mut open: Option<u128> = None;
    for (n, is_start) in keyed {
        match (open, is_start) {
            (None, true) => open = Some(n),
            (Some(first), false) if n > first => {
                out.push(Range {
                    family,
                    first,
                    last: n - 1,
                });
                open = None;
            }
            // An end with nothing open (nft puts one at address 0) bounds nothing.
            (None, false) => {}
            _ => return None,
        }
    }
    if let Some(first) = open {
        out.push(Range {
            family,
            first,
            last: family.max(),
        });
    }
    Some(out)
}

/// A chain as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedChain {
    /// Its name.
    pub name: String,
    /// Hook number, if it is a base chain.
    pub hook: Option<u32>,
    /// Priority, if it is a base chain.
    pub priority: Option<i32>,
}

/// A set as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedSet {
    /// Its name.
    pub name: String,
    /// `NFTA_SET_FLAGS`.
    pub flags: u32,
    /// `NFTA_SET_KEY_TYPE`.
    pub key_type: u32,
    /// `NFTA_SET_KEY_LEN`.
    pub key_len: u32,
}

/// A rule as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedRule {
    /// Its chain.
    pub chain: String,
    /// Its comment, if any.
    pub comment: Option<String>,
    /// Its expressions: name and `NFTA_EXPR_DATA` payload.
    pub exprs: Vec<(String, Vec<u8>)>,
}

/// The agent's table as the kernel lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// Its chains.
    pub chains: Vec<ListedChain>,
    /// Its sets.
    pub sets: Vec<ListedSet>,
    /// The elements of each set (meters are not listed).
    pub elements: BTreeMap<String, Vec<Element>>,
    /// Its rules, per chain in order.
    pub rules: Vec<ListedRule>,
}

/// What the kernel has under the agent's table name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// No such table.
    Absent,
    /// The agent's table, exactly as this ruleset makes it.
    Ours(Ruleset),
    /// The agent's table, changed behind its back: what differs.
    Modified(String),
    /// A table of that name that the agent did not make (no mark), with what it carries.
    Foreign(String),
}

/// The ruleset the listed table implements: read from its sets and its limit, then checked by
/// laying that ruleset out again and comparing every set, element, chain and rule.
pub fn observe(listed: &Listed) -> Observed {
    match ruleset_of(listed).and_then(|r| same(&layout(&r), listed).map(|()| r)) {
        Ok(r) => Observed::Ours(r),
        Err(why) => Observed::Modified(why),
    }
}

/// The ruleset as read from the listed sets and the limit of a SYN rule.
fn ruleset_of(listed: &Listed) -> Result<Ruleset, String> {
    let mut blocked = Vec::new();
    for f in &FAMILIES {
        if let Some(elements) = listed.elements.get(f.blocked_set) {
            let ranges = ranges_of(f.family, elements)
                .ok_or_else(|| format!("set {} does not hold address ranges", f.blocked_set))?;
            blocked.extend(ranges.into_iter().flat_map(cover));
        }
    }
    let notrack_ports = match listed.elements.get(PORTS_SET) {
        None => Vec::new(),
        Some(elements) => {
            let mut ports = elements
                .iter()
                .map(|e| Some(u16::from_be_bytes(e.key.as_slice().try_into().ok()?)))
                .collect::<Option<Vec<u16>>>()
                .ok_or_else(|| format!("set {PORTS_SET} holds something other than ports"))?;
            ports.sort_unstable();
            ports
        }
    };
    let syn_limit = listed
        .rules
        .iter()
        .find(|r| r.comment.as_deref() == Some(FAMILIES[0].meter_rule))
        .map(|r| {
            r.exprs
                .iter()
                .find(|(name, _)| name == "dynset")
                .and_then(|(_, data)| limit_of(data))
                .ok_or_else(|| format!("rule {} has no readable limit", FAMILIES[0].meter_rule))
        })
        .transpose()?;
    Ok(Ruleset {
        blocked,
        syn_limit,
        notrack_ports,
    })
}

/// The per-second rate and burst of the limit inside a dynset expression's data.
fn limit_of(dynset: &[u8]) -> Option<SynLimit> {
    use super::attr::{be32, be64, find, parse};
    let d = parse(dynset)?;
    let e = parse(find(&d, sys::NFTA_DYNSET_EXPR)?)?;
    let l = parse(find(&e, sys::NFTA_EXPR_DATA)?)?;
    Some(SynLimit {
        per_second: u32::try_from(be64(find(&l, sys::NFTA_LIMIT_RATE)?)?).ok()?,
        burst: be32(find(&l, sys::NFTA_LIMIT_BURST)?)?,
    })
}

/// Whether the listed table is exactly `want`; the first difference otherwise.
fn same(want: &Layout, listed: &Listed) -> Result<(), String> {
    let mut chains: Vec<String> = want
        .chains
        .iter()
        .map(|c| {
            format!(
                "{} hook {} priority {}",
                c.name,
                c.hook.number(),
                c.priority
            )
        })
        .collect();
    let mut have: Vec<String> = listed
        .chains
        .iter()
        .map(|c| match (c.hook, c.priority) {
            (Some(h), Some(p)) => format!("{} hook {h} priority {p}", c.name),
            _ => format!("{} (not a base chain)", c.name),
        })
        .collect();
    chains.sort();
    have.sort();
    if chains != have {
        return Err(format!("chains are {have:?}, not {chains:?}"));
    }
    let mut sets: Vec<ListedSet> = want
        .sets
        .iter()
        .map(|s| ListedSet {
            name: s.name.to_string(),
            flags: s.flags(),
            key_type: s.key_type,
            key_len: s.key_len,
        })
        .collect();
    let mut have_sets = listed.sets.clone();
    sets.sort_by(|a, b| a.name.cmp(&b.name));
    have_sets.sort_by(|a, b| a.name.cmp(&b.name));
    if sets != have_sets {
        return Err(format!("sets are {have_sets:?}, not {sets:?}"));
    }
    for set in want.sets.iter().filter(|s| s.kind != SetKind::Meter) {
        let mut have = listed.elements.get(set.name).cloned().unwrap_or_default();
        let mut elements = set.elements.clone();
        have.sort();
        elements.sort();
        // nft adds an interval end at address 0 to every interval set; it bounds nothing.
        have.retain(|e| !(e.interval_end && e.key.iter().all(|b| *b == 0)));
        if have != elements {
            return Err(format!("set {} holds other elements", set.name));
        }
    }
    if want.rules.len() != listed.rules.len() {
        return Err(format!(
            "{} rules instead of {}",
            listed.rules.len(),
            want.rules.len()
        ));
    }
    for chain in &want.chains {
        let wanted = want.rules.iter().filter(|r| r.chain == chain.name);
        let mut listed_here = listed.rules.iter().filter(|r| r.chain == chain.name);
        for rule in wanted {
            let Some(got) = listed_here.next() else {
                return Err(format!("rule {} is missing", rule.comment));
            };
            let exprs_match = got.exprs.len() == rule.exprs.len()
                && rule
                    .exprs
                    .iter()
                    .zip(&got.exprs)
                    .all(|(e, (name, data))| e.matches_dump(name, data));
            if got.comment.as_deref() != Some(rule.comment) || !exprs_match {
                return Err(format!(
                    "rule {:?} in chain {} is not rule {}",
                    got.comment.as_deref().unwrap_or("(no comment)"),
                    chain.name,
                    rule.comment
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host::nftables::attr::encode_all;
    use crate::host::nftables::ruleset::Prefix;

    /// The listing the kernel gives of a table created from `layout` (its echo of every
    /// attribute written; a counter's running totals).
    pub(crate) fn listed(layout: &Layout) -> Listed {
        Listed {
            chains: layout
                .chains
                .iter()
                .map(|c| ListedChain {
                    name: c.name.into(),
                    hook: Some(c.hook.number()),
                    priority: Some(c.priority),
                })
                .collect(),
            sets: layout
                .sets
                .iter()
                .map(|s| ListedSet {
                    name: s.name.into(),
                    flags: s.flags(),
                    key_type: s.key_type,
                    key_len: s.key_len,
                })
                .collect(),
            elements: layout
                .sets
                .iter()
                .filter(|s| s.kind != SetKind::Meter)
                .map(|s| (s.name.to_string(), s.elements.clone()))
                .collect(),
            rules: layout
                .rules
                .iter()
                .map(|r| ListedRule {
                    chain: r.chain.into(),
                    comment: Some(r.comment.into()),
                    exprs: r
                        .exprs
                        .iter()
                        .map(|e| (e.name.to_string(), encode_all(&e.data)))
                        .collect(),
                })
                .collect(),
        }
    }

    fn ruleset(prefixes: &[&str], limit: Option<(u32, u32)>, ports: &[u16]) -> Ruleset {
        Ruleset {
            blocked: prefixes.iter().map(|p| Prefix::parse(p).unwrap()).collect(),
            syn_limit: limit.map(|(per_second, burst)| SynLimit { per_second, burst }),
            notrack_ports: ports.to_vec(),
        }
    }

    fn summary(l: &Layout) -> Vec<String> {
        let sets = l.sets.iter().map(|s| {
            format!(
                "set {} flags {:#x} type {} len {} elements {}",
                s.name,
                s.flags(),
                s.key_type,
                s.key_len,
                s.elements.len()
            )
        });
        let chains = l
            .chains
            .iter()
            .map(|c| format!("chain {} {:?} {}", c.name, c.hook, c.priority));
        let rules = l.rules.iter().map(|r| {
            let names: Vec<&str> = r.exprs.iter().map(|e| e.name).collect();
            format!("rule {} {}: {}", r.chain, r.comment, names.join(" "))
        });
        sets.chain(chains).chain(rules).collect()
    }

    #[test]
    fn rulesets_lay_out_as_sets_chains_and_rules() {
        let full = layout(&ruleset(
            &["10.0.0.0/8", "198.19.20.0/25", "2001:db8::/32"],
            Some((10, 5)),
            &[80, 443],
        ));
        assert_eq!(
            summary(&full),
            [
                "set blocked4 flags 0x4 type 7 len 4 elements 4",
                "set blocked6 flags 0x4 type 8 len 16 elements 2",
                "set syn4 flags 0x30 type 7 len 4 elements 0",
                "set syn6 flags 0x30 type 8 len 16 elements 0",
                "set notrack_ports flags 0x0 type 13 len 2 elements 2",
                "chain prerouting Prerouting -300",
                "chain output Output -300",
                "rule prerouting blocked-ipv4: meta cmp payload lookup counter immediate",
                "rule prerouting blocked-ipv6: meta cmp payload lookup counter immediate",
                "rule prerouting syn-limit-ipv4: meta cmp payload bitwise cmp meta cmp payload \
                 dynset counter immediate",
                "rule prerouting syn-limit-ipv6: meta cmp payload bitwise cmp meta cmp payload \
                 dynset counter immediate",
                "rule prerouting notrack-in: meta cmp payload lookup notrack counter immediate",
                "rule output notrack-out: meta cmp payload lookup notrack counter immediate",
            ]
        );
        assert_eq!(
            summary(&layout(&Ruleset::default())),
            ["chain prerouting Prerouting -300"]
        );
    }

    #[test]
    fn interval_elements_mark_the_address_after_each_range() {
        let r = ruleset(&["10.0.0.0/8", "255.255.255.0/24"], None, &[]);
        let l = layout(&r);
        let keys: Vec<(Vec<u8>, bool)> = l.sets[0]
            .elements
            .iter()
            .map(|e| (e.key.clone(), e.interval_end))
            .collect();
        assert_eq!(
            keys,
            [
                (vec![10, 0, 0, 0], false),
                (vec![11, 0, 0, 0], true),
                (vec![255, 255, 255, 0], false), // runs to the top: no end element
            ]
        );
        assert_eq!(
            ranges_of(Family::V4, &l.sets[0].elements).map(|r| r.len()),
            Some(2)
        );
        // nft's leading end at 0 bounds nothing; two starts in a row are not ranges.
        let mut with_zero = l.sets[0].elements.clone();
        with_zero.insert(
            0,
            Element {
                key: vec![0; 4],
                interval_end: true,
            },
        );
        assert_eq!(
            ranges_of(Family::V4, &with_zero),
            ranges_of(Family::V4, &l.sets[0].elements)
        );
        let two_starts = [l.sets[0].elements[0].clone(), l.sets[0].elements[2].clone()];
        assert_eq!(ranges_of(Family::V4, &two_starts), None);
    }

    #[test]
    fn a_listed_table_reads_back_as_its_ruleset() {
        for r in [
            ruleset(&[], None, &[]),
            ruleset(&["198.19.20.2/32", "::/0"], Some((10, 5)), &[]),
            ruleset(&["0.0.0.0/0"], None, &[80]),
            ruleset(&["10.0.0.0/8", "2001:db8::/32"], Some((1000, 50)), &[7, 9]),
        ] {
            assert_eq!(observe(&listed(&layout(&r))), Observed::Ours(r));
        }
    }

    /// Random rulesets: IPv4 prefixes in 10.0.0.0/16 and IPv6 ones in 2001:db8::/112 (small
    /// ranges, so that they nest, touch and overlap), a limit or none, a few ports.
    fn rulesets() -> impl proptest::strategy::Strategy<Value = Ruleset> {
        use proptest::prelude::*;
        let v4 = (any::<u16>(), 16u32..=32).prop_map(|(host, len)| {
            let p = Prefix {
                family: Family::V4,
                start: (10 << 24) | u128::from(host),
                len,
            };
            Prefix {
                start: p.start & !(p.end() - p.start),
                ..p
            }
        });
        let v6 = (any::<u16>(), 112u32..=128).prop_map(|(host, len)| {
            let p = Prefix {
                family: Family::V6,
                start: (0x2001_0db8u128 << 96) | u128::from(host),
                len,
            };
            Prefix {
                start: p.start & !(p.end() - p.start),
                ..p
            }
        });
        let limit = proptest::option::of((1u32..=1_000_000, 1u32..=1_000_000));
        let ports = proptest::collection::btree_set(1u16.., 0..4);
        (
            proptest::collection::vec(prop_oneof![v4, v6], 0..12),
            limit,
            ports,
        )
            .prop_map(|(prefixes, limit, ports)| Ruleset {
                blocked: super::super::ruleset::canonical(&prefixes),
                syn_limit: limit.map(|(per_second, burst)| SynLimit { per_second, burst }),
                notrack_ports: ports.into_iter().collect(),
            })
    }

    proptest::proptest! {
        #[test]
        fn every_ruleset_reads_back_from_its_table_and_its_description(r in rulesets()) {
            proptest::prop_assert_eq!(observe(&listed(&layout(&r))), Observed::Ours(r.clone()));
            proptest::prop_assert_eq!(Ruleset::parse(&r.render()), Ok(r));
        }
    }

    #[test]
    fn changes_behind_the_agents_back_are_seen() {
        let r = ruleset(&["10.0.0.0/8"], Some((10, 5)), &[80]);
        let base = listed(&layout(&r));
        let mut extra_rule = base.clone();
        extra_rule.rules.push(extra_rule.rules[0].clone());
        let mut other_elements = base.clone();
        other_elements.elements.insert("blocked4".into(), vec![]);
        let mut changed_limit = base.clone();
        changed_limit.rules[1].exprs[8].1 =
            encode_all(&Expr::dynset_update("syn4", &Expr::limit_over(10, 6)).data);
        let mut renamed = base.clone();
        renamed.rules[0].comment = Some("mine".into());
        let mut moved = base.clone();
        moved.chains[0].priority = Some(0);
        for (what, l) in [
            ("extra rule", extra_rule),
            ("elements", other_elements),
            ("limit", changed_limit),
            ("comment", renamed),
            ("priority", moved),
        ] {
            assert!(
                matches!(observe(&l), Observed::Modified(_)),
                "{what}: {:?}",
                observe(&l)
            );
        }
    }
}
