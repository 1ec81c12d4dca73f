//! The boundary to packet I/O: a device moves Ethernet frames in batches. One backend per
//! module: [`memory`] (an in-memory link for tests), [`af_xdp`] (AF_XDP sockets on a NIC's
//! queues, fed by the [`xdp_redirect`] program, which stamps each frame: [`rx_stamp`]),
//! [`tap`] (a TAP device) and, with the cargo feature `dpdk`, `dpdk` (a PCI device bound to
//! vfio-pci, through DPDK).

pub mod af_xdp;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod memory;
pub mod rx_stamp;
pub mod tap;
pub mod xdp_redirect;

pub use memory::MemoryPort;

use hoststack_runner_api::{QueueDrops, RxWait};
use std::os::fd::RawFd;
use userstack::stack::Stack;
use userstack::time::Instant;
use userstack::wire::offload::{self, TcpChecksum};

/// The TCP checksum work a device does, from which the runtime sets the stack's
/// `rx_checksum_offload` and `tx_checksum_offload`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChecksumOffload {
    /// Every TCP frame the device hands over has a checksum that the hardware or kernel
    /// verified, or that was generated on this host and is trusted (a kernel's partial
    /// checksum); a frame the hardware said nothing about is checked by the device in
    /// software first, and a frame flagged or found bad is dropped and counted
    /// ([`QueueDrops::checksum_errors`]). The stack then checks no TCP checksum.
    pub rx_verified: bool,
    /// The device completes a TCP checksum whose field holds only the pseudo-header sum
    /// (Linux's CHECKSUM_PARTIAL), so the stack may leave it so; frames with whole checksums
    /// go out unchanged.
    pub tx_completes: bool,
}

/// What a device's hardware (or kernel) said about the TCP checksum of one received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxChecksum {
    /// Verified, or left partial by the host that made the frame (nothing crossed a wire).
    Verified,
    /// Found wrong.
    Bad,
    /// Nothing: the device checks it in software.
    Unknown,
}

impl RxChecksum {
    /// Whether a device with [`ChecksumOffload::rx_verified`] may hand `frame` to its
    /// stack: vouched for, or not flagged bad and not found bad in software (frames other
    /// than IPv4/TCP pass; the stack checks those itself).
    pub fn admits(self, frame: &[u8]) -> bool {
        match self {
            RxChecksum::Verified => true,
            RxChecksum::Bad => false,
            RxChecksum::Unknown => offload::tcp_checksum(frame) != TcpChecksum::Bad,
        }
    }
}

/// A source and sink of Ethernet frames, moved in batches.
pub trait Device {
    /// Appends up to `max` received frames to `batch`.
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize);
    /// Takes every frame of `batch` for transmission, leaving it empty.
    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>);
    /// A descriptor that polls readable when frames arrive, so an idle poller can block in
    /// poll(2) instead of spinning; `None` when the device has none (the caller then sleeps).
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
    /// The queue's drop counters since it opened, where the backend keeps them; `None`
    /// otherwise.
    fn drops(&self) -> Option<QueueDrops> {
        None
    }
    /// How long received frames waited before `receive` took them, where the backend can
    /// tell; `None` otherwise.
    fn rx_wait(&self) -> Option<&RxWait> {
        None
    }
    /// The TCP checksum work the device does; by default none, and the stack computes and
    /// checks every checksum itself.
    fn checksum_offload(&self) -> ChecksumOffload {
        ChecksumOffload::default()
    }
}

/// Scratch batches for [`poll_device`], kept across calls so polling does not allocate.
#[derive(Debug, Default)]
pub struct Batches {
    rx: Vec<Vec<u8>>,
    tx: Vec<Vec<u8>>,
}

/// One turn of a stack on a device: receive a batch of up to `batch` frames, run timers,
/// transmit everything ready. Returns the number of frames received plus sent.
pub fn poll_device(
    stack: &mut Stack,
    device: &mut impl Device,
    now: Instant,
    batch: usize,
    scratch: &mut Batches,
) -> usize {
    device.receive(&mut scratch.rx, batch);
    let received = scratch.rx.len();
    stack.ingress(now, &mut scratch.rx);
    stack.poll_timers(now);
    stack.egress(now, &mut scratch.tx);
    let sent = scratch.tx.len();
    device.transmit(&mut scratch.tx);
    received + sent
}
