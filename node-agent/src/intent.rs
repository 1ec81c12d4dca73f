//! What the node's NodeTuning asks for, as the reconciler sees it: nothing (no object), a
//! withdrawal, a revision to apply or plan, or a revision refused because its config does not
//! hash to it (changed after the operator computed the revision): the spec's content is
//! checked here, where it enters the agent, so that nothing downstream acts on it.

use hoststack_crds::{DriftPolicy, Mode, NodeConfig, NodeTuning};

use crate::journal::Applied;

/// What the node's NodeTuning asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Intent {
    /// There is no NodeTuning for this node (not created yet, or deleted): revert whatever the
    /// journal holds; there is no status to report to.
    Absent,
    /// The operator withdrew the spec: revert everything and report Reverted.
    Withdrawn,
    /// Apply (or, in Plan mode, preview) a revision.
    Revision {
        /// The governing NetworkTuning.
        tuning: String,
        /// The revision of `config`.
        revision: String,
        /// What to change.
        config: Box<NodeConfig>,
        /// Apply or Plan.
        mode: Mode,
    },
    /// A revision whose config does not hash to it: nothing of it is applied, the host stays
    /// as it is, and the revision is reported Failed with `reason`.
    Refused {
        /// The governing NetworkTuning.
        tuning: String,
        /// The revision the spec claims.
        revision: String,
        /// Why: both hashes.
        reason: String,
    },
}

impl Intent {
    /// What `object` asks for. A spec without a revision gets the revision of its config; one
    /// whose config does not hash to its revision is refused.
    pub fn of(object: Option<&NodeTuning>) -> Self {
        let Some(object) = object else {
            return Intent::Absent;
        };
        let spec = &object.spec;
        match (&spec.tuning, &spec.config) {
            (Some(tuning), Some(config)) => {
                let revision = spec.revision.clone().unwrap_or_else(|| config.revision());
                match config.verify_revision(&revision) {
                    Ok(()) => Intent::Revision {
                        tuning: tuning.clone(),
                        revision,
                        config: Box::new(config.clone()),
                        mode: spec.mode.unwrap_or_default(),
                    },
                    Err(mismatch) => Intent::Refused {
                        tuning: tuning.clone(),
                        revision,
                        reason: format!("spec.config: {mismatch}"),
                    },
                }
            }
            _ => Intent::Withdrawn,
        }
    }

    /// The NetworkTuning the intent is about.
    pub fn tuning(&self) -> Option<&str> {
        match self {
            Intent::Revision { tuning, .. } | Intent::Refused { tuning, .. } => Some(tuning),
            Intent::Absent | Intent::Withdrawn => None,
        }
    }

    /// The revision the intent is about.
    pub fn revision(&self) -> Option<&str> {
        match self {
            Intent::Revision { revision, .. } | Intent::Refused { revision, .. } => Some(revision),
            Intent::Absent | Intent::Withdrawn => None,
        }
    }

    /// What to do about drift, for a revision.
    pub fn drift_policy(&self) -> Option<DriftPolicy> {
        match self {
            Intent::Revision { config, .. } => Some(config.drift_policy.unwrap_or_default()),
            Intent::Absent | Intent::Withdrawn | Intent::Refused { .. } => None,
        }
    }

    /// The revision to apply; `None` reverts (never asked of a refused revision, which
    /// changes nothing).
    pub fn target(&self) -> Option<Applied> {
        match self {
            Intent::Revision {
                tuning, revision, ..
            } => Some(Applied {
                tuning: tuning.clone(),
                revision: revision.clone(),
            }),
            Intent::Absent | Intent::Withdrawn | Intent::Refused { .. } => None,
        }
    }
}
