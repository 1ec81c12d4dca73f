//! [`Lab`]: start, drive and tear down one local lab.

mod binaries;
mod bpffs;
pub(crate) mod kubelet;
mod network;
pub(crate) mod sweep;

pub use binaries::control_plane_dir;

use crate::command::{self, cmd};
use crate::config::{validate_node_name, LabConfig, NodeKind, NodeSpec};
use crate::process::{tail, Managed, Signal, Spawner};
use crate::{pki, vm, Error, Result};
use binaries::{repo_root, Binaries};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Namespace of the operator's and agents' ServiceAccounts.
pub const NAMESPACE: &str = "hoststack-system";

/// How long the operator and agents get between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// How long a VM node's guest may take from starting qemu until it is ready (TCG).
const VM_BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Poll interval of [`Lab::wait_for`].
const POLL: Duration = Duration::from_millis(250);

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
    api_url: String,
    kubeconfigs: BTreeMap<Identity, PathBuf>,
    nodes: Vec<Node>,
    procs: Mutex<Procs>,
    spawner: Option<Spawner>,
    torn_down: bool,
    /// Where the lab's operator serves /metrics.
    operator_metrics: SocketAddr,
    /// Set once a failure has printed [`Lab::diagnostics`], so Drop does not print them again.
    diagnosed: AtomicBool,
    /// The real (kubelet) nodes and their controllers, when the nodes are
    /// [`NodeKind::Kubelet`].
    real_nodes: Option<kubelet::Pool>,
    _slot: Slot,
}

/// Whose credentials a kubeconfig carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    /// Cluster admin (client certificate, O=system:masters).
    Admin,
    /// The operator's ServiceAccount token (the chart's operator RBAC).
    Operator,
    /// The agents' ServiceAccount token (the chart's agent RBAC).
    Agent,
}

struct Node {
    spec: NodeSpec,
    netns: String,
    ip: Ipv4Addr,
    state_dir: PathBuf,
    /// The running VM of a [`NodeKind::Vm`] node.
    vm: Option<vm::Vm>,
}

#[derive(Default)]
struct Procs {
    etcd: Option<Managed>,
    apiserver: Option<Managed>,
    operator: Option<Managed>,
    /// Extra operator replicas by leader-election identity.
    replicas: BTreeMap<String, Managed>,
    agents: BTreeMap<String, Managed>,
    /// Helpers a test started with [`Lab::spawn_helper`] (Prometheus, iperf3, ...).
    helpers: BTreeMap<String, Managed>,
}

impl Procs {
    /// Every managed process: control plane, operator and replicas, agents, helpers.
    fn all_mut(&mut self) -> impl Iterator<Item = &mut Managed> {
        let Procs {
            etcd,
            apiserver,
            operator,
            replicas,
            agents,
            helpers,
        } = self;
        [etcd, apiserver, operator]
            .into_iter()
            .flatten()
            .chain(replicas.values_mut())
            .chain(agents.values_mut())
            .chain(helpers.values_mut())
    }
}

/// The agents' /metrics port (each agent has its node's address to itself).
pub const AGENT_METRICS_PORT: u16 = 9478;

impl Lab {
    /// Builds and starts a lab; returns once the API server is ready, the CRDs are
    /// established, the Nodes exist and the operator and agents (as configured) are started.
    pub fn start(config: LabConfig) -> Result<Lab> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Setup(
                "the lab needs root (network namespaces, veths, a bridge)".into(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for node in &config.nodes {
            validate_node_name(&node.name).map_err(Error::Setup)?;
            if !names.insert(node.name.as_str()) {
                return Err(Error::Setup(format!("node {} is listed twice", node.name)));
            }
            match node.kind {
                NodeKind::Process | NodeKind::Vm => {}
                NodeKind::Kubelet => {
                    if config.start_operator || config.start_agents {
                        return Err(Error::Setup(format!(
                            "node {}: real (kubelet) nodes get hoststack from `helm install`, \
                             not from lab-run operator and agents (use LabConfig::real_pool)",
                            node.name
                        )));
                    }
                }
            }
        }
        let kubelets = config
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Kubelet)
            .count();
        if kubelets != 0 && kubelets != config.nodes.len() {
            return Err(Error::Setup(
                "a lab's nodes are either all real (kubelet) nodes or none".into(),
            ));
        }
        if config.nodes.len() > 200 {
            return Err(Error::Setup("at most 200 nodes".into()));
        }
        let slot = Slot::acquire();
        let bins = Binaries::locate(config.start_operator || config.start_agents || kubelets != 0)?;
        let (index, dir, warnings) = sweep::allocate()?;
        for warning in warnings {
            eprintln!("hoststack-lab: while sweeping stale labs: {warning}");
        }
        let nodes = config
            .nodes
            .iter()
            .enumerate()
            .map(|(i, spec)| Node {
                spec: spec.clone(),
                netns: network::netns_name(index, &spec.name),
                ip: network::node_ip(index, i),
                state_dir: dir.join("nodes").join(&spec.name).join("state"),
                vm: None,
            })
            .collect();
        let kubeconfigs = [
            (Identity::Admin, "admin"),
            (Identity::Operator, "operator"),
            (Identity::Agent, "agent"),
        ]
        .into_iter()
        .map(|(id, name)| (id, dir.join(format!("{name}.kubeconfig"))))
        .collect();
        // A free port, kept across operator restarts (a fixed one could be a host service's).
        let operator_metrics = SocketAddr::from((
            network::loopback_ip(index),
            free_port(network::loopback_ip(index))?,
        ));
        let spawner = Spawner::new().map_err(|e| Error::io("starting the spawner thread", e))?;
        // From here on, Drop tears down whatever boot got to.
        let mut lab = Lab {
            index,
            dir,
            config,
            bins,
            repo: repo_root(),
            api_url: String::new(),
            kubeconfigs,
            nodes,
            procs: Mutex::new(Procs::default()),
            spawner: Some(spawner),
            torn_down: false,
            diagnosed: AtomicBool::new(false),
            operator_metrics,
            real_nodes: None,
            _slot: slot,
        };
        lab.boot()?;
        Ok(lab)
    }

