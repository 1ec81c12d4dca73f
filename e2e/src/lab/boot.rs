//! How a [`Lab`] comes up from its rooms and goes down again. [`Lab::assemble`] checks the
//! configuration and claims a lab directory and index; [`Lab::boot`] then runs the start-up
//! steps in order (each noted in `logs/lab.log`), and [`Lab::teardown`] undoes whatever boot
//! got to, in reverse: real and VM nodes, workloads, control plane, stray processes, bpffs,
//! network, directory.

use super::binaries::{repo_root, Binaries};
use super::control_plane::kubeconfigs::{Identity, Kubeconfigs, NAMESPACE};
use super::control_plane::pki::{self, Pki};
use super::control_plane::ControlPlane;
use super::kubectl::Kubectl;
use super::nodes::Nodes;
use super::slot::Slot;
use super::vm_nodes::VmNodes;
use super::wait::LabLog;
use super::workloads::{Launch, Workloads};
use super::{bpffs, kubelet, network, sweep, Lab};
use crate::config::{LabConfig, NodeKind};
use crate::process::{kill_processes_of, Spawner};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

impl Lab {
    /// A lab with every room in place and nothing started: the configuration checked, a lab
    /// directory and index claimed (stale labs swept first), the binaries located.
    pub(super) fn assemble(config: LabConfig) -> Result<Lab> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Setup(
                "the lab needs root (network namespaces, veths, a bridge)".into(),
            ));
        }
        config.check().map_err(Error::Setup)?;
        let slot = Slot::acquire();
        let bins = Binaries::locate(
            config.start_operator || config.start_agents || config.is_real_pool(),
        )?;
        let (index, dir, warnings) = sweep::allocate()?;
        for warning in warnings {
            eprintln!("hoststack-lab: while sweeping stale labs: {warning}");
        }
        let kubeconfigs = Kubeconfigs::in_dir(&dir);
        // A free port, kept across operator restarts (a fixed one could be a host service's).
        let loopback = network::loopback_ip(index);
        let operator_metrics = SocketAddr::from((loopback, network::free_port(loopback)?));
        let workloads = Workloads::new(Launch {
            index,
            lab_dir: dir.clone(),
            operator: bins.operator.clone(),
            agent: bins.agent.clone(),
            userstack: bins.userstack.clone(),
            operator_args: config.operator_args.clone(),
            agent_args: config.agent_args.clone(),
            record_writes: config.record_writes,
            agent_image: config.agent_image.clone(),
            operator_metrics,
            loopback,
            kubeconfigs: kubeconfigs.clone(),
        });
        Ok(Lab {
            index,
            log: LabLog::in_dir(&dir),
            spawner: Spawner::new(&dir)?,
            kubectl: Kubectl::new(
                &bins.kubectl,
                &bins.helm,
                &dir,
                kubeconfigs.of(Identity::Admin),
            ),
            control_plane: ControlPlane::new(&dir),
            nodes: Nodes::plan(index, &dir, &config.nodes),
            vm_nodes: VmNodes::new(config.vm_boot_timeout),
            real_nodes: None,
            workloads,
            kubeconfigs,
            operator_metrics,
            repo: repo_root(),
            dir,
            config,
            bins,
            torn_down: false,
            diagnosed: AtomicBool::new(false),
            _slot: slot,
        })
    }

    /// Starts the lab, step by step.
    pub(super) fn boot(&mut self) -> Result<()> {
        let started = Instant::now();
        let phase = |lab: &Lab, what: &str| lab.log.phase(started, what);
        self.make_directories()?;
        self.nodes.create()?;
        phase(self, "network");
        let pki = pki::generate(&self.dir.join("pki"), &[network::bridge_ip(self.index)])?;
        phase(self, "pki");
        self.start_etcd()?;
        phase(self, "etcd serving");
        self.start_apiserver(&pki)?;
        phase(self, "kube-apiserver ready");
        if self.config.is_real_pool() {
            return self.start_real_nodes();
        }
        self.install_crds()?;
        phase(self, "CRDs established");
        self.apply_namespace_rbac_and_nodes()?;
        phase(self, "namespace, RBAC and nodes applied");
        self.mint_tokens(&pki)?;
        phase(self, "tokens minted");
        self.await_write_guards()?;
        phase(self, "write guards enforced");
        self.start_workloads()?;
        phase(self, "operator and agents started");
        Ok(())
    }

    /// The lab directory's parts, and the lab's bpffs: mounted before any agent starts, so that
    /// every agent's mount namespace shares it.
    fn make_directories(&self) -> Result<()> {
        for sub in ["logs", "etcd", "apiserver", "kube-cache", "helm"] {
            let path = self.dir.join(sub);
            std::fs::create_dir_all(&path)
                .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        }
        bpffs::mount(&self.dir)
    }

    fn start_etcd(&mut self) -> Result<()> {
        let loopback = network::loopback_ip(self.index);
        self.control_plane
            .start_etcd(&self.spawner, &self.bins.etcd, loopback)
    }

    /// Starts the API server and waits until it is ready, with the admin kubeconfig written.
    fn start_apiserver(&mut self, pki: &Pki) -> Result<()> {
        let bridge = network::bridge_ip(self.index);
        self.control_plane.start_apiserver(
            &self.spawner,
            &self.bins.kube_apiserver,
            bridge,
            pki,
            &self.config.apiserver_args,
        )?;
        self.kubeconfigs
            .write_admin(self.control_plane.api_url(), pki)?;
        self.await_apiserver()
    }

    /// Waits until the API server answers /readyz.
    pub(super) fn await_apiserver(&self) -> Result<()> {
        let kubectl = &self.kubectl;
        self.control_plane
            .await_ready("kube-apiserver /readyz", Duration::from_secs(90), || {
                kubectl.get_raw("/readyz").is_ok()
            })
    }

    /// Applies the CRDs and waits until they are established and in the OpenAPI document.
    fn install_crds(&self) -> Result<()> {
        let crds = self.repo.join("crds");
        let crds = crds.to_str().expect("UTF-8 path");
        self.kubectl
            .run(&["apply", "--server-side", "-f", crds], None)?;
        self.kubectl.run(
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
        // read the OpenAPI document (v3, the group's part), which the API server updates a
        // moment later.
        self.control_plane.await_ready(
            "the CRDs in the OpenAPI document",
            Duration::from_secs(60),
            || {
                self.kubectl
                    .get_raw("/openapi/v3/apis/hoststack.dev/v1alpha1")
                    .is_ok_and(|doc| {
                        ["NetworkTuning", "NodeTuning"]
                            .iter()
                            .all(|kind| doc.contains(&format!("dev.hoststack.v1alpha1.{kind}\"")))
                    })
            },
        )
    }

    /// Applies the namespace, the chart's ServiceAccounts, RBAC and write guard, and the Node
    /// objects.
    fn apply_namespace_rbac_and_nodes(&self) -> Result<()> {
        let rbac = self
            .kubectl
            .render_chart_rbac(&self.chart_dir(), NAMESPACE)?;
        let objects = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n---\n{rbac}\n{}",
            self.nodes.objects()
        );
        self.kubectl.run(&["apply", "-f", "-"], Some(&objects))?;
        Ok(())
    }

    /// Waits until the API server enforces the chart's ValidatingAdmissionPolicies. It loads a
    /// new policy and binding a moment after they are stored (from its informers), and until
    /// then lets through what they would refuse. Each is probed with a server-side dry run that
    /// only it refuses: an unbound agent token creating a heartbeat Lease (the write guard), the
    /// admin creating a NodeTuning with a config (the spec guard), and the operator's merge
    /// patch of a label other than its own on the first Node (the operator's node guard).
    fn await_write_guards(&self) -> Result<()> {
        let lease = format!(
            "{{\"apiVersion\":\"coordination.k8s.io/v1\",\"kind\":\"Lease\",\"metadata\":{{\"name\":\"hoststack-agent-guard-probe\",\"namespace\":\"{NAMESPACE}\"}}}}"
        );
        let spec = r#"{"apiVersion":"hoststack.dev/v1alpha1","kind":"NodeTuning","metadata":{"name":"guard-probe"},"spec":{"tuning":"probe","revision":"probe","config":{}}}"#;
        let probes = [
            ("hoststack-agent-own-node", Identity::Agent, lease.as_str()),
            ("hoststack-node-spec-guard", Identity::Admin, spec),
        ];
        for (policy, identity, object) in probes {
            let refusal = format!("ValidatingAdmissionPolicy '{policy}'");
            let kubeconfig = self.kubeconfigs.of(identity);
            self.control_plane.await_ready(
                &format!("the API server to enforce {refusal}"),
                Duration::from_secs(60),
                || {
                    let out = self.kubectl.output_as(
                        kubeconfig,
                        &["create", "--dry-run=server", "-f", "-"],
                        Some(object),
                    );
                    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains(&refusal)
                },
            )?;
        }
        // One PATCH and nothing else, as the operator writes: `kubectl patch` GETs the Node
        // first, which the operator's RBAC refuses before any policy is asked.
        if let Some(node) = self.nodes.names().first() {
            let refusal = "ValidatingAdmissionPolicy 'hoststack-operator-node-label'";
            let kubeconfig = self.kubeconfigs.of(Identity::Operator);
            let params = PatchParams {
                dry_run: true,
                field_manager: Some("hoststack-lab-guard-probe".into()),
                ..PatchParams::default()
            };
            let label =
                serde_json::json!({"metadata": {"labels": {"hoststack.dev/guard-probe": "true"}}});
            self.control_plane.await_ready(
                &format!("the API server to enforce {refusal}"),
                Duration::from_secs(60),
                || {
                    let answer = self.kubectl.patch_as::<Node>(
                        kubeconfig,
                        node,
                        &params,
                        &Patch::Merge(&label),
                    );
                    matches!(answer, Ok(Err(why)) if why.contains(refusal))
                },
            )?;
        }
        Ok(())
    }

    /// Writes the operator's and agents' kubeconfigs, and every process and VM node's agent's.
    fn mint_tokens(&self, pki: &Pki) -> Result<()> {
        let api_url = self.control_plane.api_url();
        self.kubeconfigs
            .mint_service_accounts(&self.kubectl, api_url, &pki.ca_cert)?;
        for node in self.nodes.iter() {
            // Every node here is a Node object without a kubelet (process and VM nodes), so
            // the token's Pod stays Pending and nothing runs it.
            match node.spec.kind {
                NodeKind::Process | NodeKind::Vm => {}
                // Real pools boot in start_real_nodes and never get here.
                NodeKind::Kubelet => continue,
            }
            self.kubeconfigs.mint_agent_of(
                &node.spec.name,
                &self.kubectl,
                api_url,
                &pki.ca_cert,
            )?;
        }
        Ok(())
    }

    /// Starts the operator and the process nodes' agents (as configured), and boots the VM
    /// nodes (with their agents, as configured).
    fn start_workloads(&mut self) -> Result<()> {
        if self.config.start_operator {
            self.workloads.spawn_operator(&self.spawner)?;
        }
        if self.config.start_agents {
            for node in self.nodes.iter() {
                if node.spec.kind == NodeKind::Process {
                    self.workloads.spawn_agent(&self.spawner, node, &[])?;
                }
            }
        }
        let agents = self.config.start_agents.then_some(&self.workloads);
        self.vm_nodes.boot(
            &self.dir,
            self.index,
            &self.nodes,
            agents,
            &self.spawner,
            &self.log,
        )
    }

    /// Boots a real pool once the API server is ready: controller-manager and scheduler, per
    /// node containerd (with the lab images) and a kubelet; returns when every Node is Ready.
    /// CRDs, namespace and RBAC are left to `helm install` ([`Lab::helm`]).
    fn start_real_nodes(&mut self) -> Result<()> {
        let started = Instant::now();
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
            api_url: self.control_plane.api_url(),
            api: (
                network::bridge_ip(self.index),
                self.control_plane.api_port(),
            ),
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
            spawner: &self.spawner,
        };
        let pool = kubelet::Pool::start(&input)?;
        self.real_nodes = Some(pool);
        self.log
            .phase(started, "images built and imported, kubelets started");
        let names = self.node_names();
        self.control_plane.await_ready(
            "every real Node Ready",
            Duration::from_secs(120),
            || {
                names.iter().all(|name| {
                    let out = self.kubectl.output(&[
                        "get",
                        "node",
                        name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ]);
                    out.status.success() && out.stdout == b"True"
                })
            },
        )?;
        self.log.phase(started, "every real Node Ready");
        Ok(())
    }

    /// Stops everything and removes what the lab made; the steps that failed. Runs once.
    pub(super) fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut errors = Vec::new();
        // Real nodes first: kubelets, containerd, pods, holders, cgroups, host sysctls.
        if let Some(mut pool) = self.real_nodes.take() {
            errors.extend(pool.teardown());
        }
        // VM nodes next: each guest stops its agent and powers off, then its taps go.
        errors.extend(self.vm_nodes.power_off());
        // Operator and agents, all at once, while the API server still answers them.
        errors.extend(self.workloads.stop());
        // Then the API server, then etcd.
        errors.extend(self.control_plane.stop());
        // Anything else marked with this lab (e.g. a child of a killed agent).
        let strays = kill_processes_of(&self.dir);
        if strays > 0 {
            errors.push(format!("killed {strays} stray lab processes"));
        }
        errors.extend(bpffs::unmount(&self.dir));
        errors.extend(network::remove(self.index));
        // No process of this lab runs any more: the spawner thread may go.
        self.spawner.stop();
        errors.extend(sweep::release(self.index, &self.dir));
        errors
    }
}
