//! AVX2 kernels for the two 8-bit passes, exact to the last bit.
//!
//! Pillow's weights have 22 fractional bits, too many for the 16-bit multiply-add
//! (`vpmaddwd`) that fast resizers use with reduced-precision weights. Each weight is split
//! exactly into `w = hi·2¹⁶ + lo` with `lo` its low 16 bits read as signed and `hi = (w − lo) >>
//! 16` (|hi| ≤ 85 for Pillow's weights; the split is exact for any `i32`), both `i16`. Two `vpmaddwd` accumulate `Σ p·lo` and `Σ p·hi` in `i32`, and
//! `2²¹ + Σ p·lo + (Σ p·hi << 16)` is the very integer Pillow computes (wrapping `i32`
//! arithmetic is exact modulo 2³², and the true value fits in `i32`).
//!
//! Horizontal pass: output samples are computed eight at a time (a group; four per 128-bit
//! lane). A lane holds consecutive samples whose taps start within a 16-byte window of the row;
//! one unaligned 16-byte load per lane and one `vpshufb` give, per sample, the pair of taps
//! `(2p, 2p + 1)` zero-extended to `i16` (byte offsets `d` and `d + channels` in the window).
//! When all eight samples fit one window (shrinking by less than ~1.6×) both lanes come from a
//! single `vbroadcasti128`. Large reductions put fewer samples in a lane, which still works
//! because each sample then has many taps. Shuffle controls and split weights are built once
//! per axis ([`HorizontalPlan`]); up to four rows are computed together so that each control
//! and weight vector is loaded once for all of them.
//!
//! Vertical pass: 32 samples at a time; the bytes of two input rows are interleaved into `i16`
//! pairs and multiplied by the split weights of those two taps with the same two `vpmaddwd`.

use std::arch::x86_64::*;

use super::coeffs::{AxisCoeffs, PRECISION_BITS, ROUNDING};
use super::scalar::horizontal_samples_scalar;

/// Whether the running CPU has AVX2.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// Samples per 128-bit lane.
const LANE_SLOTS: usize = 4;
/// Bytes one lane load covers.
const WINDOW: usize = 16;
/// `vpshufb` index that writes zero.
const ZERO: u8 = 0x80;

/// Eight (or fewer) consecutive output samples computed together.
#[derive(Clone, Copy, Debug)]
struct Group {
    /// Index of the first output sample in the row.
    out: u32,
    /// Samples in the low and high lane.
    n_lo: u8,
    n_hi: u8,
    /// Tap pairs to accumulate.
    pairs: u32,
    /// Byte offsets of the two lane loads (for pair 0) from the start of the input row; equal
    /// when the group's samples share one window.
    base_lo: u32,
    base_hi: u32,
    /// One past the last byte any load of this group reads, from the start of the row.
    read_end: u32,
}

/// The precomputed horizontal pass of one axis for one channel count.
pub(crate) struct HorizontalPlan {
    groups: Vec<Group>,
    /// Per group, the `vpshufb` control that builds its tap pairs from the lane loads.
    masks: Vec<[u8; 32]>,
    /// Per group and tap pair, the `lo` then the `hi` weight vector, in group order.
    weights: Vec<[i16; 16]>,
    /// Bytes (`2 × channels`) the loads advance per tap pair.
    step: usize,
    /// The largest `read_end` of all groups.
    read_len: usize,
    /// How many leading groups have four samples in both lanes.
    full_prefix: usize,
    /// Whether every group's two lanes share one window (one broadcast load per pair).
    shared: bool,
}

/// `w = hi·2¹⁶ + lo`, both halves `i16`.
pub(crate) fn split(w: i32) -> (i16, i16) {
    let lo = w as i16;
    let hi = (w - i32::from(lo)) >> 16;
    (lo, hi as i16)
}

/// A run of consecutive output samples read through one window: first sample, count, and the
/// window's start (the smallest first-tap byte of its samples).
type Lane = (usize, usize, usize);

