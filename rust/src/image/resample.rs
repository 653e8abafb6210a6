//! `Image.resize` of Pillow 13.0.0 for 8-bit images (`L`, `RGB`, `RGBX`), byte for byte.
//!
//! What Pillow does, and what this module reproduces:
//!
//! - Same size and no region: a copy. A region with integral corners whose size equals the
//!   output size: a crop (`_imaging.c`, `_resize`), whatever the filter.
//! - `NEAREST` never convolves: `_resize` builds the affine map `a = (box_w / out_w, 0, box_x0,
//!   0, box_h / out_h, box_y0)` and `ImagingScaleAffine` samples input pixel
//!   `(COORD(xo), COORD(yo))`, where `xo` starts at `box_x0 + a0 / 2` and **accumulates** `+= a0`
//!   per output column in `f64` (likewise `yo` per row), `COORD(v) = v < 0 ? -1 : (int)v`;
//!   positions outside the input leave zeros.
//! - Every other filter is `ImagingResample`: separable passes with the coefficients of
//!   [`crate::image::coeffs`], each writing a **`u8` image** (rounded, clamped) that the next
//!   pass reads. A pass is skipped when its axis is unchanged (`out == in` and the region spans
//!   the axis). Pillow 13 runs the vertical pass first iff `in_h − out_h > 0` and `in_h − out_h
//!   > 2·(in_w − out_w)` (`ImagingResampleInner`); Pillow ≤ 12.2 always runs horizontal first
//!   ([`PassOrder`]). The order changes the bytes because of the intermediate rounding.
//! - Channels are independent: RGB (stored by Pillow as 4 bytes per pixel) and 3-channel
//!   interleaved data give the same bytes. `RGBA`/`LA` are premultiplied by Pillow before
//!   resampling; this module does not do that (it resamples raw channels, like Pillow's `RGBX`).
//!
//! Execution: output rows are split into bands, one per thread. With the horizontal pass first,
//! a band computes only the intermediate rows its output rows read, into a small ring buffer
//! (rows shared by two bands are computed by both, to the same bytes); with the vertical pass
//! first, output rows go through a few row buffers, four at a time. Nothing the size of an
//! intermediate image is allocated. Results never depend on the thread count or the
//! instruction set.

use std::fmt;
use std::sync::Mutex;

use super::coeffs::{axis_coeffs, AxisCoeffs};
use super::filters::Filter;
use super::kernels::{vertical_row, Horizontal, Isa, MAX_ROWS};

/// Largest accepted width or height, of the input and of the output.
pub const MAX_SIDE: usize = 1 << 16;
/// Largest accepted image, input or output, in bytes.
pub const MAX_BYTES: usize = i32::MAX as usize;

/// Which Pillow decides the order of the two passes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PassOrder {
    /// Pillow 13.0: vertical first iff `in_h − out_h > 0` and `in_h − out_h > 2·(in_w − out_w)`.
    #[default]
    Pillow13,
    /// Pillow ≤ 12.2: always horizontal, then vertical.
    Pillow12,
}

impl PassOrder {
    /// The order of a name: `pillow13` or `pillow12`.
    pub fn from_name(name: &str) -> Option<PassOrder> {
        match name {
            "pillow13" => Some(PassOrder::Pillow13),
            "pillow12" => Some(PassOrder::Pillow12),
            _ => None,
        }
    }

    /// The name (`pillow13`, `pillow12`).
    pub fn name(self) -> &'static str {
        match self {
            PassOrder::Pillow13 => "pillow13",
            PassOrder::Pillow12 => "pillow12",
        }
    }

    /// Whether the horizontal pass runs first for this resize.
    pub fn horizontal_first(self, in_w: usize, in_h: usize, out_w: usize, out_h: usize) -> bool {
        match self {
            PassOrder::Pillow12 => true,
            PassOrder::Pillow13 => {
                let dh = in_h as i64 - out_h as i64;
                let dw = in_w as i64 - out_w as i64;
                !(dh > 0 && dh > dw * 2)
            }
        }
    }
}

/// How to resize.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResizeOptions {
    /// The filter (default bicubic, as Pillow's).
    pub filter: Filter,
    /// The pass order (default Pillow 13's).
    pub pass_order: PassOrder,
    /// Pillow's `box`: the source region `(left, top, right, bottom)`, in input pixels, as the
    /// single-precision floats Pillow converts it to. `None` is the whole image.
    pub region: Option<[f32; 4]>,
    /// Threads (at most [`MAX_THREADS`]): 0 picks one per core when the image is large enough
    /// to gain from it.
    pub threads: usize,
    /// Use SIMD kernels when the CPU has them (the output is the same either way).
    pub simd: bool,
}

impl Default for ResizeOptions {
    fn default() -> Self {
        ResizeOptions {
            filter: Filter::Bicubic,
            pass_order: PassOrder::Pillow13,
            region: None,
            threads: 0,
            simd: true,
        }
    }
}

/// An interleaved 8-bit image: `height` rows of `width × channels` bytes, no padding.
#[derive(Clone, Copy, Debug)]
pub struct ImageRef<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
    pub channels: usize,
}

