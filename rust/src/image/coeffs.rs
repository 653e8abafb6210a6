//! Per-axis resampling coefficients: Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`.
//!
//! For an axis of `in_size` input pixels, the source interval `[in0, in1)` (single precision,
//! as Pillow receives its `box`) and `out_size` output pixels:
//!
//! - `scale = f64(in1 - in0) / out_size` (the subtraction in `f32`), `filterscale =
//!   max(scale, 1)`, `support = filter.support · filterscale`, `ksize = 2·ceil(support) + 1`;
//! - output `i`: `center = in0 + (i + 0.5)·scale`, `lo = trunc(center − support + 0.5)` clamped
//!   to ≥ 0, `hi = trunc(center + support + 0.5)` clamped to ≤ `in_size`; tap `k` of `hi − lo`
//!   has weight `filter((lo + k − center + 0.5) · (1 / filterscale))`, all divided by their
//!   running sum when it is non-zero;
//! - 8-bit weights: `trunc(w·2²² ± 0.5)` (half away from zero), as `i32`.
//!
//! Every `f64` operation happens in Pillow's order, so the coefficients are bit-identical.

use super::filters::Filter;

/// Fixed-point precision of the 8-bit path: `32 − 8 − 2`.
pub const PRECISION_BITS: u32 = 22;

/// The accumulator's starting value: one half in fixed point, so that the final shift rounds.
pub const ROUNDING: i32 = 1 << (PRECISION_BITS - 1);

/// The `f64` coefficients of one axis, before fixed-point conversion.
#[derive(Clone, Debug, PartialEq)]
pub struct FloatCoeffs {
    /// Maximum taps per output pixel; the row stride of `weights`.
    pub ksize: usize,
    /// First input index of each output pixel.
    pub starts: Vec<usize>,
    /// Number of taps of each output pixel (≤ `ksize`).
    pub counts: Vec<usize>,
    /// `out_size × ksize` weights, zero past each pixel's `count`.
    pub weights: Vec<f64>,
}

/// The 22-bit fixed-point coefficients of one axis, as the 8-bit passes use them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisCoeffs {
    /// Maximum taps per output pixel; the row stride of `weights`.
    pub ksize: usize,
    /// First input index of each output pixel.
    pub starts: Vec<usize>,
    /// Number of taps of each output pixel (≤ `ksize`).
    pub counts: Vec<usize>,
    /// `out_size × ksize` weights, zero past each pixel's `count`.
    pub weights: Vec<i32>,
}

impl AxisCoeffs {
    /// Number of output pixels.
    pub fn out_len(&self) -> usize {
        self.starts.len()
    }

    /// The taps of output pixel `i`: first input index and weights.
    pub fn taps(&self, i: usize) -> (usize, &[i32]) {
        let row = &self.weights[i * self.ksize..(i + 1) * self.ksize];
        (self.starts[i], &row[..self.counts[i]])
    }

    /// The largest tap count over all output pixels.
    pub fn max_count(&self) -> usize {
        self.counts.iter().copied().max().unwrap_or(0)
    }
}

/// Pillow's `precompute_coeffs` for one axis, in `f64`.
///
/// Callers guarantee `in_size ≥ 1`, `out_size ≥ 1`, `0 ≤ in0 ≤ in1 ≤ in_size` and sizes small
/// enough (≤ 2²⁰) that every intermediate fits `i32` as it does in Pillow.
pub fn float_coeffs(
    in_size: usize,
    in0: f32,
    in1: f32,
    out_size: usize,
    filter: Filter,
) -> FloatCoeffs {
    float_coeffs_with(in_size, in0, in1, out_size, filter.support(), |x| {
        filter.eval(x)
    })
}

