//! Inkling (`InklingImageProcessor`) and Inkling2 (`Inkling2ImageProcessor`), transformers
//! 5.24's torchvision-only classes; neither resizes by default. Both cut the image into
//! `size`-sided patches, pad each with `-1.0` on the 0–255 scale (so the padding normalises
//! to `(−1 − mean′) / std′`), and normalise as the torchvision backend does
//! ([`torch_value`]: the fused `(x − mean·(1/rescale)) / (std·(1/rescale))` in `float32` when
//! both steps are on).
//!
//! - **Inkling**: `⌈H / p⌉` patch rows and `W // p + 1` columns — always one column more than
//!   the image covers, so a width that is a multiple of `p` gets a last column of padding only
//!   (transformers' own `divide_to_patches`); each patch repeated along a last axis of 2 and
//!   laid out channels-last: `pixel_values` `(Σ patches, 2, p, p, 3)` float32, `num_patches`
//!   `(B,)` int64 — one `<|unused_200054|>` per patch (`InklingProcessor`). A 4-channel array
//!   is composited onto white as the torchvision backend's `convert_to_rgb` does it in
//!   `float32` ([`torch_over_white`]). The optional pre-scaling (`rescale_image_frac`,
//!   [`prescaled_size`]) resizes with torch's antialiased `uint8` kernel, LANCZOS by default.
//! - **Inkling2**: the image padded to the `(h, w)` grid (`⌈H / h⌉ × ⌈W / w⌉`), one patch per
//!   cell, row-major, channels-last: `pixel_values` `(Σ rows·cols, h, w, 3)` float32,
//!   `image_grid_thw` `(B, 3)` int64 `[1, rows, cols]`, `rows·cols` `<|unused_200054|>` per image
//!   (`Inkling2Processor`). Alpha is composited onto an 8-pixel checkerboard of 204 and 153
//!   (`(rgb·a + bg·(255 − a) + 127) // 255` in integers, [`checkerboard`]): 4-channel arrays,
//!   RGBA PIL images (handed over as such by Python) and encoded files decoded with
//!   `alpha="white"` (the processor given `Image.open(...)`).

use std::borrow::Cow;

use super::family::{
    i64_values, FamilyConfig, Hf, Published, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::input::Alpha;
use super::normalize::Normalize;
use super::torch_simd::{Affine, Rows};
use super::value::{
    as_hw, hf_keys, hf_put, hw_value, Common, Raw, Value, CLIP_MEAN, CLIP_STD, HALF,
};
use super::{
    checked_len, parallel, Input, Options, Out, OutBuffer, Outputs, ProcessorError, Rgb, RgbRef,
    Tensor, TensorData, MAX_SIDE,
};
use crate::image::decode::RgbaImage;
use crate::image::torch::TorchFilter;
use crate::image::Filter;
use crate::memory::fallible;

/// The image placeholder of both processors (`<|unused_200054|>`, `image_token_id` 200054 of
/// `InklingConfig` and `Inkling2Config`).
pub const IMAGE_TOKEN: &str = "<|unused_200054|>";
/// Its id in the published configs.
pub const IMAGE_TOKEN_ID: u32 = 200054;

/// Inkling: `InklingImageProcessor` (`default_to_square` false: an int `size` is a shortest
/// edge, which the class cannot use); `rescale_image_frac`,
/// `rescale_image_max_upscaled_long_edge` (`None` kept: no cap).
pub const INKLING: Hf = Hf {
    image_classes: &["InklingImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        let mut out = hf_keys(
            config,
            &["rescale_image_frac", "rescale_image_max_upscaled_long_edge"],
            false,
        )?;
        if config
            .iter()
            .any(|(k, v)| k == "rescale_image_max_upscaled_long_edge" && *v == Raw::None)
        {
            hf_put(
                &mut out,
                "rescale_image_max_upscaled_long_edge",
                Raw::Bool(false),
            );
        }
        Ok(out)
    },
    processor_keys: &[],
    processor_forces: None,
    // The ids are in the replacement spec (the run is split by num_patches).
    published: None,
    count_tensor: None,
};

/// Inkling2: `Inkling2ImageProcessor` (the torchvision backend's `default_to_square`).
pub const INKLING2: Hf = Hf {
    image_classes: &["Inkling2ImageProcessor"],
    video_classes: &[],
    normalise: |config| hf_keys(config, &[], true),
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published {
        image: IMAGE_TOKEN_ID,
        video: None,
        vision_tokens: None,
    }),
    count_tensor: None,
};

