//! torch's CPU resampling and `bfloat16` rounding, bit for bit (ATen's `UpSampleKernel.cpp` and
//! `UpSampleKernelAVXAntialias.h` of torch 2.14.1, as torchvision 0.29's `resize` and
//! `F.interpolate` call them). transformers' torchvision-only processors (Llama 4,
//! Phi-4-multimodal) and Phi-3-vision's hub code are built on these.
//!
//! - [`resize_u8`]: `tvF.resize(uint8, size, BILINEAR | BICUBIC | LANCZOS, antialias=True)` on CPU. The
//!   weights are Pillow's `precompute_coeffs` arithmetic in `f64` (the same loop,
//!   [`float_coeffs_with`]) with torch's kernels — its bicubic is Keys' with `a = −0.5` written
//!   as `cubic_convolution1/2`, whose outer lobe rounds differently from Pillow's — then
//!   `int16` fixed point with a precision chosen per axis from the largest weight (the largest
//!   `p ≤ 22` with `round(max·2^(p+1)) < 2¹⁵`, so at most 15 bits), rounded half away from
//!   zero. Each pass is `clamp((2^(p−1) + Σ wᵢ·xᵢ) >> p, 0, 255)`, horizontal first; an axis
//!   that keeps its size is not resampled.
//!
//!   With AVX-512 (VBMI, VNNI) or AVX2 the passes run on kernels of their own on these `int16`
//!   weights ([`avx512`]: one `vpermb` and one `vpdpwssd` per tap pair for 16 samples;
//!   [`avx2`]: one `vpshufb` and one `vpmaddwd` for 8), streamed in bands ([`stream`]). Otherwise,
//!   and for reductions past the horizontal kernels' windows, they run on the Pillow resampler's
//!   kernels ([`run_passes`], SIMD and threads included): a weight `w` at precision `p` is the 22-bit weight `w·2^(22−p)`, and
//!   `(2²¹ + Σ (wᵢ·2^(22−p))·xᵢ) >> 22 = (2^(p−1) + Σ wᵢ·xᵢ) >> p` exactly (an arithmetic
//!   shift is a floor division, and `⌊a·2^s / 2²²⌋ = ⌊a / 2^p⌋`), with sums of the same size as
//!   Pillow's own (the weights of a pixel add up to about 2²² either way).
//! - [`bicubic_f32`]: `F.interpolate(x, size, mode="bicubic", align_corners=False)` without
//!   antialiasing on `float32` planes: Keys' cubic with `A = −0.75`, source index
//!   `scale·(i + 0.5) − 0.5` with `scale = f32(in) / f32(out)`, taps clamped to the edge, each
//!   output `Σᵢ (Σⱼ x[yᵢ][xⱼ]·wxⱼ)·wyᵢ` in `f32`. torch's SIMD builds (AVX2, AVX-512) are
//!   compiled with FMA and the compiler contracts the arithmetic: the source index is one fused
//!   multiply-add, the cubic polynomials fuse all but their last step, and each 4-tap sum is
//!   `fma(v₃, w₃, fma(v₂, w₂, fma(v₀, w₀, v₁·w₁)))` ([`dot4`]). Found by probing torch 2.14.1
//!   (single and paired impulses, then 346 k random outputs with no difference). Computing each
//!   input row's inner sums once and combining rows afterwards gives the same values.
//! - [`bf16_bits`]: `float32 → bfloat16`, round to nearest even (`c10::BFloat16`).

use crate::memory::{fallible, AllocError};

use super::coeffs::{float_coeffs_with, AxisCoeffs, PRECISION_BITS};
use super::resample::{check_destination, run_passes, ImageRef, Passes, ResampleError};
use crate::processors::normalize::Slot;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod stream;
#[cfg(target_arch = "x86_64")]
mod vertical;

/// The interpolation modes of torch's antialiased `uint8` resize that the processors use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TorchFilter {
    /// `InterpolationMode.BILINEAR` (triangle kernel, support 1).
    Bilinear,
    /// `InterpolationMode.BICUBIC` (Keys, `a = −0.5`, support 2).
    Bicubic,
    /// `InterpolationMode.LANCZOS` (Lanczos-3: `sinc(x)·sinc(x / 3)`, support 3), torch 2.14's
    /// antialiased `uint8` kernel (the same weights machinery).
    Lanczos,
}

