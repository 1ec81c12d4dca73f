//! The plugin's I/O with the API server: connecting with the kubeconfig flags, reading a
//! tuning, its nodes and its revision history, and patching it. Every error names what was
//! being done.

use hoststack_crds::{
    NetworkTuning, NodeTuning, HISTORY_FROM_LABEL, HISTORY_REVISION_LABEL, HISTORY_TUNING_LABEL,
};
use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::Value;

use crate::cli::Connection;
use crate::error::{Error, Result};
use crate::undo::Recorded;

/// The field manager of the plugin's writes.
pub const FIELD_MANAGER: &str = "kubectl-hoststack";

/// A client from `--kubeconfig` (or $KUBECONFIG, or ~/.kube/config) and `--context`.
pub async fn connect(connection: &Connection) -> Result<Client> {
    let options = KubeConfigOptions {
        context: connection.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &connection.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::Kubeconfig(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Client::try_from(hoststack_crds::api_client::bounded(config))
        .map_err(|e| Error::Kubeconfig(e.to_string()))
}

fn missing_tuning(name: &str) -> String {
    format!("no NetworkTuning named \"{name}\"")
}

/// The tuning named `name`.
pub async fn tuning(client: &Client, name: &str) -> Result<NetworkTuning> {
    Api::<NetworkTuning>::all(client.clone())
        .get(name)
        .await
        .map_err(|e| {
            Error::from_kube(e, &format!("reading NetworkTuning {name}"), || {
                missing_tuning(name)
            })
        })
}

/// The NodeTunings of the nodes `tuning` governs or rolled onto, by name.
pub async fn node_tunings(client: &Client, tuning: &NetworkTuning) -> Result<Vec<NodeTuning>> {
    let name = tuning.name_any();
    let in_waves: Vec<&String> = tuning
        .status
        .iter()
        .flat_map(|s| s.waves.iter().flat_map(|w| w.nodes.iter()))
        .collect();
    let mut nodes: Vec<NodeTuning> = Api::<NodeTuning>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::from_kube(e, "listing NodeTunings", || "no NodeTuning API".into()))?
        .items
        .into_iter()
        .filter(|nt| {
            let spec = &nt.spec;
            let governor = spec.governed_by.as_ref().or(spec.tuning.as_ref());
            governor == Some(&name) || in_waves.contains(&&nt.name_any())
        })
        .collect();
    nodes.sort_by_key(|nt| nt.name_any());
    Ok(nodes)
}

/// Sends a JSON merge patch to the tuning; `what` says what it does, for errors.
pub async fn patch_tuning(
    client: &Client,
    name: &str,
    patch: &Value,
    what: &str,
) -> Result<NetworkTuning> {
    Api::<NetworkTuning>::all(client.clone())
        .patch(
            name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(patch),
        )
        .await
        .map_err(|e| {
            Error::from_kube(e, &format!("{what} of NetworkTuning {name}"), || {
                missing_tuning(name)
            })
        })
}

/// The recorded revisions of `tuning` in `namespace`: those its object controls (not those an
/// earlier tuning of the same name left behind), and its own (not the copies of other tunings'
/// revisions it keeps for a rollback of nodes it took over).
pub async fn history(
    client: &Client,
    namespace: &str,
    tuning: &NetworkTuning,
) -> Result<Vec<Recorded>> {
    let uid = tuning.uid();
    let tuning = tuning.name_any();
    let listed = Api::<ControllerRevision>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!(
            "{HISTORY_TUNING_LABEL}={tuning},!{HISTORY_FROM_LABEL}"
        )))
        .await
        .map_err(|e| {
            Error::from_kube(
                e,
                &format!("listing the revision history in namespace {namespace}"),
                || format!("no namespace {namespace}"),
            )
        })?;
    Ok(listed
        .items
        .into_iter()
        .filter(|cr| {
            cr.owner_references()
                .iter()
                .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
        })
        .filter_map(|cr| {
            Some(Recorded {
                revision: cr.labels().get(HISTORY_REVISION_LABEL)?.clone(),
                sequence: cr.revision.unwrap_or(0),
                config: cr.data.0,
            })
        })
        .collect())
}
