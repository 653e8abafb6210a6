//! Rescale and normalize exactly as transformers' PIL backend, written channels-first.
//!
//! transformers (`image_transforms.rescale` then `normalize`) computes, per value:
//!
//! - rescale: `float32(float64(u8) * rescale_factor)` (`rescale_factor` is the Python float
//!   `1/255 = 0.00392156862745098` by default);
//! - normalize: in float32, `(x - float32(mean[c])) / float32(std[c])`: an IEEE subtraction and
//!   then an IEEE division (not a multiplication by `1/std`, no fused multiply-add);
//! - rescale off and normalize on: `float32(u8)` is normalized; both off: `float32(u8)`.
//!
//! Every result depends only on the channel and the `u8` input, so [`Normalize`] evaluates that
//! formula once for each of the 3 × 256 possible inputs: a lookup table, exact by construction,
//! whatever order the pixels are visited in. With both steps on (every family's default) and
//! AVX2 + FMA, the passes compute eight values at a time instead, by one of two methods:
//!
//! - **fused** (`f32` fused multiply-adds, no division — about twice as fast): used only when
//!   it gives the table's bits for all 3 × 256 inputs, which [`Normalize::new`] checks by
//!   running it on them; true of every family's defaults;
//! - **literal** otherwise: transformers' very operations in its order (`f64` multiply, round to
//!   `f32`, `f32` subtract, `f32` divide), the same bits as the table by IEEE semantics.
//!
//! Tests check both against the table on every input for several configurations, and that the
//! check rejects the fused method where it is off by an ulp.
//!
//! Values are stored from the registers straight into the output tensor, once per place they
//! go: a still image's values fill both frames of Qwen's temporal patch from one computation.

use super::{Out, RgbRef};

/// The rescale/normalize of one configuration, as a per-channel lookup table (and, when the
/// rescale is on and the CPU has AVX2 and FMA, the same values eight at a time).
#[derive(Clone)]
pub struct Normalize {
    lut: [[f32; 256]; 3],
    /// Rescale and normalize both on, on an AVX2 + FMA CPU.
    #[cfg(target_arch = "x86_64")]
    simd: Option<avx2::Formula>,
}

impl std::fmt::Debug for Normalize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Normalize")
            .field("zero", &[self.lut[0][0], self.lut[1][0], self.lut[2][0]])
            .field(
                "max",
                &[self.lut[0][255], self.lut[1][255], self.lut[2][255]],
            )
            .finish()
    }
}

/// One value through transformers' PIL-backend arithmetic (see the module docs).
pub fn reference_value(value: u8, rescale: Option<f64>, normalize: Option<(f64, f64)>) -> f32 {
    let x = match rescale {
        Some(factor) => (f64::from(value) * factor) as f32,
        None => f32::from(value),
    };
    match normalize {
        Some((mean, std)) => (x - mean as f32) / std as f32,
        None => x,
    }
}

impl Normalize {
    /// The table for `rescale` (the factor, or `None` when `do_rescale` is off) and `normalize`
    /// (`(mean, std)` per channel, or `None` when `do_normalize` is off).
    pub fn new(rescale: Option<f64>, normalize: Option<([f64; 3], [f64; 3])>) -> Self {
        let mut lut = [[0f32; 256]; 3];
        for (c, table) in lut.iter_mut().enumerate() {
            let channel = normalize.map(|(mean, std)| (mean[c], std[c]));
            for (v, slot) in table.iter_mut().enumerate() {
                *slot = reference_value(v as u8, rescale, channel);
            }
        }
        Normalize {
            lut,
            #[cfg(target_arch = "x86_64")]
            // Rescale alone is the formula with mean 0 and std 1: `(x − 0) / 1` is `x`, bit for
            // bit, so the table holds exactly that formula's values.
            simd: match (rescale, normalize) {
                (Some(factor), normalize) if avx2::available() => {
                    let (mean, std) = normalize.unwrap_or(([0.0; 3], [1.0; 3]));
                    Some(avx2::Formula::new(factor, mean, std, &lut))
                }
                _ => None,
            },
        }
    }

    /// A table computed elsewhere (the torchvision backend's, [`super::torch_backend`]) that
    /// is `(f32(f64(x) · factor) − f32(mean[c])) / f32(std[c])` for every input: with AVX2 +
    /// FMA, that formula eight at a time, kept only when it reproduces `lut` on all 3 × 256
    /// inputs (else the table alone).
    pub fn from_formula(lut: [[f32; 256]; 3], factor: f64, mean: [f64; 3], std: [f64; 3]) -> Self {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (factor, mean, std);
        Normalize {
            lut,
            #[cfg(target_arch = "x86_64")]
            simd: avx2::available()
                .then(|| avx2::Formula::new(factor, mean, std, &lut))
                .filter(|formula| formula.reproduces(&lut)),
        }
    }

    /// The same values without SIMD (tests compare the two).
    pub fn without_simd(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            self.simd = None;
        }
        self
    }

    /// Channel `c` (0, 1, 2) of the first `out.len()` interleaved RGB pixels of `pixels` into
    /// `out`: one plane's row, as a planar consumer (a float interpolation) reads it. The
    /// table's values, eight at a time where the formula reproduces the table.
    ///
    /// Panics if `pixels` holds fewer than `3 · out.len()` bytes or `c > 2`.
    pub fn channel_into(&self, pixels: &[u8], c: usize, out: &mut [f32]) {
        let pixels = &pixels[..3 * out.len()];
        #[cfg(target_arch = "x86_64")]
        if let Some(formula) = &self.simd {
            if out.len() >= avx2::LANES && c < 3 {
                // SAFETY: `simd` is only set when the CPU has AVX2 and FMA; `out` holds at
                // least `LANES` values and `pixels` exactly three bytes per value.
                unsafe { formula.channel_row(pixels, c, out) };
                return;
            }
        }
        let lut = &self.lut[c];
        for (v, px) in out.iter_mut().zip(pixels.chunks_exact(3)) {
            *v = lut[usize::from(px[c])];
        }
    }

    /// The AVX-512 kernel's constants, where it computes this normaliser's values (the fused
    /// formula reproduces the table, and the CPU has AVX-512 F, BW and VBMI): for callers that
    /// compute a run's values into a register and store them themselves.
    #[cfg(target_arch = "x86_64")]
    pub fn wide(&self) -> Option<avx512::Wide> {
        self.simd.as_ref().and_then(avx2::Formula::wide)
    }

    /// The writer of [`write_chw`](Self::write_chw)'s windows as `float32` or `bfloat16`, where
    /// there is one: the fused formula computes this normaliser's values on an AVX-512 CPU
    /// ([`wide`](Self::wide)).
    #[cfg(target_arch = "x86_64")]
    pub fn chw_writer(&self) -> Option<ChwWriter> {
        self.wide().map(|wide| ChwWriter { wide })
    }

    /// The output for input `value` in channel `c` (0, 1, 2).
    #[inline]
    pub fn value(&self, c: usize, value: u8) -> f32 {
        self.lut[c][usize::from(value)]
    }

    /// Writes the values of the pixel runs `runs` of `pixels` (interleaved RGB) into `out`
    /// channel by channel, once per entry of `copies`: run `y`, channel `c` to
    /// `out[start[c] + y · runs.out_stride..][..runs.width]` for each `start` of `copies` (a
    /// still image repeated over Qwen's temporal patch is computed once and stored twice).
    /// Values go straight from the registers into `out`.
    ///
    /// Panics if a run does not lie within `pixels` or `out` (a bug in the caller).
    pub fn deinterleave_into<T: Slot>(
        &self,
        pixels: &[u8],
        runs: Runs,
        out: &mut [T],
        copies: &[[usize; 3]],
    ) {
        let Runs {
            width,
            rows,
            stride,
            out_stride,
        } = runs;
        if width == 0 || rows == 0 {
            return;
        }
        let last = |step: usize, len: usize| (rows - 1).checked_mul(step)?.checked_add(len);
        assert!(
            last(stride, 3 * width).is_some_and(|end| end <= pixels.len()),
            "{runs:?} outside {} bytes of pixels",
            pixels.len()
        );
        for &start in copies.iter().flatten() {
            assert!(
                last(out_stride, width)
                    .and_then(|len| len.checked_add(start))
                    .is_some_and(|end| end <= out.len()),
                "{runs:?} from {start} outside an output of {}",
                out.len()
            );
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(formula) = &self.simd {
            if width >= avx2::LANES {
                // SAFETY: `simd` is only set when the CPU has AVX2 and FMA (`avx2::available`);
                // `width ≥ LANES`, and every run read lies within `pixels` and every run written
                // within `out` (both checked above), which is what `spread` requires (its
                // stores are unaligned ones, so a byte-aligned `Slot` is fine). A `Slot` has the
                // size of `f32` and takes any `f32` written into it.
                unsafe { formula.spread(pixels, runs, out.as_mut_ptr().cast::<f32>(), copies) };
                return;
            }
        }
        for y in 0..rows {
            let row = &pixels[y * stride..y * stride + 3 * width];
            for (k, px) in row.chunks_exact(3).enumerate() {
                for (c, &value) in px.iter().enumerate() {
                    let v = self.lut[c][usize::from(value)];
                    for start in copies {
                        out[start[c] + y * out_stride + k].set(v);
                    }
                }
            }
        }
    }

    /// Writes `src` channels-first into `out` (`3 × out_h × out_w` values, every one written),
    /// the source pixel of output `(y, x)` being `src(y + top, x + left)`, or a `0` byte where
    /// that lies outside `src` (transformers' zero padding of a center crop, which happens on
    /// `u8` before rescaling). `top`/`left` may be negative.
    pub fn write_chw<T: Slot>(
        &self,
        src: RgbRef<'_>,
        top: isize,
        left: isize,
        out_h: usize,
        out_w: usize,
        out: &mut [T],
    ) {
        debug_assert_eq!(out.len(), 3 * out_h * out_w);
        let plane = out_h * out_w;
        let Inside { x0, x1, y0, y1 } = Inside::new(src, top, left, out_h, out_w);
        let pad = |out: &mut [T], rows: std::ops::Range<usize>, cols: std::ops::Range<usize>| {
            for c in 0..3 {
                let zero = self.lut[c][0];
                for y in rows.clone() {
                    let at = c * plane + y * out_w;
                    out[at + cols.start..at + cols.end]
                        .iter_mut()
                        .for_each(|slot| slot.set(zero));
                }
            }
        };
        if x0 < x1 && y0 < y1 {
            let first =
                ((y0 as isize + top) as usize * src.width + (x0 as isize + left) as usize) * 3;
            let runs = Runs {
                width: x1 - x0,
                rows: y1 - y0,
                stride: src.width * 3,
                out_stride: out_w,
            };
            let at = y0 * out_w + x0;
            self.deinterleave_into(
                &src.data[first..],
                runs,
                out,
                &[[at, plane + at, 2 * plane + at]],
            );
            pad(out, y0..y1, 0..x0);
            pad(out, y0..y1, x1..out_w);
            pad(out, 0..y0, 0..out_w);
            pad(out, y1..out_h, 0..out_w);
        } else {
            pad(out, 0..out_h, 0..out_w);
        }
    }
}

