//! RACK loss detection (RFC 8985 section 6) as Linux runs it (net/ipv4/tcp_recovery.c): a
//! segment is lost when a segment sent after it has been delivered and more than the latest
//! round trip plus a reordering window has passed since it was sent. Time, not a count of
//! duplicate ACKs, decides; so packets a path reorders by a few positions are not resent.
//!
//! The reordering window is zero until the connection has seen reordering and while it has
//! enough SACKed segments to satisfy the duplicate-ACK rule (quick recovery where reordering
//! is not known to happen); once reordering is seen it is a quarter of the minimum RTT, and
//! it grows by that step in every round trip that brings a D-SACK (a retransmission that
//! proved spurious), up to SRTT, falling back to one step after 16 recoveries without one.

use crate::time::Instant;
use crate::wire::SeqNumber;
use core::time::Duration;

/// Recoveries without a D-SACK after which the window falls back to one step (Linux's
/// `TCP_RACK_RECOVERY_THRESH`).
const REO_WND_PERSIST: u32 = 16;

/// Largest reordering degree remembered, in segments (`net.ipv4.tcp_max_reordering` = 300).
const MAX_REORDERING: u32 = 300;

/// How long a minimum RTT sample stands before a larger one may replace it (Linux's
/// `net.ipv4.tcp_min_rtt_wlen` = 300 s). Linux keeps three candidates so that the minimum
/// steps down gradually when the window expires; one is enough for the paths we run on.
const MIN_RTT_WINDOW: Duration = Duration::from_secs(300);

/// One connection's RACK state.
#[derive(Clone, Copy, Debug)]
pub struct Rack {
    /// Send time and end of the most recently sent segment known delivered (RACK.xmit_ts,
    /// RACK.end_seq).
    latest: Option<(Instant, SeqNumber)>,
    /// The RTT of that segment (RACK.rtt).
    rtt: Duration,
    /// Windowed minimum RTT and when it was taken (RACK.min_RTT).
    min_rtt: Option<(Duration, Instant)>,
    /// Highest end of a segment SACKed (RACK.fack; Linux's highest SACKed sequence).
    fack: Option<SeqNumber>,
    /// Reordering was observed (RACK.reordering_seen).
    reordering_seen: bool,
    /// Observed reordering degree in segments (Linux's `tp->reordering`, initially
    /// `net.ipv4.tcp_reordering` = the duplicate-ACK threshold).
    reordering: u32,
    /// Reordering window in quarters of min_RTT (RACK.reo_wnd_mult).
    reo_wnd_mult: u32,
    /// Recoveries the grown window still lasts (RACK.reo_wnd_persist).
    reo_wnd_persist: u32,
    /// The window grew in the round that ends when SND.UNA passes this (RACK.dsack_round).
    dsack_round: Option<SeqNumber>,
}

impl Rack {
    /// RACK for a connection whose duplicate-ACK threshold is `dupthresh`.
    pub fn new(dupthresh: u32) -> Rack {
        Rack {
            latest: None,
            rtt: Duration::ZERO,
            min_rtt: None,
            fack: None,
            reordering_seen: false,
            reordering: dupthresh,
            reo_wnd_mult: 1,
            reo_wnd_persist: 0,
            dsack_round: None,
        }
    }

    /// Feeds an RTT sample (from timestamps or Karn's rule) to the minimum RTT.
    pub fn on_rtt_sample(&mut self, now: Instant, rtt: Duration) {
        let stale = |&(min, at): &(Duration, Instant)| rtt <= min || now - at > MIN_RTT_WINDOW;
        if self.min_rtt.as_ref().is_none_or(stale) {
            self.min_rtt = Some((rtt, now));
        }
    }

    /// A segment sent at `sent_at` and ending at `end` was (S)ACKed at `now` (RFC 8985
    /// step 2). A retransmitted segment delivered sooner than the minimum RTT was probably
    /// delivered by its original transmission, so it does not advance RACK.
    pub fn on_delivered(
        &mut self,
        now: Instant,
        sent_at: Instant,
        end: SeqNumber,
        retransmitted: bool,
    ) {
        let rtt = now - sent_at;
        if retransmitted && self.min_rtt.is_some_and(|(min, _)| rtt < min) {
            return;
        }
        if self
            .latest
            .is_none_or(|(at, seq)| sent_after(sent_at, end, at, seq))
        {
            self.latest = Some((sent_at, end));
            self.rtt = rtt;
        }
    }

