//! Revision history: every node-config revision of a tuning is kept as a ControllerRevision in
//! the operator's namespace, owned by the tuning, named `<tuning>-<revision>` and labelled
//! [`HISTORY_TUNING_LABEL`]`=<tuning>`. A rollback reads the stable revision's config from here.
//! The history is bounded: the newest [`HISTORY_LIMIT`] revisions are kept, and the current and
//! stable ones always.
//!
//! A tuning that takes nodes over from another records a copy of the other's revision they
//! run ([`Borrowed`], labelled [`HISTORY_FROM_LABEL`]`=<other tuning>`) before any wave moves
//! them, so that a rollback returns them to it even once the other tuning is gone; a copy goes
//! as soon as no node runs it or may return to it.
//!
//! A recorded revision is read only when its config hashes to its revision
//! ([`NodeConfig::verify_revision`]): one edited after it was recorded is logged, not read (a
//! rollback to it finds no config and moves no node), and replaced when the tuning records
//! that revision again.
//!
//! A history belongs to one tuning object, not to its name: revisions owned by an earlier
//! object of the same name (deleted, and not yet collected) are not read, and one in the way of
//! a new revision is replaced. [`forget`] deletes a deleted tuning's history itself, so it goes
//! with the tuning even where no garbage collector runs.

use std::collections::BTreeMap;

use hoststack_crds::{
    NetworkTuning, NodeConfig, RevisionMismatch, HISTORY_FROM_LABEL, HISTORY_REVISION_LABEL,
    HISTORY_TUNING_LABEL,
};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, Resource, ResourceExt};
use tracing::{error, info};

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
    /// The tuning whose revision this is a copy of; `None` for the tuning's own.
    pub from: Option<String>,
}

/// Another tuning's revision that nodes this tuning took over run.
#[derive(Clone, Debug, PartialEq)]
pub struct Borrowed {
    /// The revision.
    pub revision: String,
    /// The tuning it is a revision of.
    pub tuning: String,
    /// Its node config.
    pub config: NodeConfig,
}

/// The recorded revisions of a tuning, by revision hash.
pub type History = BTreeMap<String, Entry>;

/// The ControllerRevision name of a tuning's revision.
pub fn object_name(tuning: &str, revision: &str) -> String {
    format!("{tuning}-{revision}")
}

/// Which recorded revisions to delete: of the tuning's own, all but the newest
/// `HISTORY_LIMIT`; of the copies, every one; never one in `keep`.
pub fn to_prune<'a>(history: &'a History, keep: &[&str]) -> Vec<&'a str> {
    let mut by_age: Vec<(&str, &Entry)> = history
        .iter()
        .filter(|(_, e)| e.from.is_none())
        .map(|(r, e)| (r.as_str(), e))
        .collect();
    by_age.sort_by_key(|(_, e)| std::cmp::Reverse(e.sequence));
    let copies = history
        .iter()
        .filter(|(_, e)| e.from.is_some())
        .map(|(r, e)| (r.as_str(), e));
    by_age
        .into_iter()
        .skip(HISTORY_LIMIT)
        .chain(copies)
        .filter(|(r, _)| !keep.contains(r))
        .map(|(_, e)| e.name.as_str())
        .collect()
}

