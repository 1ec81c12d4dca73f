//! The agent's heartbeat: a Lease named `hoststack-agent-<node>` in the operator's namespace,
//! renewed every `--heartbeat-interval` and valid for three intervals. The operator counts a
//! node whose Lease it has not seen renewed for that long (or that never existed) as
//! unavailable and does not roll a revision onto it. A Lease is a small object of its own, so a
//! heartbeat never rewrites the NodeTuning (whose every change wakes the operator).
//!
//! The heartbeat says the agent's watch loop works, not merely that its process runs: the loop
//! publishes each round it goes ([`run`]'s `progress`; an idle loop still goes round every
//! interval), and the Lease is renewed only while the last round was at most one lease
//! duration ago ([`renews`], on the monotonic clock). A reconcile stuck in a call or a host
//! write stops the renewals, and the operator sees the node unavailable one lease duration
//! later.

use std::time::Duration;

use hoststack_crds::{agent_lease_name, AGENT_FIELD_MANAGER};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::Client;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

/// How many intervals a heartbeat stays valid: two may be missed.
const VALID_INTERVALS: u32 = 3;

/// Whether the heartbeat is renewed at `now`, the watch loop having last gone round at
/// `progress`: only while that is at most one lease duration (three `interval`s) ago.
pub fn renews(progress: Instant, now: Instant, interval: Duration) -> bool {
    now.saturating_duration_since(progress) <= interval * VALID_INTERVALS
}

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

/// Renews the heartbeat forever while the watch loop goes round (`progress`: when it last
/// did); a failed renewal is logged and retried at the next tick.
pub async fn run(
    client: Client,
    namespace: String,
    node: String,
    interval: Duration,
    progress: watch::Receiver<Instant>,
) {
    let api = Api::<Lease>::namespaced(client, &namespace);
    let name = agent_lease_name(&node);
    let params = PatchParams::apply(AGENT_FIELD_MANAGER).force();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    let mut stuck = false;
    loop {
        tick.tick().await;
        let last_round = *progress.borrow();
        if !renews(last_round, Instant::now(), interval) {
            if !stuck {
                tracing::error!(
                    lease = %name,
                    since = ?last_round.elapsed(),
                    "the watch loop is stuck; the heartbeat is not renewed"
                );
            }
            stuck = true;
            continue;
        }
        if std::mem::take(&mut stuck) {
            tracing::info!(lease = %name, "the watch loop goes round again");
        }
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
    use http::{Request, Response};
    use kube::client::Body;

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

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_stops_when_the_watch_loop_stops() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let start = Instant::now();
        let (loop_went_round, progress) = watch::channel(start);
        let heartbeat = tokio::spawn(run(
            client,
            "hoststack-system".into(),
            "node-a".into(),
            Duration::from_secs(10),
            progress,
        ));
        // The API server answers every renewal and notes when it came.
        let api_server = tokio::spawn(async move {
            let mut renewals = Vec::new();
            while let Some((request, send)) = handle.next_request().await {
                renewals.push(start.elapsed().as_secs());
                let bytes = request.into_body().collect_bytes().await.unwrap();
                send.send_response(
                    Response::builder()
                        .body(Body::from(bytes.to_vec()))
                        .unwrap(),
                );
            }
            renewals
        });
        // The watch loop goes round every 5 s for 25 s, then is stuck.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(5)).await;
            loop_went_round.send_replace(Instant::now());
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        heartbeat.abort();
        let _ = heartbeat.await;
        let renewals = api_server.await.unwrap();
        // Renewed while the loop's last round was at most a lease duration (30 s) ago.
        assert_eq!(
            renewals,
            [0, 10, 20, 30, 40, 50],
            "renewed while the loop was stuck"
        );
    }
}
