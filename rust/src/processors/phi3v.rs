//! Phi-3-vision (`Phi3VImageProcessor`, the hub's remote code of `microsoft/Phi-3-vision-*`;
//! transformers has no class): the HD transform with `num_crops`. A portrait image is transposed
//! first; the landscape image is resized with **Pillow** BILINEAR to `scale` tiles of 336 across
//! (the most with `scale · ⌈scale / ratio⌉ ≤ num_crops`), padded top and bottom with white to a
//! multiple of 336 (centred, the odd pixel at the bottom), and transposed back. `ToTensor` +
//! `Normalize` (`float32`, CLIP mean/std) give the HD image; its global image is the normalised
//! HD image interpolated to 336 × 336 with torch's bicubic (no antialiasing). Outputs:
//!
//! - `pixel_values` `(B, num_crops + 1, 3, 336, 336)` float32: the global image, the HD tiles in
//!   row-major order, zero crops up to `num_crops + 1`;
//! - `image_sizes` `(B, 2)` int64: the HD size `(height, width)`;
//! - `num_img_tokens` `(B,)` int64: `(rows · cols + 1) · 144 + 1 + (rows + 1) · 12`.
//!
//! The hub class takes only `num_crops`, `image_mean` and `image_std`; the other shared keys do
//! not apply to it and are ignored.

use std::borrow::Cow;