impl TorchFilter {
    /// `bilinear` or `bicubic`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "bilinear" => Some(TorchFilter::Bilinear),
            "bicubic" => Some(TorchFilter::Bicubic),
            "lanczos" => Some(TorchFilter::Lanczos),
            _ => None,
        }
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            TorchFilter::Bilinear => "bilinear",
            TorchFilter::Bicubic => "bicubic",
            TorchFilter::Lanczos => "lanczos",
        }
    }

    /// `interp_size / 2`: the kernel's half-width at scale 1.
    fn support(self) -> f64 {
        match self {
            TorchFilter::Bilinear => 1.0,
            TorchFilter::Bicubic => 2.0,
            TorchFilter::Lanczos => 3.0,
        }
    }

    /// `HelperInterpLinear::aa_filter` / `HelperInterpCubic::aa_filter`.
    fn aa_kernel(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            TorchFilter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            TorchFilter::Bicubic => {
                if x < 1.0 {
                    cubic1_f64(x, -0.5)
                } else if x < 2.0 {
                    cubic2_f64(x, -0.5)
                } else {
                    0.0
                }
            }
            TorchFilter::Lanczos => {
                if x < 3.0 {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

/// `sin(πx) / (πx)`, 1 at 0.
fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        let x = x * std::f64::consts::PI;
        x.sin() / x
    }
}

/// `cubic_convolution1` (`|x| ≤ 1`) in `f64`.
fn cubic1_f64(x: f64, a: f64) -> f64 {
    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
}

/// `cubic_convolution2` (`1 < |x| < 2`) in `f64`.
fn cubic2_f64(x: f64, a: f64) -> f64 {
    ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
}

/// `cubic_convolution1` (`|x| ≤ 1`) in `f32` as torch's compiled kernel evaluates it: the
/// first multiply-add fused, the last not (measured against torch 2.14.1 on AVX-512).
fn cubic1_f32(x: f32) -> f32 {
    // (A + 2)·x − (A + 3) with A = −0.75: both constants exact in f32.
    let s = 1.25f32.mul_add(x, -2.25);
    (s * x) * x + 1.0
}

/// `cubic_convolution2` (`1 ≤ |x| ≤ 2`) in `f32`, as torch's compiled kernel evaluates it:
/// `((A·x − 5A)·x + 8A)·x − 4A` with the first two multiply-adds fused, the last not.
fn cubic2_f32(x: f32) -> f32 {
    let t = (-0.75f32).mul_add(x, 3.75).mul_add(x, -6.0);
    t * x + 3.0
}

/// The `int16` weights of one axis (`_compute_index_ranges_int16_weights`) and their
/// precision, as torch computes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Int16Coeffs {
    /// Taps per output pixel (the row stride of `weights`).
    pub ksize: usize,
    pub starts: Vec<usize>,
    pub counts: Vec<usize>,
    pub weights: Vec<i16>,
    /// Fixed-point bits of the weights.
    pub precision: u32,
}

/// torch's antialiased weights for an axis of `in_size` pixels resized to `out_size`.
pub fn int16_coeffs(in_size: usize, out_size: usize, filter: TorchFilter) -> Int16Coeffs {
    let f = float_coeffs_with(
        in_size,
        0.0,
        in_size as f32,
        out_size,
        filter.support(),
        |x| filter.aa_kernel(x),
    );
    // wt_max: the largest normalised weight (rows whose sum is 0 are not normalised and do not
    // count, as in `_compute_indices_min_size_weights_aa`).
    let mut wt_max = 0.0f64;
    for (row, &count) in f.weights.chunks_exact(f.ksize).zip(&f.counts) {
        let taps = &row[..count];
        if taps.iter().sum::<f64>() != 0.0 {
            wt_max = taps.iter().fold(wt_max, |m, &w| m.max(w));
        }
    }
    let mut precision = 0u32;
    while precision < 22 {
        let next = (0.5 + wt_max * f64::from(1u32 << (precision + 1))) as i32;
        if next >= 1 << 15 {
            break;
        }
        precision += 1;
    }
    let unit = f64::from(1u32 << precision);
    let weights = f
        .weights
        .iter()
        .map(|&w| {
            let v = w * unit;
            let rounded = if v < 0.0 {
                (-0.5 + v) as i32
            } else {
                (0.5 + v) as i32
            };
            rounded as i16
        })
        .collect();
    Int16Coeffs {
        ksize: f.ksize,
        starts: f.starts,
        counts: f.counts,
        weights,
        precision,
    }
}

impl Int16Coeffs {
    /// The same weights as the resampler's 22-bit coefficients: `w·2^(22 − precision)`.
    pub fn to_axis_coeffs(&self) -> AxisCoeffs {
        let shift = PRECISION_BITS - self.precision;
        AxisCoeffs {
            ksize: self.ksize,
            starts: self.starts.clone(),
            counts: self.counts.clone(),
            weights: self
                .weights
                .iter()
                .map(|&w| i32::from(w) << shift)
                .collect(),
        }
    }
}