impl HorizontalPlan {
    pub(crate) fn new(coeffs: &AxisCoeffs, channels: usize) -> HorizontalPlan {
        let c = channels;
        let n_samples = coeffs.out_len() * c;
        let first_byte = |j: usize| coeffs.starts[j / c] * c + j % c;
        // Tap starts are not monotonic within a run (pixel x + 1 may start where pixel x does,
        // so its channel 0 sits before x's channel 2): a window starts at the smallest start.
        let span = |first: usize, n: usize| {
            let bytes = (first..first + n).map(first_byte);
            let (min, max) = bytes.fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            (min, max - min + c)
        };

        // Lanes: runs of up to four consecutive samples whose pair loads fit one window.
        let mut lanes: Vec<Lane> = Vec::new();
        let mut j = 0;
        while j < n_samples {
            let mut n = 1;
            while n < LANE_SLOTS && j + n < n_samples && span(j, n + 1).1 < WINDOW {
                n += 1;
            }
            lanes.push((j, n, span(j, n).0));
            j += n;
        }

        let mut groups = Vec::with_capacity(lanes.len().div_ceil(2));
        let mut masks = Vec::with_capacity(lanes.len().div_ceil(2));
        let mut weights = Vec::new();
        let mut shared = true;
        for pair in lanes.chunks(2) {
            let mut lo = pair[0];
            let mut hi = pair.get(1).copied().unwrap_or((lo.0 + lo.1, 0, lo.2));
            let (min, width) = span(lo.0, lo.1 + hi.1);
            if width < WINDOW {
                (lo.2, hi.2) = (min, min);
            } else {
                shared = false;
            }
            let taps = (lo.0..hi.0 + hi.1)
                .map(|j| coeffs.counts[j / c])
                .max()
                .unwrap_or(0);
            let pairs = taps.div_ceil(2);

            let mut mask = [ZERO; 32];
            let first_w = weights.len();
            weights.resize(first_w + 2 * pairs, [0i16; 16]);
            for (lane, (first, count, base)) in [lo, hi].into_iter().enumerate() {
                for slot in 0..count {
                    let j = first + slot;
                    let d = first_byte(j) - base;
                    let m = lane * 16 + slot * 4;
                    mask[m] = d as u8;
                    mask[m + 2] = (d + c) as u8;
                    let (_, w) = coeffs.taps(j / c);
                    for p in 0..pairs {
                        for t in 0..2 {
                            let (wl, wh) = split(w.get(2 * p + t).copied().unwrap_or(0));
                            let i = lane * 8 + slot * 2 + t;
                            weights[first_w + 2 * p][i] = wl;
                            weights[first_w + 2 * p + 1][i] = wh;
                        }
                    }
                }
            }
            let last_load = lo.2.max(hi.2) + 2 * c * pairs.saturating_sub(1);
            groups.push(Group {
                out: lo.0 as u32,
                n_lo: lo.1 as u8,
                n_hi: hi.1 as u8,
                pairs: pairs as u32,
                base_lo: lo.2 as u32,
                base_hi: hi.2 as u32,
                read_end: (last_load + WINDOW) as u32,
            });
            masks.push(mask);
        }
        let read_len = groups
            .iter()
            .map(|g| g.read_end as usize)
            .max()
            .unwrap_or(0);
        let full =
            |g: &&Group| usize::from(g.n_lo) == LANE_SLOTS && usize::from(g.n_hi) == LANE_SLOTS;
        let full_prefix = groups.iter().take_while(full).count();
        HorizontalPlan {
            groups,
            masks,
            weights,
            step: 2 * c,
            read_len,
            full_prefix,
            shared,
        }
    }

    /// Bytes from the start of an input row that the loads may read (past the row's end too).
    pub(crate) fn read_len(&self) -> usize {
        self.read_len
    }

