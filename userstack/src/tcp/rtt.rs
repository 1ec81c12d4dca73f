//! The retransmission timer's estimator as Linux computes it (net/ipv4/tcp_input.c
//! `tcp_rtt_estimator`, `tcp_set_rto`), kept in integer nanoseconds.
//!
//! RFC 6298's SRTT with gain 1/8 is kept, but the variance term follows Linux: the mean
//! deviation `mdev` falls eight times more slowly when a sample is *below* SRTT by more than
//! `mdev` (a falling RTT should not lengthen the timer), the largest `mdev` of each round trip
//! (`mdev_max`, at least `rto_min`) feeds `rttvar`, `rttvar` decays towards it once per round
//! trip, and RTO = SRTT + `rttvar`. So `rto_min` is a floor on the variance term, not on the
//! RTO: on a steady 20 ms path the RTO is 220 ms, where RFC 6298 gives max(SRTT + 4·RTTVAR,
//! `rto_min`) = 200 ms. The RTO is bounded by `rto_max` (Linux `TCP_RTO_MAX`).

use crate::wire::SeqNumber;
use core::time::Duration;

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// SRTT, the deviation terms and the backed-off RTO of one connection.
#[derive(Clone, Copy, Debug)]
pub struct RttEstimator {
    /// 8·SRTT in nanoseconds, 0 until the first sample.
    srtt8_ns: i64,
    /// 4·mdev: the smoothed mean deviation, scaled as the variance term of the RTO.
    mdev4_ns: i64,
    /// The largest `mdev4_ns` seen in the current round trip, at least `rto_min`.
    mdev_max_ns: i64,
    /// The variance term the RTO adds to SRTT, at least `rto_min`.
    rttvar_ns: i64,
    /// The round trip ends when `snd_una` passes this (`snd_nxt` when it began).
    rtt_seq: SeqNumber,
    base_rto_ns: i64,
    backoff: u32,
    rto_min_ns: i64,
    rto_max_ns: i64,
}

impl RttEstimator {
    /// A fresh estimator whose RTO is `initial_rto` (RFC 6298 section 2.1).
    pub fn new(initial_rto: Duration, rto_min: Duration, rto_max: Duration) -> RttEstimator {
        RttEstimator {
            srtt8_ns: 0,
            mdev4_ns: 0,
            mdev_max_ns: 0,
            rttvar_ns: 0,
            rtt_seq: SeqNumber::default(),
            base_rto_ns: nanos(initial_rto),
            backoff: 0,
            rto_min_ns: nanos(rto_min),
            rto_max_ns: nanos(rto_max),
        }
    }

    /// Folds in a measurement taken per Karn's rule or from a timestamp echo, with `snd_una`
    /// (after this ACK) and `snd_nxt` marking round trips. A valid sample also ends any
    /// backoff (RFC 6298 section 5, note on 5.7).
    pub fn sample(&mut self, rtt: Duration, snd_una: SeqNumber, snd_nxt: SeqNumber) {
        // A zero SRTT means "no sample yet"; a measured zero is recorded as 1 ns.
        let m = nanos(rtt).max(1);
        if self.srtt8_ns == 0 {
            // First sample: SRTT = R, mdev = R/2, so the RTO is 3·R unless rto_min dominates.
            self.srtt8_ns = m.saturating_mul(8);
            self.mdev4_ns = m.saturating_mul(2);
            self.rttvar_ns = self.mdev4_ns.max(self.rto_min_ns);
            self.mdev_max_ns = self.rttvar_ns;
            self.rtt_seq = snd_nxt;
        } else {
            let error = m - self.srtt8_ns / 8;
            self.srtt8_ns = (self.srtt8_ns + error).max(1);
            let beyond_mdev = error.abs() - self.mdev4_ns / 4;
            // A sample below SRTT by more than mdev raises mdev with gain 1/32, not 1/4.
            let mdev_step = if error < 0 && beyond_mdev > 0 {
                beyond_mdev / 8
            } else {
                beyond_mdev
            };
            self.mdev4_ns += mdev_step;
            if self.mdev4_ns > self.mdev_max_ns {
                self.mdev_max_ns = self.mdev4_ns;
                self.rttvar_ns = self.rttvar_ns.max(self.mdev_max_ns);
            }
            if snd_una > self.rtt_seq {
                // A round trip ended: rttvar decays a quarter of the way to its largest mdev.
                if self.mdev_max_ns < self.rttvar_ns {
                    self.rttvar_ns -= (self.rttvar_ns - self.mdev_max_ns) / 4;
                }
                self.rtt_seq = snd_nxt;
                self.mdev_max_ns = self.rto_min_ns;
            }
        }
        self.base_rto_ns = (self.srtt8_ns / 8)
            .saturating_add(self.rttvar_ns)
            .min(self.rto_max_ns);
        self.backoff = 0;
    }

