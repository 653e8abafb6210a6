//! MiniMax-M3-VL images (`MiniMaxM3VLImageProcessor`, transformers 5.24: torchvision backend
//! only): Qwen2-VL's sizing and patch layout (see [`super::qwen`]: [`qwen::smart_resize`] to
//! multiples of `patch_size × merge_size` within `size["shortest_edge"] …
//! size["longest_edge"]` pixels, `patch_size²` patches in merge-window order, a still image
//! repeated over the `temporal_patch_size` frames, `image_grid_thw` `[1, h, w]`) with the
//! torchvision backend's arithmetic:
//!
//! - the resize is `tvF.resize` of the `uint8` tensor with `antialias=True` (BICUBIC by
//!   default): torch's `uint8` antialiased kernel ([`crate::image::torch`]);
//! - rescale and normalize are fused: `(f32(x) − mean') / std'` with `mean' = f32(mean) ·
//!   f32(1 / rescale_factor)` and likewise `std'` ([`tb::fused_normalize`]).
//!
//! Defaults: 3 136 … 451 584 pixels (`{"shortest_edge": 4·28², "longest_edge": 672²}`), patch
//! 14, merge 2, temporal 2, CLIP mean/std. `__init__` folds `min_pixels`/`max_pixels` into
//! `size` as Qwen2-VL's does, and first replaces the published checkpoint's stale
//! `"size": [672, 672]` by the class default.
//!
//! `MiniMaxM3VLProcessor` writes each image as `]<]start of image[>[`, `]<]image[>[` ×
//! `t·h·w / merge_size²`, `]<]end of image[>[`: the image tokens take the embeddings. Videos
//! (`MiniMaxM3VLVideoProcessor`: chunked `video_grid_thw`, per-frame timestamp text in the
//! prompt) are not reproduced and are refused.

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::qwen::{self, Prepared, QwenConfig};
use super::torch_backend as tb;
use super::value::{
    hf_get, hf_keys, hf_put, BadSize, Common, Raw, RawMap, Value, CLIP_MEAN, CLIP_STD,
};
use super::{Deferred, Input, Options, Outputs, ProcessorError, Rgb};
use crate::image::torch::TorchFilter;

/// The configuration of MiniMax-M3-VL: Qwen's patching settings and pixel bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct MiniMaxConfig {
    pub patches: QwenConfig,
}

/// MiniMax-M3-VL: `MiniMaxM3VLImageProcessor`; `MiniMaxM3VLConfig.image_token_index` 200025
/// (`]<]image[>[`).
pub const MINIMAX_M3_VL: Hf = Hf {
    image_classes: &["MiniMaxM3VLImageProcessor"],
    video_classes: &[],
    normalise: hf_minimax,
    processor_keys: &[],
    processor_forces: None,
    // A structured replacement: its published ids are REPLACEMENT's defaults.
    published: None,
    count_tensor: None,
};

/// The `config.json` `model_type`s that name MiniMax-M3-VL: transformers' `minimax_m3_vl`, and
/// `minimax_m3`, the name the SMG gateway (1.13) registers its MiniMax-M3 processor under.
pub const MODEL_TYPES: &[(&str, &str)] = &[
    ("minimax_m3_vl", "minimax_m3_vl"),
    ("minimax_m3", "minimax_m3_vl"),
];

/// `size` as the published MiniMax-M3 `preprocessor_config.json` writes it, which
/// `MiniMaxM3VLImageProcessor.__init__` replaces by the class default (`size == [672, 672]`).
fn stale_size(value: &Raw) -> bool {
    let is_672 = |v: &Raw| match v {
        Raw::Int(n) => *n == 672,
        Raw::Float(x) => *x == 672.0,
        _ => false,
    };
    matches!(value, Raw::List(pair) if pair.len() == 2 && pair.iter().all(is_672))
}

