//! The invariants a fault campaign checks over a whole [`History`]:
//!
//! 1. no host write for a revision on a node after that node reported it Failed or Reverted,
//!    unless the operator assigned it again under a newer generation;
//! 2. never more nodes in flight off the stable revision than maxUnavailable (the canary
//!    included; a move back onto the stable revision or off the tuning is not counted, nor a
//!    node assigned the revision it already had: a new rollout keeps nodes outside its waves on
//!    what they run, an earlier revision among others);
//! 3. after a rollback no node on the rolled-back revision and that revision never assigned
//!    again; after a delete every host equal to its baseline at each quiet point;
//! 4. every node at every quiet point entirely on one revision or entirely at its baseline;
//! 5. no journal original other than the host's value before the first tuning, and none
//!    overwritten while it is held.

use super::history::{Event, History, Node, Outcome, Purpose, Revision, Values};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Which of the five.
    pub invariant: u8,
    /// The index of the event where it broke.
    pub event: usize,
    /// What happened.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant {} at event {}: {}",
            self.invariant, self.event, self.message
        )
    }
}

/// Where a host stands against the revisions and its baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostState {
    /// Every key at its baseline.
    Baseline,
    /// Entirely on these revisions (more than one when they set the same values).
    On(Vec<Revision>),
    /// Partly changed: on no revision, and not at its baseline.
    Mixed,
}

/// Classifies `host`: on revision R when every key R sets has R's value and every other key
/// is at its baseline.
pub fn host_state(
    host: &Values,
    baseline: &Values,
    defined: &BTreeMap<Revision, Values>,
) -> HostState {
    let value = |key: &String| host.get(key).or_else(|| baseline.get(key));
    if baseline.iter().all(|(k, v)| value(k) == Some(v)) {
        return HostState::Baseline;
    }
    let on: Vec<Revision> = defined
        .iter()
        .filter(|(_, wants)| {
            wants.iter().all(|(k, v)| value(k) == Some(v))
                && baseline
                    .iter()
                    .all(|(k, v)| wants.contains_key(k) || value(k) == Some(v))
        })
        .map(|(r, _)| r.clone())
        .collect();
    if on.is_empty() {
        HostState::Mixed
    } else {
        HostState::On(on)
    }
}

/// Everything learned so far while walking the history.
#[derive(Default)]
struct Walk {
    defined: BTreeMap<Revision, Values>,
    baselines: BTreeMap<Node, Values>,
    stable: Option<Revision>,
    max_unavailable: usize,
    /// Each node's latest assignment and its generation.
    assigned: BTreeMap<Node, (Option<Revision>, i64)>,
    /// Revisions a node reported Failed or Reverted, with the generation it answered.
    ended: BTreeMap<(Node, Revision), i64>,
    /// Nodes moved off the stable revision whose outcome is pending, with the generation.
    in_flight: BTreeMap<Node, i64>,
    rolled_back: BTreeSet<Revision>,
    deleted: bool,
    journal: BTreeMap<(Node, String), String>,
    violations: Vec<Violation>,
}

impl Walk {
    fn violate(&mut self, invariant: u8, event: usize, message: String) {
        self.violations.push(Violation {
            invariant,
            event,
            message,
        });
    }

