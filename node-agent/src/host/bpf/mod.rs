//! The bpf port: hoststack's built-in XDP programs (`blocklist`, `pass`) on an interface's XDP
//! hook, attached through a pinned BPF link, and the blocklist's prefixes in pinned LPM-trie
//! maps. [`objects`] does it with aya, [`rtnetlink`] asks the kernel what is attached.
//!
//! Pins live under the bpffs root (`--bpffs-root`, default
//! [`crate::paths::DEFAULT_BPFFS_ROOT`]), one directory per interface ([`Pins`]). Pinned links
//! keep the programs attached when the agent exits, so a restarted agent finds them.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hoststack_crds::XdpProgram;

use super::RealKernel;
use crate::sysfs::{dir_names, plain_name};

pub mod objects;
pub mod rtnetlink;

/// The calls of the XDP appliers on an interface's hook and on hoststack's pins for it.
pub trait Bpf: fmt::Debug + Send + Sync {
    /// What is attached to `iface`'s XDP hook (nothing when the interface is gone), and what
    /// hoststack pinned for it in `pins`.
    fn query_hook(&self, iface: &str, pins: &Pins) -> io::Result<XdpState>;
    /// Loads a built-in program, attaches it to `iface` in `mode` through a BPF link, and pins
    /// link and program in `pins` (the blocklist program uses the maps pinned there, creating
    /// and pinning missing ones empty).
    fn attach(
        &self,
        iface: &str,
        pins: &Pins,
        program: Program,
        mode: AttachMode,
    ) -> io::Result<()>;
    /// Replaces hoststack's program attached through the link pinned in `pins` by `program`,
    /// atomically (`bpf_link_update`), and pins it in place of the old one.
    fn replace(&self, pins: &Pins, program: Program) -> io::Result<()>;
    /// Unpins the program and link of `pins`, which detaches the program.
    fn detach(&self, pins: &Pins) -> io::Result<()>;
    /// What the blocklist maps pinned in `pins` hold.
    fn blocklist(&self, pins: &Pins) -> io::Result<Blocklist>;
    /// Creates and pins the blocklist maps in `pins` if needed, and makes them hold exactly
    /// `prefixes`.
    fn set_blocklist(&self, pins: &Pins, prefixes: &[Prefix]) -> io::Result<()>;
    /// Unpins the blocklist maps of `pins`.
    fn unpin_blocklist(&self, pins: &Pins) -> io::Result<()>;
}

impl Bpf for RealKernel {
    fn query_hook(&self, iface: &str, pins: &Pins) -> io::Result<XdpState> {
        objects::query(iface, pins)
    }

    fn attach(
        &self,
        iface: &str,
        pins: &Pins,
        program: Program,
        mode: AttachMode,
    ) -> io::Result<()> {
        objects::attach(iface, pins, program, mode)
    }

    fn replace(&self, pins: &Pins, program: Program) -> io::Result<()> {
        objects::replace(pins, program)
    }

    fn detach(&self, pins: &Pins) -> io::Result<()> {
        objects::detach(pins)
    }

    fn blocklist(&self, pins: &Pins) -> io::Result<Blocklist> {
        objects::blocklist(pins)
    }

    fn set_blocklist(&self, pins: &Pins, prefixes: &[Prefix]) -> io::Result<()> {
        objects::set_blocklist(pins, prefixes)
    }

    fn unpin_blocklist(&self, pins: &Pins) -> io::Result<()> {
        objects::unpin_blocklist(pins)
    }
}

/// The most prefixes one interface's blocklist holds (per address family: the maps' size).
pub const MAX_PREFIXES: usize = 4096;

/// The `blocklist` program's object file, compiled from `bpf/blocklist.c` by build.rs.
const BLOCKLIST_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/blocklist.o"));

/// The `pass` program's object file, compiled from `bpf/pass.c` by build.rs.
const PASS_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/pass.o"));

/// A built-in XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Program {
    /// Drops packets from blocked source prefixes and counts the drops.
    Blocklist,
    /// Passes every packet.
    Pass,
}

impl Program {
    /// Every built-in program.
    pub const ALL: [Program; 2] = [Program::Blocklist, Program::Pass];

