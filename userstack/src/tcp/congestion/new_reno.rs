//! NewReno window arithmetic (RFC 5681 section 3.1 with appropriate byte counting, RFC 3465).

use super::CongestionControl;
use crate::time::Instant;
use core::time::Duration;

/// RFC 5681 slow start and congestion avoidance.
#[derive(Debug, Clone)]
pub struct NewReno {
    mss: u32,
    cwnd: u32,
    ssthresh: u32,
    bytes_acked: u32,
    prior: Option<(u32, u32)>,
}

impl NewReno {
    /// A controller with cwnd = `initial_window` segments and ssthresh at infinity.
    pub fn new(mss: u32, initial_window: u32) -> NewReno {
        NewReno {
            mss,
            cwnd: mss * initial_window,
            ssthresh: u32::MAX,
            bytes_acked: 0,
            prior: None,
        }
    }

    fn reduce(&mut self, flight_size: u32) {
        self.prior = Some((self.cwnd, self.ssthresh));
        // RFC 5681 equation 4: ssthresh = max(FlightSize / 2, 2*SMSS).
        self.ssthresh = (flight_size / 2).max(2 * self.mss);
        self.bytes_acked = 0;
    }
}

impl CongestionControl for NewReno {
    fn cwnd(&self) -> u32 {
        self.cwnd
    }

    fn ssthresh(&self) -> u32 {
        self.ssthresh
    }

    fn on_ack(&mut self, _now: Instant, acked: u32, _srtt: Duration, cwnd_limited: bool) {
        if !cwnd_limited {
            return;
        }
        let mut acked = acked;
        if self.cwnd < self.ssthresh {
            // Slow start stops at ssthresh; the rest of the ACK counts toward avoidance
            // (Linux tcp_slow_start and tcp_reno_cong_avoid).
            let grown = self.cwnd.saturating_add(acked).min(self.ssthresh);
            acked -= grown - self.cwnd;
            self.cwnd = grown;
            if acked == 0 {
                return;
            }
        }
        self.bytes_acked = self.bytes_acked.saturating_add(acked);
        if self.bytes_acked >= self.cwnd {
            self.bytes_acked -= self.cwnd;
            self.cwnd = self.cwnd.saturating_add(self.mss);
        }
    }

    fn on_congestion_event(&mut self, _now: Instant, flight_size: u32) {
        self.reduce(flight_size);
        self.cwnd = self.ssthresh;
    }

    fn on_retransmission_timeout(&mut self, _now: Instant, flight_size: u32) {
        self.reduce(flight_size);
        self.cwnd = self.mss;
    }

    fn undo(&mut self) {
        if let Some((cwnd, ssthresh)) = self.prior.take() {
            self.cwnd = self.cwnd.max(cwnd);
            self.ssthresh = ssthresh;
        }
    }

    fn exit_slow_start(&mut self) {
        self.ssthresh = self.cwnd;
    }

    fn set_cwnd(&mut self, cwnd: u32) {
        self.cwnd = cwnd.max(self.mss);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_then_avoidance_then_loss() {
        let mut cc = NewReno::new(1000, 10);
        assert_eq!(cc.ssthresh(), u32::MAX);
        cc.on_ack(Instant::ZERO, 2000, Duration::ZERO, true);
        assert_eq!(cc.cwnd(), 12_000);
        cc.on_ack(Instant::ZERO, 2000, Duration::ZERO, false);
        assert_eq!(cc.cwnd(), 12_000);
        cc.on_congestion_event(Instant::ZERO, 12_000);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (6000, 6000));
        for _ in 0..6 {
            cc.on_ack(Instant::ZERO, 1000, Duration::ZERO, true);
        }
        assert_eq!(cc.cwnd(), 7000);
        cc.undo();
        assert_eq!((cc.cwnd(), cc.ssthresh()), (12_000, u32::MAX));
        cc.on_retransmission_timeout(Instant::ZERO, 10_000);
        assert_eq!((cc.cwnd(), cc.ssthresh()), (1000, 5000));
    }
}
