//! GLM-4.1V, GLM-4.6V and GLM-5-next images: Qwen2-VL's patch layout (see [`super::qwen`]:
//! `patch_size²` patches in merge-window order, a still image repeated over the
//! `temporal_patch_size` frames, `image_grid_thw` `[1, h, w]`) with GLM's own sizing.
//!
//! - GLM-4.1V / GLM-4.6V (`Glm4vImageProcessorPil`, `Glm46VImageProcessorPil`, the same code):
//!   [`glm4v_smart_resize`], which counts the temporal patch in the pixel budget
//!   (`size["shortest_edge"]`/`size["longest_edge"]`) and first scales an image with a side
//!   under `patch_size × merge_size` up to it.
//! - GLM-5-next (`Glm5NextImageProcessorPil`): [`glm5_next_smart_resize`] picks an aligned
//!   canvas within `min_image_tokens … max_image_tokens`; the image is resized to fit inside it
//!   keeping its aspect ratio (never enlarged above the token floor) and padded with zeros at
//!   the bottom and right (before rescale/normalise, as transformers pads the `uint8` array).
//!
//! The placeholder rule is a run of `<|image|>` per image (`grid_h · grid_w / merge_size²`),
//! inside the `<|begin_of_image|>` … `<|end_of_image|>` the chat template writes.
//!
//! Videos follow the torchvision video processors (`Glm4vVideoProcessor`,
//! `Glm46VVideoProcessor`, `Glm5NextVideoProcessor`; transformers has no PIL video backend):
//! frames already sampled, each resized as a `uint8` tensor by torch's antialiased kernel
//! ([`crate::image::torch`]) to a canvas that counts the video's frames in the budget (the
//! video processor's own bounds, [`GlmConfig::video_bounds`]), GLM-5-next's padded with zeros,
//! then the backend's fused rescale + normalize in `f32` and Qwen's patch layout, the last frame
//! repeated to fill the last temporal patch. The video prompt (per frame group
//! `<|begin_of_image|>`, the group's `<|image|>` run, `<|end_of_image|>` and its timestamp text)
//! is written on the Python side (`smg_grpc_proto.vision.glm_video`), from `video_grid_thw` and
//! the frames' timestamps.

use super::family::{FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::qwen::{self, Patches, Prepared, QwenConfig};
use super::torch_backend;
use super::value::{
    hf_get, hf_keys, hf_put, hf_size, BadSize, Common, Raw, RawMap, Value, CLIP_MEAN, CLIP_STD,
};
use super::{resize_rgb, Deferred, Input, Options, Outputs, ProcessorError, Rgb};
use crate::image::torch::TorchFilter;

/// Which GLM sizing rule a configuration follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlmSizing {
    /// GLM-4.1V / GLM-4.6V: pixel bounds in `size`.
    Glm4v,
    /// GLM-5-next: token bounds `min_image_tokens` / `max_image_tokens`, padded canvas.
    Glm5Next,
}

/// The configuration of the GLM families: Qwen's patching settings (`patch_size`,
/// `merge_size`, `temporal_patch_size`; GLM-4.1V's pixel bounds in `min_pixels`/`max_pixels`)
/// and GLM-5-next's token bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct GlmConfig {
    pub patches: QwenConfig,
    pub sizing: GlmSizing,
    pub min_image_tokens: u64,
    pub max_image_tokens: u64,
    /// The video processor's bounds: GLM-4.1V/4.6V pixels (`Glm4vVideoProcessor.size`, our key
    /// `video_size`), GLM-5-next tokens (`Glm5NextVideoProcessor.min_image_tokens` /
    /// `max_image_tokens`, our keys `video_min_image_tokens` / `video_max_image_tokens`).
    pub video_bounds: (u64, u64),
}

