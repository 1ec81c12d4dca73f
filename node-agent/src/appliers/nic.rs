//! NIC settings: channel counts, offload features and ring sizes through the [`Ethtool`] port,
//! the MTU through the [`Rtnetlink`](crate::host::Rtnetlink) port.
//!
//! Settings and their values (strings, like every kind):
//! - [`Kind::Channels`] `IF/combined`, `IF/rx`, `IF/tx`: a channel count (`ethtool -L`).
//! - [`Kind::Offload`] `IF/<feature>`: `on` or `off`, by the kernel's feature name
//!   (`rx-gro`, `tx-tcp-segmentation`, ...; `ethtool -K`). The spec may use ethtool's short and
//!   long aliases ([`ALIASES`]); the plan step maps them to the kernel's names.
//! - [`Kind::Ring`] `IF/rx`, `IF/tx`: a ring size (`ethtool -G`).
//! - [`Kind::Mtu`] `IF`: the MTU in bytes (`ip link set IF mtu N`).
//!
//! A driver that does not support a setting answers with its error (veth has no rings:
//! EOPNOTSUPP), which fails the setting with the kernel's words and its extended ack message.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use hoststack_crds::{InterfaceFacts, InterfaceTuning, NodeConfig};

use super::matching::{self, glob};
use super::Applier;
use crate::host::ethtool::{ChannelCounts, ChannelInfo, Features, RingSizes};
use crate::host::{Ethtool, Host, Port};
use crate::model::{invalid, Kind, Reading, Setting, Wants};
use crate::netlink::errno;
use crate::sysfs::plain_name;

/// The applier of a NIC setting: [`Kind::Channels`], [`Kind::Offload`], [`Kind::Ring`] or
/// [`Kind::Mtu`].
#[derive(Clone, Copy, Debug)]
pub struct Nic(pub Kind);

impl Applier for Nic {
    fn ports(&self) -> &'static [Port] {
        match self.0 {
            Kind::Mtu => &[Port::Rtnetlink],
            _ => &[Port::Ethtool],
        }
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host, self.0, target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host, self.0, target, value)
    }

    fn same_value(&self, a: &str, b: &str) -> bool {
        same_value(self.0, a, b)
    }
}

/// ethtool's names for groups of kernel features (`ethtool -k` prints the long ones; `-K`
/// takes both), with the kernel feature names (shell-style globs) each stands for, as ethtool
/// maps them. An alias sets every matching feature the driver lets change.
pub const ALIASES: &[(&str, &str, &str)] = &[
    ("rx", "rx-checksumming", "rx-checksum"),
    ("tx", "tx-checksumming", "tx-checksum-*"),
    ("sg", "scatter-gather", "tx-scatter-gather*"),
    ("tso", "tcp-segmentation-offload", "tx-tcp*-segmentation"),
    ("ufo", "udp-fragmentation-offload", "tx-udp-fragmentation"),
    (
        "gso",
        "generic-segmentation-offload",
        "tx-generic-segmentation",
    ),
    ("gro", "generic-receive-offload", "rx-gro"),
    ("lro", "large-receive-offload", "rx-lro"),
    ("rxvlan", "rx-vlan-offload", "rx-vlan-hw-parse"),
    ("txvlan", "tx-vlan-offload", "tx-vlan-hw-insert"),
    ("ntuple", "ntuple-filters", "rx-ntuple-filter"),
    ("rxhash", "receive-hashing", "rx-hashing"),
];

/// The kernel feature names `name` stands for among `known`: the features of its alias, or the
/// name itself when the kernel knows it; empty when it is neither.
pub fn kernel_names(name: &str, known: &[String]) -> Vec<String> {
    let pattern = ALIASES
        .iter()
        .find(|(short, long, _)| *short == name || *long == name)
        .map(|(_, _, pattern)| *pattern);
    match pattern {
        Some(p) => known.iter().filter(|k| glob(p, k)).cloned().collect(),
        None => known.iter().filter(|k| *k == name).cloned().collect(),
    }
}