    /// Doubles the RTO after a timeout (RFC 6298 section 5.5).
    pub fn back_off(&mut self) {
        self.backoff = self.backoff.saturating_add(1);
    }

    /// Number of consecutive backoffs.
    pub fn backoff_count(&self) -> u32 {
        self.backoff
    }

    /// The current RTO including backoff, bounded by the configured maximum.
    pub fn rto(&self) -> Duration {
        let shift = self.backoff.min(62);
        let backed_off = self
            .base_rto_ns
            .checked_shl(shift)
            .filter(|v| v >> shift == self.base_rto_ns);
        let bounded = backed_off.unwrap_or(i64::MAX).min(self.rto_max_ns);
        Duration::from_nanos(u64::try_from(bounded).unwrap_or(0))
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        (self.srtt8_ns > 0).then(|| Duration::from_nanos((self.srtt8_ns / 8) as u64))
    }

    /// The variance term the RTO adds to SRTT (Linux's `rttvar`, at least `rto_min`).
    pub fn rttvar(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.rttvar_ns).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn linux_defaults() -> RttEstimator {
        RttEstimator::new(ms(1000), ms(200), ms(120_000))
    }

    /// Feeds `count` samples of `rtt`, one round trip each (snd_una passes the mark every time).
    fn steady(est: &mut RttEstimator, rtt: Duration, count: u32, seq: &mut SeqNumber) {
        for _ in 0..count {
            *seq = *seq + 1000;
            est.sample(rtt, *seq, *seq + 1000);
        }
    }

    #[test]
    fn first_sample_sets_srtt_and_rto_min_floors_the_variance() {
        let mut est = linux_defaults();
        assert_eq!(est.rto(), ms(1000));
        assert_eq!(est.srtt(), None);
        // mdev = R/2 gives 4·mdev = 2R; below rto_min, rttvar is rto_min.
        est.sample(ms(20), SeqNumber(1), SeqNumber(1));
        assert_eq!(est.srtt(), Some(ms(20)));
        assert_eq!(est.rttvar(), ms(200));
        assert_eq!(est.rto(), ms(220));
        // Above rto_min the first RTO is 3·R.
        let mut slow = linux_defaults();
        slow.sample(ms(300), SeqNumber(1), SeqNumber(1));
        assert_eq!(slow.rto(), ms(900));
    }

    #[test]
    fn steady_20ms_path_keeps_linux_rto_of_srtt_plus_rto_min() {
        // RFC 6298 with rto_min as a floor on the RTO gives 200 ms here; Linux 220 ms.
        let mut est = linux_defaults();
        let mut seq = SeqNumber(1);
        steady(&mut est, ms(20), 50, &mut seq);
        assert_eq!(est.srtt(), Some(ms(20)));
        assert_eq!(est.rto(), ms(220));
    }

