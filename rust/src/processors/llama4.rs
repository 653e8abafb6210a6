//! Llama 4 (`Llama4ImageProcessor`, transformers' torchvision backend; there is no PIL class):
//! every image is fitted without distortion onto the best canvas of `size`-sided tiles, padded
//! with black, normalised in `bfloat16` and cut into its tiles; an image of more than one tile
//! is followed by a global tile (the whole image resized to one tile). Outputs, input after
//! input:
//!
//! `pixel_values` `(Σ tiles, 3, s, s)` bfloat16, `aspect_ratios` `(B, 2)` int64 (tile rows and
//! columns).
//!
//! - Canvases ([`supported_resolutions`]): for `n` from `max_patches` down to 1, each factor
//!   pair `(a, n / a)`, grouped by aspect ratio in the order first seen.
//! - Best fit ([`best_fit`]): per canvas, the scale `min(ch / H, cw / W)` in `float32` (torch
//!   tensors); the smallest scale ≥ 1 (the largest with `resize_to_max_canvas`), else the largest
//!   below 1; ties to the smallest area, then the first.
//! - Without `resize_to_max_canvas` the target is capped at `max(side, s)` per side (no upscaling
//!   beyond one tile), and the size is `get_max_res_without_distortion`'s, whose arithmetic is
//!   `float32` or `float64` per side depending on whether the value came from a tensor
//!   (Python's `min` returns whichever operand is smaller) — reproduced in [`new_size`].
//! - torch's antialiased `uint8` resize (BILINEAR by default), zero padding, then
//!   `x.to(bf16) × rescale_factor` and `(x − mean) / std` in bf16 ([`bf16_table`]).
//!
//! `patch_size` (14) and `pixel_shuffle_ratio` (0.5) are `Llama4Processor`'s; they count the
//! `<|patch|>` tokens per tile, `(s / patch)² / round(1 / ratio²)`, and change no pixel.

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::torch_backend::{self as tb, bf16_table, Table};
use super::value::{as_bool, as_count, as_float, as_hw, hf_keys, hw_value, Common, Value, HALF};
use super::{
    check_side, checked_len, parallel, prepare_all, Input, Options, OutBuf, Outputs,
    ProcessorError, Rgb, Tensor, TensorData,
};
use crate::image::Filter;

/// A `bfloat16` output value (its bits) before it is written.
type Bf16Out = std::mem::MaybeUninit<u16>;

/// Llama 4: `Llama4ImageProcessor` (torchvision: an int `size` is a square); `max_patches`,
/// `resize_to_max_canvas`, and `Llama4Processor`'s `patch_size`/`pixel_shuffle_ratio` (they
/// count tokens).
pub const LLAMA4: Hf = Hf {
    image_classes: &["Llama4ImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        hf_keys(
            config,
            &[
                "max_patches",
                "resize_to_max_canvas",
                "patch_size",
                "pixel_shuffle_ratio",
            ],
            true,
        )
    },
    // Llama4Processor's, for the token count.
    processor_keys: &[("patch_size", None), ("pixel_shuffle_ratio", None)],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The configuration of Llama 4.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama4Config {
    pub common: Common,
    /// The tile side (`size`, square).
    pub tile: (usize, usize),
    pub max_patches: usize,
    pub resize_to_max_canvas: bool,
    /// Ours: `Llama4Processor`'s, for the token count.
    pub patch_size: usize,
    pub pixel_shuffle_ratio: f64,
}

/// Ours: transformers bounds `max_patches` by nothing; the canvases grow with it.
pub const MAX_PATCHES: usize = 1024;

impl Llama4Config {
    /// `Llama4ImageProcessor`'s defaults (also the published checkpoints'): tiles of 336,
    /// at most 16, BILINEAR, mean/std 0.5; `Llama4Processor`'s patch 14 and pixel shuffle 0.5.
    pub fn llama4() -> Self {
        let mut common = Common::new(HALF, HALF);
        common.resample = Filter::Bilinear;
        Llama4Config {
            common,
            tile: (336, 336),
            max_patches: 16,
            resize_to_max_canvas: false,
            patch_size: 14,
            pixel_shuffle_ratio: 0.5,
        }
    }
}