/// Why a resize was refused. Every message names the numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum ResampleError {
    /// A channel count other than 1, 3 or 4.
    Channels { channels: usize },
    /// An input with no pixels.
    EmptyInput { width: usize, height: usize },
    /// An output size that is zero or negative.
    OutputSize { width: i64, height: i64 },
    /// An input or output beyond [`MAX_SIDE`] per side or [`MAX_BYTES`] in total.
    TooLarge {
        what: &'static str,
        width: usize,
        height: usize,
        channels: usize,
    },
    /// Input data whose length is not `width × height × channels`.
    DataLength { expected: usize, actual: usize },
    /// A destination whose length is not `out_width × out_height × channels`.
    DestinationLength { expected: usize, actual: usize },
    /// A `box` Pillow rejects (negative offset, beyond the image, empty, not finite).
    Region {
        region: [f32; 4],
        width: usize,
        height: usize,
        reason: &'static str,
    },
    /// A buffer of `bytes` bytes (sized by the input or output) could not be allocated.
    OutOfMemory { what: &'static str, bytes: u64 },
}

impl fmt::Display for ResampleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResampleError::Channels { channels } => write!(
                f,
                "image has {channels} channels; expected 1, 3 or 4 (HxW or HxWxC uint8)"
            ),
            ResampleError::EmptyInput { width, height } => {
                write!(f, "input image is empty ({width}x{height})")
            }
            ResampleError::OutputSize { width, height } => write!(
                f,
                "output size must be positive: got width {width}, height {height}"
            ),
            ResampleError::TooLarge {
                what,
                width,
                height,
                channels,
            } => write!(
                f,
                "{what} image {width}x{height}x{channels} is too large (at most {MAX_SIDE} per \
                 side and {MAX_BYTES} bytes)"
            ),
            ResampleError::DataLength { expected, actual } => write!(
                f,
                "input data has {actual} bytes; width x height x channels is {expected}"
            ),
            ResampleError::DestinationLength { expected, actual } => write!(
                f,
                "destination has {actual} bytes; the output needs {expected}"
            ),
            ResampleError::Region {
                region: [l, t, r, b],
                width,
                height,
                reason,
            } => write!(
                f,
                "box ({l}, {t}, {r}, {b}) of a {width}x{height} image: {reason}"
            ),
            ResampleError::OutOfMemory { what, bytes } => write!(
                f,
                "out of memory: cannot allocate {bytes} bytes for the {what}"
            ),
        }
    }
}

impl std::error::Error for ResampleError {}

impl ResampleError {
    /// The error for a failed allocation of the buffer for `what` (for `map_err`).
    pub fn oom(what: &'static str) -> impl FnOnce(crate::memory::AllocError) -> Self {
        move |e| ResampleError::OutOfMemory {
            what,
            bytes: e.bytes,
        }
    }
}

/// Checks an output size given as signed integers (as Python passes it).
pub fn output_size(width: i64, height: i64) -> Result<(usize, usize), ResampleError> {
    if width < 1 || height < 1 {
        return Err(ResampleError::OutputSize { width, height });
    }
    // Beyond `usize` is beyond MAX_SIDE too: `check` refuses it.
    let side = |v: i64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok((side(width), side(height)))
}

fn check_dims(what: &'static str, w: usize, h: usize, c: usize) -> Result<usize, ResampleError> {
    let too_large = ResampleError::TooLarge {
        what,
        width: w,
        height: h,
        channels: c,
    };
    if w > MAX_SIDE || h > MAX_SIDE {
        return Err(too_large);
    }
    match w.checked_mul(h).and_then(|n| n.checked_mul(c)) {
        Some(n) if n <= MAX_BYTES => Ok(n),
        _ => Err(too_large),
    }
}

/// Validates an input image and output size; returns the output length in bytes.
pub fn check(src: &ImageRef<'_>, out_w: usize, out_h: usize) -> Result<usize, ResampleError> {
    if !matches!(src.channels, 1 | 3 | 4) {
        return Err(ResampleError::Channels {
            channels: src.channels,
        });
    }
    if out_w == 0 || out_h == 0 {
        return Err(ResampleError::OutputSize {
            width: out_w as i64,
            height: out_h as i64,
        });
    }
    let in_len = check_dims("input", src.width, src.height, src.channels)?;
    if src.width == 0 || src.height == 0 {
        return Err(ResampleError::EmptyInput {
            width: src.width,
            height: src.height,
        });
    }
    if src.data.len() != in_len {
        return Err(ResampleError::DataLength {
            expected: in_len,
            actual: src.data.len(),
        });
    }
    check_dims("output", out_w, out_h, src.channels)
}

/// [`check`], and that `dst` is exactly the output's length.
pub(crate) fn check_destination(
    src: &ImageRef<'_>,
    dst: &[u8],
    out_w: usize,
    out_h: usize,
) -> Result<(), ResampleError> {
    let len = check(src, out_w, out_h)?;
    if dst.len() != len {
        return Err(ResampleError::DestinationLength {
            expected: len,
            actual: dst.len(),
        });
    }
    Ok(())
}

