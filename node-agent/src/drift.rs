//! Drift: settings of the applied revision that changed on the host behind the agent's back.
//!
//! Pure functions over what the transaction already read: [`applied_settings`] says which
//! settings the host should hold (the applied revision's, as far as the journal manages them),
//! [`detect`] compares them with the readings, [`message`] words the result for the Drifted
//! condition, and [`only_drift`] tells whether a plan would do nothing but undo the drift (the
//! case the `Report` policy leaves alone). The reconciler acts on them as
//! `NodeConfig.driftPolicy` says.

use std::fmt;

use crate::appliers::applier;
use crate::journal::Journal;
use crate::model::{Reading, Setting};
use crate::transaction::{Goal, Plan, Readings, TargetValues};

/// One setting whose value on the host is no longer the one the applied revision set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The setting.
    pub setting: Setting,
    /// The value the applied revision asks for.
    pub desired: String,
    /// What the host holds instead: another value, or nothing at all.
    pub found: Reading,
}

impl fmt::Display for Drift {
    /// `kind target: desired X, found Y`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: desired {}, found ", self.setting, self.desired)?;
        match &self.found {
            Reading::Value(v) => write!(f, "{v}"),
            Reading::Missing(reason) => write!(f, "nothing ({reason})"),
            Reading::Unreadable(reason) => write!(f, "an unreadable value ({reason})"),
        }
    }
}

/// The settings the host should hold with their values: those of `goal` when the journal says
/// the host is on the goal's revision, limited to the settings the journal manages (a setting
/// the revision newly gained, e.g. for an interface that appeared, is work for a transaction,
/// not drift). Empty for a revert or another revision.
pub fn applied_settings(goal: &Goal, journal: &Journal) -> TargetValues {
    if goal.target.is_none() || journal.applied != goal.target {
        return TargetValues::new();
    }
    goal.values
        .iter()
        .filter(|(setting, _)| journal.original(setting).is_some())
        .map(|(setting, value)| (setting.clone(), value.clone()))
        .collect()
}

/// The applied settings whose reading differs from their desired value (as their kind compares
/// values), in setting order. A setting that was not read is not judged.
pub fn detect(applied: &TargetValues, readings: &Readings) -> Vec<Drift> {
    applied
        .iter()
        .filter_map(|(setting, desired)| {
            let found = readings.get(setting)?;
            let same =
                matches!(found, Reading::Value(v) if applier(setting.kind).same_value(v, desired));
            (!same).then(|| Drift {
                setting: setting.clone(),
                desired: desired.clone(),
                found: found.clone(),
            })
        })
        .collect()
}

