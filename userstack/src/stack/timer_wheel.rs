//! A hierarchical timer wheel (Varghese and Lauck): O(1) insert, O(1) cancel by generation,
//! expiry cost proportional to the ticks crossed. Each key has at most one entry: inserting
//! again moves it (as Linux's `mod_timer` moves a timer), so the wheel never holds more entries
//! than keys and its slots stop growing once they have held every key.

use crate::time::Instant;

const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const LEVELS: usize = 6;
/// Entries each slot has room for from the start (6 × 64 × 4 × 16 bytes = 24 KiB a wheel): a
/// slot allocates only when it first holds more timers than it ever has.
const SLOT_CAPACITY: usize = 4;
/// Capacity a higher-level slot keeps after its entries cascade down (1 KiB): a timer armed
/// into it next turn allocates nothing, and a slot that once held thousands (a busy moment)
/// does not hold on to that memory.
const SLOT_KEEP: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    tick: u64,
    key: u32,
    generation: u32,
}

/// Where a key's entry is: `levels[level][slot][index]`, as (level × SLOTS + slot, index).
type Position = (u16, u32);

/// Timers keyed by `(key, generation)`, one entry per key. Cancelling is bumping the owner's
/// generation: a stale entry is skipped when it expires, so a cancel never searches the wheel.
#[derive(Debug)]
pub struct TimerWheel {
    tick_nanos: u64,
    now_tick: u64,
    levels: Vec<Vec<Vec<Entry>>>,
    /// Each key's entry, if it has one (indexed by key: keys are small, dense indices).
    positions: Vec<Option<Position>>,
    /// Bit `s` of `occupied[level]` is set when that slot holds entries.
    occupied: [u64; LEVELS],
    len: usize,
}

impl TimerWheel {
    /// A wheel whose resolution is `tick_nanos` nanoseconds (deadlines round up to a tick) and
    /// whose clock starts at `now`. Six levels of 64 slots span 2^36 ticks.
    pub fn new(tick_nanos: u64, now: Instant) -> TimerWheel {
        TimerWheel {
            tick_nanos,
            now_tick: now.as_nanos() / tick_nanos,
            levels: (0..LEVELS)
                .map(|_| {
                    (0..SLOTS)
                        .map(|_| Vec::with_capacity(SLOT_CAPACITY))
                        .collect()
                })
                .collect(),
            positions: Vec::new(),
            occupied: [0; LEVELS],
            len: 0,
        }
    }

    /// Drops every entry and gives back what the slots grew beyond their initial room (for a
    /// stack with no connection left, whose entries are all stale).
    pub fn clear(&mut self) {
        for slot in self.levels.iter_mut().flatten() {
            *slot = Vec::with_capacity(SLOT_CAPACITY);
        }
        self.positions = Vec::new();
        self.occupied = [0; LEVELS];
        self.len = 0;
    }

    /// Entries held (at most one per key), stale ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Files `entry` by how far its tick lies from now. `earliest` is the first tick it may
    /// fire at: the next tick for fresh inserts, the current one while cascading.
    fn place(&mut self, entry: Entry, earliest: u64) {
        let tick = entry.tick.max(earliest);
        let differing = (tick ^ self.now_tick) | 1;
        let level = ((63 - differing.leading_zeros()) / SLOT_BITS) as usize;
        let level = level.min(LEVELS - 1);
        let slot = ((tick >> (SLOT_BITS as usize * level)) as usize) & (SLOTS - 1);
        let entries = &mut self.levels[level][slot];
        self.positions[entry.key as usize] =
            Some(((level * SLOTS + slot) as u16, entries.len() as u32));
        entries.push(Entry { tick, ..entry });
        self.occupied[level] |= 1 << slot;
    }

    /// Takes `key`'s entry out of its slot, if it has one.
    fn remove(&mut self, key: u32) {
        let Some(Some((bucket, index))) = self.positions.get(key as usize).copied() else {
            return;
        };
        self.positions[key as usize] = None;
        let (level, slot) = (usize::from(bucket) / SLOTS, usize::from(bucket) % SLOTS);
        let entries = &mut self.levels[level][slot];
        entries.swap_remove(index as usize);
        if let Some(moved) = entries.get(index as usize) {
            self.positions[moved.key as usize] = Some((bucket, index));
        }
        if entries.is_empty() {
            self.occupied[level] &= !(1u64 << slot);
        }
        self.len -= 1;
    }

    /// Schedules `(key, generation)` to expire at `deadline` (rounded up to the next tick),
    /// replacing the key's earlier entry if it has one.
    pub fn insert(&mut self, deadline: Instant, key: u32, generation: u32) {
        if self.positions.len() <= key as usize {
            self.positions.resize(key as usize + 1, None);
        }
        self.remove(key);
        let tick = deadline.as_nanos().div_ceil(self.tick_nanos);
        self.place(
            Entry {
                tick,
                key,
                generation,
            },
            self.now_tick + 1,
        );
        self.len += 1;
    }

