//! A change that cuts a node off undoes itself, against a real API server, real agents, real
//! sysctls and real nftables in network namespaces: the post-apply probes (a TCP target in
//! another node's namespace, the API server read back over a new connection) and the dead-man
//! confirmation, which reverts a revision the agent cannot confirm within `confirmTimeout`,
//! also across a SIGKILL inside the window, and when hoststack's own change (an MTU, or an
//! advertised MSS, that the node's switch port cannot carry) is what cut the node off.
//!
//! Each test starts its own lab of four nodes: node-a..node-c in pool=edge (node-a labelled the
//! canary) and node-d in pool=core, where a TCP service listens for the probes.

use std::time::{Duration, Instant};

use hoststack_e2e::faults::history::Event;
use hoststack_e2e::faults::inject::CutOff;
use hoststack_e2e::faults::record::{from_audit_reports, from_write_log, status_writes};
use hoststack_e2e::prometheus::{sample, scrape};
use hoststack_e2e::{Lab, LabConfig, Signal};
use serde_json::Value;

/// How long one step of a rollout may take.
const STEP: Duration = Duration::from_secs(90);
/// The edge pool.
const EDGE: [&str; 3] = ["node-a", "node-b", "node-c"];
/// The port of node-d's TCP service.
const SERVICE_PORT: u16 = 5300;

fn lab() -> Lab {
    lab_of(LabConfig::with_nodes(4))
}

/// A lab of `config` with node-a labelled the canary.
fn lab_of(config: LabConfig) -> Lab {
    let lab = Lab::start(config).expect("lab starts");
    lab.label_node("node-a", "hoststack.dev/canary", Some("true"));
    lab
}

/// A TCP service on node-d (an iperf3 server, which accepts any connection) and an HTTP one
/// on the next port; their `host:port`.
fn service(lab: &Lab) -> (String, String) {
    let ip = lab.node_ip("node-d").to_string();
    let port = SERVICE_PORT.to_string();
    let http_port = (SERVICE_PORT + 1).to_string();
    let netns = lab.netns("node-d");
    let tcp = [
        "ip", "netns", "exec", netns, "iperf3", "-s", "-B", &ip, "-p", &port,
    ];
    lab.spawn_helper("service", &tcp)
        .expect("the service starts");
    let http = [
        "ip",
        "netns",
        "exec",
        netns,
        "python3",
        "-m",
        "http.server",
        &http_port,
        "--bind",
        &ip,
    ];
    lab.spawn_helper("http", &http)
        .expect("the HTTP service starts");
    (format!("{ip}:{port}"), format!("{ip}:{http_port}"))
}

/// A tuning of the edge pool: somaxconn 8192 (the namespace default is 4096), `extra` spec
/// lines (indented by two) and a canary-first rollout.
fn tuning(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  sysctls:\n    net.core.somaxconn: \"8192\"\n{extra}  rollout:\n    canary: 1\n    maxUnavailable: 2\n"
    )
}

/// `node`'s NodeTuning status; null before the operator created it.
fn node_status(lab: &Lab, node: &str) -> Value {
    let out = lab.kubectl(&["get", "nodetuning", node, "-o", "json"]);
    serde_json::from_slice::<Value>(&out.stdout).map_or(Value::Null, |nt| nt["status"].clone())
}

/// The agent's counter `series` on `node` (0 when absent).
fn counter(lab: &Lab, node: &str, series: &str) -> u64 {
    let metrics = scrape(lab.agent_metrics_address(node)).expect("the agent's /metrics");
    sample(&metrics, series).unwrap_or(0)
}

