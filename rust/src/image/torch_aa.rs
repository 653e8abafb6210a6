//! torch's antialiased resize of `float32` images on CPU, bit for bit:
//! `F.interpolate(x, size, mode="bicubic" | "bilinear", antialias=True, align_corners=False)`
//! as torch 2.14.1's AVX2 build computes it (the separable generic kernel of ATen's
//! `UpSampleKernel.cpp`, which torchvision 0.29's `resize` reaches for a float tensor).
//! transformers' Nemotron-H-Omni image processor resizes its images this way, in `float32`, so
//! that the bicubic overshoot outside `[0, 255]` is kept.
//!
//! What the kernel computes, checked against torch with impulses (every weight of 71 axis pairs)
//! and random images (100+ sizes from 1×1 to 4032×3024, up- and downscaling), no difference:
//!
//! - **weights** ([`aa_taps`]), per axis, in `f32` with some steps in `f64` as C++ promotes
//!   them: `scale = f32(in) / f32(out)`; `support = f32(2·scale)` (bicubic; `scale` for
//!   bilinear) when `scale ≥ 1`, else the filter's own; `center = f32(scale·(i + 0.5))` (the
//!   product in `f64`); `invscale = f32(1 / scale)` when `scale ≥ 1`, else 1; the taps run
//!   from `xmin = max(trunc((center − support) + 0.5), 0)` to
//!   `min(trunc((center + support) + 0.5), in)` (the differences in `f32`, the `+ 0.5` in
//!   `f64`), at most `2·⌈support⌉ + 1`; tap `j` weighs
//!   `filter(f32((f32(j + xmin) − center + 0.5) · invscale))`, and each weight is divided by
//!   their `f32` sum (left to right) unless that is 0. Bicubic is Keys' cubic with `a = −0.5`
//!   evaluated with every step fused (`fma(fma(1.5, x, −2.5)·x, x, 1)` on `[0, 1)`,
//!   `fma(fma(fma(−0.5, x, 2.5), x, −4), x, 2)` on `[1, 2)`): the compiler contracts them.
//! - **passes**: horizontal first (an axis whose size does not change is skipped; nothing at all
//!   when neither does), the intermediate image in `f32`. Each output is
//!   `x₀·w₀ + x₁·w₁ + …` over its taps, left to right, in the order GCC's vectoriser left it
//!   ([`dot`]): the products of taps `1 ..= 8·⌊n/8⌋` (`n` the taps after the first), and of the
//!   next 4 when at least 4 remain, are rounded before being added (the 8- and 4-wide vector
//!   loops multiply, then add the lanes in order), the remaining taps are fused
//!   multiply-adds (the scalar tail loop, contracted).
//! - ours streams ([`resize_plane`], [`resize_planes`] for several channel planes row by row):
//!   with AVX-512 the horizontal pass computes 16 output columns of a row at once (one SIMD lane
//!   per output column, its taps picked from a 32-value window; reductions up to about 1.7×),
//!   otherwise it runs eight input rows side by side (one lane per row); each lane's operations
//!   are those above. The vertical pass keeps only the rows its current window needs, and each
//!   output row goes to the caller as it is made.
//! - the vertical pass of an image **one pixel wide** gives every output row the value of the
//!   first (torch's `TensorIterator` makes the rows its inner loop, and the kernel reads the
//!   weights of that loop's first element only): reproduced.

use crate::memory::{fallible, AllocError};

use super::torch::TorchFilter;

/// The taps of one axis: for output `i`, `counts[i]` input indices from `starts[i]` and their
/// weights, `weights[i·ksize ..][.. counts[i]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct AaTaps {
    pub ksize: usize,
    pub starts: Vec<usize>,
    pub counts: Vec<usize>,
    pub weights: Vec<f32>,
}

impl AaTaps {
    fn row(&self, i: usize) -> (usize, &[f32]) {
        (
            self.starts[i],
            &self.weights[i * self.ksize..][..self.counts[i]],
        )
    }
}

/// `HelperInterpCubic::aa_filter<float>` (Keys, `a = −0.5`) with the compiler's contractions.
fn cubic_aa(x: f32) -> f32 {
    let x = x.abs();
    if x < 1.0 {
        (1.5f32.mul_add(x, -2.5) * x).mul_add(x, 1.0)
    } else if x < 2.0 {
        (-0.5f32).mul_add(x, 2.5).mul_add(x, -4.0).mul_add(x, 2.0)
    } else {
        0.0
    }
}

/// Lanczos-3, `sinc(x)·sinc(x / 3)` for `|x| < 3` (computed in `f64`, as the uint8 kernel's).
fn lanczos_aa(x: f32) -> f32 {
    let x = f64::from(x.abs());
    if x >= 3.0 {
        return 0.0;
    }
    let sinc = |v: f64| {
        if v == 0.0 {
            1.0
        } else {
            let v = v * std::f64::consts::PI;
            v.sin() / v
        }
    };
    (sinc(x) * sinc(x / 3.0)) as f32
}

/// `HelperInterpLinear::aa_filter<float>`.
fn linear_aa(x: f32) -> f32 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// torch's antialiased taps (`_compute_indices_min_size_weights_aa` in `float`) for an axis of
/// `in_size` pixels resized to `out_size` (both non-zero).
pub fn aa_taps(in_size: usize, out_size: usize, filter: TorchFilter) -> AaTaps {
    let (half, kernel): (f64, fn(f32) -> f32) = match filter {
        TorchFilter::Bicubic => (2.0, cubic_aa),
        TorchFilter::Bilinear => (1.0, linear_aa),
        // Lanczos-3 as the uint8 kernel defines it; the float path with LANCZOS is not checked
        // against torch (no processor asks for it: `torch_backend::filter_of` gives bilinear or
        // bicubic only).
        TorchFilter::Lanczos => (3.0, lanczos_aa),
    };
    let scale = in_size as f32 / out_size as f32;
    let support = if scale >= 1.0 {
        (half * f64::from(scale)) as f32
    } else {
        half as f32
    };
    let ksize = support.ceil() as usize * 2 + 1;
    let invscale = if scale >= 1.0 {
        (1.0 / f64::from(scale)) as f32
    } else {
        1.0
    };
    let mut taps = AaTaps {
        ksize,
        starts: Vec::with_capacity(out_size),
        counts: Vec::with_capacity(out_size),
        weights: vec![0.0; out_size * ksize],
    };
    for i in 0..out_size {
        let center = (f64::from(scale) * (i as f64 + 0.5)) as f32;
        let xmin = ((f64::from(center - support) + 0.5) as i64).max(0);
        let xmax = ((f64::from(center + support) + 0.5) as i64).min(in_size as i64);
        let count = (xmax - xmin).clamp(0, ksize as i64) as usize;
        let row = &mut taps.weights[i * ksize..][..count];
        let mut total = 0.0f32;
        for (j, w) in row.iter_mut().enumerate() {
            let offset = (j as i64 + xmin) as f32 - center;
            *w = kernel(((f64::from(offset) + 0.5) * f64::from(invscale)) as f32);
            total += *w;
        }
        if total != 0.0 {
            for w in row.iter_mut() {
                *w /= total;
            }
        }
        taps.starts.push(xmin as usize);
        taps.counts.push(count);
    }
    taps
}

