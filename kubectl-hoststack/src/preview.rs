//! `plan`'s I/O with the API server: the nodes and their NodeTunings, writing a preview request
//! into `spec.preview` of each selected node's NodeTuning (never creating one), waiting for the
//! agents' answers in `status.preview`, and removing the requests again.
//!
//! The request is written with JSON patches under the plugin's field manager: `add` replaces
//! a request left behind whole, and the removal `test`s the id first, so a plan removes only its
//! own request. The operator's server-side apply owns the rest of the spec and leaves
//! `spec.preview` alone.

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_crds::{NodeConfig, NodeTuning, PreviewRequest};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::{Client, ResourceExt};

use crate::cluster::FIELD_MANAGER;
use crate::error::{Error, Result};
use crate::plan::Answer;

/// How often the NodeTunings are read while waiting for answers.
const POLL: Duration = Duration::from_millis(250);

/// A fresh request id: the plugin's process id and the time, unique enough that two plans
/// never share one.
pub fn new_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("plan-{}-{nanos:x}", std::process::id())
}

/// Every node's labels, by name.
pub async fn nodes(client: &Client) -> Result<BTreeMap<String, BTreeMap<String, String>>> {
    let listed = Api::<PartialObjectMeta<Node>>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(|e| Error::from_kube(e, "listing Nodes", || "no Node API".into()))?;
    Ok(listed
        .items
        .into_iter()
        .map(|n| (n.name_any(), n.labels().clone()))
        .collect())
}

/// Every NodeTuning, by name (= node name).
pub async fn node_tunings(client: &Client) -> Result<BTreeMap<String, NodeTuning>> {
    let listed = Api::<NodeTuning>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::from_kube(e, "listing NodeTunings", || "no NodeTuning API".into()))?;
    Ok(listed
        .items
        .into_iter()
        .map(|n| (n.name_any(), n))
        .collect())
}

fn json_patch(ops: serde_json::Value) -> Result<json_patch::Patch> {
    serde_json::from_value(ops).map_err(|e| Error::Output(format!("building a patch: {e}")))
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

/// Writes `request` into `node`'s NodeTuning; `false` when the node has none (nothing is
/// created). The API server checks the config against the NodeTuning schema here, so a bad
/// config is refused with the field it is wrong in.
pub async fn ask(client: &Client, node: &str, request: &PreviewRequest) -> Result<bool> {
    let value = serde_json::to_value(request).map_err(|e| Error::Output(e.to_string()))?;
    let patch = json_patch(serde_json::json!([
        {"op": "add", "path": "/spec/preview", "value": value}
    ]))?;
    let written = Api::<NodeTuning>::all(client.clone())
        .patch(node, &params(), &Patch::Json::<()>(patch))
        .await;
    match written {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 && !s.message.contains("requested resource") => {
            Ok(false)
        }
        Err(e) => Err(Error::from_kube(
            e,
            &format!("writing the preview request to NodeTuning {node}"),
            || format!("no NodeTuning named \"{node}\""),
        )),
    }
}

/// What `nt` says about request `id`: its answer, that another request replaced it, or
/// nothing yet.
pub fn answer_of(nt: Option<&NodeTuning>, id: &str) -> Option<Answer> {
    let Some(nt) = nt else {
        return Some(Answer::NoAgent);
    };
    if let Some(preview) = nt
        .status
        .as_ref()
        .and_then(|s| s.preview.as_ref())
        .filter(|p| p.id == id)
    {
        return Some(Answer::Planned {
            preview: preview.clone(),
        });
    }
    match &nt.spec.preview {
        Some(p) if p.id == id => None,
        other => Some(Answer::Replaced {
            by: other.as_ref().map(|p| p.id.clone()),
        }),
    }
}

/// Waits until every node in `asked` answered request `id` (or the request was replaced or
/// the NodeTuning deleted), at most `timeout`; nodes still silent then get
/// [`Answer::NoAnswer`].
pub async fn collect(
    client: &Client,
    asked: &[String],
    id: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, Answer>> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut answers = BTreeMap::new();
    loop {
        let nts = node_tunings(client).await?;
        for node in asked {
            if !answers.contains_key(node) {
                if let Some(answer) = answer_of(nts.get(node), id) {
                    answers.insert(node.clone(), answer);
                }
            }
        }
        if answers.len() == asked.len() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    for node in asked {
        answers
            .entry(node.clone())
            .or_insert_with(|| Answer::NoAnswer {
                waited: format!("{}s", timeout.as_secs()),
            });
    }
    Ok(answers)
}

/// Removes request `id` from each of `nodes` that still carries it; returns a message for each
/// node where that failed (so the caller can say how to remove it by hand).
pub async fn withdraw(client: &Client, nodes: &[String], id: &str) -> Vec<String> {
    let api = Api::<NodeTuning>::all(client.clone());
    let mut failures = Vec::new();
    for node in nodes {
        let patch = match json_patch(serde_json::json!([
            {"op": "test", "path": "/spec/preview/id", "value": id},
            {"op": "remove", "path": "/spec/preview"}
        ])) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{node}: {e}"));
                continue;
            }
        };
        match api.patch(node, &params(), &Patch::Json::<()>(patch)).await {
            // Gone, or no longer this plan's (the test failed): nothing of ours to remove.
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {}
            Err(e) => failures.push(format!("{node}: {e}")),
        }
    }
    failures
}

/// The request for `config` of `tuning`, with a fresh id.
pub fn request(tuning: Option<String>, config: NodeConfig) -> PreviewRequest {
    PreviewRequest {
        id: new_id(),
        tuning,
        config,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NodeState, NodeTuningSpec, NodeTuningStatus, PreviewResult};

    fn nt(asked: Option<&str>, answered: Option<&str>) -> NodeTuning {
        let mut nt = NodeTuning::new(
            "node-a",
            NodeTuningSpec {
                preview: asked.map(|id| PreviewRequest {
                    id: id.into(),
                    ..PreviewRequest::default()
                }),
                ..NodeTuningSpec::default()
            },
        );
        nt.status = Some(NodeTuningStatus {
            preview: answered.map(|id| PreviewResult {
                id: id.into(),
                state: NodeState::Planned,
                ..PreviewResult::default()
            }),
            ..NodeTuningStatus::default()
        });
        nt
    }

    #[test]
    fn a_node_has_answered_when_its_status_echoes_the_id() {
        assert_eq!(answer_of(None, "p1"), Some(Answer::NoAgent));
        assert_eq!(answer_of(Some(&nt(Some("p1"), None)), "p1"), None);
        // An answer to an earlier request is not this one's.
        assert_eq!(answer_of(Some(&nt(Some("p1"), Some("p0"))), "p1"), None);
        let Some(Answer::Planned { preview }) = answer_of(Some(&nt(Some("p1"), Some("p1"))), "p1")
        else {
            panic!("not answered");
        };
        assert_eq!(preview.id, "p1");
        assert_eq!(
            answer_of(Some(&nt(Some("p2"), Some("p0"))), "p1"),
            Some(Answer::Replaced {
                by: Some("p2".into())
            })
        );
        assert_eq!(
            answer_of(Some(&nt(None, None)), "p1"),
            Some(Answer::Replaced { by: None })
        );
    }

    #[test]
    fn request_ids_are_unique_and_fit_the_schema() {
        let a = request(None, NodeConfig::default());
        let b = request(Some("edge".into()), NodeConfig::default());
        assert_ne!(a.id, b.id);
        assert!(a.id.starts_with("plan-") && a.id.len() <= 128, "{}", a.id);
    }
}
