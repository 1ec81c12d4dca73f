//! The echo service (RFC 862 over TCP): every byte received is sent back, copied once, from
//! the receive ring straight into the send ring.

/// An echo session; it has no state of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Echo;

impl Echo {
    /// Echoes the head of `input` into `output` (the send ring's free space), as much as
    /// fits; returns how many bytes, consumed and written alike. What did not fit waits in
    /// the receive ring for room.
    pub fn on_input(&mut self, input: &[u8], output: &mut [u8]) -> usize {
        let n = input.len().min(output.len());
        output[..n].copy_from_slice(&input[..n]);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_every_byte_in_order_as_far_as_there_is_room() {
        let mut echo = Echo;
        let mut out = [0u8; 5];
        assert_eq!(echo.on_input(b"abc", &mut out), 3);
        assert_eq!(echo.on_input(b"", &mut out[3..]), 0);
        assert_eq!(echo.on_input(b"defg", &mut out[3..]), 2, "room for two");
        assert_eq!(&out, b"abcde");
        assert_eq!(
            echo.on_input(b"fg", &mut []),
            0,
            "no room: nothing consumed"
        );
    }
}
