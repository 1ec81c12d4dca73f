//! The user-space TCP stack through the whole control loop, on real packets: a NetworkTuning
//! with `userspaceStack` (AF_XDP on a veth of the node, core 1, an http service) makes the
//! node's agent take core 1 out of the interface's RPS mask, start `hoststack-userstack`, and
//! report it. A Linux client in another namespace fetches the body byte-exact with curl, while
//! the node's kernel TCP on the same interface keeps serving a listener on another port. The
//! status shows backend, mode, shard, service and packets; the runner's counters are on the
//! agent's /metrics with `stack="userspace"`, and every panel of the User-space stack dashboard
//! has data from a real Prometheus scraping them. The runner SIGKILLed is restarted and serves
//! again; the agent SIGKILLed and started again takes the running runner over instead of
//! starting a second one. Deleting the tuning stops the runner and leaves no XDP program, no
//! pinned object, no runner process, and the RPS mask as it was.
//!
//! The client namespaces are named `hs<k>-us-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them even when this test dies; the runner carries the lab's marker in its
//! environment, so the teardown kills it too.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use hoststack_e2e::clients::{connect_from, hold_from, Clients, Service};
use hoststack_e2e::dashboards;
use hoststack_e2e::prometheus::{sample, scrape, Prometheus, SCRAPE_INTERVAL};
use hoststack_e2e::{Lab, LabConfig, Signal};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(90);
const NODE: &str = "node-a";
/// The node's extra interface, which the stack shares with the node's kernel.
const IFACE: &str = "us0";
/// The client subnet: the node's kernel is .1, the clients .10 and .20, the stack .50.
const SUBNET: [u8; 3] = [198, 19, 44];
const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 44, 50);
/// The dedicated core (the machine has at least two).
const CORE: u32 = 1;
const RPS: &str = "/sys/class/net/us0/queues/rx-0/rps_cpus";
const PASSIVE_OPENS: &str =
    "hoststack_netstat_total{stack=\"userspace\",proto=\"Tcp\",field=\"PassiveOpens\"}";

/// The http service's body: several segments' worth of distinct lines.
fn body() -> String {
    (0..120)
        .map(|i| format!("hoststack userstack line {i:04} abcdefghijklmnopqrstuvwxyz\n"))
        .collect()
}

fn tuning() -> String {
    serde_json::json!({
        "apiVersion": "hoststack.dev/v1alpha1",
        "kind": "NetworkTuning",
        "metadata": { "name": "userstack" },
        "spec": {
            "nodeSelector": { "matchLabels": { "pool": "edge" } },
            "userspaceStack": {
                "cores": CORE.to_string(),
                "interface": IFACE,
                "backend": "AfXdp",
                "address": format!("{STACK_IP}/24"),
                "services": [ { "kind": "Http", "port": 80, "body": body() } ]
            }
        }
    })
    .to_string()
}

/// `.status` of the node's NodeTuning; null while the operator has not created it yet.
fn status_of(lab: &Lab) -> serde_json::Value {
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", "json"]);
    if !out.status.success() {
        return serde_json::Value::Null;
    }
    let object: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("kubectl prints JSON");
    object["status"].clone()
}

/// `.status.userspaceStack` of the node's NodeTuning (null when absent).
fn stack_status(lab: &Lab) -> serde_json::Value {
    status_of(lab)["userspaceStack"].clone()
}

fn node_state(lab: &Lab) -> String {
    status_of(lab)["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The body curl fetches from the stack's http service out of namespace `ns`, when it gets one.
fn fetch(ns: &str) -> Option<Vec<u8>> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "--silent", "--fail"])
        .args(["--max-time", "5"])
        .arg(format!("http://{STACK_IP}/"))
        .output()
        .expect("curl runs (scripts/setup.sh installs it)");
    out.status.success().then_some(out.stdout)
}

/// Whether an XDP program is attached to the node's us0.
fn xdp_attached(lab: &Lab) -> bool {
    let out = Command::new("ip")
        .args(["-n", lab.netns(NODE), "-d", "link", "show", "dev", IFACE])
        .output()
        .expect("ip link");
    String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
}