/// Every drifted setting, `kind target: desired X, found Y`, joined by `; `.
pub fn message(drifted: &[Drift]) -> String {
    drifted
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether `plan` would do nothing but write the `drifted` settings back (or fail on them):
/// no original to add or release, every write and every failure about a drifted setting.
pub fn only_drift(plan: &Plan, drifted: &[Drift]) -> bool {
    let is_drifted = |s: &Setting| drifted.iter().any(|d| d.setting == *s);
    !drifted.is_empty()
        && plan.added.is_empty()
        && plan.released.is_empty()
        && plan.writes.iter().all(|write| is_drifted(&write.setting))
        && plan.failures.iter().all(|(setting, _)| is_drifted(setting))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Applied, Entry};
    use crate::model::Kind;
    use crate::transaction::{plan, Action, Write};

    fn s(key: &str) -> Setting {
        Setting::sysctl(key)
    }

    fn v(value: &str) -> Reading {
        Reading::Value(value.into())
    }

    fn applied(revision: &str) -> Option<Applied> {
        Some(Applied {
            tuning: "edge".into(),
            revision: revision.into(),
        })
    }

    fn values(pairs: &[(Setting, &str)]) -> TargetValues {
        pairs
            .iter()
            .map(|(s, v)| (s.clone(), v.to_string()))
            .collect()
    }

    #[test]
    fn applied_settings_are_the_managed_settings_of_the_revision_the_host_is_on() {
        let goal = Goal {
            target: applied("r1"),
            values: values(&[
                (s("net.ipv4.tcp_sack"), "0"),
                (s("net.core.somaxconn"), "8192"),
            ]),
        };
        let journal = Journal {
            originals: vec![Entry::new(&s("net.ipv4.tcp_sack"), "1")],
            applied: applied("r1"),
            ..Journal::default()
        };
        // somaxconn is not managed yet: a transaction's work, not drift.
        assert_eq!(
            applied_settings(&goal, &journal),
            values(&[(s("net.ipv4.tcp_sack"), "0")])
        );
        // Another revision, or a revert, has nothing applied to drift from.
        let other = Journal {
            applied: applied("r0"),
            ..journal.clone()
        };
        assert!(applied_settings(&goal, &other).is_empty());
        let revert = Goal::revert();
        let empty = Journal {
            applied: None,
            ..journal
        };
        assert!(applied_settings(&revert, &empty).is_empty());
    }

    #[test]
    fn detect_table() {
        let irq = Setting::new(Kind::IrqAffinity, "42");
        type Case = (
            &'static str,
            TargetValues,
            Vec<(Setting, Reading)>,
            Vec<Drift>,
        );
        let cases: Vec<Case> = vec![
            (
                "nothing changed",
                values(&[(s("net.ipv4.tcp_sack"), "0")]),
                vec![(s("net.ipv4.tcp_sack"), v("0"))],
                vec![],
            ),
            (
                "a value changed behind the agent's back",
                values(&[
                    (s("net.ipv4.tcp_sack"), "0"),
                    (s("net.core.somaxconn"), "8192"),
                ]),
                vec![
                    (s("net.ipv4.tcp_sack"), v("1")),
                    (s("net.core.somaxconn"), v("8192")),
                ],
                vec![Drift {
                    setting: s("net.ipv4.tcp_sack"),
                    desired: "0".into(),
                    found: v("1"),
                }],
            ),
            (
                "values compare as their kind does: whitespace, CPU sets",
                values(&[
                    (s("net.ipv4.tcp_rmem"), "4096 131072 6291456"),
                    (irq.clone(), "0-1"),
                ]),
                vec![
                    (s("net.ipv4.tcp_rmem"), v("4096\t131072\t6291456")),
                    (irq.clone(), v("0,1")),
                ],
                vec![],
            ),
            (
                "a setting that vanished or cannot be read has drifted",
                values(&[(s("net.ipv4.a"), "1"), (s("net.ipv4.b"), "1")]),
                vec![
                    (s("net.ipv4.a"), Reading::Missing("no such sysctl".into())),
                    (s("net.ipv4.b"), Reading::Unreadable("denied".into())),
                ],
                vec![
                    Drift {
                        setting: s("net.ipv4.a"),
                        desired: "1".into(),
                        found: Reading::Missing("no such sysctl".into()),
                    },
                    Drift {
                        setting: s("net.ipv4.b"),
                        desired: "1".into(),
                        found: Reading::Unreadable("denied".into()),
                    },
                ],
            ),
            (
                "a setting that was not read is not judged",
                values(&[(s("net.ipv4.tcp_sack"), "0")]),
                vec![],
                vec![],
            ),
        ];
        for (name, applied, readings, want) in cases {
            let readings: Readings = readings.into_iter().collect();
            assert_eq!(detect(&applied, &readings), want, "{name}");
        }
    }

    #[test]
    fn the_message_names_each_setting_with_both_values() {
        let drifted = [
            Drift {
                setting: s("net.ipv4.tcp_sack"),
                desired: "0".into(),
                found: v("1"),
            },
            Drift {
                setting: Setting::new(Kind::RpsCpus, "eth0/rx-0"),
                desired: "3".into(),
                found: Reading::Missing("no queue rx-0".into()),
            },
        ];
        assert_eq!(
            message(&drifted),
            "sysctl net.ipv4.tcp_sack: desired 0, found 1; \
             rpsCpus eth0/rx-0: desired 3, found nothing (no queue rx-0)"
        );
        assert_eq!(message(&[]), "");
    }

    #[test]
    fn only_drift_table() {
        let sack = Drift {
            setting: s("net.ipv4.tcp_sack"),
            desired: "0".into(),
            found: v("1"),
        };
        let write = |key: &str| Write {
            setting: s(key),
            before: "1".into(),
            value: "0".into(),
            action: Action::Set,
        };
        let cases: Vec<(&str, Plan, Vec<Drift>, bool)> = vec![
            ("no drift", Plan::default(), vec![], false),
            (
                "rewriting the drifted setting",
                Plan {
                    writes: vec![write("net.ipv4.tcp_sack")],
                    ..Plan::default()
                },
                vec![sack.clone()],
                true,
            ),
            (
                "failing on the drifted setting",
                Plan {
                    failures: vec![(s("net.ipv4.tcp_sack"), "gone".into())],
                    ..Plan::default()
                },
                vec![sack.clone()],
                true,
            ),
            (
                "another write too",
                Plan {
                    writes: vec![write("net.ipv4.tcp_sack"), write("net.core.somaxconn")],
                    ..Plan::default()
                },
                vec![sack.clone()],
                false,
            ),
            (
                "a new original to record",
                Plan {
                    writes: vec![write("net.ipv4.tcp_sack")],
                    added: vec![Entry::new(&s("net.core.somaxconn"), "4096")],
                    ..Plan::default()
                },
                vec![sack.clone()],
                false,
            ),
            (
                "a setting to release",
                Plan {
                    writes: vec![write("net.ipv4.tcp_sack")],
                    released: vec![s("net.core.somaxconn")],
                    ..Plan::default()
                },
                vec![sack],
                false,
            ),
        ];
        for (name, plan, drifted, want) in cases {
            assert_eq!(only_drift(&plan, &drifted), want, "{name}");
        }
    }

    #[test]
    fn the_plan_of_a_drifted_host_is_only_drift() {
        // The same readings through the real plan step: only the drifted setting is written.
        let goal = Goal {
            target: applied("r1"),
            values: values(&[
                (s("net.ipv4.tcp_sack"), "0"),
                (s("net.core.somaxconn"), "8192"),
            ]),
        };
        let journal = Journal {
            originals: vec![
                Entry::new(&s("net.ipv4.tcp_sack"), "1"),
                Entry::new(&s("net.core.somaxconn"), "4096"),
            ],
            applied: applied("r1"),
            ..Journal::default()
        };
        let readings: Readings = [
            (s("net.ipv4.tcp_sack"), v("1")),
            (s("net.core.somaxconn"), v("8192")),
        ]
        .into();
        let drifted = detect(&applied_settings(&goal, &journal), &readings);
        let planned = plan(&goal.values, &journal.originals, &readings);
        assert_eq!(drifted.len(), 1);
        assert!(only_drift(&planned, &drifted));
    }
}