    #[test]
    fn a_falling_rtt_barely_raises_the_variance() {
        // Steady 100 ms: 4·mdev starts at 200 ms and decays by a quarter per sample, so after
        // 20 samples it is far below rto_min and rttvar has decayed back to rto_min.
        let mut est = linux_defaults();
        let mut seq = SeqNumber(1);
        steady(&mut est, ms(100), 20, &mut seq);
        assert_eq!(est.rto(), ms(300));
        let mdev4_before = est.mdev4_ns;
        assert!(mdev4_before < nanos(ms(1)), "{mdev4_before} ns");
        // One sample 80 ms below SRTT: SRTT falls by 10 ms, 4·mdev rises by only
        // (80 ms - mdev)/8 (gain 1/32 on mdev), far below rto_min, so the RTO falls by 10 ms.
        seq = seq + 1000;
        est.sample(ms(20), seq, seq + 1000);
        assert_eq!(est.srtt(), Some(ms(90)));
        assert_eq!(
            est.mdev4_ns - mdev4_before,
            (nanos(ms(80)) - mdev4_before / 4) / 8
        );
        assert_eq!(est.rto(), ms(290));
        // The same error above SRTT raises 4·mdev by the full (80 ms - mdev): the RTO grows.
        let mut rising = linux_defaults();
        let mut seq = SeqNumber(1);
        steady(&mut rising, ms(100), 20, &mut seq);
        seq = seq + 1000;
        rising.sample(ms(180), seq, seq + 1000);
        assert_eq!(rising.srtt(), Some(ms(110)));
        assert_eq!(
            rising.mdev4_ns,
            mdev4_before + nanos(ms(80)) - mdev4_before / 4
        );
        assert_eq!(rising.rttvar_ns, rising.rto_min_ns.max(rising.mdev4_ns));
        assert_eq!(rising.rto(), ms(310));
    }

    #[test]
    fn rttvar_decays_to_the_largest_mdev_once_per_round_trip() {
        // A spike lifts rttvar above rto_min; while mdev stays that large, and within a round
        // trip, rttvar holds; each later round trip takes a quarter of its excess over that
        // round trip's largest mdev away.
        let mut est = linux_defaults();
        est.sample(ms(100), SeqNumber(1), SeqNumber(1000));
        est.sample(ms(500), SeqNumber(1), SeqNumber(1000));
        let spiked = est.rttvar();
        assert!(spiked > ms(200), "{spiked:?}");
        est.sample(ms(150), SeqNumber(500), SeqNumber(1000));
        assert_eq!(est.rttvar(), spiked, "same round trip: no decay");
        est.sample(ms(150), SeqNumber(1001), SeqNumber(2000));
        assert_eq!(
            est.rttvar(),
            spiked,
            "the round trip's largest mdev was the spike"
        );
        assert_eq!(
            est.mdev_max_ns,
            nanos(ms(200)),
            "a new round trip starts at rto_min"
        );
        est.sample(ms(150), SeqNumber(1500), SeqNumber(2000));
        let mdev_max = est.mdev_max_ns;
        assert!(mdev_max > nanos(ms(200)), "{mdev_max} ns");
        est.sample(ms(150), SeqNumber(2001), SeqNumber(3000));
        let expected = nanos(spiked) - (nanos(spiked) - mdev_max) / 4;
        assert_eq!(est.rttvar_ns, expected);
        assert_eq!(
            est.rto(),
            Duration::from_nanos((150_000_000 + expected) as u64)
        );
    }

    #[test]
    fn backoff_doubles_until_max_and_sample_resets() {
        let mut est = RttEstimator::new(ms(1000), ms(200), ms(5000));
        est.back_off();
        assert_eq!(est.rto(), ms(2000));
        est.back_off();
        est.back_off();
        assert_eq!(est.rto(), ms(5000));
        for _ in 0..100 {
            est.back_off();
        }
        assert_eq!(est.rto(), ms(5000));
        est.sample(ms(10), SeqNumber(1), SeqNumber(1));
        assert_eq!(est.backoff_count(), 0);
        assert_eq!(est.rto(), ms(210));
    }

    #[test]
    fn rto_is_bounded_by_rto_max() {
        let mut est = RttEstimator::new(ms(1000), ms(200), ms(120_000));
        est.sample(ms(60_000), SeqNumber(1), SeqNumber(1));
        assert_eq!(est.rto(), ms(120_000));
    }
}
