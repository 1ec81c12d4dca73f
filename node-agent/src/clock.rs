//! The agent's two clocks. The wall clock says what time it is for people (the times in the
//! status); every span the agent times itself — the dead-man window above all — runs on the
//! monotonic clock, which an NTP step or a `date -s` does not move. Code that decides reads
//! time through [`Clocks`], so a test can step one clock and not the other.

use std::time::{SystemTime, UNIX_EPOCH};

/// The clocks the agent reads.
pub trait Clocks: Send + Sync {
    /// The wall clock, in milliseconds since the epoch: only for what people read.
    fn wall_millis(&self) -> u64;
    /// A monotonic clock, in milliseconds since an arbitrary origin (the boot): for every span
    /// the agent times. It never goes back and is not stepped; its values mean nothing across
    /// a reboot.
    fn monotonic_millis(&self) -> u64;
}

/// The host's clocks: `CLOCK_REALTIME` and `CLOCK_BOOTTIME` (monotonic, and counting the time
/// the machine was suspended, so a window does not stretch over a suspend).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClocks;

impl Clocks for SystemClocks {
    fn wall_millis(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn monotonic_millis(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec for clock_gettime to write; CLOCK_BOOTTIME exists on
        // every kernel the agent supports (Linux 2.6.39 and later), so the call cannot fail.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
        secs * 1000 + nanos / 1_000_000
    }
}
