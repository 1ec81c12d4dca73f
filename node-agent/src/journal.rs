//! The journal: the agent's crash-safe record of what it changed on the host, and the only
//! source of truth for reverting it.
//!
//! One JSON file, `<state-dir>/journal.json`, replaced atomically (write a temporary file, fsync
//! it, rename it over the journal, fsync the directory), so a crash leaves either the old or the
//! new journal, never a torn one. See docs/agent.md for the format.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{Kind, Setting};
use crate::{Error, Result};

/// The journal format this agent writes and reads.
pub const JOURNAL_VERSION: u32 = 1;

/// File name of the journal inside the state dir.
pub const JOURNAL_FILE: &str = "journal.json";

/// What the agent has changed on the host.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Journal {
    /// Format version, [`JOURNAL_VERSION`].
    pub version: u32,
    /// The value each managed setting had before hoststack first touched it, in the order they
    /// were first touched. An original is kept across revisions until its setting is restored,
    /// and is never overwritten.
    #[serde(default)]
    pub originals: Vec<Entry>,
    /// The revision the host is on; absent when hoststack manages nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<Applied>,
    /// A transaction that started writing and has not finished; on startup its `before` values
    /// are restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction: Option<InFlight>,
    /// The applied revision while it is not confirmed yet; undone like an interrupted
    /// transaction (on startup among others) unless the agent confirms it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisional: Option<Provisional>,
}

/// An applied revision the agent has not confirmed yet (its probes, its status read back).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Provisional {
    /// The transaction that applied it: its `before` values are what an undo restores, its
    /// `added` originals what an undo drops.
    pub transaction: InFlight,
    /// The revision the host was on before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Applied>,
    /// The originals the transaction released (their settings went back to them): an undo
    /// manages them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<Entry>,
    /// When it is undone unless confirmed, in seconds since the epoch.
    pub deadline: u64,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            version: JOURNAL_VERSION,
            originals: Vec::new(),
            applied: None,
            transaction: None,
            provisional: None,
        }
    }
}

impl Journal {
    /// The original value of a setting, if hoststack manages it.
    pub fn original(&self, setting: &Setting) -> Option<&str> {
        self.originals
            .iter()
            .find(|e| e.kind == setting.kind && e.target == setting.target)
            .map(|e| e.value.as_str())
    }

    /// Whether the journal records nothing: no managed setting, no revision, no transaction.
    pub fn is_empty(&self) -> bool {
        self.originals.is_empty()
            && self.applied.is_none()
            && self.transaction.is_none()
            && self.provisional.is_none()
    }
}

/// One setting and a value of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Which applier owns the setting.
    pub kind: Kind,
    /// The setting's name, e.g. `net.ipv4.tcp_sack`.
    pub target: String,
    /// The value, as the kernel printed it (without the trailing newline).
    pub value: String,
}

impl Entry {
    /// An entry for `setting`.
    pub fn new(setting: &Setting, value: impl Into<String>) -> Self {
        Entry {
            kind: setting.kind,
            target: setting.target.clone(),
            value: value.into(),
        }
    }

    /// The setting this entry is about.
    pub fn setting(&self) -> Setting {
        Setting {
            kind: self.kind,
            target: self.target.clone(),
        }
    }
}

/// The revision the host is on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Applied {
    /// The NetworkTuning it came from.
    pub tuning: String,
    /// Its revision.
    pub revision: String,
}

/// A transaction between its journal write and its end.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    /// Where it was going: the revision being applied, or absent for a revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Applied>,
    /// The value of every setting it writes, as it was before the transaction, in write order.
    pub before: Vec<Entry>,
    /// Settings whose originals this transaction added to `originals`; dropped again when the
    /// transaction is undone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<Setting>,
}

/// The journal file in a state directory.
#[derive(Clone, Debug)]
pub struct JournalStore {
    dir: PathBuf,
}

impl JournalStore {
    /// The journal in `dir` (created on the first save).
    pub fn new(dir: &Path) -> Self {
        JournalStore {
            dir: dir.to_path_buf(),
        }
    }

