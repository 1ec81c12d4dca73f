//! The NetworkTuning controller: Context, reconcile and error_policy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{future, StreamExt};
use hoststack_crds::{
    Mode, NetworkTuning, NetworkTuningStatus, NodeState, NodeTuning, NodeTuningSpec, Phase,
    RolloutPhase, AGENT_NODE_LABEL, FINALIZER, OPERATOR_FIELD_MANAGER,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::daemonset::needs_agent;
use crate::metrics::Metrics;
use crate::selection::{assign, Assignment, NodeLabels};
use crate::status::{aggregate, condition, set_condition, Observed};
use crate::{Error, Result};

/// How often a settled tuning is reconciled anyway.
const RESYNC: Duration = Duration::from_secs(300);
/// How soon a deleted tuning looks again at its nodes' reverts.
const REVERT_POLL: Duration = Duration::from_secs(1);
/// How long a reconcile waits for the caches to fill after a start.
const CACHE_WAIT: Duration = Duration::from_secs(30);

/// What every reconcile shares.
pub struct Context {
    client: Client,
    nodes: Store<PartialObjectMeta<Node>>,
    node_tunings: Store<NodeTuning>,
    tunings: Store<NetworkTuning>,
    recorder: Recorder,
    revert_timeout: Duration,
    metrics: Arc<Metrics>,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: Client,
    identity: &str,
    revert_timeout: Duration,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let tunings_api = Api::<NetworkTuning>::all(client.clone());
    // Fail fast, with a clear message, when the CRDs are not installed.
    tunings_api
        .list(&kube::api::ListParams::default().limit(1))
        .await?;

    let (nodes, nodes_writer) = reflector::store();
    // Metadata only: labels are all selection needs, and a Node's status is large.
    let node_events = reflector::reflector(
        nodes_writer,
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    let (node_tunings, nt_writer) = reflector::store();
    let nt_events = reflector::reflector(
        nt_writer,
        watcher(
            Api::<NodeTuning>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects();
    // Any change of a node's labels or of an agent's report can change any tuning's outcome
    // (selection, conflicts, status), so it reconciles them all.
    let triggers = futures::stream::select(node_events.map(|_| ()), nt_events.map(|_| ()));

    let controller = Controller::new(tunings_api, watcher::Config::default());
    let reporter = Reporter {
        controller: OPERATOR_FIELD_MANAGER.into(),
        instance: Some(identity.to_string()),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        nodes,
        node_tunings,
        tunings: controller.store(),
        revert_timeout,
        metrics,
    });
    controller
        .reconcile_all_on(triggers)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok((obj, _)) => tracing::debug!(tuning = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile failed"),
            }
            future::ready(())
        })
        .await;
    Ok(())
}

/// Reconciles one tuning, with the finalizer that reverts its nodes on deletion.
pub async fn reconcile(tuning: Arc<NetworkTuning>, ctx: Arc<Context>) -> Result<Action> {
    let caches = futures::future::try_join(
        ctx.nodes.wait_until_ready(),
        ctx.node_tunings.wait_until_ready(),
    );
    tokio::time::timeout(CACHE_WAIT, caches)
        .await
        .map_err(|_| Error::CacheNotReady(format!("not filled within {CACHE_WAIT:?}")))?
        .map_err(|e| Error::CacheNotReady(e.to_string()))?;
    let started = std::time::Instant::now();
    let name = tuning.name_any();
    let api = Api::<NetworkTuning>::all(ctx.client.clone());
    let result = finalizer(&api, FINALIZER, tuning, |event| async {
        match event {
            FinalizerEvent::Apply(t) => apply(&t, &ctx).await,
            FinalizerEvent::Cleanup(t) => cleanup(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconciled(&name, started.elapsed(), result.is_err());
    result
}

/// Requeues a failed reconcile; a deletion that waits for reverts looks again soon.
pub fn error_policy(tuning: Arc<NetworkTuning>, error: &Error, _ctx: Arc<Context>) -> Action {
    if let Error::Finalizer(inner) = error {
        if let kube::runtime::finalizer::Error::CleanupFailed(Error::WaitingForRevert(nodes)) =
            inner.as_ref()
        {
            info!(tuning = %tuning.name_any(), ?nodes, "waiting for nodes to revert");
            return Action::requeue(REVERT_POLL);
        }
    }
    warn!(tuning = %tuning.name_any(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// The cluster as the caches see it.
struct Snapshot {
    nodes: Vec<NodeLabels>,
    node_tunings: BTreeMap<String, NodeTuning>,
    assignment: Assignment,
}

impl Snapshot {
    fn take(ctx: &Context) -> Self {
        let nodes: Vec<NodeLabels> = ctx
            .nodes
            .state()
            .iter()
            .map(|n| NodeLabels {
                name: n.name_any(),
                labels: n.labels().clone(),
            })
            .collect();
        let node_tunings = ctx
            .node_tunings
            .state()
            .iter()
            .map(|nt| (nt.name_any(), nt.as_ref().clone()))
            .collect();
        let tunings = ctx.tunings.state();
        let assignment = assign(tunings.iter().map(|t| t.as_ref()), &nodes);
        Self {
            nodes,
            node_tunings,
            assignment,
        }
    }
}

/// The NodeTuning spec a tuning gives each node it governs.
fn desired_spec(tuning: &NetworkTuning) -> NodeTuningSpec {
    NodeTuningSpec {
        tuning: Some(tuning.name_any()),
        revision: Some(tuning.spec.config.revision()),
        config: Some(tuning.spec.config.clone()),
        mode: Some(Mode::Apply),
        // Every governed node goes straight to the revision until staged rollouts exist.
        rollout_phase: Some(RolloutPhase::Stable),
        health_request: None,
    }
}

/// The spec of a node no tuning governs: no tuning, revision or config, which asks its agent to
/// revert. `mode` stays, so that the operator keeps owning a field of `spec` and server-side
/// apply does not drop the whole (required) object.
fn withdrawn_spec() -> NodeTuningSpec {
    NodeTuningSpec {
        mode: Some(Mode::Apply),
        ..Default::default()
    }
}

/// Server-side applies a node's NodeTuning spec; fields the operator owned and left out are
/// removed.
async fn apply_node_spec(client: &Client, node: &str, spec: NodeTuningSpec) -> Result<()> {
    let api = Api::<NodeTuning>::all(client.clone());
    let nt = NodeTuning::new(node, spec);
    api.patch(
        node,
        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
        &Patch::Apply(&nt),
    )
    .await?;
    Ok(())
}

/// Makes the agent label on every node match whether it needs an agent.
async fn sync_agent_labels(ctx: &Context, snap: &Snapshot) -> Result<()> {
    let api = Api::<Node>::all(ctx.client.clone());
    for node in &snap.nodes {
        let nt = snap.node_tunings.get(&node.name);
        let wants = needs_agent(
            snap.assignment.governor.contains_key(&node.name),
            nt.and_then(|nt| nt.spec.tuning.as_deref()),
            nt.and_then(|nt| nt.status.as_ref())
                .and_then(|s| s.applied_revision.as_deref()),
        );
        let has = node.labels.get(AGENT_NODE_LABEL).map(String::as_str) == Some("true");
        if wants == has {
            continue;
        }
        let labels = if wants {
            json!({AGENT_NODE_LABEL: "true"})
        } else {
            json!({})
        };
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": labels}
        });
        api.patch(
            &node.name,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// Writes a tuning's status when it changed.
async fn write_status(
    client: &Client,
    tuning: &NetworkTuning,
    status: &NetworkTuningStatus,
) -> Result<()> {
    if tuning.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api = Api::<NetworkTuning>::all(client.clone());
    let patch = json!({
        "apiVersion": NetworkTuning::api_version(&()),
        "kind": NetworkTuning::kind(&()),
        "status": status,
    });
    api.patch_status(
        &tuning.name_any(),
        &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Publishes an event about a tuning; a failure to record is logged, never fatal.
async fn publish(
    ctx: &Context,
    tuning: &NetworkTuning,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tuning.object_ref(&())).await {
        warn!(error = %e, reason, "could not record event");
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Brings every node of a live tuning to its revision and reports.
async fn apply(tuning: &NetworkTuning, ctx: &Context) -> Result<Action> {
    let snap = Snapshot::take(ctx);
    let name = tuning.name_any();
    let mine = snap.assignment.nodes_of(tuning, &snap.nodes);
    let desired = desired_spec(tuning);
    let revision = desired.revision.clone().unwrap_or_default();

    for node in &mine.governed {
        if snap.node_tunings.get(node).map(|nt| &nt.spec) != Some(&desired) {
            info!(tuning = %name, node, revision, "assigning revision");
            apply_node_spec(&ctx.client, node, desired.clone()).await?;
        }
    }
    // Nodes this tuning gave a spec to and that no tuning governs any more get theirs withdrawn;
    // nodes another tuning now governs are rewritten by that tuning's reconcile.
    for (node, nt) in &snap.node_tunings {
        let ours = nt.spec.tuning.as_deref() == Some(name.as_str());
        if ours && !snap.assignment.governor.contains_key(node) {
            info!(tuning = %name, node, "withdrawing: node no longer selected");
            apply_node_spec(&ctx.client, node, withdrawn_spec()).await?;
        }
    }
    sync_agent_labels(ctx, &snap).await?;

    let previous = tuning.status.as_ref();
    let status = aggregate(&Observed {
        generation: tuning.metadata.generation,
        revision: &revision,
        nodes: &mine,
        node_tunings: &snap.node_tunings,
        previous,
        now: now(),
    });
    let was = previous.and_then(|s| s.phase);
    let had_conflict = previous.is_some_and(|s| !s.conflicts.is_empty());
    write_status(&ctx.client, tuning, &status).await?;
    ctx.metrics.observe_status(&name, &status);

    let message_of = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    if status.phase != was {
        match status.phase {
            Some(Phase::Complete) => {
                publish(
                    ctx,
                    tuning,
                    EventType::Normal,
                    "Applied",
                    message_of("Ready"),
                )
                .await
            }
            Some(Phase::Failed) => {
                publish(
                    ctx,
                    tuning,
                    EventType::Warning,
                    "ApplyFailed",
                    message_of("Degraded"),
                )
                .await
            }
            _ => {}
        }
    }
    if !status.conflicts.is_empty() && !had_conflict {
        publish(
            ctx,
            tuning,
            EventType::Warning,
            "Conflict",
            message_of("Conflict"),
        )
        .await;
    }
    Ok(Action::requeue(RESYNC))
}

/// Withdraws a deleted tuning from its nodes and waits, bounded, until they confirm the revert.
async fn cleanup(tuning: &NetworkTuning, ctx: &Context) -> Result<Action> {
    let snap = Snapshot::take(ctx);
    let name = tuning.name_any();
    let tunings = ctx.tunings.state();
    for (node, nt) in &snap.node_tunings {
        if nt.spec.tuning.as_deref() != Some(name.as_str()) {
            continue;
        }
        // A node another tuning now governs goes to that tuning at once.
        let heir = snap
            .assignment
            .governor
            .get(node)
            .and_then(|g| tunings.iter().find(|t| t.name_any() == *g));
        let spec = heir.map(|t| desired_spec(t)).unwrap_or_else(withdrawn_spec);
        info!(tuning = %name, node, heir = ?spec.tuning, "withdrawing: tuning deleted");
        apply_node_spec(&ctx.client, node, spec).await?;
    }

    let pending: Vec<String> = snap
        .node_tunings
        .iter()
        .filter(|(_, nt)| {
            let spec_ours = nt.spec.tuning.as_deref() == Some(name.as_str());
            let status = nt.status.as_ref();
            let applied_ours = status
                .and_then(|s| s.applied_tuning.as_deref())
                .is_some_and(|t| t == name);
            // An agent in the middle of a transaction may be applying this tuning's revision.
            let applying = status.is_some_and(|s| s.state == Some(NodeState::Applying));
            spec_ours || applied_ours || applying
        })
        .map(|(node, _)| node.clone())
        .collect();
    if pending.is_empty() {
        sync_agent_labels(ctx, &snap).await?;
        publish(
            ctx,
            tuning,
            EventType::Normal,
            "Reverted",
            "every node reverted".into(),
        )
        .await;
        return Ok(Action::await_change());
    }

    let since = tuning
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| Timestamp::now().duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let mut status = tuning.status.clone().unwrap_or_default();
    let nodes = pending.join(", ");
    if since >= ctx.revert_timeout {
        let message = format!(
            "deleted, but {nodes} did not confirm their revert within {}s; the tuning is let go and those hosts may still carry its settings",
            ctx.revert_timeout.as_secs()
        );
        set_condition(
            &mut status.conditions,
            condition(
                tuning.status.as_ref(),
                "Degraded",
                true,
                "RevertTimeout",
                message.clone(),
                tuning.metadata.generation,
                &now(),
            ),
        );
        write_status(&ctx.client, tuning, &status).await?;
        publish(ctx, tuning, EventType::Warning, "RevertTimeout", message).await;
        ctx.metrics.forget(&name);
        return Ok(Action::await_change());
    }
    set_condition(
        &mut status.conditions,
        condition(
            tuning.status.as_ref(),
            "Progressing",
            true,
            "Reverting",
            format!("deleted; waiting for {nodes} to revert"),
            tuning.metadata.generation,
            &now(),
        ),
    );
    write_status(&ctx.client, tuning, &status).await?;
    Err(Error::WaitingForRevert(pending))
}
