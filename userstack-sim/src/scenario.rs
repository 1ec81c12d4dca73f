//! Experiments as data: a scenario file names a topology, impairments, TCP options and
//! traffic; together with a seed it determines the whole run.

use crate::link::GilbertElliott;
use core::time::Duration;
use serde::{Deserialize, Serialize};
use userstack::tcp::{Config, CongestionAlgorithm};

/// A whole experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name for reports.
    pub name: String,
    /// Simulated time to run, in milliseconds.
    pub duration_ms: u64,
    /// Time excluded from goodput statistics (slow start), in milliseconds.
    #[serde(default)]
    pub warmup_ms: u64,
    /// Goodput windows last this many base RTTs.
    #[serde(default = "default_window_rtts")]
    pub window_rtts: u32,
    /// Record cwnd/ssthresh/rwnd/srtt per window in the report.
    #[serde(default)]
    pub traces: bool,
    /// Have the stacks compute and verify TCP checksums. Off by default: the simulated NICs
    /// offload them (the simulated wire corrupts nothing, so a checksum never changes an
    /// outcome; only the checksum bytes in the frames, hence `trace_digest`, differ).
    #[serde(default)]
    pub checksums: bool,
    /// Network layout.
    pub topology: Topology,
    /// Options applied to every connection, on top of Linux defaults.
    #[serde(default)]
    pub tcp: TcpOverrides,
    /// Traffic sources.
    pub traffic: Vec<Traffic>,
}

fn default_window_rtts() -> u32 {
    4
}

/// Network layouts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyKind {
    /// One host whose link loops back to itself.
    Loopback,
    /// Two hosts on one link.
    Pair,
    /// `pairs` senders and `pairs` receivers joined through two gateways by a bottleneck.
    Dumbbell,
}

/// Topology parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Layout.
    pub kind: TopologyKind,
    /// Sender/receiver pairs (dumbbell only).
    #[serde(default = "one")]
    pub pairs: usize,
    /// Bottleneck (or the pair's link) bandwidth in Mbit/s.
    pub bottleneck_mbps: f64,
    /// Access link bandwidth in Mbit/s (dumbbell only).
    #[serde(default = "default_access")]
    pub access_mbps: f64,
    /// Base round-trip time in milliseconds; all propagation delay sits on the bottleneck.
    pub rtt_ms: f64,
    /// Round-trip time of each sender/receiver pair in milliseconds (dumbbell only; at least
    /// `rtt_ms`): the difference is propagation delay on that sender's access link, half each
    /// way. Empty: every pair has `rtt_ms`.
    #[serde(default)]
    pub pair_rtt_ms: Vec<f64>,
    /// Drop-tail queue of the bottleneck in packets.
    pub queue_packets: usize,
    /// Impairments of the forward (data) direction of the bottleneck.
    #[serde(default)]
    pub impairments: Impairments,
    /// Also impair the reverse (ACK) direction.
    #[serde(default)]
    pub impair_reverse: bool,
}

fn one() -> usize {
    1
}

fn default_access() -> f64 {
    10_000.0
}

/// Link impairments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Impairments {
    /// Random loss probability.
    #[serde(default)]
    pub loss: f64,
    /// Gilbert-Elliott burst loss.
    #[serde(default)]
    pub burst_loss: Option<GilbertElliott>,
    /// Uniform jitter bound in milliseconds.
    #[serde(default)]
    pub jitter_ms: f64,
    /// Probability of holding a packet back by `reorder_ms`.
    #[serde(default)]
    pub reorder: f64,
    /// Extra delay of reordered packets in milliseconds.
    #[serde(default)]
    pub reorder_ms: f64,
    /// Duplication probability.
    #[serde(default)]
    pub duplicate: f64,
}

/// TCP options a scenario may change; absent fields keep Linux defaults.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpOverrides {
    /// SACK on or off.
    pub sack: Option<bool>,
    /// D-SACK on or off.
    pub dsack: Option<bool>,
    /// Timestamps on or off.
    pub timestamps: Option<bool>,
    /// Congestion controller.
    pub congestion: Option<CongestionAlgorithm>,
    /// Receive buffer in bytes.
    pub recv_buffer: Option<usize>,
    /// Send buffer in bytes.
    pub send_buffer: Option<usize>,
    /// Nagle on or off.
    pub nagle: Option<bool>,
    /// Delayed-ACK timeout in milliseconds.
    pub delayed_ack_ms: Option<u64>,
    /// Jitter on the initial RTO in milliseconds.
    pub initial_rto_jitter_ms: Option<u64>,
    /// Initial window in segments.
    pub initial_window: Option<u32>,
}

impl TcpOverrides {
    /// Linux defaults with these overrides applied.
    pub fn apply(&self) -> Config {
        let mut c = Config::default();
        if let Some(v) = self.sack {
            c.sack = v;
        }
        if let Some(v) = self.dsack {
            c.dsack = v;
        }
        if let Some(v) = self.timestamps {
            c.timestamps = v;
        }
        if let Some(v) = self.congestion {
            c.congestion = v;
        }
        if let Some(v) = self.recv_buffer {
            c.recv_buffer = v;
        }
        if let Some(v) = self.send_buffer {
            c.send_buffer = v;
        }
        if let Some(v) = self.nagle {
            c.nagle = v;
        }
        if let Some(v) = self.delayed_ack_ms {
            c.delayed_ack = Duration::from_millis(v);
        }
        if let Some(v) = self.initial_rto_jitter_ms {
            c.initial_rto_jitter = Duration::from_millis(v);
        }
        if let Some(v) = self.initial_window {
            c.initial_window = v;
        }
        c
    }
}

