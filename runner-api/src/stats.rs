//! The runner's `--stats` file: one JSON document the runner replaces atomically (once every
//! shard serves, then every interval, a last time on exit) and the agent reads for
//! `NodeTuning.status.userspaceStack` and the exporter. camelCase fields. Read leniently
//! (unknown fields are ignored, see the crate doc). Required: every field the agent's report
//! rests on (pid, state, mode, shards, services, netstat), so a renamed one fails to parse.
//! Optional: `backend` (the agent knows which one it asked for), `steering`,
//! `checksumOffload`, `rxStamps` and a shard's `busyNanos`, `runNanos`, `drops` and `rxWait`
//! (absent from runners that predate them; a drop counter added later, such as
//! `checksumErrors`, reads as 0; an `rxStamps` state added later reads as
//! [`RxStamps::Unknown`]) and `stop` (present once stopping).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{Backend, ServiceKind};

/// The whole document.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerStats {
    /// The runner's process id (tells a file of an earlier run from the current one).
    pub pid: u32,
    /// Where it is in its life.
    pub state: RunState,
    /// The packet I/O backend (optional: the agent knows which one it asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// How the backend moves packets: `copy`, `zeroCopy`, `tap` or `dpdk`.
    pub mode: String,
    /// One entry per shard.
    pub shards: Vec<ShardStats>,
    /// The services listening.
    pub services: Vec<ServiceStats>,
    /// The RSS key and table the shards steer by (absent from runners that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<SteeringStats>,
    /// Which TCP checksum work the device does for the stack (absent from runners that
    /// predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_offload: Option<ChecksumOffloadStats>,
    /// Whether received frames carry the XDP program's clock stamps, from which the shards
    /// measure [`ShardStats::rx_wait`] (AF_XDP; absent for other backends and from runners
    /// that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_stamps: Option<RxStamps>,
    /// Counters of all shards by section (`Tcp`, `TcpExt`, `Ip`, `Icmp`) and field, named as
    /// in /proc/net/snmp and /proc/net/netstat; signed, as the kernel's `MaxConn` (-1) is.
    pub netstat: BTreeMap<String, BTreeMap<String, i64>>,
    /// How the graceful stop went; present once stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopStats>,
}

/// The runner's lifecycle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RunState {
    /// Setting up devices and shards.
    Starting,
    /// Every shard is up and serving.
    Running,
    /// Stopping: no new connections, open ones finishing.
    Draining,
    /// Stopped; the last document.
    Stopped,
}

/// One shard's figures.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShardStats {
    /// The core it is pinned to.
    pub core: u32,
    /// The device queue it serves.
    pub queue: u32,
    /// Frames received.
    pub rx_packets: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Open connections.
    pub connections: u64,
    /// Nanoseconds of the shard's loop spent in turns that received, sent or served
    /// something; the rest of [`ShardStats::run_nanos`] it polled an empty device or parked.
    /// 0 from runners that predate it.
    #[serde(default)]
    pub busy_nanos: u64,
    /// Nanoseconds the shard's loop has run. 0 from runners that predate it.
    #[serde(default)]
    pub run_nanos: u64,
    /// The device queue's own drop counters, where the backend keeps them (AF_XDP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drops: Option<QueueDrops>,
    /// How long received frames waited before the shard took them, where the backend can
    /// tell (AF_XDP with [`RxStamps::Enabled`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_wait: Option<RxWait>,
}

/// Whether the runner's XDP program stamps the frames it redirects (the measurement behind
/// [`RxWait`]). The stamp needs the helper `bpf_xdp_adjust_meta`, which some kernels refuse
/// to XDP programs; the runner then runs the program without it, and serves as ever.
/// Tagged by `state`: `{"state": "enabled"}`, `{"state": "unavailable", "reason": "..."}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum RxStamps {
    /// Every redirected frame is stamped; the shards report [`ShardStats::rx_wait`].
    Enabled,
    /// The program runs without stamps, and the shards report no `rxWait`.
    Unavailable {
        /// Why, in the kernel's words (the verifier's refusal of the helper).
        reason: String,
    },
    /// A state this reader does not know (written by a later runner); never written.
    #[serde(other)]
    Unknown,
}

/// Buckets of [`RxWait::log2_micros`].
pub const RX_WAIT_BUCKETS: usize = 16;

