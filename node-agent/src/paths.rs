//! The agent's default paths: where it pins its BPF objects and which runner it starts.

use std::path::PathBuf;

/// The bpffs directory under which the agent pins by default (`--bpffs-root`).
pub const DEFAULT_BPFFS_ROOT: &str = "/sys/fs/bpf/hoststack";

/// The file name of the user-space stack's runner.
pub const RUNNER_BINARY: &str = "hoststack-userstack";

/// The runner next to the agent's own executable (`--userstack-binary`'s default); just its
/// name, looked up in `PATH`, when the executable's directory cannot be told.
pub fn runner_next_to_agent() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(RUNNER_BINARY)))
        .unwrap_or_else(|| PathBuf::from(RUNNER_BINARY))
}
