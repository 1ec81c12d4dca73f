//! The harness the interop tests and the veth benchmark share: fresh namespaces per test
//! (the binary re-runs itself under `unshare --net --mount --propagation private`, with a
//! tmpfs over /run/netns for the client namespace), veth pairs, threads that enter the client
//! namespace, and the runner process behind a Drop guard. Each user compiles the items it
//! needs, hence `dead_code` allowed.

#![allow(dead_code)]

use serde_json::Value;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant as WallClock};

/// Tells a re-run binary which body to run.
pub const CHILD: &str = "USERSTACK_INTEROP_CHILD";
/// The runner binary.
pub const RUNNER: &str = env!("CARGO_BIN_EXE_hoststack-userstack");
/// The client namespace's name (under the private /run/netns).
pub const CLIENT_NS: &str = "usclient";
/// A guard against hangs, never a speed assertion.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Runs `body` in fresh namespaces: re-runs test `name` under unshare, or, inside, runs it.
pub fn in_namespaces(name: &str, body: fn()) {
    if std::env::var(CHILD).as_deref() == Ok(name) {
        sh(&["mkdir", "-p", "/run/netns"]);
        sh(&["mount", "-t", "tmpfs", "userstack-test", "/run/netns"]);
        sh(&["ip", "link", "set", "lo", "up"]);
        return body();
    }
    let exe = std::env::current_exe().expect("test binary");
    let flags = ["--net", "--mount", "--propagation", "private"];
    let child = Command::new("unshare")
        .args(flags)
        .arg("--")
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, name)
        .output()
        .unwrap_or_else(|e| panic!("running unshare {flags:?} (needs util-linux): {e}"));
    // The child's own output (a benchmark's JSON, a test's notes) belongs to the caller.
    print!("{}", String::from_utf8_lossy(&child.stdout));
    assert!(
        child.status.success(),
        "the test inside the namespaces (unshare {flags:?}, needs root) failed:\n{}\n{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
}

/// Runs a command, panicking with its output when it fails; returns its stdout.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command in the client namespace.
pub fn in_client(args: &[&str]) -> String {
    let mut full = vec!["ip", "netns", "exec", CLIENT_NS];
    full.extend_from_slice(args);
    sh(&full)
}

/// A veth pair `node_if`/`client_if`: the node end here with `.1`, the client end in the
/// client namespace (created on first use) with `.2`, both in 198.19.`subnet`.0/24.
pub fn veth(node_if: &str, client_if: &str, subnet: u8) {
    if !Path::new("/run/netns").join(CLIENT_NS).exists() {
        sh(&["ip", "netns", "add", CLIENT_NS]);
        in_client(&["ip", "link", "set", "lo", "up"]);
    }
    sh(&[
        "ip", "link", "add", node_if, "type", "veth", "peer", "name", client_if,
    ]);
    sh(&["ip", "link", "set", client_if, "netns", CLIENT_NS]);
    sh(&[
        "ip",
        "addr",
        "add",
        &format!("198.19.{subnet}.1/24"),
        "dev",
        node_if,
    ]);
    sh(&["ip", "link", "set", node_if, "up"]);
    in_client(&[
        "ip",
        "addr",
        "add",
        &format!("198.19.{subnet}.2/24"),
        "dev",
        client_if,
    ]);
    in_client(&["ip", "link", "set", client_if, "up"]);
}

/// Runs `f` on a thread that entered the client namespace (kernel sockets opened there are
/// the client's).
pub fn as_client<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let ns =
            std::fs::File::open(Path::new("/run/netns").join(CLIENT_NS)).expect("client namespace");
        // SAFETY: setns on this thread with a namespace descriptor.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("client thread")
}

/// The runner process; killed on drop.
pub struct Runner {
    child: Option<Child>,
    stats: PathBuf,
    dir: PathBuf,
}

impl Runner {
    /// Starts the runner with `config` and waits until its stats say running.
    pub fn start(config: &Value) -> Runner {
        let dir = std::env::temp_dir().join(format!(
            "userstack-interop-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let config_path = dir.join("config.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let stats = dir.join("stats.json");
        let child = Command::new(RUNNER)
            .args(["run", "--config"])
            .arg(&config_path)
            .arg("--stats")
            .arg(&stats)
            .args(["--stats-interval-ms", "100"])
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting hoststack-userstack");
        let mut runner = Runner {
            child: Some(child),
            stats,
            dir,
        };
        runner.wait_for(|s| s["state"] == "running");
        runner
    }

    /// The current stats document.
    pub fn stats(&self) -> Value {
        std::fs::read_to_string(&self.stats)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    /// Waits until the stats satisfy `ok` (the runner writes them every 100 ms).
    pub fn wait_for(&mut self, ok: impl Fn(&Value) -> bool) -> Value {
        let start = WallClock::now();
        loop {
            let stats = self.stats();
            if ok(&stats) {
                return stats;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let mut stderr = String::new();
                let _ = self
                    .child
                    .as_mut()
                    .unwrap()
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut stderr);
                panic!("the runner exited ({status}): {stderr}");
            }
            assert!(start.elapsed() < PATIENCE, "stats never matched: {stats}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A netstat counter, e.g. `("Tcp", "RetransSegs")`.
    pub fn counter(&self, section: &str, field: &str) -> u64 {
        self.stats()["netstat"][section][field]
            .as_u64()
            .unwrap_or_else(|| panic!("no {section}.{field} in the stats"))
    }

    /// SIGTERM; waits for exit 0 and returns the last stats.
    pub fn stop(mut self) -> Value {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
        assert!(status.success(), "the runner exited {status}: {stderr}");
        self.stats()
    }

    /// SIGKILL; waits for the process to be gone.
    pub fn kill(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn rand_suffix() -> u64 {
    std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64
}

/// The last core: the runner's shard.
pub fn shard_core() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
}

/// Whether an XDP program is attached to `interface` (as `ip link` shows it).
pub fn xdp_attached(interface: &str) -> bool {
    sh(&["ip", "link", "show", "dev", interface]).contains("prog/xdp")
}
