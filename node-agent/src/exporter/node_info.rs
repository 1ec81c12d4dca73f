//! `hoststack_node_info{tuning, revision, phase} = 1`: the node's part in a rollout, so that
//! PromQL can split any counter by rollout phase (`* on(node) group_left(phase) hoststack_node_info`).

use std::sync::Mutex;

use hoststack_crds::NodeTuning;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The labels of `hoststack_node_info`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeInfoLabels {
    /// The governing NetworkTuning (`spec.tuning`); empty when none governs the node.
    pub tuning: String,
    /// The revision the operator asks for (`spec.revision`, else the config's own revision);
    /// empty when none.
    pub revision: String,
    /// `spec.rolloutPhase`: canary, wave, stable or baseline; baseline when absent.
    pub phase: String,
}

impl NodeInfoLabels {
    /// The labels for the node's NodeTuning (`None`: there is none yet).
    pub fn of(object: Option<&NodeTuning>) -> Self {
        let spec = object.map(|o| &o.spec);
        NodeInfoLabels {
            tuning: spec.and_then(|s| s.tuning.clone()).unwrap_or_default(),
            revision: spec
                .and_then(|s| {
                    s.revision
                        .clone()
                        .or_else(|| s.config.as_ref().map(|c| c.revision()))
                })
                .unwrap_or_default(),
            phase: spec
                .and_then(|s| s.rollout_phase)
                .map_or("baseline", |p| p.as_str())
                .to_string(),
        }
    }
}

/// The `hoststack_node_info` gauge: exactly one series, 1.
#[derive(Debug)]
pub struct NodeInfo {
    family: Family<NodeInfoLabels, Gauge>,
    current: Mutex<Option<NodeInfoLabels>>,
}

impl NodeInfo {
    /// Registers the family in `registry`, with the labels of a node without a NodeTuning.
    pub fn register(registry: &mut Registry) -> Self {
        let family = Family::<NodeInfoLabels, Gauge>::default();
        registry.register(
            "node_info",
            "1, labelled with the node's tuning, revision and rollout phase (canary, wave, stable, baseline)",
            family.clone(),
        );
        let info = NodeInfo {
            family,
            current: Mutex::new(None),
        };
        info.set(NodeInfoLabels::of(None));
        info
    }

    /// Makes `labels` the one series (a no-op when they are the current ones).
    pub fn set(&self, labels: NodeInfoLabels) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref() == Some(&labels) {
            return;
        }
        self.family.get_or_create(&labels).set(1);
        if let Some(old) = current.replace(labels) {
            self.family.remove(&old);
        }
    }
}
