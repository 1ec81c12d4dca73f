//! The agent's test hooks exist only in a build with the `test-hooks` feature, the lab's: the
//! `--step-delay` flag and the `HOSTSTACK_DPDK_UNBIND_PAUSE` variable. In any other build (the
//! Dockerfile's user image, `cargo build -p hoststack-agent`) `--step-delay` is an unknown flag
//! and the variable's name is not even in the binary.
//!
//! Run both ways: `cargo test --workspace --test test_hooks` (the user's build) and with
//! `--features hoststack-agent/test-hooks` (the lab's, which scripts/test builds everything with).

use std::process::{Command, Output};

/// The agent binary of this build.
const AGENT: &str = env!("CARGO_BIN_EXE_hoststack-agent");

/// The DPDK hook's variable, spelled here so that the binary is searched for the hook's own
/// string (the agent's constant is compiled only with the feature).
const UNBIND_PAUSE_ENV: &[u8] = b"HOSTSTACK_DPDK_UNBIND_PAUSE";

/// `hoststack-agent --node-name n --step-delay 1s --help`: the help text when the flag parses,
/// clap's usage error when it does not.
fn help_with_a_step_delay() -> Output {
    Command::new(AGENT)
        .args(["--node-name", "n", "--step-delay", "1s", "--help"])
        .output()
        .expect("the agent binary runs")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_test_hooks_exist_only_in_a_test_hooks_build() {
    let out = help_with_a_step_delay();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let binary = std::fs::read(AGENT).expect("the agent binary is readable");
    let reads_the_dpdk_hook = contains(&binary, UNBIND_PAUSE_ENV);
    if cfg!(feature = "test-hooks") {
        assert!(out.status.success(), "{stderr}");
        assert!(stdout.contains("--step-delay <STEP_DELAY>"), "{stdout}");
        assert!(reads_the_dpdk_hook, "the lab's agent reads the DPDK hook");
    } else {
        assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
        assert!(
            stderr.starts_with("error: unexpected argument '--step-delay' found"),
            "{stderr}"
        );
        assert!(
            !reads_the_dpdk_hook,
            "{AGENT} holds the string HOSTSTACK_DPDK_UNBIND_PAUSE"
        );
        let help = Command::new(AGENT)
            .arg("--help")
            .output()
            .expect("the agent binary runs");
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("--resync-interval"), "{help}");
        assert!(!help.contains("step-delay"), "{help}");
    }
}
