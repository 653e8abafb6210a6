//! Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 and Qwen3-Omni (image and video towers): one
//! algorithm (`Qwen2VLImageProcessorPil`), configured by patch size, merge size, temporal patch
//! size, pixel bounds, mean and std.
//!
//! Per image: [`smart_resize`] picks a size that is a multiple of `patch_size × merge_size`
//! within `[min_pixels, max_pixels]`, the image is resized to it (BICUBIC by default, Pillow-exact),
//! rescaled and normalised, and cut into `patch_size²` patches. Patch rows come in merge-window
//! order (each `merge × merge` window contiguous, windows row-major); a row holds channel, frame,
//! y, x (a still image is repeated over the `temporal_patch_size` frames).
//!
//! Videos (`Qwen2VLVideoProcessor`'s layout): every frame is resized like an image, the frames
//! are grouped `temporal_patch_size` at a time (the last frame repeated to fill the last group)
//! and each group is patched like an image whose frames differ.

use super::family::{i64_values, tokens_tensor, FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::{Normalize, Runs};
use super::value::{
    as_count, hf_get, hf_keys, hf_put, hf_size, BadSize, Common, Raw, RawMap, Value, CLIP_MEAN,
    CLIP_STD, HALF,
};
use std::mem::MaybeUninit;

use crate::tensor::dtype::WireDtype;
use crate::tensor::wire::Produce;
use crate::tensor::TensorError;

use super::store::{Element, PRODUCE_STREAM_MIN_BYTES, WRITE_STREAM_MIN_BYTES};
use super::{
    checked_len, parallel, prepare_all, prepare_all_indexed, recycle_images, resize_rgb,
    split_lengths, store, Deferred, Input, Options, OutBuffer, Outputs, ProcessorError, Rgb,
    RgbRef, Tensor, TensorData,
};

/// The configuration of the Qwen families.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenConfig {
    pub common: Common,
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    /// `size["shortest_edge"]` (`min_pixels`).
    pub min_pixels: u64,
    /// `size["longest_edge"]` (`max_pixels`).
    pub max_pixels: u64,
    /// `(shortest_edge, longest_edge)` of the `size` the family's *processor* passes to its
    /// video processor on every call, over the preprocessor config's pixel bounds
    /// (`Qwen3OmniMoeProcessor.videos_kwargs`); `None`: videos use `min_pixels`/`max_pixels`.
    pub video_pixels: Option<(u64, u64)>,
    /// The frame rate a video's frames were sampled at, for `video_second_per_grid`
    /// (`temporal_patch_size / fps` per video, Qwen3-Omni's M-RoPE timing): `Some` for a family
    /// whose processor returns it (`Qwen3OmniMoeProcessor`: the caller's `fps`, else 1.0).
    pub video_fps: Option<f64>,
}

/// Qwen2-VL: `Qwen2VLImageProcessor`, `Qwen2VLVideoProcessor`.
pub const QWEN2_VL: Hf = Hf {
    image_classes: &["Qwen2VLImageProcessor"],
    video_classes: &["Qwen2VLVideoProcessor"],
    normalise: |config| hf_qwen(config, &QwenConfig::qwen2_vl()),
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::QWEN),
    count_tensor: None,
};
/// Qwen2.5-VL: `Qwen2_5_VLImageProcessor`.
pub const QWEN2_5_VL: Hf = Hf {
    image_classes: &["Qwen2_5_VLImageProcessor"],
    video_classes: &[],
    normalise: |config| hf_qwen(config, &QwenConfig::qwen2_vl()),
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::QWEN),
    count_tensor: None,
};
/// Qwen3-VL (its image processor is Qwen2-VL's class): `Qwen3VLVideoProcessor`.
pub const QWEN3_VL: Hf = Hf {
    image_classes: &[],
    video_classes: &["Qwen3VLVideoProcessor"],
    normalise: |config| hf_qwen(config, &QwenConfig::qwen3_vl()),
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::QWEN),
    count_tensor: None,
};
/// Qwen3.5 (Qwen2-VL's class, named by `family=` only).
pub const QWEN3_5: Hf = Hf {
    image_classes: &[],
    video_classes: &[],
    normalise: |config| hf_qwen(config, &QwenConfig::qwen3_vl()),
    processor_keys: &[],
    processor_forces: None,
    // Qwen3.5: transformers' Qwen3_5Config image_token_id / video_token_id, the published
    // checkpoints' values.
    published: Some(Published {
        image: 248056,
        video: Some(248057),
        vision_tokens: None,
    }),
    count_tensor: None,
};

/// Qwen3-Omni (`qwen3_omni_moe`, its thinker's image and video towers): transformers 5.24 maps
/// the model type to `Qwen2VLImageProcessor` and `Qwen2VLVideoProcessor` (named by `family=` or
/// the model type: the classes name Qwen2-VL), with `Qwen3OmniMoeProcessor` forcing the video
/// size. Its replacement is a run of `<|image_pad|>` 151655 / `<|video_pad|>` 151656
/// (`Qwen3OmniMoeThinkerConfig` defaults, the published checkpoints' `thinker_config`).
pub const QWEN3_OMNI_MOE: Hf = Hf {
    image_classes: &[],
    video_classes: &[],
    normalise: hf_qwen3_omni,
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::QWEN),
    count_tensor: None,
};

/// The `model_type`s (`config.json`) that name a Qwen family, the aliases the SMG gateway
/// accepts included: transformers 5.24 gives `qwen3_5_moe` and `qwen4_exp` Qwen3.5's image
/// processor, video processor, processor and token ids (248056/248057); `qwen3_6`/`qwen3_6_moe`
/// are the gateway's Qwen3.6 spellings (same architecture as Qwen3.5); `qwen3_vl_moe` is
/// Qwen3-VL's MoE model; `qwen3_omni_moe_thinker` is Qwen3-Omni's thinker alone.
pub const MODEL_TYPES: &[(&str, &str)] = &[
    ("qwen2_vl", "qwen2_vl"),
    ("qwen2_5_vl", "qwen2_5_vl"),
    ("qwen3_vl", "qwen3_vl"),
    ("qwen3_vl_moe", "qwen3_vl"),
    ("qwen3_5", "qwen3_5"),
    ("qwen3_5_moe", "qwen3_5"),
    ("qwen3_6", "qwen3_5"),
    ("qwen3_6_moe", "qwen3_5"),
    ("qwen4_exp", "qwen3_5"),
    ("qwen3_omni_moe", "qwen3_omni_moe"),
    ("qwen3_omni_moe_thinker", "qwen3_omni_moe"),
];

/// The transformers processor classes (`processor_class`) that name a Qwen family over its
/// image processor class (Qwen3-Omni's files name `Qwen2VLImageProcessor`).
pub const PROCESSOR_CLASSES: &[(&str, &str)] = &[("Qwen3OmniMoeProcessor", "qwen3_omni_moe")];

/// The Qwen keys: an int `size` is a shortest edge; top-level `min_pixels`/`max_pixels`
/// override `size["shortest_edge"]`/`size["longest_edge"]` (as
/// `Qwen2VLImageProcessorPil.__init__` does), and a partial size is completed from the class
/// default the processor would keep (`defaults`).
fn hf_qwen(config: &[(String, Raw)], defaults: &QwenConfig) -> Result<RawMap, BadSize> {
    let mut out = hf_keys(
        config,
        &["patch_size", "merge_size", "temporal_patch_size"],
        false,
    )?;
    let mut size = match hf_get(&out, "size") {
        Some(Raw::Map(size)) => size.clone(),
        _ => RawMap::new(),
    };
    for (key, edge) in [
        ("min_pixels", "shortest_edge"),
        ("max_pixels", "longest_edge"),
    ] {
        if let Some(value) = hf_get(config, key) {
            hf_put(&mut size, edge, value.clone());
            size.retain(|(k, _)| k != key);
        }
    }
    if !size.is_empty() {
        if size.len() == 1 && matches!(size[0].0.as_str(), "shortest_edge" | "longest_edge") {
            let mut full = vec![
                (
                    "shortest_edge".to_owned(),
                    Raw::Int(defaults.min_pixels as i64),
                ),
                (
                    "longest_edge".to_owned(),
                    Raw::Int(defaults.max_pixels as i64),
                ),
            ];
            for (key, value) in size {
                hf_put(&mut full, &key, value);
            }
            size = full;
        }
        hf_put(&mut out, "size", Raw::Map(size));
    }
    Ok(out)
}

