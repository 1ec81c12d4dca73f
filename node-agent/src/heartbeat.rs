//! The agent's heartbeat: a Lease named `hoststack-agent-<node>` in the operator's namespace,
//! renewed every `--heartbeat-interval` and valid for three intervals. The operator counts a
//! node whose Lease has expired (or never existed) as unavailable and does not roll a revision
//! onto it. A Lease is a small object of its own, so a heartbeat never rewrites the NodeTuning
//! (whose every change wakes the operator).

use std::time::Duration;

use hoststack_crds::{agent_lease_name, AGENT_FIELD_MANAGER};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::Client;
use tokio::time::MissedTickBehavior;

/// How many intervals a heartbeat stays valid: two may be missed.
const VALID_INTERVALS: u32 = 3;

/// The Lease that says `node`'s agent was alive at `now`.
pub fn lease(node: &str, namespace: &str, interval: Duration, now: Timestamp) -> Lease {
    let valid = (interval * VALID_INTERVALS).as_secs().max(1);
    Lease {
        metadata: ObjectMeta {
            name: Some(agent_lease_name(node)),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_string()),
            lease_duration_seconds: Some(i32::try_from(valid).unwrap_or(i32::MAX)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// Renews the heartbeat forever; a failed renewal is logged and retried at the next tick.
pub async fn run(client: Client, namespace: String, node: String, interval: Duration) {
    let api = Api::<Lease>::namespaced(client, &namespace);
    let name = agent_lease_name(&node);
    let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        let lease = lease(&node, &namespace, interval, Timestamp::now());
        match api.patch(&name, &params, &Patch::Apply(&lease)).await {
            Ok(_) if failing => {
                tracing::info!(lease = %name, "heartbeat renewed again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(lease = %name, error = %e, "heartbeat not renewed");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_is_valid_for_three_intervals() {
        let now: Timestamp = "2026-11-30T02:00:00Z".parse().unwrap();
        let l = lease("node-a", "hoststack-system", Duration::from_secs(10), now);
        assert_eq!(l.metadata.name.as_deref(), Some("hoststack-agent-node-a"));
        assert_eq!(l.metadata.namespace.as_deref(), Some("hoststack-system"));
        let spec = l.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
        assert_eq!(spec.lease_duration_seconds, Some(30));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        let short = lease("n", "ns", Duration::from_millis(100), now);
        assert_eq!(short.spec.unwrap().lease_duration_seconds, Some(1));
    }
}
