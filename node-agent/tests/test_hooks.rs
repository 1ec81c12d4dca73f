//! The agent's test hooks exist only in a build with the `test-hooks` feature, the lab's: the
//! `--step-delay` and `--write-log` flags and the `HOSTSTACK_DPDK_UNBIND_PAUSE` variable. In any
//! other build (the Dockerfile's user image, `cargo build -p hoststack-agent`) both flags are
//! unknown, and neither the variable's name nor the write log's code is in the binary.
//!
//! Run both ways: `cargo test --workspace --test test_hooks` (the user's build) and with
//! `--features hoststack-agent/test-hooks` (the lab's, which scripts/test builds everything with).

use std::process::{Command, Output};

/// The agent binary of this build.
const AGENT: &str = env!("CARGO_BIN_EXE_hoststack-agent");

/// The DPDK hook's variable, spelled here so that the binary is searched for the hook's own
/// string (the agent's constant is compiled only with the feature).
const UNBIND_PAUSE_ENV: &[u8] = b"HOSTSTACK_DPDK_UNBIND_PAUSE";

/// The write log's own error message, which only its code holds (hoststack_agent::hooks).
const WRITE_LOG_CODE: &[u8] = b"appending to the write log";

/// `hoststack-agent --node-name n <hook flag> <value> --help`: the help text when the flag
/// parses, clap's usage error when it does not.
fn help_with(flag: &str, value: &str) -> Output {
    Command::new(AGENT)
        .args(["--node-name", "n", flag, value, "--help"])
        .output()
        .expect("the agent binary runs")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn the_test_hooks_exist_only_in_a_test_hooks_build() {
    let binary = std::fs::read(AGENT).expect("the agent binary is readable");
    let reads_the_dpdk_hook = contains(&binary, UNBIND_PAUSE_ENV);
    let has_the_write_log = contains(&binary, WRITE_LOG_CODE);
    for (flag, value, shown) in [
        ("--step-delay", "1s", "--step-delay <STEP_DELAY>"),
        ("--write-log", "/tmp/w", "--write-log <WRITE_LOG>"),
    ] {
        let out = help_with(flag, value);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if cfg!(feature = "test-hooks") {
            assert!(out.status.success(), "{stderr}");
            assert!(stdout.contains(shown), "{stdout}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
            let refused = format!("error: unexpected argument '{flag}' found");
            assert!(stderr.starts_with(&refused), "{stderr}");
        }
    }
    if cfg!(feature = "test-hooks") {
        assert!(reads_the_dpdk_hook, "the lab's agent reads the DPDK hook");
        assert!(has_the_write_log, "the lab's agent has the write log");
    } else {
        assert!(
            !reads_the_dpdk_hook,
            "{AGENT} holds the string HOSTSTACK_DPDK_UNBIND_PAUSE"
        );
        assert!(!has_the_write_log, "{AGENT} holds the write log's code");
        let help = Command::new(AGENT)
            .arg("--help")
            .output()
            .expect("the agent binary runs");
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(help.contains("--resync-interval"), "{help}");
        assert!(!help.contains("step-delay"), "{help}");
        assert!(!help.contains("write-log"), "{help}");
    }
}
