//! The sender's record of segments in flight: what was sent when, what the peer SACKed, what
//! is deemed lost and what has been retransmitted (RFC 6675 section 3's scoreboard).

use crate::time::Instant;
use crate::wire::SeqNumber;
use std::collections::VecDeque;

/// One transmitted segment, from SND.UNA upward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SentSegment {
    /// First sequence number.
    pub start: SeqNumber,
    /// One past the last sequence number (a FIN counts as one).
    pub end: SeqNumber,
    /// Whether the segment carries our FIN.
    pub fin: bool,
    /// When it was last (re)transmitted.
    pub sent_at: Instant,
    /// Whether it was ever retransmitted (Karn's rule excludes it from RTT samples).
    pub retransmitted: bool,
    /// The peer SACKed it.
    pub sacked: bool,
    /// Deemed lost (RFC 6675 IsLost, or marked by an RTO or a NewReno partial ACK).
    pub lost: bool,
    /// A retransmission is in flight (counts toward the pipe, RFC 6675 SetPipe).
    pub retransmit_in_flight: bool,
}

impl SentSegment {
    /// Sequence space length.
    pub fn len(&self) -> u32 {
        self.end.distance_from(self.start)
    }

    /// Whether the segment occupies no sequence space (never stored).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a cumulative ACK removed from the scoreboard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckedSegments {
    /// Send time of the newest fully acknowledged segment never retransmitted (Karn's rule).
    pub rtt_sent_at: Option<Instant>,
    /// Segments fully acknowledged.
    pub segments: u32,
}

/// Outcome of applying one SACK block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SackUpdate {
    /// Segments newly marked SACKed.
    pub newly_sacked: u32,
    /// Bytes newly marked SACKed.
    pub newly_sacked_bytes: u32,
}

/// What loss detection found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectedLosses {
    /// Original transmissions newly deemed lost.
    pub newly_lost: u32,
    /// Retransmissions deemed lost again.
    pub lost_retransmissions: u32,
    /// When the last segment still waiting out its reordering window will be due
    /// (RFC 8985's reordering timer), if any is.
    pub pending_until: Option<Instant>,
}

/// The sent-segment queue, ordered by sequence number.
#[derive(Debug, Clone, Default)]
pub struct Scoreboard {
    segments: VecDeque<SentSegment>,
}

impl Scoreboard {
    /// An empty scoreboard.
    pub fn new() -> Scoreboard {
        Scoreboard {
            segments: VecDeque::new(),
        }
    }

    /// Number of segments in flight or awaiting acknowledgment.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The segment at `index` (0 is the oldest).
    pub fn get(&self, index: usize) -> Option<&SentSegment> {
        self.segments.get(index)
    }

    /// Records a new transmission of fresh data.
    pub fn push(&mut self, segment: SentSegment) {
        self.segments.push_back(segment);
    }

    /// Removes everything below `ack` (a partially acknowledged segment is trimmed), showing
    /// each wholly acknowledged segment to `on_acked` first.
    pub fn acknowledge(
        &mut self,
        ack: SeqNumber,
        mut on_acked: impl FnMut(&SentSegment),
    ) -> AckedSegments {
        let mut result = AckedSegments::default();
        while let Some(front) = self.segments.front_mut() {
            if front.end <= ack {
                on_acked(front);
                if !front.retransmitted {
                    result.rtt_sent_at = Some(front.sent_at);
                }
                result.segments += 1;
                self.segments.pop_front();
            } else {
                if front.start < ack {
                    front.start = ack;
                }
                break;
            }
        }
        result
    }

    /// Marks segments wholly inside `[left, right)` as SACKed (RFC 2018 section 5), showing
    /// each newly SACKed segment to `on_sacked`, in sequence order.
    pub fn sack(
        &mut self,
        left: SeqNumber,
        right: SeqNumber,
        mut on_sacked: impl FnMut(&SentSegment),
    ) -> SackUpdate {
        let mut update = SackUpdate::default();
        let first = self.segments.partition_point(|s| s.end <= left);
        for segment in self.segments.range_mut(first..) {
            if segment.start >= right {
                break;
            }
            if segment.start >= left && segment.end <= right && !segment.sacked {
                segment.sacked = true;
                segment.lost = false;
                segment.retransmit_in_flight = false;
                update.newly_sacked += 1;
                update.newly_sacked_bytes += segment.len();
                on_sacked(segment);
            }
        }
        update
    }

