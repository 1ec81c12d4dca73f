//! The thin shell that carries a [`Decision`] out against the API server, in the order of its
//! fields: the status (recording what the API server answered, so that the next reconcile
//! plans from it even before the cache has caught up), the gauges, the NodeTuning specs
//! (server-side apply, [`WRITES_IN_FLIGHT`] at a time), the agent labels (as many), the
//! revision history, the events (a failure to record one is logged, never fatal), and what
//! happens next. It decides nothing.

use futures::{stream, TryStreamExt};
use hoststack_crds::{
    NetworkTuning, NetworkTuningStatus, NodeTuning, AGENT_NODE_LABEL, OPERATOR_FIELD_MANAGER,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Event;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::decision::{Announcement, Decision, Gauges, Next, SpecWrite};
use super::writes::AgentLabel;
use super::Context;
use crate::rollout::history;
use crate::{Error, Result};

/// How many node writes (specs, agent labels) one reconcile has in flight at once.
const WRITES_IN_FLIGHT: usize = 32;

/// Carries out `decision` about `tuning`; the first failed write stops it (the reconcile is
/// retried).
pub async fn carry_out(
    ctx: &Context,
    tuning: &NetworkTuning,
    decision: Decision,
) -> Result<Action> {
    let name = tuning.name_any();
    if let Some(status) = &decision.status {
        write_status(ctx, tuning, status).await?;
    }
    match (decision.gauges, &decision.status) {
        (Gauges::Show, Some(status)) => ctx.metrics.observe_status(&name, status),
        (Gauges::Forget, _) => ctx.metrics.forget(&name),
        _ => {}
    }
    for (node, revision) in &decision.unknown_revisions {
        warn!(
            node,
            revision, "no config recorded for the revision; the node keeps its spec"
        );
    }
    // Many at a time: a wave of a large pool is thousands of small writes, and one after the
    // other they made a reconcile last as long as thousands of round trips.
    stream::iter(decision.specs.into_iter().map(Ok))
        .try_for_each_concurrent(WRITES_IN_FLIGHT, |write| write_spec(ctx, &name, write))
        .await?;
    stream::iter(decision.agent_labels.iter().map(Ok))
        .try_for_each_concurrent(WRITES_IN_FLIGHT, |label| label_node(&ctx.client, label))
        .await?;
    if decision.forget_history {
        history::forget(&ctx.client, &ctx.namespace, &name).await?;
    }
    for event in &decision.events {
        publish(ctx, tuning, event).await;
    }
    match decision.next {
        Next::Requeue(after) => Ok(Action::requeue(after)),
        Next::AwaitChange => Ok(Action::await_change()),
        Next::WaitForRevert(nodes) => Err(Error::WaitingForRevert(nodes)),
    }
}

/// Writes a tuning's status when it differs from the one it has, and records the answer.
async fn write_status(
    ctx: &Context,
    tuning: &NetworkTuning,
    status: &NetworkTuningStatus,
) -> Result<()> {
    if tuning.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api = Api::<NetworkTuning>::all(ctx.client.clone());
    let patch = json!({
        "apiVersion": NetworkTuning::api_version(&()),
        "kind": NetworkTuning::kind(&()),
        "status": status,
    });
    let written = api
        .patch_status(
            &tuning.name_any(),
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    ctx.record_status_write(&written);
    Ok(())
}

/// Server-side applies one node's NodeTuning spec; fields the operator owned and left out are
/// removed. The answer is recorded, so that the next reconcile plans from it even before the
/// cache has caught up.
/// Its span names the node and the revision it is given (`None`: nothing to apply), inside the
/// reconcile's span that names the tuning.
#[instrument(skip_all, fields(node = %write.node, revision = ?write.spec.revision))]
async fn write_spec(ctx: &Context, tuning: &str, write: SpecWrite) -> Result<()> {
    info!(
        from = write.spec.tuning.as_deref().filter(|t| *t != tuning),
        phase = write.spec.rollout_phase.map(tracing::field::debug),
        "{}",
        write.why.message()
    );
    let api = Api::<NodeTuning>::all(ctx.client.clone());
    let mut nt = NodeTuning::new(&write.node, write.spec);
    // Owned by its Node: deleting the Node deletes it (the garbage collector).
    nt.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: write.node.clone(),
        uid: write.node_uid,
        ..OwnerReference::default()
    }]);
    let written = api
        .patch(
            &write.node,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&nt),
        )
        .await?;
    ctx.record_spec_write(written);
    Ok(())
}

/// Sets or removes the agent label of one node.
async fn label_node(client: &Client, label: &AgentLabel) -> Result<()> {
    let labels = if label.wanted {
        json!({AGENT_NODE_LABEL: "true"})
    } else {
        json!({})
    };
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": label.node, "labels": labels}
    });
    Api::<Node>::all(client.clone())
        .patch(
            &label.node,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// Records an event about the tuning; a failure to record is logged, never fatal.
async fn publish(ctx: &Context, tuning: &NetworkTuning, announcement: &Announcement) {
    let event = Event {
        type_: announcement.type_,
        reason: announcement.reason.into(),
        note: Some(announcement.note.clone()),
        action: announcement.action.clone(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tuning.object_ref(&())).await {
        warn!(error = %e, reason = announcement.reason, "could not record event");
    }
}
