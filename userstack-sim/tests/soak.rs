//! The soak's 5-minute version (`userstack-soak` runs the 60-minute one): 200 connections a
//! second held open 50 s, about 10,000 at once on each end, with 1 % loss both ways. After the
//! churn stops and TIME-WAIT has passed no control block may be left, and the heap may not
//! hold more after five minutes of churn than after two: what a leak would grow.

use userstack_sim::scenario::Scenario;
use userstack_sim::soak::{churn_for, leak_allowance, soak, CountingAllocator, SoakSample};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn scenario() -> Scenario {
    let path = format!(
        "{}/scenarios/soak-10k-churn.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The soak's samples, printed as JSON lines.
fn soak_minutes(minutes: u64) -> Vec<SoakSample> {
    let (samples, report) = soak(&churn_for(&scenario(), minutes), 1, |s| {
        println!("{}", serde_json::to_string(s).expect("sample"));
    });
    assert!(
        minutes == 0 || report.network.retransmitted_segments > 1000,
        "the loss did not reach the rare paths"
    );
    samples
}

#[test]
fn churning_10k_connections_leaves_no_control_block_and_no_growing_heap() {
    let idle = soak_minutes(0).last().expect("a sample").live_heap_bytes;
    let short = *soak_minutes(2).last().expect("a sample");
    let samples = soak_minutes(5);
    let last = samples.last().expect("a sample");
    let busiest = samples.iter().map(|s| s.established).max().unwrap_or(0);
    let peak = samples.iter().map(|s| s.control_blocks).max().unwrap_or(0);
    println!(
        "{{\"opened\": {}, \"peak_established\": {busiest}, \"peak_control_blocks\": {peak}, \"idle_heap_bytes\": {idle}, \"after_2_minutes_heap_bytes\": {}, \"after_5_minutes_heap_bytes\": {}, \"final_control_blocks\": {}}}",
        last.opened, short.live_heap_bytes, last.live_heap_bytes, last.control_blocks
    );
    assert!(
        last.opened >= 59_000,
        "only {} connections opened",
        last.opened
    );
    // Both ends count: 10,000 connections are 20,000 control blocks established.
    assert!(busiest >= 19_000, "at most {busiest} established at once");
    assert_eq!(
        last.control_blocks, 0,
        "control blocks left after TIME-WAIT"
    );
    assert_eq!(
        short.control_blocks, 0,
        "control blocks left after TIME-WAIT"
    );
    assert_eq!(last.established, 0);
    // Idle again, the stacks give their tables back: what stays is 4 bytes of generation per
    // slot index ever used (handles stay unique) and the frame pool's spare buffers. It was
    // 78 MB (the slot table at its peak capacity) before the tables were released.
    assert!(
        last.live_heap_bytes <= idle + (1 << 20),
        "{} bytes live after the drain against {idle} idle",
        last.live_heap_bytes
    );
    // The same peak reached for 3 more minutes may not leave more behind.
    assert!(
        last.live_heap_bytes <= short.live_heap_bytes + leak_allowance(short.live_heap_bytes),
        "{} bytes live after 5 minutes of churn against {} after 2",
        last.live_heap_bytes,
        short.live_heap_bytes
    );
}
