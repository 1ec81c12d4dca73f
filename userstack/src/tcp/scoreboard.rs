//! The sender's record of segments in flight: what was sent when, what the peer SACKed, what
//! is deemed lost and what has been retransmitted (RFC 6675 section 3's scoreboard).

use crate::time::Instant;
use crate::wire::SeqNumber;
use core::time::Duration;
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
    /// Latest transmission time among them (RACK's "most recently sent delivered segment").
    pub latest_sent_at: Option<Instant>,
}

/// What loss detection found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectedLosses {
    /// Original transmissions newly deemed lost.
    pub newly_lost: u32,
    /// Retransmissions deemed lost again.
    pub lost_retransmissions: u32,
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

    /// Removes everything below `ack` (a partially acknowledged segment is trimmed).
    pub fn acknowledge(&mut self, ack: SeqNumber) -> AckedSegments {
        let mut result = AckedSegments::default();
        while let Some(front) = self.segments.front_mut() {
            if front.end <= ack {
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

    /// Marks segments wholly inside `[left, right)` as SACKed (RFC 2018 section 5).
    pub fn sack(&mut self, left: SeqNumber, right: SeqNumber) -> SackUpdate {
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
                update.latest_sent_at = update.latest_sent_at.max(Some(segment.sent_at));
            }
        }
        update
    }

    /// Applies RFC 6675's IsLost to every un-SACKed segment: a segment is lost when at least
    /// `dupthresh` SACKed segments lie above it. Returns how many were newly marked.
    ///
    /// A retransmission is itself deemed lost, RACK-style (RFC 8985 section 6.2), when a
    /// segment sent more than `reordering_window` after it has been SACKed: `delivered_sent_at`
    /// is the latest send time among SACKed segments. Returns the retransmissions found lost.
    pub fn detect_losses(
        &mut self,
        dupthresh: u32,
        delivered_sent_at: Option<Instant>,
        reordering_window: Duration,
    ) -> DetectedLosses {
        let mut sacked_above = 0u32;
        let mut found = DetectedLosses::default();
        for segment in self.segments.iter_mut().rev() {
            if segment.sacked {
                sacked_above += 1;
            } else if segment.retransmit_in_flight {
                if delivered_sent_at.is_some_and(|t| segment.sent_at + reordering_window < t) {
                    segment.retransmit_in_flight = false;
                    segment.lost = true;
                    found.lost_retransmissions += 1;
                }
            } else if sacked_above >= dupthresh && !segment.lost {
                segment.lost = true;
                found.newly_lost += 1;
            }
        }
        found
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

    #[test]
    fn sack_loss_detection_and_pipe() {
        let mut sb = board(6);
        assert_eq!(sb.pipe(), 600);
        assert_eq!(sb.sack(SeqNumber(100), SeqNumber(400)).newly_sacked, 3);
        let found = sb.detect_losses(3, None, Duration::ZERO);
        assert_eq!(found.newly_lost, 1);
        assert_eq!(sb.next_lost(), Some(0));
        assert_eq!(sb.pipe(), 200);
        sb.mark_retransmitted(0, Instant::from_millis(9));
        assert_eq!(sb.pipe(), 300);
        assert_eq!(sb.next_lost(), None);
        // A segment sent after the retransmission is SACKed: the retransmission was lost.
        let later = Instant::from_millis(20);
        let found = sb.detect_losses(3, Some(later), Duration::from_millis(5));
        assert_eq!(found.lost_retransmissions, 1);
        assert_eq!(sb.next_lost(), Some(0));
        sb.mark_retransmitted(0, Instant::from_millis(21));
        let acked = sb.acknowledge(SeqNumber(400));
        assert_eq!(acked.segments, 4);
        assert_eq!(acked.rtt_sent_at, Some(Instant::from_millis(3)));
        assert_eq!(sb.len(), 2);
    }

    #[test]
    fn partial_ack_trims_and_rto_marks_all() {
        let mut sb = board(3);
        sb.acknowledge(SeqNumber(50));
        assert_eq!(sb.get(0).unwrap().start, SeqNumber(50));
        sb.mark_all_lost();
        assert_eq!(sb.pipe(), 0);
        assert_eq!(sb.next_lost(), Some(0));
    }
}
