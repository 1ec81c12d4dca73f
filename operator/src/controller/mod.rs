//! The NetworkTuning controller: [`Context`], [`run`], [`reconcile`] and [`error_policy`].
//!
//! A reconcile reads a [`Snapshot`] of the caches and of the operator's own latest status
//! writes (it plans from the newer of the cached tuning and its own last write:
//! [`Snapshot::newest`]), asks what it cannot know from them (the revision history, the
//! analysis gate), decides with a pure function of those
//! ([`apply::prepare`] and [`apply::Apply::decide`] for a live tuning, [`cleanup::decide`] for
//! a deleted one) and hands the [`decision::Decision`] to [`effects::carry_out`]. Every
//! reconcile runs in a span naming the tuning and its revision; every NodeTuning write in a
//! span naming the node.

pub mod apply;
pub mod cleanup;
pub mod decision;
pub mod effects;
pub mod heartbeats;
pub mod snapshot;
pub mod writes;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{future, StreamExt};
use hoststack_crds::{NetworkTuning, NodeTuning, FINALIZER, OPERATOR_FIELD_MANAGER};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::finalizer::{finalizer, Event as FinalizerEvent};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use tracing::{info, instrument, warn};

use crate::metrics::Metrics;
use crate::rollout::planner::Verdict;
use crate::rollout::prometheus_endpoints::PrometheusEndpoints;
use crate::rollout::{gate, history};
use crate::selection::NodeLabels;
use crate::{Error, Result};
use heartbeats::Heartbeats;
pub use snapshot::Snapshot;
use snapshot::{newest_node_tunings, StatusWrite};

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
    /// When the operator saw each agent's Lease renewed, on its own clock.
    renewals: Arc<Mutex<Heartbeats>>,
    recorder: Recorder,
    revert_timeout: Duration,
    metrics: Arc<Metrics>,
    /// The Prometheus endpoints the installer lets the rollout gate ask.
    prometheus_endpoints: PrometheusEndpoints,
    /// Where the revision history (ControllerRevisions) lives.
    namespace: String,
    /// The operator's own latest status write to each tuning, by uid (the cache may lag it).
    status_writes: Mutex<BTreeMap<String, StatusWrite>>,
    /// The NodeTunings as the operator's own spec writes left them, by node, while the cache
    /// has not caught up with them: a reconcile that planned from a lagging cache wrote every
    /// such spec again.
    spec_writes: Mutex<BTreeMap<String, Arc<NodeTuning>>>,
}

/// Runs the controller until `shutdown` completes; the rollout gate asks only the Prometheus
/// `prometheus_endpoints`.
pub async fn run(
    client: Client,
    identity: &str,
    namespace: &str,
    revert_timeout: Duration,
    prometheus_endpoints: PrometheusEndpoints,
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
            hoststack_crds::api_client::watch_config(),
        )
        .modify(forget_managed_fields),
    )
    .default_backoff()
    .touched_objects()
    .inspect({
        let metrics = metrics.clone();
        move |_| metrics.watch_event("nodes")
    });
    let (node_tunings, nt_writer) = reflector::store();
    let nt_events = reflector::reflector(
        nt_writer,
        watcher(
            Api::<NodeTuning>::all(client.clone()),
            hoststack_crds::api_client::watch_config(),
        )
        .modify(forget_managed_fields),
    )
    .default_backoff()
    .touched_objects()
    .inspect({
        let metrics = metrics.clone();
        move |_| metrics.watch_event("nodetunings")
    });
    // The agents' heartbeats are read when a reconcile runs; their renewals trigger nothing,
    // but each is noted when it is seen (the operator's clock judges them, not the agents').
    let renewals = Arc::new(Mutex::new(Heartbeats::default()));
    let (heartbeats, hb_writer) = reflector::store();
    let heartbeat_events = reflector::reflector(
        hb_writer,
        watcher(
            Api::<Lease>::namespaced(client.clone(), namespace),
            hoststack_crds::api_client::watch_config(),
        )
        .modify(forget_managed_fields),
    )
    .default_backoff()
    .touched_objects()
    .filter_map({
        let metrics = metrics.clone();
        let renewals = renewals.clone();
        move |lease| {
            metrics.watch_event("leases");
            if let Ok(lease) = lease {
                let mut renewals = renewals.lock().unwrap_or_else(|e| e.into_inner());
                renewals.observe(&lease, Instant::now());
            }
            future::ready(None::<()>)
        }
    });
    // A tuning created, edited or being deleted can change who governs which node (a node it
    // lets go goes to another tuning, as a staged rollout of that one): every tuning looks
    // again. Status writes change neither, and trigger nothing here.
    let tuning_events = watcher(
        tunings_api.clone(),
        hoststack_crds::api_client::watch_config(),
    )
    .default_backoff()
    .touched_objects()
    .inspect({
        let metrics = metrics.clone();
        move |_| metrics.watch_event("networktunings")
    })
    .predicate_filter(selection_inputs, Default::default())
    .map(|_| ());
    // Any change of a node's labels or of an agent's report can change any tuning's outcome
    // (selection, conflicts, status), so it reconciles them all.
    let triggers = futures::stream::select(
        futures::stream::select(node_events.map(|_| ()), nt_events.map(|_| ())),
        futures::stream::select(heartbeat_events, tuning_events),
    );

    let controller = Controller::new(tunings_api, hoststack_crds::api_client::watch_config());
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
        renewals,
        revert_timeout,
        metrics,
        prometheus_endpoints,
        namespace: namespace.to_string(),
        status_writes: Mutex::default(),
        spec_writes: Mutex::default(),
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