/// MiniMax-M3-VL's keys as `MiniMaxM3VLImageProcessor.__init__` reads them: `size == [672,
/// 672]` replaced by the class default, then `min_pixels`/`max_pixels` written into `size`
/// (the class default when there is none). A partial `size` is kept partial, as transformers
/// keeps it (its `resize` then raises; `set` refuses it here).
fn hf_minimax(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    let config: RawMap = config
        .iter()
        .filter(|(key, value)| !(key == "size" && stale_size(value)))
        .cloned()
        .collect();
    let mut out = hf_keys(
        &config,
        &["patch_size", "merge_size", "temporal_patch_size"],
        false,
    )?;
    let folds: Vec<(&str, &Raw)> = [
        ("min_pixels", "shortest_edge"),
        ("max_pixels", "longest_edge"),
    ]
    .into_iter()
    .filter_map(|(key, edge)| hf_get(&config, key).map(|value| (edge, value)))
    .filter(|(_, value)| **value != Raw::None)
    .collect();
    if folds.is_empty() {
        return Ok(out);
    }
    let mut size = match hf_get(&out, "size") {
        Some(Raw::Map(size)) => size.clone(),
        _ => {
            let defaults = MiniMaxConfig::minimax_m3_vl().patches;
            vec![
                (
                    "shortest_edge".to_owned(),
                    Raw::Int(defaults.min_pixels as i64),
                ),
                (
                    "longest_edge".to_owned(),
                    Raw::Int(defaults.max_pixels as i64),
                ),
            ]
        }
    };
    for (edge, value) in folds {
        hf_put(&mut size, edge, value.clone());
    }
    size.retain(|(k, _)| k != "min_pixels" && k != "max_pixels");
    hf_put(&mut out, "size", Raw::Map(size));
    Ok(out)
}

impl MiniMaxConfig {
    /// `MiniMaxM3VLImageProcessor`'s class defaults: BICUBIC, rescale 1/255, CLIP mean/std,
    /// 3 136 … 451 584 pixels, patch 14, merge 2, temporal 2.
    pub fn minimax_m3_vl() -> Self {
        MiniMaxConfig {
            patches: QwenConfig {
                common: Common::new(CLIP_MEAN, CLIP_STD),
                patch_size: 14,
                merge_size: 2,
                temporal_patch_size: 2,
                min_pixels: 4 * 28 * 28,
                max_pixels: 451_584,
                video_pixels: None,
                video_fps: None,
            },
        }
    }

    /// The backend's fused rescale + normalize for this configuration (both steps are on:
    /// [`validate`](FamilyConfig::validate) refuses anything else).
    fn normalize(&self) -> Normalize {
        let c = &self.patches.common;
        tb::fused_normalize(c.rescale_factor, c.image_mean, c.image_std)
    }

    /// One image, resized with torch's `uint8` kernel to its smart-resize size (its own size
    /// with `do_resize` off), with its patch grid.
    fn prepare<'a>(&self, rgb: Rgb<'a>, threads: usize) -> Result<Prepared<'a>, ProcessorError> {
        let p = &self.patches;
        let size = if p.common.do_resize {
            qwen::smart_resize(
                rgb.height,
                rgb.width,
                p.factor(),
                p.min_pixels,
                p.max_pixels,
            )?
        } else {
            (rgb.height, rgb.width)
        };
        let filter = tb::filter_of(p.common.resample).unwrap_or(TorchFilter::Bicubic);
        qwen::prepare_at_by(p, rgb, size, |rgb, h, w| {
            tb::resize(rgb, h, w, filter, threads)
        })
    }

    fn plan<'a>(
        &self,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<qwen::Patches<'a>, ProcessorError> {
        let normalize = self.normalize();
        qwen::plan_images_by(
            &self.patches,
            &normalize,
            inputs,
            options,
            |rgb, threads| self.prepare(rgb, threads),
        )
    }
}

impl FamilyConfig for MiniMaxConfig {
    fn common(&self) -> &Common {
        &self.patches.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.patches.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size"
            | "merge_size"
            | "temporal_patch_size"
            | "size"
            | "min_pixels"
            | "max_pixels" => self.patches.set(key, value),
            _ => Ok(false),
        }
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        self.patches.entries()
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        tb::check_torch_steps(&self.patches.common)
    }

    fn images(
        &self,
        _normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        self.plan(inputs, options)?.into_outputs()
    }

    fn images_deferred<'a>(
        &self,
        _normalize: &Normalize,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        self.plan(inputs, options)
            .map(|p| Deferred::Patches(Box::new(p)))
    }

    /// Refused: `MiniMaxM3VLVideoProcessor` is not reproduced.
    fn videos(
        &self,
        _normalize: &Normalize,
        _videos: &[Vec<Input<'_>>],
        _options: &Options,
    ) -> Option<Result<Outputs, ProcessorError>> {
        Some(Err(no_videos()))
    }

    fn videos_deferred<'a>(
        &self,
        _normalize: &Normalize,
        _videos: &[Vec<Input<'a>>],
        _options: &Options,
    ) -> Option<Result<Deferred<'a>, ProcessorError>> {
        Some(Err(no_videos()))
    }

    /// `t · h · w / merge_size²` per image (`image_grid_thw`): the `]<]image[>[` tokens
    /// `MiniMaxM3VLProcessor.replace_image_token` writes.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "image_grid_thw")
            .map(|grid| qwen::grid_tokens(grid, self.patches.merge_size))
    }

    fn replacement_spec(&self) -> Option<ReplacementSpec> {
        Some(REPLACEMENT)
    }

    fn prompt_replacement(
        &self,
        grid: &[i64],
        ids: &TokenIds<'_>,
    ) -> Option<Result<Replacement, ProcessorError>> {
        Some(prompt_replacement(self, grid, ids))
    }
}

