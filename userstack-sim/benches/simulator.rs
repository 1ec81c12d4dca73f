//! The simulator's speed: whole runs of the one-flow (`one-flow-100mbit`, 4 s simulated) and
//! the eight-flow (`eight-flows-dumbbell`, 20 s simulated) scenarios at their full length,
//! seed 1, in interleaved rounds (one run of each scenario per round), reporting simulated
//! packets (frame arrivals) per wall second and per CPU second of the benchmark thread, with
//! min/median/max over the rounds, as one JSON document on stdout.
//!
//! What a figure includes: everything `userstack_sim::run` does for a seed (building the
//! network and stacks, the event loop, the TCP stacks under test, which take most of the
//! time, and the report), so it is the rate a quality run gets, not the event queue's alone.
//! What still differs between the rows: the scenarios themselves (the eight-flow one forwards
//! through two gateways, so a segment is three arrivals there and one on the one-flow pair,
//! and a gateway hop costs far less than a stack's turn). Against figures taken before the
//! simulator had its own event queue and frame pool: the stacks now run with TCP checksum
//! offload (the scenarios' default, `checksums = false`; every other field of a report is the
//! same either way, only `trace_digest` differs), and the digest hashes words, not bytes.
//! CPU time is the thread's own (`/proc/thread-self/schedstat`); wall time includes whatever
//! else the machine runs meanwhile.
//!
//! `cargo bench -p userstack-sim --bench simulator` runs 7 rounds; run without `--bench` (as
//! `cargo test --all-targets` does) it runs one round of 100 ms of simulated time per scenario
//! to prove it works. Figures go to docs/userstack.md, never into assertions.

use std::hint::black_box;
use std::time::Instant;
use userstack_sim::scenario::Scenario;

/// Rounds of the full benchmark.
const ROUNDS: usize = 7;

/// CPU time consumed by this thread so far, in nanoseconds (0 if the kernel does not say).
fn thread_cpu_nanos() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn load(name: &str) -> Result<Scenario, String> {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    Scenario::from_toml(&text).map_err(|e| format!("{path}: {e}"))
}

/// Minimum, median and maximum.
fn spread(values: &mut [f64]) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    serde_json::json!({
        "min": values.first().copied().unwrap_or(0.0),
        "median": values.get(values.len() / 2).copied().unwrap_or(0.0),
        "max": values.last().copied().unwrap_or(0.0),
    })
}

fn main() -> Result<(), String> {
    let full = std::env::args().any(|a| a == "--bench");
    let mut scenarios = vec![load("one-flow-100mbit")?, load("eight-flows-dumbbell")?];
    let rounds = if full { ROUNDS } else { 1 };
    if !full {
        for scenario in &mut scenarios {
            scenario.duration_ms = 100;
            scenario.warmup_ms = 0;
        }
    }
    // Per scenario: simulated packets of a run and the rates of each round.
    let mut packets = vec![0u64; scenarios.len()];
    let mut per_wall: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    let mut per_cpu: Vec<Vec<f64>> = vec![Vec::new(); scenarios.len()];
    for _ in 0..rounds {
        for (i, scenario) in scenarios.iter().enumerate() {
            let cpu = thread_cpu_nanos();
            let wall = Instant::now();
            let report = black_box(userstack_sim::run(scenario, 1));
            let wall = wall.elapsed().as_secs_f64();
            let cpu = thread_cpu_nanos().saturating_sub(cpu) as f64 / 1e9;
            packets[i] = report.simulated_packets;
            per_wall[i].push(report.simulated_packets as f64 / wall.max(1e-9));
            per_cpu[i].push(report.simulated_packets as f64 / cpu.max(1e-9));
        }
    }
    let results: Vec<serde_json::Value> = scenarios
        .iter()
        .enumerate()
        .map(|(i, scenario)| {
            serde_json::json!({
                "scenario": scenario.name,
                "simulated_ms": scenario.duration_ms,
                "simulated_packets": packets[i],
                "packets_per_wall_second": spread(&mut per_wall[i]),
                "packets_per_cpu_second": spread(&mut per_cpu[i]),
            })
        })
        .collect();
    let document = serde_json::json!({
        "benchmark": "simulator",
        "rounds": rounds,
        "seed": 1,
        "results": results,
    });
    let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}
