//! Where the probes of a tuning's targets may connect: the allow-list of destination prefixes
//! that whoever installs the agents chooses (the chart's `probes.allowedDestinations`, the
//! agent's `--probe-allowed-destinations`), and the pure decision (address, allow-list) →
//! allowed or refused.
//!
//! A tuning's author picks its probe targets, and the agents connect to them from the host
//! network of every node of the pool. Loopback, link-local and "this host" addresses reach what
//! only the node itself should (the kubelet's local ports, a cloud's metadata service at
//! 169.254.169.254), so they are refused even by a list that covers everything (`0.0.0.0/0`),
//! unless the list names a prefix inside them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::host::nftables::ruleset::Prefix;

/// The allow-list when none is given: every address but the guarded ones.
pub const DEFAULT_DESTINATIONS: &str = "0.0.0.0/0,::/0";

/// The ranges refused unless a listed prefix lies inside them, each with what it is.
const GUARDED: [(&str, &str); 6] = [
    ("0.0.0.0/8", "\"this host\" (0.0.0.0/8)"),
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
    ("169.254.0.0/16", "link-local (169.254.0.0/16)"),
    ("::/128", "the unspecified address (::)"),
    ("::1/128", "loopback (::1)"),
    ("fe80::/10", "link-local (fe80::/10)"),
];

/// The prefixes probes may connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Destinations {
    allowed: Vec<Prefix>,
}

impl Default for Destinations {
    fn default() -> Self {
        DEFAULT_DESTINATIONS
            .parse()
            .expect("the default destinations parse")
    }
}

impl FromStr for Destinations {
    type Err = String;

    /// Parses comma-separated CIDR prefixes (`10.0.0.0/8,fd00::/8`; a bare address is one
    /// host); every bad one is named. An empty list allows nothing.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut allowed = Vec::new();
        let mut errors = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match Prefix::parse(part) {
                Ok(p) => allowed.push(p),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(Destinations { allowed })
        } else {
            Err(errors.join("; "))
        }
    }
}

impl fmt::Display for Destinations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listed: Vec<String> = self.allowed.iter().map(Prefix::to_string).collect();
        write!(f, "{}", listed.join(","))
    }
}

impl Destinations {
    /// Whether a probe may connect to `address`; the refusal says which rule refused it. An
    /// IPv4-mapped IPv6 address is judged as the IPv4 address it is.
    pub fn judge(&self, address: IpAddr) -> Result<(), String> {
        let address = address.to_canonical();
        let guarded = GUARDED.iter().find_map(|(range, what)| {
            let range = Prefix::parse(range).expect("the guarded ranges parse");
            range.contains(address).then_some((range, *what))
        });
        match guarded {
            Some((range, what)) => {
                let named = self
                    .allowed
                    .iter()
                    .any(|p| p.contains(address) && inside(p, &range));
                if named {
                    Ok(())
                } else {
                    Err(format!(
                        "{address} is {what}, which probes may reach only where the agents' \
                         allowed destinations name a prefix inside it (they are {self})"
                    ))
                }
            }
            None if self.allowed.iter().any(|p| p.contains(address)) => Ok(()),
            None => Err(format!(
                "{address} is outside the agents' allowed destinations ({self})"
            )),
        }
    }
}

/// Whether prefix `p` lies wholly inside `range`.
fn inside(p: &Prefix, range: &Prefix) -> bool {
    p.family == range.family && p.start >= range.start && p.end() <= range.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(list: &str, address: &str) -> Result<(), String> {
        let destinations: Destinations = list.parse().unwrap();
        destinations.judge(address.parse().unwrap())
    }

    #[test]
    fn the_list_decides_and_loopback_link_local_and_this_host_need_naming() {
        let table: &[(&str, &str, bool)] = &[
            // The default: everything routable.
            (DEFAULT_DESTINATIONS, "198.18.0.9", true),
            (DEFAULT_DESTINATIONS, "2001:db8::1", true),
            (DEFAULT_DESTINATIONS, "127.0.0.1", false),
            (DEFAULT_DESTINATIONS, "127.1.2.3", false),
            (DEFAULT_DESTINATIONS, "::1", false),
            (DEFAULT_DESTINATIONS, "169.254.169.254", false),
            (DEFAULT_DESTINATIONS, "fe80::1", false),
            (DEFAULT_DESTINATIONS, "0.0.0.0", false),
            (DEFAULT_DESTINATIONS, "::", false),
            // An IPv4-mapped address is the IPv4 address.
            (DEFAULT_DESTINATIONS, "::ffff:127.0.0.1", false),
            (DEFAULT_DESTINATIONS, "::ffff:198.18.0.9", true),
            // A narrower list.
            ("198.18.0.0/15", "198.18.0.9", true),
            ("198.18.0.0/15", "198.20.0.1", false),
            ("198.18.0.0/15", "2001:db8::1", false),
            ("", "198.18.0.9", false),
            // A guarded range named by a prefix inside it.
            ("0.0.0.0/0,127.0.0.1/32", "127.0.0.1", true),
            ("0.0.0.0/0,127.0.0.1/32", "127.0.0.2", false),
            ("127.0.0.0/8", "127.9.9.9", true),
            ("169.254.0.0/16", "169.254.169.254", true),
            ("::1", "::1", true),
            ("fe80::/10", "fe80::1", true),
            // A prefix that merely covers a guarded range does not name it.
            ("126.0.0.0/7", "127.0.0.1", false),
            ("169.0.0.0/8", "169.254.169.254", false),
        ];
        for (list, address, allowed) in table {
            assert_eq!(
                judge(list, address).is_ok(),
                *allowed,
                "{address} under {list:?}: {:?}",
                judge(list, address)
            );
        }
    }

    #[test]
    fn a_refusal_names_the_address_and_the_rule() {
        assert_eq!(
            judge(DEFAULT_DESTINATIONS, "169.254.169.254"),
            Err(
                "169.254.169.254 is link-local (169.254.0.0/16), which probes may reach only \
                 where the agents' allowed destinations name a prefix inside it (they are \
                 0.0.0.0/0,::/0)"
                    .into()
            )
        );
        assert_eq!(
            judge("10.0.0.0/8", "198.18.0.9"),
            Err("198.18.0.9 is outside the agents' allowed destinations (10.0.0.0/8)".into())
        );
    }

    #[test]
    fn a_bad_list_is_refused_naming_each_bad_prefix() {
        let e = "10.0.0.0/8, 10.0.0.1/8,nonsense"
            .parse::<Destinations>()
            .unwrap_err();
        assert!(e.contains("\"10.0.0.1/8\" has host bits set"), "{e}");
        assert!(
            e.contains("\"nonsense\" is not an IPv4 or IPv6 prefix"),
            "{e}"
        );
    }
}
