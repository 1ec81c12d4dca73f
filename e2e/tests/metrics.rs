//! Metrics and dashboards against a real Prometheus scraping the lab.
//!
//! Debian's Prometheus scrapes the operator and every agent each second. A tuning is applied,
//! then real TCP traffic (iperf3) runs from node-a to node-b with 2% random loss each way,
//! made by an nftables `numgen` rule on node-a's eth0. Then every query of every panel of
//! the Node and Rollout dashboards in charts/hoststack/dashboards is evaluated at a moment
//! inside the lossy run and must return data that shows what the lab is known to be doing
//! ([`known_value`]: a value, a bound or a label per panel; the User-space stack dashboard is
//! proven where that stack runs, e2e/tests/userstack.rs), the loss counters must have risen,
//! `promtool check metrics` must accept each /metrics output, and the agent's resident memory must stay flat over 2,000 scrapes.

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

/// What the test knows about the lab at the moment the panels are evaluated.
struct Known {
    /// The tuning's revision, applied on both edge nodes.
    revision: String,
    /// The CPUs of the machine (each node's softnet counters have one series per CPU).
    cpus: usize,
}

/// Checks the answer of one panel query against what the lab is known to show inside the lossy
/// run (node-a sending to node-b with 2 % loss each way, the tuning complete on both edge
/// nodes, no transaction, probe or listen drop since): a value, a bound or a label, never only
/// that some data came back. A panel without a check here fails, so a new panel gets one.
fn known_value(
    dashboard: &str,
    panel: &str,
    ref_id: &str,
    samples: &[hoststack_e2e::prometheus::Sample],
    known: &Known,
) -> Result<(), String> {
    let values: Vec<f64> = samples.iter().map(|s| s.value).collect();
    let label = |s: &hoststack_e2e::prometheus::Sample, k: &str| {
        s.labels.get(k).cloned().unwrap_or_default()
    };
    let by = |k: &str| -> BTreeMap<String, f64> {
        samples.iter().map(|s| (label(s, k), s.value)).collect()
    };
    let all = |ok: &dyn Fn(f64) -> bool, what: &str| {
        if !values.is_empty() && values.iter().all(|v| ok(*v)) {
            Ok(())
        } else {
            Err(format!("want every value {what}"))
        }
    };
    let want = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
    let ratio = |v: f64| v > 0.0 && v < 0.5;
    match (dashboard, panel, ref_id) {
        ("node.json", "Retransmit ratio", _) => all(&ratio, "in (0, 0.5): 2 % loss each way"),
        ("node.json", "TCP segments", _) => {
            let f = by("field");
            want(
                f.get("OutSegs") > Some(&0.0) && f.get("RetransSegs") < f.get("OutSegs"),
                "OutSegs above 0, RetransSegs below it".into(),
            )
        }
        ("node.json", "Loss recovery events", _)
        | ("node.json", "SACK and D-SACK per 1000 segments", _) => want(
            by("field").get("TCPSackRecovery") > Some(&0.0),
            "TCPSackRecovery above 0 under loss".into(),
        ),
        ("node.json", "Listen queue drops", _)
        | ("node.json", "Exporter read errors", _)
        | ("node.json", "Agent transactions", _)
        | ("node.json", "Post-apply probes and self-reverts", _)
        | ("rollout.json", "Listen drops per node by phase", _)
        | ("rollout.json", "Apply failures", _) => all(&|v| v == 0.0, "0: none happened"),
        ("node.json", "Established connections", _) => {
            all(&|v| v >= 1.0, "at least 1: iperf3's connection")
        }
        ("node.json", "Softnet drops and squeezes per CPU", _)
        | ("node.json", "Softnet packets processed per CPU", _) => {
            let per_cpu = want(
                samples.len() == known.cpus,
                format!("one series per CPU ({})", known.cpus),
            );
            let moved = if ref_id == "A" && panel.contains("processed") {
                want(values.iter().sum::<f64>() > 0.0, "packets processed".into())
            } else {
                all(&|v| v >= 0.0, "a rate, not negative")
            };
            per_cpu.and(moved)
        }
        ("node.json", "Applied revision", "B") => want(
            values == [1.0] && label(&samples[0], "tuning") == TUNING,
            format!("node_info of 1 for {TUNING}"),
        ),
        // `$node` is node-a here, as a user who picked that node would see it.
        ("node.json", "Applied revision", _) | ("rollout.json", "Applied revision per node", _) => {
            want(
                samples.len() == 1
                    && samples.iter().all(|s| {
                        s.value == 1.0
                            && label(s, "revision") == known.revision
                            && label(s, "node") == SENDER
                    }),
                format!("1 for node-a's revision {}", known.revision),
            )
        }
        ("node.json", "Transaction duration (p99)", _)
        | ("rollout.json", "Operator reconcile duration (p99)", _) => {
            all(&|v| v > 0.0 && v < 65.6, "a duration in (0, 65.5] s")
        }
        ("rollout.json", "Retransmit ratio by phase", _) => want(
            by("phase").get("stable").is_some_and(|v| ratio(*v)),
            "stable in (0, 0.5)".into(),
        ),
        ("rollout.json", "SACK recoveries per 1000 segments by phase", _) => want(
            by("phase").get("stable") > Some(&0.0),
            "stable above 0 under loss".into(),
        ),
        ("rollout.json", "D-SACKs received per 1000 segments by phase", _)
        | ("rollout.json", "RTO timeouts per node by phase", _) => want(
            by("phase").keys().eq(["stable"]) && values.iter().all(|v| *v >= 0.0),
            "one rate, not negative, for the stable phase".into(),
        ),
        ("rollout.json", "Operator reconciles per second", _) => {
            all(&|v| v >= 0.0 && v.is_finite(), "a rate, not negative")
        }
        ("rollout.json", "Nodes per rollout phase", _) => want(
            by("phase") == BTreeMap::from([("stable".to_string(), 1.0)]),
            "the selected node, node-a, stable".into(),
        ),
        ("rollout.json", "Rollout progress (operator)", _) => {
            let s = by("state");
            want(
                s.get("matched") == Some(&2.0)
                    && s.get("applied") == Some(&2.0)
                    && s.get("failed") == Some(&0.0),
                "2 matched, 2 applied, 0 failed".into(),
            )
        }
        ("rollout.json", "Tuning phase (operator)", _) => want(
            by("phase") == BTreeMap::from([("Complete".to_string(), 1.0)]),
            "Complete".into(),
        ),
        _ => Err("no known-value check for this panel".into()),
    }
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
    // The rollout completed: its revision is what the revision panels must show.
    let done = lab.wait_tuning_phase(TUNING, "Complete", Duration::from_secs(90));
    // The operator reconciles every second or two while a rollout runs, and seldom once it is
    // complete: the reconcile-duration panel is judged at the rollout's end, a scrape after
    // the last reconcile, where its rate window holds reconciles (in the loss run's window it
    // may hold none, and the quantile of nothing is NaN).
    let rollout_end = unix_now() + SCRAPE_INTERVAL.as_secs_f64();
    let revision = done["currentRevision"]
        .as_str()
        .expect("a revision")
        .to_string();
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
    let known = Known {
        revision: revision.clone(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
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
            let at = if title == "Operator reconcile duration (p99)" {
                rollout_end
            } else {
                at
            };
            match prometheus.query(&expr, Some(at)) {
                Ok(result)
                    if result.is_empty() && !JUDGED_ROLLOUT_PANELS.contains(&title.as_str()) =>
                {
                    failures.push(format!("{name} / {title} / {ref_id}: no data for {expr}"))
                }
                Ok(result) => {
                    if !JUDGED_ROLLOUT_PANELS.contains(&title.as_str()) {
                        if let Err(e) = known_value(&name, &title, &ref_id, &result, &known) {
                            failures.push(format!("{name} / {title} / {ref_id}: {e}: {result:?}"));
                        }
                    }
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
