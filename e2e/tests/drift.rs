//! Drift against a real API server and real sysctls: a value of the applied revision changed
//! behind the agent's back (`sysctl -w` inside the node's namespace) is found within one
//! `--resync-interval`. With `driftPolicy: Report` the Drifted condition names the sysctl with
//! both values and the host keeps the changed value; with `Reapply` the value comes back, the
//! Drifted condition clears and `hoststack_agent_drift_total` counts it. A revert restores the
//! original value, not the drifted one.
//!
//! The operator is not started: the test writes the node's NodeTuning itself, with a field
//! manager of its own, so that only the agent is judged. It writes the spec with the operator's
//! ServiceAccount, as the operator would (only it may write a NodeTuning's spec: the chart's spec
//! guard): creates it by server-side apply and withdraws it with a merge patch sent without a
//! GET first (`kubectl patch` reads the object, which the operator's role may not).

use std::time::Duration;

use hoststack_e2e::prometheus::http_get;
use hoststack_e2e::{Identity, Lab, LabConfig};
use serde_json::Value;

/// The node whose agent is judged.
const NODE: &str = "node-a";
/// The sysctl the tests tune and change behind the agent's back.
const KEY: &str = "net.core.somaxconn";
/// Its desired value (a fresh namespace has 4096).
const DESIRED: &str = "8192";
/// What "someone else" writes.
const DRIFTED: &str = "1024";
/// How long the agent may take to notice or converge (its resync interval is 1 s).
const CONVERGE: Duration = Duration::from_secs(30);

fn lab() -> Lab {
    let config = LabConfig {
        start_operator: false,
        agent_args: vec!["--resync-interval".into(), "1s".into()],
        ..LabConfig::with_nodes(2)
    };
    Lab::start(config).expect("lab starts")
}

/// Writes the node's NodeTuning spec as the operator would (server-side apply), under the
/// revision its config hashes to; returns that revision.
fn write_spec(lab: &Lab, policy: &str) -> String {
    let config = serde_json::json!({"driftPolicy": policy, "sysctls": {KEY: DESIRED}});
    lab.write_node_spec(Identity::Operator, NODE, "e2e-drift", "drift", &config)
}

/// Withdraws the spec (no tuning, no config) as the operator would: the agent reverts.
fn withdraw(lab: &Lab) {
    let patch = serde_json::json!({"spec": {"tuning": null, "config": null, "revision": null}});
    lab.merge_patch_node_tuning(
        lab.kubeconfig_of(Identity::Operator),
        NODE,
        "e2e-drift",
        &patch,
    )
    .unwrap_or_else(|e| panic!("withdrawing the spec: {e}"));
}

fn status(lab: &Lab) -> Value {
    lab.get_json(&["get", "nodetuning", NODE])["status"].clone()
}

