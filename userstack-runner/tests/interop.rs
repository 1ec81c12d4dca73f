//! The userstack on real packets, against Linux TCP: the `hoststack-userstack` runner on an
//! AF_XDP socket of a veth (copy mode, the redirect program attached natively), and a
//! userstack client driven in this process on a second veth.
//!
//! Each test re-runs itself under `unshare --net --mount --propagation private`: the fresh
//! network namespace is the "node" (the veth the stack takes, and a kernel listener on
//! another address of the same interface), and a tmpfs over /run/netns in the private mount
//! namespace holds the client namespace (the veth's peer, curl, wrk, kernel sockets opened by
//! threads that entered it with setns). Everything — namespaces, veths, XDP programs,
//! nftables tables, the runner process (a Drop guard kills it) — vanishes with the child
//! process, even when it fails or is killed. The tests need root; without it they fail with
//! unshare's reason.
//!
//! Addresses: 198.19.64.0/24 (runner, veth `usv0`/`usv1`), 198.19.65.0/24 (in-process
//! client, `usv2`/`usv3`), 198.19.66.0/24 (TAP, `ustap0`). The stack is .50, the node's kernel .1, the
//! client namespace .2.
//!
//! CPU: the machine has two cores. The runner gets one shard pinned to the last core; a shard
//! busy-polls only while it has work and parks in poll(2) on its socket (at most 1 ms) after
//! 4096 idle turns, so an idle runner does not hold the core, and curl, wrk and the kernel
//! run beside it. Timeouts below only turn a hang into a failure; nothing asserts on speed.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant as WallClock};

use aya::programs::{ProgramError, ProgramType};
use aya::sys::{is_helper_supported, BpfHelper};
use aya_obj::VerifierLog;
use common::{
    as_client, in_client, in_namespaces, sh, shard_core, veth, xdp_attached, Runner, CLIENT_NS,
    PATIENCE, RUNNER,
};
use hoststack_runner_api::RxStamps;
use serde_json::Value;
use userstack::rss::{RssTable, MICROSOFT_KEY};
use userstack::stack::{Stack, StackConfig};
use userstack::time::Instant;
use userstack_runner::device::af_xdp::XdpSocket;
use userstack_runner::device::xdp_redirect::{AttachMode, Build, RedirectProgram, RedirectRules};
use userstack_runner::device::Device;
use userstack_runner::runtime::interface;

const STACK_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 50);
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 1);

// ------------------------------------------------------------------------------ helpers

/// A runner config on `usv0` serving http (with `body`), echo and discard.
fn runner_config(body: &str, drain_ms: u64) -> Value {
    serde_json::json!({
        "interface": "usv0",
        "backend": "afXdp",
        "cores": [shard_core()],
        "address": format!("{STACK_IP}/24"),
        "services": [
            { "kind": "Http", "port": 80, "body": body },
            { "kind": "Echo", "port": 7 },
            { "kind": "Discard", "port": 9 }
        ],
        "drainTimeoutMs": drain_ms
    })
}

/// A body that is not a repetition of a short pattern, so that a misplaced segment shows.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            b'a' + (x % 26) as u8
        })
        .collect()
}

/// Sends `data` over a kernel connection to `to` from the client namespace and reads back as
/// many bytes (echo).
fn echo_through(to: SocketAddrV4, data: Vec<u8>) -> Vec<u8> {
    as_client(move || echo_here(to, data))
}