/// GLM-4.1V: `Glm4vImageProcessor`; `config.json` `Glm4vConfig.image_token_id` (`<|image|>`)
/// and `video_token_id` (`<|video|>`, the video's anchor in the prompt).
pub const GLM4V: Hf = Hf {
    image_classes: &["Glm4vImageProcessor"],
    video_classes: &[],
    normalise: hf_glm4v,
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published {
        image: 151_343,
        video: Some(151_344),
        vision_tokens: None,
    }),
    count_tensor: None,
};
/// GLM-4.6V: `Glm46VImageProcessor` (GLM-4.1V's algorithm); `Glm46VConfig.image_token_id`.
pub const GLM46V: Hf = Hf {
    image_classes: &["Glm46VImageProcessor"],
    video_classes: &[],
    normalise: hf_glm4v,
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published {
        image: 151_343,
        video: Some(151_344),
        vision_tokens: None,
    }),
    count_tensor: None,
};
/// GLM-5-next: `Glm5NextImageProcessor`; `Glm5NextConfig.image_token_id` (`<|image|>`).
pub const GLM5_NEXT: Hf = Hf {
    image_classes: &["Glm5NextImageProcessor"],
    video_classes: &[],
    normalise: hf_glm5_next,
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published {
        image: 154_854,
        video: Some(154_855),
        vision_tokens: None,
    }),
    count_tensor: None,
};

const PATCH_KEYS: [&str; 3] = ["patch_size", "merge_size", "temporal_patch_size"];

/// GLM-4.1V's keys: the patching keys and `size` (no `min_pixels`/`max_pixels` folding: the
/// class has no `__init__` of its own, and `resize` needs both size keys).
fn hf_glm4v(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    let mut out = hf_keys(config, &PATCH_KEYS, false)?;
    // ours: the video processor's `size` (a `video_preprocessor_config.json` is not read)
    if let Some(size) = hf_get(config, "video_size") {
        hf_put(&mut out, "video_size", Raw::Map(hf_size(size, false)?));
    }
    Ok(out)
}

/// GLM-5-next's keys: the patching keys and the token bounds; `size` is not read by its
/// `resize` and `patch_expand_factor` not by its image path, so both are dropped.
fn hf_glm5_next(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    let config: RawMap = config
        .iter()
        .filter(|(k, _)| k != "size")
        .cloned()
        .collect();
    hf_keys(
        &config,
        &[
            "patch_size",
            "merge_size",
            "temporal_patch_size",
            "min_image_tokens",
            "max_image_tokens",
            // ours: the video processor's token bounds
            "video_min_image_tokens",
            "video_max_image_tokens",
        ],
        false,
    )
}

/// The largest token bound taken (the budgets are products of it and `T · factor²`).
const MAX_TOKENS: i64 = 1 << 32;

/// The `config.json` `model_type`s that name a GLM family when its preprocessor file does not
/// (the SMG gateway accepts the same): GLM-5.3-Flash is GLM-5-next's architecture, and
/// transformers runs `glm4v_moe` checkpoints (GLM-4.5V/4.6V) with `Glm4vProcessor`.
pub const MODEL_TYPES: &[(&str, &str)] = &[
    ("glm4v", "glm4v"),
    ("glm4v_moe", "glm4v"),
    ("glm46v", "glm46v"),
    ("glm5_next", "glm5_next"),
    ("glm53_flash", "glm5_next"),
];

impl GlmConfig {
    /// `Glm4vImageProcessorPil`'s class defaults (also `Glm46VImageProcessorPil`'s):
    /// 12 544 … 11 760 000 pixels, patch 14, merge 2, temporal 2, CLIP mean/std.
    pub fn glm4v() -> Self {
        GlmConfig {
            patches: QwenConfig {
                common: Common::new(CLIP_MEAN, CLIP_STD),
                patch_size: 14,
                merge_size: 2,
                temporal_patch_size: 2,
                min_pixels: 112 * 112,
                max_pixels: 28 * 28 * 15_000,
                video_pixels: None,
                video_fps: None,
            },
            sizing: GlmSizing::Glm4v,
            min_image_tokens: 16,
            max_image_tokens: 8000,
            video_bounds: (112 * 112, 28 * 28 * 2 * 30_000),
        }
    }

    /// `Glm5NextImageProcessorPil`'s class defaults: 16 … 8000 tokens, patch 14, merge 2,
    /// temporal 2, CLIP mean/std; `Glm5NextVideoProcessor`'s 16 … 240 000 tokens.
    pub fn glm5_next() -> Self {
        GlmConfig {
            sizing: GlmSizing::Glm5Next,
            video_bounds: (16, 240_000),
            ..Self::glm4v()
        }
    }