/// `tvF.resize(image, [out_h, out_w], filter, antialias=True)` of an interleaved `u8` image
/// (1 – 4 channels; each channel on its own, as torch resamples planes) into `dst`.
pub fn resize_u8(
    src: &ImageRef<'_>,
    dst: &mut [u8],
    out_w: usize,
    out_h: usize,
    filter: TorchFilter,
    threads: usize,
) -> Result<(), ResampleError> {
    check_destination(src, dst, out_w, out_h)?;
    let plan = plan(src, out_w, out_h, filter);
    #[cfg(target_arch = "x86_64")]
    if resize_simd(src, dst, &plan, threads, Simd::Avx512).is_some() {
        return Ok(());
    }
    let passes = Passes {
        horizontal: plan.horizontal.as_ref().map(Int16Coeffs::to_axis_coeffs),
        vertical: plan.vertical.as_ref().map(Int16Coeffs::to_axis_coeffs),
        out_w,
        out_h,
        horizontal_first: true,
    };
    run_passes(src, dst, passes, threads, true);
    Ok(())
}

/// What a resize of one shape needs before it reads a pixel: each resampled axis's weights
/// and the horizontal kernels' plans that the CPU can run (`None` where they do not apply).
struct Plan {
    horizontal: Option<Int16Coeffs>,
    vertical: Option<Int16Coeffs>,
    #[cfg(target_arch = "x86_64")]
    fast: Option<avx2::Horizontal>,
    #[cfg(target_arch = "x86_64")]
    wide: Option<avx512::Horizontal>,
}

/// The SIMD kernels of a resize.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    Avx2,
    Avx512,
}

/// A resize's shape: input width, height and channels, output width and height, filter.
type PlanKey = (usize, usize, usize, usize, usize, TorchFilter);

/// Plans kept for the next calls (most recent first): a batch or a stream of photos of a few
/// sizes reuses them instead of recomputing the weights (`f64` kernel evaluations per tap) and
/// the horizontal plan on every call.
const KEPT_PLANS: usize = 8;

static PLANS: std::sync::Mutex<Vec<(PlanKey, std::sync::Arc<Plan>)>> =
    std::sync::Mutex::new(Vec::new());

/// The plan of resizing `src` to `out_w × out_h` with `filter`: a kept one, or a new one (then
/// kept).
fn plan(
    src: &ImageRef<'_>,
    out_w: usize,
    out_h: usize,
    filter: TorchFilter,
) -> std::sync::Arc<Plan> {
    let (w, h) = (src.width, src.height);
    let key = (w, h, src.channels, out_w, out_h, filter);
    // A poisoned lock only means another thread panicked while holding it; the list is valid.
    let mut kept = PLANS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = kept.iter().position(|(k, _)| *k == key) {
        let entry = kept.remove(i);
        let plan = entry.1.clone();
        kept.insert(0, entry);
        return plan;
    }
    drop(kept);
    let horizontal = (out_w != w).then(|| int16_coeffs(w, out_w, filter));
    let vertical = (out_h != h).then(|| int16_coeffs(h, out_h, filter));
    let plan = std::sync::Arc::new(Plan {
        #[cfg(target_arch = "x86_64")]
        fast: horizontal
            .as_ref()
            .filter(|_| avx2::available())
            .and_then(|k| avx2::Horizontal::new(k, src.channels)),
        #[cfg(target_arch = "x86_64")]
        wide: horizontal
            .as_ref()
            .filter(|_| avx512::available())
            .and_then(|k| avx512::Horizontal::new(k, src.channels)),
        horizontal,
        vertical,
    });
    let mut kept = PLANS.lock().unwrap_or_else(|e| e.into_inner());
    kept.insert(0, (key, plan.clone()));
    kept.truncate(KEPT_PLANS);
    plan
}

/// A band of output rows not yet taken: its first row and its bytes.
#[cfg(target_arch = "x86_64")]
type Band<'a> = std::sync::Mutex<Option<(usize, &'a mut [u8])>>;

