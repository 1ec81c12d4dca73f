//! Protocol quality judged in the simulator, with fixed seeds: every quality check runs twenty
//! seeds and judges the median and the tail (the 90th or 10th percentile and the worst seed),
//! since one seed in four that collapses is a collapse whatever the median says. The
//! scenarios are the files in `scenarios/`, shortened where noted so the suite stays fast in
//! debug builds; `userstack-sim` runs them at full length (see docs/userstack.md).

use userstack_sim::metrics::{percentile, Report};
use userstack_sim::scenario::Scenario;
use userstack_sim::{median, run};

fn load(name: &str) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Median, 10th percentile and minimum of `values`: the tail of a figure where higher is
/// better.
fn lower_tail(values: &[f64]) -> (f64, f64, f64) {
    let min = values.iter().copied().fold(f64::MAX, f64::min);
    (median(values), percentile(values, 10.0), min)
}

#[test]
fn one_flow_fills_a_clean_100mbit_path_on_every_seed() {
    let mut scenario = load("one-flow-100mbit");
    scenario.duration_ms = 2000;
    scenario.warmup_ms = 800;
    let reports = run_many(&scenario);
    let utilization: Vec<f64> = reports.iter().map(|r| r.utilization).collect();
    let (u50, u10, umin) = lower_tail(&utilization);
    println!(
        "{{\"scenario\": \"one-flow-100mbit\", \"seeds\": {}, \"utilization\": {{\"median\": {u50:.4}, \"p10\": {u10:.4}, \"worst\": {umin:.4}}}}}",
        reports.len()
    );
    assert!(u50 >= 0.95, "median utilization {u50:.4}");
    assert!(umin >= 0.95, "worst seed's utilization {umin:.4}");
}

#[test]
fn eight_flows_share_the_bottleneck_fairly_on_every_seed() {
    let mut scenario = load("eight-flows-dumbbell");
    scenario.duration_ms = 30_000;
    scenario.warmup_ms = 10_000;
    let reports = run_many(&scenario);
    let utilization: Vec<f64> = reports.iter().map(|r| r.utilization).collect();
    let jain: Vec<f64> = reports.iter().map(|r| r.jain_index).collect();
    let (u50, u10, umin) = lower_tail(&utilization);
    let (j50, j10, jmin) = lower_tail(&jain);
    println!(
        "{{\"scenario\": \"eight-flows-dumbbell\", \"seeds\": {}, \"utilization\": {{\"median\": {u50:.4}, \"p10\": {u10:.4}, \"worst\": {umin:.4}}}, \"jain\": {{\"median\": {j50:.4}, \"p10\": {j10:.4}, \"worst\": {jmin:.4}}}}}",
        reports.len()
    );
    assert!(u50 >= 0.90, "median aggregate utilization {u50:.4}");
    // The real link's window (docs/evaluation.md: 30 s, the first 10 left out). Two changes
    // toward Linux slowed the flows' convergence: CUBIC's Reno-friendly α kept at 0.53 (seeds
    // 1-20 over a 10 s run: Jain p10 0.967 before, 0.922 after) and a receiver that ACKs
    // every second segment as Linux's does instead of nearly every one (p10 0.958 → 0.936 over
    // this window). Seeds 1-20 now: utilization 1.000 / 1.000 / 1.000 (median, p10, worst),
    // Jain 0.972 / 0.936 / 0.925; Linux on the real link, 8 flows: 0.972-0.998 in three runs.
    assert!(umin >= 0.97, "worst seed's utilization {umin:.4}");
    assert!(j50 >= 0.95, "median Jain index {j50:.4}");
    assert!(j10 >= 0.92, "Jain index at the 10th percentile {j10:.4}");
    assert!(jmin >= 0.90, "worst seed's Jain index {jmin:.4}");
}

