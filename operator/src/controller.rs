//! The NetworkTuning controller: Context, reconcile and error_policy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{future, StreamExt};
use hoststack_crds::{
    AnalysisStatus, Mode, NetworkTuning, NetworkTuningStatus, NodeConfig, NodeState, NodeTuning,
    NodeTuningSpec, Phase, RolloutPhase, ABORT_ANNOTATION, AGENT_LEASE_PREFIX, AGENT_NODE_LABEL,
    CANARY_LABEL, FINALIZER, OPERATOR_FIELD_MANAGER, PROMOTE_ANNOTATION,
};
use k8s_openapi::api::coordination::v1::Lease;
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
use crate::rollout::gate;
use crate::rollout::nodes::{self, NodePlan};
use crate::rollout::planner::{self, NodeView, Report, State};
use crate::rollout::strategy::{self, Gate};
use crate::rollout::{history, progress};
use crate::selection::{assign, Assignment, NodeLabels, TuningNodes};
use crate::status::{aggregate, condition, node_applied, node_failure, set_condition, Observed};
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
    heartbeats: Store<Lease>,
    recorder: Recorder,
    revert_timeout: Duration,
    metrics: Arc<Metrics>,
    /// Where the revision history (ControllerRevisions) lives.
    namespace: String,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: Client,
    identity: &str,
    namespace: &str,
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
    // The agents' heartbeats are read when a reconcile runs; their renewals trigger nothing.
    let (heartbeats, hb_writer) = reflector::store();
    let heartbeat_events = reflector::reflector(
        hb_writer,
        watcher(
            Api::<Lease>::namespaced(client.clone(), namespace),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(|_| future::ready(None::<()>));
    // Any change of a node's labels or of an agent's report can change any tuning's outcome
    // (selection, conflicts, status), so it reconciles them all.
    let triggers = futures::stream::select(
        futures::stream::select(node_events.map(|_| ()), nt_events.map(|_| ())),
        heartbeat_events,
    );

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
        heartbeats,
        revert_timeout,
        metrics,
        namespace: namespace.to_string(),
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
    let caches = futures::future::try_join3(
        ctx.nodes.wait_until_ready(),
        ctx.node_tunings.wait_until_ready(),
        ctx.heartbeats.wait_until_ready(),
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
    /// Nodes whose agent's heartbeat Lease is valid now.
    alive: BTreeSet<String>,
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
        let now = Timestamp::now();
        let alive = ctx
            .heartbeats
            .state()
            .iter()
            .filter_map(|lease| heartbeat_node(lease, now))
            .collect();
        Self {
            nodes,
            node_tunings,
            assignment,
            alive,
        }
    }
}

/// The node whose agent's heartbeat `lease` is, when it is valid at `now`.
fn heartbeat_node(lease: &Lease, now: Timestamp) -> Option<String> {
    let node = lease
        .metadata
        .name
        .as_deref()?
        .strip_prefix(AGENT_LEASE_PREFIX)?;
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let valid = i64::from(spec.lease_duration_seconds?);
    (now.as_second() <= renewed.as_second() + valid).then(|| node.to_string())
}

/// The NodeTuning spec that puts a node on `revision` (with its `config`) of `tuning`; without a
/// revision, the node carries the tuning's name and phase but nothing to apply.
fn node_spec(
    tuning: &str,
    revision: Option<(&str, &NodeConfig)>,
    plan: &NodePlan,
) -> NodeTuningSpec {
    NodeTuningSpec {
        tuning: Some(tuning.to_string()),
        revision: revision.map(|(r, _)| r.to_string()),
        config: revision.map(|(_, c)| c.clone()),
        mode: Some(Mode::Apply),
        rollout_phase: Some(plan.phase),
        health_request: plan.health_request.clone(),
        preview: None,
    }
}

/// The spec a node gets at once when its tuning is deleted and `heir` governs it now: the heir's
/// stable revision when it has one, its current one otherwise.
fn heir_spec(heir: &NetworkTuning) -> NodeTuningSpec {
    let stable = heir
        .status
        .as_ref()
        .and_then(|s| s.stable_revision.as_deref());
    let current = heir.spec.config.revision();
    let plan = NodePlan {
        revision: None,
        phase: RolloutPhase::Stable,
        health_request: None,
    };
    if stable.is_none_or(|s| s == current) {
        return node_spec(&heir.name_any(), Some((&current, &heir.spec.config)), &plan);
    }
    // The heir's stable config is on its nodes; until its own reconcile runs, the node waits
    // with nothing to apply.
    node_spec(&heir.name_any(), None, &plan)
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
    publish_action(ctx, tuning, type_, reason, "Reconcile", note).await
}

/// Publishes an event for `action`. Events of the same reason and action are one series (the
/// recorder counts repeats and keeps the first note), so each wave of each revision gets an
/// action of its own.
async fn publish_action(
    ctx: &Context,
    tuning: &NetworkTuning,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tuning.object_ref(&())).await {
        warn!(error = %e, reason, "could not record event");
    }
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// How often a rollout whose wave is being judged looks again.
const JUDGING_POLL: Duration = Duration::from_secs(2);

/// Advances a live tuning's rollout by one planning step, tells each node its revision, and
/// reports.
async fn apply(tuning: &NetworkTuning, ctx: &Context) -> Result<Action> {
    let snap = Snapshot::take(ctx);
    let name = tuning.name_any();
    let mine = snap.assignment.nodes_of(tuning, &snap.nodes);
    let config = &tuning.spec.config;
    let revision = config.revision();
    let previous = tuning.status.as_ref();
    let generation = tuning.metadata.generation;
    let now_time = now();
    let now_secs = u64::try_from(now_time.0.as_second()).unwrap_or(0);

    let resolved = match strategy::resolve(tuning.spec.rollout.as_ref(), mine.governed.len()) {
        Ok(r) => r,
        Err(message) => return invalid_rollout(tuning, ctx, message).await,
    };
    let restored = progress::restore(previous, &revision, generation);
    let history = history::sync(
        &ctx.client,
        &ctx.namespace,
        tuning,
        &revision,
        restored.stable.as_deref(),
    )
    .await?;

    let report = |node: &str| {
        let nt = snap.node_tunings.get(node);
        match node_failure(nt, &restored.revision) {
            Some(why) => Report::Failed(why),
            None if node_applied(nt, &restored.revision) => Report::Applied,
            None => Report::Pending,
        }
    };
    let labels: BTreeMap<&str, &BTreeMap<String, String>> = snap
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), &n.labels))
        .collect();
    let views: Vec<NodeView> = mine
        .governed
        .iter()
        .map(|node| NodeView {
            name: node.clone(),
            canary_label: labels
                .get(node.as_str())
                .and_then(|l| l.get(CANARY_LABEL))
                .is_some_and(|v| v == "true"),
            // An agent that never reported, or whose heartbeat expired, cannot apply or be
            // judged: it is not rolled onto.
            available: snap.alive.contains(node)
                && snap
                    .node_tunings
                    .get(node)
                    .is_some_and(|nt| nt.status.is_some()),
            report: report(node),
        })
        .collect();
    let analysis = tuning
        .spec
        .rollout
        .as_ref()
        .and_then(|r| r.analysis.as_ref());
    // Only a live rollout is judged; a finished one keeps the judgement it ended with.
    let live = matches!(restored.state, State::Progressing | State::Paused(_));
    let (verdict, judged) = if live {
        gate::evaluate(&gate::Input {
            name: &name,
            resolved: &resolved,
            analysis,
            progress: &restored,
            governed: &mine.governed,
            node_tunings: &snap.node_tunings,
            promote: tuning
                .annotations()
                .get(PROMOTE_ANNOTATION)
                .map(String::as_str),
            now: now_secs,
        })
        .await
    } else {
        (planner::Verdict::Pending, None)
    };
    // An agent that is alive but has not reported yet (its node just got a NodeTuning) answers
    // within moments: wait for it, so that the first wave is picked from every node that can
    // take part (a labelled canary among them).
    let discovering = mine.governed.iter().any(|n| {
        snap.alive.contains(n)
            && snap
                .node_tunings
                .get(n)
                .is_none_or(|nt| nt.status.is_none())
    });
    let abort = tuning
        .annotations()
        .get(ABORT_ANNOTATION)
        .map(String::as_str);
    let decision = if let Some(back) = gate::aborted(&restored, abort) {
        // Rolled back by hand: every node to the stable revision at once.
        planner::hold(&back, &views)
    } else if !discovering && views.iter().any(|v| v.available) {
        planner::plan(&resolved.strategy, &restored, &views, &verdict, now_secs)
    } else {
        // Agents still to report (a new tuning, or new nodes): nothing moves; the nodes get
        // their NodeTuning and the rollout goes on once they answer.
        planner::Decision {
            requeue_after: Some(JUDGING_POLL.as_secs()),
            ..planner::hold(&restored, &views)
        }
    };
    let sampling = match resolved.gate {
        Gate::Analysis if analysis.is_some_and(|a| !a.thresholds.is_empty()) => {
            nodes::health_request(&decision.progress, resolved.window)
        }
        _ => None,
    };
    let plans = nodes::plan_nodes(&decision, sampling.as_ref());

    // The status first: an operator restarted after this point finds the wave it started.
    let status = rollout_status(
        tuning,
        &mine,
        &snap,
        &decision,
        restored.waves.len(),
        judged,
        &now_time,
    );
    let was = previous.and_then(|s| s.phase);
    let had_conflict = previous.is_some_and(|s| !s.conflicts.is_empty());
    write_status(&ctx.client, tuning, &status).await?;
    ctx.metrics.observe_status(&name, &status);

    for (node, plan) in &plans {
        let config_of = |r: &str| -> Option<NodeConfig> {
            if r == revision {
                return Some(config.clone());
            }
            history.get(r).map(|e| e.config.clone()).or_else(|| {
                snap.node_tunings
                    .values()
                    .find(|nt| nt.spec.revision.as_deref() == Some(r))
                    .and_then(|nt| nt.spec.config.clone())
            })
        };
        let spec = match plan.revision.as_deref() {
            None => node_spec(&name, None, plan),
            Some(r) => match config_of(r) {
                Some(c) => node_spec(&name, Some((r, &c)), plan),
                None => {
                    warn!(tuning = %name, node, revision = r, "no config recorded for the revision; the node keeps its spec");
                    continue;
                }
            },
        };
        // A preview (`kubectl hoststack plan`) is not the operator's: it neither sets nor
        // compares it, and its server-side apply leaves it alone.
        if snap
            .node_tunings
            .get(node)
            .map(|nt| nt.spec.without_preview())
            != Some(spec.clone())
        {
            info!(tuning = %name, node, revision = ?spec.revision, phase = ?plan.phase, "assigning revision");
            apply_node_spec(&ctx.client, node, spec).await?;
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

    announce(ctx, tuning, previous, &status, was, had_conflict).await;
    let requeue = match &decision.progress.state {
        State::Progressing | State::Paused(_) if resolved.strategy.judged => JUDGING_POLL,
        _ => decision
            .requeue_after
            .map(Duration::from_secs)
            .map_or(RESYNC, |d| d.min(RESYNC)),
    };
    Ok(Action::requeue(requeue))
}

/// The tuning's status: the nodes' counts and conditions, with the rollout's phase, waves and
/// stable revision.
fn rollout_status(
    tuning: &NetworkTuning,
    mine: &TuningNodes,
    snap: &Snapshot,
    decision: &planner::Decision,
    judged_wave: usize,
    judged: Option<AnalysisStatus>,
    now: &Time,
) -> NetworkTuningStatus {
    let previous = tuning.status.as_ref();
    let revision = decision.progress.revision.as_str();
    let mut status = aggregate(&Observed {
        generation: tuning.metadata.generation,
        revision,
        nodes: mine,
        node_tunings: &snap.node_tunings,
        previous,
        now: now.clone(),
    });
    let p = &decision.progress;
    let (phase, message) = progress::phase_of(&p.state);
    let in_flight = p.waves.len().checked_sub(1);
    // The verdict was reached on the wave that was in flight before this step.
    let judged_wave = judged_wave.checked_sub(1);
    let report = |node: &str| {
        let nt = snap.node_tunings.get(node);
        match node_failure(nt, &p.revision) {
            Some(why) => Report::Failed(why),
            None if node_applied(nt, &p.revision) => Report::Applied,
            None => Report::Pending,
        }
    };
    let same_rollout = previous.and_then(|s| s.current_revision.as_deref()) == Some(revision);
    status.waves = progress::record_waves(p, report, |i| {
        if Some(i) == judged_wave && judged.is_some() {
            return judged.clone();
        }
        previous
            .filter(|_| same_rollout)
            .and_then(|s| s.waves.get(i))
            .and_then(|w| w.analysis.clone())
    });
    status.phase = Some(phase);
    status.message = message.clone();
    status.stable_revision = p.stable.clone();
    status.updated_nodes = match p.state {
        State::RolledBack(_) => 0,
        _ => p.updated().len() as i32,
    };
    let g = tuning.metadata.generation;
    let cond = |t: &str, s: bool, r: &str, m: String| condition(previous, t, s, r, m, g, now);
    let why = message.unwrap_or_default();
    match &p.state {
        State::Progressing => {
            if let (Some(i), Some(wave)) = (in_flight, p.waves.last()) {
                let what = if i == 0 { "canary" } else { "wave" };
                let m = format!(
                    "{what} {i} of revision {revision} on {}",
                    wave.nodes.join(", ")
                );
                set_condition(
                    &mut status.conditions,
                    cond("Progressing", true, "RollingOut", m),
                );
            }
        }
        State::Complete => {}
        State::Paused(_) => {
            let reason = if why.starts_with("analysis inconclusive") {
                "AnalysisInconclusive"
            } else {
                "Paused"
            };
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, reason, why.clone()),
            );
        }
        State::RolledBack(_) => {
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, "RolledBack", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond("Degraded", true, "RolledBack", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond(
                    "Ready",
                    false,
                    "RolledBack",
                    format!(
                        "revision {revision} was rolled back; a new spec generation tries again"
                    ),
                ),
            );
        }
        State::Halted(_) => {
            set_condition(
                &mut status.conditions,
                cond("Progressing", false, "Halted", why.clone()),
            );
            set_condition(
                &mut status.conditions,
                cond("Degraded", true, "Halted", why.clone()),
            );
        }
    }
    if !matches!(p.state, State::Complete) {
        if let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == "Ready") {
            if ready.status == "True" {
                *ready = cond(
                    "Ready",
                    false,
                    "RollingOut",
                    format!("revision {revision} is not on every node yet"),
                );
            }
        }
    }
    status
}

