//! Whether a rollout has ended, and how: the pure decision behind `status` (its exit code)
//! and `get --watch` (when it stops).
//!
//! A rollout has ended when the operator's status describes the tuning's current spec
//! (`status.observedGeneration` equals `metadata.generation`) and its phase is Complete,
//! RolledBack, Failed or Paused. A status of an older spec (just after `kubectl apply`, before
//! the operator has reconciled) says nothing about the current revision, so it is not an end.

use hoststack_crds::{NetworkTuning, Phase};

use crate::error::{EXIT_FAILED, EXIT_OK, EXIT_PAUSED, EXIT_ROLLED_BACK};

/// How a rollout ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every governed node applied the current revision.
    Complete,
    /// The updated nodes were returned to the stable revision.
    RolledBack,
    /// Nodes failed to apply and nothing rolled back.
    Failed,
    /// The rollout is held (`rollout.paused`, or an inconclusive analysis) until someone acts.
    Paused,
}

impl Outcome {
    /// `status`'s exit code for this ending.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Complete => EXIT_OK,
            Outcome::RolledBack => EXIT_ROLLED_BACK,
            Outcome::Failed => EXIT_FAILED,
            Outcome::Paused => EXIT_PAUSED,
        }
    }
}

/// How the rollout of `tuning`'s current spec ended, or `None` while it goes on (or the
/// operator has not yet seen that spec).
pub fn outcome(tuning: &NetworkTuning) -> Option<Outcome> {
    let status = tuning.status.as_ref()?;
    if status.observed_generation != tuning.metadata.generation {
        return None;
    }
    match status.phase? {
        Phase::Complete => Some(Outcome::Complete),
        Phase::RolledBack => Some(Outcome::RolledBack),
        Phase::Failed => Some(Outcome::Failed),
        Phase::Paused => Some(Outcome::Paused),
        // A superseded tuning's rollout neither goes on nor ends: it waits to govern a node.
        Phase::Pending | Phase::Progressing | Phase::Superseded => None,
    }
}

/// The ending `get --watch` stops at: `now` has ended, and `before` (what the watch saw last)
/// had not ended that way for the same spec. So a watch started on a finished rollout keeps
/// watching until a new ending arrives (a new revision completing, a paused rollout going on
/// and ending).
pub fn reached(before: &NetworkTuning, now: &NetworkTuning) -> Option<Outcome> {
    let ended = outcome(now)?;
    let same_spec = before.metadata.generation == now.metadata.generation;
    (!same_spec || outcome(before) != Some(ended)).then_some(ended)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NetworkTuningSpec, NetworkTuningStatus};

    fn tuning(generation: i64, observed: i64, phase: Phase) -> NetworkTuning {
        let mut t = NetworkTuning::new("edge", NetworkTuningSpec::default());
        t.metadata.generation = Some(generation);
        t.status = Some(NetworkTuningStatus {
            observed_generation: Some(observed),
            phase: Some(phase),
            ..NetworkTuningStatus::default()
        });
        t
    }

    #[test]
    fn each_ending_of_the_current_spec_has_its_own_exit_code() {
        let ends = [
            (Phase::Complete, Outcome::Complete),
            (Phase::RolledBack, Outcome::RolledBack),
            (Phase::Failed, Outcome::Failed),
            (Phase::Paused, Outcome::Paused),
        ];
        let mut codes = Vec::new();
        for (phase, want) in ends {
            assert_eq!(outcome(&tuning(3, 3, phase)), Some(want), "{phase}");
            codes.push(want.exit_code());
        }
        assert_eq!(codes, [0, 10, 11, 12]);
    }

    #[test]
    fn a_rollout_under_way_or_a_status_of_an_older_spec_has_not_ended() {
        for phase in [Phase::Pending, Phase::Progressing] {
            assert_eq!(outcome(&tuning(3, 3, phase)), None, "{phase}");
        }
        // Just after `kubectl apply`: the status still shows the last spec's ending.
        assert_eq!(outcome(&tuning(4, 3, Phase::Complete)), None);
        assert_eq!(outcome(&tuning(4, 3, Phase::RolledBack)), None);
        let fresh = NetworkTuning::new("edge", NetworkTuningSpec::default());
        assert_eq!(outcome(&fresh), None);
        let mut no_phase = tuning(1, 1, Phase::Complete);
        no_phase.status.as_mut().unwrap().phase = None;
        assert_eq!(outcome(&no_phase), None);
    }

    #[test]
    fn a_watch_stops_at_a_new_ending_not_at_the_one_it_started_on() {
        let done = tuning(3, 3, Phase::Complete);
        assert_eq!(reached(&done, &done), None);
        let going = tuning(3, 3, Phase::Progressing);
        assert_eq!(reached(&going, &done), Some(Outcome::Complete));
        assert_eq!(reached(&done, &going), None);
        // Paused, then promoted past an inconclusive analysis, and complete: a new ending.
        let paused = tuning(3, 3, Phase::Paused);
        assert_eq!(reached(&paused, &done), Some(Outcome::Complete));
        // A new spec that completed before the watch saw it under way.
        assert_eq!(
            reached(&done, &tuning(4, 4, Phase::Complete)),
            Some(Outcome::Complete)
        );
        assert_eq!(reached(&done, &tuning(4, 3, Phase::Complete)), None);
    }
}
