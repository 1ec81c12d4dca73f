//! The watch loop: connects the [`Reconciler`] to the API server.
//!
//! The agent watches only its own NodeTuning (a field selector on `metadata.name`), reconciles
//! on every event that brings a copy not older than its own ([`Latest`]: watch events and the
//! objects its status writes return are ordered by resourceVersion, so a queued older event
//! never brings a withdrawn spec back) and every `--resync-interval` (each reconcile re-reads
//! the host, so this is also the drift check), and server-side-applies the status subresource as
//! [`AGENT_FIELD_MANAGER`] when, and only when, the status changed. Host work runs on the
//! current thread (`block_in_place`): a transaction is never abandoned half-way by a signal; the
//! loop exits cleanly on SIGTERM or SIGINT between reconciles.
//!
//! While `spec.healthRequest` is present, a [`Sampler`] times the health windows: the loop wakes
//! at the end of each window, reads the TCP counters under `--proc-root` and writes status once
//! with the new sample. Every status write carries the latest sample (server-side apply would
//! drop a field the write leaves out); when the request goes away the next write clears it.
//!
//! A `spec.preview` (`kubectl hoststack plan`) is answered once per id with a Plan-mode run of
//! its config ([`crate::preview`]), after any transaction of the same reconcile: a preview waits
//! for an Apply in flight, no longer. The answer rides along in every status write while the
//! request stays, and goes with the next write once it is removed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hoststack_crds::{
    Confirmation, DriftPolicy, NodeTuning, NodeTuningStatus, PreviewResult, ProbeResult,
    AGENT_FIELD_MANAGER,
};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::block_in_place;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use crate::clock::{Clocks, SystemClocks};
use crate::config::Config;
use crate::confirmation::{judge, Checks, Step, Verdict, Window, API_SERVER_PROBE};
use crate::dataplane::{self, backoff::Backoff, Supervisor};
use crate::exporter::{Exporter, NodeInfoLabels};
use crate::failures::SpecGeneration;
use crate::health::{Ended, Sampler, Snapshot};
use crate::host::Host;
use crate::intent::Intent;
use crate::journal::JournalStore;
use crate::latest::{Latest, Road};
use crate::probe;
use crate::reconciler::{Next, Reconciler};
use crate::report::{self, StatusInput};
use crate::transaction::{Outcome, SelfRevert, Transactor};
use crate::{Error, Result};

/// How soon a failed status write is retried.
const STATUS_RETRY: Duration = Duration::from_secs(2);

/// How long one status write may take before it counts as failed (and SIGTERM waits no longer).
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs the agent until SIGTERM or SIGINT: serves /metrics, recovers an interrupted
/// transaction, then watches the node's NodeTuning and reconciles. Needs a multi-threaded
/// tokio runtime.
pub async fn run(config: Config) -> Result<()> {
    let mut node = NodeAgent::new(config.clone());
    let addr = config.metrics_bind_address;
    let bound = crate::exporter::serve(addr, node.metrics())
        .await
        .map_err(|source| Error::Metrics { addr, source })?;
    tracing::info!(address = %bound, "serving /metrics");
    // Recovery needs no API server: put the host back in one piece first.
    node.recover()?;
    let kube_config = hoststack_crds::api_client::bounded(
        kube::Config::infer()
            .await
            .map_err(kube::Error::InferConfig)?,
    );
    let client = Client::try_from(kube_config.clone())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    let shutdown = async move {
        tokio::select! {
            _ = sigterm.recv() => tracing::info!("SIGTERM: exiting"),
            _ = sigint.recv() => tracing::info!("SIGINT: exiting"),
        }
    };
    node.run(client, Some(kube_config), shutdown).await
}

/// One node's agent: its host, journal, reconciler, user-space stack supervisor and metrics.
/// The `hoststack-agent` binary runs one; the lab's fleet (`hoststack-fleet`) runs many in one
/// process, sharing their clients' connections.
pub struct NodeAgent {
    config: Config,
    reconciler: Reconciler,
    dataplane: Supervisor,
    metrics: Arc<Exporter>,
}

impl NodeAgent {
    /// The agent of `config.node_name` on the host under `config`'s roots; touches nothing yet.
    pub fn new(config: Config) -> NodeAgent {
        let host =
            Host::new(&config.proc_root, &config.sys_root).with_bpffs_root(&config.bpffs_root);
        let transactor = Transactor::new(host.clone(), JournalStore::new(&config.state_dir));
        let mut reconciler = Reconciler::new(transactor, config.hooks());
        reconciler.set_probe_destinations(config.probe_allowed_destinations.clone());
        let dataplane = Supervisor::new(
            &config.userstack_binary(),
            &config.state_dir,
            Backoff::default(),
            host,
        );
        let metrics = Arc::new(
            Exporter::with_userstack_stats(&config.proc_root, Some(&dataplane.stats_path()))
                .with_xdp_drops(&config.bpffs_root),
        );
        NodeAgent {
            config,
            reconciler,
            dataplane,
            metrics,
        }
    }

    /// The registry its /metrics would serve.
    pub fn metrics(&self) -> Arc<Exporter> {
        self.metrics.clone()
    }