/// How many taps after the first have their product rounded before the addition (see the
/// module docs): `8·⌊n/8⌋`, plus 4 when at least 4 more remain.
#[inline(always)]
fn rounded_taps(n: usize) -> usize {
    let eights = n / 8 * 8;
    if n - eights >= 4 {
        eights + 4
    } else {
        eights
    }
}

/// `Σ xⱼ·wⱼ` in torch's order (module docs); `values(j)` is tap `j`'s input value.
#[inline(always)]
fn dot(weights: &[f32], values: impl Fn(usize) -> f32) -> f32 {
    let Some(&w0) = weights.first() else {
        return 0.0;
    };
    let mut acc = values(0) * w0;
    let plain = rounded_taps(weights.len() - 1);
    for (j, &w) in weights.iter().enumerate().skip(1) {
        acc = if j <= plain {
            acc + values(j) * w
        } else {
            values(j).mul_add(w, acc)
        };
    }
    acc
}

/// The vertical pass of one output row: `out[x] = Σⱼ rows(j)[x]·wⱼ`, one tap at a time over the
/// whole row (each element's order is the same as [`dot`]'s).
#[inline(always)]
fn vertical_body<'r>(weights: &[f32], rows: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    let Some(&w0) = weights.first() else {
        out.fill(0.0);
        return;
    };
    for (o, &v) in out.iter_mut().zip(rows(0)) {
        *o = v * w0;
    }
    let plain = rounded_taps(weights.len() - 1);
    for (j, &w) in weights.iter().enumerate().skip(1) {
        let row = rows(j);
        if j <= plain {
            for (o, &v) in out.iter_mut().zip(row) {
                *o += v * w;
            }
        } else {
            for (o, &v) in out.iter_mut().zip(row) {
                *o = v.mul_add(w, *o);
            }
        }
    }
}

/// Rows the horizontal pass runs side by side.
const LANES: usize = 8;

/// The horizontal pass of LANES rows at once: `tin` holds the input rows transposed
/// (`in_w × LANES`, lane `l` = row `l`), `tout` gets the outputs likewise (`out_w × LANES`); each
/// lane's arithmetic is [`dot`]'s.
#[inline(always)]
fn horizontal_lanes_body(tin: &[f32], taps: &AaTaps, tout: &mut [f32]) {
    horizontal_lanes_range(tin, taps, tout, 0..tout.len() / LANES);
}

/// [`horizontal_lanes_body`] for the outputs `outs` only.
#[inline(always)]
fn horizontal_lanes_range(
    tin: &[f32],
    taps: &AaTaps,
    tout: &mut [f32],
    outs: std::ops::Range<usize>,
) {
    let skip = outs.start;
    for (x, o) in tout
        .chunks_exact_mut(LANES)
        .enumerate()
        .take(outs.end)
        .skip(skip)
    {
        let (start, weights) = taps.row(x);
        let Some(&w0) = weights.first() else {
            o.fill(0.0);
            continue;
        };
        let base = &tin[start * LANES..(start + weights.len()) * LANES];
        let mut acc = [0f32; LANES];
        for (a, &v) in acc.iter_mut().zip(&base[..LANES]) {
            *a = v * w0;
        }
        let plain = rounded_taps(weights.len() - 1);
        for (j, (&w, v)) in weights
            .iter()
            .zip(base.chunks_exact(LANES))
            .enumerate()
            .skip(1)
        {
            if j <= plain {
                for (a, &v) in acc.iter_mut().zip(v) {
                    *a += v * w;
                }
            } else {
                for (a, &v) in acc.iter_mut().zip(v) {
                    *a = v.mul_add(w, *a);
                }
            }
        }
        o.copy_from_slice(&acc);
    }
}

