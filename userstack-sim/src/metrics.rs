//! What a run measured: goodput percentiles per flow, loss beside retransmission, fairness,
//! flow completion times and congestion-state traces.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0..=100) by nearest rank; 0 for an empty sample.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's fairness index: (Σx)² / (n·Σx²); 1 when all equal, 1/n when one takes all.
pub fn jain_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|x| x * x).sum();
    if values.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (values.len() as f64 * squares)
}

/// One sample of a sender's congestion state.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TracePoint {
    /// Flow index.
    pub flow: usize,
    /// Simulated time in milliseconds.
    pub t_ms: f64,
    /// Congestion window in bytes.
    pub cwnd: u32,
    /// Slow-start threshold in bytes (u32::MAX = infinity).
    pub ssthresh: u32,
    /// The receiver's advertised window as the sender sees it, in bytes.
    pub rwnd: u32,
    /// Smoothed RTT in milliseconds.
    pub srtt_ms: f64,
}

/// Per-flow results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Flow index.
    pub flow: usize,
    /// Mean goodput after warm-up, Mbit/s.
    pub goodput_mbps: f64,
    /// Median per-window goodput, Mbit/s.
    pub p50_mbps: f64,
    /// 95th percentile per-window goodput, Mbit/s.
    pub p95_mbps: f64,
    /// 99th percentile per-window goodput, Mbit/s.
    pub p99_mbps: f64,
    /// Payload bytes delivered in order to the receiving application.
    pub bytes_delivered: u64,
    /// Data segments sent, retransmissions included.
    pub data_segments_sent: u64,
    /// Segments retransmitted.
    pub retransmissions: u64,
    /// Retransmissions proven spurious by D-SACK.
    pub spurious_retransmissions: u64,
}

/// Network-wide loss and retransmission, side by side.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetworkReport {
    /// Frames handed to links.
    pub frames_offered: u64,
    /// Frames dropped by full queues.
    pub queue_drops: u64,
    /// Frames lost by link impairments.
    pub wire_losses: u64,
    /// TCP segments carrying data that were dropped or lost.
    pub data_segments_lost: u64,
    /// (queue drops + wire losses) / frames offered.
    pub loss_ratio: f64,
    /// Segments retransmitted by all senders.
    pub retransmitted_segments: u64,
    /// Retransmitted / data segments sent.
    pub retransmit_ratio: f64,
    /// Retransmitted segments per data segment lost (1.0 is ideal).
    pub retransmissions_per_loss: f64,
    /// Frames delivered twice by duplication.
    pub duplicates: u64,
}

/// Completion times of short connections.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShortFlowReport {
    /// Connections opened.
    pub started: u64,
    /// Connections whose data was fully acknowledged.
    pub completed: u64,
    /// Median completion time, ms.
    pub fct_p50_ms: f64,
    /// 95th percentile completion time, ms.
    pub fct_p95_ms: f64,
    /// 99th percentile completion time, ms.
    pub fct_p99_ms: f64,
}

/// Everything a run reports (printed as JSON by `userstack-sim`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Seed of the run.
    pub seed: u64,
    /// Bottleneck bandwidth, Mbit/s.
    pub link_mbps: f64,
    /// Base RTT, ms.
    pub base_rtt_ms: f64,
    /// Sum of flow goodputs after warm-up, Mbit/s.
    pub aggregate_goodput_mbps: f64,
    /// Aggregate goodput over the best goodput the link allows at this MSS (see
    /// `max_goodput_mbps`: header and framing overhead excluded).
    pub utilization: f64,
    /// Aggregate goodput over the raw link bandwidth.
    pub link_share: f64,
    /// Jain's index over per-flow goodput.
    pub jain_index: f64,
    /// Per-flow results.
    pub flows: Vec<FlowReport>,
    /// Loss and retransmission.
    pub network: NetworkReport,
    /// Short-connection completion times.
    pub short_flows: ShortFlowReport,
    /// Simulated packets (frame arrivals) processed.
    pub simulated_packets: u64,
    /// Non-zero TCP counters summed over all hosts, as `Proto.Field`.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Congestion-state samples (when the scenario asks for traces).
    pub traces: Vec<TracePoint>,
    /// Digest of every frame arrival (its time, length and first 80 bytes): equal digests,
    /// identical runs.
    pub trace_digest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_and_jain() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert!((jain_index(&[1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }
}
