//! The agent's nftables table through the whole control loop, on real traffic. Two client
//! namespaces (198.19.20.10, blocked, and 198.19.20.20, allowed) reach a lab node through a
//! bridge and an extra veth (`fw0` on the node, 198.19.20.1; not its management interface
//! eth0). A NetworkTuning whose firewall blocks the first client and limits SYNs per source
//! makes the agent create `inet hoststack` in the node's namespace: the blocked client can
//! neither ping nor connect, the allowed one can; a bounded SYN flood from the allowed client
//! gets at most burst + rate × time connections through; the drop counters rise on the
//! agent's /metrics; deleting the tuning removes the table.
//!
//! The extra namespaces are named `hs<k>-fw-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them with the node namespaces even when this test dies; the table lives in the
//! node's namespace and goes with it.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoststack_e2e::prometheus::http_get;
use hoststack_e2e::{Lab, LabConfig};

/// How long the control loop may take to converge in any one step.
const CONVERGE: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 1);
/// The SYN limit of the tuning.
const RATE: u64 = 5;
const BURST: u64 = 5;
/// The flood: this many connects, each given this long.
const FLOOD: u64 = 200;
const FLOOD_WAIT: Duration = Duration::from_millis(20);

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

/// The test's namespaces: a switch and the two clients.
struct Clients {
    switch: String,
    blocked: String,
    allowed: String,
}