    /// Marks segments lost by time (RACK, RFC 8985 step 5): `lost_at` says when a segment
    /// counts as lost, or `None` while nothing sent after it is known delivered. A segment
    /// marked lost and not yet resent is skipped; a retransmission in flight can be lost again.
    pub fn detect_losses(
        &mut self,
        now: Instant,
        lost_at: impl Fn(&SentSegment) -> Option<Instant>,
    ) -> DetectedLosses {
        let mut found = DetectedLosses::default();
        for segment in &mut self.segments {
            if segment.sacked || (segment.lost && !segment.retransmit_in_flight) {
                continue;
            }
            let Some(due) = lost_at(segment) else {
                continue;
            };
            if due > now {
                found.pending_until = found.pending_until.max(Some(due));
            } else if segment.retransmit_in_flight {
                segment.retransmit_in_flight = false;
                segment.lost = true;
                found.lost_retransmissions += 1;
            } else {
                segment.lost = true;
                found.newly_lost += 1;
            }
        }
        found
    }

    /// Whether any outstanding segment was ever retransmitted.
    pub fn any_retransmitted(&self) -> bool {
        self.segments.iter().any(|s| s.retransmitted)
    }

    /// Whether a retransmission is in flight (Linux's `retrans_out` > 0).
    pub fn any_retransmit_in_flight(&self) -> bool {
        self.segments.iter().any(|s| s.retransmit_in_flight)
    }

    /// Segments the peer has SACKed (RACK's segs_sacked).
    pub fn sacked_segments(&self) -> u32 {
        self.segments.iter().filter(|s| s.sacked).count() as u32
    }

    /// Marks the oldest segment lost (fast retransmit without SACK, and NewReno partial ACKs).
    pub fn mark_first_lost(&mut self) {
        if let Some(first) = self.segments.front_mut() {
            if !first.sacked {
                first.lost = true;
                first.retransmit_in_flight = false;
            }
        }
    }

    /// After an RTO every un-SACKed segment is deemed lost (RFC 6675 section 5.1 / RFC 5681).
    pub fn mark_all_lost(&mut self) {
        for segment in &mut self.segments {
            if !segment.sacked {
                segment.lost = true;
                segment.retransmit_in_flight = false;
            }
        }
    }

    /// Clears every loss mark (an episode was undone, Linux's `tcp_undo_cwnd_reduction`):
    /// segments not yet resent count as in flight again, and RACK judges them anew.
    pub fn unmark_lost(&mut self) {
        for segment in &mut self.segments {
            segment.lost = false;
        }
    }

    /// Forgets all SACK information (the peer reneged, RFC 2018 section 8).
    pub fn clear_sacks(&mut self) {
        for segment in &mut self.segments {
            segment.sacked = false;
        }
    }

    /// Index of the first segment deemed lost and not yet retransmitted (RFC 6675 NextSeg rule 1).
    pub fn next_lost(&self) -> Option<usize> {
        self.segments
            .iter()
            .position(|s| s.lost && !s.sacked && !s.retransmit_in_flight)
    }

    /// Records the retransmission of segment `index` at `now`.
    pub fn mark_retransmitted(&mut self, index: usize, now: Instant) {
        if let Some(segment) = self.segments.get_mut(index) {
            segment.retransmitted = true;
            segment.retransmit_in_flight = true;
            segment.sent_at = now;
        }
    }

    /// RFC 6675 SetPipe: bytes believed in the network.
    pub fn pipe(&self) -> u32 {
        self.segments
            .iter()
            .filter(|s| !s.sacked)
            .map(|s| {
                let original = if s.lost { 0 } else { s.len() };
                let retransmission = if s.retransmit_in_flight { s.len() } else { 0 };
                original + retransmission
            })
            .sum()
    }

