//! The rtnetlink side of the bpf port: what is attached to an interface's XDP hook
//! (`RTM_GETLINK`, attribute `IFLA_XDP`), with netlink-packet-route's messages over
//! [`crate::netlink`], the codec the rtnetlink port reads MTUs with.

use std::io;

use netlink_packet_route::link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols;

use super::AttachMode;
use crate::netlink::Netlink;

/// Programs attached to an interface: (mode, program id).
pub type Attached = Vec<(AttachMode, u32)>;

/// The programs attached to interface `index`, with their modes.
pub fn attached(index: u32) -> io::Result<Attached> {
    let mut route = Netlink::open(protocols::NETLINK_ROUTE)?;
    let mut get = LinkMessage::default();
    get.header.index = index;
    route
        .request(RouteNetlinkMessage::GetLink(get))?
        .into_iter()
        .find_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => Some(attached_of(&link)),
            _ => None,
        })
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no RTM_NEWLINK reply"))
}

/// What a link message's `IFLA_XDP` says is attached: one program in the mode
/// `IFLA_XDP_ATTACHED` names, or with `XDP_ATTACHED_MULTI` one per mode that has a program id.
pub fn attached_of(link: &LinkMessage) -> Attached {
    let Some(xdp) = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(xdp) => Some(xdp),
        _ => None,
    }) else {
        return Vec::new();
    };
    let mut attached = XdpAttached::None;
    let (mut prog, mut drv, mut skb, mut hw) = (None, None, None, None);
    for nla in xdp {
        match nla {
            LinkXdp::Attached(mode) => attached = *mode,
            LinkXdp::ProgId(id) => prog = Some(*id),
            LinkXdp::DrvProgId(id) => drv = Some(*id),
            LinkXdp::SkbProgId(id) => skb = Some(*id),
            LinkXdp::HwProgId(id) => hw = Some(*id),
            _ => {}
        }
    }
    let one = |mode| prog.map(|id| vec![(mode, id)]).unwrap_or_default();
    match attached {
        XdpAttached::Driver => one(AttachMode::Native),
        XdpAttached::SocketBuffer => one(AttachMode::Generic),
        XdpAttached::Hardware => one(AttachMode::Offload),
        XdpAttached::Multiple => [
            (AttachMode::Native, drv),
            (AttachMode::Generic, skb),
            (AttachMode::Offload, hw),
        ]
        .into_iter()
        .filter_map(|(mode, id)| Some((mode, id?)))
        .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};

    use super::*;

    // The kernel's wire format, to build replies as it sends them.
    const NLMSG_HDRLEN: usize = 16;
    const IFINFOMSG_LEN: usize = 16;
    const NLMSG_ERROR: u16 = 2;
    const RTM_NEWLINK: u16 = 16;
    const IFLA_XDP: u16 = 43;
    const IFLA_XDP_ATTACHED: u16 = 2;
    const IFLA_XDP_PROG_ID: u16 = 4;
    const IFLA_XDP_DRV_PROG_ID: u16 = 5;
    const IFLA_XDP_SKB_PROG_ID: u16 = 6;
    const XDP_ATTACHED_DRV: u8 = 1;
    const XDP_ATTACHED_SKB: u8 = 2;
    const XDP_ATTACHED_MULTI: u8 = 4;

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

    /// What the codec makes of a reply's bytes, and what is attached according to it.
    fn parse_reply(bytes: &[u8]) -> Result<Attached, String> {
        let message =
            NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| e.to_string())?;
        match message.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                Ok(attached_of(&link))
            }
            other => Err(format!("not a link: {other:?}")),
        }
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
        for bad in [&[1u8, 2][..], &reply(RTM_NEWLINK, &[0; 4])[..]] {
            assert!(parse_reply(bad).is_err());
        }
        // Truncated attributes are refused without panicking.
        let mut cut = link(&[attr(IFLA_XDP_ATTACHED, &[XDP_ATTACHED_DRV])]);
        cut.truncate(cut.len() - 3);
        let len = cut.len() as u32;
        cut[..4].copy_from_slice(&len.to_ne_bytes());
        assert!(parse_reply(&cut).is_err());
        // The kernel's error (a vanished interface) is an error reply with its errno, which
        // `Netlink::request` turns into a `KernelError`.
        let enodev = reply(NLMSG_ERROR, &(-libc::ENODEV).to_ne_bytes());
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&enodev).expect("parses");
        match message.payload {
            NetlinkPayload::Error(e) => {
                assert_eq!(e.code.map(|c| c.get()), Some(-libc::ENODEV))
            }
            other => panic!("{other:?}"),
        }
    }
}
