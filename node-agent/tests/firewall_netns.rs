//! The nftables applier against the real kernel, inside a fresh network namespace.
//!
//! The test re-runs itself under `unshare --net`: nftables tables belong to a network
//! namespace, so every table it makes (the agent's, and the `inet other` it must leave alone)
//! vanishes with the child process, even when the child fails or is killed. It needs root,
//! `unshare` and the `nft` tool (to read the table as an administrator would).
//!
//! What it shows on the real kernel: the table nft lists for a description (sets, interval
//! elements, the per-source limit, notrack); IPv4 and IPv6 packets from blocked sources dropped
//! and counted per rule, also on /metrics; connections to a notrack port untracked (a probe
//! table of conntrack matches sees them so) and others tracked; a rule added behind the agent's
//! back read as a modified table and repaired; an atomic replacement; a SYN flood held to burst +
//! rate × time; 4096 prefixes; the revert deleting the table; `inet other` untouched throughout;
//! and a `table inet hoststack` the agent did not make refused before any write.

mod netns;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use hoststack_agent::appliers::{self, firewall};
use hoststack_agent::exporter::Exporter;
use hoststack_agent::host::nftables::netlink;
use hoststack_agent::host::Host;
use hoststack_agent::journal::{Applied, JournalStore};
use hoststack_agent::model::{Reading, Setting};
use hoststack_agent::transaction::{Goal, Outcome, Transactor};
use hoststack_crds::{ItemState, NodeState};

const TEST: &str = "the_agents_table_in_a_fresh_network_namespace";
const CHILD: &str = "HOSTSTACK_AGENT_FIREWALL_TEST_IN_NETNS";

#[test]
fn the_agents_table_in_a_fresh_network_namespace() {
    if std::env::var_os(CHILD).is_some() {
        in_fresh_namespace();
        return;
    }
    netns::rerun_under_unshare(TEST, &["--net"], CHILD, "1");
}

/// Runs `nft` with `args`; its standard output.
fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A revision with the table described by `firewall` and one sysctl (so that the table is one
/// setting among others).
fn goal(revision: &str, firewall: &str) -> Goal {
    Goal {
        target: Some(Applied {
            tuning: "test".into(),
            revision: revision.into(),
        }),
        values: [
            (firewall::setting(), firewall.to_string()),
            (Setting::sysctl("net.ipv4.tcp_sack"), "0".to_string()),
        ]
        .into(),
    }
}

/// The table that description A makes, as `nft list table inet hoststack` prints it.
const TABLE_A: &str = r#"table inet hoststack {
	comment "managed by hoststack-agent"
	set blocked4 {
		type ipv4_addr
		flags interval
		elements = { 10.0.0.0/8, 127.0.0.3,
			     198.19.20.0/25 }
	}

	set blocked6 {
		type ipv6_addr
		flags interval
		elements = { ::1,
			     2001:db8::/32 }
	}

	set syn4 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 1m
	}

	set syn6 {
		type ipv6_addr
		size 65535
		flags dynamic,timeout
		timeout 1m
	}

	set notrack_ports {
		type inet_service
		elements = { 80, 443 }
	}

	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		ip saddr @blocked4 counter packets 0 bytes 0 drop comment "blocked-ipv4"
		ip6 saddr @blocked6 counter packets 0 bytes 0 drop comment "blocked-ipv6"
		tcp flags syn / fin,syn,rst,ack update @syn4 { ip saddr limit rate over 10/second burst 20 packets } counter packets 0 bytes 0 drop comment "syn-limit-ipv4"
		tcp flags syn / fin,syn,rst,ack update @syn6 { ip6 saddr limit rate over 10/second burst 20 packets } counter packets 0 bytes 0 drop comment "syn-limit-ipv6"
		tcp dport @notrack_ports notrack counter packets 0 bytes 0 accept comment "notrack-in"
	}

	chain output {
		type filter hook output priority raw; policy accept;
		tcp sport @notrack_ports notrack counter packets 0 bytes 0 accept comment "notrack-out"
	}
}
"#;

/// Description B replaces A: other prefixes, a tighter limit, no notrack ports.
const TABLE_B: &str = r#"table inet hoststack {
	comment "managed by hoststack-agent"
	set blocked4 {
		type ipv4_addr
		flags interval
		elements = { 198.19.21.0/24 }
	}

	set syn4 {
		type ipv4_addr
		size 65535
		flags dynamic,timeout
		timeout 1m
	}

	set syn6 {
		type ipv6_addr
		size 65535
		flags dynamic,timeout
		timeout 1m
	}

	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		ip saddr @blocked4 counter packets 0 bytes 0 drop comment "blocked-ipv4"
		tcp flags syn / fin,syn,rst,ack update @syn4 { ip saddr limit rate over 5/second } counter packets 0 bytes 0 drop comment "syn-limit-ipv4"
		tcp flags syn / fin,syn,rst,ack update @syn6 { ip6 saddr limit rate over 5/second } counter packets 0 bytes 0 drop comment "syn-limit-ipv6"
	}
}
"#;