fn check_region(region: [f32; 4], w: usize, h: usize) -> Result<(), ResampleError> {
    let [l, t, r, b] = region;
    let err = |reason| ResampleError::Region {
        region,
        width: w,
        height: h,
        reason,
    };
    if !region.iter().all(|v| v.is_finite()) {
        return Err(err("coordinates must be finite"));
    }
    // Pillow's checks and messages, in its order.
    if l < 0.0 || t < 0.0 {
        return Err(err("box offset can't be negative"));
    }
    if r > w as f32 || b > h as f32 {
        return Err(err("box can't exceed original image size"));
    }
    if r - l < 0.0 || b - t < 0.0 {
        return Err(err("box can't be empty"));
    }
    Ok(())
}

/// Resizes `src` to `out_w × out_h` into a new buffer.
pub fn resize(
    src: &ImageRef<'_>,
    out_w: usize,
    out_h: usize,
    options: &ResizeOptions,
) -> Result<Vec<u8>, ResampleError> {
    let len = check(src, out_w, out_h)?;
    let mut out =
        crate::memory::fallible::zeros(len).map_err(ResampleError::oom("resized image"))?;
    resize_into(src, &mut out, out_w, out_h, options)?;
    Ok(out)
}

/// Resizes `src` to `out_w × out_h` into `dst` (exactly `out_w × out_h × channels` bytes).
pub fn resize_into(
    src: &ImageRef<'_>,
    dst: &mut [u8],
    out_w: usize,
    out_h: usize,
    options: &ResizeOptions,
) -> Result<(), ResampleError> {
    check_destination(src, dst, out_w, out_h)?;
    let (w, h) = (src.width, src.height);
    let full = [0.0, 0.0, w as f32, h as f32];
    let region = options.region.unwrap_or(full);
    check_region(region, w, h)?;

    // Image.resize: same size, whole image -> copy.
    if (out_w, out_h) == (w, h) && region == full {
        dst.copy_from_slice(src.data);
        return Ok(());
    }
    // _resize: integral box corners and box size == output size -> crop.
    let [l, t, r, b] = region;
    if l.trunc() == l && t.trunc() == t && r - l == out_w as f32 && b - t == out_h as f32 {
        crop(src, dst, l as usize, t as usize, out_w, out_h);
        return Ok(());
    }
    if options.filter == Filter::Nearest {
        nearest(src, dst, out_w, out_h, region);
        return Ok(());
    }

    // ImagingResampleInner, literally (`box[2] != xsize` compares with the output size; when
    // it matters, out_w == w).
    let need_h = out_w != w || l != 0.0 || r != out_w as f32;
    let need_v = out_h != h || t != 0.0 || b != out_h as f32;
    run_passes(
        src,
        dst,
        Passes {
            horizontal: need_h.then(|| axis_coeffs(w, l, r, out_w, options.filter)),
            vertical: need_v.then(|| axis_coeffs(h, t, b, out_h, options.filter)),
            out_w,
            out_h,
            horizontal_first: options.pass_order.horizontal_first(w, h, out_w, out_h),
        },
        options.threads,
        options.simd,
    );
    Ok(())
}

/// The separable passes of one resize: 22-bit fixed-point coefficients per axis (`None`: the
/// axis keeps its size), and their order.
pub(crate) struct Passes {
    pub horizontal: Option<AxisCoeffs>,
    pub vertical: Option<AxisCoeffs>,
    pub out_w: usize,
    pub out_h: usize,
    pub horizontal_first: bool,
}

