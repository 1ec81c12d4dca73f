//! The XDP blocklist through the whole control loop, on real traffic: two source namespaces
//! (198.19.30.10, blocked, and 198.19.30.20, allowed) reach a lab node through a bridge and an
//! extra veth (`xdp0` on the node, not its management interface eth0). A NetworkTuning attaches
//! the blocklist natively to `xdp0`; the blocked source's ping and TCP connect fail while the
//! allowed one's succeed; the agent is SIGKILLed and started again and the program stays
//! attached, keeps dropping, and is not re-attached (same program id, no transaction); the drop
//! counters are on the agent's /metrics; deleting the tuning detaches and unpins.
//!
//! The extra namespaces are named `hs<k>-xdp-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them with the node namespaces even when this test dies.

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use hoststack_e2e::clients::{connect_from, ping_from, Clients, Service};
use hoststack_e2e::prometheus::{sample, scrape};
use hoststack_e2e::{Lab, LabConfig, Signal};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 30, 1);

/// The id of the XDP program on the node's xdp0, as `ip -d link` shows it.
fn program_id(lab: &Lab) -> Option<u32> {
    let out = Command::new("ip")
        .args(["-n", lab.netns(NODE), "-d", "link", "show", "dev", "xdp0"])
        .output()
        .expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("prog/xdp id ")? + "prog/xdp id ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn jsonpath(lab: &Lab, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", &expr]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn item(lab: &Lab, kind: &str, field: &str) -> String {
    jsonpath(
        lab,
        &format!("{{.status.items[?(@.kind==\"{kind}\")].{field}}}"),
    )
}

const DROPPED: &str =
    "hoststack_xdp_dropped_packets_total{interface=\"xdp0\",program=\"blocklist\"}";

#[test]
fn an_xdp_blocklist_drops_a_blocked_source_survives_an_agent_kill_and_reverts() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let sources =
        Clients::build(&lab, NODE, "xdp0", "xdp", [198, 19, 30]).expect("client namespaces");
    let service = Service::start(lab.netns(NODE), NODE_IP).expect("a service on the node");
    let (blocked, allowed) = (sources.blocked.as_str(), sources.allowed.as_str());
    assert!(
        ping_from(blocked, NODE_IP) && ping_from(allowed, NODE_IP),
        "the network works"
    );
    assert!(connect_from(blocked, service.addr) && connect_from(allowed, service.addr));
    assert_eq!(program_id(&lab), None);

    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: xdp\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  interfaces:\n  - match:\n      \
         name: xdp0\n    xdp:\n      program: Blocklist\n      mode: Native\n      \
         blockedPrefixes: [\"198.19.30.10/32\"]\n",
    )
    .expect("the tuning is accepted");
    lab.wait_for("node-a to attach the blocklist", CONVERGE, || {
        (jsonpath(&lab, "{.status.state}") == "Applied").then_some(())
    });
    assert_eq!(item(&lab, "xdpProgram", "actual"), "blocklist/native");
    assert_eq!(item(&lab, "xdpProgram", "original"), "none");
    assert_eq!(item(&lab, "xdpBlocklist", "actual"), "198.19.30.10/32");
    let id = program_id(&lab).expect("a program on xdp0");

    assert!(
        !ping_from(blocked, NODE_IP),
        "the blocked source's ping is dropped"
    );
    assert!(!connect_from(blocked, service.addr), "its TCP connect too");
    assert!(
        ping_from(allowed, NODE_IP),
        "the allowed source's ping passes"
    );
    assert!(
        connect_from(allowed, service.addr),
        "the allowed source connects"
    );
    let dropped = lab.wait_for("the drops on /metrics", CONVERGE, || {
        sample(&scrape(lab.agent_metrics_address(NODE))?, DROPPED).filter(|n| *n >= 2)
    });

    // SIGKILL: nothing runs down; the pinned link keeps the program attached.
    lab.kill_agent(NODE, Signal::Kill);
    assert_eq!(
        program_id(&lab),
        Some(id),
        "still attached without the agent"
    );
    assert!(!ping_from(blocked, NODE_IP), "and still dropping");
    assert!(ping_from(allowed, NODE_IP));

    lab.start_agent(NODE, &[]);
    let metrics = lab.wait_for("the restarted agent to reconcile", CONVERGE, || {
        let text = scrape(lab.agent_metrics_address(NODE))?;
        text.lines()
            .any(|l| l.starts_with("hoststack_agent_applied_revision{") && l.ends_with(" 1"))
            .then_some(text)
    });
    assert_eq!(
        sample(
            &metrics,
            "hoststack_agent_transactions_total{result=\"applied\"}"
        ),
        Some(0),
        "the restarted agent found the host applied and ran no transaction"
    );
    assert_eq!(program_id(&lab), Some(id), "not re-attached");
    assert_eq!(jsonpath(&lab, "{.status.state}"), "Applied");
    assert!(!ping_from(blocked, NODE_IP) && ping_from(allowed, NODE_IP));
    let after = sample(&metrics, DROPPED).expect("the counters on the restarted agent");
    assert!(
        after > dropped,
        "{after} drops after the kill, {dropped} before"
    );

    let out = lab.kubectl(&["delete", "networktuning", "xdp", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to detach the blocklist", CONVERGE, || {
        (program_id(&lab).is_none()).then_some(())
    });
    let pins = lab.agent_bpffs_root(NODE);
    lab.wait_for("the pins to go", CONVERGE, || {
        let left = std::fs::read_dir(&pins).map(|d| d.count()).unwrap_or(0);
        (left == 0).then_some(())
    });
    assert!(ping_from(blocked, NODE_IP) && connect_from(blocked, service.addr));
    assert!(ping_from(allowed, NODE_IP));
    drop(service);
    drop(sources);
    lab.stop().expect("the lab stops cleanly");
}
