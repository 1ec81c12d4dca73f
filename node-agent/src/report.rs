//! Status building: turns an outcome into the NodeTuning's status, a pure function of its
//! inputs so that unchanged outcomes give byte-identical statuses (and no write).
//!
//! Every status the agent writes is built here and carries every field the agent owns (it
//! writes with server-side apply, which drops the fields a write leaves out): the outcome's
//! items and conditions, the drift found, the host facts and the latest health sample.

use hoststack_crds::{HealthSample, HostFacts, ItemState, NodeState, NodeTuningStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::drift::{self, Drift};
use crate::transaction::Outcome;

/// Condition type: the asked revision is applied and verified.
pub const APPLIED: &str = "Applied";
/// Condition type: the last transaction failed (the host is as it was before it).
pub const DEGRADED: &str = "Degraded";
/// Condition type: the spec was withdrawn and every original is restored.
pub const REVERTED: &str = "Reverted";
/// Condition type: settings of the applied revision changed on the host behind the agent's back.
pub const DRIFTED: &str = "Drifted";

/// Everything a status is built from.
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    /// What the agent did (or would do).
    pub outcome: &'a Outcome,
    /// The revision the outcome is about; absent when the spec was withdrawn.
    pub observed_revision: Option<&'a str>,
    /// Settings of the applied revision whose value on the host is not the desired one.
    pub drifted: &'a [Drift],
    /// Host facts.
    pub facts: Option<HostFacts>,
    /// The health sample to report (the latest, while the spec asks for samples).
    pub health: Option<&'a HealthSample>,
    /// The status before, whose condition transition times are kept when a condition's status
    /// does not change.
    pub previous: Option<&'a NodeTuningStatus>,
    /// The NodeTuning's metadata.generation.
    pub generation: Option<i64>,
    /// Now, for new transition times.
    pub now: Time,
}

