//! The lab network: a bridge in the root namespace with 198.18.k.1/24 and, per node, a network
//! namespace joined to it by a veth pair (eth0 = 198.18.k.(10+i)/24 inside).
//!
//! Every name carries the lab index k, so labs never share a device, a namespace or a subnet,
//! and a dead lab's leftovers are found by name: bridge `hs<k>br`, root-side veths
//! `hs<k>n<i>`, namespaces `hs<k>-<node>`. The lab also has a loopback address of its own,
//! 127.18.k.1, where it finds free ports for the processes in the root namespace.

use crate::command::{cmd, output, run};
use crate::{Error, Result};
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;

/// Lab indices in use: the lab's subnet is 198.18.k.0/24. The rest of 198.18.0.0/15 is left
/// for later parts of the lab (198.19.255.0/24 is the service range).
pub(crate) const INDICES: std::ops::RangeInclusive<u8> = 1..=127;

pub(crate) fn bridge_name(k: u8) -> String {
    format!("hs{k}br")
}

pub(crate) fn veth_name(k: u8, i: usize) -> String {
    format!("hs{k}n{i}")
}

pub(crate) fn netns_name(k: u8, node: &str) -> String {
    format!("hs{k}-{node}")
}

pub(crate) fn bridge_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, k, 1)
}

/// The lab's own loopback address, 127.18.k.1 (all of 127.0.0.0/8 is loopback on Linux).
pub(crate) fn loopback_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 18, k, 1)
}

pub(crate) fn node_ip(k: u8, i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, k, 10 + u8::try_from(i).expect("at most 240 nodes"))
}

/// A TCP port free on `ip` right now.
pub(crate) fn free_port(ip: Ipv4Addr) -> Result<u16> {
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| Error::io(format!("finding a free port on {ip}"), e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("reading a local address", e))
}

/// Whether anything on this host already uses lab index k: an address in 198.18.k.0/24, a
/// device or a namespace with its prefix.
pub(crate) fn in_use(k: u8) -> Result<bool> {
    let addrs = run(&mut cmd("ip", &["-4", "-o", "addr", "show"]), None)?;
    let prefix = format!(" 198.18.{k}.");
    if addrs.lines().any(|l| l.contains(&prefix)) {
        return Ok(true);
    }
    Ok(!links_of(k)?.is_empty() || !namespaces_of(k)?.is_empty())
}

/// Creates the bridge with 198.18.k.1/24.
pub(crate) fn create_bridge(k: u8) -> Result<()> {
    let br = bridge_name(k);
    let addr = format!("{}/24", bridge_ip(k));
    run(
        &mut cmd("ip", &["link", "add", &br, "type", "bridge"]),
        None,
    )?;
    run(&mut cmd("ip", &["addr", "add", &addr, "dev", &br]), None)?;
    run(&mut cmd("ip", &["link", "set", &br, "up"]), None)?;
    Ok(())
}

/// Creates node i's namespace and veth pair, brings up lo and eth0 = 198.18.k.(10+i)/24.
pub(crate) fn add_node(k: u8, i: usize, node: &str) -> Result<()> {
    let ns = netns_name(k, node);
    let veth = veth_name(k, i);
    let addr = format!("{}/24", node_ip(k, i));
    run(&mut cmd("ip", &["netns", "add", &ns]), None)?;
    // The peer is created inside the namespace, so the root namespace's eth0 is never touched.
    run(
        &mut cmd(
            "ip",
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        ),
        None,
    )?;
    run(
        &mut cmd(
            "ip",
            &["link", "set", &veth, "master", &bridge_name(k), "up"],
        ),
        None,
    )?;
    let batch = format!("addr add {addr} dev eth0\nlink set lo up\nlink set eth0 up\n");
    run(
        &mut cmd("ip", &["-n", &ns, "-batch", "-"]),
        Some(batch.as_bytes()),
    )?;
    Ok(())
}

/// Network namespaces of lab k.
pub(crate) fn namespaces_of(k: u8) -> Result<Vec<String>> {
    let prefix = format!("hs{k}-");
    let list = run(&mut cmd("ip", &["netns", "list"]), None)?;
    Ok(list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect())
}

