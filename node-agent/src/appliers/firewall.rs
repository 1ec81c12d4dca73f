//! nftables: the agent's own table, `inet hoststack`, as one setting.
//!
//! The setting `nftables inet/hoststack` has as its value the one-line description of the
//! table ([`Ruleset::render`]), or `absent` when there is none. Writing a description replaces
//! the table atomically (one netlink batch deletes the old table and adds the new one), writing
//! `absent` deletes it; so the transaction's journal, undo and revert work for the table as for
//! a sysctl. Reading lists the table from the kernel and turns it back into a description,
//! after checking every set, element, chain and rule against what that description makes.
//!
//! The agent only touches a table it made: the table carries the comment [`layout::MARK`]. A
//! table of that name without it reads as unreadable, which fails the revision before any
//! write, and the [`Nftables`] port refuses to replace or delete it. The table's ruleset, its
//! nftables objects and the netlink I/O are the port's ([`crate::host::nftables`]).

use std::io;
use std::net::IpAddr;

use hoststack_crds::Firewall;

use super::Applier;
use crate::host::nftables::{layout, ruleset, Observed, Ruleset};
use crate::host::{Host, Nftables, Port};
use crate::model::{invalid, Kind, Reading, Setting, Wants};

/// The applier of [`Kind::Nftables`].
#[derive(Clone, Copy, Debug)]
pub struct Table;

impl Applier for Table {
    fn ports(&self) -> &'static [Port] {
        &[Port::Nftables]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        match host.nftables() {
            Ok(nftables) => read(nftables, target),
            Err(missing) => missing.into(),
        }
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host.nftables()?, target, value)
    }
}

/// The setting's target: family and name of the table.
pub const TARGET: &str = "inet/hoststack";
/// The value of the setting when the table does not exist.
pub const ABSENT: &str = "absent";

/// The setting of the agent's table.
pub fn setting() -> Setting {
    Setting::new(Kind::Nftables, TARGET)
}

/// What the `firewall` section of a spec asks for: the table's description, or the reasons
/// the spec is refused (before any write).
///
/// Besides a malformed spec, a blocked prefix that contains `api_server` (the API server's
/// address) is refused: the table would drop the API server's answers, cutting the agent off
/// from the API server and so from any later fix of the spec.
pub fn desired(spec: &Firewall, api_server: Option<IpAddr>) -> Wants {
    let ruleset = Ruleset::from_spec(spec);
    let mut problems = ruleset.clone().err().unwrap_or_default();
    if let Some(api) = api_server {
        for (i, text) in spec.blocked_prefixes.iter().enumerate() {
            if ruleset::Prefix::parse(text.trim()).is_ok_and(|p| p.contains(api)) {
                problems.push(format!(
                    "firewall.blockedPrefixes[{i}]: {text} contains the API server's address \
                     {api}; blocking it would cut this agent off from the API server (and so \
                     from any fix of the spec)"
                ));
            }
        }
    }
    let mut wants = Wants::default();
    match ruleset {
        Ok(ruleset) if problems.is_empty() => wants.set(setting(), ruleset.render()),
        _ => {
            for p in problems {
                wants.refuse(Kind::Nftables.as_str(), TARGET, p);
            }
        }
    }
    wants
}

/// Reads the table through `nftables`.
pub fn read(nftables: &dyn Nftables, target: &str) -> Reading {
    if target != TARGET {
        return Reading::Missing(format!("{target}: hoststack manages only {TARGET}"));
    }
    match nftables.read_table() {
        Ok(Observed::Absent) => Reading::Value(ABSENT.into()),
        Ok(Observed::Ours(ruleset)) => Reading::Value(ruleset.render()),
        Ok(Observed::Modified(why)) => Reading::Value(format!("modified: {why}")),
        Ok(Observed::Foreign(what)) => Reading::Unreadable(format!(
            "table inet hoststack exists but hoststack did not make it ({what}, not the comment \
             {:?}); hoststack never replaces or deletes a table it did not make: remove or \
             rename it",
            layout::MARK
        )),
        Err(e) => Reading::Unreadable(format!("cannot list nftables table inet hoststack: {e}")),
    }
}

