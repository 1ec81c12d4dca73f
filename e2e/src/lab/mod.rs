//! [`Lab`]: start, drive and tear down one local lab. `Lab` is the facade the tests use; it
//! composes rooms that each own one concern and delegates to them:
//!
//! - `control_plane`: etcd and kube-apiserver, the PKI (`control_plane::pki`) and the
//!   kubeconfigs (`control_plane::kubeconfigs`, [`Identity`], [`NAMESPACE`]);
//! - the nodes of each kind: `nodes` (every node's namespace, address and state directory, and
//!   the Node objects of process and VM nodes, on the lab `network`), `kubelet` (real nodes)
//!   and `vm_nodes` (VM nodes, on [`crate::vm`]);
//! - `workloads`: the operator and its replicas, the agents as processes, the tests' helpers;
//! - `kubectl`: kubectl, helm and kube clients (`api_reader`: the reads the tests poll, without
//!   a kubectl process); `exec`: commands inside a node;
//! - `wait`: waiting, the lab's own log and the diagnostics;
//! - `sweep`: lab directories and what dead labs left behind; `bpffs`: the lab's bpffs;
//!   `binaries`: where the programs are; `slot`: one lab per process.
//!
//! `boot.rs` holds the order in which the rooms come up and go down.

mod api_reader;
mod binaries;
mod boot;
mod bpffs;
mod control_plane;
mod exec;
mod kubectl;
pub(crate) mod kubelet;
mod network;
mod nodes;
mod slot;
pub(crate) mod sweep;
mod vm_nodes;
mod wait;
mod workloads;

pub use binaries::control_plane_dir;
pub use control_plane::kubeconfigs::{Identity, NAMESPACE};

/// The Secret the lab's chart RBAC lets the operator read for the Prometheus gate
/// (`prometheus.secretName`), and no other.
pub const PROMETHEUS_SECRET: &str = "hoststack-prometheus";
pub use workloads::AGENT_METRICS_PORT;

use crate::config::{LabConfig, NodeKind};
use crate::process::{ProcessState, Signal, Spawner};
use crate::{vm, Error, Result};
use binaries::Binaries;
use control_plane::kubeconfigs::Kubeconfigs;
use control_plane::{ControlPlane, Member};
use exec::InNode;
use k8s_openapi::api::core::v1::Node;
use kubectl::Kubectl;
use nodes::Nodes;
use slot::Slot;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use vm_nodes::VmNodes;
use wait::LabLog;
use workloads::Workloads;

/// A running lab: etcd and kube-apiserver, a bridge and one network namespace per node, Node
/// objects, the CRDs and the chart's RBAC, the operator and one agent per node.
///
/// Dropping it (also while a test panics) stops every process and deletes every namespace,
/// device and file it made; [`Lab::stop`] does the same and reports failures. One lab runs
/// at a time per process: `start` waits until the previous lab of this process is gone.
///
/// The helpers meant for tests (`kubectl`, `sysctl`, `kill_agent`, ...) panic with a clear
/// message when the lab itself fails, rather than returning errors a test would unwrap.
pub struct Lab {
    index: u8,
    dir: PathBuf,
    config: LabConfig,
    bins: Binaries,
    repo: PathBuf,
    log: LabLog,
    spawner: Spawner,
    kubeconfigs: Kubeconfigs,
    kubectl: Kubectl,
    control_plane: ControlPlane,
    nodes: Nodes,
    vm_nodes: VmNodes,
    /// The real (kubelet) nodes and their controllers, when the nodes are
    /// [`NodeKind::Kubelet`].
    real_nodes: Option<kubelet::Pool>,
    workloads: Workloads,
    /// Where the lab's operator serves /metrics.
    operator_metrics: SocketAddr,
    torn_down: bool,
    /// Set once a failure has printed [`Lab::diagnostics`], so Drop does not print them again.
    diagnosed: AtomicBool,
    _slot: Slot,
}

