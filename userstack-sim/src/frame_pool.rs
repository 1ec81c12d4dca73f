//! Frames in flight, held in one slab and named by index, plus the spare frame buffers that
//! move between the hosts' stacks: after warm-up the simulator allocates no frame memory.
//!
//! A frame leaves a stack's transmit batch into a slot here; events and link queues carry its
//! [`FrameId`] (four bytes, so events stay small and copyable); at the receiving host the
//! buffer goes back into that stack's own pool. Buffers therefore drift from the hosts that
//! receive more than they send to the ones that send more: [`FramePool::lend`] and
//! [`FramePool::reclaim`] even that out around each host's turn: a host keeps what it sends in
//! a turn (up to [`MAX_LEND`]) and gives back the rest, so a buffer moves once per frame, not
//! once per turn. At most [`MAX_SPARE`] more buffers are kept here, so that an idle network
//! gives back what a burst of traffic needed.

use userstack::stack::BufferPool;

/// Spare buffers kept here at most (192 KiB of 1514-byte frames).
pub const MAX_SPARE: usize = 128;

/// Spare buffers a host's stack keeps at most between its turns (96 KiB), more than a bulk
/// sender sends in one turn once past slow start.
pub const MAX_LEND: usize = 64;

/// Names a frame in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameId(u32);

/// The slab of frames in flight and the spare buffers.
#[derive(Debug, Default)]
pub struct FramePool {
    slots: Vec<Vec<u8>>,
    free_slots: Vec<u32>,
    spare: Vec<Vec<u8>>,
}

impl FramePool {
    /// An empty pool; slots and buffers come as the run needs them.
    pub fn new() -> FramePool {
        FramePool::default()
    }

    /// Stores `frame` and names it.
    pub fn insert(&mut self, frame: Vec<u8>) -> FrameId {
        match self.free_slots.pop() {
            Some(index) => {
                self.slots[index as usize] = frame;
                FrameId(index)
            }
            None => {
                self.slots.push(frame);
                FrameId((self.slots.len() - 1) as u32)
            }
        }
    }

    /// The frame's bytes.
    pub fn get(&self, id: FrameId) -> &[u8] {
        &self.slots[id.0 as usize]
    }

    /// The frame's bytes, mutably (a gateway rewrites the TTL in place).
    pub fn get_mut(&mut self, id: FrameId) -> &mut [u8] {
        &mut self.slots[id.0 as usize]
    }

    /// Takes the frame out (its slot becomes free).
    pub fn remove(&mut self, id: FrameId) -> Vec<u8> {
        self.free_slots.push(id.0);
        core::mem::take(&mut self.slots[id.0 as usize])
    }

    /// Frees the frame, keeping its buffer as a spare.
    pub fn release(&mut self, id: FrameId) {
        let buffer = self.remove(id);
        self.keep(buffer);
    }

    fn keep(&mut self, buffer: Vec<u8>) {
        if buffer.capacity() > 0 && self.spare.len() < MAX_SPARE {
            self.spare.push(buffer);
        }
    }

    /// A second frame with the same bytes as `id`, in a spare buffer when there is one (else
    /// in a new one as large as the original's, so that a stack's pool will keep it).
    pub fn duplicate(&mut self, id: FrameId) -> FrameId {
        let original = &self.slots[id.0 as usize];
        let mut copy = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(original.capacity()));
        copy.clear();
        copy.extend_from_slice(&self.slots[id.0 as usize]);
        self.insert(copy)
    }

    /// Tops `pool` up to `want` (at most [`MAX_LEND`]) spare buffers from ours (as many as
    /// we have).
    pub fn lend(&mut self, pool: &mut BufferPool, want: usize) {
        while pool.spare() < want.min(MAX_LEND) {
            match self.spare.pop() {
                Some(buffer) => pool.put(buffer),
                None => break,
            }
        }
    }

    /// Takes back `pool`'s spare buffers beyond `keep` (at most [`MAX_LEND`]); those beyond
    /// [`MAX_SPARE`] are freed.
    pub fn reclaim(&mut self, pool: &mut BufferPool, keep: usize) {
        while pool.spare() > keep.min(MAX_LEND) {
            match pool.take_spare() {
                Some(buffer) => self.keep(buffer),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_buffers_kept() {
        let mut pool = FramePool::new();
        let a = pool.insert(vec![1; 60]);
        let b = pool.duplicate(a);
        assert_ne!(a, b);
        assert_eq!(pool.get(b), &[1; 60][..]);
        pool.release(a);
        assert_eq!(pool.insert(vec![2; 10]), a);
        let mut stack_pool = BufferPool::new(1514, 16);
        pool.release(b);
        pool.lend(&mut stack_pool, 4);
        // The 60-byte buffer is too small for the stack's pool: it is dropped, not kept.
        assert_eq!(stack_pool.spare(), 0);
        stack_pool.put(vec![0; 1514]);
        stack_pool.put(vec![0; 1514]);
        pool.reclaim(&mut stack_pool, 1);
        assert_eq!(stack_pool.spare(), 1);
        pool.lend(&mut stack_pool, 2);
        assert_eq!(stack_pool.spare(), 2);
    }
}