    fn boot(&mut self) -> Result<()> {
        let started = Instant::now();
        let phase = |lab: &Lab, what: &str| {
            lab.note(&format!("{:>6.2}s {what}", started.elapsed().as_secs_f64()))
        };
        for sub in ["logs", "etcd", "apiserver", "kube-cache", "helm"] {
            mkdir(&self.dir.join(sub))?;
        }
        for node in &self.nodes {
            mkdir(&node.state_dir)?;
        }
        // One bpffs for the lab, mounted before any agent starts so that every agent's mount
        // namespace (`ip netns exec` makes one per agent) shares it and pins outlive agents.
        bpffs::mount(&self.dir)?;

        network::create_bridge(self.index)?;
        for (i, node) in self.nodes.iter().enumerate() {
            network::add_node(self.index, i, &node.spec.name)?;
        }
        let bridge = network::bridge_ip(self.index);
        phase(self, "network");
        let pki = pki::generate(&self.dir.join("pki"), &[bridge])?;
        phase(self, "pki");

        // etcd on loopback, where only the API server reaches it (a node namespace has a
        // loopback of its own), on an address of this lab's own (127.18.k.1): labs starting at
        // the same time never race for a port, and the API server never finds another lab's etcd.
        let loopback = network::loopback_ip(self.index);
        let (client, peer) = (free_port(loopback)?, free_port(loopback)?);
        let client_url = format!("http://{loopback}:{client}");
        let peer_url = format!("http://{loopback}:{peer}");
        let etcd_args = strings(&[
            "--name=lab",
            &format!("--data-dir={}", self.dir.join("etcd").display()),
            &format!("--listen-client-urls={client_url}"),
            &format!("--advertise-client-urls={client_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=lab={peer_url}"),
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        let etcd = self.spawn("etcd", &self.bins.etcd.clone(), &etcd_args, &[])?;
        self.procs().etcd = Some(etcd);
        self.await_ready("etcd", Duration::from_secs(30), |_| {
            TcpStream::connect_timeout(
                &SocketAddr::from((loopback, client)),
                Duration::from_millis(200),
            )
            .is_ok()
        })?;
        phase(self, "etcd serving");

        // The API server on the bridge address, so agents inside node namespaces reach it.
        let port = if TcpListener::bind((bridge, 6443)).is_ok() {
            6443
        } else {
            free_port(bridge)?
        };
        self.api_url = format!("https://{bridge}:{port}");
        let p = |path: &Path| path.display().to_string();
        let apiserver_args = strings(&[
            &format!("--etcd-servers={client_url}"),
            &format!("--bind-address={bridge}"),
            &format!("--advertise-address={bridge}"),
            &format!("--secure-port={port}"),
            &format!("--cert-dir={}", p(&self.dir.join("apiserver"))),
            &format!("--tls-cert-file={}", p(&pki.serving_cert)),
            &format!("--tls-private-key-file={}", p(&pki.serving_key)),
            &format!("--client-ca-file={}", p(&pki.ca_cert)),
            "--service-cluster-ip-range=198.19.255.0/24",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            &format!("--service-account-key-file={}", p(&pki.sa_pub)),
            &format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--allow-privileged=true",
            "--profiling=false",
            // Real nodes: logs and exec reach kubelets at their addresses, as the lab admin
            // (the kubelets trust the lab CA and authorize every authenticated client).
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            &format!("--kubelet-client-certificate={}", p(&pki.admin_cert)),
            &format!("--kubelet-client-key={}", p(&pki.admin_key)),
        ]);
        let apiserver = self.spawn(
            "kube-apiserver",
            &self.bins.kube_apiserver.clone(),
            &apiserver_args,
            &[],
        )?;
        self.procs().apiserver = Some(apiserver);
        pki::write_kubeconfig(
            self.kubeconfig(),
            &self.api_url,
            &pki.ca_cert,
            "hoststack-lab-admin",
            pki::Credentials::Certificate {
                cert: &pki.admin_cert,
                key: &pki.admin_key,
            },
        )?;
        self.await_ready("kube-apiserver /readyz", Duration::from_secs(90), |lab| {
            lab.kubectl(&["get", "--raw", "/readyz"]).status.success()
        })?;
        phase(self, "kube-apiserver ready");
        if self
            .config
            .nodes
            .iter()
            .any(|n| n.kind == NodeKind::Kubelet)
        {
            return self.boot_real_nodes(port);
        }

        // The API: CRDs, the namespace, the chart's ServiceAccounts and RBAC, the Nodes.
        let crds = self.repo.join("crds");
        self.kubectl_checked(&["apply", "--server-side", "-f", &p(&crds)], None)?;
        self.kubectl_checked(
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ],
            None,
        )?;
        // Established is not yet published: `kubectl explain` (and client-side validation)
        // read the OpenAPI document, which the API server updates a moment later.
        self.await_ready(
            "the CRDs in the OpenAPI document",
            Duration::from_secs(60),
            |lab| {
                ["networktuning", "nodetuning"]
                    .iter()
                    .all(|kind| lab.kubectl(&["explain", kind]).status.success())
            },
        )?;
        phase(self, "CRDs established");
        let rbac = self.render_chart_rbac()?;
        let mut objects = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n{rbac}\n"
        );
        for node in &self.nodes {
            objects.push_str("---\n");
            objects.push_str(&node_object(node));
        }
        self.kubectl_checked(&["apply", "-f", "-"], Some(&objects))?;
        phase(self, "namespace, RBAC and nodes applied");

        for (identity, account) in [
            (Identity::Operator, "hoststack-operator"),
            (Identity::Agent, "hoststack-agent"),
        ] {
            let token = self.kubectl_checked(
                &[
                    "create",
                    "token",
                    account,
                    "-n",
                    NAMESPACE,
                    "--duration=24h",
                ],
                None,
            )?;
            pki::write_kubeconfig(
                self.kubeconfig_of(identity),
                &self.api_url,
                &pki.ca_cert,
                account,
                pki::Credentials::Token(token.trim()),
            )?;
        }
        for node in &self.nodes {
            // Every lab node is a Node object without a kubelet (process and VM nodes), so the
            // token's Pod stays Pending and nothing runs it.
            match node.spec.kind {
                NodeKind::Process | NodeKind::Vm => {}
                // Real pools boot in boot_real_nodes and never get here.
                NodeKind::Kubelet => continue,
            }
            let name = node.spec.name.as_str();
            let pod = token_pod(name);
            self.kubectl_checked(&["apply", "-f", "-"], Some(&token_pod_object(name)))?;
            let token = self.kubectl_checked(
                &[
                    "create",
                    "token",
                    "hoststack-agent",
                    "-n",
                    NAMESPACE,
                    "--bound-object-kind=Pod",
                    &format!("--bound-object-name={pod}"),
                    "--duration=24h",
                ],
                None,
            )?;
            pki::write_kubeconfig(
                &self.agent_kubeconfig(name),
                &self.api_url,
                &pki.ca_cert,
                "hoststack-agent",
                pki::Credentials::Token(token.trim()),
            )?;
        }

        phase(self, "tokens minted");
        if self.config.start_operator {
            self.spawn_operator()?;
        }
        if self.config.start_agents {
            for node in self.node_names() {
                if self.node(&node).spec.kind == NodeKind::Process {
                    self.spawn_agent(&node, &[])?;
                }
            }
        }
        self.boot_vms()?;
        phase(self, "operator and agents started");
        Ok(())
    }

