//! The DPDK binding applier: which driver a PCI device is bound to, changed through sysfs.
//!
//! The target is `ADDR/IF/NETDRIVER` (`0000:00:03.0/eth1/virtio_net`): the PCI address, and the
//! interface and network driver it had when it was matched, so that the binding still matches
//! its interface after the netdev has gone (a device bound to vfio-pci has none). The value is
//! `driver=D` (`none` when unbound), plus ` override=O` when the device's `driver_override` is
//! set, plus the settings of the interface's netdev that a rebind loses when the device has
//! one: ` up=on|off mtu=N combined=N rx=N tx=N` (each only when it could be read; channel
//! types the driver does not have are left out). A value without them (an older journal's
//! `driver=virtio-pci`) still binds, it just restores nothing.
//!
//! Setting a value writes `driver_override` (O, or a newline to clear it), unbinds the device
//! from its current driver (`<dev>/driver/unbind`) and asks the bus to probe it again
//! (`<sys>/bus/pci/drivers_probe`): with the override set the probe binds that driver, with it
//! cleared the kernel picks the device's own driver again. Then the netdev settings the value
//! carries are put back on the interface (through netlink, only those that differ): the kernel
//! creates a new netdev on a rebind, down, with the driver's default channels and MTU, so
//! reverting a binding restores the interface as it was. Binding is refused for the interface
//! that carries the default route or the route to the API server, unless the spec allows it.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use hoststack_crds::{DpdkBinding, DpdkDriver, InterfaceFacts};

use super::Applier;
use crate::host::ethtool::{ChannelCounts, ChannelInfo};
use crate::host::{Host, Port, Roots};
use crate::model::{invalid, Kind, Reading, Setting, Wants};
use crate::sysfs::{dir_names, is_pci_address, link_name, plain_name};

/// The applier of [`Kind::PciDriver`].
#[derive(Clone, Copy, Debug)]
pub struct PciDriver;

impl Applier for PciDriver {
    /// The binding itself needs only sysfs writes; the netdev settings a value carries are read
    /// through the ethtool and rtnetlink ports where the host has them (see [`NetdevSettings`]).
    fn ports(&self) -> &'static [Port] {
        &[Port::Files]
    }

    fn read(&self, host: &Host, target: &str) -> Reading {
        read(host, target)
    }

    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()> {
        write(host, target, value)
    }
}

/// The driver name of a DPDK driver choice.
pub fn driver_name(driver: DpdkDriver) -> &'static str {
    match driver {
        DpdkDriver::VfioPci => "vfio-pci",
    }
}

/// The target of a device: `ADDR/IF/NETDRIVER` (`-` for no driver).
pub fn target(pci: &str, iface: &str, netdriver: Option<&str>) -> String {
    format!("{pci}/{iface}/{}", netdriver.unwrap_or("-"))
}

/// The parts of a target: PCI address, interface, network driver.
pub fn parse_target(target: &str) -> Option<(&str, &str, Option<&str>)> {
    let mut parts = target.splitn(3, '/');
    let (pci, iface, driver) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = is_pci_address(pci) && plain_name(iface) && plain_name(driver);
    ok.then_some((pci, iface, (driver != "-").then_some(driver)))
}

/// The value of a device bound to `driver` with `override_` in driver_override.
pub fn value(driver: &str, override_: Option<&str>) -> String {
    Binding {
        driver,
        override_,
        netdev: NetdevSettings::default(),
    }
    .to_string()
}

/// The settings of a device's netdev that a rebind loses (the new netdev comes up down, with
/// the driver's default channel counts and MTU); `None` for one not recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetdevSettings {
    /// Administratively up (`IFF_UP`).
    pub up: Option<bool>,
    /// MTU.
    pub mtu: Option<u32>,
    /// Combined channels.
    pub combined: Option<u32>,
    /// Receive-only channels.
    pub rx: Option<u32>,
    /// Transmit-only channels.
    pub tx: Option<u32>,
}

