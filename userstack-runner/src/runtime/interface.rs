//! Facts about the interface the stack takes, read with ioctls on a socket so that they come
//! from the caller's network namespace (a /sys mounted elsewhere may show another one).

use std::io;
use std::net::Ipv4Addr;
use userstack::wire::EthernetAddress;

/// `struct ifreq`: a name and a union, of which we read the address or an int.
#[repr(C)]
struct InterfaceRequest {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn request(interface: &str, op: libc::Ioctl) -> Result<InterfaceRequest, String> {
    request_with(interface, op, &[])
}

/// An ioctl on `interface` with the union starting with `data`.
fn request_with(interface: &str, op: libc::Ioctl, data: &[u8]) -> Result<InterfaceRequest, String> {
    if interface.is_empty() || interface.len() >= libc::IFNAMSIZ {
        return Err(format!("{interface:?} is not a valid interface name"));
    }
    let mut req = InterfaceRequest {
        name: [0; libc::IFNAMSIZ],
        data: [0; 24],
    };
    for (dst, src) in req.name.iter_mut().zip(interface.bytes()) {
        *dst = src as libc::c_char;
    }
    req.data[..data.len()].copy_from_slice(data);
    // SAFETY: plain socket(2); closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", io::Error::last_os_error()));
    }
    // SAFETY: req is an ifreq-sized buffer the ioctl reads and writes.
    let rc = unsafe { libc::ioctl(fd, op, &mut req) };
    let error = io::Error::last_os_error();
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(format!("interface {interface}: {error}"));
    }
    Ok(req)
}

/// The interface's MAC address (SIOCGIFHWADDR).
pub fn mac_address(interface: &str) -> Result<EthernetAddress, String> {
    let req = request(interface, libc::SIOCGIFHWADDR)?;
    // struct sockaddr: a 2-byte family, then the address bytes.
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&req.data[2..8]);
    Ok(EthernetAddress(mac))
}

/// The interface's IP MTU (SIOCGIFMTU).
pub fn mtu(interface: &str) -> Result<usize, String> {
    let req = request(interface, libc::SIOCGIFMTU)?;
    let mtu = i32::from_ne_bytes([req.data[0], req.data[1], req.data[2], req.data[3]]);
    usize::try_from(mtu).map_err(|_| format!("interface {interface}: MTU {mtu}"))
}

/// `struct ethtool_drvinfo` (linux/ethtool.h), of which we read the driver name.
#[repr(C)]
struct DriverInfo {
    cmd: u32,
    driver: [u8; 32],
    rest: [u8; 160],
}

/// `ETHTOOL_GDRVINFO`.
const ETHTOOL_GDRVINFO: u32 = 0x3;

/// The interface's driver name (`veth`, `virtio_net`, ...) through the ethtool ioctl.
pub fn driver(interface: &str) -> Result<String, String> {
    let mut info = DriverInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 160],
    };
    let pointer = (&mut info as *mut DriverInfo as usize).to_ne_bytes();
    request_with(interface, libc::SIOCETHTOOL, &pointer)?;
    let end = info.driver.iter().position(|&c| c == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// Whether frames on the interface never cross a wire, so their TCP checksums need no
/// check: a veth's peer hands over the kernel's own buffers, whose checksums are left
/// partial (CHECKSUM_PARTIAL) for offload that never happens.
pub fn frames_never_cross_a_wire(interface: &str) -> bool {
    driver(interface).is_ok_and(|d| d == "veth")
}

/// A locally administered unicast MAC derived from the address, for a stack that is its own
/// host behind a TAP device.
pub fn placeholder_mac(ip: Ipv4Addr) -> EthernetAddress {
    let [a, b, c, d] = ip.octets();
    EthernetAddress([0x02, 0x00, a, b, c, d])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_a_zero_mac_and_an_mtu() {
        assert_eq!(mac_address("lo").unwrap(), EthernetAddress([0; 6]));
        assert!(mtu("lo").unwrap() >= 1500);
    }

    #[test]
    fn loopback_has_no_ethtool_driver_and_is_not_a_veth() {
        assert!(driver("lo").is_err() || driver("lo").unwrap() != "veth");
        assert!(!frames_never_cross_a_wire("lo"));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let error = mac_address("no-such-if0").unwrap_err();
        assert!(error.contains("no-such-if0"), "{error}");
        assert!(mac_address("").is_err());
    }

    #[test]
    fn placeholder_macs_are_local_unicast() {
        let mac = placeholder_mac(Ipv4Addr::new(198, 19, 64, 50));
        assert_eq!(mac.0, [2, 0, 198, 19, 64, 50]);
    }
}