/// Runs `passes` over `src` into `dst` (`out_w × out_h × channels` bytes, checked by the
/// caller), on `threads` threads (0: as many as pay), SIMD when `simd` and available. Each
/// output byte is `clamp((2²¹ + Σ wᵢ·xᵢ) >> 22, 0, 255)` per pass, whatever the kernel.
pub(crate) fn run_passes(
    src: &ImageRef<'_>,
    dst: &mut [u8],
    passes: Passes,
    threads: usize,
    simd: bool,
) {
    let isa = if simd { Isa::detect() } else { Isa::Scalar };
    let c = src.channels;
    let (out_w, out_h) = (passes.out_w, passes.out_h);
    debug_assert_eq!(dst.len(), out_w * out_h * c);
    if passes.horizontal.is_none() && passes.vertical.is_none() {
        dst.copy_from_slice(src.data);
        return;
    }
    let plan = Plan {
        src: *src,
        out_w,
        horizontal: passes.horizontal.map(|h| Horizontal::new(h, c, isa)),
        vertical: passes.vertical,
        horizontal_first: passes.horizontal_first,
        isa,
    };
    let threads = plan.threads(threads);
    let row_len = out_w * c;
    let rows_per_band = out_h.div_ceil(threads);
    // Each band is taken once, by a spawned thread or, for the first band and any band whose
    // thread could not be spawned (`spawn_scoped` reports that instead of panicking), by the
    // calling thread.
    let bands: Vec<Mutex<Option<&mut [u8]>>> = dst
        .chunks_mut(rows_per_band * row_len)
        .map(|band| Mutex::new(Some(band)))
        .collect();
    let run = |i: usize| {
        let band = bands[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(band) = band {
            plan.band(i * rows_per_band, band);
        }
    };
    run_bands(bands.len(), run);
}

fn crop(src: &ImageRef<'_>, dst: &mut [u8], x0: usize, y0: usize, out_w: usize, out_h: usize) {
    let c = src.channels;
    let in_row = src.width * c;
    let out_row = out_w * c;
    for (y, row) in dst.chunks_exact_mut(out_row).enumerate().take(out_h) {
        let at = (y0 + y) * in_row + x0 * c;
        row.copy_from_slice(&src.data[at..at + out_row]);
    }
}

/// Pillow's `COORD`: −1 for negative values, else truncation.
fn coord(v: f64) -> i64 {
    if v < 0.0 {
        -1
    } else {
        v as i64
    }
}

/// `Image.resize(..., NEAREST)`: `ImagingScaleAffine` with Pillow's accumulated positions.
fn nearest(src: &ImageRef<'_>, dst: &mut [u8], out_w: usize, out_h: usize, region: [f32; 4]) {
    let (w, h, c) = (src.width, src.height, src.channels);
    let [l, t, r, b] = region;
    let a0 = f64::from(r - l) / out_w as f64;
    let a4 = f64::from(b - t) / out_h as f64;
    // Column table: xintab, with Pillow's [xmin, xmax) span of valid columns.
    let mut xintab = vec![0usize; out_w];
    let (mut xmin, mut xmax) = (out_w, 0);
    let mut xo = f64::from(l) + a0 * 0.5;
    for (x, slot) in xintab.iter_mut().enumerate() {
        let xin = coord(xo);
        if xin >= 0 && (xin as usize) < w {
            xmax = x + 1;
            xmin = xmin.min(x);
            *slot = xin as usize;
        }
        xo += a0;
    }
    let mut yo = f64::from(t) + a4 * 0.5;
    let in_row = w * c;
    for row in dst.chunks_exact_mut(out_w * c) {
        let yi = coord(yo);
        yo += a4;
        row.fill(0);
        if yi < 0 || yi as usize >= h {
            continue;
        }
        let line = &src.data[yi as usize * in_row..(yi as usize + 1) * in_row];
        let span = &mut row[xmin * c..xmax.max(xmin) * c];
        for (px, &xin) in span.chunks_exact_mut(c).zip(&xintab[xmin..]) {
            px.copy_from_slice(&line[xin * c..(xin + 1) * c]);
        }
    }
}

/// Everything one resize needs, shared read-only by the band threads.
struct Plan<'a> {
    src: ImageRef<'a>,
    out_w: usize,
    horizontal: Option<Horizontal>,
    vertical: Option<AxisCoeffs>,
    horizontal_first: bool,
    isa: Isa,
}

/// The most threads one resize starts, whatever is requested.
pub const MAX_THREADS: usize = 64;

/// Below this many multiply-adds a resize runs on one thread (a thread costs ~30 µs to start).
const WORK_PER_THREAD: usize = 1 << 20;