impl Lab {
    /// Builds and starts a lab; returns once the API server is ready, the CRDs are
    /// established, the Nodes exist and the operator and agents (as configured) are started.
    pub fn start(config: LabConfig) -> Result<Lab> {
        // From the lab's assembly on, Drop tears down whatever boot got to.
        let mut lab = Lab::assemble(config)?;
        lab.boot()?;
        Ok(lab)
    }

    /// Stops everything and removes what the lab made, reporting each step that failed.
    /// Dropping the lab does the same and prints the failures instead.
    pub fn stop(mut self) -> Result<()> {
        let errors = self.teardown();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Teardown(errors))
        }
    }

    // ---- What the lab is -------------------------------------------------------------------

    /// The lab index k: the lab's subnet is 198.18.k.0/24 and its names start with `hs<k>`.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The lab's bridge in the root namespace (`hs<k>br`, 198.18.k.1), which joins every node's
    /// eth0 and where the API server listens.
    pub fn bridge_device(&self) -> String {
        network::bridge_name(self.index)
    }

    /// The root-side veth of `node`'s eth0 (`hs<k>n<i>`), a port of the bridge.
    pub fn uplink_peer(&self, node: &str) -> &str {
        &self.nodes.get(node).uplink_peer
    }

    /// The lab directory: logs/, pki/, etcd/, nodes/<node>/state/, the kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's URL, `https://198.18.k.1:<port>`.
    pub fn api_url(&self) -> &str {
        self.control_plane.api_url()
    }

    /// etcd's client URL (plain HTTP on the lab's loopback address), where its /metrics is.
    pub fn etcd_url(&self) -> &str {
        self.control_plane.etcd_url()
    }

    /// The `hoststack-fleet` binary: many agents in one process (docs/operator.md, Scale).
    pub fn fleet_binary(&self) -> &Path {
        &self.bins.fleet
    }

    /// The user-space stack's runner, `hoststack-userstack`.
    pub fn userstack_binary(&self) -> &Path {
        &self.bins.userstack
    }

    /// `userstack-eval`, the evaluation of the user-space stack (docs/evaluation.md).
    pub fn eval_binary(&self) -> &Path {
        &self.bins.eval
    }

    /// The `kubectl-hoststack` plugin binary, built with the operator and agent.
    pub fn plugin_binary(&self) -> &Path {
        &self.bins.plugin
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        self.kubeconfig_of(Identity::Admin)
    }

    /// The kubeconfig of `identity`.
    pub fn kubeconfig_of(&self, identity: Identity) -> &Path {
        self.kubeconfigs.of(identity)
    }

    /// The kubeconfig of `node`'s agent: a token of the agents' ServiceAccount bound to a Pod
    /// on that node, so it carries the node-name claim that the chart's write guard checks
    /// (as a DaemonSet pod's projected token does).
    pub fn agent_kubeconfig(&self, node: &str) -> PathBuf {
        self.kubeconfigs.agent_of(node)
    }

    /// A kubeconfig with a token (24 h) of ServiceAccount `account` in [`NAMESPACE`], which is
    /// made if missing: an identity of the test's own, with whatever RBAC the test binds to
    /// `system:serviceaccount:hoststack-system:<account>` (e.g. `kubectl hoststack plan`'s).
    pub fn service_account_kubeconfig(&self, account: &str) -> PathBuf {
        let ca = control_plane::pki::ca_cert(&self.dir.join("pki"));
        self.kubeconfigs
            .mint_account(account, &self.kubectl, self.api_url(), &ca)
            .unwrap_or_else(|e| panic!("minting a token of ServiceAccount {account}: {e}"))
    }

    /// A serving certificate for `ip` signed by the lab's CA, for a helper that serves TLS:
    /// the certificate, its key and the CA's certificate (`pki/<name>.crt`, `.key`, `ca.crt`).
    pub fn serving_certificate(
        &self,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<(PathBuf, PathBuf, PathBuf)> {
        let dir = self.dir.join("pki");
        let (cert, key) = control_plane::pki::serving_certificate(&dir, name, ip)?;
        Ok((cert, key, control_plane::pki::ca_cert(&dir)))
    }

    /// Runs kubectl with the credentials in `kubeconfig`, with `stdin` as its standard input.
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl.output_as(kubeconfig, args, stdin)
    }

    /// Runs kubectl with `node`'s agent credentials ([`Lab::agent_kubeconfig`]).
    pub fn kubectl_as_agent_of(&self, node: &str, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl
            .output_as(&self.agent_kubeconfig(node), args, stdin)
    }

    /// The node names, in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.names()
    }

    /// The network namespace of `node` (for `ip netns exec`).
    pub fn netns(&self, node: &str) -> &str {
        &self.nodes.get(node).netns
    }

    /// The address of `node`'s eth0.
    pub fn node_ip(&self, node: &str) -> Ipv4Addr {
        self.nodes.get(node).ip
    }

    /// Where `node`'s agent serves /metrics: the node's address, port [`AGENT_METRICS_PORT`]
    /// (reachable from the root namespace over the bridge).
    pub fn agent_metrics_address(&self, node: &str) -> SocketAddr {
        SocketAddr::from((self.node_ip(node), AGENT_METRICS_PORT))
    }

    /// Where the lab's operator serves /metrics: 127.18.k.1 and a port free when the lab
    /// started, the same across operator restarts.
    pub fn operator_metrics_address(&self) -> SocketAddr {
        self.operator_metrics
    }

    /// The lab's own loopback address, 127.18.k.1, where helpers in the root namespace may
    /// listen without racing other labs for ports.
    pub fn loopback_ip(&self) -> Ipv4Addr {
        network::loopback_ip(self.index)
    }

    /// Starts a helper process owned by the lab (like the operator: its log in
    /// `logs/<name>.log`, killed with the lab even when the test process dies); its pid.
    /// `argv[0]` is the program. A helper of the same name must have been stopped first.
    pub fn spawn_helper(&self, name: &str, argv: &[&str]) -> Result<u32> {
        self.workloads.spawn_helper(&self.spawner, name, argv)
    }

    /// Stops the helper `name` (SIGTERM, SIGKILL after a grace period); its exit status, or
    /// `None` when there is no such helper.
    pub fn stop_helper(&self, name: &str) -> Option<std::result::Result<ExitStatus, String>> {
        self.workloads.stop_helper(name)
    }

    /// Whether the helper `name` is still running.
    pub fn helper_running(&self, name: &str) -> bool {
        self.workloads.helper_running(name)
    }

    /// The agent's `--bpffs-root` for `node`: its directory on the lab's bpffs
    /// (`<lab dir>/bpffs/<node>`), where it pins its XDP programs, links and maps.
    pub fn agent_bpffs_root(&self, node: &str) -> PathBuf {
        bpffs::agent_root(&self.dir, node)
    }

    /// Whether `node` is a VM node.
    pub fn is_vm(&self, node: &str) -> bool {
        self.nodes.get(node).spec.kind == NodeKind::Vm
    }

    /// The VM of VM node `node` (its command channel, console log, agent). Panics when `node`
    /// is not a VM node.
    pub fn vm(&self, node: &str) -> &vm::Vm {
        self.nodes.get(node);
        self.vm_nodes
            .get(node)
            .unwrap_or_else(|| panic!("{node} is not a running VM node"))
    }

    /// `node`'s agent's write log (`--write-log`, hoststack_agent::hooks), beside its state
    /// directory: every host write and journal save, when [`LabConfig::record_writes`] asks
    /// for it.
    pub fn write_log(&self, node: &str) -> PathBuf {
        nodes::write_log(self.nodes.get(node))
    }

    /// The agent's `--state-dir` for `node` (its journal lives here).
    pub fn agent_state_dir(&self, node: &str) -> &Path {
        &self.nodes.get(node).state_dir
    }

    /// The API server's audit log so far (`logs/audit.log`), one `audit.k8s.io/v1` Event per
    /// write request in the order written: `user` (username, groups, extra: a pod-bound
    /// token's `authentication.kubernetes.io/pod-name`), `verb`, `objectRef`, `responseStatus`,
    /// `requestReceivedTimestamp`; the operators' election Lease also with `requestObject` and
    /// `responseObject`. Reads are not recorded.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let path = self.audit_log_path();
        control_plane::audit::events(&path).unwrap_or_else(|e| panic!("the audit log: {e}"))
    }

    /// The API server's audit log file (`logs/audit.log`), for a reader that follows it.
    pub fn audit_log_path(&self) -> PathBuf {
        control_plane::audit::log_path(&self.dir)
    }

    /// The log file of a lab process: "etcd", "kube-apiserver", "operator" or "agent-<node>".
    pub fn log_path(&self, process: &str) -> PathBuf {
        crate::process::log_path(&self.dir, process)
    }

    /// The running lab processes as (name, pid): etcd, kube-apiserver, operator,
    /// "agent <node>".
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.process_states()
            .into_iter()
            .filter_map(|p| p.exited.is_none().then_some((p.name, p.pid)))
            .collect()
    }

    /// Every lab process as it is now: control plane, operator and replicas, agents, helpers,
    /// VM nodes' qemu.
    fn process_states(&self) -> Vec<ProcessState> {
        let mut states = self.control_plane.states();
        states.extend(self.workloads.states());
        states.extend(self.vm_nodes.states());
        states
    }

    // ---- The API ---------------------------------------------------------------------------

    /// A kube client with admin credentials. Needs a tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        self.kubectl.client().await
    }

    /// A JSON merge patch of NodeTuning `node` with the credentials in `kubeconfig` (e.g.
    /// [`Lab::kubeconfig_of`]`(Identity::Operator)`), under `field_manager`, sent as the
    /// operator and the plugin send theirs: one PATCH and no GET first, which `kubectl patch`
    /// makes and neither the operator's nor the planner's RBAC allows. `Err` with the API
    /// server's message when it refuses the patch; panics when it cannot be sent.
    pub fn merge_patch_node_tuning(
        &self,
        kubeconfig: &Path,
        node: &str,
        field_manager: &str,
        patch: &serde_json::Value,
    ) -> std::result::Result<(), String> {
        self.kubectl
            .merge_patch_node_tuning(kubeconfig, node, field_manager, patch)
            .unwrap_or_else(|e| panic!("patching NodeTuning {node}: {e}"))
    }

    /// A JSON merge patch of Node `node` with the credentials in `kubeconfig`, under
    /// `field_manager`: one PATCH, no GET first (the operator may not get a Node). `Err` with
    /// the API server's message when it refuses the patch; panics when it cannot be sent.
    pub fn merge_patch_node(
        &self,
        kubeconfig: &Path,
        node: &str,
        field_manager: &str,
        patch: &serde_json::Value,
    ) -> std::result::Result<(), String> {
        let params = kube::api::PatchParams {
            field_manager: Some(field_manager.to_string()),
            ..Default::default()
        };
        self.kubectl
            .patch_as::<Node>(kubeconfig, node, &params, &kube::api::Patch::Merge(patch))
            .unwrap_or_else(|e| panic!("patching Node {node}: {e}"))
    }

    /// A server-side apply of Node `object` (its `metadata.name`) with the credentials in
    /// `kubeconfig`, forced, under `field_manager`: as the operator sets and removes its agent
    /// label. `Err` with the API server's message when it refuses the apply; panics when it
    /// cannot be sent.
    pub fn apply_node(
        &self,
        kubeconfig: &Path,
        field_manager: &str,
        object: &serde_json::Value,
    ) -> std::result::Result<(), String> {
        let node = object["metadata"]["name"]
            .as_str()
            .expect("a Node object with a name");
        let params = kube::api::PatchParams::apply(field_manager).force();
        self.kubectl
            .patch_as::<Node>(kubeconfig, node, &params, &kube::api::Patch::Apply(object))
            .unwrap_or_else(|e| panic!("applying Node {node}: {e}"))
    }

    /// Writes NodeTuning `node`'s spec as the operator does (server-side apply as `identity`,
    /// under `field_manager`): `tuning`, mode Apply, and `config` (a NodeConfig as JSON) under
    /// the revision it hashes to, which the agent checks. Returns that revision; panics with the
    /// API server's message when the write is refused.
    pub fn write_node_spec(
        &self,
        identity: Identity,
        node: &str,
        field_manager: &str,
        tuning: &str,
        config: &serde_json::Value,
    ) -> String {
        let revision = config_revision(config);
        let object = serde_json::json!({
            "apiVersion": "hoststack.dev/v1alpha1",
            "kind": "NodeTuning",
            "metadata": {"name": node},
            "spec": {"tuning": tuning, "revision": revision, "mode": "Apply", "config": config},
        });
        let out = self.kubectl_as(
            identity,
            &[
                "apply",
                "--server-side",
                "--field-manager",
                field_manager,
                "-f",
                "-",
            ],
            Some(&object.to_string()),
        );
        assert!(
            out.status.success(),
            "writing NodeTuning {node}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        revision
    }

    /// Runs kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl.output(args)
    }

    /// `kubectl <args> -o json` with the admin kubeconfig, parsed; panics with kubectl's message
    /// when it fails (e.g. `&["get", "nodetuning", "node-a"]`).
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        self.kubectl.get_json(args)
    }

    /// The status of NetworkTuning `name` (null while it has none).
    pub fn tuning_status(&self, name: &str) -> serde_json::Value {
        self.get_json(&["get", "networktuning", name])["status"].clone()
    }

    /// Waits until NetworkTuning `name` shows phase `want`; its status then.
    pub fn wait_tuning_phase(
        &self,
        name: &str,
        want: &str,
        timeout: Duration,
    ) -> serde_json::Value {
        self.wait_for(&format!("{name} to be {want}"), timeout, || {
            let status = self.tuning_status(name);
            (status["phase"] == want).then_some(status)
        })
    }

    /// Deletes NetworkTuning `name` and waits (90 s at most) until its finalizer let it go.
    pub fn delete_tuning(&self, name: &str) {
        let out = self.kubectl(&["delete", "networktuning", name, "--timeout=90s"]);
        assert!(
            out.status.success(),
            "deleting {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs kubectl as `identity`, with `stdin` as its standard input.
    pub fn kubectl_as(&self, identity: Identity, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl
            .output_as(self.kubeconfig_of(identity), args, stdin)
    }

    /// `kubectl apply -f -` of `yaml` as admin: `Ok(stdout)`, or `Err(stderr)` with the API
    /// server's message when it rejects the object.
    pub fn apply_yaml(&self, yaml: &str) -> std::result::Result<String, String> {
        self.kubectl.apply_yaml(yaml)
    }

    /// Sets (`Some`) or removes (`None`) a label of a Node.
    pub fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        self.kubectl.label_node(node, key, value)
    }

    // ---- The nodes -------------------------------------------------------------------------

    /// `node`, to run commands in.
    fn in_node(&self, node: &str) -> InNode<'_> {
        let n = self.nodes.get(node);
        InNode {
            node: &n.spec.name,
            netns: &n.netns,
        }
    }

    /// Runs `argv` inside `node`'s network namespace (`ip netns exec`).
    pub fn exec_in_node(&self, node: &str, argv: &[&str]) -> Output {
        self.in_node(node).exec(argv)
    }

    /// The value of sysctl `key` (e.g. `net.ipv4.tcp_rmem`) as `node` sees it, read from
    /// /proc/sys inside its namespace (a VM node's: in its guest), with runs of whitespace
    /// collapsed to one space ("4096 131072 6291456").
    pub fn sysctl(&self, node: &str, key: &str) -> String {
        if self.is_vm(node) {
            return self.vm(node).sysctl(key);
        }
        self.in_node(node).sysctl(key)
    }

    /// Writes sysctl `key` = `value` inside `node`'s namespace (to set up a test's originals).
    pub fn write_sysctl(&self, node: &str, key: &str, value: &str) {
        self.in_node(node).write_sysctl(key, value)
    }

    // ---- The processes ---------------------------------------------------------------------

    /// The pid of `node`'s agent while it runs.
    pub fn agent_pid(&self, node: &str) -> Option<u32> {
        self.nodes.get(node);
        self.workloads.agent_pid(node)
    }

    /// Sends `signal` to `node`'s agent. For Kill, Term and Int it waits until the agent has
    /// exited (panicking after 10 s) and returns its exit status; for Stop and Cont it returns
    /// `None` at once. Panics if the agent is not running.
    pub fn kill_agent(&self, node: &str, signal: Signal) -> Option<ExitStatus> {
        self.nodes.get(node);
        self.workloads.kill_agent(node, signal)
    }

    /// Starts `node`'s agent (again) with the configured arguments plus `extra_args` (e.g.
    /// `["--step-delay", "500ms"]`). Panics if it is running.
    pub fn start_agent(&self, node: &str, extra_args: &[&str]) {
        assert!(
            self.agent_pid(node).is_none(),
            "the agent on {node} is already running"
        );
        self.workloads
            .spawn_agent(&self.spawner, self.nodes.get(node), extra_args)
            .unwrap_or_else(|e| panic!("starting the agent on {node}: {e}"));
    }

    /// Stops the operator (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_operator(&self) {
        self.workloads.stop_operator()
    }

    /// Starts the operator. Panics if it runs.
    pub fn start_operator(&self) {
        self.workloads.start_operator(&self.spawner)
    }

    /// Sends `signal` to the lab's operator (e.g. SIGKILL: it dies holding its lease). For
    /// Kill, Term and Int it waits until the operator has exited and returns its exit status;
    /// for Stop and Cont it returns `None` at once. Panics if the operator is not running.
    pub fn kill_operator(&self, signal: Signal) -> Option<ExitStatus> {
        self.workloads.kill_operator(signal)
    }

    /// Starts one more operator replica with leader-election identity `pod_name`: the lab
    /// operator's arguments, the operator's ServiceAccount with a token bound to a Pod named
    /// `pod_name` (so its requests carry `authentication.kubernetes.io/pod-name` in the audit
    /// log, [`Lab::audit_events`], as a Deployment pod's projected token does), log
    /// `operator-<pod_name>`, listed by [`Lab::processes`] as "operator <pod_name>", stopped
    /// with the lab. Panics if a replica of that name runs.
    pub fn start_operator_replica(&self, pod_name: &str) {
        let ca = control_plane::pki::ca_cert(&self.dir.join("pki"));
        self.kubeconfigs
            .mint_replica(pod_name, &self.kubectl, self.api_url(), &ca)
            .unwrap_or_else(|e| panic!("minting operator replica {pod_name}'s token: {e}"));
        self.workloads.start_replica(&self.spawner, pod_name)
    }

    /// Stops the operator replica `pod_name` (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_operator_replica(&self, pod_name: &str) {
        self.workloads.stop_replica(pod_name)
    }

    /// Kills etcd (SIGKILL) and starts it again on the same data directory and ports; returns
    /// once it accepts connections (the API server reconnects by itself).
    pub fn restart_etcd(&self) {
        self.control_plane
            .restart(&self.spawner, Member::Etcd, Signal::Kill)
            .unwrap_or_else(|e| panic!("restarting etcd: {e}"));
    }

    /// Restarts the API server (SIGTERM, as a control-plane upgrade does) with the same flags
    /// and waits until it is ready.
    pub fn restart_apiserver(&self) {
        self.control_plane
            .restart(&self.spawner, Member::ApiServer, Signal::Term)
            .and_then(|()| self.await_apiserver())
            .unwrap_or_else(|e| panic!("restarting the API server: {e}"));
    }

    /// Pauses the API server (SIGSTOP) for `pause`, then resumes it (SIGCONT): its sockets
    /// stay open and accept connections, and nothing answers, as when a control plane stalls or
    /// a connection dies silently; pooled connections and watches hang until it resumes.
    pub fn pause_apiserver(&self, pause: Duration) {
        let signal = |signal| {
            self.control_plane
                .signal(Member::ApiServer, signal)
                .unwrap_or_else(|e| panic!("pausing the API server: {e}"))
        };
        signal(Signal::Stop);
        std::thread::sleep(pause);
        signal(Signal::Cont);
    }

    /// Cuts the power of VM node `node` (SIGKILL of its qemu): its guest and agent stop at
    /// once, mid-write if they were writing; its share (the agent's state directory) stays.
    pub fn cut_vm_power(&self, node: &str) {
        self.nodes.get(node);
        self.vm_nodes
            .cut_power(node)
            .unwrap_or_else(|e| panic!("cutting the power of VM node {node}: {e}"));
    }

    /// Powers VM node `node` on again after [`Lab::cut_vm_power`] (see docs/vm-node.md): the
    /// host comes back with its kernel's boot-time settings, and the agent, started by the
    /// guest's init, with the state directory it had. Returns once the guest is ready (not the
    /// agent), with how long the boot took.
    pub fn power_on_vm(&self, node: &str) -> Duration {
        self.nodes.get(node);
        self.vm_nodes
            .power_on(node, &self.spawner, &self.log)
            .unwrap_or_else(|e| panic!("powering VM node {node} on again: {e}"))
    }

    /// Stops and starts the operator (same leader-election identity).
    pub fn restart_operator(&self) {
        self.stop_operator();
        self.start_operator();
    }

    /// Restarts the operator with `args` after the lab's own, as `helm upgrade` with changed
    /// values rolls the operator's pods (e.g. the Prometheus the rollout gate may ask,
    /// [`crate::prometheus::Prometheus::operator_args`]). They stay for later restarts and
    /// replicas; a later call replaces them.
    pub fn reconfigure_operator(&self, args: &[String]) {
        self.workloads.configure_operator(args);
        self.restart_operator();
    }

    // ---- Waiting and diagnosing ------------------------------------------------------------

    /// Polls `check` every 250 ms until it returns `Some`, and returns that. After `timeout`
    /// it panics with `what` and [`Lab::diagnostics`].
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        wait::poll(timeout, check).unwrap_or_else(|| self.timed_out(what, timeout))
    }

    /// [`Lab::wait_for`] on VM node `node`, with `budget` counted in the guest's progress
    /// ([`vm::Vm::wait_for`]) rather than in wall time; panics with the lab's diagnostics and the
    /// guest's state.
    pub fn wait_for_guest<T>(
        &self,
        node: &str,
        what: &str,
        budget: Duration,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        let vm = self.vm(node);
        vm.wait_for(budget, check).unwrap_or_else(|why| {
            self.diagnosed.store(true, Ordering::Relaxed);
            panic!(
                "waiting for {what} (a budget of {budget:?} of {node}'s progress): {why}\n{}\n{}",
                self.diagnostics(),
                vm.guest_state()
            )
        })
    }

    /// [`Lab::wait_for`] for async checks (e.g. with a kube client).
    pub async fn wait_for_async<T, F, Fut>(&self, what: &str, timeout: Duration, check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        match wait::poll_async(timeout, check).await {
            Some(value) => value,
            None => self.timed_out(what, timeout),
        }
    }

    /// Panics for a wait on `what` that took longer than `timeout`, with the diagnostics.
    fn timed_out(&self, what: &str, timeout: Duration) -> ! {
        self.diagnosed.store(true, Ordering::Relaxed);
        panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            self.diagnostics()
        )
    }

    /// What to look at when a test fails: which processes run, the tails of the operator's and
    /// agents' logs, and `kubectl get networktunings,nodetunings -o yaml`.
    pub fn diagnostics(&self) -> String {
        let mut logs = self.workloads.operator_logs();
        logs.extend(self.nodes.iter().map(|n| format!("agent-{}", n.spec.name)));
        logs.extend(self.vm_nodes.names().map(|node| format!("console-{node}")));
        let tunings = self.kubectl(&["get", "networktunings,nodetunings", "-o", "yaml"]);
        wait::report(&self.dir, &self.process_states(), &logs, &tunings)
    }

    // ---- Real (kubelet) nodes: see `kubelet` and docs/lab.md, Real nodes --------------------

    /// The chart's directory, charts/hoststack.
    pub fn chart_dir(&self) -> PathBuf {
        self.repo.join("charts").join("hoststack")
    }

    /// Writes `values-lab.yaml` in the lab directory: the chart's values for a real pool (the
    /// image every node imported, [`crate::LAB_IMAGE`], never pulled) plus `extra` (YAML
    /// appended as is); its path.
    pub fn lab_chart_values(&self, extra: &str) -> PathBuf {
        kubelet::chart_values(&self.dir, extra)
    }

    /// Runs the lab's helm with the admin kubeconfig and helm's state under the lab directory
    /// (e.g. `&["install", "hoststack", chart, "-n", NAMESPACE, "--create-namespace"]`).
    pub fn helm(&self, args: &[&str]) -> Output {
        self.kubectl.helm(args)
    }

    /// Sends `signal` to every process named `program` (its `comm`, e.g. "hoststack-agent") in
    /// the pods of real node `node`, e.g. SIGKILL to the agent container's process in the
    /// middle of a transaction (a pod delete sends SIGTERM, which lets it finish); their pids.
    /// Panics when `node` is not a real node.
    pub fn signal_pod_processes(&self, node: &str, program: &str, signal: Signal) -> Vec<u32> {
        let pids = self
            .real_nodes
            .as_ref()
            .and_then(|pool| pool.pod_processes(node, program))
            .unwrap_or_else(|| panic!("{node} is not a real node of this lab"));
        for &pid in &pids {
            crate::process::send_signal(pid, signal)
                .unwrap_or_else(|e| panic!("signalling {program} ({pid}) on {node}: {e}"));
        }
        pids
    }

    /// Reads the file at `path` inside real node `node`'s own mount namespace (e.g. the agent's
    /// journal, `/var/lib/hoststack/journal.json`, on the node's private /var/lib/hoststack).
    /// Panics when `node` is not a running real node or the file cannot be read.
    pub fn read_real_node_file(&mut self, node: &str, path: &str) -> String {
        let seen = self
            .real_nodes
            .as_mut()
            .and_then(|pool| pool.node_path(node, Path::new(path)))
            .unwrap_or_else(|| panic!("{node} is not a running real node of this lab"));
        std::fs::read_to_string(&seen)
            .unwrap_or_else(|e| panic!("reading {path} on {node} ({}): {e}", seen.display()))
    }

    /// The processes of the real nodes as (name, pid): kube-controller-manager,
    /// kube-scheduler, and per node "holder <node>", "containerd <node>", "kubelet <node>".
    /// Empty for other labs.
    pub fn real_node_processes(&mut self) -> Vec<(String, u32)> {
        self.real_nodes
            .as_mut()
            .map(kubelet::Pool::processes)
            .unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if std::thread::panicking() && !self.diagnosed.load(Ordering::Relaxed) {
            eprintln!("{}", self.diagnostics());
        }
        let errors = self.teardown();
        for error in errors {
            eprintln!("hoststack-lab teardown: {error}");
        }
    }
}

/// The revision `config` (a NodeConfig as JSON) hashes to, the one a NodeTuning's spec must
/// carry with it; panics when it is not a NodeConfig.
pub fn config_revision(config: &serde_json::Value) -> String {
    serde_json::from_value::<hoststack_crds::NodeConfig>(config.clone())
        .unwrap_or_else(|e| panic!("not a NodeConfig: {e}: {config}"))
        .revision()
}
