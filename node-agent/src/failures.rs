//! The memory of failed revisions: each assignment of a revision is tried once.
//!
//! A revision whose transaction failed is not tried again while its spec asks for it, and not
//! either when the same spec comes back after something else was asked for in between (a
//! withdrawal, the stable revision): a copy of the NodeTuning read before the rollback must not
//! undo it. Only a genuinely new assignment tries it again: the operator put the node back on
//! the revision, which is a spec *generation* newer than every generation that had moved the
//! node away from it. Every change of the spec bumps `metadata.generation` (a preview, a health
//! request, a rollout phase too), so a newer generation alone is not an assignment: as long as
//! nothing else was asked for, the revision stays failed whatever the generation.
//!
//! The memory is per object (by uid): a NodeTuning deleted and created again is a new
//! assignment of everything. It is the agent's own, in memory: an agent that restarts tries the
//! revision its spec asks for once more (and remembers it again if it fails again), as it did
//! before this memory existed.

use hoststack_crds::NodeTuning;

use crate::intent::Intent;
use crate::transaction::Outcome;

/// How many failed revisions are remembered at most; the oldest is forgotten first.
const REMEMBERED: usize = 16;

/// Which spec of which NodeTuning an intent comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecGeneration {
    /// The object's uid (`None` without an object).
    pub uid: Option<String>,
    /// Its `metadata.generation` (0 when it has none).
    pub generation: i64,
}

impl SpecGeneration {
    /// The spec generation of `object`.
    pub fn of(object: Option<&NodeTuning>) -> Self {
        SpecGeneration {
            uid: object.and_then(|o| o.metadata.uid.clone()),
            generation: object.and_then(|o| o.metadata.generation).unwrap_or(0),
        }
    }
}

/// A revision whose transaction failed, and what was reported about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    intent: Intent,
    outcome: Outcome,
    uid: Option<String>,
    /// The newest generation seen asking for the failed revision before it was moved away.
    generation: i64,
    /// The newest generation, newer than `generation`, that asked for something else.
    moved_away: Option<i64>,
}

impl Failure {
    /// The outcome the failed transaction reported.
    pub fn outcome(&self) -> &Outcome {
        &self.outcome
    }

    /// Sees the spec `spec` ask for `intent`; whether the failure still holds (`false`: the
    /// revision was assigned again, or the object is another one).
    fn holds_after(&mut self, intent: &Intent, spec: &SpecGeneration) -> bool {
        if *intent == Intent::Absent {
            // No object: nothing is assigned, nothing moved.
            return true;
        }
        if spec.uid != self.uid {
            return false;
        }
        if *intent == self.intent {
            if self.moved_away.is_some_and(|away| spec.generation > away) {
                return false;
            }
            if self.moved_away.is_none() {
                self.generation = self.generation.max(spec.generation);
            }
        } else if spec.generation > self.generation {
            self.moved_away = self.moved_away.max(Some(spec.generation));
        }
        true
    }
}

/// The failed revisions remembered, at most [`REMEMBERED`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Failures(Vec<Failure>);

impl Failures {
    /// Sees the spec `spec` ask for `intent`: forgets the failures it assigns again (and those
    /// of another object).
    pub fn observe(&mut self, intent: &Intent, spec: &SpecGeneration) {
        self.0.retain_mut(|f| {
            let holds = f.holds_after(intent, spec);
            if !holds {
                tracing::info!(
                    revision = f.intent.revision(),
                    generation = spec.generation,
                    "the failed revision was assigned again; trying it once more"
                );
            }
            holds
        });
    }

    /// The failure of `intent`, when it is remembered.
    pub fn of(&self, intent: &Intent) -> Option<&Failure> {
        self.0.iter().find(|f| f.intent == *intent)
    }

    /// Remembers that `intent`, asked for by `spec`, failed with `outcome`.
    pub fn remember(&mut self, intent: &Intent, spec: &SpecGeneration, outcome: &Outcome) {
        self.forget(intent);
        if self.0.len() == REMEMBERED {
            self.0.remove(0);
        }
        self.0.push(Failure {
            intent: intent.clone(),
            outcome: outcome.clone(),
            uid: spec.uid.clone(),
            generation: spec.generation,
            moved_away: None,
        });
    }

