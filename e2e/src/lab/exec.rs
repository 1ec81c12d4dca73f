//! Running commands inside a node's network namespace (`ip netns exec`), and reading and
//! writing the sysctls the node sees there. The helpers panic with the node's name and the
//! command's message when the command fails.

use crate::command::{self, cmd};
use std::process::Output;

/// A node to run commands in: its name (for messages) and its network namespace.
#[derive(Clone, Copy)]
pub(crate) struct InNode<'a> {
    /// The node's name.
    pub node: &'a str,
    /// Its network namespace.
    pub netns: &'a str,
}

impl InNode<'_> {
    /// Runs `argv` inside the node's namespace.
    pub fn exec(self, argv: &[&str]) -> Output {
        let mut exec = cmd("ip", &["netns", "exec", self.netns]);
        exec.args(argv);
        command::output(&mut exec, None)
            .unwrap_or_else(|e| panic!("exec in node {}: {e}", self.node))
    }

    /// The value of sysctl `key` (e.g. `net.ipv4.tcp_rmem`) read from /proc/sys inside the
    /// namespace, with runs of whitespace collapsed to one space ("4096 131072 6291456").
    pub fn sysctl(self, key: &str) -> String {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let out = self.exec(&["cat", &path]);
        assert!(
            out.status.success(),
            "reading {key} on {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Writes sysctl `key` = `value` inside the namespace.
    pub fn write_sysctl(self, key: &str, value: &str) {
        let out = self.exec(&["sysctl", "-q", "-w", &format!("{key}={value}")]);
        assert!(
            out.status.success(),
            "writing {key}={value} on {}: {}",
            self.node,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}