/// Asserts that `node`'s agent reverted a revision of `tuning` by itself once, for `label`
/// (`probe` or `unconfirmed`, its counter), and reported it as Degraded with `reason` — read
/// from the API server's audit log: a node rolled back right after its failure shows it only
/// for a moment.
fn assert_reverted_by_itself(lab: &Lab, node: &str, tuning: &str, label: &str, reason: &str) {
    let series =
        format!(r#"hoststack_agent_self_reverts_total{{tuning="{tuning}",reason="{label}"}}"#);
    assert_eq!(counter(lab, node, &series), 1, "{series}");
    let events = lab.audit_events();
    let reported = status_writes(&events, node)
        .filter_map(|e| e["responseObject"]["status"]["conditions"].as_array())
        .flatten()
        .any(|c| c["type"] == "Degraded" && c["status"] == "True" && c["reason"] == reason);
    assert!(
        reported,
        "{node} reported the revert as Degraded ({reason})"
    );
}

/// `dev`'s MTU in `node`'s namespace, or in the root namespace for `None`.
fn mtu(lab: &Lab, node: Option<&str>, dev: &str) -> String {
    let path = format!("/sys/class/net/{dev}/mtu");
    let out = match node {
        Some(node) => lab.exec_in_node(node, &["cat", &path]),
        None => std::process::Command::new("cat")
            .arg(&path)
            .output()
            .expect("cat runs"),
    };
    assert!(out.status.success(), "reading {path}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `script` in `node`'s namespace.
fn nft(lab: &Lab, node: &str, script: &str) {
    let out = lab.exec_in_node(node, &["nft", script]);
    assert!(
        out.status.success(),
        "nft on {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_change_that_breaks_a_probe_target_reverts_by_itself_and_a_good_one_completes() {
    let lab = lab();
    let (target, web) = service(&lab);
    let original = lab.sysctl("node-a", "net.core.somaxconn");
    let probes = format!(
        "  probes:\n    targets:\n      - name: peer\n        tcp: \"{target}\"\n      - name: web\n        http:\n          url: \"http://{web}/\"\n      - name: resolver\n        dns: localhost\n"
    );
    // A firewall the agent may write (the prefix holds no API server) that drops the peer's
    // answers: the probe of the peer fails, and the canary reverts by itself at once.
    let peer = lab.node_ip("node-d");
    let breaking = format!("  firewall:\n    blockedPrefixes:\n      - {peer}/32\n{probes}");
    lab.apply_yaml(&tuning("guard", &breaking))
        .expect("accepted");
    let back = lab.wait_tuning_phase("guard", "RolledBack", STEP);
    let message = back["message"].as_str().unwrap();
    assert!(
        message.contains("node-a failed to apply") && message.contains("probe peer"),
        "{message}"
    );
    // node-a has since been rolled back (to nothing: a first rollout), and still shows
    // the probes that failed.
    let a = node_status(&lab, "node-a");
    let peer_probe = a["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "peer")
        .expect("the peer's probe");
    assert_eq!(peer_probe["passed"], false, "{a}");
    // The host is as it was: the table gone, the sysctl back; the others never changed.
    lab.wait_for("node-a back at its own values", STEP, || {
        (lab.sysctl("node-a", "net.core.somaxconn") == original).then_some(())
    });
    let tables = lab.exec_in_node("node-a", &["nft", "list", "tables"]);
    assert!(
        !String::from_utf8_lossy(&tables.stdout).contains("hoststack"),
        "the firewall is gone"
    );
    for node in ["node-b", "node-c"] {
        assert_eq!(lab.sysctl(node, "net.core.somaxconn"), original, "{node}");
    }
    assert_reverted_by_itself(&lab, "node-a", "guard", "probe", "ProbeFailed");
    lab.delete_tuning("guard");

    // The same probes (and an HTTP one, a lookup) with a change that keeps the peer reachable,
    // on nodes where ICMP is dropped both ways: every probe passes, the rollout completes.
    for node in EDGE {
        nft(
            &lab,
            node,
            "add table inet e2e-no-icmp; add chain inet e2e-no-icmp in { type filter hook input priority 0; }; add chain inet e2e-no-icmp out { type filter hook output priority 0; }; add rule inet e2e-no-icmp in meta l4proto icmp drop; add rule inet e2e-no-icmp out meta l4proto icmp drop",
        );
    }
    // The process nodes have no default route (their subnet is on-link); node-c gets one via
    // the lab's bridge, so that its gateway is probed too.
    let url = lab.api_url().trim_start_matches("https://").to_string();
    let bridge = url.rsplit_once(':').map_or(url.as_str(), |(h, _)| h);
    let out = lab.exec_in_node("node-c", &["ip", "route", "add", "default", "via", bridge]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.apply_yaml(&tuning("good", &probes)).expect("accepted");
    lab.wait_tuning_phase("good", "Complete", STEP);
    for node in EDGE {
        let s = node_status(&lab, node);
        assert_eq!(lab.sysctl(node, "net.core.somaxconn"), "8192", "{node}");
        assert!(s["confirmation"].is_null(), "{node} confirmed: {s}");
        let probes: Vec<(String, bool)> = s["probes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap().to_string(), p["passed"] == true))
            .collect();
        let want = ["peer", "web", "resolver", "default-gateway", "api-server"];
        let ran: Vec<&str> = probes.iter().map(|(n, _)| n.as_str()).collect();
        // Only node-c has a default route: the others skip the gateway.
        let want: Vec<&str> = want
            .into_iter()
            .filter(|p| node == "node-c" || *p != "default-gateway")
            .collect();
        assert_eq!(ran, want, "{node}: {s}");
        assert!(probes.iter().all(|(_, passed)| *passed), "{node}: {s}");
    }
    lab.delete_tuning("good");
    for node in EDGE {
        nft(&lab, node, "delete table inet e2e-no-icmp");
    }
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn a_node_cut_off_from_the_api_server_reverts_by_itself_within_confirm_timeout() {
    let lab = lab();
    let original = lab.sysctl("node-a", "net.core.somaxconn");
    let probes = "  probes:\n    settleTime: 5s\n    confirmTimeout: 20s\n";
    lab.apply_yaml(&tuning("cut", probes)).expect("accepted");
    // The canary applied and is provisional: cut it off before it can confirm.
    let pending = lab.wait_for("node-a's revision to be provisional", STEP, || {
        let s = node_status(&lab, "node-a");
        (s["state"] == "Applied" && s["confirmation"].is_object()).then_some(s)
    });
    let cut = CutOff::new(&lab, "node-a");
    let cut_at = Instant::now();
    assert_eq!(lab.sysctl("node-a", "net.core.somaxconn"), "8192");
    lab.wait_for("node-a to revert by itself", STEP, || {
        (lab.sysctl("node-a", "net.core.somaxconn") == original).then_some(())
    });
    let took = cut_at.elapsed();
    eprintln!(
        "cut off {took:?} before reverting by itself (confirmation deadline {})",
        pending["confirmation"]["deadline"]
    );
    // While cut off, the operator heard nothing: the rollout still waits on the canary.
    assert_ne!(lab.tuning_status("cut")["phase"], "RolledBack");
    drop(cut);
    // Healed, the node says what happened, and the canary's failure rolls the rollout back.
    let back = lab.wait_tuning_phase("cut", "RolledBack", STEP);
    let message = back["message"].as_str().unwrap();
    assert!(
        message.contains("was not confirmed within 20s") && message.contains("api-server"),
        "{message}"
    );
    assert_reverted_by_itself(&lab, "node-a", "cut", "unconfirmed", "Unconfirmed");
    for node in ["node-b", "node-c"] {
        assert_eq!(lab.sysctl(node, "net.core.somaxconn"), original, "{node}");
    }
    lab.delete_tuning("cut");
    lab.stop().expect("the lab stops cleanly");
}

/// A lab (of `config`, node-a the canary) whose network beyond the nodes carries jumbo frames
/// (the bridge, where the API server sends from), while each node's own switch port (the root
/// side of its veth) carries 1500 bytes and drops larger frames without an ICMP error, as a
/// switch port left at 1500 on a jumbo network does: a black hole for path-MTU discovery.
fn jumbo_beyond_the_nodes(config: LabConfig) -> Lab {
    let lab = lab_of(config);
    let bridge = lab.bridge_device();
    let out = std::process::Command::new("ip")
        .args(["link", "set", &bridge, "mtu", "9000"])
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab
}

#[test]
fn a_sysctl_that_advertises_an_mss_the_path_cannot_carry_reverts_by_itself() {
    let lab = jumbo_beyond_the_nodes(LabConfig::with_nodes(4));
    let key = "net.ipv4.route.min_adv_mss";
    let original = lab.sysctl("node-a", key);
    // A minimum advertised MSS of 8960 (meant for jumbo frames) on a node whose own link
    // carries 1500: the API server sends the node's new connections segments its port drops,
    // so the probe's read-back gets no answer. The agent's own connections, made before, keep
    // their MSS and still carry its status: the operator sees it waiting to be confirmed.
    let mss = format!("    {key}: \"8960\"\n  probes:\n    confirmTimeout: 20s\n");
    lab.apply_yaml(&tuning("mss", &mss)).expect("accepted");
    lab.wait_for("node-a to take the sysctl", STEP, || {
        (lab.sysctl("node-a", key) == "8960").then_some(())
    });
    lab.wait_for("node-a to revert it by itself", STEP, || {
        (lab.sysctl("node-a", key) == original).then_some(())
    });
    let back = lab.wait_tuning_phase("mss", "RolledBack", STEP);
    let message = back["message"].as_str().unwrap();
    eprintln!("{message}");
    assert!(
        message.contains("node-a failed to apply")
            && message.contains("was not confirmed within 20s")
            && message.contains("probe api-server"),
        "{message}"
    );
    assert_reverted_by_itself(&lab, "node-a", "mss", "unconfirmed", "Unconfirmed");
    for node in ["node-b", "node-c"] {
        assert_eq!(lab.sysctl(node, key), original, "{node} never changed");
    }
    lab.delete_tuning("mss");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn an_mtu_the_path_cannot_carry_cuts_the_node_off_and_it_reverts_by_itself() {
    let mut config = LabConfig::with_nodes(4);
    config.record_writes = true;
    let lab = jumbo_beyond_the_nodes(config);
    // node-a's agent starts again, so that its connections are made on the jumbo path (the API
    // server advertises a 8960-byte MSS): once the node raises its MTU, both ends of them send
    // segments its port cannot carry.
    lab.kill_agent("node-a", Signal::Term);
    lab.start_agent("node-a", &[]);
    assert_eq!(mtu(&lab, None, lab.uplink_peer("node-a")), "1500");
    assert_eq!(mtu(&lab, Some("node-a"), "eth0"), "1500");
    let jumbo = "  interfaces:\n    - match:\n        name: eth0\n      mtu: 9000\n  probes:\n    confirmTimeout: 20s\n";
    lab.apply_yaml(&tuning("jumbo", jumbo)).expect("accepted");
    lab.wait_for("node-a to take the MTU", STEP, || {
        (mtu(&lab, Some("node-a"), "eth0") == "9000").then_some(())
    });
    let applied_at = Instant::now();
    // The node cannot confirm: the status write and the probe's new connection (the TLS
    // handshake's certificates) need segments larger than 1500 bytes. At the deadline it
    // reverts by itself, its MTU back where it was.
    lab.wait_for("node-a to revert its MTU by itself", STEP, || {
        (mtu(&lab, Some("node-a"), "eth0") == "1500").then_some(())
    });
    eprintln!(
        "the MTU was reverted by the node itself {:?} after it was seen applied",
        applied_at.elapsed()
    );
    let back = lab.wait_tuning_phase("jumbo", "RolledBack", STEP);
    let message = back["message"].as_str().unwrap();
    eprintln!("{message}");
    assert!(
        message.contains("node-a failed to apply")
            && message.contains("was not confirmed within 20s")
            && message.contains("api-server"),
        "{message}"
    );
    // Cut off: nothing the agent wrote reached the API server between the MTU's change and its
    // revert (the agent's own write log and the API server's audit log read the same clock);
    // the report came once the revert had healed the path.
    let log = std::fs::read_to_string(lab.write_log("node-a")).expect("node-a's write log");
    let mtu_writes: Vec<(u64, String)> = from_write_log("node-a", &log)
        .into_iter()
        .filter_map(|t| match t.event {
            Event::HostWrite { key, value, .. } if key.contains("eth0") => Some((t.micros, value)),
            _ => None,
        })
        .collect();
    let [(cut, raised), (healed, lowered)] = &mtu_writes[..] else {
        panic!("one MTU change and its revert: {mtu_writes:?}");
    };
    assert_eq!((raised.as_str(), lowered.as_str()), ("9000", "1500"));
    let reports = from_audit_reports(&lab.audit_events(), "node-a");
    let while_cut: Vec<_> = reports
        .iter()
        .filter(|(at, ..)| (*cut..*healed).contains(at))
        .collect();
    assert!(
        while_cut.is_empty(),
        "reached the API server while cut off: {while_cut:?}"
    );
    assert!(
        reports.iter().any(|(at, state, message)| at > healed
            && state == "Failed"
            && message.contains("was not confirmed")),
        "the report once healed: {reports:?}"
    );
    assert_reverted_by_itself(&lab, "node-a", "jumbo", "unconfirmed", "Unconfirmed");
    assert_eq!(
        lab.sysctl("node-a", "net.core.somaxconn"),
        lab.sysctl("node-d", "net.core.somaxconn")
    );
    for node in ["node-b", "node-c"] {
        assert_eq!(
            mtu(&lab, Some(node), "eth0"),
            "1500",
            "{node} never changed"
        );
    }
    lab.delete_tuning("jumbo");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn an_agent_killed_inside_the_window_reverts_on_restart_unless_it_had_confirmed() {
    let lab = lab();
    let applied = r#"hoststack_agent_transactions_total{result="applied"}"#;
    // A long settle time: the kill lands inside the window.
    let probes = "  probes:\n    settleTime: 6s\n    confirmTimeout: 60s\n";
    lab.apply_yaml(&tuning("slow", probes)).expect("accepted");
    lab.wait_for("node-a's revision to be provisional", STEP, || {
        let s = node_status(&lab, "node-a");
        (s["state"] == "Applied" && s["confirmation"].is_object()).then_some(())
    });
    lab.kill_agent("node-a", Signal::Kill);
    let journal = std::fs::read_to_string(lab.agent_state_dir("node-a").join("journal.json"))
        .expect("the journal");
    assert!(journal.contains("\"provisional\""), "{journal}");
    // Restarted, it undoes the unconfirmed revision first, so it applies it again (a
    // transaction of the new process), and confirms it this time.
    lab.start_agent("node-a", &[]);
    lab.wait_for("node-a to confirm after its restart", STEP, || {
        let s = node_status(&lab, "node-a");
        (s["state"] == "Applied" && s["confirmation"].is_null()).then_some(())
    });
    assert_eq!(
        counter(&lab, "node-a", applied),
        1,
        "re-applied after the undo"
    );

    // Killed once confirmed, it keeps the revision: the new process runs no transaction.
    lab.kill_agent("node-a", Signal::Kill);
    let journal = std::fs::read_to_string(lab.agent_state_dir("node-a").join("journal.json"))
        .expect("the journal");
    assert!(!journal.contains("\"provisional\""), "{journal}");
    lab.start_agent("node-a", &[]);
    lab.wait_for("node-a's new agent to report", STEP, || {
        let metrics = scrape(lab.agent_metrics_address("node-a"))?;
        metrics
            .contains("hoststack_agent_applied_revision")
            .then_some(())
    });
    assert_eq!(
        counter(&lab, "node-a", applied),
        0,
        "kept without a transaction"
    );
    assert_eq!(lab.sysctl("node-a", "net.core.somaxconn"), "8192");
    lab.wait_tuning_phase("slow", "Complete", STEP);
    lab.delete_tuning("slow");
    lab.stop().expect("the lab stops cleanly");
}