/// How long received frames waited between the kernel's XDP program, which stamps each frame
/// it redirects to the shard's AF_XDP socket with the kernel's monotonic clock, and the
/// shard's loop taking the frame off its rx ring. The wait is the kernel publishing the frame
/// to the ring (a driver does so at the end of its poll, once for the poll's whole batch),
/// the wake-up of a parked shard, and the rest of the shard's current turn.
#[derive(Serialize, Deserialize, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RxWait {
    /// Frames measured.
    pub frames: u64,
    /// Their waits summed, in nanoseconds.
    pub total_nanos: u64,
    /// Frames by wait: entry *k* counts waits of at least 2^(k−1) and under 2^k microseconds
    /// (entry 0: under 1 µs), the last entry every longer wait.
    pub log2_micros: Vec<u64>,
}

impl Clone for RxWait {
    fn clone(&self) -> RxWait {
        RxWait {
            frames: self.frames,
            total_nanos: self.total_nanos,
            log2_micros: self.log2_micros.clone(),
        }
    }

    /// Reuses `self`'s buckets, so a runner publishing its figures does not allocate.
    fn clone_from(&mut self, source: &RxWait) {
        self.frames = source.frames;
        self.total_nanos = source.total_nanos;
        self.log2_micros.clone_from(&source.log2_micros);
    }
}

impl RxWait {
    /// Counts one frame that waited `nanos`.
    pub fn record(&mut self, nanos: u64) {
        if self.log2_micros.len() < RX_WAIT_BUCKETS {
            self.log2_micros.resize(RX_WAIT_BUCKETS, 0);
        }
        let micros = nanos / 1000;
        let bucket = (u64::BITS - micros.leading_zeros()) as usize;
        self.log2_micros[bucket.min(RX_WAIT_BUCKETS - 1)] += 1;
        self.frames += 1;
        self.total_nanos = self.total_nanos.saturating_add(nanos);
    }

    /// `f` applied field by field and bucket by bucket to `self` and `other` (sums over
    /// shards, moves over time).
    pub fn combine(&self, other: &RxWait, f: impl Fn(u64, u64) -> u64) -> RxWait {
        let buckets = self.log2_micros.len().max(other.log2_micros.len());
        let at = |w: &RxWait, i: usize| w.log2_micros.get(i).copied().unwrap_or(0);
        RxWait {
            frames: f(self.frames, other.frames),
            total_nanos: f(self.total_nanos, other.total_nanos),
            log2_micros: (0..buckets).map(|i| f(at(self, i), at(other, i))).collect(),
        }
    }

    /// The mean wait in microseconds; `None` without frames.
    pub fn mean_micros(&self) -> Option<f64> {
        (self.frames > 0).then(|| self.total_nanos as f64 / self.frames as f64 / 1e3)
    }

    /// The upper end, in microseconds, of the bucket holding the `q` quantile (0 < q ≤ 1):
    /// a bound within a factor of two; `None` without frames or when it lies in the last,
    /// open bucket.
    pub fn quantile_bound_micros(&self, q: f64) -> Option<u64> {
        let total: u64 = self.log2_micros.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (k, &n) in self.log2_micros.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return (k + 1 < RX_WAIT_BUCKETS).then_some(1 << k);
            }
        }
        None
    }
}

/// Frames a device queue dropped or could not take, as the kernel counts them for an AF_XDP
/// socket (`XDP_STATISTICS`), and the received frames the device itself dropped for a bad
/// TCP checksum.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct QueueDrops {
    /// Frames dropped for reasons other than invalid descriptors (`rx_dropped`).
    pub rx_dropped: u64,
    /// Frames dropped because the rx ring was full: the shard did not take them in time
    /// (`rx_ring_full`).
    pub rx_ring_full: u64,
    /// Times the fill ring had no frame for an arriving packet (`rx_fill_ring_empty_descs`).
    pub rx_fill_ring_empty: u64,
    /// Times the kernel found the tx ring empty when asked to send (`tx_ring_empty_descs`).
    pub tx_ring_empty: u64,
    /// Frames the shard dropped itself because the tx ring had no free slot or UMEM frame
    /// (counted by the runner, not the kernel).
    pub tx_ring_full: u64,
    /// Received TCP frames dropped by the device because their checksum was wrong: flagged
    /// bad by the hardware, or checked in software where the hardware said nothing (a device
    /// with rx checksum offload hands the stack only verified frames). 0 from runners that
    /// predate it.
    #[serde(default)]
    pub checksum_errors: u64,
}