/// Root-namespace devices of lab k: its bridge and veths.
pub(crate) fn links_of(k: u8) -> Result<Vec<String>> {
    Ok(all_links()?
        .into_iter()
        .filter(|name| lab_index_of_link(name) == Some(k))
        .collect())
}

/// Names of the root namespace's devices.
fn all_links() -> Result<Vec<String>> {
    let list = run(&mut cmd("ip", &["-o", "link", "show"]), None)?;
    // "7: hs3n0@if2: <...>" -> "hs3n0"
    Ok(list
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect())
}

/// The lab index of a device named like ours (`hs<k>br`, `hs<k>n<i>`).
pub(crate) fn lab_index_of_link(name: &str) -> Option<u8> {
    let rest = name.strip_prefix("hs")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let k: u8 = rest[..digits].parse().ok()?;
    let tail = &rest[digits..];
    let ours = tail == "br"
        || tail
            .strip_prefix('n')
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    ours.then_some(k)
}

/// The lab index of a namespace named like ours (`hs<k>-<node>`).
pub(crate) fn lab_index_of_netns(name: &str) -> Option<u8> {
    let (head, node) = name.strip_prefix("hs")?.split_once('-')?;
    if node.is_empty() || head.is_empty() || !head.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    head.parse().ok()
}

/// Lab indices that have devices or namespaces on this host.
pub(crate) fn indices_present() -> Result<Vec<u8>> {
    let list = run(&mut cmd("ip", &["netns", "list"]), None)?;
    let mut found: Vec<u8> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(lab_index_of_netns)
        .chain(all_links()?.iter().filter_map(|l| lab_index_of_link(l)))
        .collect();
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// Deletes every namespace and device of lab k. Deleting a namespace deletes its veth end, and
/// with it the root-side peer; what remains is deleted by name. Returns the failures.
pub(crate) fn remove(k: u8) -> Vec<String> {
    let mut errors = Vec::new();
    match namespaces_of(k) {
        Ok(list) => {
            for ns in list {
                if let Err(e) = run(&mut cmd("ip", &["netns", "delete", &ns]), None) {
                    errors.push(e.to_string());
                }
            }
        }
        Err(e) => errors.push(e.to_string()),
    }
    match links_of(k) {
        Ok(list) => {
            errors.extend(list.iter().filter_map(|link| delete_link(link)));
        }
        Err(e) => errors.push(e.to_string()),
    }
    errors
}

/// Deletes a device of the host's namespace; the failure, if it is still there.
///
/// A veth whose peer was a deleted namespace's eth0 goes when the kernel dismantles that
/// namespace, which it does later, on a workqueue: before the listing, between the listing and
/// the delete ("RTNETLINK answers: No such device", seen on a busy host), or after it. Gone is
/// what was wanted, however it went.
fn delete_link(link: &str) -> Option<String> {
    let out = output(&mut cmd("ip", &["link", "delete", link]), None).ok()?;
    let still_there = Path::new("/sys/class/net").join(link).exists();
    (!out.status.success() && still_there).then(|| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        format!("ip link delete {link}: {}", stderr.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_is_gone_already_is_deleted() {
        assert_eq!(delete_link("hs249n9"), None);
    }

    #[test]
    fn names_round_trip_to_the_lab_index() {
        assert_eq!(lab_index_of_link(&bridge_name(7)), Some(7));
        assert_eq!(lab_index_of_link(&veth_name(12, 3)), Some(12));
        assert_eq!(lab_index_of_netns(&netns_name(1, "node-a")), Some(1));
        for other in [
            "eth0", "hsbr", "hs1x", "hs1n", "hs1nx", "hs300br", "docker0",
        ] {
            assert_eq!(lab_index_of_link(other), None, "{other}");
        }
        for other in ["hs1", "hs-a", "hsx-a", "hs1-", "other"] {
            assert_eq!(lab_index_of_netns(other), None, "{other}");
        }
    }

    #[test]
    fn addresses_stay_in_the_benchmarking_range() {
        for k in INDICES {
            assert_eq!(bridge_ip(k).octets()[..2], [198, 18]);
            assert_eq!(node_ip(k, 0).octets(), [198, 18, k, 10]);
        }
    }
}