/// [`hf_qwen`], and our `video_size` (the processor's video `size`, as a caller's
/// `videos_kwargs` would override it) read like a `size`.
fn hf_qwen3_omni(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    let mut out = hf_qwen(config, &QwenConfig::qwen3_omni())?;
    if let Some(size) = hf_get(config, "video_size") {
        hf_put(&mut out, "video_size", Raw::Map(hf_size(size, false)?));
    }
    if let Some(fps) = hf_get(config, "fps") {
        hf_put(&mut out, "fps", fps.clone());
    }
    Ok(out)
}

const MAX_PATCH: usize = 1024;
const MAX_MERGE: usize = 64;
const MAX_TEMPORAL: usize = 64;

impl QwenConfig {
    /// `Qwen2VLImageProcessorPil`'s class defaults (Qwen2-VL, Qwen2.5-VL).
    pub fn qwen2_vl() -> Self {
        QwenConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            video_pixels: None,
            video_fps: None,
        }
    }

    /// The values of the published Qwen3-VL / Qwen3.5 `preprocessor_config.json` files.
    pub fn qwen3_vl() -> Self {
        QwenConfig {
            common: Common::new(HALF, HALF),
            patch_size: 16,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            video_pixels: None,
            video_fps: None,
        }
    }

    /// The values of the published Qwen3-Omni `preprocessor_config.json` (patch 16, merge 2,
    /// temporal 2, mean/std 0.5, 3 136 … 12 845 056 pixels), and the video size
    /// `Qwen3OmniMoeProcessor.videos_kwargs` passes on every call: 128·32² … 768·32² pixels.
    pub fn qwen3_omni() -> Self {
        QwenConfig {
            common: Common::new(HALF, HALF),
            patch_size: 16,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 3_136,
            max_pixels: 12_845_056,
            video_pixels: Some((128 * 32 * 32, 768 * 32 * 32)),
            video_fps: Some(1.0),
        }
    }

    /// The configuration frames of a video are resized with: `video_pixels` over the bounds.
    fn for_videos(&self) -> QwenConfig {
        let mut config = self.clone();
        if let Some((min, max)) = self.video_pixels {
            config.min_pixels = min;
            config.max_pixels = max;
        }
        config
    }

    /// `video_second_per_grid` of each video: `temporal_patch_size / fps`, as
    /// `Qwen3OmniMoeProcessor._process_videos` computes it (in `f64`), stored as `f32`.
    pub fn second_per_grid(&self) -> Option<f32> {
        self.video_fps
            .map(|fps| (self.temporal_patch_size as f64 / fps) as f32)
    }

    /// `patch_size × merge_size`.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }
}

impl FamilyConfig for QwenConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size" => self.patch_size = as_count("patch_size", value, MAX_PATCH)?,
            "merge_size" => self.merge_size = as_count("merge_size", value, MAX_MERGE)?,
            "temporal_patch_size" => {
                self.temporal_patch_size = as_count("temporal_patch_size", value, MAX_TEMPORAL)?
            }
            "fps" if self.video_fps.is_some() => {
                // the caller's `fps` (Qwen3-Omni's processor: 1.0 when none is given)
                let fps = match value {
                    Value::Int(v) => *v as f64,
                    Value::Float(v) => *v,
                    _ => f64::NAN,
                };
                if !(fps.is_finite() && fps > 0.0) {
                    return Err(ProcessorError::config(
                        "fps",
                        "a finite number above 0",
                        value,
                    ));
                }
                self.video_fps = Some(fps);
            }
            "video_size" => {
                // The processor's video size (`Qwen3OmniMoeProcessor.videos_kwargs["size"]`).
                let (min, max) = size_pair("video_size", value)?;
                self.video_pixels = Some((min, max));
            }
            "min_pixels" => self.min_pixels = pixels("min_pixels", value)?,
            "max_pixels" => self.max_pixels = pixels("max_pixels", value)?,
            "size" => {
                // {"shortest_edge", "longest_edge"}, or the legacy {"min_pixels", "max_pixels"}.
                (self.min_pixels, self.max_pixels) = size_pair("size", value)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let size = Value::Map(vec![
            ("shortest_edge".to_owned(), self.min_pixels as i64),
            ("longest_edge".to_owned(), self.max_pixels as i64),
        ]);
        let mut out = vec![
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("merge_size", Value::Int(self.merge_size as i64)),
            (
                "temporal_patch_size",
                Value::Int(self.temporal_patch_size as i64),
            ),
            ("size", size),
        ];
        if let Some(fps) = self.video_fps {
            out.push(("fps", Value::Float(fps)));
        }
        if let Some((min, max)) = self.video_pixels {
            out.push((
                "video_size",
                Value::Map(vec![
                    ("shortest_edge".to_owned(), min as i64),
                    ("longest_edge".to_owned(), max as i64),
                ]),
            ));
        }
        out
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        // set() checks every value; the config is valid by construction.
        Ok(())
    }

    fn images(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        images(self, normalize, inputs, options)
    }

    fn images_deferred<'a>(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        plan_images(self, normalize, inputs, options).map(|p| Deferred::Patches(Box::new(p)))
    }

    fn videos(
        &self,
        normalize: &Normalize,
        batch: &[Vec<Input<'_>>],
        options: &Options,
    ) -> Option<Result<Outputs, ProcessorError>> {
        Some(videos(self, normalize, batch, options))
    }

    fn videos_deferred<'a>(
        &self,
        normalize: &Normalize,
        batch: &[Vec<Input<'a>>],
        options: &Options,
    ) -> Option<Result<Deferred<'a>, ProcessorError>> {
        Some(plan_videos(self, normalize, batch, options).map(|p| Deferred::Patches(Box::new(p))))
    }

    /// `grid_h · grid_w / merge_size²` per image (`image_grid_thw`).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "image_grid_thw").map(|grid| grid_tokens(grid, self.merge_size))
    }

    /// `grid_t · grid_h · grid_w / merge_size²` per video (`video_grid_thw`).
    fn video_tokens(&self, outputs: &Outputs) -> Option<Vec<i64>> {
        i64_values(outputs, "video_grid_thw").map(|grid| grid_tokens(grid, self.merge_size))
    }
}

/// `t · h · w / merge_size²` per `[t, h, w]` row of a grid (`image_grid_thw`,
/// `video_grid_thw`): the placeholder tokens of each image or video.
pub fn grid_tokens(grid: &[i64], merge_size: usize) -> Vec<i64> {
    let merge = (merge_size * merge_size) as i64;
    grid.chunks_exact(3)
        .map(|r| r[0] * r[1] * r[2] / merge)
        .collect()
}

/// A Qwen `size`: `{"shortest_edge", "longest_edge"}` (or the legacy `{"min_pixels",
/// "max_pixels"}`) as `(min_pixels, max_pixels)`.
fn size_pair(field: &'static str, value: &Value) -> Result<(u64, u64), ProcessorError> {
    let bad = || {
        ProcessorError::config(
            field,
            "a dict with keys shortest_edge and longest_edge (min and max pixels)",
            value,
        )
    };
    let Value::Map(entries) = value else {
        return Err(bad());
    };
    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    let (min_key, max_key) = match keys[..] {
        ["longest_edge", "shortest_edge"] => ("shortest_edge", "longest_edge"),
        ["max_pixels", "min_pixels"] => ("min_pixels", "max_pixels"),
        _ => return Err(bad()),
    };
    let get = |k: &str| {
        entries
            .iter()
            .find(|(key, _)| key == k)
            .map_or(0, |(_, v)| *v)
    };
    let (min_field, max_field) = if field == "size" {
        ("size.shortest_edge", "size.longest_edge")
    } else {
        ("video_size.shortest_edge", "video_size.longest_edge")
    };
    Ok((
        pixels(min_field, &Value::Int(get(min_key)))?,
        pixels(max_field, &Value::Int(get(max_key)))?,
    ))
}