impl FamilyConfig for Llama4Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.tile = as_hw("size", value)?,
            "max_patches" => self.max_patches = as_count("max_patches", value, MAX_PATCHES)?,
            "resize_to_max_canvas" => {
                self.resize_to_max_canvas = as_bool("resize_to_max_canvas", value)?
            }
            "patch_size" => self.patch_size = as_count("patch_size", value, 1 << 16)?,
            "pixel_shuffle_ratio" => {
                let ratio = as_float("pixel_shuffle_ratio", value)?;
                if !(ratio.is_finite() && ratio > 0.0 && ratio <= 1.0) {
                    return Err(ProcessorError::config(
                        "pixel_shuffle_ratio",
                        "a number in (0, 1]",
                        value,
                    ));
                }
                self.pixel_shuffle_ratio = ratio;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("size", hw_value(self.tile)),
            ("max_patches", Value::Int(self.max_patches as i64)),
            (
                "resize_to_max_canvas",
                Value::Bool(self.resize_to_max_canvas),
            ),
            ("patch_size", Value::Int(self.patch_size as i64)),
            (
                "pixel_shuffle_ratio",
                Value::Float(self.pixel_shuffle_ratio),
            ),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if self.tile.0 != self.tile.1 {
            return Err(ProcessorError::config(
                "size",
                "a square tile (height = width), as find_supported_resolutions requires",
                format!("{}x{} (HxW)", self.tile.0, self.tile.1),
            ));
        }
        if !self.common.do_resize {
            return Err(ProcessorError::config(
                "do_resize",
                "true (the processor always resizes to a supported canvas)",
                false,
            ));
        }
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

    /// `Llama4Processor`: [`tokens_per_tile`] for each tile and for the global tile, which
    /// only an image of more than one tile has.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let per_tile = tokens_per_tile(self) as i64;
        let ratios = i64_values(outputs, "aspect_ratios")?;
        Some(
            ratios
                .chunks_exact(2)
                .map(|rc| {
                    let tiles = rc[0] * rc[1];
                    if tiles > 1 {
                        per_tile * (tiles + 1)
                    } else {
                        per_tile
                    }
                })
                .collect(),
        )
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

/// `Llama4Processor`'s tokens: `<|image|>` is the chat template's anchor (`fake_image_token`)
/// and the global tile's marker; `<|patch|>` (`image_token_index` of `config.json`) the
/// positions that take the vision embeddings.
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["aspect_ratios"],
    anchor: "<|image|>",
    embed: "<|patch|>",
    tokens: &[
        "<|image_start|>",
        "<|image_end|>",
        "<|image|>",
        "<|patch|>",
        "<|tile_x_separator|>",
        "<|tile_y_separator|>",
    ],
    // Scout/Maverick: LLAMA4_VISION_SPECIAL_TOKENS from 200080 (transformers'
    // convert_llama4_weights_to_hf.py; Llama4Config boi 200080, eoi 200081, image_token_index
    // 200092).
    defaults: &[
        ("<|image_start|>", 200080),
        ("<|image_end|>", 200081),
        ("<|tile_x_separator|>", 200084),
        ("<|tile_y_separator|>", 200085),
        ("<|image|>", 200090),
        ("<|patch|>", 200092),
    ],
    // vLLM's Llama4ForConditionalGeneration: pixel_values flat by patches_per_image.
    flat: &["pixel_values"],
    sizes: "patches_per_image",
    per_sample: false,
    joins: &[],
};

/// `Llama4Processor._prompt_split_image(aspect_ratio, tokens_per_tile)`: `<|image_start|>`;
/// for an image of more than one tile, per tile row its tiles' `<|patch|>` runs separated by
/// `<|tile_x_separator|>` and ended by `<|tile_y_separator|>`; then `<|image|>` and the global
/// tile's `<|patch|>` run; `<|image_end|>`. Only the `<|patch|>` positions take embeddings
/// (vLLM: `PromptUpdateDetails.select_text(repl, "<|patch|>")`). The image's rows of
/// `pixel_values` are its tiles plus the global tile when it has more than one.
pub fn prompt_replacement(
    config: &Llama4Config,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let (rows, cols) = match grid {
        &[r, c] if r >= 1 && c >= 1 && (r as u64) * (c as u64) <= MAX_PATCHES as u64 => {
            (r as usize, c as usize)
        }
        _ => {
            return Err(ProcessorError::Config {
                field: "aspect_ratios",
                expected: format!("two tile counts of at most {MAX_PATCHES} tiles in all"),
                actual: format!("{grid:?}"),
            })
        }
    };
    let start = ids.get("<|image_start|>")?;
    let end = ids.get("<|image_end|>")?;
    let image = ids.get("<|image|>")?;
    let patch = ids.get("<|patch|>")?;
    let tile_x = ids.get("<|tile_x_separator|>")?;
    let tile_y = ids.get("<|tile_y_separator|>")?;
    let per_tile = tokens_per_tile(config);
    let tiles = rows * cols;
    let mut tokens = Vec::with_capacity((tiles + 1) * (per_tile + 1) + rows + 3);
    let push_run = |tokens: &mut Vec<u32>| tokens.extend(std::iter::repeat_n(patch, per_tile));
    tokens.push(start);
    if tiles > 1 {
        for _ in 0..rows {
            for x in 0..cols {
                push_run(&mut tokens);
                if x + 1 < cols {
                    tokens.push(tile_x);
                }
            }
            tokens.push(tile_y);
        }
    }
    tokens.push(image);
    push_run(&mut tokens);
    tokens.push(end);
    let embed = tokens.iter().map(|&t| t == patch).collect();
    Ok(Replacement {
        tokens,
        embed,
        rows: if tiles > 1 { tiles + 1 } else { 1 },
    })
}

