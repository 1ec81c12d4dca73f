//! What a lab consists of: its nodes and which hoststack processes it runs.

use std::collections::BTreeMap;
use std::time::Duration;

/// How a lab node is realised: a network namespace with the agent as a process, a real
/// kubelet in the namespace, or a VM with PCI devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeKind {
    /// A Node object without a kubelet, backed by a network namespace; the agent runs as a
    /// plain process inside that namespace (`ip netns exec`).
    #[default]
    Process,
    /// A qemu virtual machine (q35, TCG, an emulated Intel IOMMU, 2 NUMA nodes, a management
    /// NIC and a 4-queue data NIC) whose guest runs the agent; see `docs/vm-node.md`.
    Vm,
    /// A real Kubernetes node: containerd and a kubelet inside the node's network namespace
    /// (with a mount namespace of their own), pods placed by kube-scheduler; hoststack is
    /// installed with Helm, its agents run as DaemonSet pods. See `docs/lab.md`, Real nodes.
    Kubelet,
}

/// One node of the lab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name: a DNS label (lowercase letters, digits, '-'), at most 40 characters.
    pub name: String,
    /// Labels of the Node object.
    pub labels: BTreeMap<String, String>,
    /// How the node is realised.
    pub kind: NodeKind,
}

impl NodeSpec {
    /// A process node without labels.
    pub fn process(name: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            labels: BTreeMap::new(),
            kind: NodeKind::Process,
        }
    }

    /// A real (kubelet) node without labels.
    pub fn kubelet(name: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            labels: BTreeMap::new(),
            kind: NodeKind::Kubelet,
        }
    }

    /// A VM node without labels.
    pub fn vm(name: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            labels: BTreeMap::new(),
            kind: NodeKind::Vm,
        }
    }

    /// The same node with one more label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// What [`crate::Lab::start`] builds.
#[derive(Clone, Debug)]
pub struct LabConfig {
    /// The nodes, in order; node i gets address 198.18.k.(10+i).
    pub nodes: Vec<NodeSpec>,
    /// Start hoststack-operator in the root namespace.
    pub start_operator: bool,
    /// Start one hoststack-agent per node inside its namespace.
    pub start_agents: bool,
    /// Extra arguments for the operator (e.g. `--revert-timeout 10s`).
    pub operator_args: Vec<String>,
    /// Extra arguments for every agent (e.g. `--resync-interval 5s`).
    pub agent_args: Vec<String>,
    /// The image the operator puts into the agent DaemonSet (unused by process nodes).
    pub agent_image: String,
    /// Process nodes' agents log every host write and journal save ([`crate::Lab::write_log`]),
    /// for the fault harness.
    pub record_writes: bool,
    /// Extra flags for kube-apiserver (e.g. the inflight limits of a large cluster).
    pub apiserver_args: Vec<String>,
    /// How long one boot of a VM node's guest may take, from starting qemu until it is ready,
    /// before the lab power-cycles it ([`VM_BOOT_TIMEOUT`] by default).
    pub vm_boot_timeout: Duration,
}

/// A VM node's boot timeout by default: a guest is ready in about 12 s under TCG on an idle
/// host and 30 s beside two busy cores.
pub const VM_BOOT_TIMEOUT: Duration = Duration::from_secs(150);

impl LabConfig {
    /// `n` process nodes named node-a, node-b, ...; the last is labelled `pool=core`, the
    /// others `pool=edge` (a single node is `pool=edge`).
    pub fn with_nodes(n: usize) -> Self {
        let nodes = (0..n)
            .map(|i| {
                let pool = if n > 1 && i == n - 1 { "core" } else { "edge" };
                NodeSpec::process(node_name(i)).label("pool", pool)
            })
            .collect();
        LabConfig {
            nodes,
            start_operator: true,
            start_agents: true,
            operator_args: Vec::new(),
            agent_args: Vec::new(),
            agent_image: "ghcr.io/hoststack/hoststack:dev".to_string(),
            record_writes: false,
            apiserver_args: Vec::new(),
            vm_boot_timeout: VM_BOOT_TIMEOUT,
        }
    }

