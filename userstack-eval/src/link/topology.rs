//! The real link: three network namespaces on one machine (the VM node's guest, whose kernel
//! has netem), a sender, a router and a receiver, joined by two veth pairs. The router shapes
//! the data direction with netem (delay, jitter, loss) feeding tbf (100 Mbit/s, a queue of
//! 250 full-size packets) and delays the ACK direction with netem, per receiving port when
//! the row's flows have different RTTs.
//!
//! ```text
//!  ue-snd              ue-rtr                                      ue-rcv
//!  s0 198.19.200.2 ── s1 198.19.200.1 │ r1 198.19.201.1 ── r0 198.19.201.2
//!     (userstack .3)   ACKs: netem      data: netem → tbf            (userstack .3)
//! ```
//!
//! Segmentation and receive offloads are off on every veth, so that a loss or a queue slot
//! is one wire-sized packet for both stacks, and Receive Packet Steering can keep the kernel's
//! packet work off the runner's core. [`plan`] is pure; [`Topology::up`] runs it and
//! [`Topology`]'s drop removes the namespaces (and with them the veths and qdiscs).

use crate::rows::{Row, BASE_RTT_MS, BOTTLENECK_MBPS, QUEUE_PACKETS};
use std::net::Ipv4Addr;
use std::process::Command;

/// The sender's namespace.
pub const SENDER_NS: &str = "ue-snd";
/// The router's namespace.
pub const ROUTER_NS: &str = "ue-rtr";
/// The receiver's namespace.
pub const RECEIVER_NS: &str = "ue-rcv";
/// The sender's interface.
pub const SENDER_IF: &str = "s0";
/// The receiver's interface.
pub const RECEIVER_IF: &str = "r0";
/// Linux's address on the sender.
pub const SENDER_LINUX: Ipv4Addr = Ipv4Addr::new(198, 19, 200, 2);
/// userstack's address on the sender (the same interface, its own address).
pub const SENDER_USERSTACK: Ipv4Addr = Ipv4Addr::new(198, 19, 200, 3);
/// The router on the sender's side: the sender's gateway.
pub const SENDER_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 19, 200, 1);
/// Linux's address on the receiver.
pub const RECEIVER_LINUX: Ipv4Addr = Ipv4Addr::new(198, 19, 201, 2);
/// userstack's address on the receiver.
pub const RECEIVER_USERSTACK: Ipv4Addr = Ipv4Addr::new(198, 19, 201, 3);
/// The router on the receiver's side: the receiver's gateway.
pub const RECEIVER_GATEWAY: Ipv4Addr = Ipv4Addr::new(198, 19, 201, 1);
/// The prefix length of both subnets.
pub const PREFIX: u8 = 24;
/// Bytes of one full-size frame as tbf counts it (1500 + the Ethernet header).
const FRAME_BYTES: u32 = 1514;

/// One command: the program and its arguments.
pub type Step = Vec<String>;

fn step(words: &str) -> Step {
    words.split_whitespace().map(str::to_string).collect()
}

/// netem's delay (and jitter) for one direction: a mean of `base_ms` plus half the row's
/// jitter, spread ± half the jitter (netem's jitter is uniform around its delay), which is
/// the row's uniform extra delay in `[0, jitter)`.
fn netem_delay(base_ms: f64, jitter_ms: f64) -> String {
    let micros = |ms: f64| (ms * 1000.0).round() as u64;
    if jitter_ms > 0.0 {
        format!(
            "delay {}us {}us",
            micros(base_ms + jitter_ms / 2.0),
            micros(jitter_ms / 2.0)
        )
    } else {
        format!("delay {}us", micros(base_ms))
    }
}

/// The RPS mask (hex, as `rps_cpus` takes it) of a machine with `cpus` CPUs that leaves out
/// `core`: every CPU but that one.
pub fn rps_mask(cpus: u32, core: u32) -> String {
    let all = if cpus >= 64 {
        u64::MAX
    } else {
        (1u64 << cpus) - 1
    };
    format!("{:x}", all & !(1u64 << core.min(63)))
}

