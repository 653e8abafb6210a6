//! torch's antialiased `uint8` resize ([`super::resize_u8`]) with AVX2 on its own `int16`
//! weights: each pass is `clamp((2^(p−1) + Σ wᵢ·xᵢ) >> p, 0, 255)` in `i32`, exactly as the
//! scalar formula (integer sums do not depend on their order, and none of them can overflow:
//! `Σ|wᵢ| < 2^(p+1)` and `2^p·wt_max < 2^14`, so `|Σ wᵢ·xᵢ| < 2^31`).
//!
//! Unlike the Pillow resampler's kernels (22-bit weights split in two `i16` halves, two
//! `vpmaddwd` per tap pair), every tap pair is one `vpmaddwd` here, and:
//!
//! - horizontal pass: 8 output samples per group, four per 128-bit lane, each sample's two taps
//!   picked from one 16-byte load per lane by `vpshufb` (a lane's tap bytes within 16 bytes:
//!   reductions up to about 2.5× with three channels; larger ones use the resampler's path),
//!   four input rows at a time sharing the controls and weights;
//! - vertical pass: 32 samples per step, each input row pair interleaved and zero-extended
//!   once for the [`ROWS`](super::stream::ROWS) output rows of a block ([`super::stream`] drives both passes).

use std::arch::x86_64::*;

use super::stream::Kernels;
use super::vertical::{self, Lanes};
use super::Int16Coeffs;

/// Output samples per horizontal group (four per 128-bit lane).
const GROUP: usize = 8;
const LANE: usize = 4;
/// Bytes one horizontal lane load covers.
const WINDOW: usize = 16;
/// `vpshufb` index that writes zero.
const ZERO: u8 = 0x80;

/// Whether the CPU has AVX2.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

#[derive(Clone, Copy, Debug)]
struct Group {
    out: usize,
    n: usize,
    pairs: usize,
    /// Byte offsets of the low and high lane's loads for pair 0 from the row's start.
    base: [usize; 2],
    /// The eight samples fit one 16-byte window: one load serves both lanes (`base` equal).
    shared: bool,
}

/// The horizontal pass of one axis for one channel count.
pub(super) struct Horizontal {
    groups: Vec<Group>,
    /// Per group, the two lanes' `vpshufb` controls.
    controls: Vec<[u8; 32]>,
    /// Per group and tap pair, the 8 samples' `(w₂ₚ, w₂ₚ₊₁)`.
    weights: Vec<[i16; 16]>,
    step: usize,
    /// Bytes from a row's start that the loads may read.
    read_len: usize,
    samples: usize,
    precision: u32,
}

impl Horizontal {
    /// `None` when some lane's taps do not fit one 16-byte window, or the precision is 0.
    pub(super) fn new(k: &Int16Coeffs, channels: usize) -> Option<Horizontal> {
        let c = channels;
        if k.precision == 0 || c == 0 {
            return None;
        }
        let samples = k.starts.len() * c;
        let first_byte = |j: usize| k.starts[j / c] * c + j % c;
        let mut plan = Horizontal {
            groups: Vec::with_capacity(samples.div_ceil(GROUP)),
            controls: Vec::with_capacity(samples.div_ceil(GROUP)),
            weights: Vec::new(),
            step: 2 * c,
            read_len: 0,
            samples,
            precision: k.precision,
        };
        for first in (0..samples).step_by(GROUP) {
            let n = GROUP.min(samples - first);
            let mut base = [0usize; 2];
            for lane in 0..2 {
                let from = first + lane * LANE;
                let to = (from + LANE).min(first + n);
                if from >= to {
                    base[lane] = base[0];
                    continue;
                }
                let (lo, hi) = (from..to)
                    .map(first_byte)
                    .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
                if hi - lo + c >= WINDOW {
                    return None;
                }
                base[lane] = lo;
            }
            let (lo, hi) = (first..first + n)
                .map(first_byte)
                .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            let shared = hi - lo + c < WINDOW;
            let taps = (first..first + n)
                .map(|j| k.counts[j / c])
                .max()
                .unwrap_or(0);
            let pairs = taps.div_ceil(2).max(1);
            let at = plan.weights.len();
            plan.weights.resize(at + pairs, [0i16; 16]);
            let mut control = [ZERO; 32];
            for s in 0..n {
                let j = first + s;
                let d = first_byte(j) - base[s / LANE];
                control[4 * s] = d as u8;
                control[4 * s + 2] = (d + c) as u8;
                let x = j / c;
                let w = &k.weights[x * k.ksize..][..k.counts[x]];
                for p in 0..pairs {
                    for t in 0..2 {
                        plan.weights[at + p][2 * s + t] = w.get(2 * p + t).copied().unwrap_or(0);
                    }
                }
            }
            let end = base[0].max(base[1]) + plan.step * (pairs - 1) + WINDOW;
            plan.read_len = plan.read_len.max(end);
            if shared {
                // Both lanes from the group's lowest byte: each lane's offsets move up by its
                // own base's distance from it.
                for (lane, control) in control.chunks_exact_mut(16).enumerate() {
                    for b in control.iter_mut().filter(|b| **b != ZERO) {
                        *b += (base[lane] - lo) as u8;
                    }
                }
                base = [lo, lo];
            }
            plan.groups.push(Group {
                out: first,
                n,
                pairs,
                base,
                shared,
            });
            plan.controls.push(control);
        }
        Some(plan)
    }

