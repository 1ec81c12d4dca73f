//! Running a real-kernel test in namespaces of its own: the test re-runs itself in a child
//! process under `unshare`, so that everything it changes (sysctls, links, nftables tables, XDP
//! programs, mounts) vanishes with that child, even when the child fails or is killed.

use std::process::Command;

/// Runs test `test` of this test binary again under `unshare <flags>`, with the environment
/// variable `env` set to `value` (which tells the child to run the body), and asserts that it
/// passed, showing its output when it did not. The namespaces need root: without it, the
/// child fails with unshare's reason rather than the test being skipped.
pub fn rerun_under_unshare(test: &str, flags: &[&str], env: &str, value: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let child = Command::new("unshare")
        .args(flags)
        .arg("--")
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, value)
        .output()
        .unwrap_or_else(|e| panic!("running unshare {flags:?} (needs util-linux): {e}"));
    assert!(
        child.status.success(),
        "the test inside the namespaces (unshare {flags:?}) failed:\n{}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
}
