//! The rtnetlink port: an interface's MTU and administrative state (`ip link set IF mtu N`,
//! `up`/`down`), through `RTM_GETLINK`/`RTM_SETLINK` with netlink-packet-route's messages over
//! [`crate::netlink`], in the agent's own network namespace (no `ip` process).

use std::fmt;
use std::io;

use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols;

use super::RealKernel;
use crate::netlink::Netlink;

/// The link calls of the MTU applier and of DPDK binding, which restores a rebound netdev.
pub trait Rtnetlink: fmt::Debug + Send + Sync {
    /// The MTU of `iface` (`RTM_GETLINK`).
    fn mtu(&self, iface: &str) -> io::Result<u32>;
    /// Sets the MTU of `iface` (`RTM_SETLINK` with `IFLA_MTU`).
    fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()>;
    /// Whether `iface` is administratively up (`RTM_GETLINK`, `IFF_UP`).
    fn link_up(&self, iface: &str) -> io::Result<bool>;
    /// Sets `iface` administratively up or down (`RTM_SETLINK` changing only `IFF_UP`).
    fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()>;
}

impl Rtnetlink for RealKernel {
    fn mtu(&self, iface: &str) -> io::Result<u32> {
        mtu(iface)
    }

    fn set_mtu(&self, iface: &str, mtu: u32) -> io::Result<()> {
        set_mtu(iface, mtu)
    }

    fn link_up(&self, iface: &str) -> io::Result<bool> {
        link_up(iface)
    }

    fn set_link_up(&self, iface: &str, up: bool) -> io::Result<()> {
        set_link_up(iface, up)
    }
}

/// The link message of `dev` (RTM_GETLINK by name).
fn link(route: &mut Netlink, dev: &str) -> io::Result<LinkMessage> {
    let mut get = LinkMessage::default();
    get.attributes.push(LinkAttribute::IfName(dev.to_string()));
    route
        .request(RouteNetlinkMessage::GetLink(get))?
        .into_iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(l),
            _ => None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no RTM_NEWLINK reply"))
}

/// The MTU of `dev`.
fn mtu(dev: &str) -> io::Result<u32> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    link(&mut route, dev)?
        .attributes
        .into_iter()
        .find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(m),
            _ => None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "link without IFLA_MTU"))
}

/// Sets the MTU of `dev` (RTM_SETLINK on its index with IFLA_MTU).
fn set_mtu(dev: &str, mtu: u32) -> io::Result<()> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    let index = link(&mut route, dev)?.header.index;
    let mut set = LinkMessage::default();
    set.header.index = index;
    set.attributes.push(LinkAttribute::Mtu(mtu));
    route.request(RouteNetlinkMessage::SetLink(set)).map(drop)
}

/// Whether `dev` is administratively up (`IFF_UP` in its link header).
fn link_up(dev: &str) -> io::Result<bool> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    Ok(link(&mut route, dev)?.header.flags.contains(LinkFlags::Up))
}

/// Sets `dev` administratively up or down (`RTM_SETLINK` changing only `IFF_UP`).
fn set_link_up(dev: &str, up: bool) -> io::Result<()> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    let index = link(&mut route, dev)?.header.index;
    let mut set = LinkMessage::default();
    set.header.index = index;
    set.header.change_mask = LinkFlags::Up;
    if up {
        set.header.flags = LinkFlags::Up;
    }
    route.request(RouteNetlinkMessage::SetLink(set)).map(drop)
}
