//! Revision history: every node-config revision of a tuning is kept as a ControllerRevision in
//! the operator's namespace, owned by the tuning, named `<tuning>-<revision>` and labelled
//! [`HISTORY_TUNING_LABEL`]`=<tuning>`. A rollback reads the stable revision's config from here.
//! The history is bounded: the newest [`HISTORY_LIMIT`] revisions are kept, and the current and
//! stable ones always.
//!
//! A history belongs to one tuning object, not to its name: revisions owned by an earlier
//! object of the same name (deleted, and not yet collected) are not read, and one in the way of
//! a new revision is replaced. [`forget`] deletes a deleted tuning's history itself, so it goes
//! with the tuning even where no garbage collector runs.

use std::collections::BTreeMap;

use hoststack_crds::{NetworkTuning, NodeConfig, HISTORY_REVISION_LABEL, HISTORY_TUNING_LABEL};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use tracing::info;

use crate::Result;

/// Revisions kept per tuning.
pub const HISTORY_LIMIT: usize = 10;

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
        .list(&ListParams::default().labels(&format!("{HISTORY_TUNING_LABEL}={name}")))
        .await?;
    let uid = tuning.uid();
    let (mine, earlier): (Vec<_>, Vec<_>) = listed
        .items
        .into_iter()
        .partition(|cr| owned_by(cr, uid.as_deref()));
    let mut history: History = mine
        .into_iter()
        .filter_map(|cr| {
            let revision = cr.labels().get(HISTORY_REVISION_LABEL)?.clone();
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
        if earlier
            .iter()
            .any(|cr| cr.metadata.name.as_deref() == Some(object_name.as_str()))
        {
            info!(tuning = %name, revision, "replacing an earlier tuning's revision");
            delete(&api, &object_name).await?;
        }
        let cr = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(object_name.clone()),
                namespace: Some(namespace.into()),
                labels: Some(BTreeMap::from([
                    (HISTORY_TUNING_LABEL.to_string(), name.clone()),
                    (HISTORY_REVISION_LABEL.to_string(), revision.to_string()),
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
        delete(&api, &object).await?;
        history.retain(|_, e| e.name != object);
    }
    Ok(history)
}

/// Deletes every recorded revision of the tuning named `tuning` (it is being deleted).
pub async fn forget(client: &Client, namespace: &str, tuning: &str) -> Result<()> {
    let api = Api::<ControllerRevision>::namespaced(client.clone(), namespace);
    let listed = api
        .list(&ListParams::default().labels(&format!("{HISTORY_TUNING_LABEL}={tuning}")))
        .await?;
    for object in listed
        .items
        .iter()
        .filter_map(|cr| cr.metadata.name.as_deref())
    {
        delete(&api, object).await?;
    }
    Ok(())
}

/// Deletes one recorded revision; one already gone is fine.
async fn delete(api: &Api<ControllerRevision>, object: &str) -> Result<()> {
    match api.delete(object, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether a recorded revision's controller is the tuning with `uid`.
fn owned_by(cr: &ControllerRevision, uid: Option<&str>) -> bool {
    cr.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

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

    #[test]
    fn a_revision_belongs_to_the_tuning_object_that_controls_it() {
        let owner = |uid: &str, controller: bool| OwnerReference {
            api_version: "hoststack.dev/v1alpha1".into(),
            kind: "NetworkTuning".into(),
            name: "edge".into(),
            uid: uid.into(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        let cr = |owners: Vec<OwnerReference>| ControllerRevision {
            metadata: ObjectMeta {
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            ..ControllerRevision::default()
        };
        assert!(owned_by(&cr(vec![owner("u2", true)]), Some("u2")));
        assert!(!owned_by(&cr(vec![owner("u1", true)]), Some("u2")));
        assert!(!owned_by(&cr(vec![owner("u2", false)]), Some("u2")));
        assert!(!owned_by(&cr(Vec::new()), Some("u2")));
        assert!(!owned_by(&cr(vec![owner("u2", true)]), None));
    }
}