    /// The eight results of group `g` for each of `R` rows, shifted (`acc >> 22`) but not yet
    /// clamped. `weights` points at the group's first weight vector and is advanced past its
    /// last. `SHARED`: both lanes load from `base_lo` with one broadcast.
    ///
    /// # Safety
    /// The CPU must support AVX2; every `src[r]` must be readable up to `src[r] + g.read_end`;
    /// `weights` must point at `2 × g.pairs` readable weight vectors.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn group<const SHARED: bool, const R: usize>(
        &self,
        g: &Group,
        mask: &[u8; 32],
        weights: &mut *const [i16; 16],
        src: [*const u8; R],
    ) -> [__m256i; R] {
        // SAFETY: the caller's contract: the loads read 16 bytes at `base_lo/hi + p·step` for
        // p < pairs, which end at or before `read_end`; the weight vectors are 32 bytes each
        // and 2 × pairs of them are readable; `mask` is 32 bytes.
        unsafe {
            let mask = _mm256_loadu_si256(mask.as_ptr().cast());
            let mut acc_lo = [_mm256_set1_epi32(ROUNDING); R];
            let mut acc_hi = [_mm256_setzero_si256(); R];
            let mut lo = src.map(|s| s.add(g.base_lo as usize));
            let mut hi = src.map(|s| s.add(g.base_hi as usize));
            let mut w = *weights;
            for _ in 0..g.pairs {
                let wl = _mm256_loadu_si256(w.cast());
                let wh = _mm256_loadu_si256(w.add(1).cast());
                for r in 0..R {
                    let v = if SHARED {
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(lo[r].cast()))
                    } else {
                        let a = _mm_loadu_si128(lo[r].cast());
                        let b = _mm_loadu_si128(hi[r].cast());
                        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), b)
                    };
                    let v = _mm256_shuffle_epi8(v, mask);
                    acc_lo[r] = _mm256_add_epi32(acc_lo[r], _mm256_madd_epi16(v, wl));
                    acc_hi[r] = _mm256_add_epi32(acc_hi[r], _mm256_madd_epi16(v, wh));
                    lo[r] = lo[r].add(self.step);
                    hi[r] = hi[r].add(self.step);
                }
                w = w.add(2);
            }
            *weights = w;
            let mut out = [_mm256_setzero_si256(); R];
            for r in 0..R {
                let acc = _mm256_add_epi32(acc_lo[r], _mm256_slli_epi32::<16>(acc_hi[r]));
                out[r] = _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(acc);
            }
            out
        }
    }

    /// Stores group `g`'s results `v` (shifted, unclamped) into `out`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn store(g: &Group, v: __m256i, out: &mut [u8]) {
        let first = g.out as usize;
        let n_lo = usize::from(g.n_lo);
        let n = n_lo + usize::from(g.n_hi);
        let v = _mm256_packs_epi32(v, v);
        let v = _mm256_packus_epi16(v, v);
        let lo = _mm256_cvtsi256_si32(v).to_le_bytes();
        let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(v)).to_le_bytes();
        if first + n_lo + 4 <= out.len() {
            // Four-byte stores; bytes past this group's samples are rewritten by the next
            // group (groups run left to right), and both stores stay inside `out`.
            out[first..first + 4].copy_from_slice(&lo);
            out[first + n_lo..first + n_lo + 4].copy_from_slice(&hi);
        } else {
            out[first..first + n_lo].copy_from_slice(&lo[..n_lo]);
            out[first + n_lo..first + n].copy_from_slice(&hi[..usize::from(g.n_hi)]);
        }
    }

    /// `R` whole rows whose buffers all extend at least `read_len` bytes.
    ///
    /// # Safety
    /// The CPU must support AVX2; `src[r].len() ≥ self.read_len`; `out[r].len()` is the
    /// output row length.
    #[target_feature(enable = "avx2")]
    unsafe fn rows_fast<const SHARED: bool, const R: usize>(
        &self,
        src: [&[u8]; R],
        out: [&mut [u8]; R],
    ) {
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let ptrs = src.map(|s| s.as_ptr());
        let mut weights = self.weights.as_ptr();
        let mut i = 0;
        while i + 2 <= self.full_prefix {
            // SAFETY: every group's loads end within `read_len ≤ src[r].len()`; the weight
            // vectors of groups i and i + 1 follow each other in `self.weights`.
            let (a, b) = unsafe {
                let a =
                    self.group::<SHARED, R>(&self.groups[i], &self.masks[i], &mut weights, ptrs);
                let b = self.group::<SHARED, R>(
                    &self.groups[i + 1],
                    &self.masks[i + 1],
                    &mut weights,
                    ptrs,
                );
                (a, b)
            };
            // Two full groups are 16 consecutive samples: packed and stored at once.
            let first = self.groups[i].out as usize;
            for r in 0..R {
                let v = _mm256_packs_epi32(a[r], b[r]);
                let v = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(v, v), order);
                let dst = &mut out[r][first..first + 16];
                // SAFETY: `dst` is 16 bytes.
                unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), _mm256_castsi256_si128(v)) };
            }
            i += 2;
        }
        for (g, mask) in self.groups[i..].iter().zip(&self.masks[i..]) {
            // SAFETY: as above.
            let v = unsafe { self.group::<SHARED, R>(g, mask, &mut weights, ptrs) };
            for r in 0..R {
                Self::store(g, v[r], out[r]);
            }
        }
    }

    /// One row whose buffer may end before `read_len`: groups that would read past `src` are
    /// computed by the scalar code.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn row_checked(&self, coeffs: &AxisCoeffs, channels: usize, src: &[u8], out: &mut [u8]) {
        let mut weights = self.weights.as_ptr();
        for (g, mask) in self.groups.iter().zip(&self.masks) {
            if g.read_end as usize > src.len() {
                let first = g.out as usize;
                let n = usize::from(g.n_lo) + usize::from(g.n_hi);
                horizontal_samples_scalar(coeffs, channels, src, first, &mut out[first..first + n]);
                // SAFETY: skips this group's 2 × pairs weight vectors, which exist.
                weights = unsafe { weights.add(2 * g.pairs as usize) };
                continue;
            }
            // SAFETY: this group's loads end within `read_end ≤ src.len()`; `weights` points
            // at its weight vectors.
            let [v] = unsafe { self.group::<false, 1>(g, mask, &mut weights, [src.as_ptr()]) };
            Self::store(g, v, out);
        }
    }

    /// One output row per input row (`R` rows at once). `src[r]` starts at an input row and may
    /// extend past it; `out[r]` is exactly one output row.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn rows<const R: usize>(
        &self,
        coeffs: &AxisCoeffs,
        channels: usize,
        src: [&[u8]; R],
        out: [&mut [u8]; R],
    ) {
        let n_samples = coeffs.out_len() * channels;
        assert!(out.iter().all(|o| o.len() == n_samples));
        if src.iter().all(|s| s.len() >= self.read_len) {
            // SAFETY: AVX2 is the caller's contract; the lengths were checked.
            unsafe {
                if self.shared {
                    self.rows_fast::<true, R>(src, out);
                } else {
                    self.rows_fast::<false, R>(src, out);
                }
            }
        } else {
            for (s, o) in src.into_iter().zip(out) {
                // SAFETY: AVX2 is the caller's contract.
                unsafe { self.row_checked(coeffs, channels, s, o) };
            }
        }
    }
}