impl Plan<'_> {
    /// Threads for this resize: `requested` (at most [`MAX_THREADS`]), or with 0 as many as the
    /// work pays for, at most one per core; never more than one per output row.
    fn threads(&self, requested: usize) -> usize {
        let out_h = self
            .vertical
            .as_ref()
            .map_or(self.src.height, |v| v.out_len());
        let wanted = if requested == 0 {
            let cores = crate::cores::count();
            // Multiply-adds of both passes, estimated with the widest kernels.
            let c = self.src.channels;
            let hw = self
                .horizontal
                .as_ref()
                .map_or(0, |hz| hz.out_row_len() * self.src.height * 4);
            let vw = self.vertical.as_ref().map_or(0, |v| {
                v.out_len() * v.max_count() * self.out_w.max(self.src.width) * c
            });
            ((hw + vw) / WORK_PER_THREAD).min(cores)
        } else {
            requested.min(MAX_THREADS)
        };
        wanted.min(out_h).max(1)
    }

    /// Computes output rows `y0..` (as many as `band` holds) into `band`.
    fn band(&self, y0: usize, band: &mut [u8]) {
        let c = self.src.channels;
        let in_row = self.src.width * c;
        let out_row = self.out_w * c;
        let data = self.src.data;
        // Input row r alone, and row r with whatever follows it in the image (the horizontal
        // kernels may read past a row's end; the bytes there never change a result).
        let row = |r: usize| &data[r * in_row..(r + 1) * in_row];
        let tail = |r: usize| &data[r * in_row..];
        match (&self.horizontal, &self.vertical) {
            (Some(hz), None) => {
                for (k, chunk) in band.chunks_mut(MAX_ROWS * out_row).enumerate() {
                    let y = y0 + k * MAX_ROWS;
                    let (mut outs, n) = split_rows(chunk, out_row);
                    let srcs: [&[u8]; MAX_ROWS] =
                        std::array::from_fn(|i| if i < n { tail(y + i) } else { &[] });
                    hz.rows_dyn(&srcs[..n], &mut outs[..n]);
                }
            }
            (None, Some(v)) => {
                for (y, out) in (y0..).zip(band.chunks_exact_mut(out_row)) {
                    let (start, weights) = v.taps(y);
                    with_rows(
                        weights.len(),
                        |t| row(start + t),
                        |rows| {
                            vertical_row(self.isa, rows, weights, out);
                        },
                    );
                }
            }
            (Some(hz), Some(v)) if self.horizontal_first => self.band_h_first(hz, v, y0, band),
            (Some(hz), Some(v)) => {
                // Vertical first: up to MAX_ROWS output rows at a time, each a vertical row of
                // full input width into a row buffer (padded for the SIMD loads), then all of
                // them horizontally.
                let padded = hz.padded_len(in_row);
                let mut tmp = vec![0u8; MAX_ROWS * padded];
                for (k, chunk) in band.chunks_mut(MAX_ROWS * out_row).enumerate() {
                    let y = y0 + k * MAX_ROWS;
                    let (mut outs, n) = split_rows(chunk, out_row);
                    for (i, buf) in tmp.chunks_exact_mut(padded).take(n).enumerate() {
                        let (start, weights) = v.taps(y + i);
                        with_rows(
                            weights.len(),
                            |t| row(start + t),
                            |rows| {
                                vertical_row(self.isa, rows, weights, &mut buf[..in_row]);
                            },
                        );
                    }
                    let mut bufs = tmp.chunks_exact(padded);
                    let srcs: [&[u8]; MAX_ROWS] =
                        std::array::from_fn(|_| bufs.next().unwrap_or(&[]));
                    hz.rows_dyn(&srcs[..n], &mut outs[..n]);
                }
            }
            (None, None) => unreachable!("a resize with no pass is a copy or a crop"),
        }
    }

    /// Horizontal first: intermediate rows (output width) are computed once each, in order, up
    /// to [`MAX_ROWS`] at a time, into a ring of row buffers as the output rows need them.
    ///
    /// The ring has `max_count + MAX_ROWS − 1` slots: when output row `y` needs rows
    /// `start..end` (at most `max_count`), the newest computed row is at most `end + MAX_ROWS −
    /// 2` (a batch starts below `end`), so the ring still holds every row from `end −
    /// max_count ≤ start` on. Rows computed ahead are read by later output rows or never.
    fn band_h_first(&self, hz: &Horizontal, v: &AxisCoeffs, y0: usize, band: &mut [u8]) {
        let c = self.src.channels;
        let in_row = self.src.width * c;
        let mid_row = self.out_w * c;
        let data = self.src.data;
        let height = self.src.height;
        let slots = v.max_count() + MAX_ROWS - 1;
        let mut ring: Vec<Vec<u8>> = vec![Vec::new(); slots];
        let mut next = 0usize; // first intermediate row not yet computed
        for (y, out) in (y0..).zip(band.chunks_exact_mut(mid_row)) {
            let (start, weights) = v.taps(y);
            let end = start + weights.len();
            let mut r = next.max(start);
            while r < end {
                let n = MAX_ROWS.min(height - r);
                // Move the slots' buffers out, fill them, and put them back.
                let mut outs: [Vec<u8>; MAX_ROWS] = std::array::from_fn(|i| {
                    if i < n {
                        let mut b = std::mem::take(&mut ring[(r + i) % slots]);
                        b.resize(mid_row, 0);
                        b
                    } else {
                        Vec::new()
                    }
                });
                let srcs: [&[u8]; MAX_ROWS] = std::array::from_fn(|i| {
                    if i < n {
                        &data[(r + i) * in_row..]
                    } else {
                        &[]
                    }
                });
                let mut refs = outs.each_mut().map(|b| b.as_mut_slice());
                hz.rows_dyn(&srcs[..n], &mut refs[..n]);
                for (i, b) in outs.into_iter().take(n).enumerate() {
                    ring[(r + i) % slots] = b;
                }
                r += n;
            }
            next = next.max(r);
            with_rows(
                weights.len(),
                |t| &ring[(start + t) % slots][..],
                |rows| {
                    vertical_row(self.isa, rows, weights, out);
                },
            );
        }
    }
}

/// Splits up to [`MAX_ROWS`] rows of `len` bytes off `chunk`: the rows and their count.
fn split_rows(chunk: &mut [u8], len: usize) -> ([&mut [u8]; MAX_ROWS], usize) {
    let mut rows = chunk.chunks_exact_mut(len);
    let mut n = 0;
    let out = std::array::from_fn(|_| match rows.next() {
        Some(r) => {
            n += 1;
            r
        }
        None => <&mut [u8]>::default(),
    });
    (out, n)
}