    /// Advances the clock to `now`, appending every `(key, generation)` whose deadline passed.
    pub fn advance(&mut self, now: Instant, expired: &mut Vec<(u32, u32)>) {
        let target = now.as_nanos() / self.tick_nanos;
        while self.now_tick < target {
            if self.len == 0 {
                self.now_tick = target;
                break;
            }
            self.now_tick += 1;
            // Cascade: when a lower level wraps, redistribute the next slot of the level above.
            for level in 1..LEVELS {
                let shift = SLOT_BITS as usize * level;
                if self.now_tick & ((1u64 << shift) - 1) != 0 {
                    break;
                }
                let slot = ((self.now_tick >> shift) as usize) & (SLOTS - 1);
                let mut entries = core::mem::take(&mut self.levels[level][slot]);
                self.occupied[level] &= !(1u64 << slot);
                // Every entry moves to a lower level (its deadline is within this slot's span).
                for entry in entries.drain(..) {
                    self.place(entry, self.now_tick);
                }
                // Give the emptied vector's capacity back, so that a timer re-armed into this
                // slot on the next turn allocates nothing, unless it is larger than worth keeping.
                if entries.capacity() <= SLOT_KEEP {
                    self.levels[level][slot] = entries;
                } else {
                    self.levels[level][slot] = Vec::with_capacity(SLOT_CAPACITY);
                }
            }
            let slot = (self.now_tick as usize) & (SLOTS - 1);
            let mut due = core::mem::take(&mut self.levels[0][slot]);
            self.occupied[0] &= !(1u64 << slot);
            for entry in due.drain(..) {
                self.positions[entry.key as usize] = None;
                expired.push((entry.key, entry.generation));
                self.len -= 1;
            }
            // Give the (now empty) vector's capacity back to the slot.
            self.levels[0][slot] = due;
        }
    }

    /// A lower bound on the next expiry: the start of the earliest non-empty slot.
    pub fn next_expiry(&self) -> Option<Instant> {
        if self.len == 0 {
            return None;
        }
        let mut best: Option<u64> = None;
        for level in 0..LEVELS {
            if self.occupied[level] == 0 {
                continue;
            }
            let shift = SLOT_BITS as usize * level;
            let current = (self.now_tick >> shift) as usize;
            // The first occupied slot after the current one, found by rotating the bitmap.
            let from = ((current + 1) & (SLOTS - 1)) as u32;
            let step = u64::from(self.occupied[level].rotate_right(from).trailing_zeros()) + 1;
            let index = current as u64 + step;
            let slot = (index as usize) & (SLOTS - 1);
            let start = if level == 0 {
                self.levels[0][slot]
                    .iter()
                    .map(|e| e.tick)
                    .min()
                    .unwrap_or(index)
            } else {
                (index << shift).max(self.now_tick + 1)
            };
            best = Some(best.map_or(start, |b| b.min(start)));
        }
        best.map(|tick| Instant::from_nanos(tick * self.tick_nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn expires_in_order_across_levels() {
        let mut wheel = TimerWheel::new(MS, Instant::ZERO);
        let deadlines = [5u64, 63, 64, 65, 4095, 4096, 300_000, 1];
        for (i, d) in deadlines.iter().enumerate() {
            wheel.insert(Instant::from_millis(*d), i as u32, 0);
        }
        let mut expired = Vec::new();
        let mut fired_at = vec![0u64; deadlines.len()];
        let mut now = 0;
        while !wheel.is_empty() {
            let next = wheel.next_expiry().unwrap().as_millis();
            assert!(next > now);
            now = next;
            wheel.advance(Instant::from_millis(now), &mut expired);
            for (key, _) in expired.drain(..) {
                fired_at[key as usize] = now;
            }
        }
        assert_eq!(fired_at, deadlines.to_vec());
    }

    #[test]
    fn inserting_a_key_again_moves_its_entry() {
        let mut wheel = TimerWheel::new(MS, Instant::ZERO);
        wheel.insert(Instant::from_millis(300), 1, 0);
        wheel.insert(Instant::from_millis(70), 2, 0);
        wheel.insert(Instant::from_millis(5), 1, 1);
        wheel.insert(Instant::from_millis(71), 3, 0);
        wheel.insert(Instant::from_millis(80), 2, 1);
        assert_eq!(wheel.len(), 3, "one entry per key");
        let mut expired = Vec::new();
        wheel.advance(Instant::from_millis(1000), &mut expired);
        assert_eq!(expired, vec![(1, 1), (3, 0), (2, 1)]);
        assert!(wheel.is_empty());
        // Keys whose entries expired or moved are free to come back.
        wheel.insert(Instant::from_millis(1001), 2, 2);
        wheel.advance(Instant::from_millis(1001), &mut expired);
        assert_eq!(expired.last(), Some(&(2, 2)));
    }

    #[test]
    fn rounds_up_and_never_fires_early() {
        let mut wheel = TimerWheel::new(MS, Instant::from_millis(10));
        wheel.insert(Instant::from_nanos(12 * MS + 1), 7, 3);
        let mut expired = Vec::new();
        wheel.advance(Instant::from_millis(12), &mut expired);
        assert!(expired.is_empty());
        wheel.advance(Instant::from_millis(13), &mut expired);
        assert_eq!(expired, vec![(7, 3)]);
        // A deadline in the past fires on the next tick.
        wheel.insert(Instant::from_millis(1), 8, 0);
        wheel.advance(Instant::from_millis(14), &mut expired);
        assert_eq!(expired.last(), Some(&(8, 0)));
    }
}
