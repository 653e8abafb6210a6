//! AVX-512 kernels (AVX-512BW, VBMI and VNNI), exact to the last bit like [`super::avx2`].
//!
//! Both passes accumulate the split weights of [`super::avx2`] (`w = hi·2¹⁶ + lo`) with
//! `vpdpwssd`, VNNI's fused `vpmaddwd` + `vpaddd` — non-saturating, so the very wrapping `i32`
//! sums of the AVX2 and scalar kernels.
//!
//! Horizontal pass: up to 16 output samples at a time (a group). One unaligned 64-byte load per
//! tap pair and row, and one zero-masking `vpermb` (VBMI) put each sample's two taps `(2p, 2p +
//! 1)` zero-extended to `i16` in its own dword. That needs the group's first tap bytes within 64
//! bytes of each other: 16 samples for reductions up to about 3.5× with three channels, fewer
//! beyond (a group takes as many as fit, [`group_layouts`]); where too few fit to beat the AVX2
//! plan (with three channels, reductions past about 8.7×), that plan serves the axis. When
//! every group fits 32 bytes (reductions up to about 1.7×), the loads are 32 bytes wide, which
//! split fewer cache lines. Results are clamped and narrowed with `vpmaxsd` and `vpmovusdb`.
//!
//! Where it costs fewer loads ([`row_cost`]), each load serves four taps instead ([`Taps`]):
//! one `vpermb` puts a sample's four tap bytes in its dword, and three `vpdpbusd` sum them times
//! the three signed bytes of each 22-bit weight (`w = l₀ + 2⁸·l₁ + 2¹⁶·l₂`), joined as
//! `a₀ + 2⁸·a₁ + 2¹⁶·a₂`, the same integer as the pairs' sums.
//!
//! Vertical pass: the AVX2 kernel on 64 samples at a time. Each 128-bit lane works like a lane
//! of the AVX2 kernel, so the in-lane unpacks and packs keep the samples in order.

use std::arch::x86_64::*;

use super::avx2::{split, tap_pairs, NO_PAIR, STACK_PAIRS};
use super::coeffs::{AxisCoeffs, PRECISION_BITS, ROUNDING};
use super::scalar::horizontal_samples_scalar;

/// Whether the running CPU has AVX-512F, BW, VL, VBMI and VNNI (and they are not turned off,
/// see [`crate::simd`]).
pub(crate) fn available() -> bool {
    crate::simd::avx512_allowed()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vbmi")
        && is_x86_feature_detected!("avx512vnni")
}

/// Output samples per group: one `zmm` of `i16` tap pairs.
pub(crate) const GROUP: usize = 16;
/// Bytes one load covers.
pub(crate) const WINDOW: usize = 64;
/// `vpermb` writes the even bytes of each `i16` (the tap bytes), zeroes the odd ones.
const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;

/// Up to 16 consecutive output samples computed together.
#[derive(Clone, Copy, Debug)]
struct Group {
    /// Index of the first output sample in the row.
    out: u32,
    /// Samples in the group (up to 16: see [`group_layouts`]).
    n: u32,
    /// Tap pairs to accumulate.
    pairs: u32,
    /// Byte offset of the load for pair 0 from the start of the input row.
    base: u32,
    /// One past the last byte any load of this group reads, from the start of the row.
    read_end: u32,
}

/// How many taps of each sample one load of a horizontal pass serves, here and in torch's
/// kernels ([`super::torch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taps {
    /// Two taps zero-extended to `i16` in each dword (one zero-masking `vpermb`), summed with
    /// `vpdpwssd` on `i16` weights.
    Pairs,
    /// Four tap bytes in each dword (one `vpermb`), summed with `vpdpbusd` (unsigned tap bytes
    /// times signed weight bytes) on the weights split into signed bytes: half the loads and
    /// `vpermb`s, which bound these passes, for one more `vpdpbusd` per weight byte.
    Quads,
}

impl Taps {
    /// Taps per load.
    pub(crate) fn count(self) -> usize {
        match self {
            Taps::Pairs => 2,
            Taps::Quads => 4,
        }
    }
}

/// `w = l₀ + 2⁸·l₁ + … + 2^(8(N−1))·l_(N−1)` with every `lᵢ` a signed byte (each but the last
/// in −128…127 by construction): the bytes, or `None` when the last does not fit.
pub(crate) fn signed_bytes<const N: usize>(w: i32) -> Option<[i8; N]> {
    let mut rest = i64::from(w);
    let mut bytes = [0i8; N];
    for (i, b) in bytes.iter_mut().enumerate() {
        let l = if i + 1 == N {
            rest
        } else {
            ((rest + 128) & 255) - 128
        };
        *b = i8::try_from(l).ok()?;
        rest = (rest - l) >> 8;
    }
    Some(bytes)
}

/// The cost of a horizontal plan's row: its loads (each with its `vpermb`), a 64-byte load
/// counting twice a 32-byte one. Measured on AMD Zen 4 (`taps_timing`, bicubic, three
/// channels): quads 1.4–1.7× faster than pairs at 2000 → 896, 2000 → 418, 872 → 224 and 4000 →
/// 500, 1.15× at 512 → 504; at 1000 → 700 and 640 → 448, where pairs fit 32-byte loads and
/// quads do not, the two within 8 % of each other.
pub(crate) fn row_cost(loads: usize, narrow: bool) -> usize {
    loads * if narrow { 1 } else { 2 }
}