use super::family::{i64_values, FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::torch_backend::{self as tb, to_tensor_table};
use super::value::{as_count, hf_only, Common, Value, CLIP_MEAN, CLIP_STD};
use super::{
    checked_len, parallel, prepare_all, resize_rgb, Input, Options, Out, OutBuffer, Outputs,
    ProcessorError, Rgb, Tensor, TensorData,
};
use crate::image::{Filter, PassOrder};
use crate::memory::fallible;

/// The HD tile side.
pub const TILE: usize = 336;
/// Ours: the output grows by 1.35 MB per crop.
pub const MAX_CROPS: usize = 4096;

/// Phi-3-vision: the hub's `Phi3VImageProcessor`, which takes only `image_mean`, `image_std`
/// and `num_crops`.
pub const PHI3_V: Hf = Hf {
    image_classes: &["Phi3VImageProcessor"],
    video_classes: &[],
    normalise: |config| Ok(hf_only(config, &["image_mean", "image_std", "num_crops"])),
    processor_keys: &[],
    processor_forces: None,
    // <|image|> 32044 (vLLM's phi3v.py _IMAGE_TOKEN_ID; the SMG gateway's phi3_v spec expands
    // <|image|> into a run of it).
    published: Some(Published {
        image: 32044,
        video: None,
        vision_tokens: None,
    }),
    count_tensor: None,
};

/// The configuration of Phi-3-vision.
#[derive(Clone, Debug, PartialEq)]
pub struct Phi3VConfig {
    pub common: Common,
    pub num_crops: usize,
}

impl Phi3VConfig {
    /// The published checkpoints' `preprocessor_config.json`: `num_crops` 16, CLIP mean/std.
    /// (The class's own `num_crops` is 1.)
    pub fn phi3_v() -> Self {
        let mut common = Common::new(CLIP_MEAN, CLIP_STD);
        common.resample = Filter::Bilinear;
        Phi3VConfig {
            common,
            num_crops: 16,
        }
    }
}

impl FamilyConfig for Phi3VConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "num_crops" => self.num_crops = as_count("num_crops", value, MAX_CROPS)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![("num_crops", Value::Int(self.num_crops as i64))]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if self.common.image_std.contains(&0.0) {
            return Err(ProcessorError::config(
                "image_std",
                "non-zero values",
                self.common.image_std,
            ));
        }
        Ok(())
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

/// The HD layout of an image of `height × width` (the landscape orientation decided inside):
/// `(resized height, resized width)` of the landscape image, and whether it was transposed.
pub fn hd_resize(height: usize, width: usize, num_crops: usize) -> ((usize, usize), bool) {
    let transposed = width < height;
    let (h, w) = if transposed {
        (width, height)
    } else {
        (height, width)
    };
    let ratio = w as f64 / h as f64;
    let mut scale = 1usize;
    while scale as f64 * (scale as f64 / ratio).ceil() <= num_crops as f64 {
        scale += 1;
    }
    scale -= 1;
    let new_w = scale * TILE;
    let new_h = (new_w as f64 / ratio) as usize;
    ((new_h, new_w), transposed)
}

/// `Image.transpose(TRANSPOSE)` of an RGB image.
fn transpose(src: &Rgb<'_>) -> Result<Rgb<'static>, ProcessorError> {
    let (h, w) = (src.height, src.width);
    let mut data = fallible::zeros(h * w * 3).map_err(ProcessorError::oom("transposed image"))?;
    for (y, row) in src.data.chunks_exact(w * 3).enumerate() {
        for (x, px) in row.chunks_exact(3).enumerate() {
            let at = (x * h + y) * 3;
            data[at..at + 3].copy_from_slice(px);
        }
    }
    Ok(Rgb {
        data: Cow::Owned(data),
        width: h,
        height: w,
    })
}

/// The padded HD `u8` image of one input.
fn prepare(
    config: &Phi3VConfig,
    rgb: Rgb<'_>,
    threads: usize,
) -> Result<Rgb<'static>, ProcessorError> {
    let ((new_h, new_w), transposed) = hd_resize(rgb.height, rgb.width, config.num_crops);
    if new_h == 0 || new_w == 0 {
        return Err(ProcessorError::shape(
            "image",
            "an HD size with both sides > 0 (Pillow: \"height and width must be > 0\")",
            format!(
                "{}x{} (HxW) resized to {new_h}x{new_w} with num_crops {}",
                rgb.height, rgb.width, config.num_crops
            ),
        ));
    }
    let landscape = if transposed { transpose(&rgb)? } else { rgb };
    // torchvision's resize of a PIL image: Image.resize((w, h), BILINEAR), Pillow 13.
    let mut common = Common::new(CLIP_MEAN, CLIP_STD);
    common.resample = Filter::Bilinear;
    common.pass_order = PassOrder::Pillow13;
    let resized = resize_rgb(landscape, new_h, new_w, &common, threads)?;
    let target = resized.height.div_ceil(TILE) * TILE;
    let top = (target - resized.height) / 2;
    let padded = tb::pad(resized.view(), target, resized.width, top, 0, 255)?;
    super::recycle_images([resized]);
    Ok(if transposed {
        transpose(&padded)?
    } else {
        padded
    })
}

/// `num_img_tokens` of an HD image of `h × w`.
pub fn tokens(h: usize, w: usize) -> i64 {
    let (rows, cols) = (h / TILE, w / TILE);
    ((rows * cols + 1) * 144 + 1 + (rows + 1) * 12) as i64
}

/// Phi-3-vision on a batch (see the module docs).
pub fn images(
    config: &Phi3VConfig,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let c = &config.common;
    // The table is the reference; the formula runs only where it gives the table's bits.
    let normalize = Normalize::from_formula(
        to_tensor_table(c.image_mean, c.image_std),
        1.0 / 255.0,
        c.image_mean,
        c.image_std,
    );
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let n = config.num_crops + 1;
    if let Some(hd) = prepared
        .iter()
        .find(|hd| (hd.height / TILE) * (hd.width / TILE) > config.num_crops)
    {
        // Not reachable (the scale search bounds the tiles by num_crops); refused, not cut.
        return Err(ProcessorError::shape(
            "image",
            format!("at most num_crops = {} tiles", config.num_crops),
            format!("{}x{} (HxW) HD image", hd.height, hd.width),
        ));
    }
    let batch = prepared.len();
    let per_crop = 3 * TILE * TILE;
    let len = checked_len("pixel_values", &[batch, n, 3, TILE, TILE], 4)?;
    let mut buffer = OutBuffer::new("pixel_values", len)?;
    let work: Vec<(&Rgb<'_>, &mut [Out])> = prepared
        .iter()
        .zip(buffer.slices(&vec![n * per_crop; batch]))
        .collect();
    let workers = parallel::writers(options.threads, work.len(), 4 * len);
    parallel::map(work, workers, |_, (hd, out)| {
        // At most num_crops tiles (hd_resize's scale bound), so `used ≤ n · per_crop`.
        let used = (1 + (hd.height / TILE) * (hd.width / TILE)) * per_crop;
        let (crops, padding) = out.split_at_mut(used);
        padding.fill(Out::new(0.0));
        tb::write_global_and_tiles(&normalize, hd.view(), (TILE, TILE), crops)
    })
    .into_iter()
    .collect::<Result<(), _>>()?;
    // SAFETY: each image's slice of `n` crops is written whole (every image succeeded, or we
    // returned above): `write_global_and_tiles` writes every value of its global image and
    // tiles (`used` values), the rest is zero-filled.
    let pixels = unsafe { buffer.finish() };
    let sizes: Vec<i64> = prepared
        .iter()
        .flat_map(|hd| [hd.height as i64, hd.width as i64])
        .collect();
    let num_tokens: Vec<i64> = prepared
        .iter()
        .map(|hd| tokens(hd.height, hd.width))
        .collect();
    super::recycle_images(prepared);
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![batch, n, 3, TILE, TILE],
                    data: TensorData::F32(pixels),
                },
            ),
            ("image_sizes", Tensor::i64(vec![batch, 2], sizes)),
            ("num_img_tokens", Tensor::i64(vec![batch], num_tokens)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hd_sizes() {
        // 600x512 (portrait): transposed to 512x600, ratio 1.17: scale 3 (3·⌈3/1.17⌉ = 9 ≤ 16,
        // 4·⌈4/1.17⌉ = 16 ≤ 16, 5·5 > 16 → 4): 1344 wide, 1344/1.17 = 1146 high.
        assert_eq!(hd_resize(600, 512, 16), ((1146, 1344), true));
        assert_eq!(tokens(1344, 1344), (16 + 1) * 144 + 1 + 5 * 12);
        // The documented failure: a 1x700 row with num_crops 1 has no rows.
        assert_eq!(hd_resize(1, 700, 1).0 .0, 0);
    }
}