fn pixels(field: &'static str, value: &Value) -> Result<u64, ProcessorError> {
    match value {
        // Python treats 0 as "not set" (and the processor then raises).
        Value::Int(v) if *v >= 1 && *v <= 1 << 40 => Ok(*v as u64),
        _ => Err(ProcessorError::config(
            field,
            "an integer between 1 and 2**40",
            value,
        )),
    }
}

/// transformers' `smart_resize(height, width, factor, min_pixels, max_pixels)`, with its Python
/// arithmetic: `round` half to even, `/` in `f64`, `math.floor`/`math.ceil` of `f64` quotients,
/// evaluated in the order the Python code writes them.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), ProcessorError> {
    if ProcessorError::ratio(height, width) > 200.0 {
        return Err(ProcessorError::AspectRatio {
            index: 0,
            height,
            width,
        });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let fu = factor as u64;
    let mut h_bar = (h / f).round_ties_even() as u64 * fu;
    let mut w_bar = (w / f).round_ties_even() as u64 * fu;
    let area = height as u64 * width as u64;
    if h_bar * w_bar > max_pixels {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = fu.max((h / beta / f).floor() as u64 * fu);
        w_bar = fu.max((w / beta / f).floor() as u64 * fu);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = (h * beta / f).ceil() as u64 * fu;
        w_bar = (w * beta / f).ceil() as u64 * fu;
    }
    let side = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok((side(h_bar), side(w_bar)))
}

/// An image resized and checked, with its patch grid.
pub(crate) struct Prepared<'a> {
    pub(crate) image: Rgb<'a>,
    /// The input size (HxW), before resizing.
    pub(crate) input: (usize, usize),
    pub(crate) grid_h: usize,
    pub(crate) grid_w: usize,
}

fn prepare<'a>(
    config: &QwenConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let (h, w) = if config.common.do_resize {
        smart_resize(
            rgb.height,
            rgb.width,
            config.factor(),
            config.min_pixels,
            config.max_pixels,
        )?
    } else {
        (rgb.height, rgb.width)
    };
    prepare_at(config, rgb, (h, w), threads)
}

/// `rgb` resized to `(h, w)` (its own size when `do_resize` is off), which must be positive
/// multiples of `patch_size × merge_size`, with its patch grid.
pub(crate) fn prepare_at<'a>(
    config: &QwenConfig,
    rgb: Rgb<'a>,
    size: (usize, usize),
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    prepare_at_by(config, rgb, size, |rgb, h, w| {
        resize_rgb(rgb, h, w, &config.common, threads)
    })
}

