//! The XDP applier: hoststack's built-in XDP programs (`blocklist`, `pass`), attached to an
//! interface with a pinned BPF link, and the blocklist's prefixes, kept in pinned LPM-trie maps.
//!
//! Two kinds of setting per interface `IF`:
//! - [`Kind::XdpBlocklist`] `IF`: the prefixes in the blocklist maps, sorted and comma-separated
//!   (`198.19.30.10/32,2001:db8::/32`), `empty` for pinned maps without a prefix, `none` when
//!   hoststack has no maps pinned for `IF`. Writing it creates and pins the maps if needed and
//!   inserts and removes keys until the maps hold exactly the list, so that the program sees the
//!   new list without being detached; `none` unpins the maps.
//! - [`Kind::XdpProgram`] `IF`: `none`, or `PROGRAM/MODE` (`blocklist/native`, `pass/generic`),
//!   read from the kernel (netlink `IFLA_XDP`: the attached program's id and mode) and matched
//!   against hoststack's pinned link. A desired value may say `auto` for the mode: it matches
//!   either mode, and writing it tries native first, then generic; the value read back says
//!   which one was used. Writing another program in the same mode replaces hoststack's program
//!   atomically through its link (`bpf_link_update`); otherwise writing detaches hoststack's own
//!   program first (if any), then loads the built-in program (the blocklist one reusing the
//!   pinned maps), attaches it through a BPF link and pins link and program. A program that hoststack did not attach is never replaced or
//!   detached: reading such an interface fails with a message naming it.
//!
//! The blocklist comes before the program in the apply order, so a blocklist program is
//! attached with its full list in place; a revert detaches the program before unpinning the
//! maps.
//!
//! Pins live under the bpffs root (`--bpffs-root`, default [`crate::paths::DEFAULT_BPFFS_ROOT`]), one
//! directory per interface ([`Pins`]). Pinned links keep the programs attached when the agent
//! exits, so a restarted agent reads the same values back and changes nothing.
//!
//! The pure part ([`desired`], [`program_value`], the value and prefix parsers, [`attach_order`])
//! decides; everything that touches the kernel goes through [`Kernel`], whose real
//! implementation is [`real`] (aya for programs, maps and links; rtnetlink for the query).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use hoststack_crds::{InterfaceFacts, Xdp, XdpMode, XdpProgram};

use super::{Applier, Host, Kernel};
use crate::model::{invalid, same_value, Kind, Reading, Setting, Wants};
use crate::sysfs::{dir_names, plain_name};

/// The applier of [`Kind::XdpBlocklist`]: lists compare as sets of prefixes.
#[derive(Clone, Copy, Debug)]
pub struct Blocklists;

impl Applier for Blocklists {
    fn read(&self, host: &Host, iface: &str) -> Reading {
        read_blocklist(host.kernel(), host.bpffs_root(), iface)
    }

    fn write(&self, host: &Host, iface: &str, value: &str) -> io::Result<()> {
        write_blocklist(host.kernel(), host.bpffs_root(), iface, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_blocklist(a, b)
    }
}

/// The applier of [`Kind::XdpProgram`]: `auto` matches either mode.
#[derive(Clone, Copy, Debug)]
pub struct Programs;

impl Applier for Programs {
    fn read(&self, host: &Host, iface: &str) -> Reading {
        read_program(host.kernel(), host.bpffs_root(), iface)
    }

    fn write(&self, host: &Host, iface: &str, value: &str) -> io::Result<()> {
        write_program(host.kernel(), host.bpffs_root(), iface, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_program(a, b)
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

/// The mode a setting value asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Native, falling back to generic.
    Auto,
    /// Exactly this mode.
    Exactly(AttachMode),
}

impl Mode {
    /// The mode a spec asks for.
    pub fn from_spec(mode: XdpMode) -> Mode {
        match mode {
            XdpMode::Auto => Mode::Auto,
            XdpMode::Native => Mode::Exactly(AttachMode::Native),
            XdpMode::Generic => Mode::Exactly(AttachMode::Generic),
        }
    }

    /// Its name in setting values.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Exactly(m) => m.name(),
        }
    }

    /// Whether a program running in `mode` satisfies this one.
    pub fn admits(self, mode: Mode) -> bool {
        self == mode || self == Mode::Auto || mode == Mode::Auto
    }
}

/// The modes to try, in order, when attaching in `mode`: `auto` tries native, then generic.
pub fn attach_order(mode: Mode) -> &'static [AttachMode] {
    match mode {
        Mode::Auto => &[AttachMode::Native, AttachMode::Generic],
        Mode::Exactly(AttachMode::Native) => &[AttachMode::Native],
        Mode::Exactly(AttachMode::Generic) => &[AttachMode::Generic],
        Mode::Exactly(AttachMode::Offload) => &[AttachMode::Offload],
    }
}

/// The value of a [`Kind::XdpProgram`] setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramValue {
    /// No XDP program, and no pin of hoststack's, on the interface.
    None,
    /// No program attached, but hoststack's pins for the interface are left (an interrupted
    /// attach or detach); only read, never written: writing any value removes them.
    LeftoverPins,
    /// A built-in program attached by hoststack.
    Attached {
        /// Which one.
        program: Program,
        /// In which mode (`auto` only in desired values).
        mode: Mode,
    },
}

impl ProgramValue {
    /// Whether two values are the same setting: equal, with `auto` matching either mode.
    pub fn same(self, other: ProgramValue) -> bool {
        match (self, other) {
            (
                ProgramValue::Attached { program, mode },
                ProgramValue::Attached {
                    program: p,
                    mode: m,
                },
            ) => program == p && mode.admits(m),
            (a, b) => a == b,
        }
    }
}

impl fmt::Display for ProgramValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramValue::None => f.write_str("none"),
            ProgramValue::LeftoverPins => f.write_str("leftover-pins"),
            ProgramValue::Attached { program, mode } => {
                write!(f, "{}/{}", program.name(), mode.name())
            }
        }
    }
}

