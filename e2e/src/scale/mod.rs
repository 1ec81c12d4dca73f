//! The scale run (`hoststack-lab scale`, docs/operator.md "Scale"): a control plane with the
//! flags a large cluster has, the operator, N Node objects without kubelets and a fleet of N
//! real agents in one process (`hoststack-fleet`, each on a host tree of its own), through the
//! scenarios of one tuning's life, each measured ([`measure`]):
//!
//! - **a** `apply`: a tuning selecting every node, all of them in one wave (canary 100%);
//! - **idle**: nothing changes for a while; the agents' writes per node per minute;
//! - **b** `rollout`: a new revision with a 1% canary, built-in health analysis and waves of
//!   10%, no pauses; **e**, during it: `churn` nodes join (a second fleet and their Node
//!   objects) and `churn` leave (their fleet stopped, their Node objects deleted) once the
//!   canary passed. Checked: every node there at the end applied it, and the audit log's
//!   history never had more nodes in flight than maxUnavailable;
//! - **c** `regression`: a third revision whose canaries retransmit 5% (their fleet hosts'
//!   counters): the rollout rolls back, every node on the second revision again;
//! - **d** `delete`: the tuning deleted; every node reverted and the finalizer gone.
//!
//! Correctness is asserted (every node applied, reverted, maxUnavailable respected); the
//! timings and counts go into the report, never into an assertion.

pub mod measure;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::faults::history::Event;
use crate::faults::invariants;
use crate::faults::record;
use crate::{Lab, LabConfig};
use measure::Reading;

/// The sysctl every revision sets (a fleet host has it: hoststack_fleet::host::SYSCTLS).
const KEY: &str = "net/core/somaxconn";
/// Its value on a fresh fleet host.
const BASELINE: &str = "4096";
/// The tuning's name.
const TUNING: &str = "fleet";
/// How long nothing but heartbeats must be written before a scenario's counts end.
const QUIET: Duration = Duration::from_secs(5);
/// How often a wait polls.
const POLL: Duration = Duration::from_secs(1);

/// What a scale run does.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// Nodes in the fleet at the start.
    pub nodes: usize,
    /// Nodes joining and leaving during the rollout (scenario e).
    pub churn: usize,
    /// Agents per HTTP/2 connection.
    pub agents_per_connection: usize,
    /// The agents' heartbeat interval.
    pub heartbeat_interval: Duration,
    /// How long the idle measurement lasts.
    pub idle: Duration,
    /// How long one scenario may take before the run fails.
    pub step_timeout: Duration,
    /// The tunings' probe timeout and confirm timeout (`probes.timeout`,
    /// `probes.confirmTimeout`); `None`, the defaults (5 s and 60 s).
    pub probe_timeouts: Option<(Duration, Duration)>,
}

impl ScaleConfig {
    /// The defaults for `nodes` nodes: 100 joining and leaving (10% of a smaller fleet), 200
    /// agents per connection, heartbeats every 10 s, a minute idle, and a step timeout that
    /// grows with the fleet.
    pub fn for_nodes(nodes: usize) -> ScaleConfig {
        ScaleConfig {
            nodes,
            churn: (nodes / 10).clamp(1, 100),
            agents_per_connection: 200,
            heartbeat_interval: Duration::from_secs(10),
            idle: Duration::from_secs(60),
            step_timeout: Duration::from_secs(300 + nodes as u64 / 2),
            probe_timeouts: None,
        }
    }

    /// The API server's flags for a cluster of this size: twice the default inflight limits,
    /// and room for the fleet's streams on each HTTP/2 connection.
    pub fn apiserver_flags(&self) -> Vec<String> {
        vec![
            "--max-requests-inflight=800".into(),
            "--max-mutating-requests-inflight=400".into(),
            "--http2-max-streams-per-connection=1000".into(),
        ]
    }
}

/// The node of number `i`.
fn node(i: usize) -> String {
    format!("fleet-{i:05}")
}

/// Runs every scenario on a fresh lab and returns the report (JSON); panics when a scenario
/// goes wrong (a node not applied or not reverted, maxUnavailable exceeded) or takes longer
/// than the step timeout.
pub fn run(config: &ScaleConfig) -> crate::Result<Value> {
    let mut lab_config = LabConfig::with_nodes(0);
    lab_config.start_agents = false;
    lab_config.apiserver_args = config.apiserver_flags();
    let lab = Lab::start(lab_config)?;
    let report = Run::new(&lab, config).all();
    lab.stop()?;
    Ok(report)
}