/// The part of an `out_h × out_w` window at `(top, left)` of an image that lies inside it: the
/// output columns `x0..x1` and rows `y0..y1` (empty ranges when none does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Inside {
    x0: usize,
    x1: usize,
    y0: usize,
    y1: usize,
}

impl Inside {
    /// Saturating throughout: a corner or size beyond `isize` (`isize::MIN` included, whose
    /// negation overflows) gives the empty range where the exact one would be, never a range
    /// reaching outside the image.
    fn new(src: RgbRef<'_>, top: isize, left: isize, out_h: usize, out_w: usize) -> Self {
        let size = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        let (w, h, out_w, out_h) = (size(src.width), size(src.height), size(out_w), size(out_h));
        let x0 = 0isize.saturating_sub(left).clamp(0, out_w);
        let x1 = w.saturating_sub(left).clamp(x0, out_w);
        let y0 = 0isize.saturating_sub(top).clamp(0, out_h);
        let y1 = h.saturating_sub(top).clamp(y0, out_h);
        // All four lie in `0..=out_w` or `0..=out_h` (clamped), so they fit `usize`.
        let [x0, x1, y0, y1] = [x0, x1, y0, y1].map(|v| v as usize);
        Inside { x0, x1, y0, y1 }
    }
}

/// [`Normalize::write_chw`] as `float32` or `bfloat16` values (AVX-512): a tensor sent as
/// `bfloat16` written straight from the registers instead of rounded from a `float32` buffer.
/// Obtained from [`Normalize::chw_writer`], which gives one only where the fused formula
/// computes the normaliser's values on an AVX-512 CPU.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub struct ChwWriter {
    wide: avx512::Wide,
}

#[cfg(target_arch = "x86_64")]
impl ChwWriter {
    /// Writes the `out_h × out_w` window of `src` at `(top, left)` into `out` as
    /// [`write_chw`](Normalize::write_chw) does (the same values, bit for bit), each value as
    /// `element` (`bfloat16`: rounded as `f32_to_bf16` rounds): every byte of `out` written.
    ///
    /// Panics unless `out` holds exactly `3 × out_h × out_w` elements, or if `src` holds fewer
    /// bytes than its size says.
    pub fn write_chw(
        &self,
        src: RgbRef<'_>,
        top: isize,
        left: isize,
        (out_h, out_w): (usize, usize),
        out: &mut [std::mem::MaybeUninit<u8>],
        element: super::store::Element,
    ) {
        let (wide, at, size) = (&self.wide, (top, left), (out_h, out_w));
        // SAFETY: a `ChwWriter` exists only where the CPU has what `avx512::available` checks
        // (`Normalize::chw_writer` gets its constants from `wide`, which requires it); the twin
        // runs only where `bf16_hardware` found AVX-512 BF16 as well (and only on values that
        // are never subnormal, which it would round wrongly).
        unsafe {
            if wide.rounds_on_cpu(element) {
                avx512::write_chw_bf16(wide, src, at, size, out, element)
            } else {
                avx512::write_chw(wide, src, at, size, out, element)
            }
        }
    }
}

/// Where [`Normalize::deinterleave_into`] can write: an output value not yet written ([`Out`]) or
/// a plain `f32` (a staging buffer).
///
/// # Safety
///
/// Implementors have the size of `f32`, an alignment of 4 or 1, and become valid when the bytes
/// of any `f32` are written over them through a pointer cast (the SIMD path stores whole
/// vectors that way, with unaligned stores only).
pub unsafe trait Slot {
    fn set(&mut self, value: f32);
}

// SAFETY: `f32` is `f32`.
unsafe impl Slot for f32 {
    #[inline]
    fn set(&mut self, value: f32) {
        *self = value;
    }
}

// SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and writing an `f32` initialises it.
unsafe impl Slot for Out {
    #[inline]
    fn set(&mut self, value: f32) {
        self.write(value);
    }
}

// SAFETY: `Unaligned` is four `MaybeUninit<u8>`: size 4, alignment 1, and any bytes written
// over it (an `f32`'s included) make it valid.
unsafe impl Slot for super::store::Unaligned {
    #[inline]
    fn set(&mut self, value: f32) {
        super::store::Unaligned::set(self, value);
    }
}

/// Rectangles of pixels for [`Normalize::deinterleave_into`]: `rows` runs of `width` pixels,
/// run `y` starting at byte `y · stride` of the pixels and written at `y · out_stride` values
/// past each start in the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runs {
    pub width: usize,
    pub rows: usize,
    pub stride: usize,
    pub out_stride: usize,
}