/// The precomputed horizontal pass of one axis for one channel count.
pub(crate) struct HorizontalPlan {
    taps: Taps,
    groups: Vec<Group>,
    /// Per group, the `vpermb` control: sample `s`'s tap bytes at bytes `4s` and `4s + 2`
    /// (pairs) or `4s` to `4s + 3` (quads).
    controls: Vec<[u8; 64]>,
    /// Per group and load, the weight vectors in group order: pairs, the `lo` then the `hi`
    /// `i16` halves of the 16 samples' two weights; quads, the three signed bytes of their four
    /// weights, low byte first.
    weights: Vec<[u8; 64]>,
    /// Bytes (`2 × channels` or `4 × channels`) the loads advance.
    step: usize,
    /// The largest `read_end` of all groups.
    read_len: usize,
    /// Every group's bytes lie within 32 of its first: 32-byte loads (fewer cache-line splits).
    narrow: bool,
}

/// A group's window at `p`: 64 bytes, or 32 (the upper half zero) when every group of the plan
/// fits them (`narrow`: fewer cache-line splits).
///
/// # Safety
/// AVX-512F; 64 bytes at `p` readable (32 when `narrow`).
#[inline(always)]
pub(crate) unsafe fn window(p: *const u8, narrow: bool) -> __m512i {
    // SAFETY: the caller's.
    unsafe {
        if narrow {
            _mm512_castsi256_si512(_mm256_loadu_si256(p.cast()))
        } else {
            _mm512_loadu_si512(p.cast())
        }
    }
}

