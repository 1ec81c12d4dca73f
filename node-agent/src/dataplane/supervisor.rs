//! The I/O shell of the dataplane: runs `hoststack-userstack` as a child process, restarts it
//! with backoff when it dies, stops it gracefully, and finds again, after an agent restart, the
//! runner an earlier agent started.
//!
//! Files, all in `<state-dir>/userstack/`: `config.json` (the runner's `--config`),
//! `stats.json` (its `--stats`), `runner.json` (the pid record: pid, the kernel's start time of
//! that pid, and the config it runs, so that a recycled pid is never mistaken for the runner),
//! and `runner.log` (its stdout and stderr). The runner gets a process group of its own and
//! outlives the agent: an agent restart (an upgrade, a crash) does not interrupt the data plane.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoststack_crds::{StackBackend, UserspaceStackStatus};
use hoststack_runner_api::Backend;
use serde::{Deserialize, Serialize};

use super::backoff::Backoff;
use super::runner_config::RunnerConfig;
use super::stats::{self, Supervision};
use crate::host::bpf::Pins;
use crate::host::Host;

/// How often the monitor looks at the runner.
const POLL: Duration = Duration::from_millis(100);

/// How long a stopped runner may take beyond its drain deadline before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// What the agent wants running.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    /// The runner's config.
    pub config: RunnerConfig,
    /// The dedicated cores in list format, as the spec wrote them.
    pub cores: String,
    /// The backend, for status.
    pub backend: StackBackend,
    /// Whether the cores are isolated from the scheduler.
    pub isolated: bool,
    /// The isolation warning, when they are not.
    pub warning: Option<String>,
}

/// The pid record in `runner.json`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct PidRecord {
    pid: u32,
    /// Field 22 of `/proc/PID/stat`: with the pid, it names one process for good.
    start_time: u64,
    config: RunnerConfig,
}

/// The runner process: a child of this agent, or one an earlier agent started.
#[derive(Debug)]
enum Process {
    Child(Child),
    Adopted,
}

/// A runner that runs.
#[derive(Debug)]
struct Running {
    process: Process,
    pid: u32,
    start_time: u64,
    started: Instant,
    config: RunnerConfig,
}

/// The supervisor's state, shared with its monitor thread.
#[derive(Debug, Default)]
struct State {
    wanted: Option<Wanted>,
    running: Option<Running>,
    /// Deaths in a row (see [`Backoff::failures_after`]).
    failures: u32,
    restarts: u32,
    /// When the dead runner is started again.
    restart_at: Option<Instant>,
    last_exit: Option<String>,
}

/// Where the supervisor keeps its files, and how it starts the runner.
#[derive(Debug)]
struct Shared {
    binary: PathBuf,
    dir: PathBuf,
    backoff: Backoff,
    host: Host,
    state: Mutex<State>,
    quit: AtomicBool,
}

/// Runs and watches the user-space stack (see the module doc).
#[derive(Debug)]
pub struct Supervisor {
    shared: Arc<Shared>,
    /// The monitor thread, started by the first runner to watch (none on a node that runs no
    /// user-space stack: a fleet of thousands of agents in one process would otherwise wake
    /// thousands of threads ten times a second).
    monitor: Mutex<Option<JoinHandle<()>>>,
}

impl Supervisor {
    /// A supervisor of `binary` keeping its files under `<state_dir>/userstack`, checking XDP
    /// hooks through `host`. Takes over the runner of the pid record when it still runs, and
    /// then starts the monitor thread.
    pub fn new(binary: &Path, state_dir: &Path, backoff: Backoff, host: Host) -> Self {
        let dir = state_dir.join("userstack");
        let running = adopt(&dir);
        let adopted = running.is_some();
        if let Some(r) = &running {
            tracing::info!(
                pid = r.pid,
                "found the user-space stack an earlier agent started"
            );
        }
        let shared = Arc::new(Shared {
            binary: binary.to_path_buf(),
            dir,
            backoff,
            host,
            state: Mutex::new(State {
                running,
                ..State::default()
            }),
            quit: AtomicBool::new(false),
        });
        let supervisor = Supervisor {
            shared,
            monitor: Mutex::new(None),
        };
        if adopted {
            supervisor.watch();
        }
        supervisor
    }