    /// Whether the oldest segment is SACKed: the peer must have discarded it (reneging).
    pub fn first_is_sacked(&self) -> bool {
        self.segments.front().is_some_and(|s| s.sacked)
    }

    /// Whether the oldest segment is deemed lost.
    pub fn first_is_lost(&self) -> bool {
        self.segments.front().is_some_and(|s| s.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    fn board(n: u32) -> Scoreboard {
        let mut sb = Scoreboard::new();
        for i in 0..n {
            sb.push(SentSegment {
                start: SeqNumber(i * 100),
                end: SeqNumber((i + 1) * 100),
                fin: false,
                sent_at: Instant::from_millis(u64::from(i)),
                retransmitted: false,
                sacked: false,
                lost: false,
                retransmit_in_flight: false,
            });
        }
        sb
    }

    /// RACK's verdict for a 10 ms path: lost 10 ms after sending once anything sent after
    /// it (by the time `delivered_sent_at`) has been delivered.
    fn lost_10ms_after(delivered_sent_at: Instant) -> impl Fn(&SentSegment) -> Option<Instant> {
        move |s| (s.sent_at < delivered_sent_at).then(|| s.sent_at + Duration::from_millis(10))
    }

    #[test]
    fn rack_loss_detection_and_pipe() {
        let mut sb = board(6);
        assert_eq!(sb.pipe(), 600);
        let mut seen = Vec::new();
        let update = sb.sack(SeqNumber(100), SeqNumber(400), |s| seen.push(s.start));
        assert_eq!(update.newly_sacked, 3);
        assert_eq!(seen, [SeqNumber(100), SeqNumber(200), SeqNumber(300)]);
        assert_eq!(sb.sacked_segments(), 3);
        // Segment 0 (sent at 0 ms) is due at 10 ms: at 9 ms it waits, at 10 ms it is lost.
        let rule = lost_10ms_after(Instant::from_millis(3));
        let found = sb.detect_losses(Instant::from_millis(9), &rule);
        assert_eq!(found.newly_lost, 0);
        assert_eq!(found.pending_until, Some(Instant::from_millis(10)));
        let found = sb.detect_losses(Instant::from_millis(10), &rule);
        assert_eq!(found.newly_lost, 1);
        assert_eq!(found.pending_until, None);
        assert_eq!(sb.next_lost(), Some(0));
        assert_eq!(sb.pipe(), 200);
        sb.mark_retransmitted(0, Instant::from_millis(11));
        assert_eq!(sb.pipe(), 300);
        assert_eq!(sb.next_lost(), None);
        // A segment sent after the retransmission is SACKed: 10 ms on, the retransmission
        // is lost too.
        sb.sack(SeqNumber(400), SeqNumber(500), |_| {});
        let rule = lost_10ms_after(Instant::from_millis(20));
        let found = sb.detect_losses(Instant::from_millis(21), &rule);
        assert_eq!(found.lost_retransmissions, 1);
        assert_eq!(sb.next_lost(), Some(0));
        sb.mark_retransmitted(0, Instant::from_millis(21));
        let mut acked = Vec::new();
        let removed = sb.acknowledge(SeqNumber(400), |s| acked.push((s.start, s.sacked)));
        assert_eq!(removed.segments, 4);
        assert_eq!(acked[0], (SeqNumber(0), false));
        assert_eq!(acked[3], (SeqNumber(300), true));
        assert_eq!(removed.rtt_sent_at, Some(Instant::from_millis(3)));
        assert_eq!(sb.len(), 2);
    }

    #[test]
    fn partial_ack_trims_and_rto_marks_all() {
        let mut sb = board(3);
        sb.acknowledge(SeqNumber(50), |_| {});
        assert_eq!(sb.get(0).unwrap().start, SeqNumber(50));
        sb.mark_all_lost();
        assert_eq!(sb.pipe(), 0);
        assert_eq!(sb.next_lost(), Some(0));
    }
}