    /// The `R` rows' sums (rounding term included) of group `i`, whose weight vectors start
    /// at `weights`, and the pointer past them.
    ///
    /// # Safety
    /// The CPU must have AVX2; `weights` must point at group `i`'s first weight vector in
    /// `self.weights`; every `ptrs[r]` must start [`read_len`](Self::read_len) readable bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn accumulate<const R: usize>(
        &self,
        i: usize,
        mut weights: *const [i16; 16],
        ptrs: [*const u8; R],
        rounding: __m256i,
    ) -> ([__m256i; R], *const [i16; 16]) {
        let g = self.groups[i];
        let control = &self.controls[i];
        // SAFETY: `control` is 32 bytes; the lane loads read 16 bytes at `base[l] + p·step` for
        // p < pairs, which end within `read_len` (built so in `new`) and so within each row
        // (the caller's); the group's `pairs` weight vectors of 32 bytes follow `weights`.
        unsafe {
            let control = _mm256_loadu_si256(control.as_ptr().cast());
            let mut acc = [rounding; R];
            let (mut lo, mut hi) = (g.base[0], g.base[1]);
            for _ in 0..g.pairs {
                let w = _mm256_loadu_si256(weights.cast());
                for r in 0..R {
                    let v = if g.shared {
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(ptrs[r].add(lo).cast()))
                    } else {
                        _mm256_loadu2_m128i(ptrs[r].add(hi).cast(), ptrs[r].add(lo).cast())
                    };
                    let v = _mm256_shuffle_epi8(v, control);
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(v, w));
                }
                lo += self.step;
                hi += self.step;
                weights = weights.add(1);
            }
            (acc, weights)
        }
    }
}

impl Kernels for Horizontal {
    const STEP: usize = <__m256i as Lanes>::BYTES;

    fn samples(&self) -> usize {
        self.samples
    }

    fn read_len(&self) -> usize {
        self.read_len
    }

