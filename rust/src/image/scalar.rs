//! The portable 8-bit convolution kernels and Pillow's `clip8`: what [`super::kernels`] runs
//! without SIMD and what the SIMD kernels ([`super::avx2`], [`super::avx512`]) fall back to at
//! row edges. A leaf: it uses only the coefficients, so every kernel module can use it.

use super::coeffs::{AxisCoeffs, PRECISION_BITS, ROUNDING};

/// `clamp(acc >> 22, 0, 255)`: Pillow's `clip8`.
#[inline(always)]
pub(crate) fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The scalar horizontal pass over one row.
pub(crate) fn horizontal_row_scalar(
    coeffs: &AxisCoeffs,
    channels: usize,
    src: &[u8],
    out: &mut [u8],
) {
    match channels {
        1 => horizontal_scalar::<1>(coeffs, src, out),
        3 => horizontal_scalar::<3>(coeffs, src, out),
        _ => horizontal_scalar::<4>(coeffs, src, out),
    }
}

fn horizontal_scalar<const C: usize>(coeffs: &AxisCoeffs, src: &[u8], out: &mut [u8]) {
    for (x, px) in out.chunks_exact_mut(C).enumerate() {
        let (start, weights) = coeffs.taps(x);
        let input = &src[start * C..(start + weights.len()) * C];
        let mut acc = [ROUNDING; C];
        for (p, &w) in input.chunks_exact(C).zip(weights) {
            for c in 0..C {
                acc[c] = acc[c].wrapping_add(i32::from(p[c]).wrapping_mul(w));
            }
        }
        for c in 0..C {
            px[c] = clip8(acc[c]);
        }
    }
}

/// The scalar horizontal pass for output samples `first..first + out.len()` of a row.
pub(crate) fn horizontal_samples_scalar(
    coeffs: &AxisCoeffs,
    channels: usize,
    src: &[u8],
    first: usize,
    out: &mut [u8],
) {
    for (j, o) in (first..).zip(out.iter_mut()) {
        let (x, c) = (j / channels, j % channels);
        let (start, weights) = coeffs.taps(x);
        let mut acc = ROUNDING;
        for (k, &w) in weights.iter().enumerate() {
            acc = acc.wrapping_add(i32::from(src[(start + k) * channels + c]).wrapping_mul(w));
        }
        *o = clip8(acc);
    }
}

/// The scalar vertical pass, in chunks the compiler vectorises (taps outer, samples inner).
pub(crate) fn vertical_row_scalar(rows: &[&[u8]], weights: &[i32], out: &mut [u8]) {
    const CHUNK: usize = 64;
    for (n, chunk) in out.chunks_mut(CHUNK).enumerate() {
        let base = n * CHUNK;
        let mut acc = [ROUNDING; CHUNK];
        let acc = &mut acc[..chunk.len()];
        for (row, &w) in rows.iter().zip(weights) {
            let row = &row[base..base + chunk.len()];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(w));
            }
        }
        for (o, &a) in chunk.iter_mut().zip(acc.iter()) {
            *o = clip8(a);
        }
    }
}
