//! Phi-4-multimodal (`Phi4MultimodalImageProcessor`, transformers' torchvision backend; there is
//! no PIL class): dynamic HD tiling. Each image is resized (torch's antialiased `uint8`
//! BILINEAR, whatever `resample` says) to fill a grid of `s`-sided crops along one side, padded
//! right/bottom with white, normalised (the torchvision backend's fused rescale + normalize in
//! `float32`), and cut into its crops; the **normalised** HD image interpolated to `s × s`
//! (`resample`, BICUBIC, without antialiasing: torch's float kernel) goes first. Outputs:
//!
//! - `image_pixel_values` `(B, n, 3, s, s)` float32, `n` the largest `1 + crops` of the batch,
//!   shorter images padded with zero crops;
//! - `image_sizes` `(B, 2)` int64: the HD size `(height, width)`;
//! - `image_attention_mask` `(B, n, s / patch, s / patch)` float32: ones for the global image,
//!   each crop's mask (zero over whole patches of padding), ones for padding crops;
//! - `num_img_tokens` `(B,)` int64: `256 + 1 + Σ mask↓ + Σ mask↓[:, 0] + 16`, `mask↓` the crop
//!   masks subsampled by 2 and laid out as the grid (transformers' constants).
//!
//! The grid ([`grid`]): `⌈W / s⌉ × ⌈H / s⌉` crops when at most `dynamic_hd`, else the
//! `(columns, rows)` with at most `dynamic_hd` crops whose `columns / rows` is closest to
//! `W / H`, ties as `find_closest_aspect_ratio` breaks them. Images too thin for it (a resized
//! side under 10 pixels) are refused, as transformers refuses them.

use super::family::{i64_values, FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::torch_backend as tb;
use super::value::{as_count, as_hw, hf_keys, hw_value, Common, Value, HALF};
use super::{
    checked_len, parallel, prepare_all, Input, Options, Out, OutBuffer, Outputs, ProcessorError,
    Rgb, Tensor, TensorData,
};
use crate::image::torch::TorchFilter;
use crate::image::Filter;
use crate::memory::fallible;

/// Phi-4-multimodal: `Phi4MultimodalImageProcessor` (torchvision: an int `size` is a square);
/// `patch_size` and `dynamic_hd`.
pub const PHI4_MULTIMODAL: Hf = Hf {
    image_classes: &["Phi4MultimodalImageProcessor"],
    video_classes: &[],
    normalise: |config| hf_keys(config, &["patch_size", "dynamic_hd"], true),
    processor_keys: &[],
    processor_forces: None,
    // <|image|> 200010 (Phi4MultimodalVisionConfig image_token_id; vLLM's phi4_multimodal.py
    // _IMAGE_PLACEHOLDER_TOKEN_ID, <|endoftext10|> in the original vocab), written num_img_tokens
    // times by Phi4MultimodalProcessor; vLLM's model refuses images without num_img_tokens, a
    // batched input the processor drops (its _get_mm_fields_config).
    published: Some(Published {
        image: 200010,
        video: None,
        vision_tokens: None,
    }),
    count_tensor: Some("num_img_tokens"),
};

/// The configuration of Phi-4-multimodal.
#[derive(Clone, Debug, PartialEq)]
pub struct Phi4Config {
    pub common: Common,
    /// The crop side (`size`, square).
    pub tile: (usize, usize),
    pub patch_size: usize,
    pub dynamic_hd: usize,
}

/// Ours: transformers bounds `dynamic_hd` by nothing; it enumerates `dynamic_hd³` pairs.
pub const MAX_CROPS: usize = 256;

impl Phi4Config {
    /// `Phi4MultimodalImageProcessor`'s defaults (also the published checkpoint's): crops of
    /// 448, patches of 14, at most 36 crops, mean/std 0.5, BICUBIC for the global image.
    pub fn phi4_multimodal() -> Self {
        let mut common = Common::new(HALF, HALF);
        common.resample = Filter::Bicubic;
        Phi4Config {
            common,
            tile: (448, 448),
            patch_size: 14,
            dynamic_hd: 36,
        }
    }

    fn mask_side(&self) -> usize {
        self.tile.0 / self.patch_size
    }
}

impl FamilyConfig for Phi4Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.tile = as_hw("size", value)?,
            "patch_size" => self.patch_size = as_count("patch_size", value, 1 << 16)?,
            "dynamic_hd" => self.dynamic_hd = as_count("dynamic_hd", value, MAX_CROPS)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("size", hw_value(self.tile)),
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("dynamic_hd", Value::Int(self.dynamic_hd as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if self.tile.0 != self.tile.1 {
            return Err(ProcessorError::config(
                "size",
                "a square size (Phi4MultimodalImageProcessor only supports square sizes)",
                format!("{}x{} (HxW)", self.tile.0, self.tile.1),
            ));
        }
        if self.patch_size > self.tile.0 {
            return Err(ProcessorError::config(
                "patch_size",
                format!("at most the crop side {}", self.tile.0),
                self.patch_size,
            ));
        }
        if self.common.resample != Filter::Bicubic {
            return Err(ProcessorError::config(
                "resample",
                "BICUBIC (3): the global image's float interpolation ported from torch",
                self.common.resample.pil_id(),
            ));
        }
        // `_preprocess` ignores do_resize (the HD resize always happens).
        tb::check_torch_steps(&self.common)
    }

    fn images(
        &self,
        _normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        images(self, inputs, options)
    }

    /// `num_img_tokens`, which the processor returns (see the module docs).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "num_img_tokens").map(<[i64]>::to_vec)
    }
}