    /// The canvas (HxW) the frames of a video of `num_frames` frames of `height × width` are
    /// brought to, per the family's video processor (`Glm4vVideoProcessor.resize`,
    /// `Glm5NextVideoProcessor.resize`: the image rule counting the video's frames).
    pub fn video_target(
        &self,
        num_frames: usize,
        height: usize,
        width: usize,
    ) -> Result<(usize, usize), ProcessorError> {
        let p = &self.patches;
        let (min, max) = self.video_bounds;
        match self.sizing {
            GlmSizing::Glm4v => glm4v_smart_resize(
                height,
                width,
                num_frames,
                p.temporal_patch_size,
                p.factor(),
                min,
                max,
            ),
            GlmSizing::Glm5Next => glm5_next_smart_resize(
                height,
                width,
                num_frames,
                p.temporal_patch_size,
                p.factor(),
                min,
                max,
            ),
        }
    }

    /// One frame of a video of `num_frames` frames as the torchvision video processor makes it
    /// before rescaling: `tvF.resize` of the `uint8` frame (torch's antialiased kernel) to the
    /// canvas, GLM-5-next's inside it and zero-padded at the bottom and right.
    fn prepare_frame<'a>(
        &self,
        rgb: Rgb<'a>,
        num_frames: usize,
        filter: TorchFilter,
        threads: usize,
    ) -> Result<Prepared<'a>, ProcessorError> {
        let p = &self.patches;
        let input = (rgb.height, rgb.width);
        if !p.common.do_resize {
            return qwen::prepare_at(p, rgb, input, threads);
        }
        let target = self.video_target(num_frames, rgb.height, rgb.width)?;
        let image = match self.sizing {
            GlmSizing::Glm4v => torch_backend::resize(rgb, target.0, target.1, filter, threads)?,
            GlmSizing::Glm5Next => {
                let content = glm5_next_content(
                    input,
                    target,
                    num_frames,
                    p.temporal_patch_size,
                    p.factor(),
                    self.video_bounds.0,
                );
                let resized = torch_backend::resize(rgb, content.0, content.1, filter, threads)?;
                pad_bottom_right(resized, target)?
            }
        };
        Ok(Prepared {
            image,
            input,
            grid_h: target.0 / p.patch_size,
            grid_w: target.1 / p.patch_size,
        })
    }

    /// The family's torchvision video processor on a batch of videos (each a list of frames,
    /// already sampled), before the values are written: each frame resized as
    /// [`prepare_frame`](Self::prepare_frame) says, rescaled and normalised with the backend's
    /// fused arithmetic, the last frame repeated to fill the last temporal patch, laid out as
    /// Qwen's patches (`pixel_values_videos`, `video_grid_thw`).
    pub fn plan_videos<'a>(
        &self,
        videos: &[Vec<Input<'a>>],
        options: &Options,
    ) -> Result<Patches<'a>, ProcessorError> {
        let common = &self.patches.common;
        torch_backend::check_torch_steps(common)?;
        let filter = torch_backend::filter_of(common.resample).ok_or_else(|| {
            ProcessorError::config(
                "resample",
                "BILINEAR (2) or BICUBIC (3)",
                common.resample.pil_id(),
            )
        })?;
        let normalize = torch_fused_normalize(common);
        qwen::plan_videos_by(
            &self.patches,
            &normalize,
            videos,
            options,
            |rgb, n, threads| self.prepare_frame(rgb, n, filter, threads),
        )
    }

    /// The canvas (HxW) an image of `height × width` is brought to, per this family's rule.
    pub fn target(&self, height: usize, width: usize) -> Result<(usize, usize), ProcessorError> {
        let p = &self.patches;
        match self.sizing {
            GlmSizing::Glm4v => glm4v_smart_resize(
                height,
                width,
                p.temporal_patch_size,
                p.temporal_patch_size,
                p.factor(),
                p.min_pixels,
                p.max_pixels,
            ),
            GlmSizing::Glm5Next => glm5_next_smart_resize(
                height,
                width,
                p.temporal_patch_size,
                p.temporal_patch_size,
                p.factor(),
                self.min_image_tokens,
                self.max_image_tokens,
            ),
        }
    }

    fn prepare<'a>(&self, rgb: Rgb<'a>, threads: usize) -> Result<Prepared<'a>, ProcessorError> {
        let p = &self.patches;
        if !p.common.do_resize {
            let size = (rgb.height, rgb.width);
            return qwen::prepare_at(p, rgb, size, threads);
        }
        let target = self.target(rgb.height, rgb.width)?;
        match self.sizing {
            GlmSizing::Glm4v => qwen::prepare_at(p, rgb, target, threads),
            GlmSizing::Glm5Next => {
                let input = (rgb.height, rgb.width);
                let content = glm5_next_content(
                    input,
                    target,
                    p.temporal_patch_size,
                    p.temporal_patch_size,
                    p.factor(),
                    self.min_image_tokens,
                );
                let image = resize_rgb(rgb, content.0, content.1, &p.common, threads)?;
                Ok(Prepared {
                    image: pad_bottom_right(image, target)?,
                    input,
                    grid_h: target.0 / p.patch_size,
                    grid_w: target.1 / p.patch_size,
                })
            }
        }
    }
}