/// A traffic source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Traffic {
    /// Long-lived transfers that keep the send buffer full.
    Bulk {
        /// Number of flows.
        #[serde(default = "one")]
        flows: usize,
        /// Bytes per flow (absent: until the end).
        #[serde(default)]
        bytes: Option<u64>,
        /// Start offset in milliseconds.
        #[serde(default)]
        start_ms: u64,
        /// Each flow starts up to this many milliseconds later, drawn from the seed.
        #[serde(default)]
        start_jitter_ms: u64,
    },
    /// Constant bit rate writes.
    Cbr {
        /// Number of flows.
        #[serde(default = "one")]
        flows: usize,
        /// Rate per flow in Mbit/s.
        rate_mbps: f64,
        /// Bytes per write.
        #[serde(default = "default_write")]
        write_bytes: usize,
    },
    /// Bulk bursts alternating with silence.
    OnOff {
        /// Number of flows.
        #[serde(default = "one")]
        flows: usize,
        /// Burst length in milliseconds.
        on_ms: u64,
        /// Silence length in milliseconds.
        off_ms: u64,
    },
    /// Short connections opened at a fixed rate, each sending `bytes` then closing.
    Short {
        /// Connections per second.
        per_second: f64,
        /// Bytes per connection.
        bytes: u64,
        /// How long a connection stays open after its bytes are acknowledged, in
        /// milliseconds: `per_second` × this is how many are open at once.
        #[serde(default)]
        hold_ms: u64,
        /// No connection opens after this many milliseconds (absent: until the end).
        #[serde(default)]
        until_ms: Option<u64>,
    },
}

fn default_write() -> usize {
    1448
}

impl Scenario {
    /// Parses a scenario from TOML.
    pub fn from_toml(text: &str) -> Result<Scenario, toml::de::Error> {
        let scenario: Scenario = toml::from_str(text)?;
        let topo = &scenario.topology;
        let invalid = <toml::de::Error as serde::de::Error>::custom;
        if !topo.pair_rtt_ms.is_empty() {
            if topo.kind != TopologyKind::Dumbbell || topo.pair_rtt_ms.len() != topo.pairs {
                return Err(invalid(format!(
                    "topology.pair_rtt_ms needs a dumbbell and one value per pair ({} given, {} pairs)",
                    topo.pair_rtt_ms.len(),
                    topo.pairs
                )));
            }
            if let Some(rtt) = topo.pair_rtt_ms.iter().find(|&&r| r < topo.rtt_ms) {
                return Err(invalid(format!(
                    "topology.pair_rtt_ms: {rtt} ms is below the bottleneck's rtt_ms {}",
                    topo.rtt_ms
                )));
            }
        }
        Ok(scenario)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_scenario() {
        let text = r#"
            name = "t"
            duration_ms = 1000
            [topology]
            kind = "dumbbell"
            pairs = 2
            bottleneck_mbps = 100
            rtt_ms = 20
            queue_packets = 100
            impairments = { loss = 0.01, burst_loss = { p_good_to_bad = 0.01, p_bad_to_good = 0.5 } }
            [tcp]
            sack = false
            congestion = "newreno"
            [[traffic]]
            kind = "bulk"
            flows = 2
            [[traffic]]
            kind = "short"
            per_second = 10
            bytes = 10000
        "#;
        let s = Scenario::from_toml(text).unwrap();
        assert_eq!(s.topology.kind, TopologyKind::Dumbbell);
        assert_eq!(s.traffic.len(), 2);
        let c = s.tcp.apply();
        assert!(!c.sack);
        assert_eq!(c.congestion, CongestionAlgorithm::NewReno);
        assert_eq!(s.topology.impairments.burst_loss.unwrap().loss_bad, 1.0);
        assert!(Scenario::from_toml("name = 1").is_err());
    }

    #[test]
    fn per_pair_rtts_need_a_dumbbell_and_one_value_per_pair_no_lower_than_the_base() {
        let with = |pair_rtts: &str| {
            Scenario::from_toml(&format!(
                r#"
                name = "t"
                duration_ms = 1000
                [topology]
                kind = "dumbbell"
                pairs = 2
                bottleneck_mbps = 100
                rtt_ms = 20
                queue_packets = 100
                pair_rtt_ms = {pair_rtts}
                [[traffic]]
                kind = "bulk"
                flows = 2
                "#
            ))
        };
        assert_eq!(with("[20, 80]").unwrap().topology.pair_rtt_ms, [20.0, 80.0]);
        let short = with("[20]").unwrap_err().to_string();
        assert!(
            short.contains("one value per pair (1 given, 2 pairs)"),
            "{short}"
        );
        let low = with("[10, 80]").unwrap_err().to_string();
        assert!(
            low.contains("10 ms is below the bottleneck's rtt_ms 20"),
            "{low}"
        );
    }
}
