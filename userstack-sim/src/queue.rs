//! The event queue: a binary min-heap of small copyable events keyed by (time, insertion
//! sequence), so events at the same instant come out in the order they were scheduled and a
//! run is the same every time.
//!
//! Events carry no frame bytes (frames sit in [`crate::frame_pool::FramePool`] and events name
//! them), so a heap entry is a few words and sifting moves little; the time and sequence are
//! packed into one `u128` (a [`Stamp`]) so that ordering is one comparison. A caller that
//! keeps a run of events already in order elsewhere (a link's arrivals, which leave a FIFO
//! link in order) [`EventQueue::stamp`]s each when it happens and keeps only the run's head
//! here ([`EventQueue::push_stamped`]): the heap stays small and the order is the same as if
//! every event had been pushed.

use core::cmp::Ordering;
use std::collections::BinaryHeap;
use userstack::time::Instant;

/// An event's place in the order: its time in nanoseconds (high 64 bits) and its insertion
/// sequence (low 64 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(u128);

impl Stamp {
    /// When the event is due.
    pub fn at(self) -> Instant {
        Instant::from_nanos((self.0 >> 64) as u64)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry<T> {
    key: Stamp,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Entry<T>) -> bool {
        self.key == other.key
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Entry<T>) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Entry<T>) -> Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest comes first.
        other.key.cmp(&self.key)
    }
}

/// Pending events of type `T`, earliest (then first scheduled) first.
#[derive(Debug)]
pub struct EventQueue<T> {
    heap: BinaryHeap<Entry<T>>,
    seq: u64,
}

impl<T: Copy> Default for EventQueue<T> {
    fn default() -> EventQueue<T> {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<T: Copy> EventQueue<T> {
    /// An empty queue.
    pub fn new() -> EventQueue<T> {
        EventQueue::default()
    }

    /// Schedules `item` at `at`, after everything already scheduled for that instant.
    pub fn push(&mut self, at: Instant, item: T) {
        let key = self.stamp(at);
        self.push_stamped(key, item);
    }

    /// The place in the order of an event at `at` scheduled now (after everything already
    /// scheduled for that instant), for [`EventQueue::push_stamped`] now or later.
    pub fn stamp(&mut self, at: Instant) -> Stamp {
        self.seq += 1;
        Stamp(u128::from(at.as_nanos()) << 64 | u128::from(self.seq))
    }

    /// Schedules `item` at the place `key` was given.
    pub fn push_stamped(&mut self, key: Stamp, item: T) {
        self.heap.push(Entry { key, item });
    }

    /// The next event and its time, left in the queue.
    pub fn peek(&self) -> Option<(Instant, T)> {
        self.heap.peek().map(|e| (e.key.at(), e.item))
    }

    /// Replaces the next event by `item` at the place `key` was given: one sift instead of
    /// a pop and a push, for an event that schedules its own successor.
    pub fn replace_next(&mut self, key: Stamp, item: T) {
        if let Some(mut next) = self.heap.peek_mut() {
            *next = Entry { key, item };
            return;
        }
        self.heap.push(Entry { key, item });
    }

    /// Takes the next event and its time.
    pub fn pop(&mut self) -> Option<(Instant, T)> {
        self.heap.pop().map(|e| (e.key.at(), e.item))
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_insertion_order() {
        let mut queue = EventQueue::new();
        queue.push(Instant::from_millis(5), 'a');
        queue.push(Instant::from_millis(1), 'b');
        queue.push(Instant::from_millis(5), 'c');
        queue.push(Instant::from_millis(1), 'd');
        assert_eq!(queue.len(), 4);
        assert_eq!(queue.peek(), Some((Instant::from_millis(1), 'b')));
        let order: Vec<char> = core::iter::from_fn(|| queue.pop().map(|(_, c)| c)).collect();
        assert_eq!(order, ['b', 'd', 'a', 'c']);
        assert!(queue.is_empty());
    }

    #[test]
    fn a_stamped_event_keeps_its_place() {
        let mut queue = EventQueue::new();
        let early = queue.stamp(Instant::from_millis(2));
        queue.push(Instant::from_millis(2), 'b');
        queue.push_stamped(early, 'a');
        assert_eq!(queue.pop(), Some((Instant::from_millis(2), 'a')));
        assert_eq!(queue.pop(), Some((Instant::from_millis(2), 'b')));
    }

    #[test]
    fn replacing_the_next_event_reorders_it() {
        let mut queue = EventQueue::new();
        queue.push(Instant::from_millis(1), 'a');
        queue.push(Instant::from_millis(3), 'b');
        let later = queue.stamp(Instant::from_millis(4));
        queue.replace_next(later, 'c');
        assert_eq!(queue.pop(), Some((Instant::from_millis(3), 'b')));
        assert_eq!(queue.pop(), Some((Instant::from_millis(4), 'c')));
        assert_eq!(queue.pop(), None);
    }
}
