//! The lab's workloads, its long-running processes besides the control plane: the operator
//! (and extra replicas) in the root namespace, one agent per process node inside the node's
//! namespace, and the helpers a test starts (Prometheus, iperf3, ...). The operator and the
//! agents run with the chart's ServiceAccount tokens, never as admin; a VM node's agent gets
//! the same flags and environment inside its guest (see [`super::vm_nodes`]).

use super::bpffs;
use super::control_plane::kubeconfigs::{Identity, Kubeconfigs, NAMESPACE};
use super::nodes::Node;
use crate::process::{args, env_var, Managed, ProcessState, Signal, Spawner};
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The agents' /metrics port (each agent has its node's address to itself).
pub const AGENT_METRICS_PORT: u16 = hoststack_crds::AGENT_METRICS_PORT;

/// How long the operator, agents and helpers get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// How the lab starts its operators and agents.
pub(crate) struct Launch {
    /// The lab index k.
    pub index: u8,
    /// The lab directory (the agents' bpffs roots are under it).
    pub lab_dir: PathBuf,
    /// hoststack-operator.
    pub operator: PathBuf,
    /// hoststack-agent.
    pub agent: PathBuf,
    /// The user-space stack's runner, which the agents start for `userspaceStack`.
    pub userstack: PathBuf,
    /// Extra arguments of every operator.
    pub operator_args: Vec<String>,
    /// Extra arguments of every agent.
    pub agent_args: Vec<String>,
    /// Whether the agents keep a write log ([`super::nodes::write_log`]).
    pub record_writes: bool,
    /// The image the operator puts into the agent DaemonSet.
    pub agent_image: String,
    /// Where the lab's operator serves /metrics (the same across restarts).
    pub operator_metrics: SocketAddr,
    /// The lab's loopback address, where extra replicas serve /metrics.
    pub loopback: Ipv4Addr,
    /// The kubeconfigs the operator and agents run with.
    pub kubeconfigs: Kubeconfigs,
}

/// The running workloads and how to start more.
pub(crate) struct Workloads {
    launch: Launch,
    /// Operator arguments a test set after the start, after the lab's own
    /// ([`Workloads::configure_operator`]).
    operator_config: Mutex<Vec<String>>,
    running: Mutex<Running>,
}

#[derive(Default)]
struct Running {
    operator: Option<Managed>,
    /// Extra operator replicas by leader-election identity.
    replicas: BTreeMap<String, Managed>,
    agents: BTreeMap<String, Managed>,
    /// Helpers a test started (Prometheus, iperf3, ...).
    helpers: BTreeMap<String, Managed>,
}

impl Workloads {
    /// No workload runs yet.
    pub fn new(launch: Launch) -> Workloads {
        Workloads {
            launch,
            operator_config: Mutex::default(),
            running: Mutex::new(Running::default()),
        }
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    // ---- The operator ----------------------------------------------------------------------

    /// Starts the lab's operator. The same leader-election identity across restarts, so a
    /// restarted operator takes its lease back at once instead of waiting for it to expire.
    pub fn spawn_operator(&self, spawner: &Spawner) -> Result<()> {
        let pod_name = format!("hoststack-operator-lab{}-0", self.launch.index);
        let kubeconfig = self.launch.kubeconfigs.of(Identity::Operator).to_path_buf();
        let operator = self.spawn_operator_process(spawner, "operator", &pod_name, &kubeconfig)?;
        self.running().operator = Some(operator);
        Ok(())
    }

    /// An operator process named `name` with leader-election identity `pod_name` and the
    /// credentials in `kubeconfig`.
    fn spawn_operator_process(
        &self,
        spawner: &Spawner,
        name: &str,
        pod_name: &str,
        kubeconfig: &Path,
    ) -> Result<Managed> {
        let launch = &self.launch;
        let mut argv = args(&[
            "--namespace",
            NAMESPACE,
            "--agent-image",
            &launch.agent_image,
        ]);
        // On the lab's own loopback address: the lab's operator on the port chosen at start,
        // extra replicas on any free port.
        let addr = if name == "operator" {
            launch.operator_metrics
        } else {
            SocketAddr::from((launch.loopback, 0))
        }
        .to_string();
        argv.extend(args(&["--metrics-bind-address", &addr]));
        argv.extend(launch.operator_args.iter().cloned());
        argv.extend(
            self.operator_config
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .cloned(),
        );
        let env = vec![
            env_var("KUBECONFIG", kubeconfig),
            env_var("POD_NAME", pod_name),
        ];
        spawner.spawn(name, &launch.operator, &argv, &env)
    }

    /// Gives every operator started from now on `args` after the lab's own (replacing those of
    /// an earlier call).
    pub fn configure_operator(&self, args: &[String]) {
        *self
            .operator_config
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = args.to_vec();
    }

    /// Starts the operator; panics if it runs.
    pub fn start_operator(&self, spawner: &Spawner) {
        let running = self
            .running()
            .operator
            .as_mut()
            .is_some_and(|p| p.exited().is_none());
        assert!(!running, "the operator is already running");
        self.spawn_operator(spawner)
            .unwrap_or_else(|e| panic!("starting the operator: {e}"));
    }

    /// Sends `signal` to the operator and, for Kill, Term and Int, waits until it has exited
    /// (panicking after 10 s); its exit status, `None` for Stop and Cont. Panics if it does not
    /// run.
    pub fn kill_operator(&self, signal: Signal) -> Option<ExitStatus> {
        let mut running = self.running();
        let operator = running.operator.as_mut().expect("the operator was started");
        assert!(operator.exited().is_none(), "the operator is running");
        operator
            .signal(signal)
            .unwrap_or_else(|e| panic!("signalling the operator: {e}"));
        if matches!(signal, Signal::Stop | Signal::Cont) {
            return None;
        }
        let status = operator
            .wait_timeout(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("the operator did not exit after {signal:?}"));
        running.operator = None;
        Some(status)
    }

    /// Stops the operator (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_operator(&self) {
        let operator = self.running().operator.take();
        if let Some(mut operator) = operator {
            operator
                .stop(GRACE)
                .unwrap_or_else(|e| panic!("stopping the operator: {e}"));
        }
    }