const A: &str = "blocked 10.0.0.0/8 127.0.0.3/32 198.19.20.0/25 ::1/128 2001:db8::/32; \
                 syn-limit 10/second burst 20; notrack 80 443";
const B: &str = "blocked 198.19.21.0/24; syn-limit 5/second burst 5; notrack none";

/// A table of someone else's, which the agent must leave exactly as it is.
const OTHER: &str = "table inet other {
	chain input {
		type filter hook input priority filter; policy accept;
		ip saddr 192.0.2.1 drop
	}
}
";

/// A table of conntrack matches that counts untracked packets to port 80 and new connections to
/// port 81, to see what notrack does.
const PROBE: &str = "table inet probe {
	chain input {
		type filter hook input priority filter; policy accept;
		ct state untracked tcp dport 80 counter
		ct state new tcp dport 81 counter
	}
}
";

/// Runs an nft script given on standard input.
fn nft_script(script: &str) {
    use std::io::Write;
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run nft");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write the script");
    assert!(child.wait().is_ok_and(|s| s.success()), "nft -f - failed");
}

/// Whether a TCP connect to `addr:port` completes.
fn connects(addr: Ipv4Addr, port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from((addr, port)), Duration::from_secs(2)).is_ok()
}

fn read(host: &Host) -> Reading {
    appliers::read(host, &firewall::setting())
}

fn drops(rule: &str) -> (u64, u64) {
    netlink::drop_counters()
        .expect("list the drop counters")
        .into_iter()
        .find(|c| c.rule == rule)
        .map(|c| (c.packets, c.bytes))
        .unwrap_or_else(|| panic!("no counter for {rule}"))
}

