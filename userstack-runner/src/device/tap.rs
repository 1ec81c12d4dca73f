//! A TAP device: the kernel sees a network interface whose frames this process reads and
//! writes through /dev/net/tun, for tests and for hosts with neither AF_XDP nor DPDK. The
//! device is not persistent: it disappears when the process closes it (or dies).
//!
//! Checksum offload both ways, as a virtio-net device does it: the device is opened with
//! `IFF_VNET_HDR`, so each frame travels behind a 10-byte `virtio_net_hdr` (read and written
//! with readv/writev into a buffer of its own, so the frame stays in its `Vec`), and
//! `TUNSETOFFLOAD` with `TUN_F_CSUM` (no TSO or UFO: the kernel segments before the device)
//! lets the kernel hand over frames whose TCP checksums it has not completed.
//! - Receive: `VIRTIO_NET_HDR_F_NEEDS_CSUM` (the kernel's own segment, checksum left partial)
//!   and `VIRTIO_NET_HDR_F_DATA_VALID` (a checksum the kernel verified) are trusted; a TCP
//!   frame with neither flag (a packet socket's, say) has its checksum checked here, and a
//!   bad one is dropped and counted, so the stack checks none.
//! - Transmit: an IPv4/TCP frame whose checksum field holds the pseudo-header sum (the
//!   stack's tx offload) goes out with `NEEDS_CSUM` and the kernel completes it (or, for a
//!   local socket, needs no checksum at all); any other frame goes out with no flags.

use super::{ChecksumOffload, Device, RxChecksum};
use hoststack_runner_api::QueueDrops;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use userstack::wire::offload;

/// Largest frame read: a 1500-byte MTU frame plus its Ethernet header and a VLAN tag.
const MAX_FRAME: usize = 1522;
/// Spare frame buffers kept for received frames.
const SPARE_BUFFERS: usize = 1024;
/// Length of `struct virtio_net_hdr` (linux/virtio_net.h), the header set with
/// `TUNSETVNETHDRSZ`: flags, gso_type, hdr_len, gso_size, csum_start, csum_offset.
const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds the
/// pseudo-header sum; whoever takes the frame completes it over `csum_start..`.
const NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the checksum was verified.
const DATA_VALID: u8 = 2;

/// An open TAP device (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR, non-blocking).
#[derive(Debug)]
pub struct Tap {
    file: File,
    spare: Vec<Vec<u8>>,
    /// Received TCP frames dropped for a bad checksum.
    checksum_errors: u64,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct InterfaceRequest {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tap {
    /// Creates (or opens) TAP device `name`; the caller brings it up and addresses the kernel
    /// side.
    pub fn open(name: &str) -> io::Result<Tap> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a valid interface name"),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(|e| io::Error::new(e.kind(), format!("opening /dev/net/tun: {e}")))?;
        let mut request = InterfaceRequest {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        request.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads an ifreq, which `request` lays out.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut request) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
        }
        let header_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads an int.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &header_len) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("TUNSETVNETHDRSZ {name}: {e}"),
            ));
        }
        // SAFETY: TUNSETOFFLOAD takes the feature bits as its argument, not a pointer.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(libc::TUN_F_CSUM),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("TUNSETOFFLOAD {name}: {e}"),
            ));
        }
        Ok(Tap {
            file,
            spare: Vec::with_capacity(SPARE_BUFFERS),
            checksum_errors: 0,
        })
    }

    /// Reads one frame and its header into `header` and `buffer`; the frame's length.
    fn read_frame(&self, header: &mut [u8; VNET_HDR_LEN], buffer: &mut [u8]) -> Option<usize> {
        let iov = [
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: header.len(),
            },
            libc::iovec {
                iov_base: buffer.as_mut_ptr().cast(),
                iov_len: buffer.len(),
            },
        ];
        // SAFETY: both iovecs point to writable memory of their lengths.
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        // Negative: WouldBlock (nothing more now) or the device went away, which look the
        // same to the poller; a read shorter than the header carries no frame.
        usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_sub(VNET_HDR_LEN))
            .filter(|&len| len > 0)
    }
}

/// What the kernel says about a received frame's checksum in its header's `flags`.
fn rx_checksum(flags: u8) -> RxChecksum {
    if flags & (NEEDS_CSUM | DATA_VALID) != 0 {
        RxChecksum::Verified
    } else {
        RxChecksum::Unknown
    }
}

