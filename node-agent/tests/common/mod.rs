//! What the kill tests share: a simulated SIGKILL is a panic with the payload [`Killed`], thrown
//! by a fake kernel (or a pause between writes) at the chosen call, and [`killed`] runs a step
//! and tells whether it was "killed" there.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

/// The panic payload of a simulated SIGKILL.
pub struct Killed;

/// Runs `f`; true when it was killed (a panic with [`Killed`]). Kills print nothing; any other
/// panic goes on.
pub fn killed(f: impl FnOnce()) -> bool {
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<Killed>() {
                previous(info);
            }
        }));
    });
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(()) => false,
        Err(payload) if payload.is::<Killed>() => true,
        Err(payload) => panic::resume_unwind(payload),
    }
}
