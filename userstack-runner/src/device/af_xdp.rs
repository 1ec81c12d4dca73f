//! AF_XDP: one socket per NIC queue, with its own UMEM and four rings, as a thin, documented
//! layer over the kernel's `linux/if_xdp.h` ABI through libc (the Rust AF_XDP crates either
//! wrap libxdp/libbpf-sys, which need a newer toolchain or a C build, or are unmaintained).
//!
//! The kernel ABI (Documentation/networking/af_xdp.rst):
//! - the UMEM is an area of user memory cut into equal frames; the socket registers it
//!   (`XDP_UMEM_REG`);
//! - four single-producer/single-consumer rings are mapped from the socket: the **fill** ring
//!   (we give the kernel empty frames to receive into), the **rx** ring (the kernel hands back
//!   filled frames), the **tx** ring (we hand frames to send) and the **completion** ring (the
//!   kernel gives back sent frames). Each ring is a power-of-two array of descriptors plus a
//!   producer and a consumer index; the producer publishes with a release store, the
//!   consumer reads it with an acquire load;
//! - with `XDP_USE_NEED_WAKEUP` the kernel sets a flag on the fill and tx rings when it wants
//!   a syscall (`recvfrom`/`sendto`) to make progress; copy mode always needs one to transmit.
//!
//! Frames are copied between the UMEM and the stack's buffers (the stack owns `Vec<u8>`
//! frames), so zero-copy mode still saves the kernel's copy but not ours. The socket binds in
//! zero-copy mode where the driver offers it and falls back to copy mode (veth), and reports
//! which one it got.
//!
//! Received frames carry the redirect program's clock stamp in their XDP metadata (the kernel
//! copies it into the UMEM headroom in copy mode too); the socket reads it as it takes each
//! frame and keeps how long frames waited ([`Device::rx_wait`]), with one clock read per
//! batch that holds stamped frames.

use super::rx_stamp::{rx_stamp, RX_STAMP_LEN};
use super::{ChecksumOffload, Device};
use crate::runtime::interface;
use hoststack_runner_api::{QueueDrops, RxWait};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Size of one UMEM frame: room for a 1500-byte MTU frame (the kernel's minimum chunk is 2048).
pub const FRAME_SIZE: u32 = 2048;
/// Descriptors per ring.
pub const RING_SIZE: u32 = 2048;
/// UMEM frames: one ring's worth for receiving (fill + rx) and one for sending (tx + completion).
pub const FRAME_COUNT: u32 = 2 * RING_SIZE;
/// Spare frame buffers kept for received frames.
const SPARE_BUFFERS: usize = 1024;
/// How long [`XdpSocket::open`] waits for a queue still held by a dead process's socket.
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// In this many tries.
const BUSY_RETRIES: u32 = 100;

/// How the socket moves frames between the NIC and the UMEM.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum XdpMode {
    /// The kernel copies frames (veth, and drivers without AF_XDP support).
    Copy,
    /// The NIC's DMA writes into the UMEM directly.
    ZeroCopy,
}

impl XdpMode {
    /// The spelling in the runner's stats (`copy`, `zeroCopy`).
    pub fn as_str(self) -> &'static str {
        match self {
            XdpMode::Copy => "copy",
            XdpMode::ZeroCopy => "zeroCopy",
        }
    }
}

/// An mmap'ed region, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by one socket, used by one thread at a time.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(len: usize, fd: Option<RawFd>, offset: libc::off_t) -> io::Result<Mapping> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
            ),
        };
        // SAFETY: a fresh mapping; the kernel checks fd and offset.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned a non-null address"),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One mapped ring with descriptors of type `T` (`u64` frame addresses for fill and
/// completion, `xdp_desc` for rx and tx). `cached_*` keep our view of the indices so that
/// the shared ones are touched once per batch.
#[derive(Debug)]
struct Ring<T> {
    _mapping: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    descs: *mut T,
    mask: u32,
    cached_producer: u32,
    cached_consumer: u32,
}

