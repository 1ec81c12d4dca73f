//! Out-of-order bookkeeping for the receive side: which byte ranges beyond RCV.NXT are held,
//! and which of them changed most recently (RFC 2018 section 4 orders SACK blocks by recency).

/// Ranges are offsets from RCV.NXT, half-open, sorted, and neither overlapping nor adjacent.
#[derive(Debug, Clone)]
pub struct Assembler {
    ranges: Vec<(u32, u32)>,
    /// Start offsets of ranges, most recently extended first (at most four).
    recent: [u32; 4],
    recent_len: usize,
    max_ranges: usize,
}

/// What adding a range found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Added {
    /// Some of the bytes were new.
    New,
    /// Every byte was already held: a duplicate (D-SACK material, RFC 2883).
    Duplicate,
    /// Accepting it would exceed the range limit; the segment must be dropped.
    Full,
}

impl Assembler {
    /// An empty assembler holding at most `max_ranges` disjoint ranges.
    pub fn new(max_ranges: usize) -> Assembler {
        Assembler {
            ranges: Vec::new(),
            recent: [0; 4],
            recent_len: 0,
            max_ranges: max_ranges.max(1),
        }
    }

    /// Whether nothing is held out of order.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The held ranges, lowest first.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    fn containing(&self, offset: u32) -> Option<(u32, u32)> {
        self.ranges
            .iter()
            .copied()
            .find(|&(s, e)| s <= offset && offset < e)
    }

    /// Records bytes `[start, end)`.
    pub fn add(&mut self, start: u32, end: u32) -> Added {
        if start >= end {
            return Added::Duplicate;
        }
        if let Some((s, e)) = self.containing(start) {
            if end <= e {
                self.touch(s);
                return Added::Duplicate;
            }
        }
        // Ranges overlapping or adjacent to [start, end) merge with it.
        let first = self.ranges.partition_point(|&(_, e)| e < start);
        let last = self.ranges.partition_point(|&(s, _)| s <= end);
        if first == last && self.ranges.len() >= self.max_ranges && start != 0 {
            return Added::Full;
        }
        let mut merged = (start, end);
        if first < last {
            merged.0 = merged.0.min(self.ranges[first].0);
            merged.1 = merged.1.max(self.ranges[last - 1].1);
        }
        self.ranges.splice(first..last, core::iter::once(merged));
        self.touch(merged.0);
        Added::New
    }

    fn touch(&mut self, start: u32) {
        let mut recent = [start, 0, 0, 0];
        let mut len = 1;
        for &offset in &self.recent[..self.recent_len] {
            if let Some((s, _)) = self.containing(offset) {
                if !recent[..len].contains(&s) && len < 4 {
                    recent[len] = s;
                    len += 1;
                }
            }
        }
        self.recent = recent;
        self.recent_len = len;
    }

    /// Removes the range starting at offset 0, if any, shifts the rest down and returns its
    /// length: the bytes that just became in order.
    pub fn take_contiguous(&mut self) -> u32 {
        match self.ranges.first() {
            Some(&(0, end)) => {
                self.ranges.remove(0);
                for range in &mut self.ranges {
                    range.0 -= end;
                    range.1 -= end;
                }
                let mut kept = 0;
                for i in 0..self.recent_len {
                    if self.recent[i] >= end {
                        self.recent[kept] = self.recent[i] - end;
                        kept += 1;
                    }
                }
                self.recent_len = kept;
                end
            }
            _ => 0,
        }
    }

    /// Held ranges in SACK order: the most recently changed first, then the rest by recency.
    pub fn recent_ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.recent[..self.recent_len]
            .iter()
            .filter_map(|&s| self.containing(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_delivers() {
        let mut a = Assembler::new(8);
        assert_eq!(a.add(10, 20), Added::New);
        assert_eq!(a.add(30, 40), Added::New);
        assert_eq!(a.add(12, 18), Added::Duplicate);
        assert_eq!(
            a.recent_ranges().collect::<Vec<_>>(),
            vec![(10, 20), (30, 40)]
        );
        assert_eq!(a.add(20, 30), Added::New);
        assert_eq!(a.ranges(), &[(10, 40)]);
        assert_eq!(a.take_contiguous(), 0);
        assert_eq!(a.add(0, 10), Added::New);
        assert_eq!(a.take_contiguous(), 40);
        assert!(a.is_empty());
    }

    #[test]
    fn recency_order_and_limit() {
        let mut a = Assembler::new(2);
        a.add(10, 20);
        a.add(30, 40);
        assert_eq!(a.add(50, 60), Added::Full);
        a.add(40, 45);
        let order: Vec<_> = a.recent_ranges().collect();
        assert_eq!(order, vec![(30, 45), (10, 20)]);
        a.add(0, 12);
        assert_eq!(a.take_contiguous(), 20);
        assert_eq!(a.recent_ranges().collect::<Vec<_>>(), vec![(10, 25)]);
    }
}
