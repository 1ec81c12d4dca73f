//! The echo service (RFC 862 over TCP): every byte received is sent back.

use super::Verdict;

/// An echo session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Echo;

impl Echo {
    /// Echoes `input` into `output`.
    pub fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>) -> Verdict {
        output.extend_from_slice(input);
        Verdict::KeepOpen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_every_byte_in_order() {
        let mut echo = Echo;
        let mut out = Vec::new();
        assert_eq!(echo.on_input(b"abc", &mut out), Verdict::KeepOpen);
        assert_eq!(echo.on_input(b"", &mut out), Verdict::KeepOpen);
        assert_eq!(echo.on_input(b"de", &mut out), Verdict::KeepOpen);
        assert_eq!(out, b"abcde");
    }
}