    /// `n` real nodes (kubelet and containerd in each namespace) named and labelled as by
    /// [`LabConfig::with_nodes`], without lab-run operator and agents: hoststack comes with
    /// `helm install` ([`crate::Lab::helm`]), its agents as DaemonSet pods.
    pub fn real_pool(n: usize) -> Self {
        let mut config = LabConfig::with_nodes(n).control_plane_only();
        for node in &mut config.nodes {
            node.kind = NodeKind::Kubelet;
        }
        config.agent_image = crate::lab::kubelet::LAB_IMAGE.to_string();
        config
    }

    /// The same configuration without operator and agents: control plane, nodes and
    /// namespaces only.
    pub fn control_plane_only(mut self) -> Self {
        self.start_operator = false;
        self.start_agents = false;
        self
    }

    /// Whether the nodes are real (kubelet) nodes.
    pub(crate) fn is_real_pool(&self) -> bool {
        self.nodes.iter().any(|n| n.kind == NodeKind::Kubelet)
    }

    /// Checks that a lab can be built from this: at most 200 nodes with valid, distinct names;
    /// either all of them real (kubelet) nodes, without lab-run operator and agents, or none.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for node in &self.nodes {
            validate_node_name(&node.name)?;
            if !names.insert(node.name.as_str()) {
                return Err(format!("node {} is listed twice", node.name));
            }
            match node.kind {
                NodeKind::Process | NodeKind::Vm => {}
                NodeKind::Kubelet => {
                    if self.start_operator || self.start_agents {
                        return Err(format!(
                            "node {}: real (kubelet) nodes get hoststack from `helm install`, \
                             not from lab-run operator and agents (use LabConfig::real_pool)",
                            node.name
                        ));
                    }
                }
            }
        }
        let kubelets = self
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Kubelet)
            .count();
        if kubelets != 0 && kubelets != self.nodes.len() {
            return Err("a lab's nodes are either all real (kubelet) nodes or none".into());
        }
        if self.nodes.len() > 200 {
            return Err("at most 200 nodes".into());
        }
        Ok(())
    }
}

impl Default for LabConfig {
    /// The standard lab: node-a and node-b (`pool=edge`), node-c (`pool=core`), operator and
    /// agents running.
    fn default() -> Self {
        LabConfig::with_nodes(3)
    }
}

/// node-a, node-b, ..., node-z, node-26, node-27, ...
fn node_name(i: usize) -> String {
    match u8::try_from(i) {
        Ok(i) if i < 26 => format!("node-{}", char::from(b'a' + i)),
        _ => format!("node-{i}"),
    }
}

/// Checks a node name: a DNS label short enough for our namespace names.
fn validate_node_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid node name {name:?}: use lowercase letters, digits and '-', at most 40"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_two_edge_nodes_and_one_core_node() {
        let config = LabConfig::default();
        let pools: Vec<(&str, &str)> = config
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.labels["pool"].as_str()))
            .collect();
        assert_eq!(
            pools,
            [("node-a", "edge"), ("node-b", "edge"), ("node-c", "core")]
        );
        assert!(config.start_operator && config.start_agents);
    }

    #[test]
    fn node_names_are_checked() {
        assert!(validate_node_name("node-a").is_ok());
        assert!(validate_node_name("Node").is_err());
        assert!(validate_node_name("-a").is_err());
        assert!(validate_node_name("a/b").is_err());
        assert!(validate_node_name(&"a".repeat(41)).is_err());
    }

    #[test]
    fn a_lab_is_all_real_nodes_without_lab_run_hoststack_or_none() {
        assert_eq!(LabConfig::default().check(), Ok(()));
        assert_eq!(LabConfig::real_pool(2).check(), Ok(()));
        let mut twice = LabConfig::with_nodes(1);
        twice.nodes.push(NodeSpec::process("node-a"));
        assert_eq!(twice.check(), Err("node node-a is listed twice".into()));
        let mut mixed = LabConfig::real_pool(2);
        mixed.nodes.push(NodeSpec::process("node-x"));
        assert!(mixed.check().unwrap_err().contains("all real"));
        let mut with_operator = LabConfig::real_pool(1);
        with_operator.start_operator = true;
        assert!(with_operator.check().unwrap_err().contains("helm install"));
        assert_eq!(
            LabConfig::with_nodes(201).check(),
            Err("at most 200 nodes".into())
        );
    }
}