impl NetdevSettings {
    /// Reads the settings of `iface` through the host's ethtool and rtnetlink ports; one that
    /// cannot be read (or that the host has no port for) is not recorded, and channel types the
    /// driver does not have (maximum 0) are left out.
    pub fn read(host: &Host, iface: &str) -> Self {
        let channels = host.ethtool().ok().and_then(|e| e.channels(iface).ok());
        let links = host.rtnetlink().ok();
        let count = |max: fn(&ChannelInfo) -> u32, now: fn(&ChannelInfo) -> u32| {
            channels.filter(|c| max(c) > 0).map(|c| now(&c))
        };
        NetdevSettings {
            up: links.and_then(|l| l.link_up(iface).ok()),
            mtu: links.and_then(|l| l.mtu(iface).ok()),
            combined: count(|c| c.combined_max, |c| c.combined),
            rx: count(|c| c.rx_max, |c| c.rx),
            tx: count(|c| c.tx_max, |c| c.tx),
        }
    }

    /// The settings of `self` that `current` does not have already: what to set to restore it.
    pub fn changes_from(&self, current: &NetdevSettings) -> NetdevSettings {
        fn differs<T: PartialEq + Copy>(want: Option<T>, now: Option<T>) -> Option<T> {
            want.filter(|w| now != Some(*w))
        }
        NetdevSettings {
            up: differs(self.up, current.up),
            mtu: differs(self.mtu, current.mtu),
            combined: differs(self.combined, current.combined),
            rx: differs(self.rx, current.rx),
            tx: differs(self.tx, current.tx),
        }
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        *self == NetdevSettings::default()
    }

    /// Sets these settings on `iface`: MTU, then channels, then the link state last.
    fn apply(&self, host: &Host, iface: &str) -> io::Result<()> {
        if let Some(mtu) = self.mtu {
            host.rtnetlink()?.set_mtu(iface, mtu)?;
        }
        let counts = ChannelCounts {
            rx: self.rx,
            tx: self.tx,
            combined: self.combined,
        };
        if counts != ChannelCounts::default() {
            host.ethtool()?.set_channels(iface, &counts)?;
        }
        if let Some(up) = self.up {
            host.rtnetlink()?.set_link_up(iface, up)?;
        }
        Ok(())
    }
}

/// A binding value: driver, driver_override, and the netdev settings to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Binding<'a> {
    driver: &'a str,
    override_: Option<&'a str>,
    netdev: NetdevSettings,
}

impl fmt::Display for Binding<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "driver={}", self.driver)?;
        if let Some(o) = self.override_ {
            write!(f, " override={o}")?;
        }
        let n = &self.netdev;
        if let Some(up) = n.up {
            write!(f, " up={}", super::nic::on_off(up))?;
        }
        for (key, count) in [
            ("mtu", n.mtu),
            ("combined", n.combined),
            ("rx", n.rx),
            ("tx", n.tx),
        ] {
            if let Some(count) = count {
                write!(f, " {key}={count}")?;
            }
        }
        Ok(())
    }
}

/// The parts of a value (see the module doc): `driver=` first, then each other key at most
/// once, in any order.
fn parse_value(value: &str) -> Option<Binding<'_>> {
    let mut words = value.split_whitespace();
    let driver = words.next()?.strip_prefix("driver=")?;
    let mut binding = Binding {
        driver,
        override_: None,
        netdev: NetdevSettings::default(),
    };
    for word in words {
        let (key, text) = word.split_once('=')?;
        let n = &mut binding.netdev;
        let count = || text.parse::<u32>().ok();
        let fresh = match key {
            "override" => binding.override_.replace(text).is_none(),
            "up" => {
                n.up.replace(match text {
                    "on" => true,
                    "off" => false,
                    _ => return None,
                })
                .is_none()
            }
            "mtu" => n.mtu.replace(count()?).is_none(),
            "combined" => n.combined.replace(count()?).is_none(),
            "rx" => n.rx.replace(count()?).is_none(),
            "tx" => n.tx.replace(count()?).is_none(),
            _ => return None,
        };
        if !fresh {
            return None;
        }
    }
    (plain_name(driver) && binding.override_.is_none_or(plain_name)).then_some(binding)
}

/// Whether the netdev `iface` sits on the PCI device `dev`: `<dev>/net/IF`, or
/// `<dev>/<bus device>/net/IF` for a netdev on a virtio device of the PCI device.
fn netdev_on(dev: &Path, iface: &str) -> bool {
    dev.join("net").join(iface).is_dir()
        || dir_names(dev)
            .iter()
            .any(|child| dev.join(child).join("net").join(iface).is_dir())
}

