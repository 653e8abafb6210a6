//! torch's antialiased `uint8` resize ([`super::resize_u8`]) with AVX2 on its own `int16`
//! weights: each pass is `clamp((2^(p−1) + Σ wᵢ·xᵢ) >> p, 0, 255)` in `i32`, exactly as the
//! scalar formula (integer sums do not depend on their order, and none of them can overflow:
//! `Σ|wᵢ| < 2^(p+1)` and `2^p·wt_max < 2^14`, so `|Σ wᵢ·xᵢ| < 2^31`).
//!
//! Unlike the Pillow resampler's kernels (22-bit weights split in two `i16` halves, two
//! `vpmaddwd` per tap pair), every tap pair is one `vpmaddwd` here, and:
//!
//! - horizontal pass: 8 output samples per group, four per 128-bit lane, each sample's two taps
//!   picked from a 16-byte window per lane by `vpshufb` (a lane's tap bytes within 16 bytes:
//!   reductions up to about 2.5× with three channels; larger ones use the resampler's path),
//!   four input rows at a time sharing the controls and weights; both windows come from one
//!   load where they can (the same 16 bytes, or 32 bytes whose halves they are; where a group
//!   would need two loads, sixteen samples are split into two interleaved groups so that they
//!   are, as at most reductions past about 2×);
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
    /// How a pair's two lanes are loaded.
    load: Load,
    /// One of two interleaved groups (see [`Horizontal::new`]): the first of the two (at
    /// `out`) takes samples `out..out + 4` and `out + 8..out + 12`, the second the four after
    /// each; the two are always computed and stored together.
    interleaved: bool,
}

/// How a horizontal group loads its two lanes for a tap pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    /// The eight samples fit one 16-byte window: it is loaded once into both lanes (`base`
    /// equal).
    Shared,
    /// The high lane's window starts 16 bytes after the low one's (`base[1] = base[0] + 16`):
    /// one 32-byte load fills both.
    Wide,
    /// Two 16-byte loads, one per lane.
    Split,
}

/// One group as [`Horizontal::new`] builds it, before it is appended.
struct Built {
    n: usize,
    base: [usize; 2],
    load: Load,
    control: [u8; 32],
    /// Per tap pair, the 8 samples' `(w₂ₚ, w₂ₚ₊₁)`.
    weights: Vec<[i16; 16]>,
}

