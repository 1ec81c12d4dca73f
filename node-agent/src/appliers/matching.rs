//! Interface matching: which of the host's interfaces an entry of `interfaces` applies to, by
//! name glob, driver and PCI address (every given field must match).

use hoststack_crds::{InterfaceFacts, InterfaceMatch};

/// Whether `name` matches a shell-style glob: `*` (any run), `?` (one character), `[abc]`,
/// `[a-z]` and `[!a]` (one character of a class).
pub fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    glob_at(&p, &n)
}

fn glob_at(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|i| glob_at(&p[1..], &n[i..])),
        Some('?') => !n.is_empty() && glob_at(&p[1..], &n[1..]),
        Some('[') => {
            let Some(end) = p.iter().skip(2).position(|c| *c == ']').map(|i| i + 2) else {
                return n.first() == Some(&'[') && glob_at(&p[1..], &n[1..]);
            };
            let Some(c) = n.first() else { return false };
            let class = &p[1..end];
            let (negate, class) = match class.first() {
                Some('!') | Some('^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == '-' {
                    hit |= class[i] <= *c && *c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == *c;
                    i += 1;
                }
            }
            hit != negate && glob_at(&p[end + 1..], &n[1..])
        }
        Some(c) => n.first() == Some(c) && glob_at(&p[1..], &n[1..]),
    }
}

/// Whether an interface matches: every field given matches (an empty match matches nothing).
pub fn matches(m: &InterfaceMatch, iface: &InterfaceFacts) -> bool {
    let any = m.name.is_some() || m.driver.is_some() || m.pci_address.is_some();
    any && m.name.as_deref().is_none_or(|g| glob(g, &iface.name))
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
        ];
        for (mat, want) in cases {
            let got: Vec<&str> = select(mat, &ifs).iter().map(|i| i.name.as_str()).collect();
            assert_eq!(got, *want, "{}", describe(mat));
        }
    }
}
