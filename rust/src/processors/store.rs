//! Moving finished values into an output tensor.
//!
//! Values are computed into a small staging row (it stays in the L1 cache) and copied out
//! once. For outputs far larger than the caches the copy uses streaming stores (`movntps`,
//! SSE2, part of every x86-64 CPU): they write whole cache lines straight to memory instead of
//! first reading each line into the cache, which halves the memory traffic of writing a
//! 100 MB `pixel_values`. Elsewhere, and for small outputs that the caller is about to read,
//! it is a plain copy. Either way the stored values are the staged ones, bit for bit.

use super::Out;

/// Outputs of at least this many bytes are written with streaming stores.
pub const STREAM_MIN_BYTES: usize = 8 << 20;

/// Whether an output of `len` `f32` values should be streamed.
pub fn should_stream(len: usize) -> bool {
    len.saturating_mul(4) >= STREAM_MIN_BYTES
}

/// Writes `src` into `dst` (equal lengths), with streaming stores when `stream` is set (call
/// [`fence`] after the last streamed copy of a thread).
pub fn copy(dst: &mut [Out], src: &[f32], stream: bool) {
    assert_eq!(dst.len(), src.len(), "staging and output rows differ");
    #[cfg(target_arch = "x86_64")]
    if stream {
        stream_copy(dst, src);
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stream;
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(s);
    }
}

#[cfg(target_arch = "x86_64")]
fn stream_copy(dst: &mut [Out], src: &[f32]) {
    use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
    let n = dst.len();
    // Values before the first 16-byte boundary (an `f32` slice is 4-byte aligned, so this is
    // exact), then blocks of four, then the rest.
    let misalign = (dst.as_ptr() as usize) % 16;
    let head = (((16 - misalign) % 16) / 4).min(n);
    let body = (n - head) / 4 * 4;
    for (d, &s) in dst[..head].iter_mut().zip(&src[..head]) {
        d.write(s);
    }
    let (d_ptr, s_ptr) = (dst.as_mut_ptr(), src.as_ptr());
    for i in (head..head + body).step_by(4) {
        // SAFETY: `i + 4 <= head + body <= n` = the length of both slices, so the four values
        // read from `src` and the four written to `dst` are in bounds; `dst + i` is 16-byte
        // aligned (`head` values past the first boundary, then steps of 16 bytes), as
        // `_mm_stream_ps` requires; `_mm_loadu_ps` accepts any alignment; SSE2 is part of the
        // x86-64 baseline. `MaybeUninit<f32>` has the layout of `f32` and writing initialises.
        unsafe {
            let v = _mm_loadu_ps(s_ptr.add(i));
            _mm_stream_ps(d_ptr.add(i).cast::<f32>(), v);
        }
    }
    for (d, &s) in dst[head + body..].iter_mut().zip(&src[head + body..]) {
        d.write(s);
    }
}

/// Orders this thread's streaming stores before anything it does next (publishing the output to
/// other threads included).
pub fn fence(streamed: bool) {
    #[cfg(target_arch = "x86_64")]
    if streamed {
        // SAFETY: `sfence` has no operands and no preconditions (SSE, x86-64 baseline).
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = streamed;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offset_and_length_copies_exactly() {
        let src: Vec<f32> = (0..67).map(|i| i as f32 * 1.5 - 3.0).collect();
        for stream in [false, true] {
            for offset in 0..4 {
                for len in 0..(src.len() - offset) {
                    let mut out = vec![Out::new(f32::NAN); src.len()];
                    copy(&mut out[offset..offset + len], &src[..len], stream);
                    fence(stream);
                    for (i, v) in out.iter().enumerate() {
                        // SAFETY: every value was initialised (NaN, then maybe copied over).
                        let v = unsafe { v.assume_init() };
                        if (offset..offset + len).contains(&i) {
                            assert_eq!(v.to_bits(), src[i - offset].to_bits());
                        } else {
                            assert!(v.is_nan(), "value {i} outside the copy was touched");
                        }
                    }
                }
            }
        }
        assert!(should_stream(2 << 20) && !should_stream(1 << 20));
    }
}