/// `find_supported_resolutions(max_patches, tile)`: canvases `(height, width)` in transformers'
/// order.
pub fn supported_resolutions(max_patches: usize, tile: usize) -> Vec<(usize, usize)> {
    let mut groups: Vec<(f64, Vec<(usize, usize)>)> = Vec::new();
    for n in (1..=max_patches).rev() {
        for a in (1..=n).filter(|a| n % a == 0) {
            let (h, w) = (a, n / a);
            let ratio = h as f64 / w as f64;
            match groups.iter_mut().find(|(r, _)| *r == ratio) {
                Some((_, list)) => list.push((h, w)),
                None => groups.push((ratio, vec![(h, w)])),
            }
        }
    }
    groups
        .into_iter()
        .flat_map(|(_, list)| list)
        .map(|(h, w)| (h * tile, w * tile))
        .collect()
}

/// `get_best_fit((height, width), canvases, resize_to_max_canvas)`.
pub fn best_fit(
    height: usize,
    width: usize,
    canvases: &[(usize, usize)],
    resize_to_max_canvas: bool,
) -> (usize, usize) {
    // torch: int64 tensor / int = float32; torch.where(scale_h > scale_w, scale_w, scale_h).
    let scales: Vec<f32> = canvases
        .iter()
        .map(|&(ch, cw)| {
            let sh = ch as f32 / height as f32;
            let sw = cw as f32 / width as f32;
            if sh > sw {
                sw
            } else {
                sh
            }
        })
        .collect();
    let up = scales.iter().copied().filter(|&s| s >= 1.0);
    let selected = if scales.iter().any(|&s| s >= 1.0) {
        if resize_to_max_canvas {
            up.fold(f32::NEG_INFINITY, f32::max)
        } else {
            up.fold(f32::INFINITY, f32::min)
        }
    } else {
        scales.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    };
    canvases
        .iter()
        .zip(&scales)
        .filter(|(_, &s)| s == selected)
        .map(|(&c, _)| c)
        .min_by_key(|&(h, w)| h * w)
        .unwrap_or(canvases[0])
}

/// A side of the target size: a Python `int`, or an element of the canvas tensor (`int64`),
/// whose divisions are then `float32`.
#[derive(Clone, Copy, Debug)]
enum Side {
    Int(usize),
    Tensor(usize),
}

impl Side {
    fn value(self) -> usize {
        match self {
            Side::Int(v) | Side::Tensor(v) => v,
        }
    }
}

/// A scale `target / original`: `float64` (Python) or `float32` (a 0-d tensor).
#[derive(Clone, Copy, Debug)]
enum Scale {
    F64(f64),
    F32(f32),
}

impl Scale {
    fn of(target: Side, original: usize) -> Scale {
        match target {
            Side::Int(t) => Scale::F64(t as f64 / original as f64),
            Side::Tensor(t) => Scale::F32(t as f32 / original as f32),
        }
    }

    /// `self < other`; a tensor compared with a Python float casts the float to `float32`.
    fn lt(self, other: Scale) -> bool {
        match (self, other) {
            (Scale::F64(a), Scale::F64(b)) => a < b,
            (Scale::F32(a), Scale::F32(b)) => a < b,
            (Scale::F32(a), Scale::F64(b)) => a < b as f32,
            (Scale::F64(a), Scale::F32(b)) => (a as f32) < b,
        }
    }

