//! The post-apply probes, run on the node's own network path (the agent's network namespace):
//! a TCP connect to each target, and the API server — a new client (its own TCP and TLS
//! connection, never one the agent already holds) reads the agent's own NodeTuning back and
//! must find the confirmation it wrote pending. Each probe is retried until its timeout; none
//! needs ICMP or a default route. [`crate::confirmation`] decides what a round means.

use std::time::Duration;

use hoststack_crds::{NodeTuning, ProbeResult, ProbeTarget};
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

use crate::confirmation::{Checks, API_SERVER_PROBE};

/// The pause between two attempts of one probe.
const ATTEMPT_PAUSE: Duration = Duration::from_millis(250);

/// What the API-server probe reads back.
pub struct ApiServer<'a> {
    /// The client configuration; every probe builds a new client from it.
    pub config: &'a kube::Config,
    /// The node, whose NodeTuning it reads.
    pub node: &'a str,
    /// The revision whose confirmation the status must show pending.
    pub revision: &'a str,
}

/// One round of `checks`: the targets, then the API server when it is checked.
pub async fn round(checks: &Checks, api_server: ApiServer<'_>) -> Vec<ProbeResult> {
    let mut results = Vec::new();
    for target in &checks.targets {
        results.push(tcp_probe(target, checks.timeout).await);
    }
    if checks.api_server {
        let url = api_server.config.cluster_url.to_string();
        let outcome = retried(checks.timeout, || read_back(&api_server)).await;
        results.push(result(API_SERVER_PROBE, &url, outcome));
    }
    results
}

/// A TCP connect to `target`.
async fn tcp_probe(target: &ProbeTarget, within: Duration) -> ProbeResult {
    let outcome = retried(within, || async {
        TcpStream::connect(&target.tcp)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
    result(&target.name, &target.tcp, outcome)
}

/// Reads the node's NodeTuning with a new client: passes when its status shows the revision's
/// confirmation pending (the agent's own status write went through and reads back).
async fn read_back(probe: &ApiServer<'_>) -> Result<(), String> {
    let client = Client::try_from(probe.config.clone()).map_err(|e| e.to_string())?;
    let api: Api<NodeTuning> = Api::all(client);
    // A list by name, which the agent's RBAC allows (it watches its NodeTuning the same way).
    let by_name = ListParams::default().fields(&format!("metadata.name={}", probe.node));
    let listed = api.list(&by_name).await.map_err(|e| e.to_string())?;
    let pending = listed
        .items
        .first()
        .and_then(|o| o.status.as_ref())
        .and_then(|s| s.confirmation.as_ref())
        .map(|c| c.revision.as_str());
    if pending == Some(probe.revision) {
        Ok(())
    } else {
        Err(format!(
            "the API server answered, but does not show the agent's status for revision {} yet",
            probe.revision
        ))
    }
}

/// Runs `attempt` until it succeeds or `within` has passed (each attempt bounded by what is
/// left); the last error when none succeeded.
async fn retried<F, Fut>(within: Duration, mut attempt: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let error = match timeout(left, attempt()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {within:?}"),
        };
        if Instant::now() + ATTEMPT_PAUSE >= deadline {
            return Err(error);
        }
        sleep(ATTEMPT_PAUSE).await;
    }
}

fn result(name: &str, target: &str, outcome: Result<(), String>) -> ProbeResult {
    ProbeResult {
        name: name.to_string(),
        target: target.to_string(),
        passed: outcome.is_ok(),
        message: outcome.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tcp_probe_passes_on_a_listener_and_fails_with_the_reason_without_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        let target = |tcp: &str| ProbeTarget {
            name: "web".into(),
            tcp: tcp.into(),
        };
        let passed = tcp_probe(&target(&open), Duration::from_secs(1)).await;
        assert!(passed.passed, "{passed:?}");
        drop(listener);
        let failed = tcp_probe(&target(&open), Duration::from_millis(600)).await;
        assert!(!failed.passed);
        assert!(
            failed.message.as_deref().unwrap().contains("refused"),
            "{failed:?}"
        );
    }
}