    /// The journal file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Reads the journal; an absent file is an empty journal.
    pub fn load(&self) -> Result<Journal> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Journal::default()),
            Err(source) => return Err(Error::JournalIo { path, source }),
        };
        let journal: Journal =
            serde_json::from_slice(&bytes).map_err(|e| Error::JournalCorrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if journal.version != JOURNAL_VERSION {
            return Err(Error::JournalCorrupt {
                path,
                reason: format!(
                    "version {} (this agent reads version {JOURNAL_VERSION})",
                    journal.version
                ),
            });
        }
        Ok(journal)
    }

    /// Replaces the journal atomically and durably.
    pub fn save(&self, journal: &Journal) -> Result<()> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::JournalIo { path, source }
        };
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        let path = self.path();
        let tmp = self.dir.join(format!("{JOURNAL_FILE}.tmp"));
        let mut bytes = serde_json::to_vec_pretty(journal)?;
        bytes.push(b'\n');
        let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(&bytes).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        drop(file);
        fs::rename(&tmp, &path).map_err(io_err(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Journal {
        Journal {
            version: JOURNAL_VERSION,
            originals: vec![
                Entry::new(&Setting::sysctl("net.ipv4.tcp_sack"), "1"),
                Entry::new(
                    &Setting::sysctl("net.ipv4.tcp_rmem"),
                    "4096\t131072\t6291456",
                ),
            ],
            applied: Some(Applied {
                tuning: "edge".into(),
                revision: "abc".into(),
            }),
            transaction: Some(InFlight {
                target: Some(Applied {
                    tuning: "edge".into(),
                    revision: "def".into(),
                }),
                before: vec![Entry::new(&Setting::sysctl("net.ipv4.tcp_sack"), "0")],
                added: vec![Setting::sysctl("net.ipv4.tcp_rmem")],
            }),
            provisional: Some(Provisional {
                transaction: InFlight {
                    target: Some(Applied {
                        tuning: "edge".into(),
                        revision: "abc".into(),
                    }),
                    before: vec![Entry::new(&Setting::sysctl("net.ipv4.tcp_sack"), "1")],
                    added: Vec::new(),
                },
                previous: None,
                released: Vec::new(),
                deadline: 1_800_000_000,
            }),
        }
    }

    #[test]
    fn round_trip_and_absent_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = JournalStore::new(&dir.path().join("state"));
        assert_eq!(store.load().expect("load"), Journal::default());
        assert!(Journal::default().is_empty());
        let j = sample();
        store.save(&j).expect("save");
        assert_eq!(store.load().expect("load"), j);
        // Saving again replaces, leaving no temporary file behind.
        store.save(&Journal::default()).expect("save");
        assert_eq!(store.load().expect("load"), Journal::default());
        let names: Vec<_> = fs::read_dir(dir.path().join("state"))
            .expect("readdir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(JOURNAL_FILE)]);
    }

    #[test]
    fn format_is_stable() {
        let text = serde_json::to_value(sample()).expect("json");
        assert_eq!(
            text,
            serde_json::json!({
                "version": 1,
                "originals": [
                    {"kind": "sysctl", "target": "net.ipv4.tcp_sack", "value": "1"},
                    {"kind": "sysctl", "target": "net.ipv4.tcp_rmem", "value": "4096\t131072\t6291456"}
                ],
                "applied": {"tuning": "edge", "revision": "abc"},
                "transaction": {
                    "target": {"tuning": "edge", "revision": "def"},
                    "before": [{"kind": "sysctl", "target": "net.ipv4.tcp_sack", "value": "0"}],
                    "added": [{"kind": "sysctl", "target": "net.ipv4.tcp_rmem"}]
                },
                "provisional": {
                    "transaction": {
                        "target": {"tuning": "edge", "revision": "abc"},
                        "before": [{"kind": "sysctl", "target": "net.ipv4.tcp_sack", "value": "1"}]
                    },
                    "deadline": 1_800_000_000u64
                }
            })
        );
    }

    #[test]
    fn a_torn_temporary_file_does_not_affect_the_journal() {
        // A crash between writing the temporary file and the rename leaves the old journal.
        let dir = tempfile::tempdir().expect("tempdir");
        let store = JournalStore::new(dir.path());
        store.save(&sample()).expect("save");
        fs::write(
            dir.path().join("journal.json.tmp"),
            b"{\"version\": 1, \"orig",
        )
        .expect("w");
        assert_eq!(store.load().expect("load"), sample());
        // The next save replaces the leftover.
        store.save(&Journal::default()).expect("save");
        assert_eq!(store.load().expect("load"), Journal::default());
    }

    #[test]
    fn corrupt_or_unknown_journals_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = JournalStore::new(dir.path());
        fs::write(store.path(), b"{not json").expect("w");
        assert!(matches!(store.load(), Err(Error::JournalCorrupt { .. })));
        fs::write(store.path(), br#"{"version": 99}"#).expect("w");
        let err = store.load().expect_err("version 99");
        assert!(err.to_string().contains("version 99"), "{err}");
    }
}