/// One scale run on a lab.
struct Run<'lab> {
    lab: &'lab Lab,
    config: &'lab ScaleConfig,
    /// Where the fleets' host trees are.
    root: PathBuf,
    /// The nodes there now.
    nodes: Vec<String>,
    /// How far the audit log has been read.
    audit_offset: u64,
}

impl<'lab> Run<'lab> {
    fn new(lab: &'lab Lab, config: &'lab ScaleConfig) -> Self {
        Run {
            lab,
            config,
            root: lab.dir().join("fleet"),
            nodes: Vec::new(),
            audit_offset: 0,
        }
    }

    fn all(mut self) -> Value {
        let n = self.config.nodes;
        let churn = self.config.churn.min(n.saturating_sub(1));
        // The canaries: 1% of the pool, labelled so that the rollout takes them first.
        let canaries: Vec<String> = (0..n.div_ceil(100)).map(node).collect();
        self.create_nodes(0..n, &canaries);
        self.start_fleet("fleet", 0, n - churn);
        self.start_fleet("fleet-leaving", n - churn, churn);
        self.nodes = (0..n).map(node).collect();
        self.wait_heartbeats();
        let mut scenarios = serde_json::Map::new();

        // a. Everything at once.
        let reading = self.reading();
        self.apply(&self.tuning("8192", "canary: \"100%\""));
        self.wait_phase("Complete", &self.nodes.clone());
        self.check_hosts(&self.nodes.clone(), "8192");
        scenarios.insert("a_apply".into(), self.since(reading, n, 1));

        // Idle: only heartbeats and nothing else.
        let reading = self.reading();
        std::thread::sleep(self.config.idle);
        scenarios.insert("idle".into(), self.since(reading, n, 1));

        // b (+ e). A judged rollout; nodes join and leave once the canary has passed.
        let reading = self.reading();
        let since = micros_now();
        let stable = self.lab.tuning_status(TUNING)["stableRevision"]
            .as_str()
            .map(String::from);
        let rollout = "canary: \"1%\"\n    maxUnavailable: \"10%\"\n    analysis:\n      window: 5s\n      thresholds:\n        - metric: RetransmitRatio\n          maxRelativeToBaseline: \"2\"";
        self.apply(&self.tuning("16384", rollout));
        self.wait_for("the canary to pass", self.config.step_timeout, || {
            let s = self.lab.tuning_status(TUNING);
            fail_if_ended(&s, "Complete");
            (s["waves"].as_array().map_or(0, Vec::len) >= 2).then_some(())
        });
        let joining: Vec<String> = (n..n + churn).map(node).collect();
        let leaving: Vec<String> = (n - churn..n).map(node).collect();
        self.create_nodes(n..n + churn, &[]);
        self.start_fleet("fleet-joining", n, churn);
        self.lab.stop_helper("fleet-leaving");
        self.delete_nodes(&leaving);
        self.nodes.retain(|name| !leaving.contains(name));
        self.nodes.extend(joining);
        self.wait_phase("Complete", &self.nodes.clone());
        self.check_hosts(&self.nodes.clone(), "16384");
        // 10% of the matched nodes: while the joining nodes are there and the leaving ones not
        // yet deleted, n + churn of them.
        let max_unavailable = (n + churn).div_ceil(10);
        self.check_max_unavailable(since, stable, max_unavailable, &leaving);
        scenarios.insert("b_rollout_with_churn".into(), self.since(reading, n, 1));

        // c. The canaries regress: the rollout rolls back.
        let reading = self.reading();
        write_regressed(&self.root, &canaries);
        self.apply(&self.tuning("32768", rollout));
        self.wait_phase("RolledBack", &[]);
        self.wait_for(
            "every node back on the second revision",
            self.config.step_timeout,
            || self.hosts_at(&self.nodes, "16384").then_some(()),
        );
        write_regressed(&self.root, &[]);
        scenarios.insert(
            "c_regression".into(),
            self.since(reading, self.nodes.len(), 1),
        );

        // d. Delete: every node reverted, the finalizer gone.
        let reading = self.reading();
        self.lab
            .kubectl(&["delete", "networktuning", TUNING, "--wait=false"]);
        self.wait_for("the tuning to be gone", self.config.step_timeout, || {
            let out = self.lab.kubectl(&["get", "networktuning", TUNING]);
            (!out.status.success()).then_some(())
        });
        self.wait_for("every node reverted", self.config.step_timeout, || {
            self.hosts_at(&self.nodes, BASELINE).then_some(())
        });
        scenarios.insert("d_delete".into(), self.since(reading, self.nodes.len(), 1));

        self.lab.stop_helper("fleet-joining");
        self.lab.stop_helper("fleet");
        json!({
            "nodes": n,
            "churn": churn,
            "agentsPerConnection": self.config.agents_per_connection,
            "heartbeatIntervalSeconds": self.config.heartbeat_interval.as_secs_f64(),
            "apiserverFlags": self.config.apiserver_flags(),
            "scenarios": scenarios,
            "etcdDbBytes": measure::etcd_db_bytes(self.lab),
            "auditLogBytes": std::fs::metadata(self.lab.audit_log_path()).map(|m| m.len()).ok(),
        })
    }

