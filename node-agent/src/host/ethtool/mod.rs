//! The ethtool port: channel counts, ring sizes and offload features of an interface through
//! the ethtool generic-netlink family, in the agent's own network namespace (no `ethtool`
//! process). [`codec`] encodes the messages, [`rxfh`] reads the RSS key and table through the
//! ioctl where the kernel has no `RSS_GET`; [`rss`] is what the dataplane steers by.
//!
//! A driver that does not support a call answers with its error (veth has no rings:
//! EOPNOTSUPP), with the kernel's extended ack message when it gives one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::OnceLock;

use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::GenlMessage;
use netlink_sys::protocols;

use super::RealKernel;
use crate::netlink::{errno, KernelError, Netlink};
use codec::Message;
pub use codec::{Rss, RSS_HASH_TOEPLITZ};

pub mod codec;
pub mod rxfh;

/// The ethtool calls of the NIC appliers (`ethtool -l/-L`, `-g/-G`, `-k/-K`).
pub trait Ethtool: fmt::Debug + Send + Sync {
    /// The channel counts of interface `iface` (`CHANNELS_GET`).
    fn channels(&self, iface: &str) -> io::Result<ChannelInfo>;
    /// Sets channel counts of `iface` (`CHANNELS_SET`).
    fn set_channels(&self, iface: &str, counts: &ChannelCounts) -> io::Result<()>;
    /// The ring sizes of `iface` (`RINGS_GET`).
    fn rings(&self, iface: &str) -> io::Result<RingInfo>;
    /// Sets ring sizes of `iface` (`RINGS_SET`).
    fn set_rings(&self, iface: &str, sizes: &RingSizes) -> io::Result<()>;
    /// The offload features of `iface` (`STRSET_GET` and `FEATURES_GET`).
    fn features(&self, iface: &str) -> io::Result<Features>;
    /// Sets the wanted state of the named features of `iface` (`FEATURES_SET`).
    fn set_features(&self, iface: &str, wanted: &BTreeMap<String, bool>) -> io::Result<()>;
}

/// Channel counts and their maxima as the driver reports them; 0 means the driver has no
/// channels of that type (`n/a` in `ethtool -l`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelInfo {
    /// Receive-only channels in use.
    pub rx: u32,
    /// Transmit-only channels in use.
    pub tx: u32,
    /// Other (link interrupt) channels in use.
    pub other: u32,
    /// Combined channels in use.
    pub combined: u32,
    /// Most receive-only channels.
    pub rx_max: u32,
    /// Most transmit-only channels.
    pub tx_max: u32,
    /// Most other channels.
    pub other_max: u32,
    /// Most combined channels.
    pub combined_max: u32,
}

/// Channel counts to set; the ones left `None` keep their value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelCounts {
    /// Receive-only channels.
    pub rx: Option<u32>,
    /// Transmit-only channels.
    pub tx: Option<u32>,
    /// Combined channels.
    pub combined: Option<u32>,
}

/// Ring sizes and their maxima as the driver reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingInfo {
    /// Receive ring entries.
    pub rx: u32,
    /// Transmit ring entries.
    pub tx: u32,
    /// Most receive ring entries.
    pub rx_max: u32,
    /// Most transmit ring entries.
    pub tx_max: u32,
}

/// Ring sizes to set; the ones left `None` keep their value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingSizes {
    /// Receive ring entries.
    pub rx: Option<u32>,
    /// Transmit ring entries.
    pub tx: Option<u32>,
}

/// An interface's offload features.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// Every feature name the kernel knows, in bit order.
    pub known: Vec<String>,
    /// The features the driver lets change (the others are `[fixed]` in `ethtool -k`).
    pub changeable: BTreeSet<String>,
    /// The features that are on.
    pub active: BTreeSet<String>,
}

impl Ethtool for RealKernel {
    fn channels(&self, iface: &str) -> io::Result<ChannelInfo> {
        channels(iface)
    }

    fn set_channels(&self, iface: &str, counts: &ChannelCounts) -> io::Result<()> {
        set_channels(iface, counts)
    }

    fn rings(&self, iface: &str) -> io::Result<RingInfo> {
        rings(iface)
    }

    fn set_rings(&self, iface: &str, sizes: &RingSizes) -> io::Result<()> {
        set_rings(iface, sizes)
    }

    fn features(&self, iface: &str) -> io::Result<Features> {
        features(iface)
    }

    fn set_features(&self, iface: &str, wanted: &BTreeMap<String, bool>) -> io::Result<()> {
        set_features(iface, wanted)
    }
}

/// An ethtool generic-netlink socket with the family's id resolved.
struct Socket {
    netlink: Netlink,
    family: u16,
}

