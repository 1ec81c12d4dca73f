//! The stamp the XDP redirect program (`bpf/redirect.c`) puts in the XDP metadata before each
//! frame it redirects, which the AF_XDP socket reads to measure how long frames waited
//! between the program and the shard (the stats' `rxWait`).

/// Bytes of XDP metadata the program writes before each frame it redirects: the kernel's
/// monotonic clock in nanoseconds (`bpf_ktime_get_ns`), then that value XOR
/// [`RX_STAMP_CHECK`], both in host byte order.
pub const RX_STAMP_LEN: usize = 16;
/// The check word's key (`RX_STAMP_CHECK` in `bpf/redirect.c`): bytes that are not a stamp
/// (a driver without room for metadata, a frame the program never saw) fail the check.
pub const RX_STAMP_CHECK: u64 = 0x7573_746b_7278_7374;

/// The program's stamp in the [`RX_STAMP_LEN`] bytes before a frame, if they hold one.
pub fn rx_stamp(meta: &[u8; RX_STAMP_LEN]) -> Option<u64> {
    let (stamp, check) = meta.split_at(8);
    let stamp = u64::from_ne_bytes(stamp.try_into().ok()?);
    let check = u64::from_ne_bytes(check.try_into().ok()?);
    (stamp != 0 && check == stamp ^ RX_STAMP_CHECK).then_some(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(stamp: u64, check: u64) -> [u8; RX_STAMP_LEN] {
        let mut meta = [0; RX_STAMP_LEN];
        meta[..8].copy_from_slice(&stamp.to_ne_bytes());
        meta[8..].copy_from_slice(&check.to_ne_bytes());
        meta
    }

    #[test]
    fn a_stamp_is_read_only_with_its_check_word() {
        let now = 1_234_567_890_123;
        assert_eq!(rx_stamp(&meta(now, now ^ RX_STAMP_CHECK)), Some(now));
        // Stale or foreign bytes: a wrong check, a cleared stamp, zeroed headroom.
        assert_eq!(rx_stamp(&meta(now, now)), None);
        assert_eq!(rx_stamp(&meta(now + 1, now ^ RX_STAMP_CHECK)), None);
        assert_eq!(rx_stamp(&meta(0, RX_STAMP_CHECK)), None);
        assert_eq!(rx_stamp(&[0; RX_STAMP_LEN]), None);
    }
}