impl FromStr for ProgramValue {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text {
            "none" => return Ok(ProgramValue::None),
            "leftover-pins" => return Ok(ProgramValue::LeftoverPins),
            _ => {}
        }
        let bad = || format!("{text:?} is not none or PROGRAM/MODE (e.g. blocklist/native)");
        let (program, mode) = text.split_once('/').ok_or_else(bad)?;
        let program = Program::ALL
            .into_iter()
            .find(|p| p.name() == program)
            .ok_or_else(bad)?;
        let mode = match mode {
            "auto" => Mode::Auto,
            "native" => Mode::Exactly(AttachMode::Native),
            "generic" => Mode::Exactly(AttachMode::Generic),
            _ => return Err(bad()),
        };
        Ok(ProgramValue::Attached { program, mode })
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
        let parsed = super::firewall::ruleset::Prefix::parse(text.trim())?;
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

/// Whether two [`Kind::XdpProgram`] values are the same setting.
pub fn same_program(a: &str, b: &str) -> bool {
    match (a.parse::<ProgramValue>(), b.parse::<ProgramValue>()) {
        (Ok(x), Ok(y)) => x.same(y),
        _ => same_value(a, b),
    }
}

/// Whether two [`Kind::XdpBlocklist`] values are the same setting (the same set of prefixes).
pub fn same_blocklist(a: &str, b: &str) -> bool {
    match (a.parse::<Blocklist>(), b.parse::<Blocklist>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => same_value(a, b),
    }
}

/// The pure plan step of `xdp` for one interface: the blocklist (for the `blocklist` program)
/// and the program. Refused: bad prefixes, more than [`MAX_PREFIXES`] of a family, prefixes
/// for the `pass` program, and the `blocklist` program on a management interface (one of
/// `management`, with the reason) unless `allowManagementInterface` is set.
pub fn desired(
    field: &str,
    iface: &InterfaceFacts,
    xdp: &Xdp,
    management: &BTreeMap<String, String>,
) -> Wants {
    let mut wants = Wants::default();
    let name = &iface.name;
    let program = Program::from_spec(xdp.program);
    let kind = Kind::XdpProgram.as_str();
    if !plain_name(name) {
        wants.refuse(
            kind,
            name,
            format!("{field}: {name:?} is not a plain interface name"),
        );
        return wants;
    }
    let value = ProgramValue::Attached {
        program,
        mode: Mode::from_spec(xdp.mode),
    };
    match program {
        Program::Pass => {
            if !xdp.blocked_prefixes.is_empty() {
                wants.refuse(
                    kind,
                    name,
                    format!(
                        "{field}.blockedPrefixes: only the Blocklist program drops by prefix; \
                         the Pass program takes none"
                    ),
                );
                return wants;
            }
        }
        Program::Blocklist => {
            if let Some(reason) = management.get(name) {
                if !xdp.allow_management_interface {
                    wants.refuse(
                        kind,
                        name,
                        format!(
                            "{field}: refusing to attach the dropping blocklist program to \
                             {name}: {reason}, and a wrong prefix would cut the node off (set \
                             allowManagementInterface to override)"
                        ),
                    );
                    return wants;
                }
            }
            let prefixes = match parse_prefixes(xdp.blocked_prefixes.iter().map(String::as_str)) {
                Ok(p) => p,
                Err(e) => {
                    wants.refuse(
                        Kind::XdpBlocklist.as_str(),
                        name,
                        format!("{field}.blockedPrefixes: {e}"),
                    );
                    return wants;
                }
            };
            for (family, v4) in [("IPv4", true), ("IPv6", false)] {
                let n = prefixes.iter().filter(|p| p.addr.is_ipv4() == v4).count();
                if n > MAX_PREFIXES {
                    wants.refuse(
                        Kind::XdpBlocklist.as_str(),
                        name,
                        format!(
                            "{field}.blockedPrefixes: {n} {family} prefixes, at most \
                             {MAX_PREFIXES} fit"
                        ),
                    );
                    return wants;
                }
            }
            wants.set(
                Setting::new(Kind::XdpBlocklist, name.clone()),
                Blocklist::Pinned(prefixes).to_string(),
            );
        }
    }
    wants.set(
        Setting::new(Kind::XdpProgram, name.clone()),
        value.to_string(),
    );
    wants
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

/// The pure reading of an interface's XDP state: hoststack's program in its mode, `none`,
/// leftover pins, or (an error naming it) a program hoststack did not attach.
pub fn program_value(iface: &str, state: &XdpState) -> Result<ProgramValue, String> {
    match state.attached.as_slice() {
        [] if state.link_program.is_none() && !state.program_pinned => Ok(ProgramValue::None),
        [] => Ok(ProgramValue::LeftoverPins),
        [only] if state.link_program == Some(only.id) && only.mode != AttachMode::Offload => {
            match Program::from_function(&only.name) {
                Some(program) => Ok(ProgramValue::Attached {
                    program,
                    mode: Mode::Exactly(only.mode),
                }),
                None => Err(foreign(iface, state)),
            }
        }
        _ => Err(foreign(iface, state)),
    }
}

/// The refusal to touch an interface with a program hoststack did not attach.
fn foreign(iface: &str, state: &XdpState) -> String {
    let programs: Vec<String> = state
        .attached
        .iter()
        .filter(|p| state.link_program != Some(p.id))
        .map(|p| format!("program {} ({:?}) in {} mode", p.id, p.name, p.mode.name()))
        .collect();
    format!(
        "{iface} already has an XDP program hoststack did not attach: {}; refusing to replace \
         or detach it (detach it first, e.g. ip link set dev {iface} xdp off)",
        programs.join(", ")
    )
}

/// Reads a [`Kind::XdpProgram`] setting.
pub fn read_program(kernel: &dyn Kernel, root: &Path, iface: &str) -> Reading {
    if !plain_name(iface) {
        return Reading::Unreadable(format!("XDP target {iface:?} is not an interface name"));
    }
    // An interface that is gone has no program: `none`, or `leftover-pins` while hoststack's
    // pins for it remain (a revert then removes them).
    match kernel.xdp_query(iface, &Pins::new(root, iface)) {
        Ok(state) => match program_value(iface, &state) {
            Ok(v) => Reading::Value(v.to_string()),
            Err(e) => Reading::Unreadable(e),
        },
        Err(e) => Reading::Unreadable(format!("querying the XDP program of {iface}: {e}")),
    }
}

/// Reads a [`Kind::XdpBlocklist`] setting.
pub fn read_blocklist(kernel: &dyn Kernel, root: &Path, iface: &str) -> Reading {
    if !plain_name(iface) {
        return Reading::Unreadable(format!("XDP target {iface:?} is not an interface name"));
    }
    match kernel.xdp_blocklist(&Pins::new(root, iface)) {
        Ok(list) => Reading::Value(list.to_string()),
        Err(e) => Reading::Unreadable(format!("reading the XDP blocklist of {iface}: {e}")),
    }
}

/// Writes a [`Kind::XdpProgram`] setting (see the module doc).
pub fn write_program(kernel: &dyn Kernel, root: &Path, iface: &str, value: &str) -> io::Result<()> {
    if !plain_name(iface) {
        return Err(invalid(format!(
            "XDP target {iface:?} is not an interface name"
        )));
    }
    let target: ProgramValue = value.parse().map_err(invalid)?;
    if target == ProgramValue::LeftoverPins {
        return Err(invalid(format!("{value:?} cannot be written")));
    }
    let pins = Pins::new(root, iface);
    let current = program_value(iface, &kernel.xdp_query(iface, &pins)?)
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    if current.same(target) {
        return Ok(());
    }
    if let Some(program) = replacement(current, target) {
        return kernel.xdp_replace(&pins, program);
    }
    if current != ProgramValue::None {
        kernel.xdp_detach(&pins)?;
    }
    let ProgramValue::Attached { program, mode } = target else {
        return Ok(());
    };
    let mut failures = Vec::new();
    for m in attach_order(mode) {
        match kernel.xdp_attach(iface, &pins, program, *m) {
            Ok(()) => return Ok(()),
            Err(e) => failures.push((m.name(), e)),
        }
    }
    let kind = failures
        .last()
        .map_or(io::ErrorKind::Other, |(_, e)| e.kind());
    let reasons: Vec<String> = failures
        .iter()
        .map(|(mode, e)| format!("{mode}: {e}"))
        .collect();
    Err(io::Error::new(
        kind,
        format!(
            "attaching {} to {iface} failed ({})",
            program.name(),
            reasons.join("; ")
        ),
    ))
}

/// The program that replaces hoststack's attached one in place (through its link, atomically:
/// no packet sees no program) when only the program changes and the mode stays admitted; `None`
/// when the change needs a detach and a new attach (a new mode, or nothing attached).
pub fn replacement(current: ProgramValue, target: ProgramValue) -> Option<Program> {
    match (current, target) {
        (
            ProgramValue::Attached {
                program: from,
                mode: Mode::Exactly(now),
            },
            ProgramValue::Attached { program, mode },
        ) if from != program && mode.admits(Mode::Exactly(now)) => Some(program),
        _ => None,
    }
}

/// Writes a [`Kind::XdpBlocklist`] setting (see the module doc).
pub fn write_blocklist(
    kernel: &dyn Kernel,
    root: &Path,
    iface: &str,
    value: &str,
) -> io::Result<()> {
    if !plain_name(iface) {
        return Err(invalid(format!(
            "XDP target {iface:?} is not an interface name"
        )));
    }
    let pins = Pins::new(root, iface);
    match value.parse::<Blocklist>().map_err(invalid)? {
        Blocklist::Unpinned => kernel.xdp_unpin_blocklist(&pins),
        Blocklist::Pinned(prefixes) => kernel.xdp_set_blocklist(&pins, &prefixes),
        Blocklist::Incomplete => Err(invalid(format!("{value:?} cannot be written"))),
    }
}

/// The interfaces with a pinned `drops` map under `root`, sorted.
pub fn counted_interfaces(root: &Path) -> Vec<String> {
    dir_names(root)
        .into_iter()
        .filter(|i| plain_name(i) && Pins::new(root, i).map("drops").exists())
        .collect()
}

/// The real kernel's side: aya for programs, maps and links, rtnetlink for the query, statfs
/// and mount(2) for the bpffs.
pub mod real {
    use std::borrow::BorrowMut;
    use std::fs;
    use std::io;
    use std::path::Path;

    use aya::maps::lpm_trie::{Key, LpmTrie};
    use aya::maps::{Map, MapData, PerCpuArray};
    use aya::programs::links::{FdLink, PinnedLink};
    use aya::programs::xdp::XdpLink;
    use aya::programs::{loaded_programs, Xdp, XdpMode};
    use aya::EbpfLoader;

    use super::{AttachMode, AttachedProgram, Blocklist, LpmKey, Pins, Prefix, Program, XdpState};

    /// `f_type` of a bpffs in statfs(2).
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

    /// Where bpffs is conventionally mounted; the agent mounts it there when needed.
    const BPFFS_MOUNT: &str = "/sys/fs/bpf";

    /// An aya error as an io::Error, with its chain of causes in the text.
    fn error(what: &str, e: impl std::error::Error) -> io::Error {
        let mut text = format!("{what}: {e}");
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        let kind = if text.contains("No such device") {
            io::ErrorKind::NotFound
        } else {
            io::ErrorKind::Other
        };
        io::Error::new(kind, text)
    }

    /// The interface index of `iface`; NotFound when there is none.
    fn if_index(iface: &str) -> io::Result<u32> {
        let name = std::ffi::CString::new(iface)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {iface}"),
            ))
        } else {
            Ok(index)
        }
    }

    /// Whether `path` lies on a bpffs (its nearest existing ancestor does).
    fn on_bpffs(path: &Path) -> io::Result<bool> {
        let existing = path
            .ancestors()
            .find(|p| p.exists())
            .unwrap_or(Path::new("/"));
        let c = super::super::c_path(existing)?;
        // SAFETY: statfs fills the zeroed struct; `c` outlives the call.
        let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statfs(c.as_ptr(), &mut stat) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(clippy::unnecessary_cast)]
        Ok(stat.f_type as i64 == BPF_FS_MAGIC)
    }

    /// Makes sure the pins' root lies on a bpffs: mounts one at /sys/fs/bpf when the root is
    /// under it and nothing is mounted there; refuses a root elsewhere that is not on a bpffs.
    fn ensure_bpffs(root: &Path) -> io::Result<()> {
        if on_bpffs(root)? {
            return Ok(());
        }
        if !root.starts_with(BPFFS_MOUNT) {
            return Err(io::Error::other(format!(
                "the bpffs root {} is not on a bpffs: mount one there (mount -t bpf bpf DIR) \
                 or choose a root under {BPFFS_MOUNT}",
                root.display()
            )));
        }
        let target = super::super::c_path(Path::new(BPFFS_MOUNT))?;
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                c"bpf".as_ptr(),
                target.as_ptr(),
                c"bpf".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0700".as_ptr().cast(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("mounting a bpffs at {BPFFS_MOUNT}: {e}"),
            ));
        }
        tracing::info!(path = BPFFS_MOUNT, "mounted a bpffs");
        Ok(())
    }

    /// Creates the pins' directory on a bpffs.
    fn prepare(pins: &Pins) -> io::Result<()> {
        ensure_bpffs(pins.root())?;
        fs::create_dir_all(pins.dir())
    }

    /// Removes `path` when it exists.
    fn remove_pin(path: &Path) -> io::Result<()> {
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io::Error::new(
                e.kind(),
                format!("unpinning {}: {e}", path.display()),
            )),
            _ => Ok(()),
        }
    }

    /// Removes the pins' directory when nothing is left in it.
    fn remove_dir_if_empty(pins: &Pins) {
        if fs::read_dir(pins.dir()).is_ok_and(|mut d| d.next().is_none()) {
            let _ = fs::remove_dir(pins.dir());
        }
    }

    /// The name the kernel gives program `id`.
    fn program_name(id: u32) -> String {
        loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == id)
            .and_then(|p| p.name_as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// See [`crate::appliers::Kernel::xdp_query`].
    pub fn query(iface: &str, pins: &Pins) -> io::Result<XdpState> {
        let index = match if_index(iface) {
            Ok(index) => Some(index),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let attached = match index {
            Some(index) => super::netlink::attached(index)?
                .into_iter()
                .map(|(mode, id)| AttachedProgram {
                    id,
                    name: program_name(id),
                    mode,
                })
                .collect(),
            None => Vec::new(),
        };
        let link_program = if pins.link().exists() {
            let link = PinnedLink::from_pin(pins.link())
                .map_err(|e| error("opening the pinned link", e))?;
            let info = FdLink::from(link)
                .info()
                .map_err(|e| error("reading the pinned link", e))?;
            Some(info.program_id())
        } else {
            None
        };
        Ok(XdpState {
            interface_gone: index.is_none(),
            attached,
            link_program,
            program_pinned: pins.program().exists(),
        })
    }

    /// See [`crate::appliers::Kernel::xdp_attach`].
    pub fn attach(iface: &str, pins: &Pins, program: Program, mode: AttachMode) -> io::Result<()> {
        let index = if_index(iface)?;
        prepare(pins)?;
        let mut ebpf = load(pins, program)?;
        let xdp = loaded(&mut ebpf, program)?;
        let aya_mode = match mode {
            AttachMode::Native => XdpMode::Driver,
            AttachMode::Generic => XdpMode::Skb,
            AttachMode::Offload => XdpMode::Hardware,
        };
        let link_id = xdp
            .attach_to_if_index(index, aya_mode)
            .map_err(|e| error("attaching", e))?;
        let link = xdp
            .take_link(link_id)
            .map_err(|e| error("taking the link", e))?;
        // A link the kernel made (bpf_link_create), not the netlink fallback: only those pin.
        let link = FdLink::try_from(link).map_err(|e| error("the kernel gave no BPF link", e))?;
        // The pinned link keeps the program attached; dropping it unpinned detaches.
        link.pin(pins.link())
            .map_err(|e| error("pinning the link", e))?;
        xdp.pin(pins.program())
            .map_err(|e| error("pinning the program", e))?;
        Ok(())
    }

    /// Loads a built-in program (the blocklist one with its pinned maps).
    fn load(pins: &Pins, program: Program) -> io::Result<aya::Ebpf> {
        let mut loader = EbpfLoader::new();
        if program == Program::Blocklist {
            // The pinned maps are reused; missing ones are created (empty) and pinned. That
            // happens only when an undo re-attaches the program before restoring its list.
            for name in Pins::MAPS {
                loader.map_pin_path(name, pins.map(name));
            }
        }
        loader
            .load(program.object())
            .map_err(|e| error("loading the object", e))
    }

    /// The XDP program of a loaded object, loaded into the kernel.
    fn loaded(ebpf: &mut aya::Ebpf, program: Program) -> io::Result<&mut Xdp> {
        let xdp: &mut Xdp = ebpf
            .program_mut(program.function())
            .ok_or_else(|| io::Error::other(format!("no {} in the object", program.function())))?
            .try_into()
            .map_err(|e| error("the program", e))?;
        xdp.load().map_err(|e| error("loading the program", e))?;
        Ok(xdp)
    }

    /// See [`crate::appliers::Kernel::xdp_replace`]: `bpf_link_update` on the pinned link, then
    /// the new program's pin in place of the old one's.
    pub fn replace(pins: &Pins, program: Program) -> io::Result<()> {
        prepare(pins)?;
        let link =
            PinnedLink::from_pin(pins.link()).map_err(|e| error("opening the pinned link", e))?;
        let link = XdpLink::try_from(FdLink::from(link))
            .map_err(|e| error("the pinned link is not an XDP link", e))?;
        let mut ebpf = load(pins, program)?;
        let xdp = loaded(&mut ebpf, program)?;
        let id = xdp
            .attach_to_link(link)
            .map_err(|e| error("replacing the program", e))?;
        // The link stays pinned: closing this descriptor leaves the new program attached.
        drop(xdp.take_link(id).map_err(|e| error("taking the link", e))?);
        remove_pin(&pins.program())?;
        xdp.pin(pins.program())
            .map_err(|e| error("pinning the program", e))
    }

    /// See [`crate::appliers::Kernel::xdp_detach`]: the program pin first, then the link. The
    /// link is opened before its pin is removed, so that closing it drops the last reference:
    /// the kernel then detaches the program at once (a link released by unlinking its pin is
    /// freed later, from a work queue, and the read-back could still see it attached).
    pub fn detach(pins: &Pins) -> io::Result<()> {
        remove_pin(&pins.program())?;
        if pins.link().exists() {
            let link = PinnedLink::from_pin(pins.link())
                .map_err(|e| error("opening the pinned link", e))?;
            let last = link.unpin().map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("unpinning {}: {e}", pins.link().display()),
                )
            })?;
            drop(last);
        }
        remove_dir_if_empty(pins);
        Ok(())
    }

    /// Opens a pinned blocklist trie.
    fn open_map(pins: &Pins, name: &str) -> io::Result<Map> {
        let data = MapData::from_pin(pins.map(name))
            .map_err(|e| error(&format!("opening the pinned map {name}"), e))?;
        Map::from_map_data(data).map_err(|e| error(&format!("the pinned map {name}"), e))
    }

    /// The keys of a trie.
    fn keys<K: aya::Pod, T: std::borrow::Borrow<MapData>>(
        trie: &LpmTrie<T, K, u8>,
    ) -> io::Result<Vec<Key<K>>> {
        trie.keys()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error("listing the blocklist", e))
    }

    /// See [`crate::appliers::Kernel::xdp_blocklist`].
    pub fn blocklist(pins: &Pins) -> io::Result<Blocklist> {
        let present = Pins::MAPS.iter().filter(|m| pins.map(m).exists()).count();
        if present == 0 {
            return Ok(Blocklist::Unpinned);
        }
        if present < Pins::MAPS.len() {
            return Ok(Blocklist::Incomplete);
        }
        let v4: LpmTrie<MapData, [u8; 4], u8> = LpmTrie::try_from(open_map(pins, "blocklist_v4")?)
            .map_err(|e| error("blocklist_v4", e))?;
        let v6: LpmTrie<MapData, [u8; 16], u8> = LpmTrie::try_from(open_map(pins, "blocklist_v6")?)
            .map_err(|e| error("blocklist_v6", e))?;
        let mut prefixes: Vec<Prefix> = Vec::new();
        for k in keys(&v4)? {
            prefixes.extend(Prefix::from_lpm_key(LpmKey::V4(k.prefix_len(), k.data())));
        }
        for k in keys(&v6)? {
            prefixes.extend(Prefix::from_lpm_key(LpmKey::V6(k.prefix_len(), k.data())));
        }
        prefixes.sort();
        Ok(Blocklist::Pinned(prefixes))
    }

    /// Makes a trie hold exactly `want`: removes the other keys, inserts the missing ones.
    fn sync<K: aya::Pod + PartialEq, T: BorrowMut<MapData>>(
        trie: &mut LpmTrie<T, K, u8>,
        want: &[Key<K>],
    ) -> io::Result<()> {
        let same =
            |a: &Key<K>, b: &Key<K>| a.prefix_len() == b.prefix_len() && a.data() == b.data();
        let have = keys(trie)?;
        for k in have.iter().filter(|k| !want.iter().any(|w| same(w, k))) {
            trie.remove(k).map_err(|e| error("removing a prefix", e))?;
        }
        for k in want.iter().filter(|w| !have.iter().any(|k| same(w, k))) {
            trie.insert(k, 1, 0)
                .map_err(|e| error("inserting a prefix", e))?;
        }
        Ok(())
    }

    /// See [`crate::appliers::Kernel::xdp_set_blocklist`].
    pub fn set_blocklist(pins: &Pins, prefixes: &[Prefix]) -> io::Result<()> {
        prepare(pins)?;
        let mut loader = EbpfLoader::new();
        for name in Pins::MAPS {
            loader.map_pin_path(name, pins.map(name));
        }
        // Creates and pins the maps that are not pinned yet, opens the others.
        let mut ebpf = loader
            .load(Program::Blocklist.object())
            .map_err(|e| error("creating the blocklist maps", e))?;
        let mut v4_keys = Vec::new();
        let mut v6_keys = Vec::new();
        for p in prefixes {
            match p.lpm_key() {
                LpmKey::V4(len, a) => v4_keys.push(Key::new(len, a)),
                LpmKey::V6(len, a) => v6_keys.push(Key::new(len, a)),
            }
        }
        let map = ebpf
            .map_mut("blocklist_v4")
            .ok_or_else(|| io::Error::other("no blocklist_v4 in the object"))?;
        let mut v4: LpmTrie<&mut MapData, [u8; 4], u8> =
            LpmTrie::try_from(map).map_err(|e| error("blocklist_v4", e))?;
        sync(&mut v4, &v4_keys)?;
        let map = ebpf
            .map_mut("blocklist_v6")
            .ok_or_else(|| io::Error::other("no blocklist_v6 in the object"))?;
        let mut v6: LpmTrie<&mut MapData, [u8; 16], u8> =
            LpmTrie::try_from(map).map_err(|e| error("blocklist_v6", e))?;
        sync(&mut v6, &v6_keys)
    }

    /// See [`crate::appliers::Kernel::xdp_unpin_blocklist`].
    pub fn unpin_blocklist(pins: &Pins) -> io::Result<()> {
        for name in Pins::MAPS {
            remove_pin(&pins.map(name))?;
        }
        remove_dir_if_empty(pins);
        Ok(())
    }

    /// The blocklist program's drop counters for the interface of `pins`, summed over CPUs:
    /// (packets, bytes).
    pub fn drops(pins: &Pins) -> io::Result<(u64, u64)> {
        let counters: PerCpuArray<MapData, u64> =
            PerCpuArray::try_from(open_map(pins, "drops")?).map_err(|e| error("drops", e))?;
        let sum = |index: u32| -> io::Result<u64> {
            let values = counters
                .get(&index, 0)
                .map_err(|e| error("reading the drop counters", e))?;
            Ok(values.iter().copied().fold(0u64, u64::wrapping_add))
        };
        Ok((sum(0)?, sum(1)?))
    }
}

