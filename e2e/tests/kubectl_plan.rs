//! `kubectl hoststack plan` against the lab: three nodes (node-a and node-b in pool=edge,
//! node-c pool=core), a tuning `edge` applied to the edge pool, and a changed version of it in a
//! file that also selects the core pool. node-a has an extra veth `plan0`, so the file's
//! `net.ipv4.conf.plan0.rp_filter` exists there and not on node-b, and node-c has no NodeTuning.
//! The agents plan the file against their real hosts: node-a would change, node-b would fail
//! (golden text, revisions masked), node-c has no agent; nothing changes on the hosts, the
//! NodeTunings keep their applied state, the journals stay byte for byte, and no preview
//! request or answer is left behind. Also: a config the schema refuses (exit 1), an existing
//! tuning by name with `--node` (no change, exit 0), JSON output, a node whose agent is stopped
//! (no answer, exit 6) and Ctrl-C while waiting (exit 130, request removed); and a preview
//! asked while an apply is in flight is answered after it.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig, Signal};
use serde_json::Value;

/// How long the control loop may take for any one step.
const STEP: Duration = Duration::from_secs(90);
/// The plugin's exit codes (docs/kubectl-plugin.md).
const EXIT_WOULD_FAIL: i32 = 5;
const EXIT_INCOMPLETE: i32 = 6;
const EXIT_INTERRUPTED: i32 = 130;
/// The sysctls the test sets up, reads back and compares.
const SYSCTLS: [&str; 3] = [
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_ecn",
];
const RP_FILTER: &str = "net.ipv4.conf.plan0.rp_filter";

/// The applied tuning: the edge pool, two sysctls.
const APPLIED: &str = "apiVersion: hoststack.dev/v1alpha1
kind: NetworkTuning
metadata:
  name: edge
spec:
  nodeSelector:
    matchLabels:
      pool: edge
  sysctls:
    net.ipv4.tcp_fin_timeout: \"30\"
    net.ipv4.tcp_keepalive_probes: \"5\"
";

/// The change to plan: both pools; fin_timeout stays, keepalive_probes goes (its original comes
/// back), ECN and plan0's reverse-path filter are new.
const CHANGED: &str = "apiVersion: hoststack.dev/v1alpha1
kind: NetworkTuning
metadata:
  name: edge
spec:
  nodeSelector:
    matchExpressions:
    - key: pool
      operator: In
      values: [edge, core]
  sysctls:
    net.ipv4.tcp_fin_timeout: \"30\"
    net.ipv4.tcp_ecn: \"1\"
    net.ipv4.conf.plan0.rp_filter: \"2\"
";

const GOLDEN: &str = "\
Plan of NetworkTuning edge revision <changed>: 3 nodes selected

node-a  would change  (on edge revision <applied>)
  ~ sysctl net.ipv4.conf.plan0.rp_filter: 0 → 2
  ~ sysctl net.ipv4.tcp_ecn: 2 → 1
  ~ sysctl net.ipv4.tcp_keepalive_probes: 5 → 9
  = 1 setting already as desired

node-b  would fail  (on edge revision <applied>)
  ! sysctl net.ipv4.conf.plan0.rp_filter: (missing) → 2  WouldFail: no such sysctl on this kernel (/proc/sys/net/ipv4/conf/plan0/rp_filter)
  ~ sysctl net.ipv4.tcp_ecn: 0 → 1
  ~ sysctl net.ipv4.tcp_keepalive_probes: 5 → 9
  = 1 setting already as desired

node-c  no plan
  no agent: the node has no NodeTuning (its agent starts once a tuning governs it)

Nodes: 1 would change, 1 would fail, 1 without a plan. Nothing was changed.
";