    /// Appends a line to the lab's own log, logs/lab.log.
    fn note(&self, line: &str) {
        use std::io::Write;
        let path = self.log_path("lab");
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }

    /// `helm template` of the chart's ServiceAccounts, RBAC and per-node write guard (the
    /// ValidatingAdmissionPolicy), with the built helm.
    fn render_chart_rbac(&self) -> Result<String> {
        let helm_home = self.dir.join("helm");
        let chart = self.repo.join("charts").join("hoststack");
        let mut helm = Command::new(&self.bins.helm);
        helm.args(["template", "hoststack"])
            .arg(&chart)
            .args(["--namespace", NAMESPACE])
            .args(["--show-only", "templates/serviceaccounts.yaml"])
            .args(["--show-only", "templates/rbac-operator.yaml"])
            .args(["--show-only", "templates/rbac-agent.yaml"])
            .args(["--show-only", "templates/node-write-guard.yaml"])
            .env("HELM_CACHE_HOME", helm_home.join("cache"))
            .env("HELM_CONFIG_HOME", helm_home.join("config"))
            .env("HELM_DATA_HOME", helm_home.join("data"));
        command::run(&mut helm, None)
    }

    fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Managed> {
        let log_name = name.replace(' ', "-");
        let log = self.dir.join("logs").join(format!("{log_name}.log"));
        let mut env = env.to_vec();
        env.push(("NO_COLOR".into(), "1".into()));
        if std::env::var_os("RUST_LOG").is_none() {
            env.push(("RUST_LOG".into(), "info".into()));
        }
        self.spawner
            .as_ref()
            .expect("spawner runs until teardown")
            .spawn(name, program, args, &env, &self.dir, log)
            .map_err(|e| Error::io(format!("starting {name} ({})", program.display()), e))
    }

    fn spawn_operator(&self) -> Result<()> {
        // The same identity across restarts, so a restarted operator takes its lease back at
        // once instead of waiting for it to expire.
        let pod_name = format!("hoststack-operator-lab{}-0", self.index);
        let operator = self.spawn_operator_process("operator", &pod_name)?;
        self.procs().operator = Some(operator);
        Ok(())
    }

    /// An operator process named `name` with leader-election identity `pod_name`.
    fn spawn_operator_process(&self, name: &str, pod_name: &str) -> Result<Managed> {
        let mut args = strings(&[
            "--namespace",
            NAMESPACE,
            "--agent-image",
            &self.config.agent_image,
        ]);
        // On the lab's own loopback address: the lab's operator on the port chosen at start
        // ([`Lab::operator_metrics_address`]), extra replicas on any free port.
        let addr = if name == "operator" {
            self.operator_metrics
        } else {
            SocketAddr::from((self.loopback_ip(), 0))
        }
        .to_string();
        args.extend(strings(&["--metrics-bind-address", &addr]));
        args.extend(self.config.operator_args.iter().cloned());
        let env = vec![
            kv("KUBECONFIG", self.kubeconfig_of(Identity::Operator)),
            kv("POD_NAME", pod_name),
        ];
        self.spawn(name, &self.bins.operator, &args, &env)
    }

