//! Real TCP traffic between lab nodes, and random loss on a node's wire.
//!
//! [`Loss`] drops a share of one node's packets to and from a peer in an nftables netdev table
//! of its own on the node's eth0. Only the ingress drops look like loss on the wire to TCP: a
//! drop on the way out (an inet output chain, and also the netdev egress hook, which sees the
//! GSO super-packet before the driver) is reported back to the sending socket as a local error
//! and never counted as a retransmission of a lost segment. So to make a node's own segments
//! get lost, install the loss at its peer. [`Bulk`] runs iperf3 flows as lab helpers, its
//! clients segmenting in software (below). [`Blackhole`] kills a node's open connections to a
//! peer silently. All are undone on drop.
//!
//! A veth carries the sender's GSO super-packets whole, so a drop at the peer's ingress loses a
//! burst of segments at once: measured with iperf3 at 50 Mbit/s on a veth pair, a 2 s window
//! held about 320 packets of 27 segments each, a 2% rule dropped 3 to 9 of them, and the
//! retransmitted share of the segments ranged from 1.0% to 3.6% — on a busy machine a window
//! with no drop at all, only a probe or two, comes up now and then. A NIC puts each segment on
//! the wire on its own, so [`Bulk`] turns TSO and GSO off on its clients' eth0: the same rule
//! then sees about 8,900 packets and drops 150 to 192 (ratios 1.7% to 2.2%).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::{Error, Lab, Result};

/// The nftables table that holds the loss rules.
pub const LOSS_TABLE: &str = "hs_loss";

/// Random loss of `permille`/1000 of the packets between a node and a peer on TCP `port`, each
/// way (the peer's segments to or from `port` dropped at the node's ingress; the node's to the
/// peer's `port` at its egress); removed on drop.
pub struct Loss<'lab> {
    lab: &'lab Lab,
    node: String,
}

impl<'lab> Loss<'lab> {
    /// Installs the loss table in `node`'s namespace.
    pub fn install(
        lab: &'lab Lab,
        node: &str,
        peer: Ipv4Addr,
        port: u16,
        permille: u32,
    ) -> Result<Self> {
        let rules = format!(
            "table netdev {LOSS_TABLE} {{\n  chain egress {{\n    type filter hook egress device eth0 priority 0;\n    ip daddr {peer} tcp dport {port} numgen random mod 1000 < {permille} drop\n  }}\n  chain ingress {{\n    type filter hook ingress device eth0 priority 0;\n    ip saddr {peer} tcp sport {port} numgen random mod 1000 < {permille} drop\n    ip saddr {peer} tcp dport {port} numgen random mod 1000 < {permille} drop\n  }}\n}}\n"
        );
        nft(Some(lab.netns(node)), &rules)?;
        Ok(Loss {
            lab,
            node: node.to_string(),
        })
    }