impl Socket {
    /// A socket, with the family id resolved once per process: generic-netlink ids are assigned
    /// when a family registers and stay for the kernel's lifetime.
    fn open() -> io::Result<Self> {
        static FAMILY_ID: OnceLock<u16> = OnceLock::new();
        let mut netlink = Netlink::open(protocols::NETLINK_GENERIC)?;
        if let Some(&family) = FAMILY_ID.get() {
            return Ok(Socket { netlink, family });
        }
        let ctrl = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(codec::FAMILY.into())],
        });
        let family = netlink
            .request(ctrl)?
            .into_iter()
            .flat_map(|m| m.payload.nlas)
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(id),
                _ => None,
            })
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel has no ethtool netlink family",
                )
            })?;
        Ok(Socket {
            netlink,
            family: *FAMILY_ID.get_or_init(|| family),
        })
    }

    /// Sends an ethtool message and returns its one reply (none for a SET, which omits it).
    fn call(&mut self, message: Message) -> io::Result<Option<Message>> {
        let mut msg = GenlMessage::from_payload(message);
        msg.set_resolved_family_id(self.family);
        Ok(self
            .netlink
            .request(msg)?
            .into_iter()
            .next()
            .map(|m| m.payload))
    }

    fn get<T>(
        &mut self,
        message: Message,
        decode: impl FnOnce(&Message) -> Result<T, netlink_packet_core::DecodeError>,
    ) -> io::Result<T> {
        let reply = self
            .call(message)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no ethtool reply"))?;
        decode(&reply).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }
}

/// The channel counts of `dev`.
fn channels(dev: &str) -> io::Result<ChannelInfo> {
    Socket::open()?.get(codec::channels_get(dev), codec::decode_channels)
}

/// Sets channel counts of `dev`.
fn set_channels(dev: &str, counts: &ChannelCounts) -> io::Result<()> {
    Socket::open()?
        .call(codec::channels_set(dev, counts))
        .map(drop)
}

/// The ring sizes of `dev`.
fn rings(dev: &str) -> io::Result<RingInfo> {
    Socket::open()?.get(codec::rings_get(dev), codec::decode_rings)
}

/// Sets ring sizes of `dev`.
fn set_rings(dev: &str, sizes: &RingSizes) -> io::Result<()> {
    Socket::open()?.call(codec::rings_set(dev, sizes)).map(drop)
}

/// Every feature name of this kernel; they never change while it runs, so they are asked once.
fn feature_names(socket: &mut Socket) -> io::Result<Vec<String>> {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    if let Some(names) = NAMES.get() {
        return Ok(names.clone());
    }
    let names = socket.get(codec::feature_names_get(), codec::decode_feature_names)?;
    Ok(NAMES.get_or_init(|| names).clone())
}

/// The offload features of `dev`.
fn features(dev: &str) -> io::Result<Features> {
    let mut socket = Socket::open()?;
    let known = feature_names(&mut socket)?;
    socket.get(codec::features_get(dev), |m| {
        codec::decode_features(m, known)
    })
}

/// Sets the wanted state of the named features of `dev`.
fn set_features(dev: &str, wanted: &BTreeMap<String, bool>) -> io::Result<()> {
    Socket::open()?
        .call(codec::features_set(dev, wanted))
        .map(drop)
}

/// The receive-side scaling of `dev` through `ETHTOOL_MSG_RSS_GET`, or, where the kernel
/// answers that with `EOPNOTSUPP` (a kernel before 6.2 has no such command; a device without
/// `get_rxfh` has no RSS), through the `ETHTOOL_GRSSH` ioctl ([`rxfh`]). `None` when
/// the device has no RSS to report; any other failure is an error naming the device.
pub fn rss(dev: &str) -> io::Result<Option<Rss>> {
    let read = match Socket::open().and_then(|mut e| e.get(codec::rss_get(dev), codec::decode_rss))
    {
        Ok(rss) => Ok(Some(rss)),
        Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => rxfh::read(dev),
        Err(e) => Err(e),
    };
    read.map_err(|e| match errno(&e) {
        // Keeps the errno (a caller tells a missing device from a failure).
        Some(errno) => KernelError {
            errno,
            message: Some(format!("reading the RSS key and table of {dev} (ethtool)")),
        }
        .into_io(),
        None => io::Error::new(
            e.kind(),
            format!("reading the RSS key and table of {dev} (ethtool): {e}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_without_rss_reads_as_none_and_a_missing_one_as_an_error() {
        // Loopback has no get_rxfh: the kernel answers RSS_GET with EOPNOTSUPP.
        assert_eq!(rss("lo").expect("RSS_GET of lo"), None);
        let error = rss("hs-no-such-dev").unwrap_err();
        assert_eq!(errno(&error), Some(libc::ENODEV));
        let text = error.to_string();
        assert!(
            text.contains("RSS key and table of hs-no-such-dev") && text.contains("No such device"),
            "{text}"
        );
    }
}
