//! Which tuning governs which node: a pure function of the tunings and the nodes' labels.
//!
//! A node matched by several tunings is governed by the one with the highest priority, then the
//! oldest (creation time), then the smallest name, so that every operator replica and every
//! reconcile agrees. Tunings being deleted govern nothing.

use std::collections::BTreeMap;

use hoststack_crds::NetworkTuning;
use k8s_openapi::jiff::Timestamp;
use kube::core::SelectorExt;
use kube::ResourceExt;

/// A node as selection sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLabels {
    /// Node name.
    pub name: String,
    /// Its uid: its NodeTuning's owner, so that deleting the Node deletes the NodeTuning.
    pub uid: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The outcome of selection over all tunings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assignment {
    /// Node name → the tuning that governs it.
    pub governor: BTreeMap<String, String>,
}

/// How one tuning ranks against others for a node: higher priority first, then older, then name.
fn rank_key(
    tuning: &NetworkTuning,
) -> (
    i32,
    std::cmp::Reverse<Option<Timestamp>>,
    std::cmp::Reverse<String>,
) {
    (
        tuning.spec.priority,
        std::cmp::Reverse(tuning.metadata.creation_timestamp.as_ref().map(|t| t.0)),
        std::cmp::Reverse(tuning.name_any()),
    )
}

/// Whether `tuning` selects a node with these labels.
pub fn selects(tuning: &NetworkTuning, labels: &BTreeMap<String, String>) -> bool {
    tuning.spec.node_selector.to_selector().matches(labels)
}

/// Decides the governing tuning of every node that some live tuning selects.
pub fn assign<'a>(
    tunings: impl IntoIterator<Item = &'a NetworkTuning>,
    nodes: &[NodeLabels],
) -> Assignment {
    let live: Vec<&NetworkTuning> = tunings
        .into_iter()
        .filter(|t| t.metadata.deletion_timestamp.is_none())
        .collect();
    let governor = nodes
        .iter()
        .filter_map(|node| {
            live.iter()
                .filter(|t| selects(t, &node.labels))
                .max_by_key(|t| rank_key(t))
                .map(|t| (node.name.clone(), t.name_any()))
        })
        .collect();
    Assignment { governor }
}

/// The nodes a tuning matches, split into those it governs and those another tuning governs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TuningNodes {
    /// Matched nodes this tuning governs.
    pub governed: Vec<String>,
    /// Matched nodes governed by another tuning: (node, governing tuning).
    pub conflicts: Vec<(String, String)>,
}

impl Assignment {
    /// The nodes `tuning` matches, split by who governs them.
    pub fn nodes_of(&self, tuning: &NetworkTuning, nodes: &[NodeLabels]) -> TuningNodes {
        let name = tuning.name_any();
        let mut out = TuningNodes::default();
        for node in nodes.iter().filter(|n| selects(tuning, &n.labels)) {
            match self.governor.get(&node.name) {
                Some(g) if *g == name => out.governed.push(node.name.clone()),
                Some(g) => out.conflicts.push((node.name.clone(), g.clone())),
                // A deleting tuning matches but governs nothing.
                None => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{LabelValue, NetworkTuningSpec, NodeSelector};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn tuning(name: &str, priority: i32, created: i64, pool: &str) -> NetworkTuning {
        let mut t = NetworkTuning::new(
            name,
            NetworkTuningSpec {
                node_selector: NodeSelector {
                    match_labels: [("pool".to_string(), LabelValue(pool.to_string()))].into(),
                    ..Default::default()
                },
                priority,
                ..Default::default()
            },
        );
        t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        t
    }

    fn node(name: &str, pool: &str) -> NodeLabels {
        NodeLabels {
            name: name.into(),
            uid: format!("uid-{name}"),
            labels: [("pool".to_string(), pool.to_string())].into(),
        }
    }

    #[test]
    fn higher_priority_governs_then_older_then_name() {
        let nodes = [node("a", "edge"), node("b", "core")];
        let table = [
            // (tunings, expected governor of node a)
            (
                vec![tuning("x", 1, 100, "edge"), tuning("y", 2, 200, "edge")],
                "y",
            ),
            (
                vec![tuning("x", 5, 100, "edge"), tuning("y", 5, 200, "edge")],
                "x",
            ),
            (
                vec![tuning("y", 5, 100, "edge"), tuning("x", 5, 100, "edge")],
                "x",
            ),
        ];
        for (tunings, want) in table {
            let a = assign(&tunings, &nodes);
            assert_eq!(a.governor.get("a").map(String::as_str), Some(want));
            assert_eq!(a.governor.get("b"), None);
        }
    }

    #[test]
    fn loser_reports_conflicts_naming_node_and_winner() {
        let nodes = [node("a", "edge"), node("b", "edge")];
        let tunings = [tuning("low", 1, 1, "edge"), tuning("high", 9, 2, "edge")];
        let a = assign(&tunings, &nodes);
        let low = a.nodes_of(&tunings[0], &nodes);
        assert!(low.governed.is_empty());
        assert_eq!(
            low.conflicts,
            vec![("a".into(), "high".into()), ("b".into(), "high".into())]
        );
        assert_eq!(a.nodes_of(&tunings[1], &nodes).governed, vec!["a", "b"]);
    }

    #[test]
    fn deleting_tuning_governs_nothing_and_hands_nodes_on() {
        let nodes = [node("a", "edge")];
        let mut high = tuning("high", 9, 2, "edge");
        high.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(3).unwrap()));
        let tunings = [tuning("low", 1, 1, "edge"), high];
        let a = assign(&tunings, &nodes);
        assert_eq!(a.governor.get("a").map(String::as_str), Some("low"));
        assert!(a.nodes_of(&tunings[1], &nodes).governed.is_empty());
    }
}