// SAFETY: the ring is owned by one socket, which one thread uses at a time.
unsafe impl<T> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, offsets: &libc::xdp_ring_offset, offset: u64) -> io::Result<Ring<T>> {
        let len = offsets.desc as usize + RING_SIZE as usize * std::mem::size_of::<T>();
        let mapping = Mapping::new(len, Some(fd), offset as libc::off_t)?;
        let base = mapping.ptr.as_ptr();
        // SAFETY: the kernel placed these fields at the offsets it reported, inside `len`.
        let ring = unsafe {
            Ring {
                producer: base.add(offsets.producer as usize).cast(),
                consumer: base.add(offsets.consumer as usize).cast(),
                flags: base.add(offsets.flags as usize).cast(),
                descs: base.add(offsets.desc as usize).cast(),
                mask: RING_SIZE - 1,
                cached_producer: 0,
                cached_consumer: 0,
                _mapping: mapping,
            }
        };
        // SAFETY: the index words are valid for the mapping's lifetime.
        let (producer, consumer) = unsafe {
            (
                (*ring.producer).load(Ordering::Acquire),
                (*ring.consumer).load(Ordering::Acquire),
            )
        };
        Ok(Ring {
            cached_producer: producer,
            cached_consumer: consumer,
            ..ring
        })
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: the flags word is valid for the mapping's lifetime.
        unsafe { (*self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0 }
    }

    /// As the consumer: entries the producer has published and we have not consumed.
    fn available(&mut self) -> u32 {
        // SAFETY: as above.
        self.cached_producer = unsafe { (*self.producer).load(Ordering::Acquire) };
        self.cached_producer.wrapping_sub(self.cached_consumer)
    }

    /// As the consumer: the entry `i` places after our consumer index.
    fn read(&self, i: u32) -> T {
        let slot = (self.cached_consumer.wrapping_add(i) & self.mask) as usize;
        // SAFETY: slot < RING_SIZE, inside the descriptor array.
        unsafe { self.descs.add(slot).read() }
    }

    /// As the consumer: releases `n` entries back to the producer.
    fn release(&mut self, n: u32) {
        self.cached_consumer = self.cached_consumer.wrapping_add(n);
        // SAFETY: as above.
        unsafe { (*self.consumer).store(self.cached_consumer, Ordering::Release) };
    }

    /// As the producer: free slots.
    fn free(&mut self) -> u32 {
        // SAFETY: as above.
        self.cached_consumer = unsafe { (*self.consumer).load(Ordering::Acquire) };
        RING_SIZE - self.cached_producer.wrapping_sub(self.cached_consumer)
    }

    /// As the producer: entries published and not yet taken by the consumer.
    fn in_flight(&mut self) -> u32 {
        RING_SIZE - self.free()
    }

    /// As the producer: writes the entry `i` places after our producer index.
    fn write(&mut self, i: u32, value: T) {
        let slot = (self.cached_producer.wrapping_add(i) & self.mask) as usize;
        // SAFETY: slot < RING_SIZE, inside the descriptor array.
        unsafe { self.descs.add(slot).write(value) };
    }

    /// As the producer: publishes `n` written entries.
    fn submit(&mut self, n: u32) {
        self.cached_producer = self.cached_producer.wrapping_add(n);
        // SAFETY: as above.
        unsafe { (*self.producer).store(self.cached_producer, Ordering::Release) };
    }
}

/// An AF_XDP socket bound to one queue of one interface, with its UMEM and rings.
#[derive(Debug)]
pub struct XdpSocket {
    // Field order is drop order: rings and UMEM are unmapped before the socket closes.
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    umem: Mapping,
    fd: OwnedFd,
    mode: XdpMode,
    /// UMEM frames free for transmitting.
    tx_frames: Vec<u64>,
    /// Buffers for received frames (from transmitted ones), so receiving does not allocate.
    spare: Vec<Vec<u8>>,
    /// Frames dropped because the tx ring had no free slot or UMEM frame.
    tx_ring_full: u64,
    /// See [`XdpSocket::open`].
    checksum_offload: ChecksumOffload,
    /// How long stamped frames waited before [`Device::receive`] took them.
    rx_wait: RxWait,
}

