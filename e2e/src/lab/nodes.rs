//! The lab's nodes as the lab sees them, whatever their kind: name, kind and labels, network
//! namespace, address and the agent's state directory. Every node is a network namespace
//! joined to the lab bridge; process and VM nodes are Node objects the lab applies (real nodes
//! register themselves through their kubelet, see [`super::kubelet`]).

use super::network;
use crate::config::{NodeKind, NodeSpec};
use crate::vm;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// One node of the lab.
pub(crate) struct Node {
    /// What was asked for.
    pub spec: NodeSpec,
    /// Its network namespace, `hs<k>-<node>`.
    pub netns: String,
    /// Its eth0 address, 198.18.k.(10+i).
    pub ip: Ipv4Addr,
    /// The root-side veth of its eth0, `hs<k>n<i>`, a port of the lab bridge.
    pub uplink_peer: String,
    /// The agent's state directory on the host, `<lab dir>/nodes/<node>/state` (a VM node's is
    /// in its share, `<lab dir>/nodes/<node>/vm/state`).
    pub state_dir: PathBuf,
}

/// `node`'s agent's write log, `writes.jsonl` beside its state directory (a VM node's is in its
/// share, where the guest's agent writes it), so that a fault which makes the state directory
/// unwritable leaves it alone.
pub fn write_log(node: &Node) -> PathBuf {
    node.state_dir.with_file_name("writes.jsonl")
}

/// The agent's state directory of a node of `kind` whose node directory is `node_dir`, on the
/// host: a VM node's is in its share ([`vm::host_state_dir`]).
fn state_dir(node_dir: &Path, kind: NodeKind) -> PathBuf {
    match kind {
        NodeKind::Vm => vm::host_state_dir(node_dir),
        NodeKind::Process | NodeKind::Kubelet => node_dir.join("state"),
    }
}

/// The nodes of one lab, in configuration order.
pub(crate) struct Nodes {
    index: u8,
    nodes: Vec<Node>,
}

impl Nodes {
    /// The nodes `specs` of lab k in `lab_dir`: node i gets address 198.18.k.(10+i).
    pub fn plan(index: u8, lab_dir: &Path, specs: &[NodeSpec]) -> Nodes {
        let nodes = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| Node {
                spec: spec.clone(),
                netns: network::netns_name(index, &spec.name),
                ip: network::node_ip(index, i),
                uplink_peer: network::veth_name(index, i),
                state_dir: state_dir(&lab_dir.join("nodes").join(&spec.name), spec.kind),
            })
            .collect();
        Nodes { index, nodes }
    }

    /// Makes every node's state directory, the lab bridge and every node's namespace with its
    /// veth pair.
    pub fn create(&self) -> Result<()> {
        for node in &self.nodes {
            std::fs::create_dir_all(&node.state_dir)
                .map_err(|e| Error::io(format!("creating {}", node.state_dir.display()), e))?;
        }
        network::create_bridge(self.index)?;
        for (i, node) in self.nodes.iter().enumerate() {
            network::add_node(self.index, i, &node.spec.name)?;
        }
        Ok(())
    }

    /// The node `name`; panics when the lab has none of that name.
    pub fn get(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.spec.name == name)
            .unwrap_or_else(|| panic!("the lab has no node {name:?}"))
    }

    /// The nodes in configuration order.
    pub fn iter(&self) -> std::slice::Iter<'_, Node> {
        self.nodes.iter()
    }

    /// The node names in configuration order.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.spec.name.clone()).collect()
    }

    /// The Node objects of every node, each after a `---` line (JSON, which is YAML).
    pub fn objects(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("---\n{}", node_object(&node.spec)))
            .collect()
    }
}

/// The Node object of a process or VM node.
fn node_object(spec: &NodeSpec) -> String {
    let mut labels = BTreeMap::new();
    labels.insert("kubernetes.io/hostname".to_string(), spec.name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.extend(spec.labels.clone());
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {"hoststack.dev/lab-node-kind": match spec.kind {
                NodeKind::Process => "process",
                NodeKind::Vm => "vm",
                NodeKind::Kubelet => "kubelet",
            }},
        },
    });
    // JSON is YAML.
    format!("{object}\n")
}