    fn spawn_agent(&self, node: &str, extra: &[&str]) -> Result<()> {
        let n = self.node(node);
        let mut args = strings(&["netns", "exec", &n.netns]);
        args.push(self.bins.agent.display().to_string());
        args.extend(self.agent_flags(node, &n.state_dir, &self.agent_bpffs_root(node)));
        let runner = self.bins.userstack.display().to_string();
        args.extend(strings(&["--userstack-binary", &runner]));
        args.extend(strings(extra));
        let agent = self.spawn(
            &format!("agent {node}"),
            Path::new("ip"),
            &args,
            &self.agent_env(node),
        )?;
        self.procs().agents.insert(node.to_string(), agent);
        Ok(())
    }

    /// The flags every agent gets (a VM node's guest paths for state and bpffs differ).
    fn agent_flags(&self, node: &str, state_dir: &Path, bpffs_root: &Path) -> Vec<String> {
        let mut args = strings(&[
            "--node-name",
            node,
            "--proc-root",
            "/proc",
            "--sys-root",
            "/sys",
            "--state-dir",
            &state_dir.display().to_string(),
            "--metrics-bind-address",
            &SocketAddr::from((self.node(node).ip, AGENT_METRICS_PORT)).to_string(),
            "--bpffs-root",
            &bpffs_root.display().to_string(),
        ]);
        args.extend(self.config.agent_args.iter().cloned());
        args
    }

    /// The environment every agent gets.
    fn agent_env(&self, node: &str) -> Vec<(String, String)> {
        vec![
            kv("KUBECONFIG", self.agent_kubeconfig(node)),
            kv("NODE_NAME", node),
        ]
    }

