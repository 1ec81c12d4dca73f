//! The rtnetlink side of the bpf port: what is attached to an interface's XDP hook
//! (`RTM_GETLINK`, attribute `IFLA_XDP`).

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