    /// The nftables tables of `node`'s namespace, as `nft list tables` prints them.
    pub fn tables(lab: &Lab, node: &str) -> String {
        let out = lab.exec_in_node(node, &["nft", "list", "tables"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Loss<'_> {
    fn drop(&mut self) {
        let out = self.lab.exec_in_node(
            &self.node,
            &["nft", "delete", "table", "netdev", LOSS_TABLE],
        );
        if !out.status.success() {
            eprintln!(
                "removing the loss table of {}: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// The nftables table that holds a [`Blackhole`]'s rules (in the node's namespace, and in the
/// root namespace with the root-side veth's name after it).
pub const BLACKHOLE_TABLE: &str = "hs_blackhole";

/// Every packet of `node`'s TCP connections to `peer:port` that are open when it is installed
/// dropped silently, each way, as when a connection dies without a FIN or a reset (a NAT entry
/// or a load balancer forgets it); connections opened later pass. Both drops are at an ingress
/// (the node's eth0 for the peer's packets, the node's root-side veth for its own), so that
/// neither end's TCP learns of them (a drop on the way out is reported to the sending socket).
/// Removed on drop.
pub struct Blackhole<'lab> {
    lab: &'lab Lab,
    node: String,
    /// The local ports of the connections it drops.
    pub ports: Vec<u16>,
}

impl<'lab> Blackhole<'lab> {
    /// Installs it; an error if `node` has no such connection open.
    pub fn install(lab: &'lab Lab, node: &str, peer: Ipv4Addr, port: u16) -> Result<Self> {
        let out = lab.exec_in_node(
            node,
            &[
                "ss",
                "-Htn",
                "state",
                "established",
                "dst",
                &format!("{peer}:{port}"),
            ],
        );
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        // "Recv-Q Send-Q Local:Port Peer:Port": the local port ends the third column.
        let ports: Vec<u16> = listing
            .lines()
            .filter_map(|l| {
                l.split_whitespace()
                    .nth(2)?
                    .rsplit(':')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        if ports.is_empty() {
            return Err(Error::Setup(format!(
                "{node} has no connection to {peer}:{port} open: {listing}"
            )));
        }
        let set = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let blackhole = Blackhole {
            lab,
            node: node.to_string(),
            ports,
        };
        let to_node = format!(
            "table netdev {BLACKHOLE_TABLE} {{\n  chain ingress {{\n    type filter hook ingress device eth0 priority 0;\n    ip saddr {peer} tcp sport {port} tcp dport {{ {set} }} drop\n  }}\n}}\n"
        );
        nft(Some(lab.netns(node)), &to_node)?;
        let uplink = lab.uplink_peer(node);
        let from_node = format!(
            "table netdev {BLACKHOLE_TABLE}_{uplink} {{\n  chain ingress {{\n    type filter hook ingress device {uplink} priority 0;\n    ip daddr {peer} tcp dport {port} tcp sport {{ {set} }} drop\n  }}\n}}\n"
        );
        nft(None, &from_node)?;
        Ok(blackhole)
    }
}

/// Runs `nft -f -` on `rules`, in network namespace `netns` (`None`: the root namespace).
fn nft(netns: Option<&str>, rules: &str) -> Result<()> {
    let mut command = match netns {
        Some(netns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", netns, "nft", "-f", "-"]);
            c
        }
        None => {
            let mut c = Command::new("nft");
            c.args(["-f", "-"]);
            c
        }
    };
    let mut child = command
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running nft", e))?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, rules.as_bytes())
            .map_err(|e| Error::io("writing rules to nft", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("waiting for nft", e))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "nft -f: {}: {rules}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

impl Drop for Blackhole<'_> {
    fn drop(&mut self) {
        let uplink = self.lab.uplink_peer(&self.node);
        let outs = [
            self.lab.exec_in_node(
                &self.node,
                &["nft", "delete", "table", "netdev", BLACKHOLE_TABLE],
            ),
            Command::new("nft")
                .args([
                    "delete",
                    "table",
                    "netdev",
                    &format!("{BLACKHOLE_TABLE}_{uplink}"),
                ])
                .output()
                .unwrap_or_else(|e| panic!("running nft: {e}")),
        ];
        for out in outs.iter().filter(|o| !o.status.success()) {
            eprintln!(
                "removing a blackhole table of {}: {}",
                self.node,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Long-running iperf3 flows from clients to one server node, each on a port of its own, at a
/// bounded rate (the lab's machine has few cores); stopped on drop.
pub struct Bulk<'lab> {
    lab: &'lab Lab,
    helpers: Vec<String>,
    /// Each client's eth0 segmentation offloads that were on, turned back on on drop.
    segmenting: Vec<(String, Vec<&'static str>)>,
}

/// The segmentation offloads a [`Bulk`] client turns off, as ethtool names them (`-K`) and
/// prints them (`-k`).
const SEGMENTATION_OFFLOADS: [(&str, &str); 2] = [
    ("tso", "tcp-segmentation-offload: on"),
    ("gso", "generic-segmentation-offload: on"),
];

/// The first iperf3 port; client i uses `BASE_PORT + i`.
pub const BASE_PORT: u16 = 5201;

impl<'lab> Bulk<'lab> {
    /// Starts one iperf3 server per client on `server` and one client per node of `clients`,
    /// each sending at `rate` (iperf3's `-b`, e.g. `20M`) for `seconds`, its segments put on
    /// the veth one by one (TSO and GSO off on its eth0). Client i talks to port
    /// `BASE_PORT + i`.
    pub fn start(
        lab: &'lab Lab,
        server: &str,
        clients: &[&str],
        rate: &str,
        seconds: u32,
    ) -> Result<Self> {
        let mut bulk = Bulk {
            lab,
            helpers: Vec::new(),
            segmenting: Vec::new(),
        };
        for client in clients {
            let shown = lab.exec_in_node(client, &["ethtool", "-k", "eth0"]);
            let shown = String::from_utf8_lossy(&shown.stdout);
            let on: Vec<&str> = SEGMENTATION_OFFLOADS
                .iter()
                .filter(|(_, shown_on)| shown.contains(shown_on))
                .map(|(feature, _)| *feature)
                .collect();
            set_offloads(lab, client, &on, "off")?;
            bulk.segmenting.push((client.to_string(), on));
        }
        let server_ip = lab.node_ip(server).to_string();
        for (i, _) in clients.iter().enumerate() {
            let port = (BASE_PORT + i as u16).to_string();
            let name = format!("iperf3-server-{port}");
            lab.spawn_helper(
                &name,
                &[
                    "ip",
                    "netns",
                    "exec",
                    lab.netns(server),
                    "iperf3",
                    "-s",
                    "-B",
                    &server_ip,
                    "-p",
                    &port,
                ],
            )?;
            bulk.helpers.push(name);
        }
        // The servers listen within a moment; a client that comes too early retries. The
        // shell kills its whole process group (iperf3 included) when the lab stops it.
        for (i, client) in clients.iter().enumerate() {
            let port = (BASE_PORT + i as u16).to_string();
            let name = format!("iperf3-client-{client}");
            let script = format!(
                "trap 'kill 0' TERM; for i in $(seq 50); do iperf3 -c {server_ip} -B {} -p {port} -b {rate} -t {seconds} -i 0 >/dev/null 2>&1 & wait $! && exit 0; sleep 0.2; done; exit 1",
                lab.node_ip(client)
            );
            lab.spawn_helper(
                &name,
                &[
                    "ip",
                    "netns",
                    "exec",
                    lab.netns(client),
                    "sh",
                    "-c",
                    &script,
                ],
            )?;
            bulk.helpers.push(name);
        }
        Ok(bulk)
    }
}

/// Sets `features` (ethtool's names) of `node`'s eth0 to `state` (`on` or `off`).
fn set_offloads(lab: &Lab, node: &str, features: &[&str], state: &str) -> Result<()> {
    if features.is_empty() {
        return Ok(());
    }
    let mut argv = vec!["ethtool", "-K", "eth0"];
    for feature in features {
        argv.extend([*feature, state]);
    }
    let out = lab.exec_in_node(node, &argv);
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "{} on {node}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

impl Drop for Bulk<'_> {
    fn drop(&mut self) {
        for name in self.helpers.iter().rev() {
            if let Some(Err(e)) = self.lab.stop_helper(name) {
                eprintln!("stopping {name}: {e}");
            }
        }
        for (client, features) in &self.segmenting {
            if let Err(e) = set_offloads(self.lab, client, features, "on") {
                eprintln!("{e}");
            }
        }
    }
}
