//! The discard service (RFC 863 over TCP): every byte received is dropped where it lies in
//! the receive ring, never copied.

/// A discard session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Discard;

impl Discard {
    /// Drops `input`; never answers. Returns the bytes consumed: all of them.
    pub fn on_input(&mut self, input: &[u8]) -> usize {
        input.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumes_everything_and_never_answers() {
        let mut discard = Discard;
        assert_eq!(discard.on_input(&[7; 4096]), 4096);
        assert_eq!(discard.on_input(&[]), 0);
    }
}
