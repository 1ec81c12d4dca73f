//! The agent's nftables table through the whole control loop, on real traffic. Two client
//! namespaces (198.19.20.10, blocked, and 198.19.20.20, allowed) reach a lab node through a
//! bridge and an extra veth (`fw0` on the node, 198.19.20.1; not its management interface
//! eth0). A NetworkTuning whose firewall blocks the first client and limits SYNs per source
//! makes the agent create `inet hoststack` in the node's namespace: the blocked client can
//! neither ping nor connect, the allowed one can; a bounded SYN flood from the allowed client
//! gets at most burst + rate × time connections through; the drop counters rise on the
//! agent's /metrics; deleting the tuning removes the table.
//!
//! The extra namespaces are named `hs<k>-fw-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them with the node namespaces even when this test dies; the table lives in the
//! node's namespace and goes with it.

use std::net::Ipv4Addr;
use std::time::Duration;

use hoststack_e2e::clients::{connect_from, flood_from, ping_from, Clients, Service};
use hoststack_e2e::prometheus::{sample, scrape};
use hoststack_e2e::{Lab, LabConfig};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 1);
/// The SYN limit of the tuning.
const RATE: u64 = 5;
const BURST: u64 = 5;
/// The flood: this many connects, each given this long.
const FLOOD: u64 = 200;
const FLOOD_WAIT: Duration = Duration::from_millis(20);

/// `nft list tables` in the node's namespace.
fn node_tables(lab: &Lab) -> String {
    let out = lab.exec_in_node(NODE, &["nft", "list", "tables"]);
    assert!(
        out.status.success(),
        "nft list tables: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn jsonpath(lab: &Lab, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", &expr]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn item(lab: &Lab, field: &str) -> String {
    jsonpath(
        lab,
        &format!("{{.status.items[?(@.kind==\"nftables\")].{field}}}"),
    )
}

fn dropped(rule: &str) -> String {
    format!("hoststack_firewall_dropped_packets_total{{table=\"inet/hoststack\",rule=\"{rule}\"}}")
}

#[test]
fn the_agents_table_drops_a_blocked_prefix_limits_a_syn_flood_and_goes_with_the_tuning() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let clients =
        Clients::build(&lab, NODE, "fw0", "fw", [198, 19, 20]).expect("client namespaces");
    let service = Service::start(lab.netns(NODE), NODE_IP).expect("a service on the node");
    let (blocked, allowed) = (clients.blocked.as_str(), clients.allowed.as_str());
    assert!(
        ping_from(blocked, NODE_IP) && ping_from(allowed, NODE_IP),
        "the network works"
    );
    assert!(connect_from(blocked, service.addr) && connect_from(allowed, service.addr));
    assert!(!node_tables(&lab).contains("hoststack"));

    lab.apply_yaml(&format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: fw\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  firewall:\n    blockedPrefixes: \
         [\"198.19.20.10/32\"]\n    synRateLimit:\n      perSecond: {RATE}\n      burst: {BURST}\n"
    ))
    .expect("the tuning is accepted");
    lab.wait_for("node-a to make its table", CONVERGE, || {
        (jsonpath(&lab, "{.status.state}") == "Applied").then_some(())
    });
    let description =
        format!("blocked 198.19.20.10/32; syn-limit {RATE}/second burst {BURST}; notrack none");
    assert_eq!(item(&lab, "target"), "inet/hoststack");
    assert_eq!(item(&lab, "original"), "absent");
    assert_eq!(item(&lab, "actual"), description);
    assert_eq!(item(&lab, "state"), "Applied");
    assert!(node_tables(&lab).contains("table inet hoststack"));

    assert!(
        !ping_from(blocked, NODE_IP),
        "the blocked client's ping is dropped"
    );
    assert!(!connect_from(blocked, service.addr), "its TCP connect too");
    assert!(
        ping_from(allowed, NODE_IP),
        "the allowed client's ping passes"
    );
    let blocked_drops = lab.wait_for("the blocked client's drops on /metrics", CONVERGE, || {
        sample(
            &scrape(lab.agent_metrics_address(NODE))?,
            &dropped("blocked-ipv4"),
        )
        .filter(|n| *n >= 2)
    });

    // A bounded SYN flood from the allowed client: 200 connects, 20 ms each at most.
    let (connected, took) = flood_from(allowed, service.addr, FLOOD, FLOOD_WAIT);
    let bound = BURST + (RATE as f64 * took.as_secs_f64()).ceil() as u64;
    println!(
        "SYN flood: {FLOOD} connects in {:.2} s, {connected} connected, at most {bound} allowed",
        took.as_secs_f64()
    );
    assert!(connected >= 1, "the burst lets the first SYNs through");
    assert!(
        connected <= bound,
        "{connected} connections > burst + rate × time = {bound}"
    );
    let metrics = lab.wait_for("the SYN drops on /metrics", CONVERGE, || {
        let text = scrape(lab.agent_metrics_address(NODE))?;
        sample(&text, &dropped("syn-limit-ipv4"))
            .filter(|n| *n >= FLOOD - connected)
            .map(|_| text)
    });
    assert!(
        sample(&metrics, &dropped("blocked-ipv4")).unwrap_or(0) >= blocked_drops,
        "counters only rise"
    );
    assert!(
        metrics.contains("hoststack_firewall_dropped_bytes_total{table=\"inet/hoststack\",rule=\"syn-limit-ipv4\"}"),
        "bytes too"
    );
    assert!(
        ping_from(allowed, NODE_IP),
        "a SYN limit leaves pings alone"
    );

    let out = lab.kubectl(&["delete", "networktuning", "fw", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to delete its table", CONVERGE, || {
        (!node_tables(&lab).contains("hoststack")).then_some(())
    });
    assert!(ping_from(blocked, NODE_IP) && connect_from(blocked, service.addr));
    let after = lab.wait_for("a scrape", CONVERGE, || {
        scrape(lab.agent_metrics_address(NODE))
    });
    assert!(
        !after.contains("hoststack_firewall_"),
        "no table, no firewall series"
    );
    drop(service);
    drop(clients);
    lab.stop().expect("the lab stops cleanly");
}
