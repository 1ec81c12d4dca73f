//! The test hooks of the lab's build (cargo feature `test-hooks`), which observe every
//! transaction ([`Progress`]): a pause after each host write, so that a test can interrupt a
//! transaction (`--step-delay`), and a log of every host write and journal save, which the
//! lab's fault harness reads as the node's history (`--write-log`). A user's build has neither
//! flag: its [`Hooks`] are the default, which observe nothing.
//!
//! The write log is JSON lines, appended (so a SIGKILL loses no line already written):
//! `{"micros": <unix time>, "wrote": {"kind", "target", "value", "revision"}}`, with `revision`
//! null for a write that restores a value, and `{"micros": <unix time>, "journal": <journal.json
//! as saved>}`.

use std::path::PathBuf;
use std::time::Duration;

use crate::transaction::Progress;

/// What the hooks do; the default does nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hooks {
    /// The pause after each host write.
    pub step_delay: Duration,
    /// Where to append the write log, if anywhere.
    pub write_log: Option<PathBuf>,
}

impl Hooks {
    /// Observes one step of a transaction: logs it, then pauses if it was a write.
    pub fn observe(&self, progress: Progress<'_>) {
        #[cfg(feature = "test-hooks")]
        if let Some(path) = &self.write_log {
            log::append(path, progress);
        }
        if matches!(progress, Progress::Wrote { .. }) && !self.step_delay.is_zero() {
            std::thread::sleep(self.step_delay);
        }
    }
}

#[cfg(feature = "test-hooks")]
mod log {
    use std::io::Write;
    use std::path::Path;
    use std::time::{SystemTime, UNIX_EPOCH};

    use crate::transaction::Progress;

    /// Appends `progress` to the write log at `path` as one line. A log that cannot be written
    /// is reported and the transaction goes on: the log observes, it never decides.
    pub fn append(path: &Path, progress: Progress<'_>) {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let line = match progress {
            Progress::Wrote {
                setting,
                value,
                target,
            } => serde_json::json!({
                "micros": micros,
                "wrote": {
                    "kind": setting.kind.as_str(),
                    "target": setting.target,
                    "value": value,
                    "revision": target.map(|t| t.revision.as_str()),
                },
            }),
            Progress::Saved(journal) => serde_json::json!({"micros": micros, "journal": journal}),
        };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), error = %e, "appending to the write log");
        }
    }
}

#[cfg(all(test, feature = "test-hooks"))]
mod tests {
    use super::*;
    use crate::journal::{Applied, Entry, Journal};
    use crate::model::{Kind, Setting};

    #[test]
    fn the_write_log_has_a_line_per_write_and_per_save() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("writes.jsonl");
        let hooks = Hooks {
            write_log: Some(path.clone()),
            ..Hooks::default()
        };
        let setting = Setting {
            kind: Kind::Sysctl,
            target: "net.core.somaxconn".into(),
        };
        let applied = Applied {
            tuning: "edge".into(),
            revision: "edge-1".into(),
        };
        let journal = Journal {
            originals: vec![Entry::new(&setting, "4096")],
            ..Journal::default()
        };
        hooks.observe(Progress::Saved(&journal));
        hooks.observe(Progress::Wrote {
            setting: &setting,
            value: "8192",
            target: Some(&applied),
        });
        hooks.observe(Progress::Wrote {
            setting: &setting,
            value: "4096",
            target: None,
        });
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0]["journal"]["originals"][0]["value"],
            serde_json::json!("4096")
        );
        assert_eq!(
            lines[1]["wrote"],
            serde_json::json!({"kind": "sysctl", "target": "net.core.somaxconn", "value": "8192", "revision": "edge-1"})
        );
        assert_eq!(lines[2]["wrote"]["revision"], serde_json::Value::Null);
        assert!(lines.iter().all(|l| l["micros"].as_u64().unwrap() > 0));
    }
}