/// `_mm512_maskz_permutexvar_epi8(EVEN_BYTES, control, v)` as the one instruction it names:
/// each `i16` of the result is the byte of `v` that `control`'s even byte picks, zero-extended.
/// With a constant mask LLVM compiles the intrinsic to an unmasked `vpermb` and a `vpandq` with
/// a constant vector: a second uop on ports 0 and 5, in the horizontal kernels' innermost loop
/// (torch's `uint8` resize of a 2000 × 1072 photo: 5–9 % faster without it).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub(crate) fn even_bytes(control: __m512i, v: __m512i) -> __m512i {
    let out: __m512i;
    // SAFETY: `vpermb` with a zeroing mask reads only the three registers and writes `out`; the
    // CPU has AVX-512F, BW and VBMI (this function's target features); no flags, memory or
    // stack are touched.
    unsafe {
        std::arch::asm!(
            "vpermb {out} {{{mask}}}{{z}}, {control}, {v}",
            out = lateout(zmm_reg) out,
            mask = in(kreg) EVEN_BYTES,
            control = in(zmm_reg) control,
            v = in(zmm_reg) v,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    out
}

/// Where a group of up to [`GROUP`] output samples reads: the group's place, its loads, the
/// offset of its first load and the `vpermb` control putting sample `s`'s taps in its dword:
/// with two taps a load, at bytes `4s` and `4s + 2` (the odd bytes are zeroed by the mask);
/// with four, at bytes `4s` to `4s + 3`.
pub(crate) struct GroupLayout {
    /// The group's first output sample.
    pub first: usize,
    /// Samples in the group (up to 16: see [`group_layouts`]).
    pub n: usize,
    /// Loads per row: the taps of the group's widest sample, two or four a load (rounded up).
    pub pairs: usize,
    /// Byte offset of the first load from the start of the input row.
    pub base: usize,
    pub control: [u8; 64],
}

/// The groups of a horizontal pass whose output pixel `x` has `counts[x]` taps from input pixel
/// `starts[x]`, on `channels` interleaved channels, each load taking `taps` (2 or 4) consecutive
/// taps of every sample, and whether every group fits 32 bytes.
///
/// Each group takes as many consecutive samples, up to [`GROUP`], as have all their bytes of one
/// load within one 64-byte window. With two taps a load and three channels, that is all 16 for
/// reductions up to about 3.5×, fewer beyond (15 at 4.5×, 12 at 6×, 9 at 8×, 6 at 13×); four
/// taps a load need `2 × channels` bytes more of the window. A group cut by the window ends at a
/// pixel boundary, so that the next starts with a whole pixel. `None` when the median group
/// would hold fewer than `min_fill` samples (where the AVX2 kernels do more per instruction), or
/// when one sample's bytes do not fit a window. Shared by this resampler's plan ([`MIN_FILL`])
/// and torch's `uint8` kernels ([`super::torch`]).
pub(crate) fn group_layouts(
    starts: &[usize],
    counts: &[usize],
    channels: usize,
    taps: usize,
    min_fill: usize,
) -> Option<(Vec<GroupLayout>, bool)> {
    let c = channels;
    debug_assert!(taps == 2 || taps == 4);
    // Bytes from a sample's first tap to its last in one load.
    let span = (taps - 1) * c;
    if c == 0 || span >= WINDOW {
        return None;
    }
    let n_samples = starts.len() * c;
    let first_byte = |j: usize| starts[j / c] * c + j % c;
    let mut narrow = true;
    let mut layouts = Vec::with_capacity(n_samples.div_ceil(GROUP));
    let mut first = 0;
    while first < n_samples {
        // Samples are taken while the group's first tap bytes, and the last tap `span` bytes
        // after each, stay within one window (one sample always does: `span < WINDOW`).
        let (mut base, mut last) = (first_byte(first), first_byte(first));
        let mut n = 1;
        while n < GROUP && first + n < n_samples {
            let b = first_byte(first + n);
            let (lo, hi) = (base.min(b), last.max(b));
            if hi - lo + span >= WINDOW {
                break;
            }
            (base, last, n) = (lo, hi, n + 1);
        }
        if n < GROUP && first + n < n_samples {
            // Cut by the window: at the last pixel boundary, so that the next group starts with
            // a whole pixel (a group cut mid-pixel leaves the next one a sample short).
            let end = (first + n) / c * c;
            if end > first {
                n = end - first;
                let bytes = (first..end).map(first_byte);
                (base, last) = bytes.fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            }
        }
        narrow &= last - base + span < WINDOW / 2;
        let widest = (first..first + n).map(|j| counts[j / c]).max().unwrap_or(0);
        let mut control = [0u8; 64];
        for s in 0..n {
            let d = first_byte(first + s) - base;
            for t in 0..taps {
                // Two taps go to the even bytes (4s, 4s + 2), four fill the dword.
                control[4 * s + t * (4 / taps)] = (d + t * c) as u8;
            }
        }
        layouts.push(GroupLayout {
            first,
            n,
            pairs: widest.div_ceil(taps).max(1),
            base,
            control,
        });
        first += n;
    }
    if median_width(&layouts) < min_fill {
        return None;
    }
    Some((layouts, narrow))
}

/// Layouts of the cheaper of pairs and quads by [`row_cost`] ([`group_layouts`] of each),
/// quads only when `quads_fit` (every weight splits into the kernel's signed bytes); pairs on a
/// tie. `None` when neither is planned. Shared by this resampler's plan and torch's kernels, so
/// that only the chosen plan's weights are built.
pub(crate) fn cheaper_layouts(
    starts: &[usize],
    counts: &[usize],
    channels: usize,
    min_fill: usize,
    quads_fit: bool,
) -> Option<(Taps, Vec<GroupLayout>, bool)> {
    let layouts = |taps: Taps| group_layouts(starts, counts, channels, taps.count(), min_fill);
    let cost = |(groups, narrow): &(Vec<GroupLayout>, bool)| {
        row_cost(groups.iter().map(|g| g.pairs).sum(), *narrow)
    };
    let pairs = layouts(Taps::Pairs);
    let quads = quads_fit.then(|| layouts(Taps::Quads)).flatten();
    let (taps, (groups, narrow)) = match (pairs, quads) {
        (Some(p), Some(q)) if cost(&q) < cost(&p) => (Taps::Quads, q),
        (Some(p), _) => (Taps::Pairs, p),
        (None, Some(q)) => (Taps::Quads, q),
        (None, None) => return None,
    };
    Some((taps, groups, narrow))
}

/// The samples of the middle group, by width: the width of nearly every group of an axis (the
/// groups at the ends of a row, where the taps are clipped, and the last one may differ).
fn median_width(layouts: &[GroupLayout]) -> usize {
    let mut widths: Vec<usize> = layouts.iter().map(|g| g.n).collect();
    widths.sort_unstable();
    widths.get(widths.len() / 2).copied().unwrap_or(GROUP)
}

/// The fewest samples in the median group for which this resampler's AVX-512 plan is used
/// (below, its AVX2 plan). Measured on the Intel Xeon VM (bicubic, horizontal pass alone, one
/// thread, two photos): with three channels 1.2–1.4× faster than AVX2 at 9 samples a group (8×
/// reductions), even at 6 (10×–13×); with one channel and with four 0.8–0.95× at 7–8 samples.
pub(crate) const MIN_FILL: usize = 9;

/// Plans kept for the next resizes (most recent first): a stream of photos of a few sizes
/// reuses them instead of rebuilding each (35–125 µs for 512- to 4000-sample axes on AMD Zen 4,
/// up to a tenth of a CLIP call). An entry is found by comparing the coefficients themselves,
/// so a kept plan is the one the build would give.
const KEPT_PLANS: usize = 8;

type KeptPlan = (usize, AxisCoeffs, std::sync::Arc<Option<HorizontalPlan>>);

static PLANS: std::sync::Mutex<Vec<KeptPlan>> = std::sync::Mutex::new(Vec::new());

/// [`HorizontalPlan::new`] for `coeffs` and `channels`, a kept one when there is one. Axes with
/// more than [`RECENT_MAX_WEIGHTS`](super::coeffs::RECENT_MAX_WEIGHTS) weights are built and not
/// kept. A plan holds 4 bytes per tap and output sample (pairs; quads 3), up to 16/9 of that
/// in groups narrower than 16 samples ([`MIN_FILL`]): with its coefficients, at most about
/// 2.2 MiB for a kept axis of four channels, and about 110 KiB for 2000 → 896 with three.
pub(crate) fn kept_plan(
    coeffs: &AxisCoeffs,
    channels: usize,
) -> std::sync::Arc<Option<HorizontalPlan>> {
    // A poisoned lock only means another thread panicked while holding it; the list is valid.
    let lock = || PLANS.lock().unwrap_or_else(|e| e.into_inner());
    {
        let mut kept = lock();
        if let Some(i) = kept
            .iter()
            .position(|(c, k, _)| *c == channels && k == coeffs)
        {
            let entry = kept.remove(i);
            let plan = entry.2.clone();
            kept.insert(0, entry);
            return plan;
        }
    }
    let plan = std::sync::Arc::new(HorizontalPlan::new(coeffs, channels));
    if coeffs.weights.len() <= super::coeffs::RECENT_MAX_WEIGHTS {
        let mut kept = lock();
        kept.truncate(KEPT_PLANS - 1);
        kept.insert(0, (channels, coeffs.clone(), plan.clone()));
    }
    plan
}

impl HorizontalPlan {
    /// The cheaper plan of pairs and quads ([`row_cost`]; quads only where every weight splits
    /// into three signed bytes, as all of this resampler's 22-bit weights do), or `None` when
    /// the groups would be too sparse for both ([`group_layouts`]).
    /// Only the chosen plan's weights are built; [`kept_plan`] keeps recent plans.
    pub(crate) fn new(coeffs: &AxisCoeffs, channels: usize) -> Option<HorizontalPlan> {
        let (taps, layouts, narrow) = cheaper_layouts(
            &coeffs.starts,
            &coeffs.counts,
            channels,
            MIN_FILL,
            Self::quads_fit(coeffs),
        )?;
        Some(Self::build(coeffs, channels, taps, layouts, narrow))
    }

    #[cfg(test)]
    fn cost(&self) -> usize {
        row_cost(
            self.groups.iter().map(|g| g.pairs as usize).sum(),
            self.narrow,
        )
    }

    /// The plan taking `taps` taps a load, or `None` when its groups would be too sparse
    /// ([`group_layouts`]) or (quads) a weight does not split into three signed bytes.
    #[cfg(test)]
    pub(crate) fn with_taps(
        coeffs: &AxisCoeffs,
        channels: usize,
        taps: Taps,
    ) -> Option<HorizontalPlan> {
        if taps == Taps::Quads && !Self::quads_fit(coeffs) {
            return None;
        }
        let c = channels;
        let (layouts, narrow) =
            group_layouts(&coeffs.starts, &coeffs.counts, c, taps.count(), MIN_FILL)?;
        Some(Self::build(coeffs, channels, taps, layouts, narrow))
    }

    /// Whether every weight splits into three signed bytes (all 22-bit ones do).
    fn quads_fit(coeffs: &AxisCoeffs) -> bool {
        coeffs
            .weights
            .iter()
            .all(|&w| signed_bytes::<3>(w).is_some())
    }

    /// The plan of these layouts: weights, controls and read lengths.
    fn build(
        coeffs: &AxisCoeffs,
        channels: usize,
        taps: Taps,
        layouts: Vec<GroupLayout>,
        narrow: bool,
    ) -> HorizontalPlan {
        let c = channels;
        let step = taps.count() * c;
        let mut plan = HorizontalPlan {
            taps,
            groups: Vec::with_capacity(layouts.len()),
            controls: Vec::with_capacity(layouts.len()),
            weights: Vec::new(),
            step,
            read_len: 0,
            narrow,
        };
        let vectors = match taps {
            Taps::Pairs => 2,
            Taps::Quads => 3,
        };
        for g in layouts {
            let at = plan.weights.len();
            plan.weights.resize(at + vectors * g.pairs, [0u8; 64]);
            for s in 0..g.n {
                let (_, w) = coeffs.taps((g.first + s) / c);
                let tap = |i: usize| w.get(i).copied().unwrap_or(0);
                for p in 0..g.pairs {
                    let v = at + vectors * p;
                    match taps {
                        Taps::Pairs => {
                            for t in 0..2 {
                                let (wl, wh) = split(tap(2 * p + t));
                                let i = 4 * s + 2 * t;
                                plan.weights[v][i..i + 2].copy_from_slice(&wl.to_le_bytes());
                                plan.weights[v + 1][i..i + 2].copy_from_slice(&wh.to_le_bytes());
                            }
                        }
                        Taps::Quads => {
                            for t in 0..4 {
                                // Checked above: every weight splits.
                                let b = signed_bytes::<3>(tap(4 * p + t)).unwrap_or([0; 3]);
                                for (k, &b) in b.iter().enumerate() {
                                    plan.weights[v + k][4 * s + t] = b as u8;
                                }
                            }
                        }
                    }
                }
            }
            let read_end = g.base + step * (g.pairs - 1) + WINDOW;
            plan.read_len = plan.read_len.max(read_end);
            plan.groups.push(Group {
                out: g.first as u32,
                n: g.n as u32,
                pairs: g.pairs as u32,
                base: g.base as u32,
                read_end: read_end as u32,
            });
            plan.controls.push(g.control);
        }
        plan
    }

    /// Bytes from the start of an input row that the loads may read (past the row's end too).
    pub(crate) fn read_len(&self) -> usize {
        self.read_len
    }

    /// One output row per input row (`R` rows at once, sharing the control and weight loads).
    /// `src[r]` starts at an input row and may extend past it; `out[r]` is exactly one output
    /// row. Groups that would read past a short `src[r]` are computed by the scalar code.
    ///
    /// # Safety
    /// The CPU must support what [`available`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    pub(crate) unsafe fn rows<const R: usize>(
        &self,
        coeffs: &AxisCoeffs,
        channels: usize,
        src: [&[u8]; R],
        out: [&mut [u8]; R],
    ) {
        let n_samples = coeffs.out_len() * channels;
        assert!(out.iter().all(|o| o.len() == n_samples));
        let mut out = out;
        let fast = src.iter().all(|s| s.len() >= self.read_len);
        let ptrs = src.map(|s| s.as_ptr());
        let zero = _mm512_setzero_si512();
        let mut weights = self.weights.as_ptr();
        let narrow = self.narrow;
        // Weight vectors per load.
        let vectors = match self.taps {
            Taps::Pairs => 2,
            Taps::Quads => 3,
        };
        for (g, control) in self.groups.iter().zip(&self.controls) {
            let (first, n, pairs) = (g.out as usize, g.n as usize, g.pairs as usize);
            if !fast && src.iter().any(|s| s.len() < g.read_end as usize) {
                for (s, o) in src.iter().zip(out.iter_mut()) {
                    horizontal_samples_scalar(coeffs, channels, s, first, &mut o[first..first + n]);
                }
                // SAFETY: skips this group's `vectors × pairs` weight vectors, which exist.
                weights = unsafe { weights.add(vectors * pairs) };
                continue;
            }
            if self.taps == Taps::Quads {
                // SAFETY: as below, with three weight vectors per load.
                unsafe {
                    let control = _mm512_loadu_si512(control.as_ptr().cast());
                    let mut acc = [[_mm512_set1_epi32(ROUNDING), zero, zero]; R];
                    let mut at = g.base as usize;
                    for _ in 0..pairs {
                        let w = [0, 1, 2].map(|k| _mm512_loadu_si512(weights.add(k).cast()));
                        for r in 0..R {
                            let v = window(ptrs[r].add(at), narrow);
                            let v = _mm512_permutexvar_epi8(control, v);
                            for k in 0..3 {
                                acc[r][k] = _mm512_dpbusd_epi32(acc[r][k], v, w[k]);
                            }
                        }
                        at += self.step;
                        weights = weights.add(3);
                    }
                    for r in 0..R {
                        let [a0, a1, a2] = acc[r];
                        let acc = _mm512_add_epi32(
                            _mm512_add_epi32(a0, _mm512_slli_epi32::<8>(a1)),
                            _mm512_slli_epi32::<16>(a2),
                        );
                        store_group(out[r].as_mut_ptr().add(first), n, acc, zero);
                    }
                }
                continue;
            }
            // SAFETY: `control` is 64 bytes; the loads read 64 bytes at `base + p·step` for
            // p < pairs, which end at `read_end ≤ src[r].len()` (checked above); 2 × pairs
            // weight vectors of 64 bytes each follow `weights`.
            unsafe {
                let control = _mm512_loadu_si512(control.as_ptr().cast());
                let mut acc_lo = [_mm512_set1_epi32(ROUNDING); R];
                let mut acc_hi = [zero; R];
                let mut at = g.base as usize;
                for _ in 0..pairs {
                    let wl = _mm512_loadu_si512(weights.cast());
                    let wh = _mm512_loadu_si512(weights.add(1).cast());
                    for r in 0..R {
                        let v = window(ptrs[r].add(at), narrow);
                        let v = even_bytes(control, v);
                        acc_lo[r] = _mm512_dpwssd_epi32(acc_lo[r], v, wl);
                        acc_hi[r] = _mm512_dpwssd_epi32(acc_hi[r], v, wh);
                    }
                    at += self.step;
                    weights = weights.add(2);
                }
                for r in 0..R {
                    let acc = _mm512_add_epi32(acc_lo[r], _mm512_slli_epi32::<16>(acc_hi[r]));
                    store_group(out[r].as_mut_ptr().add(first), n, acc, zero);
                }
            }
        }
    }
}