/// [`resize_u8`] with the kernels of [`avx512`] (`widest` AVX-512, the CPU has it and the
/// plan's reduction fits their window) or else [`avx2`], in bands of output rows over up to
/// `threads` threads: the kernels used, or `None` (nothing written) when neither applies: no
/// AVX2, nothing to resample, a reduction too large for the horizontal kernels' windows, or a
/// zero precision.
#[cfg(target_arch = "x86_64")]
fn resize_simd(
    src: &ImageRef<'_>,
    dst: &mut [u8],
    plan: &Plan,
    threads: usize,
    widest: Simd,
) -> Option<Simd> {
    let (horizontal, vertical) = (plan.horizontal.as_ref(), plan.vertical.as_ref());
    if !avx2::available() || (horizontal.is_none() && vertical.is_none()) {
        return None;
    }
    if vertical.is_some_and(|k| k.precision == 0) {
        return None;
    }
    let wide = widest == Simd::Avx512
        && avx512::available()
        && (horizontal.is_none() || plan.wide.is_some());
    if !wide && horizontal.is_some() && plan.fast.is_none() {
        return None;
    }
    let out_h = vertical.map_or(src.height, |k| k.starts.len());
    let row_len = dst.len() / out_h.max(1);
    let threads = threads.clamp(1, out_h.div_ceil(32).max(1));
    let per_band = out_h.div_ceil(threads);
    // Each band is taken once: by a spawned thread, or by the calling thread (the first band,
    // and any whose thread could not be spawned).
    let bands: Vec<Band<'_>> = dst
        .chunks_mut(per_band * row_len)
        .enumerate()
        .map(|(i, band)| std::sync::Mutex::new(Some((i * per_band, band))))
        .collect();
    let run = |i: usize| {
        let band = bands[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((first, band)) = band {
            let rows = first..first + band.len() / row_len;
            if wide {
                // SAFETY: `avx512::available()` holds (checked above).
                unsafe { stream::band(src, plan.wide.as_ref(), vertical, rows, band) };
            } else {
                // SAFETY: `avx2::available()` holds (checked above).
                unsafe { stream::band(src, plan.fast.as_ref(), vertical, rows, band) };
            }
        }
    };
    crate::image::resample::run_bands(bands.len(), run);
    Some(if wide { Simd::Avx512 } else { Simd::Avx2 })
}

/// torch's cubic taps of one axis (`HelperInterpCubic::compute_indices_weights`, `f32`):
/// per output pixel, four input indices clamped to the axis and their weights. The source
/// index `scale·(i + 0.5) − 0.5` is one fused multiply-add, as torch's compiled kernel has it.
pub fn cubic_taps(in_size: usize, out_size: usize) -> Vec<([usize; 4], [f32; 4])> {
    let scale = in_size as f32 / out_size as f32;
    let last = in_size as i64 - 1;
    (0..out_size)
        .map(|i| {
            let real = scale.mul_add(i as f32 + 0.5, -0.5);
            let index = (real.floor() as i64).min(last);
            let t = (real - index as f32).clamp(0.0, 1.0);
            let u = 1.0 - t;
            let weights = [
                cubic2_f32(t + 1.0),
                cubic1_f32(t),
                cubic1_f32(u),
                cubic2_f32(u + 1.0),
            ];
            let indices = [-1i64, 0, 1, 2].map(|d| (index + d).clamp(0, last) as usize);
            (indices, weights)
        })
        .collect()
}

/// `Σ vᵢ·wᵢ` over four taps in the order torch's compiled kernel sums them: the second
/// product rounded, then the first, third and fourth each fused onto the sum.
#[inline(always)]
fn dot4(v: [f32; 4], w: [f32; 4]) -> f32 {
    v[3].mul_add(w[3], v[2].mul_add(w[2], v[0].mul_add(w[0], v[1] * w[1])))
}

/// `F.interpolate(x[None], (out_h, out_w), mode="bicubic", align_corners=False)[0]` of
/// `channels` planes of `in_h × in_w` `f32` values (`src`, channels-first) into `dst`
/// (`channels × out_h × out_w`). Every size must be non-zero and the slices exactly that long.
pub fn bicubic_f32(
    src: &[f32],
    channels: usize,
    in_h: usize,
    in_w: usize,
    dst: &mut [f32],
    out_h: usize,
    out_w: usize,
) -> Result<(), ResampleError> {
    if out_h == 0 || out_w == 0 {
        return Err(ResampleError::OutputSize {
            width: out_w as i64,
            height: out_h as i64,
        });
    }
    if in_h == 0 || in_w == 0 || channels == 0 {
        return Err(ResampleError::EmptyInput {
            width: in_w,
            height: in_h,
        });
    }
    let planes = |h: usize, w: usize| channels.checked_mul(h).and_then(|n| n.checked_mul(w));
    if planes(in_h, in_w) != Some(src.len()) {
        return Err(ResampleError::DataLength {
            expected: planes(in_h, in_w).unwrap_or(usize::MAX),
            actual: src.len(),
        });
    }
    if planes(out_h, out_w) != Some(dst.len()) {
        return Err(ResampleError::DestinationLength {
            expected: planes(out_h, out_w).unwrap_or(usize::MAX),
            actual: dst.len(),
        });
    }
    let plane_out = out_h * out_w;
    for (c, out) in dst.chunks_exact_mut(plane_out).enumerate() {
        let plane = &src[c * in_h * in_w..(c + 1) * in_h * in_w];
        bicubic_plane(in_h, in_w, out_h, out_w, out, |r, row| {
            row.copy_from_slice(&plane[r * in_w..(r + 1) * in_w]);
        })
        .map_err(ResampleError::oom("interpolation rows"))?;
    }
    Ok(())
}

/// One plane of [`bicubic_f32`] whose input rows come from `fill(r, row)` (`row` has `in_w`
/// values), so a caller can compute them on the fly (e.g. normalised from `u8`) instead of
/// materialising the input plane; `out` is the `out_h × out_w` output plane. Each needed input
/// row is filled once. The sizes are the caller's to check (non-zero, `out` that long). The
/// horizontal sums of the needed input rows (up to `in_h × out_w` values) are kept meanwhile:
/// `Err` if they cannot be allocated, before anything is written.
pub fn bicubic_plane<S: Slot>(
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
    out: &mut [S],
    mut fill: impl FnMut(usize, &mut [f32]),
) -> Result<(), AllocError> {
    debug_assert_eq!(out.len(), out_h * out_w);
    let rows = cubic_taps(in_h, out_h);
    let cols = Columns::new(&cubic_taps(in_w, out_w));
    // The horizontal sums of each input row the output needs, in the order first needed.
    let mut slot = fallible::filled(usize::MAX, in_h)?;
    let mut needed = 0;
    for (indices, _) in &rows {
        for &r in indices {
            if slot[r] == usize::MAX {
                slot[r] = needed;
                needed += 1;
            }
        }
    }
    let mut line = fallible::zeros::<f32>(in_w)?;
    let mut mid = fallible::zeros::<f32>(needed.saturating_mul(out_w))?;
    for (r, &s) in slot.iter().enumerate() {
        if s == usize::MAX {
            continue;
        }
        fill(r, &mut line);
        horizontal(&line, &cols, &mut mid[s * out_w..(s + 1) * out_w]);
    }
    for (out_row, (iy, wy)) in out.chunks_exact_mut(out_w).zip(&rows) {
        let m = iy.map(|r| &mid[slot[r] * out_w..(slot[r] + 1) * out_w]);
        vertical(m, *wy, out_row);
    }
    Ok(())
}

/// The column taps of one axis, tap by tap (structure of arrays, for 8-wide gathers).
struct Columns {
    index: [Vec<i32>; 4],
    weight: [Vec<f32>; 4],
}

impl Columns {
    fn new(taps: &[([usize; 4], [f32; 4])]) -> Self {
        let index = std::array::from_fn(|j| taps.iter().map(|(i, _)| i[j] as i32).collect());
        let weight = std::array::from_fn(|j| taps.iter().map(|(_, w)| w[j]).collect());
        Columns { index, weight }
    }

    fn len(&self) -> usize {
        self.weight[0].len()
    }
}

fn horizontal(line: &[f32], cols: &Columns, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above); `horizontal_avx2` needs every
        // index of `cols` to be below `line.len()`, which holds as `cubic_taps` clamps them to
        // the axis, `line` being one input row (`in_w` values), and `out` as long as `cols`.
        unsafe { horizontal_avx2(line, cols, out) };
        return;
    }
    horizontal_scalar(line, cols, out, 0);
}

