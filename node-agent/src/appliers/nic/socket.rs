//! Synchronous netlink requests in the agent's own network namespace: one socket per call, a
//! request with `NLM_F_ACK`, its replies up to the ack, and the kernel's error with its extended
//! ack message (`NLMSGERR_ATTR_MSG`, e.g. "requested channel count exceeds maximum").

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::OnceLock;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NlasIterator, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_REQUEST,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::GenlMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols, Socket, SocketAddr};

use super::ethtool::{self, Message};
use super::{ChannelCounts, ChannelInfo, Features, RingInfo, RingSizes};

/// `NLMSGERR_ATTR_MSG`: the extended ack's message.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Length of a netlink message header.
const NLMSG_HDRLEN: usize = 16;

/// An error the kernel answered a request with: its errno and, when it gave one, its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    /// The errno (positive).
    pub errno: i32,
    /// The extended ack message.
    pub message: Option<String>,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let os = io::Error::from_raw_os_error(self.errno);
        match &self.message {
            Some(m) => write!(f, "{os}: {m}"),
            None => write!(f, "{os}"),
        }
    }
}

impl std::error::Error for KernelError {}

impl KernelError {
    /// As an `io::Error` of the errno's kind that displays the message too.
    pub fn into_io(self) -> io::Error {
        let kind = io::Error::from_raw_os_error(self.errno).kind();
        io::Error::new(kind, self)
    }
}

/// The errno of an error from the kernel, whether it came through [`KernelError`] or plainly.
pub fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<KernelError>())
            .map(|k| k.errno)
    })
}

/// The extended ack message in the payload of an `NLMSG_ERROR` (after its errno): the echoed
/// request header (the whole request unless `NLM_F_CAPPED`), then attributes when the outer
/// header has `NLM_F_ACK_TLVS`.
pub fn extack_message(outer_flags: u16, payload: &[u8]) -> Option<String> {
    if outer_flags & NLM_F_ACK_TLVS == 0 || payload.len() < NLMSG_HDRLEN {
        return None;
    }
    let echoed = if outer_flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = u32::from_ne_bytes(payload[..4].try_into().ok()?) as usize;
        len.checked_add(3)? & !3
    };
    let tlvs = payload.get(echoed..)?;
    NlasIterator::new(tlvs)
        .filter_map(Result::ok)
        .find(|nla| nla.kind() == NLMSGERR_ATTR_MSG)
        .and_then(|nla| netlink_packet_core::parse_string(nla.value()).ok())
        .filter(|m| !m.is_empty())
}

/// A netlink socket of one protocol, bound and connected to the kernel.
struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    fn open(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.set_ext_ack(true)?;
        socket.set_cap_ack(true)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Sends `payload` with `NLM_F_REQUEST | NLM_F_ACK` and returns the replies before the ack.
    fn request<I>(&mut self, payload: I) -> io::Result<Vec<I>>
    where
        I: NetlinkSerializable + NetlinkDeserializable + fmt::Debug,
    {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK;
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        self.socket.send(&buf, 0)?;

        let mut replies = Vec::new();
        loop {
            let (bytes, _) = self.socket.recv_from_full()?;
            let mut at = 0;
            while at < bytes.len() {
                let reply = NetlinkMessage::<I>::deserialize(&bytes[at..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "netlink message of length 0",
                    ));
                }
                at += (len + 3) & !3;
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(replies),
                        Some(code) => {
                            return Err(KernelError {
                                errno: code.get().abs(),
                                message: extack_message(reply.header.flags, &e.header),
                            }
                            .into_io())
                        }
                    },
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(m) => replies.push(m),
                    _ => {}
                }
            }
        }
    }
}

/// An ethtool generic-netlink socket with the family's id resolved.
struct Ethtool {
    netlink: Netlink,
    family: u16,
}

