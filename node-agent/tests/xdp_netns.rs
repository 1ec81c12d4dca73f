//! The XDP applier against the real kernel: the built-in programs loaded with aya, attached
//! through pinned BPF links to a veth, dropping real traffic.
//!
//! The test re-runs itself under `unshare --net --mount`: a fresh network namespace (the
//! "node", holding the veth the blocklist sits on, a bridge device, and a TCP listener) and a
//! private mount namespace, in which the applier mounts its own bpffs at /sys/fs/bpf (or a
//! private one is mounted over a bpffs the host already has). Three more namespaces are created
//! inside it: a switch with a bridge and two sources, 198.19.30.10 (blocked) and 198.19.30.20
//! (allowed), named in a tmpfs mounted over /run/netns in the private mount namespace. Every
//! namespace, veth, pin and attached program lives in namespaces that vanish with the child
//! process, even when it fails or is killed. It needs root.
//!
//! Apply and the restart run in separate processes (the test binary again, in the same
//! namespaces), so the program stays attached only through its pins. Proven here: drops of the
//! blocked source's ping and TCP connect while the allowed one passes; exact per-CPU counters
//! (20 pings, 20 × 98 bytes) and their /metrics line; `auto` falling back to generic on a
//! bridge; the bpffs mount; a restart with nothing to do; a new list through the map with the
//! same program id; another program in the same mode through the same link; a vanished
//! interface's pins removed by the revert; a revert leaving no program and no pin; a program
//! attached by iproute2 refused and left alone.

mod netns;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hoststack_agent::appliers;
use hoststack_agent::exporter::Exporter;
use hoststack_agent::host::bpf::{objects, Pins, Program};
use hoststack_agent::host::{Bpf, Host, RealKernel};
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::model::{Kind, Reading, Setting};
use hoststack_agent::transaction::{Goal, Outcome, TargetValues, Transactor};
use hoststack_crds::NodeState;

const TEST: &str = "xdp_blocklist_on_a_real_veth";
const CHILD: &str = "HOSTSTACK_AGENT_XDP_TEST";
/// The bpffs root, under /sys/fs/bpf inside the private mount namespace.
const ROOT: &str = "/sys/fs/bpf/hoststack-test";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 30, 1);
/// The first blocklist: source a, and an IPv6 prefix (only as a key of the IPv6 trie: the
/// test hosts have IPv4 addresses in 198.18.0.0/15 only).
const BLOCKED: &str = "198.19.30.10/32,2001:db8::/32";
const ALLOWED: &str = "198.19.30.20/32";
const SOURCE_A: &str = "hsxdp-a";
const SOURCE_B: &str = "hsxdp-b";
const SWITCH: &str = "hsxdp-sw";

#[test]
fn xdp_blocklist_on_a_real_veth() {
    match std::env::var(CHILD).as_deref() {
        Ok("main") => return in_namespaces(),
        Ok("apply") => return apply_phase(),
        Ok("restart") => return restart_phase(),
        _ => {}
    }
    netns::rerun_under_unshare(
        TEST,
        &["--net", "--mount", "--propagation", "private"],
        CHILD,
        "main",
    );
}

/// Runs a command, panicking with its output when it fails.
fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether one ping from namespace `ns` to the node gets an answer.
fn ping_from(ns: &str) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "1", "-W", "1", "-q"])
        .arg(NODE_IP.to_string())
        .output()
        .expect("ping")
        .status
        .success()
}

/// Whether a TCP connect from namespace `ns` to `addr` completes within two seconds.
fn connect_from(ns: &str, addr: SocketAddr) -> bool {
    let path = PathBuf::from("/run/netns").join(ns);
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on a namespace fd; it moves only this short-lived thread.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
    })
    .join()
    .expect("connect thread")
}

