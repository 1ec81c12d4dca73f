//! The DPDK binding applier: which driver a PCI device is bound to, changed through sysfs.
//!
//! The target is `ADDR/IF/NETDRIVER` (`0000:00:03.0/eth1/virtio_net`): the PCI address, and the
//! interface and network driver it had when it was matched, so that the binding still matches
//! its interface after the netdev has gone (a device bound to vfio-pci has none). The value is
//! `driver=D` (`none` when unbound), plus ` override=O` when the device's `driver_override` is
//! set.
//!
//! Setting a value writes `driver_override` (O, or a newline to clear it), unbinds the device
//! from its current driver (`<dev>/driver/unbind`) and asks the bus to probe it again
//! (`<sys>/bus/pci/drivers_probe`): with the override set the probe binds that driver, with it
//! cleared the kernel picks the device's own driver again. Binding is refused for the interface
//! that carries the default route or the route to the API server, unless the spec allows it.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use hoststack_crds::{DpdkBinding, DpdkDriver, InterfaceFacts};

use super::{invalid, link_name, plain_name, Kernel, Kind, Reading, Roots, Setting, Wants};

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

/// Whether `s` is a PCI address, `dddd:bb:dd.f` in hex.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b':',
            10 => *c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

/// The value of a device bound to `driver` with `override_` in driver_override.
pub fn value(driver: &str, override_: Option<&str>) -> String {
    match override_ {
        Some(o) => format!("driver={driver} override={o}"),
        None => format!("driver={driver}"),
    }
}

/// The parts of a value: driver, override.
fn parse_value(value: &str) -> Option<(&str, Option<&str>)> {
    let mut words = value.split_whitespace();
    let driver = words.next()?.strip_prefix("driver=")?;
    let override_ = match words.next() {
        Some(w) => Some(w.strip_prefix("override=")?),
        None => None,
    };
    (words.next().is_none() && plain_name(driver) && override_.is_none_or(plain_name))
        .then_some((driver, override_))
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

/// Reads a device's driver and override.
pub fn read(roots: &Roots, target: &str) -> Reading {
    let (dev, pci) = match device_dir(roots, target) {
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
    Reading::Value(value(&driver, override_.as_deref()))
}

/// Binds a device as `value` says (see the module doc).
pub fn write(roots: &Roots, kernel: &dyn Kernel, target: &str, value: &str) -> io::Result<()> {
    let (dev, pci) = device_dir(roots, target).map_err(invalid)?;
    let (driver, override_) = parse_value(value)
        .ok_or_else(|| invalid(format!("{value:?} is not driver=D [override=O]")))?;
    let current = link_name(&dev.join("driver"));
    kernel.write(
        &dev.join("driver_override"),
        format!("{}\n", override_.unwrap_or("")).as_bytes(),
    )?;
    if current.as_deref() == Some(driver) {
        return Ok(());
    }
    if current.is_some() {
        kernel.write(&dev.join("driver/unbind"), pci.as_bytes())?;
        pause_after_unbind();
    }
    if driver != "none" {
        kernel.write(
            &roots.sys_root.join("bus/pci/drivers_probe"),
            pci.as_bytes(),
        )?;
    }
    Ok(())
}

/// Environment variable of the kill tests' hook: a pause (e.g. `30s`) between unbinding a
/// device and probing it again, the one moment a device has no driver, so that a test can
/// SIGKILL the agent there and prove the journal finishes or undoes the bind after a restart.
pub const UNBIND_PAUSE_ENV: &str = "HOSTSTACK_DPDK_UNBIND_PAUSE";

/// Sleeps for [`UNBIND_PAUSE_ENV`] when it is set (never in production).
fn pause_after_unbind() {
    let pause = std::env::var(UNBIND_PAUSE_ENV)
        .ok()
        .and_then(|v| crate::config::parse_duration(&v).ok());
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
    super::dir_names(&devices)
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
    use super::*;

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
        assert_eq!(
            parse_value("driver=vfio-pci override=vfio-pci"),
            Some(("vfio-pci", Some("vfio-pci")))
        );
        assert_eq!(parse_value("driver=none"), Some(("none", None)));
        for bad in [
            "",
            "vfio-pci",
            "driver=a b",
            "driver=../x",
            "driver=a override=b c",
        ] {
            assert_eq!(parse_value(bad), None, "{bad}");
        }
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
