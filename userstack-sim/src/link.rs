//! A unidirectional link: a drop-tail queue, a serializer at a fixed bandwidth, then
//! propagation delay with jitter, loss (random or Gilbert-Elliott bursts), reordering and
//! duplication.

use crate::frame_pool::FrameId;
use crate::rng::Rng;
use core::time::Duration;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use userstack::time::Instant;

/// Two-state burst loss (Gilbert-Elliott).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GilbertElliott {
    /// Per-packet probability of moving from the good to the bad state.
    pub p_good_to_bad: f64,
    /// Per-packet probability of moving from the bad back to the good state.
    pub p_bad_to_good: f64,
    /// Loss probability in the good state.
    #[serde(default)]
    pub loss_good: f64,
    /// Loss probability in the bad state.
    #[serde(default = "one")]
    pub loss_bad: f64,
}

fn one() -> f64 {
    1.0
}

/// Impairments and capacity of one link direction.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Serialization rate in bits per second.
    pub bandwidth_bps: u64,
    /// One-way propagation delay.
    #[serde(with = "millis")]
    pub delay: Duration,
    /// Uniform extra delay in [0, jitter) per packet (may reorder).
    #[serde(with = "millis", default)]
    pub jitter: Duration,
    /// Independent random loss probability.
    #[serde(default)]
    pub loss: f64,
    /// Burst loss on top of `loss`.
    #[serde(default)]
    pub burst_loss: Option<GilbertElliott>,
    /// Probability that a packet is held back by `reorder_delay`.
    #[serde(default)]
    pub reorder: f64,
    /// Extra delay of a reordered packet.
    #[serde(with = "millis", default)]
    pub reorder_delay: Duration,
    /// Probability that a packet is delivered twice.
    #[serde(default)]
    pub duplicate: f64,
    /// Queue bound in packets (drop-tail).
    pub queue_packets: usize,
}

/// (De)serialises a `Duration` as floating-point milliseconds.
mod millis {
    use core::time::Duration;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = f64::deserialize(d)?;
        if !(ms.is_finite() && ms >= 0.0) {
            return Err(serde::de::Error::custom(
                "milliseconds must be finite and non-negative",
            ));
        }
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }
}

impl LinkConfig {
    /// A clean link of `mbps` Mbit/s and `delay` one way, with a queue of `queue_packets`.
    pub fn clean(mbps: f64, delay: Duration, queue_packets: usize) -> LinkConfig {
        LinkConfig {
            bandwidth_bps: (mbps * 1e6) as u64,
            delay,
            jitter: Duration::ZERO,
            loss: 0.0,
            burst_loss: None,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            duplicate: 0.0,
            queue_packets,
        }
    }

    /// Time to serialize `bytes` (plus Ethernet preamble, FCS and gap: 24 bytes).
    pub fn transmission_time(&self, bytes: usize) -> Duration {
        let bits = (bytes as u64 + 24) * 8;
        Duration::from_nanos(bits * 1_000_000_000 / self.bandwidth_bps.max(1))
    }
}

/// What became of a frame leaving the serializer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Lost on the wire.
    Lost,
    /// Arrives at the given times (two when duplicated).
    Arrives(Instant, Option<Instant>),
}

/// One direction of a link: queue, serializer state and loss-model state.
#[derive(Debug)]
pub struct LinkDirection {
    /// Capacity and impairments.
    pub config: LinkConfig,
    /// Frames waiting and their lengths; the front one is being serialized when `busy`.
    pub queue: VecDeque<(FrameId, usize)>,
    /// Whether the serializer is working on the front frame.
    pub busy: bool,
    bad_state: bool,
    last_arrival: Instant,
    /// The last frame length serialized and its time: a link carries frames of one or two
    /// sizes, so this saves a division per frame.
    last_serialized: (usize, Duration),
}

impl LinkDirection {
    /// An idle link direction.
    pub fn new(config: LinkConfig) -> LinkDirection {
        LinkDirection {
            config,
            queue: VecDeque::new(),
            busy: false,
            bad_state: false,
            last_arrival: Instant::ZERO,
            last_serialized: (usize::MAX, Duration::ZERO),
        }
    }