/// Two taps of a vertical pass: their rows, and the `(lo, lo)` and `(hi, hi)` weight pairs of
/// [`split`] packed as dwords (an odd last tap is paired with itself and a zero weight).
pub(crate) type TapPair = (*const u8, *const u8, i32, i32);

/// Tap pairs of a few taps are built on the stack.
pub(crate) const STACK_PAIRS: usize = 8;
pub(crate) const NO_PAIR: TapPair = (std::ptr::null(), std::ptr::null(), 0, 0);

/// The tap pairs of `rows` and `weights`, in `stack` when they fit, else in `heap`.
pub(crate) fn tap_pairs<'a>(
    rows: &[&[u8]],
    weights: &[i32],
    stack: &'a mut [TapPair; STACK_PAIRS],
    heap: &'a mut Vec<TapPair>,
) -> &'a [TapPair] {
    let pair = |t: usize| -> TapPair {
        let (w0, w1) = (weights[t], weights.get(t + 1).copied().unwrap_or(0));
        let r1 = rows.get(t + 1).unwrap_or(&rows[t]);
        let ((l0, h0), (l1, h1)) = (split(w0), split(w1));
        let dword = |a: i16, b: i16| i32::from(a as u16) | (i32::from(b) << 16);
        (rows[t].as_ptr(), r1.as_ptr(), dword(l0, l1), dword(h0, h1))
    };
    let n_pairs = rows.len().div_ceil(2);
    if n_pairs <= STACK_PAIRS {
        for (k, slot) in stack[..n_pairs].iter_mut().enumerate() {
            *slot = pair(2 * k);
        }
        &stack[..n_pairs]
    } else {
        *heap = (0..n_pairs).map(|k| pair(2 * k)).collect();
        heap
    }
}

