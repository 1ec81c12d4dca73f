//! The bulk sender, the client side of the evaluation (docs/evaluation.md): a connection the
//! stack opens itself and keeps full of data (zeros, written in place into the send ring)
//! until the runner stops, dropping whatever the peer sends. Its receiver is any sink, such
//! as a discard service.

/// A bulk-sending session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bulk;

impl Bulk {
    /// Drops `input`; the sending never depends on it. Returns the bytes consumed: all.
    pub fn on_input(&mut self, input: &[u8]) -> usize {
        input.len()
    }

    /// Fills `space` (the send ring's free space) with the next data; returns the bytes
    /// written: all of it.
    pub fn fill(&mut self, space: &mut [u8]) -> usize {
        space.fill(0);
        space.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_all_the_room_and_ignores_input() {
        let mut bulk = Bulk;
        let mut space = [7u8; 1000];
        assert_eq!(bulk.fill(&mut space), 1000);
        assert!(space.iter().all(|&b| b == 0));
        assert_eq!(bulk.fill(&mut []), 0);
        assert_eq!(bulk.on_input(b"anything"), 8);
    }
}