    /// Prepares and starts every VM node's qemu (with the agent inside when agents are
    /// started), then waits until each guest is ready.
    fn boot_vms(&mut self) -> Result<()> {
        let mut launched = Vec::new();
        for i in 0..self.nodes.len() {
            if self.nodes[i].spec.kind != NodeKind::Vm {
                continue;
            }
            let node = self.nodes[i].spec.name.clone();
            let agent = self.config.start_agents.then(|| vm::AgentLaunch {
                program: self.bins.agent.clone(),
                args: self.agent_flags(
                    &node,
                    Path::new(vm::GUEST_STATE_DIR),
                    Path::new(vm::GUEST_BPFFS_ROOT),
                ),
                env: self.agent_env(&node),
            });
            let place = vm::Placement {
                lab_dir: &self.dir,
                index: self.index,
                position: i,
                node: &node,
                netns: &self.nodes[i].netns,
                ip: self.nodes[i].ip,
                gateway: network::bridge_ip(self.index),
            };
            let machine = vm::Vm::prepare(&place, agent.as_ref())?;
            // The guest's agent log, where diagnostics look for every agent's log.
            let _ = std::os::unix::fs::symlink(
                machine.agent_log(),
                self.log_path(&format!("agent-{node}")),
            );
            let qemu = self.spawn(
                &machine.process_name(),
                Path::new("ip"),
                &machine.launch_args(),
                &[],
            )?;
            self.procs().helpers.insert(machine.process_name(), qemu);
            self.note(&format!(
                "VM node {node}: kernel {} ready and initramfs built in {:.2}s",
                machine.kernel_release(),
                machine.prepared_in().as_secs_f64()
            ));
            self.nodes[i].vm = Some(machine);
            launched.push((i, Instant::now()));
        }
        for (i, started) in launched {
            let machine = self.nodes[i].vm.as_ref().expect("prepared above");
            let name = machine.process_name();
            let booted = machine.await_boot(started, VM_BOOT_TIMEOUT, || {
                self.procs()
                    .helpers
                    .get_mut(&name)
                    .map_or(Some("gone".to_string()), |p| {
                        p.exited().map(|s| s.to_string())
                    })
            })?;
            self.note(&format!(
                "VM node {}: guest ready {:.2}s after qemu started",
                self.nodes[i].spec.name,
                booted.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Polls `ready` until it holds; fails early when a control-plane process exits.
    fn await_ready(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&Lab) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(self) {
                return Ok(());
            }
            {
                let mut procs = self.procs();
                let Procs {
                    etcd, apiserver, ..
                } = &mut *procs;
                for p in [etcd, apiserver].into_iter().flatten() {
                    if let Some(error) = p.exited_while_waiting(what) {
                        return Err(error);
                    }
                }
            }
            if Instant::now() >= deadline {
                let mut logs = String::new();
                for log in ["etcd", "kube-apiserver"] {
                    let path = self.dir.join("logs").join(format!("{log}.log"));
                    logs.push_str(&format!("--- {log} ---\n{}\n", tail(&path, 20)));
                }
                return Err(Error::Setup(format!(
                    "timed out after {timeout:?} waiting for {what}\n{logs}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
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

    fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut errors = Vec::new();
        // Real nodes first: kubelets, containerd, pods, holders, cgroups, host sysctls.
        if let Some(mut pool) = self.real_nodes.take() {
            errors.extend(pool.teardown());
        }
        let procs = self.procs.get_mut().unwrap_or_else(PoisonError::into_inner);

        // VM nodes first: each guest stops its agent and powers off, then its taps go.
        for node in &self.nodes {
            if let Some(machine) = &node.vm {
                let qemu = procs.helpers.remove(&machine.process_name());
                errors.extend(machine.power_off(qemu));
            }
        }
        // Operator and agents first, all at once, while the API server still answers them.
        let mut workload: Vec<Managed> = procs.operator.take().into_iter().collect();
        workload.extend(std::mem::take(&mut procs.replicas).into_values());
        workload.extend(std::mem::take(&mut procs.helpers).into_values());
        workload.extend(std::mem::take(&mut procs.agents).into_values());
        for p in &mut workload {
            let _ = p.signal(Signal::Term);
        }
        let deadline = Instant::now() + GRACE;
        for p in &mut workload {
            let left = deadline.saturating_duration_since(Instant::now());
            if p.wait_timeout(left).is_none() {
                if let Err(e) = p.kill() {
                    errors.push(e);
                }
            }
        }
        // Then the API server, then etcd (the API server hangs in shutdown without etcd).
        for p in [procs.apiserver.take(), procs.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut p = p;
            if let Err(e) = p.stop(GRACE) {
                errors.push(e);
            }
        }
        // Anything else marked with this lab (e.g. a child of a killed agent).
        let strays = crate::process::kill_processes_of(&self.dir);
        if strays > 0 {
            errors.push(format!("killed {strays} stray lab processes"));
        }
        // Unmounting the lab's bpffs drops every pin, detaching the agents' XDP programs.
        errors.extend(bpffs::unmount(&self.dir));
        errors.extend(network::remove(self.index));
        // No process of this lab runs any more: the spawner thread may go.
        self.spawner.take();

        let keep = std::env::var("HOSTSTACK_KEEP_LAB").is_ok_and(|v| v == "1");
        if keep {
            let kept = self.dir.with_file_name(format!(
                "kept-lab-{}-{}",
                self.index,
                crate::process::unix_time()
            ));
            match std::fs::rename(&self.dir, &kept) {
                Ok(()) => {
                    let _ = std::fs::remove_file(kept.join("owner"));
                    eprintln!(
                        "hoststack-lab: kept the lab directory at {}",
                        kept.display()
                    );
                }
                Err(e) => errors.push(format!("keeping {}: {e}", self.dir.display())),
            }
        } else if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            errors.push(format!("removing {}: {e}", self.dir.display()));
        }
        errors
    }

    fn procs(&self) -> MutexGuard<'_, Procs> {
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.spec.name == name)
            .unwrap_or_else(|| panic!("the lab has no node {name:?}"))
    }

    // ---- What the lab is -------------------------------------------------------------------

    /// The lab index k: the lab's subnet is 198.18.k.0/24 and its names start with `hs<k>`.
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The lab directory: logs/, pki/, etcd/, nodes/<node>/state/, the kubeconfigs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's URL, `https://198.18.k.1:<port>`.
    pub fn api_url(&self) -> &str {
        &self.api_url
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
        &self.kubeconfigs[&identity]
    }

    /// The kubeconfig of `node`'s agent: a token of the agents' ServiceAccount bound to a Pod
    /// on that node, so it carries the node-name claim that the chart's write guard checks
    /// (as a DaemonSet pod's projected token does).
    pub fn agent_kubeconfig(&self, node: &str) -> PathBuf {
        self.dir.join(format!("agent-{node}.kubeconfig"))
    }

    /// Runs kubectl with `node`'s agent credentials ([`Lab::agent_kubeconfig`]).
    pub fn kubectl_as_agent_of(&self, node: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut kubectl = self.kubectl_command(Identity::Agent, args);
        kubectl.env("KUBECONFIG", self.agent_kubeconfig(node));
        command::output(&mut kubectl, stdin.map(str::as_bytes))
            .unwrap_or_else(|e| panic!("running kubectl: {e}"))
    }

    /// The node names, in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.spec.name.clone()).collect()
    }

    /// The network namespace of `node` (for `ip netns exec`).
    pub fn netns(&self, node: &str) -> &str {
        &self.node(node).netns
    }

    /// The address of `node`'s eth0.
    pub fn node_ip(&self, node: &str) -> Ipv4Addr {
        self.node(node).ip
    }

    /// Where `node`'s agent serves /metrics: the node's address, port [`AGENT_METRICS_PORT`]
    /// (reachable from the root namespace over the bridge).
    pub fn agent_metrics_address(&self, node: &str) -> SocketAddr {
        SocketAddr::from((self.node(node).ip, AGENT_METRICS_PORT))
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
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| Error::Setup(format!("helper {name}: empty command")))?;
        let helper = self.spawn(name, Path::new(program), &strings(args), &[])?;
        let pid = helper.pid();
        if let Some(mut old) = self.procs().helpers.insert(name.to_string(), helper) {
            let _ = old.kill();
        }
        Ok(pid)
    }

    /// Stops the helper `name` (SIGTERM, SIGKILL after a grace period); its exit status, or
    /// `None` when there is no such helper.
    pub fn stop_helper(&self, name: &str) -> Option<std::result::Result<ExitStatus, String>> {
        let mut helper = self.procs().helpers.remove(name)?;
        Some(helper.stop(GRACE))
    }

    /// Whether the helper `name` is still running.
    pub fn helper_running(&self, name: &str) -> bool {
        self.procs()
            .helpers
            .get_mut(name)
            .is_some_and(|h| h.exited().is_none())
    }

    /// The agent's `--bpffs-root` for `node`: its directory on the lab's bpffs
    /// (`<lab dir>/bpffs/<node>`), where it pins its XDP programs, links and maps.
    pub fn agent_bpffs_root(&self, node: &str) -> PathBuf {
        bpffs::agent_root(&self.dir, node)
    }

    /// Whether `node` is a VM node.
    pub fn is_vm(&self, node: &str) -> bool {
        self.node(node).spec.kind == NodeKind::Vm
    }

    /// The VM of VM node `node` (its command channel, console log, agent). Panics when `node`
    /// is not a VM node.
    pub fn vm(&self, node: &str) -> &vm::Vm {
        self.node(node)
            .vm
            .as_ref()
            .unwrap_or_else(|| panic!("{node} is not a running VM node"))
    }

    /// The agent's `--state-dir` for `node` (its journal lives here).
    pub fn agent_state_dir(&self, node: &str) -> &Path {
        &self.node(node).state_dir
    }

    /// The log file of a lab process: "etcd", "kube-apiserver", "operator" or "agent-<node>".
    pub fn log_path(&self, process: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{process}.log"))
    }

    /// The running lab processes as (name, pid): etcd, kube-apiserver, operator,
    /// "agent <node>".
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.procs()
            .all_mut()
            .filter_map(|p| p.exited().is_none().then(|| (p.name.clone(), p.pid())))
            .collect()
    }

    // ---- The API ---------------------------------------------------------------------------

    /// A kube client with admin credentials. Needs a tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(self.kubeconfig())
            .map_err(|e| Error::Kube(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|e| Error::Kube(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| Error::Kube(e.to_string()))
    }

    /// Runs kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(Identity::Admin, args, None)
    }

    /// `kubectl <args> -o json` with the admin kubeconfig, parsed; panics with kubectl's message
    /// when it fails (e.g. `&["get", "nodetuning", "node-a"]`).
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.kubectl(&all);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
    }

