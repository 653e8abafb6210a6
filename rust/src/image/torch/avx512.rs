//! torch's antialiased `uint8` resize ([`super::resize_u8`]) with AVX-512 (BW, VL, VBMI and
//! VNNI) on its own `int16` weights, to the same bits as [`super::avx2`] and the scalar formula
//! (the same integer sums, which cannot overflow; `vpdpwssd` is `vpmaddwd` + `vpaddd` in one
//! instruction, wrapping like them).
//!
//! - horizontal pass: up to 16 output samples per group. Per tap pair and row, one unaligned
//!   64-byte load and one zero-masking `vpermb` put each sample's two taps `(2p, 2p + 1)`,
//!   zero-extended to `i16`, in its own dword, and one `vpdpwssd` adds them times their
//!   weights. That needs the group's first tap bytes within 64 bytes of each other: 16 samples
//!   for reductions up to about 3.5× with three channels, fewer beyond (as many as fit,
//!   [`group_layouts`](crate::image::avx512::group_layouts)); where too few fit to beat the AVX2 kernels ([`min_fill`]; with three
//!   channels, reductions past about 19×), those serve the axis, then the resampler's path.
//!   When every group fits 32 bytes, the loads are 32 bytes wide (fewer cache-line splits).
//!   Where it costs fewer loads, each load serves four taps instead ([`Taps::Quads`]): one
//!   `vpermb` puts a sample's four tap bytes in its dword, and two `vpdpbusd` sum them times the
//!   low and the high bytes of the weights.
//!   Four input rows at a time share the controls and weights. The sums are clamped and narrowed
//!   with `vpmaxsd` and `vpmovusdb`.
//! - vertical pass: the AVX2 kernel on 64 samples per step; each 128-bit lane works like a lane
//!   of the AVX2 kernel, so the in-lane unpacks and packs keep the samples in order.

use std::arch::x86_64::*;

use super::stream::Kernels;
use super::vertical::{self, Lanes};
use super::Int16Coeffs;

#[cfg(test)]
use crate::image::avx512::group_layouts;
pub(super) use crate::image::avx512::Taps;
use crate::image::avx512::{
    cheaper_layouts, even_bytes, signed_bytes, window, GroupLayout, GROUP, WINDOW,
};

/// Whether the CPU has what these kernels need (and AVX-512 is not turned off, see
/// [`crate::simd`]): the resampler's AVX-512 check, the same features.
pub(super) fn available() -> bool {
    crate::image::avx512::available()
}

/// The fewest samples in the median group for which these kernels are used (below, the AVX2
/// ones), by channel count. Measured on the Intel Xeon VM (bicubic, horizontal pass alone, one
/// thread, two photos): 1.2–2.4× faster than AVX2 with one or three channels down to 6 samples a
/// group (reductions up to 10× with one channel, 19× with three), 0.8–0.9× at 3–5; with four
/// channels, where the AVX2 kernel fills every lane, 0.8–1.0× at 8 samples, 1.1× at 12.
fn min_fill(channels: usize) -> usize {
    if channels >= 4 {
        10
    } else {
        6
    }
}

#[derive(Clone, Copy, Debug)]
struct Group {
    /// The group's first output sample in the row.
    out: u32,
    /// Samples in the group (up to 16: see [`group_layouts`](crate::image::avx512::group_layouts)).
    n: u32,
    /// Loads per row (tap pairs, or tap quads).
    loads: u32,
    /// Byte offset of the first load from the row's start.
    base: u32,
}

/// `w = 256·h + l` with `l` in −128…127: `(l, h)`, `None` when `h` is 128 (`w ≥ 32 640`).
/// With these bytes [`Taps::Quads`] sums `256·Σ x·h + Σ x·l`, the same integer as `Σ x·w`.
fn byte_split(w: i16) -> Option<(i8, i8)> {
    signed_bytes::<2>(i32::from(w)).map(|[l, h]| (l, h))
}