/// [`horizontal_lanes_body`] with AVX2 and FMA: four outputs at a time where their tap counts
/// agree (their sums are independent chains of multiplies and adds, which one output at a time
/// leaves waiting on each other's latency), each lane with [`dot`]'s operations in its order:
/// products added for the first [`rounded_taps`] taps after the first, fused after that.
///
/// The taps are checked against `tin` once per call, not per output, and the common tap counts
/// (2–12: every upscale, bicubic reductions up to 3×, bilinear up to 6×) get straight-line code of their own:
/// with a few taps per output the per-output bookkeeping cost as much as the arithmetic.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn horizontal_lanes_fma(tin: &[f32], taps: &AaTaps, tout: &mut [f32]) {
    use std::arch::x86_64::*;
    const GROUP: usize = 4;
    let n_out = tout.len() / LANES;
    let n_in = tin.len() / LANES;
    let inside = |x: usize| {
        taps.counts[x] <= taps.ksize && taps.starts[x].saturating_add(taps.counts[x]) <= n_in
    };
    if taps.starts.len() < n_out
        || taps.counts.len() < n_out
        || taps.weights.len() < n_out.saturating_mul(taps.ksize)
        || !(0..n_out).all(inside)
    {
        // Not taps of this row (never so from `aa_taps`): the bounds-checked path.
        horizontal_lanes_range(tin, taps, tout, 0..n_out);
        return;
    }
    // The sums of the four outputs from `x` (their taps `len` long), stored at their places in
    // `tout`. A macro, so that each literal `len` below gets its own straight-line copy.
    macro_rules! four {
        ($x:expr, $len:expr) => {{
            let (x, len): (usize, usize) = ($x, $len);
            let plain = rounded_taps(len - 1);
            // SAFETY: the caller's group check makes `len` every one of the four outputs' count;
            // checked above for every output `x + k < n_out`: its `len ≤ ksize` weights
            // start at `(x + k)·ksize` in `taps.weights`, and its taps' `len · 8` values at
            // `starts[x + k]·8` in `tin` (`starts + len ≤ n_in`); the stores write
            // `tout[(x + k)·8..][..8]`, inside `tout` as `x + k < n_out`. AVX2 and FMA are this
            // function's features.
            unsafe {
                let w = taps.weights.as_ptr().add(x * taps.ksize);
                let b = tin.as_ptr();
                let s = taps.starts.as_ptr().add(x);
                let bases = [
                    b.add(*s * LANES),
                    b.add(*s.add(1) * LANES),
                    b.add(*s.add(2) * LANES),
                    b.add(*s.add(3) * LANES),
                ];
                let load = |k: usize, j: usize| _mm256_loadu_ps(bases[k].add(j * LANES));
                let weight = |k: usize, j: usize| _mm256_broadcast_ss(&*w.add(k * taps.ksize + j));
                let first = |k: usize| _mm256_mul_ps(load(k, 0), weight(k, 0));
                let mut acc: [__m256; GROUP] = [first(0), first(1), first(2), first(3)];
                for j in 1..=plain {
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(load(k, j), weight(k, j)));
                    }
                }
                for j in plain + 1..len {
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(load(k, j), weight(k, j), *a);
                    }
                }
                for (k, a) in acc.into_iter().enumerate() {
                    _mm256_storeu_ps(tout.as_mut_ptr().add((x + k) * LANES), a);
                }
            }
        }};
    }
    let mut x = 0;
    while x + GROUP <= n_out {
        let len = taps.counts[x];
        if len == 0 || taps.counts[x + 1..x + GROUP].iter().any(|&c| c != len) {
            // Near the edges: this output alone.
            horizontal_lanes_range(tin, taps, tout, x..x + 1);
            x += 1;
            continue;
        }
        match len {
            2 => four!(x, 2),
            3 => four!(x, 3),
            4 => four!(x, 4),
            5 => four!(x, 5),
            6 => four!(x, 6),
            7 => four!(x, 7),
            8 => four!(x, 8),
            9 => four!(x, 9),
            10 => four!(x, 10),
            11 => four!(x, 11),
            12 => four!(x, 12),
            _ => four!(x, len),
        }
        x += GROUP;
    }
    horizontal_lanes_range(tin, taps, tout, x..n_out);
}

fn horizontal_lanes(tin: &[f32], taps: &AaTaps, tout: &mut [f32], fma: bool) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: `fma` is only true when the CPU has AVX2 and FMA (`has_fma`), the features
        // the function enables; it is otherwise safe code.
        unsafe { horizontal_lanes_fma(tin, taps, tout) };
        return;
    }
    let _ = fma;
    horizontal_lanes_body(tin, taps, tout)
}

// The two passes compiled for FMA (so `mul_add` is an instruction, not a call into libm) and
// AVX2 (so the vertical loops vectorise); the same correctly rounded operations either way.
//
// With up to [`REGISTER_TAPS`] taps, the sums of 16 outputs at a time stay in registers over all
// their taps and each output is stored once (one tap at a time over the whole row loads and
// stores every output once per tap); each element's operations and their order are still
// [`dot`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn vertical_fma<'r>(weights: &[f32], rows: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (n, len) = (out.len(), weights.len());
    if len == 0 || len > REGISTER_TAPS {
        return vertical_body(weights, rows, out);
    }
    let mut ptrs = [std::ptr::null::<f32>(); REGISTER_TAPS];
    for (j, p) in ptrs.iter_mut().enumerate().take(len) {
        let row = rows(j);
        if row.len() < n {
            return vertical_body(weights, rows, out);
        }
        *p = row.as_ptr();
    }
    let plain = rounded_taps(len - 1);
    let mut x = 0;
    while x + 16 <= n {
        // SAFETY: every `ptrs[j]` (`j < len`) starts a row of at least `n` values (checked
        // above) and `x + 16 ≤ n`, so the loads at `x` and `x + 8` read inside it; `w(j)` reads
        // `weights[j]` for `j < len = weights.len()`; the stores write `out[x..x + 16]`. AVX2
        // and FMA are this function's features.
        unsafe {
            let load = |j: usize, at: usize| _mm256_loadu_ps(ptrs[j].add(x + at));
            let w = |j: usize| _mm256_set1_ps(*weights.get_unchecked(j));
            let mut a = _mm256_mul_ps(load(0, 0), w(0));
            let mut b = _mm256_mul_ps(load(0, 8), w(0));
            for j in 1..=plain {
                a = _mm256_add_ps(a, _mm256_mul_ps(load(j, 0), w(j)));
                b = _mm256_add_ps(b, _mm256_mul_ps(load(j, 8), w(j)));
            }
            for j in plain + 1..len {
                a = _mm256_fmadd_ps(load(j, 0), w(j), a);
                b = _mm256_fmadd_ps(load(j, 8), w(j), b);
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(x), a);
            _mm256_storeu_ps(out.as_mut_ptr().add(x + 8), b);
        }
        x += 16;
    }
    vertical_body(weights, |j| &rows(j)[x..], &mut out[x..]);
}

/// Taps up to which the AVX2 vertical pass keeps its sums in registers.
#[cfg(target_arch = "x86_64")]
const REGISTER_TAPS: usize = 32;

/// `lanes[x · LANES + l] = rows[l · n + x]` for `x < n`, `l < LANES`: LANES rows of `n` values
/// (one after the other in `rows`) side by side, row `l` in lane `l`.
fn to_lanes(rows: &[f32], n: usize, lanes: &mut [f32], avx: bool) {
    regroup(rows, lanes, n, avx, true);
}

/// The inverse of [`to_lanes`]: `rows[l · n + x] = lanes[x · LANES + l]`.
fn from_lanes(lanes: &[f32], n: usize, rows: &mut [f32], avx: bool) {
    regroup(lanes, rows, n, avx, false);
}

