//! Health samples against a real API server and real TCP traffic: the test asks node-a's agent
//! for samples over 2 s windows (`spec.healthRequest`, written as the operator would, with a
//! field manager of its own) while iperf3 runs from node-a to node-b and node-b's wire loses 2%
//! of node-a's data packets at random. A sample answering the request arrives with segments sent and retransmitted
//! and the revision the host is on; every status write of the agent while it samples carries a
//! new window (contiguous with the one before: one write per window, no more); a new request id
//! starts a fresh window; a transaction in the middle of a window leaves that window's sample
//! without a revision; removing the request clears `status.health` once, after which the agent
//! writes nothing at all over several windows.
//!
//! The operator is not started, so only the agent is judged. The spec is written with the
//! operator's ServiceAccount, as the operator would (only it may write a NodeTuning's spec: the
//! chart's spec guard): created by server-side apply, then changed by merge patches sent
//! without a GET first (`kubectl patch` reads the object, which the operator's role may not).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use hoststack_e2e::traffic::{Bulk, Loss, BASE_PORT};
use hoststack_e2e::{Identity, Lab, LabConfig};
use serde_json::Value;

/// The sampled node; it sends the traffic.
const NODE: &str = "node-a";
/// Runs the iperf3 server and loses some of the data it receives.
const PEER: &str = "node-b";
/// The window asked for.
const WINDOW: &str = "2s";
/// How long anything may take to show in status.
const CONVERGE: Duration = Duration::from_secs(60);
/// The field manager the test writes the spec with.
const MANAGER: &str = "e2e-health";

/// The config of the first revision.
fn first_config() -> Value {
    serde_json::json!({"sysctls": {"net.ipv4.tcp_sack": "1"}})
}

/// The config of the second revision: one more sysctl.
fn second_config() -> Value {
    serde_json::json!({"sysctls": {"net.ipv4.tcp_sack": "1", "net.core.somaxconn": "8192"}})
}

/// Writes the first revision's spec; returns the revision.
fn write_spec(lab: &Lab) -> String {
    lab.write_node_spec(Identity::Operator, NODE, MANAGER, "health", &first_config())
}

/// Moves the node to the second revision, keeping the health request; returns the revision.
fn change_revision(lab: &Lab) -> String {
    let config = second_config();
    let revision = hoststack_e2e::config_revision(&config);
    let patch = serde_json::json!({"spec": {"revision": revision, "config": config}});
    lab.merge_patch_node_tuning(lab.kubeconfig_of(Identity::Operator), NODE, MANAGER, &patch)
        .unwrap_or_else(|e| panic!("patching the revision: {e}"));
    revision
}

/// Sets (or with `None` removes) `spec.healthRequest`.
fn ask(lab: &Lab, id: Option<&str>) {
    let request = match id {
        Some(id) => serde_json::json!({ "id": id, "window": WINDOW }),
        None => Value::Null,
    };
    let patch = serde_json::json!({ "spec": { "healthRequest": request } });
    lab.merge_patch_node_tuning(lab.kubeconfig_of(Identity::Operator), NODE, MANAGER, &patch)
        .unwrap_or_else(|e| panic!("patching healthRequest: {e}"));
}

fn object(lab: &Lab) -> Value {
    lab.get_json(&["get", "nodetuning", NODE])
}

fn number(v: &Value) -> u64 {
    v.as_u64().unwrap_or_default()
}

/// One line per version of the object seen by a watch of `seconds` with the admin
/// `kubeconfig`: the resourceVersion, then the sample's request id, start, end, revision,
/// outSegs and retransSegs (empty when absent). The first line is the object as the watch started.
fn watch(kubeconfig: &Path, seconds: u32) -> Vec<Vec<String>> {
    let bin = hoststack_e2e::control_plane_dir();
    let template = "jsonpath={.metadata.resourceVersion}|{.status.health.requestId}|{.status.health.start}|{.status.health.end}|{.status.health.revision}|{.status.health.outSegs}|{.status.health.retransSegs}{\"\\n\"}";
    let out = Command::new("timeout")
        .arg(seconds.to_string())
        .arg(bin.join("kubectl"))
        .args(["get", "nodetuning", NODE, "--watch", "-o", template])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl --watch runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect()
}

