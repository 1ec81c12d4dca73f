//! The bulk sender, the client side of the evaluation (docs/evaluation.md): a connection the
//! stack opens itself and keeps full of data until the runner stops, dropping whatever the
//! peer sends. Its receiver is any sink, such as a discard service.

use super::Verdict;

/// What one refill queues.
static CHUNK: [u8; 64 * 1024] = [0; 64 * 1024];

/// A bulk-sending session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bulk;

impl Bulk {
    /// Drops `input`; the sending never depends on it.
    pub fn on_input(&mut self, input: &[u8]) -> Verdict {
        let _ = input;
        Verdict::KeepOpen
    }

    /// Queues the next chunk of data.
    pub fn refill(&mut self, output: &mut Vec<u8>) {
        output.extend_from_slice(&CHUNK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_has_more_to_send_and_ignores_input() {
        let mut bulk = Bulk;
        let mut output = Vec::new();
        bulk.refill(&mut output);
        bulk.refill(&mut output);
        assert_eq!(output.len(), 2 * CHUNK.len());
        assert_eq!(bulk.on_input(b"anything"), Verdict::KeepOpen);
    }
}
