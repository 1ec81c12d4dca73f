//! The cluster as one reconcile sees it: the tunings, the nodes' labels, their NodeTunings,
//! whose agents' heartbeats are valid, who governs which node, and the clock, all read once at
//! the start. What a reconcile decides is a pure function of this (and of the revision history
//! and the analysis verdict), so a test builds one by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hoststack_crds::{NetworkTuning, NodeTuning, AGENT_LEASE_PREFIX};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::selection::{assign, Assignment, NodeLabels};

/// The cluster as the caches saw it at `now`.
pub struct Snapshot {
    /// Every NetworkTuning, deleting ones included.
    pub tunings: Vec<Arc<NetworkTuning>>,
    /// Every node's name and labels.
    pub nodes: Vec<NodeLabels>,
    /// Every NodeTuning, by node name.
    pub node_tunings: BTreeMap<String, NodeTuning>,
    /// Which tuning governs which node.
    pub assignment: Assignment,
    /// Nodes whose agent's heartbeat Lease is valid at `now`.
    pub alive: BTreeSet<String>,
    /// When the snapshot was taken.
    pub now: Time,
}

impl Snapshot {
    /// The snapshot of these objects at `now`: selection decided, heartbeats judged.
    pub fn new<'a>(
        tunings: Vec<Arc<NetworkTuning>>,
        nodes: Vec<NodeLabels>,
        node_tunings: impl IntoIterator<Item = NodeTuning>,
        heartbeats: impl IntoIterator<Item = &'a Lease>,
        now: Timestamp,
    ) -> Self {
        let assignment = assign(tunings.iter().map(|t| t.as_ref()), &nodes);
        Self {
            node_tunings: node_tunings
                .into_iter()
                .map(|nt| (nt.name_any(), nt))
                .collect(),
            alive: heartbeats
                .into_iter()
                .filter_map(|lease| heartbeat_node(lease, now))
                .collect(),
            tunings,
            nodes,
            assignment,
            now: Time(now),
        }
    }

    /// Now, in whole seconds since the epoch (the planner's clock).
    pub fn now_secs(&self) -> u64 {
        u64::try_from(self.now.0.as_second()).unwrap_or(0)
    }
}

/// The node whose agent's heartbeat `lease` is, when it is valid at `now`.
fn heartbeat_node(lease: &Lease, now: Timestamp) -> Option<String> {
    let node = lease
        .metadata
        .name
        .as_deref()?
        .strip_prefix(AGENT_LEASE_PREFIX)?;
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let valid = i64::from(spec.lease_duration_seconds?);
    (now.as_second() <= renewed.as_second() + valid).then(|| node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::agent_lease_name;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;

    fn lease(name: &str, renewed: i64, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                lease_duration_seconds: seconds,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_node_is_alive_while_its_agents_lease_is_valid() {
        let now = Timestamp::from_second(1_000).unwrap();
        // (lease, alive at now)
        let table = [
            (lease(&agent_lease_name("a"), 990, Some(30)), Some("a")),
            (lease(&agent_lease_name("b"), 990, Some(10)), Some("b")),
            (lease(&agent_lease_name("c"), 960, Some(30)), None),
            (lease(&agent_lease_name("d"), 990, None), None),
            (lease("hoststack-operator", 999, Some(30)), None),
        ];
        for (lease, want) in &table {
            assert_eq!(
                heartbeat_node(lease, now).as_deref(),
                *want,
                "{:?}",
                lease.metadata.name
            );
        }
        let snap = Snapshot::new(
            Vec::new(),
            Vec::new(),
            Vec::new(),
            table.iter().map(|(l, _)| l),
            now,
        );
        assert_eq!(
            snap.alive.iter().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(snap.now_secs(), 1_000);
    }
}