    /// Undoes a transaction the journal says was interrupted (and a revision never confirmed).
    /// A corrupt journal is an error; any other failure is logged and retried on every
    /// reconcile.
    pub fn recover(&mut self) -> Result<()> {
        let recover = tracing::info_span!("recover", node = %self.config.node_name);
        match recover.in_scope(|| block_in_place(|| self.reconciler.recover())) {
            Ok(true) => recover
                .in_scope(|| tracing::info!("undid an interrupted transaction from the journal")),
            Ok(false) => {}
            Err(e @ Error::JournalCorrupt { .. }) => return Err(e),
            Err(e) => recover.in_scope(
                || tracing::error!(error = %e, "recovery failed; retrying on every reconcile"),
            ),
        }
        Ok(())
    }

    /// Renews the node's heartbeat, watches its NodeTuning and reconciles with `client` until
    /// `shutdown` completes (between reconciles) or the watch ends. `kube_config` is what the
    /// API-server probe makes its new connections from (`None`: no post-apply probes).
    pub async fn run(
        mut self,
        client: Client,
        kube_config: Option<kube::Config>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        let config = self.config.clone();
        if let Some(kube_config) = &kube_config {
            let url = &kube_config.cluster_url;
            let api_server = resolve(url.host().unwrap_or(""), url.port_u16().unwrap_or(443)).await;
            tracing::info!(?api_server, "the route to this address is never bound away");
            self.reconciler.set_api_server(api_server);
        }
        // The heartbeat is renewed only while this loop goes round: at least every heartbeat
        // interval (the pulse), unless a step of it is stuck.
        let (loop_went_round, progress) = tokio::sync::watch::channel(Instant::now());
        let heartbeat = tokio::spawn(crate::heartbeat::run(
            client.clone(),
            config.namespace.clone(),
            config.node_name.clone(),
            config.heartbeat_interval,
            progress,
        ));
        let mut pulse = tokio::time::interval(config.heartbeat_interval);
        pulse.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let api: Api<NodeTuning> = Api::all(client);
        let mut agent = Agent::new(
            api.clone(),
            config.clone(),
            self.reconciler,
            self.metrics,
            self.dataplane,
        );
        agent.kube_config = kube_config;

        let selector = format!("metadata.name={}", config.node_name);
        let mut events = watcher::watcher(
            api,
            hoststack_crds::api_client::watch_config().fields(&selector),
        )
        .default_backoff()
        .boxed();
        let mut resync = tokio::time::interval(config.resync_interval);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        tracing::info!(node = %config.node_name, "watching NodeTuning");

        loop {
            loop_went_round.send_replace(Instant::now());
            let health_deadline = agent.sampler.deadline().map(Instant::from_std);
            let confirmation_due = agent.confirmation_due();
            tokio::select! {
                () = &mut shutdown => break,
                event = events.next() => match event {
                    Some(Ok(event)) => agent.on_event(event).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching NodeTuning"),
                    None => {
                        tracing::error!("the watch ended");
                        break;
                    }
                },
                _ = resync.tick(), if agent.listed => agent.reconcile().await,
                _ = pulse.tick() => {}
                _ = tokio::time::sleep_until(health_deadline.unwrap_or_else(Instant::now)),
                    if health_deadline.is_some() => agent.end_health_window().await,
                _ = tokio::time::sleep_until(confirmation_due.unwrap_or_else(Instant::now)),
                    if confirmation_due.is_some() => agent.confirmation_step().await,
            }
            if agent.spec_moved {
                agent.reconcile().await;
            }
            if std::mem::take(&mut agent.retry_soon) {
                resync.reset_at(Instant::now() + STATUS_RETRY);
            }
        }
        heartbeat.abort();
        Ok(())
    }
}

/// The watch loop's state.
struct Agent {
    api: Api<NodeTuning>,
    config: Config,
    reconciler: Reconciler,
    /// The node's NodeTuning: the newest copy from the watch or a status write.
    latest: Latest,
    /// The object of the (re)list under way.
    listing: Option<NodeTuning>,
    /// A list has completed: the NodeTuning is known.
    listed: bool,
    /// The last status write failed, or the agent's own error stopped a transaction: reconcile
    /// again soon.
    retry_soon: bool,
    /// A status write's answer asks for something other than what was reported on: reconcile
    /// again at once.
    spec_moved: bool,
    /// The /metrics registry: node info and the agent's work.
    metrics: Arc<Exporter>,
    /// The last reconcile's intent and outcome, which a health sample is reported with.
    last: Option<(Intent, Outcome)>,
    /// Health windows and the latest sample.
    sampler: Sampler,
    /// Whether the sample of the status found at start was taken over.
    resumed: bool,
    /// Runs the user-space stack of `userspaceStack`.
    dataplane: Supervisor,
    /// The answer to the spec's preview request, while there is one.
    preview: Option<PreviewResult>,
    /// The client configuration the API-server probe builds its new clients from.
    kube_config: Option<kube::Config>,
    /// The provisional revision's window and the checks that confirm it, while there is one.
    window: Option<(Window, Checks)>,
    /// The last round of probes, reported in the status.
    probes: Vec<ProbeResult>,
    /// The clocks: the confirmation window runs on the monotonic one.
    clocks: Arc<dyn Clocks>,
}

