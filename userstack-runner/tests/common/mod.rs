//! The harness the interop tests and the veth and shards benchmarks share: fresh namespaces
//! per test (the binary re-runs itself under `unshare --net --mount --propagation private`,
//! with a tmpfs over /run/netns for the client namespace), veth pairs, threads that enter the
//! client namespace, the runner process behind a Drop guard (and paused with SIGSTOP while a
//! benchmark measures something else), and the benchmarks' measuring tools: CPU time from
//! /proc, pinning, a thin epoll, min/median/max. Each user compiles the items it needs, hence
//! `dead_code` allowed.

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
    veth_with_queues(node_if, client_if, subnet, 1);
}

/// [`veth`] with `queues` receive and transmit queues on both ends. A veth hands a frame to
/// the peer's receive queue numbered like the sender's transmit queue (the skb's queue
/// mapping; frames mapped past the peer's queues skip its XDP program), so the sender's
/// queue choice is the steering: the kernel picks it by XPS where set, else by the socket's
/// random flow hash.
pub fn veth_with_queues(node_if: &str, client_if: &str, subnet: u8, queues: u32) {
    if !Path::new("/run/netns").join(CLIENT_NS).exists() {
        sh(&["ip", "netns", "add", CLIENT_NS]);
        in_client(&["ip", "link", "set", "lo", "up"]);
    }
    let queues = queues.to_string();
    let counts = [
        "numtxqueues",
        queues.as_str(),
        "numrxqueues",
        queues.as_str(),
    ];
    let mut add = vec!["ip", "link", "add", node_if];
    add.extend_from_slice(&counts);
    add.extend_from_slice(&["type", "veth", "peer", "name", client_if]);
    add.extend_from_slice(&counts);
    sh(&add);
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

    /// SIGSTOP, then waits until every thread has stopped: a paused runner takes no CPU at
    /// all (not even an idle shard's 1 ms wake-ups), while its XDP program stays attached.
    pub fn pause(&self) {
        let pid = self.child.as_ref().expect("a running runner").id();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let start = WallClock::now();
        while !all_threads_stopped(pid) {
            assert!(start.elapsed() < PATIENCE, "the runner never stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT: undoes [`Runner::pause`].
    pub fn resume(&self) {
        let pid = self.child.as_ref().expect("a running runner").id();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }

    /// SIGTERM (after a SIGCONT, in case it is paused); waits for exit 0 and returns the last
    /// stats.
    pub fn stop(mut self) -> Value {
        self.resume();
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

/// Whether every thread of process `pid` is stopped (state `T`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .is_ok_and(|stat| stat_fields(&stat).first() == Some(&"T"))
    })
}

/// The fields of a /proc stat line after `pid (comm)`: state first.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rfind(')')
        .map_or(Vec::new(), |at| stat[at + 1..].split_whitespace().collect())
}

// ------------------------------------------------------------------- benchmark tools

/// Where a benchmark's parent tells its re-run child whether cargo asked for a full run.
pub const FULL_RUN_ENV: &str = "USERSTACK_BENCH_FULL";

/// Whether this is a full benchmark run (`cargo bench` passes `--bench`; `cargo test
/// --all-targets` does not, and then a benchmark only proves it works). Called in the parent,
/// it records the answer for the child re-run under unshare.
pub fn full_run() -> bool {
    if std::env::var(CHILD).is_err() {
        let full = std::env::args().any(|a| a == "--bench");
        std::env::set_var(FULL_RUN_ENV, if full { "1" } else { "0" });
    }
    std::env::var(FULL_RUN_ENV).as_deref() == Ok("1")
}

/// Busy and total jiffies per CPU, from /proc/stat (idle and iowait are not busy).
pub fn cpu_times() -> Vec<(u64, u64)> {
    std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            let idle = v[3] + v[4];
            let total: u64 = v.iter().take(8).sum();
            (total - idle, total)
        })
        .collect()
}

/// The busy share of `core` between two [`cpu_times`] samples.
pub fn busy_share(before: &[(u64, u64)], after: &[(u64, u64)], core: usize) -> f64 {
    let (b0, t0) = before[core];
    let (b1, t1) = after[core];
    (b1 - b0) as f64 / (t1 - t0).max(1) as f64
}

/// CPU seconds (user + system) of a process or task, from its stat file
/// (`/proc/PID/stat` sums a process's threads; `/proc/self/task/TID/stat` is one thread).
pub fn task_cpu(stat_path: &str) -> f64 {
    let text = std::fs::read_to_string(stat_path).unwrap_or_else(|e| panic!("{stat_path}: {e}"));
    let fields = stat_fields(&text);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after "pid (comm) ".
    let ticks: u64 =
        fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// The calling thread's id, for `/proc/self/task/TID/stat`.
pub fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Pins the calling thread to `core`.
pub fn pin(core: usize) {
    // SAFETY: a zeroed set with one CPU; sched_setaffinity on this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "pinning to core {core}: {}",
        std::io::Error::last_os_error()
    );
}

/// `{min, median, max}` of `values` (the upper median for an even count).
pub fn spread(values: &[f64]) -> Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |i: usize| sorted.get(i).copied().unwrap_or(0.0);
    serde_json::json!({
        "min": at(0),
        "median": at(sorted.len() / 2),
        "max": at(sorted.len().saturating_sub(1)),
    })
}

/// A thin epoll instance (level-triggered unless the caller adds `EPOLLET`); each
/// registration carries a caller's token.
pub struct Epoll {
    fd: std::os::fd::OwnedFd,
}

impl Epoll {
    /// A new epoll instance.
    pub fn new() -> Epoll {
        // SAFETY: epoll_create1 has no preconditions.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(
            fd >= 0,
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Epoll {
            fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) },
        }
    }

    /// Registers `fd` for `events` with `token`.
    pub fn add(&self, fd: i32, token: u64, events: i32) {
        self.control(libc::EPOLL_CTL_ADD, fd, token, events);
    }

    /// Changes `fd`'s events.
    pub fn modify(&self, fd: i32, token: u64, events: i32) {
        self.control(libc::EPOLL_CTL_MOD, fd, token, events);
    }

    fn control(&self, op: i32, fd: i32, token: u64, events: i32) {
        let mut event = libc::epoll_event {
            events: events as u32,
            u64: token,
        };
        // SAFETY: a valid epoll descriptor and event.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut event) };
        assert_eq!(rc, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
    }

    /// Waits at most `timeout_ms` (-1: forever); the ready events fill `events`' front.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> usize {
        // SAFETY: events is a valid buffer of its length.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let error = std::io::Error::last_os_error();
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::Interrupted,
                "epoll_wait: {error}"
            );
            return 0;
        }
        n as usize
    }
}
