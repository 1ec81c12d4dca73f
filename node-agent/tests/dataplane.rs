//! The dataplane supervisor's process lifecycle, against a stand-in runner: a shell script that
//! keeps the runner's contract (`run --config FILE --stats FILE`, the stats file written
//! atomically with its pid, SIGTERM ends it with exit 0, a failed setup is one line on stderr and
//! exit 2). The real runner on real packets is the lab's test (e2e/tests/userstack.rs); here the
//! supervisor's own behaviour is checked: start, restart with backoff after SIGKILL, taking over
//! the runner of an earlier agent instead of starting a second one, graceful stop, and the
//! runner's counters in the exporter next to the kernel's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hoststack_agent::dataplane::backoff::Backoff;
use hoststack_agent::dataplane::runner_config::translate;
use hoststack_agent::dataplane::{Supervisor, Wanted};
use hoststack_agent::exporter::{Exporter, Format};
use hoststack_agent::host::Host;
use hoststack_crds::{ServiceKind, StackBackend, StackService, UserspaceStack};

/// A runner that serves until SIGTERM: writes `running` stats, and `stopped` on SIGTERM.
const SERVING: &str = r#"#!/bin/sh
stats="$5"
write() {
  printf '{"pid":%d,"state":"%s","backend":"afXdp","mode":"copy","shards":[{"core":1,"queue":0,"rxPackets":7,"txPackets":5,"connections":1}],"services":[{"kind":"Http","port":80}],"netstat":{"Tcp":{"PassiveOpens":3,"CurrEstab":1},"TcpExt":{"TCPSackRecovery":2}}}' "$$" "$1" > "$stats.tmp"
  mv "$stats.tmp" "$stats"
}
trap 'write stopped; exit 0' TERM
write running
while :; do sleep 0.05; done
"#;

/// A runner whose setup fails, as the contract says: one line on stderr, exit code 2.
const FAILING: &str = r#"#!/bin/sh
echo "no such interface hs-dp-none0" >&2
exit 2
"#;

/// An interface that does not exist: its XDP hook reads as empty.
const IFACE: &str = "hs-dp-none0";

fn runner(dir: &Path, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("hoststack-userstack");
    std::fs::write(&path, script).expect("write the stand-in runner");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn wanted() -> Wanted {
    let stack = UserspaceStack {
        cores: "1".into(),
        interface: IFACE.into(),
        backend: StackBackend::AfXdp,
        address: "198.18.200.2/24".into(),
        services: vec![StackService {
            kind: ServiceKind::Http,
            port: 80,
            body: Some("hello\n".into()),
        }],
        ..UserspaceStack::default()
    };
    Wanted {
        config: translate(&stack, &[1].into(), None),
        cores: "1".into(),
        backend: StackBackend::AfXdp,
        isolated: false,
        warning: Some("warning: not isolated".into()),
    }
}

fn quick() -> Backoff {
    Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(200),
        healthy_run: Duration::from_secs(600),
    }
}

/// Polls `check` until it holds (panicking with `what` after 20 s).
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Processes running `binary` (by their command line), not counting a fork of one of them: the
/// stand-in is a shell script, and between its fork and the exec of `sleep` or `mv` the child
/// has the script's command line too (seen in a CI run on a loaded machine: a second "runner"
/// two pids above the first).
fn processes_of(binary: &Path) -> Vec<u32> {
    let needle = binary.to_string_lossy().into_owned();
    let running: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command name in parentheses: the state, then the parent's pid.
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = fields.next()?;
            let parent = fields.next()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (state != "Z" && String::from_utf8_lossy(&cmdline).contains(&needle))
                .then_some((pid, parent))
        })
        .collect();
    running
        .iter()
        .filter(|(_, parent)| !running.iter().any(|(pid, _)| pid == parent))
        .map(|(pid, _)| *pid)
        .collect()
}

/// Kills what a failed test left running.
struct Reaper(PathBuf);

impl Drop for Reaper {
    fn drop(&mut self) {
        for pid in processes_of(&self.0) {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
    }
}

fn host() -> Host {
    Host::new(Path::new("/proc"), Path::new("/sys"))
}

#[test]
fn the_runner_is_restarted_after_sigkill_taken_over_by_a_new_agent_and_stopped_gracefully() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = runner(dir.path(), SERVING);
    let _reaper = Reaper(binary.clone());
    let state = dir.path().join("state");