/// The CPUs of us0's rx-0 RPS mask, and the mask as the kernel prints it.
fn rps(lab: &Lab) -> (BTreeSet<u32>, String) {
    let out = lab.exec_in_node(NODE, &["cat", RPS]);
    assert!(out.status.success(), "reading {RPS}");
    let mask = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut cpus = BTreeSet::new();
    for (i, group) in mask.split(',').rev().enumerate() {
        let word = u32::from_str_radix(group, 16).expect("a hex mask");
        cpus.extend(
            (0..32)
                .filter(|b| word & (1 << b) != 0)
                .map(|b| i as u32 * 32 + b),
        );
    }
    (cpus, mask)
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .is_some_and(|i| !stat[i + 1..].trim_start().starts_with('Z'))
    })
}

/// Pids of the runners started from this node's state dir.
fn runners(lab: &Lab) -> Vec<u64> {
    let config = lab.agent_state_dir(NODE).join("userstack/config.json");
    let needle = config.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

/// Waits until the stack runs with a pid other than `not`, and returns its status.
fn running(lab: &Lab, what: &str, not: Option<u64>) -> serde_json::Value {
    lab.wait_for(what, CONVERGE, || {
        let s = stack_status(lab);
        (s["state"] == "Running" && s["pid"].as_u64().is_some() && s["pid"].as_u64() != not)
            .then_some(s)
    })
}

#[test]
fn the_userspace_stack_serves_beside_the_kernel_is_restarted_and_reverts() {
    let lab = Lab::start(LabConfig {
        agent_args: vec!["--resync-interval".into(), "1s".into()],
        ..LabConfig::with_nodes(1)
    })
    .expect("lab starts");
    let clients = Clients::build(&lab, NODE, IFACE, "us", SUBNET).expect("client namespaces");
    let client = clients.allowed.as_str();
    let kernel = Service::start(lab.netns(NODE), clients.node_ip).expect("a kernel listener");
    assert!(connect_from(client, kernel.addr), "the network works");
    // Before: RPS on us0 may use every CPU, the dedicated one included.
    let set = lab.exec_in_node(NODE, &["sh", "-c", &format!("echo 3 > {RPS}")]);
    assert!(set.status.success(), "writing {RPS}");
    let (cpus_before, mask_before) = rps(&lab);
    assert_eq!(cpus_before, [0, 1].into());
    assert!(!xdp_attached(&lab));
    assert_eq!(
        fetch(client),
        None,
        "nothing answers the stack's address yet"
    );

    lab.apply_yaml(&tuning()).expect("the tuning is accepted");
    let status = running(&lab, "the stack to serve", None);
    assert_eq!(node_state(&lab), "Applied");
    assert_eq!(status["backend"], "AfXdp");
    assert_eq!(status["mode"], "copy", "veth offers no zero-copy: {status}");
    assert_eq!(status["cores"], CORE.to_string());
    assert_eq!(status["shards"][0]["core"], CORE);
    assert_eq!(status["shards"][0]["queue"], 0);
    assert_eq!(
        status["services"],
        serde_json::json!([{ "kind": "Http", "port": 80 }])
    );
    // The lab's machine does not isolate core 1: the status says so.
    assert_eq!(status["isolated"], false);
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("not isolated from the scheduler")),
        "{status}"
    );
    assert!(
        xdp_attached(&lab),
        "the runner's redirect program is on us0"
    );
    let (cpus, _) = rps(&lab);
    assert_eq!(cpus, [0].into(), "core 1 is out of the RPS mask");

    // curl over the stack, byte-exact; the kernel's listener on the same interface still works.
    assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));
    assert!(
        connect_from(client, kernel.addr),
        "kernel TCP beside the stack"
    );
    assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));
    let status = lab.wait_for("packets in the status", CONVERGE, || {
        let s = stack_status(&lab);
        (s["shards"][0]["rxPackets"].as_u64() > Some(0)).then_some(s)
    });
    assert!(
        status["shards"][0]["txPackets"].as_u64() > Some(0),
        "{status}"
    );
    // The User-space stack dashboard, as Grafana would ask a real Prometheus scraping this
    // node's agent: every query of every panel returns data, and the established connections
    // panel shows the one connection a client holds open.
    let prometheus = Prometheus::start(&lab).expect("prometheus starts");
    let held = hold_from(client, (STACK_IP, 80).into()).expect("a connection to the stack");
    for _ in 0..3 {
        assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));
        std::thread::sleep(SCRAPE_INTERVAL);
    }
    let dashboard = dashboards::named("userspace.json");
    let established = lab.wait_for("the dashboard's data", CONVERGE, || {
        let answers = dashboards::evaluate(&prometheus, &dashboard, "userstack", NODE, None);
        let empty: Vec<String> = answers
            .iter()
            .filter(|(_, a)| !a.as_ref().is_ok_and(|s| !s.is_empty()))
            .map(|(q, a)| format!("{} / {}: {a:?}", q.panel, q.ref_id))
            .collect();
        if !empty.is_empty() {
            eprintln!("not yet: {empty:?}");
            return None;
        }
        answers
            .into_iter()
            .find(|(q, _)| q.panel == "Established connections")
            .and_then(|(_, a)| a.ok())
            .filter(|s| s.iter().any(|s| s.value == 1.0))
    });
    eprintln!("userspace.json: every panel has data; established: {established:?}");
    drop(held);
    drop(prometheus);
    let opens = lab.wait_for("the stack's counters on /metrics", CONVERGE, || {
        sample(&scrape(lab.agent_metrics_address(NODE))?, PASSIVE_OPENS).filter(|n| *n >= 2)
    });
    assert!(opens >= 2);
    // Every userspace series is named as a kernel series of the same family is.
    let text = scrape(lab.agent_metrics_address(NODE)).expect("/metrics");
    let userspace: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("{stack=\"userspace\","))
        .collect();
    assert!(userspace.len() >= 10, "{userspace:?}");
    for line in userspace {
        let series = &line[..line.rfind(' ').expect("a value")];
        let kernel = series.replace("{stack=\"userspace\",", "{stack=\"kernel\",");
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{kernel} "))),
            "{series} has no kernel twin"
        );
    }

    // SIGKILL the runner: the agent starts it again, and it serves again.
    let first = status["pid"].as_u64().expect("pid");
    assert_eq!(runners(&lab), [first]);
    let kill = Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = running(&lab, "the stack to be restarted", Some(first));
    assert!(status["restarts"].as_u64() >= Some(1), "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("last exit: killed by signal 9")),
        "{status}"
    );
    let second = status["pid"].as_u64().expect("pid");
    assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));
    assert_eq!(runners(&lab), [second]);

    // SIGKILL the agent: the runner keeps serving; the next agent takes it over.
    lab.kill_agent(NODE, Signal::Kill);
    assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));
    lab.start_agent(NODE, &[]);
    lab.wait_for("the restarted agent to reconcile", CONVERGE, || {
        let text = scrape(lab.agent_metrics_address(NODE))?;
        text.lines()
            .any(|l| l.starts_with("hoststack_agent_applied_revision{") && l.ends_with(" 1"))
            .then_some(())
    });
    let status = running(&lab, "the stack to be reported again", None);
    assert_eq!(
        status["pid"].as_u64(),
        Some(second),
        "taken over, not restarted"
    );
    assert_eq!(runners(&lab), [second], "no second runner");
    assert_eq!(fetch(client).as_deref(), Some(body().as_bytes()));

    // Revert: the runner stops, its program goes, RPS gets core 1 back exactly.
    let out = lab.kubectl(&["delete", "networktuning", "userstack", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("the node to revert", CONVERGE, || {
        (node_state(&lab) == "Reverted" && stack_status(&lab).is_null()).then_some(())
    });
    assert!(!alive(second), "the runner is gone");
    assert!(runners(&lab).is_empty());
    assert!(!xdp_attached(&lab), "no XDP program on us0");
    let pins = lab.agent_bpffs_root(NODE);
    let left = std::fs::read_dir(&pins).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "nothing pinned under {}", pins.display());
    assert_eq!(
        rps(&lab),
        (cpus_before, mask_before),
        "the RPS mask as it was"
    );
    assert_eq!(fetch(client), None, "the stack's address answers no more");
    assert!(connect_from(client, kernel.addr), "the kernel still serves");
    drop(kernel);
    drop(clients);
    lab.stop().expect("the lab stops cleanly");
}