    /// Starts one more operator replica with leader-election identity `pod_name` and its own
    /// kubeconfig ([`Kubeconfigs::replica_of`], minted beforehand); panics if a replica of that
    /// name runs.
    pub fn start_replica(&self, spawner: &Spawner, pod_name: &str) {
        let running = self
            .running()
            .replicas
            .get_mut(pod_name)
            .is_some_and(|p| p.exited().is_none());
        assert!(!running, "operator replica {pod_name} is already running");
        let kubeconfig = self.launch.kubeconfigs.replica_of(pod_name);
        let replica = self
            .spawn_operator_process(
                spawner,
                &format!("operator {pod_name}"),
                pod_name,
                &kubeconfig,
            )
            .unwrap_or_else(|e| panic!("starting operator replica {pod_name}: {e}"));
        self.running()
            .replicas
            .insert(pod_name.to_string(), replica);
    }

    /// Stops the operator replica `pod_name` (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_replica(&self, pod_name: &str) {
        let replica = self.running().replicas.remove(pod_name);
        if let Some(mut replica) = replica {
            replica
                .stop(GRACE)
                .unwrap_or_else(|e| panic!("stopping operator replica {pod_name}: {e}"));
        }
    }

    // ---- The agents ------------------------------------------------------------------------

    /// Starts `node`'s agent inside its namespace with the configured flags plus `extra`.
    pub fn spawn_agent(&self, spawner: &Spawner, node: &Node, extra: &[&str]) -> Result<()> {
        let name = &node.spec.name;
        let mut argv = args(&["netns", "exec", &node.netns]);
        argv.push(self.launch.agent.display().to_string());
        argv.extend(self.agent_flags(
            node,
            &node.state_dir,
            &bpffs::agent_root(&self.launch.lab_dir, name),
        ));
        let runner = self.launch.userstack.display().to_string();
        argv.extend(args(&["--userstack-binary", &runner]));
        argv.extend(args(extra));
        let agent = spawner.spawn(
            &format!("agent {name}"),
            Path::new("ip"),
            &argv,
            &self.agent_env(name),
        )?;
        self.running().agents.insert(name.to_string(), agent);
        Ok(())
    }

    /// The agent binary.
    pub fn agent_program(&self) -> &Path {
        &self.launch.agent
    }

    /// The flags every agent gets (a VM node's guest paths for state and bpffs differ; its
    /// write log is in its share, at the same path in the guest).
    pub fn agent_flags(&self, node: &Node, state_dir: &Path, bpffs_root: &Path) -> Vec<String> {
        let mut argv = args(&[
            "--node-name",
            &node.spec.name,
            "--proc-root",
            "/proc",
            "--sys-root",
            "/sys",
            "--state-dir",
            &state_dir.display().to_string(),
            "--metrics-bind-address",
            &SocketAddr::from((node.ip, AGENT_METRICS_PORT)).to_string(),
            "--bpffs-root",
            &bpffs_root.display().to_string(),
        ]);
        if self.launch.record_writes {
            let log = super::nodes::write_log(node).display().to_string();
            argv.extend(args(&["--write-log", &log]));
        }
        argv.extend(self.launch.agent_args.iter().cloned());
        argv
    }

    /// The environment every agent gets.
    pub fn agent_env(&self, node: &str) -> Vec<(String, String)> {
        vec![
            env_var("KUBECONFIG", self.launch.kubeconfigs.agent_of(node)),
            env_var("NODE_NAME", node),
        ]
    }

    /// The pid of `node`'s agent while it runs.
    pub fn agent_pid(&self, node: &str) -> Option<u32> {
        let mut running = self.running();
        let agent = running.agents.get_mut(node)?;
        agent.exited().is_none().then(|| agent.pid())
    }

    /// Sends `signal` to `node`'s agent. For Kill, Term and Int it waits until the agent has
    /// exited (panicking after 10 s) and returns its exit status; for Stop and Cont it returns
    /// `None` at once. Panics if the agent is not running.
    pub fn kill_agent(&self, node: &str, signal: Signal) -> Option<ExitStatus> {
        let mut running = self.running();
        let agent = running
            .agents
            .get_mut(node)
            .unwrap_or_else(|| panic!("no agent was started on {node}"));
        assert!(
            agent.exited().is_none(),
            "the agent on {node} is not running"
        );
        agent
            .signal(signal)
            .unwrap_or_else(|e| panic!("signalling the agent on {node}: {e}"));
        if matches!(signal, Signal::Stop | Signal::Cont) {
            return None;
        }
        let status = agent
            .wait_timeout(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("the agent on {node} did not exit after {signal:?}"));
        running.agents.remove(node);
        Some(status)
    }

    // ---- The helpers -----------------------------------------------------------------------

    /// Starts helper `name` (`argv[0]` is the program); its pid. A helper of the same name is
    /// killed.
    pub fn spawn_helper(&self, spawner: &Spawner, name: &str, argv: &[&str]) -> Result<u32> {
        let (program, rest) = argv
            .split_first()
            .ok_or_else(|| Error::Setup(format!("helper {name}: empty command")))?;
        let helper = spawner.spawn(name, Path::new(program), &args(rest), &[])?;
        let pid = helper.pid();
        if let Some(mut old) = self.running().helpers.insert(name.to_string(), helper) {
            let _ = old.kill();
        }
        Ok(pid)
    }

    /// Stops the helper `name` (SIGTERM, SIGKILL after a grace period); its exit status, or
    /// `None` when there is no such helper.
    pub fn stop_helper(&self, name: &str) -> Option<Result<ExitStatus, String>> {
        let mut helper = self.running().helpers.remove(name)?;
        Some(helper.stop(GRACE))
    }

    /// Whether the helper `name` is still running.
    pub fn helper_running(&self, name: &str) -> bool {
        self.running()
            .helpers
            .get_mut(name)
            .is_some_and(|h| h.exited().is_none())
    }

    // ---- All of them -----------------------------------------------------------------------

    /// The operator, the replicas, the agents and the helpers as they are now.
    pub fn states(&self) -> Vec<ProcessState> {
        let mut running = self.running();
        let Running {
            operator,
            replicas,
            agents,
            helpers,
        } = &mut *running;
        operator
            .iter_mut()
            .chain(replicas.values_mut())
            .chain(agents.values_mut())
            .chain(helpers.values_mut())
            .map(Managed::state)
            .collect()
    }

    /// The log names of the operator and its replicas ("operator", "operator-<pod name>").
    pub fn operator_logs(&self) -> Vec<String> {
        let mut logs = vec!["operator".to_string()];
        logs.extend(
            self.running()
                .replicas
                .values()
                .map(|p| p.name.replace(' ', "-")),
        );
        logs
    }

    /// Stops every workload at once while the API server still answers them: SIGTERM, 5 s,
    /// SIGKILL. The failures.
    pub fn stop(&mut self) -> Vec<String> {
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Managed> = running.operator.take().into_iter().collect();
        all.extend(std::mem::take(&mut running.replicas).into_values());
        all.extend(std::mem::take(&mut running.helpers).into_values());
        all.extend(std::mem::take(&mut running.agents).into_values());
        for p in &mut all {
            let _ = p.signal(Signal::Term);
        }
        let deadline = Instant::now() + GRACE;
        let mut errors = Vec::new();
        for p in &mut all {
            let left = deadline.saturating_duration_since(Instant::now());
            if p.wait_timeout(left).is_none() {
                if let Err(e) = p.kill() {
                    errors.push(e);
                }
            }
        }
        errors
    }
}