/// A time in milliseconds since the epoch as RFC 3339, to the second (as the status shows it).
pub fn time_of_millis(millis: u64) -> String {
    let secs = i64::try_from(millis / 1000).unwrap_or(i64::MAX);
    Timestamp::from_second(secs)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Now, to the second, as the API server stores condition times: a time with a fraction would
/// never compare equal to the stored one, and every status would look changed.
pub fn now() -> Time {
    let secs = Timestamp::now().as_second();
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The status for an outcome.
pub fn status(input: &StatusInput) -> NodeTuningStatus {
    let o = input.outcome;
    let revision = input.observed_revision.unwrap_or("-");
    let applied_msg = match o.state {
        NodeState::Applied if !input.drifted.is_empty() => format!(
            "revision {revision} is applied; {} of its settings drifted since (see Drifted)",
            input.drifted.len()
        ),
        NodeState::Applied => format!("revision {revision} is applied and verified"),
        NodeState::Applying => match &o.message {
            Some(error) => format!("applying revision {revision} once the agent can: {error}"),
            None => format!("applying revision {revision}"),
        },
        NodeState::Planned => "plan mode: nothing was changed".to_string(),
        NodeState::Reverted => "the spec was withdrawn; nothing is applied".to_string(),
        NodeState::Idle => "nothing asked yet".to_string(),
        NodeState::Failed => o.message.clone().unwrap_or_default(),
    };
    let not_supported = o.items.iter().any(|i| i.state == ItemState::NotSupported);
    let conditions = vec![
        condition(
            input,
            APPLIED,
            o.state == NodeState::Applied,
            &o.state.to_string(),
            applied_msg,
        ),
        if o.state == NodeState::Failed {
            let reason = match o.self_revert {
                Some(cause) => cause.condition_reason(),
                None if not_supported => "NotSupported",
                None => "TransactionFailed",
            };
            condition(
                input,
                DEGRADED,
                true,
                reason,
                o.message.clone().unwrap_or_default(),
            )
        } else if let (NodeState::Applying, Some(error)) = (o.state, &o.message) {
            condition(input, DEGRADED, true, "AgentError", error.clone())
        } else {
            condition(input, DEGRADED, false, "AsExpected", String::new())
        },
        if o.state == NodeState::Reverted {
            condition(
                input,
                REVERTED,
                true,
                "SpecWithdrawn",
                "every setting hoststack changed is restored to its original value".into(),
            )
        } else {
            condition(input, REVERTED, false, &o.state.to_string(), String::new())
        },
        if input.drifted.is_empty() {
            condition(input, DRIFTED, false, "NoDrift", String::new())
        } else {
            condition(
                input,
                DRIFTED,
                true,
                "Drifted",
                drift::message(input.drifted),
            )
        },
    ];
    NodeTuningStatus {
        state: Some(o.state),
        applied_revision: o.applied.as_ref().map(|a| a.revision.clone()),
        applied_tuning: o.applied.as_ref().map(|a| a.tuning.clone()),
        observed_revision: observed_revision(input),
        message: o.message.clone(),
        items: o.items.clone(),
        conditions,
        facts: input.facts.clone(),
        health: input.health.cloned(),
        // The watch loop adds the answer to a preview request (it keeps it between writes).
        preview: None,
        // The watch loop adds the user-space stack's status from its supervisor.
        userspace_stack: None,
        // The watch loop adds the confirmation window and the probes' results.
        confirmation: None,
        probes: Vec::new(),
    }
}

/// The revision the outcome is about. A revert of a withdrawn spec is about the revision it
/// reverted, which the withdrawn spec no longer names: the one the status before was about
/// (kept while the spec stays withdrawn), the one whose transaction it showed in progress, or
/// the one the host was on. So a Reverted report names what it ended, and a write for that
/// revision afterwards shows in the history (the fault harness's invariant 1).
fn observed_revision(input: &StatusInput) -> Option<String> {
    if let Some(revision) = input.observed_revision {
        return Some(revision.to_string());
    }
    let previous = input
        .previous
        .filter(|_| input.outcome.state == NodeState::Reverted)?;
    match previous.state {
        Some(NodeState::Reverted | NodeState::Applying) => previous.observed_revision.clone(),
        _ => previous.applied_revision.clone(),
    }
}

/// A condition, keeping the previous transition time when its status did not change.
fn condition(
    input: &StatusInput,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = input
        .previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| input.now.clone());
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        observed_generation: input.generation,
        last_transition_time,
    }
}

#[cfg(test)]
mod tests {
    use hoststack_crds::ItemResult;

    use super::*;
    use crate::journal::Applied;
    use crate::transaction::SelfRevert;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    fn outcome(state: NodeState, message: Option<&str>) -> Outcome {
        Outcome {
            state,
            items: vec![ItemResult {
                kind: "sysctl".into(),
                target: "net.ipv4.tcp_sack".into(),
                original: Some("1".into()),
                desired: Some("0".into()),
                actual: Some("0".into()),
                state: ItemState::Applied,
                message: None,
            }],
            message: message.map(str::to_string),
            applied: Some(Applied {
                tuning: "edge".into(),
                revision: "r1".into(),
            }),
            self_revert: None,
        }
    }

