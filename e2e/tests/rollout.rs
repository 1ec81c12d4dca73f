//! Staged rollouts against a real API server, real agents and real sysctls in network
//! namespaces: canary first, waves, pauses, promotion by hand, an operator restart in the
//! middle of a wave, a refused value and a real TCP regression rolled back, and healthy waves
//! promoted, judged by the agents' health samples and by a real Prometheus.
//!
//! A check that nothing happened (a paused rollout, a restarted operator, a rollback that
//! stays) first waits until the operator has reconciled the tuning as it stands
//! ([`await_processed`], from the operator's own reconcile counter), never for a fixed time.
//!
//! Each test starts its own lab of five nodes: node-a..node-d in pool=edge (the tuning's
//! nodes) and node-e in pool=core (the traffic's far end in the regression tests).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hoststack_e2e::prometheus::{revision_transactions, sample, scrape, Prometheus};
use hoststack_e2e::traffic::{Bulk, Loss, BASE_PORT};
use hoststack_e2e::{Lab, LabConfig, NAMESPACE, PROMETHEUS_SECRET};
use serde_json::Value;

/// How long one step of a rollout may take.
const STEP: Duration = Duration::from_secs(90);
/// The tuning's nodes.
const EDGE: [&str; 4] = ["node-a", "node-b", "node-c", "node-d"];

fn lab() -> Lab {
    Lab::start(LabConfig::with_nodes(5)).expect("lab starts")
}

/// A tuning of the edge pool setting `sysctls`, with `rollout` (YAML lines indented by four).
fn tuning(name: &str, sysctls: &[(&str, &str)], rollout: &str) -> String {
    let mut yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  sysctls:\n"
    );
    for (k, v) in sysctls {
        yaml.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    yaml.push_str("  rollout:\n");
    yaml.push_str(rollout);
    yaml
}