fn vertical<S: Slot>(m: [&[f32]; 4], wy: [f32; 4], out: &mut [S]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above), the only target feature the function
        // enables; it is otherwise safe code.
        unsafe { vertical_fma(m, wy, out) };
        return;
    }
    vertical_body(m, wy, out);
}

/// Outputs `from..` of one row's horizontal pass, one at a time.
#[inline(always)]
fn horizontal_scalar(line: &[f32], cols: &Columns, out: &mut [f32], from: usize) {
    for (x, o) in out.iter_mut().enumerate().skip(from) {
        let v = std::array::from_fn(|j| line[cols.index[j][x] as usize]);
        let w = std::array::from_fn(|j| cols.weight[j][x]);
        *o = dot4(v, w);
    }
}

#[inline(always)]
fn vertical_body<S: Slot>(m: [&[f32]; 4], wy: [f32; 4], out: &mut [S]) {
    for (x, o) in out.iter_mut().enumerate() {
        o.set(dot4([m[0][x], m[1][x], m[2][x], m[3][x]], wy));
    }
}

/// [`horizontal_scalar`] eight outputs at a time: each tap of eight outputs gathered, then the
/// same [`dot4`] order per lane (`vfmadd` is the same correctly rounded operation as
/// `mul_add`).
///
/// # Safety
///
/// The CPU must have AVX2 and FMA, every index of `cols` must be below `line.len()` and `out`
/// must be `cols.len()` long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn horizontal_avx2(line: &[f32], cols: &Columns, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = cols.len();
    debug_assert_eq!(out.len(), n);
    let chunks = n / 8;
    for k in 0..chunks {
        let at = k * 8;
        // SAFETY: `at + 8 ≤ n`, the length of every index/weight vector and of `out`; every
        // gathered index is below `line.len()` (the caller's guarantee), scale 4 = size of f32.
        unsafe {
            let tap = |j: usize| {
                let idx = _mm256_loadu_si256(cols.index[j].as_ptr().add(at).cast());
                let v = _mm256_i32gather_ps::<4>(line.as_ptr(), idx);
                let w = _mm256_loadu_ps(cols.weight[j].as_ptr().add(at));
                (v, w)
            };
            let (v0, w0) = tap(0);
            let (v1, w1) = tap(1);
            let (v2, w2) = tap(2);
            let (v3, w3) = tap(3);
            let acc = _mm256_mul_ps(v1, w1);
            let acc = _mm256_fmadd_ps(v0, w0, acc);
            let acc = _mm256_fmadd_ps(v2, w2, acc);
            let acc = _mm256_fmadd_ps(v3, w3, acc);
            _mm256_storeu_ps(out.as_mut_ptr().add(at), acc);
        }
    }
    horizontal_scalar(line, cols, out, chunks * 8);
}