/// Reports an invalid rollout section: Degraded, nothing changes on any node.
async fn invalid_rollout(tuning: &NetworkTuning, ctx: &Context, message: String) -> Result<Action> {
    let mut status = tuning.status.clone().unwrap_or_default();
    set_condition(
        &mut status.conditions,
        condition(
            tuning.status.as_ref(),
            "Degraded",
            true,
            "InvalidRollout",
            message.clone(),
            tuning.metadata.generation,
            &now(),
        ),
    );
    if tuning.status.as_ref() != Some(&status) {
        publish(ctx, tuning, EventType::Warning, "InvalidRollout", message).await;
    }
    write_status(&ctx.client, tuning, &status).await?;
    Ok(Action::await_change())
}

/// Events for what changed: a wave promoted, a pause, a rollback, a halt, completion, a
/// conflict.
async fn announce(
    ctx: &Context,
    tuning: &NetworkTuning,
    previous: Option<&NetworkTuningStatus>,
    status: &NetworkTuningStatus,
    was: Option<Phase>,
    had_conflict: bool,
) {
    let message_of = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    };
    let revision = status.current_revision.as_deref().unwrap_or_default();
    let same_rollout =
        previous.and_then(|s| s.current_revision.as_ref()) == status.current_revision.as_ref();
    let waves_before = previous
        .filter(|_| same_rollout)
        .map_or(0, |s| s.waves.len());
    if status.waves.len() > waves_before && status.phase == Some(Phase::Progressing) {
        let wave = &status.waves[status.waves.len() - 1];
        let note = format!(
            "wave {} of revision {revision} started on {}",
            wave.index,
            wave.nodes.join(", ")
        );
        let action = format!("Rollout/{revision}/wave{}", wave.index);
        publish_action(ctx, tuning, EventType::Normal, "WaveStarted", &action, note).await;
    }
    let message = status.message.clone().unwrap_or_default();
    let action = format!("Rollout/{revision}");
    if status.phase != was {
        let event = match status.phase {
            Some(Phase::Complete) => Some((EventType::Normal, "Applied", message_of("Ready"))),
            Some(Phase::RolledBack) => Some((EventType::Warning, "RolledBack", message)),
            Some(Phase::Failed) => Some((EventType::Warning, "Halted", message)),
            Some(Phase::Paused) => Some((EventType::Normal, "Paused", message)),
            _ => None,
        };
        if let Some((type_, reason, note)) = event {
            publish_action(ctx, tuning, type_, reason, &action, note).await;
        }
    }
    announce_conflict(ctx, tuning, status, had_conflict, message_of).await;
}

/// The Conflict event, when a conflict appeared.
async fn announce_conflict(
    ctx: &Context,
    tuning: &NetworkTuning,
    status: &NetworkTuningStatus,
    had_conflict: bool,
    message_of: impl Fn(&str) -> String,
) {
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
        let spec = heir.map(|t| heir_spec(t)).unwrap_or_else(withdrawn_spec);
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
        history::forget(&ctx.client, &ctx.namespace, &name).await?;
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
