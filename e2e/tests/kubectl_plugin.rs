//! `kubectl hoststack` against the lab: the built plugin binary, run with the lab's admin
//! kubeconfig (and once through kubectl's own plugin lookup), watches and steers real
//! rollouts of real sysctls on four nodes (node-a..node-c in pool=edge, node-d pool=core):
//! `get` while the canary waits (golden text, revisions and times masked), `promote`, `pause`
//! and `resume`, `undo` to the previous revision, `abort` of a live rollout, and `get` of a
//! tuning that does not exist; `status` waiting for a rollout to end Paused, Complete, timed
//! out and RolledBack (its exit codes and lines), and `get --watch` ending when the rollout
//! pauses.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hoststack_e2e::{Identity, Lab, LabConfig};
use serde_json::Value;

/// How long one step of a rollout may take.
const STEP: Duration = Duration::from_secs(90);
/// The tuning's nodes.
const EDGE: [&str; 3] = ["node-a", "node-b", "node-c"];
/// The plugin's exit code for a tuning that does not exist (docs/kubectl-plugin.md).
const EXIT_NOT_FOUND: i32 = 3;
/// `status`'s exit codes (docs/kubectl-plugin.md).
const EXIT_ROLLED_BACK: i32 = 10;
const EXIT_PAUSED: i32 = 12;
const EXIT_TIMEOUT: i32 = 13;