impl Runs {
    /// One run of `width` pixels.
    pub fn one(width: usize) -> Self {
        Runs {
            width,
            rows: 1,
            stride: 3 * width,
            out_stride: width,
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// Values per vector.
    pub const LANES: usize = 8;

    /// Whether the CPU has what [`Formula::spread`] uses (every AVX2 CPU made has FMA too).
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// How [`Formula::spread`] evaluates a value.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Method {
        /// transformers' operations in its order: `f64` multiply, round to `f32`, `f32`
        /// subtract, `f32` divide.
        Literal,
        /// `f32` only, with fused multiply-adds (no division): the rescale as `v·hi + v·lo`
        /// (`factor` split into two `f32`s, one rounding), the division as a multiplication by
        /// `1/std` corrected once by its residual (`q + (d − q·std)/std`). Both are within a
        /// hair of the exact result, not always the same rounding of it, so this method is only
        /// used when it gives the literal bits for all 3 × 256 inputs (checked when built).
        Fused,
    }

    /// `(f32(f64(v) * factor) - mean[c]) / std[c]`, the constants rounded as the scalar path
    /// rounds them.
    #[derive(Clone, Debug)]
    pub struct Formula {
        method: Method,
        /// [`Method::Fused`] runs 16 values at a time with AVX-512 (the same operations per
        /// value, so the same bits; `reproduces` checks the kernel actually used).
        wide: bool,
        factor: f64,
        hi: f32,
        lo: f32,
        mean: [f32; 3],
        std: [f32; 3],
        recip: [f32; 3],
        /// No value of the table is subnormal (see [`super::avx512::Wide::subnormal_free`]).
        subnormal_free: bool,
    }

    impl Formula {
        /// The formula, [`Method::Fused`] if it reproduces `table` (the literal values of every
        /// input) exactly, else [`Method::Literal`]. Call only when [`available`].
        pub fn new(factor: f64, mean: [f64; 3], std: [f64; 3], table: &[[f32; 256]; 3]) -> Self {
            let hi = factor as f32;
            let std = std.map(|s| s as f32);
            let mut formula = Formula {
                method: Method::Fused,
                wide: super::avx512::available(),
                factor,
                hi,
                lo: (factor - f64::from(hi)) as f32,
                mean: mean.map(|m| m as f32),
                std,
                recip: std.map(|s| 1.0 / s),
                subnormal_free: table.iter().flatten().all(|v| !v.is_subnormal()),
            };
            if !formula.reproduces(table) {
                formula.method = Method::Literal;
            }
            formula
        }

        /// The same formula evaluated with `method` (tests compare the two).
        #[cfg(test)]
        pub fn with_method(mut self, method: Method) -> Self {
            self.method = method;
            self
        }

        #[cfg(test)]
        pub fn method(&self) -> Method {
            self.method
        }

        /// The same formula without the AVX-512 kernel (tests compare the two).
        #[cfg(test)]
        pub fn narrow(self) -> Self {
            self.without_wide()
        }

        /// Whether this formula gives `table`'s bits for every input byte of every channel.
        pub fn reproduces(&self, table: &[[f32; 256]; 3]) -> bool {
            let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
            let mut got = vec![0f32; 3 * 256];
            // SAFETY: `available` was checked by the caller of `new`; 256 ≥ LANES pixels, and
            // the three runs (0, 256, 512)..+256 lie within `got` (768 values).
            unsafe {
                self.spread(
                    &all,
                    super::Runs::one(256),
                    got.as_mut_ptr(),
                    &[[0, 256, 512]],
                )
            };
            let same = got.chunks_exact(256).zip(table).all(|(got, want)| {
                got.iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            });
            // With AVX-512 the run of 256 went through the wide kernel; narrow runs use the
            // AVX2 one, which must give the table's bits too.
            same && (!self.wide || self.clone().without_wide().reproduces(table))
        }

        /// The same formula without the AVX-512 kernel.
        fn without_wide(mut self) -> Self {
            self.wide = false;
            self
        }

        /// Stores channel `c` of run `y` of `runs` at `out + start[c] + y · runs.out_stride`,
        /// for each `start` of `copies`, eight values at a time: vectors at 0, 8, 16, … of a
        /// run and a last one at `width − 8` (overlapping the one before it, whose values it
        /// writes again, unchanged).
        ///
        /// # Safety
        ///
        /// The CPU must support AVX2 and FMA; `runs.width ≥ LANES`; for every run `y`,
        /// `pixels[y · stride..][..3 · width]` must be in bounds, and for every `start` of
        /// `copies` and channel `c`, `out + start[c] + y · out_stride ..][..width]` valid for
        /// writes and not read or written by anyone else during the call.
        pub unsafe fn spread(
            &self,
            pixels: &[u8],
            runs: super::Runs,
            out: *mut f32,
            copies: &[[usize; 3]],
        ) {
            // SAFETY: forwarded from this function's contract; `wide` is only set when
            // `super::avx512::available()` found what the wide kernel needs.
            unsafe {
                match self.method {
                    Method::Literal => spread::<false>(self, pixels, runs, out, copies),
                    // Runs of up to `WINDOW_PIXELS` (the patch rows of the Qwen layout) stay
                    // on the AVX2 kernel's one-window path: its earlier three-load form was, per
                    // MiniMax-M3-VL / Qwen2-VL call, 15-22 % faster on an Intel Xeon with
                    // AVX-512 than one masked 16-lane load and six masked stores per row.
                    Method::Fused if self.wide && runs.width > WINDOW_PIXELS => {
                        super::avx512::spread(&self.constants(), pixels, runs, out, copies)
                    }
                    Method::Fused => spread::<true>(self, pixels, runs, out, copies),
                }
            }
        }

        /// The AVX-512 kernel's constants, when [`spread`](Self::spread) uses that kernel (the
        /// fused method, on a CPU with it).
        pub fn wide(&self) -> Option<super::avx512::Wide> {
            (self.method == Method::Fused && self.wide).then(|| self.constants())
        }

        /// The fused formula's constants, as the AVX-512 kernels take them.
        fn constants(&self) -> super::avx512::Wide {
            super::avx512::Wide {
                split: [self.hi, self.lo],
                channels: [self.mean, self.std, self.recip],
                subnormal_free: self.subnormal_free,
            }
        }

        /// Channel `c` of `out.len()` interleaved RGB pixels into `out`, with the same per-value
        /// operations as [`spread`](Self::spread)'s AVX2 kernel (so the bits `reproduces`
        /// checked).
        ///
        /// # Safety
        ///
        /// The CPU must support AVX2 and FMA; `c < 3`, `out.len() ≥ LANES` and `pixels.len() ≥
        /// 3 · out.len()`.
        pub unsafe fn channel_row(&self, pixels: &[u8], c: usize, out: &mut [f32]) {
            // SAFETY: forwarded from this function's contract.
            unsafe {
                match (self.method, self.factor == 1.0) {
                    (Method::Literal, false) => channel_row::<false, false>(self, pixels, c, out),
                    (Method::Literal, true) => channel_row::<false, true>(self, pixels, c, out),
                    (Method::Fused, false) => channel_row::<true, false>(self, pixels, c, out),
                    (Method::Fused, true) => channel_row::<true, true>(self, pixels, c, out),
                }
            }
        }
    }

    /// `vpshufb` controls gathering channel `c` of 8 interleaved RGB pixels (24 bytes) into the
    /// low 8 bytes: `MASKS[c]` from the first 16 bytes, `MASKS[3 + c]` from the last 8; `-128`
    /// writes 0.
    const MASKS: [[i8; 16]; 6] = {
        let mut masks = [[-128i8; 16]; 6];
        let mut c = 0;
        while c < 3 {
            let mut j = 0;
            while j < LANES {
                let at = 3 * j + c;
                if at < 16 {
                    masks[c][j] = at as i8;
                } else {
                    masks[3 + c][j] = (at - 16) as i8;
                }
                j += 1;
            }
            c += 1;
        }
        masks
    };

    /// How far past the end of a run [`spread`] prefetches, in bytes.
    const PREFETCH_AHEAD: usize = 128;

    /// The constants of one channel, broadcast.
    #[derive(Clone, Copy)]
    struct Channel {
        mask: (__m128i, __m128i),
        mean: __m256,
        std: __m256,
        recip: __m256,
    }

    /// The value of channel `ch` of the 8 pixels whose bytes are `lo` (bytes 0–15) and `hi`
    /// (16–23).
    #[target_feature(enable = "avx2,fma")]
    fn value<const FUSED: bool, const UNIT: bool>(
        (lo, hi): (__m128i, __m128i),
        ch: Channel,
        factor: __m256d,
        split: (__m256, __m256),
    ) -> __m256 {
        let bytes = _mm_or_si128(
            _mm_shuffle_epi8(lo, ch.mask.0),
            _mm_shuffle_epi8(hi, ch.mask.1),
        );
        floats::<FUSED, UNIT>(bytes, ch, factor, split)
    }

    /// The values of channel `ch` of the 8 bytes in the low half of `bytes` ([`widened`] of
    /// them widened to `i32`).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn floats<const FUSED: bool, const UNIT: bool>(
        bytes: __m128i,
        ch: Channel,
        factor: __m256d,
        split: (__m256, __m256),
    ) -> __m256 {
        widened::<FUSED, UNIT>(_mm256_cvtepu8_epi32(bytes), ch, factor, split)
    }