    fn step(&mut self, index: usize, event: &Event) {
        match event {
            Event::Defined { revision, values } => {
                self.defined.insert(revision.clone(), values.clone());
            }
            Event::Baseline { node, values } => {
                self.baselines.insert(node.clone(), values.clone());
            }
            Event::Rollout {
                stable,
                max_unavailable,
            } => {
                self.stable = stable.clone();
                self.max_unavailable = *max_unavailable;
            }
            Event::Assigned {
                node,
                revision,
                generation,
            } => self.assigned_event(index, node, revision, *generation),
            Event::HostWrite {
                node,
                purpose: Purpose::Apply(revision),
                key,
                value,
            } => {
                let ended = self.ended.get(&(node.clone(), revision.clone())).copied();
                let reassigned = |g: i64| {
                    self.assigned.get(node).is_some_and(|(r, generation)| {
                        r.as_ref() == Some(revision) && *generation > g
                    })
                };
                if let Some(g) = ended.filter(|&g| !reassigned(g)) {
                    self.violate(
                        1,
                        index,
                        format!(
                            "{node} wrote {key}={value} for {revision} after reporting it ended in generation {g}, with no newer assignment"
                        ),
                    );
                }
            }
            Event::HostWrite { .. } => {}
            Event::Reported {
                node,
                revision,
                generation,
                outcome,
            } => {
                if self.in_flight.get(node).is_some_and(|g| generation >= g) {
                    self.in_flight.remove(node);
                }
                match outcome {
                    Outcome::Applied => {
                        self.ended.remove(&(node.clone(), revision.clone()));
                    }
                    Outcome::Failed | Outcome::Reverted => {
                        self.ended
                            .insert((node.clone(), revision.clone()), *generation);
                    }
                }
            }
            Event::Journaled {
                node,
                key,
                original,
            } => self.journaled_event(index, node, key, original),
            Event::Released { node, key } => {
                self.journal.remove(&(node.clone(), key.clone()));
            }
            Event::RolledBack { revision } => {
                self.rolled_back.insert(revision.clone());
            }
            Event::Deleted => self.deleted = true,
            Event::Quiescent { hosts } => self.quiescent_event(index, hosts),
        }
    }

    fn assigned_event(
        &mut self,
        index: usize,
        node: &Node,
        revision: &Option<Revision>,
        generation: i64,
    ) {
        if let Some(r) = revision.as_ref().filter(|r| self.rolled_back.contains(*r)) {
            self.violate(
                3,
                index,
                format!("{node} assigned {r} after it was rolled back"),
            );
        }
        let previous = self
            .assigned
            .insert(node.clone(), (revision.clone(), generation))
            .map(|(r, _)| r);
        if revision.is_some() && *revision != self.stable {
            // The same revision again (a new phase, a health request, a node another rollout
            // keeps where it is) moves nothing: the node stays in flight or not, as it was.
            if previous.as_ref() != Some(revision) {
                self.in_flight.insert(node.clone(), generation);
            }
        } else {
            self.in_flight.remove(node);
        }
        if self.in_flight.len() > self.max_unavailable {
            let nodes: Vec<&str> = self.in_flight.keys().map(String::as_str).collect();
            let message = format!(
                "{} nodes in flight off the stable revision ({}), maxUnavailable {}",
                nodes.len(),
                nodes.join(", "),
                self.max_unavailable
            );
            self.violate(2, index, message);
        }
    }

    fn journaled_event(&mut self, index: usize, node: &Node, key: &String, original: &String) {
        let baseline = self.baselines.get(node).and_then(|b| b.get(key)).cloned();
        if let Some(before) = baseline.filter(|b| b != original) {
            self.violate(
                5,
                index,
                format!("{node} journaled {key}={original} as original; it was {before} before any tuning"),
            );
        }
        let slot = (node.clone(), key.clone());
        if let Some(held) = self.journal.get(&slot).filter(|h| *h != original) {
            let message =
                format!("{node} overwrote the journaled original {key}={held} with {original}");
            self.violate(5, index, message);
        }
        self.journal.insert(slot, original.clone());
    }

    fn quiescent_event(&mut self, index: usize, hosts: &BTreeMap<Node, Values>) {
        for (node, host) in hosts {
            let baseline = self.baselines.get(node).cloned().unwrap_or_default();
            let state = host_state(host, &baseline, &self.defined);
            if state == HostState::Mixed {
                self.violate(4, index, format!("{node} is partly tuned: {host:?}"));
            }
            if let HostState::On(revisions) = &state {
                if let Some(bad) = revisions
                    .iter()
                    .find(|r| self.rolled_back.contains(*r) && Some(*r) != self.stable.as_ref())
                {
                    self.violate(3, index, format!("{node} is on {bad} after its rollback"));
                }
            }
            if self.deleted && state != HostState::Baseline {
                self.violate(
                    3,
                    index,
                    format!("{node} is not back at its baseline after the delete: {host:?}"),
                );
            }
        }
    }
}