    /// Runs kubectl as `identity`, with `stdin` as its standard input.
    pub fn kubectl_as(&self, identity: Identity, args: &[&str], stdin: Option<&str>) -> Output {
        let mut kubectl = self.kubectl_command(identity, args);
        command::output(&mut kubectl, stdin.map(str::as_bytes))
            .unwrap_or_else(|e| panic!("running kubectl: {e}"))
    }

    /// `kubectl apply -f -` of `yaml` as admin: `Ok(stdout)`, or `Err(stderr)` with the API
    /// server's message when it rejects the object.
    pub fn apply_yaml(&self, yaml: &str) -> std::result::Result<String, String> {
        let out = self.kubectl_as(Identity::Admin, &["apply", "-f", "-"], Some(yaml));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Sets (`Some`) or removes (`None`) a label of a Node.
    pub fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        let label = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        self.kubectl_checked(&["label", "node", node, &label, "--overwrite"], None)
            .unwrap_or_else(|e| panic!("labelling node {node}: {e}"));
    }

    fn kubectl_command(&self, identity: Identity, args: &[&str]) -> Command {
        let mut kubectl = cmd(self.bins.kubectl.to_str().expect("UTF-8 path"), args);
        kubectl
            .env("KUBECONFIG", self.kubeconfig_of(identity))
            .env("KUBECACHEDIR", self.dir.join("kube-cache"));
        kubectl
    }

    fn kubectl_checked(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut kubectl = self.kubectl_command(Identity::Admin, args);
        command::run(&mut kubectl, stdin.map(str::as_bytes))
    }

    // ---- The nodes -------------------------------------------------------------------------

    /// Runs `argv` inside `node`'s network namespace (`ip netns exec`).
    pub fn exec_in_node(&self, node: &str, argv: &[&str]) -> Output {
        let mut exec = cmd("ip", &["netns", "exec", self.netns(node)]);
        exec.args(argv);
        command::output(&mut exec, None).unwrap_or_else(|e| panic!("exec in node {node}: {e}"))
    }

