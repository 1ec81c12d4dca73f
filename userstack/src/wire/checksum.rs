//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).

use std::net::Ipv4Addr;

/// Adds `data` as big-endian 16-bit words into a one's-complement accumulator (RFC 1071
/// section 4.1); an odd trailing byte is padded with zero.
///
/// The sum is taken over native-endian 64-bit loads split into 32-bit halves (deferred
/// carries, RFC 1071 section 2(C)) and byte-swapped at the end, which the one's-complement
/// sum permits (RFC 1071 section 2(B), byte-order independence).
pub fn accumulate(acc: u32, data: &[u8]) -> u32 {
    let mut wide: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        wide += (w & 0xffff_ffff) + (w >> 32);
    }
    let mut rest = chunks.remainder().chunks_exact(2);
    for word in &mut rest {
        wide += u64::from(u16::from_ne_bytes([word[0], word[1]]));
    }
    if let [last] = rest.remainder() {
        wide += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    while wide > 0xffff {
        wide = (wide & 0xffff) + (wide >> 16);
    }
    let native = wide as u16;
    let big_endian = u16::from_be_bytes(native.to_ne_bytes());
    let mut sum = acc + u32::from(big_endian);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// Folds a 32-bit accumulator to 16 bits with end-around carry.
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The Internet checksum of `data`: the one's complement of the one's-complement sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(accumulate(0, data))
}

/// The accumulator seeded with the IPv4 pseudo-header of RFC 9293 section 3.1.
pub fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, length: u16) -> u32 {
    let mut acc = accumulate(0, &src.octets());
    acc = accumulate(acc, &dst.octets());
    acc = accumulate(acc, &[0, protocol]);
    accumulate(acc, &length.to_be_bytes())
}

/// Updates checksum `old_checksum` after a 16-bit field changed from `old_word` to `new_word`,
/// per RFC 1624 equation 3: `HC' = ~(~HC + ~m + m')`.
pub fn update(old_checksum: u16, old_word: u16, new_word: u16) -> u16 {
    let acc = u32::from(!old_checksum) + u32::from(!old_word) + u32::from(new_word);
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3 example bytes: the folded sum is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(accumulate(0, &data)), 0xddf2);
    }

    #[test]
    fn wide_sum_matches_word_by_word_sum() {
        for len in 0..64usize {
            let data: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(151).wrapping_add(7))
                .collect();
            let mut reference = 0u32;
            for pair in data.chunks(2) {
                let word = u32::from(pair[0]) << 8 | u32::from(*pair.get(1).unwrap_or(&0));
                reference += word;
                reference = (reference & 0xffff) + (reference >> 16);
            }
            assert_eq!(fold(accumulate(0, &data)), fold(reference), "len {len}");
        }
    }

    #[test]
    fn incremental_update_matches_recomputation() {
        let mut data = [
            0x45u8, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let sum = checksum(&data);
        data[10..12].copy_from_slice(&sum.to_be_bytes());
        let old = u16::from_be_bytes([data[8], data[9]]);
        data[8] = 63;
        let new = u16::from_be_bytes([data[8], data[9]]);
        let updated = update(sum, old, new);
        data[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(updated, checksum(&data));
    }
}