    /// Its name in setting values.
    pub fn name(self) -> &'static str {
        match self {
            Program::Blocklist => "blocklist",
            Program::Pass => "pass",
        }
    }

    /// The name of its function in the object, which the kernel reports as the program's name.
    pub fn function(self) -> &'static str {
        match self {
            Program::Blocklist => "hs_blocklist",
            Program::Pass => "hs_pass",
        }
    }

    /// Its compiled object.
    pub fn object(self) -> &'static [u8] {
        match self {
            Program::Blocklist => BLOCKLIST_OBJECT,
            Program::Pass => PASS_OBJECT,
        }
    }

    /// The built-in program whose function the kernel names `function`.
    pub fn from_function(function: &str) -> Option<Program> {
        Program::ALL.into_iter().find(|p| p.function() == function)
    }

    /// The program a spec asks for.
    pub fn from_spec(program: XdpProgram) -> Program {
        match program {
            XdpProgram::Blocklist => Program::Blocklist,
            XdpProgram::Pass => Program::Pass,
        }
    }
}

/// How a program runs on an interface, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttachMode {
    /// In the driver (XDP_FLAGS_DRV_MODE).
    Native,
    /// In the kernel's generic receive path (XDP_FLAGS_SKB_MODE).
    Generic,
    /// On the NIC itself (XDP_FLAGS_HW_MODE); hoststack never attaches so.
    Offload,
}

impl AttachMode {
    /// Its name in setting values and messages.
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Offload => "offload",
        }
    }
}

/// A source prefix of the blocklist, with its host bits clear.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

impl Prefix {
    /// The prefix `addr/len`; `None` when `len` is too long for the family or host bits are
    /// set.
    pub fn new(addr: IpAddr, len: u8) -> Option<Prefix> {
        let prefix = Prefix { addr, len };
        (len <= prefix.max_len() && prefix.masked() == addr).then_some(prefix)
    }

    /// Its address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    fn max_len(&self) -> u8 {
        match self.addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// The address with the bits beyond the length cleared.
    fn masked(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        }
    }

    /// The key of this prefix in the blocklist's LPM trie of its family: the prefix length
    /// and the address bytes in network order.
    pub fn lpm_key(&self) -> LpmKey {
        match self.addr {
            IpAddr::V4(a) => LpmKey::V4(u32::from(self.len), a.octets()),
            IpAddr::V6(a) => LpmKey::V6(u32::from(self.len), a.octets()),
        }
    }

    /// The prefix of an LPM-trie key; `None` when the length is too long or host bits are set.
    pub fn from_lpm_key(key: LpmKey) -> Option<Prefix> {
        let (addr, len) = match key {
            LpmKey::V4(len, bytes) => (IpAddr::V4(Ipv4Addr::from(bytes)), len),
            LpmKey::V6(len, bytes) => (IpAddr::V6(Ipv6Addr::from(bytes)), len),
        };
        Prefix::new(addr, u8::try_from(len).ok()?)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = String;

    /// `ADDR/LEN` or a bare address (a host prefix); host bits must be clear. Parsed as the
    /// firewall parses its blocked prefixes, so both refuse the same input in the same words.
    fn from_str(text: &str) -> Result<Self, String> {
        let parsed = crate::host::nftables::ruleset::Prefix::parse(text.trim())?;
        let len = u8::try_from(parsed.len).expect("a prefix length is at most 128");
        Ok(Prefix {
            addr: parsed.family.addr(parsed.start),
            len,
        })
    }
}

/// A key of a blocklist LPM trie: prefix length, then the address in network byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LpmKey {
    /// A key of `blocklist_v4`.
    V4(u32, [u8; 4]),
    /// A key of `blocklist_v6`.
    V6(u32, [u8; 16]),
}

/// What hoststack's blocklist maps for an interface hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocklist {
    /// No map is pinned.
    Unpinned,
    /// Some maps are pinned, not all (an interrupted write); only read, never written.
    Incomplete,
    /// Every map is pinned; the maps hold these prefixes, sorted.
    Pinned(Vec<Prefix>),
}

impl fmt::Display for Blocklist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocklist::Unpinned => f.write_str("none"),
            Blocklist::Incomplete => f.write_str("incomplete"),
            Blocklist::Pinned(list) if list.is_empty() => f.write_str("empty"),
            Blocklist::Pinned(list) => {
                for (i, p) in list.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{p}")?;
                }
                Ok(())
            }
        }
    }
}