/// The kernel's monotonic clock in nanoseconds (the clock of `bpf_ktime_get_ns`).
fn monotonic_nanos() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: value points to a T of the given size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// getsockopt(2) at SOL_XDP into a plain C struct (all-zero bytes are a valid `T`).
fn getsockopt<T: Copy>(fd: RawFd, name: libc::c_int) -> io::Result<T> {
    // SAFETY: T is a plain C struct of integers, for which zero is valid.
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: value is a writable T of len bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_XDP,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The index of interface `name` in the caller's network namespace.
pub fn interface_index(name: &str) -> io::Result<u32> {
    let c_name = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
    if index == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(index)
    }
}

fn context(what: &str) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl XdpSocket {
    /// Opens an AF_XDP socket on queue `queue` of `interface`: zero-copy where the driver
    /// offers it, copy mode otherwise. Frames reach it only once a program redirects them to
    /// it (see [`super::xdp_redirect`]).
    ///
    /// Checksum offload ([`Device::checksum_offload`]): an AF_XDP descriptor carries no
    /// checksum flags on receive, so received checksums count as verified only on a veth
    /// ([`interface::frames_never_cross_a_wire`]: the peer hands over the kernel's own
    /// buffers, whose checksums are left partial and never cross a wire), and are checked by
    /// the stack everywhere else. Transmit checksums are always whole: asking the driver to
    /// complete one needs AF_XDP tx metadata (`XDP_TXMD_FLAGS_CHECKSUM`, Linux 6.8 and a
    /// driver that implements it), which Linux 6.1 does not have, so it is not used.
    pub fn open(interface: &str, queue: u32) -> io::Result<XdpSocket> {
        let ifindex = interface_index(interface).map_err(context("no such interface"))?;
        let mut attempts = 0;
        loop {
            let result = match XdpSocket::bind(ifindex, queue, XdpMode::ZeroCopy) {
                Ok(socket) => Ok(socket),
                Err(_) => XdpSocket::bind(ifindex, queue, XdpMode::Copy),
            };
            match result {
                // The socket of a process that just died holds the queue until the kernel
                // frees it (deferred): a restarted runner waits for it, up to BUSY_WAIT.
                Err(e) if e.kind() == io::ErrorKind::ResourceBusy && attempts < BUSY_RETRIES => {
                    attempts += 1;
                    std::thread::sleep(BUSY_WAIT / BUSY_RETRIES);
                }
                result => {
                    return result.map(|mut socket| {
                        socket.checksum_offload.rx_verified =
                            interface::frames_never_cross_a_wire(interface);
                        socket
                    })
                }
            }
        }
    }

    fn bind(ifindex: u32, queue: u32, mode: XdpMode) -> io::Result<XdpSocket> {
        // SAFETY: plain socket(2).
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error()).map_err(context("socket(AF_XDP)"));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Mapping::new((FRAME_COUNT * FRAME_SIZE) as usize, None, 0)
            .map_err(context("mapping the UMEM"))?;
        let registration = libc::xdp_umem_reg {
            addr: umem.ptr.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: FRAME_SIZE,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &registration).map_err(context("XDP_UMEM_REG"))?;
        for ring in [
            libc::XDP_UMEM_FILL_RING,
            libc::XDP_UMEM_COMPLETION_RING,
            libc::XDP_RX_RING,
            libc::XDP_TX_RING,
        ] {
            setsockopt(raw, ring, &RING_SIZE).map_err(context("sizing the rings"))?;
        }
        let offsets: libc::xdp_mmap_offsets =
            getsockopt(raw, libc::XDP_MMAP_OFFSETS).map_err(context("XDP_MMAP_OFFSETS"))?;
        let mut fill: Ring<u64> = Ring::map(raw, &offsets.fr, libc::XDP_UMEM_PGOFF_FILL_RING)
            .map_err(context("mapping the fill ring"))?;
        let completion = Ring::map(raw, &offsets.cr, libc::XDP_UMEM_PGOFF_COMPLETION_RING)
            .map_err(context("mapping the completion ring"))?;
        let rx = Ring::map(raw, &offsets.rx, libc::XDP_PGOFF_RX_RING as u64)
            .map_err(context("mapping the rx ring"))?;
        let tx = Ring::map(raw, &offsets.tx, libc::XDP_PGOFF_TX_RING as u64)
            .map_err(context("mapping the tx ring"))?;
        // The first RING_SIZE frames receive; the rest transmit.
        for i in 0..RING_SIZE {
            fill.write(i, u64::from(i * FRAME_SIZE));
        }
        fill.submit(RING_SIZE);
        let tx_frames = (RING_SIZE..FRAME_COUNT)
            .map(|i| u64::from(i * FRAME_SIZE))
            .collect();
        let flags = libc::XDP_USE_NEED_WAKEUP
            | match mode {
                XdpMode::Copy => libc::XDP_COPY,
                XdpMode::ZeroCopy => libc::XDP_ZEROCOPY,
            };
        let address = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: address is a sockaddr_xdp of the given size.
        let rc = unsafe {
            libc::bind(
                raw,
                (&address as *const libc::sockaddr_xdp).cast(),
                std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error()).map_err(context("binding the AF_XDP socket"));
        }
        Ok(XdpSocket {
            fill,
            completion,
            rx,
            tx,
            umem,
            fd,
            mode,
            tx_frames,
            spare: Vec::with_capacity(SPARE_BUFFERS),
            tx_ring_full: 0,
            checksum_offload: ChecksumOffload::default(),
            rx_wait: RxWait::default(),
        })
    }

    /// Copy or zero-copy, as bound.
    pub fn mode(&self) -> XdpMode {
        self.mode
    }

    /// The frame at UMEM address `addr`, `len` bytes long.
    fn frame(&self, addr: u64, len: u32) -> &[u8] {
        let start = addr as usize;
        let len = (len as usize).min(self.umem.len.saturating_sub(start));
        // SAFETY: start + len lies inside the UMEM mapping.
        unsafe { std::slice::from_raw_parts(self.umem.ptr.as_ptr().add(start), len) }
    }

    /// Takes the redirect program's stamp from the metadata before the frame at `addr` and
    /// clears it, so a frame that arrives later in the same UMEM frame without one is not
    /// read as stamped; `None` when the frame has none.
    fn take_rx_stamp(&mut self, addr: u64) -> Option<u64> {
        let offset = (addr % u64::from(FRAME_SIZE)) as usize;
        if offset < RX_STAMP_LEN {
            return None;
        }
        let start = addr as usize - RX_STAMP_LEN;
        // SAFETY: the RX_STAMP_LEN bytes before the frame lie inside its UMEM frame, which is
        // ours until it goes back on the fill ring.
        let meta = unsafe {
            &mut *self
                .umem
                .ptr
                .as_ptr()
                .add(start)
                .cast::<[u8; RX_STAMP_LEN]>()
        };
        let stamp = rx_stamp(meta)?;
        *meta = [0; RX_STAMP_LEN];
        Some(stamp)
    }

    fn frame_mut(&mut self, addr: u64) -> &mut [u8] {
        let start = addr as usize;
        // SAFETY: addr is a frame start handed out by us, inside the UMEM mapping.
        unsafe {
            std::slice::from_raw_parts_mut(self.umem.ptr.as_ptr().add(start), FRAME_SIZE as usize)
        }
    }

    /// Takes the frames the kernel finished sending back into the free list.
    fn reclaim_completions(&mut self) {
        let done = self.completion.available();
        for i in 0..done {
            let addr = self.completion.read(i);
            self.tx_frames.push(addr & !u64::from(FRAME_SIZE - 1));
        }
        self.completion.release(done);
    }

    fn kick(&self, rx: bool) {
        // Errors (EAGAIN, EBUSY, ENOBUFS) only mean "try again on the next batch".
        // SAFETY: zero-length I/O on our own socket.
        unsafe {
            if rx {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                );
            } else {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                );
            }
        }
    }
}