#[test]
fn sack_retransmits_at_most_one_and_a_half_times_the_losses_on_every_seed() {
    let mut scenario = load("loss-1pct-sack");
    scenario.duration_ms = 5000;
    let reports = run_many(&scenario);
    let ratio: Vec<f64> = reports
        .iter()
        .map(|r| r.network.retransmissions_per_loss)
        .collect();
    let lost: Vec<f64> = reports
        .iter()
        .map(|r| r.network.data_segments_lost as f64)
        .collect();
    let (r50, r90, rmax) = distribution(&ratio);
    println!(
        "{{\"scenario\": \"loss-1pct-sack\", \"seeds\": {}, \"retransmissions_per_loss\": {{\"median\": {r50:.3}, \"p90\": {r90:.3}, \"worst\": {rmax:.3}}}, \"fewest_lost\": {}}}",
        reports.len(),
        lower_tail(&lost).2
    );
    assert!(
        lower_tail(&lost).2 > 10.0,
        "every seed must actually lose segments: {lost:?}"
    );
    // Seeds 1-20: 1.000 / 1.000 / 1.030 (median, p90, worst).
    assert!(
        r50 <= 1.5,
        "median retransmissions per lost segment {r50:.3}"
    );
    assert!(
        r90 <= 1.1,
        "retransmissions per lost segment at p90 {r90:.3}"
    );
    assert!(
        rmax <= 1.5,
        "worst seed's retransmissions per lost segment {rmax:.3}"
    );
}

#[test]
fn same_seed_gives_identical_traces() {
    let mut scenario = load("mixed-traffic");
    scenario.duration_ms = 1500;
    scenario.warmup_ms = 500;
    let first = run(&scenario, 42);
    let second = run(&scenario, 42);
    assert_eq!(first, second);
    assert!(!first.traces.is_empty());
    assert!(first.short_flows.completed > 0);
    let other = run(&scenario, 43);
    assert_ne!(first.trace_digest, other.trace_digest);
}

#[test]
fn every_scenario_file_parses() {
    let dir = format!("{}/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            count += 1;
        }
    }
    assert!(count >= 6);
}

#[test]
fn loopback_topology_carries_a_flow() {
    let text = r#"
        name = "loopback"
        duration_ms = 300
        [topology]
        kind = "loopback"
        bottleneck_mbps = 10
        rtt_ms = 1
        queue_packets = 100
        [[traffic]]
        kind = "bulk"
        bytes = 100000
    "#;
    let report = run(&Scenario::from_toml(text).unwrap(), 1);
    assert_eq!(report.flows[0].bytes_delivered, 100_000);
}

/// Seeds of the distribution checks: enough that the 90th percentile and the worst seed mean
/// something.
const MANY_SEEDS: std::ops::Range<u64> = 1..21;

/// Runs `scenario` once per seed of `MANY_SEEDS`, on parallel threads.
fn run_many(scenario: &Scenario) -> Vec<Report> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = MANY_SEEDS
            .map(|seed| scope.spawn(move || run(scenario, seed)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("simulation thread"))
            .collect()
    })
}

/// Median, 90th percentile and maximum of `values`.
fn distribution(values: &[f64]) -> (f64, f64, f64) {
    let max = values.iter().copied().fold(f64::MIN, f64::max);
    (median(values), percentile(values, 90.0), max)
}

#[test]
fn five_percent_loss_without_sack_never_floods_the_queue() {
    // One flow over a path that loses 5% at random: its loss-limited share (Mathis et al.,
    // MSS/RTT * 1.22/sqrt(p)) is about 3.2 Mbit/s. A sender that inflates its window after a
    // timeout overshoots that share and overflows the bottleneck queue on some seeds.
    let scenario = load("loss-5pct-nosack");
    let reports = run_many(&scenario);
    let goodput: Vec<f64> = reports.iter().map(|r| r.aggregate_goodput_mbps).collect();
    let drops: Vec<f64> = reports
        .iter()
        .map(|r| r.network.queue_drops as f64)
        .collect();
    let (g50, g90, gmax) = distribution(&goodput);
    let (d50, d90, dmax) = distribution(&drops);
    let resent: Vec<f64> = reports.iter().map(|r| r.network.retransmit_ratio).collect();
    let (r50, r90, rmax) = distribution(&resent);
    println!(
        "{{\"scenario\": \"loss-5pct-nosack\", \"seeds\": {}, \"goodput_mbps\": {{\"median\": {g50:.2}, \"p90\": {g90:.2}, \"worst\": {gmax:.2}}}, \"queue_drops\": {{\"median\": {d50}, \"p90\": {d90}, \"worst\": {dmax}}}, \"retransmitted_per_sent\": {{\"median\": {r50:.3}, \"p90\": {r90:.3}, \"worst\": {rmax:.3}}}}}",
        reports.len()
    );
    let share = 1448.0 * 8.0 / 0.020 * 1.22 / 0.05f64.sqrt() / 1e6;
    assert!(d90 == 0.0, "queue drops at the 90th percentile: {d90}");
    assert!(
        gmax <= 1.5 * share,
        "worst seed {gmax:.2} Mbit/s, loss-limited share {share:.2}"
    );
    // Go-back-N after a timeout resends what the receiver holds; duplicate ACKs must not
    // make that worse (it was 0.18 at p90 and 0.29 at worst when they inflated the window).
    // Linux's longer RTO (SRTT + 200 ms, not 200 ms) moved the worst seed from 0.124 to 0.152:
    // the same timeouts, with more of the window resent by go-back-N after each.
    assert!(
        r90 <= 0.12,
        "retransmitted/sent at the 90th percentile: {r90:.3}"
    );
    assert!(
        rmax <= 0.17,
        "retransmitted/sent on the worst seed: {rmax:.3}"
    );
    // Linux → Linux without SACK on the real link: 1.66-1.84 Mbit/s (0.53-0.58 of the
    // share). Here both ends are userstack; with its receiver ACKing every second segment as
    // Linux's does (not nearly every one) the median fell from 1.91 to 1.53 (0.48).
    assert!(
        g50 >= 0.45 * share,
        "median {g50:.2} Mbit/s, share {share:.2}"
    );
}