/// A group's sums shifted down by [`PRECISION_BITS`], clamped to 0…255 and stored as its `n`
/// bytes at `dst` (`first + n ≤ n_samples = out[r].len()` at the callers: the store stays in
/// the row).
///
/// # Safety
/// AVX-512F, BW and VL; `n ≤ 16` bytes at `dst` writable.
#[inline(always)]
unsafe fn store_group(dst: *mut u8, n: usize, acc: __m512i, zero: __m512i) {
    // SAFETY: the caller's.
    unsafe {
        let v = _mm512_srai_epi32::<{ PRECISION_BITS }>(acc);
        let bytes = _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, zero));
        if n == GROUP {
            _mm_storeu_si128(dst.cast(), bytes);
        } else {
            _mm_mask_storeu_epi8(dst.cast(), (1u16 << n) - 1, bytes);
        }
    }
}

/// One vertical output row (see `kernels::vertical_row`), 64 samples at a time.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI ([`available`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn vertical_row(rows: &[&[u8]], weights: &[i32], out: &mut [u8]) {
    const STEP: usize = 64;
    let n = out.len();
    if n < STEP {
        // SAFETY: AVX-512F implies AVX2.
        unsafe { super::avx2::vertical_row(rows, weights, out) };
        return;
    }
    assert!(rows.iter().all(|r| r.len() >= n));
    let mut stack = [NO_PAIR; STACK_PAIRS];
    let mut heap = Vec::new();
    let pairs = tap_pairs(rows, weights, &mut stack, &mut heap);
    let zero = _mm512_setzero_si512();
    let mut i = 0;
    loop {
        // The last chunk overlaps the previous one when n is not a multiple of 64: those
        // samples are recomputed to the same values.
        let at = i.min(n - STEP);
        let mut lo = [_mm512_set1_epi32(ROUNDING); 4];
        let mut hi = [zero; 4];
        for &(p0, p1, wl, wh) in pairs {
            // SAFETY: both pointers start rows of at least `n ≥ at + 64` bytes (asserted).
            let (r0, r1) = unsafe {
                (
                    _mm512_loadu_si512(p0.add(at).cast()),
                    _mm512_loadu_si512(p1.add(at).cast()),
                )
            };
            let (wl, wh) = (_mm512_set1_epi32(wl), _mm512_set1_epi32(wh));
            let x = _mm512_unpacklo_epi8(r0, r1);
            let y = _mm512_unpackhi_epi8(r0, r1);
            // Per 128-bit lane L: samples 16L + [0..4], [4..8], [8..12], [12..16].
            let v = [
                _mm512_unpacklo_epi8(x, zero),
                _mm512_unpackhi_epi8(x, zero),
                _mm512_unpacklo_epi8(y, zero),
                _mm512_unpackhi_epi8(y, zero),
            ];
            for k in 0..4 {
                lo[k] = _mm512_dpwssd_epi32(lo[k], v[k], wl);
                hi[k] = _mm512_dpwssd_epi32(hi[k], v[k], wh);
            }
        }
        // Not a closure mapped over the array: a closure does not inherit `target_feature`, is
        // not inlined, and would take the accumulators through the stack.
        let s = [
            shifted(lo[0], hi[0]),
            shifted(lo[1], hi[1]),
            shifted(lo[2], hi[2]),
            shifted(lo[3], hi[3]),
        ];
        // In-lane packs put the samples back in order: lane L gets 16L..16L + 16.
        let bytes = _mm512_packus_epi16(
            _mm512_packs_epi32(s[0], s[1]),
            _mm512_packs_epi32(s[2], s[3]),
        );
        // SAFETY: `at + 64 ≤ n = out.len()`.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(at).cast(), bytes) };
        if at + STEP >= n {
            break;
        }
        i += STEP;
    }
}

