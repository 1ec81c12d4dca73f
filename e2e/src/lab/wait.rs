//! Waiting and diagnosing: polling a check until it holds or its time is up, the lab's own log
//! of what it did when (`logs/lab.log`), and the report that says what to look at when a test
//! fails (which processes run, the tails of the hoststack logs, the tunings' state).

use crate::process::{self, tail, ProcessState};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// How often a wait polls its check.
const POLL: Duration = Duration::from_millis(250);

/// Polls `check` every 250 ms until it returns `Some`, and returns that; `None` once `timeout`
/// has passed.
pub(crate) fn poll<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// [`poll`] for async checks.
pub(crate) async fn poll_async<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The lab's own log, `logs/lab.log`: start-up phases with timestamps.
pub(crate) struct LabLog {
    path: PathBuf,
}

impl LabLog {
    /// The log of the lab in `lab_dir`.
    pub fn in_dir(lab_dir: &Path) -> LabLog {
        LabLog {
            path: process::log_path(lab_dir, "lab"),
        }
    }

    /// Appends `line`.
    pub fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            let _ = writeln!(file, "{line}");
        }
    }

    /// Appends `what`, prefixed with the seconds since `started`.
    pub fn phase(&self, started: Instant, what: &str) {
        self.note(&format!("{:>6.2}s {what}", started.elapsed().as_secs_f64()));
    }
}

/// The report of the lab in `lab_dir`: the state of each of `processes`, the tails of the logs
/// `logs` that exist, and `tunings` (the output of `kubectl get networktunings,nodetunings -o
/// yaml`).
pub(crate) fn report(
    lab_dir: &Path,
    processes: &[ProcessState],
    logs: &[String],
    tunings: &Output,
) -> String {
    let mut out = format!("==== hoststack lab {} ====\n", lab_dir.display());
    for p in processes {
        let state = match p.exited {
            Some(status) => format!("exited ({status})"),
            None => format!("running (pid {})", p.pid),
        };
        out.push_str(&format!("{}: {state}\n", p.name));
    }
    for log in logs {
        let path = process::log_path(lab_dir, log);
        if path.exists() {
            out.push_str(&format!(
                "---- {log}.log (tail) ----\n{}\n",
                tail(&path, 40)
            ));
        }
    }
    out.push_str(&format!(
        "---- kubectl get networktunings,nodetunings -o yaml ----\n{}{}",
        String::from_utf8_lossy(&tunings.stdout),
        String::from_utf8_lossy(&tunings.stderr)
    ));
    out
}
