//! Every reconcile branch against a mocked API server: the caches hold a [`World`], the
//! [`Scenario`] expects each request the branch makes, and the test checks what the reconcile
//! returned. No cluster; each runs in milliseconds.

use std::sync::Arc;
use std::time::Duration;

use hoststack_crds::{
    NetworkTuningStatus, NodeState, NodeTuningSpec, Phase, Rollout, RolloutPhase, WaveStatus,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;

use super::fixtures::{
    deleted, finalized, finish, heartbeat, node, node_tuning, spec_on, tuning, Scenario, World,
};
use super::{error_policy, reconcile, Context};
use crate::Error;

#[tokio::test]
async fn a_new_tuning_gets_the_finalizer_first() {
    let edge = tuning("edge", "edge", "1");
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![node("node-a", "edge", false, false)],
        ..World::default()
    });
    let verifier = server.run(Scenario::FinalizerAdded);
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn an_invalid_rollout_is_reported_and_touches_no_node() {
    let mut edge = finalized(tuning("edge", "edge", "1"));
    edge.spec.rollout = Some(Rollout {
        canary: Some(IntOrString::String("most".into())),
        ..Rollout::default()
    });
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![node("node-a", "edge", false, false)],
        ..World::default()
    });
    let verifier = server.run(Scenario::InvalidRollout);
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn selected_nodes_get_their_specs_and_the_agent_before_their_agents_report() {
    let edge = finalized(tuning("edge", "edge", "1"));
    let revision = edge.spec.config.revision();
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![
            node("node-a", "edge", false, false),
            node("node-b", "edge", false, false),
            node("node-c", "core", false, false),
        ],
        ..World::default()
    });
    let verifier = server.run(Scenario::SpecsWritten {
        revision,
        nodes: vec!["node-a", "node-b"],
    });
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    // Nothing moves until the agents answer; they are asked again soon.
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn once_the_agents_report_the_labelled_canary_gets_the_revision() {
    let edge = finalized(tuning("edge", "edge", "1"));
    let revision = edge.spec.config.revision();
    let waiting = spec_on("edge", None, RolloutPhase::Stable);
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![
            node("node-a", "edge", true, false),
            node("node-b", "edge", true, true),
        ],
        node_tunings: vec![
            node_tuning("node-a", waiting.clone(), Some((NodeState::Idle, "", ""))),
            node_tuning("node-b", waiting, Some((NodeState::Idle, "", ""))),
        ],
        heartbeats: vec![heartbeat("node-a"), heartbeat("node-b")],
    });
    let verifier = server.run(Scenario::CanaryStarted {
        revision,
        canary: "node-b",
    });
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
}

/// What a test's log lines are written to.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// This thread's log lines from now until the guard drops go to `log`.
///
/// tracing caches each call site's interest process-wide, computed when the site first runs.
/// While at most one dispatcher exists, it asks only the registering thread's subscriber, so a
/// test on another thread without one would cache "never" for the operator's call sites and this
/// thread's subscriber would see nothing. A second dispatcher that wants everything (a bare
/// registry) makes every registration ask all dispatchers, and the rebuild after installing ours
/// re-asks the sites cached before.
fn capture(log: &Log) -> (tracing::Dispatch, tracing::subscriber::DefaultGuard) {
    let anchor = tracing::Dispatch::new(tracing_subscriber::registry());
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    tracing::callsite::rebuild_interest_cache();
    (anchor, guard)
}

