//! The XDP program that feeds the AF_XDP sockets (`bpf/redirect.c`): it redirects the stack's
//! frames — ARP for its address, TCP to its address on a service port or in its ephemeral
//! range — to the socket of the queue they arrived on, and passes everything else to the
//! kernel. Each frame it redirects carries a stamp of the kernel's monotonic clock in its
//! XDP metadata ([`super::rx_stamp`]), from which the socket measures how long frames wait.
//!
//! The stamp is a measurement aid, never a reason not to serve: it needs the helper
//! `bpf_xdp_adjust_meta`, which some kernels' verifiers refuse to XDP programs ("program of
//! this type cannot use helper bpf_xdp_adjust_meta#54", seen on a 6.18 build). build.rs
//! compiles the program twice ([`Build`]); the stamped build is tried first, and when the
//! verifier refuses it that helper ([`stamp_helper_refused`]) the unstamped build runs
//! instead and the program says why ([`RedirectProgram::rx_stamps`]). Any other failure to
//! load stays an error. The kernel's verifier is asked rather than probed ahead: it is the
//! judge of this very program.
//!
//! Loaded with aya and attached through a BPF link that is not pinned: the link lives as
//! long as the [`RedirectProgram`] (and so the process) does, so the kernel detaches the
//! program when the runner exits or is killed.

use super::af_xdp::XdpSocket;
use aya::maps::{Array, HashMap, XskMap};
use aya::programs::{ProgramError, Xdp, XdpMode};
use aya::sys::BpfHelper;
use aya::{Ebpf, EbpfLoader};
use hoststack_runner_api::RxStamps;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;

/// The program's function name in the object.
const FUNCTION: &str = "userstack_redirect";
/// The helper only the stamped build calls.
const STAMP_HELPER: BpfHelper = BpfHelper::BPF_FUNC_xdp_adjust_meta;
/// How a verifier refuses a helper, by kernel release (the diagnostics libbpf's helper probe
/// looks for): each is followed by the helper's name (or `unknown`), `#` and its number.
const HELPER_REFUSALS: [&str; 3] = [
    "program of this type cannot use helper ",
    "unknown func ",
    "invalid func ",
];

/// The program's builds, compiled from `bpf/redirect.c` by build.rs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// Stamps every frame it redirects (calls `bpf_xdp_adjust_meta`).
    Stamped,
    /// Stamps nothing (`-DNO_RX_STAMPS`): for kernels that refuse the helper to XDP.
    Unstamped,
}

impl Build {
    /// The compiled object.
    fn object(self) -> &'static [u8] {
        match self {
            Build::Stamped => include_bytes!(concat!(env!("OUT_DIR"), "/redirect.o")),
            Build::Unstamped => {
                include_bytes!(concat!(env!("OUT_DIR"), "/redirect-unstamped.o"))
            }
        }
    }
}

/// Why the stamped build cannot run, when the verifier refused it the stamping helper (the
/// unstamped build runs instead); `None` for any other failure, which stays an error.
pub fn stamp_helper_refused(error: &ProgramError) -> Option<String> {
    let ProgramError::LoadError { verifier_log, .. } = error else {
        return None;
    };
    let number = format!("#{}", STAMP_HELPER as u32);
    verifier_log
        .to_string()
        .lines()
        .map(str::trim)
        .find(|line| {
            HELPER_REFUSALS.iter().any(|refusal| {
                line.split_once(refusal)
                    .is_some_and(|(_, helper)| helper.ends_with(&number))
            })
        })
        .map(|line| {
            format!("the kernel refuses bpf_xdp_adjust_meta to XDP programs (verifier: {line})")
        })
}

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
    rx_stamps: RxStamps,
}

fn error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// `build`'s object with its maps created and filled with `rules`, its program not loaded.
fn open(build: Build, rules: &RedirectRules) -> io::Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .load(build.object())
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
    Ok(ebpf)
}

