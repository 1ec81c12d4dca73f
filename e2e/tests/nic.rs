//! NIC settings through the whole control loop: a NetworkTuning sets the MTU, offloads (by
//! alias) and rx/tx channel counts of an extra veth pair inside a node's namespace; the agent
//! applies them over netlink, reports each item with original, desired and actual values, and
//! restores every value when the tuning is deleted. The node's management interface (eth0) is
//! never touched; the veth pair goes with the node's namespace when the lab stops.

use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const DEV: &str = "data0";
const PEER: &str = "data1";

/// Runs `argv` in the node's namespace and returns its stdout; panics when it fails.
fn in_node(lab: &Lab, argv: &[&str]) -> String {
    let out = lab.exec_in_node(NODE, argv);
    assert!(
        out.status.success(),
        "{argv:?} in {NODE}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The MTU as `ip -d link show` prints it.
fn mtu(lab: &Lab, dev: &str) -> String {
    let out = in_node(lab, &["ip", "-d", "link", "show", "dev", dev]);
    let mut words = out.split_whitespace();
    words.by_ref().find(|w| *w == "mtu").expect("ip prints mtu");
    words.next().expect("mtu value").to_string()
}

/// A feature's state as `ethtool -k` prints it, by its printed name.
fn feature(lab: &Lab, dev: &str, name: &str) -> String {
    in_node(lab, &["ethtool", "-k", dev])
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(&format!("{name}: "))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("ethtool -k {dev} has no {name}"))
}

/// The current rx and tx channel counts as `ethtool -l` prints them.
fn channels(lab: &Lab, dev: &str) -> (String, String) {
    let out = in_node(lab, &["ethtool", "-l", dev]);
    let current = out
        .split("Current hardware settings:")
        .nth(1)
        .expect("current settings")
        .to_string();
    let field = |name: &str| {
        current
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("{name}:"))
                    .map(|v| v.trim().to_string())
            })
            .unwrap_or_else(|| panic!("no {name} in {current}"))
    };
    (field("RX"), field("TX"))
}

/// Everything `ip -d link`, `ethtool -k` and `ethtool -l` print about a device.
fn snapshot(lab: &Lab, dev: &str) -> String {
    [
        in_node(lab, &["ip", "-d", "link", "show", "dev", dev]),
        in_node(lab, &["ethtool", "-k", dev]),
        in_node(lab, &["ethtool", "-l", dev]),
    ]
    .join("\n")
}

fn jsonpath(lab: &Lab, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", &expr]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One field of the status item `kind` `target`.
fn item(lab: &Lab, kind: &str, target: &str, field: &str) -> String {
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", "json"]);
    let object: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("kubectl prints JSON");
    object["status"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["kind"] == kind && i["target"] == target)
        .and_then(|i| i[field].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no {field} of item {kind} {target} in {object:#}"))
}

#[test]
fn mtu_offloads_and_channels_of_a_node_veth_are_applied_and_reverted() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    in_node(
        &lab,
        &[
            "ip",
            "link",
            "add",
            DEV,
            "numrxqueues",
            "4",
            "numtxqueues",
            "4",
            "type",
            "veth",
            "peer",
            "name",
            PEER,
            "numrxqueues",
            "4",
            "numtxqueues",
            "4",
        ],
    );
    let pristine = snapshot(&lab, DEV);
    let peer = snapshot(&lab, PEER);
    let management = snapshot(&lab, "eth0");
    assert_eq!(mtu(&lab, DEV), "1500");
    assert_eq!(feature(&lab, DEV, "generic-receive-offload"), "off");
    assert_eq!(feature(&lab, DEV, "tcp-segmentation-offload"), "on");
    assert_eq!(channels(&lab, DEV), ("4".into(), "4".into()));

    lab.apply_yaml(&format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: nic\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  interfaces:\n  - match:\n      \
         name: {DEV}\n    mtu: 9000\n    offloads:\n      tso: false\n      gro: true\n    \
         channels:\n      rx: 2\n      tx: 3\n"
    ))
    .expect("the tuning is accepted");
    lab.wait_for("node-a to apply the NIC settings", CONVERGE, || {
        (jsonpath(&lab, "{.status.state}") == "Applied").then_some(())
    });

    // The host, read independently.
    assert_eq!(mtu(&lab, DEV), "9000");
    assert_eq!(feature(&lab, DEV, "generic-receive-offload"), "on");
    assert_eq!(feature(&lab, DEV, "tcp-segmentation-offload"), "off");
    assert_eq!(feature(&lab, DEV, "tx-tcp-segmentation"), "off");
    assert_eq!(channels(&lab, DEV), ("2".into(), "3".into()));
    assert_eq!(
        snapshot(&lab, PEER),
        peer,
        "the peer keeps its own settings"
    );
    assert_eq!(snapshot(&lab, "eth0"), management, "eth0 is never touched");

    // The status items.
    let rows: [(&str, String, &str, &str); 5] = [
        ("mtu", DEV.to_string(), "1500", "9000"),
        ("offload", format!("{DEV}/rx-gro"), "off", "on"),
        ("offload", format!("{DEV}/tx-tcp-segmentation"), "on", "off"),
        ("channels", format!("{DEV}/rx"), "4", "2"),
        ("channels", format!("{DEV}/tx"), "4", "3"),
    ];
    for (kind, target, original, desired) in &rows {
        assert_eq!(
            item(&lab, kind, target, "state"),
            "Applied",
            "{kind} {target}"
        );
        assert_eq!(
            item(&lab, kind, target, "original"),
            *original,
            "{kind} {target}"
        );
        assert_eq!(
            item(&lab, kind, target, "desired"),
            *desired,
            "{kind} {target}"
        );
        assert_eq!(
            item(&lab, kind, target, "actual"),
            *desired,
            "{kind} {target}"
        );
    }

    let out = lab.kubectl(&["delete", "networktuning", "nic", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to restore the NIC settings", CONVERGE, || {
        (snapshot(&lab, DEV) == pristine).then_some(())
    });
    assert_eq!(snapshot(&lab, PEER), peer);
    assert_eq!(snapshot(&lab, "eth0"), management);
    lab.stop().expect("the lab stops cleanly");
}
