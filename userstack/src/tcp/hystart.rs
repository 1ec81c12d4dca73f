//! HyStart++ (RFC 9406): leave the initial slow start when the RTT starts to climb, before the
//! queue overflows, instead of after a burst of losses.

use crate::wire::SeqNumber;
use core::time::Duration;

/// RFC 9406 section 4.3 constants.
const MIN_RTT_THRESH: Duration = Duration::from_millis(4);
const MAX_RTT_THRESH: Duration = Duration::from_millis(16);
const MIN_RTT_DIVISOR: u32 = 8;
const N_RTT_SAMPLE: u32 = 8;
const CSS_GROWTH_DIVISOR: u32 = 4;
const CSS_ROUNDS: u32 = 5;
/// Cap on slow-start growth per ACK for a non-paced sender, in segments.
const L: u32 = 8;

/// How the congestion window may grow on this ACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Growth {
    /// Standard slow start (bytes acknowledged, capped at L segments).
    SlowStart(u32),
    /// Conservative slow start: a quarter of that.
    Conservative(u32),
    /// Conservative slow start is over: set ssthresh to cwnd and enter avoidance.
    ExitSlowStart,
    /// HyStart++ no longer applies; grow as the controller sees fit.
    Unchanged,
}

/// Per-connection HyStart++ state, used in the initial slow start only.
#[derive(Clone, Copy, Debug)]
pub struct HyStart {
    active: bool,
    window_end: Option<SeqNumber>,
    last_round_min_rtt: Option<Duration>,
    current_round_min_rtt: Option<Duration>,
    rtt_samples: u32,
    css_baseline_min_rtt: Option<Duration>,
    css_rounds: u32,
}

impl HyStart {
    /// State for a new connection; `enabled` false makes every ACK `Unchanged`.
    pub fn new(enabled: bool) -> HyStart {
        HyStart {
            active: enabled,
            window_end: None,
            last_round_min_rtt: None,
            current_round_min_rtt: None,
            rtt_samples: 0,
            css_baseline_min_rtt: None,
            css_rounds: 0,
        }
    }

    /// Any congestion event ends the initial slow start and with it HyStart++.
    pub fn stop(&mut self) {
        self.active = false;
    }

    /// Processes an ACK of `acked` new bytes in slow start (RFC 9406 section 4.2). `snd_nxt`
    /// marks the end of the next round; `rtt` is this ACK's RTT sample, if any.
    pub fn on_ack(
        &mut self,
        ack: SeqNumber,
        snd_nxt: SeqNumber,
        acked: u32,
        mss: u32,
        rtt: Option<Duration>,
    ) -> Growth {
        if !self.active {
            return Growth::Unchanged;
        }
        // Round bookkeeping: a round ends when its last segment is acknowledged.
        let round_ended = self.window_end.is_none_or(|end| ack >= end);
        if round_ended {
            self.window_end = Some(snd_nxt);
            self.last_round_min_rtt = self.current_round_min_rtt;
            self.current_round_min_rtt = None;
            self.rtt_samples = 0;
            if self.css_baseline_min_rtt.is_some() {
                self.css_rounds += 1;
                if self.css_rounds >= CSS_ROUNDS {
                    self.active = false;
                    return Growth::ExitSlowStart;
                }
            }
        }
        if let Some(rtt) = rtt {
            self.current_round_min_rtt =
                Some(self.current_round_min_rtt.map_or(rtt, |m| m.min(rtt)));
            self.rtt_samples += 1;
        }
        let capped = acked.min(L * mss);
        match self.css_baseline_min_rtt {
            None => {
                if let (true, Some(current), Some(last)) = (
                    self.rtt_samples >= N_RTT_SAMPLE,
                    self.current_round_min_rtt,
                    self.last_round_min_rtt,
                ) {
                    let threshold = (last / MIN_RTT_DIVISOR).clamp(MIN_RTT_THRESH, MAX_RTT_THRESH);
                    if current >= last + threshold {
                        self.css_baseline_min_rtt = Some(current);
                        self.css_rounds = 0;
                        return Growth::Conservative(capped / CSS_GROWTH_DIVISOR);
                    }
                }
                Growth::SlowStart(capped)
            }
            Some(baseline) => {
                if self.rtt_samples >= N_RTT_SAMPLE
                    && self.current_round_min_rtt.is_some_and(|c| c < baseline)
                {
                    // The RTT increase was spurious: back to slow start.
                    self.css_baseline_min_rtt = None;
                    return Growth::SlowStart(capped);
                }
                Growth::Conservative(capped / CSS_GROWTH_DIVISOR)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rising_rtt_enters_css_then_exits_after_five_rounds() {
        let mut h = HyStart::new(true);
        let mss = 1000;
        let mut ack = SeqNumber(0);
        let mut snd_nxt = SeqNumber(10_000);
        // Round 1: RTT 20 ms.
        for _ in 0..10 {
            ack = ack + 1000;
            assert_eq!(
                h.on_ack(ack, snd_nxt, 1000, mss, Some(ms(20))),
                Growth::SlowStart(1000)
            );
        }
        // Round 2: RTT 30 ms (> 20 + max(20/8, 4) ms) after eight samples: conservative.
        snd_nxt = snd_nxt + 20_000;
        let mut growth = Vec::new();
        for _ in 0..10 {
            ack = ack + 1000;
            growth.push(h.on_ack(ack, snd_nxt, 1000, mss, Some(ms(30))));
        }
        assert!(growth.contains(&Growth::Conservative(250)));
        // Five more rounds in CSS end slow start.
        let mut exited = false;
        for _ in 0..6 {
            snd_nxt = snd_nxt + 20_000;
            for _ in 0..20 {
                ack = ack + 1000;
                if h.on_ack(ack, snd_nxt, 1000, mss, Some(ms(30))) == Growth::ExitSlowStart {
                    exited = true;
                }
            }
        }
        assert!(exited);
        assert_eq!(
            h.on_ack(ack + 1000, snd_nxt, 1000, mss, Some(ms(30))),
            Growth::Unchanged
        );
    }

    #[test]
    fn disabled_or_stopped_changes_nothing() {
        let mut h = HyStart::new(false);
        assert_eq!(
            h.on_ack(SeqNumber(1), SeqNumber(2), 1000, 1000, None),
            Growth::Unchanged
        );
        let mut h = HyStart::new(true);
        h.stop();
        assert_eq!(
            h.on_ack(SeqNumber(1), SeqNumber(2), 1000, 1000, None),
            Growth::Unchanged
        );
    }

    #[test]
    fn growth_is_capped_at_l_segments() {
        let mut h = HyStart::new(true);
        assert_eq!(
            h.on_ack(SeqNumber(100_000), SeqNumber(200_000), 50_000, 1000, None),
            Growth::SlowStart(8000)
        );
    }
}