/// The `config.json` `model_type`s of the two families (transformers' auto classes:
/// `inkling_mm_model` → `InklingImageProcessor`; `inkling2`, `inkling2_loop` →
/// `Inkling2ImageProcessor`; the SMG gateway 1.13 matches `inkling_mm_model`).
pub const MODEL_TYPES: &[(&str, &str)] = &[
    ("inkling_mm_model", "inkling"),
    ("inkling", "inkling"),
    ("inkling2", "inkling2"),
    ("inkling2_loop", "inkling2"),
];

/// Ours: a patch side no model approaches.
const MAX_PATCH: usize = 4096;

/// The configuration of Inkling.
#[derive(Clone, Debug, PartialEq)]
pub struct InklingConfig {
    pub common: Common,
    /// `size` (square; the patch side).
    pub patch: (usize, usize),
    /// `rescale_image_frac`: `None` (the default) disables the pre-scaling.
    pub rescale_image_frac: Option<f64>,
    /// `rescale_image_max_upscaled_long_edge` (default 2048; `None`: no cap).
    pub max_upscaled_long_edge: Option<i64>,
}

impl InklingConfig {
    /// `InklingImageProcessor`'s defaults: patches of 40, CLIP mean/std, LANCZOS (used only by
    /// the pre-scaling), no pre-scaling, cap 2048.
    pub fn inkling() -> Self {
        let mut common = Common::new(CLIP_MEAN, CLIP_STD);
        common.resample = Filter::Lanczos;
        InklingConfig {
            common,
            patch: (40, 40),
            rescale_image_frac: None,
            max_upscaled_long_edge: Some(2048),
        }
    }

    /// `(rows, columns)` of an image of `height × width` (transformers' `divide_to_patches`).
    pub fn grid(&self, height: usize, width: usize) -> (usize, usize) {
        let p = self.patch.0;
        (height.div_ceil(p), width / p + 1)
    }
}

