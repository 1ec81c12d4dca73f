//! Recycled frame buffers, so that the steady state allocates nothing.

/// A free list of equally sized byte buffers.
#[derive(Debug)]
pub struct BufferPool {
    free: Vec<Vec<u8>>,
    buffer_len: usize,
    max_free: usize,
}

impl BufferPool {
    /// A pool handing out buffers of `buffer_len` bytes and keeping at most `max_free` spares.
    pub fn new(buffer_len: usize, max_free: usize) -> BufferPool {
        BufferPool {
            free: Vec::new(),
            buffer_len,
            max_free,
        }
    }

    /// A buffer of exactly `buffer_len` bytes (contents unspecified).
    pub fn get(&mut self) -> Vec<u8> {
        match self.free.pop() {
            Some(mut buffer) => {
                buffer.resize(self.buffer_len, 0);
                buffer
            }
            None => vec![0; self.buffer_len],
        }
    }

    /// Returns a buffer for reuse.
    pub fn put(&mut self, buffer: Vec<u8>) {
        if self.free.len() < self.max_free && buffer.capacity() >= self.buffer_len {
            self.free.push(buffer);
        }
    }

    /// Takes a spare buffer as is (any length), to hand to another pool.
    pub fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.free.pop()
    }

    /// Spare buffers held.
    pub fn spare(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recycles() {
        let mut pool = BufferPool::new(1514, 2);
        let mut a = pool.get();
        a.truncate(60);
        pool.put(a);
        assert_eq!(pool.spare(), 1);
        assert_eq!(pool.get().len(), 1514);
        assert_eq!(pool.spare(), 0);
    }
}