/// The horizontal pass of one axis for one channel count.
pub(super) struct Horizontal {
    taps: Taps,
    groups: Vec<Group>,
    /// Per group, the `vpermb` control: sample `s`'s tap bytes at bytes `4s` and `4s + 2`
    /// (pairs) or `4s` to `4s + 3` (quads).
    controls: Vec<[u8; 64]>,
    /// Per group and load, one vector (pairs: the 16 samples' `(w₂ₚ, w₂ₚ₊₁)` as `i16`) or two
    /// (quads: the 16 samples' four `l` bytes, then their four `h` bytes).
    weights: Vec<[u8; 64]>,
    /// Bytes (`2 × channels` or `4 × channels`) the loads advance.
    step: usize,
    /// Bytes from a row's start that the loads may read.
    read_len: usize,
    samples: usize,
    precision: u32,
    /// Every group's bytes lie within 32 of its first: 32-byte loads.
    narrow: bool,
}

impl Horizontal {
    /// The cheaper plan of pairs and quads (quads only where every weight splits into bytes;
    /// [`cheaper_layouts`]). Measured on AMD Zen 4 (torch's bicubic, three channels, one
    /// thread): at 2000 → 896 quads take 3 loads where pairs take 5 (9-tap samples), and the
    /// resize is 1.19× faster (0.841 → 0.705 ms); at 1000 → 700 pairs fit 32-byte loads and
    /// quads do not, and pairs are 1.12× faster (0.357 against 0.400 ms). `None` when neither
    /// fits ([`min_fill`]), or the precision is 0.
    pub(super) fn new(k: &Int16Coeffs, channels: usize) -> Option<Horizontal> {
        let c = channels;
        if k.precision == 0 || c == 0 {
            return None;
        }
        let quads_fit = k.weights.iter().all(|&w| byte_split(w).is_some());
        let (taps, layouts, narrow) =
            cheaper_layouts(&k.starts, &k.counts, c, min_fill(c), quads_fit)?;
        Some(Horizontal::build(k, c, taps, layouts, narrow))
    }

    /// The plan taking `taps` taps a load; `None` when too few samples fit a window
    /// ([`min_fill`]), the precision is 0, or (quads) some weight does not split into bytes.
    #[cfg(test)]
    pub(super) fn with_taps(k: &Int16Coeffs, channels: usize, taps: Taps) -> Option<Horizontal> {
        let c = channels;
        if k.precision == 0 || c == 0 {
            return None;
        }
        if taps == Taps::Quads && !k.weights.iter().all(|&w| byte_split(w).is_some()) {
            return None;
        }
        let (layouts, narrow) = group_layouts(&k.starts, &k.counts, c, taps.count(), min_fill(c))?;
        Some(Horizontal::build(k, c, taps, layouts, narrow))
    }

    /// The plan of these layouts: weights, controls and read length.
    fn build(
        k: &Int16Coeffs,
        c: usize,
        taps: Taps,
        layouts: Vec<GroupLayout>,
        narrow: bool,
    ) -> Horizontal {
        let mut plan = Horizontal {
            taps,
            groups: Vec::with_capacity(layouts.len()),
            controls: Vec::with_capacity(layouts.len()),
            weights: Vec::new(),
            step: taps.count() * c,
            read_len: 0,
            samples: k.starts.len() * c,
            precision: k.precision,
            narrow,
        };
        let vectors = match taps {
            Taps::Pairs => 1,
            Taps::Quads => 2,
        };
        for g in layouts {
            let at = plan.weights.len();
            plan.weights.resize(at + vectors * g.pairs, [0u8; 64]);
            for s in 0..g.n {
                let x = (g.first + s) / c;
                let w = &k.weights[x * k.ksize..][..k.counts[x]];
                let tap = |i: usize| w.get(i).copied().unwrap_or(0);
                for p in 0..g.pairs {
                    match taps {
                        Taps::Pairs => {
                            for t in 0..2 {
                                let b = tap(2 * p + t).to_le_bytes();
                                plan.weights[at + p][4 * s + 2 * t..][..2].copy_from_slice(&b);
                            }
                        }
                        Taps::Quads => {
                            for t in 0..4 {
                                // Checked above: every weight splits.
                                let (l, h) = byte_split(tap(4 * p + t)).unwrap_or((0, 0));
                                plan.weights[at + 2 * p][4 * s + t] = l as u8;
                                plan.weights[at + 2 * p + 1][4 * s + t] = h as u8;
                            }
                        }
                    }
                }
            }
            let end = g.base + plan.step * (g.pairs - 1) + WINDOW;
            plan.read_len = plan.read_len.max(end);
            plan.groups.push(Group {
                out: g.first as u32,
                n: g.n as u32,
                loads: g.pairs as u32,
                base: g.base as u32,
            });
            plan.controls.push(g.control);
        }
        plan
    }