    fn cond<'a>(s: &'a NodeTuningStatus, t: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .expect("condition")
    }

    #[test]
    fn conditions_follow_the_state_and_keep_transition_times() {
        let applied = outcome(NodeState::Applied, None);
        let first = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: Some(3),
            now: at(100),
        });
        assert_eq!(first.state, Some(NodeState::Applied));
        assert_eq!(first.applied_revision.as_deref(), Some("r1"));
        assert_eq!(first.applied_tuning.as_deref(), Some("edge"));
        assert_eq!(cond(&first, APPLIED).status, "True");
        assert_eq!(cond(&first, DEGRADED).status, "False");
        assert_eq!(cond(&first, REVERTED).status, "False");
        assert_eq!(cond(&first, APPLIED).observed_generation, Some(3));

        // The same outcome later: identical status, so nothing to write.
        let again = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &[],
            facts: None,
            health: None,
            previous: Some(&first),
            generation: Some(3),
            now: at(200),
        });
        assert_eq!(again, first);

        // A failure flips Applied and Degraded at the new time; Reverted keeps its time.
        let failed = outcome(NodeState::Failed, Some("sysctl x: nope"));
        let third = status(&StatusInput {
            outcome: &failed,
            observed_revision: Some("r2"),
            drifted: &[],
            facts: None,
            health: None,
            previous: Some(&first),
            generation: Some(4),
            now: at(300),
        });
        assert_eq!(cond(&third, APPLIED).last_transition_time, at(300));
        assert_eq!(cond(&third, DEGRADED).status, "True");
        assert_eq!(cond(&third, DEGRADED).reason, "TransactionFailed");
        assert_eq!(cond(&third, DEGRADED).message, "sysctl x: nope");
        assert_eq!(cond(&third, REVERTED).last_transition_time, at(100));
        assert_eq!(third.message.as_deref(), Some("sysctl x: nope"));
        assert_eq!(third.observed_revision.as_deref(), Some("r2"));
    }

    #[test]
    fn a_revision_the_agent_reverted_by_itself_is_degraded_with_the_cause() {
        for (cause, reason) in [
            (SelfRevert::ProbeFailed, "ProbeFailed"),
            (SelfRevert::Unconfirmed, "Unconfirmed"),
        ] {
            let reverted = Outcome {
                self_revert: Some(cause),
                ..outcome(
                    NodeState::Failed,
                    Some("probe peer (198.18.1.13:5300): refused"),
                )
            };
            let s = status(&StatusInput {
                outcome: &reverted,
                observed_revision: Some("r2"),
                drifted: &[],
                facts: None,
                health: None,
                previous: None,
                generation: Some(4),
                now: at(300),
            });
            assert_eq!(s.state, Some(NodeState::Failed));
            let degraded = cond(&s, DEGRADED);
            assert_eq!(
                (degraded.status.as_str(), degraded.reason.as_str()),
                ("True", reason)
            );
            assert_eq!(degraded.message, "probe peer (198.18.1.13:5300): refused");
        }
    }

    #[test]
    fn an_agent_error_is_applying_and_degraded_not_failed() {
        let error = outcome(NodeState::Applying, Some("agent error: journal /s: denied"));
        let s = status(&StatusInput {
            outcome: &error,
            observed_revision: Some("r2"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: Some(4),
            now: at(100),
        });
        assert_eq!(s.state, Some(NodeState::Applying));
        assert_eq!(cond(&s, APPLIED).status, "False");
        assert_eq!(
            cond(&s, APPLIED).message,
            "applying revision r2 once the agent can: agent error: journal /s: denied"
        );
        assert_eq!(cond(&s, DEGRADED).status, "True");
        assert_eq!(cond(&s, DEGRADED).reason, "AgentError");
        assert_eq!(
            cond(&s, DEGRADED).message,
            "agent error: journal /s: denied"
        );
        // The Applying shown before a transaction has no message and is not degraded.
        let applying = status(&StatusInput {
            outcome: &outcome(NodeState::Applying, None),
            observed_revision: Some("r2"),
            drifted: &[],
            facts: None,
            health: None,
            previous: Some(&s),
            generation: Some(4),
            now: at(200),
        });
        assert_eq!(cond(&applying, DEGRADED).status, "False");
    }

    #[test]
    fn reverted_and_not_supported() {
        let mut reverted = outcome(NodeState::Reverted, None);
        reverted.applied = None;
        let s = status(&StatusInput {
            outcome: &reverted,
            observed_revision: None,
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: None,
            now: at(1),
        });
        assert_eq!(cond(&s, REVERTED).status, "True");
        assert_eq!(cond(&s, REVERTED).reason, "SpecWithdrawn");
        assert_eq!(s.applied_revision, None);

        let mut unsupported = outcome(NodeState::Failed, Some("interfaces: not supported"));
        unsupported.items[0].state = ItemState::NotSupported;
        let s = status(&StatusInput {
            outcome: &unsupported,
            observed_revision: Some("r"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: None,
            now: at(1),
        });
        assert_eq!(cond(&s, DEGRADED).reason, "NotSupported");
    }

    #[test]
    fn a_revert_names_the_revision_it_reverted() {
        let applied = outcome(NodeState::Applied, None);
        let on_r1 = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: Some(3),
            now: at(100),
        });
        let mut reverted = outcome(NodeState::Reverted, None);
        reverted.applied = None;
        let withdrawn = |previous| {
            status(&StatusInput {
                outcome: &reverted,
                observed_revision: None,
                drifted: &[],
                facts: None,
                health: None,
                previous,
                generation: Some(4),
                now: at(200),
            })
        };
        let first = withdrawn(Some(&on_r1));
        assert_eq!(first.state, Some(NodeState::Reverted));
        assert_eq!(first.observed_revision.as_deref(), Some("r1"));
        assert_eq!(first.applied_revision, None);
        // Reported again (every reconcile of the withdrawn spec): the same status, no write.
        assert_eq!(withdrawn(Some(&first)), first);
        // A revision the transaction before was about but never reported applied (the agent
        // stopped between its writes and its report) is the one reverted.
        let applying = Outcome {
            applied: None,
            ..outcome(NodeState::Applying, None)
        };
        let mid_r2 = status(&StatusInput {
            outcome: &applying,
            observed_revision: Some("r2"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: Some(5),
            now: at(300),
        });
        assert_eq!(
            withdrawn(Some(&mid_r2)).observed_revision.as_deref(),
            Some("r2")
        );
        // Nothing ever applied: nothing reverted, no revision named.
        assert_eq!(withdrawn(None).observed_revision, None);
    }

    #[test]
    fn drift_is_a_condition_and_the_health_sample_is_kept() {
        let applied = outcome(NodeState::Applied, None);
        let drifted = [Drift {
            setting: crate::model::Setting::sysctl("net.ipv4.tcp_sack"),
            desired: "0".into(),
            found: crate::model::Reading::Value("1".into()),
        }];
        let sample = HealthSample {
            request_id: "h1".into(),
            out_segs: 10,
            ..HealthSample::default()
        };
        let clean = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &[],
            facts: None,
            health: None,
            previous: None,
            generation: Some(1),
            now: at(100),
        });
        assert_eq!(cond(&clean, DRIFTED).status, "False");
        assert_eq!(cond(&clean, DRIFTED).reason, "NoDrift");
        assert_eq!(clean.health, None);

        let found = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &drifted,
            facts: None,
            health: Some(&sample),
            previous: Some(&clean),
            generation: Some(1),
            now: at(200),
        });
        let d = cond(&found, DRIFTED);
        assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", "Drifted"));
        assert_eq!(d.message, "sysctl net.ipv4.tcp_sack: desired 0, found 1");
        assert_eq!(d.last_transition_time, at(200));
        assert_eq!(
            cond(&found, APPLIED).message,
            "revision r1 is applied; 1 of its settings drifted since (see Drifted)"
        );
        assert_eq!(cond(&found, APPLIED).last_transition_time, at(100));
        assert_eq!(found.health.as_ref(), Some(&sample));

        // Back in line: NoDrift from then on.
        let fixed = status(&StatusInput {
            outcome: &applied,
            observed_revision: Some("r1"),
            drifted: &[],
            facts: None,
            health: Some(&sample),
            previous: Some(&found),
            generation: Some(1),
            now: at(300),
        });
        assert_eq!(cond(&fixed, DRIFTED).status, "False");
        assert_eq!(cond(&fixed, DRIFTED).last_transition_time, at(300));
    }

    #[test]
    fn now_has_whole_seconds() {
        assert_eq!(now().0.subsec_nanosecond(), 0);
    }
}
