//! Host knobs beyond sysctls through the whole control loop: RPS on a node's veth rx queue
//! (`/sys/class/net/eth0/queues/rx-0/rps_cpus`, per network namespace) applied by a
//! NetworkTuning, reported per item, and reverted when the tuning is deleted.

use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);

const RPS_CPUS: &str = "/sys/class/net/eth0/queues/rx-0/rps_cpus";

fn rps_cpus(lab: &Lab, node: &str) -> String {
    let out = lab.exec_in_node(node, &["cat", RPS_CPUS]);
    assert!(
        out.status.success(),
        "reading {RPS_CPUS} on {node}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A mask's value as a number, whatever the kernel's padding.
fn mask(text: &str) -> u128 {
    u128::from_str_radix(&text.replace(',', ""), 16).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

fn jsonpath(lab: &Lab, args: &[&str], path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &expr]);
    String::from_utf8_lossy(&lab.kubectl(&all).stdout)
        .trim()
        .to_string()
}

#[test]
fn rps_on_a_node_veth_is_applied_and_reverted() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let original = rps_cpus(&lab, "node-a");
    assert_eq!(mask(&original), 0, "a fresh veth steers nothing");

    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: rps\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  interfaces:\n  - match:\n      \
         name: eth0\n    rps:\n      cpus: \"1\"\n",
    )
    .expect("the tuning is accepted");
    lab.wait_for("node-a to apply RPS", CONVERGE, || {
        let state = jsonpath(&lab, &["get", "nodetuning", "node-a"], "{.status.state}");
        (state == "Applied").then_some(())
    });
    assert_eq!(mask(&rps_cpus(&lab, "node-a")), 0b10, "CPU 1 only");
    let item = |field: &str| {
        jsonpath(
            &lab,
            &["get", "nodetuning", "node-a"],
            &format!("{{.status.items[?(@.target==\"eth0/rx-0\")].{field}}}"),
        )
    };
    assert_eq!(item("kind"), "rpsCpus");
    assert_eq!(item("state"), "Applied");
    assert_eq!(item("original"), original);
    assert_eq!(mask(&item("actual")), 0b10);

    let out = lab.kubectl(&["delete", "networktuning", "rps", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to restore rps_cpus", CONVERGE, || {
        (rps_cpus(&lab, "node-a") == original).then_some(())
    });
    lab.stop().expect("the lab stops cleanly");
}