/// [`prepare_at`] with another resize (`resize(rgb, h, w)`; MiniMax-M3-VL: torch's `uint8`
/// kernel): the same checks and grid.
pub(crate) fn prepare_at_by<'a, R>(
    config: &QwenConfig,
    rgb: Rgb<'a>,
    (h, w): (usize, usize),
    resize: R,
) -> Result<Prepared<'a>, ProcessorError>
where
    R: FnOnce(Rgb<'a>, usize, usize) -> Result<Rgb<'a>, ProcessorError>,
{
    let input = (rgb.height, rgb.width);
    let ps = config.patch_size;
    for (what, len) in [("height", h), ("width", w)] {
        if len % config.factor() != 0 || len == 0 {
            return Err(ProcessorError::shape(
                if config.common.do_resize {
                    "smart_resize size"
                } else {
                    "size (do_resize is off)"
                },
                format!(
                    "a {what} that is a positive multiple of patch_size x merge_size = {}",
                    config.factor()
                ),
                format!("{h}x{w} (HxW)"),
            ));
        }
    }
    let image = resize(rgb, h, w)?;
    Ok(Prepared {
        image,
        input,
        grid_h: h / ps,
        grid_w: w / ps,
    })
}

/// Writes the patches of merge-window row `window_row` (all `grid_w × merge` patch rows of it)
/// of `frames` (`temporal_patch_size` frames of the same size) into `out`, as the bytes of
/// little-endian `f32` values at any address.
///
/// Row `((bi·(gw/m) + bj)·m + mi)·m + mj` holds grid cell `(bi·m + mi, bj·m + mj)`; its column
/// `((c·T + t)·ps + y)·ps + x` holds the normalised value of channel `c` of frame `t` at pixel
/// `(i·ps + y, j·ps + x)`. Each patch of a distinct frame is normalised once and stored to every
/// frame slot showing it (a still image fills all `T` slots from one pass): straight from the
/// registers with unaligned stores, or with `stream` through a staging row copied out with
/// streaming stores (see [`store`]). As [`Element::Bf16`], each staged row is written as
/// little-endian `bfloat16` (round to nearest even), 2 bytes a value.
pub fn write_window_row(
    frames: &[RgbRef<'_>],
    patch_size: usize,
    merge_size: usize,
    window_row: usize,
    normalize: &Normalize,
    out: &mut [MaybeUninit<u8>],
    Writing { stream, element }: Writing,
) {
    let (ps, m, t_len) = (patch_size, merge_size, frames.len());
    // Streamed on a CPU with AVX-512 VBMI: from the registers, without the staging below.
    #[cfg(target_arch = "x86_64")]
    if stream && ps <= 16 && cfg!(target_endian = "little") {
        if let Some(wide) = normalize.wide() {
            if store::LinePacker::available() {
                // SAFETY: `wide` is only given on a CPU with AVX-512 F, BW, VBMI and FMA
                // (`avx512::available`), which `LinePacker::available` confirmed too; the twin
                // runs only where `bf16_hardware` found AVX-512 BF16 as well (and only on values
                // that are never subnormal, which it would round wrongly).
                unsafe {
                    if wide.rounds_on_cpu(element) {
                        write_window_row_wide_bf16(frames, ps, m, window_row, &wide, out, element)
                    } else {
                        write_window_row_wide(frames, ps, m, window_row, &wide, out, element)
                    }
                };
                store::fence(true);
                return;
            }
        }
    }
    let width = frames[0].width;
    let grid_w = width / ps;
    let block = ps * ps;
    let cols = 3 * t_len * block;
    debug_assert_eq!(out.len(), grid_w * m * cols * element.size());
    // Where each distinct frame's block goes in an output row, per channel: once per frame slot
    // showing it. `copies[t]` is empty unless frame `t` is distinct (a frame equal to the one
    // before it is not).
    let mut copies: Vec<Vec<[usize; 3]>> = vec![Vec::new(); t_len];
    let mut source = 0;
    for t in 0..t_len {
        if t > 0 && !same_frame(frames[t], frames[t - 1]) {
            source = t;
        }
        copies[source].push([0, 1, 2].map(|c| (c * t_len + t) * block));
    }
    let runs = Runs {
        width: ps,
        rows: ps,
        stride: width * 3,
        out_stride: ps,
    };
    // Values go straight from the registers into `out` (unaligned stores: a tensor inside a
    // serialized message sits at any byte offset), each output row's lines asked for while the
    // row before it is written; with streaming stores, a whole output row is staged (in the L1
    // cache) and copied out in one piece.
    let mut staging = Vec::new();
    let (mut rounded, mut narrow) = (Vec::new(), Vec::new());
    let mut rows = out.chunks_exact_mut(cols * element.size());
    for bj in 0..grid_w / m {
        for mi in 0..m {
            for mj in 0..m {
                let Some(row) = rows.next() else { break };
                let (i, j) = (window_row * m + mi, bj * m + mj);
                let first = (i * ps * width + j * ps) * 3;
                let patches = frames.iter().zip(&copies).filter(|(_, c)| !c.is_empty());
                if element == Element::Bf16 {
                    // Each distinct frame's patch is normalised once into `staging` (its three
                    // channels one block after another), rounded to bfloat16 once, and the
                    // rounded blocks copied to every frame slot showing it; the row, now whole,
                    // is copied out.
                    staging.resize(3 * block, 0f32);
                    rounded.resize(3 * block * 2, 0u8);
                    narrow.resize(cols * 2, 0u8);
                    for (frame, slots) in patches {
                        normalize.deinterleave_into(
                            &frame.data[first..],
                            runs,
                            &mut staging,
                            &[[0, block, 2 * block]],
                        );
                        store::bf16_row(&staging, &mut rounded);
                        for slot in slots {
                            for (c, &at) in slot.iter().enumerate() {
                                narrow[2 * at..2 * (at + block)]
                                    .copy_from_slice(&rounded[2 * c * block..2 * (c + 1) * block]);
                            }
                        }
                    }
                    store::copy_raw(row, &narrow, stream);
                } else if stream {
                    staging.resize(cols, 0f32);
                    for (frame, copies) in patches {
                        normalize.deinterleave_into(
                            &frame.data[first..],
                            runs,
                            &mut staging,
                            copies,
                        );
                    }
                    store::copy_bytes(row, &staging, true);
                } else {
                    // The next patch row's lines are asked for now, so that they arrive while
                    // this one is computed (MiniMax-M3-VL, 7-10 MB of `pixel_values` on the
                    // Intel VM: 17-20 % faster per call).
                    store::prefetch_for_write(
                        row.as_ptr().wrapping_add(row.len()).cast(),
                        row.len(),
                    );
                    let values = store::unaligned_of(row);
                    for (frame, copies) in patches {
                        normalize.deinterleave_into(&frame.data[first..], runs, values, copies);
                    }
                }
            }
        }
    }
    store::fence(stream);
}

#[cfg(target_arch = "x86_64")]
store::bf16_twins! {
/// [`write_window_row`] with streaming stores, each patch row's values computed into registers
/// (channel by channel, one run of `ps` values per pixel row) and streamed from there as whole
/// cache lines by a [`store::LinePacker`]: no staging row. The values are the fused formula's
/// ([`avx512::Registers::values`](super::normalize::avx512::Registers::values)), the same bits
/// as every other kernel of the normaliser; as [`Element::Bf16`] each is rounded as
/// [`store::bf16_vector`] rounds, as a staged row is (by the CPU in the twin,
/// `write_window_row_wide_bf16`: see [`store::bf16_twins`]).
///
/// Panics unless `1 ≤ ps ≤ 16` and every frame holds the window row's pixel rows.
///
/// # Safety
///
/// The CPU must have AVX-512 F, BW and VBMI and FMA (and BF16 for the twin).
unsafe fn write_window_row_wide / write_window_row_wide_bf16(
    frames: &[RgbRef<'_>],
    ps: usize,
    m: usize,
    window_row: usize,
    wide: &super::normalize::avx512::Wide,
    out: &mut [MaybeUninit<u8>],
    element: Element,
) {
    use std::arch::x86_64::*;
    assert!((1..=16).contains(&ps), "patch size {ps} outside 1..=16");
    let width = frames[0].width;
    let (grid_w, stride) = (width / ps, width.saturating_mul(3));
    // Every pixel row of this window row lies in every frame: the loads below stay in bounds.
    let rows = (window_row + 1)
        .checked_mul(m)
        .and_then(|n| n.checked_mul(ps))
        .unwrap_or(usize::MAX);
    for frame in frames {
        assert!(
            frame.width == width
                && rows
                    .checked_mul(stride)
                    .is_some_and(|n| frame.data.len() >= n),
            "a {}x{} frame of {} bytes has no window row {window_row} of {ps}-pixel patches",
            frame.width,
            frame.height,
            frame.data.len()
        );
    }
    // SAFETY: the CPU features are this function's contract.
    let registers = unsafe { wide.registers() };
    let mut packer = store::LinePacker::new(out);
    let load_mask: u64 = (1u64 << (3 * ps)) - 1; // 3·ps ≤ 48 bits
    let run_bytes = element.size() * ps;
    let mut values = [_mm512_setzero_si512(); 16];
    for bj in 0..grid_w / m {
        for mi in 0..m {
            for mj in 0..m {
                let (i, j) = (window_row * m + mi, bj * m + mj);
                let first = (i * ps * width + j * ps) * 3;
                for c in 0..3 {
                    // The frame whose channel `c` `values` holds: a frame equal to it (a still
                    // image over the temporal patch) is stored again without computing.
                    let mut held: Option<usize> = None;
                    for t in 0..frames.len() {
                        if !held.is_some_and(|h| same_frame(frames[h], frames[t])) {
                            let data = frames[t].data;
                            for (y, value) in values.iter_mut().enumerate().take(ps) {
                                let at = first + y * stride;
                                if c == 0 {
                                    // The bytes the next patch reads in this row, asked for
                                    // early (a prefetch never faults; `wrapping_add` claims
                                    // nothing about the address).
                                    _mm_prefetch::<_MM_HINT_T0>(
                                        data.as_ptr().wrapping_add(at + 3 * ps + 128).cast(),
                                    );
                                }
                                // SAFETY: the masked load reads only bytes `at..at + 3·ps`
                                // (masked-off bytes are not accessed): pixel row `i·ps + y < rows`
                                // from column `j·ps`, with `j·ps + ps ≤ grid_w·ps ≤ width`, inside
                                // `data` (asserted above).
                                let px = unsafe {
                                    _mm512_maskz_loadu_epi8(load_mask, data.as_ptr().add(at).cast())
                                };
                                let v = registers.values(px, c);
                                *value = to_bytes(element, v);
                            }
                            held = Some(t);
                        }
                        // Two runs joined into one vector where both fit (bfloat16; float32
                        // for ps ≤ 8): half the appends, the same bytes in the same order. Kept
                        // apart from the one-run loop: a chunk size chosen at run time made
                        // float32 (ps 14) 15–20 % slower.
                        if 2 * run_bytes <= 64 {
                            for pair in values[..ps].chunks(2) {
                                let (joined, len) = match *pair {
                                    [a, b] => (store::join(a, b, run_bytes), 2 * run_bytes),
                                    _ => (pair[0], run_bytes),
                                };
                                // SAFETY: the CPU features are this function's contract.
                                unsafe { packer.append(joined, len) };
                            }
                        } else {
                            for value in &values[..ps] {
                                // SAFETY: the CPU features are this function's contract.
                                unsafe { packer.append(*value, run_bytes) };
                            }
                        }
                    }
                }
            }
        }
    }
    // SAFETY: the CPU features are this function's contract.
    unsafe { packer.finish() };
}
}

/// How [`write_window_row`] writes: as which [`Element`], with streaming stores or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writing {
    pub element: Element,
    pub stream: bool,
}

fn same_frame(a: RgbRef<'_>, b: RgbRef<'_>) -> bool {
    std::ptr::eq(a.data, b.data)
}

/// `temporal_patch_size` frames (indices into [`Patches`]' frames; a still image is its one
/// frame repeated) cut into one block of rows of the output.
#[derive(Clone, Debug)]
struct Group {
    frames: Vec<usize>,
    grid_h: usize,
    grid_w: usize,
}

/// A batch resized, checked and laid out, its values not yet written: everything [`images`] and
/// [`videos`] do but the last pass. [`Patches::write`] writes `pixel_values` (or
/// `pixel_values_videos`) wherever the caller wants them — straight into a serialized request
/// or a shared-memory segment, so that the 4-bytes-a-value tensor is written once and never
/// copied — and [`Patches::into_outputs`] into a new tensor.
#[derive(Debug)]
pub struct Patches<'a> {
    frames: Vec<Rgb<'a>>,
    groups: Vec<Group>,
    /// One `[t, h, w]` row per image or video.
    grid: Vec<[i64; 3]>,
    video: bool,
    /// `video_second_per_grid` of every video, for a family whose processor returns it.
    second_per_grid: Option<f32>,
    patch_size: usize,
    merge_size: usize,
    normalize: Normalize,
    threads: usize,
}

impl<'a> Patches<'a> {
    /// Output rows (patches) and columns (`3 · T · ps²`).
    pub fn shape(&self) -> [usize; 2] {
        let rows = self.groups.iter().map(|g| g.grid_h * g.grid_w).sum();
        let t_len = self.groups.first().map_or(1, |g| g.frames.len());
        [rows, 3 * t_len * self.patch_size * self.patch_size]
    }

    /// The size of the written tensor in bytes.
    pub fn byte_len(&self) -> usize {
        self.len_as(Element::F32)
    }

    /// The size of the tensor written as `element`s, in bytes.
    fn len_as(&self, element: Element) -> usize {
        let [rows, cols] = self.shape();
        rows * cols * element.size()
    }

    /// The tensor's name: `pixel_values`, or `pixel_values_videos`.
    pub fn name(&self) -> &'static str {
        if self.video {
            "pixel_values_videos"
        } else {
            "pixel_values"
        }
    }

    /// `image_grid_thw` (`[1, h, w]` per image) or `video_grid_thw` (`[groups, h, w]` per video).
    pub fn grid(&self) -> (&'static str, Tensor) {
        let name = if self.video {
            "video_grid_thw"
        } else {
            "image_grid_thw"
        };
        let values = self.grid.iter().flatten().copied().collect();
        (name, Tensor::i64(vec![self.grid.len(), 3], values))
    }

    /// `video_second_per_grid` (`(videos,)` float32, one value per video: `temporal_patch_size
    /// / fps`) for a family whose processor returns it; `None` for images and other families.
    pub fn seconds(&self) -> Option<(&'static str, Tensor)> {
        let seconds = self.second_per_grid?;
        let n = self.grid.len();
        Some((
            "video_second_per_grid",
            Tensor {
                shape: vec![n],
                data: TensorData::F32(vec![seconds; n]),
            },
        ))
    }

    /// `num_image_tokens` (or `num_video_tokens`): the placeholder tokens of each image (or
    /// video), from the grid.
    pub fn tokens(&self) -> (&'static str, Tensor) {
        let name = if self.video {
            "num_video_tokens"
        } else {
            "num_image_tokens"
        };
        let grid: Vec<i64> = self.grid.iter().flatten().copied().collect();
        (name, tokens_tensor(grid_tokens(&grid, self.merge_size)))
    }

    /// Writes the tensor into `out` (exactly [`byte_len`](Self::byte_len) bytes, any
    /// alignment): little-endian `f32` values, row-major, every byte written. The same values
    /// as [`into_outputs`](Self::into_outputs), bit for bit.
    pub fn write(&self, out: &mut [MaybeUninit<u8>]) -> Result<(), ProcessorError> {
        self.write_streaming(out, self.byte_len() >= WRITE_STREAM_MIN_BYTES, Element::F32)
    }

    /// [`write`](Self::write) as `element`s, with streaming stores (`stream`: the values go to
    /// memory, not into the caches) or without.
    fn write_streaming(
        &self,
        out: &mut [MaybeUninit<u8>],
        stream: bool,
        element: Element,
    ) -> Result<(), ProcessorError> {
        let expected = self.len_as(element);
        if out.len() != expected {
            return Err(ProcessorError::BatchShape {
                what: "destination bytes",
                expected: vec![expected],
                actual: vec![out.len()],
            });
        }
        let (ps, m, cols) = (self.patch_size, self.merge_size, self.shape()[1]);
        // One job per merge-window row of each group, each with its own slice of the output.
        let lengths: Vec<usize> = self
            .groups
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.grid_w * m * cols * element.size(), g.grid_h / m))
            .collect();
        let mut slices = split_lengths(out, &lengths).into_iter();
        let mut jobs = Vec::with_capacity(lengths.len());
        for group in &self.groups {
            let frames: Vec<RgbRef<'_>> = group
                .frames
                .iter()
                .map(|&f| self.frames[f].view())
                .collect();
            for window_row in 0..group.grid_h / m {
                let out = slices.next().unwrap_or_default();
                jobs.push((frames.clone(), window_row, out));
            }
        }
        parallel::map(jobs, self.writers(), |_, (frames, window_row, out)| {
            write_window_row(
                &frames,
                ps,
                m,
                window_row,
                &self.normalize,
                out,
                Writing { element, stream },
            )
        });
        Ok(())
    }

    /// How many merge-window rows the batch has: [`Self::write_streaming`]'s jobs.
    fn window_rows(&self) -> usize {
        let m = self.merge_size.max(1);
        self.groups.iter().map(|g| g.grid_h / m).sum()
    }

    /// The tensor written into a new buffer (a recycled one when one fits).
    pub fn values(&self) -> Result<Vec<f32>, ProcessorError> {
        let [rows, cols] = self.shape();
        let len = checked_len(self.name(), &[rows, cols], 4)?;
        let mut values = OutBuffer::new(self.name(), len)?;
        let mut all = values.slices(&[len]);
        if let Some(out) = all.pop() {
            self.write(store::bytes_of(out))?;
        }
        // SAFETY: `write` succeeded on the whole buffer, and it writes every byte of its output.
        Ok(unsafe { values.finish() })
    }

    /// The outputs of [`images`] / [`videos`]: the tensor written into a new buffer, and the grid.
    pub fn into_outputs(self) -> Result<Outputs, ProcessorError> {
        let [rows, cols] = self.shape();
        let values = self.values()?;
        let mut tensors = vec![
            (
                self.name(),
                Tensor {
                    shape: vec![rows, cols],
                    data: TensorData::F32(values),
                },
            ),
            self.grid(),
        ];
        tensors.extend(self.seconds());
        Ok(Outputs { tensors })
    }

    /// The same batch owning every image it reads (an input array used unresized is copied), so
    /// that it can outlive the inputs.
    ///
    /// [`ProcessorError::OutOfMemory`] if a copy cannot be allocated.
    pub fn into_owned(mut self) -> Result<Patches<'static>, ProcessorError> {
        let frames = std::mem::take(&mut self.frames)
            .into_iter()
            .map(|rgb| {
                Ok(Rgb {
                    width: rgb.width,
                    height: rgb.height,
                    data: std::borrow::Cow::Owned(super::owned_bytes(
                        rgb.data,
                        "copy of an image",
                    )?),
                })
            })
            .collect::<Result<_, ProcessorError>>()?;
        Ok(Patches {
            frames,
            groups: std::mem::take(&mut self.groups),
            grid: std::mem::take(&mut self.grid),
            video: self.video,
            second_per_grid: self.second_per_grid,
            patch_size: self.patch_size,
            merge_size: self.merge_size,
            normalize: self.normalize.clone(),
            threads: self.threads,
        })
    }
}