/// Value `(l, x)` (`l < LANES`, `x < n`) from `src` to `dst`, one of them holding LANES rows of
/// `n` values one after the other (at `l·n + x`) and the other the same values side by side
/// (at `x·LANES + l`): `into_lanes` says which. With `avx` (the CPU has AVX) eight `x` at a
/// time, as 8 × 8 transposes in registers.
fn regroup(src: &[f32], dst: &mut [f32], n: usize, avx: bool, into_lanes: bool) {
    assert!(src.len() >= LANES * n && dst.len() >= LANES * n);
    // Where value `(l, x)` lies: `l·(step of l) + x·(step of x)` in each layout.
    let (rows, lanes) = ((n, 1), (1, LANES));
    let ((sl, sx), (dl, dx)) = if into_lanes {
        (rows, lanes)
    } else {
        (lanes, rows)
    };
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut x = 0;
    #[cfg(target_arch = "x86_64")]
    if avx {
        // The 8 × 8 block at `x`, read and written as 8 runs of 8 consecutive values: runs of
        // `x` `n` apart in the rows layout, runs of `l` LANES apart in the lanes layout.
        let (src_stride, dst_stride) = if into_lanes { (n, LANES) } else { (LANES, n) };
        while x + LANES <= n {
            // SAFETY: `avx` is only true when the CPU has AVX (`has_fma` checked AVX2). In either
            // layout the block's 64 values are `(l, x + i)` for `l, i < 8`, at most index
            // `7·n + x + 7 < 8·n` (rows) or `(x + 7)·8 + 7 < 8·n` (lanes), inside both buffers
            // (asserted lengths), which are distinct slices.
            unsafe {
                transpose8(
                    src.as_ptr().add(x * sx),
                    src_stride,
                    dst.as_mut_ptr().add(x * dx),
                    dst_stride,
                )
            };
            x += LANES;
        }
    }
    let _ = avx;
    for x in x..n {
        for l in 0..LANES {
            dst[l * dl + x * dx] = src[l * sl + x * sx];
        }
    }
}

/// The 8 × 8 block of `f32` whose row `i` is `src[i · src_stride..][..8]`, transposed into
/// `dst` (row `j` at `dst[j · dst_stride..][..8]`): unpacks, shuffles and lane permutes, no
/// arithmetic, so the values are moved unchanged.
///
/// # Safety
///
/// The CPU must have AVX; the eight rows of eight values must be readable at `src` and writable
/// at `dst` with those strides, and not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose8(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the eight unaligned loads and stores are the rows the contract makes valid.
    unsafe {
        let r = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| _mm256_loadu_ps(src.add(i * src_stride)));
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        let out = [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ];
        for (j, v) in out.into_iter().enumerate() {
            _mm256_storeu_ps(dst.add(j * dst_stride), v);
        }
    }
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn vertical<'r>(weights: &[f32], rows: impl Fn(usize) -> &'r [f32], out: &mut [f32], fma: bool) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: as in `horizontal`.
        unsafe { vertical_fma(weights, rows, out) };
        return;
    }
    let _ = fma;
    vertical_body(weights, rows, out)
}