/// The applied revision `node`'s agent reports, if its NodeTuning exists yet.
fn applied_revision(lab: &Lab, node: &str) -> Option<String> {
    let out = lab.kubectl(&[
        "get",
        "nodetuning",
        node,
        "-o",
        "jsonpath={.status.appliedRevision}",
    ]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn phase(lab: &Lab, tuning: &str) -> String {
    lab.tuning_status(tuning)["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The nodes of each wave so far.
fn waves(lab: &Lab, tuning: &str) -> Vec<Vec<String>> {
    lab.tuning_status(tuning)["waves"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    w["nodes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|n| n.as_str().unwrap().to_string())
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The revision each node's spec asks for, and its rollout phase.
fn node_spec(lab: &Lab, node: &str) -> (String, String) {
    let nt = lab.get_json(&["get", "nodetuning", node]);
    let s = &nt["spec"];
    (
        s["revision"].as_str().unwrap_or_default().to_string(),
        s["rolloutPhase"].as_str().unwrap_or_default().to_string(),
    )
}

/// The revisions each node's agent has ever been asked for, from the operator's log.
fn assigned(lab: &Lab, node: &str) -> BTreeSet<String> {
    let log = std::fs::read_to_string(lab.log_path("operator")).unwrap_or_default();
    log.lines()
        .filter(|l| {
            l.contains("assigning revision")
                && (l.contains(&format!("node=\"{node}\"")) || l.contains(&format!("node={node} ")))
        })
        .filter_map(|l| {
            let rest = &l[l.find("revision=Some(\"")? + 15..];
            Some(rest[..rest.find('"')?].to_string())
        })
        .collect()
}

/// The transactions `node`'s agent ran for `revision`, by result, from its own counters.
fn transactions(lab: &Lab, node: &str, revision: &str) -> BTreeMap<String, u64> {
    let metrics = scrape(lab.agent_metrics_address(node)).expect("the agent's /metrics answers");
    revision_transactions(&metrics, revision)
}

fn events(lab: &Lab, tuning: &str) -> String {
    let field = format!("regarding.name={tuning}");
    let out = lab.kubectl(&[
        "get",
        "events.events.k8s.io",
        "-A",
        "--field-selector",
        &field,
        "-o",
        "custom-columns=REASON:.reason,NOTE:.note",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of a tuning's recorded revisions (ControllerRevisions), one per line.
fn history(lab: &Lab, tuning: &str) -> String {
    let label = format!("hoststack.dev/tuning={tuning}");
    let out = lab.kubectl(&[
        "get",
        "controllerrevisions",
        "-n",
        NAMESPACE,
        "-l",
        &label,
        "-o",
        "name",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// How many reconciles of `tuning` the running operator has finished
/// (`hoststack_operator_reconciles_total`), once its /metrics answers.
fn reconciles(lab: &Lab, tuning: &str) -> u64 {
    let series = format!("hoststack_operator_reconciles_total{{tuning=\"{tuning}\"}}");
    lab.wait_for("the operator's /metrics", STEP, || {
        let text = scrape(lab.operator_metrics_address())?;
        Some(sample(&text, &series).unwrap_or(0))
    })
}

/// Waits until the operator has acted on `tuning` as it stands when this is called: twice, a
/// harmless annotation changes (a watch event) and one more reconcile of the tuning finishes.
/// Reconciles of one object run one at a time, so the second one counted began after the
/// first had finished, which was after this call: whatever that reconcile decided is written
/// by the time this returns.
fn await_processed(lab: &Lab, tuning: &str) {
    for round in 0..2 {
        let before = reconciles(lab, tuning);
        let nudge = format!("e2e.hoststack.dev/nudge={}-{round}", std::process::id());
        let out = lab.kubectl(&["annotate", "networktuning", tuning, &nudge, "--overwrite"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        lab.wait_for(&format!("the operator to reconcile {tuning}"), STEP, || {
            (reconciles(lab, tuning) > before).then_some(())
        });
    }
}

#[test]
fn canary_waves_pause_promote_and_an_operator_restart() {
    let lab = lab();
    lab.label_node("node-c", "hoststack.dev/canary", Some("true"));
    let originals: Vec<String> = EDGE
        .iter()
        .map(|n| lab.sysctl(n, "net.ipv4.tcp_sack"))
        .collect();
    assert!(originals.iter().all(|v| v == "1"));

    // a. A good change: the labelled canary first, alone for its pause, then waves of two.
    let rollout = "    canary: 1\n    maxUnavailable: 2\n    pauseAfterCanary: 4s\n";
    lab.apply_yaml(&tuning("edge", &[("net.ipv4.tcp_sack", "0")], rollout))
        .expect("accepted");
    let canary = lab.wait_for("the canary to apply", STEP, || {
        let s = lab.tuning_status("edge");
        let w = &s["waves"][0];
        (w["result"] == "Applied").then_some(s)
    });
    let revision = canary["currentRevision"].as_str().unwrap().to_string();
    assert_eq!(waves(&lab, "edge"), vec![vec!["node-c".to_string()]]);
    assert_eq!(lab.sysctl("node-c", "net.ipv4.tcp_sack"), "0");
    // During the canary's pause the others are untouched and keep `stable` (they are the
    // baseline; relabelling them would cost every node a write).
    for node in ["node-a", "node-b", "node-d"] {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), "1", "{node}");
        assert_eq!(node_spec(&lab, node).1, "stable", "{node}");
    }
    assert_eq!(
        node_spec(&lab, "node-c"),
        (revision.clone(), "canary".into())
    );
    let done = lab.wait_tuning_phase("edge", "Complete", STEP);
    assert_eq!(
        waves(&lab, "edge"),
        vec![
            vec!["node-c".to_string()],
            vec!["node-a".to_string(), "node-b".to_string()],
            vec!["node-d".to_string()],
        ]
    );
    assert_eq!(done["stableRevision"], revision.as_str());
    assert_eq!(done["appliedNodes"], 4);
    for node in EDGE {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), "0", "{node}");
        assert_eq!(node_spec(&lab, node), (revision.clone(), "stable".into()));
    }
    let recorded = history(&lab, "edge");
    assert!(recorded.contains(&format!("edge-{revision}")), "{recorded}");
    let ev = events(&lab, "edge");
    assert!(ev.contains("WaveStarted") && ev.contains("Applied"), "{ev}");

    // e. Paused holds before the canary; resuming goes on.
    let paused = "    canary: 1\n    maxUnavailable: 2\n    paused: true\n";
    let sysctls = [("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_dsack", "0")];
    lab.apply_yaml(&tuning("edge", &sysctls, paused))
        .expect("accepted");
    let held = lab.wait_tuning_phase("edge", "Paused", STEP);
    assert_eq!(held["message"], "rollout.paused is set");
    assert!(held["waves"].as_array().is_none_or(|w| w.is_empty()));
    await_processed(&lab, "edge");
    let still = lab.tuning_status("edge");
    assert_eq!(still["phase"], "Paused");
    assert!(still["waves"].as_array().is_none_or(|w| w.is_empty()));
    for node in EDGE {
        assert_eq!(
            lab.sysctl(node, "net.ipv4.tcp_dsack"),
            "1",
            "{node} untouched"
        );
    }
    let out = lab.kubectl(&[
        "patch",
        "networktuning",
        "edge",
        "--type=merge",
        "-p",
        r#"{"spec":{"rollout":{"paused":false}}}"#,
    ]);
    assert!(out.status.success());
    lab.wait_tuning_phase("edge", "Complete", STEP);
    for node in EDGE {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_dsack"), "0", "{node}");
    }

    // e. Promotion by hand, and f. an operator restarted while a wave waits.
    let manual = "    canary: 1\n    maxUnavailable: 2\n    analysis:\n      manual: true\n";
    let with_ecn = [
        ("net.ipv4.tcp_sack", "0"),
        ("net.ipv4.tcp_dsack", "0"),
        ("net.ipv4.tcp_ecn", "1"),
    ];
    lab.apply_yaml(&tuning("edge", &with_ecn, manual))
        .expect("accepted");
    let waiting = lab.wait_for("the canary to wait for promotion", STEP, || {
        let s = lab.tuning_status("edge");
        (s["waves"][0]["analysis"]["verdict"] == "Pending").then_some(s)
    });
    let message = waiting["waves"][0]["analysis"]["message"].as_str().unwrap();
    let current = waiting["currentRevision"].as_str().unwrap().to_string();
    assert!(
        message.contains(&format!(
            "kubectl annotate networktuning edge hoststack.dev/promote={current}-wave0"
        )),
        "{message}"
    );
    assert_eq!(lab.sysctl("node-c", "net.ipv4.tcp_ecn"), "1");
    lab.stop_operator();
    lab.start_operator();
    await_processed(&lab, "edge");
    assert_eq!(
        waves(&lab, "edge"),
        vec![vec!["node-c".to_string()]],
        "no wave repeated or skipped"
    );
    assert_eq!(phase(&lab, "edge"), "Progressing");
    for node in ["node-a", "node-b", "node-d"] {
        assert_ne!(lab.sysctl(node, "net.ipv4.tcp_ecn"), "1", "{node} waits");
    }
    let promote = |wave: &str| {
        let kv = format!("hoststack.dev/promote={current}-wave{wave}");
        let out = lab.kubectl(&["annotate", "networktuning", "edge", &kv, "--overwrite"]);
        assert!(out.status.success());
    };
    promote("0");
    lab.wait_for("wave 1 to wait for promotion", STEP, || {
        let s = lab.tuning_status("edge");
        (s["waves"][1]["analysis"]["verdict"] == "Pending").then_some(())
    });
    // Restarted again in the middle of wave 1.
    lab.stop_operator();
    lab.start_operator();
    promote("1");
    lab.wait_for("wave 2 to wait for promotion", STEP, || {
        let s = lab.tuning_status("edge");
        (s["waves"][2]["analysis"]["verdict"] == "Pending").then_some(())
    });
    promote("2");
    lab.wait_tuning_phase("edge", "Complete", STEP);
    let all = waves(&lab, "edge");
    let flat: Vec<&String> = all.iter().flatten().collect();
    let unique: BTreeSet<&String> = flat.iter().copied().collect();
    assert_eq!((all.len(), flat.len(), unique.len()), (3, 4, 4), "{all:?}");
    for node in EDGE {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_ecn"), "1", "{node}");
    }

    lab.delete_tuning("edge");
    for (node, original) in EDGE.iter().zip(&originals) {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), *original, "{node}");
    }
    // The history goes with the tuning (this lab runs no garbage collector).
    assert_eq!(
        history(&lab, "edge"),
        "",
        "a deleted tuning's history is left"
    );
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_value_the_kernel_refuses_on_the_canary_rolls_back_and_spares_the_others() {
    let lab = lab();
    lab.label_node("node-b", "hoststack.dev/canary", Some("true"));
    let rollout = "    canary: 1\n    maxUnavailable: 2\n";
    lab.apply_yaml(&tuning("edge", &[("net.ipv4.tcp_sack", "0")], rollout))
        .expect("accepted");
    let good = lab.wait_tuning_phase("edge", "Complete", STEP);
    let stable = good["currentRevision"].as_str().unwrap().to_string();

    // tcp_congestion_control must name a congestion control this namespace allows.
    let bad = [
        ("net.ipv4.tcp_sack", "0"),
        ("net.ipv4.tcp_congestion_control", "no-such-cc"),
    ];
    lab.apply_yaml(&tuning("edge", &bad, rollout))
        .expect("accepted");
    let back = lab.wait_tuning_phase("edge", "RolledBack", STEP);
    let bad_revision = back["currentRevision"].as_str().unwrap().to_string();
    assert_ne!(bad_revision, stable);
    let message = back["message"].as_str().unwrap();
    assert!(
        message.contains("node-b failed to apply") && message.contains("tcp_congestion_control"),
        "{message}"
    );
    assert_eq!(back["stableRevision"], stable.as_str());
    let degraded = back["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Degraded")
        .unwrap();
    assert_eq!(
        (&degraded["status"], &degraded["reason"]),
        (&"True".into(), &"RolledBack".into())
    );
    // Every node is back on the stable revision, and only the canary was ever asked for the bad
    // one.
    lab.wait_for("every node to run the stable revision again", STEP, || {
        EDGE.iter()
            .all(|n| {
                let nt = lab.get_json(&["get", "nodetuning", n]);
                nt["status"]["appliedRevision"] == stable.as_str()
                    && nt["status"]["state"] == "Applied"
            })
            .then_some(())
    });
    for node in EDGE {
        assert_eq!(node_spec(&lab, node).0, stable, "{node}");
        let asked = assigned(&lab, node);
        assert_eq!(
            asked.contains(&bad_revision),
            node == "node-b",
            "{node} was asked for {asked:?}"
        );
        // The canary tried the bad revision exactly once, by its own counters.
        let tried = (node == "node-b").then(|| ("failed".to_string(), 1));
        assert_eq!(
            transactions(&lab, node, &bad_revision),
            tried.into_iter().collect(),
            "{node}'s transactions of the bad revision"
        );
    }
    assert!(events(&lab, "edge").contains("RolledBack"));
    // It stays rolled back until the spec changes.
    await_processed(&lab, "edge");
    assert_eq!(phase(&lab, "edge"), "RolledBack");
    lab.delete_tuning("edge");
    lab.stop().expect("the lab stops cleanly");
}

/// Tcp OutSegs of `node`'s namespace, from /proc/net/snmp.
fn out_segs(lab: &Lab, node: &str) -> u64 {
    let out = lab.exec_in_node(node, &["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (
        tcp.next().unwrap_or_default(),
        tcp.next().unwrap_or_default(),
    );
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "OutSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Traffic from every edge node to node-e, and 5 % loss of the canary's segments once it is
/// picked; returns the final status.
fn regression(lab: &Lab, canary: &str, analysis: &str) -> Value {
    lab.label_node(canary, "hoststack.dev/canary", Some("true"));
    let _bulk = Bulk::start(lab, "node-e", &EDGE, "40M", 300).expect("traffic starts");
    for node in EDGE {
        let before = out_segs(lab, node);
        lab.wait_for(&format!("traffic from {node}"), STEP, || {
            (out_segs(lab, node) > before + 1000).then_some(())
        });
    }
    let rollout = format!("    canary: 1\n    maxUnavailable: 2\n{analysis}");
    lab.apply_yaml(&tuning("edge", &[("net.ipv4.tcp_sack", "0")], &rollout))
        .expect("accepted");
    lab.wait_for("the canary to be assigned", STEP, || {
        (waves(lab, "edge").first().map(|w| w[0].as_str()) == Some(canary)).then_some(())
    });
    let port = BASE_PORT + EDGE.iter().position(|n| *n == canary).unwrap() as u16;
    // The canary's segments are lost on the way in to node-e: 5 % of them.
    let _loss = Loss::install(lab, "node-e", lab.node_ip(canary), port, 50).expect("loss");
    let back = lab.wait_tuning_phase("edge", "RolledBack", STEP);
    // Nobody but the canary was ever changed.
    for node in EDGE.iter().filter(|n| **n != canary) {
        assert!(
            !assigned(lab, node).contains(back["currentRevision"].as_str().unwrap()),
            "{node} was never rolled onto"
        );
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), "1", "{node}");
    }
    lab.wait_for("the canary to be reverted", STEP, || {
        (lab.sysctl(canary, "net.ipv4.tcp_sack") == "1").then_some(())
    });
    // The canary applied the rolled-back revision exactly once, the others never.
    let revision = back["currentRevision"].as_str().unwrap();
    for node in EDGE {
        let ran = (node == canary).then(|| ("applied".to_string(), 1));
        assert_eq!(
            transactions(lab, node, revision),
            ran.into_iter().collect(),
            "{node}'s transactions of the rolled-back revision"
        );
    }
    back
}

#[test]
fn a_retransmit_regression_on_the_canary_fails_the_health_analysis() {
    let lab = lab();
    let analysis = "    analysis:\n      window: 4s\n      thresholds:\n        - metric: RetransmitRatio\n          max: \"0.01\"\n          maxRelativeToBaseline: \"3\"\n";
    let back = regression(&lab, "node-a", analysis);
    let wave = &back["waves"][0];
    assert_eq!(wave["result"], "RolledBack");
    let a = &wave["analysis"];
    assert_eq!(a["verdict"], "Fail", "{a}");
    let metrics = a["metrics"].as_array().unwrap();
    let ratio = |key: &str| -> f64 {
        metrics
            .iter()
            .find(|m| m["limit"] == "0.01")
            .and_then(|m| m[key].as_str())
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    assert!(ratio("judged") > 0.01, "{a}");
    let relative = metrics
        .iter()
        .find(|m| m["baseline"].is_string())
        .expect("a baseline value");
    eprintln!("analysis: {a}");
    let baseline: f64 = relative["baseline"].as_str().unwrap().parse().unwrap();
    assert!(baseline < ratio("judged"), "{a}");
    assert!(back["message"]
        .as_str()
        .unwrap()
        .starts_with("analysis failed: RetransmitRatio"));
    lab.delete_tuning("edge");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_retransmit_regression_on_the_canary_fails_the_prometheus_gate() {
    let lab = lab();
    let prometheus = Prometheus::start(&lab).expect("prometheus starts");
    // The installer's Prometheus (plain http, allowed explicitly); the tuning names it as
    // tunings written before the chart held the address do.
    lab.reconfigure_operator(&prometheus.operator_args());
    lab.wait_for("every target up", Duration::from_secs(30), || {
        let up = prometheus.targets_up();
        (up.len() == 1 + lab.node_names().len() && up.values().all(|u| *u)).then_some(())
    });
    let query = r#"sum(rate(hoststack_netstat_total{proto=\"Tcp\",field=\"RetransSegs\",node=~\"{{judged}}\"}[5s])) / sum(rate(hoststack_netstat_total{proto=\"Tcp\",field=\"OutSegs\",node=~\"{{judged}}\"}[5s]))"#;
    let analysis = format!(
        "    analysis:\n      window: 8s\n      prometheus:\n        address: http://{}\n        query: \"{query}\"\n        successCondition: result < 0.01\n        failureCondition: result > 0.02\n",
        prometheus.address()
    );
    let back = regression(&lab, "node-b", &analysis);
    let a = &back["waves"][0]["analysis"];
    assert_eq!(a["verdict"], "Fail", "{a}");
    let m = &a["metrics"][0];
    assert_eq!(m["metric"], "prometheus");
    let value: f64 = m["judged"].as_str().unwrap().parse().unwrap();
    assert!(value > 0.02, "{a}");
    eprintln!("analysis: {a}");

    // The judged values reach users three more ways, each with the status' numbers: an event,
    // the operator's metrics, and the Rollout dashboard's analysis panels.
    let revision = back["currentRevision"].as_str().unwrap();
    let recorded = events(&lab, "edge");
    let judged_text = m["judged"].as_str().unwrap();
    assert!(
        recorded.contains("AnalysisFailed")
            && recorded.contains(&format!(
                "wave 0 of revision {revision}: prometheus {judged_text} (limit result < 0.01) failed"
            )),
        "{recorded}"
    );
    let panels: Value = serde_json::from_str(include_str!(
        "../../charts/hoststack/dashboards/rollout.json"
    ))
    .unwrap();
    let expr_of = |title: &str| {
        panels["panels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("the panel {title}"))["targets"][0]["expr"]
            .as_str()
            .unwrap()
            .replace("$tuning", "edge")
    };
    let shown = |title: &str| {
        lab.wait_for(
            &format!("{title} in Prometheus"),
            Duration::from_secs(30),
            || {
                let samples = prometheus.query(&expr_of(title), None).ok()?;
                (!samples.is_empty()).then_some(samples)
            },
        )
    };
    let values: BTreeMap<String, f64> = shown("Analysis: judged values against their limits")
        .into_iter()
        .filter(|s| s.labels["revision"] == revision && s.labels["wave"] == "0")
        .map(|s| {
            (
                format!("{}/{}", s.labels["metric"], s.labels["series"]),
                s.value,
            )
        })
        .collect();
    assert_eq!(
        values,
        BTreeMap::from([
            ("prometheus/judged".to_string(), value),
            ("prometheus/limit".to_string(), 0.01),
        ]),
        "{a}"
    );
    eprintln!(
        "events:\n{}\nanalysis panel at the canary's verdict: {values:?}",
        recorded
            .lines()
            .filter(|l| l.starts_with("Analysis"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let verdicts = shown("Analysis verdicts");
    assert!(
        verdicts.iter().any(|s| s.labels["revision"] == revision
            && s.labels["metric"] == "prometheus"
            && s.value == 0.0),
        "{verdicts:?}"
    );

    // The Rollout dashboard's first panel, as Grafana would evaluate it at the end of the
    // canary's window, splits the retransmit ratio by phase: the canary above the baseline.
    let dashboard: Value = serde_json::from_str(include_str!(
        "../../charts/hoststack/dashboards/rollout.json"
    ))
    .unwrap();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Retransmit ratio by phase")
        .expect("the panel");
    let expr = panel["targets"][0]["expr"]
        .as_str()
        .unwrap()
        .replace("$__rate_interval", "5s")
        .replace("$tuning", "edge")
        .replace("$node", ".*");
    let applied: k8s_openapi::jiff::Timestamp = back["waves"][0]["appliedAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let at = applied.as_second() as f64 + 8.0;
    let by_phase: std::collections::BTreeMap<String, f64> = prometheus
        .query(&expr, Some(at))
        .expect("the panel's query")
        .into_iter()
        .map(|s| (s.labels["phase"].clone(), s.value))
        .collect();
    eprintln!("retransmit ratio by phase at the canary's window: {by_phase:?}");
    assert!(by_phase["canary"] > 0.02, "{by_phase:?}");
    assert!(
        by_phase["stable"] < by_phase["canary"] / 5.0,
        "{by_phase:?}"
    );

    // `kubectl hoststack report` draws the same from the range API, with the rollout's moments.
    let (svg, data) = (
        lab.dir().join("rollout.svg"),
        lab.dir().join("rollout.json"),
    );
    let out = std::process::Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(["report", "edge", "--prometheus"])
        .arg(format!("http://{}", prometheus.address()))
        .arg("--out")
        .arg(&svg)
        .arg("--data")
        .arg(&data)
        .output()
        .expect("the plugin runs");
    eprintln!(
        "$ kubectl hoststack report edge ...\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{out:?}");
    let picture = std::fs::read_to_string(&svg).expect("the SVG was written");
    assert!(picture.starts_with("<svg"), "{}", &picture[..80]);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&data).unwrap()).unwrap();
    let markers = report["markers"].as_array().unwrap();
    let at = |kind: &str| {
        markers
            .iter()
            .find(|m| m["kind"] == kind && (kind != "waveApplied" || m["wave"] == 0))
            .unwrap_or_else(|| panic!("a {kind} marker: {markers:?}"))
    };
    let canary_applied = at("waveApplied");
    assert_eq!(canary_applied["time"], back["waves"][0]["appliedAt"]);
    let rolled_back = at("rolledBack")["at"].as_f64().unwrap();
    let canary_applied = canary_applied["at"].as_f64().unwrap();
    assert!(rolled_back > canary_applied, "{markers:?}");
    let panel = &report["panels"][0];
    assert_eq!(panel["title"], "Retransmit ratio by phase");
    let max_in_canary_window = |phase: &str| {
        panel["series"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["phase"] == phase)
            .unwrap_or_else(|| panic!("a {phase} series: {panel}"))["points"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| (canary_applied..=rolled_back).contains(&p[0].as_f64().unwrap()))
            .map(|p| p[1].as_f64().unwrap())
            .fold(f64::NAN, f64::max)
    };
    let (canary, baseline) = (
        max_in_canary_window("canary"),
        max_in_canary_window("stable"),
    );
    eprintln!(
        "report: max retransmit ratio in the canary's window: canary {canary}, baseline {baseline}"
    );
    assert!(canary > 0.02, "{canary}");
    assert!(baseline < canary, "{baseline} < {canary}");
    // A Prometheus that does not answer (a port nobody listens on) is exit 1, named.
    let closed = std::net::TcpListener::bind((lab.loopback_ip(), 0))
        .and_then(|l| l.local_addr())
        .unwrap();
    let out = std::process::Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(["report", "edge", "--prometheus"])
        .arg(format!("http://{closed}"))
        .arg("--out")
        .arg(&svg)
        .output()
        .expect("the plugin runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("$ kubectl hoststack report edge --prometheus http://{closed} ...\n{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: Prometheus unreachable: http://{closed}: ")),
        "{stderr}"
    );
    lab.delete_tuning("edge");
    drop(prometheus);
    lab.stop().expect("the lab stops cleanly");
}

/// Waits until `tuning` completes its current revision and checks that every wave passed its
/// analysis, that every measured value passed, and that every edge node runs the revision as
/// the stable one; the waves' analyses.
fn promoted(lab: &Lab, tuning: &str, want_waves: usize) -> Vec<Value> {
    let done = lab.wait_tuning_phase(tuning, "Complete", STEP);
    let current = done["currentRevision"].as_str().unwrap().to_string();
    assert_eq!(done["stableRevision"], current.as_str(), "{done}");
    let waves = done["waves"].as_array().expect("waves").clone();
    assert_eq!(waves.len(), want_waves, "{done}");
    let analyses: Vec<Value> = waves.iter().map(|w| w["analysis"].clone()).collect();
    for (i, a) in analyses.iter().enumerate() {
        assert_eq!(a["verdict"], "Pass", "wave {i}: {a}");
        let metrics = a["metrics"].as_array().expect("measured values");
        assert!(!metrics.is_empty(), "wave {i} was measured: {a}");
        assert!(metrics.iter().all(|m| m["passed"] == true), "wave {i}: {a}");
    }
    for node in EDGE {
        assert_eq!(node_spec(lab, node), (current.clone(), "stable".into()));
        assert_eq!(
            applied_revision(lab, node).as_deref(),
            Some(current.as_str())
        );
    }
    eprintln!("{tuning} {current} promoted: {analyses:?}");
    analyses
}

/// The Secret the chart lets the operator read for the Prometheus gate, with basic-auth
/// `password` for user alice and the CA bundle `ca`.
fn prometheus_secret(lab: &Lab, password: &str, ca: &[u8]) {
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": { "name": PROMETHEUS_SECRET, "namespace": NAMESPACE },
        "stringData": {
            "username": "alice",
            "password": password,
            "ca.crt": String::from_utf8_lossy(ca),
        },
    });
    lab.apply_yaml(&secret.to_string())
        .expect("the Secret is stored");
}

/// The tuning's condition of `type_`, once it is there.
fn condition(lab: &Lab, tuning: &str, type_: &str) -> Option<Value> {
    lab.tuning_status(tuning)["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

#[test]
fn healthy_waves_pass_the_health_analysis_and_the_prometheus_gate() {
    let lab = lab();
    // Prometheus as deployments run it: https (a certificate of the lab's CA) and basic auth.
    let prometheus = Prometheus::start_secured(&lab, "alice", "s3cret").expect("prometheus starts");
    let ca = prometheus.ca_pem().expect("a CA").to_vec();
    // The chart's prometheus.address: the one endpoint the gate may send credentials to.
    lab.reconfigure_operator(&prometheus.operator_args());
    lab.wait_for("every target up", Duration::from_secs(30), || {
        let up = prometheus.targets_up();
        (up.len() == 1 + lab.node_names().len() && up.values().all(|u| *u)).then_some(())
    });
    lab.label_node("node-a", "hoststack.dev/canary", Some("true"));
    let bulk = Bulk::start(&lab, "node-e", &EDGE, "40M", 300).expect("traffic starts");
    for node in EDGE {
        let before = out_segs(&lab, node);
        lab.wait_for(&format!("traffic from {node}"), STEP, || {
            (out_segs(&lab, node) > before + 1000).then_some(())
        });
    }

    // The built-in analysis alone: the canary, then one wave of the other three, each judged
    // on its health samples and promoted.
    let thresholds = "    canary: 1\n    maxUnavailable: 3\n    analysis:\n      window: 4s\n      thresholds:\n        - metric: RetransmitRatio\n          max: \"0.01\"\n";
    lab.apply_yaml(&tuning("edge", &[("net.ipv4.tcp_sack", "0")], thresholds))
        .expect("accepted");
    let analyses = promoted(&lab, "edge", 2);
    assert_eq!(waves(&lab, "edge")[0], ["node-a"]);
    for a in &analyses {
        let m = &a["metrics"][0];
        assert_eq!(
            (&m["metric"], &m["limit"]),
            (&"RetransmitRatio".into(), &"0.01".into())
        );
        let judged: f64 = m["judged"].as_str().unwrap().parse().unwrap();
        assert!(judged < 0.01, "{a}");
    }
    assert!(
        analyses[0]["requestId"]
            .as_str()
            .is_some_and(|id| id.ends_with("-wave0")),
        "the canary was judged on its own samples: {}",
        analyses[0]
    );

    // The Prometheus gate alone, on the next revision: https trusting the CA bundle and basic
    // auth, both from the Secret the chart lets the operator read, and a tenant header.
    prometheus_secret(&lab, "wrong", &ca);
    let query = r#"sum(rate(hoststack_netstat_total{proto=\"Tcp\",field=\"RetransSegs\",node=~\"{{judged}}\"}[5s])) / sum(rate(hoststack_netstat_total{proto=\"Tcp\",field=\"OutSegs\",node=~\"{{judged}}\"}[5s]))"#;
    let gate = |address: &str| {
        format!(
            "    canary: 1\n    maxUnavailable: 3\n    analysis:\n      window: 6s\n      prometheus:\n{address}        secretName: {PROMETHEUS_SECRET}\n        headers:\n          - name: X-Scope-OrgID\n            value: team-a\n        timeout: 5s\n        query: \"{query}\"\n        successCondition: result < 0.01\n        failureCondition: result > 0.02\n"
        )
    };
    let next = [("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_dsack", "0")];
    // First the tuning names an address of its own (a listener on the lab's loopback address):
    // the gate refuses it, sends it nothing, and the rollout pauses at the canary.
    let decoy = std::net::TcpListener::bind((lab.loopback_ip(), 0)).expect("a free port");
    decoy.set_nonblocking(true).expect("non-blocking");
    let decoy_url = format!("https://{}", decoy.local_addr().unwrap());
    lab.apply_yaml(&tuning(
        "edge",
        &next,
        &gate(&format!("        address: {decoy_url}\n")),
    ))
    .expect("accepted");
    let refused = lab.wait_for("the gate's refusal of the tuning's address", STEP, || {
        condition(&lab, "edge", "PrometheusAnswered").filter(|c| c["status"] == "False")
    });
    eprintln!("PrometheusAnswered: {refused}");
    assert_eq!(refused["reason"], "AddressNotAllowed", "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "{decoy_url:?} is not a Prometheus the operator was installed to ask"
        )) && message.contains(prometheus.url()),
        "{refused}"
    );
    let status = lab.tuning_status("edge");
    assert_eq!(status["phase"], "Paused", "{status}");
    assert_eq!(
        status["waves"][0]["analysis"]["prometheusOutcome"], "AddressNotAllowed",
        "{status}"
    );
    assert_eq!(waves(&lab, "edge").len(), 1, "nothing went past the canary");
    match decoy.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the tuning's address was contacted: {other:?}"),
    }
    // The tuning names no address (the installer's Prometheus), with a wrong password in the
    // Secret: the canary's analysis is inconclusive and says why, never a pass.
    lab.apply_yaml(&tuning("edge", &next, &gate("")))
        .expect("accepted");
    let refused = lab.wait_for("the gate's refusal", STEP, || {
        condition(&lab, "edge", "PrometheusAnswered")
            .filter(|c| c["status"] == "False" && c["reason"] != "AddressNotAllowed")
    });
    eprintln!("PrometheusAnswered: {refused}");
    assert_eq!(refused["reason"], "Unauthorized", "{refused}");
    assert!(
        refused["message"].as_str().unwrap().contains("401"),
        "{refused}"
    );
    let status = lab.tuning_status("edge");
    assert_eq!(status["phase"], "Paused", "{status}");
    assert_eq!(
        status["waves"][0]["analysis"]["verdict"], "Inconclusive",
        "{status}"
    );
    assert_eq!(
        status["waves"][0]["analysis"]["prometheusOutcome"], "Unauthorized",
        "{status}"
    );
    let progressing = condition(&lab, "edge", "Progressing").unwrap();
    assert_eq!(
        progressing["reason"], "AnalysisInconclusive",
        "{progressing}"
    );
    assert_eq!(waves(&lab, "edge").len(), 1, "nothing went past the canary");
    // The right password: the same canary passes and the rollout goes on by itself.
    prometheus_secret(&lab, "s3cret", &ca);
    let analyses = promoted(&lab, "edge", 2);
    let answered = condition(&lab, "edge", "PrometheusAnswered").unwrap();
    assert_eq!(
        (&answered["status"], &answered["reason"]),
        (&"True".into(), &"Answered".into()),
        "{answered}"
    );
    for a in &analyses {
        let m = &a["metrics"][0];
        assert_eq!(m["metric"], "prometheus", "{a}");
        let value: f64 = m["judged"].as_str().unwrap().parse().unwrap();
        assert!(value < 0.01, "{a}");
    }
    for node in EDGE {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_dsack"), "0", "{node}");
    }
    drop(bulk);
    lab.delete_tuning("edge");
    drop(prometheus);
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn silent_agents_are_not_rolled_onto_and_joining_nodes_get_the_stable_revision() {
    let mut config = LabConfig::with_nodes(5);
    config.agent_args = vec!["--heartbeat-interval".into(), "1s".into()];
    let lab = Lab::start(config).expect("lab starts");
    let rollout = "    canary: 1\n    maxUnavailable: 2\n    pauseAfterCanary: 6s\n";
    lab.apply_yaml(&tuning("edge", &[("net.ipv4.tcp_sack", "0")], rollout))
        .expect("accepted");
    let stable = lab.wait_tuning_phase("edge", "Complete", STEP)["currentRevision"]
        .as_str()
        .unwrap()
        .to_string();

    // node-d's agent goes silent: its heartbeat expires after three intervals.
    lab.kill_agent("node-d", hoststack_e2e::Signal::Kill);
    std::thread::sleep(Duration::from_secs(5));
    let next = [("net.ipv4.tcp_sack", "0"), ("net.ipv4.tcp_dsack", "0")];
    lab.apply_yaml(&tuning("edge", &next, rollout))
        .expect("accepted");
    lab.wait_for("the canary's pause", STEP, || {
        (lab.tuning_status("edge")["waves"][0]["result"] == "Applied").then_some(())
    });
    // A node joins the pool while the canary is paused: it gets the stable revision.
    lab.label_node("node-e", "pool", Some("edge"));
    lab.wait_for("node-e to apply the stable revision", STEP, || {
        (applied_revision(&lab, "node-e")? == stable).then_some(())
    });
    assert_eq!(node_spec(&lab, "node-e"), (stable.clone(), "stable".into()));
    assert_eq!(lab.sysctl("node-e", "net.ipv4.tcp_sack"), "0");
    assert_eq!(lab.sysctl("node-e", "net.ipv4.tcp_dsack"), "1");

    let done = lab.wait_tuning_phase("edge", "Complete", STEP);
    let current = done["currentRevision"].as_str().unwrap().to_string();
    let rolled: BTreeSet<String> = waves(&lab, "edge").into_iter().flatten().collect();
    assert!(
        !rolled.contains("node-d"),
        "the silent node is in no wave: {rolled:?}"
    );
    assert!(
        rolled.contains("node-e"),
        "the joined node took part: {rolled:?}"
    );
    assert_eq!(lab.sysctl("node-d", "net.ipv4.tcp_dsack"), "1");
    // Once the revision is proven everywhere it is the stable one, and the node that comes back
    // gets it.
    lab.start_agent("node-d", &[]);
    lab.wait_for("node-d to catch up", STEP, || {
        (applied_revision(&lab, "node-d")? == current).then_some(())
    });
    assert_eq!(lab.sysctl("node-d", "net.ipv4.tcp_dsack"), "0");
    lab.delete_tuning("edge");
    lab.stop().expect("the lab stops cleanly");
}