/// Reads a tuning's history, records `revision` and copies of the `borrowed` revisions when
/// they are new, and prunes what is neither recent nor `kept` (nor borrowed).
pub async fn sync(
    client: &Client,
    namespace: &str,
    tuning: &NetworkTuning,
    revision: &str,
    kept: &[String],
    borrowed: &[Borrowed],
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
    let (mut history, edited) = recorded(mine);
    for (object, mismatch) in &edited {
        error!(tuning = %name, object, %mismatch, "a recorded revision's config was edited: not read");
    }
    let own = (revision, &tuning.spec.config, None);
    let copies = borrowed
        .iter()
        .map(|b| (b.revision.as_str(), &b.config, Some(&b.tuning)));
    for (revision, config, from) in std::iter::once(own).chain(copies) {
        if history.contains_key(revision) {
            continue;
        }
        let sequence = history.values().map(|e| e.sequence).max().unwrap_or(0) + 1;
        let entry = Entry {
            name: object_name(&name, revision),
            sequence,
            config: config.clone(),
            from: from.cloned(),
        };
        let in_the_way = earlier
            .iter()
            .any(|cr| cr.metadata.name.as_deref() == Some(entry.name.as_str()))
            || edited.iter().any(|(object, _)| *object == entry.name);
        if in_the_way {
            info!(tuning = %name, revision, "replacing an earlier tuning's revision");
            delete(&api, &entry.name).await?;
        }
        record(&api, tuning, namespace, revision, &entry).await?;
        history.insert(revision.to_string(), entry);
    }
    let keep: Vec<&str> = std::iter::once(revision)
        .chain(kept.iter().map(String::as_str))
        .chain(borrowed.iter().map(|b| b.revision.as_str()))
        .collect();
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

/// The tuning's history as its ControllerRevisions `mine` record it, and the objects whose
/// config does not hash to their revision (edited since they were recorded), which it leaves
/// out.
fn recorded(mine: Vec<ControllerRevision>) -> (History, Vec<(String, RevisionMismatch)>) {
    let mut history = History::new();
    let mut edited = Vec::new();
    for cr in mine {
        let (Some(revision), Some(name)) = (
            cr.labels().get(HISTORY_REVISION_LABEL).cloned(),
            cr.metadata.name.clone(),
        ) else {
            continue;
        };
        let Ok(config) = serde_json::from_value::<NodeConfig>(cr.data.0) else {
            continue;
        };
        if let Err(mismatch) = config.verify_revision(&revision) {
            edited.push((name, mismatch));
            continue;
        }
        let entry = Entry {
            name,
            sequence: cr.revision.unwrap_or(0),
            config,
            from: cr
                .metadata
                .labels
                .and_then(|mut l| l.remove(HISTORY_FROM_LABEL)),
        };
        history.insert(revision, entry);
    }
    (history, edited)
}

/// Creates the ControllerRevision of `entry`, owned by `tuning`; one another reconcile created
/// first is the same by construction.
async fn record(
    api: &Api<ControllerRevision>,
    tuning: &NetworkTuning,
    namespace: &str,
    revision: &str,
    entry: &Entry,
) -> Result<()> {
    let name = tuning.name_any();
    let mut labels = BTreeMap::from([
        (HISTORY_TUNING_LABEL.to_string(), name.clone()),
        (HISTORY_REVISION_LABEL.to_string(), revision.to_string()),
    ]);
    if let Some(from) = &entry.from {
        labels.insert(HISTORY_FROM_LABEL.to_string(), from.clone());
    }
    let cr = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(entry.name.clone()),
            namespace: Some(namespace.into()),
            labels: Some(labels),
            owner_references: tuning.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: RawExtension(
            serde_json::to_value(&entry.config).expect("a NodeConfig always serializes"),
        ),
        revision: Some(entry.sequence),
    };
    match api.create(&PostParams::default(), &cr).await {
        Ok(_) => {
            info!(tuning = %name, revision, sequence = entry.sequence, from = entry.from.as_deref(), "recorded revision");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
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
        let history: History = (1..=15)
            .map(|i| {
                let entry = Entry {
                    name: format!("t-r{i}"),
                    sequence: i,
                    config: NodeConfig::default(),
                    // r14 and r15 are copies of another tuning's revisions.
                    from: (i > 13).then(|| "core".to_string()),
                };
                (format!("r{i}"), entry)
            })
            .collect();
        let mut pruned = to_prune(&history, &["r2", "r15"]);
        pruned.sort();
        // The oldest own revisions beyond the ten newest, and every copy nobody keeps.
        assert_eq!(pruned, ["t-r1", "t-r14", "t-r3"]);
        let small: History = history.into_iter().take(3).collect();
        assert!(to_prune(&small, &[]).is_empty());
        assert_eq!(object_name("edge", "abc"), "edge-abc");
    }

    /// A recorded revision as [`record`] writes it: `config` under the revision `revision`.
    fn controller_revision(revision: &str, config: &NodeConfig) -> ControllerRevision {
        ControllerRevision {
            metadata: ObjectMeta {
                name: Some(object_name("edge", revision)),
                labels: Some(BTreeMap::from([
                    (HISTORY_TUNING_LABEL.to_string(), "edge".to_string()),
                    (HISTORY_REVISION_LABEL.to_string(), revision.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            data: RawExtension(serde_json::to_value(config).expect("serializes")),
            revision: Some(1),
        }
    }

    /// Issue 39: a recorded revision whose config was edited (its name and label unchanged)
    /// is not read as that revision: a rollback must never push what nobody rolled out.
    #[test]
    fn a_recorded_revision_whose_config_does_not_hash_to_it_is_not_read() {
        let mut good = NodeConfig::default();
        good.sysctls.insert(
            "net.ipv4.tcp_sack".into(),
            hoststack_crds::SysctlValue("1".into()),
        );
        let mut edited_config = good.clone();
        edited_config.sysctls.insert(
            "net.ipv4.tcp_sack".into(),
            hoststack_crds::SysctlValue("0".into()),
        );
        // The revision that was rolled out before someone edited its recorded config.
        let mut rolled_out = good.clone();
        rolled_out.sysctls.insert(
            "net.core.somaxconn".into(),
            hoststack_crds::SysctlValue("4096".into()),
        );
        let (kept, tampered) = (good.revision(), rolled_out.revision());
        let (history, edited) = recorded(vec![
            controller_revision(&kept, &good),
            controller_revision(&tampered, &edited_config),
        ]);
        assert_eq!(
            history.keys().collect::<Vec<_>>(),
            [&kept],
            "{tampered} holds a config that hashes to {}",
            edited_config.revision()
        );
        let message = edited[0].1.to_string();
        assert_eq!(edited[0].0, object_name("edge", &tampered));
        assert!(
            message.contains(&tampered) && message.contains(&edited_config.revision()),
            "{message}"
        );
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