impl Ethtool {
    /// A socket, with the family id resolved once per process: generic-netlink ids are assigned
    /// when a family registers and stay for the kernel's lifetime.
    fn open() -> io::Result<Self> {
        static FAMILY_ID: OnceLock<u16> = OnceLock::new();
        let mut netlink = Netlink::open(protocols::NETLINK_GENERIC)?;
        if let Some(&family) = FAMILY_ID.get() {
            return Ok(Ethtool { netlink, family });
        }
        let ctrl = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(ethtool::FAMILY.into())],
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
        Ok(Ethtool {
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
pub fn channels(dev: &str) -> io::Result<ChannelInfo> {
    Ethtool::open()?.get(ethtool::channels_get(dev), ethtool::decode_channels)
}

/// Sets channel counts of `dev`.
pub fn set_channels(dev: &str, counts: &ChannelCounts) -> io::Result<()> {
    Ethtool::open()?
        .call(ethtool::channels_set(dev, counts))
        .map(drop)
}

/// The ring sizes of `dev`.
pub fn rings(dev: &str) -> io::Result<RingInfo> {
    Ethtool::open()?.get(ethtool::rings_get(dev), ethtool::decode_rings)
}

/// Sets ring sizes of `dev`.
pub fn set_rings(dev: &str, sizes: &RingSizes) -> io::Result<()> {
    Ethtool::open()?
        .call(ethtool::rings_set(dev, sizes))
        .map(drop)
}

/// Every feature name of this kernel; they never change while it runs, so they are asked once.
fn feature_names(ethtool: &mut Ethtool) -> io::Result<Vec<String>> {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    if let Some(names) = NAMES.get() {
        return Ok(names.clone());
    }
    let names = ethtool.get(ethtool::feature_names_get(), ethtool::decode_feature_names)?;
    Ok(NAMES.get_or_init(|| names).clone())
}

/// The offload features of `dev`.
pub fn features(dev: &str) -> io::Result<Features> {
    let mut ethtool = Ethtool::open()?;
    let known = feature_names(&mut ethtool)?;
    ethtool.get(ethtool::features_get(dev), |m| {
        ethtool::decode_features(m, known)
    })
}

/// Sets the wanted state of the named features of `dev`.
pub fn set_features(dev: &str, wanted: &BTreeMap<String, bool>) -> io::Result<()> {
    Ethtool::open()?
        .call(ethtool::features_set(dev, wanted))
        .map(drop)
}

/// The receive-side scaling of `dev` through `ETHTOOL_MSG_RSS_GET`, or, where the kernel
/// answers that with `EOPNOTSUPP` (a kernel before 6.2 has no such command; a device without
/// `get_rxfh` has no RSS), through the `ETHTOOL_GRSSH` ioctl ([`super::rxfh`]). `None` when
/// the device has no RSS to report; any other failure is an error naming the device.
pub fn rss(dev: &str) -> io::Result<Option<ethtool::Rss>> {
    let read =
        match Ethtool::open().and_then(|mut e| e.get(ethtool::rss_get(dev), ethtool::decode_rss)) {
            Ok(rss) => Ok(Some(rss)),
            Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => super::rxfh::read(dev),
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
pub fn mtu(dev: &str) -> io::Result<u32> {
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
pub fn set_mtu(dev: &str, mtu: u32) -> io::Result<()> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    let index = link(&mut route, dev)?.header.index;
    let mut set = LinkMessage::default();
    set.header.index = index;
    set.attributes.push(LinkAttribute::Mtu(mtu));
    route.request(RouteNetlinkMessage::SetLink(set)).map(drop)
}

/// Whether `dev` is administratively up (`IFF_UP` in its link header).
pub fn link_up(dev: &str) -> io::Result<bool> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    Ok(link(&mut route, dev)?.header.flags.contains(LinkFlags::Up))
}

/// Sets `dev` administratively up or down (`RTM_SETLINK` changing only `IFF_UP`).
pub fn set_link_up(dev: &str, up: bool) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extended_ack_messages_are_found_after_the_echoed_header() {
        let mut capped = vec![0u8; NLMSG_HDRLEN];
        capped[..4].copy_from_slice(&40u32.to_ne_bytes());
        let text = b"requested channel count exceeds maximum\0";
        let mut tlv = Vec::new();
        tlv.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        tlv.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        tlv.extend_from_slice(text);
        while tlv.len() % 4 != 0 {
            tlv.push(0);
        }
        // An offset attribute before it is skipped.
        let mut offs = vec![8, 0, 2, 0];
        offs.extend_from_slice(&32u32.to_ne_bytes());
        let payload = [capped.clone(), offs, tlv.clone()].concat();
        assert_eq!(
            extack_message(NLM_F_ACK_TLVS | NLM_F_CAPPED, &payload).as_deref(),
            Some("requested channel count exceeds maximum")
        );
        assert_eq!(extack_message(NLM_F_CAPPED, &payload), None);
        // Not capped: the whole request (40 bytes) is echoed first.
        let whole = [capped, vec![0; 24], tlv].concat();
        assert_eq!(
            extack_message(NLM_F_ACK_TLVS, &whole).as_deref(),
            Some("requested channel count exceeds maximum")
        );
        assert_eq!(extack_message(NLM_F_ACK_TLVS, &[1, 2]), None);
    }

    #[test]
    fn kernel_errors_keep_errno_and_message() {
        let e = KernelError {
            errno: libc::EOPNOTSUPP,
            message: Some("no rings here".into()),
        }
        .into_io();
        assert_eq!(errno(&e), Some(libc::EOPNOTSUPP));
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(e.to_string().ends_with(": no rings here"), "{e}");
        assert_eq!(
            errno(&io::Error::from_raw_os_error(libc::ENODEV)),
            Some(libc::ENODEV)
        );
    }

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