    /// The value of sysctl `key` (e.g. `net.ipv4.tcp_rmem`) as `node` sees it, read from
    /// /proc/sys inside its namespace, with runs of whitespace collapsed to one space
    /// ("4096 131072 6291456").
    pub fn sysctl(&self, node: &str, key: &str) -> String {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let out = self.exec_in_node(node, &["cat", &path]);
        assert!(
            out.status.success(),
            "reading {key} on {node}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Writes sysctl `key` = `value` inside `node`'s namespace (to set up a test's originals).
    pub fn write_sysctl(&self, node: &str, key: &str, value: &str) {
        let out = self.exec_in_node(node, &["sysctl", "-q", "-w", &format!("{key}={value}")]);
        assert!(
            out.status.success(),
            "writing {key}={value} on {node}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    // ---- The processes ---------------------------------------------------------------------

    /// The pid of `node`'s agent while it runs.
    pub fn agent_pid(&self, node: &str) -> Option<u32> {
        self.node(node);
        let mut procs = self.procs();
        let agent = procs.agents.get_mut(node)?;
        agent.exited().is_none().then(|| agent.pid())
    }

    /// Sends `signal` to `node`'s agent. For Kill, Term and Int it waits until the agent has
    /// exited (panicking after 10 s) and returns its exit status; for Stop and Cont it returns
    /// `None` at once. Panics if the agent is not running.
    pub fn kill_agent(&self, node: &str, signal: Signal) -> Option<ExitStatus> {
        self.node(node);
        let mut procs = self.procs();
        let agent = procs
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
        procs.agents.remove(node);
        Some(status)
    }

    /// Starts `node`'s agent (again) with the configured arguments plus `extra_args` (e.g.
    /// `["--step-delay", "500ms"]`). Panics if it is running.
    pub fn start_agent(&self, node: &str, extra_args: &[&str]) {
        assert!(
            self.agent_pid(node).is_none(),
            "the agent on {node} is already running"
        );
        self.spawn_agent(node, extra_args)
            .unwrap_or_else(|e| panic!("starting the agent on {node}: {e}"));
    }

    /// Stops the operator (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_operator(&self) {
        let operator = self.procs().operator.take();
        if let Some(mut operator) = operator {
            operator
                .stop(GRACE)
                .unwrap_or_else(|e| panic!("stopping the operator: {e}"));
        }
    }

    /// Starts the operator. Panics if it runs.
    pub fn start_operator(&self) {
        let running = self
            .procs()
            .operator
            .as_mut()
            .is_some_and(|p| p.exited().is_none());
        assert!(!running, "the operator is already running");
        self.spawn_operator()
            .unwrap_or_else(|e| panic!("starting the operator: {e}"));
    }

    /// Starts one more operator replica with leader-election identity `pod_name`: the lab
    /// operator's arguments and credentials, log `operator-<pod_name>`, listed by
    /// [`Lab::processes`] as "operator <pod_name>", stopped with the lab. Panics if a replica
    /// of that name runs.
    pub fn start_operator_replica(&self, pod_name: &str) {
        let running = self
            .procs()
            .replicas
            .get_mut(pod_name)
            .is_some_and(|p| p.exited().is_none());
        assert!(!running, "operator replica {pod_name} is already running");
        let replica = self
            .spawn_operator_process(&format!("operator {pod_name}"), pod_name)
            .unwrap_or_else(|e| panic!("starting operator replica {pod_name}: {e}"));
        self.procs().replicas.insert(pod_name.to_string(), replica);
    }

    /// Stops the operator replica `pod_name` (SIGTERM, then SIGKILL after 5 s), if it runs.
    pub fn stop_operator_replica(&self, pod_name: &str) {
        let replica = self.procs().replicas.remove(pod_name);
        if let Some(mut replica) = replica {
            replica
                .stop(GRACE)
                .unwrap_or_else(|e| panic!("stopping operator replica {pod_name}: {e}"));
        }
    }

    /// Stops and starts the operator (same leader-election identity).
    pub fn restart_operator(&self) {
        self.stop_operator();
        self.start_operator();
    }

    // ---- Waiting and diagnosing ------------------------------------------------------------

    /// Polls `check` every 250 ms until it returns `Some`, and returns that. After `timeout`
    /// it panics with `what` and [`Lab::diagnostics`].
    pub fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check() {
                return value;
            }
            if Instant::now() >= deadline {
                self.diagnosed.store(true, Ordering::Relaxed);
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.diagnostics()
                );
            }
            std::thread::sleep(POLL);
        }
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
    pub async fn wait_for_async<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check().await {
                return value;
            }
            if Instant::now() >= deadline {
                self.diagnosed.store(true, Ordering::Relaxed);
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.diagnostics()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// What to look at when a test fails: which processes run, the tails of the operator's and
    /// agents' logs, and `kubectl get networktunings,nodetunings -o yaml`.
    pub fn diagnostics(&self) -> String {
        let mut out = format!("==== hoststack lab {} ====\n", self.dir.display());
        {
            let mut procs = self.procs();
            for p in procs.all_mut() {
                let state = match p.exited() {
                    Some(status) => format!("exited ({status})"),
                    None => format!("running (pid {})", p.pid()),
                };
                out.push_str(&format!("{}: {state}\n", p.name));
            }
        }
        let mut logs = vec!["operator".to_string()];
        logs.extend(
            self.procs()
                .replicas
                .values()
                .map(|p| p.name.replace(' ', "-")),
        );
        logs.extend(self.nodes.iter().map(|n| format!("agent-{}", n.spec.name)));
        logs.extend(
            self.nodes
                .iter()
                .filter(|n| n.vm.is_some())
                .map(|n| format!("console-{}", n.spec.name)),
        );
        for log in logs {
            let path = self.log_path(&log);
            if path.exists() {
                out.push_str(&format!(
                    "---- {log}.log (tail) ----\n{}\n",
                    tail(&path, 40)
                ));
            }
        }
        let get = self.kubectl(&["get", "networktunings,nodetunings", "-o", "yaml"]);
        out.push_str(&format!(
            "---- kubectl get networktunings,nodetunings -o yaml ----\n{}{}",
            String::from_utf8_lossy(&get.stdout),
            String::from_utf8_lossy(&get.stderr)
        ));
        out
    }
}

/// Real (kubelet) nodes: see `kubelet` and docs/lab.md, Real nodes.
impl Lab {
    /// Boots a real pool once the API server is ready: controller-manager and scheduler, per
    /// node containerd (with the lab images) and a kubelet; returns when every Node is Ready.
    /// CRDs, namespace and RBAC are left to `helm install` ([`Lab::helm`]).
    fn boot_real_nodes(&mut self, api_port: u16) -> Result<()> {
        let started = Instant::now();
        let spawn = |name: &str, program: &Path, args: &[String], env: &[(String, String)]| {
            self.spawn(name, program, args, env)
        };
        let input = kubelet::PoolInput {
            index: self.index,
            lab_dir: &self.dir,
            repo: &self.repo,
            workload_bin: self
                .bins
                .agent
                .parent()
                .ok_or_else(|| Error::Setup("the agent has no directory".into()))?,
            control_plane_bin: self
                .bins
                .kubectl
                .parent()
                .ok_or_else(|| Error::Setup("kubectl has no directory".into()))?,
            pki_dir: &self.dir.join("pki"),
            api_url: &self.api_url,
            api: (network::bridge_ip(self.index), api_port),
            loopback: network::loopback_ip(self.index),
            nodes: self
                .nodes
                .iter()
                .enumerate()
                .map(|(position, n)| kubelet::NodeInput {
                    name: &n.spec.name,
                    netns: &n.netns,
                    ip: n.ip,
                    position,
                    labels: n
                        .spec
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                })
                .collect(),
            spawn: &spawn,
        };
        let pool = kubelet::Pool::start(&input)?;
        self.real_nodes = Some(pool);
        self.note(&format!(
            "{:>6.2}s images built and imported, kubelets started",
            started.elapsed().as_secs_f64()
        ));
        let names = self.node_names();
        self.await_ready("every real Node Ready", Duration::from_secs(120), |lab| {
            names.iter().all(|name| {
                let out = lab.kubectl(&[
                    "get",
                    "node",
                    name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                out.status.success() && out.stdout == b"True"
            })
        })?;
        self.note(&format!(
            "{:>6.2}s every real Node Ready",
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// The chart's directory, charts/hoststack.
    pub fn chart_dir(&self) -> PathBuf {
        self.repo.join("charts").join("hoststack")
    }

    /// Writes `values-lab.yaml` in the lab directory: the chart's values for a real pool (the
    /// image every node imported, [`crate::LAB_IMAGE`], never pulled) plus `extra` (YAML
    /// appended as is); its path.
    pub fn lab_chart_values(&self, extra: &str) -> PathBuf {
        let (repository, tag) = kubelet::LAB_IMAGE
            .rsplit_once(':')
            .expect("the lab image has a tag");
        let path = self.dir.join("values-lab.yaml");
        let values = format!(
            "image:\n  repository: {repository}\n  tag: {tag}\n  pullPolicy: Never\n{extra}"
        );
        std::fs::write(&path, values).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Runs the lab's helm with the admin kubeconfig and helm's state under the lab directory
    /// (e.g. `&["install", "hoststack", chart, "-n", NAMESPACE, "--create-namespace"]`).
    pub fn helm(&self, args: &[&str]) -> Output {
        let helm_home = self.dir.join("helm");
        let mut helm = cmd(self.bins.helm.to_str().expect("UTF-8 path"), args);
        helm.env("KUBECONFIG", self.kubeconfig())
            .env("HELM_CACHE_HOME", helm_home.join("cache"))
            .env("HELM_CONFIG_HOME", helm_home.join("config"))
            .env("HELM_DATA_HOME", helm_home.join("data"));
        command::output(&mut helm, None).unwrap_or_else(|e| panic!("running helm: {e}"))
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

/// The Node object of a process node.
fn node_object(node: &Node) -> String {
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), node.spec.name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.extend(node.spec.labels.clone());
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.spec.name,
            "labels": labels,
            "annotations": {"hoststack.dev/lab-node-kind": match node.spec.kind {
                NodeKind::Process => "process",
                NodeKind::Vm => "vm",
                NodeKind::Kubelet => "kubelet",
            }},
        },
    });
    // JSON is YAML.
    format!("{object}\n")
}

/// Name of the Pod that `node`'s agent token is bound to.
fn token_pod(node: &str) -> String {
    format!("hoststack-agent-token-{node}")
}

/// A Pod on `node` that only anchors its agent's bound token: the API server puts the node's
/// name into tokens bound to a Pod with a nodeName. No kubelet runs it (an image that never
/// pulls, every taint tolerated so that no controller evicts it).
fn token_pod_object(node: &str) -> String {
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": token_pod(node), "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "hoststack-agent",
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{
                "name": "token-anchor",
                "image": "hoststack.invalid/token-anchor",
                "imagePullPolicy": "Never"
            }]
        }
    });
    // JSON is YAML.
    format!("{object}\n")
}

/// A free TCP port on `ip`.
fn free_port(ip: Ipv4Addr) -> Result<u16> {
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| Error::io(format!("finding a free port on {ip}"), e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("reading a local address", e))
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io(format!("creating {}", path.display()), e))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn kv(key: &str, value: impl AsRef<std::ffi::OsStr>) -> (String, String) {
    (
        key.to_string(),
        value.as_ref().to_string_lossy().into_owned(),
    )
}

/// One lab at a time per process: labs are heavy (an API server each) on small machines, and
/// tests that share a process would otherwise start theirs all at once.
struct Slot;

static BUSY: Mutex<bool> = Mutex::new(false);
static FREED: Condvar = Condvar::new();

impl Slot {
    fn acquire() -> Slot {
        let mut busy = BUSY.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            busy = FREED.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        *busy = true;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *BUSY.lock().unwrap_or_else(PoisonError::into_inner) = false;
        FREED.notify_one();
    }
}
