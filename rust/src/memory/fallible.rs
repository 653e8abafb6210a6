//! Fallible allocation of buffers whose size comes from the input.
//!
//! `vec![x; n]`, `Vec::with_capacity(n)`, `to_vec()` and `collect()` abort the process when the
//! allocator refuses (an address-space limit, an overcommit policy, a container's memory cap):
//! with untrusted sizes that would take the whole interpreter down. Every buffer sized by an
//! image, a tensor or a message is allocated through these helpers instead, which report the
//! failure as an [`AllocError`] naming the bytes asked for; each caller turns it into its own
//! error type's `OutOfMemory` variant, saying what the buffer was for.
//!
//! The checks are O(1) (one `try_reserve_exact` or one `alloc_zeroed`); none adds a pass over
//! the memory that the infallible form did not make. Zero-filled buffers come from
//! [`zeroed`](super::zeroed) (calloc: fresh pages are not touched), like `vec![0; n]`.

use std::fmt;
use std::mem::MaybeUninit;

/// An allocation of `bytes` bytes that the allocator refused (or that no `usize` can express).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocError {
    pub bytes: u64,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "out of memory: cannot allocate {} bytes", self.bytes)
    }
}

impl std::error::Error for AllocError {}

/// The size in bytes of `len` values of `T`, saturating at `u64::MAX`.
pub fn bytes_of<T>(len: usize) -> u64 {
    let bytes = (len as u128).saturating_mul(std::mem::size_of::<T>() as u128);
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

/// An empty `Vec` with room for exactly `len` values.
pub fn with_capacity<T>(len: usize) -> Result<Vec<T>, AllocError> {
    let mut values = Vec::new();
    values.try_reserve_exact(len).map_err(|_| AllocError {
        bytes: bytes_of::<T>(len),
    })?;
    Ok(values)
}

/// `len` uninitialised values (no pass over the memory).
pub fn uninit<T>(len: usize) -> Result<Vec<MaybeUninit<T>>, AllocError> {
    let mut values = with_capacity::<MaybeUninit<T>>(len)?;
    // SAFETY: the capacity is at least `len` (reserved above) and a `MaybeUninit` value needs no
    // initialisation.
    unsafe { values.set_len(len) };
    Ok(values)
}

/// `vec![value; len]`, fallible: the values are written once, as `vec!` writes them.
pub fn filled<T: Clone>(value: T, len: usize) -> Result<Vec<T>, AllocError> {
    let mut values = with_capacity(len)?;
    values.resize(len, value);
    Ok(values)
}

/// `vec![0; len]`, fallible, from zeroed pages ([`super::zeroed`]: calloc, no write pass).
pub fn zeros<T: super::Zeroable>(len: usize) -> Result<Vec<T>, AllocError> {
    super::zeroed(len).map_err(|bytes| AllocError { bytes })
}

/// `src.to_vec()`, fallible.
pub fn copied<T: Copy>(src: &[T]) -> Result<Vec<T>, AllocError> {
    let mut values = with_capacity(src.len())?;
    values.extend_from_slice(src);
    Ok(values)
}

/// `iter.collect()` of an iterator of `len` items (or fewer), fallible: the room for `len` items
/// is reserved first, so collecting never reallocates.
pub fn collect<T>(len: usize, iter: impl IntoIterator<Item = T>) -> Result<Vec<T>, AllocError> {
    let mut values = with_capacity(len)?;
    values.extend(iter.into_iter().take(len));
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_impossible_sizes_with_the_byte_count() {
        let len = usize::MAX / 2;
        assert_eq!(
            with_capacity::<u8>(len).unwrap_err(),
            AllocError { bytes: len as u64 }
        );
        // The byte count is the element count times the element size, saturating.
        assert_eq!(
            uninit::<f32>(len).unwrap_err(),
            AllocError { bytes: u64::MAX }
        );
        assert_eq!(
            filled(1.0f32, 1 << 61).unwrap_err(),
            AllocError { bytes: 1 << 63 }
        );
        assert_eq!(
            zeros::<u8>(len).unwrap_err(),
            AllocError { bytes: len as u64 }
        );
        assert_eq!(
            collect::<u64>(len, std::iter::repeat(7)).unwrap_err(),
            AllocError { bytes: u64::MAX }
        );
        assert_eq!(
            AllocError { bytes: 2116000000 }.to_string(),
            "out of memory: cannot allocate 2116000000 bytes"
        );
    }

    #[test]
    fn buffers_match_the_infallible_forms() {
        assert_eq!(filled(3u16, 5).unwrap(), vec![3u16; 5]);
        assert_eq!(zeros::<f32>(4).unwrap(), vec![0.0f32; 4]);
        assert_eq!(copied(&[1u8, 2, 3]).unwrap(), vec![1, 2, 3]);
        assert_eq!(collect(3, 10..).unwrap(), vec![10, 11, 12]);
        let v = collect(4, 0..2).unwrap();
        assert_eq!((v, 4), (vec![0, 1], 4));
        let u = uninit::<f32>(6).unwrap();
        assert_eq!((u.len(), u.capacity()), (6, 6));
        let c = with_capacity::<i64>(9).unwrap();
        assert_eq!((c.len(), c.capacity()), (0, 9));
    }
}