    let sup = Supervisor::new(&binary, &state, quick(), host());
    assert_eq!(sup.status(), None, "nothing wanted, nothing reported");
    sup.ensure(wanted()).expect("start");
    wait_for("the runner to serve", || {
        sup.status().is_some_and(|s| s.state == "Running")
    });
    let status = sup.status().expect("status");
    let first = status.pid.expect("pid");
    assert_eq!(status.mode.as_deref(), Some("copy"));
    assert_eq!(status.backend, Some(StackBackend::AfXdp));
    assert_eq!(status.shards.len(), 1);
    assert_eq!(status.shards[0].rx_packets, 7);
    assert_eq!(status.services[0].port, 80);
    assert_eq!(status.restarts, 0);
    assert!(!status.isolated);
    assert_eq!(status.message.as_deref(), Some("warning: not isolated"));
    let config: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("userstack/config.json")).expect("config written"),
    )
    .expect("json");
    assert_eq!(config["interface"], IFACE);
    assert_eq!(config["services"][0]["kind"], "Http");

    // SIGKILL: the supervisor starts it again, after the backoff.
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(first as libc::pid_t, libc::SIGKILL) },
        0
    );
    wait_for("a new runner to serve", || {
        sup.status()
            .is_some_and(|s| s.state == "Running" && s.pid != Some(first))
    });
    let status = sup.status().expect("status");
    let second = status.pid.expect("pid");
    assert_eq!(status.restarts, 1);
    assert_eq!(
        status.message.as_deref(),
        Some("warning: not isolated; last exit: killed by signal 9")
    );
    assert_eq!(processes_of(&binary), [second]);

    // The agent goes away (its monitor thread ends); the runner keeps serving, and the next
    // agent takes it over instead of starting a second one.
    drop(sup);
    assert_eq!(processes_of(&binary), [second]);
    let next = Supervisor::new(&binary, &state, quick(), host());
    assert_eq!(next.pid(), Some(second));
    next.ensure(wanted()).expect("keep");
    assert_eq!(next.pid(), Some(second));
    assert_eq!(processes_of(&binary), [second]);
    assert_eq!(next.status().expect("status").state, "Running");

    // Revert: SIGTERM, and the runner is gone with its files.
    next.stop().expect("stop");
    assert_eq!(next.pid(), None);
    assert_eq!(next.status(), None);
    assert!(processes_of(&binary).is_empty());
    for file in ["runner.json", "config.json", "stats.json"] {
        assert!(
            !state.join("userstack").join(file).exists(),
            "{file} is left"
        );
    }
    // The runner was this test process' child: reap it.
    // SAFETY: waitpid on our own child with a null status pointer.
    unsafe { libc::waitpid(second as libc::pid_t, std::ptr::null_mut(), 0) };
    // Stopping again is a no-op.
    next.stop().expect("stop again");
}

#[test]
fn a_runner_whose_setup_fails_is_retried_with_its_reason_in_status() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = runner(dir.path(), FAILING);
    let _reaper = Reaper(binary.clone());
    let sup = Supervisor::new(&binary, &dir.path().join("state"), quick(), host());
    sup.ensure(wanted()).expect("start");
    wait_for("two restarts", || {
        sup.status().is_some_and(|s| s.restarts >= 2)
    });
    let status = sup.status().expect("status");
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.ends_with("last exit: exit code 2: no such interface hs-dp-none0")),
        "{status:?}"
    );
    assert!(status.shards.is_empty());
    sup.stop().expect("stop");
    assert_eq!(sup.status(), None);
    assert!(
        !dir.path().join("state/userstack/config.json").exists(),
        "the files of a runner that is not running go too"
    );
}

#[test]
fn a_missing_runner_binary_is_reported_and_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("hoststack-userstack");
    let sup = Supervisor::new(&missing, &dir.path().join("state"), quick(), host());
    sup.ensure(wanted()).expect("ensure");
    wait_for("a retry", || sup.status().is_some_and(|s| s.restarts >= 1));
    let status = sup.status().expect("status");
    assert_eq!(status.state, "Restarting");
    let message = status.message.expect("message");
    assert!(
        message.contains(&format!("cannot start {}", missing.display())),
        "{message}"
    );
    sup.stop().expect("stop");
}

#[test]
fn the_runner_counters_are_exported_beside_the_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stats = dir.path().join("stats.json");
    std::fs::write(
        &stats,
        r#"{"pid":1,"state":"running","mode":"copy","shards":[],"services":[],
            "netstat":{"Tcp":{"PassiveOpens":3,"CurrEstab":2,"MaxConn":-1},
                       "TcpExt":{"TCPSackRecovery":4,"TCPDSACKRecv":1}}}"#,
    )
    .expect("write stats");
    let proc_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc/linux-6.18");
    let exporter = Exporter::with_userstack_stats(&proc_root, Some(&stats));
    let text = exporter.encode_as(Format::PrometheusText);
    for line in [
        "hoststack_netstat_total{stack=\"userspace\",proto=\"TcpExt\",field=\"TCPSackRecovery\"} 4",
        "hoststack_netstat_total{stack=\"userspace\",proto=\"TcpExt\",field=\"TCPDSACKRecv\"} 1",
        "hoststack_netstat_total{stack=\"userspace\",proto=\"Tcp\",field=\"PassiveOpens\"} 3",
        "hoststack_netstat_value{stack=\"userspace\",proto=\"Tcp\",field=\"CurrEstab\"} 2",
        "hoststack_netstat_value{stack=\"userspace\",proto=\"Tcp\",field=\"MaxConn\"} -1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?}");
    }
    // The kernel's are still there, in the same families: one TYPE line for each.
    assert!(text.contains("hoststack_netstat_total{stack=\"kernel\",proto=\"TcpExt\""));
    let types = |family: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("# TYPE {family} ")))
            .count()
    };
    assert_eq!(
        (
            types("hoststack_netstat_total"),
            types("hoststack_netstat_value")
        ),
        (1, 1),
        "{text}"
    );
    // Without a stats file (no stack runs) there is no userspace series at all.
    std::fs::remove_file(&stats).expect("rm");
    let text = exporter.encode_as(Format::PrometheusText);
    assert!(!text.contains("stack=\"userspace\""));
}
