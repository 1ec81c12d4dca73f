//! The XDP program that feeds the AF_XDP sockets (`bpf/redirect.c`): it redirects the stack's
//! frames — ARP for its address, TCP to its address on a service port or in its ephemeral
//! range — to the socket of the queue they arrived on, and passes everything else to the
//! kernel. Each frame it redirects carries a stamp of the kernel's monotonic clock in its
//! XDP metadata ([`super::rx_stamp`]), from which the socket measures how long frames wait.
//!
//! Loaded with aya and attached through a BPF link that is not pinned: the link lives as
//! long as the [`RedirectProgram`] (and so the process) does, so the kernel detaches the
//! program when the runner exits or is killed.

use super::af_xdp::XdpSocket;
use aya::maps::{Array, HashMap, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

/// The compiled program (see build.rs).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/redirect.o"));
/// The program's function name in the object.
const FUNCTION: &str = "userstack_redirect";

/// Which frames the program hands to the stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedirectRules {
    /// The stack's IPv4 address.
    pub address: Ipv4Addr,
    /// Ports the stack listens on.
    pub ports: Vec<u16>,
    /// The stack's ephemeral port range, inclusive (for connections it opens).
    pub ephemeral_ports: (u16, u16),
}

/// How the program runs on the interface.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AttachMode {
    /// In the driver (native XDP).
    Driver,
    /// In the kernel's generic path (for drivers without native XDP).
    Generic,
}

/// The program, loaded and attached to one interface; dropping it detaches it.
#[derive(Debug)]
pub struct RedirectProgram {
    ebpf: Ebpf,
    mode: AttachMode,
}

fn error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

impl RedirectProgram {
    /// Loads the program with `rules` and attaches it to `interface`, natively where the
    /// driver supports it and in generic mode otherwise. Sockets join with
    /// [`RedirectProgram::add_socket`].
    pub fn attach(interface: &str, rules: &RedirectRules) -> io::Result<RedirectProgram> {
        let mut ebpf = EbpfLoader::new()
            .load(OBJECT)
            .map_err(|e| error("loading the redirect object", e))?;
        {
            let mut settings: Array<_, u32> = ebpf
                .map_mut("settings")
                .ok_or_else(|| io::Error::other("no settings map in the object"))?
                .try_into()
                .map_err(|e| error("the settings map", e))?;
            let values = [
                u32::from_ne_bytes(rules.address.octets()),
                u32::from(rules.ephemeral_ports.0),
                u32::from(rules.ephemeral_ports.1),
            ];
            for (index, value) in values.into_iter().enumerate() {
                settings
                    .set(index as u32, value, 0)
                    .map_err(|e| error("writing the settings map", e))?;
            }
        }
        {
            let mut ports: HashMap<_, u16, u8> = ebpf
                .map_mut("ports")
                .ok_or_else(|| io::Error::other("no ports map in the object"))?
                .try_into()
                .map_err(|e| error("the ports map", e))?;
            for &port in &rules.ports {
                ports
                    .insert(port, 1, 0)
                    .map_err(|e| error("writing the ports map", e))?;
            }
        }
        let program: &mut Xdp = ebpf
            .program_mut(FUNCTION)
            .ok_or_else(|| io::Error::other(format!("no {FUNCTION} in the object")))?
            .try_into()
            .map_err(|e| error("the redirect program", e))?;
        program
            .load()
            .map_err(|e| error("loading the redirect program", e))?;
        let mode = match program.attach(interface, XdpMode::Driver) {
            Ok(_) => AttachMode::Driver,
            Err(native) => match program.attach(interface, XdpMode::Skb) {
                Ok(_) => AttachMode::Generic,
                Err(generic) => {
                    return Err(io::Error::other(format!(
                        "attaching XDP to {interface} failed: native: {native}; generic: \
                         {generic}"
                    )))
                }
            },
        };
        Ok(RedirectProgram { ebpf, mode })
    }

    /// Native or generic.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Sends the frames arriving on queue `queue` to `socket`.
    pub fn add_socket(&mut self, queue: u32, socket: &XdpSocket) -> io::Result<()> {
        let mut sockets: XskMap<_> = self
            .ebpf
            .map_mut("xsks")
            .ok_or_else(|| io::Error::other("no xsks map in the object"))?
            .try_into()
            .map_err(|e| error("the xsks map", e))?;
        sockets
            .set(queue, socket.as_raw_fd(), 0)
            .map_err(|e| error("adding the socket to the xsks map", e))
    }
}
