//! The scale run (hoststack_e2e::scale, `hoststack-lab scale`) at 100 nodes: a fleet of 100
//! real agents in one process, against a real API server and the operator, through apply,
//! idle, a judged rollout with 10 nodes joining and 10 leaving, a regression rolled back and
//! a delete. The run asserts what must hold — every node applied each revision, went back on
//! the rollback, reverted on the delete, and the rollout never had more nodes in flight than
//! maxUnavailable (from the API server's audit log) — and reports its measurements, which are
//! printed, never asserted (docs/operator.md, Scale, has the figures at 1,000 and 5,000).

use std::time::Duration;

use hoststack_e2e::scale::{self, ScaleConfig};

#[test]
fn a_hundred_agents_apply_roll_out_with_churn_roll_back_and_revert() {
    let mut config = ScaleConfig::for_nodes(100);
    config.idle = Duration::from_secs(10);
    let report = scale::run(&config).expect("the scale run");
    eprintln!("{report:#}");
    for scenario in [
        "a_apply",
        "idle",
        "b_rollout_with_churn",
        "c_regression",
        "d_delete",
    ] {
        let measured = &report["scenarios"][scenario];
        assert!(
            measured["seconds"].as_f64().is_some(),
            "{scenario} ran and was measured: {measured}"
        );
    }
    assert_eq!(report["nodes"], 100);
    assert_eq!(report["churn"], 10);
}
