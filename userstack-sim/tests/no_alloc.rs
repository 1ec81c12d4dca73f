//! The simulator allocates nothing per packet: after warm-up (slow start, send buffers and
//! frame pools grown), a counting global allocator counts the allocations made between a
//! metric sample and the end of the run while tens of thousands of frames cross the network.
//! The count is asserted, never a time.
//!
//! The simulator's own frames, events and link queues, and the stacks under test, allocate
//! nothing then. What still may is the metrics' record: a goodput sample per window pushed
//! on a `Vec` that doubles now and then, a few allocations a run.

#[path = "../../userstack/tests/support/counting_alloc.rs"]
mod counting_alloc;
use userstack_sim::scenario::Scenario;

fn load(name: &str) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs `scenario` and returns the frames that arrived and the allocations made from the
/// first metric sample at or after `from_ms` to the end of the run.
fn steady_state(scenario: &Scenario, from_ms: u64) -> (u64, u64) {
    let mut start: Option<(u64, u64)> = None;
    let mut last = (0, 0);
    userstack_sim::run_observed(scenario, 1, |net| {
        let now = (net.packets(), counting_alloc::allocations());
        if start.is_none() && net.now().as_millis() >= from_ms {
            start = Some(now);
        }
        last = now;
    });
    let (packets, allocations) = start.expect("a sample after warm-up");
    (last.0 - packets, last.1 - allocations)
}

/// Allocations allowed per 10,000 frames (the metrics' record growing; one frame or event
/// allocated by the simulator would be 10,000).
const ALLOCATIONS_PER_10_000_FRAMES: u64 = 10;

#[test]
fn one_flow_and_eight_flows_through_gateways_allocate_nothing_per_packet() {
    // One after the other in one test: the allocation counter is global, and tests in one
    // binary run on parallel threads.
    for (name, duration_ms, from_ms, least) in [
        ("one-flow-100mbit", 3000, 1500, 10_000),
        ("eight-flows-dumbbell", 8000, 6000, 50_000),
    ] {
        let mut scenario = load(name);
        scenario.duration_ms = duration_ms;
        let (packets, allocations) = steady_state(&scenario, from_ms);
        println!(
            "{{\"scenario\": \"{name}\", \"packets\": {packets}, \"allocations\": {allocations}}}"
        );
        assert!(packets > least, "{name}: {packets} packets");
        assert!(
            allocations * 10_000 <= packets * ALLOCATIONS_PER_10_000_FRAMES,
            "{name}: {allocations} allocations for {packets} frames"
        );
    }
}
