//! hoststack installed with Helm on a real node pool: three kubelets with containerd, each in
//! its node's network namespace, the lab's images imported (no registry), the chart from
//! charts/hoststack. One lab for the whole life cycle (a real pool takes a while to boot):
//! install, a tuning through the agent pods, an upgrade, an agent pod deleted in the middle of
//! a transaction (SIGTERM, which lets the transaction finish), the agent's container SIGKILLed
//! in the middle of one (the kubelet restarts it; the journal makes it all or nothing), and
//! uninstall. Timings and memory are printed (`--nocapture`), never asserted.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use hoststack_e2e::{Lab, LabConfig, Signal, NAMESPACE};

/// How long any one step may take to converge.
const CONVERGE: Duration = Duration::from_secs(120);

/// The first revision's sysctls, each different from a fresh namespace's default.
const FIRST: [(&str, &str); 3] = [
    ("net.ipv4.tcp_sack", "0"),
    ("net.ipv4.tcp_congestion_control", "reno"),
    ("net.ipv4.tcp_rmem", "4096 65536 1048576"),
];

/// The second revision: every key changes again, so a half-applied revision shows. (A node
/// namespace may choose only from net.ipv4.tcp_allowed_congestion_control, "reno bbr" here.)
const SECOND: [(&str, &str); 3] = [
    ("net.ipv4.tcp_sack", "1"),
    ("net.ipv4.tcp_congestion_control", "bbr"),
    ("net.ipv4.tcp_rmem", "4096 131072 2097152"),
];

/// The agent's pause after each host write while the test interrupts a transaction.
const STEP_DELAY: &str = "--step-delay=3s";

/// The upgrade's value that gives the agents [`STEP_DELAY`] (agent.extraArgs).
const SLOW_AGENTS: &str = "agent.extraArgs={--step-delay=3s}";

fn tuning_yaml(sysctls: &[(&str, &str)]) -> String {
    let mut yaml = String::from(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: edge\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  sysctls:\n",
    );
    for (k, v) in sysctls {
        yaml.push_str(&format!("    {k}: \"{v}\"\n"));
    }
    yaml
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sysctls(lab: &Lab, node: &str) -> BTreeMap<String, String> {
    FIRST
        .iter()
        .map(|(k, _)| (k.to_string(), lab.sysctl(node, k)))
        .collect()
}

fn jsonpath(lab: &Lab, args: &[&str], path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let mut all = args.to_vec();
    all.extend(["-o", &expr]);
    let out = lab.kubectl(&all);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn helm_ok(lab: &Lab, args: &[&str]) -> String {
    let out = lab.helm(args);
    assert!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl_ok(lab: &Lab, args: &[&str]) -> String {
    let out = lab.kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Running pods of `component` ("operator" or the agent) as (name, node, uid).
fn running_pods(lab: &Lab, selector: &str) -> Vec<(String, String, String)> {
    let pods = lab.get_json(&["get", "pods", "-n", NAMESPACE, "-l", selector]);
    pods["items"]
        .as_array()
        .expect("a pod list")
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["containerStatuses"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().all(|c| c["ready"] == true))
        })
        .map(|p| {
            let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (
                s(&p["metadata"]["name"]),
                s(&p["spec"]["nodeName"]),
                s(&p["metadata"]["uid"]),
            )
        })
        .collect()
}

const OPERATOR_PODS: &str = "app.kubernetes.io/component=operator";
const AGENT_PODS: &str = "app.kubernetes.io/name=hoststack-agent";

/// The sysctl originals in `node`'s agent journal (its /var/lib/hoststack, inside the node),
/// whitespace collapsed as [`Lab::sysctl`] reads values; fails on a transaction left in it.
fn journaled_originals(lab: &mut Lab, node: &str) -> BTreeMap<String, String> {
    let text = lab.read_real_node_file(node, "/var/lib/hoststack/journal.json");
    let journal: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{node}'s journal ({e}): {text}"));
    assert!(
        journal["transaction"].is_null(),
        "{node}'s journal holds an unfinished transaction: {text}"
    );
    journal["originals"]
        .as_array()
        .unwrap_or_else(|| panic!("no originals in {text}"))
        .iter()
        .map(|e| {
            let value = e["value"].as_str().unwrap_or_default();
            (
                e["target"].as_str().unwrap_or_default().to_string(),
                value.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect()
}

fn agent_nodes(lab: &Lab) -> Vec<String> {
    let mut nodes: Vec<String> = running_pods(lab, AGENT_PODS)
        .into_iter()
        .map(|(_, node, _)| node)
        .collect();
    nodes.sort();
    nodes
}

fn wait_applied(lab: &Lab, what: &str, want: &BTreeMap<String, String>) {
    lab.wait_for(what, CONVERGE, || {
        let progress = jsonpath(
            lab,
            &["get", "networktuning", "edge"],
            "{.status.progress} {.status.phase}",
        );
        let hosts = ["node-a", "node-b"]
            .iter()
            .all(|n| sysctls(lab, n) == *want);
        (progress == "2/2 Complete" && hosts).then_some(())
    });
}

/// Resident memory of a process in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Resident memory of every process of the pod with `uid` (found by its cgroup), in MiB.
fn pod_rss_mib(uid: &str) -> f64 {
    // The cgroupfs driver names a pod's cgroup pod<uid>.
    let needle = format!("pod{uid}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
                c.lines()
                    .any(|l| l.contains(":memory:") && l.contains(&needle))
            })
        })
        .map(rss_mib)
        .sum()
}

/// Resident memory of containerd's shims of this lab, in MiB, and how many there are.
fn shims_rss_mib(lab_dir: &Path) -> (usize, f64) {
    let marker = format!("HOSTSTACK_LAB_DIR={}", lab_dir.display());
    let shims: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim().starts_with("containerd-shim"))
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
        })
        .collect();
    (shims.len(), shims.iter().map(|p| rss_mib(*p)).sum())
}