/// The sysfs directory of a target's device.
fn device_dir(roots: &Roots, target: &str) -> Result<(PathBuf, String), String> {
    let (pci, _, _) = parse_target(target)
        .ok_or_else(|| format!("PCI target {target:?} is not ADDR/IF/DRIVER"))?;
    Ok((
        roots.sys_root.join("bus/pci/devices").join(pci),
        pci.to_string(),
    ))
}

/// Reads a device's driver and override, and the settings of its interface's netdev when it
/// has one.
pub fn read(host: &Host, target: &str) -> Reading {
    let (dev, pci) = match device_dir(host.roots(), target) {
        Ok(d) => d,
        Err(e) => return Reading::Unreadable(e),
    };
    if !dev.is_dir() {
        return Reading::Missing(format!("no PCI device {pci} ({})", dev.display()));
    }
    let driver = link_name(&dev.join("driver")).unwrap_or_else(|| "none".into());
    let override_ = fs::read_to_string(dev.join("driver_override"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s != "(null)");
    let netdev = match parse_target(target) {
        Some((_, iface, _)) if netdev_on(&dev, iface) => NetdevSettings::read(host, iface),
        _ => NetdevSettings::default(),
    };
    let binding = Binding {
        driver: &driver,
        override_: override_.as_deref(),
        netdev,
    };
    Reading::Value(binding.to_string())
}

/// Binds a device as `value` says, then restores the netdev settings it carries (see the
/// module doc).
pub fn write(host: &Host, target: &str, value: &str) -> io::Result<()> {
    let roots = host.roots();
    let files = host.files()?;
    let (dev, pci) = device_dir(roots, target).map_err(invalid)?;
    let binding = parse_value(value).ok_or_else(|| {
        invalid(format!(
            "{value:?} is not driver=D [override=O] [up=on|off] [mtu=N] [combined=N] [rx=N] [tx=N]"
        ))
    })?;
    let driver = binding.driver;
    let current = link_name(&dev.join("driver"));
    files.write(
        &dev.join("driver_override"),
        format!("{}\n", binding.override_.unwrap_or("")).as_bytes(),
    )?;
    if current.as_deref() != Some(driver) {
        if current.is_some() {
            files.write(&dev.join("driver/unbind"), pci.as_bytes())?;
            #[cfg(feature = "test-hooks")]
            pause_after_unbind();
        }
        if driver != "none" {
            files.write(
                &roots.sys_root.join("bus/pci/drivers_probe"),
                pci.as_bytes(),
            )?;
        }
    }
    if binding.netdev.is_empty() {
        return Ok(());
    }
    let (_, iface, _) = parse_target(target).ok_or_else(|| invalid(target.to_string()))?;
    if !netdev_on(&dev, iface) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{pci} is bound to {driver} but has no netdev {iface} to restore its settings on"
            ),
        ));
    }
    binding
        .netdev
        .changes_from(&NetdevSettings::read(host, iface))
        .apply(host, iface)
}

/// Environment variable of the kill tests' hook: a pause (e.g. `30s`) between unbinding a
/// device and probing it again, the one moment a device has no driver, so that a test can
/// SIGKILL the agent there and prove the journal finishes or undoes the bind after a restart.
/// Only a build with the `test-hooks` feature (the lab's) reads it.
#[cfg(feature = "test-hooks")]
pub const UNBIND_PAUSE_ENV: &str = "HOSTSTACK_DPDK_UNBIND_PAUSE";

/// Sleeps for [`UNBIND_PAUSE_ENV`] when it is set.
#[cfg(feature = "test-hooks")]
fn pause_after_unbind() {
    let pause = std::env::var(UNBIND_PAUSE_ENV)
        .ok()
        .and_then(|v| crate::duration::parse_duration(&v).ok());
    if let Some(pause) = pause {
        std::thread::sleep(pause);
    }
}

/// The IOMMU group of a PCI device, from `<sys>/bus/pci/devices/ADDR/iommu_group`.
pub fn iommu_group(roots: &Roots, pci: &str) -> Option<String> {
    link_name(
        &roots
            .sys_root
            .join("bus/pci/devices")
            .join(pci)
            .join("iommu_group"),
    )
}