fn tokens(field: &'static str, value: &Value) -> Result<u64, ProcessorError> {
    match value {
        Value::Int(v) if *v >= 1 && *v <= MAX_TOKENS => Ok(*v as u64),
        _ => Err(ProcessorError::config(
            field,
            format!("an integer between 1 and {MAX_TOKENS}"),
            value,
        )),
    }
}

impl FamilyConfig for GlmConfig {
    fn common(&self) -> &Common {
        &self.patches.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.patches.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match (self.sizing, key) {
            (_, "patch_size" | "merge_size" | "temporal_patch_size") => {
                self.patches.set(key, value)
            }
            (GlmSizing::Glm4v, "size") => {
                // Both keys, as `Glm4vImageProcessorPil.resize` requires (never the legacy
                // min_pixels/max_pixels names, which this class does not read).
                let both = matches!(value, Value::Map(entries)
                    if entries.len() == 2
                        && entries.iter().any(|(k, _)| k == "shortest_edge")
                        && entries.iter().any(|(k, _)| k == "longest_edge"));
                if !both {
                    return Err(ProcessorError::config(
                        "size",
                        "a dict with keys shortest_edge and longest_edge (min and max pixels)",
                        value,
                    ));
                }
                self.patches.set(key, value)
            }
            (GlmSizing::Glm5Next, "min_image_tokens") => {
                self.min_image_tokens = tokens("min_image_tokens", value)?;
                Ok(true)
            }
            (GlmSizing::Glm5Next, "max_image_tokens") => {
                self.max_image_tokens = tokens("max_image_tokens", value)?;
                Ok(true)
            }
            (GlmSizing::Glm4v, "video_size") => {
                self.video_bounds = video_size(value)?;
                Ok(true)
            }
            (GlmSizing::Glm5Next, "video_min_image_tokens") => {
                self.video_bounds.0 = tokens("video_min_image_tokens", value)?;
                Ok(true)
            }
            (GlmSizing::Glm5Next, "video_max_image_tokens") => {
                self.video_bounds.1 = tokens("video_max_image_tokens", value)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut entries = self.patches.entries();
        if self.sizing == GlmSizing::Glm5Next {
            entries.retain(|(key, _)| *key != "size");
            entries.push(("min_image_tokens", Value::Int(self.min_image_tokens as i64)));
            entries.push(("max_image_tokens", Value::Int(self.max_image_tokens as i64)));
        }
        let (min, max) = (self.video_bounds.0 as i64, self.video_bounds.1 as i64);
        match self.sizing {
            GlmSizing::Glm4v => entries.push((
                "video_size",
                Value::Map(vec![
                    ("shortest_edge".into(), min),
                    ("longest_edge".into(), max),
                ]),
            )),
            GlmSizing::Glm5Next => {
                entries.push(("video_min_image_tokens", Value::Int(min)));
                entries.push(("video_max_image_tokens", Value::Int(max)));
            }
        }
        entries
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        Ok(())
    }

    fn images(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        qwen::plan_images_by(&self.patches, normalize, inputs, options, |rgb, threads| {
            self.prepare(rgb, threads)
        })?
        .into_outputs()
    }

    fn images_deferred<'a>(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        qwen::plan_images_by(&self.patches, normalize, inputs, options, |rgb, threads| {
            self.prepare(rgb, threads)
        })
        .map(|p| Deferred::Patches(Box::new(p)))
    }

    /// `grid_h · grid_w / merge_size²` per image (`image_grid_thw`), as
    /// `Glm4vProcessor.replace_image_token` counts `<|image|>`.
    fn image_tokens(&self, outputs: &Outputs, vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        self.patches.image_tokens(outputs, vision)
    }

    fn videos(
        &self,
        _normalize: &Normalize,
        videos: &[Vec<Input<'_>>],
        options: &Options,
    ) -> Option<Result<Outputs, ProcessorError>> {
        Some(
            self.plan_videos(videos, options)
                .and_then(Patches::into_outputs),
        )
    }

    fn videos_deferred<'a>(
        &self,
        _normalize: &Normalize,
        videos: &[Vec<Input<'a>>],
        options: &Options,
    ) -> Option<Result<Deferred<'a>, ProcessorError>> {
        Some(
            self.plan_videos(videos, options)
                .map(|p| Deferred::Patches(Box::new(p))),
        )
    }

    /// `grid_t · grid_h · grid_w / merge_size²` per video (`video_grid_thw`): the `<|image|>`
    /// tokens `Glm4vProcessor.replace_video_token` writes over all its frame groups
    /// (`grid_h · grid_w / merge_size²` in each of the `grid_t` groups).
    fn video_tokens(&self, outputs: &Outputs) -> Option<Vec<i64>> {
        self.patches.video_tokens(outputs)
    }
}

