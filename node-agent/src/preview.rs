//! Previews: the agent's answer to `spec.preview` (`kubectl hoststack plan`), what applying
//! another config would change on this host now, computed by Plan mode and changing nothing.
//!
//! The pure part lives here: which intent a request stands for, and the answer made from
//! the plan's outcome. The watch loop ([`crate::controller`]) asks the
//! [`Reconciler`](crate::reconciler::Reconciler) for the plan once per request id, after any
//! transaction of the same reconcile, and keeps the answer in every status write while the
//! request stays.

use hoststack_crds::{Mode, NodeState, NodeTuningSpec, PreviewRequest, PreviewResult};

use crate::intent::Intent;
use crate::transaction::Outcome;

/// The tuning name a preview goes under when neither the request nor the spec names one.
const UNNAMED: &str = "preview";

/// The Plan-mode intent of `request`, a preview on the node whose spec is `spec`.
pub fn intent(spec: &NodeTuningSpec, request: &PreviewRequest) -> Intent {
    let tuning = request
        .tuning
        .clone()
        .or_else(|| spec.tuning.clone())
        .unwrap_or_else(|| UNNAMED.to_string());
    Intent::Revision {
        tuning,
        revision: request.config.revision(),
        config: Box::new(request.config.clone()),
        mode: Mode::Plan,
    }
}

/// The answer to request `id` about `revision` from the plan's outcome (or the agent's error,
/// which fails the answer with its reason), read from the host at `observed_at`.
pub fn answer(
    id: &str,
    revision: &str,
    planned: crate::Result<Outcome>,
    observed_at: &str,
) -> PreviewResult {
    let (state, message, items, applied) = match planned {
        Ok(o) => (o.state, o.message, o.items, o.applied),
        Err(e) => (
            NodeState::Failed,
            Some(format!("agent error: {e}")),
            Vec::new(),
            None,
        ),
    };
    PreviewResult {
        id: id.to_string(),
        revision: revision.to_string(),
        applied_revision: applied.map(|a| a.revision),
        state,
        message,
        items,
        observed_at: observed_at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use hoststack_crds::{ItemResult, ItemState, NodeConfig, SysctlValue};

    use super::*;
    use crate::journal::Applied;

    fn request(tuning: Option<&str>) -> PreviewRequest {
        let mut config = NodeConfig::default();
        config
            .sysctls
            .insert("net.ipv4.tcp_ecn".into(), SysctlValue("1".into()));
        PreviewRequest {
            id: "p1".into(),
            tuning: tuning.map(str::to_string),
            config,
        }
    }

    #[test]
    fn a_request_is_a_plan_of_its_config_under_its_tuning_or_the_nodes() {
        let spec = NodeTuningSpec {
            tuning: Some("edge".into()),
            ..NodeTuningSpec::default()
        };
        let r = request(Some("edge-next"));
        let Intent::Revision {
            tuning,
            revision,
            config,
            mode,
        } = intent(&spec, &r)
        else {
            panic!("not a revision");
        };
        assert_eq!(
            (tuning.as_str(), revision, *config, mode),
            (
                "edge-next",
                r.config.revision(),
                r.config.clone(),
                Mode::Plan
            )
        );
        let unnamed = request(None);
        assert_eq!(
            intent(&spec, &unnamed).target().map(|a| a.tuning),
            Some("edge".into())
        );
        assert_eq!(
            intent(&NodeTuningSpec::default(), &unnamed)
                .target()
                .map(|a| a.tuning),
            Some(UNNAMED.into())
        );
    }

    #[test]
    fn the_answer_carries_the_plan_or_the_agents_error() {
        let item = ItemResult {
            kind: "sysctl".into(),
            target: "net.ipv4.tcp_ecn".into(),
            actual: Some("2".into()),
            desired: Some("1".into()),
            state: ItemState::WouldChange,
            ..ItemResult::default()
        };
        let outcome = Outcome {
            state: NodeState::Planned,
            items: vec![item.clone()],
            message: None,
            applied: Some(Applied {
                tuning: "edge".into(),
                revision: "r1".into(),
            }),
            self_revert: None,
        };
        let a = answer("p1", "r2", Ok(outcome), "2026-11-30T04:00:00Z");
        assert_eq!(
            a,
            PreviewResult {
                id: "p1".into(),
                revision: "r2".into(),
                applied_revision: Some("r1".into()),
                state: NodeState::Planned,
                message: None,
                items: vec![item],
                observed_at: "2026-11-30T04:00:00Z".into(),
            }
        );
        let failed = answer(
            "p1",
            "r2",
            Err(crate::Error::Timeout("reading")),
            "2026-11-30T04:00:00Z",
        );
        assert_eq!(failed.state, NodeState::Failed);
        assert!(failed.items.is_empty());
        assert!(
            failed
                .message
                .as_deref()
                .unwrap()
                .starts_with("agent error: "),
            "{failed:?}"
        );
    }
}