#[test]
fn four_flows_keep_the_path_full_through_a_millisecond_of_reordering_jitter() {
    // Up to 1 ms of jitter per packet reorders them by a few positions at 8,600 packets a
    // second. RACK's time-based loss detection with its reordering window (RFC 8985) takes
    // that for what it is; the duplicate-ACK rule took it for loss and cut 4 CUBIC flows
    // from 94 to 36 Mbit/s (seed 1, full length) with thousands of spurious retransmissions.
    // Full length: CUBIC flows need the 15 s after warm-up to converge to a fair share.
    let scenario = load("four-flows-jitter-1ms");
    let reports = run_many(&scenario);
    let goodput: Vec<f64> = reports.iter().map(|r| r.aggregate_goodput_mbps).collect();
    let jain: Vec<f64> = reports.iter().map(|r| r.jain_index).collect();
    let resent: Vec<f64> = reports.iter().map(|r| r.network.retransmit_ratio).collect();
    let (r50, r90, rmax) = distribution(&resent);
    let (g50, g10, gmin) = lower_tail(&goodput);
    let (j50, _, jmin) = lower_tail(&jain);
    println!(
        "{{\"scenario\": \"four-flows-jitter-1ms\", \"seeds\": {}, \"goodput_mbps\": {{\"median\": {g50:.2}, \"p10\": {g10:.2}, \"worst\": {gmin:.2}}}, \"jain\": {{\"median\": {j50:.4}, \"worst\": {jmin:.4}}}, \"retransmitted_per_sent\": {{\"median\": {r50:.4}, \"p90\": {r90:.4}, \"worst\": {rmax:.4}}}}}",
        reports.len()
    );
    assert!(gmin >= 88.0, "worst seed {gmin:.2} Mbit/s of 100");
    // Fairness is CUBIC's convergence, which jitter does not change: the same four flows
    // without jitter had Jain 0.948 on their worst seed and 0.978 at the median.
    assert!(jmin >= 0.90, "worst seed's Jain index {jmin:.4}");
    assert!(j50 >= 0.97, "median Jain index {j50:.4}");
    assert!(
        r90 <= 0.01,
        "retransmitted/sent at the 90th percentile: {r90:.4}"
    );
    assert!(
        rmax <= 0.02,
        "retransmitted/sent on the worst seed: {rmax:.4}"
    );
}

