//! Synchronous netlink requests in the agent's own network namespace, over netlink-sys with
//! netlink-packet-core's messages: one socket per call, a request with `NLM_F_ACK`, its replies
//! up to the ack, and the kernel's error with its extended ack message (`NLMSGERR_ATTR_MSG`,
//! e.g. "requested channel count exceeds maximum"). The ethtool and rtnetlink ports speak
//! through it; the nftables port has its own batches (see `host::nftables::netlink`).

use std::fmt;
use std::io;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NlasIterator, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_REQUEST,
};
use netlink_sys::{Socket, SocketAddr};

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
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    /// A socket of `protocol` (a `netlink_sys::protocols` constant) asking for extended acks.
    pub fn open(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.set_ext_ack(true)?;
        socket.set_cap_ack(true)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Sends `payload` with `NLM_F_REQUEST | NLM_F_ACK` and returns the replies before the ack.
    pub fn request<I>(&mut self, payload: I) -> io::Result<Vec<I>>
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
}
