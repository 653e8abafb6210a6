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
//! formula once for each of the 3 × 256 possible inputs and the image passes become table
//! lookups: exact by construction, whatever order the pixels are visited in.

use super::{store, Out, RgbRef};

/// The rescale/normalize of one configuration, as a per-channel lookup table.
#[derive(Clone)]
pub struct Normalize {
    lut: [[f32; 256]; 3],
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
        Normalize { lut }
    }

    /// The output for input `value` in channel `c` (0, 1, 2).
    #[inline]
    pub fn value(&self, c: usize, value: u8) -> f32 {
        self.lut[c][usize::from(value)]
    }

    /// The table of channel `c`.
    #[inline]
    pub fn table(&self, c: usize) -> &[f32; 256] {
        &self.lut[c]
    }

    /// `r[k]`, `g[k]`, `b[k]` = the values of pixel `k` of `pixels` (interleaved RGB, 3 bytes
    /// per output value of each slice; the slices have equal lengths).
    #[inline]
    pub fn deinterleave(&self, pixels: &[u8], r: &mut [f32], g: &mut [f32], b: &mut [f32]) {
        let n = r.len();
        let (g, b, pixels) = (&mut g[..n], &mut b[..n], &pixels[..3 * n]);
        let [t0, t1, t2] = &self.lut;
        for (k, px) in pixels.chunks_exact(3).enumerate() {
            r[k] = t0[usize::from(px[0])];
            g[k] = t1[usize::from(px[1])];
            b[k] = t2[usize::from(px[2])];
        }
    }

    /// Writes `src` channels-first into `out` (`3 × out_h × out_w` values, every one written),
    /// the source pixel of output `(y, x)` being `src(y + top, x + left)`, or a `0` byte where
    /// that lies outside `src` (transformers' zero padding of a center crop, which happens on
    /// `u8` before rescaling). `top`/`left` may be negative.
    pub fn write_chw(
        &self,
        src: RgbRef<'_>,
        top: isize,
        left: isize,
        out_h: usize,
        out_w: usize,
        out: &mut [Out],
    ) {
        debug_assert_eq!(out.len(), 3 * out_h * out_w);
        let plane = out_h * out_w;
        let stream = store::should_stream(out.len());
        let (w, h) = (src.width as isize, src.height as isize);
        // The output columns that read inside the source: x in [x0, x1).
        let x0 = (-left).clamp(0, out_w as isize) as usize;
        let x1 = (w - left).clamp(x0 as isize, out_w as isize) as usize;
        // One staging row per channel, padding values in place once.
        let mut staging = vec![0f32; 3 * out_w];
        for (c, row) in staging.chunks_exact_mut(out_w).enumerate() {
            row.fill(self.lut[c][0]);
        }
        let (r_plane, rest) = out.split_at_mut(plane);
        let (g_plane, b_plane) = rest.split_at_mut(plane);
        let rows = r_plane
            .chunks_exact_mut(out_w)
            .zip(g_plane.chunks_exact_mut(out_w))
            .zip(b_plane.chunks_exact_mut(out_w));
        for (y, ((r, g), b)) in rows.enumerate() {
            let sy = y as isize + top;
            let (sr, rest) = staging.split_at_mut(out_w);
            let (sg, sb) = rest.split_at_mut(out_w);
            if sy >= 0 && sy < h && x0 < x1 {
                let start = (sy as usize * src.width + (x0 as isize + left) as usize) * 3;
                let pixels = &src.data[start..start + (x1 - x0) * 3];
                self.deinterleave(pixels, &mut sr[x0..x1], &mut sg[x0..x1], &mut sb[x0..x1]);
                store::copy(r, sr, stream);
                store::copy(g, sg, stream);
                store::copy(b, sb, stream);
            } else {
                // A row outside the source: all padding.
                for (c, dst) in [r, g, b].into_iter().enumerate() {
                    dst.fill(Out::new(self.lut[c][0]));
                }
            }
        }
        store::fence(stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