    // `R` rows sharing each group's control and weight loads.
    #[target_feature(enable = "avx2")]
    unsafe fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        assert!(src.iter().all(|s| s.len() >= self.read_len));
        assert!(out.iter().all(|o| o.len() == self.samples));
        let ptrs = src.map(|s| s.as_ptr());
        let rounding = _mm256_set1_epi32(1 << (self.precision - 1));
        let shift = _mm_cvtsi32_si128(self.precision as i32);
        // Dwords 0 and 4: the low lane's four bytes, then the high lane's.
        let gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
        // Two groups packed together: the first's lanes (dwords 0, 4), then the second's (1, 5).
        let gather2 = _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0);
        let mut weights = self.weights.as_ptr();
        let mut i = 0;
        while i < self.groups.len() {
            let g = self.groups[i];
            // SAFETY: `accumulate`'s contract: `weights` is group `i`'s first weight vector
            // (the groups' vectors follow each other, `pairs` each, as built in `new`), and the
            // rows are `read_len` long (asserted). The stores write `out[r][g.out..][..16]` for
            // two full adjacent groups (`g.out + 16 ≤ samples`) or `out[r][g.out..][..g.n]`,
            // inside the row.
            unsafe {
                let (acc, next) = self.accumulate::<R>(i, weights, ptrs, rounding);
                weights = next;
                let paired = self
                    .groups
                    .get(i + 1)
                    .filter(|h| g.n == GROUP && h.n == GROUP && h.out == g.out + GROUP);
                if paired.is_some() {
                    let (acc2, next) = self.accumulate::<R>(i + 1, weights, ptrs, rounding);
                    weights = next;
                    for r in 0..R {
                        let a = _mm256_sra_epi32(acc[r], shift);
                        let b = _mm256_sra_epi32(acc2[r], shift);
                        // Saturating packs clamp to 0..=255, in-lane: per lane the first
                        // group's 4 bytes, then the second's.
                        let p = _mm256_packs_epi32(a, b);
                        let bytes = _mm256_packus_epi16(p, p);
                        let bytes = _mm256_permutevar8x32_epi32(bytes, gather2);
                        let dst = out[r].as_mut_ptr().add(g.out);
                        _mm_storeu_si128(dst.cast(), _mm256_castsi256_si128(bytes));
                    }
                    i += 2;
                    continue;
                }
                for r in 0..R {
                    let v = _mm256_sra_epi32(acc[r], shift);
                    // Saturating packs clamp to 0..=255 (in-lane: each lane's 4 bytes first).
                    let p = _mm256_packs_epi32(v, v);
                    let b = _mm256_packus_epi16(p, p);
                    let b = _mm256_permutevar8x32_epi32(b, gather);
                    let bytes = _mm256_castsi256_si128(b);
                    let dst = out[r].as_mut_ptr().add(g.out);
                    if g.n == GROUP {
                        _mm_storel_epi64(dst.cast(), bytes);
                    } else {
                        let mut tmp = [0u8; 16];
                        _mm_storeu_si128(tmp.as_mut_ptr().cast(), bytes);
                        std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, g.n);
                    }
                }
                i += 1;
            }
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn vertical<const R: usize>(
        rows: &[*const u8],
        weights: &[i32],
        precision: u32,
        n: usize,
        out: [*mut u8; R],
    ) {
        // SAFETY: AVX2 is enabled here, and the CPU has it (the caller's contract, with the
        // pointers').
        unsafe { vertical::vertical::<__m256i, R>(rows, weights, precision, n, out) }
    }
}

// The methods are the AVX2 forms of the operations `Lanes` names.
impl Lanes for __m256i {
    const BYTES: usize = 32;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller's (32 readable bytes, AVX2).
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        // SAFETY: the caller's (32 writable bytes, AVX2).
        unsafe { _mm256_storeu_si256(p.cast(), v) }
    }

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn splat(x: i32) -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe { _mm256_set1_epi32(x) }
    }

    #[inline(always)]
    unsafe fn unpack8<const HI: bool>(a: Self, b: Self) -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe {
            if HI {
                _mm256_unpackhi_epi8(a, b)
            } else {
                _mm256_unpacklo_epi8(a, b)
            }
        }
    }

    #[inline(always)]
    unsafe fn dot_add(acc: Self, v: Self, w: Self) -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(v, w)) }
    }

    #[inline(always)]
    unsafe fn shift(v: Self, count: __m128i) -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe { _mm256_sra_epi32(v, count) }
    }

    #[inline(always)]
    unsafe fn pack(s: [Self; 4]) -> Self {
        // SAFETY: the caller's (AVX2).
        unsafe {
            _mm256_packus_epi16(
                _mm256_packs_epi32(s[0], s[1]),
                _mm256_packs_epi32(s[2], s[3]),
            )
        }
    }
}