/// [`float_coeffs`] with any kernel: `support` its half-width at scale 1, `kernel` its value.
/// torch's antialiased `uint8` resize computes its weights with this very arithmetic
/// (`_compute_indices_min_size_weights_aa`), with kernels of its own ([`crate::image::torch`]).
pub fn float_coeffs_with(
    in_size: usize,
    in0: f32,
    in1: f32,
    out_size: usize,
    support: f64,
    kernel: impl Fn(f64) -> f64,
) -> FloatCoeffs {
    let scale = f64::from(in1 - in0) / out_size as f64;
    let filterscale = if scale < 1.0 { 1.0 } else { scale };
    let support = support * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let inv_filterscale = 1.0 / filterscale;
    let in0 = f64::from(in0);

    let mut starts = Vec::with_capacity(out_size);
    let mut counts = Vec::with_capacity(out_size);
    let mut weights = vec![0.0f64; out_size * ksize];
    for (i, k) in weights.chunks_exact_mut(ksize).enumerate() {
        let center = in0 + (i as f64 + 0.5) * scale;
        // C's `(int)` conversion truncates toward zero; `as i64` does the same.
        let lo = ((center - support + 0.5) as i64).max(0);
        let hi = ((center + support + 0.5) as i64).min(in_size as i64);
        let count = (hi - lo).clamp(0, ksize as i64) as usize;
        let lo = (lo as usize).min(in_size);
        let mut sum = 0.0;
        for (x, w) in k[..count].iter_mut().enumerate() {
            *w = kernel(((x + lo) as f64 - center + 0.5) * inv_filterscale);
            sum += *w;
        }
        if sum != 0.0 {
            for w in &mut k[..count] {
                *w /= sum;
            }
        }
        starts.push(lo);
        counts.push(count);
    }
    FloatCoeffs {
        ksize,
        starts,
        counts,
        weights,
    }
}

/// One weight in 22-bit fixed point, rounded half away from zero (`normalize_coeffs_8bpc`).
pub fn fixed_point(w: f64) -> i32 {
    let scaled = w * f64::from(1u32 << PRECISION_BITS);
    if w < 0.0 {
        (-0.5 + scaled) as i32
    } else {
        (0.5 + scaled) as i32
    }
}

/// The fixed-point coefficients of one axis.
///
/// The last [`RECENT_AXES`] distinct axes' coefficients are kept and handed out again as
/// copies: a batch of same-sized photos, or a video's frames, computes each axis once (13 µs
/// for 451 → 448 bicubic outputs, 75 µs for 2000 → 1988; a copy costs 0.3–2 µs). The key is
/// every argument, so a kept result is the one the computation would give.
pub fn axis_coeffs(
    in_size: usize,
    in0: f32,
    in1: f32,
    out_size: usize,
    filter: Filter,
) -> AxisCoeffs {
    let key = (in_size, in0.to_bits(), in1.to_bits(), out_size, filter);
    if let Some(kept) = recent().iter().find(|(k, _)| *k == key) {
        return kept.1.clone();
    }
    let f = float_coeffs(in_size, in0, in1, out_size, filter);
    let coeffs = AxisCoeffs {
        ksize: f.ksize,
        starts: f.starts,
        counts: f.counts,
        weights: f.weights.into_iter().map(fixed_point).collect(),
    };
    if coeffs.weights.len() <= RECENT_MAX_WEIGHTS {
        let mut kept = recent();
        if kept.len() == RECENT_AXES {
            kept.pop_front();
        }
        kept.push_back((key, coeffs.clone()));
    }
    coeffs
}

/// How many distinct axes [`axis_coeffs`] keeps.
pub const RECENT_AXES: usize = 16;

/// The largest coefficients [`axis_coeffs`] keeps, in weights (256 KiB; 4 MiB for all of them):
/// a 2000-pixel bicubic axis has 10 000, a 13 000 → 448 one 52 000.
pub const RECENT_MAX_WEIGHTS: usize = 1 << 16;

type AxisKey = (usize, u32, u32, usize, Filter);