impl Agent {
    /// The loop's state before the first list.
    fn new(
        api: Api<NodeTuning>,
        config: Config,
        reconciler: Reconciler,
        metrics: Arc<Exporter>,
        dataplane: Supervisor,
    ) -> Self {
        Agent {
            api,
            config,
            reconciler,
            latest: Latest::default(),
            listing: None,
            listed: false,
            retry_soon: false,
            spec_moved: false,
            metrics,
            last: None,
            sampler: Sampler::new(),
            resumed: false,
            dataplane,
            preview: None,
            kube_config: None,
            window: None,
            probes: Vec::new(),
            clocks: Arc::new(SystemClocks),
        }
    }

    /// Takes one watch event. A completed (re)list reconciles; after it, an event reconciles
    /// when it brought a copy not older than the agent's own (an older one changes nothing).
    async fn on_event(&mut self, event: Event<NodeTuning>) {
        let taken = match event {
            Event::Init => {
                self.listing = None;
                return;
            }
            Event::InitApply(object) => {
                self.listing = Some(object);
                return;
            }
            Event::InitDone => {
                match self.listing.take() {
                    Some(object) => self.latest.offer(object, Road::Relist),
                    None => self.latest.deleted(None, Road::Relist),
                };
                self.listed = true;
                true
            }
            Event::Apply(object) => self.latest.offer(object, Road::Watch),
            Event::Delete(object) => self.latest.deleted(Some(&object), Road::Watch),
        };
        if taken && self.listed {
            self.reconcile().await;
        }
    }

    /// One reconcile of the current object: decide, maybe transact, report. It runs in a span
    /// that names the node, the tuning and the revision, with the decision, the transaction
    /// (`apply` or `revert`) and a preview in spans of their own inside it, so that every log
    /// line says what it is about.
    ///
    /// Every status write returns the object, and its spec can be newer than the one the
    /// reconcile acted on (the operator withdrew or replaced it meanwhile; the watch events
    /// queued behind the write are older and are ignored): the reconcile then starts again
    /// from the newest copy at once.
    async fn reconcile(&mut self) {
        loop {
            self.spec_moved = false;
            self.reconcile_once().await;
            if !self.spec_moved {
                break;
            }
        }
    }

    /// One pass of [`Agent::reconcile`]. When the answer to the Applying write asks for
    /// something else, it stops before the transaction: the next pass acts on the newest.
    async fn reconcile_once(&mut self) {
        let intent = Intent::of(self.latest.object());
        let mut spec = SpecGeneration::of(self.latest.object());
        let span = tracing::info_span!(
            "reconcile",
            node = %self.config.node_name,
            tuning = intent.tuning(),
            revision = intent.revision(),
        );
        async move {
            if !std::mem::replace(&mut self.resumed, true) {
                let previous = self.latest.object().and_then(|o| o.status.as_ref());
                self.sampler
                    .resume(previous.and_then(|s| s.health.as_ref()));
            }
            self.metrics
                .node_info
                .set(NodeInfoLabels::of(self.latest.object()));
            // A revert stops the stack first; the transaction then gives its cores back.
            self.follow_dataplane(dataplane::before_transaction(&intent));
            let decide = tracing::info_span!("decide");
            let next = decide.in_scope(|| block_in_place(|| self.reconciler.next(&intent, &spec)));
            let outcome = match next {
                Ok(Next::Report(outcome)) => outcome,
                Ok(Next::Transaction { applying }) => {
                    let transaction = match intent.target() {
                        Some(_) => tracing::info_span!("apply"),
                        None => tracing::info_span!("revert"),
                    };
                    // Settings of the applied revision changed and the policy re-applies them
                    // (under Report a transaction only runs for other work, which rewrites them
                    // in passing).
                    let drift = !self.reconciler.drifted().is_empty()
                        && intent.drift_policy() == Some(DriftPolicy::Reapply);
                    if drift {
                        transaction.in_scope(|| {
                            tracing::warn!(
                                drifted = %crate::drift::message(self.reconciler.drifted()),
                                "settings drifted; writing the desired values again"
                            )
                        });
                    }
                    if let Some(applying) = applying {
                        self.report(&intent, &applying).await;
                        if self.spec_moved {
                            tracing::info!(
                                "the answer to the Applying write asks for something else; \
                                 acting on that instead"
                            );
                            return;
                        }
                        // The same intent, perhaps of a newer generation: it acts on that one.
                        spec = SpecGeneration::of(self.latest.object());
                    }
                    self.sampler.transaction_started();
                    transaction.in_scope(|| {
                        tracing::info!(revision = ?intent.revision(), "transaction starts");
                        let started = std::time::Instant::now();
                        let outcome = block_in_place(|| self.reconciler.transact(&intent, &spec));
                        self.retry_soon |= self.reconciler.retry_soon();
                        self.metrics.work.transaction(
                            intent.target().as_ref(),
                            outcome.state,
                            started.elapsed(),
                            drift,
                        );
                        tracing::info!(
                            state = %outcome.state,
                            message = outcome.message.as_deref().unwrap_or(""),
                            "transaction ended"
                        );
                        outcome
                    })
                }
                Err(e) => {
                    tracing::error!(error = %e, "reconcile failed; retrying soon");
                    self.retry_soon = true;
                    self.reconciler.error_outcome(&e)
                }
            };
            let outcome = self.follow_confirmation(&intent, &spec, outcome).await;
            self.metrics.work.applied(outcome.applied.as_ref());
            // The stack is the last step of an applied revision.
            self.follow_dataplane(dataplane::after_transaction(&intent, outcome.state));
            self.follow_health_request(&outcome);
            self.follow_preview();
            self.report(&intent, &outcome).await;
            self.last = Some((intent, outcome));
        }
        .instrument(span)
        .await
    }