// SAFETY: `write_streaming` succeeds only on a destination of exactly `wire_len` bytes, which it splits
// into one slice per merge-window row (the slices' lengths sum to `byte_len`); each
// `write_window_row` writes every value of its slice (all `grid_w × merge` patch rows of the
// window row, every column of each: grids are multiples of the merge size, checked in
// `prepare`), so every byte is initialised when it returns.
unsafe impl Produce for Patches<'_> {
    /// `float32`, or `bfloat16` (half the bytes: the same values rounded to nearest even).
    fn wire_len(&self, dtype: WireDtype) -> Option<usize> {
        Element::of(dtype).map(|element| self.len_as(element))
    }

    /// Into a serialized message or a shared-memory segment, which this process does not read
    /// back: streamed from [`PRODUCE_STREAM_MIN_BYTES`] on (see there).
    fn produce(&self, out: &mut [MaybeUninit<u8>], dtype: WireDtype) -> Result<(), TensorError> {
        let element = Element::of(dtype).ok_or(TensorError::UnsupportedConversion {
            from: WireDtype::Float32,
            to: dtype,
        })?;
        let expected = self.len_as(element);
        let stream = expected >= PRODUCE_STREAM_MIN_BYTES;
        self.write_streaming(out, stream, element)
            .map_err(|_| TensorError::DestinationSize {
                expected,
                actual: out.len(),
            })
    }

    /// The threads [`Patches::write_streaming`] writes with, one job per merge-window row: up to
    /// the batch's thread count, an automatic one as the `float32` output's size pays for
    /// ([`parallel::writers`]; the same count for bfloat16, so that a destination prefaulted by
    /// this many threads is written by as many).
    fn writers(&self) -> usize {
        parallel::writers(self.threads, self.window_rows(), self.byte_len())
    }
}