    /// Records a newly SACKed segment ending at `end`; returns whether it shows reordering: it
    /// was never retransmitted and lies below a segment SACKed before it (RFC 8985 step 3).
    pub fn on_sacked(&mut self, end: SeqNumber, retransmitted: bool, mss: u32) -> bool {
        let reordered = !retransmitted && self.note_reordering(end, self.fack, mss);
        self.fack = Some(self.fack.map_or(end, |f| f.max(end)));
        reordered
    }

    /// Records a segment ending at `end` that a cumulative ACK delivered without it having
    /// been SACKed; `prior_fack` is RACK.fack before this ACK. Returns whether it shows
    /// reordering: it was never retransmitted and a segment above it had been SACKed.
    pub fn on_cumulatively_acked(
        &mut self,
        end: SeqNumber,
        retransmitted: bool,
        prior_fack: Option<SeqNumber>,
        mss: u32,
    ) -> bool {
        !retransmitted && self.note_reordering(end, prior_fack, mss)
    }

    /// RACK.fack: the highest end of a segment SACKed so far.
    pub fn fack(&self) -> Option<SeqNumber> {
        self.fack
    }

    /// A delivery ending at `end` below `fack` is reordering of degree (fack - end) / MSS
    /// (Linux's `tcp_check_sack_reordering`).
    fn note_reordering(&mut self, end: SeqNumber, fack: Option<SeqNumber>, mss: u32) -> bool {
        let Some(fack) = fack.filter(|&f| end < f) else {
            return false;
        };
        self.reordering_seen = true;
        let degree = fack.distance_from(end).div_ceil(mss.max(1));
        self.reordering = self.reordering.max(degree.min(MAX_REORDERING));
        true
    }

    /// Per-ACK window adaptation (RFC 8985 step 4): a D-SACK of a retransmission (not of a
    /// loss probe) on a connection that has seen reordering widens the window by one step,
    /// at most once per round trip.
    pub fn on_ack(&mut self, dsack: bool, snd_una: SeqNumber, snd_nxt: SeqNumber) {
        if self.dsack_round.is_some_and(|round| snd_una >= round) {
            self.dsack_round = None;
        }
        if dsack && self.reordering_seen && self.dsack_round.is_none() {
            self.dsack_round = Some(snd_nxt);
            self.reo_wnd_mult = self.reo_wnd_mult.saturating_add(1);
            self.reo_wnd_persist = REO_WND_PERSIST;
        }
    }

    /// A fast or timeout recovery ended: the widened window lasts 16 of them.
    pub fn on_recovery_end(&mut self) {
        self.reo_wnd_persist = self.reo_wnd_persist.saturating_sub(1);
        if self.reo_wnd_persist == 0 {
            self.reo_wnd_mult = 1;
        }
    }

    /// The reordering window (RFC 8985 section 6.2, Linux's `tcp_rack_reo_wnd`): zero before
    /// any reordering is seen when in recovery or when `sacked` segments already meet the
    /// reordering degree, else min_RTT/4 per step, at most SRTT.
    pub fn reo_wnd(&self, in_recovery: bool, sacked: u32, srtt: Duration) -> Duration {
        if !self.reordering_seen && (in_recovery || sacked >= self.reordering) {
            return Duration::ZERO;
        }
        let step = self.min_rtt.map_or(Duration::ZERO, |(min, _)| min / 4);
        step.saturating_mul(self.reo_wnd_mult).min(srtt)
    }

    /// When the segment sent at `sent_at` and ending at `end` counts as lost: RACK.rtt plus
    /// `reo_wnd` after it was sent, provided a segment sent after it was delivered; `None`
    /// while nothing sent after it is known delivered (RFC 8985 step 5).
    pub fn lost_at(&self, sent_at: Instant, end: SeqNumber, reo_wnd: Duration) -> Option<Instant> {
        let (latest_at, latest_end) = self.latest?;
        sent_after(latest_at, latest_end, sent_at, end).then(|| sent_at + self.rtt + reo_wnd)
    }
}