/// `find_closest_aspect_ratio`'s choice among `(columns, rows)` grids of at most `max_num` crops
/// (sorted by crop count; within a count the order cannot matter: two grids of one count equally
/// far from `aspect` always have a third, of fewer crops, strictly closer).
fn closest_ratio(
    aspect: f64,
    max_num: usize,
    width: usize,
    height: usize,
    s: usize,
) -> (usize, usize) {
    let mut ratios: Vec<(usize, usize)> = (1..=max_num)
        .flat_map(|i| (1..=max_num).map(move |j| (i, j)))
        .filter(|&(i, j)| i * j <= max_num)
        .collect();
    ratios.sort_by_key(|&(i, j)| i * j);
    let area = (width * height) as f64;
    let mut best_diff = f64::INFINITY;
    let mut best = (1, 1);
    for (i, j) in ratios {
        let diff = (aspect - i as f64 / j as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (i, j);
        } else if diff == best_diff && area > 0.5 * s as f64 * s as f64 * i as f64 * j as f64 {
            best = (i, j);
        }
    }
    best
}

/// The `(columns, rows)` crop grid of an image of `height × width` (see the module docs).
pub fn grid(height: usize, width: usize, s: usize, dynamic_hd: usize) -> (usize, usize) {
    let w_crops = width.div_ceil(s);
    let h_crops = height.div_ceil(s);
    if w_crops * h_crops > dynamic_hd {
        closest_ratio(width as f64 / height as f64, dynamic_hd, width, height, s)
    } else {
        (w_crops, h_crops)
    }
}

/// One image's HD layout (`dynamic_preprocess`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `(columns, rows)` of crops.
    pub grid: (usize, usize),
    /// The resized image `(height, width)` before the white padding.
    pub resized: (usize, usize),
}

