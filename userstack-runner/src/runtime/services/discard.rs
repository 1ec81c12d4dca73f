//! The discard service (RFC 863 over TCP): every byte received is read and dropped.

use super::Verdict;

/// A discard session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Discard;

impl Discard {
    /// Drops `input`; never answers.
    pub fn on_input(&mut self, input: &[u8]) -> Verdict {
        let _ = input;
        Verdict::KeepOpen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_answers_and_stays_open() {
        let mut discard = Discard;
        assert_eq!(discard.on_input(&[7; 4096]), Verdict::KeepOpen);
    }
}