/// The topology: node `xdp0` (198.19.30.1) — switch bridge — sources a (.10) and b (.20); and a
/// bridge `gen0`, which offers only generic XDP.
fn build_network() {
    // Namespace names live in a tmpfs of this mount namespace: nothing reaches the host's
    // /run/netns, even when the test is killed.
    std::fs::create_dir_all("/run/netns").expect("/run/netns");
    sh(&["mount", "-t", "tmpfs", "tmpfs", "/run/netns"]);
    sh(&["ip", "link", "set", "lo", "up"]);
    for ns in [SWITCH, SOURCE_A, SOURCE_B] {
        sh(&["ip", "netns", "add", ns]);
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
    }
    sh(&[
        "ip", "link", "add", "xdp0", "type", "veth", "peer", "name", "up0", "netns", SWITCH,
    ]);
    sh(&["ip", "-n", SWITCH, "link", "add", "br0", "type", "bridge"]);
    sh(&[
        "ip", "-n", SWITCH, "link", "set", "up0", "master", "br0", "up",
    ]);
    sh(&["ip", "-n", SWITCH, "link", "set", "br0", "up"]);
    for (ns, port, addr) in [
        (SOURCE_A, "pa", "198.19.30.10/24"),
        (SOURCE_B, "pb", "198.19.30.20/24"),
    ] {
        sh(&[
            "ip", "-n", SWITCH, "link", "add", port, "type", "veth", "peer", "name", "eth0",
            "netns", ns,
        ]);
        sh(&[
            "ip", "-n", SWITCH, "link", "set", port, "master", "br0", "up",
        ]);
        sh(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
        sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
    }
    sh(&["ip", "addr", "add", "198.19.30.1/24", "dev", "xdp0"]);
    sh(&["ip", "link", "set", "xdp0", "up"]);
    sh(&["ip", "link", "add", "gen0", "type", "bridge"]);
    sh(&["ip", "link", "set", "gen0", "up"]);
}

/// Gives this private mount namespace a bpffs of its own when the host already has one at
/// /sys/fs/bpf (pins must not reach the host); otherwise the applier mounts it.
fn private_bpffs() -> bool {
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some("/sys/fs/bpf"));
    if mounted {
        sh(&["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"]);
    }
    !mounted
}

fn host() -> Host {
    Host::new(Path::new("/proc"), Path::new("/sys")).with_bpffs_root(Path::new(ROOT))
}

fn transactor() -> Transactor {
    let state = std::env::var("HOSTSTACK_XDP_TEST_STATE").expect("state dir");
    Transactor::new(host(), JournalStore::new(Path::new(&state)))
}

fn goal(revision: &str, prefixes: &str) -> Goal {
    let desired: TargetValues = [
        (
            Setting::new(Kind::XdpBlocklist, "xdp0"),
            prefixes.to_string(),
        ),
        (
            Setting::new(Kind::XdpProgram, "xdp0"),
            "blocklist/native".to_string(),
        ),
        (
            Setting::new(Kind::XdpProgram, "gen0"),
            "pass/auto".to_string(),
        ),
    ]
    .into();
    Goal {
        target: Some(Applied {
            tuning: "t".into(),
            revision: revision.into(),
        }),
        values: desired,
    }
}

fn read(kind: Kind, iface: &str) -> String {
    match appliers::read(&host(), &Setting::new(kind, iface)) {
        Reading::Value(v) => v,
        other => panic!("{iface}: {other:?}"),
    }
}

fn run(t: &Transactor, g: &Goal) -> Outcome {
    t.execute(g, &mut |_| {}).expect("transaction")
}

/// The program attached to `iface` (id), as the kernel says.
fn attached_id(iface: &str) -> Option<u32> {
    let state = RealKernel
        .query_hook(iface, &Pins::new(Path::new(ROOT), iface))
        .expect("query");
    state.attached.first().map(|p| p.id)
}