    /// How many taps a load takes (tests compare both).
    #[cfg(test)]
    pub(super) fn taps(&self) -> Taps {
        self.taps
    }

    /// [`Kernels::rows`] with tap pairs.
    ///
    /// # Safety
    /// The CPU must have what [`available`] checks; every `src[r]` at least
    /// [`read_len`](Kernels::read_len) bytes long (asserted).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    unsafe fn pair_rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        assert!(src.iter().all(|s| s.len() >= self.read_len));
        assert!(out.iter().all(|o| o.len() == self.samples));
        let ptrs = src.map(|s| s.as_ptr());
        let rounding = _mm512_set1_epi32(1 << (self.precision - 1));
        let shift = _mm_cvtsi32_si128(self.precision as i32);
        let mut weights = self.weights.as_ptr();
        for (g, control) in self.groups.iter().zip(&self.controls) {
            // SAFETY: `control` is 64 bytes; the loads read at most 64 bytes at `base + p·step`
            // for p < loads, which end within `read_len` (built so in `with_taps`) and so within
            // each row (asserted); the group's `loads` weight vectors of 64 bytes follow
            // `weights` (the groups' vectors follow each other, as built in `with_taps`). The
            // stores write `out[r][g.out..][..g.n]`, inside the row (`g.out + g.n ≤ samples`).
            unsafe {
                let control = _mm512_loadu_si512(control.as_ptr().cast());
                let mut acc = [rounding; R];
                let mut at = g.base as usize;
                for _ in 0..g.loads {
                    let w = _mm512_loadu_si512(weights.cast());
                    for r in 0..R {
                        let v = window(ptrs[r].add(at), self.narrow);
                        let v = even_bytes(control, v);
                        acc[r] = _mm512_dpwssd_epi32(acc[r], v, w);
                    }
                    at += self.step;
                    weights = weights.add(1);
                }
                for r in 0..R {
                    store_group(out[r].as_mut_ptr().add(g.out as usize), g.n, acc[r], shift);
                }
            }
        }
    }

    /// [`Kernels::rows`] with tap quads: per load, the low and the high weight bytes each
    /// summed by one `vpdpbusd` (tap bytes unsigned, weight bytes signed, four products a
    /// dword, wrapping like `vpdpwssd`), joined as `low + 256·high` at the end.
    ///
    /// # Safety
    /// As [`pair_rows`](Self::pair_rows).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    unsafe fn quad_rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        assert!(src.iter().all(|s| s.len() >= self.read_len));
        assert!(out.iter().all(|o| o.len() == self.samples));
        let ptrs = src.map(|s| s.as_ptr());
        let rounding = _mm512_set1_epi32(1 << (self.precision - 1));
        let shift = _mm_cvtsi32_si128(self.precision as i32);
        let zero = _mm512_setzero_si512();
        let mut weights = self.weights.as_ptr();
        for (g, control) in self.groups.iter().zip(&self.controls) {
            // SAFETY: as in `pair_rows`, with two weight vectors per load (`2 × loads` follow
            // `weights`, as built in `with_taps`).
            unsafe {
                let control = _mm512_loadu_si512(control.as_ptr().cast());
                let (mut low, mut high) = ([rounding; R], [zero; R]);
                let mut at = g.base as usize;
                for _ in 0..g.loads {
                    let wl = _mm512_loadu_si512(weights.cast());
                    let wh = _mm512_loadu_si512(weights.add(1).cast());
                    for r in 0..R {
                        let v =
                            _mm512_permutexvar_epi8(control, window(ptrs[r].add(at), self.narrow));
                        low[r] = _mm512_dpbusd_epi32(low[r], v, wl);
                        high[r] = _mm512_dpbusd_epi32(high[r], v, wh);
                    }
                    at += self.step;
                    weights = weights.add(2);
                }
                for r in 0..R {
                    let acc = _mm512_add_epi32(low[r], _mm512_slli_epi32::<8>(high[r]));
                    store_group(out[r].as_mut_ptr().add(g.out as usize), g.n, acc, shift);
                }
            }
        }
    }
}