/// The torchvision backend's fused rescale + normalize
/// ([`torch_backend::fused_f32_table`]: `(f32(x) − mean') / std'` with `mean' = f32(mean) ·
/// f32(1 / rescale_factor)`, likewise `std'`) as a [`Normalize`]: the PIL arithmetic with a
/// rescale factor of 1 (exact on `u8`) and `mean'`/`std'` (exact as `f64`) is that very
/// formula, so its table — and its SIMD passes, which it checks against the table — are
/// torch's values.
fn torch_fused_normalize(common: &Common) -> Normalize {
    let inverse = (1.0 / common.rescale_factor) as f32;
    let fused = |v: [f64; 3]| v.map(|x| f64::from(x as f32 * inverse));
    Normalize::new(
        Some(1.0),
        Some((fused(common.image_mean), fused(common.image_std))),
    )
}

/// `video_size`: `{"shortest_edge": min_pixels, "longest_edge": max_pixels}`, both keys, as
/// `Glm4vVideoProcessor.resize` requires.
fn video_size(value: &Value) -> Result<(u64, u64), ProcessorError> {
    let expected = "a dict with keys shortest_edge and longest_edge (min and max pixels)";
    let Value::Map(entries) = value else {
        return Err(ProcessorError::config("video_size", expected, value));
    };
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| *v)
            .filter(|v| (1..=1 << 40).contains(v))
            .map(|v| v as u64)
    };
    match (entries.len(), get("shortest_edge"), get("longest_edge")) {
        (2, Some(min), Some(max)) => Ok((min, max)),
        _ => Err(ProcessorError::config("video_size", expected, value)),
    }
}