/// Runs the plugin with the lab's admin kubeconfig.
fn run(lab: &Lab, bin: &Path, args: &[&str]) -> Output {
    let out = Command::new(bin)
        .arg("--kubeconfig")
        .arg(lab.kubeconfig())
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("the plugin runs");
    eprintln!(
        "$ kubectl hoststack {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the plugin and returns its stdout, which must be a success.
fn ok(lab: &Lab, bin: &Path, args: &[&str]) -> String {
    let out = run(lab, bin, args);
    assert!(
        out.status.success(),
        "kubectl hoststack {args:?} exited {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `get --watch` running in the background, its lines collected; killed when dropped, also
/// when the test fails.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl Watch {
    fn start(lab: &Lab, bin: &Path, tuning: &str) -> Watch {
        let mut child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(lab.kubeconfig())
            .args(["get", tuning, "--watch"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the plugin runs");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Waits until the watch ends by itself; its exit status.
    fn end(&mut self, lab: &Lab) -> std::process::ExitStatus {
        lab.wait_for("the watch to end", STEP, || {
            self.child.try_wait().expect("the watch's status")
        })
    }

    /// Everything printed so far.
    fn output(&mut self) -> &str {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        &self.seen
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tuning of the edge pool setting `sysctls`, rolled out canary first and promoted by hand.
fn tuning(sysctls: &[(&str, &str)]) -> String {
    let mut yaml = "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: edge\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  sysctls:\n".to_string();
    for (k, v) in sysctls {
        yaml.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    yaml.push_str(
        "  rollout:\n    canary: 1\n    maxUnavailable: 2\n    analysis:\n      manual: true\n",
    );
    yaml
}

fn status(lab: &Lab) -> Value {
    lab.get_json(&["get", "networktuning", "edge"])["status"].clone()
}

/// `status`'s lines: each names the tuning, and each differs from the one before.
fn state_lines(out: &Output) -> Vec<String> {
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert!(!lines.is_empty(), "status printed nothing");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with("NetworkTuning edge: "), "{line}");
        assert!(
            i == 0 || lines[i - 1] != *line,
            "a repeated line: {lines:?}"
        );
    }
    lines
}

fn spec_paused(lab: &Lab) -> bool {
    let out = lab.kubectl(&[
        "get",
        "networktuning",
        "edge",
        "-o",
        "jsonpath={.spec.rollout.paused}",
    ]);
    String::from_utf8_lossy(&out.stdout) == "true"
}

/// Waits until wave `index` of the current rollout waits to be promoted; returns the status.
fn waiting(lab: &Lab, index: usize) -> Value {
    lab.wait_for(&format!("wave {index} to wait for promotion"), STEP, || {
        let s = status(lab);
        (s["phase"] == "Progressing" && s["waves"][index]["analysis"]["verdict"] == "Pending")
            .then_some(s)
    })
}

fn wait_phase(lab: &Lab, want: &str) -> Value {
    lab.wait_for(&format!("edge to be {want}"), STEP, || {
        let s = status(lab);
        (s["phase"] == want).then_some(s)
    })
}

/// `text` with each revision replaced by its name and RFC 3339 times by `<time>`.
fn mask(text: &str, revisions: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (revision, name) in revisions {
        out = out.replace(revision, name);
    }
    // 2026-11-30T02:00:00Z: 20 characters, digits but for - - T : : Z at fixed places.
    let shape = |w: &[u8]| {
        w.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
    };
    let bytes = out.as_bytes();
    let mut masked = String::new();
    let mut i = 0;
    while i < bytes.len() {
        if i + 20 <= bytes.len() && shape(&bytes[i..i + 20]) {
            masked.push_str("<time>");
            i += 20;
        } else {
            let c = out[i..].chars().next().unwrap();
            masked.push(c);
            i += c.len_utf8();
        }
    }
    masked
}

#[test]
fn get_promote_pause_resume_undo_and_abort_steer_a_real_rollout() {
    let lab = Lab::start(LabConfig::with_nodes(4)).expect("lab starts");
    let bin = lab.plugin_binary().to_path_buf();
    let original_dsack = lab.sysctl("node-a", "net.ipv4.tcp_dsack");
    let original_ecn = lab.sysctl("node-a", "net.ipv4.tcp_ecn");
    assert_eq!(original_dsack, "1");
    assert_ne!(original_ecn, "1");

    // Every command has --help, and a tuning that does not exist is named, with exit code 3.
    for command in [
        "get", "status", "promote", "pause", "resume", "abort", "undo",
    ] {
        let help = ok(&lab, &bin, &[command, "--help"]);
        assert!(help.contains("Usage: kubectl hoststack"), "{help}");
    }
    let missing = run(&lab, &bin, &["get", "no-such-tuning"]);
    assert_eq!(missing.status.code(), Some(EXIT_NOT_FOUND));
    let why = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(why, "error: no NetworkTuning named \"no-such-tuning\"\n");

    // An API server that does not answer, and credentials without the right.
    let dead = lab.dir().join("dead.kubeconfig");
    std::fs::write(
        &dead,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: dead\n  context:\n    cluster: dead\n    user: u\ncurrent-context: dead\n",
    )
    .expect("a kubeconfig");
    let out = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(&dead)
        .args(["get", "edge"])
        .output()
        .expect("the plugin runs");
    let why = String::from_utf8_lossy(&out.stderr);
    eprintln!("$ kubectl hoststack get edge  # server down\n{why}");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        why.starts_with("error: API server unreachable: reading NetworkTuning edge: "),
        "{why}"
    );

    // v1: the first revision, promoted wave by wave.
    lab.apply_yaml(&tuning(&[("net.ipv4.tcp_sack", "0")]))
        .expect("accepted");
    waiting(&lab, 0);
    ok(&lab, &bin, &["promote", "edge"]);
    waiting(&lab, 1);
    ok(&lab, &bin, &["promote", "edge"]);
    let v1 = wait_phase(&lab, "Complete")["currentRevision"]
        .as_str()
        .unwrap()
        .to_string();

    let out = Command::new(&bin)
        .arg("--kubeconfig")
        .arg(lab.kubeconfig_of(Identity::Agent))
        .args(["promote", "edge"])
        .output()
        .expect("the plugin runs");
    let why = String::from_utf8_lossy(&out.stderr);
    eprintln!("$ kubectl hoststack promote edge  # as the agent\n{why}");
    assert_eq!(out.status.code(), Some(4));
    assert!(why.starts_with("error: no permission: "), "{why}");

    // v2: the canary waits for promotion; `get` shows it, through kubectl's plugin lookup.
    lab.apply_yaml(&tuning(&[
        ("net.ipv4.tcp_sack", "0"),
        ("net.ipv4.tcp_dsack", "0"),
    ]))
    .expect("accepted");
    let s = waiting(&lab, 0);
    let v2 = s["currentRevision"].as_str().unwrap().to_string();
    let kubectl = hoststack_e2e::control_plane_dir().join("kubectl");
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(&kubectl)
        .args(["hoststack", "--kubeconfig"])
        .arg(lab.kubeconfig())
        .args(["get", "edge"])
        .env("PATH", path)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    eprintln!("$ kubectl hoststack get edge\n{text}");
    assert!(
        !text.contains('\x1b'),
        "no colour when stdout is not a terminal"
    );
    let want = "\
NetworkTuning edge
  Phase:     Progressing
  Revision:  current <v2>  stable <v1>
  Nodes:     3 matched, 1 updated, 1 applied, 0 failed
Waves
├─ canary 0  Applied  applied <time>
│  ├─ analysis Pending: waiting to be promoted: kubectl annotate networktuning edge hoststack.dev/promote=<v2>-wave0 --overwrite
│  └─ node-a  canary  Applied  applied <v2> of edge  probes passed
│     ├─ sysctl net.ipv4.tcp_dsack: 1 → 0 (actual 0)  Applied
│     └─ sysctl net.ipv4.tcp_sack: 1 → 0 (actual 0)  Applied
└─ not in a wave (stable)
   ├─ node-b  stable  Applied  applied <v1> of edge  probes passed
   │  └─ sysctl net.ipv4.tcp_sack: 1 → 0 (actual 0)  Applied
   └─ node-c  stable  Applied  applied <v1> of edge  probes passed
      └─ sysctl net.ipv4.tcp_sack: 1 → 0 (actual 0)  Applied
";
    assert_eq!(
        mask(&text, &[(&v2, "<v2>"), (&v1, "<v1>")]),
        want,
        "\n{text}"
    );
    let json: Value =
        serde_json::from_str(&ok(&lab, &bin, &["get", "edge", "-o", "json"])).unwrap();
    assert_eq!(json["items"][0]["status"]["currentRevision"], v2.as_str());
    assert_eq!(json["items"].as_array().unwrap().len(), 1 + EDGE.len());

    // promote moves the rollout on: wave 1 (node-b, node-c) starts, and a running
    // `get --watch` prints it.
    let mut watch = Watch::start(&lab, &bin, "edge");
    lab.wait_for("the watch to print the tree", STEP, || {
        watch.output().contains("├─ canary 0").then_some(())
    });
    assert!(!watch.output().contains("wave 1"));
    let said = ok(&lab, &bin, &["promote", "edge"]);
    assert_eq!(
        said,
        format!("NetworkTuning edge: promoted canary 0 (node-a) of revision {v2} (hoststack.dev/promote={v2}-wave0)\n")
    );
    let s = waiting(&lab, 1);
    assert_eq!(
        s["waves"][1]["nodes"],
        serde_json::json!(["node-b", "node-c"])
    );
    lab.wait_for("the watch to print wave 1", STEP, || {
        watch.output().contains("└─ wave 1  Applied").then_some(())
    });

    // pause sets spec.rollout.paused: once wave 1 is promoted the rollout holds (Paused);
    // resume clears it and the rollout completes.
    let said = ok(&lab, &bin, &["pause", "edge"]);
    assert_eq!(
        said,
        "NetworkTuning edge: paused (spec.rollout.paused=true)\n"
    );
    assert!(spec_paused(&lab));
    assert_eq!(
        ok(&lab, &bin, &["pause", "edge"]),
        "NetworkTuning edge: already paused; nothing changed\n"
    );
    let said = ok(&lab, &bin, &["promote", "edge"]);
    assert!(said.contains("note: spec.rollout.paused is set"), "{said}");
    // `status` waits for the hold and exits 12, a line per change, the last one Paused.
    let out = run(&lab, &bin, &["status", "edge", "--timeout", "90s"]);
    assert_eq!(out.status.code(), Some(EXIT_PAUSED));
    let lines = state_lines(&out);
    assert_eq!(
        lines.last().unwrap(),
        &format!("NetworkTuning edge: Paused  current {v2}  stable {v1}  3/3 applied  — rollout.paused is set")
    );
    let held = wait_phase(&lab, "Paused");
    assert_eq!(held["message"], "rollout.paused is set");
    // The watch started while the rollout was under way ends with it, on the Paused tree.
    let ended = watch.end(&lab);
    assert!(ended.success(), "{ended}");
    let seen = watch.output().to_string();
    let last_tree = &seen[seen.rfind("NetworkTuning edge\n").unwrap()..];
    assert!(last_tree.contains("  Phase:     Paused\n"), "{seen}");
    drop(watch);
    let said = ok(&lab, &bin, &["resume", "edge"]);
    assert_eq!(
        said,
        "NetworkTuning edge: resumed (spec.rollout.paused=false)\n"
    );
    assert!(!spec_paused(&lab));
    // `status` after resume waits through the rest of the rollout and exits 0.
    let out = run(&lab, &bin, &["status", "edge", "--timeout", "90s"]);
    assert_eq!(out.status.code(), Some(0));
    let lines = state_lines(&out);
    assert_eq!(
        lines.last().unwrap(),
        &format!("NetworkTuning edge: Complete  current {v2}  stable {v2}  3/3 applied")
    );
    let done = wait_phase(&lab, "Complete");
    assert_eq!(done["stableRevision"], v2.as_str());
    for node in EDGE {
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_dsack"), "0", "{node}");
    }

    // undo puts v1's config back into the spec; its rollout brings tcp_dsack back everywhere.
    let said = ok(&lab, &bin, &["undo", "edge"]);
    assert!(
        said.starts_with(&format!(
            "NetworkTuning edge: spec set back from revision {v2} to revision {v1} (#1 in hoststack-system/edge-{v1})"
        )),
        "{said}"
    );
    let s = waiting(&lab, 0);
    assert_eq!(s["currentRevision"], v1.as_str());
    ok(&lab, &bin, &["promote", "edge"]);
    waiting(&lab, 1);
    ok(&lab, &bin, &["promote", "edge"]);
    wait_phase(&lab, "Complete");
    for node in EDGE {
        assert_eq!(
            lab.sysctl(node, "net.ipv4.tcp_dsack"),
            original_dsack,
            "{node}"
        );
        assert_eq!(lab.sysctl(node, "net.ipv4.tcp_sack"), "0", "{node}");
    }

    // abort rolls a live rollout back at once: v3's canary returns to v1.
    lab.apply_yaml(&tuning(&[
        ("net.ipv4.tcp_sack", "0"),
        ("net.ipv4.tcp_ecn", "1"),
    ]))
    .expect("accepted");
    let s = waiting(&lab, 0);
    let v3 = s["currentRevision"].as_str().unwrap().to_string();
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_ecn"), "1");
    // The canary waits for a promotion nobody gives: `status` gives up after --timeout, 13
    // (long enough for its first reading on a busy machine).
    let out = run(&lab, &bin, &["status", "edge", "--timeout", "5s"]);
    assert_eq!(out.status.code(), Some(EXIT_TIMEOUT));
    let lines = state_lines(&out);
    assert!(
        lines.iter().all(|l| l.starts_with(&format!(
            "NetworkTuning edge: Progressing  current {v3}  stable {v1}  "
        ))),
        "{lines:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "timed out: the rollout of NetworkTuning edge did not end within 5s\n"
    );
    let said = ok(&lab, &bin, &["abort", "edge"]);
    assert_eq!(
        said,
        format!("NetworkTuning edge: rollout of revision {v3} aborted (hoststack.dev/abort={v3}); the operator returns its updated nodes (node-a) to the stable revision {v1}\n")
    );
    let back = wait_phase(&lab, "RolledBack");
    assert_eq!(
        back["message"],
        format!("aborted by hand (hoststack.dev/abort={v3})")
    );
    assert_eq!(back["waves"][0]["result"], "RolledBack");
    // The phase turns RolledBack when the abort is seen; node-a's return follows, on the host
    // first and then in the status's count once its agent has reported it.
    lab.wait_for("node-a to be back on v1", STEP, || {
        (lab.sysctl("node-a", "net.ipv4.tcp_ecn") == original_ecn
            && status(&lab)["appliedNodes"] == 0)
            .then_some(())
    });
    let out = run(&lab, &bin, &["status", "edge"]);
    assert_eq!(out.status.code(), Some(EXIT_ROLLED_BACK));
    assert_eq!(
        state_lines(&out),
        [format!("NetworkTuning edge: RolledBack  current {v3}  stable {v1}  0/3 applied  — aborted by hand (hoststack.dev/abort={v3})")]
    );
    let text = ok(&lab, &bin, &["get", "edge"]);
    assert!(text.contains("  Phase:     RolledBack\n"), "{text}");
    assert!(text.contains("├─ canary 0  RolledBack"), "{text}");
    // Aborting again has nothing to abort.
    let again = run(&lab, &bin, &["abort", "edge"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("no rollout to abort (phase RolledBack)")
    );

    let out = lab.kubectl(&["delete", "networktuning", "edge", "--timeout=90s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.stop().expect("the lab stops cleanly");
}