/// The PCI network devices (class `0x02....`) under `<sys>/bus/pci/devices` that no interface
/// of `interfaces` sits on: each as an interface named by its PCI address, with its PCI driver.
pub fn unattached_devices(roots: &Roots, interfaces: &[InterfaceFacts]) -> Vec<InterfaceFacts> {
    let devices = roots.sys_root.join("bus/pci/devices");
    dir_names(&devices)
        .into_iter()
        .filter(|pci| is_pci_address(pci))
        .filter(|pci| {
            !interfaces
                .iter()
                .any(|i| i.pci_address.as_deref() == Some(pci))
        })
        .filter(|pci| {
            fs::read_to_string(devices.join(pci).join("class"))
                .is_ok_and(|c| c.trim().starts_with("0x02"))
        })
        .map(|pci| InterfaceFacts {
            driver: link_name(&devices.join(&pci).join("driver")),
            name: pci.clone(),
            pci_address: Some(pci),
            ..InterfaceFacts::default()
        })
        .collect()
}

/// A status note on a bound device: its IOMMU group and whether `/dev/vfio/N` exists.
pub fn note(roots: &Roots, target: &str) -> Option<String> {
    let (pci, _, _) = parse_target(target)?;
    Some(match iommu_group(roots, pci) {
        Some(group) => {
            let dev = roots.host_path(&format!("/dev/vfio/{group}"));
            let present = if dev.exists() { "present" } else { "absent" };
            format!("IOMMU group {group}; /dev/vfio/{group} {present}")
        }
        None => "no IOMMU group".into(),
    })
}

/// Parses `/proc/net/route`: (interface, destination, mask) of each route that is up.
pub fn routes_v4(text: &str) -> Vec<(String, Ipv4Addr, Ipv4Addr)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let hex = |s: &str| u32::from_str_radix(s, 16).ok();
            let (dest, flags, mask) = (hex(f.get(1)?)?, hex(f.get(3)?)?, hex(f.get(7)?)?);
            // Little-endian in the file; RTF_UP set, RTF_REJECT not.
            (flags & 0x1 != 0 && flags & 0x200 == 0).then(|| {
                (
                    f[0].to_string(),
                    Ipv4Addr::from(dest.swap_bytes()),
                    Ipv4Addr::from(mask.swap_bytes()),
                )
            })
        })
        .collect()
}

/// Parses `/proc/net/ipv6_route`: (interface, destination, prefix length) of each route that is
/// up.
pub fn routes_v6(text: &str) -> Vec<(String, Ipv6Addr, u8)> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let dest = u128::from_str_radix(f.first()?, 16).ok()?;
            let plen = u8::from_str_radix(f.get(1)?, 16).ok()?;
            let flags = u32::from_str_radix(f.get(8)?, 16).ok()?;
            let iface = f.get(9)?;
            (flags & 0x1 != 0 && flags & 0x200 == 0 && *iface != "lo")
                .then(|| (iface.to_string(), Ipv6Addr::from(dest), plen))
        })
        .collect()
}

/// The interfaces that must not be bound away, each with the reason: the one of the default
/// route, and the one of the most specific route to the API server.
pub fn management_interfaces(
    route: &str,
    ipv6_route: &str,
    api_server: Option<IpAddr>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let v4 = routes_v4(route);
    let v6 = routes_v6(ipv6_route);
    for (iface, dest, mask) in &v4 {
        if dest.is_unspecified() && mask.is_unspecified() {
            out.entry(iface.clone())
                .or_insert_with(|| "it carries the default route".into());
        }
    }
    for (iface, dest, plen) in &v6 {
        if dest.is_unspecified() && *plen == 0 {
            out.entry(iface.clone())
                .or_insert_with(|| "it carries the default route".into());
        }
    }
    let best = match api_server {
        Some(IpAddr::V4(a)) => v4
            .iter()
            .filter(|(_, d, m)| u32::from(a) & u32::from(*m) == u32::from(*d))
            .max_by_key(|(_, _, m)| u32::from(*m).count_ones())
            .map(|(i, _, _)| i.clone()),
        Some(IpAddr::V6(a)) => v6
            .iter()
            .filter(|(_, d, p)| {
                let mask = if *p == 0 {
                    0
                } else {
                    u128::MAX << (128 - u32::from(*p))
                };
                u128::from(a) & mask == u128::from(*d)
            })
            .max_by_key(|(_, _, p)| *p)
            .map(|(i, _, _)| i.clone()),
        None => None,
    };
    if let (Some(iface), Some(addr)) = (best, api_server) {
        let reason = format!("it carries the route to the API server ({addr})");
        out.entry(iface)
            .and_modify(|r| *r = format!("{r} and {reason}"))
            .or_insert(reason);
    }
    out
}

