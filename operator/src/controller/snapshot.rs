//! The cluster as one reconcile sees it: the tunings, the nodes' labels, their NodeTunings,
//! whose agents are alive, who governs which node, the operator's own latest status
//! writes, and the clock, all read once at the start. What a reconcile decides is a pure
//! function of this (and of the revision history and the analysis verdict), so a test builds
//! one by hand.
//!
//! The rollout's progress lives in the tuning's status, and the cached tuning can lag the
//! operator's own last write of it: a reconcile triggered by a NodeTuning event right after a
//! RolledBack write would still see the wave in flight, and put the canary back on the failed
//! revision. [`Snapshot::newest`] is the tuning a reconcile plans from: the cached copy, with
//! the status of the operator's own last write instead when that write is newer (by
//! resourceVersion, [`hoststack_crds::resource_version`]). When the two cannot be ordered (a
//! resourceVersion that is not an integer) the cache wins, as before this rule.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hoststack_crds::{resource_version, NetworkTuning, NetworkTuningStatus, NodeTuning};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::selection::{assign, Assignment, NodeLabels};

/// The status the operator last wrote to a tuning, as the API server answered the write.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusWrite {
    /// The tuning's resourceVersion right after the write.
    pub resource_version: Option<String>,
    /// Its status then.
    pub status: NetworkTuningStatus,
}

impl StatusWrite {
    /// The record of a status write the API server answered with `written`.
    pub fn of(written: &NetworkTuning) -> Self {
        StatusWrite {
            resource_version: written.metadata.resource_version.clone(),
            status: written.status.clone().unwrap_or_default(),
        }
    }
}

/// The cluster as the caches saw it at `now`.
pub struct Snapshot {
    /// Every NetworkTuning, deleting ones included.
    pub tunings: Vec<Arc<NetworkTuning>>,
    /// Every node's name and labels.
    pub nodes: Vec<NodeLabels>,
    /// Every node's uid, by name.
    pub node_uids: BTreeMap<String, String>,
    /// Every NodeTuning, by node name.
    pub node_tunings: BTreeMap<String, Arc<NodeTuning>>,
    /// Which tuning governs which node.
    pub assignment: Assignment,
    /// Nodes whose agent is alive ([`super::heartbeats::Heartbeats::alive`]).
    pub alive: BTreeSet<String>,
    /// The operator's own latest status write to each tuning, by the tuning's uid.
    pub status_writes: BTreeMap<String, StatusWrite>,
    /// When the snapshot was taken.
    pub now: Time,
}

impl Snapshot {
    /// The snapshot of these objects at `now`, with the nodes whose agents are `alive`:
    /// selection decided.
    pub fn new(
        tunings: Vec<Arc<NetworkTuning>>,
        nodes: Vec<NodeLabels>,
        node_tunings: impl IntoIterator<Item = impl Into<Arc<NodeTuning>>>,
        alive: BTreeSet<String>,
        now: Timestamp,
    ) -> Self {
        let assignment = assign(tunings.iter().map(|t| t.as_ref()), &nodes);
        Self {
            node_tunings: node_tunings
                .into_iter()
                .map(|nt| {
                    let nt: Arc<NodeTuning> = nt.into();
                    (nt.name_any(), nt)
                })
                .collect(),
            alive,
            tunings,
            node_uids: nodes
                .iter()
                .map(|n| (n.name.clone(), n.uid.clone()))
                .collect(),
            nodes,
            assignment,
            status_writes: BTreeMap::new(),
            now: Time(now),
        }
    }

    /// The snapshot with the operator's own latest status writes, by tuning uid.
    pub fn with_status_writes(mut self, writes: BTreeMap<String, StatusWrite>) -> Self {
        self.status_writes = writes;
        self
    }

