//! The boundary to packet I/O: a device moves Ethernet frames in batches. One backend per
//! module: [`memory`] (an in-memory link for tests), [`af_xdp`] (AF_XDP sockets on a NIC's
//! queues, fed by the [`xdp_redirect`] program), [`tap`] (a TAP device) and, with the cargo
//! feature `dpdk`, `dpdk` (a PCI device bound to vfio-pci, through DPDK).

pub mod af_xdp;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod memory;
pub mod tap;
pub mod xdp_redirect;

pub use memory::MemoryPort;

use hoststack_runner_api::QueueDrops;
use std::os::fd::RawFd;
use userstack::stack::Stack;
use userstack::time::Instant;

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