/// (status, reason, message) of the Drifted condition, when there is one.
fn drifted(status: &Value) -> Option<(String, String, String)> {
    let c = status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Drifted")?;
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

fn item_actual(status: &Value) -> Option<String> {
    status["items"]
        .as_array()?
        .iter()
        .find(|i| i["target"] == KEY)
        .and_then(|i| i["actual"].as_str())
        .map(str::to_string)
}

fn wait_applied(lab: &Lab, revision: &str) {
    lab.wait_for(&format!("{NODE} to apply {revision}"), CONVERGE, || {
        let s = status(lab);
        (s["state"] == "Applied" && s["appliedRevision"] == revision).then_some(())
    });
    assert_eq!(lab.sysctl(NODE, KEY), DESIRED);
}

fn wait_no_drift(lab: &Lab) {
    lab.wait_for("Drifted False/NoDrift", CONVERGE, || {
        let d = drifted(&status(lab))?;
        (d.0 == "False" && d.1 == "NoDrift").then_some(())
    });
}

/// `hoststack_agent_drift_total` of the node's agent.
fn drift_total(lab: &Lab) -> u64 {
    let (code, text) =
        http_get(lab.agent_metrics_address(NODE), "/metrics", None).expect("scraping the agent");
    assert_eq!(code, 200);
    text.lines()
        .find_map(|l| l.strip_prefix("hoststack_agent_drift_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("no hoststack_agent_drift_total in\n{text}"))
}

#[test]
fn report_names_the_drifted_sysctl_and_leaves_it_changed() {
    let lab = lab();
    let original = lab.sysctl(NODE, KEY);
    assert_ne!(original, DESIRED);
    assert_ne!(original, DRIFTED);
    let revision = write_spec(&lab, "Report");
    wait_applied(&lab, &revision);
    wait_no_drift(&lab);

    lab.write_sysctl(NODE, KEY, DRIFTED);
    let want = format!("sysctl {KEY}: desired {DESIRED}, found {DRIFTED}");
    let found = lab.wait_for("Drifted True naming the sysctl", CONVERGE, || {
        let s = status(&lab);
        let d = drifted(&s)?;
        (d.0 == "True").then_some(s)
    });
    let (_, reason, message) = drifted(&found).expect("condition");
    assert_eq!(reason, "Drifted");
    assert_eq!(message, want);
    assert_eq!(item_actual(&found).as_deref(), Some(DRIFTED));
    assert_eq!(found["state"], "Applied");
    // Several resyncs later the host still has the changed value, nothing was re-applied, and
    // the condition still says so.
    let conditions = |s: &Value| s["conditions"].clone();
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(lab.sysctl(NODE, KEY), DRIFTED);
        assert_eq!(conditions(&status(&lab)), conditions(&found));
    }
    assert_eq!(drift_total(&lab), 0);

    // Put back by hand: the condition clears.
    lab.write_sysctl(NODE, KEY, DESIRED);
    wait_no_drift(&lab);
    assert_eq!(item_actual(&status(&lab)).as_deref(), Some(DESIRED));

    // Drifted again, then the spec is withdrawn: the original comes back, not the drifted value.
    lab.write_sysctl(NODE, KEY, DRIFTED);
    lab.wait_for("Drifted True again", CONVERGE, || {
        (drifted(&status(&lab))?.0 == "True").then_some(())
    });
    withdraw(&lab);
    lab.wait_for(&format!("{NODE} to revert"), CONVERGE, || {
        (status(&lab)["state"] == "Reverted").then_some(())
    });
    assert_eq!(lab.sysctl(NODE, KEY), original);
    let journal =
        std::fs::read_to_string(lab.agent_state_dir(NODE).join("journal.json")).expect("journal");
    assert!(!journal.contains(KEY), "{journal}");
    lab.stop().expect("clean teardown");
}

#[test]
fn reapply_brings_the_value_back_and_clears_drifted() {
    let lab = lab();
    let original = lab.sysctl(NODE, KEY);
    let revision = write_spec(&lab, "Reapply");
    wait_applied(&lab, &revision);
    wait_no_drift(&lab);
    assert_eq!(drift_total(&lab), 0);

    lab.write_sysctl(NODE, KEY, DRIFTED);
    lab.wait_for(
        "the agent to write the desired value again",
        CONVERGE,
        || (lab.sysctl(NODE, KEY) == DESIRED).then_some(()),
    );
    wait_no_drift(&lab);
    lab.wait_for("agent_drift to count it", CONVERGE, || {
        (drift_total(&lab) == 1).then_some(())
    });
    let s = status(&lab);
    assert_eq!(s["state"], "Applied");
    assert_eq!(item_actual(&s).as_deref(), Some(DESIRED));
    // The journal still holds the value from before the first transaction.
    let journal =
        std::fs::read_to_string(lab.agent_state_dir(NODE).join("journal.json")).expect("journal");
    let journal: Value = serde_json::from_str(&journal).expect("journal JSON");
    let recorded = journal["originals"]
        .as_array()
        .expect("originals")
        .iter()
        .find(|e| e["target"] == KEY)
        .and_then(|e| e["value"].as_str())
        .map(str::to_string);
    assert_eq!(recorded, Some(original.clone()));

    withdraw(&lab);
    lab.wait_for(&format!("{NODE} to revert"), CONVERGE, || {
        (status(&lab)["state"] == "Reverted").then_some(())
    });
    assert_eq!(lab.sysctl(NODE, KEY), original);
    lab.stop().expect("clean teardown");
}