    /// `tuning` as a reconcile plans from it: the cached copy, or that copy with the status of
    /// the operator's own last write when the write is newer than the copy.
    pub fn newest<'a>(&self, tuning: &'a NetworkTuning) -> Cow<'a, NetworkTuning> {
        let Some(write) = tuning
            .metadata
            .uid
            .as_ref()
            .and_then(|uid| self.status_writes.get(uid))
        else {
            return Cow::Borrowed(tuning);
        };
        let cached = tuning.metadata.resource_version.as_deref();
        let written = write.resource_version.as_deref();
        match resource_version::compare(written, cached) {
            Some(Ordering::Greater) => {
                tracing::debug!(
                    tuning = %tuning.name_any(),
                    cached,
                    written,
                    "the cached tuning is older than the operator's own status write; planning from the write"
                );
                let mut newest = tuning.clone();
                newest.status = Some(write.status.clone());
                Cow::Owned(newest)
            }
            Some(Ordering::Equal | Ordering::Less) => Cow::Borrowed(tuning),
            None => {
                tracing::warn!(
                    tuning = %tuning.name_any(),
                    cached,
                    written,
                    "resourceVersions that are not integers (docs/install.md, Requirements); planning from the cache, which may lag the operator's own writes"
                );
                Cow::Borrowed(tuning)
            }
        }
    }

    /// Now, in whole seconds since the epoch (the planner's clock).
    pub fn now_secs(&self) -> u64 {
        u64::try_from(self.now.0.as_second()).unwrap_or(0)
    }
}

