//! The walking skeleton's control loop against a real API server, real network namespaces and
//! real sysctls: apply, relabel, delete, bad input, host refusals, a killed agent, conflicts.
//! Each test starts its own lab; the lab's Drop tears it down even when an assertion fails.

use std::collections::BTreeMap;
use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig, Signal};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);

/// The keys the tests tune, with values that differ from a fresh namespace's defaults.
const DESIRED: [(&str, &str); 3] = [
    ("net.ipv4.tcp_sack", "0"),
    ("net.ipv4.tcp_congestion_control", "reno"),
    ("net.ipv4.tcp_rmem", "4096 65536 1048576"),
];

fn tuning_yaml(name: &str, pool: &str, priority: i32, sysctls: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: {pool}\n  priority: {priority}\n  sysctls:\n"
    );
    for (k, v) in sysctls {
        yaml.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    yaml
}

fn jsonpath(lab: &Lab, args: &[&str], path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &expr]);
    let out = lab.kubectl(&all);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn sysctls(lab: &Lab, node: &str) -> BTreeMap<String, String> {
    DESIRED
        .iter()
        .map(|(k, _)| (k.to_string(), lab.sysctl(node, k)))
        .collect()
}

fn desired() -> BTreeMap<String, String> {
    DESIRED
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The sysctl originals in `node`'s journal (`originals`, docs/agent.md), each value with its
/// runs of whitespace collapsed to one space as [`Lab::sysctl`] reads them.
fn journaled_originals(lab: &Lab, node: &str) -> BTreeMap<String, String> {
    let path = lab.agent_state_dir(node).join("journal.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let journal: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", path.display()));
    let entries = journal["originals"]
        .as_array()
        .unwrap_or_else(|| panic!("no originals in {text}"));
    let mut originals = BTreeMap::new();
    for entry in entries {
        assert_eq!(entry["kind"], "sysctl", "{text}");
        let (key, value) = (entry["target"].as_str(), entry["value"].as_str());
        let (Some(key), Some(value)) = (key, value) else {
            panic!("a malformed original {entry} in {text}");
        };
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            originals.insert(key.to_string(), value).is_none(),
            "{key} is journaled twice: {text}"
        );
    }
    originals
}

fn node_state(lab: &Lab, node: &str) -> String {
    jsonpath(lab, &["get", "nodetuning", node], "{.status.state}")
}

fn wait_progress(lab: &Lab, tuning: &str, progress: &str) {
    lab.wait_for(
        &format!("{tuning} to report {progress} applied and Complete"),
        CONVERGE,
        || {
            let got = jsonpath(
                lab,
                &["get", "networktuning", tuning],
                "{.status.progress} {.status.phase}",
            );
            (got == format!("{progress} Complete")).then_some(())
        },
    );
}

fn wait_sysctls(lab: &Lab, node: &str, want: &BTreeMap<String, String>, what: &str) {
    lab.wait_for(&format!("{node} to have {what} sysctls"), CONVERGE, || {
        (sysctls(lab, node) == *want).then_some(())
    });
}

