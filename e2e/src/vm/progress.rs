//! The guest's progress, read from its heartbeat, so that a wait on a VM node follows what the
//! guest gets done rather than the host's wall clock.
//!
//! The guest's command runner (see [`super::initramfs`]) writes `<share>/heartbeat` once per
//! turn: the turn number and the guest's uptime. A turn is at least [`TURN`] (the runner sleeps
//! that long between turns) and longer when the guest runs slowly, e.g. when the host's cores
//! are busy and qemu's vCPU threads get less of them. A [`Budget`] of N seconds is therefore a
//! number of turns (N / [`TURN`]): a guest that makes progress slowly gets proportionally more
//! wall time, and one whose heartbeat stops for [`SILENCE`] is reported at once as not
//! answering, instead of after the whole budget. [`WALL_CLOCK_CAP`] times the budget in wall
//! time ends any wait, so that a test always ends.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The runner's sleep between turns: the shortest a turn can be.
pub(crate) const TURN: Duration = Duration::from_millis(200);
/// How long the heartbeat may stand still before the guest counts as not answering. A guest
/// vCPU stalled by the kernel (an RCU stall is reported after 21 s) may hold the runner that
/// long; a guest that stays silent longer has stopped.
pub const SILENCE: Duration = Duration::from_secs(60);
/// The most wall time a budget may stretch to, as a multiple of the budget.
pub const WALL_CLOCK_CAP: u32 = 5;

/// The guest's heartbeat file.
#[derive(Clone, Debug)]
pub(crate) struct Heartbeat {
    path: PathBuf,
}

impl Heartbeat {
    /// The heartbeat in the node's share.
    pub(crate) fn in_share(share: &Path) -> Heartbeat {
        Heartbeat {
            path: share.join("heartbeat"),
        }
    }

    /// The turn number the guest last wrote; `None` before its first turn (or while it is
    /// being replaced).
    fn turn(&self) -> Option<u64> {
        std::fs::read_to_string(&self.path)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// A budget of `budget` worth of the guest's turns, starting now.
    pub(crate) fn budget(&self, budget: Duration) -> Budget {
        let now = Instant::now();
        Budget {
            heartbeat: self.clone(),
            turns_allowed: (budget.as_millis() / TURN.as_millis()).max(1) as u64,
            budget,
            turns: 0,
            last_turn: self.turn(),
            last_change: now,
            started: now,
        }
    }
}

/// Why a wait on the guest ended without its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exhausted {
    /// The heartbeat stood still for this long: the guest stopped answering.
    Silent(Duration),
    /// The guest made its budget's worth of turns (or the wall-clock cap passed).
    Spent {
        /// The turns the guest made.
        turns: u64,
        /// The wall time that took.
        took: Duration,
    },
}

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exhausted::Silent(d) => write!(
                f,
                "the guest stopped answering: its heartbeat has not moved for {d:.1?}"
            ),
            Exhausted::Spent { turns, took } => write!(
                f,
                "the guest made {turns} turns of its command runner in {took:.1?} (it was answering)"
            ),
        }
    }
}

/// A wait's allowance in the guest's turns.
#[derive(Debug)]
pub(crate) struct Budget {
    heartbeat: Heartbeat,
    budget: Duration,
    turns_allowed: u64,
    turns: u64,
    last_turn: Option<u64>,
    last_change: Instant,
    started: Instant,
}

impl Budget {
    /// Reads the heartbeat and says whether the wait may go on.
    pub(crate) fn check(&mut self) -> Result<(), Exhausted> {
        let now = Instant::now();
        let turn = self.heartbeat.turn();
        self.observe(turn, now)
    }

    /// [`Budget::check`] with the turn read and the time given (the pure part).
    fn observe(&mut self, turn: Option<u64>, now: Instant) -> Result<(), Exhausted> {
        if let Some(turn) = turn {
            if Some(turn) != self.last_turn {
                // A respawned runner counts from 1 again.
                self.turns += match self.last_turn {
                    Some(last) if turn > last => turn - last,
                    _ => 1,
                };
                self.last_turn = Some(turn);
                self.last_change = now;
            }
        }
        let took = now.duration_since(self.started);
        let silent = now.duration_since(self.last_change);
        if silent >= SILENCE {
            return Err(Exhausted::Silent(silent));
        }
        if self.turns >= self.turns_allowed || took >= self.budget * WALL_CLOCK_CAP {
            return Err(Exhausted::Spent {
                turns: self.turns,
                took,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(seconds: u64, at: Instant) -> Budget {
        Budget {
            heartbeat: Heartbeat {
                path: PathBuf::from("/nonexistent"),
            },
            budget: Duration::from_secs(seconds),
            turns_allowed: seconds * 5,
            turns: 0,
            last_turn: Some(10),
            last_change: at,
            started: at,
        }
    }

    #[test]
    fn a_slow_guest_gets_more_time_and_a_silent_one_fails_fast() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        // 2 s of budget is 10 turns; a guest at one turn per 500 ms still goes on after 4.5 s.
        let ms = Duration::from_millis;
        let mut slow = budget(2, t0);
        for i in 1..=9 {
            assert_eq!(slow.observe(Some(10 + i), t0 + ms(500 * i)), Ok(()));
        }
        assert_eq!(
            slow.observe(Some(20), t0 + ms(5000)),
            Err(Exhausted::Spent {
                turns: 10,
                took: ms(5000)
            })
        );
        // A heartbeat that stands still fails after SILENCE, long before the wall-clock cap of
        // a long budget.
        let mut silent = budget(600, t0);
        assert_eq!(silent.observe(Some(10), t0 + s(59)), Ok(()));
        assert_eq!(
            silent.observe(Some(10), t0 + s(60)),
            Err(Exhausted::Silent(s(60)))
        );
        // A respawned runner (turn 1 again) is progress, and the wall-clock cap ends any wait.
        let mut capped = budget(10, t0);
        assert_eq!(capped.observe(Some(1), t0 + s(30)), Ok(()));
        assert_eq!(capped.turns, 1);
        let mut t = 30;
        let mut turn = 1;
        while t < 49 {
            t += 1;
            turn += 1;
            assert_eq!(capped.observe(Some(turn), t0 + s(t)), Ok(()));
        }
        assert!(matches!(
            capped.observe(Some(turn + 1), t0 + s(50)),
            Err(Exhausted::Spent { .. })
        ));
    }
}