impl Drop for Patches<'_> {
    fn drop(&mut self) {
        recycle_images(std::mem::take(&mut self.frames));
    }
}

/// The checks on a batch's size shared by images and videos.
fn checked_patches(patches: Patches<'_>) -> Result<Patches<'_>, ProcessorError> {
    let [rows, cols] = patches.shape();
    checked_len(patches.name(), &[rows, cols], 4)?;
    Ok(patches)
}

/// `Qwen2VLImageProcessorPil` on a batch, before the values are written: see [`Patches`].
pub fn plan_images<'a>(
    config: &QwenConfig,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<Patches<'a>, ProcessorError> {
    plan_images_by(config, normalize, inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })
}

/// [`plan_images`] with another family's sizing (`prepare` resizes one image and gives its
/// grid; GLM's smart resize and padding): the same patch layout.
pub(crate) fn plan_images_by<'a, F>(
    config: &QwenConfig,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
    prepare: F,
) -> Result<Patches<'a>, ProcessorError>
where
    F: Fn(Rgb<'a>, usize) -> Result<Prepared<'a>, ProcessorError> + Sync,
{
    let prepared = prepare_all(inputs, options, prepare)?;
    let t_len = config.temporal_patch_size;
    let mut patches = Patches {
        frames: Vec::with_capacity(prepared.len()),
        groups: Vec::with_capacity(prepared.len()),
        grid: Vec::with_capacity(prepared.len()),
        video: false,
        second_per_grid: None,
        patch_size: config.patch_size,
        merge_size: config.merge_size,
        normalize: normalize.clone(),
        threads: options.threads,
    };
    for (i, p) in prepared.into_iter().enumerate() {
        patches.groups.push(Group {
            frames: vec![i; t_len],
            grid_h: p.grid_h,
            grid_w: p.grid_w,
        });
        patches.grid.push([1, p.grid_h as i64, p.grid_w as i64]);
        patches.frames.push(p.image);
    }
    checked_patches(patches)
}

/// `Qwen2VLImageProcessorPil` on a batch: `pixel_values` `(Σ grid_h·grid_w, 3·T·ps²)` float32 and
/// `image_grid_thw` `(n, 3)` int64.
pub fn images(
    config: &QwenConfig,
    normalize: &Normalize,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    plan_images(config, normalize, inputs, options)?.into_outputs()
}

/// `Qwen2VLVideoProcessor`'s layout with the PIL backend's arithmetic, before the values are
/// written: see [`Patches`].
pub fn plan_videos<'a>(
    config: &QwenConfig,
    normalize: &Normalize,
    videos: &[Vec<Input<'a>>],
    options: &Options,
) -> Result<Patches<'a>, ProcessorError> {
    let config = &config.for_videos();
    plan_videos_by(config, normalize, videos, options, |rgb, _, threads| {
        prepare(config, rgb, threads)
    })
}