    /// [`LinkConfig::transmission_time`] of a `len`-byte frame on this link.
    pub fn serialization_time(&mut self, len: usize) -> Duration {
        if self.last_serialized.0 != len {
            self.last_serialized = (len, self.config.transmission_time(len));
        }
        self.last_serialized.1
    }

    /// Offers a frame of `len` bytes to the queue; returns it back when the queue is full
    /// (drop-tail).
    pub fn enqueue(&mut self, frame: FrameId, len: usize) -> Result<(), FrameId> {
        if self.queue.len() >= self.config.queue_packets.max(1) {
            return Err(frame);
        }
        self.queue.push_back((frame, len));
        Ok(())
    }

    /// Draws the fate of a frame that finished serializing at `now`.
    pub fn fate(&mut self, now: Instant, rng: &mut Rng) -> Fate {
        let c = self.config;
        let mut lost = rng.chance(c.loss);
        if let Some(ge) = c.burst_loss {
            let flip = if self.bad_state {
                ge.p_bad_to_good
            } else {
                ge.p_good_to_bad
            };
            if rng.chance(flip) {
                self.bad_state = !self.bad_state;
            }
            lost |= rng.chance(if self.bad_state {
                ge.loss_bad
            } else {
                ge.loss_good
            });
        }
        if lost {
            return Fate::Lost;
        }
        let jitter_nanos = c.jitter.as_nanos() as u64;
        let mut at = now + c.delay;
        if jitter_nanos > 0 {
            at += Duration::from_nanos(rng.below(jitter_nanos));
        }
        if rng.chance(c.reorder) {
            at += c.reorder_delay;
        } else if c.jitter.is_zero() {
            // Without jitter a link is FIFO.
            at = at.max(self.last_arrival);
        }
        self.last_arrival = self.last_arrival.max(at);
        let duplicate = rng.chance(c.duplicate).then_some(at);
        Fate::Arrives(at, duplicate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_tail_and_serialization_time() {
        let mut frames = crate::frame_pool::FramePool::new();
        let mut link = LinkDirection::new(LinkConfig::clean(100.0, Duration::from_millis(5), 2));
        for expect_ok in [true, true, false] {
            let frame = frames.insert(vec![0; 1514]);
            assert_eq!(link.enqueue(frame, 1514).is_ok(), expect_ok);
        }
        assert_eq!(
            link.config.transmission_time(1514),
            Duration::from_nanos(123_040)
        );
        assert_eq!(
            link.serialization_time(66),
            link.config.transmission_time(66)
        );
        assert_eq!(link.serialization_time(66), Duration::from_nanos(7_200));
        let mut rng = Rng::new(1);
        assert_eq!(
            link.fate(Instant::ZERO, &mut rng),
            Fate::Arrives(Instant::from_millis(5), None)
        );
    }

    #[test]
    fn burst_loss_clusters() {
        let mut config = LinkConfig::clean(100.0, Duration::ZERO, 10);
        config.burst_loss = Some(GilbertElliott {
            p_good_to_bad: 0.01,
            p_bad_to_good: 0.3,
            loss_good: 0.0,
            loss_bad: 1.0,
        });
        let mut link = LinkDirection::new(config);
        let mut rng = Rng::new(7);
        let fates: Vec<bool> = (0..100_000)
            .map(|_| link.fate(Instant::ZERO, &mut rng) == Fate::Lost)
            .collect();
        let losses = fates.iter().filter(|&&l| l).count();
        let runs = fates.windows(2).filter(|w| w[1] && !w[0]).count();
        // Stationary bad-state share ≈ 0.01 / 0.31 ≈ 3.2 %, mean burst ≈ 3.3 packets.
        assert!((2_500..4_000).contains(&losses), "{losses}");
        assert!(losses as f64 / runs as f64 > 2.5);
    }
}