#[tokio::test]
async fn each_assignment_is_logged_with_the_tuning_the_node_and_the_revision() {
    let log = Log::default();
    let _logging = capture(&log);
    let edge = finalized(tuning("edge", "edge", "1"));
    let revision = edge.spec.config.revision();
    let waiting = spec_on("edge", None, RolloutPhase::Stable);
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![node("node-b", "edge", true, true)],
        node_tunings: vec![node_tuning(
            "node-b",
            waiting,
            Some((NodeState::Idle, "", "")),
        )],
        heartbeats: vec![heartbeat("node-b")],
    });
    let verifier = server.run(Scenario::CanaryStarted {
        revision: revision.clone(),
        canary: "node-b",
    });
    reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("assigning revision"))
        .unwrap_or_else(|| panic!("no assignment logged:\n{text}"));
    // The shape the rollout e2e test reads the operator's log in.
    assert!(
        line.contains(&format!("reconcile{{tuning=edge revision={revision}}}"))
            && line.contains("node=node-b ")
            && line.contains(&format!("revision=Some(\"{revision}\")"))
            && line.contains("phase=Canary"),
        "{line}"
    );
}

#[tokio::test]
async fn the_lower_priority_tuning_reports_the_conflict() {
    let low = finalized(tuning("low", "edge", "0"));
    let mut high = finalized(tuning("high", "edge", "1"));
    high.spec.priority = 9;
    let revision = low.spec.config.revision();
    let (ctx, server) = Context::test(World {
        tunings: vec![low.clone(), high],
        nodes: vec![node("node-a", "edge", true, false)],
        ..World::default()
    });
    let verifier = server.run(Scenario::Conflict {
        revision,
        node: "node-a",
        winner: "high",
    });
    let action = reconcile(Arc::new(low), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(2)));
}

#[tokio::test]
async fn a_failed_canary_rolls_every_node_back_to_the_stable_revision() {
    let mut edge = finalized(tuning("edge", "edge", "1"));
    let failed = edge.spec.config.revision();
    let stable = tuning("edge", "edge", "0").spec.config.revision();
    edge.status = Some(NetworkTuningStatus {
        observed_generation: Some(1),
        current_revision: Some(failed.clone()),
        stable_revision: Some(stable.clone()),
        phase: Some(Phase::Progressing),
        waves: vec![WaveStatus {
            index: 0,
            nodes: vec!["node-a".into()],
            ..WaveStatus::default()
        }],
        ..NetworkTuningStatus::default()
    });
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![
            node("node-a", "edge", true, false),
            node("node-b", "edge", true, false),
        ],
        node_tunings: vec![
            node_tuning(
                "node-a",
                spec_on("edge", Some((&failed, "1")), RolloutPhase::Canary),
                Some((NodeState::Failed, "edge", &failed)),
            ),
            node_tuning(
                "node-b",
                spec_on("edge", Some((&stable, "0")), RolloutPhase::Stable),
                Some((NodeState::Applied, "edge", &stable)),
            ),
        ],
        heartbeats: vec![heartbeat("node-a"), heartbeat("node-b")],
    });
    let verifier = server.run(Scenario::RolledBack {
        stable: (stable, "0"),
        failed,
        canary: "node-a",
    });
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
}

