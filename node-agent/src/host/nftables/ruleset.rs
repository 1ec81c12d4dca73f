//! The canonical ruleset: what the agent's table holds, independent of how nftables encodes it.
//!
//! A [`Ruleset`] is made from the spec ([`Ruleset::from_spec`], which refuses bad input), is
//! rendered as the one-line description that the journal and status carry
//! ([`Ruleset::render`]), and is parsed back from it ([`Ruleset::parse`]) when the transaction
//! writes or restores a value. Blocked prefixes are kept canonical: the smallest set of CIDR
//! prefixes that covers exactly the addresses of the spec's prefixes (nested ones dropped,
//! adjacent ones joined), so that a spec, its description and what the kernel holds compare
//! equal.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hoststack_crds::Firewall;

/// The kernel's burst for a packet limit given as 0 (`NFT_LIMIT_PKT_BURST_DEFAULT`): the
/// kernel has no packet limit without burst.
pub const KERNEL_DEFAULT_BURST: u32 = 5;

/// What the description says where a part is not used.
const NONE: &str = "none";

/// Everything the agent's table does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Source prefixes to drop: canonical (see the module doc), IPv4 before IPv6, ascending.
    pub blocked: Vec<Prefix>,
    /// New TCP connections allowed per source, if limited.
    pub syn_limit: Option<SynLimit>,
    /// TCP ports accepted without connection tracking, ascending, no duplicates.
    pub notrack_ports: Vec<u16>,
}

/// A per-source SYN rate limit as the kernel applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynLimit {
    /// SYNs per second per source address.
    pub per_second: u32,
    /// SYNs let through at once above the rate (never 0: see [`KERNEL_DEFAULT_BURST`]).
    pub burst: u32,
}

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4: 32-bit addresses.
    V4,
    /// IPv6: 128-bit addresses.
    V6,
}

impl Family {
    /// Address width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The highest address, as a number.
    pub fn max(self) -> u128 {
        match self {
            Family::V4 => u128::from(u32::MAX),
            Family::V6 => u128::MAX,
        }
    }

    /// An address of this family from its number.
    pub fn addr(self, n: u128) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
        }
    }

    /// The address as the kernel's set key: network byte order, 4 or 16 bytes.
    pub fn key(self, n: u128) -> Vec<u8> {
        match self {
            Family::V4 => (n as u32).to_be_bytes().to_vec(),
            Family::V6 => n.to_be_bytes().to_vec(),
        }
    }

    /// The number of a set key of this family; `None` when the length is wrong.
    pub fn from_key(self, key: &[u8]) -> Option<u128> {
        match self {
            Family::V4 => Some(u128::from(u32::from_be_bytes(key.try_into().ok()?))),
            Family::V6 => Some(u128::from_be_bytes(key.try_into().ok()?)),
        }
    }
}

/// A CIDR prefix with no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    /// Its family.
    pub family: Family,
    /// The network address as a number.
    pub start: u128,
    /// The prefix length.
    pub len: u32,
}

impl Prefix {
    /// The last address it covers.
    pub fn end(&self) -> u128 {
        let host_bits = self.family.bits() - self.len;
        if host_bits >= 128 {
            u128::MAX
        } else {
            self.start | ((1u128 << host_bits) - 1)
        }
    }

    /// Whether `addr` lies in the prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let (family, n) = match addr {
            IpAddr::V4(a) => (Family::V4, u128::from(u32::from(a))),
            IpAddr::V6(a) => (Family::V6, u128::from(a)),
        };
        family == self.family && self.start <= n && n <= self.end()
    }

    /// Parses `ADDR/LEN` (or a bare address, a single host), refusing host bits.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 prefix (ADDR/LEN)"))?;
        let (family, n) = match addr {
            IpAddr::V4(a) => (Family::V4, u128::from(u32::from(a))),
            IpAddr::V6(a) => (Family::V6, u128::from(a)),
        };
        let len = match len {
            None => family.bits(),
            Some(l) => Some(l)
                .filter(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|l| l.parse::<u32>().ok())
                .filter(|l| *l <= family.bits())
                .ok_or_else(|| {
                    format!(
                        "{text:?}: prefix length must be 0 to {} for this family",
                        family.bits()
                    )
                })?,
        };
        let prefix = Prefix {
            family,
            start: n,
            len,
        };
        let network = prefix.network();
        if network.start != n {
            return Err(format!(
                "{text:?} has host bits set; did you mean {network}? (refused rather than \
                 guessed, since the two block different addresses)"
            ));
        }
        Ok(prefix)
    }

    /// The prefix with its host bits cleared.
    fn network(&self) -> Prefix {
        let host_bits = self.family.bits() - self.len;
        let mask = if host_bits >= 128 {
            0
        } else {
            !((1u128 << host_bits) - 1)
        };
        Prefix {
            start: self.start & mask & self.family.max(),
            ..*self
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.family.addr(self.start), self.len)
    }
}