impl Clients {
    /// Builds switch and clients and links the switch to the node's new `fw0`.
    fn build(lab: &Lab) -> Clients {
        let k = lab.index();
        let c = Clients {
            switch: format!("hs{k}-fw-sw"),
            blocked: format!("hs{k}-fw-a"),
            allowed: format!("hs{k}-fw-b"),
        };
        let node_ns = lab.netns(NODE);
        for ns in [&c.switch, &c.blocked, &c.allowed] {
            sh(&["ip", "netns", "add", ns]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh(&[
            "ip", "-n", node_ns, "link", "add", "fw0", "type", "veth", "peer", "name", "up0",
            "netns", &c.switch,
        ]);
        sh(&[
            "ip", "-n", &c.switch, "link", "add", "br0", "type", "bridge",
        ]);
        sh(&[
            "ip", "-n", &c.switch, "link", "set", "up0", "master", "br0", "up",
        ]);
        sh(&["ip", "-n", &c.switch, "link", "set", "br0", "up"]);
        for (ns, port, addr) in [
            (&c.blocked, "pa", "198.19.20.10/24"),
            (&c.allowed, "pb", "198.19.20.20/24"),
        ] {
            sh(&[
                "ip", "-n", &c.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]);
            sh(&[
                "ip", "-n", &c.switch, "link", "set", port, "master", "br0", "up",
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
            "198.19.20.1/24",
            "dev",
            "fw0",
        ]);
        sh(&["ip", "-n", node_ns, "link", "set", "fw0", "up"]);
        c
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // Deleting the switch deletes both ends of every veth, fw0 included.
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

/// A TCP listener on the node (198.19.20.1), accepting until dropped.
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
                    std::thread::sleep(Duration::from_millis(5));
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
    flood_from(ns, addr, 1, Duration::from_secs(2)).0 == 1
}

/// `count` connects from namespace `ns` to `addr`, each given `wait`: how many completed, and
/// how long the whole flood took.
fn flood_from(ns: &str, addr: SocketAddr, count: u64, wait: Duration) -> (u64, Duration) {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns);
        let start = Instant::now();
        let connected = (0..count)
            .filter(|_| TcpStream::connect_timeout(&addr, wait).is_ok())
            .count() as u64;
        (connected, start.elapsed())
    })
    .join()
    .expect("connect thread")
}

/// `nft list tables` in the node's namespace.
fn node_tables(lab: &Lab) -> String {
    let out = lab.exec_in_node(NODE, &["nft", "list", "tables"]);
    assert!(
        out.status.success(),
        "nft list tables: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn jsonpath(lab: &Lab, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    let out = lab.kubectl(&["get", "nodetuning", NODE, "-o", &expr]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn item(lab: &Lab, field: &str) -> String {
    jsonpath(
        lab,
        &format!("{{.status.items[?(@.kind==\"nftables\")].{field}}}"),
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

fn dropped(rule: &str) -> String {
    format!("hoststack_firewall_dropped_packets_total{{table=\"inet/hoststack\",rule=\"{rule}\"}}")
}

#[test]
fn the_agents_table_drops_a_blocked_prefix_limits_a_syn_flood_and_goes_with_the_tuning() {
    let lab = Lab::start(LabConfig::with_nodes(1)).expect("lab starts");
    let clients = Clients::build(&lab);
    let service = Service::start(lab.netns(NODE));
    let (blocked, allowed) = (clients.blocked.as_str(), clients.allowed.as_str());
    assert!(
        ping_from(blocked) && ping_from(allowed),
        "the network works"
    );
    assert!(connect_from(blocked, service.addr) && connect_from(allowed, service.addr));
    assert!(!node_tables(&lab).contains("hoststack"));

    lab.apply_yaml(&format!(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: fw\nspec:\n  \
         nodeSelector:\n    matchLabels:\n      pool: edge\n  firewall:\n    blockedPrefixes: \
         [\"198.19.20.10/32\"]\n    synRateLimit:\n      perSecond: {RATE}\n      burst: {BURST}\n"
    ))
    .expect("the tuning is accepted");
    lab.wait_for("node-a to make its table", CONVERGE, || {
        (jsonpath(&lab, "{.status.state}") == "Applied").then_some(())
    });
    let description =
        format!("blocked 198.19.20.10/32; syn-limit {RATE}/second burst {BURST}; notrack none");
    assert_eq!(item(&lab, "target"), "inet/hoststack");
    assert_eq!(item(&lab, "original"), "absent");
    assert_eq!(item(&lab, "actual"), description);
    assert_eq!(item(&lab, "state"), "Applied");
    assert!(node_tables(&lab).contains("table inet hoststack"));

    assert!(!ping_from(blocked), "the blocked client's ping is dropped");
    assert!(!connect_from(blocked, service.addr), "its TCP connect too");
    assert!(ping_from(allowed), "the allowed client's ping passes");
    let blocked_drops = lab.wait_for("the blocked client's drops on /metrics", CONVERGE, || {
        sample(&scrape(&lab)?, &dropped("blocked-ipv4")).filter(|n| *n >= 2)
    });

    // A bounded SYN flood from the allowed client: 200 connects, 20 ms each at most.
    let (connected, took) = flood_from(allowed, service.addr, FLOOD, FLOOD_WAIT);
    let bound = BURST + (RATE as f64 * took.as_secs_f64()).ceil() as u64;
    println!(
        "SYN flood: {FLOOD} connects in {:.2} s, {connected} connected, at most {bound} allowed",
        took.as_secs_f64()
    );
    assert!(connected >= 1, "the burst lets the first SYNs through");
    assert!(
        connected <= bound,
        "{connected} connections > burst + rate × time = {bound}"
    );
    let metrics = lab.wait_for("the SYN drops on /metrics", CONVERGE, || {
        let text = scrape(&lab)?;
        sample(&text, &dropped("syn-limit-ipv4"))
            .filter(|n| *n >= FLOOD - connected)
            .map(|_| text)
    });
    assert!(
        sample(&metrics, &dropped("blocked-ipv4")).unwrap_or(0) >= blocked_drops,
        "counters only rise"
    );
    assert!(
        metrics.contains("hoststack_firewall_dropped_bytes_total{table=\"inet/hoststack\",rule=\"syn-limit-ipv4\"}"),
        "bytes too"
    );
    assert!(ping_from(allowed), "a SYN limit leaves pings alone");

    let out = lab.kubectl(&["delete", "networktuning", "fw", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lab.wait_for("node-a to delete its table", CONVERGE, || {
        (!node_tables(&lab).contains("hoststack")).then_some(())
    });
    assert!(ping_from(blocked) && connect_from(blocked, service.addr));
    let after = lab.wait_for("a scrape", CONVERGE, || scrape(&lab));
    assert!(
        !after.contains("hoststack_firewall_"),
        "no table, no firewall series"
    );
    drop(service);
    drop(clients);
    lab.stop().expect("the lab stops cleanly");
}
