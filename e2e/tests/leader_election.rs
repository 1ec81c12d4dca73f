//! Two operator replicas are safe: one holds the Lease and reconciles; when it stops, the other
//! takes the lease over and carries on.

use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig, NAMESPACE};

fn lease_holder(lab: &Lab) -> String {
    let out = lab.kubectl(&[
        "get",
        "lease",
        "hoststack-operator",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_second_replica_waits_then_takes_over() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let first = lab.wait_for(
        "the lab's operator to hold the lease",
        Duration::from_secs(60),
        || {
            let holder = lease_holder(&lab);
            (!holder.is_empty()).then_some(holder)
        },
    );
    assert_ne!(first, "replica-2");

    lab.start_operator_replica("replica-2");

    // While the first leads, the second only waits: the lease stays with the first.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        lease_holder(&lab),
        first,
        "the first replica keeps the lease"
    );

    lab.stop_operator();
    lab.wait_for(
        "replica-2 to take the lease over",
        Duration::from_secs(60),
        || (lease_holder(&lab) == "replica-2").then_some(()),
    );
    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata: {name: takeover}\nspec:\n  nodeSelector: {}\n  sysctls: {net.ipv4.tcp_sack: \"0\"}\n",
    )
    .expect("accepted");
    lab.wait_for(
        "replica-2 to reconcile the tuning to 1/1",
        Duration::from_secs(60),
        || {
            let out = lab.kubectl(&[
                "get",
                "networktuning",
                "takeover",
                "-o",
                "jsonpath={.status.progress}",
            ]);
            (String::from_utf8_lossy(&out.stdout) == "1/1").then_some(())
        },
    );
    assert_eq!(lab.sysctl("node-a", "net.ipv4.tcp_sack"), "0");
    let out = lab.kubectl(&["delete", "networktuning", "takeover", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.stop_operator_replica("replica-2");
    lab.stop().expect("the lab stops cleanly");
}