/// Whether a transmission at `t1` ending at `seq1` came after one at `t2` ending at `seq2`
/// (RFC 8985 RACK_sent_after: later, or at the same instant and higher in sequence).
fn sent_after(t1: Instant, seq1: SeqNumber, t2: Instant, seq2: SeqNumber) -> bool {
    t1 > t2 || (t1 == t2 && seq1 > seq2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSS: u32 = 1000;

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn rack_on_20ms_path() -> Rack {
        let mut rack = Rack::new(3);
        rack.on_rtt_sample(ms(20), Duration::from_millis(20));
        rack
    }

    #[test]
    fn a_segment_is_lost_an_rtt_plus_the_window_after_it_was_sent() {
        let mut rack = rack_on_20ms_path();
        // Nothing sent later is delivered yet: no verdict.
        assert_eq!(rack.lost_at(ms(0), SeqNumber(1000), Duration::ZERO), None);
        // The segment sent 1 ms later is delivered at 21 ms: RACK.rtt = 20 ms.
        rack.on_delivered(ms(21), ms(1), SeqNumber(2000), false);
        let window = Duration::from_millis(5);
        assert_eq!(rack.lost_at(ms(0), SeqNumber(1000), window), Some(ms(25)));
        // Same send time: the lower sequence counts as sent before.
        assert_eq!(rack.lost_at(ms(1), SeqNumber(1500), window), Some(ms(26)));
        assert_eq!(rack.lost_at(ms(1), SeqNumber(2000), window), None);
    }

    #[test]
    fn a_retransmission_delivered_faster_than_the_minimum_rtt_does_not_advance_rack() {
        let mut rack = rack_on_20ms_path();
        rack.on_delivered(ms(30), ms(10), SeqNumber(2000), false);
        // Retransmitted at 25 ms, ACKed at 30 ms: the original must have arrived.
        rack.on_delivered(ms(30), ms(25), SeqNumber(3000), true);
        assert_eq!(rack.lost_at(ms(20), SeqNumber(2500), Duration::ZERO), None);
    }

    #[test]
    fn the_window_is_zero_until_reordering_is_seen_then_a_quarter_of_min_rtt() {
        let mut rack = rack_on_20ms_path();
        let srtt = Duration::from_millis(25);
        assert_eq!(rack.reo_wnd(false, 1, srtt), Duration::from_millis(5));
        assert_eq!(rack.reo_wnd(false, 3, srtt), Duration::ZERO);
        assert_eq!(rack.reo_wnd(true, 0, srtt), Duration::ZERO);
        assert!(!rack.on_sacked(SeqNumber(5000), false, MSS));
        // A cumulative ACK delivers a segment below the SACKed one: reordering, degree 3.
        assert!(rack.on_cumulatively_acked(SeqNumber(2000), false, rack.fack(), MSS));
        assert!(rack.reordering_seen);
        assert_eq!(rack.reordering, 3);
        assert_eq!(rack.reo_wnd(true, 10, srtt), Duration::from_millis(5));
        // A SACK ten segments below the highest SACKed one: degree 10.
        assert!(!rack.on_sacked(SeqNumber(15_000), false, MSS));
        assert!(rack.on_sacked(SeqNumber(5_000), false, MSS));
        assert_eq!(rack.reordering, 10);
        // A retransmitted segment below fack is no evidence.
        assert!(!rack.on_sacked(SeqNumber(4_000), true, MSS));
    }

    #[test]
    fn d_sacks_widen_the_window_once_per_round_until_16_recoveries_pass() {
        let mut rack = rack_on_20ms_path();
        let srtt = Duration::from_millis(40);
        // Without reordering seen a D-SACK does not widen the window (Linux).
        rack.on_ack(true, SeqNumber(0), SeqNumber(10_000));
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_millis(5));
        rack.on_sacked(SeqNumber(9_000), false, MSS);
        rack.on_sacked(SeqNumber(8_000), false, MSS);
        rack.on_ack(true, SeqNumber(0), SeqNumber(10_000));
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_millis(10));
        // A second D-SACK in the same round does not count.
        rack.on_ack(true, SeqNumber(5_000), SeqNumber(12_000));
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_millis(10));
        // The next round's D-SACK does; the window never exceeds SRTT.
        for round in 1..=10u32 {
            rack.on_ack(
                true,
                SeqNumber(10_000 * round),
                SeqNumber(10_000 * (round + 1)),
            );
        }
        assert_eq!(rack.reo_wnd(false, 0, srtt), srtt);
        for _ in 0..15 {
            rack.on_recovery_end();
        }
        assert_eq!(rack.reo_wnd(false, 0, srtt), srtt);
        rack.on_recovery_end();
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_millis(5));
    }

    #[test]
    fn the_minimum_rtt_expires_after_its_window() {
        let mut rack = Rack::new(3);
        rack.on_rtt_sample(ms(0), Duration::from_millis(10));
        rack.on_rtt_sample(ms(1000), Duration::from_millis(30));
        rack.reordering_seen = true;
        let srtt = Duration::from_secs(1);
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_micros(2500));
        rack.on_rtt_sample(ms(301_000), Duration::from_millis(40));
        assert_eq!(rack.reo_wnd(false, 0, srtt), Duration::from_millis(10));
    }
}