impl Layout {
    pub fn new(height: usize, width: usize, config: &Phi4Config) -> Result<Self, ProcessorError> {
        let s = config.tile.0;
        let grid = grid(height, width, s, config.dynamic_hd);
        let (tw, th) = (s * grid.0, s * grid.1);
        let ratio_w = tw as f64 / width as f64;
        let ratio_h = th as f64 / height as f64;
        // new_size = (width, height), Python's int() truncation.
        let (new_w, new_h) = if ratio_w < ratio_h {
            (tw, (height as f64 * ratio_w) as usize)
        } else {
            ((width as f64 * ratio_h) as usize, th)
        };
        if new_h.min(th) < 10 || new_w.min(tw) < 10 {
            return Err(ProcessorError::shape(
                "image",
                "an aspect ratio whose resized sides are at least 10 pixels (transformers: \
                 \"the aspect ratio is very extreme\")",
                format!("{height}x{width} (HxW) resized to {new_h}x{new_w} for a {th}x{tw} grid"),
            ));
        }
        Ok(Layout {
            grid,
            resized: (new_h, new_w),
        })
    }

    /// The padded HD size `(height, width)`.
    pub fn hd(&self, s: usize) -> (usize, usize) {
        (s * self.grid.1, s * self.grid.0)
    }

    /// The HD attention mask, `(m · rows) × (m · columns)` row-major, `m = s / patch`.
    pub fn mask(&self, config: &Phi4Config) -> Result<Vec<f32>, ProcessorError> {
        let m = config.mask_side();
        let (th, tw) = self.hd(config.tile.0);
        let (mh, mw) = (m * self.grid.1, m * self.grid.0);
        let mut mask =
            fallible::filled(1.0f32, mh * mw).map_err(ProcessorError::oom("HD attention mask"))?;
        let (pad_w, pad_h) = (tw - self.resized.1, th - self.resized.0);
        let p = config.patch_size;
        if pad_w >= p {
            let zero = (pad_w / p).min(mw);
            for row in mask.chunks_exact_mut(mw) {
                row[mw - zero..].fill(0.0);
            }
        }
        if pad_h >= p {
            let zero = (pad_h / p).min(mh);
            mask[(mh - zero) * mw..].fill(0.0);
        }
        Ok(mask)
    }
}

/// `num_img_tokens` of an HD mask (`mh × mw`, crops of `m × m`).
fn tokens(mask: &[f32], mw: usize, m: usize) -> i64 {
    // The crops subsampled [::2, ::2] and laid out as the grid again: rows and columns of the
    // HD mask at even offsets within their crop.
    let mh = mask.len() / mw;
    let mut sum = 0.0f64;
    let mut first_column = 0.0f64;
    for y in (0..mh).filter(|y| (y % m).is_multiple_of(2)) {
        let row = &mask[y * mw..(y + 1) * mw];
        for (x, &v) in row
            .iter()
            .enumerate()
            .filter(|(x, _)| (x % m).is_multiple_of(2))
        {
            sum += f64::from(v);
            if x == 0 {
                first_column += f64::from(v);
            }
        }
    }
    256 + 1 + sum as i64 + first_column as i64 + 16
}

struct Prepared {
    canvas: Rgb<'static>,
    layout: Layout,
}

fn prepare(config: &Phi4Config, rgb: Rgb<'_>, threads: usize) -> Result<Prepared, ProcessorError> {
    let layout = Layout::new(rgb.height, rgb.width, config)?;
    let (h, w) = layout.resized;
    let (th, tw) = layout.hd(config.tile.0);
    let resized = tb::resize(rgb, h, w, TorchFilter::Bilinear, threads)?;
    let canvas = tb::pad(resized.view(), th, tw, 0, 0, 255)?;
    super::recycle_images([resized]);
    Ok(Prepared { canvas, layout })
}