/// `on` or `off`.
pub fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// A feature value as a bool: `on`/`off` (also `true`/`false`), any case.
fn parse_on_off(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" => Some(true),
        "off" | "false" => Some(false),
        _ => None,
    }
}

/// Whether two values of a NIC kind are the same: offloads as on/off, the rest as numbers.
pub fn same_value(kind: Kind, a: &str, b: &str) -> bool {
    match kind {
        Kind::Offload => match (parse_on_off(a), parse_on_off(b)) {
            (Some(x), Some(y)) => x == y,
            _ => crate::model::same_value(a, b),
        },
        _ => match (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
            (Ok(x), Ok(y)) => x == y,
            _ => crate::model::same_value(a, b),
        },
    }
}

/// What one NIC setting is about.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part<'a> {
    /// A channel count: `combined`, `rx` or `tx`.
    Channels(&'a str),
    /// An offload feature by its kernel name.
    Offload(&'a str),
    /// A ring size: `rx` or `tx`.
    Ring(&'a str),
    /// The MTU.
    Mtu,
}

/// Longest interface name (`IFNAMSIZ` - 1).
const IFNAME_MAX: usize = 15;

/// The interface and part of a NIC setting's target.
fn parse_target(kind: Kind, target: &str) -> Result<(&str, Part<'_>), String> {
    let (iface, rest) = match target.split_once('/') {
        Some((i, r)) => (i, Some(r)),
        None => (target, None),
    };
    let part = match (kind, rest) {
        (Kind::Channels, Some(p @ ("combined" | "rx" | "tx"))) => Part::Channels(p),
        (Kind::Offload, Some(f)) if plain_name(f) => Part::Offload(f),
        (Kind::Ring, Some(p @ ("rx" | "tx"))) => Part::Ring(p),
        (Kind::Mtu, None) => Part::Mtu,
        _ => {
            return Err(format!(
                "{} target {target:?} is not {}",
                kind.as_str(),
                match kind {
                    Kind::Channels => "IF/combined, IF/rx or IF/tx",
                    Kind::Offload => "IF/<feature>",
                    Kind::Ring => "IF/rx or IF/tx",
                    _ => "an interface name",
                }
            ))
        }
    };
    if !plain_name(iface) || iface.len() > IFNAME_MAX {
        return Err(format!("{target:?} does not name an interface"));
    }
    Ok((iface, part))
}

/// The current value of a NIC setting as a string.
fn value(host: &Host, iface: &str, part: &Part) -> Result<Option<String>, io::Error> {
    Ok(match part {
        Part::Channels(which) => {
            let c = host.ethtool()?.channels(iface)?;
            Some(
                match *which {
                    "combined" => c.combined,
                    "rx" => c.rx,
                    _ => c.tx,
                }
                .to_string(),
            )
        }
        Part::Offload(name) => {
            let f = host.ethtool()?.features(iface)?;
            f.known
                .iter()
                .any(|k| k == name)
                .then(|| on_off(f.active.contains(*name)).to_string())
        }
        Part::Ring(which) => {
            let r = host.ethtool()?.rings(iface)?;
            Some(if *which == "rx" { r.rx } else { r.tx }.to_string())
        }
        Part::Mtu => Some(host.rtnetlink()?.mtu(iface)?.to_string()),
    })
}

/// Reads a NIC setting: `Missing` when the interface (or, for an offload, the feature) does not
/// exist; `Unreadable` with the driver's answer when it cannot be read (veth rings).
pub fn read(host: &Host, kind: Kind, target: &str) -> Reading {
    let (iface, part) = match parse_target(kind, target) {
        Ok(t) => t,
        Err(e) => return Reading::Unreadable(e),
    };
    match value(host, iface, &part) {
        Ok(Some(v)) => Reading::Value(v),
        Ok(None) => Reading::Missing(format!(
            "{iface} has no offload feature {:?}: the kernel does not know the name",
            target.split_once('/').map_or(target, |(_, f)| f)
        )),
        Err(e) if errno(&e) == Some(libc::ENODEV) => {
            Reading::Missing(format!("no such interface on this host: {iface}"))
        }
        Err(e) => Reading::Unreadable(format!("cannot read {} {target}: {e}", kind.as_str())),
    }
}

/// A count or size from a value.
fn number(value: &str) -> io::Result<u32> {
    value
        .trim()
        .parse()
        .map_err(|_| invalid(format!("{value:?} is not a count")))
}

/// Writes a NIC setting through the host's ports.
pub fn write(host: &Host, kind: Kind, target: &str, value: &str) -> io::Result<()> {
    let (iface, part) = parse_target(kind, target).map_err(invalid)?;
    match part {
        Part::Channels(which) => {
            let n = Some(number(value)?);
            let mut counts = ChannelCounts::default();
            match which {
                "combined" => counts.combined = n,
                "rx" => counts.rx = n,
                _ => counts.tx = n,
            }
            host.ethtool()?.set_channels(iface, &counts)
        }
        Part::Offload(name) => {
            let on = parse_on_off(value)
                .ok_or_else(|| invalid(format!("{value:?} is not on or off")))?;
            host.ethtool()?
                .set_features(iface, &[(name.to_string(), on)].into())
        }
        Part::Ring(which) => {
            let n = Some(number(value)?);
            let sizes = if which == "rx" {
                RingSizes { rx: n, tx: None }
            } else {
                RingSizes { rx: None, tx: n }
            };
            host.ethtool()?.set_rings(iface, &sizes)
        }
        Part::Mtu => host.rtnetlink()?.set_mtu(iface, number(value)?),
    }
}

/// What discovery read of one interface's NIC, for the plan step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicFacts {
    /// Its offload features, or why they could not be read.
    pub features: Result<Features, String>,
    /// Its channel counts, or why they could not be read.
    pub channels: Result<ChannelInfo, String>,
}

impl NicFacts {
    /// Reads the NIC facts of `iface` through `ethtool`.
    pub fn read(ethtool: &dyn Ethtool, iface: &str) -> Self {
        NicFacts {
            features: ethtool.features(iface).map_err(|e| e.to_string()),
            channels: ethtool.channels(iface).map_err(|e| e.to_string()),
        }
    }

    /// The facts of a host without the ethtool port: neither could be read, for `reason`.
    pub fn unreadable(reason: &str) -> Self {
        NicFacts {
            features: Err(reason.to_string()),
            channels: Err(reason.to_string()),
        }
    }
}

/// The pure plan step of an entry's `channels`, `offloads`, `rings` and `mtu` for one interface:
/// a setting per asked value; offload aliases become the kernel's names. An unknown feature
/// name, or a change of a `[fixed]` one, is refused.
pub fn desired(field: &str, iface: &str, entry: &InterfaceTuning, nic: Option<&NicFacts>) -> Wants {
    let mut wants = Wants::default();
    if let Some(c) = &entry.channels {
        for (which, n) in [("combined", c.combined), ("rx", c.rx), ("tx", c.tx)] {
            if let Some(n) = n {
                wants.set(
                    Setting::new(Kind::Channels, format!("{iface}/{which}")),
                    n.to_string(),
                );
            }
        }
    }
    if !entry.offloads.is_empty() {
        match nic.map(|n| &n.features) {
            Some(Ok(features)) => {
                for (name, on) in &entry.offloads {
                    offload(&mut wants, field, iface, name, *on, features);
                }
            }
            Some(Err(e)) => wants.refuse(
                Kind::Offload.as_str(),
                iface,
                format!("{field}.offloads: cannot read the offload features of {iface}: {e}"),
            ),
            None => wants.refuse(
                Kind::Offload.as_str(),
                iface,
                format!("{field}.offloads: the offload features of {iface} were not read"),
            ),
        }
    }
    if let Some(r) = &entry.rings {
        for (which, n) in [("rx", r.rx), ("tx", r.tx)] {
            if let Some(n) = n {
                wants.set(
                    Setting::new(Kind::Ring, format!("{iface}/{which}")),
                    n.to_string(),
                );
            }
        }
    }
    if let Some(mtu) = entry.mtu {
        wants.set(Setting::new(Kind::Mtu, iface), mtu.to_string());
    }
    wants
}

/// The settings of one `offloads` entry: every changeable kernel feature it names; a fixed one
/// that already has the asked state is kept (nothing to change), any other fixed one refused.
fn offload(wants: &mut Wants, field: &str, iface: &str, name: &str, on: bool, f: &Features) {
    let names = kernel_names(name, &f.known);
    if names.is_empty() {
        wants.refuse(
            Kind::Offload.as_str(),
            format!("{iface}/{name}"),
            format!(
                "{field}.offloads: {name:?} is not an offload feature this kernel knows (use a \
                 kernel feature name as `ethtool -k {iface}` lists them, or an alias: {})",
                ALIASES
                    .iter()
                    .map(|(short, _, _)| *short)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        return;
    }
    let changeable: Vec<&String> = names.iter().filter(|n| f.changeable.contains(*n)).collect();
    let stuck: Vec<&String> = names
        .iter()
        .filter(|n| !f.changeable.contains(*n) && f.active.contains(*n) != on)
        .collect();
    // An alias sets what it can, as `ethtool -K` does; only when it can set nothing, or a
    // kernel name is fixed in the other state, is it refused.
    let alias = names.len() > 1 || names[0] != name;
    if (!alias && !stuck.is_empty()) || (alias && changeable.is_empty() && !stuck.is_empty()) {
        let list: Vec<&str> = stuck.iter().map(|s| s.as_str()).collect();
        wants.refuse(
            Kind::Offload.as_str(),
            format!("{iface}/{name}"),
            format!(
                "{field}.offloads: {} of {iface} is fixed {} ([fixed] in `ethtool -k`): the \
                 driver does not let it change",
                list.join(", "),
                on_off(!on)
            ),
        );
        return;
    }
    for n in names
        .iter()
        .filter(|n| f.changeable.contains(*n) || f.active.contains(*n) == on)
    {
        wants.set(
            Setting::new(Kind::Offload, format!("{iface}/{n}")),
            on_off(on),
        );
    }
}

/// The rx and tx queue counts of an interface once `channels` are set: combined channels serve
/// both directions, rx/tx-only ones one each (unset counts keep their current value).
pub fn queues_after(current: &ChannelInfo, channels: &hoststack_crds::Channels) -> (u32, u32) {
    let combined = channels.combined.unwrap_or(current.combined);
    let rx = channels.rx.unwrap_or(current.rx);
    let tx = channels.tx.unwrap_or(current.tx);
    (combined + rx, combined + tx)
}

/// The interfaces with the queue counts they will have once the channel counts `config` asks
/// for are set (interfaces whose channels could not be read keep their counts).
pub fn interfaces_after(
    config: &NodeConfig,
    interfaces: &[InterfaceFacts],
    nic: &BTreeMap<String, NicFacts>,
) -> Vec<InterfaceFacts> {
    let mut out = interfaces.to_vec();
    for entry in &config.interfaces {
        let Some(channels) = &entry.channels else {
            continue;
        };
        let names: BTreeSet<&str> = matching::select(&entry.match_, interfaces)
            .into_iter()
            .map(|i| i.name.as_str())
            .collect();
        for iface in out.iter_mut().filter(|i| names.contains(i.name.as_str())) {
            if let Some(Ok(current)) = nic.get(&iface.name).map(|n| &n.channels) {
                let (rx, tx) = queues_after(current, channels);
                iface.rx_queues = rx;
                iface.tx_queues = tx;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use hoststack_crds::{Channels, InterfaceMatch, Rings};

    use super::*;
    use crate::host::ethtool::RingInfo;
    use crate::host::Roots;
    use crate::netlink::KernelError;

    fn known() -> Vec<String> {
        [
            "tx-scatter-gather",
            "tx-checksum-ipv4",
            "tx-checksum-ip-generic",
            "tx-tcp-segmentation",
            "tx-tcp-ecn-segmentation",
            "tx-tcp-mangleid-segmentation",
            "tx-tcp6-segmentation",
            "tx-generic-segmentation",
            "rx-gro",
            "rx-lro",
            "rx-checksum",
            "tx-udp-segmentation",
        ]
        .map(String::from)
        .to_vec()
    }

    /// A veth-like device: LRO and IPv4 checksum fixed off, the rest changeable; GRO off.
    fn veth() -> Features {
        let known = known();
        let fixed = ["rx-lro", "tx-checksum-ipv4"];
        Features {
            changeable: known
                .iter()
                .filter(|n| !fixed.contains(&n.as_str()))
                .cloned()
                .collect(),
            active: known
                .iter()
                .filter(|n| !fixed.contains(&n.as_str()) && *n != "rx-gro")
                .cloned()
                .collect(),
            known,
        }
    }

    #[test]
    fn aliases_map_to_the_kernel_names() {
        let k = known();
        let table: &[(&str, &[&str])] = &[
            (
                "tso",
                &[
                    "tx-tcp-segmentation",
                    "tx-tcp-ecn-segmentation",
                    "tx-tcp-mangleid-segmentation",
                    "tx-tcp6-segmentation",
                ],
            ),
            (
                "tcp-segmentation-offload",
                &[
                    "tx-tcp-segmentation",
                    "tx-tcp-ecn-segmentation",
                    "tx-tcp-mangleid-segmentation",
                    "tx-tcp6-segmentation",
                ],
            ),
            ("gso", &["tx-generic-segmentation"]),
            ("gro", &["rx-gro"]),
            ("generic-receive-offload", &["rx-gro"]),
            ("lro", &["rx-lro"]),
            ("rx", &["rx-checksum"]),
            ("rx-checksumming", &["rx-checksum"]),
            ("tx", &["tx-checksum-ipv4", "tx-checksum-ip-generic"]),
            ("sg", &["tx-scatter-gather"]),
            ("rx-gro", &["rx-gro"]),
            ("tx-udp-segmentation", &["tx-udp-segmentation"]),
            ("no-such-feature", &[]),
            ("rxhash", &[]),
        ];
        for (name, names) in table {
            assert_eq!(kernel_names(name, &k), *names, "{name}");
        }
    }

    /// The ethtool of a host with one veth, `v0`, whose rings cannot be read or set (veth has
    /// no ring parameters). The readings test changes nothing.
    #[derive(Debug)]
    struct OneVeth;

    /// What a veth answers about rings.
    fn no_rings() -> io::Error {
        KernelError {
            errno: libc::EOPNOTSUPP,
            message: None,
        }
        .into_io()
    }

    impl Ethtool for OneVeth {
        fn channels(&self, _: &str) -> io::Result<ChannelInfo> {
            unreachable!("the readings test reads no channels")
        }
        fn set_channels(&self, _: &str, _: &ChannelCounts) -> io::Result<()> {
            unreachable!("the readings test changes nothing")
        }
        fn rings(&self, _: &str) -> io::Result<RingInfo> {
            Err(no_rings())
        }
        fn set_rings(&self, _: &str, _: &RingSizes) -> io::Result<()> {
            Err(no_rings())
        }
        fn features(&self, iface: &str) -> io::Result<Features> {
            if iface != "v0" {
                return Err(io::Error::from_raw_os_error(libc::ENODEV));
            }
            Ok(Features {
                active: ["rx-gro".to_string()].into(),
                ..veth()
            })
        }
        fn set_features(&self, _: &str, _: &BTreeMap<String, bool>) -> io::Result<()> {
            unreachable!("the readings test changes nothing")
        }
    }

    #[test]
    fn readings() {
        let host = Host::at(Roots::new("/proc".as_ref(), "/sys".as_ref()))
            .with_ethtool(std::sync::Arc::new(OneVeth));
        let read = |kind, target| super::read(&host, kind, target);
        assert_eq!(
            read(Kind::Offload, "v0/rx-gro"),
            Reading::Value("on".into())
        );
        assert_eq!(
            read(Kind::Offload, "v0/rx-lro"),
            Reading::Value("off".into())
        );
        assert_eq!(
            read(Kind::Offload, "v0/turbo"),
            Reading::Missing(
                "v0 has no offload feature \"turbo\": the kernel does not know the name".into()
            )
        );
        assert_eq!(
            read(Kind::Offload, "v9/rx-gro"),
            Reading::Missing("no such interface on this host: v9".into())
        );
        assert_eq!(
            read(Kind::Ring, "v0/rx"),
            Reading::Unreadable(
                "cannot read ring v0/rx: Operation not supported (os error 95)".into()
            )
        );
        assert!(matches!(
            read(Kind::Ring, "v0/combined"),
            Reading::Unreadable(_)
        ));
        assert!(write(&host, Kind::Offload, "v0/rx-gro", "maybe")
            .is_err_and(|e| e.kind() == io::ErrorKind::InvalidInput));
    }

    #[test]
    fn values_compare_as_on_off_and_numbers() {
        assert!(same_value(Kind::Offload, "on", "ON"));
        assert!(same_value(Kind::Offload, "true", "on"));
        assert!(!same_value(Kind::Offload, "on", "off"));
        assert!(same_value(Kind::Mtu, "1500", " 1500\n"));
        assert!(same_value(Kind::Channels, "04", "4"));
        assert!(!same_value(Kind::Ring, "256", "512"));
    }

    #[test]
    fn targets() {
        let ok: &[(Kind, &str)] = &[
            (Kind::Channels, "eth0/combined"),
            (Kind::Channels, "eth0/rx"),
            (Kind::Offload, "eth0/rx-gro"),
            (Kind::Ring, "eth0/tx"),
            (Kind::Mtu, "eth0"),
        ];
        for (kind, t) in ok {
            assert!(parse_target(*kind, t).is_ok(), "{kind:?} {t}");
        }
        let bad: &[(Kind, &str)] = &[
            (Kind::Channels, "eth0/other"),
            (Kind::Channels, "eth0"),
            (Kind::Ring, "eth0/combined"),
            (Kind::Mtu, "eth0/rx"),
            (Kind::Offload, "eth0/"),
            (Kind::Mtu, "../x"),
            (Kind::Mtu, "a-very-long-interface-name"),
        ];
        for (kind, t) in bad {
            assert!(parse_target(*kind, t).is_err(), "{kind:?} {t}");
        }
    }

    fn plan(entry: &InterfaceTuning, features: Result<Features, String>) -> Wants {
        let facts = NicFacts {
            features,
            channels: Ok(ChannelInfo::default()),
        };
        desired("interfaces[0]", "veth0", entry, Some(&facts))
    }

    fn settings(w: &Wants) -> Vec<String> {
        w.settings.iter().map(|(s, v)| format!("{s}={v}")).collect()
    }

    #[test]
    fn channels_rings_and_mtu_plan() {
        let entry = InterfaceTuning {
            channels: Some(Channels {
                combined: None,
                rx: Some(2),
                tx: Some(3),
            }),
            rings: Some(Rings {
                rx: Some(512),
                tx: None,
            }),
            mtu: Some(9000),
            ..InterfaceTuning::default()
        };
        let w = plan(&entry, Ok(veth()));
        assert!(w.refused.is_empty(), "{w:?}");
        assert_eq!(
            settings(&w),
            [
                "channels veth0/rx=2",
                "channels veth0/tx=3",
                "ring veth0/rx=512",
                "mtu veth0=9000"
            ]
        );
        // Without readable features, the offload-free parts still plan.
        assert_eq!(plan(&entry, Err("EOPNOTSUPP".into())).settings.len(), 4);
    }

    #[test]
    fn offloads_plan() {
        let entry = |pairs: &[(&str, bool)]| InterfaceTuning {
            offloads: pairs.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
            ..InterfaceTuning::default()
        };
        // Aliases and kernel names; a fixed feature asked for the state it has is kept.
        let w = plan(
            &entry(&[("tso", false), ("gro", true), ("lro", false), ("tx", false)]),
            Ok(veth()),
        );
        assert!(w.refused.is_empty(), "{w:?}");
        assert_eq!(
            settings(&w),
            [
                "offload veth0/rx-gro=on",
                "offload veth0/rx-lro=off",
                "offload veth0/tx-tcp-segmentation=off",
                "offload veth0/tx-tcp-ecn-segmentation=off",
                "offload veth0/tx-tcp-mangleid-segmentation=off",
                "offload veth0/tx-tcp6-segmentation=off",
                "offload veth0/tx-checksum-ipv4=off",
                "offload veth0/tx-checksum-ip-generic=off",
            ]
        );
        // A fixed feature asked to change, and an unknown name: refused, nothing set.
        let w = plan(&entry(&[("lro", true), ("bogus", true)]), Ok(veth()));
        assert!(w.settings.is_empty(), "{w:?}");
        let messages: Vec<&str> = w.refused.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(messages.len(), 2);
        assert!(
            messages[0].contains("\"bogus\" is not an offload feature this kernel knows"),
            "{messages:?}"
        );
        assert!(
            messages[1].contains("rx-lro of veth0 is fixed off ([fixed] in `ethtool -k`)"),
            "{messages:?}"
        );
        // A kernel name that is fixed.
        let w = plan(&entry(&[("tx-checksum-ipv4", true)]), Ok(veth()));
        assert_eq!(w.refused.len(), 1, "{w:?}");
        // An alias with one changeable member sets that one only.
        let w = plan(&entry(&[("tx", true)]), Ok(veth()));
        assert_eq!(settings(&w), ["offload veth0/tx-checksum-ip-generic=on"]);
        // Unreadable features refuse the offloads with the reason.
        let w = plan(
            &entry(&[("gro", true)]),
            Err("Operation not supported".into()),
        );
        assert!(
            w.refused[0].message.contains("Operation not supported"),
            "{w:?}"
        );
    }

    #[test]
    fn interfaces_get_the_queue_counts_of_their_new_channels() {
        let iface = |name: &str| InterfaceFacts {
            name: name.into(),
            rx_queues: 4,
            tx_queues: 4,
            ..InterfaceFacts::default()
        };
        let veth = ChannelInfo {
            rx: 4,
            tx: 4,
            rx_max: 4,
            tx_max: 4,
            ..ChannelInfo::default()
        };
        let nic: BTreeMap<String, NicFacts> = [
            (
                "data0".to_string(),
                NicFacts {
                    features: Ok(Features::default()),
                    channels: Ok(veth),
                },
            ),
            (
                "data1".to_string(),
                NicFacts {
                    features: Ok(Features::default()),
                    channels: Err("Operation not supported".into()),
                },
            ),
        ]
        .into();
        let mut config = NodeConfig::default();
        config.interfaces.push(InterfaceTuning {
            match_: InterfaceMatch {
                name: Some("data*".into()),
                ..InterfaceMatch::default()
            },
            channels: Some(Channels {
                combined: None,
                rx: Some(2),
                tx: Some(1),
            }),
            ..InterfaceTuning::default()
        });
        let after = interfaces_after(
            &config,
            &[iface("data0"), iface("data1"), iface("eth0")],
            &nic,
        );
        let counts: Vec<(&str, u32, u32)> = after
            .iter()
            .map(|i| (i.name.as_str(), i.rx_queues, i.tx_queues))
            .collect();
        assert_eq!(counts, [("data0", 2, 1), ("data1", 4, 4), ("eth0", 4, 4)]);
    }

    #[test]
    fn queue_counts_after_a_channel_change() {
        let veth = ChannelInfo {
            rx: 4,
            tx: 4,
            rx_max: 4,
            tx_max: 4,
            ..ChannelInfo::default()
        };
        let ask = |combined, rx, tx| Channels { combined, rx, tx };
        assert_eq!(queues_after(&veth, &ask(None, Some(2), None)), (2, 4));
        let nic = ChannelInfo {
            combined: 8,
            combined_max: 16,
            ..ChannelInfo::default()
        };
        assert_eq!(queues_after(&nic, &ask(Some(4), None, None)), (4, 4));
    }
}
