//! Criterion benchmark of the simulator's speed: one second of the one-flow scenario, in
//! simulated packets per second of wall time. Figures go to docs/userstack.md, never into
//! assertions.

use core::time::Duration;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn simulator(c: &mut Criterion) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/one-flow-100mbit.toml"
    ))
    .unwrap();
    let mut scenario = userstack_sim::scenario::Scenario::from_toml(&text).unwrap();
    scenario.duration_ms = 1000;
    scenario.warmup_ms = 0;
    let packets = userstack_sim::run(&scenario, 1).simulated_packets;
    let mut group = c.benchmark_group("simulator");
    group.throughput(Throughput::Elements(packets));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    group.bench_function("one_flow_100mbit_1s", |bench| {
        bench.iter(|| black_box(userstack_sim::run(&scenario, 1).simulated_packets))
    });
    group.finish();
}

criterion_group!(benches, simulator);
criterion_main!(benches);