impl Built {
    /// The group of the `counts[l]` samples from `firsts[l]` in lane `l` (`counts[0] ≥ 1`,
    /// each at most [`LANE`]); `None` when a lane's samples do not fit one 16-byte window.
    fn new(k: &Int16Coeffs, c: usize, firsts: [usize; 2], counts: [usize; 2]) -> Option<Built> {
        debug_assert!((1..=LANE).contains(&counts[0]) && counts[1] <= LANE);
        let first_byte = |j: usize| k.starts[j / c] * c + j % c;
        let lane_samples = |l: usize| firsts[l]..firsts[l] + counts[l];
        // A sample's two bytes `d` and `d + c` lie in a 16-byte window from its lane's base
        // when `d + c < WINDOW`.
        let fits = |d: usize| d + c < WINDOW;
        let span = |l: usize| {
            lane_samples(l)
                .map(first_byte)
                .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)))
        };
        let (lo0, hi0) = span(0);
        let (lo1, hi1) = if counts[1] == 0 { (lo0, hi0) } else { span(1) };
        if !fits(hi0 - lo0) || !fits(hi1 - lo1) {
            return None;
        }
        let (lo, hi) = (lo0.min(lo1), hi0.max(hi1));
        let (load, base) = if fits(hi - lo) {
            (Load::Shared, [lo, lo])
        } else {
            // One 32-byte load from `start`, the largest offset at or below the low lane's
            // first byte and 16 below the high lane's, if every sample lies in its lane's half.
            match lo1.checked_sub(WINDOW).map(|l| l.min(lo0)) {
                Some(start)
                    if fits(hi0 - start) && hi1.checked_sub(start + WINDOW).is_some_and(fits) =>
                {
                    (Load::Wide, [start, start + WINDOW])
                }
                _ => (Load::Split, [lo0, lo1]),
            }
        };
        let taps = (0..2)
            .flat_map(lane_samples)
            .map(|j| k.counts[j / c])
            .max()
            .unwrap_or(0);
        let pairs = taps.div_ceil(2).max(1);
        let mut weights = vec![[0i16; 16]; pairs];
        let mut control = [ZERO; 32];
        for (l, &lane_base) in base.iter().enumerate() {
            for (i, j) in lane_samples(l).enumerate() {
                let slot = l * LANE + i;
                let d = first_byte(j) - lane_base;
                control[4 * slot] = d as u8;
                control[4 * slot + 2] = (d + c) as u8;
                let x = j / c;
                let w = &k.weights[x * k.ksize..][..k.counts[x]];
                for (p, pair) in weights.iter_mut().enumerate() {
                    for t in 0..2 {
                        pair[2 * slot + t] = w.get(2 * p + t).copied().unwrap_or(0);
                    }
                }
            }
        }
        Some(Built {
            n: counts[0] + counts[1],
            base,
            load,
            control,
            weights,
        })
    }
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
    ///
    /// Samples go by groups of eight, four per lane: `first..first + 4` in the low lane and
    /// `first + 4..first + 8` in the high one. Where either of two such groups would need two
    /// loads per tap pair ([`Load::Split`]: most groups past a reduction of about 2×, where
    /// neighbouring runs of four sit about 9 bytes apart), sixteen samples form two interleaved
    /// groups instead — lanes `first..first + 4` and `first + 8..first + 12`, then
    /// `first + 4..first + 8` and `first + 12..first + 16` — if each then takes one 32-byte
    /// load ([`Load::Wide`]: its high lane's window starts 16 bytes after its low lane's).
    pub(super) fn new(k: &Int16Coeffs, channels: usize) -> Option<Horizontal> {
        let c = channels;
        if k.precision == 0 || c == 0 {
            return None;
        }
        let samples = k.starts.len() * c;
        let mut plan = Horizontal {
            groups: Vec::with_capacity(samples.div_ceil(GROUP)),
            controls: Vec::with_capacity(samples.div_ceil(GROUP)),
            weights: Vec::new(),
            step: 2 * c,
            read_len: 0,
            samples,
            precision: k.precision,
        };
        // The group of the (up to) eight samples from `first`, lanes side by side.
        let plain = |first: usize| {
            let n = GROUP.min(samples - first);
            Built::new(
                k,
                c,
                [first, first + LANE],
                [LANE.min(n), n.saturating_sub(LANE)],
            )
        };
        let mut first = 0;
        while first < samples {
            let a = plain(first)?;
            if first + 2 * GROUP <= samples {
                let b = plain(first + GROUP)?;
                if a.load == Load::Split || b.load == Load::Split {
                    // Interleaved instead, if both then take one load per pair.
                    let low = Built::new(k, c, [first, first + 2 * LANE], [LANE; 2]);
                    let high = Built::new(k, c, [first + LANE, first + 3 * LANE], [LANE; 2]);
                    if let (Some(low), Some(high)) = (low, high) {
                        if low.load == Load::Wide && high.load == Load::Wide {
                            plan.push(low, first, true);
                            plan.push(high, first + LANE, true);
                            first += 2 * GROUP;
                            continue;
                        }
                    }
                }
                plan.push(a, first, false);
                plan.push(b, first + GROUP, false);
                first += 2 * GROUP;
                continue;
            }
            let n = a.n;
            plan.push(a, first, false);
            first += n;
        }
        Some(plan)
    }

    /// The numbers of groups that load a tap pair's lanes with one 32-byte load, side by side
    /// and interleaved, and with two loads (the kernel's tests check that plans of each kind
    /// were run and compared).
    #[cfg(test)]
    pub(super) fn load_kinds(&self) -> [usize; 3] {
        let count = |f: &dyn Fn(&Group) -> bool| self.groups.iter().filter(|g| f(g)).count();
        [
            count(&|g| g.load == Load::Wide && !g.interleaved),
            count(&|g| g.interleaved),
            count(&|g| g.load == Load::Split),
        ]
    }

    /// Appends a built group whose first output sample is `out`.
    fn push(&mut self, built: Built, out: usize, interleaved: bool) {
        let end = built.base[0].max(built.base[1]) + self.step * (built.weights.len() - 1) + WINDOW;
        self.read_len = self.read_len.max(end);
        self.groups.push(Group {
            out,
            n: built.n,
            pairs: built.weights.len(),
            base: built.base,
            load: built.load,
            interleaved,
        });
        self.controls.push(built.control);
        self.weights.extend(built.weights);
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
        // p < pairs (a wide group's one load the 32 bytes at `base[0] + p·step`, which are
        // the same two windows: `base[1] = base[0] + 16`), which end within `read_len` (built
        // so in `push`) and so within each row (the caller's); the group's `pairs` weight
        // vectors of 32 bytes follow `weights`.
        unsafe {
            let control = _mm256_loadu_si256(control.as_ptr().cast());
            let mut acc = [rounding; R];
            let (mut lo, mut hi) = (g.base[0], g.base[1]);
            for _ in 0..g.pairs {
                let w = _mm256_loadu_si256(weights.cast());
                for r in 0..R {
                    let v = match g.load {
                        Load::Shared => {
                            _mm256_broadcastsi128_si256(_mm_loadu_si128(ptrs[r].add(lo).cast()))
                        }
                        // `hi = lo + 16` (`Load::Wide`): bytes `lo..lo + 32`.
                        Load::Wide => _mm256_loadu_si256(ptrs[r].add(lo).cast()),
                        Load::Split => {
                            _mm256_loadu2_m128i(ptrs[r].add(hi).cast(), ptrs[r].add(lo).cast())
                        }
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
        // Two groups packed together: the first's lanes (dwords 0, 4), then the second's (1, 5)
        // for two adjacent groups; the two low lanes (0, 1), then the two high ones (4, 5), for
        // two interleaved groups.
        let adjacent = _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0);
        let interleaved = _mm256_setr_epi32(0, 1, 4, 5, 0, 0, 0, 0);
        let mut weights = self.weights.as_ptr();
        let mut i = 0;
        while i < self.groups.len() {
            let g = self.groups[i];
            // SAFETY: `accumulate`'s contract: `weights` is group `i`'s first weight vector
            // (the groups' vectors follow each other, `pairs` each, as appended by `push`), and the
            // rows are `read_len` long (asserted). The stores write `out[r][g.out..][..16]` for
            // two full adjacent or two interleaved groups (`g.out + 16 ≤ samples`: interleaved
            // groups come in twos covering sixteen samples, built so in `new`) or
            // `out[r][g.out..][..g.n]`, inside the row.
            unsafe {
                let (acc, next) = self.accumulate::<R>(i, weights, ptrs, rounding);
                weights = next;
                let order = if g.interleaved {
                    // The first of two interleaved groups (the second is never reached here:
                    // it is taken with the first).
                    debug_assert!(self
                        .groups
                        .get(i + 1)
                        .is_some_and(|h| h.interleaved && h.out == g.out + LANE));
                    Some(interleaved)
                } else {
                    self.groups
                        .get(i + 1)
                        .filter(|h| {
                            g.n == GROUP && h.n == GROUP && h.out == g.out + GROUP && !h.interleaved
                        })
                        .map(|_| adjacent)
                };
                if let Some(order) = order {
                    let (acc2, next) = self.accumulate::<R>(i + 1, weights, ptrs, rounding);
                    weights = next;
                    for r in 0..R {
                        let a = _mm256_sra_epi32(acc[r], shift);
                        let b = _mm256_sra_epi32(acc2[r], shift);
                        // Saturating packs clamp to 0..=255, in-lane: per lane the first
                        // group's 4 bytes, then the second's.
                        let p = _mm256_packs_epi32(a, b);
                        let bytes = _mm256_packus_epi16(p, p);
                        let bytes = _mm256_permutevar8x32_epi32(bytes, order);
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
