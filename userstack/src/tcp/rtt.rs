//! The retransmission timer's estimator (RFC 6298).

use core::time::Duration;

/// Clock granularity G of RFC 6298 section 2: our timestamps tick in milliseconds.
const GRANULARITY: Duration = Duration::from_millis(1);

/// SRTT, RTTVAR and the backed-off RTO of one connection.
#[derive(Clone, Copy, Debug)]
pub struct RttEstimator {
    srtt: Option<Duration>,
    rttvar: Duration,
    base_rto: Duration,
    backoff: u32,
    rto_min: Duration,
    rto_max: Duration,
}

impl RttEstimator {
    /// A fresh estimator whose RTO is `initial_rto` (RFC 6298 section 2.1).
    pub fn new(initial_rto: Duration, rto_min: Duration, rto_max: Duration) -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: Duration::ZERO,
            base_rto: initial_rto,
            backoff: 0,
            rto_min,
            rto_max,
        }
    }

    /// Folds in a measurement taken per Karn's rule or from a timestamp echo (RFC 6298 2.2-2.3).
    /// A valid sample also ends any backoff (RFC 6298 section 5, note on 5.7).
    pub fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let delta = srtt.abs_diff(rtt);
                self.rttvar = self.rttvar * 3 / 4 + delta / 4;
                self.srtt = Some(srtt * 7 / 8 + rtt / 8);
            }
        }
        let srtt = self.srtt.unwrap_or(rtt);
        self.base_rto = (srtt + GRANULARITY.max(self.rttvar * 4)).clamp(self.rto_min, self.rto_max);
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
        let factor = 1u32.checked_shl(self.backoff.min(31)).unwrap_or(u32::MAX);
        self.base_rto.saturating_mul(factor).min(self.rto_max)
    }

    /// Smoothed RTT, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// RTT variation.
    pub fn rttvar(&self) -> Duration {
        self.rttvar
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
        est.sample(Duration::from_millis(10));
        assert_eq!(est.backoff_count(), 0);
        assert_eq!(est.rto(), Duration::from_millis(200));
    }
}
