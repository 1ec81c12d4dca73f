//! Which agents are alive, judged on the operator's own clock.
//!
//! Every agent renews its heartbeat Lease (`hoststack-agent-<node>`) while its watch loop goes
//! round. The Lease's `renewTime` is read from the agent's clock, and comparing it with the
//! operator's own would make a node whose clock runs behind never available (it is never
//! rolled onto) and one whose clock runs ahead look alive long after its agent died. So the
//! operator never compares the two: it notes, on its own monotonic clock, when it saw each
//! Lease's `renewTime` change (any change: a clock stepped back still renews), and a node is
//! alive while that was at most the Lease's `leaseDurationSeconds` ago — as Kubernetes' node
//! lifecycle controller judges kubelets' Leases by its own probe timestamps.
//!
//! A Lease seen for the first time counts as renewed then: after a restart of the operator,
//! every agent that has a Lease gets one lease duration to show it renews (the node lifecycle
//! controller's grace period does the same).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use hoststack_crds::AGENT_LEASE_PREFIX;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// When the operator saw each agent's Lease renewed, by node.
#[derive(Debug, Default)]
pub struct Heartbeats {
    seen: BTreeMap<String, Sighting>,
}

/// The last renewal of one Lease the operator saw.
#[derive(Debug)]
struct Sighting {
    /// The `renewTime` it showed (the agent's clock: only compared with itself).
    renew_time: Option<MicroTime>,
    /// When the operator saw that `renewTime` first (its own clock).
    changed_at: Instant,
}

impl Heartbeats {
    /// Notes `lease` as seen at `now`: a `renewTime` other than the one seen before (or a Lease
    /// not seen before) is a renewal at `now`. Anything that is not an agent's Lease is
    /// ignored.
    pub fn observe(&mut self, lease: &Lease, now: Instant) {
        let Some(node) = node_of(lease) else {
            return;
        };
        let renew_time = lease.spec.as_ref().and_then(|s| s.renew_time.clone());
        if self
            .seen
            .get(node)
            .is_some_and(|s| s.renew_time == renew_time)
        {
            return;
        }
        self.seen.insert(
            node.to_string(),
            Sighting {
                renew_time,
                changed_at: now,
            },
        );
    }

    /// The nodes whose agents are alive at `now`, of those with a Lease in `leases` (every
    /// agent Lease that exists now; the sightings of the others are forgotten). Each of them
    /// is observed first, so a renewal the watch has not shown yet counts from `now`.
    pub fn alive<'a>(
        &mut self,
        leases: impl IntoIterator<Item = &'a Lease>,
        now: Instant,
    ) -> BTreeSet<String> {
        let mut present = BTreeSet::new();
        let mut alive = BTreeSet::new();
        for lease in leases {
            let Some(node) = node_of(lease) else {
                continue;
            };
            self.observe(lease, now);
            present.insert(node.to_string());
            let seen = &self.seen[node];
            let valid = lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs);
            let fresh = valid.is_some_and(|valid| {
                seen.renew_time.is_some() && now.saturating_duration_since(seen.changed_at) <= valid
            });
            if fresh {
                alive.insert(node.to_string());
            }
        }
        self.seen.retain(|node, _| present.contains(node));
        alive
    }
}

/// The node whose agent's heartbeat `lease` is.
fn node_of(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .name
        .as_deref()?
        .strip_prefix(AGENT_LEASE_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::agent_lease_name;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::jiff::Timestamp;
    use kube::api::ObjectMeta;

    /// `name`'s Lease renewed at `renewed` (seconds since the epoch, on the agent's clock).
    fn lease(name: &str, renewed: Option<i64>, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                renew_time: renewed.map(|s| MicroTime(Timestamp::from_second(s).unwrap())),
                lease_duration_seconds: seconds,
                ..LeaseSpec::default()
            }),
        }
    }

    fn names(set: BTreeSet<String>) -> Vec<String> {
        set.into_iter().collect()
    }

    #[test]
    fn a_node_is_alive_while_the_operator_saw_its_lease_renewed_within_its_duration() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut heartbeats = Heartbeats::default();
        // a's clock is a day behind the operator's, b's a day ahead: it makes no difference.
        let day = 86_400;
        let now = 2_000_000_000;
        let a = |renewed: i64| lease(&agent_lease_name("a"), Some(renewed - day), Some(30));
        let b = |renewed: i64| lease(&agent_lease_name("b"), Some(renewed + day), Some(30));
        let others = [
            lease(&agent_lease_name("c"), None, Some(30)),
            lease(&agent_lease_name("d"), Some(now), None),
            lease("hoststack-operator", Some(now), Some(30)),
        ];
        let leases = |a_renewed, b_renewed| {
            let mut all = vec![a(a_renewed), b(b_renewed)];
            all.extend(others.iter().cloned());
            all
        };
        // First seen: alive for one lease duration (never renewed, or no duration: never).
        assert_eq!(
            names(heartbeats.alive(&leases(now, now), at(0))),
            ["a", "b"]
        );
        // a renews every 10 s; b's agent died at 0.
        heartbeats.observe(&a(now + 10), at(10));
        heartbeats.observe(&a(now + 20), at(20));
        assert_eq!(
            names(heartbeats.alive(&leases(now + 20, now), at(30))),
            ["a", "b"]
        );
        assert_eq!(
            names(heartbeats.alive(&leases(now + 20, now), at(31))),
            ["a"]
        );
        // a's clock is stepped back an hour: a different renewTime is still a renewal.
        assert_eq!(
            names(heartbeats.alive(&leases(now - 3_600, now), at(45))),
            ["a"]
        );
        assert_eq!(
            names(heartbeats.alive(&leases(now - 3_600, now), at(75))),
            ["a"]
        );
        // a's agent stops: a relist shows the same Lease again, which is no renewal.
        assert_eq!(
            names(heartbeats.alive(&leases(now - 3_600, now), at(76))),
            [] as [&str; 0]
        );
    }

    #[test]
    fn a_deleted_lease_is_forgotten() {
        let t0 = Instant::now();
        let mut heartbeats = Heartbeats::default();
        let a = lease(&agent_lease_name("a"), Some(1_000), Some(30));
        assert_eq!(names(heartbeats.alive([&a], t0)), ["a"]);
        assert!(heartbeats.alive([], t0 + Duration::from_secs(1)).is_empty());
        // The same Lease created again counts as a new sighting.
        let later = t0 + Duration::from_secs(100);
        assert_eq!(names(heartbeats.alive([&a], later)), ["a"]);
    }
}
