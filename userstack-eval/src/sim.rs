//! The rows in the simulator: the same path as the real link (a 100 Mbit/s bottleneck, 20 ms
//! of base RTT, a 250-packet drop-tail queue), CUBIC with Linux's defaults on both ends, 30 s
//! per run of which the first 10 s are left out, over fixed seeds.

use crate::rows::{Row, BASE_RTT_MS, BOTTLENECK_MBPS, QUEUE_PACKETS};
use userstack_sim::metrics::Report;
use userstack_sim::scenario::Scenario;
use userstack_sim::{median, run, run_observed};

/// The simulator's scenario for `row`.
pub fn scenario(row: &Row) -> Scenario {
    let pair_rtts = if row.rtts_ms.is_empty() {
        String::new()
    } else {
        format!("pair_rtt_ms = {:?}\n", row.rtts_ms)
    };
    let text = format!(
        r#"
name = "{label}"
duration_ms = 30000
warmup_ms = 10000
window_rtts = 5
[topology]
kind = "dumbbell"
pairs = {flows}
bottleneck_mbps = {BOTTLENECK_MBPS}
access_mbps = 1000
rtt_ms = {BASE_RTT_MS}
{pair_rtts}queue_packets = {QUEUE_PACKETS}
impairments = {{ loss = {loss}, jitter_ms = {jitter} }}
[tcp]
sack = {sack}
recv_buffer = 4194304
send_buffer = 4194304
initial_rto_jitter_ms = 50
[[traffic]]
kind = "bulk"
flows = {flows}
start_jitter_ms = 100
"#,
        label = row.label,
        flows = row.flows,
        loss = row.loss,
        jitter = row.jitter_ms,
        sack = row.sack,
    );
    Scenario::from_toml(&text).expect("the evaluation's scenarios parse")
}

/// `row` run once per seed `1..=seeds`.
pub fn runs(row: &Row, seeds: u64) -> Vec<Report> {
    let scenario = scenario(row);
    (1..=seeds).map(|seed| run(&scenario, seed)).collect()
}

/// `report`'s counter `name` (`TcpExt.TCPTimeouts`), summed over both ends.
pub fn counter(report: &Report, name: &str) -> f64 {
    report.counters.get(name).copied().unwrap_or(0) as f64
}

/// Median and worst (lowest, or highest where `higher_is_worse`) of `values`.
pub fn median_worst(values: &[f64], higher_is_worse: bool) -> (f64, f64) {
    let worst = if higher_is_worse {
        values.iter().copied().fold(f64::MIN, f64::max)
    } else {
        values.iter().copied().fold(f64::MAX, f64::min)
    };
    (median(values), worst)
}

/// Goodput of flow 0 per window (5 RTTs) over one run, in Mbit/s, with the window's end in s.
pub fn throughput_over_time(scenario: &Scenario, seed: u64) -> Vec<(f64, f64)> {
    let mut last = (0.0, 0u64);
    let mut series = Vec::new();
    run_observed(scenario, seed, |net| {
        let t = net.now().as_nanos() as f64 / 1e9;
        let delivered = net.ctx.flows.first().map_or(0, |f| f.delivered);
        if t > last.0 {
            let mbps = (delivered - last.1) as f64 * 8.0 / (t - last.0) / 1e6;
            series.push((t, mbps));
        }
        last = (t, delivered);
    });
    series
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::by_label;

    #[test]
    fn every_row_is_a_valid_scenario_of_its_flows() {
        for row in &crate::rows::ROWS {
            let s = scenario(row);
            assert_eq!(s.name, row.label);
        }
        let s = scenario(by_label("4 flows, RTT 20/40/60/80 ms").unwrap());
        assert_eq!(s.topology.pair_rtt_ms, [20.0, 40.0, 60.0, 80.0]);
    }
}
