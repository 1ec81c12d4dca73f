//! The restart schedule of the stack: exponential backoff between starts of a stack that keeps
//! dying, reset once it has run for a while.
//!
//! Pure: the supervisor feeds it how long the last run lasted and asks for the next delay.

use std::time::Duration;

/// The restart policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the first restart.
    pub initial: Duration,
    /// The longest delay.
    pub max: Duration,
    /// A run at least this long counts as healthy: the next death restarts after `initial`
    /// again.
    pub healthy_run: Duration,
}

impl Default for Backoff {
    /// 500 ms, doubling to at most 30 s; a run of 60 s resets it.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            healthy_run: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay before restart number `failures` in a row (1 = the first): `initial` doubled
    /// `failures - 1` times, capped at `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max))
    }

    /// Failures in a row after a run that lasted `ran`, given `before` in a row before it.
    pub fn failures_after(&self, before: u32, ran: Duration) -> u32 {
        if ran >= self.healthy_run {
            1
        } else {
            before.saturating_add(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets_after_a_healthy_run() {
        let b = Backoff::default();
        let delays: Vec<u128> = (1..=9).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(
            delays,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(b.delay(u32::MAX), b.max);
        assert_eq!(b.delay(0), b.initial);
        let quick = Duration::from_millis(10);
        assert_eq!(b.failures_after(0, quick), 1);
        assert_eq!(b.failures_after(4, quick), 5);
        assert_eq!(b.failures_after(4, b.healthy_run), 1);
        assert_eq!(b.failures_after(u32::MAX, quick), u32::MAX);
    }
}