/// The rtnetlink query of an interface's XDP hook (`RTM_GETLINK`, attribute `IFLA_XDP`).
mod netlink {
    use std::io;

    use super::AttachMode;

    const NLMSG_HDRLEN: usize = 16;
    const IFINFOMSG_LEN: usize = 16;
    const NLMSG_ERROR: u16 = 2;
    const RTM_NEWLINK: u16 = 16;
    const RTM_GETLINK: u16 = 18;
    const NLM_F_REQUEST: u16 = 1;
    const IFLA_XDP: u16 = 43;
    const IFLA_XDP_ATTACHED: u16 = 2;
    const IFLA_XDP_PROG_ID: u16 = 4;
    const IFLA_XDP_DRV_PROG_ID: u16 = 5;
    const IFLA_XDP_SKB_PROG_ID: u16 = 6;
    const IFLA_XDP_HW_PROG_ID: u16 = 7;
    const XDP_ATTACHED_DRV: u8 = 1;
    const XDP_ATTACHED_SKB: u8 = 2;
    const XDP_ATTACHED_HW: u8 = 3;
    const XDP_ATTACHED_MULTI: u8 = 4;
    /// The attribute type without the nested and byte-order flags.
    const NLA_TYPE_MASK: u16 = 0x3fff;

    /// Programs attached to an interface: (mode, program id).
    pub type Attached = Vec<(AttachMode, u32)>;

