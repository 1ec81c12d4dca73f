//! A connection to the API server that dies silently hangs the agent for no longer than its
//! client's timeouts (`hoststack_crds::api_client`): the agent applies and confirms a revision
//! and goes quiet, then every connection it has open to the API server is blackholed (each
//! packet dropped, each way, no FIN, no reset: as when a NAT entry or a load balancer forgets
//! it) and the next revision is written. Only the watch can deliver it (the agent resyncs every
//! 10 minutes and has no status write pending): the agent must give up on the silent watch (a
//! live one hears a bookmark every minute), and on any dead pooled connection its next request
//! picks, connect again and apply the new revision. Without bounds kube's watcher waits 295 s
//! on a quiet watch before it opens another.
//!
//! The operator is not started; the test writes the spec as the operator would.

use std::time::Duration;

use hoststack_e2e::traffic::Blackhole;
use hoststack_e2e::{Identity, Lab, LabConfig};

/// The node whose connections die.
const NODE: &str = "node-a";
/// The field manager the test writes the spec with.
const MANAGER: &str = "e2e-api-timeouts";
/// Longer than the agent takes with bounded calls (the watch's silence, then a request on a
/// dead pooled connection, each at most the 90 s read timeout) and shorter than kube's watcher
/// waits on a quiet watch without them (290 s and a 5 s margin).
const RECONNECTED: Duration = Duration::from_secs(240);

fn status(lab: &Lab) -> serde_json::Value {
    lab.get_json(&["get", "nodetuning", NODE])["status"].clone()
}

#[test]
fn an_agent_whose_connections_die_silently_connects_again_and_applies_the_next_revision() {
    let lab = Lab::start(LabConfig {
        start_operator: false,
        agent_args: vec!["--resync-interval".into(), "10m".into()],
        ..LabConfig::with_nodes(1)
    })
    .expect("lab starts");
    let config =
        |somaxconn: &str| serde_json::json!({"sysctls": {"net.core.somaxconn": somaxconn}});
    let first = lab.write_node_spec(
        Identity::Operator,
        NODE,
        MANAGER,
        "timeouts",
        &config("8192"),
    );
    lab.wait_for(
        &format!("{NODE} to apply and confirm {first}"),
        Duration::from_secs(60),
        || {
            let s = status(&lab);
            (s["state"] == "Applied"
                && s["appliedRevision"] == first.as_str()
                && s.get("confirmation").is_none())
            .then_some(())
        },
    );
    // Let the confirmation's status write finish: nothing of the agent's is in flight.
    std::thread::sleep(Duration::from_secs(2));

    let (peer, port) = lab
        .api_url()
        .strip_prefix("https://")
        .and_then(|a| a.trim_end_matches('/').split_once(':'))
        .and_then(|(host, port)| Some((host.parse().ok()?, port.parse().ok()?)))
        .unwrap_or_else(|| panic!("an IPv4 address and port in {}", lab.api_url()));
    let dead = Blackhole::install(&lab, NODE, peer, port).expect("the agent's connections die");
    eprintln!(
        "blackholed the agent's connections from ports {:?}",
        dead.ports
    );
    let second = lab.write_node_spec(
        Identity::Operator,
        NODE,
        MANAGER,
        "timeouts",
        &config("4096"),
    );
    lab.wait_for(
        &format!("{NODE} to connect again and apply {second}"),
        RECONNECTED,
        || {
            let s = status(&lab);
            (s["state"] == "Applied" && s["appliedRevision"] == second.as_str()).then_some(())
        },
    );
    assert_eq!(lab.sysctl(NODE, "net.core.somaxconn"), "4096");
    eprintln!(
        "{}",
        std::fs::read_to_string(lab.log_path("agent-node-a")).unwrap_or_default()
    );
    drop(dead);
    lab.stop().expect("clean teardown");
}
