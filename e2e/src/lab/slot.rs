//! One lab at a time per process: labs are heavy (an API server each) on small machines, and
//! tests that share a process would otherwise start theirs all at once. [`Slot::acquire`]
//! waits until the previous lab of this process has dropped its slot.

use std::sync::{Condvar, Mutex, PoisonError};

/// The right to run this process's one lab; released on drop.
pub(crate) struct Slot;

static BUSY: Mutex<bool> = Mutex::new(false);
static FREED: Condvar = Condvar::new();

impl Slot {
    /// Waits until no other lab of this process runs, and takes the slot.
    pub fn acquire() -> Slot {
        let mut busy = BUSY.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy {
            busy = FREED.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        *busy = true;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *BUSY.lock().unwrap_or_else(PoisonError::into_inner) = false;
        FREED.notify_one();
    }
}