/// Runs this test binary again in the same namespaces, as phase `phase`.
fn phase(phase: &str, state: &Path) {
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, phase)
        .env("HOSTSTACK_XDP_TEST_STATE", state)
        .output()
        .expect("run a phase");
    assert!(
        out.status.success(),
        "phase {phase} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A process that applies the blocklist and exits.
fn apply_phase() {
    let applied = run(&transactor(), &goal("r1", BLOCKED));
    assert_eq!(applied.state, NodeState::Applied, "{applied:?}");
    let actual = |kind: &str, target: &str| {
        applied
            .items
            .iter()
            .find(|i| i.kind == kind && i.target == target)
            .and_then(|i| i.actual.clone())
    };
    assert_eq!(
        actual("xdpProgram", "xdp0").as_deref(),
        Some("blocklist/native")
    );
    // A bridge offers no native XDP: auto fell back to generic.
    assert_eq!(
        actual("xdpProgram", "gen0").as_deref(),
        Some("pass/generic")
    );
}

/// A restarted agent: finds everything in place and writes nothing.
fn restart_phase() {
    let t = transactor();
    let g = goal("r1", BLOCKED);
    let prepared = t.prepare(&g, &mut |_| {}).expect("prepare");
    assert!(
        prepared.is_settled(&g),
        "a restarted agent would change something: {:?}",
        prepared.plan
    );
    let again = run(&t, &g);
    assert_eq!(again.state, NodeState::Applied, "{again:?}");
}

fn in_namespaces() {
    let state = tempfile::tempdir().expect("state dir");
    let agent_mounts = private_bpffs();
    build_network();
    let listener = TcpListener::bind((NODE_IP, 0)).expect("listen on the node");
    let port = listener.local_addr().expect("address").port();
    let service = SocketAddr::from((NODE_IP, port));
    // Accept in the background so that connects complete.
    std::thread::spawn(move || for _ in listener.incoming() {});

    assert!(
        ping_from(SOURCE_A) && ping_from(SOURCE_B),
        "the network works before"
    );
    assert_eq!(read(Kind::XdpProgram, "xdp0"), "none");
    assert_eq!(read(Kind::XdpBlocklist, "xdp0"), "none");

    phase("apply", state.path());
    if agent_mounts {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            mountinfo
                .lines()
                .any(|l| l.contains(" /sys/fs/bpf ") && l.contains(" - bpf ")),
            "the applier mounted a bpffs at /sys/fs/bpf"
        );
    }
    // The applying process has exited: the pinned link holds the program.
    let id = attached_id("xdp0").expect("a program on xdp0");
    assert_eq!(read(Kind::XdpProgram, "xdp0"), "blocklist/native");
    assert_eq!(read(Kind::XdpBlocklist, "xdp0"), BLOCKED);
    assert!(!ping_from(SOURCE_A), "the blocked source's ping is dropped");
    assert!(
        !connect_from(SOURCE_A, service),
        "the blocked source's connect is dropped"
    );
    assert!(ping_from(SOURCE_B), "the allowed source's ping passes");
    assert!(
        connect_from(SOURCE_B, service),
        "the allowed source connects"
    );

    // The per-CPU counters counted the drops: one ping, at least one SYN.
    let pins = Pins::new(Path::new(ROOT), "xdp0");
    let (packets, bytes) = objects::drops(&pins).expect("counters");
    assert!(packets >= 2, "{packets} drops counted");
    assert!(bytes >= packets * 42, "{bytes} bytes for {packets} packets");
    let metrics = Exporter::new(Path::new("/proc"))
        .with_xdp_drops(Path::new(ROOT))
        .encode();
    let line = format!(
        "hoststack_xdp_dropped_packets_total{{interface=\"xdp0\",program=\"blocklist\"}} {packets}"
    );
    assert!(metrics.contains(&line), "{line} not in\n{metrics}");

    // Exactly: 20 echo requests of 98-byte frames (14 Ethernet + 20 IPv4 + 8 ICMP + 56 data).
    let flood = Command::new("ip")
        .args([
            "netns", "exec", SOURCE_A, "ping", "-c", "20", "-i", "0.01", "-W", "1", "-q",
        ])
        .arg(NODE_IP.to_string())
        .output()
        .expect("ping");
    assert!(!flood.status.success(), "no answer to the blocked source");
    let (more, more_bytes) = objects::drops(&pins).expect("counters");
    assert_eq!((more - packets, more_bytes - bytes), (20, 20 * 98));

    // A restarted agent picks the pins up and changes nothing.
    phase("restart", state.path());
    assert_eq!(attached_id("xdp0"), Some(id), "not re-attached");

    // A new list goes through the map: same program, the other source is blocked now.
    let t = transactor_in(state.path());
    let r2 = run(&t, &goal("r2", ALLOWED));
    assert_eq!(r2.state, NodeState::Applied, "{r2:?}");
    assert_eq!(
        attached_id("xdp0"),
        Some(id),
        "the program was not detached"
    );
    assert!(ping_from(SOURCE_A), "a is no longer blocked");
    assert!(!ping_from(SOURCE_B), "b is blocked now");
    assert!(!connect_from(SOURCE_B, service));
    assert!(connect_from(SOURCE_A, service));

    // Pass instead of the blocklist, same mode: replaced through the same link (its pin is not
    // made again), the maps unpinned, nobody blocked.
    let link_pin = || std::fs::metadata(pins.link()).expect("link pin").ino();
    let pinned = link_pin();
    let r3 = Goal {
        target: Some(Applied {
            tuning: "t".into(),
            revision: "r3".into(),
        }),
        values: [
            (
                Setting::new(Kind::XdpProgram, "xdp0"),
                "pass/native".to_string(),
            ),
            (
                Setting::new(Kind::XdpProgram, "gen0"),
                "pass/auto".to_string(),
            ),
        ]
        .into(),
    };
    let passing = run(&t, &r3);
    assert_eq!(passing.state, NodeState::Applied, "{passing:?}");
    assert_eq!(read(Kind::XdpProgram, "xdp0"), "pass/native");
    assert_eq!(read(Kind::XdpBlocklist, "xdp0"), "none");
    assert_eq!(link_pin(), pinned, "the same link");
    assert_ne!(attached_id("xdp0"), Some(id), "a new program on it");
    assert!(ping_from(SOURCE_A) && ping_from(SOURCE_B));

    // The bridge goes away while tuned: the kernel detaches its program, the pins stay.
    sh(&["ip", "link", "del", "gen0"]);
    assert_eq!(read(Kind::XdpProgram, "gen0"), "leftover-pins");

    // Revert: nothing attached, nothing pinned (the vanished interface's pins included).
    let reverted = run(&t, &Goal::revert());
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:?}");
    assert_eq!(attached_id("xdp0"), None);
    assert_eq!(attached_id("gen0"), None);
    let left: Vec<_> = std::fs::read_dir(ROOT)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "pins left: {left:?}");
    assert!(
        ping_from(SOURCE_A) && ping_from(SOURCE_B),
        "the network works after"
    );

    // A program someone else attached (here with iproute2) is refused, not replaced.
    let object = state.path().join("pass.o");
    std::fs::write(&object, Program::Pass.object()).expect("write the object");
    sh(&["ip", "link", "add", "gen1", "type", "bridge"]);
    let object_path = object.display().to_string();
    sh(&[
        "ip",
        "link",
        "set",
        "dev",
        "gen1",
        "xdpgeneric",
        "obj",
        &object_path,
        "sec",
        "xdp",
    ]);
    let theirs = attached_id("gen1");
    assert!(theirs.is_some(), "iproute2 attached its program");
    let foreign = Goal {
        target: Some(Applied {
            tuning: "t".into(),
            revision: "r3".into(),
        }),
        values: [(
            Setting::new(Kind::XdpProgram, "gen1"),
            "pass/auto".to_string(),
        )]
        .into(),
    };
    let refused = run(&t, &foreign);
    assert_eq!(refused.state, NodeState::Failed, "{refused:?}");
    let message = refused.message.expect("message");
    assert!(
        message.contains("gen1 already has an XDP program hoststack did not attach"),
        "{message}"
    );
    assert_eq!(attached_id("gen1"), theirs, "left as it was");
}

fn transactor_in(state: &Path) -> Transactor {
    Transactor::new(host(), JournalStore::new(state))
}
