//! The rollout's memory in the tuning's status: the planner's [`Progress`] is restored from the
//! status a reconcile starts with and recorded into the status it writes, so that an operator
//! restarted in the middle of a wave carries on without repeating or skipping one.

use std::collections::BTreeMap;

use hoststack_crds::{AnalysisStatus, NetworkTuningStatus, Phase, WaveOrigin, WaveStatus};
use k8s_openapi::jiff::Timestamp;

use super::planner::{Holding, Progress, Report, State, Wave};

/// The rollout of tuning `name` a reconcile continues. A new revision starts a fresh rollout
/// from the last revision every node applied; a rollout that rolled back or halted stays so
/// until the spec's generation changes; a superseded tuning that governs nodes again starts a
/// new round of waves for them.
pub fn restore(
    status: Option<&NetworkTuningStatus>,
    name: &str,
    revision: &str,
    generation: Option<i64>,
) -> Progress {
    let Some(s) = status else {
        return Progress::start(revision, None);
    };
    let same_revision = s.current_revision.as_deref() == Some(revision);
    let stable = match (s.phase, same_revision) {
        (Some(Phase::Complete), false) => s.current_revision.as_deref(),
        _ => s.stable_revision.as_deref(),
    };
    if !same_revision {
        return Progress::start(revision, stable);
    }
    let message = s.message.clone().unwrap_or_default();
    let state = match s.phase {
        Some(Phase::Superseded) => {
            let after = s.waves.last().map_or(0, |w| w.index as usize + 1);
            return Progress {
                first_wave: after,
                ..Progress::start(revision, stable)
            };
        }
        Some(Phase::Complete) => State::Complete,
        Some(Phase::Paused) => State::Paused(message),
        Some(Phase::RolledBack) if s.observed_generation == generation => {
            State::RolledBack(message)
        }
        Some(Phase::Failed) if s.observed_generation == generation => State::Halted(message),
        Some(Phase::RolledBack | Phase::Failed) => return Progress::start(revision, stable),
        Some(Phase::Pending | Phase::Progressing) | None => State::Progressing,
    };
    let stable = if state == State::Complete {
        Some(revision)
    } else {
        stable
    };
    Progress {
        revision: revision.into(),
        stable: stable.map(Into::into),
        waves: s
            .waves
            .iter()
            .map(|w| Wave {
                nodes: w.nodes.clone(),
                applied_at: w.applied_at.as_deref().and_then(parse_time),
                from: w
                    .from
                    .iter()
                    .flat_map(|o| {
                        let held = holding(name, o);
                        o.nodes.iter().map(move |n| (n.clone(), held.clone()))
                    })
                    .collect(),
            })
            .collect(),
        first_wave: s.waves.first().map_or(0, |w| w.index as usize),
        state,
    }
}

/// What a wave's recorded origin says its nodes ran, for the rollout of tuning `name`.
fn holding(name: &str, origin: &WaveOrigin) -> Holding {
    match (&origin.tuning, &origin.revision) {
        (Some(t), Some(r)) if t == name => Holding::Own(r.clone()),
        (Some(t), Some(r)) => Holding::Other {
            tuning: t.clone(),
            revision: r.clone(),
        },
        _ => Holding::Nothing,
    }
}

/// A wave's origins as its status records them, grouped by what the nodes ran.
fn record_from(name: &str, from: &BTreeMap<String, Holding>) -> Vec<WaveOrigin> {
    let mut groups: BTreeMap<&Holding, Vec<String>> = BTreeMap::new();
    for (node, held) in from {
        groups.entry(held).or_default().push(node.clone());
    }
    groups
        .into_iter()
        .map(|(held, nodes)| {
            let (tuning, revision) = match held {
                Holding::Nothing => (None, None),
                Holding::Own(r) => (Some(name.to_string()), Some(r.clone())),
                Holding::Other { tuning, revision } => {
                    (Some(tuning.clone()), Some(revision.clone()))
                }
            };
            WaveOrigin {
                nodes,
                tuning,
                revision,
            }
        })
        .collect()
}