/// transformers' GLM-4.1V `smart_resize(num_frames, height, width, temporal_factor, factor,
/// min_pixels, max_pixels)` with its Python arithmetic (an image passes `num_frames =
/// temporal_factor`): fewer than `temporal_factor` frames are refused, a side under `factor`
/// scales both up (`int()` truncation), the aspect ratio (of the scaled size) must be at most
/// 200, and the bounds compare `t_bar · h_bar · w_bar`, `t_bar` the frame count rounded (half
/// to even) to a multiple of `temporal_factor`.
pub fn glm4v_smart_resize(
    height: usize,
    width: usize,
    num_frames: usize,
    temporal_factor: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), ProcessorError> {
    if num_frames < temporal_factor {
        return Err(ProcessorError::shape(
            "frames",
            format!(
                "at least temporal_patch_size = {temporal_factor} frames per video \
                 (GLM-4.1V's smart_resize: t must be larger than temporal_factor)"
            ),
            format!("{num_frames} frames"),
        ));
    }
    let (mut height, mut width) = (height, width);
    let f = factor as f64;
    if height < factor || width < factor {
        let scale = (f / height as f64).max(f / width as f64);
        height = (height as f64 * scale) as usize;
        width = (width as f64 * scale) as usize;
    }
    if height == 0 || width == 0 || ProcessorError::ratio(height, width) > 200.0 {
        return Err(ProcessorError::AspectRatio {
            index: 0,
            height,
            width,
        });
    }
    let (h, w) = (height as f64, width as f64);
    let fu = factor as u128;
    // t_bar = round(num_frames / temporal_factor) · temporal_factor (temporal_factor for an
    // image, whose num_frames is temporal_factor).
    let t_bar = (num_frames as f64 / temporal_factor as f64).round_ties_even() as u128
        * temporal_factor as u128;
    let mut h_bar = (h / f).round_ties_even() as u128 * fu;
    let mut w_bar = (w / f).round_ties_even() as u128 * fu;
    let volume = num_frames as u128 * height as u128 * width as u128;
    if t_bar * h_bar * w_bar > max_pixels as u128 {
        let beta = (volume as f64 / max_pixels as f64).sqrt();
        h_bar = fu.max((h / beta / f).floor() as u128 * fu);
        w_bar = fu.max((w / beta / f).floor() as u128 * fu);
    } else if t_bar * h_bar * w_bar < min_pixels as u128 {
        let beta = (min_pixels as f64 / volume as f64).sqrt();
        h_bar = (h * beta / f).ceil() as u128 * fu;
        w_bar = (w * beta / f).ceil() as u128 * fu;
    }
    let side = |v: u128| usize::try_from(v).unwrap_or(usize::MAX);
    Ok((side(h_bar), side(w_bar)))
}

/// `math.ceil(value / factor) * factor` on integers.
fn align(value: u128, factor: u128) -> u128 {
    value.div_ceil(factor) * factor
}

/// transformers' GLM-5-next `smart_resize(num_frames, …)` (an image passes `num_frames =
/// temporal_factor`; the budgets count `max(T, round(num_frames / T) · T)` frames): the
/// aligned size, raised to the token floor if under it, then — if over the token ceiling — the
/// largest aligned size whose content height (searched by bisection, the width following the
/// aspect ratio) fits the budget.
pub fn glm5_next_smart_resize(
    height: usize,
    width: usize,
    num_frames: usize,
    temporal_factor: usize,
    factor: usize,
    min_tokens: u64,
    max_tokens: u64,
) -> Result<(usize, usize), ProcessorError> {
    let (t, f) = (temporal_factor as u128, factor as u128);
    let per_token = t * f * f;
    let min_pixels = min_tokens as u128 * per_token;
    let max_pixels = max_tokens as u128 * per_token;
    let (h, w) = (height as u128, width as u128);
    let n = num_frames as u128;
    // aligned_frames = max(T, round(n / T) · T): T for an image (n = T).
    let frames = t.max((num_frames as f64 / temporal_factor as f64).round_ties_even() as u128 * t);
    let mut aligned = (align(h, f), align(w, f));
    if frames * aligned.0 * aligned.1 < min_pixels {
        let scale = (min_pixels as f64 / (n * h * w) as f64).sqrt();
        let up = |side: u128| align(((side as f64 * scale).ceil() as u128).max(1), f);
        aligned = (up(h), up(w));
    }
    if frames * aligned.0 * aligned.1 > max_pixels {
        if max_pixels < frames * f * f {
            return Err(ProcessorError::config(
                "max_image_tokens",
                format!(
                    "a budget of at least one aligned patch ({} pixels)",
                    frames * f * f
                ),
                max_pixels as i64,
            ));
        }
        let (mut low, mut high) = (1u128, h);
        let mut best = (f, f);
        while low <= high {
            let content_h = (low + high) / 2;
            // floor(width * content_h / height): Python's true division of two integers
            // (exact in f64 at these sizes), then floor.
            let content_w = (((w * content_h) as f64 / h as f64).floor() as u128).max(1);
            let candidate = (align(content_h, f), align(content_w, f));
            if frames * candidate.0 * candidate.1 <= max_pixels {
                best = candidate;
                low = content_h + 1;
            } else {
                high = content_h - 1;
            }
        }
        aligned = best;
    }
    let side = |v: u128| usize::try_from(v).unwrap_or(usize::MAX);
    Ok((side(aligned.0), side(aligned.1)))
}

