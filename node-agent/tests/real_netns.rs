//! The transaction against the real kernel's /proc/sys, inside a fresh network namespace.
//!
//! The test re-runs itself under `unshare --net`: net.* sysctls are per network namespace, so
//! everything it sets lives in a namespace that vanishes with the child process, even when the
//! child fails or is killed. It needs root to create the namespace.

mod netns;

use hoststack_agent::appliers;
use hoststack_agent::host::Host;
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::model::{Reading, Setting};
use hoststack_agent::transaction::{Goal, Outcome, Transactor};
use hoststack_crds::NodeState;

const TEST: &str = "real_sysctls_in_a_fresh_network_namespace";
const CHILD: &str = "HOSTSTACK_AGENT_TEST_IN_NETNS";

#[test]
fn real_sysctls_in_a_fresh_network_namespace() {
    if std::env::var_os(CHILD).is_some() {
        in_fresh_namespace();
        return;
    }
    netns::rerun_under_unshare(TEST, &["--net"], CHILD, "1");
}

fn read(host: &Host, key: &str) -> String {
    match appliers::read(host, &Setting::sysctl(key)) {
        Reading::Value(v) => v,
        other => panic!("{key}: {other:?}"),
    }
}

fn goal(revision: &str, sysctls: &[(&str, &str)]) -> Goal {
    Goal {
        target: Some(Applied {
            tuning: "test".into(),
            revision: revision.into(),
        }),
        values: sysctls
            .iter()
            .map(|(k, v)| (Setting::sysctl(*k), v.to_string()))
            .collect(),
    }
}

fn in_fresh_namespace() {
    let keys = [
        "net.ipv4.tcp_sack",
        "net.ipv4.tcp_congestion_control",
        "net.ipv4.tcp_rmem",
        "net.core.somaxconn",
    ];
    let host = Host::new(std::path::Path::new("/proc"), std::path::Path::new("/sys"));
    let originals: Vec<String> = keys.iter().map(|k| read(&host, k)).collect();
    let state = tempfile::tempdir().expect("tempdir");
    let tx = Transactor::new(host.clone(), JournalStore::new(state.path()));
    let run = |g: &Goal| -> Outcome { tx.execute(g, &mut |_| {}).expect("transaction") };

    let r1 = run(&goal(
        "r1",
        &[
            ("net.ipv4.tcp_sack", "0"),
            ("net.ipv4.tcp_congestion_control", "reno"),
            ("net.ipv4.tcp_rmem", "4096 87380 1048576"),
            ("net.core.somaxconn", "1234"),
        ],
    ));
    assert_eq!(r1.state, NodeState::Applied, "{r1:?}");
    assert_eq!(read(&host, "net.ipv4.tcp_sack"), "0");
    assert_eq!(read(&host, "net.ipv4.tcp_congestion_control"), "reno");
    // The kernel prints it with tabs; the comparison collapses whitespace.
    assert_eq!(read(&host, "net.ipv4.tcp_rmem"), "4096\t87380\t1048576");

    // The kernel refuses an unknown congestion control (ENOENT): the earlier write is undone.
    let refused = run(&goal(
        "r2",
        &[
            ("net.core.somaxconn", "999"),
            ("net.ipv4.tcp_congestion_control", "no_such_cc"),
        ],
    ));
    assert_eq!(refused.state, NodeState::Failed, "{refused:?}");
    let message = refused.message.expect("message");
    assert!(
        message.contains("net.ipv4.tcp_congestion_control"),
        "{message}"
    );
    assert!(message.contains("No such file or directory"), "{message}");
    assert_eq!(read(&host, "net.core.somaxconn"), "1234");
    assert_eq!(read(&host, "net.ipv4.tcp_sack"), "0");

    // A value the kernel accepts but changes (tcp_rmem needs three numbers) fails at read-back.
    let changed = run(&goal("r3", &[("net.ipv4.tcp_rmem", "4096 87380")]));
    assert_eq!(changed.state, NodeState::Failed, "{changed:?}");
    assert_eq!(read(&host, "net.ipv4.tcp_rmem"), "4096\t87380\t1048576");

    // A key this kernel does not have: nothing is written.
    let missing = run(&goal(
        "r4",
        &[("net.core.somaxconn", "1"), ("net.ipv4.tcp_no_such", "1")],
    ));
    assert_eq!(missing.state, NodeState::Failed);
    assert_eq!(read(&host, "net.core.somaxconn"), "1234");

    // Withdrawn: every original is back.
    assert_eq!(run(&Goal::revert()).state, NodeState::Reverted);
    let now: Vec<String> = keys.iter().map(|k| read(&host, k)).collect();
    assert_eq!(now, originals);
}