#[test]
fn five_percent_loss_with_sack_stays_within_the_loss_limited_share_on_every_seed() {
    // SACK's value shows under loss: each lost segment is resent about once, the queue never
    // overflows, and the flow keeps close to its loss-limited share (Mathis et al.) on the
    // worst seed as well as the median, ahead of the same path without SACK.
    let sack = run_many(&load("loss-5pct-sack"));
    let no_sack = run_many(&load("loss-5pct-nosack"));
    let goodput: Vec<f64> = sack.iter().map(|r| r.aggregate_goodput_mbps).collect();
    let per_loss: Vec<f64> = sack
        .iter()
        .map(|r| r.network.retransmissions_per_loss)
        .collect();
    let drops: Vec<f64> = sack.iter().map(|r| r.network.queue_drops as f64).collect();
    let without: Vec<f64> = no_sack.iter().map(|r| r.aggregate_goodput_mbps).collect();
    let lowest = lower_tail(&goodput).2;
    let (g50, _, gmax) = distribution(&goodput);
    let (p50, p90, pmax) = distribution(&per_loss);
    let n50 = median(&without);
    println!(
        "{{\"scenario\": \"loss-5pct-sack\", \"seeds\": {}, \"goodput_mbps\": {{\"median\": {g50:.2}, \"lowest\": {lowest:.2}, \"highest\": {gmax:.2}}}, \"retransmissions_per_loss\": {{\"median\": {p50:.3}, \"p90\": {p90:.3}, \"worst\": {pmax:.3}}}, \"without_sack_median_mbps\": {n50:.2}}}",
        sack.len()
    );
    let share = 1448.0 * 8.0 / 0.020 * 1.22 / 0.05f64.sqrt() / 1e6;
    assert!(distribution(&drops).2 == 0.0, "queue drops on some seed");
    assert!(
        pmax <= 1.1,
        "retransmissions per lost segment on the worst seed: {pmax:.3}"
    );
    // Mathis' share is for Reno; CUBIC's Reno-friendly region matches it in theory
    // (α = 0.53, β = 0.7 give the same 1.22), and Linux on the real link reaches 0.74-0.75 of
    // it (docs/evaluation.md, 1 flow at 5 % loss: 2.35-2.38 Mbit/s). Seeds 1-20 of 10 s (about
    // 100 losses each): 2.37 median — Linux's figure — and 1.90 lowest (0.60), with the
    // receiver ACKing as Linux's does; the queue-drop and retransmission bounds above are
    // what a collapse would break.
    assert!(
        lowest >= 0.55 * share,
        "lowest seed {lowest:.2} Mbit/s, share {share:.2}"
    );
    assert!(
        gmax <= 1.5 * share,
        "highest seed {gmax:.2} Mbit/s, share {share:.2}"
    );
    assert!(
        g50 >= 1.2 * n50,
        "SACK median {g50:.2} against {n50:.2} without"
    );
}

#[test]
fn four_flows_of_different_rtts_keep_the_path_full() {
    // Base RTTs 20, 40, 60 and 80 ms through one bottleneck. The shares are not equal (CUBIC
    // is only partly RTT-fair) and swing from seed to seed, so they are printed, not judged:
    // that waits for the comparison with Linux on the same path. What must hold on every
    // seed is a full path with few retransmissions.
    let reports = run_many(&load("four-flows-different-rtts"));
    let goodput: Vec<f64> = reports.iter().map(|r| r.aggregate_goodput_mbps).collect();
    let smallest_flow: Vec<f64> = reports
        .iter()
        .map(|r| {
            r.flows
                .iter()
                .map(|f| f.goodput_mbps)
                .fold(f64::MAX, f64::min)
        })
        .collect();
    let jain: Vec<f64> = reports.iter().map(|r| r.jain_index).collect();
    let resent: Vec<f64> = reports.iter().map(|r| r.network.retransmit_ratio).collect();
    let (gmin, smin, jmin) = (
        lower_tail(&goodput).2,
        lower_tail(&smallest_flow).2,
        lower_tail(&jain).2,
    );
    let (r50, r90, rmax) = distribution(&resent);
    println!(
        "{{\"scenario\": \"four-flows-different-rtts\", \"seeds\": {}, \"goodput_mbps\": {{\"median\": {:.2}, \"worst\": {gmin:.2}}}, \"smallest_flow_mbps\": {{\"median\": {:.2}, \"worst\": {smin:.2}}}, \"jain\": {{\"median\": {:.3}, \"worst\": {jmin:.3}}}, \"retransmitted_per_sent\": {{\"median\": {r50:.4}, \"p90\": {r90:.4}, \"worst\": {rmax:.4}}}}}",
        reports.len(),
        median(&goodput),
        median(&smallest_flow),
        median(&jain)
    );
    assert!(
        gmin >= 93.0,
        "worst seed {gmin:.2} Mbit/s of 94.15 achievable"
    );
    assert!(
        r90 <= 0.006,
        "retransmitted/sent at the 90th percentile: {r90:.4}"
    );
    assert!(
        rmax <= 0.01,
        "retransmitted/sent on the worst seed: {rmax:.4}"
    );
}
