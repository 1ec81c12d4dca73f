//! Test doubles for the controller: a [`World`] of cached objects, a [`Context`] whose client
//! talks to a mocked API server (tower-test), and the [`ApiServerVerifier`] that expects each
//! request a [`Scenario`] makes, checks it and answers it as the API server would. A reconcile
//! that sends a request the scenario does not expect fails (the mock is gone); one that sends
//! too few leaves the verifier waiting, and [`finish`] fails on its timeout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hoststack_crds::{
    agent_lease_name, LabelValue, NetworkTuning, NetworkTuningSpec, NetworkTuningStatus,
    NodeConfig, NodeSelector, NodeState, NodeTuning, NodeTuningSpec, NodeTuningStatus,
    RolloutPhase, AGENT_NODE_LABEL, CANARY_LABEL, DEFAULT_NAMESPACE, FINALIZER,
    HISTORY_REVISION_LABEL, HISTORY_TUNING_LABEL, OPERATOR_FIELD_MANAGER,
};
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::client::Body;
use kube::core::PartialObjectMetaExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde_json::{json, Value};
use tower_test::mock::{Handle, SendResponse};

use super::heartbeats::Heartbeats;
use super::snapshot::Snapshot;
use super::Context;
use crate::metrics::Metrics;
use crate::selection::NodeLabels;

/// The uid of every test tuning (the owner of its revision history).
pub const UID: &str = "uid-edge";

/// The resourceVersion the mocked API server answers a tuning's status write with.
pub const WRITTEN_VERSION: &str = "12";

/// A tuning named `name` selecting `pool=<pool>`, with the sysctl `net.ipv4.tcp_sack=<sack>`
/// as its config, generation 1, created at second 1.
pub fn tuning(name: &str, pool: &str, sack: &str) -> NetworkTuning {
    let mut t = NetworkTuning::new(
        name,
        NetworkTuningSpec {
            node_selector: NodeSelector {
                match_labels: [("pool".to_string(), LabelValue(pool.to_string()))].into(),
                ..NodeSelector::default()
            },
            config: config(sack),
            ..NetworkTuningSpec::default()
        },
    );
    t.metadata.uid = Some(UID.into());
    t.metadata.generation = Some(1);
    t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1).unwrap()));
    t
}

/// The node config that sets `net.ipv4.tcp_sack` to `sack`.
pub fn config(sack: &str) -> NodeConfig {
    serde_json::from_value(json!({"sysctls": {"net.ipv4.tcp_sack": sack}})).unwrap()
}

/// `tuning` with the operator's finalizer.
pub fn finalized(mut tuning: NetworkTuning) -> NetworkTuning {
    tuning.metadata.finalizers = Some(vec![FINALIZER.into()]);
    tuning
}

/// `tuning`, deleted at `at` (its finalizer keeps it).
pub fn deleted(mut tuning: NetworkTuning, at: Timestamp) -> NetworkTuning {
    tuning.metadata.deletion_timestamp = Some(Time(at));
    finalized(tuning)
}

/// A node in `pool`, with the agent label when `agent` and the canary label when `canary`.
pub fn node(
    name: &str,
    pool: &str,
    agent: bool,
    canary: bool,
) -> (String, BTreeMap<String, String>) {
    let mut labels = BTreeMap::from([("pool".to_string(), pool.to_string())]);
    if agent {
        labels.insert(AGENT_NODE_LABEL.into(), "true".into());
    }
    if canary {
        labels.insert(CANARY_LABEL.into(), "true".into());
    }
    (name.to_string(), labels)
}

/// `node`'s NodeTuning with `spec`, and a status when its agent reported `state` about
/// `revision` (applied when the state is Applied, failed with `message` when Failed).
pub fn node_tuning(
    node: &str,
    spec: NodeTuningSpec,
    report: Option<(NodeState, &str, &str)>,
) -> NodeTuning {
    let mut nt = NodeTuning::new(node, spec);
    nt.status = report.map(|(state, tuning, revision)| NodeTuningStatus {
        state: Some(state),
        observed_revision: Some(revision.into()),
        applied_revision: (state == NodeState::Applied).then(|| revision.into()),
        applied_tuning: (state == NodeState::Applied).then(|| tuning.into()),
        message: (state == NodeState::Failed).then(|| "net.ipv4.tcp_sack: refused".into()),
        ..NodeTuningStatus::default()
    });
    nt
}

