//! Connection churn over a long run, watched for leaks: the classic bug of user-space stacks
//! is a control block (or its buffers) kept after TIME-WAIT or on a rare error path. A soak
//! runs a scenario whose short connections are held open and churned, samples every
//! simulated minute how many control blocks the stacks hold and how much heap the process
//! has live, and after the churn stops and TIME-WAIT (2·MSL) has passed expects no control
//! block left and the heap back where an idle stack's is.

use crate::metrics::Report;
use crate::run_observed;
use crate::scenario::{Scenario, Traffic};
use serde::Serialize;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use userstack::counters::Counter;
use userstack::time::Instant;

/// Bytes allocated and not yet freed through [`CountingAllocator`].
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes. A soak binary or test installs it with
/// `#[global_allocator]`; without it [`live_heap_bytes`] stays 0.
pub struct CountingAllocator;

// SAFETY: every call is forwarded unchanged to `System`; the counter is only bookkeeping.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`; `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Live heap bytes, when [`CountingAllocator`] is the global allocator.
pub fn live_heap_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// How much more heap than after a two-minute churn the drained stacks may hold before it
/// counts as a leak: 1 % of it plus 64 KiB, for the frame pool's spare buffers (one
/// 1.5 kB frame more or less) and the allocator's rounding. A leak of even one byte per
/// connection is 720 kB over the hour's 720,000.
pub fn leak_allowance(reference: usize) -> usize {
    reference / 100 + 64 * 1024
}

/// One minute's look at the stacks.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SoakSample {
    /// Simulated minutes since the start.
    pub minute: u64,
    /// Control blocks held by every stack (connections in any state, TIME-WAIT included).
    pub control_blocks: usize,
    /// Connections in ESTABLISHED or CLOSE-WAIT.
    pub established: u64,
    /// Connections opened so far.
    pub opened: u64,
    /// Live heap bytes of the whole process, less the simulator's record of completion
    /// times (one per connection: it grows by design).
    pub live_heap_bytes: usize,
}

/// `scenario` with its short connections opening for `minutes` only, and run long enough
/// after that for the held ones to close (their hold), TIME-WAIT (2·MSL) to pass and a lost
/// FIN or two to be resent.
pub fn churn_for(scenario: &Scenario, minutes: u64) -> Scenario {
    let mut scenario = scenario.clone();
    let churn_ms = minutes * 60_000;
    let mut hold_ms = 0;
    for traffic in &mut scenario.traffic {
        if let Traffic::Short {
            until_ms,
            hold_ms: hold,
            ..
        } = traffic
        {
            *until_ms = Some(churn_ms);
            hold_ms = hold_ms.max(*hold);
        }
    }
    let time_wait_ms = scenario.tcp.apply().msl.as_millis() as u64 * 2;
    scenario.duration_ms = churn_ms + hold_ms + time_wait_ms + 30_000;
    scenario
}

/// Runs `scenario` with `seed`, calling `on_sample` each simulated minute; returns the
/// samples and the run's report.
pub fn soak(
    scenario: &Scenario,
    seed: u64,
    mut on_sample: impl FnMut(&SoakSample),
) -> (Vec<SoakSample>, Report) {
    let mut samples = Vec::new();
    let mut next_minute = 0u64;
    let report = run_observed(scenario, seed, |net| {
        if net.now() < Instant::from_millis(next_minute * 60_000) {
            return;
        }
        let sample = SoakSample {
            minute: next_minute,
            control_blocks: net.stacks().map(|s| s.connection_count()).sum(),
            established: net
                .stacks()
                .map(|s| s.counters().get(Counter::CurrEstab))
                .sum(),
            opened: net.ctx.short_started,
            live_heap_bytes: live_heap_bytes()
                .saturating_sub(net.ctx.short_fct_ms.capacity() * core::mem::size_of::<f64>()),
        };
        on_sample(&sample);
        samples.push(sample);
        next_minute += 1;
    });
    (samples, report)
}