impl FamilyConfig for InklingConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.patch = as_hw("size", value)?,
            "rescale_image_frac" => {
                self.rescale_image_frac = match value {
                    Value::Float(v) => Some(*v),
                    Value::Int(v) => Some(*v as f64),
                    _ => {
                        return Err(ProcessorError::config(
                            "rescale_image_frac",
                            "a number or None",
                            value,
                        ))
                    }
                }
            }
            "rescale_image_max_upscaled_long_edge" => {
                self.max_upscaled_long_edge = match value {
                    Value::Int(v) => Some(*v),
                    Value::Bool(false) => None,
                    _ => {
                        return Err(ProcessorError::config(
                            "rescale_image_max_upscaled_long_edge",
                            "an integer, or None (false here)",
                            value,
                        ))
                    }
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut out = vec![
            ("size", hw_value(self.patch)),
            (
                "rescale_image_max_upscaled_long_edge",
                self.max_upscaled_long_edge
                    .map_or(Value::Bool(false), Value::Int),
            ),
        ];
        if let Some(frac) = self.rescale_image_frac {
            out.push(("rescale_image_frac", Value::Float(frac)));
        }
        out
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if !self.common.do_resize {
            return Err(ProcessorError::config(
                "do_resize",
                "not false (InklingImageProcessor: \"`do_resize` cannot be set to `False` for \
                 this model!\")",
                false,
            ));
        }
        if self.patch.0 != self.patch.1 || self.patch.0 > MAX_PATCH {
            return Err(ProcessorError::config(
                "size",
                format!(
                    "a square size of at most {MAX_PATCH} (InklingImageProcessor: \"Can resize \
                     only to square size\")"
                ),
                format!("{}x{} (HxW)", self.patch.0, self.patch.1),
            ));
        }
        if self.rescale_image_frac.is_some() && prescale_filter(self.common.resample).is_none() {
            return Err(ProcessorError::config(
                "resample",
                "LANCZOS (1), BILINEAR (2) or BICUBIC (3) with rescale_image_frac: the torch \
                 uint8 kernels ported",
                self.common.resample.pil_id(),
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
        inkling_images(self, inputs, options)
    }

    /// `InklingProcessor.replace_image_token`: one placeholder per patch.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "num_patches").map(<[i64]>::to_vec)
    }

    fn replacement_spec(&self) -> Option<ReplacementSpec> {
        Some(ReplacementSpec {
            grid: &["num_patches"],
            anchor: IMAGE_TOKEN,
            embed: IMAGE_TOKEN,
            tokens: &[IMAGE_TOKEN],
            defaults: &[(IMAGE_TOKEN, IMAGE_TOKEN_ID)],
            flat: &["pixel_values"],
            // The SMG gateway's name for the rows per image (its Inkling encoder layout).
            sizes: "tokens_per_item",
            per_sample: false,
            joins: &[],
        })
    }

    fn prompt_replacement(
        &self,
        grid: &[i64],
        ids: &TokenIds<'_>,
    ) -> Option<Result<Replacement, ProcessorError>> {
        Some((|| {
            let id = ids.get(IMAGE_TOKEN)?;
            let n = match grid {
                [n] if *n >= 1 => *n as usize,
                _ => {
                    return Err(ProcessorError::config(
                        "num_patches",
                        "one positive count per image",
                        format!("{grid:?}"),
                    ))
                }
            };
            Ok(Replacement {
                tokens: vec![id; n],
                embed: vec![true; n],
                rows: n,
            })
        })())
    }
}

/// The torch kernel of the pre-scaling's `resample`.
fn prescale_filter(filter: Filter) -> Option<TorchFilter> {
    match filter {
        Filter::Lanczos => Some(TorchFilter::Lanczos),
        Filter::Bilinear => Some(TorchFilter::Bilinear),
        Filter::Bicubic => Some(TorchFilter::Bicubic),
        _ => None,
    }
}

/// The size `(height, width)` the pre-scaling gives an image of `height × width`, or `None`
/// when it keeps the image (`ratio == 1`): the long edge times `frac`, capped at
/// `max(cap, long edge)`, each side `floor(side · ratio + 0.5)` (`_preprocess`, in Python's
/// float arithmetic).
pub fn prescaled_size(
    height: usize,
    width: usize,
    frac: f64,
    cap: Option<i64>,
) -> Option<(f64, f64)> {
    let long_edge = height.max(width) as f64;
    let mut target = long_edge * frac;
    if let Some(cap) = cap {
        target = target.min((cap as f64).max(long_edge));
    }
    let ratio = target / long_edge;
    (ratio != 1.0).then(|| {
        (
            (height as f64 * ratio + 0.5).floor(),
            (width as f64 * ratio + 0.5).floor(),
        )
    })
}

/// Inkling's optional pre-scaling of one image (`rescale_image_frac`), torch's antialiased
/// `uint8` resize with `filter`.
fn prescale<'a>(
    config: &InklingConfig,
    frac: f64,
    filter: TorchFilter,
    image: Rgb<'a>,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    let Some((h, w)) = prescaled_size(
        image.height,
        image.width,
        frac,
        config.max_upscaled_long_edge,
    ) else {
        return Ok(image);
    };
    if !(h >= 1.0 && w >= 1.0 && h <= MAX_SIDE as f64 && w <= MAX_SIDE as f64) {
        return Err(ProcessorError::shape(
            "rescale_image_frac",
            format!("a pre-scaled size of 1 to {MAX_SIDE} pixels a side"),
            format!(
                "{}x{} (HxW) scaled by {frac} to {h}x{w}",
                image.height, image.width
            ),
        ));
    }
    if (h, w) == (1.0, 1.0) && image.height != 1 {
        // torch 2.14.1's uint8 antialiased kernel trips an internal assertion
        // (`num_channels == unpacked_output.size(0)`) resizing to 1 x 1 from more than one row.
        return Err(ProcessorError::shape(
            "rescale_image_frac",
            "a pre-scaled size other than 1x1 from an image taller than 1 (torch's uint8 \
             resize raises there)",
            format!(
                "{}x{} (HxW) scaled by {frac} to 1x1",
                image.height, image.width
            ),
        ));
    }
    super::torch_backend::resize(image, h as usize, w as usize, filter, threads)
}

/// The configuration of Inkling2.
#[derive(Clone, Debug, PartialEq)]
pub struct Inkling2Config {
    pub common: Common,
    /// `size`: the patch `(height, width)`.
    pub patch: (usize, usize),
}

impl Inkling2Config {
    /// `Inkling2ImageProcessor`'s defaults: patches of 40 × 40, mean/std 0.5.
    pub fn inkling2() -> Self {
        Inkling2Config {
            common: Common::new(HALF, HALF),
            patch: (40, 40),
        }
    }
}

