//! Handing nodes from one tuning to another, against a real API server, real agents and real
//! sysctls in network namespaces: a higher-priority tuning takes the edge pool over from
//! `edge-sack` as a staged rollout (the nodes outside its waves keep edge-sack's values, each
//! wave moves its nodes in one transaction), a failed takeover and a failed analysis return
//! every node to edge-sack's revision, deleting the winner hands the nodes back canary first,
//! and the takeover survives an operator restart mid-wave and an agent SIGKILL inside the
//! transaction that moves its node.
//!
//! Each test starts its own lab of five nodes: node-a..node-d in pool=edge (node-a labelled
//! the canary) and node-e in pool=core, which no tuning here selects.

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_e2e::prometheus::{revision_transactions, sample, scrape, Prometheus};
use hoststack_e2e::{Lab, LabConfig, Signal, NAMESPACE};
use serde_json::Value;

/// How long one step of a rollout may take.
const STEP: Duration = Duration::from_secs(90);
/// The edge pool.
const EDGE: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];
/// edge-sack's sysctls (examples/edge-sack.yaml, without the congestion control, which a
/// namespace may not allow).
const SACK: [(&str, &str); 3] = [
    ("net.core.somaxconn", "8192"),
    ("net.ipv4.tcp_rmem", "4096 262144 16777216"),
    ("net.ipv4.tcp_wmem", "4096 262144 16777216"),
];

fn lab() -> Lab {
    let lab = Lab::start(LabConfig::with_nodes(5)).expect("lab starts");
    lab.label_node("node-a", "hoststack.dev/canary", Some("true"));
    lab
}

/// A tuning of the edge pool with `priority`, `sysctls` and `rollout` (YAML lines indented by
/// four).
fn tuning(name: &str, priority: u32, sysctls: &[(&str, &str)], rollout: &str) -> String {
    let mut yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  priority: {priority}\n  sysctls:\n"
    );
    for (k, v) in sysctls {
        yaml.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    yaml.push_str("  rollout:\n");
    yaml.push_str(rollout);
    yaml
}

/// edge-sack, applied and complete on the edge pool; returns its revision.
fn edge_sack(lab: &Lab, rollout: &str) -> String {
    lab.apply_yaml(&tuning("edge-sack", 10, &SACK, rollout))
        .expect("accepted");
    let done = lab.wait_tuning_phase("edge-sack", "Complete", STEP);
    for node in EDGE {
        assert!(on_sack(lab, node), "{node} has edge-sack's values");
    }
    done["currentRevision"].as_str().unwrap().to_string()
}

/// Whether `node` has every one of edge-sack's values.
fn on_sack(lab: &Lab, node: &str) -> bool {
    SACK.iter().all(|(k, v)| lab.sysctl(node, k) == *v)
}

/// What each edge node's spec holds and its agent reports: (spec tuning, spec revision,
/// rollout phase, governed by, applied tuning, applied revision).
fn nodes(lab: &Lab) -> BTreeMap<String, [String; 6]> {
    EDGE.iter()
        .map(|n| {
            let nt = lab.get_json(&["get", "nodetuning", n]);
            let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let row = [
                s(&nt["spec"]["tuning"]),
                s(&nt["spec"]["revision"]),
                s(&nt["spec"]["rolloutPhase"]),
                s(&nt["spec"]["governedBy"]),
                s(&nt["status"]["appliedTuning"]),
                s(&nt["status"]["appliedRevision"]),
            ];
            (n.to_string(), row)
        })
        .collect()
}

/// Waits until every edge node runs `tuning`'s `revision`, asked and applied.
fn wait_all_on(lab: &Lab, tuning: &str, revision: &str) {
    lab.wait_for(
        &format!("every edge node on {tuning} {revision}"),
        STEP,
        || {
            nodes(lab)
                .values()
                .all(|r| r[0] == tuning && r[1] == revision && r[4] == tuning && r[5] == revision)
                .then_some(())
        },
    );
}

/// The wave of `tuning` with this index, once its status shows it.
fn wave(lab: &Lab, tuning: &str, index: usize) -> Option<Value> {
    lab.tuning_status(tuning)["waves"]
        .as_array()?
        .iter()
        .find(|w| w["index"] == index)
        .cloned()
}