impl QueueDrops {
    /// Frames lost: dropped on receive (no fill frame, a full rx ring, a bad checksum) or, by
    /// the runner, on send. The two `empty` counts are events, not losses.
    pub fn lost(&self) -> u64 {
        self.rx_dropped + self.rx_ring_full + self.tx_ring_full + self.checksum_errors
    }

    /// `f` applied field by field to `self` and `other` (sums over shards, moves over time).
    pub fn combine(self, other: QueueDrops, f: impl Fn(u64, u64) -> u64) -> QueueDrops {
        QueueDrops {
            rx_dropped: f(self.rx_dropped, other.rx_dropped),
            rx_ring_full: f(self.rx_ring_full, other.rx_ring_full),
            rx_fill_ring_empty: f(self.rx_fill_ring_empty, other.rx_fill_ring_empty),
            tx_ring_empty: f(self.tx_ring_empty, other.tx_ring_empty),
            tx_ring_full: f(self.tx_ring_full, other.tx_ring_full),
            checksum_errors: f(self.checksum_errors, other.checksum_errors),
        }
    }
}

/// The TCP checksum work the device does, which the stack then skips.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChecksumOffloadStats {
    /// The device hands over only TCP frames whose checksums are verified (by the hardware
    /// or kernel, or by the device in software), so the stack does not check them.
    pub rx: bool,
    /// The device completes the TCP checksums the stack leaves partial (the pseudo-header
    /// sum only).
    pub tx: bool,
}

/// A service being served.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStats {
    /// What it does.
    pub kind: ServiceKind,
    /// Its port.
    pub port: u16,
}

/// What the shards steer by.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SteeringStats {
    /// Where the key and table came from.
    pub source: SteeringSource,
    /// The Toeplitz key, lowercase hex.
    pub key: String,
    /// Entries in the indirection table.
    pub indirection_size: u32,
}

/// Where the runner's RSS key and table come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum SteeringSource {
    /// The NIC's own, from the config's `rss` (read by the agent).
    Nic,
    /// The runner's configured key spread over the shards (the NIC has no RSS to read, or
    /// the backend programs the key itself).
    Configured,
}

impl SteeringSource {
    /// The spelling in the stats file (`nic`, `configured`).
    pub fn as_str(self) -> &'static str {
        match self {
            SteeringSource::Nic => "nic",
            SteeringSource::Configured => "configured",
        }
    }
}