/// The phase and message that record `state`.
pub fn phase_of(state: &State) -> (Phase, Option<String>) {
    match state {
        State::Progressing => (Phase::Progressing, None),
        State::Paused(why) => (Phase::Paused, Some(why.clone())),
        State::Complete => (Phase::Complete, None),
        State::RolledBack(why) => (Phase::RolledBack, Some(why.clone())),
        State::Halted(why) => (Phase::Failed, Some(why.clone())),
    }
}

/// The waves of tuning `name` as the status shows them. `report` tells what a node's agent
/// says about the rollout's revision; `analysis` gives each wave's judgement (by its index
/// among every wave of the revision), when it has one.
pub fn record_waves(
    name: &str,
    progress: &Progress,
    report: impl Fn(&str) -> Report,
    analysis: impl Fn(usize) -> Option<AnalysisStatus>,
) -> Vec<WaveStatus> {
    let rolled_back = matches!(progress.state, State::RolledBack(_));
    progress
        .waves
        .iter()
        .enumerate()
        .map(|(i, wave)| {
            let index = progress.wave_index(i);
            let reports: Vec<Report> = wave.nodes.iter().map(|n| report(n)).collect();
            let result = if rolled_back {
                "RolledBack"
            } else if reports.iter().any(|r| matches!(r, Report::Failed(_))) {
                "Failed"
            } else if wave.applied_at.is_some() || reports.iter().all(|r| *r == Report::Applied) {
                "Applied"
            } else if reports.contains(&Report::Applied) {
                "Applying"
            } else {
                "Pending"
            };
            WaveStatus {
                index: index as u32,
                nodes: wave.nodes.clone(),
                result: result.into(),
                applied_at: wave.applied_at.map(format_time),
                analysis: analysis(index),
                from: record_from(name, &wave.from),
            }
        })
        .collect()
}

/// Seconds since the epoch of an RFC 3339 time.
pub fn parse_time(text: &str) -> Option<u64> {
    let t: Timestamp = text.parse().ok()?;
    u64::try_from(t.as_second()).ok()
}