/// Passes the wave in flight of `tuning` by hand, once it waits to be promoted.
fn promote(lab: &Lab, tuning: &str, revision: &str, index: usize) {
    let id = format!("{revision}-wave{index}");
    lab.wait_for(&format!("{id} to wait for its promotion"), STEP, || {
        (wave(lab, tuning, index)?["result"] == "Applied").then_some(())
    });
    let annotation = format!("hoststack.dev/promote={id}");
    let out = lab.kubectl(&[
        "annotate",
        "networktuning",
        tuning,
        &annotation,
        "--overwrite",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The nodes of the wave of `tuning` with this index.
fn wave_nodes(lab: &Lab, tuning: &str, index: usize) -> Vec<String> {
    lab.wait_for(&format!("wave {index} of {tuning}"), STEP, || {
        Some(
            wave(lab, tuning, index)?["nodes"]
                .as_array()?
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect(),
        )
    })
}

/// `kubectl hoststack ARGS` with the lab's admin kubeconfig: what it printed.
fn plugin(lab: &Lab, args: &[&str]) -> String {
    let out = std::process::Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(args)
        .output()
        .expect("the plugin runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl get networktunings`, as a user sees it.
fn get_tunings(lab: &Lab) -> String {
    let out = lab.kubectl(&["get", "networktunings"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The recorded revisions (ControllerRevisions) labelled `selector`, by name.
fn history(lab: &Lab, selector: &str) -> Vec<String> {
    let out = lab.kubectl(&[
        "get",
        "controllerrevisions",
        "-n",
        NAMESPACE,
        "-l",
        selector,
        "-o",
        "name",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn a_failed_takeover_leaves_every_node_on_the_tuning_it_had() {
    let lab = lab();
    let sack = edge_sack(&lab, "    canary: 1\n    maxUnavailable: 50%\n");

    // newbie's only mistake: a sysctl this kernel lacks.
    let newbie = tuning(
        "newbie",
        900,
        &[
            ("net.core.somaxconn", "4096"),
            ("net.ipv4.tcp_no_such_knob", "1"),
        ],
        "    canary: 1\n    maxUnavailable: 2\n",
    );
    lab.apply_yaml(&newbie).expect("accepted");
    let back = lab.wait_tuning_phase("newbie", "RolledBack", STEP);
    assert!(
        back["message"]
            .as_str()
            .unwrap()
            .contains("node-a failed to apply"),
        "{back}"
    );
    assert_eq!(back["waves"].as_array().unwrap().len(), 1, "{back}");
    assert_eq!(back["waves"][0]["from"][0]["tuning"], "edge-sack", "{back}");

    // Every node on edge-sack's revision, asked and applied, with its values; newbie governs.
    wait_all_on(&lab, "edge-sack", &sack);
    for (node, row) in nodes(&lab) {
        assert_eq!(row[3], "newbie", "{node} is governed by newbie: {row:?}");
        assert!(on_sack(&lab, &node), "{node} kept edge-sack's values");
    }
    // edge-sack says it is superseded, not Complete 0/N.
    let superseded = lab.wait_tuning_phase("edge-sack", "Superseded", STEP);
    assert_eq!(superseded["supersededBy"], "newbie", "{superseded}");
    assert_eq!(superseded["progress"], "0/0", "{superseded}");
    let table = get_tunings(&lab);
    eprintln!("after the failed takeover:\n{table}");
    assert!(
        table.lines().any(|l| l.starts_with("edge-sack ")
            && l.contains("Superseded")
            && l.contains("newbie")),
        "{table}"
    );
    // edge-sack's revision, copied into newbie's history for the rollback, stays while nodes
    // may return to it.
    assert_eq!(
        history(&lab, "hoststack.dev/from-tuning=edge-sack"),
        [format!("controllerrevision.apps/newbie-{sack}")]
    );

    // Deleting newbie gives the nodes back to edge-sack, which they never left.
    lab.delete_tuning("newbie");
    let done = lab.wait_tuning_phase("edge-sack", "Complete", STEP);
    assert_eq!(done["progress"], "4/4", "{done}");
    lab.wait_for("edge-sack to govern its nodes again", STEP, || {
        nodes(&lab)
            .values()
            .all(|r| r[3] == "edge-sack")
            .then_some(())
    });
    assert!(history(&lab, "hoststack.dev/tuning=newbie").is_empty());
    lab.delete_tuning("edge-sack");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_takeover_goes_canary_first_and_deleting_the_winner_hands_the_nodes_back_the_same_way() {
    let lab = lab();
    let manual = "    canary: 1\n    maxUnavailable: 2\n    analysis:\n      manual: true\n";
    // edge-sack's own first rollout: three waves (1, 2 and 1 nodes), each promoted.
    lab.apply_yaml(&tuning("edge-sack", 10, &SACK, manual))
        .expect("accepted");
    let sack = lab.wait_for("edge-sack's revision", STEP, || {
        lab.tuning_status("edge-sack")["currentRevision"]
            .as_str()
            .map(String::from)
    });
    for i in 0..3 {
        promote(&lab, "edge-sack", &sack, i);
    }
    lab.wait_tuning_phase("edge-sack", "Complete", STEP);
    wait_all_on(&lab, "edge-sack", &sack);

    // newbie takes over, canary first, a wave at a time.
    lab.apply_yaml(&tuning(
        "newbie",
        900,
        &[("net.core.somaxconn", "4096")],
        manual,
    ))
    .expect("accepted");
    let newbie = lab.wait_for("newbie's revision", STEP, || {
        lab.tuning_status("newbie")["currentRevision"]
            .as_str()
            .map(String::from)
    });
    let mut moved: Vec<String> = Vec::new();
    for i in 0..3 {
        let wave = wave_nodes(&lab, "newbie", i);
        if i == 0 {
            assert_eq!(wave, ["node-a"], "the labelled canary first");
        }
        moved.extend(wave);
        lab.wait_for(&format!("wave {i} to apply"), STEP, || {
            moved
                .iter()
                .all(|n| lab.sysctl(n, "net.core.somaxconn") == "4096")
                .then_some(())
        });
        // The nodes not yet moved keep edge-sack's revision and values, as newbie's baseline.
        let rows = nodes(&lab);
        for node in EDGE.iter().filter(|n| !moved.iter().any(|m| m == *n)) {
            let row = &rows[*node];
            assert_eq!(
                (
                    row[0].as_str(),
                    row[1].as_str(),
                    row[2].as_str(),
                    row[3].as_str()
                ),
                ("edge-sack", sack.as_str(), "stable", "newbie"),
                "{node} in wave {i}"
            );
            assert!(on_sack(&lab, node), "{node} keeps edge-sack's values");
        }
        // A moved node runs exactly newbie's config (edge-sack's buffers, which newbie does not
        // set, back at the host's own value, as on node-e), reached in one transaction from
        // one revision to the other: no revert in between.
        let original = lab.sysctl("node-e", "net.ipv4.tcp_rmem");
        for node in &moved {
            assert_eq!(lab.sysctl(node, "net.ipv4.tcp_rmem"), original, "{node}");
            let metrics = scrape(lab.agent_metrics_address(node)).expect("the agent's /metrics");
            assert_eq!(
                revision_transactions(&metrics, &newbie),
                [("applied".to_string(), 1)].into(),
                "{node}"
            );
            let reverts = r#"hoststack_agent_transactions_total{result="reverted"}"#;
            assert_eq!(sample(&metrics, reverts), Some(0), "{node}");
        }
        if i == 0 {
            let get = plugin(&lab, &["get", "newbie"]);
            eprintln!("kubectl hoststack get newbie, canary applied:\n{get}");
            assert!(get.contains("of edge-sack"), "{get}");
        }
        promote(&lab, "newbie", &newbie, i);
    }
    lab.wait_tuning_phase("newbie", "Complete", STEP);
    wait_all_on(&lab, "newbie", &newbie);
    lab.wait_tuning_phase("edge-sack", "Superseded", STEP);
    eprintln!("after the takeover:\n{}", get_tunings(&lab));

    // Deleting newbie hands the nodes back to edge-sack: a new round of its rollout, canary
    // first, numbered after its first three waves; the others keep newbie's values meanwhile.
    lab.delete_tuning("newbie");
    let canary = wave_nodes(&lab, "edge-sack", 3);
    assert_eq!(canary, ["node-a"]);
    lab.wait_for("the canary back on edge-sack", STEP, || {
        on_sack(&lab, "node-a").then_some(())
    });
    let rows = nodes(&lab);
    for node in ["node-b", "node-c", "node-d"] {
        assert_eq!(
            (rows[node][0].as_str(), rows[node][2].as_str()),
            ("newbie", "stable"),
            "{node}"
        );
        assert_eq!(lab.sysctl(node, "net.core.somaxconn"), "4096", "{node}");
    }
    // newbie is gone, and its revision lives on as a copy in edge-sack's history.
    assert!(history(&lab, "hoststack.dev/tuning=newbie").is_empty());
    assert_eq!(
        history(&lab, "hoststack.dev/from-tuning=newbie"),
        [format!("controllerrevision.apps/edge-sack-{newbie}")]
    );
    eprintln!("handing back:\n{}", get_tunings(&lab));
    for i in 3..6 {
        promote(&lab, "edge-sack", &sack, i);
    }
    lab.wait_tuning_phase("edge-sack", "Complete", STEP);
    wait_all_on(&lab, "edge-sack", &sack);
    for node in EDGE {
        assert!(on_sack(&lab, node), "{node}");
    }
    // No node runs newbie's revision or may return to it: its copy goes.
    lab.wait_for("the copy of newbie's revision to go", STEP, || {
        history(&lab, "hoststack.dev/from-tuning=newbie")
            .is_empty()
            .then_some(())
    });
    lab.delete_tuning("edge-sack");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_failed_analysis_returns_the_canary_to_the_other_tunings_revision() {
    let lab = lab();
    let prometheus = Prometheus::start(&lab).expect("prometheus starts");
    // The installer's Prometheus, which the gate asks when a tuning names none.
    lab.reconfigure_operator(&prometheus.operator_args());
    let sack = edge_sack(&lab, "    canary: 1\n    maxUnavailable: 50%\n");
    // A gate that fails every canary it sees.
    let query = r#"count(hoststack_node_info{node=~\"{{judged}}\",phase=\"canary\"})"#;
    let gate = format!(
        "    canary: 1\n    maxUnavailable: 2\n    analysis:\n      window: 2s\n      prometheus:\n        query: \"{query}\"\n        successCondition: result < 1\n        failureCondition: result >= 1\n"
    );
    lab.apply_yaml(&tuning(
        "newbie",
        900,
        &[("net.core.somaxconn", "4096")],
        &gate,
    ))
    .expect("accepted");
    let back = lab.wait_tuning_phase("newbie", "RolledBack", STEP);
    let analysis = &back["waves"][0]["analysis"];
    assert_eq!(analysis["verdict"], "Fail", "{back}");
    assert!(
        back["message"]
            .as_str()
            .unwrap()
            .starts_with("analysis failed"),
        "{back}"
    );
    // The canary had applied newbie's value; it is back on edge-sack's revision and values.
    wait_all_on(&lab, "edge-sack", &sack);
    for node in EDGE {
        assert!(on_sack(&lab, node), "{node}");
    }
    drop(prometheus);
    lab.delete_tuning("newbie");
    lab.delete_tuning("edge-sack");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_takeover_survives_an_operator_restart_mid_wave_and_an_agent_killed_inside_its_transaction() {
    let lab = lab();
    let sack = edge_sack(&lab, "    canary: 1\n    maxUnavailable: 50%\n");
    // node-b's agent pauses after each host write, so that it can be killed inside the
    // transaction that moves it from edge-sack's revision to newbie's.
    lab.kill_agent("node-b", Signal::Term);
    lab.start_agent("node-b", &["--step-delay", "3s"]);
    let manual = "    canary: 1\n    maxUnavailable: 1\n    analysis:\n      manual: true\n";
    let next = [
        ("net.core.somaxconn", "4096"),
        ("net.ipv4.tcp_rmem", "4096 131072 8388608"),
        ("net.ipv4.tcp_wmem", "4096 131072 8388608"),
    ];
    lab.apply_yaml(&tuning("newbie", 900, &next, manual))
        .expect("accepted");
    let newbie = lab.wait_for("newbie's revision", STEP, || {
        lab.tuning_status("newbie")["currentRevision"]
            .as_str()
            .map(String::from)
    });

    // The operator restarts while the canary waits for its promotion: the rollout carries on
    // from its status, and the baseline stays where it was.
    promote(&lab, "newbie", &newbie, 0);
    assert_eq!(wave_nodes(&lab, "newbie", 1), ["node-b"]);
    lab.restart_operator();

    // node-b's agent dies after its first write and before its last.
    lab.wait_for("node-b's transaction to have begun", STEP, || {
        let changed = next
            .iter()
            .filter(|(k, v)| lab.sysctl("node-b", k) == *v)
            .count();
        (changed >= 1 && changed < next.len()).then_some(())
    });
    lab.kill_agent("node-b", Signal::Kill);
    lab.start_agent("node-b", &[]);
    lab.wait_for("node-b to apply newbie", STEP, || {
        next.iter()
            .all(|(k, v)| lab.sysctl("node-b", k) == *v)
            .then_some(())
    });
    // Nothing moved node-c or node-d meanwhile, and the rollout goes on from where it was.
    for node in ["node-c", "node-d"] {
        assert!(on_sack(&lab, node), "{node}");
        assert_eq!(nodes(&lab)[node][0], "edge-sack", "{node}");
    }
    for i in 1..4 {
        promote(&lab, "newbie", &newbie, i);
    }
    let done = lab.wait_tuning_phase("newbie", "Complete", STEP);
    let waves: Vec<Vec<Value>> = done["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["nodes"].as_array().unwrap().clone())
        .collect();
    assert_eq!(waves.len(), 4, "no wave repeated or skipped: {done}");
    wait_all_on(&lab, "newbie", &newbie);

    // Narrowing newbie's selector to no node hands the pool back to edge-sack (a staged
    // rollout without analysis, so it goes through at once); newbie, matching nothing, is
    // Pending.
    let narrowed = tuning("newbie", 900, &next, manual).replace("pool: edge", "pool: nowhere");
    lab.apply_yaml(&narrowed).expect("accepted");
    lab.wait_tuning_phase("edge-sack", "Complete", STEP);
    wait_all_on(&lab, "edge-sack", &sack);
    let pending = lab.wait_tuning_phase("newbie", "Pending", STEP);
    assert_eq!(pending["progress"], "0/0", "{pending}");
    lab.delete_tuning("newbie");
    lab.delete_tuning("edge-sack");
    lab.stop().expect("the lab stops cleanly");
}