impl FamilyConfig for Inkling2Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.patch = as_hw("size", value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![("size", hw_value(self.patch))]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if self.patch.0 > MAX_PATCH || self.patch.1 > MAX_PATCH {
            return Err(ProcessorError::config(
                "size",
                format!("sides of at most {MAX_PATCH}"),
                format!("{}x{} (HxW)", self.patch.0, self.patch.1),
            ));
        }
        // `_preprocess` ignores do_resize and resample.
        Ok(())
    }

    fn keeps_alpha(&self) -> bool {
        true
    }

    fn images(
        &self,
        _normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        inkling2_images(self, inputs, options)
    }

    /// `Inkling2Processor.replace_image_token`: `prod(image_grid_thw)` placeholders.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "image_grid_thw")
            .map(|grid| grid.chunks_exact(3).map(|g| g[0] * g[1] * g[2]).collect())
    }
}

/// The torchvision backend's `rescale_and_normalize` of one `float32` value of channel `c`:
/// fused `(x − f32(mean)·f32(1/rescale)) / (f32(std)·f32(1/rescale))` with both steps on,
/// `(x − f32(mean)) / f32(std)` with only `do_normalize`, `x · f32(rescale)` with only
/// `do_rescale`, else `x` — every operation in `float32`.
pub fn torch_value(common: &Common, c: usize, x: f32) -> f32 {
    match (common.do_rescale, common.do_normalize) {
        (true, true) => {
            let inverse = (1.0 / common.rescale_factor) as f32;
            let m = common.image_mean[c] as f32 * inverse;
            let s = common.image_std[c] as f32 * inverse;
            (x - m) / s
        }
        (false, true) => (x - common.image_mean[c] as f32) / common.image_std[c] as f32,
        (true, false) => x * common.rescale_factor as f32,
        (false, false) => x,
    }
}

/// [`torch_value`] of every byte value per channel, and of the `-1.0` padding.
struct Values {
    /// The value of every input ([`torch_value`]), with a vector kernel when one reproduces it.
    affine: Affine,
    pad: [f32; 3],
}

impl Values {
    fn new(common: &Common) -> Self {
        let mut table = [[0f32; 256]; 3];
        for (c, row) in table.iter_mut().enumerate() {
            for (v, slot) in row.iter_mut().enumerate() {
                *slot = torch_value(common, c, v as f32);
            }
        }
        let pad = [0, 1, 2].map(|c| torch_value(common, c, -1.0));
        // `torch_value` as `(x − m) / s` for the kernel to try (`Affine::new` keeps it only if
        // it gives the table's bits; a rescale alone, `x · factor`, usually does not).
        let f32s = |v: [f64; 3]| v.map(|x| x as f32);
        let inverse = (1.0 / common.rescale_factor) as f32;
        let (m, s) = match (common.do_rescale, common.do_normalize) {
            (true, true) => (
                f32s(common.image_mean).map(|x| x * inverse),
                f32s(common.image_std).map(|x| x * inverse),
            ),
            (false, true) => (f32s(common.image_mean), f32s(common.image_std)),
            (true, false) => ([0.0; 3], [inverse; 3]),
            (false, false) => ([0.0; 3], [1.0; 3]),
        };
        Values {
            affine: Affine::new(table, m, s),
            pad,
        }
    }

    /// The `h × w` window at `(top, left)` of `image`, padded where it leaves the image,
    /// channels-last into `out` (`h · w · 3` values, every one written).
    fn write_window(
        &self,
        image: RgbRef<'_>,
        (top, left): (usize, usize),
        (h, w): (usize, usize),
        out: &mut [Out],
    ) {
        debug_assert_eq!(out.len(), h * w * 3);
        let inside_w = image.width.saturating_sub(left).min(w);
        let inside_h = image.height.saturating_sub(top).min(h);
        if inside_w > 0 && inside_h > 0 {
            let start = (top * image.width + left) * 3;
            let rows = Rows {
                n: inside_w * 3,
                rows: inside_h,
                stride: image.width * 3,
                out_stride: w * 3,
            };
            self.affine
                .write_interleaved_rows(&image.data[start..], rows, out);
        }
        let pad = self.pad.map(Out::new);
        for (y, row) in out.chunks_exact_mut(w * 3).enumerate() {
            let from = if y < inside_h { inside_w * 3 } else { 0 };
            for dst in row[from..].chunks_exact_mut(3) {
                dst.copy_from_slice(&pad);
            }
        }
    }
}