    /// Starts the monitor thread unless it runs.
    fn watch(&self) {
        let mut monitor = self.monitor.lock().unwrap_or_else(PoisonError::into_inner);
        if monitor.is_none() {
            let shared = self.shared.clone();
            *monitor = std::thread::Builder::new()
                .name("userstack-supervisor".into())
                .spawn(move || shared.monitor())
                .ok();
        }
    }

    /// The runner's stats file.
    pub fn stats_path(&self) -> PathBuf {
        self.shared.dir.join("stats.json")
    }

    /// Runs the stack as `wanted` says: keeps a runner with the same config (also one found at
    /// start), replaces one with another config (stopping it gracefully first), or starts one.
    pub fn ensure(&self, wanted: Wanted) -> Result<(), String> {
        self.watch();
        let mut state = self.shared.lock();
        let same = state
            .running
            .as_ref()
            .is_some_and(|r| r.config == wanted.config);
        if !same {
            if let Some(running) = state.running.take() {
                tracing::info!(
                    pid = running.pid,
                    "the stack's config changed: restarting it"
                );
                self.shared.stop_process(running)?;
            }
            // A new config starts at once; the same one keeps the backoff it is in.
            if state.wanted.as_ref().map(|w| &w.config) != Some(&wanted.config) {
                state.failures = 0;
                state.restart_at = None;
            }
        }
        let config = wanted.config.clone();
        state.wanted = Some(wanted);
        if state.running.is_none() && state.restart_at.is_none() {
            let result = self.shared.spawn(&config);
            self.shared.started(&mut state, result);
        }
        Ok(())
    }

    /// Stops the stack, if it runs: SIGTERM, the drain deadline and a grace period, then
    /// SIGKILL, and checks that no XDP program is left on its interface. Then removes its files
    /// (config, stats, pid record), so no stale counters are exported. Also stops a runner found
    /// at start that nothing asked for any more.
    pub fn stop(&self) -> Result<(), String> {
        let mut state = self.shared.lock();
        state.wanted = None;
        state.restart_at = None;
        state.failures = 0;
        state.restarts = 0;
        state.last_exit = None;
        if let Some(running) = state.running.take() {
            let iface = running.config.interface.clone();
            // A DPDK runner attaches no XDP program (its device has no netdev).
            let xdp = running.config.backend != Backend::Dpdk;
            self.shared.stop_process(running)?;
            if xdp {
                self.shared.check_detached(&iface)?;
            }
        }
        // Also the files of a runner that died while no agent watched it.
        for file in ["runner.json", "config.json", "stats.json"] {
            match fs::remove_file(self.shared.dir.join(file)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("removing {file}: {e}")),
            }
        }
        Ok(())
    }

    /// The stack's status while the agent wants it running; `None` otherwise.
    pub fn status(&self) -> Option<UserspaceStackStatus> {
        let state = self.shared.lock();
        let wanted = state.wanted.as_ref()?;
        let supervision = Supervision {
            pid: state.running.as_ref().map(|r| r.pid),
            restarts: state.restarts,
            last_exit: state.last_exit.clone(),
        };
        let stats = stats::read(&self.stats_path());
        Some(stats::status(
            &wanted.cores,
            wanted.backend,
            wanted.isolated,
            wanted.warning.as_deref(),
            &supervision,
            stats.as_ref(),
        ))
    }

    /// The pid of the runner, while one runs.
    pub fn pid(&self) -> Option<u32> {
        self.shared.lock().running.as_ref().map(|r| r.pid)
    }
}