    /// The programs attached to interface `index`, with their modes.
    pub fn attached(index: u32) -> io::Result<Attached> {
        // SAFETY: plain socket(2) call; the fd is owned right after.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        let request = request(index);
        // SAFETY: the buffer is valid for its length.
        let sent = unsafe { libc::send(raw, request.as_ptr().cast(), request.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 64 * 1024];
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        parse_reply(&buf)
    }

    /// The RTM_GETLINK request for interface `index`.
    fn request(index: u32) -> Vec<u8> {
        let len = (NLMSG_HDRLEN + IFINFOMSG_LEN) as u32;
        let mut m = Vec::with_capacity(len as usize);
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&RTM_GETLINK.to_ne_bytes());
        m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        m.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel
        m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]); // family, pad, type
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&[0; 8]); // flags, change
        m
    }

    /// The attributes in `bytes`: (type without flags, payload).
    fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            if bytes.len() < 4 {
                return None;
            }
            let len = usize::from(u16::from_ne_bytes([bytes[0], bytes[1]]));
            let kind = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
            if len < 4 || len > bytes.len() {
                return None;
            }
            let payload = &bytes[4..len];
            let next = ((len + 3) & !3).min(bytes.len());
            bytes = &bytes[next..];
            Some((kind, payload))
        })
    }

    fn u32_of(payload: &[u8]) -> Option<u32> {
        Some(u32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
    }

    /// Parses the kernel's answer: an error, or a link message whose `IFLA_XDP` says what is
    /// attached.
    pub(super) fn parse_reply(buf: &[u8]) -> io::Result<Attached> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed netlink reply");
        if buf.len() < NLMSG_HDRLEN {
            return Err(bad());
        }
        let len = u32_of(buf).ok_or_else(bad)? as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        let msg = buf.get(..len).ok_or_else(bad)?;
        if kind == NLMSG_ERROR {
            let code = msg
                .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
                .and_then(|b| Some(i32::from_ne_bytes(b.try_into().ok()?)))
                .ok_or_else(bad)?;
            return Err(io::Error::from_raw_os_error(-code));
        }
        if kind != RTM_NEWLINK {
            return Err(bad());
        }
        let attrs = msg.get(NLMSG_HDRLEN + IFINFOMSG_LEN..).ok_or_else(bad)?;
        let Some((_, xdp)) = attributes(attrs).find(|(t, _)| *t == IFLA_XDP) else {
            return Ok(Vec::new());
        };
        let mut attached = 0u8;
        let mut ids = [None; 4];
        for (t, payload) in attributes(xdp) {
            match t {
                IFLA_XDP_ATTACHED => attached = payload.first().copied().unwrap_or(0),
                IFLA_XDP_PROG_ID => ids[0] = u32_of(payload),
                IFLA_XDP_DRV_PROG_ID => ids[1] = u32_of(payload),
                IFLA_XDP_SKB_PROG_ID => ids[2] = u32_of(payload),
                IFLA_XDP_HW_PROG_ID => ids[3] = u32_of(payload),
                _ => {}
            }
        }
        let one = |mode| ids[0].map(|id| vec![(mode, id)]).unwrap_or_default();
        Ok(match attached {
            XDP_ATTACHED_DRV => one(AttachMode::Native),
            XDP_ATTACHED_SKB => one(AttachMode::Generic),
            XDP_ATTACHED_HW => one(AttachMode::Offload),
            XDP_ATTACHED_MULTI => [
                (AttachMode::Native, ids[1]),
                (AttachMode::Generic, ids[2]),
                (AttachMode::Offload, ids[3]),
            ]
            .into_iter()
            .filter_map(|(m, id)| Some((m, id?)))
            .collect(),
            _ => Vec::new(),
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
            let mut a = Vec::new();
            a.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(payload);
            while a.len() % 4 != 0 {
                a.push(0);
            }
            a
        }

        fn reply(kind: u16, body: &[u8]) -> Vec<u8> {
            let mut m = Vec::new();
            m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(&[0; 10]);
            m.extend_from_slice(body);
            m
        }

        fn link(xdp: &[Vec<u8>]) -> Vec<u8> {
            let mut body = vec![0u8; IFINFOMSG_LEN];
            body.extend(attr(3, b"veth0\0")); // IFLA_IFNAME first, as the kernel sends it
            body.extend(attr(IFLA_XDP | 0x8000, &xdp.concat()));
            reply(RTM_NEWLINK, &body)
        }

        #[test]
        fn replies() {
            let id = |n: u32| n.to_ne_bytes();
            let table: Vec<(Vec<u8>, Attached)> = vec![
                (link(&[attr(IFLA_XDP_ATTACHED, &[0])]), vec![]),
                (
                    link(&[
                        attr(IFLA_XDP_ATTACHED, &[XDP_ATTACHED_DRV]),
                        attr(IFLA_XDP_PROG_ID, &id(42)),
                    ]),
                    vec![(AttachMode::Native, 42)],
                ),
                (
                    link(&[
                        attr(IFLA_XDP_ATTACHED, &[XDP_ATTACHED_SKB]),
                        attr(IFLA_XDP_PROG_ID, &id(7)),
                    ]),
                    vec![(AttachMode::Generic, 7)],
                ),
                (
                    link(&[
                        attr(IFLA_XDP_ATTACHED, &[XDP_ATTACHED_MULTI]),
                        attr(IFLA_XDP_DRV_PROG_ID, &id(1)),
                        attr(IFLA_XDP_SKB_PROG_ID, &id(2)),
                    ]),
                    vec![(AttachMode::Native, 1), (AttachMode::Generic, 2)],
                ),
            ];
            for (bytes, want) in table {
                assert_eq!(parse_reply(&bytes).expect("parses"), want);
            }
            let no_xdp = reply(RTM_NEWLINK, &[0u8; IFINFOMSG_LEN]);
            assert_eq!(parse_reply(&no_xdp).expect("parses"), vec![]);
            let enodev = reply(NLMSG_ERROR, &(-libc::ENODEV).to_ne_bytes());
            assert_eq!(
                parse_reply(&enodev).expect_err("error").raw_os_error(),
                Some(libc::ENODEV)
            );
            for bad in [&[1u8, 2][..], &reply(RTM_NEWLINK, &[0; 4])[..]] {
                assert!(parse_reply(bad).is_err());
            }
            // Truncated attributes end the walk without panicking.
            let mut cut = link(&[attr(IFLA_XDP_ATTACHED, &[XDP_ATTACHED_DRV])]);
            cut.truncate(cut.len() - 3);
            let len = cut.len() as u32;
            cut[..4].copy_from_slice(&len.to_ne_bytes());
            assert!(parse_reply(&cut).is_ok());
        }
    }
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

    #[test]
    fn blocklist_values() {
        let list: Blocklist = "2001:db8::/32, 198.19.30.10/32,10.0.0.0/8,198.19.30.10"
            .parse()
            .expect("parses");
        assert_eq!(
            list.to_string(),
            "10.0.0.0/8,198.19.30.10/32,2001:db8::/32",
            "sorted, v4 first, duplicates merged"
        );
        assert_eq!("empty".parse(), Ok(Blocklist::Pinned(vec![])));
        assert_eq!(Blocklist::Pinned(vec![]).to_string(), "empty");
        assert_eq!("none".parse(), Ok(Blocklist::Unpinned));
        let err = "10.0.0.1/8,nope".parse::<Blocklist>().expect_err("bad");
        assert!(
            err.contains("10.0.0.0/8") && err.contains("\"nope\""),
            "{err}"
        );
        assert!(same_blocklist(
            "10.0.0.0/8,10.1.0.0/16",
            "10.1.0.0/16, 10.0.0.0/8"
        ));
        assert!(!same_blocklist("10.0.0.0/8", "10.0.0.0/16"));
        assert!(!same_blocklist("none", "empty"));
    }

    #[test]
    fn program_values_and_modes() {
        let table: &[(&str, &str, bool)] = &[
            ("blocklist/auto", "blocklist/native", true),
            ("blocklist/auto", "blocklist/generic", true),
            ("blocklist/native", "blocklist/generic", false),
            ("pass/native", "blocklist/native", false),
            ("none", "none", true),
            ("none", "leftover-pins", false),
            ("none", "pass/auto", false),
        ];
        for (a, b, same) in table {
            assert_eq!(same_program(a, b), *same, "{a} {b}");
            assert_eq!(same_program(b, a), *same, "{b} {a}");
        }
        for text in ["none", "leftover-pins", "blocklist/native", "pass/auto"] {
            let v: ProgramValue = text.parse().expect("parses");
            assert_eq!(v.to_string(), text);
        }
        for bad in [
            "",
            "blocklist",
            "drop/native",
            "pass/offload",
            "pass/native/x",
        ] {
            assert!(bad.parse::<ProgramValue>().is_err(), "{bad}");
        }
    }

    #[test]
    fn in_place_replacement() {
        let v = |text: &str| text.parse::<ProgramValue>().expect("value");
        let table: &[(&str, &str, Option<Program>)] = &[
            ("pass/native", "blocklist/auto", Some(Program::Blocklist)),
            (
                "pass/generic",
                "blocklist/generic",
                Some(Program::Blocklist),
            ),
            ("blocklist/native", "pass/native", Some(Program::Pass)),
            ("blocklist/native", "pass/generic", None),
            ("pass/native", "pass/auto", None),
            ("none", "pass/native", None),
            ("leftover-pins", "pass/native", None),
            ("pass/native", "none", None),
        ];
        for (from, to, want) in table {
            assert_eq!(replacement(v(from), v(to)), *want, "{from} -> {to}");
        }
    }

    #[test]
    fn the_mode_fallback_decision() {
        use AttachMode::*;
        assert_eq!(attach_order(Mode::Auto), [Native, Generic]);
        assert_eq!(attach_order(Mode::Exactly(Native)), [Native]);
        assert_eq!(attach_order(Mode::Exactly(Generic)), [Generic]);
        assert_eq!(Mode::from_spec(XdpMode::Auto), Mode::Auto);
        assert_eq!(Mode::from_spec(XdpMode::Generic), Mode::Exactly(Generic));
    }

    fn attached(id: u32, name: &str, mode: AttachMode) -> AttachedProgram {
        AttachedProgram {
            id,
            name: name.into(),
            mode,
        }
    }

    #[test]
    fn reading_the_hook() {
        let ours = |mode| XdpState {
            interface_gone: false,
            attached: vec![attached(9, "hs_blocklist", mode)],
            link_program: Some(9),
            program_pinned: true,
        };
        let table: Vec<(&str, XdpState, Result<&str, &str>)> = vec![
            ("nothing", XdpState::default(), Ok("none")),
            (
                "ours native",
                ours(AttachMode::Native),
                Ok("blocklist/native"),
            ),
            (
                "ours generic",
                ours(AttachMode::Generic),
                Ok("blocklist/generic"),
            ),
            (
                "an interface gone, its pins left",
                XdpState {
                    interface_gone: true,
                    link_program: Some(9),
                    ..XdpState::default()
                },
                Ok("leftover-pins"),
            ),
            (
                "pins without a program",
                XdpState {
                    interface_gone: false,
                    program_pinned: true,
                    ..XdpState::default()
                },
                Ok("leftover-pins"),
            ),
            (
                "someone else's",
                XdpState {
                    interface_gone: false,
                    attached: vec![attached(5, "xdp_fw", AttachMode::Native)],
                    ..XdpState::default()
                },
                Err("program 5 (\"xdp_fw\") in native mode"),
            ),
            (
                "someone else's beside ours",
                XdpState {
                    interface_gone: false,
                    attached: vec![
                        attached(9, "hs_pass", AttachMode::Native),
                        attached(5, "xdp_fw", AttachMode::Generic),
                    ],
                    link_program: Some(9),
                    program_pinned: true,
                },
                Err("program 5 (\"xdp_fw\") in generic mode"),
            ),
            (
                "our name but not our link",
                XdpState {
                    interface_gone: false,
                    attached: vec![attached(5, "hs_pass", AttachMode::Native)],
                    link_program: Some(9),
                    program_pinned: true,
                },
                Err("program 5"),
            ),
        ];
        for (name, state, want) in table {
            match (program_value("veth1", &state), want) {
                (Ok(v), Ok(text)) => assert_eq!(v.to_string(), text, "{name}"),
                (Err(e), Err(part)) => {
                    assert!(e.contains(part), "{name}: {e}");
                    assert!(
                        e.contains("refusing to replace or detach it"),
                        "{name}: {e}"
                    );
                }
                (got, _) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn wants() {
        let iface = InterfaceFacts {
            name: "veth1".into(),
            ..InterfaceFacts::default()
        };
        let management: BTreeMap<String, String> = [(
            "veth1".to_string(),
            "it carries the default route".to_string(),
        )]
        .into();
        let spec = |program, prefixes: &[&str], allow| Xdp {
            program,
            mode: XdpMode::Auto,
            blocked_prefixes: prefixes.iter().map(|s| s.to_string()).collect(),
            allow_management_interface: allow,
        };
        let none = BTreeMap::new();
        type Case<'a> = (
            &'a str,
            Xdp,
            &'a BTreeMap<String, String>,
            Result<&'a [(&'a str, &'a str)], &'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "a blocklist",
                spec(XdpProgram::Blocklist, &["198.19.30.10/32", "2001:db8::/32"], false),
                &none,
                Ok(&[
                    ("xdpBlocklist veth1", "198.19.30.10/32,2001:db8::/32"),
                    ("xdpProgram veth1", "blocklist/auto"),
                ]),
            ),
            (
                "an empty blocklist",
                spec(XdpProgram::Blocklist, &[], false),
                &none,
                Ok(&[
                    ("xdpBlocklist veth1", "empty"),
                    ("xdpProgram veth1", "blocklist/auto"),
                ]),
            ),
            (
                "pass",
                spec(XdpProgram::Pass, &[], false),
                &management,
                Ok(&[("xdpProgram veth1", "pass/auto")]),
            ),
            (
                "the blocklist on the management interface",
                spec(XdpProgram::Blocklist, &["10.0.0.0/8"], false),
                &management,
                Err("refusing to attach the dropping blocklist program to veth1: it carries the default route"),
            ),
            (
                "allowed there",
                spec(XdpProgram::Blocklist, &["10.0.0.0/8"], true),
                &management,
                Ok(&[
                    ("xdpBlocklist veth1", "10.0.0.0/8"),
                    ("xdpProgram veth1", "blocklist/auto"),
                ]),
            ),
            (
                "bad prefixes",
                spec(XdpProgram::Blocklist, &["10.0.0.1/8", "x"], false),
                &none,
                Err("interfaces[0].xdp.blockedPrefixes: \"10.0.0.1/8\" has host bits set"),
            ),
            (
                "prefixes for pass",
                spec(XdpProgram::Pass, &["10.0.0.0/8"], false),
                &none,
                Err("the Pass program takes none"),
            ),
        ];
        for (name, xdp, management, want) in cases {
            let w = desired("interfaces[0].xdp", &iface, &xdp, management);
            match want {
                Ok(settings) => {
                    assert!(w.refused.is_empty(), "{name}: {w:?}");
                    let got: Vec<(String, String)> = w
                        .settings
                        .iter()
                        .map(|(s, v)| (s.to_string(), v.clone()))
                        .collect();
                    let want: Vec<(String, String)> = settings
                        .iter()
                        .map(|(s, v)| (s.to_string(), v.to_string()))
                        .collect();
                    assert_eq!(got, want, "{name}");
                }
                Err(text) => {
                    assert!(w.settings.is_empty(), "{name}: {w:?}");
                    assert!(w.refused[0].message.contains(text), "{name}: {w:?}");
                }
            }
        }
        let many: Vec<String> = (0..=MAX_PREFIXES)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
            .collect();
        let w = desired(
            "f",
            &iface,
            &Xdp {
                blocked_prefixes: many,
                ..Xdp::default()
            },
            &none,
        );
        assert!(w.refused[0].message.contains("4097 IPv4 prefixes"), "{w:?}");
    }
}