/// The torchvision backend's `convert_to_rgb` of one colour value over white (4-channel
/// arrays): `to_dtype(float32, scale=True)` (`x · f32(1/255)`), `v·a + (1 − a)`, then
/// `to_dtype(uint8, scale=True)` (`· 255.999`, truncated), each step in `float32`.
pub fn torch_over_white(value: u8, alpha: u8) -> u8 {
    let scale = (1.0f64 / 255.0) as f32;
    let v = f32::from(value) * scale;
    let a = f32::from(alpha) * scale;
    let blended = v * a + (1.0 - a);
    (blended * (255.0f64 + 1.0 - 1e-3) as f32) as u8
}

/// `Inkling2ImageProcessor.convert_to_rgb` of an RGBA image: each pixel over an 8-pixel
/// checkerboard whose cell `(y // 8 + x // 8)` is 204 when even, else 153, as
/// `(rgb·a + bg·(255 − a) + 127) // 255`.
pub fn checkerboard(rgba: &[u8], width: usize, out: &mut Vec<u8>) {
    for (i, px) in rgba.chunks_exact(4).enumerate() {
        let (y, x) = (i / width, i % width);
        let bg: u32 = if (y / 8 + x / 8) % 2 == 0 { 204 } else { 153 };
        let a = u32::from(px[3]);
        for &v in &px[..3] {
            out.push(((u32::from(v) * a + bg * (255 - a) + 127) / 255) as u8);
        }
    }
}

/// A well-formed `height × width × 4` array, else `None` (left to [`Input::to_rgb`], which
/// reports what is wrong).
fn rgba_pixels<'a>(input: &Input<'a>) -> Option<(&'a [u8], usize, usize)> {
    match *input {
        Input::Pixels {
            data,
            width,
            height,
            channels: 4,
        } if width >= 1
            && height >= 1
            && width <= MAX_SIDE
            && height <= MAX_SIDE
            && data.len() == width * height * 4 =>
        {
            Some((data, width, height))
        }
        _ => None,
    }
}

fn owned(data: Vec<u8>, width: usize, height: usize) -> Rgb<'static> {
    Rgb {
        data: Cow::Owned(data),
        width,
        height,
    }
}

/// One input as RGB the way `InklingImageProcessor` receives it.
fn inkling_rgb<'a>(input: Input<'a>, options: &Options) -> Result<Rgb<'a>, ProcessorError> {
    let Some((data, width, height)) = rgba_pixels(&input) else {
        return input.to_rgb(options);
    };
    let mut out = fallible::with_capacity(width * height * 3)
        .map_err(ProcessorError::oom("image converted to RGB"))?;
    for px in data.chunks_exact(4) {
        out.extend(px[..3].iter().map(|&v| torch_over_white(v, px[3])));
    }
    Ok(owned(out, width, height))
}

/// One input as RGB the way `Inkling2ImageProcessor` receives it (alpha over the checkerboard).
fn inkling2_rgb<'a>(input: Input<'a>, options: &Options) -> Result<Rgb<'a>, ProcessorError> {
    let oom = ProcessorError::oom("image converted to RGB");
    if let Some((data, width, height)) = rgba_pixels(&input) {
        let mut out = fallible::with_capacity(width * height * 3).map_err(oom)?;
        checkerboard(data, width, &mut out);
        return Ok(owned(out, width, height));
    }
    if let (Input::Encoded(bytes), Alpha::White) = (input, options.alpha) {
        let decoded = crate::image::decode::decode_keeping_alpha(
            bytes,
            options.apply_exif,
            options.max_pixels,
            options.threads,
        )
        .map_err(|error| ProcessorError::Decode { index: 0, error })?;
        return Ok(match decoded {
            RgbaImage::Rgb(image) => {
                owned(image.pixels, image.width as usize, image.height as usize)
            }
            RgbaImage::Rgba {
                width,
                height,
                pixels,
            } => {
                let (w, h) = (width as usize, height as usize);
                let mut out = fallible::with_capacity(w * h * 3).map_err(oom)?;
                checkerboard(&pixels, w, &mut out);
                owned(out, w, h)
            }
        });
    }
    input.to_rgb(options)
}