    /// Starts, keeps or stops the user-space stack as `step` says; a failure is logged, and the
    /// next reconcile tries again.
    fn follow_dataplane(&mut self, step: dataplane::StackAction) {
        let result = match step {
            dataplane::StackAction::Keep => return,
            dataplane::StackAction::Stop => block_in_place(|| self.dataplane.stop()),
            dataplane::StackAction::Run(stack) => block_in_place(|| {
                let facts = crate::facts::collect(&self.config.proc_root, &self.config.sys_root);
                dataplane::wanted(&stack, &self.config.sys_root, &facts.interfaces)
                    .and_then(|wanted| self.dataplane.ensure(wanted))
            }),
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "user-space stack");
        }
    }

    /// Starts, keeps or stops health sampling as the spec's `healthRequest` says, with the host
    /// on the revision of `outcome`.
    fn follow_health_request(&mut self, outcome: &Outcome) {
        let request = self
            .latest
            .object()
            .and_then(|o| o.spec.health_request.as_ref());
        let revision = outcome.applied.as_ref().map(|a| a.revision.as_str());
        let proc_root = &self.config.proc_root;
        let started = self
            .sampler
            .update(request, revision, || Snapshot::take(proc_root));
        if let Err(e) = started {
            tracing::warn!(error = %e, "health sampling");
        }
    }

    /// Answers the spec's preview request, once per id, or forgets the answer when the request
    /// is gone.
    fn follow_preview(&mut self) {
        let Some(object) = self.latest.object() else {
            self.preview = None;
            return;
        };
        let Some(request) = &object.spec.preview else {
            self.preview = None;
            return;
        };
        if self.preview.as_ref().is_some_and(|p| p.id == request.id) {
            return;
        }
        let intent = crate::preview::intent(&object.spec, request);
        let span = tracing::info_span!(
            "preview",
            id = %request.id,
            tuning = intent.tuning(),
            revision = intent.revision(),
        );
        let _preview = span.enter();
        let planned = block_in_place(|| self.reconciler.preview(&intent));
        let answer = crate::preview::answer(
            &request.id,
            intent.revision().unwrap_or_default(),
            planned,
            &report::now().0.to_string(),
        );
        tracing::info!(
            id = %answer.id,
            revision = %answer.revision,
            state = %answer.state,
            "answered a preview"
        );
        self.preview = Some(answer);
    }

    /// Ends the health window that is due: reads the counters and writes the sample.
    async fn end_health_window(&mut self) {
        let applied = self.last.as_ref().and_then(|(_, o)| o.applied.clone());
        let span = tracing::info_span!(
            "health",
            node = %self.config.node_name,
            tuning = applied.as_ref().map(|a| a.tuning.as_str()),
            revision = applied.as_ref().map(|a| a.revision.as_str()),
        );
        let revision = applied.map(|a| a.revision);
        async move {
            let snapshot = block_in_place(|| Snapshot::take(&self.config.proc_root));
            match self.sampler.end(revision.as_deref(), snapshot) {
                Some(Ended::Sample(measured)) => {
                    if !measured.went_backwards.is_empty() {
                        tracing::warn!(
                            counters = ?measured.went_backwards,
                            "TCP counters went backwards (reset); this window measured nothing"
                        );
                    }
                    if let Some((intent, outcome)) = self.last.clone() {
                        self.report(&intent, &outcome).await;
                    }
                }
                Some(Ended::Unmeasured(reason)) => {
                    tracing::warn!(%reason, "no health sample for this window");
                }
                None => {}
            }
        }
        .instrument(span)
        .await
    }

    /// Keeps the confirmation window in step with the journal after a reconcile: opens one when
    /// the host is on a provisional revision of `intent` (and runs the probe targets at once: a
    /// target the change broke reverts it before anything else), closes it when nothing is
    /// provisional any more. Returns the outcome to report.
    async fn follow_confirmation(
        &mut self,
        intent: &Intent,
        spec: &SpecGeneration,
        outcome: Outcome,
    ) -> Outcome {
        let provisional = match block_in_place(|| self.reconciler.provisional()) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "reading the journal");
                return outcome;
            }
        };
        let Some(revision) = provisional else {
            self.window = None;
            return outcome;
        };
        if self
            .window
            .as_ref()
            .is_some_and(|(w, _)| w.revision == revision)
        {
            return outcome;
        }
        let checks = match self.reconciler.checks(intent) {
            Ok(Some(checks)) => checks,
            // Nothing confirms it any more (the spec turned the probes off): it stays.
            Ok(None) => {
                if let Err(e) = block_in_place(|| self.reconciler.confirm()) {
                    tracing::error!(error = %e, "confirming the revision");
                }
                return outcome;
            }
            Err(e) => {
                let reason = e.to_string();
                return self
                    .self_revert(intent, spec, reason, SelfRevert::ProbeFailed)
                    .await;
            }
        };
        let window = Window::open(&revision, &checks, self.window_now(), fastrand::f64());
        self.metrics
            .work
            .provisional(intent.tuning().unwrap_or_default());
        tracing::info!(
            %revision,
            settle = ?checks.settle,
            confirm_timeout = ?checks.confirm_timeout,
            "the revision is provisional until its probes confirm it"
        );
        let targets = Checks {
            api_server: false,
            ..checks.clone()
        };
        // The probes of an earlier revision say nothing about this one.
        self.probes.clear();
        let deadline = self.round_deadline(&window);
        let results = self.probe_round(&targets, &revision, deadline).await;
        self.window = Some((window, checks));
        if let Verdict::Revert(reason) = judge(&results) {
            return self
                .self_revert(intent, spec, reason, SelfRevert::ProbeFailed)
                .await;
        }
        outcome
    }

    /// When `window` closes, on tokio's clock: every round of probes in it ends by then.
    fn round_deadline(&self, window: &Window) -> Instant {
        Instant::now() + Duration::from_millis(window.deadline.saturating_sub(self.window_now()))
    }

    /// Now, on the confirmation window's clock: the monotonic one, so that a step of the wall
    /// clock neither expires a good revision at once nor postpones the revert of a bad one.
    fn window_now(&self) -> u64 {
        self.clocks.monotonic_millis()
    }

    /// What the confirmation window asks for now, while there is one.
    fn confirmation_now(&self) -> Option<Step> {
        let (window, _) = self.window.as_ref()?;
        Some(window.step(self.window_now()))
    }

    /// When the confirmation window wants the loop's attention.
    fn confirmation_due(&self) -> Option<Instant> {
        let due = match self.confirmation_now()? {
            Step::Wait(wait) => wait,
            Step::Probe | Step::Expire(_) => Duration::ZERO,
        };
        Some(Instant::now() + due)
    }

    /// Advances the confirmation window: a round of probes when it is due (confirming,
    /// retrying or reverting), the revert by itself when the deadline passed.
    async fn confirmation_step(&mut self) {
        let Some((window, checks)) = self.window.clone() else {
            return;
        };
        let Some((intent, _)) = self.last.clone() else {
            return;
        };
        let spec = SpecGeneration::of(self.latest.object());
        let span = tracing::info_span!(
            "confirm",
            node = %self.config.node_name,
            tuning = intent.tuning(),
            revision = %window.revision,
        );
        async move {
            match window.step(self.window_now()) {
                Step::Wait(_) => {}
                Step::Expire(reason) => {
                    self.revert_and_report(intent, &spec, reason, SelfRevert::Unconfirmed).await;
                }
                Step::Probe => {
                    // The round (the status write it needs, then the probes) ends by the
                    // deadline at the latest: a node cut off must not wait out its timeouts.
                    let deadline = self.round_deadline(&window);
                    // The status with the confirmation pending must be written for the API
                    // server to show it back.
                    let reported = async {
                        if let Some((intent, outcome)) = self.last.clone() {
                            self.report(&intent, &outcome).await;
                        }
                    };
                    let results = match tokio::time::timeout_at(deadline, reported).await {
                        Ok(()) => Some(self.probe_round(&checks, &window.revision, deadline).await),
                        Err(_) => None,
                    };
                    let Some(results) = results else {
                        let mut cut_short = window.clone();
                        cut_short.last_error.get_or_insert_with(|| {
                            format!("probe {API_SERVER_PROBE}: the status write with the confirmation pending did not reach the API server by the deadline")
                        });
                        let reason = cut_short
                            .step(cut_short.deadline)
                            .expired()
                            .unwrap_or_default();
                        self.revert_and_report(intent, &spec, reason, SelfRevert::Unconfirmed).await;
                        return;
                    };
                    match judge(&results) {
                        Verdict::Confirm => match block_in_place(|| self.reconciler.confirm()) {
                            Ok(_) => {
                                tracing::info!("every probe passed: the revision is confirmed");
                                self.window = None;
                                if let Some((intent, outcome)) = self.last.clone() {
                                    self.report(&intent, &outcome).await;
                                }
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "confirming the revision");
                                self.retry_window(e.to_string());
                            }
                        },
                        Verdict::Revert(reason) => {
                            self.revert_and_report(intent, &spec, reason, SelfRevert::ProbeFailed).await;
                        }
                        Verdict::Retry(reason) => {
                            tracing::warn!(%reason, "not confirmed yet; probing again");
                            self.retry_window(reason);
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// [`Agent::self_revert`] from the window, then reports it and remembers it as the last
    /// outcome.
    async fn revert_and_report(
        &mut self,
        intent: Intent,
        spec: &SpecGeneration,
        reason: String,
        cause: SelfRevert,
    ) {
        let outcome = self.self_revert(&intent, spec, reason, cause).await;
        self.report(&intent, &outcome).await;
        self.last = Some((intent, outcome));
    }

    /// Records a round that did not confirm the window's revision.
    fn retry_window(&mut self, why: String) {
        let now = self.window_now();
        if let Some((window, _)) = &mut self.window {
            window.retry(now, why, fastrand::f64());
        }
    }

    /// Runs one round of `checks` for `revision`, ended by `deadline`, counts and keeps the
    /// results.
    async fn probe_round(
        &mut self,
        checks: &Checks,
        revision: &str,
        deadline: Instant,
    ) -> Vec<ProbeResult> {
        let Some(kube_config) = &self.kube_config else {
            return Vec::new();
        };
        let api_server = probe::ApiServer {
            config: kube_config,
            node: &self.config.node_name,
            revision,
        };
        let destinations = &self.config.probe_allowed_destinations;
        let results = probe::round(checks, api_server, destinations, deadline).await;
        let tuning = self
            .last
            .as_ref()
            .and_then(|(i, _)| i.tuning().map(String::from))
            .unwrap_or_default();
        self.metrics.work.probes(&tuning, &results);
        for r in results.iter().filter(|r| !r.passed) {
            tracing::warn!(probe = %r.name, target = %r.target, error = r.message.as_deref().unwrap_or(""), "probe failed");
        }
        if !results.is_empty() {
            self.probes = results.clone();
        }
        results
    }

    /// Reverts the provisional revision of `intent` by itself, for `reason` and `cause`. The outcome reports it (once the API server
    /// can be reached: a failed write is retried, and every reconcile reports it again).
    async fn self_revert(
        &mut self,
        intent: &Intent,
        spec: &SpecGeneration,
        reason: String,
        cause: SelfRevert,
    ) -> Outcome {
        tracing::error!(%reason, "reverting the revision by itself");
        let outcome = block_in_place(|| self.reconciler.abandon(intent, spec, reason, cause));
        self.retry_soon |= self.reconciler.retry_soon();
        self.window = None;
        self.metrics
            .work
            .self_revert(intent.tuning().unwrap_or_default(), cause);
        self.metrics.work.applied(outcome.applied.as_ref());
        self.follow_dataplane(dataplane::after_transaction(intent, outcome.state));
        outcome
    }

    /// Writes the status for `outcome` when it differs from the current one.
    async fn report(&mut self, intent: &Intent, outcome: &Outcome) {
        let Some(object) = self.latest.object() else {
            return;
        };
        let facts =
            block_in_place(|| crate::facts::collect(&self.config.proc_root, &self.config.sys_root));
        let previous = object.status.as_ref();
        let mut status = report::status(&StatusInput {
            outcome,
            observed_revision: intent.revision(),
            drifted: self.reconciler.drifted(),
            facts: Some(facts),
            health: self.sampler.latest(),
            previous,
            generation: object.metadata.generation,
            now: report::now(),
        });
        status.userspace_stack = self.dataplane.status();
        status.preview = self.preview.clone();
        // The deadline as people read it: on the wall clock, however it was set.
        let (wall, now) = (self.clocks.wall_millis(), self.window_now());
        status.confirmation = self.window.as_ref().map(|(w, _)| Confirmation {
            revision: w.revision.clone(),
            deadline: report::time_of_millis(wall + w.deadline.saturating_sub(now)),
        });
        status.probes = self.probes.clone();
        if previous == Some(&status) {
            return;
        }
        match self.patch_status(status).await {
            Ok(updated) => {
                self.latest.offer(updated, Road::StatusWrite);
                self.spec_moved |= Intent::of(self.latest.object()) != *intent;
            }
            Err(e) => {
                tracing::warn!(error = %e, "writing status failed; retrying soon");
                self.retry_soon = true;
            }
        }
    }

    /// Server-side-applies the status subresource.
    async fn patch_status(&self, status: NodeTuningStatus) -> Result<NodeTuning> {
        let name = &self.config.node_name;
        let patch = serde_json::json!({
            "apiVersion": NodeTuning::api_version(&()),
            "kind": NodeTuning::kind(&()),
            "metadata": { "name": name },
            "status": serde_json::to_value(status)?,
        });
        let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
        let patch = Patch::Apply(&patch);
        let write = self.api.patch_status(name, &params, &patch);
        match tokio::time::timeout(STATUS_TIMEOUT, write).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(Error::Timeout("writing status")),
        }
    }
}

/// The address of the API server's host name (the first one it resolves to).
async fn resolve(host: &str, port: u16) -> Option<std::net::IpAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse() {
        return Some(ip);
    }
    let mut addrs = tokio::net::lookup_host((host, port)).await.ok()?;
    addrs.next().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};

    use clap::Parser;
    use hoststack_crds::{Mode, NodeConfig, NodeState, NodeTuningSpec, SysctlValue};
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use tower_test::mock::Handle;

    use super::*;

    const NODE: &str = "node-a";

    /// The agent's watch loop state on a host under `root` (procfs, sysfs, state dir, bpffs),
    /// its client talking to the returned mocked API server.
    fn agent(root: &Path) -> (Agent, Handle<Request<Body>, Response<Body>>) {
        let dir = |d: &str| {
            let path = root.join(d);
            std::fs::create_dir_all(&path).unwrap();
            path.to_str().unwrap().to_string()
        };
        let config = Config::try_parse_from([
            "hoststack-agent",
            "--node-name",
            NODE,
            "--proc-root",
            &dir("proc"),
            "--sys-root",
            &dir("sys"),
            "--state-dir",
            &dir("state"),
            "--bpffs-root",
            &dir("bpffs"),
            "--userstack-binary",
            "/nonexistent/hoststack-userstack",
        ])
        .expect("flags parse");
        let host =
            Host::new(&config.proc_root, &config.sys_root).with_bpffs_root(&config.bpffs_root);
        let reconciler = Reconciler::new(
            Transactor::new(host.clone(), JournalStore::new(&config.state_dir)),
            crate::hooks::Hooks::default(),
        );
        let dataplane = Supervisor::new(
            &config.userstack_binary(),
            &config.state_dir,
            Backoff::default(),
            host,
        );
        let metrics = Arc::new(Exporter::new(&config.proc_root));
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = Api::all(Client::new(service, "default"));
        (
            Agent::new(api, config, reconciler, metrics, dataplane),
            handle,
        )
    }

    /// The node config that sets `net.ipv4.tcp_sack` to 0.
    fn sack_off() -> NodeConfig {
        let mut c = NodeConfig::default();
        c.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
        c
    }

    /// The node's NodeTuning at resourceVersion `version` and spec generation `generation`,
    /// asking for `config` of tuning `edge` (`None`: the spec withdrawn).
    fn copy(version: u64, generation: i64, config: Option<&NodeConfig>) -> NodeTuning {
        let mut nt = NodeTuning::new(
            NODE,
            NodeTuningSpec {
                tuning: config.map(|_| "edge".into()),
                revision: config.map(NodeConfig::revision),
                config: config.cloned(),
                mode: Some(Mode::Apply),
                ..NodeTuningSpec::default()
            },
        );
        nt.metadata.uid = Some("uid-node-a".into());
        nt.metadata.resource_version = Some(version.to_string());
        nt.metadata.generation = Some(generation);
        nt
    }

    /// Answers the agent's status writes in turn, each with the next of `answers` carrying the
    /// status written; the states written.
    fn api_server(
        mut handle: Handle<Request<Body>, Response<Body>>,
        answers: Vec<NodeTuning>,
    ) -> tokio::task::JoinHandle<Vec<String>> {
        tokio::spawn(async move {
            let mut states = Vec::new();
            for mut answer in answers {
                let (request, send) = handle.next_request().await.expect("a status write");
                assert_eq!(
                    (request.method(), request.uri().path()),
                    (
                        &Method::PATCH,
                        "/apis/hoststack.dev/v1alpha1/nodetunings/node-a/status"
                    )
                );
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let status: NodeTuningStatus =
                    serde_json::from_value(body["status"].clone()).expect("a NodeTuningStatus");
                states.push(status.state.map(|s| s.to_string()).unwrap_or_default());
                answer.status = Some(status);
                let response = Response::builder()
                    .status(StatusCode::OK)
                    .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                    .unwrap();
                send.send_response(response);
            }
            states
        })
    }

    /// The value of the sample `series` in the agent's /metrics.
    fn sample(agent: &Agent, series: &str) -> Option<u64> {
        agent
            .metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_queued_older_event_never_brings_a_withdrawn_spec_back() {
        let root = tempfile::tempdir().expect("tempdir");
        let sack = root.path().join("proc/sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let (mut agent, handle) = agent(root.path());
        let config = sack_off();
        let revision = config.revision();
        // The operator withdraws the spec (version 12) while the transaction runs, so the write
        // of Applied returns version 13 with the spec withdrawn; the revert's write returns 14.
        let server = api_server(
            handle,
            vec![
                copy(11, 1, Some(&config)),
                copy(13, 2, None),
                copy(14, 2, None),
            ],
        );
        agent.on_event(Event::Init).await;
        agent
            .on_event(Event::InitApply(copy(10, 1, Some(&config))))
            .await;
        agent.on_event(Event::InitDone).await;
        // The answer to the Applied write asks for the revert: the agent acts on it at once.
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "1\n", "reverted");
        // A resync finds nothing to do.
        agent.reconcile().await;
        // The watch now delivers what was queued behind the writes: the copy of the first
        // status write still asks for the revision. It is older than the agent's: ignored.
        agent
            .on_event(Event::Apply(copy(11, 1, Some(&config))))
            .await;
        assert_eq!(
            std::fs::read_to_string(&sack).unwrap(),
            "1\n",
            "the withdrawn revision came back"
        );
        agent.on_event(Event::Apply(copy(12, 2, None))).await;
        let states = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("every status write made")
            .expect("the writes were as expected");
        assert_eq!(states, ["Applying", "Applied", "Reverted"]);
        let applied = format!(
            "hoststack_agent_revision_transactions_total{{tuning=\"edge\",revision=\"{revision}\",result=\"applied\"}}"
        );
        assert_eq!(sample(&agent, &applied), Some(1));
        assert_eq!(
            sample(
                &agent,
                "hoststack_agent_transactions_total{result=\"reverted\"}"
            ),
            Some(1)
        );
        assert_eq!(
            agent
                .latest
                .object()
                .map(|o| o.metadata.resource_version.clone()),
            Some(Some("14".into()))
        );
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_spec_withdrawn_under_the_applying_write_is_not_applied() {
        let root = tempfile::tempdir().expect("tempdir");
        let sack = root.path().join("proc/sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let (mut agent, handle) = agent(root.path());
        let config = sack_off();
        // The operator withdrew the spec (generation 2) before the agent wrote Applying: the
        // write's answer shows it withdrawn.
        let server = api_server(handle, vec![copy(12, 2, None), copy(13, 2, None)]);
        agent.on_event(Event::Init).await;
        agent
            .on_event(Event::InitApply(copy(10, 1, Some(&config))))
            .await;
        agent.on_event(Event::InitDone).await;
        assert_eq!(
            std::fs::read_to_string(&sack).unwrap(),
            "1\n",
            "the withdrawn revision was applied"
        );
        let states = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("every status write made")
            .expect("the writes were as expected");
        assert_eq!(states, ["Applying", "Reverted"]);
        assert_eq!(
            sample(
                &agent,
                "hoststack_agent_transactions_total{result=\"applied\"}"
            )
            .unwrap_or(0),
            0,
            "no transaction ran"
        );
    }

    /// Clocks a test sets by hand.
    #[derive(Default)]
    struct HandClocks {
        wall: AtomicU64,
        monotonic: AtomicU64,
    }

    impl Clocks for HandClocks {
        fn wall_millis(&self) -> u64 {
            self.wall.load(AtomicOrdering::SeqCst)
        }
        fn monotonic_millis(&self) -> u64 {
            self.monotonic.load(AtomicOrdering::SeqCst)
        }
    }

    impl HandClocks {
        /// Moves the wall clock by `wall` and the monotonic clock forward by `elapsed` ms.
        fn step(&self, wall: i64, elapsed: u64) {
            let now = self.wall_millis().checked_add_signed(wall).unwrap();
            self.wall.store(now, AtomicOrdering::SeqCst);
            self.monotonic.fetch_add(elapsed, AtomicOrdering::SeqCst);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_dead_man_window_ignores_steps_of_the_wall_clock() {
        const HOUR: i64 = 3_600_000;
        let root = tempfile::tempdir().expect("tempdir");
        let sack = root.path().join("proc/sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let (mut agent, handle) = agent(root.path());
        let clocks = Arc::new(HandClocks::default());
        clocks.step(1_800_000_000_000, 5_000);
        agent.clocks = clocks.clone();
        let config = sack_off();
        let server = api_server(
            handle,
            vec![copy(11, 1, Some(&config)), copy(12, 1, Some(&config))],
        );
        agent.on_event(Event::Init).await;
        agent
            .on_event(Event::InitApply(copy(10, 1, Some(&config))))
            .await;
        agent.on_event(Event::InitDone).await;
        let states = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("every status write made")
            .expect("the writes were as expected");
        assert_eq!(states, ["Applying", "Applied"]);
        // Applied provisionally: the window (60 s by default) waits for its settle time.
        assert!(
            matches!(agent.confirmation_now(), Some(Step::Wait(_))),
            "{:?}",
            agent.confirmation_now()
        );
        // NTP steps the wall clock an hour forward half a second later: the window still runs.
        clocks.step(HOUR, 500);
        assert!(
            !matches!(agent.confirmation_now(), Some(Step::Expire(_))),
            "a wall-clock step forward expired the window: {:?}",
            agent.confirmation_now()
        );
        // Stepped two hours back, and 61 s after the apply: the window has expired.
        clocks.step(-2 * HOUR, 61_000);
        assert!(
            matches!(agent.confirmation_now(), Some(Step::Expire(_))),
            "a wall-clock step back postponed the revert: {:?}",
            agent.confirmation_now()
        );
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "0\n");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_relist_is_taken_and_a_new_assignment_applies() {
        let root = tempfile::tempdir().expect("tempdir");
        let sack = root.path().join("proc/sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let (mut agent, handle) = agent(root.path());
        let config = sack_off();
        let server = api_server(
            handle,
            vec![copy(21, 3, Some(&config)), copy(22, 3, Some(&config))],
        );
        // Known: the spec withdrawn at version 14.
        agent.latest.offer(copy(14, 2, None), Road::StatusWrite);
        agent.listed = true;
        // The watch desynced; the relist finds the revision assigned again.
        agent.on_event(Event::Init).await;
        agent
            .on_event(Event::InitApply(copy(20, 3, Some(&config))))
            .await;
        agent.on_event(Event::InitDone).await;
        let states = tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("every status write made")
            .expect("the writes were as expected");
        assert_eq!(states, ["Applying", "Applied"]);
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "0\n");
        assert_eq!(
            agent
                .latest
                .object()
                .and_then(|o| o.status.as_ref())
                .and_then(|s| s.state),
            Some(NodeState::Applied)
        );
        // A relist that no longer finds the object: deleted, the host reverted (no status to
        // write to).
        agent.on_event(Event::Init).await;
        agent.on_event(Event::InitDone).await;
        assert!(agent.latest.object().is_none());
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "1\n");
    }
}
