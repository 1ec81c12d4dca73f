//! Revision history: every node-config revision of a tuning is kept as a ControllerRevision in
//! the operator's namespace, owned by the tuning (so it goes when the tuning goes), named
//! `<tuning>-<revision>` and labelled `hoststack.dev/tuning=<tuning>`. A rollback reads the
//! stable revision's config from here. The history is bounded: the newest [`HISTORY_LIMIT`]
//! revisions are kept, and the current and stable ones always.

use std::collections::BTreeMap;

use hoststack_crds::{NetworkTuning, NodeConfig};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use tracing::info;

use crate::Result;

/// Revisions kept per tuning.
pub const HISTORY_LIMIT: usize = 10;
/// The label naming a revision's tuning.
pub const TUNING_LABEL: &str = "hoststack.dev/tuning";
/// The label carrying a revision's hash.
pub const REVISION_LABEL: &str = "hoststack.dev/revision";

/// One recorded revision.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The ControllerRevision's name.
    pub name: String,
    /// Its sequence number (1 is the tuning's first revision).
    pub sequence: i64,
    /// The node config of the revision.
    pub config: NodeConfig,
}

/// The recorded revisions of a tuning, by revision hash.
pub type History = BTreeMap<String, Entry>;

/// The ControllerRevision name of a tuning's revision.
pub fn object_name(tuning: &str, revision: &str) -> String {
    format!("{tuning}-{revision}")
}

/// Which recorded revisions to delete: all but the newest `HISTORY_LIMIT`, never `keep`.
pub fn to_prune<'a>(history: &'a History, keep: &[&str]) -> Vec<&'a str> {
    let mut by_age: Vec<(&str, &Entry)> = history.iter().map(|(r, e)| (r.as_str(), e)).collect();
    by_age.sort_by_key(|(_, e)| std::cmp::Reverse(e.sequence));
    by_age
        .into_iter()
        .skip(HISTORY_LIMIT)
        .filter(|(r, _)| !keep.contains(r))
        .map(|(_, e)| e.name.as_str())
        .collect()
}

/// Reads a tuning's history, records `revision` when it is new, and prunes the oldest.
pub async fn sync(
    client: &Client,
    namespace: &str,
    tuning: &NetworkTuning,
    revision: &str,
    stable: Option<&str>,
) -> Result<History> {
    let api = Api::<ControllerRevision>::namespaced(client.clone(), namespace);
    let name = tuning.name_any();
    let listed = api
        .list(&ListParams::default().labels(&format!("{TUNING_LABEL}={name}")))
        .await?;
    let mut history: History = listed
        .items
        .into_iter()
        .filter_map(|cr| {
            let revision = cr.labels().get(REVISION_LABEL)?.clone();
            let config = serde_json::from_value(cr.data.0).ok()?;
            let entry = Entry {
                name: cr.metadata.name?,
                sequence: cr.revision.unwrap_or(0),
                config,
            };
            Some((revision, entry))
        })
        .collect();
    if !history.contains_key(revision) {
        let sequence = history.values().map(|e| e.sequence).max().unwrap_or(0) + 1;
        let object_name = object_name(&name, revision);
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(object_name.clone()),
                namespace: Some(namespace.into()),
                labels: Some(BTreeMap::from([
                    (TUNING_LABEL.to_string(), name.clone()),
                    (REVISION_LABEL.to_string(), revision.to_string()),
                ])),
                owner_references: tuning.controller_owner_ref(&()).map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            data: RawExtension(
                serde_json::to_value(&tuning.spec.config).expect("a NodeConfig always serializes"),
            ),
            revision: Some(sequence),
        };
        match api.create(&PostParams::default(), &cr).await {
            Ok(_) => info!(tuning = %name, revision, sequence, "recorded revision"),
            // Another reconcile recorded it first: the same content by construction.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        history.insert(
            revision.to_string(),
            Entry {
                name: object_name,
                sequence,
                config: tuning.spec.config.clone(),
            },
        );
    }
    let keep: Vec<&str> = [Some(revision), stable].into_iter().flatten().collect();
    let prune: Vec<String> = to_prune(&history, &keep)
        .into_iter()
        .map(String::from)
        .collect();
    for object in prune {
        match api.delete(&object, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        history.retain(|_, e| e.name != object);
    }
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prunes_the_oldest_but_never_the_current_or_stable_revision() {
        let history: History = (1..=13)
            .map(|i| {
                let entry = Entry {
                    name: format!("t-r{i}"),
                    sequence: i,
                    config: NodeConfig::default(),
                };
                (format!("r{i}"), entry)
            })
            .collect();
        let mut pruned = to_prune(&history, &["r2"]);
        pruned.sort();
        assert_eq!(pruned, ["t-r1", "t-r3"]);
        let small: History = history.into_iter().take(3).collect();
        assert!(to_prune(&small, &[]).is_empty());
        assert_eq!(object_name("edge", "abc"), "edge-abc");
    }
}