/// Converts every input on the batch's threads, the first error (by index) returned.
fn convert_all<'a>(
    inputs: &[Input<'a>],
    options: &Options,
    convert: fn(Input<'a>, &Options) -> Result<Rgb<'a>, ProcessorError>,
) -> Result<Vec<Rgb<'a>>, ProcessorError> {
    let pixels = inputs
        .iter()
        .fold(0u64, |sum, input| sum.saturating_add(input.cost_hint()));
    let workers = parallel::decoders(options.threads, inputs.len(), pixels);
    // One image decodes with all the batch's threads, several with one each.
    let item = options.per_item(workers);
    let items = fallible::copied(inputs).map_err(ProcessorError::oom("batch"))?;
    parallel::map(items, workers, |i, input| {
        convert(input, &item).map_err(|e| e.at(i))
    })
    .into_iter()
    .collect()
}

/// Inkling on a batch (see the module docs).
pub fn inkling_images(
    config: &InklingConfig,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let p = config.patch.0;
    let values = Values::new(&config.common);
    let mut images = convert_all(inputs, options, inkling_rgb)?;
    if let Some(frac) = config.rescale_image_frac {
        // `validate` checked the filter.
        let filter = prescale_filter(config.common.resample).unwrap_or(TorchFilter::Lanczos);
        let pixels = images.iter().fold(0u64, |sum, image| {
            sum.saturating_add((image.width as u64).saturating_mul(image.height as u64))
        });
        let workers = parallel::decoders(options.threads, images.len(), pixels);
        let threads = options.per_item(workers).threads;
        images = parallel::map(images, workers, |i, image| {
            prescale(config, frac, filter, image, threads).map_err(|e| e.at(i))
        })
        .into_iter()
        .collect::<Result<_, _>>()?;
    }
    let counts: Vec<usize> = images
        .iter()
        .map(|im| {
            let (rows, cols) = config.grid(im.height, im.width);
            rows * cols
        })
        .collect();
    let total: usize = counts.iter().sum();
    let per_patch = 2 * p * p * 3;
    let len = checked_len("pixel_values", &[total, 2, p, p, 3], 4)?;
    let mut buffer = OutBuffer::new("pixel_values", len)?;
    let lengths: Vec<usize> = counts.iter().map(|n| n * per_patch).collect();
    let work: Vec<(&Rgb<'_>, &mut [Out])> = images.iter().zip(buffer.slices(&lengths)).collect();
    let workers = parallel::writers(options.threads, work.len(), 4 * len);
    parallel::map(work, workers, |_, (image, out)| {
        let cols = config.grid(image.height, image.width).1;
        for (k, slot) in out.chunks_exact_mut(per_patch).enumerate() {
            let origin = ((k / cols) * p, (k % cols) * p);
            let (first, second) = slot.split_at_mut(per_patch / 2);
            values.write_window(image.view(), origin, (p, p), first);
            second.copy_from_slice(first);
        }
    });
    // SAFETY: the slices cover the buffer (`lengths` sum to `len`), and each is written whole:
    // every patch's first copy by `write_window` (every value of its window), its second
    // copied from the first.
    let pixels = unsafe { buffer.finish() };
    super::recycle_images(images);
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![total, 2, p, p, 3],
                    data: TensorData::F32(pixels),
                },
            ),
            (
                "num_patches",
                Tensor::i64(
                    vec![counts.len()],
                    counts.iter().map(|&n| n as i64).collect(),
                ),
            ),
        ],
    })
}