#[test]
fn apply_relabel_and_delete_restore_every_host() {
    let lab = Lab::start(LabConfig::default()).expect("lab starts");
    let originals: BTreeMap<String, BTreeMap<String, String>> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| (n.to_string(), sysctls(&lab, n)))
        .collect();
    for (node, values) in &originals {
        assert_ne!(
            *values,
            desired(),
            "{node} must start different from the tuning"
        );
    }

    // a. Two of three nodes change, inside their own namespaces only.
    lab.apply_yaml(&tuning_yaml("edge", "edge", 0, &DESIRED))
        .expect("the tuning is accepted");
    wait_progress(&lab, "edge", "2/2");
    assert_eq!(sysctls(&lab, "node-a"), desired());
    assert_eq!(sysctls(&lab, "node-b"), desired());
    assert_eq!(sysctls(&lab, "node-c"), originals["node-c"]);
    let table =
        String::from_utf8_lossy(&lab.kubectl(&["get", "networktunings"]).stdout).into_owned();
    assert!(table.contains("APPLIED/GOVERNED"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("edge "))
        .expect("a row for edge");
    assert!(row.contains("Complete") && row.contains(" 2/2 "), "{table}");
    let nodes = String::from_utf8_lossy(&lab.kubectl(&["get", "nodetunings"]).stdout).into_owned();
    assert!(
        nodes
            .lines()
            .filter(|l| l.contains("edge") && l.contains("Applied"))
            .count()
            == 2,
        "{nodes}"
    );
    let reported_original = jsonpath(
        &lab,
        &["get", "nodetuning", "node-a"],
        "{.status.items[?(@.target==\"net.ipv4.tcp_sack\")].original}",
    );
    assert_eq!(reported_original, originals["node-a"]["net.ipv4.tcp_sack"]);

    // b. A node relabelled out of the selector gets its originals back; relabelled in, the
    // tuning again.
    lab.label_node("node-b", "pool", Some("core"));
    wait_sysctls(&lab, "node-b", &originals["node-b"], "its original");
    lab.wait_for("node-b to report Reverted", CONVERGE, || {
        (node_state(&lab, "node-b") == "Reverted").then_some(())
    });
    wait_progress(&lab, "edge", "1/1");
    assert_eq!(sysctls(&lab, "node-a"), desired());
    lab.label_node("node-b", "pool", Some("edge"));
    wait_sysctls(&lab, "node-b", &desired(), "the tuning's");
    wait_progress(&lab, "edge", "2/2");

    // c. Deleting the tuning restores every node, then the finalizer lets the object go.
    let out = lab.kubectl(&["delete", "networktuning", "edge", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (node, values) in &originals {
        assert_eq!(sysctls(&lab, node), *values, "{node} after delete");
    }
    let gone = lab.kubectl(&["get", "networktuning", "edge"]);
    assert!(!gone.status.success(), "the tuning is gone");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn the_api_server_rejects_bad_input_naming_the_field() {
    let lab = Lab::start(LabConfig::with_nodes(1).control_plane_only()).expect("lab starts");
    let document = |name: &str, spec: &str| {
        format!(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };
    let interface = |glob: &str| {
        format!(
            "  nodeSelector: {{}}\n  interfaces:\n  - match: {{name: \"{glob}\"}}\n    mtu: 1500\n"
        )
    };
    let long = "1".repeat(10 * 1024);
    let cases: Vec<(String, &str, &str)> = vec![
        (
            interface(&format!("eth{}", "[0-9]".repeat(13))),
            "spec.interfaces[0].match.name",
            "may not be more than 64 bytes",
        ),
        (
            interface("eth\\x01"),
            "spec.interfaces[0].match.name",
            "printable ASCII",
        ),
        (
            interface("e th0"),
            "spec.interfaces[0].match.name",
            "printable ASCII",
        ),
        (
            interface("*a*b*c*d*"),
            "spec.interfaces[0].match.name",
            "at most 4 '*'",
        ),
        (
            "  nodeSelector: {}\n  sysctls: {kernel.panic: \"1\"}\n".into(),
            "spec.sysctls",
            "sysctl key kernel.panic is not allowed",
        ),
        (
            "  nodeSelector: {}\n  sysctls: {\"net.ipv4/tcp_sack\": \"1\"}\n".into(),
            "spec.sysctls",
            "net.ipv4/tcp_sack is not allowed",
        ),
        (
            "  nodeSelector: {}\n  sysctls: {\"net.ipv4..tcp_sack\": \"1\"}\n".into(),
            "spec.sysctls",
            "net.ipv4..tcp_sack is not allowed",
        ),
        (
            "  nodeSelector: {}\n  sysctls: {net.ipv4.tcp_sack: \"\"}\n".into(),
            "spec.sysctls.net.ipv4.tcp_sack",
            "at least 1 chars long",
        ),
        (
            "  nodeSelector: {}\n  sysctls: {net.ipv4.tcp_sack: \"1\\n0\"}\n".into(),
            "spec.sysctls.net.ipv4.tcp_sack",
            "should match",
        ),
        (
            format!("  nodeSelector: {{}}\n  sysctls: {{net.ipv4.tcp_sack: \"{long}\"}}\n"),
            "spec.sysctls.net.ipv4.tcp_sack",
            "Too long",
        ),
        (
            "  nodeSelector: {matchExpressions: [{key: pool, operator: Near, values: [a]}]}\n"
                .into(),
            "spec.nodeSelector.matchExpressions[0].operator",
            "Unsupported value",
        ),
        (
            "  nodeSelector: {matchExpressions: [{key: pool, operator: In}]}\n".into(),
            "spec.nodeSelector.matchExpressions[0]",
            "In and NotIn need at least one value",
        ),
        (
            "  nodeSelector: {matchLabels: {\"bad key!\": x}}\n".into(),
            "spec.nodeSelector.matchLabels",
            "must be valid label keys",
        ),
        (
            "  nodeSelector: {}\n  priority: -1\n".into(),
            "spec.priority",
            "greater than or equal to 0",
        ),
        // A line break in a probe's URL would end its request line: refused, as is anything
        // but plain http:// with a host, and a tcp target without a port.
        (
            "  nodeSelector: {}\n  probes: {targets: [{name: web, http: {url: \"http://198.18.0.9/a HTTP/1.0\\r\\nX-Injected: 1\"}}]}\n".into(),
            "spec.probes.targets[0].http.url",
            "should match",
        ),
        (
            "  nodeSelector: {}\n  probes: {targets: [{name: web, http: {url: \"https://198.18.0.9/\"}}]}\n".into(),
            "spec.probes.targets[0].http.url",
            "should match",
        ),
        (
            "  nodeSelector: {}\n  probes: {targets: [{name: peer, tcp: \"198.18.0.9\\n:80\"}]}\n".into(),
            "spec.probes.targets[0].tcp",
            "should match",
        ),
        // A probe's timeout must fit in the confirmation window (given, or its default).
        (
            "  nodeSelector: {}\n  probes: {timeout: 2m, confirmTimeout: 60s}\n".into(),
            "spec.probes",
            "probes.timeout (default 5s) must not be longer than probes.confirmTimeout",
        ),
        (
            "  nodeSelector: {}\n  probes: {timeout: 61s}\n".into(),
            "spec.probes",
            "probes.timeout (default 5s) must not be longer than probes.confirmTimeout",
        ),
        (
            "  nodeSelector: {}\n  probes: {confirmTimeout: 4s}\n".into(),
            "spec.probes",
            "every probe must be able to end within the confirmation window",
        ),
    ];
    // The operator puts a tuning's name into label values, which hold at most 63 characters.
    let long_name = "n".repeat(64);
    let cases = cases
        .into_iter()
        .map(|(spec, field, message)| ("bad", spec, field, message))
        .chain([(
            long_name.as_str(),
            "  nodeSelector: {}\n".to_string(),
            "metadata.name",
            "at most 63 characters",
        )]);
    for (name, spec, field, message) in cases {
        let err = lab
            .apply_yaml(&document(name, &spec))
            .expect_err(&format!("rejected: {name}: {spec}"));
        assert!(
            err.contains(field),
            "{spec}: the error names {field}: {err}"
        );
        assert!(
            err.contains(message),
            "{spec}: the error says {message}: {err}"
        );
    }
    let listed = jsonpath(&lab, &["get", "networktunings"], "{.items}");
    assert_eq!(listed, "[]", "nothing was stored");
    // At the bounds: a 63-character name; a 64-byte glob of classes, one negated, with 4 stars.
    let at_bounds = &long_name[..63];
    let glob = format!("*[!0]*{}**", "[0-9a-z]".repeat(7));
    assert_eq!(glob.len(), 64);
    lab.apply_yaml(&document(at_bounds, &interface(&glob)))
        .expect("a tuning at the bounds is accepted");
    let stored = jsonpath(
        &lab,
        &["get", "networktuning", at_bounds],
        "{.spec.interfaces[0].match.name}",
    );
    assert_eq!(stored, glob);
    let out = lab.kubectl(&["delete", "networktuning", at_bounds, "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let explain = lab.kubectl(&["explain", "networktuning.spec.sysctls"]);
    let explain = String::from_utf8_lossy(&explain.stdout);
    assert!(explain.contains("Kernel parameters to set"), "{explain}");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn the_host_refuses_and_the_node_is_left_as_it_was() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let before = sysctls(&lab, "node-a");
    let cases = [
        (
            "missing",
            vec![
                ("net.ipv4.tcp_sack", "0"),
                ("net.ipv4.tcp_no_such_knob", "1"),
                ("net.ipv4.tcp_rmem", "4096 65536 1048576"),
            ],
            "net.ipv4.tcp_no_such_knob",
        ),
        (
            "refused",
            vec![
                ("net.ipv4.tcp_sack", "0"),
                ("net.ipv4.tcp_congestion_control", "no-such-algorithm"),
                ("net.ipv4.tcp_rmem", "4096 65536 1048576"),
            ],
            "net.ipv4.tcp_congestion_control",
        ),
    ];
    for (name, sysctl_set, bad_key) in cases {
        lab.apply_yaml(&tuning_yaml(name, "edge", 0, &sysctl_set))
            .expect("the schema accepts it");
        // The node is the canary of a first rollout: its failure rolls the tuning back, and
        // the node returns to having nothing of it.
        lab.wait_for(&format!("{name}: to roll back"), CONVERGE, || {
            let phase = jsonpath(&lab, &["get", "networktuning", name], "{.status.phase}");
            (phase == "RolledBack").then_some(())
        });
        let message = jsonpath(&lab, &["get", "networktuning", name], "{.status.message}");
        assert!(
            message.contains("node-a failed to apply") && message.contains(bad_key),
            "{name}: the message names the node and the key: {message}"
        );
        let degraded = jsonpath(
            &lab,
            &["get", "networktuning", name],
            "{.status.conditions[?(@.type==\"Degraded\")].message}",
        );
        assert!(
            degraded.contains("node-a") && degraded.contains(bad_key),
            "{degraded}"
        );
        lab.wait_for(&format!("{name}: node-a to be reverted"), CONVERGE, || {
            (node_state(&lab, "node-a") == "Reverted").then_some(())
        });
        assert_eq!(
            sysctls(&lab, "node-a"),
            before,
            "{name}: every sysctl as it was"
        );
        let out = lab.kubectl(&["delete", "networktuning", name, "--timeout=60s"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn an_agent_killed_mid_transaction_ends_all_or_nothing() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let originals = sysctls(&lab, "node-a");
    lab.kill_agent("node-a", Signal::Term);
    lab.start_agent("node-a", &["--step-delay", "2s"]);
    lab.apply_yaml(&tuning_yaml("slow", "edge", 0, &DESIRED))
        .expect("accepted");
    // Kill it after the first write and before the last.
    lab.wait_for("the first write of the transaction", CONVERGE, || {
        let now = sysctls(&lab, "node-a");
        let changed = now.iter().filter(|(k, v)| **v != originals[*k]).count();
        (changed >= 1 && changed < DESIRED.len()).then_some(())
    });
    lab.kill_agent("node-a", Signal::Kill);
    let mid = sysctls(&lab, "node-a");
    assert!(
        mid != originals && mid != desired(),
        "killed in between: {mid:?}"
    );
    // The journal holds every original, whole (the kernel's tabs as the lab's spaces), and
    // only those: none lost, none replaced by a desired value.
    assert_eq!(
        journaled_originals(&lab, "node-a"),
        originals,
        "the journal's originals"
    );

    lab.start_agent("node-a", &[]);
    wait_progress(&lab, "slow", "1/1");
    assert_eq!(
        sysctls(&lab, "node-a"),
        desired(),
        "fully applied after restart"
    );
    // The originals survived the crash: deleting restores them exactly.
    let out = lab.kubectl(&["delete", "networktuning", "slow", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sysctls(&lab, "node-a"), originals, "fully reverted");
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn overlapping_tunings_the_higher_priority_governs() {
    let lab = Lab::start(LabConfig::default()).expect("lab starts");
    let originals = sysctls(&lab, "node-a");
    lab.apply_yaml(&tuning_yaml(
        "low",
        "edge",
        1,
        &[("net.ipv4.tcp_sack", "0")],
    ))
    .expect("accepted");
    wait_progress(&lab, "low", "2/2");
    lab.apply_yaml(&tuning_yaml(
        "high",
        "edge",
        5,
        &[("net.ipv4.tcp_congestion_control", "reno")],
    ))
    .expect("accepted");
    wait_progress(&lab, "high", "2/2");
    for node in ["node-a", "node-b"] {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_congestion_control"), "reno");
        // low's setting was reverted when high took the node over.
        assert_eq!(
            lab.sysctl(node, "net.ipv4.tcp_sack"),
            originals["net.ipv4.tcp_sack"]
        );
    }
    let conflict = lab.wait_for("low to report Conflict", CONVERGE, || {
        let c = jsonpath(
            &lab,
            &["get", "networktuning", "low"],
            "{.status.conditions[?(@.type==\"Conflict\")].status} {.status.conditions[?(@.type==\"Conflict\")].message}",
        );
        c.starts_with("True").then_some(c)
    });
    assert!(
        conflict.contains("node-a") && conflict.contains("node-b") && conflict.contains("high"),
        "{conflict}"
    );
    let high_conflict = jsonpath(
        &lab,
        &["get", "networktuning", "high"],
        "{.status.conditions[?(@.type==\"Conflict\")].status}",
    );
    assert_eq!(high_conflict, "False");

    // Deleting the winner hands the nodes to the other tuning.
    let out = lab.kubectl(&["delete", "networktuning", "high", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_progress(&lab, "low", "2/2");
    for node in ["node-a", "node-b"] {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), "0");
        assert_eq!(
            lab.sysctl(node, "net.ipv4.tcp_congestion_control"),
            originals["net.ipv4.tcp_congestion_control"]
        );
    }
    lab.stop().expect("the lab stops cleanly");
}

#[test]
fn every_example_applies_and_reverts() {
    let lab = Lab::start(LabConfig::default()).expect("lab starts");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<_> = std::fs::read_dir(&examples)
        .expect("examples/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "examples/ holds at least one tuning");
    for file in files {
        let yaml = std::fs::read_to_string(&file).expect("readable");
        let name = yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix("name: "))
            .expect("metadata.name")
            .to_string();
        lab.apply_yaml(&yaml)
            .unwrap_or_else(|e| panic!("{} is rejected: {e}", file.display()));
        lab.wait_for(&format!("{} to complete", file.display()), CONVERGE, || {
            let got = jsonpath(&lab, &["get", "networktuning", &name], "{.status.phase}");
            (got == "Complete").then_some(())
        });
        let out = lab.kubectl(&["delete", "networktuning", &name, "--timeout=60s"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    lab.stop().expect("the lab stops cleanly");
}
