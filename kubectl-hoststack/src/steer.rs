//! What `promote`, `pause`, `resume` and `abort` write: pure functions from the tuning as it
//! stands to the merge patch that steers it (or the reason there is nothing to steer), so that
//! every rule is a unit test and the commands are thin shells.

use hoststack_crds::{wave_id, NetworkTuning, Phase};
pub use hoststack_crds::{ABORT_ANNOTATION, PROMOTE_ANNOTATION};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// The phase a tuning reports (Pending when it has no status yet).
fn phase(tuning: &NetworkTuning) -> Phase {
    tuning
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or_default()
}

/// Whether the tuning's rollout is live: waves are being applied, judged or held.
fn live(tuning: &NetworkTuning) -> bool {
    matches!(phase(tuning), Phase::Progressing | Phase::Paused)
}

/// The index of the wave in flight: the last wave of a live rollout.
pub fn wave_in_flight(tuning: &NetworkTuning) -> Result<u32> {
    let name = tuning.name_any();
    if !live(tuning) {
        return Err(Error::Invalid(format!(
            "NetworkTuning {name} has no rollout in flight (phase {})",
            phase(tuning)
        )));
    }
    tuning
        .status
        .as_ref()
        .and_then(|s| s.waves.last())
        .map(|w| w.index)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "NetworkTuning {name} has not started a wave yet; nothing to promote"
            ))
        })
}

/// The wave `promote` promotes: `asked`, which must exist, or the wave in flight.
pub fn wave_to_promote(tuning: &NetworkTuning, asked: Option<u32>) -> Result<u32> {
    let in_flight = wave_in_flight(tuning)?;
    match asked {
        Some(i) if i > in_flight => Err(Error::Invalid(format!(
            "NetworkTuning {} has no wave {i} yet: wave {in_flight} is in flight",
            tuning.name_any()
        ))),
        Some(i) => Ok(i),
        None => Ok(in_flight),
    }
}

/// The merge patch that promotes wave `index` of `revision`.
pub fn promote_patch(revision: &str, index: u32) -> Value {
    json!({"metadata": {"annotations": {PROMOTE_ANNOTATION: wave_id(revision, index as usize)}}})
}

/// Whether `spec.rollout.paused` is set.
pub fn is_paused(tuning: &NetworkTuning) -> bool {
    tuning.spec.rollout.as_ref().is_some_and(|r| r.paused)
}

/// The merge patch that sets `spec.rollout.paused`.
pub fn paused_patch(paused: bool) -> Value {
    json!({"spec": {"rollout": {"paused": paused}}})
}

/// The revision `abort` rolls back: the current one, while its rollout is live.
pub fn revision_to_abort(tuning: &NetworkTuning) -> Result<String> {
    let name = tuning.name_any();
    if !live(tuning) {
        let hint = match phase(tuning) {
            Phase::Complete => "; `undo` returns to the previous revision",
            _ => "",
        };
        return Err(Error::Invalid(format!(
            "NetworkTuning {name} has no rollout to abort (phase {}){hint}",
            phase(tuning)
        )));
    }
    tuning
        .status
        .as_ref()
        .and_then(|s| s.current_revision.clone())
        .ok_or_else(|| Error::Invalid(format!("NetworkTuning {name} reports no revision yet")))
}

/// The merge patch that aborts the rollout of `revision`.
pub fn abort_patch(revision: &str) -> Value {
    json!({"metadata": {"annotations": {ABORT_ANNOTATION: revision}}})
}

/// Whether the abort annotation names `revision`: putting that revision back (`undo`) must
/// clear it, or the operator would abort its rollout again at once.
pub fn aborts(tuning: &NetworkTuning, revision: &str) -> bool {
    tuning
        .annotations()
        .get(ABORT_ANNOTATION)
        .map(String::as_str)
        == Some(revision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NetworkTuningSpec, NetworkTuningStatus, Rollout, WaveStatus};

    fn tuning(phase: Phase, waves: u32) -> NetworkTuning {
        let mut t = NetworkTuning::new("edge", NetworkTuningSpec::default());
        t.status = Some(NetworkTuningStatus {
            phase: Some(phase),
            current_revision: Some("r2".into()),
            waves: (0..waves)
                .map(|index| WaveStatus {
                    index,
                    ..WaveStatus::default()
                })
                .collect(),
            ..NetworkTuningStatus::default()
        });
        t
    }

    #[test]
    fn promote_takes_the_wave_in_flight_unless_told_and_never_a_future_one() {
        let t = tuning(Phase::Progressing, 2);
        assert_eq!(wave_to_promote(&t, None).unwrap(), 1);
        assert_eq!(wave_to_promote(&t, Some(0)).unwrap(), 0);
        let e = wave_to_promote(&t, Some(2)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "NetworkTuning edge has no wave 2 yet: wave 1 is in flight"
        );
        assert_eq!(wave_to_promote(&tuning(Phase::Paused, 1), None).unwrap(), 0);
        let e = wave_to_promote(&tuning(Phase::Complete, 3), None).unwrap_err();
        assert!(e.to_string().contains("phase Complete"), "{e}");
        assert!(wave_to_promote(&tuning(Phase::Progressing, 0), None).is_err());
        assert_eq!(
            promote_patch("r2", 1),
            json!({"metadata": {"annotations": {"hoststack.dev/promote": "r2-wave1"}}})
        );
    }

    #[test]
    fn pause_and_resume_patch_the_spec() {
        let mut t = tuning(Phase::Progressing, 1);
        assert!(!is_paused(&t));
        t.spec.rollout = Some(Rollout {
            paused: true,
            ..Rollout::default()
        });
        assert!(is_paused(&t));
        assert_eq!(
            paused_patch(false),
            json!({"spec": {"rollout": {"paused": false}}})
        );
    }

    #[test]
    fn abort_names_the_current_revision_of_a_live_rollout_only() {
        assert_eq!(revision_to_abort(&tuning(Phase::Paused, 1)).unwrap(), "r2");
        let e = revision_to_abort(&tuning(Phase::Complete, 3)).unwrap_err();
        assert!(e.to_string().contains("`undo`"), "{e}");
        assert!(revision_to_abort(&tuning(Phase::RolledBack, 1)).is_err());
        let mut t = tuning(Phase::RolledBack, 1);
        assert!(!aborts(&t, "r2"));
        t.annotations_mut()
            .insert(ABORT_ANNOTATION.into(), "r2".into());
        assert!(aborts(&t, "r2") && !aborts(&t, "r3"));
        assert_eq!(
            abort_patch("r2"),
            json!({"metadata": {"annotations": {"hoststack.dev/abort": "r2"}}})
        );
    }
}