    /// `math.floor(side · self)`.
    fn floor_times(self, side: usize) -> usize {
        match self {
            Scale::F64(s) => (side as f64 * s).floor() as usize,
            Scale::F32(s) => (side as f32 * s).floor() as usize,
        }
    }
}

/// Python's `min(a, b)` of an `int` and a tensor element: `b` if `b < a`, else `a`.
fn py_min(a: usize, b: Side) -> Side {
    if b.value() < a {
        b
    } else {
        Side::Int(a)
    }
}

/// The resized size `(height, width)` for an image of `height × width` on `canvas`.
pub fn new_size(
    height: usize,
    width: usize,
    canvas: (usize, usize),
    tile: usize,
    resize_to_max_canvas: bool,
) -> (usize, usize) {
    let (th, tw) = if resize_to_max_canvas {
        (Side::Tensor(canvas.0), Side::Tensor(canvas.1))
    } else {
        (
            py_min(height.max(tile), Side::Tensor(canvas.0)),
            py_min(width.max(tile), Side::Tensor(canvas.1)),
        )
    };
    // get_max_res_without_distortion
    let scale_w = Scale::of(tw, width);
    let scale_h = Scale::of(th, height);
    let (h, w) = if scale_w.lt(scale_h) {
        (scale_w.floor_times(height).min(th.value()), tw.value())
    } else {
        (th.value(), scale_h.floor_times(width).min(tw.value()))
    };
    (h.max(1), w.max(1))
}

/// `<|patch|>` tokens per tile (and per global tile): `Llama4Processor`'s
/// `(s // patch)² // round(1 / ratio²)`.
pub fn tokens_per_tile(config: &Llama4Config) -> usize {
    let side = config.tile.0 / config.patch_size;
    // Python's `round`: ties to even.
    let downsample =
        (1.0 / (config.pixel_shuffle_ratio * config.pixel_shuffle_ratio)).round_ties_even();
    (side * side) / (downsample as usize).max(1)
}

/// One input, ready to be written: the resized image (the canvas's top left; the rest is zero
/// padding), its grid, and the global tile.
struct Prepared<'a> {
    canvas: Rgb<'a>,
    rows: usize,
    cols: usize,
    global: Option<Rgb<'static>>,
}

fn prepare<'a>(
    config: &Llama4Config,
    canvases: &[(usize, usize)],
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let s = config.tile.0;
    let filter =
        tb::filter_of(config.common.resample).unwrap_or(crate::image::torch::TorchFilter::Bilinear);
    let canvas = best_fit(rgb.height, rgb.width, canvases, config.resize_to_max_canvas);
    check_side("canvas", canvas.0, canvas.1)?;
    let (h, w) = new_size(
        rgb.height,
        rgb.width,
        canvas,
        s,
        config.resize_to_max_canvas,
    );
    let (rows, cols) = (canvas.0 / s, canvas.1 / s);
    let global = if rows * cols > 1 {
        let data = tb::resized(rgb.view(), s, s, filter, threads)?;
        Some(Rgb {
            data: std::borrow::Cow::Owned(data),
            width: s,
            height: s,
        })
    } else {
        None
    };
    let resized = tb::resize(rgb, h, w, filter, threads)?;
    Ok(Prepared {
        canvas: resized,
        rows,
        cols,
        global,
    })
}

fn write(table: &Table<Bf16Out>, p: &Prepared<'_>, s: usize, out: &mut [Bf16Out]) {
    let per_tile = 3 * s * s;
    let mut tiles = out.chunks_exact_mut(per_tile);
    for r in 0..p.rows {
        for c in 0..p.cols {
            if let Some(tile) = tiles.next() {
                tb::write_padded_tile(table, p.canvas.view(), 0, (r * s, c * s), (s, s), tile);
            }
        }
    }
    if let (Some(global), Some(tile)) = (&p.global, tiles.next()) {
        tb::write_tile(table, global.view(), (0, 0), (s, s), tile);
    }
}