/// [`plan_videos`] with another family's sizing and values: `prepare` resizes one frame (given
/// the number of frames of its video, which GLM's sizing counts) and gives its grid, and
/// `normalize` writes the values; the same patch layout. `config` is the videos' own.
pub(crate) fn plan_videos_by<'a, F>(
    config: &QwenConfig,
    normalize: &Normalize,
    videos: &[Vec<Input<'a>>],
    options: &Options,
    prepare: F,
) -> Result<Patches<'a>, ProcessorError>
where
    F: Fn(Rgb<'a>, usize, usize) -> Result<Prepared<'a>, ProcessorError> + Sync,
{
    if videos.is_empty() {
        return Err(ProcessorError::shape(
            "videos",
            "at least one video",
            "an empty batch",
        ));
    }
    if let Some(v) = videos.iter().position(Vec::is_empty) {
        return Err(ProcessorError::shape(
            "frames",
            "at least one frame per video",
            format!("video {v} with no frames"),
        ));
    }
    let frames: Vec<Input<'a>> = videos.iter().flatten().copied().collect();
    let lengths: Vec<usize> = videos
        .iter()
        .flat_map(|video| std::iter::repeat_n(video.len(), video.len()))
        .collect();
    let prepared = prepare_all_indexed(&frames, options, |i, rgb, threads| {
        prepare(rgb, lengths[i], threads)
    })?;
    let t_len = config.temporal_patch_size;
    let groups_of = |n: usize| n.div_ceil(t_len);
    let mut patches = Patches {
        frames: Vec::with_capacity(prepared.len()),
        groups: Vec::new(),
        grid: Vec::with_capacity(videos.len()),
        video: true,
        second_per_grid: config.second_per_grid(),
        patch_size: config.patch_size,
        merge_size: config.merge_size,
        normalize: normalize.clone(),
        threads: options.threads,
    };
    // Split the frames back into videos and check each video's frames agree in size.
    let mut first_frame = 0;
    for (v, video) in videos.iter().enumerate() {
        let head = &prepared[first_frame..first_frame + video.len()];
        let expected = head[0].input;
        if let Some((f, p)) = head.iter().enumerate().find(|(_, p)| p.input != expected) {
            let actual = p.input;
            recycle_images(prepared.into_iter().map(|p| p.image));
            return Err(ProcessorError::VideoShape {
                video: v,
                frame: f,
                expected,
                actual,
            });
        }
        let (n, grid_h, grid_w) = (video.len(), head[0].grid_h, head[0].grid_w);
        for g in 0..groups_of(n) {
            // The last frame fills an incomplete group, as the video processor's padding does.
            let frames = (0..t_len)
                .map(|t| first_frame + (g * t_len + t).min(n - 1))
                .collect();
            patches.groups.push(Group {
                frames,
                grid_h,
                grid_w,
            });
        }
        patches
            .grid
            .push([groups_of(n) as i64, grid_h as i64, grid_w as i64]);
        first_frame += n;
    }
    patches.frames = prepared.into_iter().map(|p| p.image).collect();
    checked_patches(patches)
}

/// `Qwen2VLVideoProcessor`'s layout with the PIL backend's arithmetic: `pixel_values_videos`
/// `(Σ grid_t·grid_h·grid_w, 3·T·ps²)` float32 and `video_grid_thw` `(n, 3)` int64.
pub fn videos(
    config: &QwenConfig,
    normalize: &Normalize,
    videos: &[Vec<Input<'_>>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    plan_videos(config, normalize, videos, options)?.into_outputs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    /// `data` as an interleaved RGB image of `width × height`.
    fn rgb(data: &[u8], width: usize, height: usize) -> Input<'_> {
        Input::Pixels {
            data,
            width,
            height,
            channels: 3,
        }
    }

    #[test]
    fn smart_resize_table() {
        // The reference table (§5.1) and Python's round-half-even: 70/28 = 2.5 -> 2.
        let q2 = |h, w| smart_resize(h, w, 28, 3136, 12_845_056).unwrap();
        let q2d = |h, w| smart_resize(h, w, 28, 3136, 1_003_520).unwrap();
        let q3 = |h, w| smart_resize(h, w, 32, 65_536, 16_777_216).unwrap();
        assert_eq!(q2(70, 70), (56, 56));
        assert_eq!(q2(600, 512), (588, 504));
        assert_eq!(q3(600, 512), (608, 512));
        assert_eq!(q2(1000, 3000), (1008, 2996));
        assert_eq!(q2d(1000, 3000), (560, 1708));
        assert_eq!(q3(1000, 3000), (992, 3008));
        assert_eq!(q2(4000, 3000), (4004, 2996));
        assert_eq!(q2d(4000, 3000), (1148, 840));
        assert_eq!(q3(4000, 3000), (4000, 3008));
        assert_eq!(q2(1080, 1920), (1092, 1932));
        assert_eq!(q2d(1080, 1920), (728, 1316));
        assert_eq!(q3(1080, 1920), (1088, 1920));
        assert_eq!(q2(10, 10), (56, 56));
        assert_eq!(q3(10, 10), (256, 256));
        assert_eq!(q2(1, 1), (56, 56));
        assert_eq!(q2(1, 200), (28, 812));
        let err = smart_resize(1, 201, 28, 3136, 12_845_056).unwrap_err();
        assert_eq!(err.kind(), "aspect_ratio");
        assert_eq!(
            err.to_string(),
            "image 0: absolute aspect ratio must be smaller than 200, got 201.0"
        );
    }

    /// The two builds of the register-streamed writer (`bfloat16` rounded with integer
    /// operations, and by the CPU) write the same bytes, where the CPU has both.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn window_row_twins_write_the_same_bfloat16() {
        let normalize = Normalize::new(Some(1.0 / 255.0), Some(([0.4, 0.5, 0.6], [0.2, 0.3, 0.4])));
        let Some(wide) = normalize.wide() else {
            return;
        };
        if !store::LinePacker::available() || !store::bf16_hardware() {
            return;
        }
        for ps in [3, 14, 16] {
            let (width, height) = (4 * ps, 2 * ps);
            let data: Vec<u8> = (0..width * height * 3)
                .map(|i| ((i * 37) % 253) as u8)
                .collect();
            let frame = RgbRef {
                data: &data,
                width,
                height,
            };
            let frames = [frame, frame];
            let len = 2 * 4 * 2 * 3 * 2 * ps * ps; // grid_w · m rows of 3·T·ps² bf16 values
            for offset in [0, 5, 63] {
                let mut a = vec![MaybeUninit::new(0x33u8); len + 64];
                let mut b = vec![MaybeUninit::new(0x33u8); len + 64];
                // SAFETY: `wide` and the checks above: AVX-512 F, BW, VBMI, FMA and BF16.
                unsafe {
                    let (a, b) = (&mut a[offset..offset + len], &mut b[offset..offset + len]);
                    write_window_row_wide(&frames, ps, 2, 0, &wide, a, Element::Bf16);
                    write_window_row_wide_bf16(&frames, ps, 2, 0, &wide, b, Element::Bf16);
                }
                store::fence(true);
                // SAFETY: every byte was initialised above.
                let (a, b): (Vec<u8>, Vec<u8>) = unsafe {
                    (
                        a.iter().map(|x| x.assume_init()).collect(),
                        b.iter().map(|x| x.assume_init()).collect(),
                    )
                };
                assert!(a == b, "ps {ps}, offset {offset}");
            }
        }
    }

    #[test]
    fn window_rows_direct_and_streamed_match_the_layout() {
        // Frames A, A, B (A repeated: one computation stored twice), ps 14 (vectors) and 3
        // (scalar), merge 2; every value against the documented layout, both store paths, with
        // and without SIMD.
        let normalize = Normalize::new(Some(1.0 / 255.0), Some(([0.4, 0.5, 0.6], [0.2, 0.3, 0.4])));
        for ps in [3, 14, 16] {
            let (m, t_len) = (2, 3);
            let (width, height) = (4 * ps, 2 * ps);
            let frame = |seed: usize| -> Vec<u8> {
                (0..width * height * 3)
                    .map(|i| ((i * 31 + seed * 7) % 251) as u8)
                    .collect()
            };
            let (a, b) = (frame(1), frame(2));
            let rgb = |data| RgbRef {
                data,
                width,
                height,
            };
            let frames = [rgb(a.as_slice()), rgb(a.as_slice()), rgb(b.as_slice())];
            let (grid_w, cols) = (width / ps, 3 * t_len * ps * ps);
            for window_row in 0..height / ps / m {
                let expected: Vec<u32> = (0..grid_w * m * cols)
                    .map(|k| {
                        let (r, col) = (k / cols, k % cols);
                        let (bj, mi, mj) = (r / (m * m), r / m % m, r % m);
                        let (i, j) = (window_row * m + mi, bj * m + mj);
                        let (c, t, y, x) = (
                            col / (t_len * ps * ps),
                            col / (ps * ps) % t_len,
                            col / ps % ps,
                            col % ps,
                        );
                        let px = ((i * ps + y) * width + j * ps + x) * 3 + c;
                        normalize.value(c, frames[t].data[px]).to_bits()
                    })
                    .collect();
                for n in [normalize.clone(), normalize.clone().without_simd()] {
                    let write = |bytes: &mut [MaybeUninit<u8>], element, stream| {
                        let writing = Writing { element, stream };
                        write_window_row(&frames, ps, m, window_row, &n, bytes, writing);
                    };
                    // Cached stores at three offsets; streaming stores (from the registers
                    // where the CPU has AVX-512 VBMI and SIMD is on, else through a staged row)
                    // at every offset across a cache line.
                    let streamed = (0..68).map(|offset| (true, offset));
                    for (stream, offset) in [(false, 0), (false, 1), (false, 3)]
                        .into_iter()
                        .chain(streamed)
                    {
                        let len = 4 * expected.len();
                        let mut buffer =
                            vec![crate::processors::Out::new(f32::NAN); expected.len() + 18];
                        let bytes = &mut store::bytes_of(&mut buffer)[offset..offset + len];
                        write(bytes, Element::F32, stream);
                        // SAFETY: every byte was initialised (NaN, then maybe overwritten).
                        let got: Vec<u32> = bytes
                            .chunks_exact(4)
                            .map(|b| {
                                // SAFETY: as above.
                                let b: Vec<u8> =
                                    b.iter().map(|x| unsafe { x.assume_init() }).collect();
                                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                            })
                            .collect();
                        assert_eq!(
                            got, expected,
                            "ps {ps}, window row {window_row}, stream {stream}, offset {offset}"
                        );
                        // Nothing around the output was written.
                        let nan = f32::NAN.to_le_bytes();
                        let all = store::bytes_of(&mut buffer);
                        for (k, byte) in all.iter().enumerate() {
                            if k < offset || k >= offset + len {
                                // SAFETY: every byte was initialised (NaN).
                                let byte = unsafe { byte.assume_init() };
                                assert_eq!(byte, nan[k % 4], "byte {k} around offset {offset}");
                            }
                        }
                    }
                    // As bfloat16: each value the float32 one rounded to nearest even.
                    let expected16: Vec<u16> = expected
                        .iter()
                        .map(|&bits| crate::tensor::convert::f32_to_bf16(bits))
                        .collect();
                    let streamed = (0..66).map(|offset| (true, offset));
                    for (stream, offset) in [(false, 0), (false, 1)].into_iter().chain(streamed) {
                        let len = 2 * expected16.len();
                        let mut buffer = vec![MaybeUninit::new(0xAAu8); len + offset + 64];
                        let bytes = &mut buffer[offset..offset + len];
                        write(bytes, Element::Bf16, stream);
                        // SAFETY: every byte was initialised (0xAA, then maybe overwritten).
                        let got: Vec<u16> = bytes
                            .chunks_exact(2)
                            .map(|b| unsafe {
                                u16::from_le_bytes([b[0].assume_init(), b[1].assume_init()])
                            })
                            .collect();
                        assert_eq!(
                            got, expected16,
                            "bfloat16: ps {ps}, window row {window_row}, stream {stream}, offset {offset}"
                        );
                        let around = buffer[..offset].iter().chain(&buffer[offset + len..]);
                        assert!(
                            around
                                // SAFETY: every byte was initialised (0xAA, then maybe
                                // overwritten).
                                .map(|b| unsafe { b.assume_init() })
                                .all(|b| b == 0xAA),
                            "bfloat16: a byte around offset {offset} was written"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn produced_bytes_are_the_written_values() {
        // 224 x 224 -> 256 patches, 1.2 MB: `produce` streams it (at least
        // PRODUCE_STREAM_MIN_BYTES), `values` does not (below store::STREAM_MIN_BYTES); the
        // same bits, at a misaligned destination too.
        let data: Vec<u8> = (0..224 * 224 * 3).map(|i| (i * 37 % 253) as u8).collect();
        let input = rgb(&data, 224, 224);
        let config = QwenConfig::qwen2_vl();
        let normalize = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        let patches = plan_images(&config, &normalize, &[input], &Options::default()).unwrap();
        let len = patches.byte_len();
        assert!((PRODUCE_STREAM_MIN_BYTES..store::STREAM_MIN_BYTES).contains(&len));
        let want: Vec<u8> = patches
            .values()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        for offset in [0, 3] {
            let mut buffer = vec![MaybeUninit::new(0xAAu8); len + offset];
            patches
                .produce(&mut buffer[offset..], WireDtype::Float32)
                .unwrap();
            // SAFETY: every byte was initialised (0xAA, then overwritten).
            let got: Vec<u8> = buffer[offset..]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            assert!(got == want, "offset {offset}: produced bytes differ");
        }
        // As bfloat16: half the bytes, each value the float32 one rounded to nearest even (the
        // same bits as the float32 tensor converted on the wire), streamed (at least
        // PRODUCE_STREAM_MIN_BYTES) or not, at any offset.
        let want16: Vec<u8> = patches
            .values()
            .unwrap()
            .iter()
            .flat_map(|v| crate::tensor::convert::f32_to_bf16(v.to_bits()).to_le_bytes())
            .collect();
        assert_eq!(patches.wire_len(WireDtype::Bfloat16), Some(len / 2));
        assert_eq!(patches.wire_len(WireDtype::Float16), None);
        for (offset, stream) in [(0, true), (5, true), (0, false), (63, false)] {
            let mut buffer = vec![MaybeUninit::new(0xAAu8); len / 2 + offset];
            let out = &mut buffer[offset..];
            if stream {
                patches.produce(out, WireDtype::Bfloat16).unwrap();
            } else {
                patches.write_streaming(out, false, Element::Bf16).unwrap();
            }
            // SAFETY: every byte was initialised (0xAA, then overwritten).
            let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert!(
                got == want16,
                "offset {offset}, stream {stream}: bfloat16 bytes differ"
            );
        }
        let mut short = vec![MaybeUninit::new(0u8); len / 2 - 1];
        assert!(patches.produce(&mut short, WireDtype::Bfloat16).is_err());
        assert!(patches
            .produce(&mut short, WireDtype::Float16)
            .is_err_and(|e| matches!(e, TensorError::UnsupportedConversion { .. })));
    }

    #[test]
    fn writers_are_the_write_jobs_on_the_threads_asked_for() {
        // 224 x 224: a 16 x 16 patch grid, 8 merge-window rows per image, 1.2 MB of float32.
        let data = vec![7u8; 224 * 224 * 3];
        let input = rgb(&data, 224, 224);
        let config = QwenConfig::qwen2_vl();
        let normalize = Normalize::new(Some(1.0 / 255.0), Some((CLIP_MEAN, CLIP_STD)));
        for (images, threads, expected) in [
            (1, 1, 1),
            (1, 3, 3),
            (1, 64, 8),
            (2, 64, 16),
            // Automatic: one writer per 2 MiB of output, at most one per core.
            (1, 0, 1),
            (2, 0, 1),
            (8, 0, crate::cores::count().min(4)),
        ] {
            let options = Options {
                threads,
                ..Options::default()
            };
            let inputs = vec![input; images];
            let patches = plan_images(&config, &normalize, &inputs, &options).unwrap();
            assert_eq!(patches.window_rows(), 8 * images);
            assert_eq!(
                patches.writers(),
                expected,
                "{images} images, threads {threads}"
            );
        }
    }

    #[test]
    fn patch_order() {
        // A 4x4 image, patch 1, merge 2, T 2: rows in merge-window order, values repeated over T.
        let data: Vec<u8> = (0..48).collect();
        let input = rgb(&data, 4, 4);
        let p = Preprocessor::new(
            Family::Qwen2Vl,
            &[
                ("patch_size".into(), Value::Int(1)),
                ("do_resize".into(), Value::Bool(false)),
                ("do_rescale".into(), Value::Bool(false)),
                ("do_normalize".into(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let out = p.images(&[input], &Options::default()).unwrap();
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [16, 6]);
        let TensorData::F32(v) = &pv.data else {
            panic!()
        };
        // Row 2 = grid cell (1, 0): pixel (1, 0) = bytes 12..15 -> columns (c, t).
        assert_eq!(&v[2 * 6..3 * 6], &[12., 12., 13., 13., 14., 14.]);
        // Row 4 = window (0, 1), cell (0, 2): pixel (0, 2) = bytes 6..9.
        assert_eq!(&v[4 * 6..5 * 6], &[6., 6., 7., 7., 8., 8.]);
        assert_eq!(
            out.get("image_grid_thw").unwrap().data,
            TensorData::I64(vec![1, 4, 4])
        );
    }

    #[test]
    fn video_groups_repeat_the_last_frame() {
        let frames: Vec<Vec<u8>> = (0..3u8).map(|f| vec![f * 10; 2 * 2 * 3]).collect();
        let inputs: Vec<Input<'_>> = frames
            .iter()
            .map(|d| Input::Pixels {
                data: d,
                width: 2,
                height: 2,
                channels: 3,
            })
            .collect();
        let p = Preprocessor::new(
            Family::Qwen2Vl,
            &[
                ("patch_size".into(), Value::Int(1)),
                ("do_resize".into(), Value::Bool(false)),
                ("do_rescale".into(), Value::Bool(false)),
                ("do_normalize".into(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let out = p
            .videos(std::slice::from_ref(&inputs), &Options::default())
            .unwrap();
        let pv = out.get("pixel_values_videos").unwrap();
        assert_eq!(pv.shape, [8, 6]);
        let TensorData::F32(v) = &pv.data else {
            panic!()
        };
        assert_eq!(&v[..6], &[0., 10., 0., 10., 0., 10.]);
        assert_eq!(&v[4 * 6..5 * 6], &[20., 20., 20., 20., 20., 20.]);
        assert_eq!(
            out.get("video_grid_thw").unwrap().data,
            TensorData::I64(vec![2, 2, 2])
        );
        // Frames of different sizes are refused.
        let small = [0u8; 4 * 2 * 3];
        let mut mixed = inputs.clone();
        mixed.push(Input::Pixels {
            data: &small,
            width: 2,
            height: 4,
            channels: 3,
        });
        let err = p.videos(&[mixed], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "video_shape");
        assert_eq!(
            p.videos(&[vec![]], &Options::default()).unwrap_err().kind(),
            "image_shape"
        );
    }

    #[test]
    fn do_resize_off_needs_multiples() {
        let data = vec![0u8; 30 * 28 * 3];
        let input = rgb(&data, 28, 30);
        let p = Preprocessor::new(Family::Qwen2Vl, &[("do_resize".into(), Value::Bool(false))])
            .unwrap();
        let err = p.images(&[input], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "image_shape");
        assert!(err.to_string().contains("28"), "{err}");
    }
}