    /// Node objects `range` (no kubelet: the fleet's agents are the nodes), `canaries` among
    /// them labelled hoststack.dev/canary=true; created 500 to a `kubectl create`.
    fn create_nodes(&self, range: std::ops::Range<usize>, canaries: &[String]) {
        let names: Vec<String> = range.map(node).collect();
        for chunk in names.chunks(500) {
            let items: Vec<Value> = chunk
                .iter()
                .map(|name| {
                    let mut labels = json!({"pool": "fleet"});
                    if canaries.contains(name) {
                        labels["hoststack.dev/canary"] = json!("true");
                    }
                    json!({"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": name, "labels": labels}})
                })
                .collect();
            let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
            let out = self.lab.kubectl_with(
                self.lab.kubeconfig(),
                &["create", "-f", "-", "-o", "name"],
                Some(&list.to_string()),
            );
            assert!(
                out.status.success(),
                "creating nodes: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Deletes the Node objects `names`.
    fn delete_nodes(&self, names: &[String]) {
        for chunk in names.chunks(500) {
            let mut args = vec!["delete", "node", "--wait=false"];
            args.extend(chunk.iter().map(String::as_str));
            let out = self.lab.kubectl(&args);
            assert!(
                out.status.success(),
                "deleting nodes: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Starts the fleet helper `name` with the agents of nodes `first..first+count`. It runs
    /// as the lab admin: a real agent's token is bound to its node, and the write guard lets it
    /// write that node's status only (docs/security.md); minting thousands of bound tokens is
    /// not part of a scale run.
    fn start_fleet(&self, name: &str, first: usize, count: usize) {
        let kubeconfig = format!("KUBECONFIG={}", self.lab.kubeconfig().display());
        let root = self.root.display().to_string();
        let (first, count) = (first.to_string(), count.to_string());
        let per_connection = self.config.agents_per_connection.to_string();
        let heartbeat = format!("{}ms", self.config.heartbeat_interval.as_millis());
        let fleet = self.lab.fleet_binary().display().to_string();
        let argv = [
            "env",
            &kubeconfig,
            &fleet,
            "--root",
            &root,
            "--first",
            &first,
            "--count",
            &count,
            "--agents-per-connection",
            &per_connection,
            "--heartbeat-interval",
            &heartbeat,
        ];
        self.lab
            .spawn_helper(name, &argv)
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    }

    /// Waits until every node's heartbeat Lease exists.
    fn wait_heartbeats(&self) {
        let want = self.nodes.len();
        self.wait_for("every agent's heartbeat", self.config.step_timeout, || {
            let out = self
                .lab
                .kubectl(&["get", "leases", "-n", crate::NAMESPACE, "-o", "name"]);
            let count = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("hoststack-agent-fleet-"))
                .count();
            (count >= want).then_some(())
        });
    }

    /// The scale run's tuning: `value` for the sysctl, `rollout` as the rollout's settings,
    /// and the configured probe timeouts.
    fn tuning(&self, value: &str, rollout: &str) -> String {
        let probes = self
            .config
            .probe_timeouts
            .map_or(String::new(), |(timeout, confirm)| {
                format!(
                    "  probes:\n    timeout: {}s\n    confirmTimeout: {}s\n",
                    timeout.as_secs(),
                    confirm.as_secs()
                )
            });
        format!(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {TUNING}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: fleet\n  sysctls:\n    net.core.somaxconn: \"{value}\"\n{probes}  rollout:\n    {rollout}\n"
        )
    }

    /// `kubectl apply` of `yaml`.
    fn apply(&self, yaml: &str) {
        self.lab
            .apply_yaml(yaml)
            .unwrap_or_else(|e| panic!("applying the tuning: {e}"));
    }

    /// Waits until the tuning's phase is `phase` with every node of `applied` counted applied.
    fn wait_phase(&self, phase: &str, applied: &[String]) {
        let what = format!("phase {phase} with {} nodes applied", applied.len());
        self.wait_for(&what, self.config.step_timeout, || {
            let s = self.lab.tuning_status(TUNING);
            fail_if_ended(&s, phase);
            let done =
                s["phase"] == phase && s["appliedNodes"].as_u64() >= Some(applied.len() as u64);
            done.then_some(())
        });
    }

    /// Whether the hosts of `nodes` all hold `value`.
    fn hosts_at(&self, nodes: &[String], value: &str) -> bool {
        nodes.iter().all(|n| host_value(&self.root, n) == value)
    }

    /// Asserts that every host of `nodes` holds `value`.
    fn check_hosts(&self, nodes: &[String], value: &str) {
        let wrong: Vec<(&String, String)> = nodes
            .iter()
            .map(|n| (n, host_value(&self.root, n)))
            .filter(|(_, v)| v != value)
            .collect();
        assert!(wrong.is_empty(), "hosts not at {value}: {wrong:?}");
    }

    /// Asserts that the audit log's history since `since`, when `stable` was the stable
    /// revision, never had more than `max_unavailable` nodes in flight. The nodes that `left`
    /// are left out: a node deleted while in flight never reports, and is not in flight for the
    /// operator any more.
    fn check_max_unavailable(
        &self,
        since: u64,
        stable: Option<String>,
        max_unavailable: usize,
        left: &[String],
    ) {
        // From where the last scenario's counts ended: the whole log is large at scale.
        let (events, _) = measure::audit_events_since(self.lab, self.audit_offset);
        let start = record::Timed {
            micros: since,
            event: Event::Rollout {
                stable,
                max_unavailable,
            },
        };
        let of_present = record::from_audit(&events, since, max_unavailable)
            .into_iter()
            .filter(|t| match &t.event {
                Event::Assigned { node, .. } | Event::Reported { node, .. } => !left.contains(node),
                _ => true,
            })
            .collect();
        let history = record::merge(vec![vec![start], of_present], since);
        let broken: Vec<_> = invariants::check(&history)
            .into_iter()
            .filter(|v| v.invariant == 2)
            .collect();
        assert!(broken.is_empty(), "maxUnavailable exceeded: {broken:?}");
    }

    /// [`Lab::wait_for`], polling every [`POLL`]: at scale a poll lists thousands of objects or
    /// reads thousands of host files, and four a second load the API server it measures.
    fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(done) = check() {
                return done;
            }
            if std::time::Instant::now() >= deadline {
                return self.lab.wait_for(what, Duration::ZERO, check);
            }
            std::thread::sleep(POLL);
        }
    }

    fn reading(&self) -> Reading {
        Reading::take(self.lab, self.audit_offset)
    }

    /// The measurement since `reading`, for `nodes` nodes and `revisions` revisions: the
    /// scenario's time is until now, its counts until the writes it set off have ended.
    fn since(&mut self, reading: Reading, nodes: usize, revisions: usize) -> Value {
        let done = std::time::Instant::now();
        measure::wait_quiet(self.lab, QUIET, self.config.step_timeout);
        let (report, offset) = reading.since(self.lab, nodes, revisions, done);
        self.audit_offset = offset;
        eprintln!("hoststack-lab scale: {report}");
        report
    }
}

/// A tuning of the whole fleet setting somaxconn to `value`, with `rollout` (YAML, the lines
/// after `rollout:` indented by four).
/// Fails the run at once when the tuning `status` ended in RolledBack or Failed while the run
/// waits for `wanted`, with the status's message: waiting longer cannot help.
fn fail_if_ended(status: &Value, wanted: &str) {
    let phase = status["phase"].as_str().unwrap_or_default();
    if phase != wanted && matches!(phase, "RolledBack" | "Failed") {
        panic!(
            "the tuning went {phase} ({}, progress {}) while the run waited for {wanted}",
            status["message"], status["progress"]
        );
    }
}

/// The sysctl's value on `node`'s fleet host.
fn host_value(root: &Path, node: &str) -> String {
    std::fs::read_to_string(root.join(node).join("proc/sys").join(KEY))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Names `nodes` in the fleets' `regressed` file (their hosts retransmit 5%).
fn write_regressed(root: &Path, nodes: &[String]) {
    let mut text = nodes.join("\n");
    text.push('\n');
    std::fs::write(root.join("regressed"), text).expect("writing the regressed file");
}

/// Now, in microseconds since the epoch (the audit log's clock).
fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