/// The spec the operator gives a node of `tuning` on `revision` (`sack` its config) in `phase`.
pub fn spec_on(
    tuning: &str,
    revision: Option<(&str, &str)>,
    phase: RolloutPhase,
) -> NodeTuningSpec {
    NodeTuningSpec {
        tuning: Some(tuning.into()),
        governed_by: Some(tuning.into()),
        revision: revision.map(|(r, _)| r.into()),
        config: revision.map(|(_, sack)| config(sack)),
        mode: Some(hoststack_crds::Mode::Apply),
        rollout_phase: Some(phase),
        ..NodeTuningSpec::default()
    }
}

/// The heartbeat Lease of `node`'s agent, renewed now and valid for an hour.
pub fn heartbeat(node: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(agent_lease_name(node)),
            namespace: Some(DEFAULT_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_duration_seconds: Some(3600),
            ..LeaseSpec::default()
        }),
    }
}

/// The recorded revision `revision` of the test tuning `tuning` (`sack` its config), number
/// `sequence`.
pub fn recorded(tuning: &str, revision: &str, sack: &str, sequence: i64) -> ControllerRevision {
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{tuning}-{revision}")),
            namespace: Some(DEFAULT_NAMESPACE.into()),
            labels: Some(BTreeMap::from([
                (HISTORY_TUNING_LABEL.to_string(), tuning.to_string()),
                (HISTORY_REVISION_LABEL.to_string(), revision.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "hoststack.dev/v1alpha1".into(),
                kind: "NetworkTuning".into(),
                name: tuning.into(),
                uid: UID.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        data: RawExtension(serde_json::to_value(config(sack)).unwrap()),
        revision: Some(sequence),
    }
}

/// What the controller's caches hold.
#[derive(Default)]
pub struct World {
    /// Every NetworkTuning.
    pub tunings: Vec<NetworkTuning>,
    /// Every node: name and labels.
    pub nodes: Vec<(String, BTreeMap<String, String>)>,
    /// Every NodeTuning.
    pub node_tunings: Vec<NodeTuning>,
    /// The agents' heartbeat Leases.
    pub heartbeats: Vec<Lease>,
}

impl World {
    /// The snapshot of this world at `now`.
    pub fn snapshot_at(self, now: Timestamp) -> Snapshot {
        Snapshot::new(
            self.tunings.into_iter().map(Arc::new).collect(),
            self.nodes
                .into_iter()
                .map(|(name, labels)| NodeLabels {
                    uid: node_uid(&name),
                    name,
                    labels,
                })
                .collect(),
            self.node_tunings,
            Heartbeats::default().alive(&self.heartbeats, Instant::now()),
            now,
        )
    }
}

/// The uid of node `name`'s Node object in these fixtures.
pub fn node_uid(name: &str) -> String {
    format!("uid-{name}")
}

/// A store holding `objects`, ready.
fn store<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

impl Context {
    /// A context whose caches hold `world` and whose client talks to the returned verifier.
    pub fn test(world: World) -> (Arc<Context>, ApiServerVerifier) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let reporter = Reporter {
            controller: OPERATOR_FIELD_MANAGER.into(),
            instance: None,
        };
        let nodes = world
            .nodes
            .into_iter()
            .map(|(name, labels)| {
                ObjectMeta {
                    uid: Some(node_uid(&name)),
                    name: Some(name),
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }
                .into_response_partial::<Node>()
            })
            .collect();
        let ctx = Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            nodes: store(nodes),
            node_tunings: store(world.node_tunings),
            tunings: store(world.tunings),
            heartbeats: store(world.heartbeats),
            renewals: Default::default(),
            revert_timeout: Duration::from_secs(120),
            metrics: Arc::new(Metrics::default()),
            prometheus_endpoints: Default::default(),
            namespace: DEFAULT_NAMESPACE.into(),
            status_writes: Default::default(),
            spec_writes: Default::default(),
        };
        (Arc::new(ctx), ApiServerVerifier(handle))
    }
}

/// The API server's side of the mocked client.
pub struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

/// One reconcile branch: the requests it makes, in order.
pub enum Scenario {
    /// A tuning without the finalizer gets it, and nothing else happens.
    FinalizerAdded,
    /// An unusable rollout section: the status says Degraded (InvalidRollout) and an event
    /// says why; no history, no node.
    InvalidRollout,
    /// A new tuning whose agents have not reported: its revision is recorded, its status says
    /// Progressing, each selected node gets a spec without a revision and the agent label.
    SpecsWritten {
        /// The tuning's revision.
        revision: String,
        /// The selected nodes.
        nodes: Vec<&'static str>,
    },
    /// Every agent reported: the canary gets the revision and a WaveStarted event is recorded.
    CanaryStarted {
        /// The tuning's revision.
        revision: String,
        /// The canary node.
        canary: &'static str,
    },
    /// The tuning matches a node a higher-priority tuning governs: its status names the winner
    /// and a Conflict event is recorded.
    Conflict {
        /// The losing tuning's revision.
        revision: String,
        /// The node.
        node: &'static str,
        /// The tuning that governs it.
        winner: &'static str,
    },
    /// The canary failed the revision: it goes back to the stable revision, whose config comes
    /// from the history, and a RolledBack event is recorded.
    RolledBack {
        /// The stable revision (and its config).
        stable: (String, &'static str),
        /// The failed revision.
        failed: String,
        /// The canary; the other node, on the stable revision all along and labelled `stable`,
        /// is not written.
        canary: &'static str,
    },
    /// A rolled-back tuning whose nodes are all back on the stable revision: the history is
    /// read and the status (still RolledBack, the nodes' counts updated) written; no node's
    /// spec changes and no event is recorded.
    StaysRolledBack {
        /// The stable revision (and its config).
        stable: (String, &'static str),
        /// The failed revision.
        failed: String,
    },
    /// A deleted tuning whose nodes all reverted: the agent label goes, the history is
    /// deleted, a Reverted event is recorded and the finalizer is removed.
    FinalizerRemoved {
        /// The node whose agent label goes.
        node: &'static str,
        /// The recorded revision deleted.
        revision: String,
    },
    /// A deleted tuning whose node still runs it: the status says Reverting and its spec is
    /// withdrawn; the finalizer stays.
    WaitingForRevert {
        /// The node.
        node: &'static str,
    },
}

/// Waits for the verifier to have answered every request of its scenario.
pub async fn finish(verifier: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(Duration::from_secs(1), verifier)
        .await
        .expect("the reconcile made every request of the scenario")
        .expect("the scenario's checks held");
}

const TUNINGS: &str = "/apis/hoststack.dev/v1alpha1/networktunings";
const NODE_TUNINGS: &str = "/apis/hoststack.dev/v1alpha1/nodetunings";
const NODES: &str = "/api/v1/nodes";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

/// Where the revision history lives.
fn revisions() -> String {
    format!("/apis/apps/v1/namespaces/{DEFAULT_NAMESPACE}/controllerrevisions")
}

impl ApiServerVerifier {
    /// Answers the scenario's requests in order; await the handle with [`finish`].
    pub fn run(self, scenario: Scenario) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            match scenario {
                Scenario::FinalizerAdded => {
                    self.finalizer_added("edge").await;
                }
                Scenario::InvalidRollout => {
                    self.status("edge", |s| {
                        let degraded = condition(s, "Degraded");
                        assert_eq!(degraded["reason"], "InvalidRollout", "{s}");
                        assert!(
                            degraded["message"]
                                .as_str()
                                .unwrap()
                                .starts_with("rollout.canary: "),
                            "{s}"
                        );
                    })
                    .await
                    .event("InvalidRollout")
                    .await;
                }
                Scenario::SpecsWritten { revision, nodes } => {
                    let mut v = self
                        .history("edge", vec![])
                        .await
                        .history_recorded("edge", &revision)
                        .await
                        .status("edge", |s| {
                            assert_eq!(s["phase"], "Progressing", "{s}");
                            assert_eq!(s["currentRevision"], revision.as_str());
                            assert!(s.get("waves").is_none(), "{s}");
                        })
                        .await;
                    for node in &nodes {
                        v = v
                            .spec(node, |spec| {
                                assert_eq!(spec["tuning"], "edge");
                                assert_eq!(spec["revision"], Value::Null, "{spec}");
                                assert_eq!(spec["rolloutPhase"], "stable");
                            })
                            .await;
                    }
                    // In the caches' order, which is not the nodes' names'.
                    let mut labelled = Vec::new();
                    for _ in &nodes {
                        let (node, next) = v.agent_label_any(true).await;
                        labelled.push(node);
                        v = next;
                    }
                    labelled.sort();
                    assert_eq!(labelled, nodes);
                }
                Scenario::CanaryStarted { revision, canary } => {
                    self.history("edge", vec![recorded("edge", &revision, "1", 1)])
                        .await
                        .status("edge", |s| {
                            assert_eq!(s["phase"], "Progressing", "{s}");
                            assert_eq!(s["waves"][0]["nodes"], json!([canary]), "{s}");
                        })
                        .await
                        .spec(canary, |spec| {
                            assert_eq!(spec["revision"], revision.as_str(), "{spec}");
                            assert_eq!(spec["rolloutPhase"], "canary");
                            assert_eq!(
                                spec["config"],
                                json!({"sysctls": {"net.ipv4.tcp_sack": "1"}})
                            );
                        })
                        .await
                        .event("WaveStarted")
                        .await;
                }
                Scenario::Conflict {
                    revision,
                    node,
                    winner,
                } => {
                    self.history("low", vec![])
                        .await
                        .history_recorded("low", &revision)
                        .await
                        .status("low", |s| {
                            assert_eq!(
                                s["conflicts"],
                                json!([{"node": node, "governedBy": winner}]),
                                "{s}"
                            );
                            let conflict = condition(s, "Conflict");
                            assert_eq!(conflict["status"], "True");
                            assert!(
                                conflict["message"]
                                    .as_str()
                                    .unwrap()
                                    .contains(&format!("{node} governed by {winner}")),
                                "{s}"
                            );
                        })
                        .await
                        .event("Conflict")
                        .await;
                }
                Scenario::RolledBack {
                    stable,
                    failed,
                    canary,
                } => {
                    let (stable, sack) = stable;
                    self.history(
                        "edge",
                        vec![
                            recorded("edge", &stable, sack, 1),
                            recorded("edge", &failed, "1", 2),
                        ],
                    )
                    .await
                    .status("edge", |s| {
                        assert_eq!(s["phase"], "RolledBack", "{s}");
                        assert_eq!(s["stableRevision"], stable.as_str());
                        assert_eq!(condition(s, "Degraded")["reason"], "RolledBack", "{s}");
                    })
                    .await
                    .spec(canary, |spec| {
                        assert_eq!(spec["revision"], stable.as_str(), "{spec}");
                        assert_eq!(
                            spec["config"],
                            json!({"sysctls": {"net.ipv4.tcp_sack": sack}})
                        );
                        assert_eq!(spec["rolloutPhase"], "stable");
                    })
                    .await
                    .event("RolledBack")
                    .await;
                }
                Scenario::StaysRolledBack { stable, failed } => {
                    let (stable, sack) = stable;
                    self.history(
                        "edge",
                        vec![
                            recorded("edge", &stable, sack, 1),
                            recorded("edge", &failed, "1", 2),
                        ],
                    )
                    .await
                    .status("edge", |s| {
                        assert_eq!(s["phase"], "RolledBack", "{s}");
                        assert_eq!(s["currentRevision"], failed.as_str(), "{s}");
                        assert_eq!(s["waves"][0]["result"], "RolledBack", "{s}");
                    })
                    .await;
                }
                Scenario::FinalizerRemoved { node, revision } => {
                    self.agent_label(node, false)
                        .await
                        .history("edge", vec![recorded("edge", &revision, "1", 1)])
                        .await
                        .history_deleted(&format!("edge-{revision}"))
                        .await
                        .event("Reverted")
                        .await
                        .finalizer_removed("edge")
                        .await;
                }
                Scenario::WaitingForRevert { node } => {
                    self.status("edge", |s| {
                        let progressing = condition(s, "Progressing");
                        assert_eq!(progressing["reason"], "Reverting", "{s}");
                        assert_eq!(
                            progressing["message"],
                            format!("deleted; waiting for {node} to revert")
                        );
                    })
                    .await
                    .spec(node, |spec| {
                        assert_eq!(spec, &json!({"mode": "Apply"}), "{spec}");
                    })
                    .await;
                }
            }
        })
    }

    /// The next request, which must be `method` on `path`: its query and its body (`null` when
    /// empty), and where to send the answer.
    async fn expect(
        &mut self,
        method: Method,
        path: &str,
    ) -> (String, Value, SendResponse<Response<Body>>) {
        let (request, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("no request, expected {method} {path}"));
        assert_eq!(
            (request.method(), request.uri().path()),
            (&method, path),
            "{}",
            request.uri()
        );
        let query = request.uri().query().unwrap_or_default().to_string();
        (query, body(request).await, send)
    }

    /// The next request, a server-side apply by the operator on `path`: its body.
    async fn expect_apply(&mut self, path: &str) -> (Value, SendResponse<Response<Body>>) {
        let (request, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("no request, expected an apply of {path}"));
        assert_eq!(request.uri().path(), path, "{}", request.uri());
        self.answered_apply(request, send, path).await
    }

    /// `request`, which must be a server-side apply by the operator: its body.
    async fn answered_apply(
        &self,
        request: Request<Body>,
        send: SendResponse<Response<Body>>,
        path: &str,
    ) -> (Value, SendResponse<Response<Body>>) {
        assert_eq!(request.method(), Method::PATCH, "{path}");
        let query = request.uri().query().unwrap_or_default().to_string();
        assert!(
            query.contains(&format!("fieldManager={OPERATOR_FIELD_MANAGER}"))
                && query.contains("force=true"),
            "{path}?{query}"
        );
        (body(request).await, send)
    }

    /// A JSON patch adding the finalizer to `tuning`.
    async fn finalizer_added(mut self, tuning: &str) -> Self {
        let (_, patch, send) = self
            .expect(Method::PATCH, &format!("{TUNINGS}/{tuning}"))
            .await;
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]},
            ])
        );
        answer(send, &finalized(self::tuning(tuning, "edge", "1")));
        self
    }

    /// A JSON patch removing the finalizer from `tuning`.
    async fn finalizer_removed(mut self, tuning: &str) -> Self {
        let (_, patch, send) = self
            .expect(Method::PATCH, &format!("{TUNINGS}/{tuning}"))
            .await;
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/finalizers/0", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/0"},
            ])
        );
        answer(send, &self::tuning(tuning, "edge", "1"));
        self
    }

    /// The status of `tuning`, applied whole; `check` looks at it.
    async fn status(mut self, tuning: &str, check: impl FnOnce(&Value)) -> Self {
        let (body, send) = self
            .expect_apply(&format!("{TUNINGS}/{tuning}/status"))
            .await;
        check(&body["status"]);
        let mut answered = self::tuning(tuning, "edge", "1");
        answered.metadata.resource_version = Some(WRITTEN_VERSION.into());
        answered.status = Some(
            serde_json::from_value::<NetworkTuningStatus>(body["status"].clone())
                .expect("a NetworkTuningStatus"),
        );
        answer(send, &answered);
        self
    }

    /// The spec of `node`'s NodeTuning, applied whole; `check` looks at it.
    async fn spec(mut self, node: &str, check: impl FnOnce(&Value)) -> Self {
        let (body, send) = self.expect_apply(&format!("{NODE_TUNINGS}/{node}")).await;
        assert_eq!(
            body["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid(node)}]),
            "owned by its Node"
        );
        check(&body["spec"]);
        let spec: NodeTuningSpec =
            serde_json::from_value(body["spec"].clone()).expect("a NodeTuningSpec");
        answer(send, &NodeTuning::new(node, spec));
        self
    }

    /// The agent label of `node` set (`wanted`) or removed.
    async fn agent_label(self, node: &str, wanted: bool) -> Self {
        let (labelled, verifier) = self.agent_label_any(wanted).await;
        assert_eq!(labelled, node);
        verifier
    }

    /// The agent label of some node set (`wanted`) or removed: which node.
    async fn agent_label_any(mut self, wanted: bool) -> (String, Self) {
        let (request, send) = self
            .0
            .next_request()
            .await
            .expect("no request, expected a node's agent label");
        let path = request.uri().path().to_string();
        let node = path
            .strip_prefix(&format!("{NODES}/"))
            .unwrap_or_else(|| panic!("{path} is not a node"))
            .to_string();
        let (body, send) = self.answered_apply(request, send, &path).await;
        let labels = if wanted {
            json!({AGENT_NODE_LABEL: "true"})
        } else {
            json!({})
        };
        assert_eq!(body["metadata"]["labels"], labels, "{body}");
        answer(
            send,
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        );
        (node, self)
    }

    /// The list of `tuning`'s recorded revisions, answered with `items`.
    async fn history(mut self, tuning: &str, items: Vec<ControllerRevision>) -> Self {
        let (query, _, send) = self.expect(Method::GET, &revisions()).await;
        assert!(
            query.contains(&format!("labelSelector=hoststack.dev%2Ftuning%3D{tuning}")),
            "{query}"
        );
        answer(
            send,
            &json!({
                "apiVersion": "apps/v1",
                "kind": "ControllerRevisionList",
                "metadata": {},
                "items": items,
            }),
        );
        self
    }

    /// A new recorded revision `revision` of `tuning`, owned by it.
    async fn history_recorded(mut self, tuning: &str, revision: &str) -> Self {
        let (_, body, send) = self.expect(Method::POST, &revisions()).await;
        assert_eq!(body["metadata"]["name"], format!("{tuning}-{revision}"));
        assert_eq!(body["metadata"]["labels"][HISTORY_REVISION_LABEL], revision);
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
        answer(send, &body);
        self
    }

    /// The deletion of the recorded revision `object`.
    async fn history_deleted(mut self, object: &str) -> Self {
        let (_, _, send) = self
            .expect(Method::DELETE, &format!("{}/{object}", revisions()))
            .await;
        answer(
            send,
            &json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"}),
        );
        self
    }

    /// A new event about the tuning, of `reason`.
    async fn event(mut self, reason: &str) -> Self {
        let (_, body, send) = self.expect(Method::POST, EVENTS).await;
        assert_eq!(body["reason"], reason, "{body}");
        answer(send, &body);
        self
    }
}

/// A request's body as JSON (`null` when empty).
async fn body(request: Request<Body>) -> Value {
    let bytes = request.into_body().collect_bytes().await.unwrap();
    if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("a JSON body")
    }
}

/// Answers a request with `object` as JSON, 200 OK.
fn answer(send: SendResponse<Response<Body>>, object: &impl serde::Serialize) {
    let response = Response::builder()
        .status(StatusCode::OK)
        .body(Body::from(serde_json::to_vec(object).unwrap()))
        .unwrap();
    send.send_response(response);
}

/// The condition of `type_` in a status, as JSON.
fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}