// `mul_add` is a hardware instruction here instead of a call into libm's `fmaf` (the same
// correctly rounded result, many times faster).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn vertical_fma<S: Slot>(m: [&[f32]; 4], wy: [f32; 4], out: &mut [S]) {
    vertical_body(m, wy, out)
}

/// `c10::BFloat16(x)`: the bits of `x` rounded to `bfloat16`, to nearest even (NaN → `0x7FC0`).
pub fn bf16_bits(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let bias = ((bits >> 16) & 1) + 0x7FFF;
    (bits.wrapping_add(bias) >> 16) as u16
}

/// The `f32` a `bfloat16` stands for (exact).
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resampler's kernels on the same weights (`to_axis_coeffs`), without [`avx2`].
    fn reference(src: &ImageRef<'_>, ow: usize, oh: usize, filter: TorchFilter) -> Vec<u8> {
        let (w, h) = (src.width, src.height);
        let passes = Passes {
            horizontal: (ow != w).then(|| int16_coeffs(w, ow, filter).to_axis_coeffs()),
            vertical: (oh != h).then(|| int16_coeffs(h, oh, filter).to_axis_coeffs()),
            out_w: ow,
            out_h: oh,
            horizontal_first: true,
        };
        let mut out = vec![0u8; ow * oh * src.channels];
        run_passes(src, &mut out, passes, 1, false);
        out
    }

    /// [`resize_u8`] (the AVX2 kernels where the CPU has them) equals the scalar passes on
    /// random images: every channel count, up- and downscaling, odd sizes, short rows, one axis
    /// kept, reductions past the horizontal window, several threads.
    #[test]
    fn fast_kernels_equal_the_scalar_passes() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        let mut cases = vec![
            (600, 512, 3, 504, 588),
            (1000, 872, 3, 644, 560),
            (2000, 1072, 3, 924, 476),
            (741, 500, 3, 812, 532),
            (64, 64, 3, 64, 30),
            (64, 64, 3, 30, 64),
            (33, 7, 1, 70, 3),
            (1, 1, 3, 9, 5),
            (900, 40, 4, 60, 41),
            (4032, 60, 3, 336, 20),
            // AVX-512 groups narrower than 16 samples (reductions past ~3.5x)
            (2000, 50, 3, 224, 20),
            (1000, 30, 1, 100, 10),
            (1300, 20, 4, 200, 20),
            (3000, 9, 3, 160, 9),
        ];
        for _ in 0..60 {
            let (w, h) = (1 + next(300), 1 + next(300));
            cases.push((w, h, [1, 3, 4][next(3)], 1 + next(400), 1 + next(400)));
        }
        // Runs of each kernel set, and plans the AVX-512 kernels took.
        let (mut ran, mut wide) = ([0usize; 2], 0usize);
        // AVX2 horizontal plans run and compared with groups of each kind of load but the
        // shared one (side by side in one 32-byte load, interleaved, two loads).
        #[cfg(target_arch = "x86_64")]
        let mut loads = [0usize; 3];
        // AVX-512 plans that chose quads; forced runs of pairs and of quads.
        #[cfg(target_arch = "x86_64")]
        let (mut chose_quads, mut tapped) = (0usize, [0usize; 2]);
        for (w, h, c, ow, oh) in cases {
            let data: Vec<u8> = (0..w * h * c).map(|_| next(256) as u8).collect();
            let src = ImageRef {
                data: &data,
                width: w,
                height: h,
                channels: c,
            };
            for filter in [
                TorchFilter::Bilinear,
                TorchFilter::Bicubic,
                TorchFilter::Lanczos,
            ] {
                let want = reference(&src, ow, oh, filter);
                for threads in [1, 3] {
                    let mut ours = vec![0u8; ow * oh * c];
                    resize_u8(&src, &mut ours, ow, oh, filter, threads).unwrap();
                    assert!(
                        ours == want,
                        "{filter:?} {w}x{h}x{c} -> {ow}x{oh}, {threads} threads"
                    );
                }
                // Each SIMD kernel set on its own (the best one ran above).
                #[cfg(target_arch = "x86_64")]
                {
                    let plan = plan(&src, ow, oh, filter);
                    for simd in [Simd::Avx2, Simd::Avx512] {
                        let mut ours = vec![0u8; ow * oh * c];
                        if let Some(used) = resize_simd(&src, &mut ours, &plan, 1, simd) {
                            ran[used as usize] += 1;
                            assert!(ours == want, "{simd:?} {filter:?} {w}x{h}x{c} -> {ow}x{oh}");
                            // The AVX2 horizontal plan just compared, by the kinds it holds.
                            if let (Simd::Avx2, Some(fast)) = (used, &plan.fast) {
                                for (n, k) in loads.iter_mut().zip(fast.load_kinds()) {
                                    *n += usize::from(k > 0);
                                }
                            }
                        }
                    }
                    wide += usize::from(plan.wide.is_some());
                    chose_quads += usize::from(
                        plan.wide.as_ref().map(|h| h.taps()) == Some(avx512::Taps::Quads),
                    );
                    // The AVX-512 pass with each tap width on its own (`new` takes the one
                    // with fewer loads).
                    for (i, taps) in [avx512::Taps::Pairs, avx512::Taps::Quads]
                        .into_iter()
                        .enumerate()
                    {
                        let forced = Plan {
                            horizontal: plan.horizontal.clone(),
                            vertical: plan.vertical.clone(),
                            fast: None,
                            wide: plan
                                .horizontal
                                .as_ref()
                                .filter(|_| avx512::available())
                                .and_then(|k| avx512::Horizontal::with_taps(k, c, taps)),
                        };
                        if forced.wide.is_none() {
                            continue;
                        }
                        let mut ours = vec![0u8; ow * oh * c];
                        resize_simd(&src, &mut ours, &forced, 1, Simd::Avx512);
                        assert!(ours == want, "{taps:?} {filter:?} {w}x{h}x{c} -> {ow}x{oh}");
                        tapped[i] += 1;
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            // Both kernel sets ran on most cases where the CPU has them (not on reductions
            // past their windows, nor where only one axis keeps its size and so on).
            eprintln!(
                "AVX2 runs {}, AVX-512 runs {}, AVX-512 plans {wide}",
                ran[0], ran[1]
            );
            if avx2::available() {
                assert!(ran[0] > 150, "AVX2 ran {} times", ran[0]);
                eprintln!("AVX2 plans with wide / interleaved / split groups {loads:?}");
                assert!(loads.iter().all(|&n| n >= 10), "load kinds {loads:?}");
            }
            eprintln!("AVX-512 quads chosen {chose_quads}, forced pairs / quads {tapped:?}");
            if avx512::available() {
                assert!(ran[1] > 150 && wide > 100, "AVX-512 ran {} times", ran[1]);
                assert!(tapped[0] > 100 && tapped[1] > 100 && chose_quads > 50);
            }
        }
    }

    /// Timing of [`resize_u8`] against the resampler's path on the benchmark's photo sizes:
    /// `cargo test --release -- --ignored --nocapture resize_timing`.
    #[test]
    #[ignore]
    fn resize_timing() {
        // The four photos of the torch-families benchmark at MiniMax-M3-VL's sizes.
        for (w, h, ow, oh) in [
            (512, 600, 504, 588),
            (1000, 872, 700, 616),
            (2000, 1072, 896, 476),
            (741, 500, 728, 504),
        ] {
            let data: Vec<u8> = (0..w * h * 3).map(|i| (i * 7919 % 251) as u8).collect();
            let src = ImageRef {
                data: &data,
                width: w,
                height: h,
                channels: 3,
            };
            let mut out = vec![0u8; ow * oh * 3];
            // The thread's CPU time (the machine may be shared), best of 7 runs of 20 calls.
            let cpu = || {
                let mut t = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `t` is a valid timespec to write.
                unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
                t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
            };
            let time = |f: &mut dyn FnMut()| {
                let mut best = f64::MAX;
                for _ in 0..7 {
                    let t = cpu();
                    for _ in 0..20 {
                        f();
                    }
                    best = best.min((cpu() - t) / 20.0);
                }
                best * 1e3
            };
            let filter = TorchFilter::Bicubic;
            let fast = time(&mut || resize_u8(&src, &mut out, ow, oh, filter, 1).unwrap());
            let old = time(&mut || {
                let passes = Passes {
                    horizontal: Some(int16_coeffs(w, ow, filter).to_axis_coeffs()),
                    vertical: Some(int16_coeffs(h, oh, filter).to_axis_coeffs()),
                    out_w: ow,
                    out_h: oh,
                    horizontal_first: true,
                };
                run_passes(&src, &mut out, passes, 1, true);
            });
            println!(
                "{w}x{h} -> {ow}x{oh}: resampler {old:.3} ms, fast {fast:.3} ms, {:.2}x",
                old / fast
            );
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(-2.0), 0xC000);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        assert_eq!(bf16_bits(f32::NAN), 0x7FC0);
        assert_eq!(bf16_value(0x3F80), 1.0);
        for v in 0..=255u8 {
            // Every u8 is exact in bfloat16 (8 significant bits).
            assert_eq!(bf16_value(bf16_bits(f32::from(v))), f32::from(v));
        }
    }

    #[test]
    fn weights_precision_fits_int16() {
        for (inp, out) in [
            (100, 37),
            (37, 100),
            (4032, 336),
            (7, 1),
            (1, 9),
            (65536, 3),
        ] {
            for filter in [TorchFilter::Bilinear, TorchFilter::Bicubic] {
                let c = int16_coeffs(inp, out, filter);
                assert!(c.precision <= 22, "{inp}->{out}");
                let max = c.weights.iter().map(|w| i32::from(*w).abs()).max().unwrap();
                assert!(max < 1 << 15, "{inp}->{out}: {max}");
                // Each pixel's weights sum to about 2^precision.
                for (row, &n) in c.weights.chunks_exact(c.ksize).zip(&c.counts) {
                    let sum: i32 = row[..n].iter().map(|&w| i32::from(w)).sum();
                    let unit = 1i32 << c.precision;
                    assert!(
                        (sum - unit).abs() <= n as i32,
                        "{inp}->{out}: {sum} vs {unit}"
                    );
                }
            }
        }
    }

    /// The two passes written out literally, torch's way (int16 weights, shift by the
    /// precision), against the resampler's kernels on the scaled weights.
    #[test]
    fn fixed_point_passes_equal_the_literal_arithmetic() {
        let (w, h, c) = (53usize, 41usize, 3usize);
        let data: Vec<u8> = (0..w * h * c)
            .map(|i| ((i * 7919 + (i / 13) * 31) % 256) as u8)
            .collect();
        let src = ImageRef {
            data: &data,
            width: w,
            height: h,
            channels: c,
        };
        for filter in [TorchFilter::Bilinear, TorchFilter::Bicubic] {
            for (ow, oh) in [(20, 17), (107, 90), (53, 12), (7, 41), (1, 1)] {
                let mut ours = vec![0u8; ow * oh * c];
                resize_u8(&src, &mut ours, ow, oh, filter, 1).unwrap();
                let pass = |input: &[u8], iw: usize, ih: usize, horizontal: bool| {
                    let (n_in, n_out) = if horizontal { (iw, ow) } else { (ih, oh) };
                    if n_in == n_out {
                        return input.to_vec();
                    }
                    let k = int16_coeffs(n_in, n_out, filter);
                    let (ow2, oh2) = if horizontal { (ow, ih) } else { (iw, oh) };
                    let mut out = vec![0u8; ow2 * oh2 * c];
                    for y in 0..oh2 {
                        for x in 0..ow2 {
                            let i = if horizontal { x } else { y };
                            let row = &k.weights[i * k.ksize..][..k.counts[i]];
                            for ch in 0..c {
                                let mut acc: i32 = 1 << (k.precision - 1);
                                for (t, &wt) in row.iter().enumerate() {
                                    let (sx, sy) = if horizontal {
                                        (k.starts[i] + t, y)
                                    } else {
                                        (x, k.starts[i] + t)
                                    };
                                    acc +=
                                        i32::from(wt) * i32::from(input[(sy * iw + sx) * c + ch]);
                                }
                                out[(y * ow2 + x) * c + ch] =
                                    (acc >> k.precision).clamp(0, 255) as u8;
                            }
                        }
                    }
                    out
                };
                let mid = pass(&data, w, h, true);
                let want = pass(&mid, ow, h, false);
                assert_eq!(ours, want, "{filter:?} {w}x{h} -> {ow}x{oh}");
            }
        }
    }

    #[test]
    fn cubic_taps_at_identity_and_edges() {
        // Same size: t = 0, weights (0, 1, 0, 0): an exact copy.
        for (idx, w) in cubic_taps(5, 5) {
            assert_eq!(w, [0.0, 1.0, 0.0, 0.0]);
            assert!(idx.iter().all(|&i| i < 5));
        }
        // Upscaling: the first output's source index is negative, its taps clamp to 0.
        let taps = cubic_taps(4, 8);
        assert_eq!(taps[0].0, [0, 0, 0, 1]);
        let sum: f32 = taps[3].1.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6);
        let src: Vec<f32> = (0..2 * 4 * 4).map(|v| v as f32).collect();
        let mut dst = vec![0.0; 2 * 4 * 4];
        bicubic_f32(&src, 2, 4, 4, &mut dst, 4, 4).unwrap();
        assert_eq!(src, dst);
    }
}
