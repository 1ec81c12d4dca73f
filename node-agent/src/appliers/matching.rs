//! Interface matching: which of the host's interfaces an entry of `interfaces` applies to, by
//! name glob, driver and PCI address (every given field must match).
//!
//! A glob is matched in at most (pattern length + 1) x (name length + 1) steps, whatever the
//! pattern: a spec's author (or the preview-only identity) cannot stall the agent's loop with a
//! pattern of many stars.

use hoststack_crds::{check_interface_glob, InterfaceFacts, InterfaceMatch};

/// Whether `name` matches a shell-style glob: `*` (any run), `?` (one character), `[abc]`,
/// `[a-z]`, `[!a]` and `[^a]` (one character of a class, or not of it). A class runs to the first
/// `]` after its first member (`[]a]` holds `]` and `a`); a `[` that no `]` closes is a literal.
/// Takes at most (pattern length + 1) x (name length + 1) steps.
pub fn glob(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    match_tokens(&tokens(&pattern), &name).0
}

/// One element of a glob: a star matches a run of characters, every other token exactly one.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// `*`: any run of characters, the empty one too.
    Star,
    /// `?`: any one character.
    Any,
    /// A character that stands for itself.
    Literal(char),
    /// `[...]`: one character among the members (single characters and `a-z` ranges), or, when
    /// negated (`[!...]`, `[^...]`), one not among them.
    Class { negated: bool, members: Vec<char> },
}

impl Token {
    /// Whether this token, other than a star, matches the character `c`.
    fn matches(&self, c: char) -> bool {
        match self {
            Token::Star | Token::Any => true,
            Token::Literal(l) => *l == c,
            Token::Class { negated, members } => in_class(members, c) != *negated,
        }
    }
}

/// The tokens of a glob, left to right.
fn tokens(pattern: &[char]) -> Vec<Token> {
    let mut out = Vec::with_capacity(pattern.len());
    let mut i = 0;
    while i < pattern.len() {
        out.push(match pattern[i] {
            '*' => Token::Star,
            '?' => Token::Any,
            '[' => {
                let close = pattern
                    .get(i + 2..)
                    .and_then(|rest| rest.iter().position(|c| *c == ']'));
                match close {
                    None => Token::Literal('['),
                    Some(k) => {
                        let end = i + 2 + k;
                        let class = &pattern[i + 1..end];
                        i = end;
                        match class.split_first() {
                            Some(('!' | '^', members)) => Token::Class {
                                negated: true,
                                members: members.to_vec(),
                            },
                            _ => Token::Class {
                                negated: false,
                                members: class.to_vec(),
                            },
                        }
                    }
                }
            }
            c => Token::Literal(c),
        });
        i += 1;
    }
    out
}

/// Whether `c` is among a class's members: single characters and `a-z` ranges (a `-` first or
/// last stands for itself).
fn in_class(members: &[char], c: char) -> bool {
    let mut i = 0;
    while i < members.len() {
        if i + 2 < members.len() && members[i + 1] == '-' {
            if members[i] <= c && c <= members[i + 2] {
                return true;
            }
            i += 3;
        } else {
            if members[i] == c {
                return true;
            }
            i += 1;
        }
    }
    false
}

/// Whether `name` matches `tokens`, and the steps it took.
///
/// The star backtrack: tokens are matched left to right; on a mismatch, the last star seen takes
/// one more character and matching resumes after it. Moving an earlier star instead never helps,
/// since every token but a star takes exactly one character: whatever an earlier star's longer
/// run would let the rest match, the last star's run can take too. Each resumption starts one
/// character further into the name and runs at most one step per token, so the steps are at
/// most (tokens + 1) x (name length + 1).
fn match_tokens(tokens: &[Token], name: &[char]) -> (bool, usize) {
    let (mut t, mut n) = (0, 0);
    // The token after the last star seen, and where that star's run ends in the name.
    let mut last_star: Option<(usize, usize)> = None;
    let mut steps = 0;
    while n < name.len() {
        steps += 1;
        match tokens.get(t) {
            Some(Token::Star) => {
                t += 1;
                last_star = Some((t, n));
            }
            Some(token) if token.matches(name[n]) => {
                t += 1;
                n += 1;
            }
            _ => {
                let Some((after, run_end)) = last_star else {
                    return (false, steps);
                };
                last_star = Some((after, run_end + 1));
                (t, n) = (after, run_end + 1);
            }
        }
    }
    // The name is used up: only stars may be left.
    let rest = &tokens[t..];
    steps += rest.len();
    (rest.iter().all(|t| *t == Token::Star), steps)
}