/// Every command that builds the link for `row`, in order; the sysctls give both ends
/// CUBIC, no cached path metrics and the row's SACK setting. With `rps`, every veth's
/// received packets are processed on the CPUs of that mask (Receive Packet Steering): the
/// evaluation keeps the kernel's packet work off the runner's core in every pairing, as the
/// agent takes a user-space stack's core out of its interface's RPS mask.
pub fn plan(row: &Row, rps: Option<&str>) -> Vec<Step> {
    let one_way = f64::from(BASE_RTT_MS) / 2.0;
    let mut steps = Vec::new();
    for ns in [SENDER_NS, ROUTER_NS, RECEIVER_NS] {
        steps.push(step(&format!("ip netns add {ns}")));
        steps.push(step(&format!("ip -n {ns} link set lo up")));
    }
    steps.push(step(&format!(
        "ip link add {SENDER_IF} netns {SENDER_NS} type veth peer name s1 netns {ROUTER_NS}"
    )));
    steps.push(step(&format!(
        "ip link add {RECEIVER_IF} netns {RECEIVER_NS} type veth peer name r1 netns {ROUTER_NS}"
    )));
    for (ns, dev, address) in [
        (SENDER_NS, SENDER_IF, SENDER_LINUX),
        (ROUTER_NS, "s1", SENDER_GATEWAY),
        (ROUTER_NS, "r1", RECEIVER_GATEWAY),
        (RECEIVER_NS, RECEIVER_IF, RECEIVER_LINUX),
    ] {
        steps.push(step(&format!(
            "ip -n {ns} addr add {address}/{PREFIX} dev {dev}"
        )));
        steps.push(step(&format!(
            "ip netns exec {ns} ethtool -K {dev} tso off gso off gro off"
        )));
        if let Some(mask) = rps {
            steps.push(vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                ns.to_string(),
                "sh".into(),
                "-c".into(),
                format!("echo {mask} > /sys/class/net/{dev}/queues/rx-0/rps_cpus"),
            ]);
        }
        steps.push(step(&format!("ip -n {ns} link set {dev} up")));
    }
    steps.push(step(&format!(
        "ip -n {SENDER_NS} route add default via {SENDER_GATEWAY}"
    )));
    steps.push(step(&format!(
        "ip -n {RECEIVER_NS} route add default via {RECEIVER_GATEWAY}"
    )));
    steps.push(step(&format!(
        "ip netns exec {ROUTER_NS} sysctl -qw net.ipv4.ip_forward=1"
    )));
    for ns in [SENDER_NS, RECEIVER_NS] {
        for setting in [
            format!("net.ipv4.tcp_sack={}", u8::from(row.sack)),
            "net.ipv4.tcp_congestion_control=cubic".into(),
            "net.ipv4.tcp_no_metrics_save=1".into(),
        ] {
            steps.push(step(&format!("ip netns exec {ns} sysctl -qw {setting}")));
        }
    }
    // The data direction: delay, jitter and loss, then the bottleneck and its queue.
    let loss = if row.loss > 0.0 {
        format!(" loss {}%", (row.loss * 10_000.0).round() / 100.0)
    } else {
        String::new()
    };
    steps.push(step(&format!(
        "tc -n {ROUTER_NS} qdisc add dev r1 root handle 1: netem {}{loss} limit 100000",
        netem_delay(one_way, row.jitter_ms)
    )));
    steps.push(step(&format!(
        "tc -n {ROUTER_NS} qdisc add dev r1 parent 1:1 handle 10: tbf rate {BOTTLENECK_MBPS}mbit \
         burst {} limit {}",
        10 * FRAME_BYTES,
        QUEUE_PACKETS * FRAME_BYTES
    )));
    // The ACK direction: the rest of each flow's RTT.
    let ports = row.ports();
    if ports.len() == 1 {
        steps.push(step(&format!(
            "tc -n {ROUTER_NS} qdisc add dev s1 root handle 1: netem {} limit 100000",
            netem_delay(f64::from(ports[0].1) - one_way, 0.0)
        )));
    } else {
        // One band per receiving port, told apart by the ACKs' source port; everything
        // else (ARP) goes to band 1, the first port's.
        steps.push(step(&format!(
            "tc -n {ROUTER_NS} qdisc add dev s1 root handle 1: prio bands {} priomap {}",
            ports.len(),
            ["0"; 16].join(" ")
        )));
        for (band, (port, rtt)) in ports.iter().enumerate() {
            let band = band + 1;
            steps.push(step(&format!(
                "tc -n {ROUTER_NS} qdisc add dev s1 parent 1:{band} handle {}: netem {} limit 100000",
                band + 10,
                netem_delay(f64::from(*rtt) - one_way, 0.0)
            )));
            steps.push(step(&format!(
                "tc -n {ROUTER_NS} filter add dev s1 parent 1: protocol ip prio 1 u32 \
                 match ip sport {port} 0xffff flowid 1:{band}"
            )));
        }
    }
    steps
}

