//! What one reconcile decided, as a value: the tuning's status, the NodeTuning specs to write,
//! the agent labels to change, whether the revision history goes, the events to record, what
//! the operator's gauges show and when to look again. The deciding modules
//! ([`rollout`](super::rollout), [`deletion`](super::deletion)) return one; the
//! [`effects`](super::effects) carry it out.

use std::time::Duration;

use hoststack_crds::{NetworkTuningStatus, NodeTuningSpec};
use kube::runtime::events::EventType;

use super::writes::AgentLabel;

/// One reconcile's decision. The effects carry it out in the order of its fields: the status
/// first (an operator restarted after that point finds the wave it started), then the specs,
/// the agent labels and the history, and the events last.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The tuning's status; written when it differs from the one the reconcile planned from
    /// (the newer of the cached one and the operator's own last write). `None`: nothing to
    /// report.
    pub status: Option<NetworkTuningStatus>,
    /// What the operator's per-tuning gauges do.
    pub gauges: Gauges,
    /// The NodeTuning specs to write, in order.
    pub specs: Vec<SpecWrite>,
    /// Revisions a node was planned onto whose config is recorded nowhere: `(node, revision)`.
    /// The node keeps its spec.
    pub unknown_revisions: Vec<(String, String)>,
    /// The nodes whose agent label changes.
    pub agent_labels: Vec<AgentLabel>,
    /// Delete the tuning's revision history (every node reverted after its deletion).
    pub forget_history: bool,
    /// The events to record about the tuning.
    pub events: Vec<Announcement>,
    /// What happens next.
    pub next: Next,
}

impl Decision {
    /// A decision that only reports `status` and waits for a change.
    pub fn report(status: NetworkTuningStatus) -> Self {
        Decision {
            status: Some(status),
            gauges: Gauges::Keep,
            specs: Vec::new(),
            unknown_revisions: Vec::new(),
            agent_labels: Vec::new(),
            forget_history: false,
            events: Vec::new(),
            next: Next::AwaitChange,
        }
    }
}

/// What the per-tuning gauges (phase, node counts) do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gauges {
    /// Stay as they are.
    Keep,
    /// Show the decided status.
    Show,
    /// Go: the tuning is let go.
    Forget,
}

/// One NodeTuning spec to write, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecWrite {
    /// The node (and NodeTuning) name.
    pub node: String,
    /// The node's uid, the NodeTuning's owner.
    pub node_uid: String,
    /// The whole spec the operator owns.
    pub spec: NodeTuningSpec,
    /// Why it is written.
    pub why: Why,
}

/// Why a NodeTuning spec is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The rollout puts the node on a revision (or changes its phase or health request).
    Assign,
    /// The node is no longer selected by any tuning: its spec is withdrawn.
    Unselected,
    /// The tuning was deleted: the node goes to its heir, or its spec is withdrawn.
    Deleted,
}

impl Why {
    /// The log line of a write for this reason.
    pub fn message(self) -> &'static str {
        match self {
            Why::Assign => "assigning revision",
            Why::Unselected => "withdrawing: node no longer selected",
            Why::Deleted => "withdrawing: tuning deleted",
        }
    }
}

/// An event about the tuning.
#[derive(Clone, Debug, PartialEq)]
pub struct Announcement {
    /// Normal or Warning.
    pub type_: EventType,
    /// The event's reason (`WaveStarted`, `RolledBack`, `Conflict`...).
    pub reason: &'static str,
    /// Its action. Events of the same reason and action are one series (the recorder counts
    /// repeats and keeps the first note), so each wave of each revision gets an action of its
    /// own.
    pub action: String,
    /// The human-readable note.
    pub note: String,
}

impl Announcement {
    /// An event of the plain `Reconcile` action.
    pub fn reconcile(type_: EventType, reason: &'static str, note: String) -> Self {
        Announcement {
            type_,
            reason,
            action: "Reconcile".into(),
            note,
        }
    }
}

/// What happens after the decision is carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Reconcile again after this long (or on a change).
    Requeue(Duration),
    /// Reconcile again on a change only.
    AwaitChange,
    /// The deleted tuning's nodes have not confirmed their revert yet: the finalizer stays and
    /// the reconcile fails with [`crate::Error::WaitingForRevert`], which looks again soon.
    WaitForRevert(Vec<String>),
}
