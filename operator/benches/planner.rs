//! One planning step of the rollout planner (`plan`) at 5,000, 20,000 and 50,000 nodes, to
//! show its cost per step and that it grows linearly with the pool.
//!
//! Two scenarios, each a criterion group with the node count as parameter:
//! - `plan/mid_rollout`: a canary and waves of `maxUnavailable` (5% of the pool) cover half
//!   the pool, every updated node applied and the last wave judged good: the step checks the
//!   waves and picks the next one.
//! - `plan/start`: a fresh rollout, no wave yet: the step picks the canary.
//!
//! Throughput is reported in nodes, so criterion's "elem/s" compares the sizes per node.
//! Run: `cargo bench -p hoststack-operator --bench planner`
//! (add `-- --warm-up-time 1 --measurement-time 5` for a short run).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hoststack_operator::rollout::planner::{
    plan, Holding, NodeView, Progress, Report, Strategy, Verdict, Wave,
};

/// The pool sizes benched.
const SIZES: [usize; 3] = [5_000, 20_000, 50_000];

/// The rollout settings for a pool of `n` nodes: one canary, waves of 5% of the pool.
fn strategy(n: usize) -> Strategy {
    Strategy {
        canary: 1,
        max_unavailable: (n * 5).div_ceil(100),
        pause_after_canary: Duration::ZERO,
        pause_between_waves: Duration::ZERO,
        auto_rollback: true,
        paused: false,
        judged: true,
    }
}

/// `n` nodes, every hundredth labelled canary; the first `updated` of them applied r2, the
/// others still run r1.
fn pool(n: usize, updated: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| NodeView {
            name: format!("node-{i:05}"),
            canary_label: i % 100 == 0,
            available: true,
            report: if i < updated {
                Report::Applied
            } else {
                Report::Pending
            },
            holding: Holding::Own(if i < updated { "r2" } else { "r1" }.into()),
            settled: true,
        })
        .collect()
}

/// Half the pool updated: the canary, then waves of `maxUnavailable`, all applied.
fn mid_rollout(n: usize) -> (Strategy, Progress, Vec<NodeView>) {
    let strategy = strategy(n);
    let nodes = pool(n, n / 2);
    let names: Vec<String> = nodes.iter().map(|v| v.name.clone()).collect();
    let mut progress = Progress::start("r2", Some("r1"));
    progress.waves.push(Wave {
        applied_at: Some(0),
        ..Wave::of(vec![names[0].clone()])
    });
    for chunk in names[1..n / 2].chunks(strategy.max_unavailable) {
        progress.waves.push(Wave {
            applied_at: Some(1),
            ..Wave::of(chunk.to_vec())
        });
    }
    (strategy, progress, nodes)
}

fn planning_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan/mid_rollout");
    for n in SIZES {
        let (strategy, progress, nodes) = mid_rollout(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| plan(&strategy, &progress, &nodes, 0, &Verdict::Pass, 10))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("plan/start");
    for n in SIZES {
        let (strategy, progress, nodes) =
            (strategy(n), Progress::start("r2", Some("r1")), pool(n, 0));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| plan(&strategy, &progress, &nodes, 0, &Verdict::Pending, 0))
        });
    }
    group.finish();
}

criterion_group!(benches, planning_step);
criterion_main!(benches);