/// Llama 4 on a batch (see the module docs).
pub fn images(
    config: &Llama4Config,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let s = config.tile.0;
    let c = &config.common;
    let table =
        bf16_table(c.rescale_factor, c.image_mean, c.image_std).map(|r| r.map(Bf16Out::new));
    let canvases = supported_resolutions(config.max_patches, s);
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, &canvases, rgb, threads)
    })?;
    let counts: Vec<usize> = prepared
        .iter()
        .map(|p| p.rows * p.cols + usize::from(p.global.is_some()))
        .collect();
    let total: usize = counts.iter().sum();
    let len = checked_len("pixel_values", &[total, 3, s, s], 2)?;
    let mut buffer = OutBuf::<u16>::new("pixel_values", len)?;
    let lengths: Vec<usize> = counts.iter().map(|n| n * 3 * s * s).collect();
    let work: Vec<(&Prepared<'_>, &mut [Bf16Out])> =
        prepared.iter().zip(buffer.slices(&lengths)).collect();
    let workers = parallel::writers(options.threads, work.len(), 2 * len);
    parallel::map(work, workers, |_, (p, out)| write(&table, p, s, out));
    // SAFETY: every value was written: the slices of `lengths` cover the buffer, and `write`
    // fills each image's `rows · cols` tiles (each `write_padded_tile` writes its whole window,
    // image and padding) and its global tile, `counts` of them.
    let pixel_values = unsafe { buffer.finish() };
    let aspect: Vec<i64> = prepared
        .iter()
        .flat_map(|p| [p.rows as i64, p.cols as i64])
        .collect();
    let batch = prepared.len();
    super::recycle_images(
        prepared
            .into_iter()
            .flat_map(|p| std::iter::once(p.canvas).chain(p.global)),
    );
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![total, 3, s, s],
                    data: TensorData::Bf16(pixel_values),
                },
            ),
            ("aspect_ratios", Tensor::i64(vec![batch, 2], aspect)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canvases_as_transformers() {
        let c = supported_resolutions(16, 336);
        assert_eq!(c.len(), 50);
        // n = 16: factors 1, 2, 4, 8, 16 → ratios 1/16, 2/8, 1 (4x4), 8/2, 16; first group 1/16.
        assert_eq!(c[0], (336, 16 * 336));
        let c4 = supported_resolutions(4, 224);
        // The docstring's example for max 4 (the order of its dict): 0.25, 1.0 (2x2, 1x1), 4.0, ...
        assert_eq!(&c4[..4], &[(224, 896), (448, 448), (224, 224), (896, 224)]);
    }

    #[test]
    fn documented_examples() {
        let c = supported_resolutions(16, 336);
        // transformers' docs: 600x512 → 672x672 without a resize; 1080x1920 → 1008x1680, 945x1680.
        assert_eq!(best_fit(600, 512, &c, false), (672, 672));
        assert_eq!(new_size(600, 512, (672, 672), 336, false), (600, 512));
        assert_eq!(best_fit(1080, 1920, &c, false), (1008, 1680));
        assert_eq!(new_size(1080, 1920, (1008, 1680), 336, false), (945, 1680));
        // 200x200 → one tile, upscaled.
        assert_eq!(best_fit(200, 200, &c, false), (336, 336));
        assert_eq!(new_size(200, 200, (336, 336), 336, false), (336, 336));
        let docs = [(224, 672), (672, 224), (224, 448), (448, 224), (224, 224)];
        assert_eq!(best_fit(200, 300, &docs, false), (224, 448));
        assert_eq!(tokens_per_tile(&Llama4Config::llama4()), 144);
    }

    #[test]
    fn replacement_as_llama4_processor() {
        let names = REPLACEMENT.tokens;
        let owned: Vec<(String, u32)> = names
            .iter()
            .zip([1, 2, 3, 4, 5, 6])
            .map(|(n, i)| (n.to_string(), i))
            .collect();
        let ids = TokenIds(&owned);
        let config = Llama4Config::llama4();
        let one = prompt_replacement(&config, &[1, 1], &ids).unwrap();
        assert_eq!(one.tokens.len(), 147);
        assert_eq!((one.tokens[0], one.tokens[1], one.tokens[146]), (1, 3, 2));
        assert_eq!(one.embed.iter().filter(|&&e| e).count(), 144);
        assert_eq!(one.rows, 1);
        // 2 rows of 3 tiles: 6 runs, 2 x-separators per row, one y-separator per row, global.
        let six = prompt_replacement(&config, &[2, 3], &ids).unwrap();
        assert_eq!(six.tokens.len(), 1 + 6 * 144 + 4 + 2 + 1 + 144 + 1);
        assert_eq!(six.tokens[1 + 144], 5);
        assert_eq!(six.tokens[1 + 3 * 144 + 2], 6);
        assert_eq!(six.embed.iter().filter(|&&e| e).count(), 7 * 144);
        assert_eq!(six.rows, 7);
        assert!(prompt_replacement(&config, &[0, 1], &ids).is_err());
        assert!(prompt_replacement(&config, &[1, 1], &TokenIds(&[])).is_err());
    }
}
