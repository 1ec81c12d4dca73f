//! One planning step of the rollout planner for 5,000 nodes, mid-rollout (a wave in flight,
//! half the pool updated). Run: `cargo bench -p hoststack-operator --bench planner`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use hoststack_operator::rollout::planner::{
    plan, Holding, NodeView, Progress, Report, Strategy, Verdict, Wave,
};

fn mid_rollout(n: usize) -> (Strategy, Progress, Vec<NodeView>) {
    let strategy = Strategy {
        canary: 1,
        max_unavailable: 250,
        pause_after_canary: Duration::ZERO,
        pause_between_waves: Duration::ZERO,
        auto_rollback: true,
        paused: false,
        judged: true,
    };
    let names: Vec<String> = (0..n).map(|i| format!("node-{i:05}")).collect();
    let mut progress = Progress::start("r2", Some("r1"));
    progress.waves.push(Wave {
        applied_at: Some(0),
        ..Wave::of(vec![names[0].clone()])
    });
    for chunk in names[1..n / 2].chunks(250) {
        progress.waves.push(Wave {
            applied_at: Some(1),
            ..Wave::of(chunk.to_vec())
        });
    }
    let nodes = names
        .iter()
        .enumerate()
        .map(|(i, name)| NodeView {
            name: name.clone(),
            canary_label: i % 100 == 0,
            available: true,
            report: if i < n / 2 {
                Report::Applied
            } else {
                Report::Pending
            },
            holding: Holding::Own(if i < n / 2 { "r2" } else { "r1" }.into()),
        })
        .collect();
    (strategy, progress, nodes)
}

fn planning_step(c: &mut Criterion) {
    let (strategy, progress, nodes) = mid_rollout(5_000);
    c.bench_function("plan 5000 nodes, next wave", |b| {
        b.iter(|| plan(&strategy, &progress, &nodes, &Verdict::Pass, 10))
    });
}

criterion_group!(benches, planning_step);
criterion_main!(benches);
