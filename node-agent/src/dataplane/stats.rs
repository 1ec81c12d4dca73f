//! The runner's `--stats` file and what the agent reports from it: the stack's part of
//! `NodeTuning.status` ([`status`]) and its TCP counters for the exporter. The file is a
//! [`RunnerStats`] of the agent<->runner contract (crate hoststack-runner-api).
//!
//! The runner rewrites the file atomically every interval, once as soon as every shard serves,
//! and a last time on exit. The agent only reads it.

use std::path::Path;

use hoststack_crds::{
    ServiceKind, StackBackend, StackServiceStatus, StackShardStatus, StackSteeringStatus,
    UserspaceStackStatus,
};
use hoststack_runner_api::{self as api, RunState, RunnerStats};

/// Reads the stats file; `None` when it does not exist (yet) or does not parse.
pub fn read(path: &Path) -> Option<RunnerStats> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The CRD's service kind for the contract's.
fn service_kind(kind: api::ServiceKind) -> ServiceKind {
    match kind {
        api::ServiceKind::Echo => ServiceKind::Echo,
        api::ServiceKind::Discard => ServiceKind::Discard,
        api::ServiceKind::Http => ServiceKind::Http,
    }
}

/// How the supervisor sees the runner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Supervision {
    /// The running runner's pid; `None` while waiting to restart it.
    pub pid: Option<u32>,
    /// Restarts after the runner died.
    pub restarts: u32,
    /// How the last runner ended (exit code or signal, and its last line on stderr).
    pub last_exit: Option<String>,
}

