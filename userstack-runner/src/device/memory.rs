//! An in-memory point-to-point link: two [`MemoryPort`]s joined back to back, for tests and
//! benchmarks of the stack without a kernel.

use super::Device;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

type Queue = Rc<RefCell<VecDeque<Vec<u8>>>>;

/// One end of an in-memory point-to-point link (single-threaded: both ends live on one core).
#[derive(Debug)]
pub struct MemoryPort {
    rx: Queue,
    tx: Queue,
}

impl MemoryPort {
    /// Two ends joined back to back: what one transmits the other receives.
    pub fn pair() -> (MemoryPort, MemoryPort) {
        let ab = Queue::default();
        let ba = Queue::default();
        (
            MemoryPort {
                rx: ba.clone(),
                tx: ab.clone(),
            },
            MemoryPort { rx: ab, tx: ba },
        )
    }

    /// Frames waiting to be received on this end.
    pub fn pending(&self) -> usize {
        self.rx.borrow().len()
    }
}

impl Device for MemoryPort {
    fn receive(&mut self, batch: &mut Vec<Vec<u8>>, max: usize) {
        let mut rx = self.rx.borrow_mut();
        let n = max.min(rx.len());
        batch.extend(rx.drain(..n));
    }

    fn transmit(&mut self, batch: &mut Vec<Vec<u8>>) {
        self.tx.borrow_mut().extend(batch.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{poll_device, Batches};
    use std::net::{Ipv4Addr, SocketAddrV4};
    use userstack::stack::Stack;
    use userstack::stack::StackConfig;
    use userstack::time::Instant;
    use userstack::wire::EthernetAddress;

    #[test]
    fn two_stacks_over_a_memory_link() {
        let ip_a = Ipv4Addr::new(198, 18, 0, 1);
        let ip_b = Ipv4Addr::new(198, 18, 0, 2);
        let mut a = Stack::new(
            StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 1]), ip_a, 24),
            Instant::ZERO,
        );
        let mut b = Stack::new(
            StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, 2]), ip_b, 24),
            Instant::ZERO,
        );
        let (mut port_a, mut port_b) = MemoryPort::pair();
        let (mut scratch_a, mut scratch_b) = (Batches::default(), Batches::default());
        b.listen(7, 8).unwrap();
        let client = a.connect(SocketAddrV4::new(ip_b, 7)).unwrap();
        a.send(client, b"over the memory link").unwrap();
        let mut now = Instant::ZERO;
        let mut server = None;
        let mut got = Vec::new();
        for _ in 0..100 {
            now += core::time::Duration::from_micros(10);
            poll_device(&mut a, &mut port_a, now, 32, &mut scratch_a);
            poll_device(&mut b, &mut port_b, now, 32, &mut scratch_b);
            if server.is_none() {
                server = b.accept(7);
            }
            if let Some(s) = server {
                let mut buf = [0u8; 64];
                let n = b.recv(s, &mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
            }
        }
        assert_eq!(got, b"over the memory link");
        assert_eq!(port_a.pending() + port_b.pending(), 0);
    }
}