/// How a graceful stop went.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StopStats {
    /// Connections closed in both directions before the deadline.
    pub drained: u64,
    /// Connections reset at the deadline.
    pub reset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A document with every field set, in the JSON the runner writes.
    fn full() -> (RunnerStats, serde_json::Value) {
        let netstat = BTreeMap::from([
            (
                "Tcp".to_string(),
                BTreeMap::from([("MaxConn".to_string(), -1), ("OutSegs".to_string(), 12)]),
            ),
            (
                "TcpExt".to_string(),
                BTreeMap::from([("TCPSackRecovery".to_string(), 2)]),
            ),
        ]);
        let stats = RunnerStats {
            pid: 1234,
            state: RunState::Draining,
            backend: Some(Backend::AfXdp),
            mode: "zeroCopy".into(),
            shards: vec![ShardStats {
                core: 1,
                queue: 0,
                rx_packets: 10,
                tx_packets: 8,
                connections: 2,
                busy_nanos: 700,
                run_nanos: 1000,
                drops: Some(QueueDrops {
                    rx_dropped: 1,
                    rx_ring_full: 2,
                    rx_fill_ring_empty: 3,
                    tx_ring_empty: 4,
                    tx_ring_full: 5,
                    checksum_errors: 6,
                }),
                rx_wait: Some(RxWait {
                    frames: 3,
                    total_nanos: 4500,
                    log2_micros: vec![1, 1, 1],
                }),
            }],
            services: vec![ServiceStats {
                kind: ServiceKind::Http,
                port: 80,
            }],
            steering: Some(SteeringStats {
                source: SteeringSource::Nic,
                key: "6d5a56da".into(),
                indirection_size: 128,
            }),
            checksum_offload: Some(ChecksumOffloadStats {
                rx: true,
                tx: false,
            }),
            rx_stamps: Some(RxStamps::Enabled),
            netstat,
            stop: Some(StopStats {
                drained: 3,
                reset: 1,
            }),
        };
        let json = json!({
            "pid": 1234,
            "state": "draining",
            "backend": "afXdp",
            "mode": "zeroCopy",
            "shards": [
                {
                    "core": 1, "queue": 0, "rxPackets": 10, "txPackets": 8, "connections": 2,
                    "busyNanos": 700, "runNanos": 1000,
                    "drops": {
                        "rxDropped": 1, "rxRingFull": 2, "rxFillRingEmpty": 3, "txRingEmpty": 4,
                        "txRingFull": 5, "checksumErrors": 6
                    },
                    "rxWait": { "frames": 3, "totalNanos": 4500, "log2Micros": [1, 1, 1] }
                }
            ],
            "services": [ { "kind": "Http", "port": 80 } ],
            "steering": { "source": "nic", "key": "6d5a56da", "indirectionSize": 128 },
            "checksumOffload": { "rx": true, "tx": false },
            "rxStamps": { "state": "enabled" },
            "netstat": {
                "Tcp": { "MaxConn": -1, "OutSegs": 12 },
                "TcpExt": { "TCPSackRecovery": 2 }
            },
            "stop": { "drained": 3, "reset": 1 }
        });
        (stats, json)
    }

    #[test]
    fn a_full_document_is_pinned_and_round_trips() {
        let (stats, json) = full();
        assert_eq!(serde_json::to_value(&stats).unwrap(), json);
        let back: RunnerStats = serde_json::from_value(json).unwrap();
        assert_eq!(back, stats);
    }

    #[test]
    fn drops_combine_field_by_field_and_count_losses_only() {
        let (stats, _) = full();
        let drops = stats.shards[0].drops.unwrap();
        let twice = drops.combine(drops, |a, b| a + b);
        assert_eq!(
            (twice.rx_dropped, twice.tx_ring_full, twice.checksum_errors),
            (2, 10, 12)
        );
        // rxDropped 1 + rxRingFull 2 + txRingFull 5 + checksumErrors 6; the empty-ring events
        // are not losses.
        assert_eq!(drops.lost(), 14);
        assert_eq!(twice.combine(drops, u64::saturating_sub), drops);
    }

    #[test]
    fn drops_of_a_runner_without_checksum_errors_parse_as_zero() {
        let drops: QueueDrops = serde_json::from_value(json!({
            "rxDropped": 1, "rxRingFull": 2, "rxFillRingEmpty": 3, "txRingEmpty": 4,
            "txRingFull": 5
        }))
        .unwrap();
        assert_eq!((drops.tx_ring_full, drops.checksum_errors), (5, 0));
    }

    #[test]
    fn every_state_and_source_has_its_spelling() {
        for (state, name) in [
            (RunState::Starting, "starting"),
            (RunState::Running, "running"),
            (RunState::Draining, "draining"),
            (RunState::Stopped, "stopped"),
        ] {
            assert_eq!(serde_json::to_value(state).unwrap(), json!(name));
        }
        for source in [SteeringSource::Nic, SteeringSource::Configured] {
            assert_eq!(
                serde_json::to_value(source).unwrap(),
                json!(source.as_str())
            );
        }
    }

    #[test]
    fn a_renamed_field_fails_and_an_unknown_one_is_ignored() {
        let (stats, json) = full();
        let text = json.to_string();
        for (from, to) in [
            ("\"pid\"", "\"processId\""),
            ("\"mode\"", "\"ioMode\""),
            ("rxPackets", "rxFrames"),
            ("indirectionSize", "indirectionEntries"),
            ("\"netstat\"", "\"counters\""),
            ("\"drained\"", "\"closed\""),
        ] {
            assert!(text.contains(from), "{from} is not in {text}");
            let error = serde_json::from_str::<RunnerStats>(&text.replace(from, to)).unwrap_err();
            assert!(
                error.to_string().contains("missing field"),
                "{from} -> {to}: {error}"
            );
        }
        // A field a later runner adds does not hide the rest from an earlier agent.
        let mut later = json.clone();
        later["drops"] = json!(5);
        later["shards"][0]["rxBytes"] = json!(9000);
        assert_eq!(serde_json::from_value::<RunnerStats>(later).unwrap(), stats);
        // Backend, steering, checksum offload, receive stamps and stop are optional: a document
        // without them still parses.
        let mut earlier = json;
        let object = earlier.as_object_mut().unwrap();
        for field in ["backend", "steering", "checksumOffload", "rxStamps", "stop"] {
            object.remove(field);
        }
        // So are a shard's load and drops.
        let shard = object["shards"][0].as_object_mut().unwrap();
        for field in ["busyNanos", "runNanos", "drops", "rxWait"] {
            shard.remove(field);
        }
        let parsed: RunnerStats = serde_json::from_value(earlier).unwrap();
        assert_eq!(
            (
                parsed.backend,
                parsed.steering,
                parsed.checksum_offload,
                parsed.rx_stamps,
                parsed.stop
            ),
            (None, None, None, None, None)
        );
        let shard = &parsed.shards[0];
        assert_eq!(
            (
                shard.busy_nanos,
                shard.run_nanos,
                shard.drops,
                &shard.rx_wait
            ),
            (0, 0, None, &None)
        );
    }

    #[test]
    fn receive_stamps_say_why_they_are_unavailable_and_a_later_state_reads_as_unknown() {
        let reason = "program of this type cannot use helper bpf_xdp_adjust_meta#54";
        let unavailable = RxStamps::Unavailable {
            reason: reason.into(),
        };
        let json = json!({ "state": "unavailable", "reason": reason });
        assert_eq!(serde_json::to_value(&unavailable).unwrap(), json);
        assert_eq!(
            serde_json::from_value::<RxStamps>(json).unwrap(),
            unavailable
        );
        // A reason is part of the state: without one it does not parse.
        assert!(serde_json::from_value::<RxStamps>(json!({ "state": "unavailable" })).is_err());
        // A state a later runner adds does not hide the rest of its document.
        let (stats, mut later) = full();
        later["rxStamps"] = json!({ "state": "sampled", "everyNth": 8 });
        let parsed: RunnerStats = serde_json::from_value(later).unwrap();
        assert_eq!(parsed.rx_stamps, Some(RxStamps::Unknown));
        assert_eq!(parsed.shards, stats.shards);
    }

    #[test]
    fn rx_waits_fall_in_power_of_two_buckets_and_bound_their_quantiles() {
        let mut wait = RxWait::default();
        // 0.4 µs, 1 µs, 3 µs, 3.9 µs, 700 µs, and one of a minute (the open last bucket).
        for nanos in [400, 1_000, 3_000, 3_900, 700_000, 60_000_000_000] {
            wait.record(nanos);
        }
        let mut expected = vec![0; RX_WAIT_BUCKETS];
        expected[0] = 1; // under 1 µs
        expected[1] = 1; // [1, 2) µs
        expected[2] = 2; // [2, 4) µs
        expected[10] = 1; // [512, 1024) µs
        expected[RX_WAIT_BUCKETS - 1] = 1;
        assert_eq!(wait.log2_micros, expected);
        assert_eq!(wait.frames, 6);
        // Half the frames waited under 4 µs, five in six under 1,024 µs; the slowest is
        // beyond the last bound.
        assert_eq!(wait.quantile_bound_micros(0.5), Some(4));
        assert_eq!(wait.quantile_bound_micros(5.0 / 6.0), Some(1024));
        assert_eq!(wait.quantile_bound_micros(1.0), None);
        assert_eq!(RxWait::default().quantile_bound_micros(0.5), None);
        assert_eq!(RxWait::default().mean_micros(), None);
        let mean = wait.mean_micros().unwrap();
        assert!((mean - 60_000_708_300.0 / 6e3).abs() < 1e-6, "{mean}");
        // Moves over time subtract bucket by bucket.
        let mut later = wait.clone();
        later.record(2_500);
        let moved = later.combine(&wait, u64::saturating_sub);
        assert_eq!((moved.frames, moved.total_nanos), (1, 2_500));
        assert_eq!(moved.quantile_bound_micros(0.9), Some(4));
    }
}