fn no_videos() -> ProcessorError {
    ProcessorError::config(
        "videos",
        "images only: MiniMaxM3VLVideoProcessor (chunked video_grid_thw, per-frame timestamp \
         text) is not reproduced",
        "minimax_m3_vl",
    )
}

/// `MiniMaxM3VLProcessor.IMAGE_TOKEN`: the chat template's anchor, once per image, and the
/// token whose positions take the image's embeddings.
pub const IMAGE: &str = "]<]image[>[";
/// `VISION_START_TOKEN`.
pub const START: &str = "]<]start of image[>[";
/// `VISION_END_TOKEN`.
pub const END: &str = "]<]end of image[>[";
/// `MiniMaxM3VLConfig.image_token_index` (the published tokenizer's id of [`IMAGE`]).
const IMAGE_ID: u32 = 200_025;

/// `MiniMaxM3VLProcessor`'s tokens.
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["image_grid_thw"],
    anchor: IMAGE,
    embed: IMAGE,
    tokens: &[START, END, IMAGE],
    // The published MiniMax-M3 tokenizer's added tokens (the ids the SMG gateway's tests use
    // too): ]<]image[>[ 200025, ]<]start of image[>[ 200029, ]<]end of image[>[ 200030.
    defaults: &[(START, 200_029), (END, 200_030), (IMAGE, IMAGE_ID)],
    // pixel_values is flat, its rows per image given by image_grid_thw (as Qwen's).
    flat: &[],
    sizes: "",
    per_sample: false,
    // The replacement starts and ends with special tokens, which the tokenizer splits out
    // before anything else: nothing merges.
    joins: &[],
};