/// `Glm5NextImageProcessorPil.resize`'s (and `Glm5NextVideoProcessor.resize`'s) content size
/// inside the canvas `target`: scaled by `min(target_h / h, target_w / w)`, at most 1 unless
/// `num_frames · h · w` is under the token floor, floored, between 1 and the canvas.
fn glm5_next_content(
    (height, width): (usize, usize),
    (target_h, target_w): (usize, usize),
    num_frames: usize,
    temporal_factor: usize,
    factor: usize,
    min_tokens: u64,
) -> (usize, usize) {
    let per_token = (temporal_factor * factor * factor) as u128;
    let mut scale = (target_h as f64 / height as f64).min(target_w as f64 / width as f64);
    // The image processor counts `temporal_factor` frames here, the video processor the video's.
    if (num_frames * height) as u128 * width as u128 >= per_token * min_tokens as u128 {
        scale = scale.min(1.0);
    }
    let content =
        |side: usize, target: usize| ((side as f64 * scale).floor() as usize).clamp(1, target);
    (content(height, target_h), content(width, target_w))
}

/// `np.pad(image, ((0, 0), (0, H − h), (0, W − w)))`: the image at the top left of a zeroed
/// `H × W` canvas (itself when it fills it).
fn pad_bottom_right(
    image: Rgb<'_>,
    (height, width): (usize, usize),
) -> Result<Rgb<'_>, ProcessorError> {
    if (image.height, image.width) == (height, width) {
        return Ok(image);
    }
    let padded = torch_backend::pad(image.view(), height, width, 0, 0, 0)?;
    super::recycle_images([image]);
    Ok(padded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm4v_sizes_match_transformers() {
        // transformers 5.24 glm4v smart_resize(2, h, w, 2, 28, 12544, 11760000).
        let r = |h, w| glm4v_smart_resize(h, w, 2, 2, 28, 12_544, 11_760_000).unwrap();
        assert_eq!(r(10, 10), (84, 84));
        assert_eq!(r(1, 200), (28, 5600));
        assert_eq!(r(600, 512), (588, 504));
        assert_eq!(r(4000, 3000), (2800, 2100));
        assert_eq!(r(1080, 1920), (1092, 1932));
        // 1 x 300 scales to 28 x 8400: 300:1.
        let err = glm4v_smart_resize(1, 300, 2, 2, 28, 12_544, 11_760_000).unwrap_err();
        assert_eq!(err.kind(), "aspect_ratio");
    }

    #[test]
    fn glm5_next_sizes_match_transformers() {
        // transformers 5.24 glm5_next smart_resize(2, h, w, 2, 28, tokens...).
        let r = |h, w, lo, hi| glm5_next_smart_resize(h, w, 2, 2, 28, lo, hi).unwrap();
        assert_eq!(r(10, 10, 16, 8000), (112, 112));
        assert_eq!(r(1, 200, 16, 8000), (28, 1596));
        assert_eq!(r(600, 512, 16, 8000), (616, 532));
        assert_eq!(r(4000, 3000, 16, 8000), (2884, 2156));
        assert_eq!(r(1080, 1920, 64, 300), (364, 644));
        assert_eq!(r(600, 512, 64, 300), (504, 448));
        // the content inside the canvas (then zero-padded)
        assert_eq!(
            glm5_next_content((1, 200), (28, 1596), 2, 2, 28, 16),
            (7, 1596)
        );
        assert_eq!(
            glm5_next_content((4000, 3000), (2884, 2156), 2, 2, 28, 16),
            (2874, 2156)
        );
        assert_eq!(
            glm5_next_content((600, 512), (504, 448), 2, 2, 28, 64),
            (504, 430)
        );
    }

    #[test]
    fn video_sizes_count_the_frames() {
        // transformers 5.24 video_processing_glm4v / _glm5_next smart_resize(n, h, w, 2, 28, …)
        let a = |n, h, w, max| glm4v_smart_resize(h, w, n, 2, 28, 12_544, max).unwrap();
        assert_eq!(a(3, 600, 512, 47_040_000), (588, 504));
        assert_eq!(a(3, 600, 512, 200_704), (280, 224));
        assert_eq!(a(5, 1080, 1920, 200_704), (140, 252));
        assert_eq!(a(16, 4000, 3000, 47_040_000), (1960, 1484));
        assert_eq!(a(16, 4000, 3000, 200_704), (112, 84));
        let err = glm4v_smart_resize(60, 60, 1, 2, 28, 12_544, 47_040_000).unwrap_err();
        assert_eq!(err.kind(), "image_shape");
        let b = |n, h, w, lo, hi| glm5_next_smart_resize(h, w, n, 2, 28, lo, hi).unwrap();
        assert_eq!(b(3, 600, 512, 16, 240_000), (616, 532));
        assert_eq!(b(3, 600, 512, 64, 300), (364, 308));
        assert_eq!(b(5, 1080, 1920, 64, 300), (252, 448));
        assert_eq!(b(1, 10, 10, 16, 240_000), (168, 168));
        assert_eq!(b(1, 10, 10, 64, 300), (336, 336));
        assert_eq!(b(7, 333, 517, 64, 300), (196, 280));
    }

    #[test]
    fn fused_normalize_is_torchs_table() {
        // the CLIP defaults and an odd configuration, SIMD and scalar
        let mut odd = Common::new([0.1, 0.77, 0.333], [0.01, 1.5, 0.29]);
        odd.rescale_factor = 0.0031;
        for common in [Common::new(CLIP_MEAN, CLIP_STD), odd] {
            let table = torch_backend::fused_f32_table(
                common.rescale_factor,
                common.image_mean,
                common.image_std,
            );
            let normalize = torch_fused_normalize(&common);
            for n in [normalize.clone(), normalize.without_simd()] {
                for (c, row) in table.iter().enumerate() {
                    for (v, want) in row.iter().enumerate() {
                        assert_eq!(n.value(c, v as u8).to_bits(), want.to_bits(), "{c} {v}");
                    }
                }
            }
        }
    }

    #[test]
    fn padding_keeps_the_image_top_left() {
        let image = Rgb {
            data: std::borrow::Cow::Owned((1..=12).collect()),
            width: 2,
            height: 2,
        };
        let padded = pad_bottom_right(image, (3, 3)).unwrap();
        let mut want = [0u8; 27];
        want[..6].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        want[9..15].copy_from_slice(&[7, 8, 9, 10, 11, 12]);
        assert_eq!(&padded.data[..], &want[..]);
    }

    /// A canvas large enough to come from the buffer cache gets zeros where the image is not,
    /// whatever the recycled buffer held.
    #[test]
    fn padding_overwrites_a_recycled_buffer() {
        let (w, h, canvas) = (200, 150, (300, 320));
        let len = canvas.0 * canvas.1 * 3;
        // Dirty buffers of the canvas's size for the cache to hand out (another test may take
        // one, or this one another's: every byte is checked all the same).
        for _ in 0..4 {
            crate::memory::recycle::give_u8(vec![0xAB; len]);
        }
        let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
        let image = Rgb {
            data: std::borrow::Cow::Owned(pixels.clone()),
            width: w,
            height: h,
        };
        let padded = pad_bottom_right(image, canvas).unwrap();
        assert_eq!((padded.height, padded.width), canvas);
        for (y, out) in padded.data.chunks_exact(canvas.1 * 3).enumerate() {
            let inside = if y < h { w * 3 } else { 0 };
            if inside > 0 {
                assert_eq!(&out[..inside], &pixels[y * w * 3..][..inside], "row {y}");
            }
            assert!(out[inside..].iter().all(|&b| b == 0), "padding of row {y}");
        }
    }
}