    /// Forgets the failure of `intent` (the host came to match it without the agent).
    pub fn forget(&mut self, intent: &Intent) {
        self.0.retain(|f| f.intent != *intent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{Mode, NodeConfig, NodeState, SysctlValue};

    fn revision(sack: &str) -> Intent {
        let mut config = NodeConfig::default();
        config
            .sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue(sack.into()));
        Intent::Revision {
            tuning: "edge".into(),
            revision: config.revision(),
            config: Box::new(config),
            mode: Mode::Apply,
        }
    }

    fn spec(uid: &str, generation: i64) -> SpecGeneration {
        SpecGeneration {
            uid: Some(uid.into()),
            generation,
        }
    }

    fn failed() -> Outcome {
        Outcome {
            state: NodeState::Failed,
            items: Vec::new(),
            message: Some("net.ipv4.tcp_sack: refused".into()),
            applied: None,
            self_revert: None,
        }
    }

    #[test]
    fn a_failed_revision_is_tried_again_only_when_assigned_again() {
        let (bad, good) = (revision("0"), revision("1"));
        // (what, the spec seen next, whether the failure of `bad` at generation 2 still holds)
        type Step<'a> = (&'a str, Intent, SpecGeneration, bool);
        let table: Vec<Vec<Step>> = vec![
            vec![
                ("the same spec again", bad.clone(), spec("u", 2), true),
                (
                    "a preview or health request",
                    bad.clone(),
                    spec("u", 3),
                    true,
                ),
                ("withdrawn", Intent::Withdrawn, spec("u", 4), true),
                ("the stale spec back", bad.clone(), spec("u", 2), true),
                ("the preview's copy back", bad.clone(), spec("u", 3), true),
                ("assigned again", bad.clone(), spec("u", 5), false),
            ],
            vec![
                ("the stable revision", good.clone(), spec("u", 3), true),
                ("withdrawn after it", Intent::Withdrawn, spec("u", 4), true),
                (
                    "the stable revision's copy back",
                    good.clone(),
                    spec("u", 3),
                    true,
                ),
                (
                    "the failed spec's copy back",
                    bad.clone(),
                    spec("u", 4),
                    true,
                ),
                ("assigned again", bad.clone(), spec("u", 6), false),
            ],
            vec![
                (
                    "an older copy of something else",
                    good.clone(),
                    spec("u", 1),
                    true,
                ),
                ("the same spec, newer", bad.clone(), spec("u", 3), true),
                ("the object deleted", Intent::Absent, spec("", 0), true),
                ("created again", bad.clone(), spec("v", 1), false),
            ],
        ];
        for steps in table {
            let mut failures = Failures::default();
            failures.remember(&bad, &spec("u", 2), &failed());
            for (what, intent, seen, holds) in steps {
                failures.observe(&intent, &seen);
                assert_eq!(failures.of(&bad).is_some(), holds, "{what}");
                assert!(failures.of(&good).is_none(), "{what}");
            }
        }
    }

    #[test]
    fn each_failed_revision_is_remembered_on_its_own() {
        let mut failures = Failures::default();
        let first = revision("0");
        failures.remember(&first, &spec("u", 2), &failed());
        let mut others = Vec::new();
        for i in 0..REMEMBERED {
            let other = revision(&format!("{}", i + 2));
            failures.remember(&other, &spec("u", 3 + i as i64), &failed());
            others.push(other);
        }
        // The oldest went to make room; the others are all there, each with its outcome.
        assert!(failures.of(&first).is_none());
        assert!(others.iter().all(|o| failures.of(o).is_some()));
        assert_eq!(failures.0.len(), REMEMBERED);
        assert_eq!(
            failures.of(&others[0]).map(|f| f.outcome()),
            Some(&failed())
        );
        failures.forget(&others[0]);
        assert!(failures.of(&others[0]).is_none());
        assert!(failures.of(&others[1]).is_some());
    }
}
