//! Metrics and dashboards against a real Prometheus scraping the lab.
//!
//! Debian's Prometheus scrapes the operator and every agent each second. A tuning is applied,
//! then real TCP traffic (iperf3) runs from node-a to node-b with 2% random loss each way,
//! made by an nftables `numgen` rule on node-a's eth0. Then every query of every panel of
//! the Node and Rollout dashboards in charts/hoststack/dashboards is evaluated at a moment
//! inside the lossy run and must return data (the User-space stack dashboard is proven where
//! that stack runs, e2e/tests/userstack.rs), the loss counters must have risen, `promtool check metrics` must accept
//! each /metrics output, and the agent's resident memory must stay flat over 2,000 scrapes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hoststack_e2e::prometheus::{http_get, Prometheus, SCRAPE_INTERVAL};
use hoststack_e2e::traffic::Loss;
use hoststack_e2e::{dashboards, Lab, LabConfig};
use serde_json::Value;

/// The tuning applied (pool=edge: node-a and node-b).
const TUNING: &str = "edge-sack";
/// Sends the bulk traffic; the loss rule lives in its namespace.
const SENDER: &str = "node-a";
/// Runs the iperf3 server.
const RECEIVER: &str = "node-b";

/// TcpExt/Tcp fields that rise under random loss on this kernel (6.18, checked by hand with
/// the same rule: RetransSegs, TCPSackRecovery, TCPFastRetrans, TCPLossProbes, TCPDSACKRecv and
/// TCPDSACKRecvSegs move; TCPTimeouts does not, SACK recovery repairs the losses first).
const MUST_RISE: [(&str, &str); 6] = [
    ("Tcp", "RetransSegs"),
    ("TcpExt", "TCPSackRecovery"),
    ("TcpExt", "TCPFastRetrans"),
    ("TcpExt", "TCPLossProbes"),
    ("TcpExt", "TCPDSACKRecv"),
    ("TcpExt", "TCPDSACKRecvSegs"),
];

/// Reported beside them, without a requirement.
const REPORTED: [(&str, &str); 4] = [
    ("Tcp", "OutSegs"),
    ("TcpExt", "TCPTimeouts"),
    ("TcpExt", "TCPSACKReorder"),
    ("TcpExt", "TCPDSACKUndo"),
];

/// Panels that show a judged rollout's analysis, which this test's tuning (no analysis) does
/// not run: e2e/tests/rollout.rs proves their queries against a real Prometheus with the
/// values the tuning's status holds (`a_retransmit_regression_on_the_canary_fails_the_prometheus_gate`).
const JUDGED_ROLLOUT_PANELS: [&str; 2] = [
    "Analysis: judged values against their limits",
    "Analysis verdicts",
];

fn dashboards() -> Vec<(String, Value)> {
    dashboards::all()
}

fn substitute(expr: &str) -> String {
    dashboards::substitute(expr, TUNING, SENDER)
}

/// The dashboards are well-formed Grafana JSON: the three expected, unique ids, template
/// variables for data source, tuning and node, and on every panel a title, a description, a
/// unit, the templated data source and at least one query; the user-space dashboard queries
/// only stack="userspace" and the others only stack="kernel".
#[test]
fn dashboards_are_valid_grafana_json() {
    let boards = dashboards();
    let names: Vec<&str> = boards.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["node.json", "rollout.json", "userspace.json"]);
    for (name, d) in &boards {
        assert!(
            d["uid"]
                .as_str()
                .is_some_and(|u| u.starts_with("hoststack-")),
            "{name}"
        );
        assert!(d["title"].as_str().is_some(), "{name}");
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(vars, ["datasource", "tuning", "node"], "{name}");
        let mut ids = std::collections::BTreeSet::new();
        for panel in d["panels"].as_array().unwrap() {
            let title = panel["title"].as_str().unwrap_or_default();
            assert!(
                ids.insert(panel["id"].as_u64().unwrap()),
                "{name}: id twice"
            );
            assert!(!title.is_empty(), "{name}: a panel without a title");
            assert!(
                panel["description"].as_str().is_some_and(|s| s.len() > 20),
                "{name}/{title}: no description"
            );
            assert!(
                panel["fieldConfig"]["defaults"]["unit"].as_str().is_some(),
                "{name}/{title}: no unit"
            );
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}/{title}"
            );
            for key in ["x", "y", "w", "h"] {
                assert!(panel["gridPos"][key].as_u64().is_some(), "{name}/{title}");
            }
            let targets = panel["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{name}/{title}: no query");
            for t in targets {
                let expr = t["expr"].as_str().unwrap();
                if expr.contains("hoststack_netstat") {
                    let want = if name == "userspace.json" {
                        "stack=\"userspace\""
                    } else {
                        "stack=\"kernel\""
                    };
                    let other = if name == "userspace.json" {
                        "stack=\"kernel\""
                    } else {
                        "stack=\"userspace\""
                    };
                    assert!(expr.contains(want), "{name}/{title}: {expr}");
                    assert!(!expr.contains(other), "{name}/{title}: {expr}");
                }
            }
        }
    }
}