#[tokio::test]
async fn a_cache_that_lags_the_own_rolled_back_write_puts_no_node_back_on_the_failed_revision() {
    let mut edge = finalized(tuning("edge", "edge", "1"));
    let failed = edge.spec.config.revision();
    let stable = tuning("edge", "edge", "0").spec.config.revision();
    // The cached tuning, older than the operator's write of RolledBack below: the canary's
    // wave is in flight.
    edge.metadata.resource_version = Some("10".into());
    edge.status = Some(NetworkTuningStatus {
        observed_generation: Some(1),
        current_revision: Some(failed.clone()),
        stable_revision: Some(stable.clone()),
        phase: Some(Phase::Progressing),
        waves: vec![WaveStatus {
            index: 0,
            nodes: vec!["node-a".into()],
            ..WaveStatus::default()
        }],
        ..NetworkTuningStatus::default()
    });
    let nodes = vec![
        node("node-a", "edge", true, false),
        node("node-b", "edge", true, false),
    ];
    let alive = vec![heartbeat("node-a"), heartbeat("node-b")];
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: nodes.clone(),
        node_tunings: vec![
            node_tuning(
                "node-a",
                spec_on("edge", Some((&failed, "1")), RolloutPhase::Canary),
                Some((NodeState::Failed, "edge", &failed)),
            ),
            node_tuning(
                "node-b",
                spec_on("edge", Some((&stable, "0")), RolloutPhase::Stable),
                Some((NodeState::Applied, "edge", &stable)),
            ),
        ],
        heartbeats: alive.clone(),
    });
    let verifier = server.run(Scenario::RolledBack {
        stable: (stable.clone(), "0"),
        failed: failed.clone(),
        canary: "node-a",
    });
    reconcile(Arc::new(edge.clone()), ctx.clone())
        .await
        .expect("reconciled");
    finish(verifier).await;

    // The canary has reverted and applied the stable revision, and its report triggers the
    // next reconcile before the cached tuning has caught up with the RolledBack write: the
    // cache still shows the canary's wave in flight, which would put it back on the failed
    // revision.
    let on_stable = spec_on("edge", Some((&stable, "0")), RolloutPhase::Stable);
    let (lagging, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes,
        node_tunings: vec![
            node_tuning(
                "node-a",
                on_stable.clone(),
                Some((NodeState::Applied, "edge", &stable)),
            ),
            node_tuning(
                "node-b",
                on_stable,
                Some((NodeState::Applied, "edge", &stable)),
            ),
        ],
        heartbeats: alive,
    });
    let written = ctx.status_writes.lock().unwrap().clone();
    assert_eq!(
        written.values().map(|w| w.status.phase).collect::<Vec<_>>(),
        [Some(Phase::RolledBack)]
    );
    *lagging.status_writes.lock().unwrap() = written;
    let verifier = server.run(Scenario::StaysRolledBack {
        stable: (stable, "0"),
        failed,
    });
    let action = reconcile(Arc::new(edge), lagging)
        .await
        .expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
}

#[tokio::test]
async fn a_deleted_tuning_whose_nodes_reverted_lets_go_of_its_finalizer() {
    let edge = deleted(tuning("edge", "edge", "1"), Timestamp::now());
    let revision = edge.spec.config.revision();
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![node("node-a", "edge", true, false)],
        node_tunings: vec![node_tuning(
            "node-a",
            NodeTuningSpec {
                mode: Some(hoststack_crds::Mode::Apply),
                ..NodeTuningSpec::default()
            },
            Some((NodeState::Reverted, "", &revision)),
        )],
        heartbeats: vec![heartbeat("node-a")],
    });
    let verifier = server.run(Scenario::FinalizerRemoved {
        node: "node-a",
        revision,
    });
    let action = reconcile(Arc::new(edge), ctx).await.expect("reconciled");
    finish(verifier).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_deleted_tuning_withdraws_its_nodes_and_waits_for_their_revert() {
    let edge = deleted(tuning("edge", "edge", "1"), Timestamp::now());
    let revision = edge.spec.config.revision();
    let (ctx, server) = Context::test(World {
        tunings: vec![edge.clone()],
        nodes: vec![node("node-a", "edge", true, false)],
        node_tunings: vec![node_tuning(
            "node-a",
            spec_on("edge", Some((&revision, "1")), RolloutPhase::Stable),
            Some((NodeState::Applied, "edge", &revision)),
        )],
        heartbeats: vec![heartbeat("node-a")],
    });
    let verifier = server.run(Scenario::WaitingForRevert { node: "node-a" });
    let edge = Arc::new(edge);
    let error = reconcile(edge.clone(), ctx.clone())
        .await
        .expect_err("the finalizer stays");
    finish(verifier).await;
    assert!(
        matches!(&error, Error::Finalizer(inner) if matches!(inner.as_ref(),
            kube::runtime::finalizer::Error::CleanupFailed(Error::WaitingForRevert(nodes)) if nodes == &["node-a"])),
        "{error:?}"
    );
    // It looks again soon.
    assert_eq!(
        error_policy(edge, &error, ctx),
        Action::requeue(Duration::from_secs(1))
    );
}