/// Whether an interface matches: every field given matches (an empty match matches nothing,
/// and so does a name glob the API refuses, see [`check_interface_glob`]).
pub fn matches(m: &InterfaceMatch, iface: &InterfaceFacts) -> bool {
    let any = m.name.is_some() || m.driver.is_some() || m.pci_address.is_some();
    any && m
        .name
        .as_deref()
        .is_none_or(|g| check_interface_glob(g).is_ok() && glob(g, &iface.name))
        && m.driver
            .as_deref()
            .is_none_or(|d| iface.driver.as_deref() == Some(d))
        && m.pci_address.as_deref().is_none_or(|a| {
            iface
                .pci_address
                .as_deref()
                .is_some_and(|b| a.eq_ignore_ascii_case(b))
        })
}

/// The interfaces an entry applies to, in the order given.
pub fn select<'a>(m: &InterfaceMatch, interfaces: &'a [InterfaceFacts]) -> Vec<&'a InterfaceFacts> {
    interfaces.iter().filter(|i| matches(m, i)).collect()
}

/// A match written out for messages: `name=eth* driver=ixgbe`.
pub fn describe(m: &InterfaceMatch) -> String {
    let mut parts = Vec::new();
    if let Some(n) = &m.name {
        parts.push(format!("name={n}"));
    }
    if let Some(d) = &m.driver {
        parts.push(format!("driver={d}"));
    }
    if let Some(a) = &m.pci_address {
        parts.push(format!("pciAddress={a}"));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference: the recursive definition of a glob match the agent has always used, with
    /// its answers for (pattern position, name position) kept in a table filled from the ends,
    /// so that it takes (pattern length + 1) x (name length + 1) steps on any input.
    fn reference(pattern: &str, name: &str) -> bool {
        let p: Vec<char> = pattern.chars().collect();
        let n: Vec<char> = name.chars().collect();
        // at[i][j]: whether p[i..] matches n[j..].
        let mut at = vec![vec![false; n.len() + 1]; p.len() + 1];
        at[p.len()][n.len()] = true;
        for i in (0..p.len()).rev() {
            for j in (0..=n.len()).rev() {
                let next = |k: usize| j < n.len() && at[k][j + 1];
                at[i][j] = match p[i] {
                    '*' => at[i + 1][j] || (j < n.len() && at[i][j + 1]),
                    '?' => next(i + 1),
                    '[' => {
                        // A class runs to the first `]` after its first member; without one the
                        // `[` is a literal.
                        let close = p
                            .get(i + 2..)
                            .and_then(|rest| rest.iter().position(|c| *c == ']'));
                        match close {
                            None => j < n.len() && n[j] == '[' && next(i + 1),
                            Some(k) => {
                                let end = i + 2 + k;
                                let mut class = &p[i + 1..end];
                                let negate = matches!(class.first(), Some('!' | '^'));
                                if negate {
                                    class = &class[1..];
                                }
                                j < n.len() && among(class, n[j]) != negate && next(end + 1)
                            }
                        }
                    }
                    c => j < n.len() && n[j] == c && next(i + 1),
                };
            }
        }
        at[0][0]
    }

    /// Whether `c` is one of a class's members: single characters and `a-z` ranges.
    fn among(class: &[char], c: char) -> bool {
        let mut i = 0;
        while i < class.len() {
            if i + 2 < class.len() && class[i + 1] == '-' {
                if class[i] <= c && c <= class[i + 2] {
                    return true;
                }
                i += 3;
            } else {
                if class[i] == c {
                    return true;
                }
                i += 1;
            }
        }
        false
    }

    /// Patterns of stars against a node's worth of interface names as long as the kernel allows
    /// (15 bytes, as Calico's are): every 15-character pattern whose first 14 characters are `*`
    /// or `?`, at least 8 of them stars, and whose last is `b`, against 64 such names, of which
    /// those ending in `b` match some patterns. The backtracking matcher took 6.5 s (debug
    /// build) for the one pattern of 14 stars against one name, and about 3 minutes per name for
    /// all of these patterns: hours for the node. It counts on no clock; on that matcher it does
    /// not finish.
    #[test]
    fn star_patterns_against_a_node_of_long_names_agree_with_the_reference() {
        let names: Vec<String> = (1..=64u64)
            .map(|i| {
                format!(
                    "cali{:011x}",
                    0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i) >> 20
                )
            })
            .collect();
        let mut matched = 0;
        for bits in (0u32..1 << 14).filter(|b| b.count_ones() >= 8) {
            let pattern: String = (0..14)
                .map(|k| if bits & (1 << k) != 0 { '*' } else { '?' })
                .chain(['b'])
                .collect();
            for name in &names {
                let want = reference(&pattern, name);
                assert_eq!(glob(&pattern, name), want, "{pattern} vs {name}");
                matched += usize::from(want);
            }
        }
        // Not vacuous: some names end in `b`, and the patterns match them.
        assert!(matched > 0);
    }

    /// The patterns that took the backtracking matcher longest take at most (pattern length +
    /// 1) x (name length + 1) steps.
    #[test]
    fn star_patterns_take_at_most_pattern_times_name_steps() {
        let name: Vec<char> = "cali0123456789a".chars().collect();
        for pattern in ["**************b", "*a*a*a*a*a*a*ab", "*?*?*?*?*?*?*?b"] {
            let p: Vec<char> = pattern.chars().collect();
            let (matched, steps) = match_tokens(&tokens(&p), &name);
            assert!(!matched, "{pattern}");
            assert!(steps <= 16 * 16, "{pattern}: {steps} steps");
        }
    }

    proptest::proptest! {
        /// A match takes at most (pattern length + 1) x (name length + 1) steps, whatever the
        /// pattern, star-heavy ones included: linear in either length.
        #[test]
        fn steps_are_bounded_by_pattern_times_name(
            pattern in "[a*?\\[\\]!-]{0,24}",
            name in "[ab\\[\\]-]{0,15}",
        ) {
            let p: Vec<char> = pattern.chars().collect();
            let n: Vec<char> = name.chars().collect();
            let (_, steps) = match_tokens(&tokens(&p), &n);
            let bound = (p.len() + 1) * (n.len() + 1);
            proptest::prop_assert!(steps <= bound, "{} vs {}: {} steps", pattern, name, steps);
        }

        /// The matcher agrees with the reference on short patterns and names over an alphabet
        /// of every character the glob syntax gives a meaning to.
        #[test]
        fn agrees_with_the_reference(
            pattern in "[ab*?\\[\\]!^-]{0,10}",
            name in "[ab*?\\[\\]!^-]{0,8}",
        ) {
            proptest::prop_assert_eq!(
                glob(&pattern, &name),
                reference(&pattern, &name),
                "{} vs {}",
                pattern,
                name
            );
        }
    }

    #[test]
    fn globs() {
        let table: &[(&str, &str, bool)] = &[
            ("eth0", "eth0", true),
            ("eth0", "eth01", false),
            ("eth*", "eth0", true),
            ("eth*", "eth", true),
            ("eth*", "veth0", false),
            ("*0", "veth0", true),
            ("e?h1", "eth1", true),
            ("e?h1", "eh1", false),
            ("eth[0-2]", "eth2", true),
            ("eth[0-2]", "eth3", false),
            ("eth[!0]", "eth1", true),
            ("eth[!0]", "eth0", false),
            ("ens[13]f*", "ens3f0", true),
            ("[", "[", true),
            ("[a", "[a", true),
            ("eth[^0]", "eth1", true),
            ("[]a]", "]", true),
            ("[!]", "x", true),
            ("[a-]", "-", true),
            ("*", "", true),
        ];
        for (p, n, want) in table {
            assert_eq!(glob(p, n), *want, "{p} vs {n}");
        }
    }

    #[test]
    fn matching_table() {
        let ifs = vec![
            InterfaceFacts {
                name: "eth0".into(),
                driver: Some("virtio_net".into()),
                pci_address: Some("0000:00:03.0".into()),
                ..InterfaceFacts::default()
            },
            InterfaceFacts {
                name: "eth1".into(),
                driver: Some("ixgbe".into()),
                pci_address: Some("0000:af:00.1".into()),
                ..InterfaceFacts::default()
            },
            InterfaceFacts {
                name: "lo".into(),
                ..InterfaceFacts::default()
            },
        ];
        let m = |name: Option<&str>, driver: Option<&str>, pci: Option<&str>| InterfaceMatch {
            name: name.map(str::to_string),
            driver: driver.map(str::to_string),
            pci_address: pci.map(str::to_string),
        };
        let cases: &[(InterfaceMatch, &[&str])] = &[
            (m(Some("eth*"), None, None), &["eth0", "eth1"]),
            (m(Some("eth*"), Some("ixgbe"), None), &["eth1"]),
            (m(None, Some("virtio_net"), None), &["eth0"]),
            (m(None, None, Some("0000:AF:00.1")), &["eth1"]),
            (m(Some("lo"), Some("virtio_net"), None), &[]),
            (m(None, None, None), &[]),
            // A glob the API refuses (5 stars) matches nothing.
            (m(Some("*e*t*h*0*"), None, None), &[]),
        ];
        for (mat, want) in cases {
            let got: Vec<&str> = select(mat, &ifs).iter().map(|i| i.name.as_str()).collect();
            assert_eq!(got, *want, "{}", describe(mat));
        }
    }
}