/// `(lo + (hi << 16)) >> 22`: the sums of the split weights recombined and shifted (not yet
/// clamped).
#[target_feature(enable = "avx512f")]
#[inline]
fn shifted(lo: __m512i, hi: __m512i) -> __m512i {
    let acc = _mm512_add_epi32(lo, _mm512_slli_epi32::<16>(hi));
    _mm512_srai_epi32::<{ PRECISION_BITS }>(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::coeffs::axis_coeffs;
    use crate::image::scalar::horizontal_row_scalar;
    use crate::image::Filter;

    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    /// Calls `f(w, ow, filter, channels, coeffs)` for each size pair, filter and channel count
    /// (1, 3, 4): the axes the horizontal-pass tests walk.
    fn for_each_axis(
        sizes: &[(usize, usize)],
        filters: &[Filter],
        mut f: impl FnMut(usize, usize, Filter, usize, &AxisCoeffs),
    ) {
        for &(w, ow) in sizes {
            for &filter in filters {
                for c in [1, 3, 4] {
                    f(w, ow, filter, c, &axis_coeffs(w, 0.0, w as f32, ow, filter));
                }
            }
        }
    }

    /// The AVX-512 horizontal pass against the scalar one: every filter, 1, 3 and 4 channels,
    /// up- and downscales (groups narrower than 16 samples from about 3.5× on; the plan refuses
    /// the largest reductions), whole padded rows and rows that end exactly at the input (groups
    /// near the end fall back to scalar code).
    #[test]
    fn horizontal_matches_scalar() {
        if !available() {
            eprintln!("no AVX-512 VBMI/VNNI here: nothing to compare");
            return;
        }
        let filters = [
            Filter::Box,
            Filter::Bilinear,
            Filter::Hamming,
            Filter::Bicubic,
            Filter::Lanczos,
        ];
        let (mut planned, mut narrow) = (0, 0);
        let sizes = [
            (1280, 1148),
            (97, 131),
            (640, 224),
            (300, 17),
            (7, 3),
            (2000, 512),
            (33, 33),
            (1000, 224),
            (900, 150),
            (2000, 250),
            (4000, 500),
        ];
        // Plans of each tap width, and how often `new` chose quads.
        let (mut quads, mut chose_quads) = (0, 0);
        for_each_axis(&sizes, &filters, |w, ow, filter, c, coeffs| {
            chose_quads +=
                usize::from(HorizontalPlan::new(coeffs, c).is_some_and(|p| p.taps == Taps::Quads));
            for taps in [Taps::Pairs, Taps::Quads] {
                let Some(plan) = HorizontalPlan::with_taps(coeffs, c, taps) else {
                    continue;
                };
                if taps == Taps::Pairs {
                    planned += 1;
                    narrow += usize::from(plan.narrow);
                } else {
                    quads += 1;
                }
                let row = noise((w * 31 + ow * 7 + c) as u64, w * c + plan.read_len());
                let mut want = vec![0u8; ow * c];
                horizontal_row_scalar(coeffs, c, &row[..w * c], &mut want);
                for len in [row.len(), w * c] {
                    let mut got = [vec![0u8; ow * c], vec![0u8; ow * c]];
                    let [a, b] = &mut got;
                    // SAFETY: `available` found the features the kernel needs.
                    unsafe { plan.rows(coeffs, c, [&row[..len], &row[..len]], [a, b]) };
                    let at = format!("{taps:?} {w}->{ow} {filter:?} c={c} len={len}");
                    assert_eq!(got[0], want, "{at}");
                    assert_eq!(got[1], want, "{at}");
                }
            }
        });
        assert!(
            quads > 50 && chose_quads > 20,
            "quads {quads}, chosen {chose_quads}"
        );
        assert!(planned > 60, "only {planned} axes planned");
        assert!(
            (10..planned - 10).contains(&narrow),
            "{narrow} of {planned} with 32-byte loads"
        );
        // An 8x bicubic reduction of three channels: groups of 9 (12 where the taps are clipped,
        // fewer at the end), planned; 16x: 6, refused.
        let eight = axis_coeffs(4000, 0.0, 4000.0, 500, Filter::Bicubic);
        let plan = HorizontalPlan::with_taps(&eight, 3, Taps::Pairs).expect("8x reduction planned");
        let (_, middle) = plan.groups.split_last().unwrap();
        assert!(middle.iter().all(|g| (9..16).contains(&g.n)));
        let sixteen = axis_coeffs(4000, 0.0, 4000.0, 250, Filter::Bicubic);
        assert!(
            HorizontalPlan::with_taps(&sixteen, 3, Taps::Pairs).is_none(),
            "16x reduction needs the AVX2 plan"
        );
    }

    /// Timing of the horizontal pass with pairs and with quads (four rows at a time, bicubic,
    /// three channels), with each plan's cost as [`HorizontalPlan::new`] weighs it:
    /// `cargo test --release -- --ignored --nocapture taps_timing`.
    #[test]
    #[ignore]
    fn taps_timing() {
        if !available() {
            return;
        }
        let axes = [
            (512, 504),
            (1000, 1008),
            (2000, 1988),
            (1000, 700),
            (2000, 896),
            (2000, 418),
            (872, 224),
            (640, 448),
            (4000, 500),
        ];
        for (w, ow) in axes {
            let c = 3;
            let coeffs = axis_coeffs(w, 0.0, w as f32, ow, Filter::Bicubic);
            let mut line = String::new();
            for taps in [Taps::Pairs, Taps::Quads] {
                let Some(plan) = HorizontalPlan::with_taps(&coeffs, c, taps) else {
                    line += &format!(" {taps:?}: not planned;");
                    continue;
                };
                let row = noise(7, w * c + plan.read_len());
                let mut out: [Vec<u8>; 4] = std::array::from_fn(|_| vec![0u8; ow * c]);
                let mut best = f64::MAX;
                for _ in 0..7 {
                    let start = std::time::Instant::now();
                    for _ in 0..200 {
                        let [a, b, d, e] = &mut out;
                        // SAFETY: `available` found the features the kernel needs.
                        unsafe { plan.rows(&coeffs, c, [&row[..]; 4], [a, b, d, e]) };
                    }
                    best = best.min(start.elapsed().as_secs_f64() / 200.0);
                }
                let cost = plan.cost();
                line += &format!(" {taps:?} {:.2} µs (cost {cost});", best * 1e6);
            }
            let start = std::time::Instant::now();
            for _ in 0..100 {
                std::hint::black_box(HorizontalPlan::new(&coeffs, c));
            }
            let build = start.elapsed().as_secs_f64() / 100.0 * 1e6;
            println!("{w} -> {ow}:{line} new() {build:.1} µs");
        }
    }

    /// A kept plan is the plan [`HorizontalPlan::new`] builds for the same coefficients and
    /// channels (found by comparing them), not one of another axis or channel count.
    #[test]
    fn kept_plans_are_the_built_ones() {
        let shape = |p: &Option<HorizontalPlan>| {
            p.as_ref().map(|p| {
                (
                    p.taps,
                    p.cost(),
                    p.read_len,
                    p.groups.len(),
                    p.weights.clone(),
                )
            })
        };
        let axes = [(2000, 896), (2000, 418), (640, 448), (97, 131), (4000, 500)];
        for round in 0..2 {
            for (w, ow) in axes {
                for c in [1, 3, 4] {
                    let coeffs = axis_coeffs(w, 0.0, w as f32, ow, Filter::Bicubic);
                    let kept = kept_plan(&coeffs, c);
                    let built = HorizontalPlan::new(&coeffs, c);
                    assert!(
                        shape(&kept) == shape(&built),
                        "{w}->{ow} c={c} round {round}"
                    );
                }
            }
        }
    }

    /// Weights split into signed bytes exactly where the last byte fits: every `int16` into two
    /// but the 128 from 32 640, and every 22-bit weight (and far beyond) into three.
    #[test]
    fn weights_split_into_signed_bytes() {
        for w in i32::from(i16::MIN)..=i32::from(i16::MAX) {
            match signed_bytes::<2>(w) {
                Some([l, h]) => assert_eq!(256 * i32::from(h) + i32::from(l), w),
                None => assert!(w >= 32_640, "{w}"),
            }
        }
        // The largest: 127 in every byte.
        const MAX3: i32 = 127 * 65536 + 127 * 256 + 127;
        let joined = |b: [i8; 3]| i32::from(b[0]) + 256 * i32::from(b[1]) + 65536 * i32::from(b[2]);
        let mut w = -(1 << 23);
        while w < 1 << 23 {
            match signed_bytes::<3>(w) {
                Some(b) => assert_eq!(joined(b), w),
                None => assert!(w > MAX3, "{w}"),
            }
            w += 97;
        }
        for w in [-(1 << 23), -1, 0, 1, 1 << 22, MAX3] {
            assert_eq!(signed_bytes::<3>(w).map(joined), Some(w));
        }
        assert_eq!(signed_bytes::<3>(MAX3 + 1), None);
    }

    /// [`group_layouts`] covers every output sample once, in order, each group as wide as fits
    /// (up to 16 samples whose two or four tap bytes lie in one 64-byte window; cut at a pixel
    /// boundary, and the rest of the next pixel would not fit), with the controls pointing at
    /// each sample's taps; axes whose median group is narrower than asked are refused. Pure
    /// arithmetic: runs without AVX-512.
    #[test]
    fn groups_take_as_many_samples_as_fit_one_window() {
        let filters = [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos];
        let sizes = [
            (640, 224),
            (1000, 224),
            (900, 150),
            (4000, 500),
            (2000, 97),
            (50, 70),
        ];
        let mut axes = 0;
        for_each_axis(&sizes, &filters, |w, ow, _, c, k| {
            for taps in [2, 4] {
                let first_byte = |j: usize| k.starts[j / c] * c + j % c;
                let span = (taps - 1) * c;
                let (layouts, _) = group_layouts(&k.starts, &k.counts, c, taps, 1).unwrap();
                let mut next = 0;
                for g in &layouts {
                    assert_eq!(g.first, next, "{w}->{ow} c={c}");
                    assert!((1..=GROUP).contains(&g.n));
                    let bytes: Vec<usize> = (g.first..g.first + g.n).map(first_byte).collect();
                    assert!(bytes
                        .iter()
                        .all(|&b| b >= g.base && b - g.base + span < WINDOW));
                    let end = g.first + g.n;
                    if g.n < GROUP && end < ow * c {
                        // Cut by the window: at a pixel boundary when the group holds one,
                        // and taking the rest of the next pixel would not fit.
                        assert!(end % c == 0 || end / c * c <= g.first, "{w}->{ow} c={c}");
                        let ext = ((end / c + 1) * c).min(ow * c);
                        let more: Vec<usize> = (g.first..ext).map(first_byte).collect();
                        let span = more.iter().max().unwrap() - more.iter().min().unwrap();
                        let wide = more.iter().max().unwrap() - more.iter().min().unwrap();
                        assert!(ext - g.first > GROUP || wide + span >= WINDOW, "not widest");
                    }
                    for (s, &b) in bytes.iter().enumerate() {
                        for t in 0..taps {
                            let at = 4 * s + t * (4 / taps);
                            assert_eq!(usize::from(g.control[at]), b - g.base + t * c);
                        }
                    }
                    let widest = (g.first..end).map(|j| k.counts[j / c]).max().unwrap();
                    assert_eq!(g.pairs, widest.div_ceil(taps).max(1));
                    next = end;
                }
                assert_eq!(next, ow * c);
                let mut widths: Vec<usize> = layouts.iter().map(|g| g.n).collect();
                widths.sort_unstable();
                let median = widths[widths.len() / 2];
                for min_fill in [1, 6, 9, 16] {
                    let planned = group_layouts(&k.starts, &k.counts, c, taps, min_fill).is_some();
                    assert_eq!(planned, median >= min_fill, "median {median}");
                }
                axes += 1;
            }
        });
        assert_eq!(axes, 108);
    }

    /// The AVX-512 kernel against the AVX2 one and the scalar reference, on random rows and
    /// weights (Pillow-sized and extreme), for lengths around the vector width and tap counts
    /// on both sides of the stack limit.
    #[test]
    fn vertical_matches_avx2_and_scalar() {
        if !available() {
            eprintln!("no AVX-512 VNNI here: nothing to compare");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for taps in [1, 2, 3, 7, 16, 17, 40] {
            for n in [1, 31, 63, 64, 65, 127, 200, 3444] {
                let rows: Vec<Vec<u8>> = (0..taps)
                    .map(|_| (0..n).map(|_| next() as u8).collect())
                    .collect();
                let weights: Vec<i32> = (0..taps)
                    .map(|t| match t % 3 {
                        0 => (next() % (1 << 23)) as i32 - (1 << 21),
                        1 => -(1 << 22) + (next() % 5) as i32,
                        _ => (1 << 22) / taps,
                    })
                    .collect();
                let refs: Vec<&[u8]> = rows.iter().map(Vec::as_slice).collect();
                let mut want = vec![0u8; n];
                crate::image::scalar::vertical_row_scalar(&refs, &weights, &mut want);
                let mut avx2 = vec![0u8; n];
                let mut avx512 = vec![0u8; n];
                // SAFETY: `available` found AVX-512 (which implies AVX2) on this CPU.
                unsafe {
                    crate::image::avx2::vertical_row(&refs, &weights, &mut avx2);
                    vertical_row(&refs, &weights, &mut avx512);
                }
                assert_eq!(avx2, want, "avx2, {taps} taps, {n} samples");
                assert_eq!(avx512, want, "avx512, {taps} taps, {n} samples");
            }
        }
    }
}
