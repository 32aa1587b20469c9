//! Eight bytes a step: the byte tests the scanners make, on a `u64` read little-endian, each
//! exact per byte (no carry or borrow crosses from one byte into the next).

pub(super) const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = ONES * 0x80;

/// The eight bytes from `i`, zeros past the end of `bytes`. The whole-word read is the common
/// case; only the last few bytes of a text take the copy.
pub(super) fn load(bytes: &[u8], i: usize) -> u64 {
    if let Some(&word) = bytes.get(i..).and_then(|rest| rest.first_chunk::<8>()) {
        return u64::from_le_bytes(word);
    }
    let mut word = [0u8; 8];
    let part = bytes.get(i..).unwrap_or_default();
    for (slot, b) in word.iter_mut().zip(part) {
        *slot = *b;
    }
    u64::from_le_bytes(word)
}

/// 0x80 in each byte of `x` strictly between `m` and `n` (both at most 128), 0 in the others.
/// The low seven bits are added apart from the high one, so no byte carries into its neighbour.
pub(super) fn between(x: u64, m: u64, n: u64) -> u64 {
    let low = x & (ONES * 127);
    (ONES * (127 + n)).wrapping_sub(low) & !x & low.wrapping_add(ONES * (127 - m)) & HIGH
}

/// 0x80 in each byte of `x` equal to `b`.
pub(super) fn equal(x: u64, b: u8) -> u64 {
    let y = x ^ (ONES * u64::from(b));
    // A byte is zero when neither its high bit nor (its low bits + 0x7F) sets bit 7.
    !(((y & (ONES * 127)).wrapping_add(ONES * 127)) | y) & HIGH
}

/// Byte j's mark (0x80) to bit j.
pub(super) fn bits(marks: u64) -> u64 {
    ((marks >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// `[0-9]`.
pub(super) fn digit(x: u64) -> u64 {
    between(x, 0x2F, 0x3A)
}

/// `[A-Za-z0-9]`.
pub(super) fn alnum(x: u64) -> u64 {
    digit(x) | between(x | (ONES * 0x20), 0x60, 0x7B)
}

/// `[A-Za-z0-9_]`: the word characters of `\b` without the Unicode flag.
pub(super) fn word(x: u64) -> u64 {
    alnum(x) | equal(x, b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_in_every_lane() {
        for lane in 0..8 {
            for b in 0..=255u8 {
                // Neighbours that would carry or borrow into the lane if the tests leaked.
                for fill in [0x00u8, 0xFF, 0x5F, 0x7F, 0x80, 0x2F] {
                    let mut bytes = [fill; 8];
                    bytes[lane] = b;
                    let x = u64::from_le_bytes(bytes);
                    let at = |m: u64| (bits(m) >> lane) & 1 == 1;
                    assert_eq!(at(equal(x, b'_')), b == b'_', "{b:#x} lane {lane}");
                    assert_eq!(at(equal(x, b'#')), b == b'#', "{b:#x} lane {lane}");
                    let w = b.is_ascii_alphanumeric() || b == b'_';
                    assert_eq!(at(word(x)), w, "{b:#x} lane {lane} fill {fill:#x}");
                    assert_eq!(at(digit(x)), b.is_ascii_digit());
                    assert_eq!(at(alnum(x)), b.is_ascii_alphanumeric());
                }
            }
        }
        assert_eq!(load(b"abc", 1), u64::from_le_bytes(*b"bc\0\0\0\0\0\0"));
        assert_eq!(load(b"abcdefghij", 2), u64::from_le_bytes(*b"cdefghij"));
        assert_eq!(load(b"abc", 3), 0);
        assert_eq!(load(b"abc", 9), 0);
    }
}