    /// The values of channel `ch` of the 8 bytes `v` (each widened to an `i32` lane). With `UNIT`
    /// (a rescale factor of exactly 1) the rescaled value is the byte itself, which both methods
    /// compute exactly (`v·1 + v·0` fused, `f32(f64(v)·1)` literal), so that step is skipped.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn widened<const FUSED: bool, const UNIT: bool>(
        v: __m256i,
        ch: Channel,
        factor: __m256d,
        (f_hi, f_lo): (__m256, __m256),
    ) -> __m256 {
        if UNIT {
            let x = _mm256_cvtepi32_ps(v);
            let d = _mm256_sub_ps(x, ch.mean);
            if FUSED {
                let q = _mm256_mul_ps(d, ch.recip);
                _mm256_fmadd_ps(_mm256_fnmadd_ps(q, ch.std, d), ch.recip, q)
            } else {
                _mm256_div_ps(d, ch.std)
            }
        } else if FUSED {
            let v = _mm256_cvtepi32_ps(v);
            let x = _mm256_fmadd_ps(v, f_hi, _mm256_mul_ps(v, f_lo));
            let d = _mm256_sub_ps(x, ch.mean);
            let q = _mm256_mul_ps(d, ch.recip);
            _mm256_fmadd_ps(_mm256_fnmadd_ps(q, ch.std, d), ch.recip, q)
        } else {
            let first = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));
            let second = _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(v));
            let x = _mm256_set_m128(
                _mm256_cvtpd_ps(_mm256_mul_pd(second, factor)),
                _mm256_cvtpd_ps(_mm256_mul_pd(first, factor)),
            );
            _mm256_div_ps(_mm256_sub_ps(x, ch.mean), ch.std)
        }
    }

    /// Widest run of the one-window path of [`spread_to`]: 16 pixels, 48 bytes.
    const WINDOW_PIXELS: usize = 16;

    /// Per channel `c`, the `vpshufb` control that widens four pixels of each 128-bit lane to
    /// `i32`: lane 0 takes the pixels at bytes `3j + c` of its 16 bytes (`j < 4`), lane 1 those at
    /// `4 + 3j + c`. Lanes loaded from bytes `3i` and `3i + 8` of interleaved RGB pixels thus give
    /// channel `c` of pixels `i..i + 8` ([`window_vectors`]); `-1` writes 0.
    pub(crate) const WIDEN: [[i8; 32]; 3] = {
        let mut masks = [[-1i8; 32]; 3];
        let mut c = 0;
        while c < 3 {
            let mut j = 0;
            while j < 4 {
                masks[c][4 * j] = (3 * j + c) as i8;
                masks[c][16 + 4 * j] = (4 + 3 * j + c) as i8;
                j += 1;
            }
            c += 1;
        }
        masks
    };

    /// The two pairs of lanes of a run of `w` pixels (`LANES ≤ w ≤ WINDOW_PIXELS`) for
    /// [`WIDEN`]: bytes `0..16` and `8..24` (pixels `0..8`), and `b..b + 16` and `b + 8..b + 24`
    /// with `b = 3·(w − 8)` (pixels `w − 8..w`; the first pair again when `w` is 8).
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2; `LANES ≤ w`; `p[..3·w]` must be readable.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) unsafe fn window_vectors(p: *const u8, w: usize) -> (__m256i, __m256i) {
        let b = 3 * (w - LANES);
        // SAFETY: the four 16-byte loads read bytes `0..24` and `b..b + 24` of `p`, and
        // `b + 24 = 3·w` bytes are readable by the contract.
        unsafe {
            (
                _mm256_loadu2_m128i(p.add(8).cast(), p.cast()),
                _mm256_loadu2_m128i(p.add(b + 8).cast(), p.add(b).cast()),
            )
        }
    }

    /// [`Formula::spread`] with the method chosen at compile time.
    ///
    /// # Safety
    ///
    /// As [`Formula::spread`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn spread<const FUSED: bool>(
        formula: &Formula,
        pixels: &[u8],
        runs: super::Runs,
        out: *mut f32,
        copies: &[[usize; 3]],
    ) {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            if formula.factor == 1.0 {
                spread_copies::<FUSED, true>(formula, pixels, runs, out, copies)
            } else {
                spread_copies::<FUSED, false>(formula, pixels, runs, out, copies)
            }
        }
    }

    /// [`spread`] with the unit factor known at compile time.
    ///
    /// # Safety
    ///
    /// As [`Formula::spread`].
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn spread_copies<const FUSED: bool, const UNIT: bool>(
        formula: &Formula,
        pixels: &[u8],
        runs: super::Runs,
        out: *mut f32,
        copies: &[[usize; 3]],
    ) {
        // One or two places per value (a still image over Qwen's two-frame temporal patch)
        // with the count known at compile time: the stores unrolled, no loop over `copies` per
        // vector. More copies (rare: a longer temporal patch) are written one pass each, the
        // same values.
        match copies {
            // SAFETY: forwarded from this function's contract; `[*a]` is `copies`.
            [a] => unsafe { spread_to::<FUSED, UNIT, 1>(formula, pixels, runs, out, [*a]) },
            // SAFETY: forwarded from this function's contract; `[*a, *b]` is `copies`.
            [a, b] => unsafe { spread_to::<FUSED, UNIT, 2>(formula, pixels, runs, out, [*a, *b]) },
            _ => {
                for start in copies {
                    // SAFETY: forwarded from this function's contract; `start` is an entry of
                    // `copies`, which the contract covers.
                    unsafe { spread_to::<FUSED, UNIT, 1>(formula, pixels, runs, out, [*start]) };
                }
            }
        }
    }

    /// The constants of channel `c`, broadcast (a function with the target features rather
    /// than a closure, which would not inherit them and would not be inlined).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn channel(formula: &Formula, c: usize) -> Channel {
        Channel {
            // SAFETY: each mask is a 16-byte array, read with an unaligned load.
            mask: unsafe {
                (
                    _mm_loadu_si128(MASKS[c].as_ptr().cast()),
                    _mm_loadu_si128(MASKS[3 + c].as_ptr().cast()),
                )
            },
            mean: _mm256_set1_ps(formula.mean[c]),
            std: _mm256_set1_ps(formula.std[c]),
            recip: _mm256_set1_ps(formula.recip[c]),
        }
    }

    /// [`Formula::channel_row`] with the method and unit factor known at compile time: eight
    /// values at a time, the last vector at `out.len() − 8` (overlapping the one before it,
    /// whose values it writes again, unchanged).
    ///
    /// # Safety
    ///
    /// As [`Formula::channel_row`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn channel_row<const FUSED: bool, const UNIT: bool>(
        formula: &Formula,
        pixels: &[u8],
        c: usize,
        out: &mut [f32],
    ) {
        let n = out.len();
        assert!(c < 3 && n >= LANES && pixels.len() >= 3 * n);
        let ch = channel(formula, c);
        let factor = _mm256_set1_pd(formula.factor);
        let split = (_mm256_set1_ps(formula.hi), _mm256_set1_ps(formula.lo));
        let mut next = 0;
        loop {
            let at = next.min(n - LANES);
            // SAFETY: `at + LANES ≤ n`, so the 24 bytes read (16 at `3·at`, 8 at `3·at + 16`)
            // lie within the `3·n` bytes of `pixels` and the 8 values stored at `at` within
            // `out` (asserted above); both are unaligned accesses.
            unsafe {
                let p = pixels.as_ptr().add(3 * at);
                let bytes = (_mm_loadu_si128(p.cast()), _mm_loadl_epi64(p.add(16).cast()));
                let v = value::<FUSED, UNIT>(bytes, ch, factor, split);
                _mm256_storeu_ps(out.as_mut_ptr().add(at), v);
            }
            if at + LANES >= n {
                break;
            }
            next += LANES;
        }
    }

    /// [`spread`] into the `N` places `copies`.
    ///
    /// A run of 8 to 16 pixels (a patch row: 14 for Qwen2-VL and MiniMax-M3-VL, 16 for Qwen3-VL)
    /// is read from its `3·width` bytes as two vectors of two 16-byte
    /// lanes ([`window_vectors`]), from which one `vpshufb` per channel and vector ([`WIDEN`])
    /// picks that channel's eight pixels widened to `i32`: two vectors per channel, the second
    /// at `width − 8`. Other runs go eight pixels at a time.
    ///
    /// # Safety
    ///
    /// As [`Formula::spread`], with `copies` for its `copies`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn spread_to<const FUSED: bool, const UNIT: bool, const N: usize>(
        formula: &Formula,
        pixels: &[u8],
        runs: super::Runs,
        out: *mut f32,
        copies: [[usize; 3]; N],
    ) {
        let n = runs.width;
        debug_assert!(n >= LANES);
        let channels = [
            channel(formula, 0),
            channel(formula, 1),
            channel(formula, 2),
        ];
        let factor = _mm256_set1_pd(formula.factor);
        let split = (_mm256_set1_ps(formula.hi), _mm256_set1_ps(formula.lo));
        // The one-window path, channel by channel (a channel's constants and controls stay in
        // registers; its values go to one contiguous block per copy), over the rows whose
        // `3·n` bytes lie inside `pixels` (all of them, by the contract; checked all the same, a
        // prefix of the rows); the rest below.
        let mut first = 0;
        if n <= WINDOW_PIXELS {
            let fits = |y: usize| pixels.len() - y * runs.stride >= 3 * n;
            first = (0..runs.rows).find(|&y| !fits(y)).unwrap_or(runs.rows);
            for (c, &ch) in channels.iter().enumerate() {
                // SAFETY: a 32-byte array, read with an unaligned load.
                let widen = unsafe { _mm256_loadu_si256(WIDEN[c].as_ptr().cast()) };
                for y in 0..first {
                    let (row, dst) = (y * runs.stride, y * runs.out_stride);
                    if c == 0 {
                        // As below: the next bytes of this row, asked for early.
                        _mm_prefetch::<_MM_HINT_T0>(
                            pixels
                                .as_ptr()
                                .wrapping_add(row + 3 * n + PREFETCH_AHEAD)
                                .cast::<i8>(),
                        );
                    }
                    // SAFETY: the `3·n ≤ 48` bytes read at `row` lie within `pixels` (`fits`,
                    // true of rows before `first`); the vectors stored at `start[c] + dst` and
                    // `start[c] + dst + n − 8` lie within the run's `n` output values
                    // (`LANES ≤ n`), in bounds by the contract; all loads and stores are
                    // unaligned ones.
                    unsafe {
                        let (front, back) = window_vectors(pixels.as_ptr().add(row), n);
                        let low = widened::<FUSED, UNIT>(
                            _mm256_shuffle_epi8(front, widen),
                            ch,
                            factor,
                            split,
                        );
                        let high = widened::<FUSED, UNIT>(
                            _mm256_shuffle_epi8(back, widen),
                            ch,
                            factor,
                            split,
                        );
                        for start in &copies {
                            let at = out.add(start[c] + dst);
                            _mm256_storeu_ps(at, low);
                            _mm256_storeu_ps(at.add(n - LANES), high);
                        }
                    }
                }
            }
        }
        for y in first..runs.rows {
            let (row, dst) = (y * runs.stride, y * runs.out_stride);
            // The bytes a caller walking patches left to right reads next in this row, asked
            // for early: rows of a patch are `stride` apart, too many streams for the hardware
            // prefetcher. The address may lie past `pixels` (`wrapping_add` computes it without
            // claiming it is in bounds); a prefetch never faults and reads nothing into Rust.
            _mm_prefetch::<_MM_HINT_T0>(
                pixels
                    .as_ptr()
                    .wrapping_add(row + 3 * n + PREFETCH_AHEAD)
                    .cast::<i8>(),
            );
            let mut next = 0;
            loop {
                let at = next.min(n - LANES);
                // SAFETY: `at + LANES <= n`, so the 24 bytes read (16 at `row + 3·at`, 8 at
                // `row + 3·at + 16`) lie within run `y` of `pixels`, and the 8 values stored at
                // `start[c] + dst + at` within its output run, both in bounds by the contract;
                // all loads and stores are unaligned ones.
                unsafe {
                    let p = pixels.as_ptr().add(row + 3 * at);
                    let bytes = (_mm_loadu_si128(p.cast()), _mm_loadl_epi64(p.add(16).cast()));
                    for (c, &ch) in channels.iter().enumerate() {
                        let v = value::<FUSED, UNIT>(bytes, ch, factor, split);
                        for start in &copies {
                            _mm256_storeu_ps(out.add(start[c] + dst + at), v);
                        }
                    }
                }
                if at + LANES >= n {
                    break;
                }
                next += LANES;
            }
        }
    }
}