/// Drops an object's managedFields before a cache keeps it: nothing the operator decides reads
/// them, and on a Node or a NodeTuning they are often the largest part of its metadata. The
/// caches that grow with the cluster (Nodes, NodeTunings, heartbeat Leases) hold every object
/// without them.
fn forget_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// What of a tuning selection depends on: its spec (by generation) and whether it is being
/// deleted.
fn selection_inputs(tuning: &NetworkTuning) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    tuning.metadata.generation.hash(&mut hasher);
    tuning
        .metadata
        .deletion_timestamp
        .is_some()
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Reconciles one tuning, with the finalizer that reverts its nodes on deletion.
#[instrument(skip_all, fields(tuning = %tuning.name_any(), revision = %tuning.spec.config.revision()))]
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
            FinalizerEvent::Apply(t) => reconcile_live(&t, &ctx).await,
            FinalizerEvent::Cleanup(t) => reconcile_deleted(&t, &ctx).await,
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

impl Context {
    /// Records the tuning the API server answered a status write with.
    fn record_status_write(&self, written: &NetworkTuning) {
        if let Some(uid) = &written.metadata.uid {
            self.status_writes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone(), StatusWrite::of(written));
        }
    }

    /// Records the NodeTuning the API server answered a spec write with.
    fn record_spec_write(&self, written: NodeTuning) {
        self.spec_writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(written.name_any(), Arc::new(written));
    }

    /// The caches as they are now, with the operator's own latest status writes (those of
    /// tunings gone from the cache are forgotten) and its own spec writes where they are newer
    /// than the cache (those the cache has caught up with are forgotten).
    fn snapshot(&self) -> Snapshot {
        let nodes = self
            .nodes
            .state()
            .iter()
            .map(|n| NodeLabels {
                name: n.name_any(),
                uid: n.uid().unwrap_or_default(),
                labels: n.labels().clone(),
            })
            .collect();
        let node_tunings = newest_node_tunings(
            self.node_tunings.state(),
            &mut self.spec_writes.lock().unwrap_or_else(|e| e.into_inner()),
        );
        let alive = self
            .renewals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .alive(
                self.heartbeats.state().iter().map(|l| l.as_ref()),
                Instant::now(),
            );
        let tunings = self.tunings.state();
        let status_writes = {
            let mut writes = self.status_writes.lock().unwrap_or_else(|e| e.into_inner());
            writes.retain(|uid, _| tunings.iter().any(|t| t.uid().as_ref() == Some(uid)));
            writes.clone()
        };
        Snapshot::new(tunings, nodes, node_tunings, alive, Timestamp::now())
            .with_status_writes(status_writes)
    }
}

/// Advances a live tuning's rollout by one planning step, tells each node its revision, and
/// reports.
async fn reconcile_live(tuning: &NetworkTuning, ctx: &Context) -> Result<Action> {
    let snap = ctx.snapshot();
    let tuning = snap.newest(tuning);
    let tuning = tuning.as_ref();
    let decision = match apply::prepare(tuning, &snap) {
        Err(invalid) => *invalid,
        Ok(step) => {
            let history = history::sync(
                &ctx.client,
                &ctx.namespace,
                tuning,
                step.revision(),
                &step.kept(),
                &step.borrowed(),
            )
            .await?;
            let judgement = match step.gate(&ctx.prometheus_endpoints) {
                Some(mut input) => {
                    let secret = input
                        .analysis
                        .and_then(|a| a.prometheus.as_ref())
                        .and_then(|p| p.secret_name.as_deref());
                    if let Some(name) = secret {
                        input.prometheus_secret =
                            Some(read_secret(&ctx.client, &ctx.namespace, name).await);
                    }
                    gate::evaluate(&input).await
                }
                None => (Verdict::Pending, None),
            };
            step.decide(&history, judgement)
        }
    };
    effects::carry_out(ctx, tuning, decision).await
}

/// The data of Secret `name` in the operator's namespace, or why it cannot be had (the chart
/// lets the operator read only the Secret its values name).
async fn read_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> std::result::Result<BTreeMap<String, Vec<u8>>, String> {
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
    {
        Ok(secret) => Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| (key, value.0))
            .collect()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            Err(format!("not found in namespace {namespace}"))
        }
        Err(kube::Error::Api(e)) if e.code == 403 => Err(format!(
            "the operator may not read it in namespace {namespace}: the chart grants it the \
             Secret named by its value prometheus.secretName only ({})",
            e.message
        )),
        Err(e) => Err(format!("reading it failed: {e}")),
    }
}

/// Withdraws a deleted tuning from its nodes and waits, bounded, until they confirm the revert.
async fn reconcile_deleted(tuning: &NetworkTuning, ctx: &Context) -> Result<Action> {
    let snap = ctx.snapshot();
    let tuning = snap.newest(tuning);
    let decision = cleanup::decide(&tuning, &snap, ctx.revert_timeout);
    effects::carry_out(ctx, &tuning, decision).await
}
