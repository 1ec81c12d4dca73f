//! The API server's audit log: every write request, who made it and what came of it, one JSON
//! event per line in `logs/audit.log` (the `audit.k8s.io/v1` Event). Reads are not recorded.
//! The operators' election Lease is recorded with its request and response bodies, so that a
//! test can tell from the log who held the lease after each write, and so are the writes of
//! hoststack's own objects (NodeTunings, NetworkTunings and their status), from which the fault
//! harness reads every assignment and report (crate::faults::record); every other write at the
//! Metadata level (user, verb, object, response code, timestamps).
//!
//! A test reads it to prove what happened in the API rather than what a fixed wait suggests,
//! e.g. that a standby operator replica wrote nothing before it held the lease
//! (e2e/tests/leader_election.rs).

use super::kubeconfigs::NAMESPACE;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The audit log of the lab in `lab_dir`.
pub(crate) fn log_path(lab_dir: &Path) -> PathBuf {
    crate::process::log_path(lab_dir, "audit")
}

/// Writes the audit policy into `lab_dir` and returns the API server's flags that use it.
pub(crate) fn apiserver_flags(lab_dir: &Path) -> Result<Vec<String>> {
    let policy = lab_dir.join("audit-policy.yaml");
    std::fs::write(&policy, policy_yaml())
        .map_err(|e| Error::io(format!("writing {}", policy.display()), e))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log_path(lab_dir).display()),
        "--audit-log-format=json".to_string(),
        // One file, never rotated (0 means the default, 100 MB): the readers of the log read
        // one file, and a scale run writes more than that.
        "--audit-log-maxsize=1000000".to_string(),
        // Written while the request is answered, so an event is in the file once its request
        // has returned.
        "--audit-log-mode=blocking".to_string(),
    ])
}

/// The audit policy (the first rule that matches a request decides its level).
fn policy_yaml() -> String {
    format!(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    verbs: [get, list, watch]
  - level: RequestResponse
    namespaces: [{NAMESPACE}]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
        resourceNames: [{lease}]
  - level: RequestResponse
    resources:
      - group: {group}
        resources: [nodetunings, nodetunings/status, networktunings, networktunings/status]
  - level: Metadata
",
        lease = hoststack_crds::OPERATOR_LEASE,
        group = hoststack_crds::GROUP,
    )
}

/// The events in the audit log at `path` so far, in the order written. A last line still being
/// written is left out; any other line that is not JSON is an error.
pub(crate) fn events(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    // Everything after the last newline is an event not yet complete.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| {
                Error::Setup(format!("{} line {}: not JSON ({e})", path.display(), i + 1))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_records_writes_and_the_election_lease_and_tunings_in_full() {
        let policy = policy_yaml();
        assert!(policy.contains("  - level: None\n    verbs: [get, list, watch]\n"));
        assert!(policy.contains("resourceNames: [hoststack-operator]"));
        assert!(policy.contains("      - group: hoststack.dev\n        resources: [nodetunings, nodetunings/status, networktunings, networktunings/status]\n"));
        assert!(policy.ends_with("  - level: Metadata\n"));
    }

    #[test]
    fn a_line_being_written_is_left_out() {
        let dir = std::env::temp_dir().join(format!("hoststack-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, "{\"verb\":\"create\"}\n{\"verb\":\"patch\"}\n{\"ver").unwrap();
        let events = events(&path).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1]["verb"], "patch");
        std::fs::write(&path, "{\"verb\":\"create\"}\nnot json\n").unwrap();
        assert!(events_err(&path).contains("line 2: not JSON"));
        assert!(super::events(&dir.join("none")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn events_err(path: &Path) -> String {
        super::events(path).unwrap_err().to_string()
    }
}
