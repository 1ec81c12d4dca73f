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
    /// The governing NetworkTuning (`spec.governedBy`, else `spec.tuning`); empty when none
    /// governs the node. A node a tuning took over is labelled with it while it still runs the
    /// revision of the tuning it came from (the baseline of the takeover).
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
            tuning: spec
                .and_then(|s| s.governed_by.clone().or_else(|| s.tuning.clone()))
                .unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NodeConfig, NodeTuningSpec, RolloutPhase};

    fn encode(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn labels_from_the_spec() {
        let config = NodeConfig::default();
        let canary = NodeTuning::new(
            "node-a",
            NodeTuningSpec {
                tuning: Some("edge".into()),
                config: Some(config.clone()),
                rollout_phase: Some(RolloutPhase::Canary),
                ..NodeTuningSpec::default()
            },
        );
        let labels = NodeInfoLabels::of(Some(&canary));
        assert_eq!(labels.tuning, "edge");
        assert_eq!(labels.revision, config.revision());
        assert_eq!(labels.phase, "canary");
        let unphased = NodeTuning::new(
            "node-a",
            NodeTuningSpec {
                tuning: Some("edge".into()),
                revision: Some("r1".into()),
                ..NodeTuningSpec::default()
            },
        );
        let labels = NodeInfoLabels::of(Some(&unphased));
        assert_eq!(
            (labels.revision.as_str(), labels.phase.as_str()),
            ("r1", "baseline")
        );
    }

    #[test]
    fn exactly_one_series() {
        let mut registry = Registry::with_prefix("hoststack");
        let info = NodeInfo::register(&mut registry);
        assert!(encode(&registry)
            .contains("hoststack_node_info{tuning=\"\",revision=\"\",phase=\"baseline\"} 1"));
        info.set(NodeInfoLabels {
            tuning: "edge".into(),
            revision: "r2".into(),
            phase: "wave".into(),
        });
        let text = encode(&registry);
        assert_eq!(text.matches("hoststack_node_info{").count(), 1, "{text}");
        assert!(
            text.contains("hoststack_node_info{tuning=\"edge\",revision=\"r2\",phase=\"wave\"} 1")
        );
    }
}