/// What the DPDK plan step needs to know of the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Context {
    /// Whether the vfio-pci driver is there.
    pub vfio_available: bool,
    /// Interfaces that must not be bound away, with the reason.
    pub management: BTreeMap<String, String>,
    /// IOMMU group of each PCI device.
    pub iommu_groups: BTreeMap<String, String>,
}

/// The pure plan step of `dpdk` for one interface: bind its PCI device to the DPDK driver.
/// Refused: an interface without a PCI device, a management interface (unless allowed),
/// vfio-pci absent, a device without an IOMMU group.
pub fn desired(field: &str, iface: &InterfaceFacts, binding: &DpdkBinding, ctx: &Context) -> Wants {
    let mut wants = Wants::default();
    let kind = Kind::PciDriver.as_str();
    let Some(pci) = iface.pci_address.as_deref() else {
        wants.refuse(
            kind,
            &iface.name,
            format!("{field}: {} is not a PCI device", iface.name),
        );
        return wants;
    };
    if let Some(reason) = ctx.management.get(&iface.name) {
        if !binding.allow_management_interface {
            wants.refuse(
                kind,
                pci,
                format!(
                    "{field}: refusing to bind {} ({pci}) to {}: {reason}, and binding it away \
                     would cut the node off (set allowManagementInterface to override)",
                    iface.name,
                    driver_name(binding.driver)
                ),
            );
            return wants;
        }
    }
    let driver = driver_name(binding.driver);
    if !ctx.vfio_available {
        wants.refuse(
            kind,
            pci,
            format!("{field}: {driver} is not available on this host (load the vfio-pci module; no <sys>/bus/pci/drivers/vfio-pci)"),
        );
        return wants;
    }
    if !ctx.iommu_groups.contains_key(pci) {
        wants.refuse(
            kind,
            pci,
            format!("{field}: {pci} has no IOMMU group; {driver} needs an IOMMU (boot with intel_iommu=on or amd_iommu=on)"),
        );
        return wants;
    }
    wants.set(
        Setting::new(
            Kind::PciDriver,
            target(pci, &iface.name, iface.driver.as_deref()),
        ),
        value(driver, Some(driver)),
    );
    wants
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::host::ethtool::{Features, RingInfo, RingSizes};
    use crate::host::{Ethtool, Files, Rtnetlink};

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
eth1\t000012C6\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
eth2\t000112C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
eth3\t000212C6\t00000000\t0201\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";

    const ROUTE6: &str = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 eth4
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo
";

    #[test]
    fn routes() {
        let v4 = routes_v4(ROUTE);
        assert_eq!(v4.len(), 4, "the reject route is skipped");
        assert_eq!(
            v4[2],
            (
                "eth1".into(),
                Ipv4Addr::new(198, 18, 0, 0),
                Ipv4Addr::new(255, 255, 0, 0)
            )
        );
        let v6 = routes_v6(ROUTE6);
        assert_eq!(v6, vec![("eth4".into(), "fd00::".parse().expect("ip"), 64)]);
    }

    #[test]
    fn management_table() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
        type Case<'a> = (Option<IpAddr>, &'a [(&'a str, &'a str)]);
        let cases: &[Case] = &[
            (None, &[("eth0", "default route")]),
            // The most specific route wins: 198.18.1.0/24 on eth2 over 198.18.0.0/16 on eth1.
            (
                ip("198.18.1.7"),
                &[
                    ("eth0", "default route"),
                    ("eth2", "API server (198.18.1.7)"),
                ],
            ),
            (
                ip("198.18.9.1"),
                &[("eth0", "default route"), ("eth1", "API server")],
            ),
            // Only the default route leads there: eth0 carries both.
            (
                ip("10.0.0.1"),
                &[(
                    "eth0",
                    "default route and it carries the route to the API server",
                )],
            ),
            (
                ip("fd00::1"),
                &[("eth0", "default route"), ("eth4", "API server")],
            ),
        ];
        for (api, want) in cases {
            let got = management_interfaces(ROUTE, ROUTE6, *api);
            assert_eq!(got.len(), want.len(), "{api:?}: {got:?}");
            for (iface, text) in *want {
                assert!(
                    got.get(*iface).is_some_and(|r| r.contains(text)),
                    "{api:?}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn targets_and_values() {
        assert_eq!(
            target("0000:00:03.0", "eth1", Some("virtio_net")),
            "0000:00:03.0/eth1/virtio_net"
        );
        assert_eq!(
            parse_target("0000:00:03.0/eth1/-"),
            Some(("0000:00:03.0", "eth1", None))
        );
        for bad in [
            "0000:00:03.0/eth1",
            "../x/eth1/-",
            "0000:00:03.0/../-",
            "0000:00:03.0/e/a/b",
        ] {
            assert_eq!(parse_target(bad), None, "{bad}");
        }
        let plain = |driver, override_| Binding {
            driver,
            override_,
            netdev: NetdevSettings::default(),
        };
        assert_eq!(
            parse_value("driver=vfio-pci override=vfio-pci"),
            Some(plain("vfio-pci", Some("vfio-pci")))
        );
        assert_eq!(parse_value("driver=none"), Some(plain("none", None)));
        let full = Binding {
            driver: "virtio-pci",
            override_: None,
            netdev: NetdevSettings {
                up: Some(true),
                mtu: Some(9000),
                combined: Some(4),
                rx: None,
                tx: Some(0),
            },
        };
        let text = "driver=virtio-pci up=on mtu=9000 combined=4 tx=0";
        assert_eq!(full.to_string(), text);
        assert_eq!(parse_value(text), Some(full));
        assert_eq!(
            parse_value("driver=virtio-pci tx=0 combined=4 mtu=9000 up=on"),
            Some(full),
            "any order after driver="
        );
        for bad in [
            "",
            "vfio-pci",
            "driver=a b",
            "driver=../x",
            "driver=a override=b c",
            "override=b driver=a",
            "driver=a up=yes",
            "driver=a mtu=-1",
            "driver=a combined=4 combined=2",
            "driver=a speed=100",
        ] {
            assert_eq!(parse_value(bad), None, "{bad}");
        }
    }

    #[test]
    fn restoring_changes_only_what_differs() {
        let was = NetdevSettings {
            up: Some(true),
            mtu: Some(9000),
            combined: Some(4),
            rx: None,
            tx: None,
        };
        let fresh = NetdevSettings {
            up: Some(false),
            mtu: Some(9000),
            combined: Some(2),
            ..NetdevSettings::default()
        };
        assert_eq!(
            was.changes_from(&fresh),
            NetdevSettings {
                up: Some(true),
                combined: Some(4),
                ..NetdevSettings::default()
            }
        );
        assert!(was.changes_from(&was).is_empty());
        assert!(NetdevSettings::default().changes_from(&fresh).is_empty());
    }

    /// The netdev state of the fake NIC: up, MTU, combined channels.
    type Netdev = (bool, u32, u32);

    /// Fake files, ethtool and rtnetlink ports over a fake sysfs with one virtio-net device,
    /// 0000:00:03.0, whose netdev eth1 sits at `virtio1/net/eth1`: unbinding removes the netdev,
    /// probing creates a new one with the driver's defaults (down, MTU 1500, 2 of 4 combined
    /// channels), like the kernel. Binding touches no ring and no offload feature.
    #[derive(Debug)]
    struct FakeNic {
        sys: PathBuf,
        netdev: std::sync::Mutex<Option<Netdev>>,
    }

    const DEFAULTS: Netdev = (false, 1500, 2);

    impl FakeNic {
        fn new(sys: &Path, netdev: Netdev) -> Arc<Self> {
            let nic = FakeNic {
                sys: sys.to_path_buf(),
                netdev: std::sync::Mutex::new(None),
            };
            for d in ["virtio-pci", "vfio-pci"] {
                fs::create_dir_all(sys.join("bus/pci/drivers").join(d)).expect("driver dir");
            }
            fs::write(sys.join("bus/pci/drivers_probe"), "").expect("drivers_probe");
            fs::create_dir_all(nic.dev()).expect("device");
            fs::write(nic.dev().join("driver_override"), "(null)\n").expect("override");
            nic.bind("virtio-pci", netdev);
            Arc::new(nic)
        }

        fn dev(&self) -> PathBuf {
            self.sys.join("bus/pci/devices/0000:00:03.0")
        }

        fn bind(&self, driver: &str, netdev: Netdev) {
            let target = self.sys.join("bus/pci/drivers").join(driver);
            std::os::unix::fs::symlink(target, self.dev().join("driver")).expect("link");
            if driver == "virtio-pci" {
                fs::create_dir_all(self.dev().join("virtio1/net/eth1")).expect("netdev");
                *self.state() = Some(netdev);
            }
        }

        fn state(&self) -> std::sync::MutexGuard<'_, Option<Netdev>> {
            self.netdev.lock().expect("lock")
        }

        fn with<T>(&self, iface: &str, f: impl FnOnce(&mut Netdev) -> T) -> io::Result<T> {
            match (iface, self.state().as_mut()) {
                ("eth1", Some(n)) => Ok(f(n)),
                _ => Err(io::Error::from_raw_os_error(libc::ENODEV)),
            }
        }
    }

    impl Files for FakeNic {
        fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            let text = String::from_utf8_lossy(bytes).trim().to_string();
            match path.file_name().and_then(|n| n.to_str()) {
                Some("driver_override") => fs::write(path, format!("{text}\n")),
                Some("unbind") => {
                    fs::remove_file(self.dev().join("driver"))?;
                    let _ = fs::remove_dir_all(self.dev().join("virtio1"));
                    *self.state() = None;
                    Ok(())
                }
                Some("drivers_probe") => {
                    let over = fs::read_to_string(self.dev().join("driver_override"))?;
                    let over = over.trim();
                    self.bind(if over.is_empty() { "virtio-pci" } else { over }, DEFAULTS);
                    Ok(())
                }
                _ => Err(io::ErrorKind::Unsupported.into()),
            }
        }
    }

    impl Ethtool for FakeNic {
        fn channels(&self, iface: &str) -> io::Result<ChannelInfo> {
            self.with(iface, |n| ChannelInfo {
                combined: n.2,
                combined_max: 4,
                ..ChannelInfo::default()
            })
        }
        fn set_channels(&self, iface: &str, counts: &ChannelCounts) -> io::Result<()> {
            if counts.rx.is_some() || counts.tx.is_some() {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.with(iface, |n| n.2 = counts.combined.unwrap_or(n.2))
        }
        fn rings(&self, _: &str) -> io::Result<RingInfo> {
            unreachable!("binding touches no ring")
        }
        fn set_rings(&self, _: &str, _: &RingSizes) -> io::Result<()> {
            unreachable!("binding touches no ring")
        }
        fn features(&self, _: &str) -> io::Result<Features> {
            unreachable!("binding touches no offload feature")
        }
        fn set_features(&self, _: &str, _: &BTreeMap<String, bool>) -> io::Result<()> {
            unreachable!("binding touches no offload feature")
        }
    }

    impl Rtnetlink for FakeNic {
        fn mtu(&self, iface: &str) -> io::Result<u32> {
            self.with(iface, |n| n.1)
        }
        fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()> {
            self.with(iface, |n| n.1 = mtu)
        }
        fn link_up(&self, iface: &str) -> io::Result<bool> {
            self.with(iface, |n| n.0)
        }
        fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()> {
            self.with(iface, |n| n.0 = up)
        }
    }

    const TARGET: &str = "0000:00:03.0/eth1/virtio_net";

    /// The host of the fake NIC's ports.
    fn host(roots: &Roots, nic: &Arc<FakeNic>) -> Host {
        Host::at(roots.clone())
            .with_files(nic.clone())
            .with_ethtool(nic.clone())
            .with_rtnetlink(nic.clone())
    }

    fn value_of(roots: &Roots, nic: &Arc<FakeNic>) -> String {
        match read(&host(roots, nic), TARGET) {
            Reading::Value(v) => v,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn binding_back_restores_the_netdev_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Roots::new(&dir.path().join("proc"), &dir.path().join("sys"));
        let nic = FakeNic::new(&roots.sys_root, (true, 9000, 4));
        let original = value_of(&roots, &nic);
        assert_eq!(original, "driver=virtio-pci up=on mtu=9000 combined=4");

        let bound = value("vfio-pci", Some("vfio-pci"));
        write(&host(&roots, &nic), TARGET, &bound).expect("bind");
        assert_eq!(value_of(&roots, &nic), bound, "no netdev while bound");
        assert_eq!(*nic.state(), None);

        write(&host(&roots, &nic), TARGET, &original).expect("revert");
        assert_eq!(value_of(&roots, &nic), original, "exact revert");
        assert_eq!(*nic.state(), Some((true, 9000, 4)));
    }

    #[test]
    fn an_old_journal_value_binds_back_without_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Roots::new(&dir.path().join("proc"), &dir.path().join("sys"));
        let nic = FakeNic::new(&roots.sys_root, (true, 9000, 4));
        write(
            &host(&roots, &nic),
            TARGET,
            &value("vfio-pci", Some("vfio-pci")),
        )
        .expect("bind");
        write(&host(&roots, &nic), TARGET, "driver=virtio-pci").expect("revert");
        assert_eq!(
            *nic.state(),
            Some(DEFAULTS),
            "bound back, settings not restored"
        );
        assert_eq!(
            value_of(&roots, &nic),
            "driver=virtio-pci up=off mtu=1500 combined=2"
        );
    }

    #[test]
    fn settings_without_their_netdev_fail_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let roots = Roots::new(&dir.path().join("proc"), &dir.path().join("sys"));
        let nic = FakeNic::new(&roots.sys_root, (true, 9000, 4));
        let err = write(
            &host(&roots, &nic),
            "0000:00:03.0/eth7/virtio_net",
            "driver=virtio-pci up=on",
        )
        .expect_err("no eth7");
        assert!(err.to_string().contains("no netdev eth7"), "{err}");
    }

    #[test]
    fn desired_table() {
        let eth = |name: &str, pci: Option<&str>| InterfaceFacts {
            name: name.into(),
            driver: Some("virtio_net".into()),
            pci_address: pci.map(str::to_string),
            ..InterfaceFacts::default()
        };
        let ctx = Context {
            vfio_available: true,
            management: [(
                "eth0".to_string(),
                "it carries the default route".to_string(),
            )]
            .into(),
            iommu_groups: [
                ("0000:00:03.0".to_string(), "7".to_string()),
                ("0000:00:04.0".to_string(), "8".to_string()),
            ]
            .into(),
        };
        let allow = DpdkBinding {
            allow_management_interface: true,
            ..DpdkBinding::default()
        };
        let cases: Vec<(&str, InterfaceFacts, DpdkBinding, Context, Option<&str>)> = vec![
            (
                "a data NIC binds to vfio-pci",
                eth("eth1", Some("0000:00:03.0")),
                DpdkBinding::default(),
                ctx.clone(),
                None,
            ),
            (
                "the default-route interface is refused",
                eth("eth0", Some("0000:00:04.0")),
                DpdkBinding::default(),
                ctx.clone(),
                Some("carries the default route"),
            ),
            (
                "unless allowed",
                eth("eth0", Some("0000:00:04.0")),
                allow,
                ctx.clone(),
                None,
            ),
            (
                "no PCI device",
                eth("veth0", None),
                DpdkBinding::default(),
                ctx.clone(),
                Some("not a PCI device"),
            ),
            (
                "no vfio-pci",
                eth("eth1", Some("0000:00:03.0")),
                DpdkBinding::default(),
                Context {
                    vfio_available: false,
                    ..ctx.clone()
                },
                Some("vfio-pci is not available"),
            ),
            (
                "no IOMMU group",
                eth("eth1", Some("0000:00:05.0")),
                DpdkBinding::default(),
                ctx.clone(),
                Some("no IOMMU group"),
            ),
        ];
        for (name, iface, binding, ctx, refused) in cases {
            let w = desired("interfaces[0].dpdk", &iface, &binding, &ctx);
            match refused {
                None => {
                    assert!(w.refused.is_empty(), "{name}: {w:?}");
                    let pci = iface.pci_address.clone().expect("pci");
                    assert_eq!(
                        w.settings,
                        vec![(
                            Setting::new(
                                Kind::PciDriver,
                                format!("{pci}/{}/virtio_net", iface.name)
                            ),
                            "driver=vfio-pci override=vfio-pci".to_string()
                        )],
                        "{name}"
                    );
                }
                Some(text) => {
                    assert!(w.settings.is_empty(), "{name}");
                    assert!(w.refused[0].message.contains(text), "{name}: {w:?}");
                }
            }
        }
    }
}