/// The horizontal pass with AVX-512 (F): 16 consecutive output columns of one row at a time,
/// one SIMD lane per output, each lane doing exactly [`dot`]'s operations on its own taps. A
/// group's taps are picked from a 32-value window of the row (two loads and one `vpermt2ps` per
/// tap); the rounded-then-added taps and the fused ones are chosen per lane with masks. Axes
/// where a group's taps span more than 32 input values (reductions beyond about 1.7×) have no
/// plan and keep the rows-side-by-side pass.
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::{rounded_taps, AaTaps};

    /// Output columns per group.
    pub(super) const GROUP: usize = 16;
    /// Input values one group may read, from its base.
    const WINDOW: usize = 32;

    /// Whether the running CPU has AVX-512F (and it is not turned off, see [`crate::simd`]).
    pub(super) fn available() -> bool {
        crate::simd::avx512_allowed() && is_x86_feature_detected!("avx512f")
    }

    /// One group's precomputed taps: `taps` vectors of window indices and weights, and per tap
    /// the lanes that add a rounded product and the lanes that fuse it.
    pub(super) struct Plan {
        /// Per group: the window's first input index and its tap count (the most of its lanes).
        groups: Vec<(usize, usize)>,
        /// Per group and tap: each lane's index into the window (0 past its taps).
        index: Vec<[i32; GROUP]>,
        /// Per group and tap: each lane's weight (0 past its taps).
        weight: Vec<[f32; GROUP]>,
        /// Per group and tap: lanes adding `x·w` rounded, and lanes fusing it.
        masks: Vec<(u16, u16)>,
        /// Input values the loads may read (the row must be padded to this length).
        pub(super) read_len: usize,
        /// Output columns, rounded up to whole groups (the output row's length).
        pub(super) padded_out: usize,
    }

    impl Plan {
        /// The plan of `taps`, or `None` when a group's taps do not fit one window or some
        /// output has no tap.
        pub(super) fn new(taps: &AaTaps) -> Option<Plan> {
            let out = taps.starts.len();
            let n_groups = out.div_ceil(GROUP);
            let mut plan = Plan {
                groups: Vec::with_capacity(n_groups),
                index: Vec::new(),
                weight: Vec::new(),
                masks: Vec::new(),
                read_len: 0,
                padded_out: n_groups * GROUP,
            };
            for first in (0..out).step_by(GROUP) {
                let lanes = first..out.min(first + GROUP);
                let base = lanes.clone().map(|i| taps.starts[i]).min()?;
                let mut most = 0;
                for i in lanes.clone() {
                    let (start, weights) = taps.row(i);
                    if weights.is_empty() || start - base + weights.len() > WINDOW {
                        return None;
                    }
                    most = most.max(weights.len());
                }
                let at = plan.index.len();
                plan.index.resize(at + most, [0; GROUP]);
                plan.weight.resize(at + most, [0.0; GROUP]);
                plan.masks.resize(at + most, (0, 0));
                for (lane, i) in lanes.enumerate() {
                    let (start, weights) = taps.row(i);
                    let plain = rounded_taps(weights.len() - 1);
                    for (j, &w) in weights.iter().enumerate() {
                        plan.index[at + j][lane] = (start - base + j) as i32;
                        plan.weight[at + j][lane] = w;
                        if j == 0 {
                            continue;
                        }
                        let (plains, fused) = &mut plan.masks[at + j];
                        if j <= plain {
                            *plains |= 1 << lane;
                        } else {
                            *fused |= 1 << lane;
                        }
                    }
                }
                plan.groups.push((base, most));
                plan.read_len = plan.read_len.max(base + WINDOW);
            }
            Some(plan)
        }

        /// `P` rows (of as many planes) at once, sharing each group's index, weight and mask
        /// loads: `outs[p][x] = Σⱼ lines[p][start(x) + j]·wⱼ` in [`super::dot`]'s order for
        /// every output column (and garbage in the padding columns).
        ///
        /// # Safety
        /// The CPU must support AVX-512F ([`available`]).
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn rows<const P: usize>(
            &self,
            lines: [&[f32]; P],
            outs: [&mut [f32]; P],
        ) {
            assert!(lines.iter().all(|l| l.len() >= self.read_len));
            assert!(outs.iter().all(|o| o.len() == self.padded_out));
            let mut tap = 0;
            for (g, &(base, taps)) in self.groups.iter().enumerate() {
                // SAFETY: `base + WINDOW ≤ read_len ≤ lines[p].len()`: both loads are in the
                // line; the group's `taps` index, weight and mask entries start at `tap`; the
                // store covers `outs[p][16g .. 16g + 16]`, within `padded_out`.
                unsafe {
                    let lo = lines.map(|l| _mm512_loadu_ps(l.as_ptr().add(base)));
                    let hi = lines.map(|l| _mm512_loadu_ps(l.as_ptr().add(base + GROUP)));
                    let idx = _mm512_loadu_si512(self.index.as_ptr().add(tap).cast());
                    let w = _mm512_loadu_ps(self.weight.as_ptr().add(tap).cast());
                    let mut acc = [_mm512_setzero_ps(); P];
                    for p in 0..P {
                        acc[p] = _mm512_mul_ps(_mm512_permutex2var_ps(lo[p], idx, hi[p]), w);
                    }
                    for t in tap + 1..tap + taps {
                        let idx = _mm512_loadu_si512(self.index.as_ptr().add(t).cast());
                        let w = _mm512_loadu_ps(self.weight.as_ptr().add(t).cast());
                        let (plains, fused) = *self.masks.get_unchecked(t);
                        for p in 0..P {
                            let x = _mm512_permutex2var_ps(lo[p], idx, hi[p]);
                            if plains != 0 {
                                acc[p] =
                                    _mm512_mask_add_ps(acc[p], plains, acc[p], _mm512_mul_ps(x, w));
                            }
                            if fused != 0 {
                                acc[p] = _mm512_mask3_fmadd_ps(x, w, acc[p], fused);
                            }
                        }
                    }
                    for p in 0..P {
                        _mm512_storeu_ps(outs[p].as_mut_ptr().add(g * GROUP), acc[p]);
                    }
                }
                tap += taps;
            }
        }
    }

    /// The vertical pass of one output row, 16 columns at a time kept in a register over all
    /// the taps: `out[x] = Σⱼ rows[j][x]·wⱼ` in [`super::dot`]'s order (every column has the
    /// same taps), row `j` being `ring[starts[j] ..][.. out.len()]`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F ([`available`]).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn vertical(
        weights: &[f32],
        ring: &[f32],
        starts: &[usize],
        out: &mut [f32],
    ) {
        let n = out.len();
        assert!(
            !weights.is_empty()
                && weights.len() == starts.len()
                && starts.iter().all(|&s| s + n <= ring.len())
        );
        let rows: &[usize] = starts;
        let plain = rounded_taps(weights.len() - 1);
        let mut x = 0;
        while x < n {
            let left = n - x;
            let mask: u16 = if left >= GROUP {
                u16::MAX
            } else {
                (1u16 << left) - 1
            };
            // SAFETY: the masked loads and the store touch columns `x .. x + min(16, left)`
            // only, within every row (each ends within `ring`, checked above) and within `out`.
            unsafe {
                let load = |j: usize| _mm512_maskz_loadu_ps(mask, ring.as_ptr().add(rows[j] + x));
                let mut acc = _mm512_mul_ps(load(0), _mm512_set1_ps(weights[0]));
                for (j, &w) in weights.iter().enumerate().skip(1) {
                    let w = _mm512_set1_ps(w);
                    acc = if j <= plain {
                        _mm512_add_ps(acc, _mm512_mul_ps(load(j), w))
                    } else {
                        _mm512_fmadd_ps(load(j), w, acc)
                    };
                }
                _mm512_mask_storeu_ps(out.as_mut_ptr().add(x), mask, acc);
            }
            x += GROUP;
        }
    }
}

/// One channel plane of `F.interpolate(x, (out_h, out_w), mode, antialias=True)`, streamed: the
/// input's rows come from `fill(r, row)` (`row` has `in_w` values; each row is filled at most
/// once, in order), and each output row goes to `emit(y, row)` (`out_w` values), in order.
/// Every size must be non-zero. Only `2·⌈support⌉ + 1` horizontally resampled rows are kept at a
/// time (the vertical taps of consecutive outputs move forward); `Err` when those few rows
/// cannot be allocated, before anything is emitted.
pub fn resize_plane(
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
    filter: TorchFilter,
    mut fill: impl FnMut(usize, &mut [f32]),
    mut emit: impl FnMut(usize, &[f32]),
) -> Result<(), AllocError> {
    resize_planes(
        1,
        (in_h, in_w),
        (out_h, out_w),
        filter,
        |r, _, row| fill(r, row),
        |y, _, row| emit(y, row),
    )
}