/// [`echo_through`] from the calling thread's namespace.
fn echo_here(to: SocketAddrV4, data: Vec<u8>) -> Vec<u8> {
    let stream = TcpStream::connect_timeout(&to.into(), PATIENCE).expect("connect");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let len = data.len();
    let sender = std::thread::spawn(move || {
        writer.write_all(&data).expect("write");
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = Vec::with_capacity(len);
    (&stream).read_to_end(&mut back).expect("read");
    sender.join().unwrap();
    back
}

/// The router namespace of the lossy path.
const ROUTER_NS: &str = "usrouter";
/// The router's address on the node's link: the stack's gateway.
const ROUTER_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 64, 2);

/// Runs a command in the router namespace.
fn in_router(args: &[&str]) -> String {
    let mut full = vec!["ip", "netns", "exec", ROUTER_NS];
    full.extend_from_slice(args);
    sh(&full)
}

/// node `usv0` (198.19.64.1) — (198.19.64.2) router (198.19.67.1) — `usv1` client
/// (198.19.67.2, default route via the router): a path whose loss is real to both ends, since
/// the router drops in its forward hook after both senders have handed the packet on.
fn routed_path() {
    sh(&["ip", "netns", "add", ROUTER_NS]);
    sh(&["ip", "netns", "add", CLIENT_NS]);
    for ns in [ROUTER_NS, CLIENT_NS] {
        sh(&["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]);
    }
    sh(&[
        "ip", "link", "add", "usv0", "type", "veth", "peer", "name", "usr0",
    ]);
    sh(&["ip", "link", "set", "usr0", "netns", ROUTER_NS]);
    sh(&["ip", "addr", "add", "198.19.64.1/24", "dev", "usv0"]);
    sh(&["ip", "link", "set", "usv0", "up"]);
    in_router(&["ip", "addr", "add", "198.19.64.2/24", "dev", "usr0"]);
    in_router(&["ip", "link", "set", "usr0", "up"]);
    in_router(&[
        "ip", "link", "add", "usr1", "type", "veth", "peer", "name", "usv1",
    ]);
    in_router(&["ip", "link", "set", "usv1", "netns", CLIENT_NS]);
    in_router(&["ip", "addr", "add", "198.19.67.1/24", "dev", "usr1"]);
    in_router(&["ip", "link", "set", "usr1", "up"]);
    in_router(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    in_client(&["ip", "addr", "add", "198.19.67.2/24", "dev", "usv1"]);
    in_client(&["ip", "link", "set", "usv1", "up"]);
    in_client(&["ip", "route", "add", "default", "via", "198.19.67.1"]);
    // Per-frame loss: without this the client's 64 KiB TSO/GSO packets (and the router's
    // GRO) would make one drop cost up to 45 frames, and make drops 45 times rarer.
    in_client(&["ethtool", "-K", "usv1", "tso", "off", "gso", "off"]);
    in_router(&["ethtool", "-K", "usr1", "gro", "off"]);
}

/// Replaces the table `inet userstack_loss` in namespace `ns` with one whose chain on `hook`
/// drops `per_mille`/1000 of the TCP packets passing it (there is no netem here: LAB-FACTS
/// section 6).
///
/// The router drops in its `forward` hook, both ways, after both senders have handed the packet
/// on. An end host drops in its `input` hook only: a drop in the output hook is not a loss to
/// the kernel's TCP (the transmit fails locally and the segment goes out again as new data).
fn drop_tcp(ns: &str, hook: &str, per_mille: u32) {
    let rules = format!(
        "table inet userstack_loss {{\n\
           chain {hook} {{ type filter hook {hook} priority 0; meta l4proto tcp numgen random mod 1000 < {per_mille} drop; }}\n\
         }}\n"
    );
    let _ = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "nft",
            "delete",
            "table",
            "inet",
            "userstack_loss",
        ])
        .output();
    let path = std::env::temp_dir().join(format!("userstack-loss-{}.nft", std::process::id()));
    std::fs::write(&path, rules).unwrap();
    sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "nft",
        "-f",
        path.to_str().unwrap(),
    ]);
    std::fs::remove_file(path).unwrap();
}

/// A kernel netstat counter of the client namespace.
fn client_kernel_counter(field: &'static str) -> u64 {
    as_client(move || {
        let text = std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap()
            + &std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let names: Vec<&str> = pair[0].split_whitespace().collect();
            let values: Vec<&str> = pair[1].split_whitespace().collect();
            if let Some(i) = names.iter().position(|n| *n == field) {
                return values[i].parse().unwrap();
            }
        }
        panic!("no {field} in the kernel's netstat")
    })
}

// ------------------------------------------------------------------------------ tests