/// Runs the plugin with the lab's admin kubeconfig.
fn run(lab: &Lab, args: &[&str]) -> Output {
    let started = std::time::Instant::now();
    let out = Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(args)
        .output()
        .expect("the plugin runs");
    // How long it took is printed for the docs, never asserted.
    eprintln!(
        "$ kubectl hoststack {}   # {} ms\n{}{}",
        args.join(" "),
        started.elapsed().as_millis(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn nodetuning(lab: &Lab, node: &str) -> Value {
    lab.get_json(&["get", "nodetuning", node])
}

/// What must not change: the spec the operator wrote and the agent's applied state.
fn applied_state(lab: &Lab, node: &str) -> Value {
    let nt = nodetuning(lab, node);
    let s = &nt["status"];
    serde_json::json!({
        "spec": nt["spec"],
        "state": s["state"],
        "appliedRevision": s["appliedRevision"],
        "observedRevision": s["observedRevision"],
        "items": s["items"],
    })
}

/// The host as the test sees it: the sysctls, plan0's filter where it exists, and the journal.
fn host(lab: &Lab, node: &str) -> Vec<String> {
    let mut seen: Vec<String> = SYSCTLS
        .iter()
        .map(|k| format!("{k}={}", lab.sysctl(node, k)))
        .collect();
    if node == "node-a" {
        seen.push(format!("{RP_FILTER}={}", lab.sysctl(node, RP_FILTER)));
    }
    let mut files: Vec<_> = std::fs::read_dir(lab.agent_state_dir(node))
        .expect("the agent's state dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    for file in files.iter().filter(|f| f.is_file()) {
        let bytes = std::fs::read(file).expect("a journal file");
        seen.push(format!(
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&bytes)
        ));
    }
    seen
}

/// Waits until neither spec nor status of the edge nodes carries a preview.
fn no_preview_left(lab: &Lab) {
    for node in ["node-a", "node-b"] {
        let nt = nodetuning(lab, node);
        assert!(
            nt["spec"].get("preview").is_none(),
            "the plugin removes its request: {nt:#}"
        );
    }
    lab.wait_for("the agents to drop their answers", STEP, || {
        ["node-a", "node-b"]
            .iter()
            .all(|n| nodetuning(lab, n)["status"].get("preview").is_none())
            .then_some(())
    });
}

/// `text` with the revisions (hashes of the configs) named.
fn mask(text: &str, applied: &str, changed: &str) -> String {
    text.replace(applied, "<applied>")
        .replace(changed, "<changed>")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing the tuning file");
    path.to_str().expect("UTF-8 path").to_string()
}

#[test]
fn plan_previews_a_change_per_node_from_the_real_hosts_and_changes_nothing() {
    let lab = Lab::start(LabConfig::with_nodes(3)).expect("lab starts");
    let in_a = lab.exec_in_node(
        "node-a",
        &[
            "ip", "link", "add", "plan0", "type", "veth", "peer", "name", "plan1",
        ],
    );
    assert!(in_a.status.success(), "{in_a:?}");
    for (node, ecn) in [("node-a", "2"), ("node-b", "0")] {
        lab.write_sysctl(node, "net.ipv4.tcp_fin_timeout", "60");
        lab.write_sysctl(node, "net.ipv4.tcp_keepalive_probes", "9");
        lab.write_sysctl(node, "net.ipv4.tcp_ecn", ecn);
    }
    lab.write_sysctl("node-a", RP_FILTER, "0");

    lab.apply_yaml(APPLIED).expect("the tuning is accepted");
    let applied = lab.wait_for("edge to be rolled out", STEP, || {
        let s = lab.get_json(&["get", "networktuning", "edge"])["status"].clone();
        (s["phase"] == "Complete").then(|| s["currentRevision"].as_str().map(str::to_string))?
    });
    let tuning_status = lab.get_json(&["get", "networktuning", "edge"])["status"].clone();
    let before: Vec<(Value, Vec<String>)> = ["node-a", "node-b"]
        .iter()
        .map(|n| (applied_state(&lab, n), host(&lab, n)))
        .collect();
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_fin_timeout"), "30");

    // The changed tuning from a file, as JSON: each node's answer.
    let file = write(lab.dir(), "edge-next.yaml", CHANGED);
    let out = run(&lab, &["plan", &file, "-o", "json"]);
    assert_eq!(out.status.code(), Some(EXIT_WOULD_FAIL));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan prints JSON");
    let changed = plan["revision"].as_str().expect("a revision").to_string();
    assert_ne!(changed, applied);
    let results: Vec<(&str, &str)> = plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap(),
                n["answer"]["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("node-a", "planned"),
            ("node-b", "planned"),
            ("node-c", "noAgent")
        ]
    );
    let failing: Vec<&Value> = plan["nodes"][1]["answer"]["preview"]["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|i| i["state"] == "WouldFail")
        .collect();
    assert_eq!(failing.len(), 1, "{plan:#}");
    assert_eq!(failing[0]["target"], RP_FILTER);
    assert!(
        failing[0]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{plan:#}"
    );
    no_preview_left(&lab);

    // The same as text: the per-node diff.
    let out = run(&lab, &["plan", &file]);
    assert_eq!(out.status.code(), Some(EXIT_WOULD_FAIL));
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert!(!text.contains('\x1b'), "no colour on a pipe: {text}");
    assert_eq!(mask(&text, &applied, &changed), GOLDEN);
    no_preview_left(&lab);

    // A config the NodeTuning schema refuses: the API server's words, exit 1, nothing left.
    let bad = write(
        lab.dir(),
        "bad.yaml",
        &CHANGED.replace("net.ipv4.tcp_ecn", "kernel.panic"),
    );
    let out = run(&lab, &["plan", &bad]);
    assert_eq!(out.status.code(), Some(1));
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(
        why.starts_with(
            "error: the API server refused writing the preview request to NodeTuning node-a: "
        ) && why.contains("sysctl key kernel.panic is not allowed"),
        "{why}"
    );
    no_preview_left(&lab);

    // Nothing changed: hosts, journals, the NodeTunings' applied state, the rollout.
    let after: Vec<(Value, Vec<String>)> = ["node-a", "node-b"]
        .iter()
        .map(|n| (applied_state(&lab, n), host(&lab, n)))
        .collect();
    assert_eq!(after, before);
    assert!(lab
        .kubectl(&["get", "nodetuning", "node-c"])
        .stderr
        .starts_with(b"Error from server (NotFound)"));
    let now = lab.get_json(&["get", "networktuning", "edge"])["status"].clone();
    assert_eq!(
        (&now["currentRevision"], &now["phase"], &now["waves"]),
        (
            &tuning_status["currentRevision"],
            &tuning_status["phase"],
            &tuning_status["waves"]
        )
    );

    // The applied tuning by name, on one node: the host is at it, so no change, exit 0.
    let out = run(&lab, &["plan", "edge", "--node", "node-a"]);
    assert_eq!(out.status.code(), Some(0));
    let text = mask(&String::from_utf8_lossy(&out.stdout), &applied, &changed);
    assert_eq!(
        text,
        "Plan of NetworkTuning edge revision <applied>: 1 node selected\n\n\
         node-a  no change  (on edge revision <applied>)\n  \
         = 2 settings already as desired\n\n\
         Nodes: 1 unchanged. Nothing was changed.\n"
    );
    let out = run(&lab, &["plan", "edge", "--node", "node-c"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: node node-c is not selected by the tuning's nodeSelector\n"
    );
    no_preview_left(&lab);

    // A node whose agent is stopped gives no answer in time; the request goes anyway.
    lab.kill_agent("node-b", Signal::Term);
    let out = run(
        &lab,
        &["plan", &file, "--node", "node-b", "--timeout", "2s"],
    );
    assert_eq!(out.status.code(), Some(EXIT_INCOMPLETE));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("no answer from its agent within 2s"),
        "{out:?}"
    );
    assert!(nodetuning(&lab, "node-b")["spec"].get("preview").is_none());

    // Ctrl-C while waiting: the request is removed, exit 130.
    let child = Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(["plan", &file, "--node", "node-b", "--timeout", "10m"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the plugin runs");
    let pid = child.id().to_string();
    let mut running = Running(Some(child));
    lab.wait_for("the request on node-b", STEP, || {
        nodetuning(&lab, "node-b")["spec"]
            .get("preview")
            .map(|_| ())
    });
    let interrupted = Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill runs");
    assert!(interrupted.success());
    let child = running.0.take().expect("the plugin");
    let out = child.wait_with_output().expect("the plugin exits");
    assert_eq!(out.status.code(), Some(EXIT_INTERRUPTED), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{out:?}"
    );
    assert!(nodetuning(&lab, "node-b")["spec"].get("preview").is_none());
    assert_eq!(applied_state(&lab, "node-b"), before[1].0);
}

/// A plugin process, killed if the test fails while it runs.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A preview asked while the agent is applying waits for that transaction and is answered
/// after it: the agents pause 2 s after every host write, `plan` is started as soon as node-a
/// reports Applying, its request is seen on the NodeTuning while the status still says
/// Applying, and its answer is made from the host and journal the transaction left (the new
/// revision applied, its settings unchanged, only the planned ECN would change).
#[test]
fn a_preview_during_an_apply_is_answered_after_it() {
    let lab = Lab::start(LabConfig {
        agent_args: vec!["--step-delay".into(), "2s".into()],
        ..LabConfig::with_nodes(2)
    })
    .expect("lab starts");
    lab.write_sysctl("node-a", "net.ipv4.tcp_fin_timeout", "60");
    lab.write_sysctl("node-a", "net.ipv4.tcp_keepalive_probes", "9");
    lab.write_sysctl("node-a", "net.ipv4.tcp_ecn", "2");
    lab.apply_yaml(APPLIED).expect("the tuning is accepted");
    lab.wait_for("node-a to be applying", STEP, || {
        // The operator may not have created the NodeTuning yet.
        let out = lab.kubectl(&["get", "nodetuning", "node-a", "-o", "json"]);
        let nt: Value = serde_json::from_slice(&out.stdout).ok()?;
        (nt["status"]["state"] == "Applying").then_some(())
    });
    let file = write(
        lab.dir(),
        "edge-ecn.yaml",
        &APPLIED.replace(
            "    net.ipv4.tcp_keepalive_probes: \"5\"\n",
            "    net.ipv4.tcp_keepalive_probes: \"5\"\n    net.ipv4.tcp_ecn: \"1\"\n",
        ),
    );
    let child = Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args([
            "plan",
            &file,
            "--node",
            "node-a",
            "--timeout",
            "5m",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the plugin runs");
    let mut running = Running(Some(child));
    let asked = lab.wait_for("the request on node-a", STEP, || {
        let nt = nodetuning(&lab, "node-a");
        nt["spec"].get("preview").is_some().then_some(nt)
    });
    assert_eq!(asked["status"]["state"], "Applying", "{asked:#}");
    assert!(asked["status"].get("preview").is_none());
    let child = running.0.take().expect("the plugin");
    let out = child.wait_with_output().expect("the plugin exits");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let plan: Value = serde_json::from_slice(&out.stdout).expect("plan prints JSON");
    let preview = &plan["nodes"][0]["answer"]["preview"];
    let nt = nodetuning(&lab, "node-a");
    assert_eq!(nt["status"]["state"], "Applied");
    assert_eq!(
        preview["appliedRevision"], nt["spec"]["revision"],
        "{plan:#}"
    );
    let states: Vec<(&str, &str)> = preview["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| (i["target"].as_str().unwrap(), i["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [
            ("net.ipv4.tcp_ecn", "WouldChange"),
            ("net.ipv4.tcp_fin_timeout", "Unchanged"),
            ("net.ipv4.tcp_keepalive_probes", "Unchanged"),
        ]
    );
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_ecn"), "2");
    assert!(nodetuning(&lab, "node-a")["spec"].get("preview").is_none());
}
