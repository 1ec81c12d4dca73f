//! Congestion control behind one trait, so that the algorithm is a per-connection choice.

mod cubic;
mod new_reno;

pub use cubic::Cubic;
pub use new_reno::NewReno;

use super::config::CongestionAlgorithm;
use crate::time::Instant;
use core::fmt::Debug;
use core::time::Duration;

/// A congestion controller: it owns cwnd and ssthresh (both in bytes).
pub trait CongestionControl: Debug + Send {
    /// Congestion window in bytes.
    fn cwnd(&self) -> u32;
    /// Slow-start threshold in bytes (`u32::MAX` until the first congestion event).
    fn ssthresh(&self) -> u32;
    /// New data was cumulatively acknowledged outside loss recovery. `cwnd_limited` says
    /// whether the sender was using its window (RFC 7661: an idle window must not grow).
    fn on_ack(&mut self, now: Instant, acked: u32, srtt: Duration, cwnd_limited: bool);
    /// Loss was detected by duplicate ACKs or SACK (RFC 5681 3.2 step 2, RFC 6675 step 4.2).
    fn on_congestion_event(&mut self, now: Instant, flight_size: u32);
    /// The retransmission timer expired (RFC 5681 section 3.1 equation 4, cwnd = 1 segment).
    fn on_retransmission_timeout(&mut self, now: Instant, flight_size: u32);
    /// Every retransmission of the last episode proved spurious (RFC 2883): restore the state
    /// from before the episode.
    fn undo(&mut self);
    /// Slow start ends without a loss (HyStart++): ssthresh becomes cwnd.
    fn exit_slow_start(&mut self);
    /// Overrides cwnd (used on leaving recovery and for restart after idle).
    fn set_cwnd(&mut self, cwnd: u32);
}

/// Builds the controller `algorithm` for segments of `mss` bytes and an initial window of
/// `initial_window` segments.
pub fn new_controller(
    algorithm: CongestionAlgorithm,
    mss: u32,
    initial_window: u32,
) -> Box<dyn CongestionControl> {
    match algorithm {
        CongestionAlgorithm::NewReno => Box::new(NewReno::new(mss, initial_window)),
        CongestionAlgorithm::Cubic => Box::new(Cubic::new(mss, initial_window)),
    }
}