fn print_memory(lab: &mut Lab) {
    let mut total = 0.0;
    let mut processes = lab.processes();
    processes.extend(lab.real_node_processes());
    for (name, pid) in processes {
        let mib = rss_mib(pid);
        total += mib;
        eprintln!("memory: {name:<28} {mib:7.1} MiB");
    }
    let (count, shims) = shims_rss_mib(lab.dir());
    total += shims;
    eprintln!("memory: {count} containerd shims          {shims:7.1} MiB");
    for selector in [OPERATOR_PODS, AGENT_PODS] {
        for (pod, node, uid) in running_pods(lab, selector) {
            let mib = pod_rss_mib(&uid);
            total += mib;
            eprintln!("memory: pod {pod} on {node}: {mib:.1} MiB");
        }
    }
    eprintln!("memory: total {total:.1} MiB");
}

#[test]
fn helm_install_upgrade_interrupt_and_uninstall_on_a_real_pool() {
    let started = Instant::now();
    let mut lab = Lab::start(LabConfig::real_pool(3)).expect("the real pool starts");
    let pool_ready = started.elapsed();
    let originals: BTreeMap<String, BTreeMap<String, String>> = lab
        .node_names()
        .into_iter()
        .map(|n| {
            let now = sysctls(&lab, &n);
            (n, now)
        })
        .collect();
    for node in originals.values() {
        assert_ne!(
            *node,
            map(&FIRST),
            "the test needs hosts that differ from FIRST"
        );
    }

    // ---- helm install --------------------------------------------------------------------
    let values = lab.lab_chart_values("operator:\n  revertTimeout: 60s\n");
    let chart = lab.chart_dir();
    let (chart, values) = (chart.to_str().unwrap(), values.to_str().unwrap());
    let install = Instant::now();
    helm_ok(
        &lab,
        &[
            "install",
            "hoststack",
            chart,
            "-n",
            NAMESPACE,
            "--create-namespace",
            "-f",
            values,
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    let operators = running_pods(&lab, OPERATOR_PODS);
    assert_eq!(
        operators.len(),
        2,
        "two operator replicas run: {operators:?}"
    );
    let leader = lab.wait_for("one operator replica to hold the lease", CONVERGE, || {
        let holder = jsonpath(
            &lab,
            &["get", "lease", "hoststack-operator", "-n", NAMESPACE],
            "{.spec.holderIdentity}",
        );
        operators
            .iter()
            .any(|(name, _, _)| *name == holder)
            .then_some(holder)
    });
    let operator_ready = install.elapsed();
    // Nothing is tuned yet: the DaemonSet exists and has no pods.
    lab.wait_for("the agent DaemonSet", CONVERGE, || {
        lab.kubectl(&["get", "daemonset", "hoststack-agent", "-n", NAMESPACE])
            .status
            .success()
            .then_some(())
    });
    assert_eq!(
        agent_nodes(&lab),
        Vec::<String>::new(),
        "no agent before a tuning"
    );

    // ---- a NetworkTuning through the agent pods ------------------------------------------
    let apply = Instant::now();
    lab.apply_yaml(&tuning_yaml(&FIRST))
        .expect("the tuning is accepted");
    lab.wait_for("agent pods Running on node-a and node-b", CONVERGE, || {
        (agent_nodes(&lab) == ["node-a", "node-b"]).then_some(())
    });
    let agents_running = apply.elapsed();
    wait_applied(
        &lab,
        "the first revision on node-a and node-b",
        &map(&FIRST),
    );
    let tuned = apply.elapsed();
    assert_eq!(
        agent_nodes(&lab),
        ["node-a", "node-b"],
        "no agent on node-c"
    );
    assert_eq!(
        sysctls(&lab, "node-c"),
        originals["node-c"],
        "node-c untouched"
    );
    eprintln!(
        "timing: Lab::start to every Node Ready (with any cargo build of the binaries; \
         logs/lab.log has the lab's own phases) {:.1}s; helm install to operators Ready and a leader ({leader}) \
         {:.1}s; tuning applied to agents Running {:.1}s, to both hosts tuned {:.1}s; from \
         nothing to agents Running {:.1}s",
        pool_ready.as_secs_f64(),
        operator_ready.as_secs_f64(),
        agents_running.as_secs_f64(),
        tuned.as_secs_f64(),
        (pool_ready + operator_ready + agents_running).as_secs_f64()
    );
    print_memory(&mut lab);

    // ---- helm upgrade rolls the pods, the hosts keep their tuning -------------------------
    // The upgrade also slows the agents down (a step delay after each host write, through
    // agent.extraArgs) so that the next part can interrupt a transaction: as a chart value it
    // is in the operator's flags, so every leader applies it.
    let before: Vec<String> = running_pods(&lab, AGENT_PODS)
        .into_iter()
        .chain(running_pods(&lab, OPERATOR_PODS))
        .map(|(_, _, uid)| uid)
        .collect();
    helm_ok(
        &lab,
        &[
            "upgrade",
            "hoststack",
            chart,
            "-n",
            NAMESPACE,
            "-f",
            values,
            "--set",
            "operator.logLevel=debug",
            "--set",
            "agent.logLevel=debug",
            "--set",
            SLOW_AGENTS,
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    lab.wait_for("every operator and agent pod replaced", CONVERGE, || {
        // Each check samples the hosts: the tuning must hold through the whole roll.
        for node in ["node-a", "node-b"] {
            assert_eq!(
                sysctls(&lab, node),
                map(&FIRST),
                "{node} during the upgrade"
            );
        }
        let agents = running_pods(&lab, AGENT_PODS);
        let operators = running_pods(&lab, OPERATOR_PODS);
        let fresh = agents
            .iter()
            .chain(&operators)
            .all(|(_, _, uid)| !before.contains(uid));
        (fresh && agents.len() == 2 && operators.len() == 2).then_some(())
    });
    let agent_env = jsonpath(
        &lab,
        &["get", "daemonset", "hoststack-agent", "-n", NAMESPACE],
        "{.spec.template.spec.containers[0].env}",
    );
    assert!(
        agent_env.contains("debug"),
        "the upgrade reached the agents: {agent_env}"
    );
    let agent_args = jsonpath(
        &lab,
        &["get", "daemonset", "hoststack-agent", "-n", NAMESPACE],
        "{.spec.template.spec.containers[0].args}",
    );
    assert!(
        agent_args.contains(STEP_DELAY),
        "agent.extraArgs reached the agents: {agent_args}"
    );
    wait_applied(&lab, "the first revision after the upgrade", &map(&FIRST));

    // ---- an agent pod deleted in the middle of a transaction ------------------------------
    // The agents run with the upgrade's step delay, so the test can interrupt one.
    lab.wait_for("the slowed agents Running", CONVERGE, || {
        let pods = lab.get_json(&["get", "pods", "-n", NAMESPACE, "-l", AGENT_PODS]);
        let slow = pods["items"].as_array().is_some_and(|items| {
            items.len() == 2
                && items.iter().all(|p| {
                    p["spec"]["containers"][0]["args"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|v| v == STEP_DELAY))
                })
        });
        (slow && agent_nodes(&lab) == ["node-a", "node-b"]).then_some(())
    });
    wait_applied(&lab, "the first revision after the slow roll", &map(&FIRST));
    lab.apply_yaml(&tuning_yaml(&SECOND))
        .expect("the second revision is accepted");
    let second = map(&SECOND);
    let first = map(&FIRST);
    let victim = lab.wait_for("node-a between the two revisions", CONVERGE, || {
        let now = sysctls(&lab, "node-a");
        let changed = now.iter().filter(|(k, v)| **v == second[*k]).count();
        (changed >= 1 && changed < SECOND.len()).then_some(now)
    });
    let pod = running_pods(&lab, AGENT_PODS)
        .into_iter()
        .find(|(_, node, _)| node == "node-a")
        .expect("node-a's agent pod");
    kubectl_ok(
        &lab,
        &["delete", "pod", &pod.0, "-n", NAMESPACE, "--wait=true"],
    );
    eprintln!(
        "deleted agent pod {} with node-a half-way: {victim:?}",
        pod.0
    );
    lab.wait_for("the DaemonSet to recreate node-a's agent", CONVERGE, || {
        running_pods(&lab, AGENT_PODS)
            .iter()
            .any(|(_, node, uid)| node == "node-a" && *uid != pod.2)
            .then_some(())
    });
    // All or nothing: from here on node-a is never half-way, and it ends at the new revision.
    lab.wait_for("node-a at the second revision", CONVERGE, || {
        let now = sysctls(&lab, "node-a");
        let settled = jsonpath(&lab, &["get", "nodetuning", "node-a"], "{.status.state}");
        (now == second && settled == "Applied").then_some(())
    });
    wait_applied(&lab, "the second revision on both hosts", &second);
    assert_ne!(first, second);

    // ---- the agent's container SIGKILLed in the middle of a transaction -------------------
    // Back to the first revision; node-a's agent process dies between two host writes, with
    // no chance to finish. The kubelet restarts the container in the same pod, and the
    // restarted agent undoes the interrupted transaction from its journal before it applies
    // the revision again: node-a ends at the first revision, its originals intact.
    let (pod, _, uid) = running_pods(&lab, AGENT_PODS)
        .into_iter()
        .find(|(_, node, _)| node == "node-a")
        .expect("node-a's agent pod");
    let third = Instant::now();
    lab.apply_yaml(&tuning_yaml(&FIRST))
        .expect("the first revision again is accepted");
    let victim = lab.wait_for("node-a between the two revisions again", CONVERGE, || {
        let now = sysctls(&lab, "node-a");
        let changed = now.iter().filter(|(k, v)| **v == first[*k]).count();
        (changed >= 1 && changed < FIRST.len()).then_some(now)
    });
    let killed = lab.signal_pod_processes("node-a", "hoststack-agent", Signal::Kill);
    assert_eq!(
        killed.len(),
        1,
        "one agent process in node-a's pods: {killed:?}"
    );
    eprintln!(
        "SIGKILLed node-a's agent (pid {}) half-way: {victim:?}",
        killed[0]
    );
    lab.wait_for(
        "the kubelet to restart node-a's agent container",
        CONVERGE,
        || {
            let p = lab.get_json(&["get", "pod", &pod, "-n", NAMESPACE]);
            let restarts = p["status"]["containerStatuses"][0]["restartCount"].as_u64();
            (p["metadata"]["uid"] == uid.as_str() && restarts >= Some(1)).then_some(())
        },
    );
    lab.wait_for("node-a at the first revision again", CONVERGE, || {
        let now = sysctls(&lab, "node-a");
        let settled = jsonpath(&lab, &["get", "nodetuning", "node-a"], "{.status.state}");
        (now == first && settled == "Applied").then_some(())
    });
    let log = kubectl_ok(&lab, &["logs", &pod, "-n", NAMESPACE]);
    assert!(
        log.contains("undid an interrupted transaction from the journal"),
        "the restarted agent found the transaction the kill interrupted: {log}"
    );
    assert_eq!(
        journaled_originals(&mut lab, "node-a"),
        originals["node-a"],
        "node-a's journal keeps the originals from before the first tuning"
    );
    wait_applied(&lab, "the first revision on both hosts again", &first);
    eprintln!(
        "timing: the revision with node-a's agent SIGKILLed half-way, applied to both hosts: {:.1}s",
        third.elapsed().as_secs_f64()
    );

    // ---- a Node deleted takes its NodeTuning with it ---------------------------------------
    // The operator makes each NodeTuning owned by its Node, so the garbage collector (in the
    // lab's kube-controller-manager) deletes it with the Node: a pool that replaces nodes does
    // not pile up NodeTunings of nodes long gone, and the operator does not write one back.
    // node-b's agent, still running, sees its NodeTuning gone and puts the host back as it
    // was. (The kubelet does not register a deleted Node again until it restarts: 1.37's
    // registerWithAPIServer runs once.)
    let matched_nodes = |lab: &Lab| {
        jsonpath(
            lab,
            &["get", "networktuning", "edge"],
            "{.status.matchedNodes}",
        )
        .parse::<u32>()
        .ok()
    };
    let matched = matched_nodes(&lab).expect("edge's matchedNodes");
    let node_uid = jsonpath(&lab, &["get", "node", "node-b"], "{.metadata.uid}");
    let owner = jsonpath(
        &lab,
        &["get", "nodetuning", "node-b"],
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].uid}",
    );
    assert_eq!(
        owner,
        format!("Node/{node_uid}"),
        "node-b's NodeTuning is owned by its Node"
    );
    // `Some(true)` while node-b's NodeTuning exists, `Some(false)` once it is gone.
    let node_b_tuning_exists = |lab: &Lab| {
        let args = [
            "get",
            "nodetuning",
            "node-b",
            "--ignore-not-found",
            "-o",
            "name",
        ];
        let out = lab.kubectl(&args);
        out.status.success().then_some(!out.stdout.is_empty())
    };
    kubectl_ok(&lab, &["delete", "node", "node-b", "--wait=true"]);
    lab.wait_for(
        "node-b's NodeTuning collected with its Node",
        CONVERGE,
        || (node_b_tuning_exists(&lab) == Some(false)).then_some(()),
    );
    lab.wait_for("the operator to count one node fewer", CONVERGE, || {
        (matched_nodes(&lab)? + 1 == matched).then_some(())
    });
    assert_eq!(
        node_b_tuning_exists(&lab),
        Some(false),
        "the operator wrote node-b's NodeTuning back"
    );
    lab.wait_for("node-b's host back as it was", CONVERGE, || {
        (sysctls(&lab, "node-b") == originals["node-b"]).then_some(())
    });

    // ---- helm uninstall -------------------------------------------------------------------
    helm_ok(
        &lab,
        &[
            "uninstall",
            "hoststack",
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "180s",
        ],
    );
    lab.wait_for("the operator and agent pods gone", CONVERGE, || {
        let pods = lab.get_json(&["get", "pods", "-n", NAMESPACE]);
        pods["items"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(())
    });
    // docs/install.md, Uninstall: the CRDs stay, and with them every NetworkTuning and the
    // hosts' tuning; the operator, its DaemonSet, the RBAC and the admission policy go.
    for crd in ["networktunings.hoststack.dev", "nodetunings.hoststack.dev"] {
        kubectl_ok(&lab, &["get", "crd", crd]);
    }
    kubectl_ok(&lab, &["get", "networktuning", "edge"]);
    kubectl_ok(&lab, &["get", "nodetuning", "node-a"]);
    let label = jsonpath(
        &lab,
        &["get", "node", "node-a"],
        "{.metadata.labels.hoststack\\.dev/agent}",
    );
    assert_eq!(label, "true", "node-a keeps its hoststack.dev/agent label");
    assert_eq!(sysctls(&lab, "node-a"), first, "node-a keeps its tuning");
    for node in ["node-b", "node-c"] {
        assert_eq!(sysctls(&lab, node), originals[node], "{node}");
    }
    for (kind, name) in [
        ("deployment", "hoststack-operator"),
        ("daemonset", "hoststack-agent"),
        ("poddisruptionbudget", "hoststack-operator"),
        ("serviceaccount", "hoststack-agent"),
        ("serviceaccount", "hoststack-operator"),
        ("clusterrole", "hoststack-agent"),
        ("clusterrolebinding", "hoststack-agent"),
        ("validatingadmissionpolicy", "hoststack-agent-own-node"),
        (
            "validatingadmissionpolicybinding",
            "hoststack-agent-own-node",
        ),
        ("validatingadmissionpolicy", "hoststack-node-spec-guard"),
        (
            "validatingadmissionpolicybinding",
            "hoststack-node-spec-guard",
        ),
        ("validatingadmissionpolicy", "hoststack-operator-node-label"),
        (
            "validatingadmissionpolicybinding",
            "hoststack-operator-node-label",
        ),
    ] {
        let out = lab.kubectl(&["get", kind, name, "-n", NAMESPACE]);
        assert!(
            !out.status.success(),
            "{kind}/{name} is left after uninstall"
        );
    }
    lab.stop().expect("the real pool stops cleanly");
}