/// The commands that remove the link (the namespaces take their veths and qdiscs along).
pub fn teardown() -> Vec<Step> {
    [SENDER_NS, ROUTER_NS, RECEIVER_NS]
        .iter()
        .map(|ns| step(&format!("ip netns del {ns}")))
        .collect()
}

/// Runs `step`; its stderr on failure.
pub fn run(step: &Step) -> Result<(), String> {
    let out = Command::new(&step[0])
        .args(&step[1..])
        .output()
        .map_err(|e| format!("{}: {e}", step.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            step.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// What the router's data-direction qdiscs counted so far: packets netem dropped (the row's
/// random loss) and packets tbf dropped (the bottleneck queue overflowing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drops {
    /// netem's drops: the row's random loss.
    pub lost: u64,
    /// tbf's drops: packets that found the bottleneck queue full.
    pub overflowed: u64,
}

/// The data direction's drop counters, from `tc -s -j qdisc show` in the router.
pub fn drops() -> Result<Drops, String> {
    let step = step(&format!("tc -n {ROUTER_NS} -s -j qdisc show dev r1"));
    let out = Command::new(&step[0])
        .args(&step[1..])
        .output()
        .map_err(|e| format!("{}: {e}", step.join(" ")))?;
    parse_drops(&String::from_utf8_lossy(&out.stdout))
}

/// [`Drops`] from `tc -s -j qdisc show`'s JSON.
pub fn parse_drops(json: &str) -> Result<Drops, String> {
    let qdiscs: Vec<serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("tc's JSON: {e}"))?;
    let of = |kind: &str| -> u64 {
        qdiscs
            .iter()
            .filter(|q| q["kind"] == kind)
            .filter_map(|q| q["drops"].as_u64())
            .sum()
    };
    // netem is tbf's parent, and a parent's drops include its child's.
    let overflowed = of("tbf");
    Ok(Drops {
        lost: of("netem").saturating_sub(overflowed),
        overflowed,
    })
}

/// The link, up; dropping it removes it.
#[derive(Debug)]
pub struct Topology(());

impl Topology {
    /// Builds the link for `row` (with `rps`, its packets steered to that CPU mask), first
    /// removing one a crashed run left behind; on failure removes what it built.
    pub fn up(row: &Row, rps: Option<&str>) -> Result<Topology, String> {
        remove();
        let topology = Topology(());
        for step in plan(row, rps) {
            run(&step)?;
        }
        Ok(topology)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        remove();
    }
}

/// Removes the namespaces, whichever exist.
fn remove() {
    for step in teardown() {
        let _ = Command::new(&step[0]).args(&step[1..]).output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::by_label;

    fn joined(row: &str) -> Vec<String> {
        plan(by_label(row).unwrap(), None)
            .iter()
            .map(|s| s.join(" "))
            .collect()
    }

    #[test]
    fn the_clean_path_is_10_ms_each_way_with_a_250_packet_bottleneck() {
        let plan = joined("1 flow");
        assert!(plan.contains(
            &"tc -n ue-rtr qdisc add dev r1 root handle 1: netem delay 10000us limit 100000".into()
        ));
        assert!(plan.contains(
            &"tc -n ue-rtr qdisc add dev r1 parent 1:1 handle 10: tbf rate 100mbit burst 15140 limit 378500"
                .into()
        ));
        assert!(plan.contains(
            &"tc -n ue-rtr qdisc add dev s1 root handle 1: netem delay 10000us limit 100000".into()
        ));
        assert!(plan.contains(&"ip netns exec ue-snd sysctl -qw net.ipv4.tcp_sack=1".into()));
    }

    #[test]
    fn packets_are_steered_off_the_runners_core_on_every_veth() {
        assert_eq!(rps_mask(2, 1), "1");
        assert_eq!(rps_mask(4, 0), "e");
        let plan: Vec<String> = plan(by_label("1 flow").unwrap(), Some("1"))
            .iter()
            .map(|s| s.join(" "))
            .collect();
        for (ns, dev) in [
            ("ue-snd", "s0"),
            ("ue-rtr", "s1"),
            ("ue-rtr", "r1"),
            ("ue-rcv", "r0"),
        ] {
            assert!(
                plan.contains(&format!(
                    "ip netns exec {ns} sh -c echo 1 > /sys/class/net/{dev}/queues/rx-0/rps_cpus"
                )),
                "{plan:#?}"
            );
        }
        assert!(!joined("1 flow").iter().any(|s| s.contains("rps_cpus")));
    }

    #[test]
    fn drops_are_read_from_tcs_json() {
        // netem's count includes the drops of its child, tbf (as this kernel reports them:
        // a clean row's netem and tbf drops are equal).
        let json = r#"[{"kind":"netem","handle":"1:","root":true,"drops":12,"packets":900},
            {"kind":"tbf","handle":"10:","parent":"1:1","drops":3,"packets":880}]"#;
        assert_eq!(
            parse_drops(json).unwrap(),
            Drops {
                lost: 9,
                overflowed: 3
            }
        );
        assert!(parse_drops("Error").is_err());
    }

    #[test]
    fn loss_jitter_and_sack_reach_the_commands() {
        let plan = joined("1 flow, 5 % loss, SACK off");
        assert!(plan
            .iter()
            .any(|s| s.contains("netem delay 10000us loss 5% limit")));
        assert!(plan.contains(&"ip netns exec ue-rcv sysctl -qw net.ipv4.tcp_sack=0".into()));
        let plan = joined("4 flows, 1 ms jitter");
        assert!(plan
            .iter()
            .any(|s| s.contains("dev r1 root handle 1: netem delay 10500us 500us limit")));
    }

    #[test]
    fn flows_of_different_rtts_get_their_ack_delay_by_port() {
        let plan = joined("4 flows, RTT 20/40/60/80 ms");
        for (band, port, delay) in [(1, 5001, 10), (2, 5002, 30), (3, 5003, 50), (4, 5004, 70)] {
            assert!(
                plan.contains(&format!(
                    "tc -n ue-rtr qdisc add dev s1 parent 1:{band} handle {}: netem delay {}us limit 100000",
                    band + 10,
                    delay * 1000
                )),
                "{plan:#?}"
            );
            assert!(plan.contains(&format!(
                "tc -n ue-rtr filter add dev s1 parent 1: protocol ip prio 1 u32 match ip sport {port} 0xffff flowid 1:{band}"
            )));
        }
    }
}