/// Calls `f` with the `n` rows `row(0..n)`, gathered on the stack when there are few.
fn with_rows<'a, T>(
    n: usize,
    row: impl Fn(usize) -> &'a [u8],
    f: impl FnOnce(&[&'a [u8]]) -> T,
) -> T {
    const STACK: usize = 16;
    if n <= STACK {
        let rows: [&[u8]; STACK] = std::array::from_fn(|t| if t < n { row(t) } else { &[] });
        f(&rows[..n])
    } else {
        let rows: Vec<&[u8]> = (0..n).map(row).collect();
        f(&rows)
    }
}

/// Runs `run(0..count)` on up to `count` threads: bands 1.. on spawned threads, then every band
/// on the calling thread too; `run` takes each band once (a band already taken is skipped), so a
/// thread that could not be spawned (`spawn_scoped` reports it instead of panicking) only leaves
/// more work to the calling thread.
pub(crate) fn run_bands(count: usize, run: impl Fn(usize) + Sync) {
    std::thread::scope(|scope| {
        for i in 1..count {
            let run = &run;
            if std::thread::Builder::new()
                .spawn_scoped(scope, move || run(i))
                .is_err()
            {
                break;
            }
        }
        for i in 0..count {
            run(i);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::coeffs::ROUNDING;
    use crate::image::scalar::clip8;

    /// Deterministic pseudo-random bytes (xorshift64*).
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    }

    /// A literal transcription of Pillow's two passes over whole images (u8 intermediate
    /// image, horizontal pass restricted to no rows): the oracle for the optimised code.
    fn reference(
        src: &ImageRef<'_>,
        out_w: usize,
        out_h: usize,
        filter: Filter,
        order: PassOrder,
    ) -> Vec<u8> {
        let (w, h, c) = (src.width, src.height, src.channels);
        let hpass = |data: &[u8], rows: usize| -> Vec<u8> {
            let k = axis_coeffs(w, 0.0, w as f32, out_w, filter);
            let mut out = vec![0u8; rows * out_w * c];
            for y in 0..rows {
                for x in 0..out_w {
                    let (start, ws) = k.taps(x);
                    for ch in 0..c {
                        let mut acc = ROUNDING;
                        for (t, &wt) in ws.iter().enumerate() {
                            acc += i32::from(data[(y * w + start + t) * c + ch]) * wt;
                        }
                        out[(y * out_w + x) * c + ch] = clip8(acc);
                    }
                }
            }
            out
        };
        let vpass = |data: &[u8], width: usize| -> Vec<u8> {
            let k = axis_coeffs(h, 0.0, h as f32, out_h, filter);
            let mut out = vec![0u8; out_h * width * c];
            for y in 0..out_h {
                let (start, ws) = k.taps(y);
                for i in 0..width * c {
                    let mut acc = ROUNDING;
                    for (t, &wt) in ws.iter().enumerate() {
                        acc += i32::from(data[(start + t) * width * c + i]) * wt;
                    }
                    out[y * width * c + i] = clip8(acc);
                }
            }
            out
        };
        let (nh, nv) = (out_w != w, out_h != h);
        if order.horizontal_first(w, h, out_w, out_h) {
            let mid = if nh {
                hpass(src.data, h)
            } else {
                src.data.to_vec()
            };
            if nv {
                vpass(&mid, out_w)
            } else {
                mid
            }
        } else {
            let mid = if nv {
                vpass(src.data, w)
            } else {
                src.data.to_vec()
            };
            if nh {
                hpass(&mid, out_h)
            } else {
                mid
            }
        }
    }

    const CONV: [Filter; 5] = [
        Filter::Box,
        Filter::Bilinear,
        Filter::Hamming,
        Filter::Bicubic,
        Filter::Lanczos,
    ];

    fn sizes() -> Vec<((usize, usize), (usize, usize))> {
        vec![
            ((512, 60), (504, 58)),
            ((37, 23), (91, 47)),
            ((100, 40), (33, 39)),
            ((40, 100), (39, 33)),
            ((30, 200), (60, 50)),
            ((1, 30), (7, 90)),
            ((200, 3), (3, 3)),
            ((7, 7), (1, 1)),
            ((1, 1), (5, 3)),
            ((64, 64), (64, 17)),
            ((64, 64), (17, 64)),
            ((50, 9), (13, 9)),
            ((10, 10), (10, 11)),
            ((600, 20), (61, 20)),
            ((20, 160), (20, 13)),
        ]
    }

    #[test]
    fn matches_the_literal_transcription() {
        for (i, ((w, h), (ow, oh))) in sizes().into_iter().enumerate() {
            for c in [1, 3, 4] {
                let data = noise(w * h * c, i as u64 * 7 + c as u64);
                let src = ImageRef {
                    data: &data,
                    width: w,
                    height: h,
                    channels: c,
                };
                for filter in CONV {
                    for order in [PassOrder::Pillow13, PassOrder::Pillow12] {
                        let want = reference(&src, ow, oh, filter, order);
                        for simd in [false, true] {
                            for threads in [1, 3] {
                                let opts = ResizeOptions {
                                    filter,
                                    pass_order: order,
                                    region: None,
                                    threads,
                                    simd,
                                };
                                let got = resize(&src, ow, oh, &opts).unwrap();
                                assert!(
                                    got == want,
                                    "{w}x{h}x{c} -> {ow}x{oh} {filter} {order:?} simd={simd} threads={threads}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn simd_and_threads_equal_scalar_on_many_shapes() {
        // Deterministic sweep: widths and heights around SIMD chunk boundaries, every channel
        // count, up- and downscales up to 8x (lanes with fewer than four samples).
        let mut seed = 1u64;
        for &(w, ow) in &[
            (1, 1),
            (5, 3),
            (31, 32),
            (33, 16),
            (64, 9),
            (97, 130),
            (250, 31),
            (16, 125),
        ] {
            for &(h, oh) in &[(2, 5), (40, 37), (9, 1), (70, 70)] {
                for c in [1, 3, 4] {
                    seed += 1;
                    let data = noise(w * h * c, seed);
                    let src = ImageRef {
                        data: &data,
                        width: w,
                        height: h,
                        channels: c,
                    };
                    for filter in CONV {
                        let base = ResizeOptions {
                            filter,
                            threads: 1,
                            simd: false,
                            ..Default::default()
                        };
                        if (w, h) == (ow, oh) {
                            continue;
                        }
                        let want = resize(&src, ow, oh, &base).unwrap();
                        for threads in [1, 2, 5] {
                            let opts = ResizeOptions {
                                threads,
                                simd: true,
                                ..base
                            };
                            assert_eq!(
                                resize(&src, ow, oh, &opts).unwrap(),
                                want,
                                "{w}x{h}x{c}->{ow}x{oh} {filter} t{threads}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn random_shapes_filters_and_regions_agree_across_kernels() {
        // 400 deterministic random cases: sizes 1..90 in, 1..130 out, every channel count and
        // filter, a quarter with a fractional region. SIMD with 1 to 4 threads must equal the
        // scalar kernel on one thread; without a region, both must equal the transcription.
        let mut s = 0x853c_49e6_748f_ea9bu64;
        let mut next = |n: usize| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % n as u64) as usize
        };
        for case in 0..400 {
            let (w, h) = (1 + next(90), 1 + next(90));
            let (ow, oh) = (1 + next(130), 1 + next(130));
            let c = [1, 3, 4][next(3)];
            let filter = Filter::ALL[next(6)];
            let order = [PassOrder::Pillow13, PassOrder::Pillow12][next(2)];
            let region = (next(4) == 0).then(|| {
                let l = next(w * 4) as f32 / 8.0;
                let t = next(h * 4) as f32 / 8.0;
                let r = l + next(((w as f32 - l) * 8.0) as usize + 1) as f32 / 8.0;
                let b = t + next(((h as f32 - t) * 8.0) as usize + 1) as f32 / 8.0;
                [l, t, r.min(w as f32), b.min(h as f32)]
            });
            let data = noise(w * h * c, case);
            let src = ImageRef {
                data: &data,
                width: w,
                height: h,
                channels: c,
            };
            let base = ResizeOptions {
                filter,
                pass_order: order,
                region,
                threads: 1,
                simd: false,
            };
            let want = resize(&src, ow, oh, &base).unwrap();
            if region.is_none() && filter != Filter::Nearest && (w, h) != (ow, oh) {
                assert_eq!(want, reference(&src, ow, oh, filter, order), "case {case}");
            }
            let threads = 1 + next(4);
            let fast = ResizeOptions {
                simd: true,
                threads,
                ..base
            };
            assert_eq!(
                resize(&src, ow, oh, &fast).unwrap(),
                want,
                "case {case}: {w}x{h}x{c} -> {ow}x{oh} {filter} {order:?} {region:?} t{threads}"
            );
        }
    }

    #[test]
    fn identity_copies_and_integral_box_crops() {
        let data = noise(6 * 5 * 3, 9);
        let src = ImageRef {
            data: &data,
            width: 6,
            height: 5,
            channels: 3,
        };
        for filter in Filter::ALL {
            let opts = ResizeOptions {
                filter,
                ..Default::default()
            };
            assert_eq!(resize(&src, 6, 5, &opts).unwrap(), data);
            let crop = ResizeOptions {
                region: Some([1.0, 2.0, 4.0, 5.0]),
                ..opts
            };
            let got = resize(&src, 3, 3, &crop).unwrap();
            for y in 0..3 {
                assert_eq!(
                    &got[y * 9..y * 9 + 9],
                    &data[((y + 2) * 6 + 1) * 3..((y + 2) * 6 + 4) * 3]
                );
            }
        }
    }

    #[test]
    fn one_axis_only_touches_that_axis() {
        // Only the width changes: each row is resampled independently; rows stay rows.
        let data = noise(40 * 3, 3);
        let src = ImageRef {
            data: &data,
            width: 40,
            height: 3,
            channels: 1,
        };
        let got = resize(&src, 13, 3, &ResizeOptions::default()).unwrap();
        for y in 0..3 {
            let row = ImageRef {
                data: &data[y * 40..(y + 1) * 40],
                width: 40,
                height: 1,
                channels: 1,
            };
            assert_eq!(
                &got[y * 13..(y + 1) * 13],
                &resize(&row, 13, 1, &ResizeOptions::default()).unwrap()[..]
            );
        }
    }

    #[test]
    fn constant_images_stay_constant() {
        for c in [1, 3, 4] {
            let data = vec![77u8; 33 * 21 * c];
            let src = ImageRef {
                data: &data,
                width: 33,
                height: 21,
                channels: c,
            };
            for filter in Filter::ALL {
                for (ow, oh) in [(5, 7), (70, 50), (33, 2)] {
                    let opts = ResizeOptions {
                        filter,
                        ..Default::default()
                    };
                    let got = resize(&src, ow, oh, &opts).unwrap();
                    assert!(got.iter().all(|&v| v == 77), "{filter} {c} {ow}x{oh}");
                }
            }
        }
    }

    #[test]
    fn nearest_samples_pillow_positions() {
        // 4 -> 3 columns: a0 = 4/3, positions 0.667, 2.0, 3.333 -> columns 0, 2, 3.
        let data: Vec<u8> = (0..4).collect();
        let src = ImageRef {
            data: &data,
            width: 4,
            height: 1,
            channels: 1,
        };
        let opts = ResizeOptions {
            filter: Filter::Nearest,
            ..Default::default()
        };
        assert_eq!(resize(&src, 3, 1, &opts).unwrap(), vec![0, 2, 3]);
        // 3 -> 7: a0 = 3/7, positions 0.214 + k·0.4286 -> 0,0,1,1,1,2,2.
        let data: Vec<u8> = vec![10, 20, 30];
        let src = ImageRef {
            data: &data,
            width: 3,
            height: 1,
            channels: 1,
        };
        assert_eq!(
            resize(&src, 7, 1, &opts).unwrap(),
            vec![10, 10, 20, 20, 20, 30, 30]
        );
    }

    #[test]
    fn errors_name_the_numbers() {
        let data = vec![0u8; 12];
        let src = ImageRef {
            data: &data,
            width: 2,
            height: 2,
            channels: 3,
        };
        let opts = ResizeOptions::default();
        assert_eq!(
            resize(&src, 0, 3, &opts),
            Err(ResampleError::OutputSize {
                width: 0,
                height: 3
            })
        );
        assert_eq!(
            output_size(-4, 3),
            Err(ResampleError::OutputSize {
                width: -4,
                height: 3
            })
        );
        assert!(matches!(
            resize(&src, MAX_SIDE + 1, 1, &opts),
            Err(ResampleError::TooLarge { what: "output", .. })
        ));
        assert!(matches!(
            resize(&src, MAX_SIDE, MAX_SIDE, &opts),
            Err(ResampleError::TooLarge { .. })
        ));
        let bad = ImageRef { channels: 2, ..src };
        assert_eq!(
            resize(&bad, 1, 1, &opts),
            Err(ResampleError::Channels { channels: 2 })
        );
        let short = ImageRef {
            data: &data[..11],
            ..src
        };
        assert_eq!(
            resize(&short, 1, 1, &opts),
            Err(ResampleError::DataLength {
                expected: 12,
                actual: 11
            })
        );
        let empty = ImageRef {
            data: &[],
            width: 0,
            height: 5,
            channels: 3,
        };
        assert_eq!(
            resize(&empty, 1, 1, &opts),
            Err(ResampleError::EmptyInput {
                width: 0,
                height: 5
            })
        );
        let mut dst = vec![0u8; 5];
        assert_eq!(
            resize_into(&src, &mut dst, 1, 1, &opts),
            Err(ResampleError::DestinationLength {
                expected: 3,
                actual: 5
            })
        );
        for (region, reason) in [
            ([-1.0, 0.0, 1.0, 1.0], "box offset can't be negative"),
            ([0.0, 0.0, 3.0, 1.0], "box can't exceed original image size"),
            ([1.5, 0.0, 1.0, 1.0], "box can't be empty"),
            ([0.0, f32::NAN, 1.0, 1.0], "coordinates must be finite"),
        ] {
            let o = ResizeOptions {
                region: Some(region),
                ..opts
            };
            match resize(&src, 1, 1, &o) {
                Err(ResampleError::Region { reason: r, .. }) => assert_eq!(r, reason),
                other => panic!("{region:?}: {other:?}"),
            }
        }
        let msg = ResampleError::TooLarge {
            what: "input",
            width: 70000,
            height: 2,
            channels: 3,
        }
        .to_string();
        assert!(msg.contains("70000x2x3") && msg.contains("65536"), "{msg}");
    }

    #[test]
    fn pass_order_rule() {
        let p13 = PassOrder::Pillow13;
        // 600 -> 588 high, 512 -> 504 wide: 12 > 16 is false -> horizontal first.
        assert!(p13.horizontal_first(512, 600, 504, 588));
        // 1000 -> 500 high, 1000 -> 900 wide: 500 > 200 -> vertical first.
        assert!(!p13.horizontal_first(1000, 1000, 900, 500));
        // Upscaled height never goes vertical first; widened width makes it easier.
        assert!(p13.horizontal_first(10, 10, 5, 20));
        assert!(!p13.horizontal_first(10, 10, 20, 9));
        assert!(PassOrder::Pillow12.horizontal_first(1000, 1000, 900, 500));
        assert_eq!(PassOrder::from_name("pillow12"), Some(PassOrder::Pillow12));
        assert_eq!(PassOrder::from_name("pillow11"), None);
    }
}