/// An inclusive range of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Range {
    /// Its family.
    pub family: Family,
    /// The first address.
    pub first: u128,
    /// The last address.
    pub last: u128,
}

/// The ranges the prefixes cover, joined where they overlap or touch, in order.
pub fn ranges(prefixes: &[Prefix]) -> Vec<Range> {
    let mut all: Vec<Range> = prefixes
        .iter()
        .map(|p| Range {
            family: p.family,
            first: p.start,
            last: p.end(),
        })
        .collect();
    all.sort();
    let mut out: Vec<Range> = Vec::new();
    for r in all {
        match out.last_mut() {
            Some(prev)
                if prev.family == r.family
                    && (prev.last == u128::MAX || r.first <= prev.last + 1) =>
            {
                prev.last = prev.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

/// The fewest prefixes that cover exactly `range`, in order.
pub fn cover(range: Range) -> Vec<Prefix> {
    let bits = range.family.bits();
    let mut out = Vec::new();
    let mut start = range.first;
    loop {
        // The largest aligned block at `start` that does not pass `last`.
        let align = if start == 0 {
            bits
        } else {
            start.trailing_zeros().min(bits)
        };
        let span = range.last - start; // block size - 1 must be <= span
        let fit = if span == u128::MAX {
            128
        } else {
            127 - (span + 1).leading_zeros()
        };
        let host_bits = align.min(fit).min(bits);
        out.push(Prefix {
            family: range.family,
            start,
            len: bits - host_bits,
        });
        let size_minus_one = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let block_last = start + size_minus_one;
        if block_last >= range.last {
            return out;
        }
        start = block_last + 1;
    }
}

/// The canonical form of a list of prefixes (see the module doc).
pub fn canonical(prefixes: &[Prefix]) -> Vec<Prefix> {
    ranges(prefixes).into_iter().flat_map(cover).collect()
}

impl Ruleset {
    /// The ruleset a spec asks for; every problem of the spec, each naming the field, when it
    /// cannot be made.
    ///
    /// Refused: a prefix that does not parse, one with host bits set (`10.0.0.1/8`: the user
    /// may have meant the host or the network, and the two block different traffic), port 0, a
    /// rate of 0.
    pub fn from_spec(spec: &Firewall) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let mut prefixes = Vec::new();
        for (i, text) in spec.blocked_prefixes.iter().enumerate() {
            match Prefix::parse(text.trim()) {
                Ok(p) => prefixes.push(p),
                Err(e) => errors.push(format!("firewall.blockedPrefixes[{i}]: {e}")),
            }
        }
        let syn_limit = spec.syn_rate_limit.as_ref().and_then(|l| {
            if l.per_second == 0 {
                errors.push("firewall.synRateLimit.perSecond: must be at least 1".into());
                return None;
            }
            Some(SynLimit {
                per_second: l.per_second,
                burst: if l.burst == 0 {
                    KERNEL_DEFAULT_BURST
                } else {
                    l.burst
                },
            })
        });
        let mut ports = spec.notrack_ports.clone();
        if ports.contains(&0) {
            errors.push("firewall.notrackPorts: port 0 is not a port".into());
        }
        ports.sort_unstable();
        ports.dedup();
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Ruleset {
            blocked: canonical(&prefixes),
            syn_limit,
            notrack_ports: ports,
        })
    }

    /// The blocked prefixes of one family.
    pub fn blocked(&self, family: Family) -> impl Iterator<Item = &Prefix> {
        self.blocked.iter().filter(move |p| p.family == family)
    }

    /// The one-line description: `blocked P...; syn-limit R/second burst B; notrack PORT...`,
    /// each part `none` when unused.
    pub fn render(&self) -> String {
        let blocked = if self.blocked.is_empty() {
            NONE.to_string()
        } else {
            join(&self.blocked)
        };
        let syn = match self.syn_limit {
            None => NONE.to_string(),
            Some(l) => format!("{}/second burst {}", l.per_second, l.burst),
        };
        let ports = if self.notrack_ports.is_empty() {
            NONE.to_string()
        } else {
            join(&self.notrack_ports)
        };
        format!("blocked {blocked}; syn-limit {syn}; notrack {ports}")
    }

    /// Parses a description made by [`Ruleset::render`]; anything else is refused, so that a
    /// value that did not come from the agent is never written.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("not a firewall description ({why}): {text:?}");
        let parts: Vec<&str> = text.split(';').map(str::trim).collect();
        let [blocked, syn, notrack] = parts[..] else {
            return Err(bad("want three parts separated by ';'"));
        };
        let words = |part: &str, head: &str| -> Result<Vec<String>, String> {
            let mut w = part.split_whitespace();
            if w.next() != Some(head) {
                return Err(bad(&format!("want a part starting with {head:?}")));
            }
            let rest: Vec<String> = w.map(str::to_string).collect();
            if rest.is_empty() {
                return Err(bad(&format!("{head} is empty")));
            }
            Ok(rest)
        };
        let is_none = |w: &[String]| w.len() == 1 && w[0] == NONE;

        let blocked = words(blocked, "blocked")?;
        let blocked = if is_none(&blocked) {
            Vec::new()
        } else {
            let prefixes = blocked
                .iter()
                .map(|p| Prefix::parse(p))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(&e))?;
            if canonical(&prefixes) != prefixes {
                return Err(bad("blocked prefixes are not canonical"));
            }
            prefixes
        };

        let syn = words(syn, "syn-limit")?;
        let syn_limit = if is_none(&syn) {
            None
        } else {
            let rate = syn[0].strip_suffix("/second");
            match (rate, syn.get(1).map(String::as_str), syn.get(2), syn.len()) {
                (Some(rate), Some("burst"), Some(burst), 3) => {
                    let number = |t: &str| t.parse::<u32>().ok().filter(|n| *n > 0);
                    match (number(rate), number(burst)) {
                        (Some(per_second), Some(burst)) => Some(SynLimit { per_second, burst }),
                        _ => return Err(bad("syn-limit wants positive numbers")),
                    }
                }
                _ => return Err(bad("want syn-limit R/second burst B")),
            }
        };

        let ports = words(notrack, "notrack")?;
        let notrack_ports = if is_none(&ports) {
            Vec::new()
        } else {
            let ports = ports
                .iter()
                .map(|p| p.parse::<u16>().ok().filter(|p| *p > 0))
                .collect::<Option<Vec<u16>>>()
                .ok_or_else(|| bad("notrack wants port numbers"))?;
            if !ports.windows(2).all(|w| w[0] < w[1]) {
                return Err(bad("notrack ports are not ascending"));
            }
            ports
        };
        Ok(Ruleset {
            blocked,
            syn_limit,
            notrack_ports,
        })
    }
}