/// The cached NodeTunings, each replaced by the operator's own last write of it when that is
/// newer (by resourceVersion): a reconcile that planned from a cache lagging its own writes
/// wrote every such spec again. `writes` keeps only what is still newer than the cache (the
/// rest is forgotten, as is the write of a NodeTuning the cache no longer has: the cache
/// decides what exists).
pub fn newest_node_tunings(
    cached: Vec<Arc<NodeTuning>>,
    writes: &mut BTreeMap<String, Arc<NodeTuning>>,
) -> Vec<Arc<NodeTuning>> {
    let names: BTreeSet<String> = cached.iter().map(|nt| nt.name_any()).collect();
    writes.retain(|name, _| names.contains(name));
    cached
        .into_iter()
        .map(|nt| {
            let name = nt.name_any();
            let newer = writes.get(&name).filter(|w| {
                let (written, cached) = (
                    w.metadata.resource_version.as_deref(),
                    nt.metadata.resource_version.as_deref(),
                );
                let order = resource_version::compare(written, cached);
                if order.is_none() {
                    tracing::warn!(
                        node_tuning = %name,
                        cached,
                        written,
                        "resourceVersions that are not integers (docs/install.md, Requirements); planning from the cache, which may lag the operator's own writes"
                    );
                }
                order == Some(Ordering::Greater)
            });
            match newer {
                Some(w) => w.clone(),
                None => {
                    writes.remove(&name);
                    nt
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::Phase;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[tokio::test]
    async fn an_agent_whose_clock_is_behind_is_alive_when_it_renews() {
        // node-a's clock is an hour behind the operator's: its fresh renewal reads an hour old.
        let mut skewed = crate::controller::fixtures::heartbeat("node-a");
        let spec = skewed.spec.as_mut().unwrap();
        spec.lease_duration_seconds = Some(30);
        spec.renew_time = Some(MicroTime(
            Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1),
        ));
        let world = crate::controller::fixtures::World {
            heartbeats: vec![skewed],
            ..Default::default()
        };
        let (ctx, _api_server) = crate::controller::Context::test(world);
        assert_eq!(
            ctx.snapshot().alive.into_iter().collect::<Vec<_>>(),
            ["node-a"],
            "a renewal judged by the agent's clock"
        );
    }

    #[test]
    fn own_spec_writes_stand_in_for_a_lagging_cache_until_it_catches_up() {
        let nt = |name: &str, rv: &str, revision: &str| {
            let mut nt = NodeTuning::new(name, Default::default());
            nt.metadata.resource_version = Some(rv.into());
            nt.spec.revision = Some(revision.into());
            Arc::new(nt)
        };
        let revision_of = |nts: &[Arc<NodeTuning>], name: &str| {
            nts.iter()
                .find(|nt| nt.name_any() == name)
                .and_then(|nt| nt.spec.revision.clone())
        };
        let mut writes = BTreeMap::from([
            ("a".to_string(), nt("a", "20", "r2")),
            ("b".to_string(), nt("b", "15", "r2")),
            ("gone".to_string(), nt("gone", "30", "r2")),
        ]);
        let cached = vec![nt("a", "10", "r1"), nt("b", "15", "r2"), nt("c", "5", "r1")];
        let newest = newest_node_tunings(cached, &mut writes);
        // a: the own write is newer; b: the cache caught up; c: never written.
        assert_eq!(revision_of(&newest, "a").as_deref(), Some("r2"));
        assert_eq!(revision_of(&newest, "b").as_deref(), Some("r2"));
        assert_eq!(revision_of(&newest, "c").as_deref(), Some("r1"));
        assert_eq!(
            newest.len(),
            3,
            "a write the cache does not have adds nothing"
        );
        // Only a's write is still ahead of the cache.
        assert_eq!(writes.keys().collect::<Vec<_>>(), ["a"]);
        // Once the cache has a newer copy (another writer's), the cache wins.
        let newest = newest_node_tunings(vec![nt("a", "25", "r3")], &mut writes);
        assert_eq!(revision_of(&newest, "a").as_deref(), Some("r3"));
        assert!(writes.is_empty());
    }

    #[test]
    fn a_reconcile_plans_from_the_newer_of_the_cache_and_its_own_write() {
        let mut cached = NetworkTuning::new("edge", Default::default());
        cached.metadata.uid = Some("uid-edge".into());
        cached.metadata.resource_version = Some("10".into());
        cached.status = Some(status_of(Phase::Progressing));
        // (what, the write's uid, its resourceVersion, the phase planned from)
        let table = [
            ("no write", None, None, Phase::Progressing),
            (
                "a newer write",
                Some("uid-edge"),
                Some("12"),
                Phase::RolledBack,
            ),
            (
                "the write the cache holds",
                Some("uid-edge"),
                Some("10"),
                Phase::Progressing,
            ),
            (
                "a write the cache is past",
                Some("uid-edge"),
                Some("9"),
                Phase::Progressing,
            ),
            (
                "no order",
                Some("uid-edge"),
                Some("v12"),
                Phase::Progressing,
            ),
            ("no version", Some("uid-edge"), None, Phase::Progressing),
            (
                "another tuning of that name",
                Some("uid-old"),
                Some("12"),
                Phase::Progressing,
            ),
        ];
        for (what, uid, version, want) in table {
            let writes: BTreeMap<String, StatusWrite> = uid
                .map(|uid: &str| {
                    let write = StatusWrite {
                        resource_version: version.map(Into::into),
                        status: status_of(Phase::RolledBack),
                    };
                    (uid.to_string(), write)
                })
                .into_iter()
                .collect();
            let snap = Snapshot::new(
                Vec::new(),
                Vec::new(),
                Vec::<NodeTuning>::new(),
                BTreeSet::new(),
                Timestamp::from_second(1_000).unwrap(),
            )
            .with_status_writes(writes);
            let newest = snap.newest(&cached);
            assert_eq!(
                newest.status.as_ref().and_then(|s| s.phase),
                Some(want),
                "{what}"
            );
            // Only the status comes from the write: the rest is the cached copy.
            assert_eq!(newest.metadata, cached.metadata, "{what}");
        }
    }

    fn status_of(phase: Phase) -> NetworkTuningStatus {
        NetworkTuningStatus {
            phase: Some(phase),
            ..Default::default()
        }
    }
}