/// The fused formula of [`avx2::Method::Fused`] on 16 values at a time (AVX-512F, BW and
/// VBMI): one masked load of up to 16 pixels, one `vpermb` per channel to gather its bytes, the
/// same floating-point operations per value as the AVX2 kernel, masked stores (a run of any
/// width, no overlapping vectors).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::store::{bf16_twins, Element};

    /// Values per vector.
    const LANES: usize = 16;

    /// Whether the CPU has what [`spread`] uses (and AVX-512 is not turned off, see
    /// [`crate::simd`]).
    pub fn available() -> bool {
        crate::simd::avx512_allowed()
            && super::avx2::available()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    }

    /// `vpermb` control gathering channel `c` of 16 interleaved RGB pixels into bytes 0–15.
    const fn control(c: usize) -> [u8; 64] {
        let mut bytes = [0u8; 64];
        let mut j = 0;
        while j < LANES {
            bytes[j] = (3 * j + c) as u8;
            j += 1;
        }
        bytes
    }

    /// The three controls, one per channel (also used by `torch_simd`).
    pub(crate) const CONTROLS: [[u8; 64]; 3] = [control(0), control(1), control(2)];

    /// The constants of the fused formula (as [`spread`] takes them): `split` is the rescale
    /// factor split into two `f32`s, `channels` the mean, std and reciprocal of the std per
    /// channel.
    #[derive(Clone, Copy, Debug)]
    pub struct Wide {
        pub split: [f32; 2],
        pub channels: [[f32; 3]; 3],
        /// No value the formula computes is subnormal: its table holds none of the 3 × 256
        /// values, and the formula gives the table's values (it is only used where it
        /// reproduces them). The CPU's `bfloat16` rounding, which flushes subnormal inputs to
        /// zero, is then exact for every value (see `store::bf16_vector_cpu`).
        pub subnormal_free: bool,
    }

    /// The fused formula's constants in registers: `hi`/`lo` broadcast, and per set `k` (< 3) the
    /// mean, std and reciprocal of the std, each a vector of one channel's value
    /// ([`Registers`]) or of each lane's channel ([`Interleaved`]).
    #[derive(Clone, Copy)]
    struct Constants {
        hi: __m512,
        lo: __m512,
        mean: [__m512; 3],
        std: [__m512; 3],
        recip: [__m512; 3],
    }

    impl Constants {
        /// The fused formula on the 16 bytes of `bytes` with constant set `k`: the operations of
        /// every kernel of this method (so the bits `reproduces` checked).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        fn values(&self, bytes: __m128i, k: usize) -> __m512 {
            let v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
            let x = _mm512_fmadd_ps(v, self.hi, _mm512_mul_ps(v, self.lo));
            let d = _mm512_sub_ps(x, self.mean[k]);
            let q = _mm512_mul_ps(d, self.recip[k]);
            _mm512_fmadd_ps(_mm512_fnmadd_ps(q, self.std[k], d), self.recip[k], q)
        }
    }

    /// [`Wide`]'s constants broadcast, one set per channel, and the byte controls, for
    /// [`Registers::values`].
    #[derive(Clone, Copy)]
    pub struct Registers {
        controls: [__m512i; 3],
        constants: Constants,
    }

    /// [`Wide`]'s constants for values laid out channels-last (`R G B R G B …`, as the pixels
    /// are): per lane, the constants of its channel, one set per phase (the channel of a run's
    /// first value), for [`Interleaved::values`].
    #[derive(Clone, Copy)]
    pub struct Interleaved(Constants);

    impl Wide {
        /// Whether values of this formula written as `element` are rounded by the CPU (the
        /// kernels' `bf16_twins`): `bfloat16`, on a CPU with AVX-512 BF16
        /// (`store::bf16_hardware`), from a table without a subnormal value
        /// ([`subnormal_free`](Self::subnormal_free)).
        pub fn rounds_on_cpu(&self, element: Element) -> bool {
            element == Element::Bf16 && self.subnormal_free && super::super::store::bf16_hardware()
        }

        /// The constants in registers.
        ///
        /// # Safety
        ///
        /// The CPU must have what [`available`] checks.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        pub unsafe fn registers(&self) -> Registers {
            Registers {
                // SAFETY: each control is a 64-byte array, read with an unaligned load.
                controls: CONTROLS.map(|c| unsafe { _mm512_loadu_si512(c.as_ptr().cast()) }),
                constants: self.constants(|values, c| _mm512_set1_ps(values[c])),
            }
        }

        /// The constants per lane, for each phase.
        ///
        /// # Safety
        ///
        /// The CPU must have what [`available`] checks.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        pub unsafe fn interleaved(&self) -> Interleaved {
            Interleaved(self.constants(|values, phase| {
                let per_lane: [f32; LANES] = std::array::from_fn(|k| values[(phase + k) % 3]);
                // SAFETY: a 16-value array, read with an unaligned load.
                unsafe { _mm512_loadu_ps(per_lane.as_ptr()) }
            }))
        }

        /// `hi`/`lo` broadcast and each set `k` of the per-channel constants as `spread(values,
        /// k)` lays them out.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        fn constants(&self, spread: impl Fn([f32; 3], usize) -> __m512) -> Constants {
            let [mean, std, recip] = self.channels;
            Constants {
                hi: _mm512_set1_ps(self.split[0]),
                lo: _mm512_set1_ps(self.split[1]),
                mean: std::array::from_fn(|k| spread(mean, k)),
                std: std::array::from_fn(|k| spread(std, k)),
                recip: std::array::from_fn(|k| spread(recip, k)),
            }
        }
    }

    impl Interleaved {
        /// The values of the 16 bytes of `bytes` laid out channels-last, the first of channel
        /// `phase` (< 3): per value, the operations of [`Registers::values`] with its channel's
        /// constants (so the bits `reproduces` checked).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        pub fn values(&self, bytes: __m128i, phase: usize) -> __m512 {
            self.0.values(bytes, phase)
        }
    }

    impl Registers {
        /// The values of channel `c` (< 3) of the (up to) 16 interleaved RGB pixels whose bytes
        /// are `px`'s first 48: the fused formula, the same operations as every kernel of this
        /// method (so the bits `reproduces` checked).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        #[inline]
        pub fn values(&self, px: __m512i, c: usize) -> __m512 {
            let bytes = _mm512_castsi512_si128(_mm512_permutexvar_epi8(self.controls[c], px));
            self.constants.values(bytes, c)
        }
    }

    bf16_twins! {
    /// [`super::ChwWriter::write_chw`]: a window row at a time, in each channel plane the
    /// normalised zero left of the image, its values 16 at a time, the zero right of it (rows
    /// outside the image all zero); stored with masked stores of each run's own bytes.
    ///
    /// Panics unless `out` holds exactly `3 × out_h × out_w` elements, or if `src.data` holds
    /// fewer than `3 × width × height` bytes.
    ///
    /// # Safety
    ///
    /// The CPU must support what [`available`] checks (and AVX-512 BF16 for the twin,
    /// `write_chw_bf16`, which rounds `bfloat16` with it: see [`bf16_twins`]).
    pub unsafe fn write_chw / write_chw_bf16(
        wide: &Wide,
        src: super::RgbRef<'_>,
        top_left: (isize, isize),
        size: (usize, usize),
        out: &mut [std::mem::MaybeUninit<u8>],
        element: Element,
    ) {
        let ((top, left), (out_h, out_w)) = (top_left, size);
        let size = element.size();
        let row_bytes = out_w.checked_mul(size).expect("window size overflows");
        let plane = out_h.checked_mul(row_bytes).expect("window size overflows");
        assert_eq!(
            Some(out.len()),
            plane.checked_mul(3),
            "{out_h}x{out_w} window of {element:?} into {} bytes",
            out.len()
        );
        let stride = src.checked_stride();
        let super::Inside { x0, x1, y0, y1 } = super::Inside::new(src, top, left, out_h, out_w);
        // SAFETY: the CPU features are this function's contract.
        let registers = unsafe { wide.registers() };
        // The normalised zero of each channel in all 64 bytes (`bfloat16` fills only the low 32
        // of `Element::bytes`: they are repeated into the high half).
        let zeros: [__m512i; 3] = std::array::from_fn(|c| {
            let v = to_bytes(element, registers.values(_mm512_setzero_si512(), c));
            match element {
                Element::F32 => v,
                Element::Bf16 => _mm512_inserti64x4::<1>(v, _mm512_castsi512_si256(v)),
            }
        });
        let base = out.as_mut_ptr().cast::<u8>();
        // Stores the first `len` (≤ 64) bytes of `v` at byte `at` of `out` and asks for the same
        // line of the next output row.
        let put = |at: usize, v: __m512i, len: usize| {
            debug_assert!(len <= 64 && at + len <= 3 * plane);
            let mask = u64::MAX >> (64 - len);
            // SAFETY: every caller stores within one output row of one plane of `out` (`at +
            // len ≤ 3 · plane`, `out`'s length, asserted above; `len ≤ 64` by the callers);
            // masked-off bytes are not accessed. The prefetch never faults (`wrapping_add`
            // claims nothing about the address).
            unsafe {
                _mm512_mask_storeu_epi8(base.add(at).cast(), mask, v);
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(at + row_bytes).cast());
            }
        };
        let pad = |at: usize, len: usize, zero: __m512i| {
            let mut done = 0;
            while done < len {
                let now = (len - done).min(64);
                put(at + done, zero, now);
                done += now;
            }
        };
        for y in 0..out_h {
            let inside = (y0..y1).contains(&y);
            let (left_pad, right_pad) = if inside { (x0, out_w - x1) } else { (out_w, 0) };
            let rows: [usize; 3] = std::array::from_fn(|c| c * plane + y * row_bytes);
            for c in 0..3 {
                pad(rows[c], left_pad * size, zeros[c]);
                pad(
                    rows[c] + (out_w - right_pad) * size,
                    right_pad * size,
                    zeros[c],
                );
            }
            if !inside {
                continue;
            }
            // Inside the image: source row `y + top` ≥ 0 (as `y ≥ y0`) and < height (as
            // `y < y1`), columns `x + left` for `x` in `x0..x1`, all in `0..width` likewise.
            let row = (y as isize + top) as usize * stride;
            let mut x = x0;
            while x < x1 {
                let count = LANES.min(x1 - x);
                let at = row + (x as isize + left) as usize * 3;
                let bytes_mask: u64 = (1u64 << (3 * count)) - 1; // 3·count ≤ 48 bits
                                                                 // SAFETY: the masked load reads only bytes `at..at + 3·count` (masked-off bytes
                                                                 // are not accessed): pixels of one row of the image, inside `src.data` (its
                                                                 // length asserted above).
                let px = unsafe {
                    _mm512_maskz_loadu_epi8(bytes_mask, src.data.as_ptr().add(at).cast())
                };
                for (c, &dst) in rows.iter().enumerate() {
                    let v = to_bytes(element, registers.values(px, c));
                    put(dst + x * size, v, count * size);
                }
                x += count;
            }
        }
    }
    }

    /// As the AVX2 kernel's `spread::<true>`, with the fused formula's constants `wide`.
    ///
    /// # Safety
    ///
    /// The CPU must support what [`available`] checks; `runs.width ≥ 1`; for every run `y`,
    /// `pixels[y · stride..][..3 · width]` must be in bounds, and for every `start` of `copies`
    /// and channel `c`, `out + start[c] + y · out_stride ..][..width]` valid for writes and not
    /// read or written by anyone else during the call.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
    pub unsafe fn spread(
        wide: &Wide,
        pixels: &[u8],
        runs: super::Runs,
        out: *mut f32,
        copies: &[[usize; 3]],
    ) {
        let n = runs.width;
        // SAFETY: the CPU features are this function's contract.
        let registers = unsafe { wide.registers() };
        for y in 0..runs.rows {
            let (row, dst) = (y * runs.stride, y * runs.out_stride);
            // As in the AVX2 kernel: the next bytes of this row, asked for early (a prefetch
            // never faults, and `wrapping_add` claims nothing about the address).
            _mm_prefetch::<_MM_HINT_T0>(
                pixels.as_ptr().wrapping_add(row + 3 * n + 128).cast::<i8>(),
            );
            let mut at = 0;
            while at < n {
                let count = LANES.min(n - at);
                let bytes_mask: u64 = (1u64 << (3 * count)) - 1; // 3·count ≤ 48 bits
                let values_mask: u16 = ((1u32 << count) - 1) as u16;
                // SAFETY: the masked load reads only the `3·count` bytes of pixels
                // `at..at + count` of run `y` (masked-off bytes are never accessed), in bounds by
                // the contract; the masked stores write only values `at..at + count` of each
                // output run, in bounds too.
                unsafe {
                    let p = pixels.as_ptr().add(row + 3 * at);
                    let px = _mm512_maskz_loadu_epi8(bytes_mask, p.cast());
                    for c in 0..3 {
                        let v = registers.values(px, c);
                        for start in copies {
                            let at = start[c] + dst + at;
                            _mm512_mask_storeu_ps(out.add(at), values_mask, v);
                            // The same values' line of the next run, asked for now (see
                            // `store::prefetch_for_write`); past the last run the address may
                            // lie outside `out`, which a prefetch never faults on.
                            _mm_prefetch::<_MM_HINT_T0>(
                                out.wrapping_add(at + runs.out_stride).cast::<i8>(),
                            );
                        }
                    }
                }
                at += count;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bits of `values`, a test buffer made with `Out::new` (every value initialised when
    /// the buffer was made, then maybe overwritten by a writer).
    fn bits(values: &[Out]) -> Vec<u32> {
        // SAFETY: every element was created initialised (`Out::new`) and writers only store
        // initialised values into it.
        values
            .iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
    const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

    #[test]
    fn table_is_the_formula() {
        let n = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        for c in 0..3 {
            for v in 0..=255u8 {
                let x = (f64::from(v) * 0.00392156862745098) as f32;
                let want = (x - CLIP_MEAN[c] as f32) / CLIP_STD[c] as f32;
                assert_eq!(n.value(c, v).to_bits(), want.to_bits());
            }
        }
        // numpy: ((np.float64(255) * (1/255)).astype(np.float32) - np.float32(0.48145466))
        //        / np.float32(0.26862954) == np.float32(1.9303361)
        assert_eq!(n.value(0, 255), 1.930_336_1_f32);
        let off = Normalize::new(None, None);
        assert_eq!(off.value(2, 200), 200.0);
        let rescale_only = Normalize::new(Some(0.5), None);
        assert_eq!(rescale_only.value(1, 3), 1.5);
    }

    /// The values `n` writes for `pixels`, as bits, per channel (through `deinterleave_into`,
    /// stored twice into an output prefilled with NaN, both copies checked equal).
    fn run(n: &Normalize, pixels: &[u8]) -> [Vec<u32>; 3] {
        let len = pixels.len() / 3;
        let mut out = vec![Out::new(f32::NAN); 6 * len + 1];
        let copies = [
            [1, len + 1, 2 * len + 1],
            [3 * len + 1, 4 * len + 1, 5 * len + 1],
        ];
        n.deinterleave_into(pixels, Runs::one(len), &mut out, &copies);
        let out = bits(&out);
        assert!(
            f32::from_bits(out[0]).is_nan(),
            "the value before the runs was written"
        );
        assert_eq!(
            out[1..3 * len + 1],
            out[3 * len + 1..],
            "the two copies differ"
        );
        std::array::from_fn(|c| out[1 + c * len..1 + (c + 1) * len].to_vec())
    }

    /// `fast` and, when it has a vector formula, the same with the literal method always and with
    /// its chosen method without the AVX-512 kernel.
    fn variants(fast: &Normalize) -> Vec<Normalize> {
        let mut variants = vec![fast.clone()];
        #[cfg(target_arch = "x86_64")]
        if let Some(formula) = &fast.simd {
            let mut literal = fast.clone();
            literal.simd = Some(formula.clone().with_method(avx2::Method::Literal));
            variants.push(literal);
            let mut narrow = fast.clone();
            narrow.simd = Some(formula.clone().narrow());
            variants.push(narrow);
        }
        variants
    }

    #[test]
    fn simd_equals_the_table_for_every_input() {
        let configs = [
            (1.0 / 255.0, CLIP_MEAN, CLIP_STD),
            (0.00392156862745098, [0.5; 3], [0.5; 3]),
            (0.5, [100.0, -3.25, 0.1], [7.0, 0.001, 1e6]),
            (1e-3, [0.0; 3], [1.0; 3]),
            (3.7, [1.0, 2.0, 3.0], [0.0, -1.0, 1e-30]), // std 0: inf and NaN both ways
        ];
        for (factor, mean, std) in configs {
            let fast = Normalize::new(Some(factor), Some((mean, std)));
            let table = fast.clone().without_simd();
            let variants = variants(&fast);
            // Run lengths around both vector widths, every position of a run.
            for n in [1, 7, 8, 9, 13, 14, 15, 16, 17, 31, 32, 33, 100, 256] {
                let pixels: Vec<u8> = (0..3 * n).map(|i| ((i * 37 + n) % 256) as u8).collect();
                let want = run(&table, &pixels);
                for variant in &variants {
                    assert_eq!(run(variant, &pixels), want, "factor {factor}, n {n}");
                }
            }
            // Every byte value in every channel.
            let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
            for variant in &variants {
                let got = run(variant, &all);
                for (c, values) in got.iter().enumerate() {
                    for (v, &bits) in (0..=255u8).zip(values) {
                        assert_eq!(bits, table.value(c, v).to_bits(), "factor {factor}, c {c}");
                    }
                }
            }
        }
    }

    /// One channel of a row ([`Normalize::channel_into`], the planar rows of a float
    /// interpolation): the table's bits for every method, a unit factor (torch's fused form)
    /// included, rows of every length around the vector width, every byte value.
    #[test]
    fn channel_rows_equal_the_table() {
        let mut norms = vec![crate::processors::torch_backend::fused_normalize(
            1.0 / 255.0,
            CLIP_MEAN,
            CLIP_STD,
        )];
        for (factor, mean, std) in [
            (1.0 / 255.0, CLIP_MEAN, CLIP_STD),
            (0.5, [100.0, -3.25, 0.1], [7.0, 0.001, 1e6]),
            (3.7, [1.0, 2.0, 3.0], [0.0, -1.0, 1e-30]),
        ] {
            norms.push(Normalize::new(Some(factor), Some((mean, std))));
        }
        let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, 255 - v, v / 3]).collect();
        for norm in &norms {
            let table = norm.clone().without_simd();
            for variant in variants(norm) {
                for n in [1, 7, 8, 9, 15, 16, 17, 100, 256] {
                    let pixels = &all[..3 * n];
                    for c in 0..3 {
                        let mut got = vec![f32::NAN; n];
                        variant.channel_into(pixels, c, &mut got);
                        let want: Vec<u32> = pixels
                            .chunks_exact(3)
                            .map(|px| table.value(c, px[c]).to_bits())
                            .collect();
                        let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "n {n}, c {c}");
                    }
                }
            }
        }
    }

    #[test]
    fn torch_fused_formula_is_the_table_with_and_without_simd() {
        for (factor, mean, std) in [
            (1.0 / 255.0, CLIP_MEAN, CLIP_STD),
            (0.00392156862745098, [0.5; 3], [0.5; 3]),
            (0.5, [100.0, -3.25, 0.1], [7.0, 0.001, 1e6]),
        ] {
            let fast = crate::processors::torch_backend::fused_normalize(factor, mean, std);
            let table = crate::processors::torch_backend::fused_f32_table(factor, mean, std);
            let inverse = (1.0 / factor) as f32;
            // torch: (x.float() - f32(mean) * f32(1/factor)) / (f32(std) * f32(1/factor))
            for c in 0..3 {
                for v in 0..=255u8 {
                    let want =
                        (f32::from(v) - mean[c] as f32 * inverse) / (std[c] as f32 * inverse);
                    assert_eq!(table[c][usize::from(v)].to_bits(), want.to_bits());
                    assert_eq!(fast.value(c, v).to_bits(), want.to_bits());
                }
            }
            let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
            let want = run(&fast.clone().without_simd(), &all);
            assert_eq!(run(&fast, &all), want, "factor {factor}");
            #[cfg(target_arch = "x86_64")]
            if let Some(formula) = &fast.simd {
                let mut literal = fast.clone();
                literal.simd = Some(formula.clone().with_method(avx2::Method::Literal));
                assert_eq!(run(&literal, &all), want, "factor {factor}");
            }
        }
    }

    /// Patch-shaped runs (several rows `stride` apart, stored twice `out_stride` apart) of every
    /// width around the one-window path (8–16 pixels, the last run ending at the end of the
    /// pixels; wider runs take the general path): the table's bits, for a unit factor (torch's
    /// fused form) and 1/255, each method.
    #[test]
    fn patch_runs_equal_the_table() {
        let mut configs = vec![Normalize::new(
            Some(1.0 / 255.0),
            Some((CLIP_MEAN, CLIP_STD)),
        )];
        configs.push(crate::processors::torch_backend::fused_normalize(
            1.0 / 255.0,
            CLIP_MEAN,
            CLIP_STD,
        ));
        configs.push(crate::processors::torch_backend::fused_normalize(
            0.5,
            [100.0, -3.25, 0.1],
            [7.0, 0.001, 1e6],
        ));
        for fast in configs {
            let table = fast.clone().without_simd();
            let variants = variants(&fast);
            for width in 8..=18 {
                let rows = 6;
                for gap in [0, 5, 40] {
                    let stride = 3 * width + gap;
                    let len = (rows - 1) * stride + 3 * width;
                    let pixels: Vec<u8> =
                        (0..len).map(|i| ((i * 113 + width) % 256) as u8).collect();
                    let runs = Runs {
                        width,
                        rows,
                        stride,
                        out_stride: width,
                    };
                    let plane = rows * width;
                    let copies = [[0, 2 * plane, 4 * plane], [plane, 3 * plane, 5 * plane]];
                    let mut want = vec![Out::new(f32::NAN); 6 * plane];
                    table.deinterleave_into(&pixels, runs, &mut want, &copies);
                    let want = bits(&want);
                    assert!(want.iter().all(|&b| !f32::from_bits(b).is_nan()));
                    for variant in &variants {
                        let mut got = vec![Out::new(f32::NAN); 6 * plane];
                        variant.deinterleave_into(&pixels, runs, &mut got, &copies);
                        let got = bits(&got);
                        assert_eq!(got, want, "width {width}, gap {gap}");
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fused_method_only_where_it_is_exact() {
        if !avx2::available() {
            return;
        }
        let method = |factor: f64, mean: [f64; 3], std: [f64; 3]| {
            let n = Normalize::new(Some(factor), Some((mean, std)));
            n.simd.as_ref().map(avx2::Formula::method)
        };
        // Every family's defaults: fused.
        for (mean, std) in [(CLIP_MEAN, CLIP_STD), ([0.5; 3], [0.5; 3])] {
            assert_eq!(method(1.0 / 255.0, mean, std), Some(avx2::Method::Fused));
        }
        // std 0: the fused reciprocal gives NaN where the division gives ±inf -> literal.
        assert_eq!(
            method(1.0 / 255.0, [0.5; 3], [0.0, 1.0, 1.0]),
            Some(avx2::Method::Literal)
        );
        // A factor whose fused rescale rounds v = 51 to the neighbouring f32 of the literal
        // one (0.32973742 instead of 0.3297374; found by searching a million random factors):
        // rejected, and the literal method gives the table's values.
        let factor = f64::from_bits(4_574_104_166_287_093_035);
        assert_eq!(
            method(factor, [0.0; 3], [1.0; 3]),
            Some(avx2::Method::Literal)
        );
        // Random configurations over 16 decades: whichever method is chosen reproduces the
        // table.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
        for config in [(factor, [0.0; 3], [1.0; 3])]
            .into_iter()
            .chain((0..300).map(|_| {
                let mut wide = || 10f64.powf(next() * 16.0 - 8.0);
                (wide(), [wide(), -wide(), wide()], [wide(), wide(), wide()])
            }))
        {
            let (factor, mean, std) = config;
            let n = Normalize::new(Some(factor), Some((mean, std)));
            let got = run(&n, &all);
            for (c, values) in got.iter().enumerate() {
                for (v, &bits) in (0..=255u8).zip(values) {
                    assert_eq!(bits, n.value(c, v).to_bits(), "{config:?}, c {c}, v {v}");
                }
            }
        }
    }

    /// Rescale alone runs the formula with mean 0 and std 1, which must give the table's bits
    /// (`f32(f64(v) · factor)`) for every input, by every kernel.
    #[test]
    fn rescale_alone_equals_the_table_for_every_input() {
        let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
        for factor in [
            1.0 / 255.0,
            0.5,
            1e-3,
            3.7,
            1.0 / 127.5,
            0.00392156862745098,
        ] {
            let fast = Normalize::new(Some(factor), None);
            #[cfg(target_arch = "x86_64")]
            assert_eq!(fast.simd.is_some(), avx2::available(), "factor {factor}");
            for variant in variants(&fast) {
                let got = run(&variant, &all);
                for (c, values) in got.iter().enumerate() {
                    for (v, &bits) in (0..=255u8).zip(values) {
                        let want = (f64::from(v) * factor) as f32;
                        assert_eq!(bits, want.to_bits(), "factor {factor}, c {c}, v {v}");
                    }
                }
            }
        }
    }

    #[test]
    fn chw_with_padding() {
        // 2x2 RGB image, crop 3x4 starting at (-1, -1): one zero row/column before.
        let data: Vec<u8> = (1..=12).collect();
        let src = RgbRef {
            data: &data,
            width: 2,
            height: 2,
        };
        let n = Normalize::new(None, None);
        let mut out = vec![Out::new(f32::NAN); 3 * 3 * 4];
        n.write_chw(src, -1, -1, 3, 4, &mut out);
        // SAFETY: every value was initialised (to NaN, then by write_chw).
        let out: Vec<f32> = out.iter().map(|v| unsafe { v.assume_init() }).collect();
        let r: Vec<f32> = out[..12].to_vec();
        assert_eq!(
            r,
            [0., 0., 0., 0., 0., 1., 4., 0., 0., 7., 10., 0.].map(|v: f32| v)
        );
        let b: Vec<f32> = out[24..].to_vec();
        assert_eq!(b, [0., 0., 0., 0., 0., 3., 6., 0., 0., 9., 12., 0.]);
        // A window entirely outside the image is all padding.
        let mut out = vec![Out::new(f32::NAN); 3 * 3 * 4];
        n.write_chw(src, 5, 5, 3, 4, &mut out);
        // SAFETY: as above.
        assert!(out.iter().all(|v| unsafe { v.assume_init() } == 0.0));
    }

    /// `ChwWriter`'s windows are `write_chw`'s values, bit for bit, as `float32` and as
    /// `bfloat16` (`f32_to_bf16` of them), at every offset of a cache line, for windows inside
    /// the image, across each of its edges, around it and wholly outside it, of widths around
    /// the 16-value vectors; the bytes around the output stay untouched.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn chw_writer_windows_are_write_chw_bit_for_bit() {
        use super::super::store::Element;
        use crate::tensor::convert::f32_to_bf16;
        let n = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        let Some(writer) = n.chw_writer() else {
            assert!(
                n.wide().is_none(),
                "no writer where the AVX-512 kernel runs"
            );
            return;
        };
        let (width, height) = (37, 23);
        let data: Vec<u8> = (0..3 * width * height)
            .map(|i| ((i * 193 + 11) % 256) as u8)
            .collect();
        let src = RgbRef {
            data: &data,
            width,
            height,
        };
        let windows: [(isize, isize, usize, usize); 9] = [
            (0, 0, 23, 37),   // the whole image
            (3, 5, 7, 16),    // inside, one vector a row
            (2, 1, 9, 33),    // inside, a partial vector a row
            (-4, -6, 30, 50), // around it
            (20, 30, 8, 17),  // across the bottom-right corner
            (-2, 10, 5, 1),   // one column, across the top
            (30, 0, 3, 19),   // wholly below
            (0, -40, 4, 20),  // wholly left
            (5, 2, 1, 64),    // one row, across the right edge
        ];
        for (top, left, h, w) in windows {
            let mut want = vec![Out::new(f32::NAN); 3 * h * w];
            n.write_chw(src, top, left, h, w, &mut want);
            // SAFETY: `write_chw` wrote every value.
            let want: Vec<f32> = want.iter().map(|v| unsafe { v.assume_init() }).collect();
            for element in [Element::F32, Element::Bf16] {
                let expected: Vec<u8> = match element {
                    Element::F32 => want.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    Element::Bf16 => want
                        .iter()
                        .flat_map(|v| f32_to_bf16(v.to_bits()).to_le_bytes())
                        .collect(),
                };
                let len = expected.len();
                for offset in 0..68 {
                    let mut buf = vec![std::mem::MaybeUninit::new(0xA5u8); offset + len + 70];
                    writer.write_chw(
                        src,
                        top,
                        left,
                        (h, w),
                        &mut buf[offset..offset + len],
                        element,
                    );
                    // SAFETY: every byte was initialised (to 0xA5, then maybe overwritten).
                    let got: Vec<u8> = buf.iter().map(|b| unsafe { b.assume_init() }).collect();
                    let window = (top, left, h, w);
                    assert!(
                        got[..offset].iter().all(|&b| b == 0xA5),
                        "{window:?} {element:?} at {offset}: bytes before the output written"
                    );
                    assert!(
                        got[offset + len..].iter().all(|&b| b == 0xA5),
                        "{window:?} {element:?} at {offset}: bytes after the output written"
                    );
                    assert!(
                        got[offset..offset + len] == expected[..],
                        "{window:?} {element:?} at {offset}: values differ"
                    );
                }
            }
        }
    }

    /// The two builds of the window kernel (`bfloat16` rounded with integer operations, and by
    /// the CPU) write the same bytes, where the CPU has both.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn chw_twins_write_the_same_bfloat16() {
        use super::super::store::{bf16_hardware, Element};
        let n = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        let (Some(wide), true) = (n.wide(), bf16_hardware()) else {
            return;
        };
        let data: Vec<u8> = (0..3 * 37 * 23)
            .map(|i| ((i * 59 + 1) % 256) as u8)
            .collect();
        let src = RgbRef {
            data: &data,
            width: 37,
            height: 23,
        };
        for (at, size) in [
            ((0, 0), (23, 37)),
            ((-4, -6), (30, 50)),
            ((20, 30), (8, 17)),
        ] {
            let len = 2 * 3 * size.0 * size.1;
            let mut a = vec![std::mem::MaybeUninit::new(1u8); len];
            let mut b = vec![std::mem::MaybeUninit::new(2u8); len];
            // SAFETY: `wide` and `bf16_hardware`: AVX-512 F, BW, VBMI, FMA and BF16.
            unsafe {
                avx512::write_chw(&wide, src, at, size, &mut a, Element::Bf16);
                avx512::write_chw_bf16(&wide, src, at, size, &mut b, Element::Bf16);
            }
            // SAFETY: every byte was initialised above.
            let (a, b): (Vec<u8>, Vec<u8>) = unsafe {
                (
                    a.iter().map(|x| x.assume_init()).collect(),
                    b.iter().map(|x| x.assume_init()).collect(),
                )
            };
            assert!(a == b, "{at:?} {size:?}");
        }
    }

    /// A normaliser whose values include subnormals is marked so (the CPU's `bfloat16` rounding
    /// would flush them), and its windows as `bfloat16` are still `f32_to_bf16` of its values;
    /// the usual ones are marked free of them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn subnormal_values_keep_the_integer_rounding() {
        use super::super::store::Element;
        use crate::tensor::convert::f32_to_bf16;
        let clip = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        if let Some(wide) = clip.wide() {
            assert!(wide.subnormal_free);
        }
        // Values of about 1e-38 (a huge std): some subnormal, some normal. The first of these
        // whose formula reproduces its table.
        let candidates = [3e37, 5e37, 1e38, 2e38, 3e38]
            .map(|std| Normalize::new(Some(1.0 / 255.0), Some(([0.5, 0.25, 0.75], [std; 3]))));
        let found = candidates.iter().find(|n| n.wide().is_some());
        let Some(tiny) = found else {
            assert!(!super::avx512::available(), "no candidate has the formula");
            return;
        };
        let wide = tiny.wide().expect("found by it");
        let values = (0..3).flat_map(|c| (0..=255u8).map(move |v| (c, v)));
        let subnormal = values
            .clone()
            .filter(|&(c, v)| tiny.value(c, v).is_subnormal())
            .count();
        assert!(
            subnormal > 0 && subnormal < 768,
            "{subnormal} subnormal values"
        );
        assert!(!wide.subnormal_free);
        let writer = tiny
            .chw_writer()
            .expect("a writer where there is a formula");
        let data: Vec<u8> = (0..3 * 20 * 20).map(|i| (i % 256) as u8).collect();
        let src = RgbRef {
            data: &data,
            width: 20,
            height: 20,
        };
        let mut want = vec![Out::new(f32::NAN); 3 * 20 * 20];
        tiny.write_chw(src, 0, 0, 20, 20, &mut want);
        let want: Vec<u8> = bits(&want)
            .into_iter()
            .flat_map(|b| f32_to_bf16(b).to_le_bytes())
            .collect();
        let mut got = vec![std::mem::MaybeUninit::new(0u8); want.len()];
        writer.write_chw(src, 0, 0, (20, 20), &mut got, Element::Bf16);
        // SAFETY: the writer wrote every byte.
        let got: Vec<u8> = got.iter().map(|b| unsafe { b.assume_init() }).collect();
        assert!(got == want, "subnormal values rounded wrongly");
    }

    /// Hostile geometry: corners at `isize::MIN`/`MAX` give windows of padding only (the scalar
    /// writer and the AVX-512 one alike), and an image whose size overflows `3 · width` is
    /// refused before anything is read.
    #[test]
    fn extreme_corners_and_sizes_are_padding_or_refused() {
        let n = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        let data = vec![9u8; 3 * 4 * 4];
        let src = RgbRef {
            data: &data,
            width: 4,
            height: 4,
        };
        let zero: Vec<u32> = (0..3).flat_map(|c| [n.value(c, 0).to_bits(); 6]).collect();
        for (top, left) in [
            (isize::MIN, 0),
            (0, isize::MIN),
            (isize::MAX, 0),
            (0, isize::MAX),
        ] {
            let mut out = vec![Out::new(f32::NAN); 3 * 2 * 3];
            n.write_chw(src, top, left, 2, 3, &mut out);
            let got = bits(&out);
            assert_eq!(got, zero, "({top}, {left})");
            #[cfg(target_arch = "x86_64")]
            if let Some(writer) = n.chw_writer() {
                let mut bytes = vec![std::mem::MaybeUninit::new(0u8); 4 * 3 * 2 * 3];
                let element = super::super::store::Element::F32;
                writer.write_chw(src, top, left, (2, 3), &mut bytes, element);
                let got: Vec<u32> = bytes
                    .chunks_exact(4)
                    .map(|b| {
                        // SAFETY: every byte was written.
                        let b: Vec<u8> = b.iter().map(|x| unsafe { x.assume_init() }).collect();
                        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                    })
                    .collect();
                assert_eq!(got, zero, "({top}, {left}), AVX-512");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(writer) = n.chw_writer() {
            // 3 · width wraps to 2: a 2-byte image would pass an unchecked size test.
            let wide_src = RgbRef {
                data: &data[..2],
                width: usize::MAX / 3 + 1,
                height: 1,
            };
            let refused = std::panic::catch_unwind(|| {
                let mut bytes = vec![std::mem::MaybeUninit::new(0u8); 4 * 3 * 8];
                let element = super::super::store::Element::F32;
                writer.write_chw(wide_src, 0, 0, (1, 8), &mut bytes, element);
            });
            assert!(refused.is_err(), "an image whose size overflows was read");
        }
    }

    /// The writer refuses an output of the wrong size before writing anything.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn chw_writer_refuses_a_wrong_output_size() {
        use super::super::store::Element;
        let n = Normalize::new(Some(1.0 / 255.0), Some(([0.5; 3], [0.5; 3])));
        let Some(writer) = n.chw_writer() else {
            return;
        };
        let data = vec![7u8; 3 * 4 * 4];
        let src = RgbRef {
            data: &data,
            width: 4,
            height: 4,
        };
        let result = std::panic::catch_unwind(|| {
            let mut out = vec![std::mem::MaybeUninit::new(0u8); 3 * 4 * 4 * 4 - 1];
            writer.write_chw(src, 0, 0, (4, 4), &mut out, Element::F32);
        });
        let message = result.expect_err("a short output was accepted");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("4x4 window of F32 into 191 bytes"), "{text}");
    }
}