impl FromStr for Blocklist {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "none" => Ok(Blocklist::Unpinned),
            "incomplete" => Ok(Blocklist::Incomplete),
            "empty" => Ok(Blocklist::Pinned(Vec::new())),
            list => Ok(Blocklist::Pinned(parse_prefixes(list.split(','))?)),
        }
    }
}

/// Parses prefixes into a sorted list without duplicates; every bad one is named in the error.
pub fn parse_prefixes<'a>(texts: impl IntoIterator<Item = &'a str>) -> Result<Vec<Prefix>, String> {
    let mut prefixes = BTreeSet::new();
    let mut errors = Vec::new();
    for text in texts {
        match text.parse::<Prefix>() {
            Ok(p) => {
                prefixes.insert(p);
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(prefixes.into_iter().collect())
    } else {
        Err(errors.join("; "))
    }
}

/// Where hoststack pins one interface's XDP objects: `<bpffs-root>/<IF>/`, holding `link`
/// (the BPF link that keeps the program attached), `program`, and for the blocklist the maps
/// `blocklist_v4`, `blocklist_v6` and `drops`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pins {
    root: PathBuf,
    dir: PathBuf,
}

impl Pins {
    /// The names of the blocklist program's maps, as pinned.
    pub const MAPS: [&'static str; 3] = ["blocklist_v4", "blocklist_v6", "drops"];

    /// The pins of interface `iface` under `root`.
    pub fn new(root: &Path, iface: &str) -> Self {
        Pins {
            root: root.to_path_buf(),
            dir: root.join(iface),
        }
    }

    /// The bpffs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The interface's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pinned link.
    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    /// The pinned program.
    pub fn program(&self) -> PathBuf {
        self.dir.join("program")
    }

    /// A pinned map, by name (one of [`Pins::MAPS`]).
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// One program attached to an interface, as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedProgram {
    /// The kernel's program id.
    pub id: u32,
    /// The program's name (its function name, at most 15 bytes).
    pub name: String,
    /// How it runs.
    pub mode: AttachMode,
}

/// What the kernel says about an interface's XDP hook and hoststack's pins for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XdpState {
    /// The interface does not exist (any more); its pins may still be there.
    pub interface_gone: bool,
    /// The programs attached (more than one only with different modes).
    pub attached: Vec<AttachedProgram>,
    /// The program id behind hoststack's pinned link, when the link pin exists.
    pub link_program: Option<u32>,
    /// Whether hoststack's program pin exists.
    pub program_pinned: bool,
}

/// The interfaces with a pinned `drops` map under `root`, sorted.
pub fn counted_interfaces(root: &Path) -> Vec<String> {
    dir_names(root)
        .into_iter()
        .filter(|i| plain_name(i) && Pins::new(root, i).map("drops").exists())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_to_lpm_keys() {
        let table: &[(&str, Result<LpmKey, &str>)] = &[
            ("198.19.30.10/32", Ok(LpmKey::V4(32, [198, 19, 30, 10]))),
            ("198.19.30.10", Ok(LpmKey::V4(32, [198, 19, 30, 10]))),
            ("10.0.0.0/8", Ok(LpmKey::V4(8, [10, 0, 0, 0]))),
            ("0.0.0.0/0", Ok(LpmKey::V4(0, [0; 4]))),
            (
                "2001:db8::/32",
                Ok(LpmKey::V6(
                    32,
                    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                )),
            ),
            ("10.0.0.1/8", Err("host bits set; did you mean 10.0.0.0/8?")),
            ("10.0.0.0/33", Err("prefix length must be 0 to 32")),
            ("2001:db8::/129", Err("0 to 128")),
            ("10.0.0.0/x", Err("0 to 32")),
            ("eth0", Err("not an IPv4 or IPv6 prefix")),
            ("", Err("not an IPv4 or IPv6 prefix")),
        ];
        for (text, want) in table {
            match (text.parse::<Prefix>(), want) {
                (Ok(p), Ok(key)) => {
                    assert_eq!(p.lpm_key(), *key, "{text}");
                    assert_eq!(Prefix::from_lpm_key(*key), Some(p), "{text}");
                }
                (Err(e), Err(part)) => assert!(e.contains(part), "{text}: {e}"),
                (got, _) => panic!("{text}: {got:?}"),
            }
        }
        assert_eq!(Prefix::from_lpm_key(LpmKey::V4(33, [0; 4])), None);
        assert_eq!(Prefix::from_lpm_key(LpmKey::V4(8, [10, 0, 0, 1])), None);
    }
}
