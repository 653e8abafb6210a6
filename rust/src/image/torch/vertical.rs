//! The vertical pass of torch's `uint8` resize, written once over the vector width: 32 samples
//! per step with AVX2 (`__m256i`), 64 with AVX-512 (`__m512i`).
//!
//! The input rows come in pairs (`2q`, `2q + 1`): a pair is interleaved byte by byte and
//! zero-extended once, then each output row of the block adds its packed weight pair
//! `(w₂q, w₂q₊₁)` times it (`vpmaddwd` + `vpaddd`, or VNNI's `vpdpwssd`, the same wrapping sum).
//! The unpacks and packs work within 128-bit lanes, so each lane's 16 samples come back in
//! order at either width.

use std::arch::x86_64::__m128i;

use super::stream::ROWS;

/// The integer vector operations of the vertical kernel on one instruction set's vectors.
/// Implementations make every method `#[inline(always)]`: called from [`vertical`] inside a
/// function that enables the instruction set, they and their intrinsics inline there.
///
/// Every method is `unsafe` for one reason beyond those it states: the CPU must have the
/// implementation's instruction set.
pub(super) trait Lanes: Copy {
    /// Bytes (samples) per vector.
    const BYTES: usize;

    /// # Safety
    /// The instruction set; `p` must start [`BYTES`](Self::BYTES) readable bytes.
    unsafe fn load(p: *const u8) -> Self;

    /// # Safety
    /// The instruction set; `p` must start [`BYTES`](Self::BYTES) writable bytes.
    unsafe fn store(p: *mut u8, v: Self);

    /// # Safety
    /// The instruction set.
    unsafe fn zero() -> Self;

    /// # Safety
    /// The instruction set.
    unsafe fn splat(x: i32) -> Self;

    /// Per 128-bit lane, the low (`HI` false) or high eight bytes of `a` and `b` interleaved.
    ///
    /// # Safety
    /// The instruction set.
    unsafe fn unpack8<const HI: bool>(a: Self, b: Self) -> Self;

    /// `acc + (v₀·w₀ + v₁·w₁)` per dword of `i16` pairs, wrapping.
    ///
    /// # Safety
    /// The instruction set.
    unsafe fn dot_add(acc: Self, v: Self, w: Self) -> Self;

    /// Each dword shifted right arithmetically by `count`'s low 64 bits.
    ///
    /// # Safety
    /// The instruction set.
    unsafe fn shift(v: Self, count: __m128i) -> Self;

    /// Per 128-bit lane, the dwords of `s[0..4]` narrowed with signed then unsigned saturation
    /// to bytes, in order.
    ///
    /// # Safety
    /// The instruction set.
    unsafe fn pack(s: [Self; 4]) -> Self;
}

/// [`super::stream::Kernels::vertical`] on vectors `L`.
///
/// # Safety
/// The CPU must have `L`'s instruction set, and the function calling this one must enable it;
/// the pointers as [`super::stream::Kernels::vertical`] requires.
#[inline(always)]
pub(super) unsafe fn vertical<L: Lanes, const R: usize>(
    rows: &[*const u8],
    weights: &[i32],
    precision: u32,
    n: usize,
    out: [*mut u8; R],
) {
    let step = L::BYTES;
    let pairs = rows.len() / 2;
    assert!(n >= step && weights.len() >= pairs * ROWS);
    // The blocks below are sound because the CPU has `L`'s instruction set (the caller's
    // contract), the loads read `step` bytes at `at ≤ n − step` of rows at least `n` long, and
    // the stores write `step` bytes at `at` of output rows `n` long (the caller's).
    // SAFETY: see above.
    let (rounding, zero) = unsafe { (L::splat(1 << (precision - 1)), L::zero()) };
    // SAFETY: SSE2 is part of x86-64.
    let count = unsafe { std::arch::x86_64::_mm_cvtsi32_si128(precision as i32) };
    let mut i = 0;
    loop {
        // The last step overlaps the one before when n is not a multiple of the step: those
        // samples are computed again, to the same values.
        let at = i.min(n - step);
        let mut acc = [[rounding; 4]; R];
        for q in 0..pairs {
            // SAFETY: see above.
            unsafe {
                let (r0, r1) = (
                    L::load(rows[2 * q].add(at)),
                    L::load(rows[2 * q + 1].add(at)),
                );
                let x = L::unpack8::<false>(r0, r1);
                let y = L::unpack8::<true>(r0, r1);
                // Per 128-bit lane L: samples 16L + [0..4], [4..8], [8..12], [12..16], each
                // dword (row 2q's byte, row 2q + 1's byte) as two i16.
                let v = [
                    L::unpack8::<false>(x, zero),
                    L::unpack8::<true>(x, zero),
                    L::unpack8::<false>(y, zero),
                    L::unpack8::<true>(y, zero),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = L::splat(weights[q * ROWS + r]);
                    for k in 0..4 {
                        acc[k] = L::dot_add(acc[k], v[k], w);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: see above.
            unsafe {
                let bytes = L::pack([
                    L::shift(acc[0], count),
                    L::shift(acc[1], count),
                    L::shift(acc[2], count),
                    L::shift(acc[3], count),
                ]);
                L::store(out[r].add(at), bytes);
            }
        }
        if at + step >= n {
            break;
        }
        i += step;
    }
}