/// Inkling2 on a batch (see the module docs).
pub fn inkling2_images(
    config: &Inkling2Config,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let (ph, pw) = config.patch;
    let values = Values::new(&config.common);
    let images = convert_all(inputs, options, inkling2_rgb)?;
    let grids: Vec<(usize, usize)> = images
        .iter()
        .map(|im| (im.height.div_ceil(ph), im.width.div_ceil(pw)))
        .collect();
    let total: usize = grids.iter().map(|(r, c)| r * c).sum();
    let per_patch = ph * pw * 3;
    let len = checked_len("pixel_values", &[total, ph, pw, 3], 4)?;
    let mut buffer = OutBuffer::new("pixel_values", len)?;
    let lengths: Vec<usize> = grids.iter().map(|(r, c)| r * c * per_patch).collect();
    let work: Vec<((&Rgb<'_>, usize), &mut [Out])> = images
        .iter()
        .zip(grids.iter().map(|g| g.1))
        .zip(buffer.slices(&lengths))
        .collect();
    let workers = parallel::writers(options.threads, work.len(), 4 * len);
    parallel::map(work, workers, |_, ((image, cols), out)| {
        for (k, slot) in out.chunks_exact_mut(per_patch).enumerate() {
            let origin = ((k / cols) * ph, (k % cols) * pw);
            values.write_window(image.view(), origin, (ph, pw), slot);
        }
    });
    // SAFETY: the slices cover the buffer (`lengths` sum to `len`) and `write_window` writes
    // every value of every patch.
    let pixels = unsafe { buffer.finish() };
    super::recycle_images(images);
    let grid: Vec<i64> = grids
        .iter()
        .flat_map(|&(r, c)| [1, r as i64, c as i64])
        .collect();
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![total, ph, pw, 3],
                    data: TensorData::F32(pixels),
                },
            ),
            ("image_grid_thw", Tensor::i64(vec![grids.len(), 3], grid)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_and_padding_column() {
        let c = InklingConfig::inkling();
        assert_eq!(c.grid(40, 40), (1, 2));
        assert_eq!(c.grid(41, 79), (2, 2));
        assert_eq!(c.grid(1, 1), (1, 1));
        let pixels = vec![7u8; 40 * 80 * 3];
        let input = Input::Pixels {
            data: &pixels,
            width: 80,
            height: 40,
            channels: 3,
        };
        let out = inkling_images(&c, &[input], &Options::default()).unwrap();
        let t = out.get("pixel_values").unwrap();
        assert_eq!(t.shape, vec![3, 2, 40, 40, 3]);
        let TensorData::F32(v) = &t.data else {
            panic!()
        };
        let values = Values::new(&c.common);
        // The third patch is padding only, in both copies.
        let third = &v[2 * 9600..];
        assert!(third.chunks_exact(3).all(|px| px == values.pad));
        assert_eq!(v[0], values.affine.value(0, 7));
        assert_eq!(i64_values(&out, "num_patches"), Some(&[3i64][..]));
    }

    #[test]
    fn inkling2_grid_and_tokens() {
        let c = Inkling2Config::inkling2();
        let pixels = vec![0u8; 41 * 81 * 4];
        let input = Input::Pixels {
            data: &pixels,
            width: 81,
            height: 41,
            channels: 4,
        };
        let out = inkling2_images(&c, &[input], &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, vec![6, 40, 40, 3]);
        assert_eq!(i64_values(&out, "image_grid_thw"), Some(&[1i64, 2, 3][..]));
        assert_eq!(c.image_tokens(&out, None), Some(vec![6]));
    }

    #[test]
    fn prescaled_sizes() {
        // InklingImageProcessor._preprocess: the long edge times frac, capped at
        // max(cap, long edge), sides floor(side * ratio + 0.5).
        assert_eq!(
            prescaled_size(600, 512, 0.5, Some(2048)),
            Some((300.0, 256.0))
        );
        assert_eq!(
            prescaled_size(1000, 1000, 2.0, Some(2048)),
            Some((2000.0, 2000.0))
        );
        // Already above the cap: kept.
        assert_eq!(prescaled_size(3024, 4032, 2.0, Some(2048)), None);
        assert_eq!(prescaled_size(100, 50, 1.7, Some(300)), Some((170.0, 85.0)));
        assert_eq!(
            prescaled_size(100, 50, 4.0, Some(300)),
            Some((300.0, 150.0))
        );
        assert_eq!(prescaled_size(100, 50, 4.0, None), Some((400.0, 200.0)));
        assert_eq!(prescaled_size(7, 5, 1.0, Some(2048)), None);
    }

    #[test]
    fn composites() {
        assert_eq!(torch_over_white(0, 0), 255);
        assert_eq!(torch_over_white(77, 255), 77);
        let mut out = Vec::new();
        checkerboard(&[10, 20, 30, 0, 10, 20, 30, 255], 2, &mut out);
        assert_eq!(out, vec![204, 204, 204, 10, 20, 30]);
        out.clear();
        // x = 8 starts the next cell: 153.
        let row: Vec<u8> = (0..9).flat_map(|_| [0u8, 0, 0, 0]).collect();
        checkerboard(&row, 9, &mut out);
        assert_eq!(&out[24..], &[153, 153, 153]);
    }
}
