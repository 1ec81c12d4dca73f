//! A byte ring with a fixed capacity whose memory grows lazily up to that capacity, so that
//! idle connections with large windows cost little and the steady state never allocates.

/// Bytes `[head, head + len)` are readable; bytes written past `len` by
/// [`RingBuffer::write_at`] wait there (out-of-order data) until [`RingBuffer::commit`].
#[derive(Debug, Clone)]
pub struct RingBuffer {
    storage: Vec<u8>,
    head: usize,
    len: usize,
    capacity: usize,
}

/// Smallest allocation once a buffer holds any data.
const MIN_STORAGE: usize = 4096;

impl RingBuffer {
    /// An empty buffer that will hold at most `capacity` bytes.
    pub fn new(capacity: usize) -> RingBuffer {
        RingBuffer {
            storage: Vec::new(),
            head: 0,
            len: 0,
            capacity,
        }
    }

    /// Maximum number of bytes held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Committed (readable) bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no committed bytes are held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room left after the committed bytes.
    pub fn free(&self) -> usize {
        self.capacity - self.len
    }

    /// Bytes of memory currently allocated.
    pub fn allocated(&self) -> usize {
        self.storage.len()
    }

    fn ensure_storage(&mut self, end: usize) {
        if end <= self.storage.len() {
            return;
        }
        let new_len = end
            .next_power_of_two()
            .max(MIN_STORAGE)
            .min(self.capacity)
            .max(end);
        let mut storage = vec![0u8; new_len];
        let old = self.storage.len();
        if old > 0 {
            let (first, second) = self.storage.split_at(self.head);
            storage[..second.len()].copy_from_slice(second);
            storage[second.len()..old].copy_from_slice(first);
        }
        self.storage = storage;
        self.head = 0;
    }

    fn copy_in(&mut self, position: usize, data: &[u8]) {
        let size = self.storage.len();
        let start = (self.head + position) % size;
        let first = data.len().min(size - start);
        self.storage[start..start + first].copy_from_slice(&data[..first]);
        self.storage[..data.len() - first].copy_from_slice(&data[first..]);
    }

    /// Appends as much of `data` as fits and commits it; returns the bytes taken.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let n = self.write_at(0, data);
        self.len += n;
        n
    }

    /// Stores `data` at `offset` bytes past the committed end without committing it; returns
    /// how many bytes were stored (data beyond the capacity is cut off).
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> usize {
        let start = self.len + offset;
        if start >= self.capacity {
            return 0;
        }
        let n = data.len().min(self.capacity - start);
        if n == 0 {
            return 0;
        }
        self.ensure_storage(start + n);
        self.copy_in(start, &data[..n]);
        n
    }

    /// Makes `n` more bytes (previously written with `write_at`) readable.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.capacity);
        self.len += n;
    }

    /// Copies up to `out.len()` committed bytes starting `offset` bytes past the head, without
    /// consuming them; returns the bytes copied.
    pub fn peek(&self, offset: usize, out: &mut [u8]) -> usize {
        if offset >= self.len {
            return 0;
        }
        let n = out.len().min(self.len - offset);
        let size = self.storage.len();
        let start = (self.head + offset) % size;
        let first = n.min(size - start);
        out[..first].copy_from_slice(&self.storage[start..start + first]);
        out[first..n].copy_from_slice(&self.storage[..n - first]);
        n
    }

    /// Drops `n` committed bytes from the head.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        if n == 0 {
            return;
        }
        self.head = (self.head + n) % self.storage.len();
        self.len -= n;
    }

    /// Copies committed bytes into `out` and consumes them; returns the bytes read.
    pub fn read(&mut self, out: &mut [u8]) -> usize {
        let n = self.peek(0, out);
        self.consume(n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_grows() {
        let mut ring = RingBuffer::new(10_000);
        assert_eq!(ring.allocated(), 0);
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        assert_eq!(ring.push(&data[..3000]), 3000);
        assert_eq!(ring.allocated(), 4096);
        let mut out = vec![0u8; 2000];
        assert_eq!(ring.read(&mut out), 2000);
        assert_eq!(&out[..], &data[..2000]);
        assert_eq!(ring.push(&data[3000..6000]), 3000);
        let mut rest = vec![0u8; 4000];
        assert_eq!(ring.read(&mut rest), 4000);
        assert_eq!(&rest[..], &data[2000..6000]);
        assert!(ring.is_empty());
    }

    #[test]
    fn out_of_order_then_commit() {
        let mut ring = RingBuffer::new(16);
        assert_eq!(ring.write_at(4, b"efgh"), 4);
        assert_eq!(ring.push(b"abcd"), 4);
        ring.commit(4);
        let mut out = [0u8; 16];
        assert_eq!(ring.read(&mut out), 8);
        assert_eq!(&out[..8], b"abcdefgh");
        assert_eq!(ring.write_at(20, b"x"), 0);
        assert_eq!(ring.push(&[0u8; 20]), 16);
        assert_eq!(ring.free(), 0);
    }
}