impl Device for XdpSocket {
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize) {
        let ready = self
            .rx
            .available()
            .min(u32::try_from(max).unwrap_or(u32::MAX));
        if ready > 0 {
            // The fill ring has room for every frame we return: frames circulate only
            // between fill and rx, and there are exactly RING_SIZE of them.
            let mut now = None;
            for i in 0..ready {
                let desc = self.rx.read(i);
                if let Some(stamp) = self.take_rx_stamp(desc.addr) {
                    let now = *now.get_or_insert_with(monotonic_nanos);
                    self.rx_wait.record(now.saturating_sub(stamp));
                }
                let mut buffer = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(FRAME_SIZE as usize));
                buffer.clear();
                buffer.extend_from_slice(self.frame(desc.addr, desc.len));
                batch.push(buffer);
                self.fill.write(i, desc.addr & !u64::from(FRAME_SIZE - 1));
            }
            self.rx.release(ready);
            self.fill.submit(ready);
        }
        if self.fill.needs_wakeup() {
            self.kick(true);
        }
    }

    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>) {
        self.reclaim_completions();
        let mut queued = 0;
        let room = self.tx.free();
        for frame in batch.drain(..) {
            let len = frame.len().min(FRAME_SIZE as usize);
            match self.tx_frames.pop() {
                Some(addr) if queued < room => {
                    self.frame_mut(addr)[..len].copy_from_slice(&frame[..len]);
                    self.tx.write(
                        queued,
                        libc::xdp_desc {
                            addr,
                            len: len as u32,
                            options: 0,
                        },
                    );
                    queued += 1;
                }
                // No frame or no slot: the frame is dropped, as a full NIC queue would;
                // TCP retransmits.
                Some(addr) => {
                    self.tx_frames.push(addr);
                    self.tx_ring_full += 1;
                }
                None => self.tx_ring_full += 1,
            }
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(frame);
            }
        }
        if queued > 0 {
            self.tx.submit(queued);
        }
        // In copy mode one sendto sends at most 32 frames (the kernel's TX_BATCH_SIZE), so
        // kick until the kernel has taken every queued frame; frames left behind would wait
        // for the next batch, which may never come (the tail of a transfer).
        for _ in 0..RING_SIZE / 32 + 1 {
            if self.tx.in_flight() == 0 || !(self.mode == XdpMode::Copy || self.tx.needs_wakeup()) {
                break;
            }
            self.kick(false);
        }
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn checksum_offload(&self) -> ChecksumOffload {
        self.checksum_offload
    }

    fn drops(&self) -> Option<QueueDrops> {
        let kernel: libc::xdp_statistics =
            getsockopt(self.fd.as_raw_fd(), libc::XDP_STATISTICS).ok()?;
        Some(QueueDrops {
            rx_dropped: kernel.rx_dropped,
            rx_ring_full: kernel.rx_ring_full,
            rx_fill_ring_empty: kernel.rx_fill_ring_empty_descs,
            tx_ring_empty: kernel.tx_ring_empty_descs,
            tx_ring_full: self.tx_ring_full,
            checksum_errors: 0,
        })
    }

    fn rx_wait(&self) -> Option<&RxWait> {
        Some(&self.rx_wait)
    }
}

impl AsRawFd for XdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