#[test]
fn samples_arrive_once_per_window_while_asked_and_stop_when_not() {
    let lab = Lab::start(LabConfig {
        start_operator: false,
        agent_args: vec!["--resync-interval".into(), "1s".into()],
        ..LabConfig::with_nodes(2)
    })
    .expect("lab starts");
    let r1 = write_spec(&lab);
    lab.wait_for(&format!("{NODE} to apply {r1}"), CONVERGE, || {
        (object(&lab)["status"]["state"] == "Applied").then_some(())
    });
    assert!(object(&lab)["status"].get("health").is_none());

    // Lossy bulk traffic from node-a to node-b for the whole sampling part.
    // At node-b's ingress, where node-a's TCP cannot see it (see hoststack_e2e::traffic).
    let loss = Loss::install(&lab, PEER, lab.node_ip(NODE), BASE_PORT, 20).expect("loss rule");
    let bulk = Bulk::start(&lab, PEER, &[NODE], "50M", 120).expect("iperf3 runs");

    ask(&lab, Some("h1"));
    let sample = lab.wait_for("a sample of h1 with retransmissions", CONVERGE, || {
        let health = object(&lab)["status"]["health"].clone();
        (health["requestId"] == "h1" && number(&health["retransSegs"]) > 0).then_some(health)
    });
    eprintln!("sample: {sample}");
    assert!(number(&sample["outSegs"]) > number(&sample["retransSegs"]));
    assert_eq!(sample["revision"], r1.as_str());
    assert_eq!(sample["steady"], true, "{sample}");
    assert!(number(&sample["durationMs"]) >= 2000, "{sample}");
    let ratio: f64 = sample["retransmitRatio"]
        .as_str()
        .expect("a ratio, segments were sent")
        .parse()
        .expect("a decimal");
    // 2% of the data packets (GSO packets of several segments each) are lost: well above the
    // ratio of a clean veth (0 to a few loss probes in thousands of segments).
    assert!(ratio > 0.002 && ratio < 1.0, "{sample}");
    for rate in ["sackRecoveriesPerKiloSegment", "dsacksPerKiloSegment"] {
        let text = sample[rate].as_str().unwrap_or_else(|| panic!("{rate}"));
        assert!(text.parse::<f64>().is_ok(), "{rate}: {text}");
    }

    // Every status write while sampling carries the next window: new, and starting where the
    // previous one ended. Over ~4 windows there are writes, and none without a new sample.
    let seen = watch(lab.kubeconfig(), 9);
    eprintln!("watched: {seen:?}");
    assert!(seen.len() >= 3, "at least two windows ended: {seen:?}");
    for pair in seen.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert_ne!(before[0], after[0], "{seen:?}");
        assert_eq!(after[1], "h1", "{seen:?}");
        assert_eq!(
            after[2], before[3],
            "a write without a new, contiguous window: {seen:?}"
        );
    }

    // A new revision while sampling: the window the transaction ran in is credited to no
    // revision, the windows after it to the new one, and none after the change to the old one.
    let kubeconfig = lab.kubeconfig().to_path_buf();
    let (during, r2) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch(&kubeconfig, 9));
        std::thread::sleep(Duration::from_secs(1));
        let r2 = change_revision(&lab);
        (watcher.join().expect("the watch"), r2)
    });
    eprintln!("watched across the transaction: {during:?}");
    let revisions: Vec<&str> = during
        .windows(2)
        .filter(|p| p[1][3] != p[0][3])
        .map(|p| p[1][4].as_str())
        .collect();
    let unattributed = revisions
        .iter()
        .position(|r| r.is_empty())
        .unwrap_or_else(|| panic!("no sample without a revision: {during:?}"));
    assert!(
        revisions[unattributed..].iter().all(|r| *r != r1),
        "{during:?}"
    );
    assert!(
        revisions[unattributed..].contains(&r2.as_str()),
        "{during:?}"
    );

    // A new id: a fresh window answering it.
    ask(&lab, Some("h2"));
    lab.wait_for("a sample of h2", CONVERGE, || {
        let health = object(&lab)["status"]["health"].clone();
        (health["requestId"] == "h2" && number(&health["outSegs"]) > 0).then_some(())
    });
    drop(bulk);
    drop(loss);

    // No request: the sample is cleared once, and then nothing is written over 3 windows.
    ask(&lab, None);
    lab.wait_for("status.health to go away", CONVERGE, || {
        object(&lab)["status"].get("health").is_none().then_some(())
    });
    let quiet = watch(lab.kubeconfig(), 7);
    assert_eq!(
        quiet.len(),
        1,
        "no status write without a request: {quiet:?}"
    );
    assert_eq!(quiet[0][1], "");
    lab.stop().expect("clean teardown");
}