/// The `virtio_net_hdr` for a frame to transmit (native byte order, as a TAP device without
/// `TUNSETVNETLE` takes it on a little-endian host, and as legacy virtio does).
fn transmit_header(frame: &[u8]) -> [u8; VNET_HDR_LEN] {
    let mut header = [0u8; VNET_HDR_LEN];
    if let Some(partial) = offload::partial_tcp_checksum(frame) {
        header[0] = NEEDS_CSUM;
        // Both fit: the start is at most 14 + 60 bytes, the offset is 16.
        header[6..8].copy_from_slice(&(partial.start as u16).to_ne_bytes());
        header[8..10].copy_from_slice(&(partial.offset as u16).to_ne_bytes());
    }
    header
}

impl Device for Tap {
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize) {
        for _ in 0..max {
            let mut buffer = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(MAX_FRAME));
            buffer.resize(MAX_FRAME, 0);
            let mut header = [0u8; VNET_HDR_LEN];
            let Some(len) = self.read_frame(&mut header, &mut buffer) else {
                self.spare.push(buffer);
                return;
            };
            buffer.truncate(len);
            if rx_checksum(header[0]).admits(&buffer) {
                batch.push(buffer);
            } else {
                self.checksum_errors += 1;
                self.spare.push(buffer);
            }
        }
    }

    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>) {
        for frame in batch.drain(..) {
            let header = transmit_header(&frame);
            let iov = [
                libc::iovec {
                    iov_base: header.as_ptr().cast_mut().cast(),
                    iov_len: header.len(),
                },
                libc::iovec {
                    iov_base: frame.as_ptr().cast_mut().cast(),
                    iov_len: frame.len(),
                },
            ];
            // SAFETY: both iovecs point to readable memory of their lengths; writev does not
            // write through them. A full queue drops the frame, as a NIC would; TCP
            // retransmits.
            unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(frame);
            }
        }
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn drops(&self) -> Option<QueueDrops> {
        Some(QueueDrops {
            checksum_errors: self.checksum_errors,
            ..QueueDrops::default()
        })
    }

    /// Both ways: see the module doc.
    fn checksum_offload(&self) -> ChecksumOffload {
        ChecksumOffload {
            rx_verified: true,
            tx_completes: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use userstack::wire::tcp::fill_partial_checksum;
    use userstack::wire::{ethernet, ipv4, EthernetAddress, EthernetRepr, Ipv4Repr, TcpRepr};

    const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const DST: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
    const TCP_START: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;

    /// An Ethernet/IPv4/TCP frame with a whole checksum.
    fn frame() -> Vec<u8> {
        let repr = TcpRepr {
            src_port: 40000,
            dst_port: 80,
            payload: b"through the tap",
            ..TcpRepr::default()
        };
        let mut frame = vec![0u8; TCP_START + repr.buffer_len()];
        EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: ethernet::ethertype::IPV4,
        }
        .emit(&mut frame);
        Ipv4Repr {
            src_addr: SRC,
            dst_addr: DST,
            protocol: ipv4::protocol::TCP,
            payload_len: repr.buffer_len(),
            ttl: 64,
            tos: 0,
            ident: 1,
            dont_fragment: true,
        }
        .emit(&mut frame[ethernet::HEADER_LEN..]);
        repr.emit(&mut frame[TCP_START..], SRC, DST);
        frame
    }

    #[test]
    fn flagged_frames_are_trusted_and_unflagged_ones_checked() {
        let good = frame();
        let mut bad = good.clone();
        bad[TCP_START + 16] ^= 0xff;
        assert!(rx_checksum(0).admits(&good));
        assert!(!rx_checksum(0).admits(&bad));
        assert!(rx_checksum(NEEDS_CSUM).admits(&bad));
        assert!(rx_checksum(DATA_VALID).admits(&bad));
        assert!(!RxChecksum::Bad.admits(&good));
    }

    #[test]
    fn partial_checksums_go_out_with_needs_csum_and_whole_ones_without() {
        let whole = frame();
        assert_eq!(transmit_header(&whole), [0; VNET_HDR_LEN]);
        let mut partial = whole.clone();
        fill_partial_checksum(&mut partial[TCP_START..], SRC, DST);
        let header = transmit_header(&partial);
        assert_eq!(header[0], NEEDS_CSUM);
        assert_eq!(u16::from_ne_bytes([header[6], header[7]]), TCP_START as u16);
        assert_eq!(u16::from_ne_bytes([header[8], header[9]]), 16);
        assert_eq!(header[1..6], [0; 5], "no GSO");
    }
}