/// Phi-4-multimodal on a batch (see the module docs).
pub fn images(
    config: &Phi4Config,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let s = config.tile.0;
    let m = config.mask_side();
    let c = &config.common;
    let normalize = tb::fused_normalize(c.rescale_factor, c.image_mean, c.image_std);
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let crops: Vec<usize> = prepared
        .iter()
        .map(|p| 1 + p.layout.grid.0 * p.layout.grid.1)
        .collect();
    let n = crops.iter().copied().max().unwrap_or(1);
    let batch = prepared.len();
    let per_crop = 3 * s * s;
    let len = checked_len("image_pixel_values", &[batch, n, 3, s, s], 4)?;
    let mut buffer = OutBuffer::new("image_pixel_values", len)?;
    let work: Vec<(&Prepared, &mut [Out])> = prepared
        .iter()
        .zip(buffer.slices(&vec![n * per_crop; batch]))
        .collect();
    let workers = parallel::writers(options.threads, work.len(), 4 * len);
    parallel::map(work, workers, |_, (p, out)| {
        let used = (1 + p.layout.grid.0 * p.layout.grid.1) * per_crop;
        let (crops, padding) = out.split_at_mut(used);
        padding.fill(Out::new(0.0));
        tb::write_global_and_tiles(&normalize, p.canvas.view(), (s, s), crops)
    })
    .into_iter()
    .collect::<Result<(), _>>()?;
    // SAFETY: each image's slice of `n` crops is written whole (every image succeeded, or we
    // returned above): `write_global_and_tiles` writes every value of its global image and
    // tiles (`used` values), the rest is zero-filled.
    let pixels = unsafe { buffer.finish() };
    let mut masks = fallible::filled(1.0f32, batch * n * m * m)
        .map_err(ProcessorError::oom("image_attention_mask"))?;
    let mut sizes = Vec::with_capacity(2 * batch);
    let mut num_tokens = Vec::with_capacity(batch);
    for (p, out) in prepared.iter().zip(masks.chunks_exact_mut(n * m * m)) {
        let hd = p.layout.mask(config)?;
        let (cols, rows) = p.layout.grid;
        let mw = m * cols;
        // Crop (r, c) of the HD mask goes to slot 1 + r · cols + c.
        for r in 0..rows {
            for col in 0..cols {
                let slot = &mut out[(1 + r * cols + col) * m * m..][..m * m];
                for y in 0..m {
                    let src = &hd[(r * m + y) * mw + col * m..][..m];
                    slot[y * m..(y + 1) * m].copy_from_slice(src);
                }
            }
        }
        num_tokens.push(tokens(&hd, mw, m));
        let (th, tw) = p.layout.hd(s);
        sizes.extend([th as i64, tw as i64]);
    }
    super::recycle_images(prepared.into_iter().map(|p| p.canvas));
    Ok(Outputs {
        tensors: vec![
            (
                "image_pixel_values",
                Tensor {
                    shape: vec![batch, n, 3, s, s],
                    data: TensorData::F32(pixels),
                },
            ),
            ("image_sizes", Tensor::i64(vec![batch, 2], sizes)),
            (
                "image_attention_mask",
                Tensor {
                    shape: vec![batch, n, m, m],
                    data: TensorData::F32(masks),
                },
            ),
            ("num_img_tokens", Tensor::i64(vec![batch], num_tokens)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids() {
        let c = Phi4Config::phi4_multimodal();
        // 600x512 → 2x2 crops of 448 (as the reference's example: (1, 5, 3, 448, 448)).
        assert_eq!(grid(600, 512, 448, 36), (2, 2));
        let l = Layout::new(600, 512, &c).unwrap();
        assert_eq!(l.hd(448), (896, 896));
        // ratio_w = 896/512 = 1.75 ≥ ratio_h = 896/600: height fills, width 512·1.4933 = 764.
        assert_eq!(l.resized, (896, 764));
        let mask = l.mask(&c).unwrap();
        // 132 px of padding on the right: 9 patch columns zeroed.
        assert_eq!(mask[63], 0.0);
        assert_eq!(mask[64 - 10], 1.0);
        assert!(Layout::new(1, 700, &c).is_err());
        // More than 36 crops: the closest aspect ratio.
        assert_eq!(grid(4000, 4000, 448, 36), (6, 6));
        assert_eq!(grid(1000, 4000, 448, 4), (4, 1));
    }
}