/// A group's sums shifted down by the precision, clamped to 0…255 and stored as its `n` bytes
/// at `dst`.
///
/// # Safety
/// AVX-512F, BW and VL; `n ≤ 16` bytes at `dst` writable.
#[inline(always)]
unsafe fn store_group(dst: *mut u8, n: u32, acc: __m512i, shift: __m128i) {
    // SAFETY: the caller's.
    unsafe {
        let v = _mm512_sra_epi32(acc, shift);
        let bytes = _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, _mm512_setzero_si512()));
        if n as usize == GROUP {
            _mm_storeu_si128(dst.cast(), bytes);
        } else {
            _mm_mask_storeu_epi8(dst.cast(), (1u16 << n) - 1, bytes);
        }
    }
}

impl Kernels for Horizontal {
    const STEP: usize = <__m512i as Lanes>::BYTES;

    fn samples(&self) -> usize {
        self.samples
    }

    fn read_len(&self) -> usize {
        self.read_len
    }

    // `R` rows sharing each group's control and weight loads.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    unsafe fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        match self.taps {
            // SAFETY: the caller's (AVX-512).
            Taps::Pairs => unsafe { self.pair_rows(src, out) },
            // SAFETY: the caller's (AVX-512).
            Taps::Quads => unsafe { self.quad_rows(src, out) },
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn vertical<const R: usize>(
        rows: &[*const u8],
        weights: &[i32],
        precision: u32,
        n: usize,
        out: [*mut u8; R],
    ) {
        // SAFETY: AVX-512F, BW and VNNI are enabled here, and the CPU has them (the caller's
        // contract, with the pointers').
        unsafe { vertical::vertical::<__m512i, R>(rows, weights, precision, n, out) }
    }
}

// The methods are the AVX-512 forms of the operations `Lanes` names (BW for the byte and word
// operations, VNNI for `vpdpwssd`).
impl Lanes for __m512i {
    const BYTES: usize = 64;

    #[inline(always)]
    unsafe fn load(p: *const u8) -> Self {
        // SAFETY: the caller's (64 readable bytes, AVX-512).
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    #[inline(always)]
    unsafe fn store(p: *mut u8, v: Self) {
        // SAFETY: the caller's (64 writable bytes, AVX-512).
        unsafe { _mm512_storeu_si512(p.cast(), v) }
    }

    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn splat(x: i32) -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe { _mm512_set1_epi32(x) }
    }

    #[inline(always)]
    unsafe fn unpack8<const HI: bool>(a: Self, b: Self) -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe {
            if HI {
                _mm512_unpackhi_epi8(a, b)
            } else {
                _mm512_unpacklo_epi8(a, b)
            }
        }
    }

    #[inline(always)]
    unsafe fn dot_add(acc: Self, v: Self, w: Self) -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe { _mm512_dpwssd_epi32(acc, v, w) }
    }

    #[inline(always)]
    unsafe fn shift(v: Self, count: __m128i) -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe { _mm512_sra_epi32(v, count) }
    }

    #[inline(always)]
    unsafe fn pack(s: [Self; 4]) -> Self {
        // SAFETY: the caller's (AVX-512).
        unsafe {
            _mm512_packus_epi16(
                _mm512_packs_epi32(s[0], s[1]),
                _mm512_packs_epi32(s[2], s[3]),
            )
        }
    }
}