/// The stack's status from the supervisor's view and the runner's stats. Stats of another pid
/// (a runner that died) count for nothing; `warning` is the isolation warning. The message
/// also says when the runner serves without receive stamps, and why.
pub fn status(
    cores: &str,
    backend: StackBackend,
    isolated: bool,
    warning: Option<&str>,
    supervision: &Supervision,
    stats: Option<&RunnerStats>,
) -> UserspaceStackStatus {
    let current = stats.filter(|s| supervision.pid.is_some_and(|pid| pid == s.pid));
    let state = match (supervision.pid, current) {
        (None, _) => "Restarting",
        (Some(_), Some(s)) if s.state == RunState::Running => "Running",
        (Some(_), _) => "Starting",
    };
    let stamps = current.and_then(|s| match &s.rx_stamps {
        Some(api::RxStamps::Unavailable { reason }) => {
            Some(format!("receive stamps unavailable: {reason}"))
        }
        _ => None,
    });
    let message: Vec<String> = warning
        .map(str::to_string)
        .into_iter()
        .chain(stamps)
        .chain(
            supervision
                .last_exit
                .as_ref()
                .map(|e| format!("last exit: {e}")),
        )
        .collect();
    UserspaceStackStatus {
        state: state.into(),
        pid: supervision.pid,
        backend: Some(backend),
        mode: current.map(|s| s.mode.clone()),
        cores: cores.into(),
        isolated,
        restarts: supervision.restarts,
        shards: current
            .map(|s| {
                s.shards
                    .iter()
                    .map(|sh| StackShardStatus {
                        core: sh.core,
                        queue: sh.queue,
                        rx_packets: sh.rx_packets,
                        tx_packets: sh.tx_packets,
                        connections: sh.connections,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        services: current
            .map(|s| {
                s.services
                    .iter()
                    .map(|sv| StackServiceStatus {
                        kind: service_kind(sv.kind),
                        port: sv.port,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        steering: current
            .and_then(|s| s.steering.as_ref())
            .map(|st| StackSteeringStatus {
                source: st.source.as_str().into(),
                key: st.key.clone(),
                indirection_size: st.indirection_size,
            }),
        message: (!message.is_empty()).then(|| message.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = r#"{
        "pid": 1234, "state": "running", "backend": "afXdp", "mode": "copy",
        "shards": [ { "core": 1, "queue": 0, "rxPackets": 10, "txPackets": 8, "connections": 2 } ],
        "services": [ { "kind": "Http", "port": 80 } ],
        "netstat": { "Tcp": { "ActiveOpens": 0, "PassiveOpens": 3, "MaxConn": -1 },
                     "TcpExt": { "TCPSackRecovery": 1 } },
        "steering": { "source": "nic", "key": "6d5a56da", "indirectionSize": 128 }
    }"#;

    fn stats() -> RunnerStats {
        serde_json::from_str(STATS).expect("the contract's example parses")
    }

    #[test]
    fn a_running_runner_reports_its_shards_services_and_mode() {
        let s = stats();
        assert_eq!(s.netstat["TcpExt"]["TCPSackRecovery"], 1);
        assert_eq!(s.netstat["Tcp"]["MaxConn"], -1);
        let sup = Supervision {
            pid: Some(1234),
            restarts: 1,
            last_exit: Some("killed by signal 9".into()),
        };
        let st = status(
            "1",
            StackBackend::AfXdp,
            false,
            Some("warning: x"),
            &sup,
            Some(&s),
        );
        assert_eq!(st.state, "Running");
        assert_eq!(st.pid, Some(1234));
        assert_eq!(st.backend, Some(StackBackend::AfXdp));
        assert_eq!(st.mode.as_deref(), Some("copy"));
        assert_eq!(
            st.shards,
            [StackShardStatus {
                core: 1,
                queue: 0,
                rx_packets: 10,
                tx_packets: 8,
                connections: 2
            }]
        );
        assert_eq!(
            st.services,
            [StackServiceStatus {
                kind: ServiceKind::Http,
                port: 80
            }]
        );
        assert_eq!(
            st.steering,
            Some(StackSteeringStatus {
                source: "nic".into(),
                key: "6d5a56da".into(),
                indirection_size: 128
            })
        );
        assert_eq!(st.restarts, 1);
        assert_eq!(
            st.message.as_deref(),
            Some("warning: x; last exit: killed by signal 9")
        );
    }

    #[test]
    fn a_runner_without_receive_stamps_says_why_in_the_message() {
        let reason = "the kernel refuses bpf_xdp_adjust_meta to XDP programs (verifier: \
                      program of this type cannot use helper bpf_xdp_adjust_meta#54)";
        let mut s = stats();
        s.rx_stamps = Some(api::RxStamps::Unavailable {
            reason: reason.into(),
        });
        let sup = Supervision {
            pid: Some(1234),
            ..Supervision::default()
        };
        let st = status("1", StackBackend::AfXdp, true, None, &sup, Some(&s));
        assert_eq!(st.state, "Running");
        assert_eq!(
            st.message,
            Some(format!("receive stamps unavailable: {reason}"))
        );
        // After the isolation warning; nothing said when stamped, or by a runner of
        // another pid.
        let st = status(
            "1",
            StackBackend::AfXdp,
            false,
            Some("warning: x"),
            &sup,
            Some(&s),
        );
        assert_eq!(
            st.message,
            Some(format!("warning: x; receive stamps unavailable: {reason}"))
        );
        let other = Supervision {
            pid: Some(99),
            ..sup.clone()
        };
        let st = status("1", StackBackend::AfXdp, true, None, &other, Some(&s));
        assert_eq!(st.message, None);
        s.rx_stamps = Some(api::RxStamps::Enabled);
        let st = status("1", StackBackend::AfXdp, true, None, &sup, Some(&s));
        assert_eq!(st.message, None);
    }

    #[test]
    fn stats_of_a_dead_runner_count_for_nothing() {
        let s = stats();
        let restarting = Supervision {
            pid: None,
            restarts: 2,
            last_exit: None,
        };
        let st = status("1", StackBackend::AfXdp, true, None, &restarting, Some(&s));
        assert_eq!(st.state, "Restarting");
        assert!(st.shards.is_empty() && st.services.is_empty() && st.mode.is_none());
        assert_eq!(st.steering, None);
        assert_eq!(st.message, None);
        // A new runner that has not written its own stats yet: Starting.
        let new = Supervision {
            pid: Some(99),
            ..restarting
        };
        let st = status("1", StackBackend::AfXdp, true, None, &new, Some(&s));
        assert_eq!(st.state, "Starting");
        assert!(st.shards.is_empty());
        assert_eq!(
            status("1", StackBackend::AfXdp, true, None, &new, None).state,
            "Starting"
        );
    }

    #[test]
    fn a_missing_or_torn_file_reads_as_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stats.json");
        assert_eq!(read(&path), None);
        std::fs::write(&path, &STATS[..40]).expect("write");
        assert_eq!(read(&path), None);
        std::fs::write(&path, STATS).expect("write");
        assert_eq!(read(&path), Some(stats()));
    }
}