/// The chart packages each dashboard as a ConfigMap labelled grafana_dashboard: "1" (checked
/// with the lab's helm, which scripts/setup.sh builds).
#[test]
fn the_chart_packages_the_dashboards() {
    let bin = hoststack_e2e::control_plane_dir();
    let helm = bin.join("helm");
    assert!(
        helm.exists(),
        "no helm at {}: run scripts/setup.sh",
        helm.display()
    );
    let home = tempdir();
    let out = Command::new(&helm)
        .args(["template", "hs", "../charts/hoststack"])
        .args(["--show-only", "templates/dashboards.yaml"])
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("helm runs");
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("kind: ConfigMap").count(), dashboards().len());
    assert_eq!(
        text.matches("grafana_dashboard: \"1\"").count(),
        dashboards().len()
    );
    for (name, _) in dashboards() {
        assert!(text.contains(&format!("hoststack-{name}: |-")), "{name}");
    }
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hoststack-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The netstat counters of one /metrics text (Prometheus text format): (proto, field) → value.
fn netstat(text: &str) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("hoststack_netstat_total{stack=\"kernel\",proto=\"")
        else {
            continue;
        };
        let (proto, rest) = rest.split_once("\",field=\"").unwrap();
        let (field, value) = rest.split_once("\"} ").unwrap();
        out.insert(
            (proto.to_string(), field.to_string()),
            value.parse().unwrap(),
        );
    }
    out
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics", None).expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// `promtool check metrics` on `text`; its complaints.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package) runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let lab = Lab::start(LabConfig::default()).expect("lab starts");
    let prometheus = Prometheus::start(&lab).expect("prometheus starts");
    eprintln!("prometheus on {}", prometheus.address());

    // Every target up first, so that Prometheus sees the tuning's transactions happen.
    lab.wait_for("every target up", Duration::from_secs(30), || {
        let up = prometheus.targets_up();
        (up.len() == 1 + lab.node_names().len() && up.values().all(|u| *u)).then_some(())
    });
    // A tuning, applied and verified on the edge nodes.
    lab.apply_yaml(include_str!("../../examples/edge-sack.yaml"))
        .expect("the example applies");
    for node in [SENDER, RECEIVER] {
        lab.wait_for(&format!("{node} to apply"), Duration::from_secs(60), || {
            let out = lab.kubectl(&["get", "nodetuning", node, "-o", "jsonpath={.status.state}"]);
            (String::from_utf8_lossy(&out.stdout) == "Applied").then_some(())
        });
    }
    // node_info says which tuning governs which node.
    lab.wait_for(
        "node_info of both edge nodes in Prometheus",
        Duration::from_secs(30),
        || {
            let expr = format!("hoststack_node_info{{tuning=\"{TUNING}\"}}");
            (prometheus.query(&expr, None).ok()?.len() == 2).then_some(())
        },
    );

    // promtool accepts every /metrics output, agents' and operator's.
    let mut endpoints: Vec<(String, std::net::SocketAddr)> = lab
        .node_names()
        .into_iter()
        .map(|n| (format!("agent {n}"), lab.agent_metrics_address(&n)))
        .collect();
    endpoints.push(("operator".into(), lab.operator_metrics_address()));
    for (what, addr) in &endpoints {
        let (ok, said) = promtool(&scrape(*addr));
        assert!(ok && said.trim().is_empty(), "promtool on {what}: {said}");
    }

    // Lossy traffic, until every counter of MUST_RISE rose (at most 3 runs of 4 s).
    let sender_metrics = lab.agent_metrics_address(SENDER);
    let before = netstat(&scrape(sender_metrics));
    let receiver_ip = lab.node_ip(RECEIVER).to_string();
    let sender_ip = lab.node_ip(SENDER).to_string();
    lab.spawn_helper(
        "iperf3-server",
        &[
            "ip",
            "netns",
            "exec",
            lab.netns(RECEIVER),
            "iperf3",
            "-s",
            "-B",
            &receiver_ip,
        ],
    )
    .expect("iperf3 server starts");
    let mut after = before.clone();
    let mut loss_end = 0.0;
    {
        let _loss =
            Loss::install(&lab, SENDER, lab.node_ip(RECEIVER), 5201, 20).expect("loss installs");
        assert!(Loss::tables(&lab, SENDER).contains("hs_loss"));
        for run in 1..=3 {
            let started = Instant::now();
            let out = loop {
                let out = lab.exec_in_node(
                    SENDER,
                    &[
                        "timeout",
                        "30",
                        "iperf3",
                        "-c",
                        &receiver_ip,
                        "-B",
                        &sender_ip,
                        "-t",
                        "4",
                    ],
                );
                // The server may not listen yet.
                if out.status.success() || started.elapsed() > Duration::from_secs(10) {
                    break out;
                }
                std::thread::sleep(Duration::from_millis(300));
            };
            loss_end = unix_now();
            assert!(
                out.status.success(),
                "iperf3: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let summary = String::from_utf8_lossy(&out.stdout);
            eprintln!(
                "iperf3 run {run}: {}",
                summary.lines().rev().nth(3).unwrap_or_default().trim()
            );
            after = netstat(&scrape(sender_metrics));
            let rose = |k: &(&str, &str)| {
                let key = (k.0.to_string(), k.1.to_string());
                after.get(&key) > before.get(&key)
            };
            if MUST_RISE.iter().all(rose) {
                break;
            }
        }
    }
    assert!(
        !Loss::tables(&lab, SENDER).contains("hs_loss"),
        "the loss table is removed"
    );
    if let Some(Err(e)) = lab.stop_helper("iperf3-server") {
        eprintln!("stopping iperf3: {e}");
    }
    eprintln!("counters of {SENDER} before and after the lossy runs:");
    for (proto, field) in MUST_RISE.iter().chain(REPORTED.iter()) {
        let key = (proto.to_string(), field.to_string());
        eprintln!(
            "  {proto} {field}: {} -> {}",
            before.get(&key).copied().unwrap_or_default(),
            after.get(&key).copied().unwrap_or_default()
        );
    }
    for (proto, field) in MUST_RISE {
        let key = (proto.to_string(), field.to_string());
        assert!(
            after.get(&key) > before.get(&key),
            "{proto} {field} did not rise under loss: {:?} -> {:?}",
            before.get(&key),
            after.get(&key)
        );
    }

    // Let Prometheus scrape past the end of the run, then evaluate every panel's queries at a
    // moment inside it, so that the rates see the lossy traffic.
    std::thread::sleep(3 * SCRAPE_INTERVAL);
    let at = loss_end - 1.5;
    let mut failures = Vec::new();
    let mut proven = 0;
    for (name, dashboard) in dashboards() {
        // The user-space stack does not run in this lab: e2e/tests/userstack.rs, where it
        // does, proves that dashboard's queries return data.
        if name == "userspace.json" {
            continue;
        }
        // Template variables: label_values(<selector>, <label>).
        for var in dashboard["templating"]["list"].as_array().unwrap() {
            let Some(def) = var["definition"].as_str() else {
                continue;
            };
            let inner = def
                .strip_prefix("label_values(")
                .and_then(|d| d.strip_suffix(')'))
                .unwrap();
            let (selector, label) = inner.rsplit_once(", ").unwrap();
            let selector = substitute(selector);
            match prometheus.query(&selector, Some(at)) {
                Ok(r) if r.iter().any(|s| s.labels.contains_key(label)) => {}
                other => failures.push(format!("{name} variable {def}: {other:?}")),
            }
        }
        for dashboards::Query {
            panel: title,
            ref_id,
            expr,
        } in dashboards::queries(&dashboard)
        {
            let expr = substitute(&expr);
            match prometheus.query(&expr, Some(at)) {
                Ok(result)
                    if result.is_empty() && !JUDGED_ROLLOUT_PANELS.contains(&title.as_str()) =>
                {
                    failures.push(format!("{name} / {title} / {ref_id}: no data for {expr}"))
                }
                Ok(result) => {
                    proven += usize::from(!result.is_empty());
                    let values: Vec<String> = result
                        .iter()
                        .take(4)
                        .map(|s| {
                            let legend = ["phase", "field", "cpu", "state", "result", "node"]
                                .iter()
                                .find_map(|k| s.labels.get(*k).map(|v| format!("{k}={v}")))
                                .unwrap_or_default();
                            format!("{legend} {:.4}", s.value)
                        })
                        .collect();
                    eprintln!(
                        "{name} / {title} / {ref_id}: {} series: {}",
                        result.len(),
                        values.join(", ")
                    );
                }
                Err(e) => failures.push(format!("{name} / {title} / {ref_id}: {e}: {expr}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "dashboard queries failed:\n{}",
        failures.join("\n")
    );
    eprintln!("{proven} panel queries returned data");

    // The agent's resident memory stays flat over 2,000 scrapes.
    let pid = lab.agent_pid(SENDER).expect("the agent runs");
    for _ in 0..200 {
        scrape(sender_metrics);
    }
    let warm = vm_rss_kib(pid);
    for _ in 0..2000 {
        scrape(sender_metrics);
    }
    let end = vm_rss_kib(pid);
    eprintln!("agent VmRSS: {warm} KiB after 200 scrapes, {end} KiB after 2,200");
    assert!(
        end <= warm + 1024,
        "the agent's VmRSS grew from {warm} KiB to {end} KiB over 2,000 scrapes"
    );

    drop(prometheus);
    lab.stop().expect("clean teardown");
}