/// Writes the table through `nftables`: `absent` deletes it, a description replaces it. Any
/// other value (such as the `modified: ...` of a table changed behind the agent's back) is
/// refused.
pub fn write(nftables: &dyn Nftables, target: &str, value: &str) -> io::Result<()> {
    if target != TARGET {
        return Err(invalid(format!(
            "{target}: hoststack manages only {TARGET}"
        )));
    }
    if value.trim() == ABSENT {
        return nftables.delete_table();
    }
    let ruleset = Ruleset::parse(value.trim()).map_err(invalid)?;
    nftables.replace_table(&ruleset)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hoststack_crds::SynRateLimit;

    use super::*;

    /// An nftables that keeps the table in memory.
    #[derive(Debug, Default)]
    struct Tables(Mutex<Option<Observed>>);

    impl Nftables for Tables {
        fn read_table(&self) -> io::Result<Observed> {
            Ok(self.0.lock().unwrap().clone().unwrap_or(Observed::Absent))
        }
        fn replace_table(&self, ruleset: &Ruleset) -> io::Result<()> {
            *self.0.lock().unwrap() = Some(Observed::Ours(ruleset.clone()));
            Ok(())
        }
        fn delete_table(&self) -> io::Result<()> {
            *self.0.lock().unwrap() = None;
            Ok(())
        }
    }

    #[test]
    fn a_spec_becomes_one_setting_or_refusals() {
        let spec = Firewall {
            blocked_prefixes: vec!["198.19.20.2/32".into()],
            syn_rate_limit: Some(SynRateLimit {
                per_second: 10,
                burst: 20,
            }),
            notrack_ports: vec![80],
        };
        let w = desired(&spec, Some("198.18.1.1".parse().unwrap()));
        assert!(w.refused.is_empty());
        assert_eq!(
            w.settings,
            [(
                setting(),
                "blocked 198.19.20.2/32; syn-limit 10/second burst 20; notrack 80".to_string()
            )]
        );
        let bad = Firewall {
            blocked_prefixes: vec!["198.19.20.2/24".into()],
            ..Firewall::default()
        };
        let w = desired(&bad, None);
        assert!(w.settings.is_empty());
        assert_eq!(w.refused.len(), 1);
        assert_eq!(w.refused[0].kind, "nftables");
        assert_eq!(w.refused[0].target, TARGET);
        assert!(w.refused[0].message.contains("host bits set"));
        let api = Firewall {
            blocked_prefixes: vec!["198.19.20.0/24".into(), "198.18.0.0/15".into()],
            ..Firewall::default()
        };
        let w = desired(&api, Some("198.18.1.1".parse().unwrap()));
        assert!(w.settings.is_empty());
        assert_eq!(
            w.refused
                .iter()
                .map(|r| r.message.as_str())
                .collect::<Vec<_>>(),
            [
                "firewall.blockedPrefixes[1]: 198.18.0.0/15 contains the API server's address \
              198.18.1.1; blocking it would cut this agent off from the API server (and so from \
              any fix of the spec)"
            ]
        );
        assert_eq!(desired(&api, None).refused, []);
    }

    #[test]
    fn values_write_and_read_back_through_the_kernel() {
        let k = Tables::default();
        assert_eq!(read(&k, TARGET), Reading::Value("absent".into()));
        let value = "blocked 10.0.0.0/8; syn-limit none; notrack none";
        write(&k, TARGET, value).unwrap();
        assert_eq!(read(&k, TARGET), Reading::Value(value.into()));
        write(&k, TARGET, "absent").unwrap();
        assert_eq!(read(&k, TARGET), Reading::Value("absent".into()));
        let refused = write(&k, TARGET, "modified: 3 rules instead of 2").unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
        assert!(write(&k, "ip/filter", value).is_err());
        assert!(matches!(read(&k, "ip/filter"), Reading::Missing(_)));
    }

    #[test]
    fn a_table_the_agent_did_not_make_is_unreadable() {
        let k = Tables(Mutex::new(Some(Observed::Foreign("no comment".into()))));
        match read(&k, TARGET) {
            Reading::Unreadable(m) => {
                assert!(m.contains("hoststack did not make it (no comment"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let k = Tables(Mutex::new(Some(Observed::Modified(
            "2 rules instead of 1".into(),
        ))));
        assert_eq!(
            read(&k, TARGET),
            Reading::Value("modified: 2 rules instead of 1".into())
        );
    }
}