/// The object's program.
fn program(ebpf: &mut Ebpf) -> io::Result<&mut Xdp> {
    ebpf.program_mut(FUNCTION)
        .ok_or_else(|| io::Error::other(format!("no {FUNCTION} in the object")))?
        .try_into()
        .map_err(|e| error("the redirect program", e))
}

impl RedirectProgram {
    /// Loads the program with `rules` and attaches it to `interface`, natively where the
    /// driver supports it and in generic mode otherwise: the stamped build, or the unstamped
    /// one where the kernel refuses the stamping helper ([`RedirectProgram::rx_stamps`]
    /// says which). Sockets join with [`RedirectProgram::add_socket`].
    pub fn attach(interface: &str, rules: &RedirectRules) -> io::Result<RedirectProgram> {
        RedirectProgram::attach_with(interface, rules, |program, _| program.load())
    }

    /// [`RedirectProgram::attach`] with `load` handing each build's program to the kernel's
    /// verifier: the port through which a test plays a kernel that refuses the stamped build.
    pub fn attach_with(
        interface: &str,
        rules: &RedirectRules,
        mut load: impl FnMut(&mut Xdp, Build) -> Result<(), ProgramError>,
    ) -> io::Result<RedirectProgram> {
        let mut ebpf = open(Build::Stamped, rules)?;
        let rx_stamps = match load(program(&mut ebpf)?, Build::Stamped) {
            Ok(()) => RxStamps::Enabled,
            Err(refused) => {
                let reason = stamp_helper_refused(&refused)
                    .ok_or_else(|| error("loading the redirect program", &refused))?;
                ebpf = open(Build::Unstamped, rules)?;
                load(program(&mut ebpf)?, Build::Unstamped)
                    .map_err(|e| error("loading the redirect program without stamps", e))?;
                RxStamps::Unavailable { reason }
            }
        };
        let program = program(&mut ebpf)?;
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
        Ok(RedirectProgram {
            ebpf,
            mode,
            rx_stamps,
        })
    }

    /// Whether the program stamps the frames it redirects, and why not.
    pub fn rx_stamps(&self) -> &RxStamps {
        &self.rx_stamps
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

#[cfg(test)]
mod tests {
    use super::*;
    use aya_obj::VerifierLog;

    fn refused(log: &str) -> ProgramError {
        ProgramError::LoadError {
            io_error: io::Error::from_raw_os_error(libc::EINVAL),
            verifier_log: VerifierLog::new(log.into()),
        }
    }

    #[test]
    fn only_a_refusal_of_the_stamping_helper_falls_back_to_the_unstamped_build() {
        // As kernels word the refusal of helper 54 (6.18's, and older releases'): the
        // unstamped build runs, and the reason quotes the verifier.
        for line in [
            "program of this type cannot use helper bpf_xdp_adjust_meta#54",
            "unknown func bpf_xdp_adjust_meta#54",
            "invalid func unknown#54",
        ] {
            let log = format!(
                "0: R1=ctx() R10=fp0\n; int userstack_redirect(...)\n{line}\nprocessed 52 insns\n"
            );
            let reason = stamp_helper_refused(&refused(&log));
            assert_eq!(
                reason,
                Some(format!(
                    "the kernel refuses bpf_xdp_adjust_meta to XDP programs (verifier: {line})"
                )),
                "{log}"
            );
        }
        // Anything else stays an error: another helper refused, a verifier error of the
        // program's own, a load that failed before the verifier.
        for other in [
            refused("program of this type cannot use helper bpf_ktime_get_ns#5"),
            refused("unknown func bpf_redirect_map#51"),
            refused("invalid func unknown#540"),
            refused("R1 invalid mem access 'scalar'\nprocessed 12 insns"),
            refused(""),
            ProgramError::NotLoaded,
        ] {
            assert_eq!(stamp_helper_refused(&other), None, "{other}");
        }
    }
}