/// [`resize_plane`] on `planes` channel planes at once, each resized on its own (the same
/// values as one call per plane): `fill(r, c, row)` gives row `r` of plane `c`, `emit(y, c,
/// row)` takes output row `y` of plane `c`. Row `r` of every plane is asked for before row
/// `r + 1` of any, and output row `y` of every plane is emitted before row `y + 1` of any, so a
/// caller with interleaved channels reads and writes each row once while it is in cache.
pub fn resize_planes(
    planes: usize,
    (in_h, in_w): (usize, usize),
    (out_h, out_w): (usize, usize),
    filter: TorchFilter,
    mut fill: impl FnMut(usize, usize, &mut [f32]),
    mut emit: impl FnMut(usize, usize, &[f32]),
) -> Result<(), AllocError> {
    let fma = has_fma();
    let cols = (in_w != out_w).then(|| aa_taps(in_w, out_w, filter));
    #[cfg(target_arch = "x86_64")]
    let wide = match &cols {
        Some(cols) if wide::available() => wide::Plan::new(cols),
        _ => None,
    };
    // Per plane, a padded input row and a padded output row.
    #[cfg(target_arch = "x86_64")]
    let wide_len = wide
        .as_ref()
        .map_or((0, 0), |p| (p.read_len.max(in_w), p.padded_out));
    #[cfg(target_arch = "x86_64")]
    let mut wide_line = fallible::zeros::<f32>(planes * wide_len.0)?;
    #[cfg(target_arch = "x86_64")]
    let mut wide_out = fallible::zeros::<f32>(planes * wide_len.1)?;
    let mut line = fallible::zeros::<f32>(in_w)?;
    #[cfg(target_arch = "x86_64")]
    let rows_side_by_side = cols.is_some() && wide.is_none();
    #[cfg(not(target_arch = "x86_64"))]
    let rows_side_by_side = cols.is_some();
    // The side-by-side path's rows before and after it, one after the other (`block`: LANES
    // input rows, then reused for LANES output rows), and the same values in lanes.
    let (mut tin, mut tout, mut block) = if rows_side_by_side {
        (
            fallible::zeros::<f32>(in_w * LANES)?,
            fallible::zeros::<f32>(out_w * LANES)?,
            fallible::zeros::<f32>(in_w.max(out_w) * LANES)?,
        )
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    // Input rows `r0..r1` (at most LANES) of every plane, horizontally resampled (or as they
    // are), each handed to `put(r, c, row)`. With AVX-512 the horizontal pass runs 16 output
    // columns of a row at a time ([`wide`]); otherwise LANES rows at a time, one lane per row
    // (the same operations per lane as [`dot`]): independent sums side by side instead of one
    // long dependency chain per output.
    let mut rows_of = |r0: usize, r1: usize, put: &mut dyn FnMut(usize, usize, &[f32])| match &cols
    {
        Some(cols) => {
            #[cfg(target_arch = "x86_64")]
            if let Some(plan) = &wide {
                let (line_len, out_len) = wide_len;
                for r in r0..r1 {
                    for (c, line) in wide_line.chunks_exact_mut(line_len).enumerate() {
                        fill(r, c, &mut line[..in_w]);
                    }
                    let mut lines = wide_line.chunks_exact(line_len);
                    let mut outs = wide_out.chunks_exact_mut(out_len);
                    if planes == 3 {
                        let lines = [(); 3].map(|_| lines.next().unwrap_or_default());
                        let outs = [(); 3].map(|_| outs.next().unwrap_or_default());
                        // SAFETY: a plan exists only when `wide::available()` found AVX-512F.
                        unsafe { plan.rows(lines, outs) };
                    } else {
                        for (line, out) in lines.zip(outs) {
                            // SAFETY: as above.
                            unsafe { plan.rows([line], [out]) };
                        }
                    }
                    for (c, out) in wide_out.chunks_exact(out_len).enumerate() {
                        put(r, c, &out[..out_w]);
                    }
                }
                return;
            }
            for c in 0..planes {
                // Lanes past `r1 − r0` keep what they held: their outputs are not used.
                for (row, r) in block.chunks_exact_mut(in_w).zip(r0..r1) {
                    fill(r, c, row);
                }
                to_lanes(&block, in_w, &mut tin, fma);
                horizontal_lanes(&tin, cols, &mut tout, fma);
                from_lanes(&tout, out_w, &mut block, fma);
                for (row, r) in block.chunks_exact(out_w).zip(r0..r1) {
                    put(r, c, row);
                }
            }
        }
        None => {
            for r in r0..r1 {
                for c in 0..planes {
                    fill(r, c, &mut line);
                    put(r, c, &line);
                }
            }
        }
    };
    if in_h == out_h {
        let mut r = 0;
        while r < in_h {
            let r1 = (r + LANES).min(in_h);
            rows_of(r, r1, &mut |y, c, row| emit(y, c, row));
            r = r1;
        }
        return Ok(());
    }
    let rows = aa_taps(in_h, out_h, filter);
    let cap = rows.ksize + LANES;
    let mut ring = fallible::zeros::<f32>(cap * planes * out_w)?;
    let mut vout = fallible::zeros::<f32>(out_w)?;
    // Input rows below `next` have been resampled into the ring (row `r` of plane `c` in slot
    // `(r % cap)·planes + c`). A window is at most `ksize` rows, windows only move forward, and
    // rows are made at most LANES − 1 ahead of the window's end, so a row is overwritten only
    // once no later output needs it.
    let at = |r: usize, c: usize| ((r % cap) * planes + c) * out_w;
    #[cfg(target_arch = "x86_64")]
    let wide_vertical = wide::available();
    // Where each vertical tap's row starts in the ring.
    #[cfg(target_arch = "x86_64")]
    let mut slots: Vec<usize> = Vec::with_capacity(rows.ksize);
    let mut next = 0usize;
    for y in 0..out_h {
        let (start, weights) = rows.row(y);
        let end = start + weights.len();
        next = next.max(start);
        while next < end {
            let r1 = (next + LANES).min(in_h);
            rows_of(next, r1, &mut |r, c, row| {
                ring[at(r, c)..at(r, c) + out_w].copy_from_slice(row);
            });
            next = r1;
        }
        let ring = &ring[..];
        if out_w == 1 {
            // torch's one-pixel-wide quirk (module docs): the first output row's value
            // everywhere.
            let firsts: Vec<f32> = (0..planes)
                .map(|c| dot(weights, |j| ring[at(start + j, c)]))
                .collect();
            for each in 0..out_h {
                for (c, &v) in firsts.iter().enumerate() {
                    emit(each, c, &[v]);
                }
            }
            return Ok(());
        }
        for c in 0..planes {
            let row = |j: usize| &ring[at(start + j, c)..at(start + j, c) + out_w];
            #[cfg(target_arch = "x86_64")]
            if wide_vertical && !weights.is_empty() {
                slots.clear();
                slots.extend((0..weights.len()).map(|j| at(start + j, c)));
                // SAFETY: `wide_vertical` only when `wide::available()` found AVX-512F.
                unsafe { wide::vertical(weights, ring, &slots, &mut vout) };
                emit(y, c, &vout);
                continue;
            }
            vertical(weights, row, &mut vout, fma);
            emit(y, c, &vout);
        }
    }
    Ok(())
}

/// [`resize_plane`] into `out` (`out_h × out_w`, row-major).
pub fn resize_plane_into(
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
    filter: TorchFilter,
    out: &mut [f32],
    fill: impl FnMut(usize, &mut [f32]),
) -> Result<(), AllocError> {
    debug_assert_eq!(out.len(), out_h * out_w);
    resize_plane(in_h, in_w, out_h, out_w, filter, fill, |y, row| {
        out[y * out_w..(y + 1) * out_w].copy_from_slice(row)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The literal arithmetic: each output of a pass summed in `f64`-free `f32` steps.
    fn literal(
        src: &[f32],
        in_h: usize,
        in_w: usize,
        out_h: usize,
        out_w: usize,
        filter: TorchFilter,
    ) -> Vec<f32> {
        let pass =
            |data: &[f32], h: usize, w: usize, horizontal: bool| -> (Vec<f32>, usize, usize) {
                let (n_in, n_out) = if horizontal { (w, out_w) } else { (h, out_h) };
                if n_in == n_out {
                    return (data.to_vec(), h, w);
                }
                let taps = aa_taps(n_in, n_out, filter);
                let (oh, ow) = if horizontal { (h, out_w) } else { (out_h, w) };
                let mut out = vec![0.0f32; oh * ow];
                for y in 0..oh {
                    for x in 0..ow {
                        let i = if horizontal { x } else { y };
                        let (start, weights) = taps.row(i);
                        let value = |j: usize| {
                            if horizontal {
                                data[y * w + start + j]
                            } else {
                                data[(start + j) * w + x]
                            }
                        };
                        let n = weights.len() - 1;
                        let plain = if n % 8 >= 4 { n / 8 * 8 + 4 } else { n / 8 * 8 };
                        let mut acc = value(0) * weights[0];
                        for (j, &wt) in weights.iter().enumerate().skip(1) {
                            if j <= plain {
                                acc += value(j) * wt;
                            } else {
                                acc = value(j).mul_add(wt, acc);
                            }
                        }
                        out[y * ow + x] = acc;
                    }
                }
                (out, oh, ow)
            };
        let (mid, h, w) = pass(src, in_h, in_w, true);
        pass(&mid, h, w, false).0
    }

    #[test]
    fn weights_sum_to_one_and_stay_in_range() {
        for (n_in, n_out) in [
            (100, 37),
            (37, 100),
            (4032, 1664),
            (7, 1),
            (1, 32),
            (16, 17),
        ] {
            for filter in [TorchFilter::Bicubic, TorchFilter::Bilinear] {
                let taps = aa_taps(n_in, n_out, filter);
                for i in 0..n_out {
                    let (start, weights) = taps.row(i);
                    assert!(start + weights.len() <= n_in, "{n_in}->{n_out} #{i}");
                    assert!(!weights.is_empty());
                    let sum: f32 = weights.iter().sum();
                    assert!((sum - 1.0).abs() < 1e-5, "{n_in}->{n_out} #{i}: {sum}");
                }
            }
        }
    }

    #[test]
    fn weights_as_torch_computes_them() {
        // 10 -> 3: scale 10/3, support 20/3, at most 15 taps; centres 5/3, 5 and 25/3, so
        // the ranges are [0, 8), [0, 10) and [2, 10).
        let taps = aa_taps(10, 3, TorchFilter::Bicubic);
        assert_eq!(taps.ksize, 15);
        assert_eq!(taps.starts, [0, 0, 2]);
        assert_eq!(taps.counts, [8, 10, 8]);
        // Upscaling: four taps (support 2), the middle ones largest.
        let taps = aa_taps(4, 8, TorchFilter::Bicubic);
        assert_eq!(taps.ksize, 5);
        let (start, weights) = taps.row(3);
        assert_eq!((start, weights.len()), (0, 4));
        assert!(weights[1] > weights[0] && weights[2] > weights[3]);
    }

    #[test]
    fn planes_equal_the_literal_arithmetic() {
        let (in_h, in_w) = (41usize, 53usize);
        let src: Vec<f32> = (0..in_h * in_w)
            .map(|i| ((i * 7919 + (i / 13) * 31) % 256) as f32)
            .collect();
        for filter in [TorchFilter::Bicubic, TorchFilter::Bilinear] {
            for (oh, ow) in [
                (20, 17),
                (107, 90),
                (41, 12),
                (7, 53),
                (41, 53),
                (3, 2),
                (200, 5),
                (41, 70),
                (30, 40),
                (41, 31),
                (41, 33),
            ] {
                let mut ours = vec![0.0f32; oh * ow];
                resize_plane_into(in_h, in_w, oh, ow, filter, &mut ours, |r, row| {
                    row.copy_from_slice(&src[r * in_w..(r + 1) * in_w])
                })
                .unwrap();
                let want = literal(&src, in_h, in_w, oh, ow, filter);
                assert_eq!(
                    ours.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{filter:?} {in_h}x{in_w} -> {oh}x{ow}"
                );
            }
        }
    }

    /// The lane transposes put row `l`'s value `x` at `x · LANES + l` and back, with and
    /// without AVX, for widths on both sides of whole 8 × 8 blocks.
    #[test]
    fn lanes_hold_the_rows_side_by_side() {
        for n in [0usize, 1, 7, 8, 9, 16, 23, 64, 71] {
            let rows: Vec<f32> = (0..LANES * n).map(|i| i as f32 * 0.5 - 3.0).collect();
            for avx in [false, has_fma()] {
                let mut lanes = vec![f32::NAN; LANES * n];
                to_lanes(&rows, n, &mut lanes, avx);
                for l in 0..LANES {
                    for x in 0..n {
                        assert_eq!(lanes[x * LANES + l], rows[l * n + x], "n {n} avx {avx}");
                    }
                }
                let mut back = vec![f32::NAN; LANES * n];
                from_lanes(&lanes, n, &mut back, avx);
                assert_eq!(back, rows, "n {n} avx {avx}");
            }
        }
    }

    #[test]
    fn planes_together_equal_planes_apart() {
        let (in_h, in_w) = (37usize, 45usize);
        let plane = |c: usize, i: usize| ((i * 31 + c * 97 + (i / 7) * 13) % 256) as f32;
        for (oh, ow) in [(50, 60), (37, 20), (20, 45), (37, 45), (9, 1)] {
            let mut together = vec![vec![0.0f32; oh * ow]; 3];
            resize_planes(
                3,
                (in_h, in_w),
                (oh, ow),
                TorchFilter::Bicubic,
                |r, c, row| {
                    for (x, v) in row.iter_mut().enumerate() {
                        *v = plane(c, r * in_w + x);
                    }
                },
                |y, c, row| together[c][y * ow..(y + 1) * ow].copy_from_slice(row),
            )
            .unwrap();
            for (c, got) in together.iter().enumerate() {
                let mut apart = vec![0.0f32; oh * ow];
                resize_plane_into(
                    in_h,
                    in_w,
                    oh,
                    ow,
                    TorchFilter::Bicubic,
                    &mut apart,
                    |r, row| {
                        for (x, v) in row.iter_mut().enumerate() {
                            *v = plane(c, r * in_w + x);
                        }
                    },
                )
                .unwrap();
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&apart), "plane {c}: {oh}x{ow}");
            }
        }
    }

    /// The AVX2 horizontal pass (straight-line code per tap count, four outputs at a time)
    /// equals the plain one lane by lane, for every tap count it groups (2 to over 12).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lanes_fma_equal_the_plain_lanes() {
        if !has_fma() {
            eprintln!("no AVX2 and FMA on this CPU: nothing to compare");
            return;
        }
        let in_w = 61;
        let tin: Vec<f32> = (0..in_w * LANES)
            .map(|i| ((i * 7919 + (i / 13) * 31) % 511) as f32 * 0.75 - 100.0)
            .collect();
        // The tap counts that ran as groups of four outputs (the kernel's grouping rule).
        let mut grouped = std::collections::BTreeSet::new();
        for filter in [TorchFilter::Bicubic, TorchFilter::Bilinear] {
            for out_w in 2..=140 {
                let taps = aa_taps(in_w, out_w, filter);
                let mut x = 0;
                while x + 4 <= out_w {
                    let len = taps.counts[x];
                    if len > 0 && taps.counts[x..x + 4].iter().all(|&c| c == len) {
                        grouped.insert(len);
                        x += 4;
                    } else {
                        x += 1;
                    }
                }
                let mut plain = vec![0.0f32; out_w * LANES];
                let mut fast = vec![0.0f32; out_w * LANES];
                horizontal_lanes(&tin, &taps, &mut plain, false);
                horizontal_lanes(&tin, &taps, &mut fast, true);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&plain), "{filter:?} {in_w} -> {out_w}");
            }
        }
        // Every straight-line arm (2–12) and the general one (above 12) ran.
        assert!(
            (2..=12).all(|n| grouped.contains(&n)) && grouped.iter().any(|&n| n > 12),
            "grouped tap counts {grouped:?}"
        );
    }

    /// The vertical pass in registers equals the one-tap-at-a-time body, for tap counts on
    /// both sides of [`REGISTER_TAPS`] and rows with and without a tail of under 16 values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vertical_equals_the_plain_body() {
        if !has_fma() {
            eprintln!("no AVX2 and FMA on this CPU: nothing to compare");
            return;
        }
        let rows: Vec<Vec<f32>> = (0..40)
            .map(|r| {
                (0..53)
                    .map(|x| ((r * 53 + x) * 7919 % 613) as f32 * 0.37 - 90.0)
                    .collect()
            })
            .collect();
        for len in 0..40 {
            let weights: Vec<f32> = (0..len)
                .map(|j| ((j as f32 + 0.5) * 0.61).sin() / 3.0)
                .collect();
            for n in [0usize, 1, 15, 16, 17, 32, 47, 53] {
                let row = |j: usize| &rows[j][..n];
                let mut plain = vec![0.0f32; n];
                let mut fast = vec![0.0f32; n];
                vertical_body(&weights, row, &mut plain);
                vertical(&weights, row, &mut fast, true);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&plain), "{len} taps, {n} values");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_plans_cover_mild_resizes() {
        // The AVX-512 horizontal pass serves upscaling and reductions up to about 1.7x; the
        // rows-side-by-side pass the rest (both checked by the test above on such a CPU).
        for (n_in, n_out, fits) in [
            (53, 70, true),
            (53, 40, true),
            (2000, 2016, true),
            (741, 768, true),
            (53, 17, false),
        ] {
            let plan = wide::Plan::new(&aa_taps(n_in, n_out, TorchFilter::Bicubic));
            assert_eq!(plan.is_some(), fits, "{n_in} -> {n_out}");
        }
    }

    #[test]
    fn one_pixel_wide_columns_take_the_first_row() {
        let src: Vec<f32> = (0..30).map(|v| v as f32 * 3.0).collect();
        let mut out = vec![0.0f32; 12];
        resize_plane_into(30, 1, 12, 1, TorchFilter::Bicubic, &mut out, |r, row| {
            row[0] = src[r]
        })
        .unwrap();
        assert!(out.iter().all(|&v| v == out[0]));
        assert!(out[0] < 10.0);
    }

    #[test]
    fn rounded_taps_split() {
        assert_eq!(rounded_taps(0), 0);
        assert_eq!(rounded_taps(3), 0);
        assert_eq!(rounded_taps(4), 4);
        assert_eq!(rounded_taps(7), 4);
        assert_eq!(rounded_taps(8), 8);
        assert_eq!(rounded_taps(11), 8);
        assert_eq!(rounded_taps(12), 12);
        assert_eq!(rounded_taps(16), 16);
        assert_eq!(rounded_taps(21), 20);
    }
}
