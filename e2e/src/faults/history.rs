//! One fault campaign's record, in the order things happened: what the operator assigned,
//! what each agent wrote to its host and reported, what it journaled, and what the hosts held
//! when everything was quiet.

use std::collections::BTreeMap;

/// A node's name.
pub type Node = String;
/// A revision's name (the ControllerRevision the operator rolls out).
pub type Revision = String;
/// A host setting's key (a sysctl, a sysfs path, an interface attribute) and its value.
pub type Values = BTreeMap<String, String>;

/// Why an agent wrote to its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// To apply the revision.
    Apply(Revision),
    /// To put the journaled originals back (a failed revision, a rollback or a delete).
    Revert,
}

/// What an agent reported of a revision in its NodeTuning status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every item applied and read back.
    Applied,
    /// The transaction failed and was reverted.
    Failed,
    /// The revision was withdrawn and the host reverted.
    Reverted,
}

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A revision's desired host values.
    Defined {
        /// The revision.
        revision: Revision,
        /// What it sets.
        values: Values,
    },
    /// A node's host before any tuning.
    Baseline {
        /// The node.
        node: Node,
        /// Every key any revision sets, with its value.
        values: Values,
    },
    /// The rollout's stable revision and how many nodes may be in flight at once.
    Rollout {
        /// The stable revision (`None` before the first one completes).
        stable: Option<Revision>,
        /// maxUnavailable, resolved to a count.
        max_unavailable: usize,
    },
    /// The operator assigned `revision` to `node` (`None`: withdrew its tuning) in the
    /// NodeTuning spec's `generation`.
    Assigned {
        /// The node.
        node: Node,
        /// The revision, or none.
        revision: Option<Revision>,
        /// The NodeTuning's metadata.generation after the write.
        generation: i64,
    },
    /// An agent wrote `key = value` to its host.
    HostWrite {
        /// The node.
        node: Node,
        /// Why.
        purpose: Purpose,
        /// The setting.
        key: String,
        /// The value written.
        value: String,
    },
    /// An agent reported the outcome of a revision assigned in `generation`.
    Reported {
        /// The node.
        node: Node,
        /// The revision.
        revision: Revision,
        /// The generation it answered.
        generation: i64,
        /// What came of it.
        outcome: Outcome,
    },
    /// An agent journaled the original of `key` before its first change of it.
    Journaled {
        /// The node.
        node: Node,
        /// The setting.
        key: String,
        /// The value it recorded as original.
        original: String,
    },
    /// An agent dropped the journal entry of `key` (its original is back on the host).
    Released {
        /// The node.
        node: Node,
        /// The setting.
        key: String,
    },
    /// The operator rolled the rollout back from `revision`.
    RolledBack {
        /// The failed revision.
        revision: Revision,
    },
    /// The NetworkTuning was deleted.
    Deleted,
    /// Nothing was in flight: the hosts as read then.
    Quiescent {
        /// Each node's host, for every key any revision sets.
        hosts: BTreeMap<Node, Values>,
    },
}

/// A campaign's events, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The events.
    pub events: Vec<Event>,
}

impl History {
    /// Appends an event.
    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }
}