/// The kept axes, oldest first (a poisoned lock is taken as it is: the list is always whole).
fn recent() -> std::sync::MutexGuard<'static, std::collections::VecDeque<(AxisKey, AxisCoeffs)>> {
    static RECENT: std::sync::Mutex<std::collections::VecDeque<(AxisKey, AxisCoeffs)>> =
        std::sync::Mutex::new(std::collections::VecDeque::new());
    RECENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(in_size: usize, out_size: usize, filter: Filter) -> AxisCoeffs {
        axis_coeffs(in_size, 0.0, in_size as f32, out_size, filter)
    }

    /// [`axis_coeffs`] without the kept axes.
    fn computed(in_size: usize, in0: f32, in1: f32, out_size: usize, filter: Filter) -> AxisCoeffs {
        let f = float_coeffs(in_size, in0, in1, out_size, filter);
        AxisCoeffs {
            ksize: f.ksize,
            starts: f.starts,
            counts: f.counts,
            weights: f.weights.into_iter().map(fixed_point).collect(),
        }
    }

    #[test]
    fn kept_axes_are_the_computed_ones() {
        // More distinct axes than are kept, each asked for several times and in an order that
        // evicts and brings back earlier ones; axes differing in one argument only (the box's
        // edges by one ulp, the filter, one size), and one too large to keep.
        let mut axes = vec![(13_000usize, 0.0f32, 13_000.0f32, 448usize, Filter::Bicubic)];
        for (i, filter) in [Filter::Bicubic, Filter::Bilinear, Filter::Lanczos]
            .into_iter()
            .enumerate()
        {
            for (in_size, out_size) in [(451, 448), (300, 308), (64, 17), (7, 7), (1000, 1008)] {
                let in1 = in_size as f32;
                axes.push((in_size, 0.0, in1, out_size, filter));
                axes.push((
                    in_size,
                    0.0,
                    f32::from_bits(in1.to_bits() - 1),
                    out_size,
                    filter,
                ));
                axes.push((in_size, 0.25 * i as f32, in1, out_size + 1, filter));
            }
        }
        assert!(axes.len() > 2 * RECENT_AXES);
        let large = computed(13_000, 0.0, 13_000.0, 448, Filter::Bicubic);
        assert!(
            large.weights.len() <= RECENT_MAX_WEIGHTS,
            "a large axis is still kept"
        );
        for round in 0..3 {
            for (n, &(in_size, in0, in1, out_size, filter)) in axes.iter().enumerate() {
                let want = computed(in_size, in0, in1, out_size, filter);
                for _ in 0..1 + (n + round) % 3 {
                    let got = axis_coeffs(in_size, in0, in1, out_size, filter);
                    assert_eq!(got, want, "{in_size} [{in0}, {in1}) -> {out_size} {filter}");
                }
            }
            assert!(recent().len() <= RECENT_AXES);
        }
        let huge = axis_coeffs(100_000, 0.0, 100_000.0, 1, Filter::Lanczos);
        assert!(huge.weights.len() > RECENT_MAX_WEIGHTS);
        assert!(recent()
            .iter()
            .all(|(_, c)| c.weights.len() <= RECENT_MAX_WEIGHTS));
    }

    #[test]
    fn fixed_point_rounds_half_away_from_zero() {
        let unit = 1.0 / f64::from(1u32 << PRECISION_BITS);
        assert_eq!(fixed_point(1.0), 1 << 22);
        assert_eq!(fixed_point(0.5 * unit), 1);
        assert_eq!(fixed_point(0.499 * unit), 0);
        assert_eq!(fixed_point(-0.5 * unit), -1);
        assert_eq!(fixed_point(-0.499 * unit), 0);
        assert_eq!(fixed_point(-0.0), 0);
        assert_eq!(fixed_point(-0.0625), -(1 << 18));
    }

    #[test]
    fn identity_is_a_unit_tap_for_every_filter() {
        for filter in [
            Filter::Box,
            Filter::Bilinear,
            Filter::Hamming,
            Filter::Bicubic,
            Filter::Lanczos,
        ] {
            let c = full(7, 7, filter);
            assert_eq!(
                c.ksize,
                2 * filter.support().ceil() as usize + 1,
                "{filter}"
            );
            for i in 0..7 {
                let (start, w) = c.taps(i);
                let pos = w.iter().position(|&v| v != 0).map(|k| start + k);
                assert_eq!(pos, Some(i), "{filter} output {i}: {start} {w:?}");
                assert_eq!(w.iter().filter(|&&v| v != 0).count(), 1, "{filter} {w:?}");
                assert!(w.contains(&(1 << 22)), "{filter} {w:?}");
            }
        }
    }

    #[test]
    fn bicubic_downscale_by_two() {
        // 8 -> 4: scale 2, support 4, ksize 9; output 1 has center 3 and taps 0..7.
        let c = full(8, 4, Filter::Bicubic);
        assert_eq!(c.ksize, 9);
        assert_eq!(c.starts, vec![0, 0, 1, 3]);
        assert_eq!(c.counts, vec![5, 7, 7, 5]);
        let f = float_coeffs(8, 0.0, 8.0, 4, Filter::Bicubic);
        // Output 1: taps at (x − 3 + 0.5)/2 for x = 0..7: −1.25, −0.75, …, 1.25, 1.75.
        let raw: Vec<f64> = (0..7)
            .map(|x| Filter::Bicubic.eval((x as f64 - 3.0 + 0.5) * 0.5))
            .collect();
        let sum: f64 = raw.iter().sum();
        for (k, r) in raw.iter().enumerate() {
            assert_eq!(f.weights[9 + k], r / sum);
        }
        let fixed: i32 = c.taps(1).1.iter().sum();
        assert!((fixed - (1 << 22)).abs() <= 4, "{fixed}");
    }

    #[test]
    fn upscale_keeps_the_kernel_width() {
        // 2 -> 5 bilinear: scale 0.4, support 1, ksize 3.
        let c = full(2, 5, Filter::Bilinear);
        assert_eq!(c.ksize, 3);
        let f = float_coeffs(2, 0.0, 2.0, 5, Filter::Bilinear);
        // Output 0: center 0.2, lo = trunc(-0.3) = 0, hi = trunc(1.7) = 1: one tap, weight 1.
        assert_eq!((f.starts[0], f.counts[0]), (0, 1));
        assert_eq!(f.weights[0], 1.0);
        // Output 2: center 1.0, taps 0 and 1 at distance 0.5 each.
        assert_eq!((f.starts[2], f.counts[2]), (0, 2));
        assert_eq!(&f.weights[6..8], &[0.5, 0.5]);
        assert_eq!(c.taps(2).1, &[1 << 21, 1 << 21]);
    }

    #[test]
    fn one_pixel_input_and_output() {
        // 1 -> 1: a single unit tap.
        let c = full(1, 1, Filter::Lanczos);
        assert_eq!(c.taps(0), (0, &[1 << 22][..]));
        // 1 -> 4: every output reads the only input pixel with weight 1.
        let c = full(1, 4, Filter::Bicubic);
        for i in 0..4 {
            assert_eq!(c.taps(i), (0, &[1 << 22][..]), "output {i}");
        }
        // 300 -> 1: one output spanning the whole input.
        let c = full(300, 1, Filter::Bicubic);
        assert_eq!(c.ksize, 1201);
        assert_eq!((c.starts[0], c.counts[0]), (0, 300));
        let total: i64 = c.taps(0).1.iter().map(|&w| i64::from(w)).sum();
        assert!((total - (1 << 22)).abs() < 300, "{total}");
        // Box 4 -> 1: four equal taps.
        let c = full(4, 1, Filter::Box);
        assert_eq!(c.taps(0), (0, &[1 << 20; 4][..]));
    }

    #[test]
    fn sub_region_shifts_the_centers() {
        // Box region [2, 6) of 10 pixels to 4: identity on pixels 2..5.
        let c = axis_coeffs(10, 2.0, 6.0, 4, Filter::Bilinear);
        for i in 0..4 {
            let (start, w) = c.taps(i);
            let pos = w.iter().position(|&v| v == 1 << 22).map(|k| start + k);
            assert_eq!(pos, Some(i + 2));
        }
    }

    #[test]
    fn counts_never_exceed_ksize_or_the_input() {
        for filter in [
            Filter::Box,
            Filter::Bilinear,
            Filter::Hamming,
            Filter::Bicubic,
            Filter::Lanczos,
        ] {
            for (n_in, n_out) in [(1, 3), (3, 1), (7, 300), (300, 7), (513, 512), (10, 10)] {
                let c = full(n_in, n_out, filter);
                for i in 0..n_out {
                    assert!(c.counts[i] <= c.ksize);
                    assert!(c.starts[i] + c.counts[i] <= n_in);
                    assert!(c.counts[i] >= 1, "{filter} {n_in}->{n_out} output {i}");
                }
            }
        }
    }
}
