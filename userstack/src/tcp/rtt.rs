//! The retransmission timer's estimator (RFC 6298), kept in integer nanoseconds.

use core::time::Duration;

/// Clock granularity G of RFC 6298 section 2: our timestamps tick in milliseconds.
const GRANULARITY_NS: u64 = 1_000_000;

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// SRTT, RTTVAR and the backed-off RTO of one connection.
#[derive(Clone, Copy, Debug)]
pub struct RttEstimator {
    /// SRTT in nanoseconds, 0 until the first sample.
    srtt_ns: u64,
    rttvar_ns: u64,
    base_rto_ns: u64,
    backoff: u32,
    rto_min_ns: u64,
    rto_max_ns: u64,
}

impl RttEstimator {
    /// A fresh estimator whose RTO is `initial_rto` (RFC 6298 section 2.1).
    pub fn new(initial_rto: Duration, rto_min: Duration, rto_max: Duration) -> RttEstimator {
        RttEstimator {
            srtt_ns: 0,
            rttvar_ns: 0,
            base_rto_ns: nanos(initial_rto),
            backoff: 0,
            rto_min_ns: nanos(rto_min),
            rto_max_ns: nanos(rto_max),
        }
    }

    /// Folds in a measurement taken per Karn's rule or from a timestamp echo (RFC 6298 2.2-2.3).
    /// A valid sample also ends any backoff (RFC 6298 section 5, note on 5.7).
    pub fn sample(&mut self, rtt: Duration) {
        // A zero SRTT means "no sample yet"; a measured zero is recorded as 1 ns.
        let r = nanos(rtt).max(1);
        if self.srtt_ns == 0 {
            self.srtt_ns = r;
            self.rttvar_ns = r / 2;
        } else {
            let delta = self.srtt_ns.abs_diff(r);
            self.rttvar_ns = self.rttvar_ns - self.rttvar_ns / 4 + delta / 4;
            self.srtt_ns = self.srtt_ns - self.srtt_ns / 8 + r / 8;
        }
        let rto = self
            .srtt_ns
            .saturating_add(GRANULARITY_NS.max(self.rttvar_ns.saturating_mul(4)));
        self.base_rto_ns = rto.clamp(self.rto_min_ns, self.rto_max_ns.max(self.rto_min_ns));
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
        let backed_off = self
            .base_rto_ns
            .checked_shl(self.backoff.min(63))
            .filter(|v| v >> self.backoff.min(63) == self.base_rto_ns);
        Duration::from_nanos(backed_off.unwrap_or(u64::MAX).min(self.rto_max_ns))
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        (self.srtt_ns > 0).then(|| Duration::from_nanos(self.srtt_ns))
    }

    /// RTT variation.
    pub fn rttvar(&self) -> Duration {
        Duration::from_nanos(self.rttvar_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc6298_first_and_later_samples() {
        let mut est = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(120),
        );
        assert_eq!(est.rto(), Duration::from_secs(1));
        assert_eq!(est.srtt(), None);
        est.sample(Duration::from_millis(100));
        assert_eq!(est.srtt(), Some(Duration::from_millis(100)));
        assert_eq!(est.rttvar(), Duration::from_millis(50));
        assert_eq!(est.rto(), Duration::from_millis(300));
        est.sample(Duration::from_millis(100));
        assert_eq!(est.rttvar(), Duration::from_micros(37_500));
        assert_eq!(est.rto(), Duration::from_millis(250));
    }

    #[test]
    fn backoff_doubles_until_max_and_sample_resets() {
        let mut est = RttEstimator::new(
            Duration::from_secs(1),
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        est.back_off();
        assert_eq!(est.rto(), Duration::from_secs(2));
        est.back_off();
        est.back_off();
        assert_eq!(est.rto(), Duration::from_secs(5));
        for _ in 0..100 {
            est.back_off();
        }
        assert_eq!(est.rto(), Duration::from_secs(5));
        est.sample(Duration::from_millis(10));
        assert_eq!(est.backoff_count(), 0);
        assert_eq!(est.rto(), Duration::from_millis(200));
    }
}