/// One vertical output row (see `kernels::vertical_row`).
///
/// Taps are taken in pairs `(t, t + 1)`: the two rows' bytes are interleaved and zero-extended
/// to `i16` pairs, and two `vpmaddwd` (split weights, as in the horizontal pass) accumulate 32
/// samples. An odd last tap is paired with a zero weight.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn vertical_row(rows: &[&[u8]], weights: &[i32], out: &mut [u8]) {
    const STEP: usize = 32;
    let n = out.len();
    if n < STEP {
        super::scalar::vertical_row_scalar(rows, weights, out);
        return;
    }
    assert!(rows.iter().all(|r| r.len() >= n));
    let mut stack = [NO_PAIR; STACK_PAIRS];
    let mut heap = Vec::new();
    let pairs = tap_pairs(rows, weights, &mut stack, &mut heap);
    let zero = _mm256_setzero_si256();
    let rounding = _mm256_set1_epi32(ROUNDING);
    let mut i = 0;
    loop {
        // The last chunk overlaps the previous one when n is not a multiple of 32: those
        // samples are recomputed to the same values.
        let at = i.min(n - STEP);
        // Named accumulators, not arrays mapped by closures: a closure does not inherit
        // `target_feature`, so it is not inlined and the accumulators go through the stack.
        let (mut lo0, mut lo1, mut lo2, mut lo3) = (rounding, rounding, rounding, rounding);
        let (mut hi0, mut hi1, mut hi2, mut hi3) = (zero, zero, zero, zero);
        for &(p0, p1, wl, wh) in pairs {
            // SAFETY: both pointers start rows of at least `n ≥ at + 32` bytes (asserted).
            let (r0, r1) = unsafe {
                (
                    _mm256_loadu_si256(p0.add(at).cast()),
                    _mm256_loadu_si256(p1.add(at).cast()),
                )
            };
            let (wl, wh) = (_mm256_set1_epi32(wl), _mm256_set1_epi32(wh));
            let x = _mm256_unpacklo_epi8(r0, r1);
            let y = _mm256_unpackhi_epi8(r0, r1);
            // Samples [0..4 | 16..20], [4..8 | 20..24], [8..12 | 24..28], [12..16 | 28..32].
            let v0 = _mm256_unpacklo_epi8(x, zero);
            let v1 = _mm256_unpackhi_epi8(x, zero);
            let v2 = _mm256_unpacklo_epi8(y, zero);
            let v3 = _mm256_unpackhi_epi8(y, zero);
            lo0 = _mm256_add_epi32(lo0, _mm256_madd_epi16(v0, wl));
            hi0 = _mm256_add_epi32(hi0, _mm256_madd_epi16(v0, wh));
            lo1 = _mm256_add_epi32(lo1, _mm256_madd_epi16(v1, wl));
            hi1 = _mm256_add_epi32(hi1, _mm256_madd_epi16(v1, wh));
            lo2 = _mm256_add_epi32(lo2, _mm256_madd_epi16(v2, wl));
            hi2 = _mm256_add_epi32(hi2, _mm256_madd_epi16(v2, wh));
            lo3 = _mm256_add_epi32(lo3, _mm256_madd_epi16(v3, wl));
            hi3 = _mm256_add_epi32(hi3, _mm256_madd_epi16(v3, wh));
        }
        let s0 = shifted(lo0, hi0);
        let s1 = shifted(lo1, hi1);
        let s2 = shifted(lo2, hi2);
        let s3 = shifted(lo3, hi3);
        // In-lane packs put the samples back in order: lane 0 gets 0..16, lane 1 16..32.
        let bytes = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
        // SAFETY: `at + 32 ≤ n = out.len()`.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(at).cast(), bytes) };
        if at + STEP >= n {
            break;
        }
        i += STEP;
    }
}

/// `(lo + (hi << 16)) >> 22`: the sums of the split weights recombined and shifted (not yet
/// clamped).
#[target_feature(enable = "avx2")]
#[inline]
fn shifted(lo: __m256i, hi: __m256i) -> __m256i {
    let acc = _mm256_add_epi32(lo, _mm256_slli_epi32::<16>(hi));
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_exact() {
        for w in [
            0,
            1,
            -1,
            32767,
            32768,
            -32768,
            -32769,
            1 << 22,
            -(1 << 22),
            5_000_000,
            -5_000_000,
        ] {
            let (lo, hi) = split(w);
            assert_eq!(i32::from(hi) * 65536 + i32::from(lo), w, "{w}");
        }
    }
}
