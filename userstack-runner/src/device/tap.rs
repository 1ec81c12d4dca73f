//! A TAP device: the kernel sees a network interface whose frames this process reads and
//! writes through /dev/net/tun, for tests and for hosts with neither AF_XDP nor DPDK. The
//! device is not persistent: it disappears when the process closes it (or dies).

use super::Device;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

/// Largest frame read: a 1500-byte MTU frame plus its Ethernet header and a VLAN tag.
const MAX_FRAME: usize = 1522;
/// Spare frame buffers kept for received frames.
const SPARE_BUFFERS: usize = 1024;

/// An open TAP device (IFF_TAP | IFF_NO_PI, non-blocking).
#[derive(Debug)]
pub struct Tap {
    file: File,
    spare: Vec<Vec<u8>>,
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
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            _pad: [0; 22],
        };
        request.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads an ifreq, which `request` lays out.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut request) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name}: {e}")));
        }
        Ok(Tap {
            file,
            spare: Vec::with_capacity(SPARE_BUFFERS),
        })
    }
}

impl Device for Tap {
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize) {
        for _ in 0..max {
            let mut buffer = self
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(MAX_FRAME));
            buffer.resize(MAX_FRAME, 0);
            match self.file.read(&mut buffer) {
                Ok(n) if n > 0 => {
                    buffer.truncate(n);
                    batch.push(buffer);
                }
                // WouldBlock: nothing more now; other errors (the device went away) look
                // the same to the poller, which sees no frames.
                _ => {
                    self.spare.push(buffer);
                    return;
                }
            }
        }
    }

    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>) {
        for frame in batch.drain(..) {
            // A full queue drops the frame, as a NIC would; TCP retransmits.
            let _ = self.file.write(&frame);
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(frame);
            }
        }
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }
}