/// Every invariant the history breaks, in the order they broke.
pub fn check(history: &History) -> Vec<Violation> {
    let mut walk = Walk::default();
    for (index, event) in history.events.iter().enumerate() {
        walk.step(index, event);
    }
    walk.violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(pairs: &[(&str, &str)]) -> Values {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn assigned(node: &str, revision: Option<&str>, generation: i64) -> Event {
        Event::Assigned {
            node: node.into(),
            revision: revision.map(Into::into),
            generation,
        }
    }

    fn write(node: &str, revision: &str, key: &str, value: &str) -> Event {
        Event::HostWrite {
            node: node.into(),
            purpose: Purpose::Apply(revision.into()),
            key: key.into(),
            value: value.into(),
        }
    }

    fn reported(node: &str, revision: &str, generation: i64, outcome: Outcome) -> Event {
        Event::Reported {
            node: node.into(),
            revision: revision.into(),
            generation,
            outcome,
        }
    }

    fn journaled(node: &str, key: &str, original: &str) -> Event {
        Event::Journaled {
            node: node.into(),
            key: key.into(),
            original: original.into(),
        }
    }

    fn quiet(hosts: &[(&str, &[(&str, &str)])]) -> Event {
        Event::Quiescent {
            hosts: hosts
                .iter()
                .map(|(n, v)| (n.to_string(), values(v)))
                .collect(),
        }
    }

    /// Two nodes at sack=1 and rmem=4096; revision "a" sets sack=0, "b" also rmem=8192;
    /// maxUnavailable 1.
    fn setup() -> History {
        let mut h = History::default();
        h.push(Event::Defined {
            revision: "a".into(),
            values: values(&[("sack", "0")]),
        });
        h.push(Event::Defined {
            revision: "b".into(),
            values: values(&[("sack", "0"), ("rmem", "8192")]),
        });
        for node in ["n1", "n2"] {
            h.push(Event::Baseline {
                node: node.into(),
                values: values(&[("sack", "1"), ("rmem", "4096")]),
            });
        }
        h.push(Event::Rollout {
            stable: None,
            max_unavailable: 1,
        });
        h
    }

    /// Revision "a" rolled out canary first (n1) then n2, then deleted: every invariant holds.
    fn good_rollout_and_delete() -> History {
        let mut h = setup();
        for (node, generation) in [("n1", 1), ("n2", 1)] {
            h.push(assigned(node, Some("a"), generation));
            h.push(journaled(node, "sack", "1"));
            h.push(write(node, "a", "sack", "0"));
            h.push(reported(node, "a", generation, Outcome::Applied));
        }
        h.push(quiet(&[
            ("n1", &[("sack", "0"), ("rmem", "4096")]),
            ("n2", &[("sack", "0"), ("rmem", "4096")]),
        ]));
        h.push(Event::Deleted);
        for node in ["n1", "n2"] {
            h.push(assigned(node, None, 2));
            h.push(Event::HostWrite {
                node: node.into(),
                purpose: Purpose::Revert,
                key: "sack".into(),
                value: "1".into(),
            });
            h.push(Event::Released {
                node: node.into(),
                key: "sack".into(),
            });
            h.push(reported(node, "a", 2, Outcome::Reverted));
        }
        h.push(quiet(&[
            ("n1", &[("sack", "1"), ("rmem", "4096")]),
            ("n2", &[("sack", "1"), ("rmem", "4096")]),
        ]));
        h
    }

    fn broken(history: &History) -> Vec<u8> {
        check(history).iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_rollout_and_delete_breaks_nothing() {
        assert_eq!(check(&good_rollout_and_delete()), Vec::<Violation>::new());
    }

    #[test]
    fn a_write_for_a_revision_the_node_reported_reverted_breaks_1_unless_reassigned() {
        // The race of issue 18: a stale watch event brings the withdrawn spec back and the
        // agent applies it again after it reported the revision Reverted.
        let mut h = good_rollout_and_delete();
        h.push(write("n1", "a", "sack", "0"));
        let violations = check(&h);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert_eq!(violations[0].invariant, 1);
        assert!(violations[0]
            .message
            .contains("n1 wrote sack=0 for a after reporting it ended in generation 2"));
        // A genuinely new assignment of the same revision may write again.
        let mut h = good_rollout_and_delete();
        h.push(assigned("n1", Some("a"), 3));
        h.push(write("n1", "a", "sack", "0"));
        assert!(broken(&h).is_empty(), "{:?}", check(&h));
    }

    #[test]
    fn two_nodes_moved_off_stable_at_once_with_max_unavailable_1_breaks_2() {
        let mut h = setup();
        h.push(assigned("n1", Some("a"), 1));
        h.push(assigned("n2", Some("a"), 1));
        assert_eq!(broken(&h), [2]);
        // Moving both back onto the stable revision at once (a rollback) is not counted.
        let mut h = setup();
        h.push(Event::Rollout {
            stable: Some("a".into()),
            max_unavailable: 1,
        });
        h.push(assigned("n1", Some("b"), 2));
        h.push(reported("n1", "b", 2, Outcome::Applied));
        h.push(assigned("n2", Some("b"), 2));
        h.push(Event::RolledBack {
            revision: "b".into(),
        });
        h.push(assigned("n1", Some("a"), 3));
        h.push(assigned("n2", Some("a"), 3));
        assert!(broken(&h).is_empty(), "{:?}", check(&h));
        // A new rollout keeps n1 on the earlier revision b (its spec rewritten, the revision
        // the same) while its canary n2 moves: one node in flight, not two.
        let mut h = setup();
        h.push(assigned("n1", Some("b"), 1));
        h.push(reported("n1", "b", 1, Outcome::Applied));
        h.push(assigned("n1", Some("b"), 2));
        h.push(assigned("n2", Some("c"), 2));
        assert!(broken(&h).is_empty(), "{:?}", check(&h));
    }

    #[test]
    fn a_node_left_on_a_rolled_back_revision_or_the_revision_reassigned_breaks_3() {
        let mut h = setup();
        h.push(Event::Rollout {
            stable: Some("a".into()),
            max_unavailable: 1,
        });
        h.push(assigned("n1", Some("b"), 2));
        h.push(reported("n1", "b", 2, Outcome::Applied));
        h.push(Event::RolledBack {
            revision: "b".into(),
        });
        h.push(quiet(&[("n1", &[("sack", "0"), ("rmem", "8192")])]));
        h.push(assigned("n2", Some("b"), 3));
        assert_eq!(broken(&h), [3, 3]);
    }

    #[test]
    fn a_host_not_back_at_its_baseline_after_the_delete_breaks_3() {
        let mut h = good_rollout_and_delete();
        h.push(quiet(&[("n2", &[("sack", "1"), ("rmem", "8192")])]));
        // Partly changed as well: rmem is no revision's value set alone.
        assert_eq!(broken(&h), [4, 3]);
    }

    #[test]
    fn a_partly_applied_node_at_a_quiet_point_breaks_4() {
        let mut h = setup();
        h.push(quiet(&[("n1", &[("sack", "1"), ("rmem", "8192")])]));
        let violations = check(&h);
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].invariant, 4);
        assert!(violations[0].message.starts_with("n1 is partly tuned"));
    }

    #[test]
    fn a_journaled_value_other_than_the_original_or_an_overwritten_one_breaks_5() {
        let mut h = setup();
        // After a reboot the agent must not take its own earlier value for the original.
        h.push(journaled("n1", "sack", "0"));
        h.push(journaled("n2", "sack", "1"));
        h.push(journaled("n2", "sack", "0"));
        let violations = check(&h);
        assert_eq!(
            violations.iter().map(|v| v.invariant).collect::<Vec<_>>(),
            [5, 5, 5]
        );
        assert!(violations[0]
            .message
            .contains("journaled sack=0 as original; it was 1"));
        assert!(violations[2]
            .message
            .contains("overwrote the journaled original sack=1 with 0"));
    }

    #[test]
    fn host_states_tell_a_revision_from_a_mixture() {
        let h = setup();
        let mut walk = Walk::default();
        for (i, e) in h.events.iter().enumerate() {
            walk.step(i, e);
        }
        let baseline = values(&[("sack", "1"), ("rmem", "4096")]);
        let state = |host: &[(&str, &str)]| host_state(&values(host), &baseline, &walk.defined);
        assert_eq!(
            state(&[("sack", "1"), ("rmem", "4096")]),
            HostState::Baseline
        );
        assert_eq!(
            state(&[("sack", "0"), ("rmem", "4096")]),
            HostState::On(vec!["a".into()])
        );
        assert_eq!(
            state(&[("sack", "0"), ("rmem", "8192")]),
            HostState::On(vec!["b".into()])
        );
        assert_eq!(state(&[("sack", "1"), ("rmem", "8192")]), HostState::Mixed);
    }
}
