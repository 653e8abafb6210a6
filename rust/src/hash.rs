//! Content hashes of media: BLAKE3, the hash the contracts name for encoder-cache keys (vLLM's
//! `mm_hashes`, TokenSpeed's `content_hash`).
//!
//! A digest covers a sequence of byte strings, each framed by its length, so that no two
//! different sequences hash alike (`["ab", "c"]` differs from `["a", "bc"]`). The crate's SIMD
//! code hashes several GB/s on one core, so the Python layer releases the GIL around it.

/// The 32-byte BLAKE3 digest of `parts`, each preceded by its length as a little-endian u64.
pub fn digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    *hasher.finalize().as_bytes()
}

/// The plain BLAKE3 hash of `data` (TokenSpeed's `content_hash` is this of a hex digest).
pub fn plain(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_is_blake3_of_nothing() {
        // BLAKE3 of the empty string, from the reference test vectors.
        assert_eq!(
            hex(&digest([])),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn parts_are_length_framed() {
        let ab_c = digest([&b"ab"[..], &b"c"[..]]);
        let a_bc = digest([&b"a"[..], &b"bc"[..]]);
        assert_ne!(ab_c, a_bc);
        let mut framed = Vec::new();
        for part in [&b"ab"[..], &b"c"[..]] {
            framed.extend_from_slice(&(part.len() as u64).to_le_bytes());
            framed.extend_from_slice(part);
        }
        assert_eq!(ab_c, *blake3::hash(&framed).as_bytes());
    }

    #[test]
    fn a_large_part_is_framed_once() {
        let data: Vec<u8> = (0..(3 * 1024 * 1024 + 17))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut framed = (data.len() as u64).to_le_bytes().to_vec();
        framed.extend_from_slice(&data);
        assert_eq!(digest([&data[..]]), *blake3::hash(&framed).as_bytes());
    }

    #[test]
    fn plain_matches_the_reference_vector() {
        // BLAKE3("abc"), from the reference implementation's test vectors.
        assert_eq!(
            hex(&plain(b"abc")),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0x00, 0xab, 0xff]), "00abff");
    }
}
