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

    /// The free memory right after the committed bytes, to fill in place and make readable
    /// with [`RingBuffer::commit`]: its contiguous part, up to the end of the memory or up to
    /// the head, so a ring that wraps hands out its free space in two turns. When the memory
    /// allocated so far is full it grows first (doubling, at least 4 KiB, at most the
    /// capacity); the slice is empty only when the ring is full. Its bytes are stale (earlier
    /// data or zeros). For a ring that holds no out-of-order bytes (a send ring): an empty
    /// ring starts over at the front of its memory, so that its free space is contiguous.
    pub fn writable(&mut self) -> &mut [u8] {
        if self.len == self.capacity {
            return &mut [];
        }
        if self.len == 0 {
            self.head = 0;
        }
        if self.len == self.storage.len() {
            self.ensure_storage(self.len + 1);
        }
        let size = self.storage.len();
        let tail = self.head + self.len;
        if tail < size {
            &mut self.storage[tail..]
        } else {
            &mut self.storage[tail - size..self.head]
        }
    }

    /// Makes `n` more bytes (previously written with `write_at` or into
    /// [`RingBuffer::writable`]) readable.
    pub fn commit(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.capacity);
        self.len += n;
    }

    /// The committed bytes from the head, to read in place and drop with
    /// [`RingBuffer::consume`]: all of them, or, when they wrap around the end of the memory,
    /// the part before the end (the rest follows once that is consumed).
    pub fn readable(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        let end = (self.head + self.len).min(self.storage.len());
        &self.storage[self.head..end]
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
}

/// Copies as many leading bytes of `from` as fit into `to`; returns how many: the step of the
/// copying socket calls over the in-place ones.
pub(crate) fn copy_prefix(from: &[u8], to: &mut [u8]) -> usize {
    let n = from.len().min(to.len());
    to[..n].copy_from_slice(&from[..n]);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies as much of `data` in as fits, through `writable`, as a send ring is filled.
    fn push(ring: &mut RingBuffer, data: &[u8]) -> usize {
        let mut taken = 0;
        loop {
            let n = copy_prefix(&data[taken..], ring.writable());
            if n == 0 {
                return taken;
            }
            ring.commit(n);
            taken += n;
        }
    }

    /// Copies committed bytes out, through `readable`, and consumes them.
    fn read(ring: &mut RingBuffer, out: &mut [u8]) -> usize {
        let mut done = 0;
        loop {
            let n = copy_prefix(ring.readable(), &mut out[done..]);
            if n == 0 {
                return done;
            }
            ring.consume(n);
            done += n;
        }
    }

    #[test]
    fn wraps_and_grows() {
        let mut ring = RingBuffer::new(10_000);
        assert_eq!(ring.allocated(), 0);
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        assert_eq!(push(&mut ring, &data[..3000]), 3000);
        assert_eq!(ring.allocated(), 4096);
        let mut out = vec![0u8; 2000];
        assert_eq!(read(&mut ring, &mut out), 2000);
        assert_eq!(&out[..], &data[..2000]);
        assert_eq!(push(&mut ring, &data[3000..6000]), 3000);
        let mut rest = vec![0u8; 4000];
        assert_eq!(read(&mut ring, &mut rest), 4000);
        assert_eq!(&rest[..], &data[2000..6000]);
        assert!(ring.is_empty());
    }

    #[test]
    fn out_of_order_then_commit() {
        let mut ring = RingBuffer::new(16);
        assert_eq!(ring.write_at(4, b"efgh"), 4);
        assert_eq!(ring.write_at(0, b"abcd"), 4);
        ring.commit(8);
        let mut out = [0u8; 16];
        assert_eq!(read(&mut ring, &mut out), 8);
        assert_eq!(&out[..8], b"abcdefgh");
        assert_eq!(ring.write_at(20, b"x"), 0);
        assert_eq!(push(&mut ring, &[0u8; 20]), 16);
        assert_eq!(ring.free(), 0);
        assert!(ring.writable().is_empty());
    }

    #[test]
    fn in_place_views_split_where_the_memory_ends() {
        let mut ring = RingBuffer::new(4096);
        assert!(ring.readable().is_empty());
        assert_eq!(
            ring.writable().len(),
            4096,
            "an empty ring lends all its memory"
        );
        ring.writable()[..4000].fill(1);
        ring.commit(4000);
        ring.consume(3000);
        // 1000 bytes at 3000..4000: the free space is 96 bytes to the end, then 3000 from
        // the front.
        assert_eq!(ring.writable().len(), 96);
        ring.writable().fill(2);
        ring.commit(96);
        assert_eq!(ring.writable().len(), 3000);
        ring.writable()[..10].fill(3);
        ring.commit(10);
        // Reading is split the same way: to the end of the memory, then the front.
        assert_eq!(ring.readable().len(), 1096);
        assert!(ring.readable()[..1000].iter().all(|&b| b == 1));
        assert!(ring.readable()[1000..].iter().all(|&b| b == 2));
        ring.consume(1096);
        assert_eq!(ring.readable(), &[3; 10]);
        ring.consume(10);
        // Empty again: the free space starts over at the front, in one piece.
        assert_eq!(ring.writable().len(), 4096);
    }

    #[test]
    fn writable_grows_the_memory_by_doubling_only_when_it_is_full() {
        let mut ring = RingBuffer::new(10_000);
        assert_eq!(ring.writable().len(), 4096);
        assert_eq!(ring.allocated(), 4096);
        ring.commit(4096);
        // Full memory: it doubles, the committed bytes move to the front.
        assert_eq!(ring.writable().len(), 4096);
        assert_eq!(ring.allocated(), 8192);
        ring.commit(4096);
        // Capped at the capacity.
        assert_eq!(ring.writable().len(), 10_000 - 8192);
        assert_eq!(ring.allocated(), 10_000);
        ring.commit(10_000 - 8192);
        assert!(ring.writable().is_empty());
    }
}
