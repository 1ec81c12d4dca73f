//! Two client namespaces, one to be blocked and one allowed, that reach a lab node through a
//! bridge of their own and an extra veth on the node (never its management interface eth0),
//! plus a TCP service on the node and the probes the filtering tests use (ping, connect, a
//! bounded connect flood).
//!
//! The namespaces are named `hs<k>-<tag>-*`, so the lab's teardown (and its sweep of stale
//! labs) deletes them with the node namespaces even when a test dies; dropping [`Clients`]
//! deletes them at once.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{command, Error, Lab, Result};

/// The test's namespaces: a switch and the two clients, on `<subnet>.0/24`: the node's extra
/// interface is `.1`, the blocked client `.10`, the allowed one `.20`.
pub struct Clients {
    /// The namespace holding the bridge.
    pub switch: String,
    /// The client a tuning blocks.
    pub blocked: String,
    /// The client a tuning allows.
    pub allowed: String,
    /// The node's address on the extra interface.
    pub node_ip: Ipv4Addr,
}

impl Clients {
    /// Builds switch and clients and links the switch to a new veth `iface` in `node`'s
    /// namespace. `subnet` is the first three octets (inside 198.18.0.0/15).
    pub fn build(lab: &Lab, node: &str, iface: &str, tag: &str, subnet: [u8; 3]) -> Result<Self> {
        let k = lab.index();
        let [a, b, c] = subnet;
        let clients = Clients {
            switch: format!("hs{k}-{tag}-sw"),
            blocked: format!("hs{k}-{tag}-a"),
            allowed: format!("hs{k}-{tag}-b"),
            node_ip: Ipv4Addr::new(a, b, c, 1),
        };
        let node_ns = lab.netns(node);
        let (sw, blocked, allowed) = (&clients.switch, &clients.blocked, &clients.allowed);
        for ns in [sw, blocked, allowed] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&[
            "-n", node_ns, "link", "add", iface, "type", "veth", "peer", "name", "up0", "netns", sw,
        ])?;
        ip(&["-n", sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", sw, "link", "set", "up0", "master", "br0", "up"])?;
        ip(&["-n", sw, "link", "set", "br0", "up"])?;
        for (ns, port, host) in [(blocked, "pa", 10), (allowed, "pb", 20)] {
            ip(&[
                "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns,
            ])?;
            ip(&["-n", sw, "link", "set", port, "master", "br0", "up"])?;
            let addr = format!("{a}.{b}.{c}.{host}/24");
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        let node_addr = format!("{}/24", clients.node_ip);
        ip(&["-n", node_ns, "addr", "add", &node_addr, "dev", iface])?;
        ip(&["-n", node_ns, "link", "set", iface, "up"])?;
        Ok(clients)
    }

    /// The address of a client (`.10` blocked, `.20` allowed).
    pub fn ip_of(&self, ns: &str) -> Ipv4Addr {
        let [a, b, c, _] = self.node_ip.octets();
        Ipv4Addr::new(a, b, c, if ns == self.blocked { 10 } else { 20 })
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        // Deleting the switch deletes both ends of every veth, the node's extra one included.
        for ns in [&self.switch, &self.blocked, &self.allowed] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Runs `ip` with `args`.
fn ip(args: &[&str]) -> Result<()> {
    let mut ip = Command::new("ip");
    ip.args(args);
    command::run(&mut ip, None).map(|_| ())
}

/// Moves the calling thread into the named network namespace.
pub fn enter(ns: &str) -> Result<()> {
    let path = PathBuf::from("/run/netns").join(ns);
    let file = std::fs::File::open(&path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    // SAFETY: setns on a namespace fd; it moves only the calling thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io(
            format!("setns {ns}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// A TCP listener in a namespace, accepting until dropped.
pub struct Service {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Listens on `ip` (any port) inside namespace `ns`.
    pub fn start(ns: &str, ip: Ipv4Addr) -> Result<Service> {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let ns = ns.to_string();
        let thread = std::thread::spawn(move || {
            let listener = enter(&ns).and_then(|()| {
                let l = TcpListener::bind((ip, 0))
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| Error::io(format!("listening on {ip}"), e))?;
                let addr = l
                    .local_addr()
                    .map_err(|e| Error::io("the listener's address", e))?;
                Ok((l, addr))
            });
            let listener = match listener {
                Ok((l, addr)) => {
                    let _ = tx.send(Ok(addr));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            while !stopping.load(Ordering::SeqCst) {
                if listener.accept().is_err() {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        let addr = rx
            .recv()
            .map_err(|_| Error::Setup("the listener thread died".into()))??;
        Ok(Service {
            addr,
            stop,
            thread: Some(thread),
        })
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

/// Whether one ping from namespace `ns` to `ip` gets an answer within a second.
pub fn ping_from(ns: &str, ip: Ipv4Addr) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ping", "-c", "1", "-W", "1", "-q"])
        .arg(ip.to_string())
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether a TCP connect from namespace `ns` to `addr` completes within two seconds.
pub fn connect_from(ns: &str, addr: SocketAddr) -> bool {
    flood_from(ns, addr, 1, Duration::from_secs(2)).0 == 1
}

/// A TCP connection from namespace `ns` to `addr`, held open until dropped; `None` when it
/// does not complete within two seconds.
pub fn hold_from(ns: &str, addr: SocketAddr) -> Option<TcpStream> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns).ok()?;
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()
    })
    .join()
    .ok()
    .flatten()
}

/// `count` connects from namespace `ns` to `addr`, one after the other, each given `wait`: how
/// many completed, and how long the whole flood took.
pub fn flood_from(ns: &str, addr: SocketAddr, count: u64, wait: Duration) -> (u64, Duration) {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        if enter(&ns).is_err() {
            return (0, Duration::ZERO);
        }
        let start = Instant::now();
        let connected = (0..count)
            .filter(|_| TcpStream::connect_timeout(&addr, wait).is_ok())
            .count() as u64;
        (connected, start.elapsed())
    })
    .join()
    .unwrap_or((0, Duration::ZERO))
}
