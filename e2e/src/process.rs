//! The lab's long-running processes: spawned so that they die with the lab, logged to
//! `<lab dir>/logs/<name>.log`, marked with the lab directory so that the lab's processes can be
//! found by it, and stopped with SIGTERM then SIGKILL.

use crate::{Error, Result};
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Environment variable set on every lab process: the lab directory. The sweeper finds a
/// dead lab's processes by it.
pub(crate) const LAB_DIR_ENV: &str = "HOSTSTACK_LAB_DIR";

/// A signal the tests may send to a lab process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: orderly shutdown.
    Term,
    /// SIGKILL: immediate death, e.g. in the middle of a transaction.
    Kill,
    /// SIGINT.
    Int,
    /// SIGSTOP: freeze.
    Stop,
    /// SIGCONT: thaw after [`Signal::Stop`].
    Cont,
}

impl Signal {
    pub(crate) fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Int => libc::SIGINT,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to process `pid`; a process that is already gone is not an error.
pub(crate) fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal.raw()) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        Ok(())
    } else {
        Err(err)
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// A thread that forks every long-running lab process.
///
/// Each process gets PR_SET_PDEATHSIG = SIGKILL, which the kernel delivers when the *thread*
/// that forked it exits. Forking from a thread that lives exactly as long as the lab means
/// the processes die with the lab, or with the test process when it is killed, and never
/// earlier (as they would if a short-lived worker thread forked them).
pub(crate) struct Spawner {
    lab_dir: PathBuf,
    requests: Option<mpsc::Sender<SpawnRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    /// Starts the thread that forks the processes of the lab in `lab_dir`.
    pub fn new(lab_dir: &Path) -> Result<Spawner> {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let thread = thread::Builder::new()
            .name("hoststack-lab-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .map_err(|e| Error::io("starting the spawner thread", e))?;
        Ok(Spawner {
            lab_dir: lab_dir.to_path_buf(),
            requests: Some(tx),
            thread: Some(thread),
        })
    }

    /// Starts the lab process `name` (e.g. "agent node-a"): `program` with `args` and `env`
    /// (plus `NO_COLOR=1`, and `RUST_LOG=info` unless set), its output appended to
    /// `logs/<name>.log` (spaces as '-'), in a process group of its own (so a terminal's Ctrl-C
    /// reaches only the lab's owner, which then tears down in order), marked with the lab
    /// directory.
    pub fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Managed> {
        let log = log_path(&self.lab_dir, &name.replace(' ', "-"));
        let mut env = env.to_vec();
        env.push(env_var("NO_COLOR", "1"));
        if std::env::var_os("RUST_LOG").is_none() {
            env.push(env_var("RUST_LOG", "info"));
        }
        self.spawn_logged(name, program, args, &env, log)
            .map_err(|e| Error::io(format!("starting {name} ({})", program.display()), e))
    }

    fn spawn_logged(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: PathBuf,
    ) -> io::Result<Managed> {
        let mut file = OpenOptions::new().create(true).append(true).open(&log)?;
        writeln!(
            file,
            "=== {} {} {}",
            unix_time(),
            program.display(),
            args.join(" ")
        )?;
        let mut command = Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env(LAB_DIR_ENV, &self.lab_dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0);
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (prctl, getppid, _exit).
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The lab died between fork and prctl: do not outlive it.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        self.requests
            .as_ref()
            .expect("spawner is running")
            .send((command, tx))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
        let child = rx
            .recv()
            .map_err(|_| io::Error::other("spawner thread is gone"))??;
        Ok(Managed {
            name: name.to_string(),
            child,
            log,
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env.to_vec(),
        })
    }

    /// Starts `process` again, as it was started (program, arguments, environment, log), once
    /// it has exited: a restart of etcd or the API server on the same data and ports.
    pub fn respawn(&self, process: &Managed) -> Result<Managed> {
        let Managed {
            name,
            program,
            args,
            env,
            log,
            ..
        } = process;
        self.spawn_logged(name, program, args, env, log.clone())
            .map_err(|e| Error::io(format!("restarting {name} ({})", program.display()), e))
    }

    /// Ends the thread (once no process of the lab runs any more: its exit kills whatever it
    /// forked); spawning afterwards panics.
    pub fn stop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running lab process.
pub(crate) struct Managed {
    /// Short name for messages: etcd, kube-apiserver, operator, agent node-a.
    pub name: String,
    child: Child,
    /// Its log file.
    pub log: PathBuf,
    /// What it runs, with which arguments and environment ([`Spawner::respawn`]).
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Managed {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its name, pid and exit status, for listings.
    pub fn state(&mut self) -> ProcessState {
        ProcessState {
            name: self.name.clone(),
            pid: self.pid(),
            exited: self.exited(),
        }
    }

    /// The error for a wait on `what` that this process ended by exiting, with its log's tail;
    /// `None` while it runs.
    pub fn exited_while_waiting(&mut self, what: &str) -> Option<Error> {
        let status = self.exited()?;
        Some(Error::Setup(format!(
            "{} exited ({status}) while waiting for {what}; its log:\n{}",
            self.name,
            tail(&self.log, 30)
        )))
    }

    /// Sends `signal` to the process.
    pub fn signal(&mut self, signal: Signal) -> io::Result<()> {
        if self.exited().is_some() {
            return Ok(());
        }
        send_signal(self.pid(), signal)
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns the exit status, or a message
    /// when even SIGKILL did not end it.
    pub fn stop(&mut self, grace: Duration) -> Result<ExitStatus, String> {
        let _ = self.signal(Signal::Term);
        if let Some(status) = self.wait_timeout(grace) {
            return Ok(status);
        }
        self.kill()
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) -> Result<ExitStatus, String> {
        let _ = self.signal(Signal::Kill);
        self.wait_timeout(Duration::from_secs(10))
            .ok_or_else(|| format!("{} (pid {}) survived SIGKILL", self.name, self.pid()))
    }
}

/// A lab process as seen at one moment: what [`crate::Lab::processes`] and the diagnostics list.
pub(crate) struct ProcessState {
    /// Its name (see [`Managed::name`]).
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Its exit status once it has exited.
    pub exited: Option<ExitStatus>,
}

/// The log file of lab process `process` ("etcd", "operator", "agent-node-a", "lab", ...).
pub(crate) fn log_path(lab_dir: &Path, process: &str) -> PathBuf {
    lab_dir.join("logs").join(format!("{process}.log"))
}

/// Owned copies of `items`, for argument lists.
pub(crate) fn args(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// An environment entry `key=value`.
pub(crate) fn env_var(key: &str, value: impl AsRef<std::ffi::OsStr>) -> (String, String) {
    (
        key.to_string(),
        value.as_ref().to_string_lossy().into_owned(),
    )
}

/// Processes (other than this one) whose environment marks them as lab `dir`'s.
pub(crate) fn processes_of(dir: &Path) -> Vec<u32> {
    let marker = format!("{LAB_DIR_ENV}={}", dir.display());
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|&b| b == 0)
                    .any(|entry| entry == marker.as_bytes())
            })
        })
        .collect()
}

/// SIGKILLs every process of lab `dir` and waits (up to 10 s) until they are gone. Returns
/// how many there were.
pub(crate) fn kill_processes_of(dir: &Path) -> usize {
    let pids = processes_of(dir);
    for &pid in &pids {
        let _ = send_signal(pid, Signal::Kill);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| running(pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    pids.len()
}

/// Whether `pid` exists and is not a zombie.
pub(crate) fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z") | Some("X") | None)
}

/// Seconds since the epoch, for log markers.
pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The last `lines` lines of the file at `path` (or a note that it cannot be read).
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}