impl Drop for Supervisor {
    /// Ends the monitor thread; the runner keeps running (see the module doc).
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::Relaxed);
        let monitor = self
            .monitor
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(monitor) = monitor.take() {
            let _ = monitor.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The monitor thread: notices a dead runner, and starts the wanted one when its backoff
    /// is over.
    fn monitor(&self) {
        while !self.quit.load(Ordering::Relaxed) {
            std::thread::sleep(POLL);
            let mut state = self.lock();
            if let Some(running) = state.running.as_mut() {
                if let Some(exit) = ended(running) {
                    let ran = running.started.elapsed();
                    let pid = running.pid;
                    let exit = format!("{exit}{}", self.last_error_line());
                    tracing::warn!(pid, %exit, "the user-space stack died");
                    state.running = None;
                    let _ = fs::remove_file(self.dir.join("runner.json"));
                    if state.wanted.is_some() {
                        state.failures = self.backoff.failures_after(state.failures, ran);
                        let delay = self.backoff.delay(state.failures);
                        tracing::info!(?delay, "restarting the user-space stack after a backoff");
                        state.restart_at = Some(Instant::now() + delay);
                    }
                    state.last_exit = Some(exit);
                }
            }
            let due = state.restart_at.is_some_and(|t| Instant::now() >= t);
            if due && state.running.is_none() {
                if let Some(config) = state.wanted.as_ref().map(|w| w.config.clone()) {
                    state.restarts += 1;
                    let result = self.spawn(&config);
                    self.started(&mut state, result);
                }
            }
        }
    }

    /// Records the outcome of a start; a start that failed is retried after a backoff.
    fn started(&self, state: &mut State, result: io::Result<Running>) {
        match result {
            Ok(running) => {
                tracing::info!(pid = running.pid, "started the user-space stack");
                state.restart_at = None;
                state.running = Some(running);
            }
            Err(e) => {
                let exit = format!("cannot start {}: {e}", self.binary.display());
                tracing::error!(%exit, "starting the user-space stack");
                state.failures = self.backoff.failures_after(state.failures, Duration::ZERO);
                state.restart_at = Some(Instant::now() + self.backoff.delay(state.failures));
                state.last_exit = Some(exit);
            }
        }
    }

    /// Writes the config and starts the runner in a process group of its own.
    fn spawn(&self, config: &RunnerConfig) -> io::Result<Running> {
        fs::create_dir_all(&self.dir)?;
        let config_path = self.dir.join("config.json");
        let stats_path = self.dir.join("stats.json");
        write_atomic(&config_path, &serde_json::to_vec_pretty(config)?)?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("runner.log"))?;
        writeln!(log, "=== starting {}", self.binary.display())?;
        let child = Command::new(&self.binary)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .arg("--stats")
            .arg(&stats_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()?;
        let pid = child.id();
        let start_time = start_time(pid).unwrap_or_default();
        let record = PidRecord {
            pid,
            start_time,
            config: config.clone(),
        };
        write_atomic(
            &self.dir.join("runner.json"),
            &serde_json::to_vec_pretty(&record)?,
        )?;
        Ok(Running {
            process: Process::Child(child),
            pid,
            start_time,
            started: Instant::now(),
            config: config.clone(),
        })
    }

    /// SIGTERM, then up to the drain deadline plus [`STOP_GRACE`], then SIGKILL.
    fn stop_process(&self, mut running: Running) -> Result<(), String> {
        let pid = running.pid;
        signal(&running, libc::SIGTERM);
        let grace = Duration::from_millis(running.config.drain_timeout_ms) + STOP_GRACE;
        let deadline = Instant::now() + grace;
        while ended(&mut running).is_none() {
            if Instant::now() >= deadline {
                tracing::warn!(pid, "the user-space stack did not stop in time: SIGKILL");
                signal(&running, libc::SIGKILL);
                let killed = Instant::now() + Duration::from_secs(10);
                while ended(&mut running).is_none() {
                    if Instant::now() >= killed {
                        return Err(format!("the user-space stack (pid {pid}) survived SIGKILL"));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::info!(pid, "stopped the user-space stack");
        Ok(())
    }

    /// Fails when a program hoststack did not pin is still attached to `iface`'s XDP hook (the
    /// runner's program goes with the runner's file descriptors).
    fn check_detached(&self, iface: &str) -> Result<(), String> {
        let pins = Pins::new(self.host.bpffs_root(), iface);
        let query = self.host.bpf().map_err(io::Error::from);
        let state = match query.and_then(|bpf| bpf.query_hook(iface, &pins)) {
            Ok(state) => state,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return Ok(()),
            Err(e) => return Err(format!("reading the XDP hook of {iface}: {e}")),
        };
        let left: Vec<String> = state
            .attached
            .iter()
            .filter(|p| state.link_program != Some(p.id))
            .map(|p| format!("program {} ({:?})", p.id, p.name))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the user-space stack stopped but {iface} still has XDP {}",
                left.join(", ")
            ))
        }
    }

    /// The last line the runner wrote (its reason on a failed setup), as `: line`.
    fn last_error_line(&self) -> String {
        let text = fs::read_to_string(self.dir.join("runner.log")).unwrap_or_default();
        text.lines()
            .rev()
            .map(str::trim)
            .take_while(|l| !l.starts_with("=== "))
            .find(|l| !l.is_empty())
            .map(|l| format!(": {l}"))
            .unwrap_or_default()
    }
}

/// How the runner ended, when it has.
fn ended(running: &mut Running) -> Option<String> {
    match &mut running.process {
        Process::Child(child) => match child.try_wait() {
            Ok(Some(status)) => Some(describe(status)),
            Ok(None) => None,
            Err(e) => Some(format!("lost: {e}")),
        },
        Process::Adopted => (start_time(running.pid) != Some(running.start_time))
            .then(|| "exited (it was not this agent's child: no exit status)".to_string()),
    }
}

/// An exit status in words: `exit code 2`, `killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// Sends `signal` to the runner (a runner already gone is no error).
fn signal(running: &Running, signal: libc::c_int) {
    if matches!(running.process, Process::Adopted)
        && start_time(running.pid) != Some(running.start_time)
    {
        return;
    }
    let Ok(pid) = libc::pid_t::try_from(running.pid) else {
        return;
    };
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe { libc::kill(pid, signal) };
}

/// The runner of the pid record in `dir`, when that very process still runs.
fn adopt(dir: &Path) -> Option<Running> {
    let text = fs::read(dir.join("runner.json")).ok()?;
    let record: PidRecord = serde_json::from_slice(&text).ok()?;
    (start_time(record.pid) == Some(record.start_time)).then(|| Running {
        process: Process::Adopted,
        pid: record.pid,
        start_time: record.start_time,
        started: Instant::now(),
        config: record.config,
    })
}

/// The start time of a live (not zombie) process: field 22 of `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, starttime field 22.
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Writes `bytes` to `path` through a temporary file and a rename, synced.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_dead_pid_has_none() {
        let me = start_time(std::process::id());
        assert!(me.is_some());
        assert_eq!(start_time(std::process::id()), me);
        let mut child = Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert_eq!(start_time(pid), None);
    }

    #[test]
    fn a_supervisor_with_no_runner_to_watch_runs_no_thread() {
        let dir = std::env::temp_dir().join(format!("supervisor-idle-{}", std::process::id()));
        let host = Host::new(Path::new("/proc"), Path::new("/sys"));
        let supervisor = Supervisor::new(Path::new("/bin/false"), &dir, Backoff::default(), host);
        let monitor = |s: &Supervisor| s.monitor.lock().unwrap().is_some();
        assert!(!monitor(&supervisor), "no runner adopted, none wanted");
        assert_eq!(supervisor.status(), None);
        supervisor.stop().expect("nothing to stop");
        assert!(!monitor(&supervisor), "stopping nothing starts nothing");
        drop(supervisor);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn exit_statuses_in_words() {
        assert_eq!(describe(ExitStatus::from_raw(2 << 8)), "exit code 2");
        assert_eq!(describe(ExitStatus::from_raw(9)), "killed by signal 9");
    }
}