/// An RFC 3339 time of seconds since the epoch.
pub fn format_time(seconds: u64) -> String {
    i64::try_from(seconds)
        .ok()
        .and_then(|s| Timestamp::from_second(s).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: Phase, current: &str, stable: Option<&str>) -> NetworkTuningStatus {
        NetworkTuningStatus {
            observed_generation: Some(1),
            current_revision: Some(current.into()),
            stable_revision: stable.map(Into::into),
            phase: Some(phase),
            message: Some("why".into()),
            waves: vec![WaveStatus {
                index: 0,
                nodes: vec!["a".into()],
                result: "Applied".into(),
                applied_at: Some("2026-11-30T01:00:00Z".into()),
                analysis: None,
                from: Vec::new(),
            }],
            ..NetworkTuningStatus::default()
        }
    }

    #[test]
    fn restores_where_it_stood_and_starts_fresh_on_a_new_revision() {
        assert_eq!(
            restore(None, "edge", "r1", Some(1)),
            Progress::start("r1", None)
        );
        let mid = status(Phase::Progressing, "r2", Some("r1"));
        let p = restore(Some(&mid), "edge", "r2", Some(1));
        assert_eq!(p.stable.as_deref(), Some("r1"));
        assert_eq!(p.state, State::Progressing);
        assert_eq!(p.waves[0].applied_at, parse_time("2026-11-30T01:00:00Z"));
        assert_eq!(p.waves[0].nodes, vec!["a".to_string()]);
        // A new revision mid-rollout starts from the old stable one.
        assert_eq!(
            restore(Some(&mid), "edge", "r3", Some(2)),
            Progress::start("r3", Some("r1"))
        );
        // After a complete rollout, its revision is the stable one.
        let done = status(Phase::Complete, "r2", Some("r2"));
        assert_eq!(
            restore(Some(&done), "edge", "r2", Some(1))
                .stable
                .as_deref(),
            Some("r2")
        );
        assert_eq!(
            restore(Some(&done), "edge", "r3", Some(2)),
            Progress::start("r3", Some("r2"))
        );
        let paused = status(Phase::Paused, "r2", Some("r1"));
        assert_eq!(
            restore(Some(&paused), "edge", "r2", Some(1)).state,
            State::Paused("why".into())
        );
    }

    #[test]
    fn a_superseded_tuning_starts_a_new_round_after_its_last_wave() {
        let mut superseded = status(Phase::Superseded, "r2", Some("r1"));
        superseded.waves[0].index = 3;
        let p = restore(Some(&superseded), "edge", "r2", Some(1));
        assert_eq!(
            p,
            Progress {
                first_wave: 4,
                ..Progress::start("r2", Some("r1"))
            }
        );
    }

    #[test]
    fn a_rollback_holds_until_the_generation_changes() {
        let back = status(Phase::RolledBack, "r2", Some("r1"));
        assert_eq!(
            restore(Some(&back), "edge", "r2", Some(1)).state,
            State::RolledBack("why".into())
        );
        assert_eq!(
            restore(Some(&back), "edge", "r2", Some(2)),
            Progress::start("r2", Some("r1"))
        );
        let halted = status(Phase::Failed, "r2", Some("r1"));
        assert_eq!(
            restore(Some(&halted), "edge", "r2", Some(1)).state,
            State::Halted("why".into())
        );
    }

    #[test]
    fn waves_record_their_results_and_round_trip() {
        let mut p = Progress::start("r2", Some("r1"));
        p.waves = vec![
            Wave {
                nodes: vec!["a".into()],
                applied_at: Some(1_800_000_000),
                from: BTreeMap::new(),
            },
            Wave {
                nodes: vec!["b".into(), "c".into(), "d".into()],
                applied_at: None,
                from: [
                    ("b".to_string(), Holding::Own("r0".into())),
                    (
                        "c".to_string(),
                        Holding::Other {
                            tuning: "core".into(),
                            revision: "c1".into(),
                        },
                    ),
                ]
                .into(),
            },
        ];
        let report = |n: &str| match n {
            "a" | "b" | "d" => Report::Applied,
            _ => Report::Pending,
        };
        let waves = record_waves("edge", &p, report, |_| None);
        let results: Vec<&str> = waves.iter().map(|w| w.result.as_str()).collect();
        assert_eq!(results, ["Applied", "Applying"]);
        let s = NetworkTuningStatus {
            current_revision: Some("r2".into()),
            stable_revision: Some("r1".into()),
            phase: Some(Phase::Progressing),
            waves,
            ..NetworkTuningStatus::default()
        };
        // Only the nodes that did not come from the stable revision are recorded, by origin.
        let origins: Vec<(Vec<String>, Option<&str>, Option<&str>)> = s.waves[1]
            .from
            .iter()
            .map(|o| (o.nodes.clone(), o.tuning.as_deref(), o.revision.as_deref()))
            .collect();
        assert_eq!(
            origins,
            [
                (vec!["b".to_string()], Some("edge"), Some("r0")),
                (vec!["c".to_string()], Some("core"), Some("c1")),
            ]
        );
        assert_eq!(restore(Some(&s), "edge", "r2", None), p);
        p.state = State::RolledBack("x".into());
        let waves = record_waves("edge", &p, |_| Report::Failed("no".into()), |_| None);
        assert!(waves.iter().all(|w| w.result == "RolledBack"));
        // A later round numbers its waves after the earlier ones, and restores that way.
        let mut later = p.next_round();
        later.waves.push(Wave::of(vec!["e".into()]));
        let waves = record_waves("edge", &later, |_| Report::Pending, |_| None);
        assert_eq!(waves[0].index, 2);
        let s = NetworkTuningStatus {
            current_revision: Some("r2".into()),
            phase: Some(Phase::Progressing),
            waves,
            ..NetworkTuningStatus::default()
        };
        assert_eq!(restore(Some(&s), "edge", "r2", None).first_wave, 2);
        assert_eq!(phase_of(&p.state), (Phase::RolledBack, Some("x".into())));
    }
}
