//! The evaluation's real link, reduced for CI (docs/evaluation.md has the full run): a VM
//! node's guest builds the netem link and runs two rows in every pairing, a few seconds
//! each — Linux's TCP and the user-space stack as sender and receiver. Behaviour, not speed:
//! every flow carries data in every pairing; with 5 % loss and SACK off on both ends every
//! sender retransmits and recovers without SACK, which proves that netem's loss and the
//! row's SACK setting reach both stacks; and the four flows of different RTTs each get
//! through the router's per-port delays. Every run records where its time went.

use hoststack_e2e::evaluation::{on_vm, Evaluation};
use hoststack_runner_api::IdlePolicy;
use std::time::Duration;
use userstack_eval::report::{Measurement, Pairing};

const LOSSY: &str = "1 flow, 5 % loss, SACK off";
const RTTS: &str = "4 flows, RTT 20/40/60/80 ms";

#[test]
fn both_stacks_carry_every_flow_over_the_netem_link() {
    let measurements = on_vm(&Evaluation {
        rows: vec![LOSSY.into(), RTTS.into()],
        pairings: Vec::new(),
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(2),
        spin_core: None,
        repeat: 1,
        steer: true,
        control: false,
        runner_idle: IdlePolicy::Park,
    })
    .expect("the evaluation runs in the VM node's guest");
    let of = |row: &str, pairing: Pairing| -> &Measurement {
        measurements
            .iter()
            .find(|m| m.row == row && m.pairing == pairing)
            .unwrap_or_else(|| panic!("no {row} with {pairing:?} in {measurements:#?}"))
    };
    for pairing in Pairing::ALL {
        let lossy = of(LOSSY, pairing);
        assert_eq!(lossy.flow_mbps.len(), 1, "{lossy:#?}");
        assert!(lossy.flow_mbps[0] > 0.0, "no data moved: {lossy:#?}");
        assert!(lossy.sent("Tcp", "OutSegs") > 0, "{lossy:#?}");
        assert!(
            lossy.sent("Tcp", "RetransSegs") > 0,
            "5 % loss but no retransmission: {lossy:#?}"
        );
        assert_eq!(
            lossy.sent("TcpExt", "TCPSackRecovery"),
            0,
            "SACK is off on both ends: {lossy:#?}"
        );
        assert!(
            lossy.sent("TcpExt", "TCPRenoRecovery") + lossy.rtos() > 0,
            "losses without SACK end in NewReno recovery or a timeout: {lossy:#?}"
        );
        // Where the time went is recorded for every run: both vCPUs' shares, what held a
        // Linux sender back, the runner's busy share, its queue's drops and its frames' wait.
        let load = &lossy.load;
        assert_eq!(load.cpu_busy.len(), 2, "{lossy:#?}");
        let share = |v: f64| (0.0..=1.0).contains(&v);
        assert!(
            load.cpu_busy
                .iter()
                .chain(&load.cpu_softirq)
                .all(|&v| share(v)),
            "{load:?}"
        );
        assert_eq!(
            load.rwnd_limited.is_some_and(share),
            !pairing.userstack_sends(),
            "{load:?}"
        );
        let runner = pairing != Pairing::LinuxToLinux;
        assert_eq!(
            load.runner_busy.is_some_and(|b| b > 0.0 && b <= 1.0),
            runner,
            "{load:?}"
        );
        assert_eq!(load.runner_drops.is_some(), runner, "{load:?}");
        // The runner's received frames (data or ACKs) came stamped by its XDP program in
        // the guest's kernel, and how long they waited is counted for the window; or, where
        // that kernel refuses the stamping helper to XDP, no wait is counted and the run says
        // why.
        let stamped = load
            .runner_rx_wait
            .as_ref()
            .is_some_and(|w| w.frames > 0 && w.log2_micros.iter().sum::<u64>() == w.frames);
        let unstamped = load.runner_rx_wait.is_none()
            && load
                .runner_rx_stamps_unavailable
                .as_deref()
                .is_some_and(|reason| reason.contains("bpf_xdp_adjust_meta"));
        assert_eq!(stamped || unstamped, runner, "{load:?}");
        // The router counted the row's 5 % loss.
        assert!(load.path_losses > Some(0), "{load:?}");
        assert!(load.queue_drops.is_some(), "{load:?}");
        let rtts = of(RTTS, pairing);
        assert_eq!(rtts.flow_mbps.len(), 4, "{rtts:#?}");
        assert!(
            rtts.flow_mbps.iter().all(|&mbps| mbps > 0.0),
            "a flow of the four moved nothing: {rtts:#?}"
        );
    }
}