/// curl fetches over keep-alive are byte-exact, a malformed request gets 400, wrk bounded
/// in time and connections sees no error, and SIGTERM stops with exit 0, state stopped and
/// no XDP program left.
#[test]
fn curl_and_wrk_against_the_http_service() {
    in_namespaces("curl_and_wrk_against_the_http_service", || {
        veth("usv0", "usv1", 64);
        let body = String::from_utf8(pattern(20_000)).unwrap();
        let runner = Runner::start(&runner_config(&body, 2000));
        assert!(xdp_attached("usv0"));
        let stats = runner.stats();
        assert_eq!(stats["backend"], "afXdp");
        assert_eq!(stats["mode"], "copy", "veth offers no zero-copy");
        assert_eq!(stats["shards"][0]["core"], shard_core());

        // Three fetches on one connection (curl reuses it: one connect).
        let url = format!("http://{STACK_IP}/");
        let out = in_client(&[
            "curl",
            "-sS",
            "--fail",
            "-m",
            "30",
            "-w",
            "%{num_connects}\n",
            &url,
            &url,
            &url,
        ]);
        let expected = format!("{body}1\n{body}0\n{body}0\n");
        assert!(
            out == expected,
            "curl output differs (len {} vs {})",
            out.len(),
            expected.len()
        );

        // A malformed request: 400, then the stack closes.
        let reply = as_client(|| {
            let mut s = TcpStream::connect((STACK_IP, 80)).unwrap();
            s.set_read_timeout(Some(PATIENCE)).unwrap();
            s.write_all(b"NOT HTTP\r\n\r\n").unwrap();
            let mut reply = String::new();
            s.read_to_string(&mut reply).unwrap();
            reply
        });
        assert!(reply.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{reply}");

        // wrk: 1 thread, 8 connections, 2 seconds.
        let wrk = in_client(&["wrk", "-t1", "-c8", "-d2s", &url]);
        assert!(!wrk.contains("Socket errors"), "{wrk}");
        assert!(!wrk.contains("Non-2xx"), "{wrk}");
        let requests: u64 = wrk
            .lines()
            .find(|l| l.contains("requests in"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no request count in {wrk}"));
        assert!(requests > 0, "{wrk}");
        assert!(runner.counter("Tcp", "PassiveOpens") >= 10);

        let last = runner.stop();
        assert_eq!(last["state"], "stopped");
        assert!(last["stop"].is_object(), "{last}");
        assert!(!xdp_attached("usv0"), "the XDP program outlived the runner");
    });
}

/// The kernel keeps its own traffic on the same interface: a kernel listener on the node's
/// address serves a client while the stack answers on its address, and ping works to both
/// addresses (the stack answers its own, through AF_XDP).
#[test]
fn kernel_listener_on_the_same_interface_keeps_serving() {
    in_namespaces(
        "kernel_listener_on_the_same_interface_keeps_serving",
        || {
            veth("usv0", "usv1", 64);
            let runner = Runner::start(&runner_config("stack\n", 2000));
            let listener = TcpListener::bind((NODE_IP, 8080)).unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                s.write_all(b"kernel\n").unwrap();
            });
            let from_kernel = as_client(|| {
                let mut s = TcpStream::connect((NODE_IP, 8080)).unwrap();
                let mut text = String::new();
                s.read_to_string(&mut text).unwrap();
                text
            });
            server.join().unwrap();
            assert_eq!(from_kernel, "kernel\n");
            in_client(&["ping", "-c", "1", "-W", "5", &NODE_IP.to_string()]);
            // The stack's own address answers ping too: the redirect program hands it ICMP.
            in_client(&["ping", "-c", "2", "-W", "5", &STACK_IP.to_string()]);
            let from_stack = in_client(&[
                "curl",
                "-sS",
                "--fail",
                "-m",
                "30",
                &format!("http://{STACK_IP}/"),
            ]);
            assert_eq!(from_stack, "stack\n");
            let mut runner = runner;
            runner.wait_for(|s| s["netstat"]["Tcp"]["PassiveOpens"] == 1);
            let stats = runner.stats();
            assert_eq!(stats["netstat"]["Icmp"]["InEchos"], 2);
            assert_eq!(stats["netstat"]["Icmp"]["OutEchoReps"], 2);
            runner.stop();
        },
    );
}

/// Several MB through the echo service across a router, on a clean path and then with the
/// router dropping 1% and then 5% of the TCP packets both ways, arrive byte-exact; the
/// stack's retransmit and SACK-recovery counters move, as the kernel client's do on the same
/// path (it sends the 4 MiB that the stack echoes). The stack reaches the client through its
/// configured gateway.
#[test]
fn echo_over_a_lossy_path_is_byte_exact() {
    in_namespaces("echo_over_a_lossy_path_is_byte_exact", || {
        routed_path();
        let mut config = runner_config("", 2000);
        config["gateway"] = ROUTER_IP.to_string().into();
        let mut runner = Runner::start(&config);
        let to = SocketAddrV4::new(STACK_IP, 7);
        let mut rounds = Vec::new();
        for per_mille in [0, 10, 50] {
            if per_mille > 0 {
                drop_tcp(ROUTER_NS, "forward", per_mille);
            }
            let stack_before = (
                runner.counter("Tcp", "RetransSegs"),
                runner.counter("TcpExt", "TCPSackRecovery"),
            );
            let kernel_before = (
                client_kernel_counter("RetransSegs"),
                client_kernel_counter("TCPSackRecovery"),
            );
            let data = pattern(4 << 20);
            let back = echo_through(to, data.clone());
            assert!(
                back == data,
                "{per_mille}/1000 loss: echo differs (len {})",
                back.len()
            );
            if per_mille == 0 {
                continue;
            }
            let stats = runner
                .wait_for(|s| s["netstat"]["Tcp"]["RetransSegs"].as_u64() > Some(stack_before.0));
            let stack_moved = (
                stats["netstat"]["Tcp"]["RetransSegs"].as_u64().unwrap() - stack_before.0,
                stats["netstat"]["TcpExt"]["TCPSackRecovery"]
                    .as_u64()
                    .unwrap()
                    - stack_before.1,
            );
            let kernel_moved = (
                client_kernel_counter("RetransSegs") - kernel_before.0,
                client_kernel_counter("TCPSackRecovery") - kernel_before.1,
            );
            assert!(
                stack_moved.0 > 0 && stack_moved.1 > 0,
                "{per_mille}/1000: stack {stack_moved:?}"
            );
            assert!(
                kernel_moved.0 > 0 && kernel_moved.1 > 0,
                "{per_mille}/1000: kernel {kernel_moved:?}"
            );
            rounds.push((per_mille, stack_moved, kernel_moved));
        }
        // Shown with --nocapture: (loss per mille, stack (RetransSegs, TCPSackRecovery),
        // kernel (RetransSegs, TCPSackRecovery)).
        println!("echo over a lossy router, 4 MiB each way: {rounds:?}");
        runner.stop();
    });
}

/// SIGTERM drains: a connection whose client closes when it sees our FIN counts as
/// drained, one whose client never closes is reset at the deadline.
/// Voluntary context switches of the runner's shard thread (`userstack-CORE`): one per
/// sleep in poll(2).
fn shard_sleeps(runner: &Runner) -> u64 {
    let pid = runner.stats()["pid"]
        .as_u64()
        .expect("the stats name the pid");
    let name = format!("userstack-{}", shard_core());
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the runner's tasks");
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap();
            return status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("voluntary_ctxt_switches in the thread's status");
        }
    }
    panic!("no thread {name} in the runner {pid}");
}