/// Items joined by single spaces.
fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use hoststack_crds::SynRateLimit;

    use super::*;

    fn spec(prefixes: &[&str], limit: Option<(u32, u32)>, ports: &[u16]) -> Firewall {
        Firewall {
            blocked_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            syn_rate_limit: limit.map(|(per_second, burst)| SynRateLimit { per_second, burst }),
            notrack_ports: ports.to_vec(),
        }
    }

    #[test]
    fn specs_render_to_canonical_descriptions() {
        let table: &[(Firewall, &str)] = &[
            (
                spec(&[], None, &[]),
                "blocked none; syn-limit none; notrack none",
            ),
            (
                spec(&["198.19.20.2/32"], Some((10, 0)), &[443, 80, 80]),
                "blocked 198.19.20.2/32; syn-limit 10/second burst 5; notrack 80 443",
            ),
            (
                // Nested prefixes collapse, adjacent ones join, IPv4 sorts before IPv6, a bare
                // address is a host.
                spec(
                    &[
                        "2001:db8::/32",
                        "10.0.0.0/8",
                        "10.1.0.0/16",
                        "198.19.20.0/25",
                        "198.19.20.128/25",
                        "192.0.2.7",
                    ],
                    Some((100, 20)),
                    &[],
                ),
                "blocked 10.0.0.0/8 192.0.2.7/32 198.19.20.0/24 2001:db8::/32; \
                 syn-limit 100/second burst 20; notrack none",
            ),
            (
                spec(&["0.0.0.0/0", "::/0"], None, &[]),
                "blocked 0.0.0.0/0 ::/0; syn-limit none; notrack none",
            ),
        ];
        for (s, want) in table {
            let ruleset = Ruleset::from_spec(s).expect("valid spec");
            assert_eq!(ruleset.render(), *want);
            assert_eq!(Ruleset::parse(want).as_ref(), Ok(&ruleset), "{want}");
        }
    }

    #[test]
    fn bad_specs_are_refused_naming_the_field() {
        let s = spec(
            &[
                "10.0.0.1/8",
                "nonsense",
                "10.0.0.0/33",
                "2001:db8::1/32",
                "1.2.3.0/+24",
            ],
            Some((0, 0)),
            &[0, 80],
        );
        let errors = Ruleset::from_spec(&s).expect_err("refused");
        let want = [
            "firewall.blockedPrefixes[0]: \"10.0.0.1/8\" has host bits set; did you mean 10.0.0.0/8?",
            "firewall.blockedPrefixes[1]: \"nonsense\" is not an IPv4 or IPv6 prefix",
            "firewall.blockedPrefixes[2]: \"10.0.0.0/33\": prefix length must be 0 to 32",
            "firewall.blockedPrefixes[3]: \"2001:db8::1/32\" has host bits set; did you mean 2001:db8::/32?",
            "firewall.blockedPrefixes[4]: \"1.2.3.0/+24\": prefix length",
            "firewall.synRateLimit.perSecond: must be at least 1",
            "firewall.notrackPorts: port 0 is not a port",
        ];
        assert_eq!(errors.len(), want.len(), "{errors:#?}");
        for (e, w) in errors.iter().zip(want) {
            assert!(e.starts_with(w), "{e:?} should start with {w:?}");
        }
    }

    #[test]
    fn descriptions_not_made_by_render_are_refused() {
        for bad in [
            "",
            "absent",
            "blocked none; syn-limit none",
            "blocked 10.0.0.1/8; syn-limit none; notrack none",
            "blocked 10.0.0.0/25 10.0.0.128/25; syn-limit none; notrack none",
            "blocked none; syn-limit 10/minute burst 5; notrack none",
            "blocked none; syn-limit 10/second burst 0; notrack none",
            "blocked none; syn-limit none; notrack 443 80",
            "blocked none; syn-limit none; notrack 0",
            "blocked; syn-limit none; notrack none",
        ] {
            assert!(Ruleset::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefixes_contain_their_own_family_only() {
        let p = Prefix::parse("198.18.0.0/15").unwrap();
        assert!(p.contains("198.19.255.1".parse().unwrap()));
        assert!(!p.contains("198.20.0.0".parse().unwrap()));
        assert!(!p.contains("::ffff:198.18.0.1".parse().unwrap()));
        let all = Prefix::parse("::/0").unwrap();
        assert!(all.contains("2001:db8::1".parse().unwrap()));
        assert!(!all.contains("10.0.0.1".parse().unwrap()));
    }

    proptest::proptest! {
        /// Parsing a description never panics, and what parses renders back to itself.
        #[test]
        fn parsing_arbitrary_descriptions_never_panics(text in "(blocked|syn-limit|notrack|none|[0-9./:;a-f ]){0,12}") {
            if let Ok(r) = Ruleset::parse(&text) {
                proptest::prop_assert_eq!(Ruleset::parse(&r.render()), Ok(r));
            }
        }

        /// The canonical prefixes cover exactly the addresses the given ones cover, ascending
        /// and disjoint, and canonical is idempotent.
        #[test]
        fn canonical_prefixes_cover_the_same_addresses(
            given in proptest::collection::vec((0u32..256, 24u32..=32), 0..10),
            probes in proptest::collection::vec(0u32..256, 32),
        ) {
            let base = u128::from(u32::from(Ipv4Addr::new(198, 19, 20, 0)));
            let prefixes: Vec<Prefix> = given
                .iter()
                .map(|(host, len)| {
                    let p = Prefix { family: Family::V4, start: base + u128::from(*host), len: *len };
                    Prefix { start: p.start & !(p.end() - p.start), ..p }
                })
                .collect();
            let c = canonical(&prefixes);
            for probe in probes {
                let addr = IpAddr::V4(Ipv4Addr::from((base as u32) + probe));
                proptest::prop_assert_eq!(
                    prefixes.iter().any(|p| p.contains(addr)),
                    c.iter().any(|p| p.contains(addr)),
                    "{}", addr
                );
            }
            for w in c.windows(2) {
                proptest::prop_assert!(w[0].end() < w[1].start);
            }
            proptest::prop_assert_eq!(canonical(&c), c);
        }
    }

    #[test]
    fn ranges_are_covered_by_the_fewest_prefixes() {
        let v4 = |a: [u8; 4]| u128::from(u32::from(Ipv4Addr::from(a)));
        let table: &[(u128, u128, &str)] = &[
            (v4([10, 0, 0, 0]), v4([10, 0, 0, 255]), "10.0.0.0/24"),
            (
                v4([10, 0, 0, 1]),
                v4([10, 0, 0, 6]),
                "10.0.0.1/32 10.0.0.2/31 10.0.0.4/31 10.0.0.6/32",
            ),
            (0, u128::from(u32::MAX), "0.0.0.0/0"),
            (
                v4([255, 255, 255, 254]),
                u128::from(u32::MAX),
                "255.255.255.254/31",
            ),
        ];
        for (first, last, want) in table {
            let got = cover(Range {
                family: Family::V4,
                first: *first,
                last: *last,
            });
            assert_eq!(join(&got), *want);
        }
        let all_v6 = cover(Range {
            family: Family::V6,
            first: 0,
            last: u128::MAX,
        });
        assert_eq!(join(&all_v6), "::/0");
    }
}
