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
//! Pinned links keep the programs attached when the agent exits, so a restarted agent reads the
//! same values back and changes nothing.
//!
//! This module is the pure part ([`desired`], [`program_value`], the value parsers and
//! comparisons, [`attach_order`], [`replacement`]), which decides; everything that touches the
//! kernel goes through the [`Bpf`] port ([`crate::host::bpf`]: the programs, pins and prefixes
//! it speaks, aya for programs, maps and links, rtnetlink for what is attached).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;

use hoststack_crds::{InterfaceFacts, Xdp, XdpMode};

use super::Applier;
use crate::host::bpf::{
    parse_prefixes, AttachMode, Blocklist, Pins, Program, XdpState, MAX_PREFIXES,
};
use crate::host::{Bpf, Host, Port};
use crate::model::{invalid, same_value, Kind, Reading, Setting, Wants};
use crate::sysfs::plain_name;

/// The applier of [`Kind::XdpBlocklist`]: lists compare as sets of prefixes.
#[derive(Clone, Copy, Debug)]
pub struct Blocklists;

impl Applier for Blocklists {
    fn ports(&self) -> &'static [Port] {
        &[Port::Bpf]
    }

    fn read(&self, host: &Host, iface: &str) -> Reading {
        match host.bpf() {
            Ok(bpf) => read_blocklist(bpf, host.bpffs_root(), iface),
            Err(missing) => missing.into(),
        }
    }

    fn write(&self, host: &Host, iface: &str, value: &str) -> io::Result<()> {
        write_blocklist(host.bpf()?, host.bpffs_root(), iface, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_blocklist(a, b)
    }
}

/// The applier of [`Kind::XdpProgram`]: `auto` matches either mode.
#[derive(Clone, Copy, Debug)]
pub struct Programs;

impl Applier for Programs {
    fn ports(&self) -> &'static [Port] {
        &[Port::Bpf]
    }

    fn read(&self, host: &Host, iface: &str) -> Reading {
        match host.bpf() {
            Ok(bpf) => read_program(bpf, host.bpffs_root(), iface),
            Err(missing) => missing.into(),
        }
    }

    fn write(&self, host: &Host, iface: &str, value: &str) -> io::Result<()> {
        write_program(host.bpf()?, host.bpffs_root(), iface, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_program(a, b)
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
                let n = prefixes.iter().filter(|p| p.addr().is_ipv4() == v4).count();
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
pub fn read_program(bpf: &dyn Bpf, root: &Path, iface: &str) -> Reading {
    if !plain_name(iface) {
        return Reading::Unreadable(format!("XDP target {iface:?} is not an interface name"));
    }
    // An interface that is gone has no program: `none`, or `leftover-pins` while hoststack's
    // pins for it remain (a revert then removes them).
    match bpf.query_hook(iface, &Pins::new(root, iface)) {
        Ok(state) => match program_value(iface, &state) {
            Ok(v) => Reading::Value(v.to_string()),
            Err(e) => Reading::Unreadable(e),
        },
        Err(e) => Reading::Unreadable(format!("querying the XDP program of {iface}: {e}")),
    }
}

/// Reads a [`Kind::XdpBlocklist`] setting.
pub fn read_blocklist(bpf: &dyn Bpf, root: &Path, iface: &str) -> Reading {
    if !plain_name(iface) {
        return Reading::Unreadable(format!("XDP target {iface:?} is not an interface name"));
    }
    match bpf.blocklist(&Pins::new(root, iface)) {
        Ok(list) => Reading::Value(list.to_string()),
        Err(e) => Reading::Unreadable(format!("reading the XDP blocklist of {iface}: {e}")),
    }
}

/// Writes a [`Kind::XdpProgram`] setting (see the module doc).
pub fn write_program(bpf: &dyn Bpf, root: &Path, iface: &str, value: &str) -> io::Result<()> {
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
    let current = program_value(iface, &bpf.query_hook(iface, &pins)?)
        .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
    if current.same(target) {
        return Ok(());
    }
    if let Some(program) = replacement(current, target) {
        return bpf.replace(&pins, program);
    }
    if current != ProgramValue::None {
        bpf.detach(&pins)?;
    }
    let ProgramValue::Attached { program, mode } = target else {
        return Ok(());
    };
    let mut failures = Vec::new();
    for m in attach_order(mode) {
        match bpf.attach(iface, &pins, program, *m) {
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
pub fn write_blocklist(bpf: &dyn Bpf, root: &Path, iface: &str, value: &str) -> io::Result<()> {
    if !plain_name(iface) {
        return Err(invalid(format!(
            "XDP target {iface:?} is not an interface name"
        )));
    }
    let pins = Pins::new(root, iface);
    match value.parse::<Blocklist>().map_err(invalid)? {
        Blocklist::Unpinned => bpf.unpin_blocklist(&pins),
        Blocklist::Pinned(prefixes) => bpf.set_blocklist(&pins, &prefixes),
        Blocklist::Incomplete => Err(invalid(format!("{value:?} cannot be written"))),
    }
}

#[cfg(test)]
mod tests {
    use hoststack_crds::XdpProgram;

    use super::*;
    use crate::host::bpf::AttachedProgram;

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