/// `MiniMaxM3VLProcessor.replace_image_token`: `start + image × n + end`, `n = t · h · w /
/// merge_size²` from the image's `image_grid_thw` row. Only the image tokens take embeddings
/// (vLLM: `PromptUpdateDetails.select_token_id(full, image_token_id)`); the image owns `t · h ·
/// w` rows of `pixel_values`.
pub fn prompt_replacement(
    config: &MiniMaxConfig,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let merge = (config.patches.merge_size * config.patches.merge_size) as i64;
    let rows = match grid {
        &[t, h, w] if t >= 0 && h >= 0 && w >= 0 => t
            .checked_mul(h)
            .and_then(|th| th.checked_mul(w))
            .filter(|rows| *rows <= 1 << 40),
        _ => None,
    };
    let Some(rows) = rows else {
        return Err(ProcessorError::Config {
            field: "image_grid_thw",
            expected: "one [t, h, w] row of non-negative values".to_owned(),
            actual: format!("{grid:?}"),
        });
    };
    let n = (rows / merge) as usize;
    let start = ids.get(START)?;
    let end = ids.get(END)?;
    let image = ids.get(IMAGE)?;
    Ok(Replacement::bracketed(start, image, n, end, rows as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor, Tensor, TensorData};

    fn raw(entries: &[(&str, Raw)]) -> RawMap {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn size_of(map: &RawMap) -> Option<&Raw> {
        map.iter().find(|(k, _)| k == "size").map(|(_, v)| v)
    }

    #[test]
    fn stale_size_is_dropped_and_pixels_fold_into_size() {
        let pair = Raw::List(vec![Raw::Int(672), Raw::Int(672)]);
        assert_eq!(
            size_of(&hf_minimax(&raw(&[("size", pair.clone())])).unwrap()),
            None
        );
        let folded = hf_minimax(&raw(&[
            ("size", pair),
            ("min_pixels", Raw::Int(3136)),
            ("max_pixels", Raw::Int(1_000_000)),
        ]))
        .unwrap();
        assert_eq!(
            size_of(&folded),
            Some(&Raw::Map(raw(&[
                ("shortest_edge", Raw::Int(3136)),
                ("longest_edge", Raw::Int(1_000_000)),
            ])))
        );
        // A partial size stays partial (transformers' resize raises), completed only by the
        // other bound.
        let partial = Raw::Map(raw(&[("shortest_edge", Raw::Int(200_704))]));
        assert_eq!(
            size_of(&hf_minimax(&raw(&[("size", partial.clone())])).unwrap()),
            Some(&partial)
        );
        let completed = hf_minimax(&raw(&[
            ("size", partial),
            ("max_pixels", Raw::Int(1_000_000)),
        ]))
        .unwrap();
        assert_eq!(
            size_of(&completed),
            Some(&Raw::Map(raw(&[
                ("shortest_edge", Raw::Int(200_704)),
                ("longest_edge", Raw::Int(1_000_000)),
            ])))
        );
        // Another pair is kept as a height/width size, which the family refuses.
        let other = hf_minimax(&raw(&[(
            "size",
            Raw::List(vec![Raw::Int(448), Raw::Int(448)]),
        )]))
        .unwrap();
        assert_eq!(
            size_of(&other),
            Some(&Raw::Map(raw(&[
                ("height", Raw::Int(448)),
                ("width", Raw::Int(448)),
            ])))
        );
    }

    #[test]
    fn defaults_grid_and_tokens() {
        let p = Preprocessor::new(Family::MinimaxM3Vl, &[]).unwrap();
        let data: Vec<u8> = (0..300 * 500 * 3).map(|i| (i % 253) as u8).collect();
        let input = Input::Pixels {
            data: &data,
            width: 500,
            height: 300,
            channels: 3,
        };
        let out = p.images(&[input], &Options::default()).unwrap();
        // smart_resize(300, 500, 28, 3136, 451584) = (308, 504): 22 x 36 patches.
        assert_eq!(
            out.get("image_grid_thw").unwrap(),
            &Tensor::i64(vec![1, 3], vec![1, 22, 36])
        );
        assert_eq!(
            out.get("pixel_values").unwrap().shape,
            [22 * 36, 3 * 2 * 14 * 14]
        );
        assert_eq!(
            out.get("num_image_tokens").unwrap().data,
            TensorData::I64(vec![22 * 36 / 4])
        );
    }

    #[test]
    fn replacement_and_refusals() {
        let owned: Vec<(String, u32)> = REPLACEMENT
            .defaults
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        let config = MiniMaxConfig::minimax_m3_vl();
        let r = prompt_replacement(&config, &[1, 2, 4], &TokenIds(&owned)).unwrap();
        assert_eq!(r.tokens, [200_029, 200_025, 200_025, 200_030].to_vec());
        assert_eq!(r.embed, [false, true, true, false].to_vec());
        assert_eq!(r.rows, 8);
        assert!(prompt_replacement(&config, &[1, 2], &TokenIds(&owned)).is_err());
        assert!(prompt_replacement(&config, &[1, -2, 4], &TokenIds(&owned)).is_err());
        for (key, bad) in [
            ("do_normalize", Value::Bool(false)),
            ("do_rescale", Value::Bool(false)),
            ("resample", Value::Int(1)),
            ("patch_size", Value::Int(0)),
            (
                "size",
                Value::Map(vec![("height".to_owned(), 448), ("width".to_owned(), 448)]),
            ),
        ] {
            let err = Preprocessor::new(Family::MinimaxM3Vl, &[(key.to_owned(), bad)]).unwrap_err();
            assert!(err.to_string().starts_with("config "), "{key}: {err}");
        }
        let p = Preprocessor::new(Family::MinimaxM3Vl, &[]).unwrap();
        let data = [0u8; 3 * 28 * 28];
        let frame = Input::Pixels {
            data: &data,
            width: 28,
            height: 28,
            channels: 3,
        };
        let err = p.videos(&[vec![frame]], &Options::default()).unwrap_err();
        assert!(err.to_string().contains("videos"), "{err}");
    }
}