/// With nothing to do, a shard parks in poll(2) (one sleep per millisecond at most) unless
/// its config says `"idle": "spin"`, when it never sleeps.
#[test]
fn an_idle_shard_parks_unless_told_to_spin() {
    in_namespaces("an_idle_shard_parks_unless_told_to_spin", || {
        veth("usv0", "usv1", 64);
        let sleeps_while_idle = |idle: &str| {
            let mut config = runner_config("x", 1000);
            config["idle"] = Value::from(idle);
            let runner = Runner::start(&config);
            let before = shard_sleeps(&runner);
            std::thread::sleep(Duration::from_millis(300));
            let slept = shard_sleeps(&runner) - before;
            runner.stop();
            slept
        };
        let parked = sleeps_while_idle("park");
        let spun = sleeps_while_idle("spin");
        assert!(
            parked >= 20,
            "a parking shard slept only {parked} times in 300 ms"
        );
        assert_eq!(spun, 0, "a spinning shard slept");
    });
}

#[test]
fn graceful_stop_drains_then_resets() {
    in_namespaces("graceful_stop_drains_then_resets", || {
        veth("usv0", "usv1", 64);
        let runner = Runner::start(&runner_config("x", 1000));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let clients = std::thread::spawn(move || {
            as_client(move || {
                let polite = TcpStream::connect((STACK_IP, 7)).unwrap();
                let stubborn = TcpStream::connect((STACK_IP, 7)).unwrap();
                for mut s in [&polite, &stubborn] {
                    s.write_all(b"ping").unwrap();
                    let mut buf = [0u8; 4];
                    s.read_exact(&mut buf).unwrap();
                }
                ready_tx.send(()).unwrap();
                // The polite client reads to our FIN, then closes.
                let mut rest = Vec::new();
                (&polite).read_to_end(&mut rest).unwrap();
                drop(polite);
                // The stubborn one sees our FIN too but keeps its side open until the
                // runner has stopped; by then the stack has reset it, so writing fails.
                let mut buf = [0u8; 1];
                let end = (&stubborn).read(&mut buf).unwrap();
                release_rx.recv().unwrap();
                let mut written = Ok(());
                for _ in 0..3 {
                    written = (&stubborn).write_all(b"late").map_err(|e| e.kind());
                    std::thread::sleep(Duration::from_millis(50));
                }
                (rest.len() + end, written)
            })
        });
        ready_rx.recv_timeout(PATIENCE).unwrap();
        let mut runner = runner;
        runner.wait_for(|s| s["shards"][0]["connections"] == 2);
        let last = runner.stop();
        release_tx.send(()).unwrap();
        let (rest, written) = clients.join().unwrap();
        assert_eq!(rest, 0, "both clients read end-of-stream and nothing else");
        assert!(
            matches!(
                written,
                Err(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
            ),
            "{written:?}"
        );
        assert_eq!(last["stop"]["drained"], 1, "{last}");
        assert_eq!(last["stop"]["reset"], 1, "{last}");
        assert!(last["netstat"]["Tcp"]["OutRsts"].as_u64().unwrap() >= 1);
    });
}

/// SIGKILL leaves no XDP program on the interface (the link belongs to the process's
/// descriptors), and a new runner attaches and serves again.
#[test]
fn sigkill_leaves_no_xdp_program() {
    in_namespaces("sigkill_leaves_no_xdp_program", || {
        veth("usv0", "usv1", 64);
        let runner = Runner::start(&runner_config("first\n", 2000));
        assert!(xdp_attached("usv0"));
        runner.kill();
        // The kernel releases the link when the last descriptor closes, at process exit.
        let start = WallClock::now();
        while xdp_attached("usv0") {
            assert!(
                start.elapsed() < PATIENCE,
                "the XDP program outlived SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let again = Runner::start(&runner_config("second\n", 2000));
        let out = in_client(&[
            "curl",
            "-sS",
            "--fail",
            "-m",
            "30",
            &format!("http://{STACK_IP}/"),
        ]);
        assert_eq!(out, "second\n");
        again.stop();
        assert!(!xdp_attached("usv0"));
    });
}

/// A bad configuration or a failed setup is one line on stderr and exit code 2, with
/// nothing attached.
#[test]
fn bad_setups_exit_2_with_one_line() {
    in_namespaces("bad_setups_exit_2_with_one_line", || {
        veth("usv0", "usv1", 64);
        let dir = std::env::temp_dir().join(format!("userstack-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut no_interface = runner_config("", 2000);
        no_interface["interface"] = "usv-missing".into();
        let mut no_core = runner_config("", 2000);
        no_core["cores"] = serde_json::json!([4000]);
        let mut bad_address = runner_config("", 2000);
        bad_address["address"] = "198.19.64.50".into();
        for (config, expected) in [
            (no_interface, "usv-missing"),
            (no_core, "core 4000"),
            (bad_address, "prefix"),
        ] {
            let path = dir.join("config.json");
            std::fs::write(&path, config.to_string()).unwrap();
            let out = Command::new(RUNNER)
                .args(["run", "--config"])
                .arg(&path)
                .arg("--stats")
                .arg(dir.join("stats.json"))
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(stderr.contains(expected), "{stderr} lacks {expected}");
            assert!(!xdp_attached("usv0"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

/// The TAP backend: the runner creates the device, the kernel side gets an address, and
/// curl fetches from the stack through it.
#[test]
fn tap_backend_serves_curl() {
    in_namespaces("tap_backend_serves_curl", || {
        let config = serde_json::json!({
            "interface": "ustap0",
            "backend": "tap",
            "cores": [shard_core()],
            "address": "198.19.66.50/24",
            "services": [ { "kind": "Http", "port": 80, "body": "over tap\n" } ]
        });
        let runner = Runner::start(&config);
        assert_eq!(runner.stats()["mode"], "tap");
        sh(&["ip", "addr", "add", "198.19.66.1/24", "dev", "ustap0"]);
        sh(&["ip", "link", "set", "ustap0", "up"]);
        let out = sh(&["curl", "-sS", "--fail", "-m", "30", "http://198.19.66.50/"]);
        assert_eq!(out, "over tap\n");
        runner.stop();
    });
}

/// Sends one TCP segment (an ACK for no connection, from port 40000 to `to`) through a raw
/// IP socket: the kernel adds the IP header and leaves the TCP checksum as given, whole and
/// right or, with `corrupt`, wrong. The frame reaches the device with no checksum flag.
fn send_raw_tcp(from: Ipv4Addr, to: SocketAddrV4, corrupt: bool) {
    let repr = userstack::wire::TcpRepr {
        src_port: 40000,
        dst_port: to.port(),
        seq_number: userstack::wire::SeqNumber(1),
        ack_number: userstack::wire::SeqNumber(1),
        flags: userstack::wire::TcpFlags(userstack::wire::TcpFlags::ACK),
        window_len: 1024,
        ..userstack::wire::TcpRepr::default()
    };
    let mut segment = vec![0u8; repr.buffer_len()];
    repr.emit(&mut segment, from, *to.ip());
    if corrupt {
        segment[16] ^= 0x5a;
    }
    // SAFETY: plain socket(2), closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) };
    assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    let address = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(to.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: segment and address are valid for their lengths; fd is ours.
    let sent = unsafe {
        libc::sendto(
            fd,
            segment.as_ptr().cast(),
            segment.len(),
            0,
            (&address as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    let error = std::io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    assert_eq!(sent, segment.len() as isize, "sendto: {error}");
}

/// TCP checksum offload on the TAP backend, both ways, against the kernel: the runner reports
/// it (`checksumOffload`), the kernel sees a device that takes partial checksums (ethtool's
/// `tx-checksumming`), 1 MiB echoes byte-exact (the kernel's segments arrive with partial
/// checksums the device trusts, the stack's leave with partial checksums the kernel takes),
/// and a segment from a raw socket with a wrong checksum (no flag: checked in software) is
/// dropped and counted in the device's drops and in netstat, while the same segment with a
/// right checksum reaches the stack.
#[test]
fn tap_offloads_checksums_and_drops_corrupt_segments() {
    in_namespaces("tap_offloads_checksums_and_drops_corrupt_segments", || {
        let stack = Ipv4Addr::new(198, 19, 66, 50);
        let kernel = Ipv4Addr::new(198, 19, 66, 1);
        let config = serde_json::json!({
            "interface": "ustap0",
            "backend": "tap",
            "cores": [shard_core()],
            "address": format!("{stack}/24"),
            "services": [ { "kind": "Echo", "port": 7 } ]
        });
        let mut runner = Runner::start(&config);
        assert_eq!(
            runner.stats()["checksumOffload"],
            serde_json::json!({ "rx": true, "tx": true })
        );
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{kernel}/24"),
            "dev",
            "ustap0",
        ]);
        sh(&["ip", "link", "set", "ustap0", "up"]);
        let features = sh(&["ethtool", "-k", "ustap0"]);
        assert!(features.contains("tx-checksumming: on"), "{features}");

        let data = pattern(1 << 20);
        let back = echo_here(SocketAddrV4::new(stack, 7), data.clone());
        assert!(back == data, "the echo came back different");
        let checksum_errors = |s: &Value| s["shards"][0]["drops"]["checksumErrors"].as_u64();
        let stats = runner.wait_for(|s| checksum_errors(s).is_some());
        assert_eq!(checksum_errors(&stats), Some(0), "{stats}");
        assert_eq!(stats["netstat"]["Tcp"]["InCsumErrors"], 0, "{stats}");

        send_raw_tcp(kernel, SocketAddrV4::new(stack, 7), true);
        let stats = runner.wait_for(|s| checksum_errors(s) == Some(1));
        assert_eq!(stats["netstat"]["Tcp"]["InCsumErrors"], 1, "{stats}");
        let segments = runner.counter("Tcp", "InSegs");
        send_raw_tcp(kernel, SocketAddrV4::new(stack, 7), false);
        let stats = runner.wait_for(|s| {
            s["netstat"]["Tcp"]["InSegs"]
                .as_u64()
                .is_some_and(|n| n > segments)
        });
        assert_eq!(checksum_errors(&stats), Some(1), "{stats}");
        runner.stop();
    });
}

/// A userstack client in this process (AF_XDP on `usv2`) against kernel TCP servers in the
/// client namespace: 4 MiB up to a kernel sink and 4 MiB down from a kernel source arrive
/// byte-exact over a clean path and over one dropping 1% and 5% of the TCP packets reaching
/// the client namespace, where the stack's retransmit and SACK-recovery counters move. The source port of every connection
/// is chosen to hash back to the client's queue.
#[test]
fn userstack_client_against_kernel_servers() {
    in_namespaces("userstack_client_against_kernel_servers", || {
        veth("usv2", "usv3", 65);
        let local = Ipv4Addr::new(198, 19, 65, 50);
        let server_ip = Ipv4Addr::new(198, 19, 65, 2);
        let mut client = Client::new("usv2", local);
        let mut rounds = Vec::new();
        for per_mille in [0, 10, 50] {
            if per_mille > 0 {
                drop_tcp(CLIENT_NS, "input", per_mille);
            }
            let data = pattern(4 << 20);
            let expected = data.clone();
            let sink = as_client_server(server_ip, 9000 + per_mille as u16, move |mut s| {
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                got
            });
            let before = client.stack.counters();
            client.send_all(SocketAddrV4::new(server_ip, 9000 + per_mille as u16), &data);
            let got = sink.join().unwrap();
            assert!(
                got == expected,
                "{per_mille}/1000: upload differs (len {})",
                got.len()
            );
            let down = data.clone();
            let source = as_client_server(server_ip, 9100 + per_mille as u16, move |mut s| {
                s.write_all(&down).unwrap();
                Vec::new()
            });
            let received =
                client.receive_all(SocketAddrV4::new(server_ip, 9100 + per_mille as u16));
            source.join().unwrap();
            assert!(
                received == expected,
                "{per_mille}/1000: download differs (len {})",
                received.len()
            );
            let after = client.stack.counters();
            let moved = |c| after.get(c) - before.get(c);
            use userstack::counters::Counter;
            rounds.push((
                per_mille,
                moved(Counter::RetransSegs),
                moved(Counter::TCPSackRecovery),
            ));
            if per_mille > 0 {
                assert!(
                    moved(Counter::RetransSegs) > 0,
                    "{per_mille}/1000: no retransmission"
                );
                assert!(
                    moved(Counter::TCPSackRecovery) > 0,
                    "{per_mille}/1000: no SACK recovery"
                );
            }
        }
        eprintln!("(loss per mille, RetransSegs, TCPSackRecovery) per round: {rounds:?}");
    });
}

/// Whether this kernel lets XDP programs call `bpf_xdp_adjust_meta`, the helper the
/// redirect program stamps frames with (aya's probe, as libbpf's: a minimal program's load).
fn kernel_offers_stamps() -> bool {
    is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_adjust_meta)
        .expect("probing the kernel's XDP helpers")
}

/// The verifier's answer to the stamped build on a kernel that refuses the helper (a 6.18
/// build: "program of this type cannot use helper bpf_xdp_adjust_meta#54").
const REFUSAL: &str = "program of this type cannot use helper bpf_xdp_adjust_meta#54";

/// The redirect program where the kernel refuses the stamping helper to XDP programs. As
/// this kernel decides, the stamped build runs where the kernel offers the helper and the
/// unstamped one, saying why, where it does not. As a kernel that refuses it decides (the
/// verifier's answer played through the loader's port, where this kernel accepts the helper):
/// the stamped build is tried first, the unstamped one attaches instead, the reason quotes
/// the verifier, and it carries a connection both ways with no frame stamped.
#[test]
fn the_redirect_program_serves_without_stamps_where_the_kernel_refuses_the_helper() {
    in_namespaces(
        "the_redirect_program_serves_without_stamps_where_the_kernel_refuses_the_helper",
        || {
            veth("usv2", "usv3", 65);
            let local = Ipv4Addr::new(198, 19, 65, 50);
            let server_ip = Ipv4Addr::new(198, 19, 65, 2);
            let offered = kernel_offers_stamps();
            let as_this_kernel = Client::new("usv2", local);
            match as_this_kernel.program.rx_stamps() {
                RxStamps::Enabled => assert!(offered, "stamped, but the probe says refused"),
                RxStamps::Unavailable { reason } => {
                    assert!(
                        !offered,
                        "unstamped on a kernel that offers the helper: {reason}"
                    );
                    assert!(reason.contains("bpf_xdp_adjust_meta"), "{reason}");
                }
                RxStamps::Unknown => panic!("the runner wrote a state it does not know"),
            }
            drop(as_this_kernel);
            let mut builds = Vec::new();
            let mut client = Client::with_program("usv2", local, |interface, rules| {
                RedirectProgram::attach_with(interface, rules, |program, build| {
                    builds.push(build);
                    match build {
                        Build::Stamped => Err(ProgramError::LoadError {
                            io_error: std::io::Error::from_raw_os_error(libc::EINVAL),
                            verifier_log: VerifierLog::new(format!("0: R1=ctx()\n{REFUSAL}\n")),
                        }),
                        Build::Unstamped => program.load(),
                    }
                })
            });
            assert_eq!(builds, [Build::Stamped, Build::Unstamped]);
            assert!(
                matches!(client.program.rx_stamps(), RxStamps::Unavailable { reason }
                    if reason.contains(REFUSAL)),
                "{:?}",
                client.program.rx_stamps()
            );
            let data = pattern(256 << 10);
            let expected = data.clone();
            let sink = as_client_server(server_ip, 9200, move |mut s| {
                let mut got = Vec::new();
                s.read_to_end(&mut got).unwrap();
                got
            });
            client.send_all(SocketAddrV4::new(server_ip, 9200), &data);
            assert!(sink.join().unwrap() == expected, "the upload differs");
            let down = data.clone();
            let source = as_client_server(server_ip, 9201, move |mut s| {
                s.write_all(&down).unwrap();
                Vec::new()
            });
            let received = client.receive_all(SocketAddrV4::new(server_ip, 9201));
            source.join().unwrap();
            assert!(received == expected, "the download differs");
            let wait = client.socket.rx_wait().expect("AF_XDP measures waits");
            assert_eq!(wait.frames, 0, "a frame read as stamped: {wait:?}");
        },
    );
}

/// A kernel server in the client namespace on `port`, running `serve` on its one
/// connection.
fn as_client_server(
    ip: Ipv4Addr,
    port: u16,
    serve: impl FnOnce(TcpStream) -> Vec<u8> + Send + 'static,
) -> std::thread::JoinHandle<Vec<u8>> {
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        as_client(move || {
            let listener = TcpListener::bind((ip, port)).unwrap();
            bound_tx.send(()).unwrap();
            let (stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            serve(stream)
        })
    });
    bound_rx.recv_timeout(PATIENCE).expect("server bound");
    handle
}

/// A userstack client: one stack on an AF_XDP socket of queue 0, driven by this thread.
struct Client {
    stack: Stack,
    socket: XdpSocket,
    program: RedirectProgram,
    rss: RssTable,
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
    epoch: WallClock,
}

impl Client {
    fn new(interface: &str, ip: Ipv4Addr) -> Client {
        Client::with_program(interface, ip, RedirectProgram::attach)
    }

    /// A client whose redirect program `attach` loads and attaches.
    fn with_program(
        interface: &str,
        ip: Ipv4Addr,
        attach: impl FnOnce(&str, &RedirectRules) -> std::io::Result<RedirectProgram>,
    ) -> Client {
        let socket = XdpSocket::open(interface, 0).unwrap();
        let mut config = StackConfig::new(interface::mac_address(interface).unwrap(), ip, 24);
        // On a veth: received checksums verified, none completed on transmit.
        let offload = socket.checksum_offload();
        assert!(offload.rx_verified && !offload.tx_completes, "{offload:?}");
        config.rx_checksum_offload = offload.rx_verified;
        let rules = RedirectRules {
            address: ip,
            ports: vec![],
            ephemeral_ports: config.ephemeral_ports,
        };
        let mut program = attach(interface, &rules).unwrap();
        assert_eq!(program.mode(), AttachMode::Driver, "veth runs XDP natively");
        program.add_socket(0, &socket).unwrap();
        Client {
            stack: Stack::new(config, Instant::ZERO),
            socket,
            program,
            rss: RssTable::spread(&MICROSOFT_KEY, 1),
            rx: Vec::new(),
            tx: Vec::new(),
            epoch: WallClock::now(),
        }
    }

    fn turn(&mut self) {
        let now = Instant::from_nanos(self.epoch.elapsed().as_nanos() as u64);
        self.socket.receive(&mut self.rx, 64);
        self.stack.ingress(now, &mut self.rx);
        self.stack.poll_timers(now);
        self.stack.egress(now, &mut self.tx);
        self.socket.transmit(&mut self.tx);
        assert!(
            self.epoch.elapsed() < 10 * PATIENCE,
            "the client made no progress"
        );
    }

    fn connect(&mut self, to: SocketAddrV4) -> userstack::stack::SocketHandle {
        self.rss
            .connect(&mut self.stack, 0, to)
            .expect("a free port whose replies reach queue 0")
    }

    fn send_all(&mut self, to: SocketAddrV4, data: &[u8]) {
        let handle = self.connect(to);
        let mut sent = 0;
        while sent < data.len() {
            sent += self.stack.send(handle, &data[sent..]).unwrap();
            self.turn();
        }
        self.stack.close(handle).unwrap();
        // Until the peer has everything and closed: our connection leaves the flow table
        // only after TIME-WAIT, so wait for the FIN exchange instead.
        while self.stack.connection(handle).is_some_and(|c| {
            !matches!(
                c.state(),
                userstack::tcp::State::TimeWait | userstack::tcp::State::Closed
            )
        }) {
            self.turn();
        }
    }

    fn receive_all(&mut self, from: SocketAddrV4) -> Vec<u8> {
        let handle = self.connect(from);
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            self.turn();
            let n = self.stack.recv(handle, &mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            if n == 0
                && self
                    .stack
                    .connection(handle)
                    .is_some_and(|c| c.is_recv_finished())
            {
                break;
            }
        }
        self.stack.close(handle).unwrap();
        for _ in 0..1000 {
            self.turn();
        }
        got
    }
}

/// The bulk client (config `clients`): the runner opens two connections to a kernel sink in
/// the client namespace and keeps them full; both carry data (the sink reads a MiB on each)
/// until SIGTERM, which closes them gracefully: the sink reads end-of-stream, not a reset.
#[test]
fn bulk_clients_fill_a_kernel_sink() {
    in_namespaces("bulk_clients_fill_a_kernel_sink", || {
        veth("usv0", "usv1", 64);
        let sink = as_client(|| TcpListener::bind(("198.19.64.2", 5001)).unwrap());
        let mut config = runner_config("x", 2000);
        config["clients"] = serde_json::json!([
            { "kind": "bulk", "remote": "198.19.64.2:5001", "connections": 2 }
        ]);
        let mut runner = Runner::start(&config);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (stream, peer) = sink.accept().unwrap();
                assert_eq!(peer.ip(), std::net::IpAddr::V4(STACK_IP));
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let mut buffer = vec![0u8; 64 * 1024];
                    let mut total = 0usize;
                    loop {
                        match stream.read(&mut buffer) {
                            Ok(0) => return (total, true),
                            Ok(n) => total += n,
                            Err(_) => return (total, false),
                        }
                    }
                })
            })
            .collect();
        runner.wait_for(|s| s["shards"][0]["connections"] == 2);
        // About 5.8 MB sent: over a MiB on each connection.
        let stats = runner.wait_for(|s| s["netstat"]["Tcp"]["OutSegs"].as_u64() > Some(4000));
        assert_eq!(stats["netstat"]["Tcp"]["ActiveOpens"], 2, "{stats}");
        // The shard's load and the AF_XDP socket's drop counters are published: sending
        // flat out, the loop was busy for some of its time, never more than all of it.
        let shard = &stats["shards"][0];
        let (busy, ran) = (shard["busyNanos"].as_u64(), shard["runNanos"].as_u64());
        assert!(busy > Some(0) && busy <= ran, "{shard}");
        for field in [
            "rxDropped",
            "rxRingFull",
            "rxFillRingEmpty",
            "txRingEmpty",
            "txRingFull",
        ] {
            assert!(shard["drops"][field].is_u64(), "{field}: {shard}");
        }
        // Where the kernel offers the stamping helper, the kernel's ACKs reached the shard
        // stamped by the redirect program (the veth keeps XDP metadata, and copy mode carries
        // it into the UMEM): each frame's wait is counted in one bucket, and no frame is
        // counted that the shard did not receive. Where it does not, the runner serves
        // without stamps, says why, and reports no waits.
        let stamps = &stats["rxStamps"];
        if kernel_offers_stamps() {
            assert_eq!(stamps["state"], "enabled", "{stats}");
            let wait = &shard["rxWait"];
            let frames = wait["frames"].as_u64().unwrap_or(0);
            assert!(frames > 0, "no stamped frame: {shard}");
            assert!(Some(frames) <= shard["rxPackets"].as_u64(), "{shard}");
            let buckets: u64 = wait["log2Micros"]
                .as_array()
                .map_or(0, |b| b.iter().filter_map(Value::as_u64).sum());
            assert_eq!(buckets, frames, "{wait}");
            assert!(wait["totalNanos"].as_u64() > Some(0), "{wait}");
        } else {
            assert_eq!(stamps["state"], "unavailable", "{stats}");
            let reason = stamps["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("bpf_xdp_adjust_meta"), "{stats}");
            assert!(shard.get("rxWait").is_none(), "{shard}");
        }
        runner.stop();
        for reader in readers {
            let (read, ended) = reader.join().unwrap();
            assert!(read >= 1 << 20, "the sink read only {read} bytes");
            assert!(ended, "the connection ended with an error, not a FIN");
        }
    });
}