fn in_fresh_namespace() {
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status();
    assert!(up.is_ok_and(|s| s.success()), "ip link set lo up");
    nft_script(OTHER);
    let other_before = nft(&["list", "table", "inet", "other"]);
    assert_eq!(other_before, OTHER);

    let host = Host::new(std::path::Path::new("/proc"), std::path::Path::new("/sys"));
    let state = tempfile::tempdir().expect("tempdir");
    let tx = Transactor::new(host.clone(), JournalStore::new(state.path()));
    let run = |g: &Goal| -> Outcome { tx.execute(g, &mut |_| {}).expect("transaction") };
    let exporter = Exporter::new(std::path::Path::new("/proc"));
    assert!(
        !exporter.encode().contains("firewall"),
        "no table, no firewall series"
    );
    assert_eq!(read(&host), Reading::Value("absent".into()));

    // Apply A: the table, its sets, the limit and notrack rules are as nft prints them.
    let applied = run(&goal("a", A));
    assert_eq!(applied.state, NodeState::Applied, "{applied:#?}");
    let item = applied
        .items
        .iter()
        .find(|i| i.kind == "nftables")
        .expect("nftables item");
    assert_eq!(item.state, ItemState::Applied);
    assert_eq!(item.original.as_deref(), Some("absent"));
    assert_eq!(item.actual.as_deref(), Some(A));
    assert_eq!(nft(&["list", "table", "inet", "hoststack"]), TABLE_A);
    assert_eq!(nft(&["list", "table", "inet", "other"]), other_before);

    // Packets from a blocked source are dropped and counted, per rule.
    let receiver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    receiver
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let sender = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 3), 0)).expect("bind");
    for _ in 0..3 {
        sender
            .send_to(&[0u8; 10], receiver.local_addr().unwrap())
            .expect("send");
    }
    assert!(
        receiver.recv_from(&mut [0u8; 64]).is_err(),
        "a datagram from 127.0.0.3 got through"
    );
    assert_eq!(
        drops("blocked-ipv4"),
        (3, 3 * 38),
        "3 IPv4/UDP packets of 38 bytes"
    );
    assert_eq!(drops("syn-limit-ipv4"), (0, 0));
    // And from ::1, by the IPv6 rule.
    let receiver6 = UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).expect("bind");
    receiver6
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let sender6 = UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).expect("bind");
    sender6
        .send_to(&[0u8; 10], receiver6.local_addr().unwrap())
        .expect("send");
    assert!(
        receiver6.recv_from(&mut [0u8; 64]).is_err(),
        "a datagram from ::1 got through"
    );
    assert_eq!(
        drops("blocked-ipv6"),
        (1, 58),
        "1 IPv6/UDP packet of 58 bytes"
    );
    let metrics = exporter.encode();
    assert!(
        metrics.lines().any(|l| l
            == "hoststack_firewall_dropped_packets_total{table=\"inet/hoststack\",rule=\"blocked-ipv4\"} 3"),
        "{metrics}"
    );

    // Notrack: connections to port 80 (a notrack port) are untracked, to port 81 tracked, as a
    // probe table of conntrack matches sees them.
    nft_script(PROBE);
    for port in [80, 81] {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("listen");
        assert!(
            connects(Ipv4Addr::LOCALHOST, port),
            "connect to port {port}"
        );
        drop(listener);
    }
    let probe = nft(&["list", "table", "inet", "probe"]);
    let packets = |marker: &str| -> u64 {
        let line = probe
            .lines()
            .find(|l| l.contains(marker))
            .unwrap_or_else(|| panic!("{marker} in {probe}"));
        let after = &line[line.find("packets ").expect("packets") + 8..];
        after.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(packets("dport 80") >= 2, "untracked to port 80: {probe}");
    assert_eq!(
        packets("dport 81"),
        1,
        "one new connection to port 81: {probe}"
    );
    assert!(
        drops("blocked-ipv4").0 == 3,
        "notrack traffic is not blocked"
    );

    // A rule added behind the agent's back reads as a modified table; the same revision
    // applied again replaces it.
    nft(&[
        "add",
        "rule",
        "inet",
        "hoststack",
        "prerouting",
        "udp",
        "dport",
        "53",
        "drop",
    ]);
    match read(&host) {
        Reading::Value(v) => assert!(v.starts_with("modified: "), "{v}"),
        other => panic!("{other:?}"),
    }
    let repaired = run(&goal("a", A));
    assert_eq!(repaired.state, NodeState::Applied, "{repaired:#?}");
    assert_eq!(read(&host), Reading::Value(A.into()));

    // Replace A with B in one batch; the other table is untouched, the original stays absent.
    let replaced = run(&goal("b", B));
    assert_eq!(replaced.state, NodeState::Applied, "{replaced:#?}");
    let item = replaced
        .items
        .iter()
        .find(|i| i.kind == "nftables")
        .expect("nftables item");
    assert_eq!(item.original.as_deref(), Some("absent"));
    assert_eq!(nft(&["list", "table", "inet", "hoststack"]), TABLE_B);
    assert_eq!(nft(&["list", "table", "inet", "other"]), other_before);

    // A SYN flood from 127.0.0.1: at most burst + rate × elapsed connections get through, the
    // rest are dropped by syn-limit-ipv4 and counted.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listen");
    let target: SocketAddr = listener.local_addr().unwrap();
    let attempts = 40u64;
    let start = Instant::now();
    let mut connected = 0u64;
    for _ in 0..attempts {
        if TcpStream::connect_timeout(&target, Duration::from_millis(20)).is_ok() {
            connected += 1;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bound = 5 + (5.0 * elapsed).ceil() as u64;
    let (dropped, _) = drops("syn-limit-ipv4");
    println!("SYN flood: {attempts} connects in {elapsed:.2}s, {connected} connected, {dropped} SYNs dropped, bound {bound}");
    assert!(connected >= 1, "the burst lets the first SYNs through");
    assert!(connected <= bound, "{connected} connections > {bound}");
    assert!(
        dropped >= attempts - connected,
        "every refused connect is a dropped SYN ({dropped} < {})",
        attempts - connected
    );

    // The schema's most prefixes, 4096 hosts none of which touch another: 8192 interval
    // elements, in one batch, read back exactly.
    let hosts: Vec<String> = (0..4096u32)
        .map(|i| format!("10.0.{}.{}/32", i / 128, 2 * (i % 128)))
        .collect();
    let many = format!("blocked {}; syn-limit none; notrack none", hosts.join(" "));
    let large = run(&goal("c", &many));
    assert_eq!(large.state, NodeState::Applied, "{:?}", large.message);
    assert_eq!(read(&host), Reading::Value(many.clone()));
    assert_eq!(nft(&["list", "table", "inet", "other"]), other_before);

    // Revert: the table is gone, the other table and the sysctl are as they were.
    let reverted = run(&Goal::revert());
    assert_eq!(reverted.state, NodeState::Reverted, "{reverted:#?}");
    assert_eq!(read(&host), Reading::Value("absent".into()));
    assert!(!nft(&["list", "tables"]).contains("hoststack"));
    assert_eq!(nft(&["list", "table", "inet", "other"]), other_before);
    assert!(netlink::drop_counters().expect("list").is_empty());
    assert!(!exporter.encode().contains("firewall"));

    // A table of the agent's name that the agent did not make fails the revision before any
    // write, and is left as it is.
    nft(&["add", "table", "inet", "hoststack"]);
    let theirs = nft(&["list", "table", "inet", "hoststack"]);
    let sack = appliers::read(&host, &Setting::sysctl("net.ipv4.tcp_sack"));
    let refused = run(&goal("a", A));
    assert_eq!(refused.state, NodeState::Failed, "{refused:#?}");
    let message = refused.message.unwrap_or_default();
    assert!(message.contains("hoststack did not make it"), "{message}");
    assert_eq!(nft(&["list", "table", "inet", "hoststack"]), theirs);
    assert_eq!(
        appliers::read(&host, &Setting::sysctl("net.ipv4.tcp_sack")),
        sack
    );
    assert!(netlink::delete().is_err(), "the kernel call refuses it too");
    assert!(netlink::drop_counters().expect("list").is_empty());
}
