//! The 60-minute soak: `userstack-soak [SCENARIO.toml] [--minutes N] [--seed N]` churns the
//! scenario's short connections (default `scenarios/soak-10k-churn.toml`, 60 minutes), prints
//! one JSON line per simulated minute (control blocks, established connections, connections
//! opened, live heap bytes) and a summary line, and exits 1 if a control block outlives
//! TIME-WAIT or the heap after the drain holds more than after a two-minute churn of the
//! same scenario, beyond `leak_allowance` (a leak grows with the connections churned).

use std::process::ExitCode;
use userstack_sim::scenario::Scenario;
use userstack_sim::soak::{churn_for, leak_allowance, live_heap_bytes, soak, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const USAGE: &str = "usage: userstack-soak [SCENARIO.toml] [--minutes N] [--seed N]";

fn main() -> ExitCode {
    let mut path = format!(
        "{}/scenarios/soak-10k-churn.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let (mut minutes, mut seed) = (60u64, 1u64);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let number = |value: Option<String>| value.and_then(|v| v.parse::<u64>().ok());
        match arg.as_str() {
            "--minutes" => match number(args.next()) {
                Some(n) => minutes = n,
                None => return usage("--minutes needs an unsigned integer"),
            },
            "--seed" => match number(args.next()) {
                Some(n) => seed = n,
                None => return usage("--seed needs an unsigned integer"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other if !other.starts_with('-') => path = other.to_string(),
            other => return usage(&format!("unknown option {other}")),
        }
    }
    let scenario = match std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|text| Scenario::from_toml(&text).map_err(|e| e.to_string()))
    {
        Ok(scenario) => scenario,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let (reference, _) = soak(&churn_for(&scenario, minutes.min(2)), seed, |_| {});
    let reference = reference.last().map_or(0, |s| s.live_heap_bytes);
    let (samples, report) = soak(&churn_for(&scenario, minutes), seed, |sample| {
        println!(
            "{}",
            serde_json::to_string(sample).expect("a sample serializes")
        );
    });
    let Some(last) = samples.last() else {
        eprintln!("{path}: the run took no sample");
        return ExitCode::from(2);
    };
    let peak = samples.iter().map(|s| s.control_blocks).max().unwrap_or(0);
    let leaked =
        last.control_blocks > 0 || last.live_heap_bytes > reference + leak_allowance(reference);
    println!(
        "{{\"minutes\": {minutes}, \"seed\": {seed}, \"opened\": {}, \"peak_control_blocks\": {peak}, \"final_control_blocks\": {}, \"heap_after_2_minutes\": {reference}, \"heap_after_drain\": {}, \"heap_now\": {}, \"retransmitted_segments\": {}, \"leak\": {leaked}}}",
        last.opened,
        last.control_blocks,
        last.live_heap_bytes,
        live_heap_bytes(),
        report.network.retransmitted_segments
    );
    if leaked {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("{problem}\n{USAGE}");
    ExitCode::from(2)
}
