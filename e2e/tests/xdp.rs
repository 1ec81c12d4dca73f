//! The XDP blocklist through the whole control loop, on real traffic: two source namespaces
//! (198.19.30.10, blocked, and 198.19.30.20, allowed) reach a lab node through a bridge and an
//! extra veth (`xdp0` on the node, not its management interface eth0). A NetworkTuning attaches
//! the blocklist natively to `xdp0`; the blocked source's ping and TCP connect fail while the
//! allowed one's succeed; the agent is SIGKILLed and started again and the program stays
//! attached, keeps dropping, and is not re-attached (same program id, no transaction); the drop
//! counters are on the agent's /metrics; deleting the tuning detaches and unpins.
//!
//! The extra namespaces are named `hs<k>-xdp-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them with the node namespaces even when this test dies.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hoststack_e2e::prometheus::http_get;
use hoststack_e2e::{Lab, LabConfig, Signal};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 30, 1);

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

/// The test's namespaces: a switch and the two sources.
struct Sources {
    switch: String,
    blocked: String,
    allowed: String,
}

impl Sources {
    /// Builds switch and sources and links the switch to the node's new `xdp0`.
    fn build(lab: &Lab) -> Sources {
        let k = lab.index();
        let s = Sources {
            switch: format!("hs{k}-xdp-sw"),
            blocked: format!("hs{k}-xdp-a"),
            allowed: format!("hs{k}-xdp-b"),
        };
        let node_ns = lab.netns(NODE);
        for ns in [&s.switch, &s.blocked, &s.allowed] {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&[
            "ip", "-n", node_ns, "link", "add", "xdp0", "type", "veth", "peer", "name", "up0",
            "netns", &s.switch,
        ]);
        sh(&[
            "ip", "-n", &s.switch, "link", "add", "br0", "type", "bridge",
        ]);
        sh(&[
            "ip", "-n", &s.switch, "link", "set", "up0", "master", "br0", "up",
        ]);
        sh(&["ip", "-n", &s.switch, "link", "set", "br0", "up"]);
        for (ns, port, addr) in [
            (&s.blocked, "pa", "198.19.30.10/24"),
            (&s.allowed, "pb", "198.19.30.20/24"),
        ] {
            sh(&[
                "ip", "-n", &s.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]);
            sh(&[
                "ip", "-n", &s.switch, "link", "set", port, "master", "br0", "up",
            ]);
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", "eth0"]);
            sh(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
        }
        sh(&[
            "ip",
            "-n",
            node_ns,
            "addr",
            "add",
            "198.19.30.1/24",
            "dev",
            "xdp0",
        ]);
        sh(&["ip", "-n", node_ns, "link", "set", "xdp0", "up"]);
        s
    }
}

impl Drop for Sources {
    fn drop(&mut self) {
        // Deleting the switch deletes both ends of every veth, xdp0 included.
        for ns in [&self.switch, &self.blocked, &self.allowed] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Moves the calling thread into the named network namespace.
fn enter(ns: &str) {
    let file = std::fs::File::open(PathBuf::from("/run/netns").join(ns)).expect("open netns");
    // SAFETY: setns on a namespace fd; it moves only the calling thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// A TCP listener on the node (198.19.30.1), accepting until dropped.
struct Service {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    fn start(node_ns: &str) -> Service {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let node_ns = node_ns.to_string();
        let thread = std::thread::spawn(move || {
            enter(&node_ns);
            let listener = TcpListener::bind((NODE_IP, 0)).expect("listen on the node");
            listener.set_nonblocking(true).expect("nonblocking");
            tx.send(listener.local_addr().expect("address"))
                .expect("send");
            while !stopping.load(Ordering::SeqCst) {
                if listener.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        let addr = rx.recv().expect("the listener's address");
        Service {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
    })
    .join()
    .expect("connect thread")
}

/// The id of the XDP program on the node's xdp0, as `ip -d link` shows it.
fn program_id(lab: &Lab) -> Option<u32> {
    let out = Command::new("ip")
        .args(["-n", lab.netns(NODE), "-d", "link", "show", "dev", "xdp0"])
        .output()
        .expect("ip link");
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("prog/xdp id ")? + "prog/xdp id ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn jsonpath(lab: &Lab, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", &expr]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn item(lab: &Lab, kind: &str, field: &str) -> String {
    jsonpath(
        lab,
        &format!("{{.status.items[?(@.kind==\"{kind}\")].{field}}}"),
    )
}

fn scrape(lab: &Lab) -> Option<String> {
    let (status, body) = http_get(lab.agent_metrics_address(NODE), "/metrics", None).ok()?;
    (status == 200).then_some(body)
}

/// The value of the sample `series` (name and labels exactly) in `text`.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

const DROPPED: &str =
    "hoststack_xdp_dropped_packets_total{interface=\"xdp0\",program=\"blocklist\"}";

#[test]
fn an_xdp_blocklist_drops_a_blocked_source_survives_an_agent_kill_and_reverts() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let sources = Sources::build(&lab);
    let service = Service::start(lab.netns(NODE));
    let (blocked, allowed) = (sources.blocked.as_str(), sources.allowed.as_str());
    assert!(
        ping_from(blocked) && ping_from(allowed),
        "the network works"
    );
    assert!(connect_from(blocked, service.addr) && connect_from(allowed, service.addr));
    assert_eq!(program_id(&lab), None);

    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: xdp\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  interfaces:\n  - match:\n      \
         name: xdp0\n    xdp:\n      program: Blocklist\n      mode: Native\n      \
         blockedPrefixes: [\"198.19.30.10/32\"]\n",
    )
    .expect("the tuning is accepted");
    lab.wait_for("node-a to attach the blocklist", CONVERGE, || {
        (jsonpath(&lab, "{.status.state}") == "Applied").then_some(())
    });
    assert_eq!(item(&lab, "xdpProgram", "actual"), "blocklist/native");
    assert_eq!(item(&lab, "xdpProgram", "original"), "none");
    assert_eq!(item(&lab, "xdpBlocklist", "actual"), "198.19.30.10/32");
    let id = program_id(&lab).expect("a program on xdp0");

    assert!(!ping_from(blocked), "the blocked source's ping is dropped");
    assert!(!connect_from(blocked, service.addr), "its TCP connect too");
    assert!(ping_from(allowed), "the allowed source's ping passes");
    assert!(
        connect_from(allowed, service.addr),
        "the allowed source connects"
    );
    let dropped = lab.wait_for("the drops on /metrics", CONVERGE, || {
        sample(&scrape(&lab)?, DROPPED).filter(|n| *n >= 2)
    });

    // SIGKILL: nothing runs down; the pinned link keeps the program attached.
    lab.kill_agent(NODE, Signal::Kill);
    assert_eq!(
        program_id(&lab),
        Some(id),
        "still attached without the agent"
    );
    assert!(!ping_from(blocked), "and still dropping");
    assert!(ping_from(allowed));

    lab.start_agent(NODE, &[]);
    let metrics = lab.wait_for("the restarted agent to reconcile", CONVERGE, || {
        let text = scrape(&lab)?;
        text.lines()
            .any(|l| l.starts_with("hoststack_agent_applied_revision{") && l.ends_with(" 1"))
            .then_some(text)
    });
    assert_eq!(
        sample(
            &metrics,
            "hoststack_agent_transactions_total{result=\"applied\"}"
        ),
        Some(0),
        "the restarted agent found the host applied and ran no transaction"
    );
    assert_eq!(program_id(&lab), Some(id), "not re-attached");
    assert_eq!(jsonpath(&lab, "{.status.state}"), "Applied");
    assert!(!ping_from(blocked) && ping_from(allowed));
    let after = sample(&metrics, DROPPED).expect("the counters on the restarted agent");
    assert!(
        after > dropped,
        "{after} drops after the kill, {dropped} before"
    );

    let out = lab.kubectl(&["delete", "networktuning", "xdp", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to detach the blocklist", CONVERGE, || {
        (program_id(&lab).is_none()).then_some(())
    });
    let pins = lab.agent_bpffs_root(NODE);
    lab.wait_for("the pins to go", CONVERGE, || {
        let left = std::fs::read_dir(&pins).map(|d| d.count()).unwrap_or(0);
        (left == 0).then_some(())
    });
    assert!(ping_from(blocked) && connect_from(blocked, service.addr));
    assert!(ping_from(allowed));
    drop(service);
    drop(sources);
    lab.stop().expect("the lab stops cleanly");
}
