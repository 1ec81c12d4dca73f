//! The soak's short version in CI (issue 18; the hour-long one is `hoststack-lab soak`,
//! docs/lab.md): eleven schedules (a warm-up and ten measured, each sampled; about ten minutes
//! beside other labs), the fault campaign's script over and over under API server and etcd restarts,
//! cut-offs and unwritable state directories, with the operator and every agent one process
//! throughout. It fails on a schedule that breaks an invariant or does not settle, on anything
//! left behind after a delete (journal entries, the agent's nftables table, BPF pins), on a
//! process whose open file descriptors grew, and on a process whose resident memory or
//! descriptors grew faster per schedule than its bound (hoststack_e2e::faults::soak::Bound,
//! which says how the bounds were chosen from measurements).

use hoststack_e2e::faults::{campaign, soak};
use hoststack_e2e::Lab;
use std::time::Duration;

#[test]
fn eleven_schedules_of_rollouts_under_faults_leak_nothing() {
    let lab = Lab::start(campaign::lab_config()).expect("lab starts");
    // Ten measured schedules: a one-off step of the allocator (up to 9 MiB, measured) is then
    // under 1 MiB per schedule, half an agent's bound, however slowly the machine runs them.
    let report = soak::run(&lab, Duration::ZERO, 11, Duration::ZERO);
    println!("{report}");
    assert_eq!(report.samples.len(), 11, "{report}");
    assert!(
        report.samples.iter().all(|s| s.usage.len() == 5),
        "{report}"
    );
    assert!(report.growth().is_empty(), "{report}");
    assert!(report.passed(), "{report}");
    lab.stop().expect("the lab stops cleanly");
}
