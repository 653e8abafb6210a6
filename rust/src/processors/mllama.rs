//! Llama 3.2 Vision (`mllama`: `MllamaImageProcessorPil`, transformers 5.24). Every image is
//! resized (BILINEAR by default, Pillow on the `u8` image) to fit, aspect kept, the best canvas
//! of at most `max_image_tiles` square tiles of side `s` (`size`), padded with black at the
//! bottom and right to that canvas, rescaled and normalised, and cut into its tiles
//! (row-major). A flat list of images is one sample for transformers
//! (`make_nested_list_of_images`), so the outputs carry a leading sample dimension of 1:
//!
//! `pixel_values` `(1, B, max_image_tiles, 3, s, s)` float32 (the tiles an image does not use
//! are `0.0`); `aspect_ratio_ids` `(1, B)` int64 (the canvas's index, from 1, in
//! [`supported_aspect_ratios`]); `aspect_ratio_mask` `(1, B, max_image_tiles)` int64 (1 for the
//! image's tiles, and always for the first); `num_tiles` `(1, B)` int64 (transformers returns
//! it as a nested list, which `MllamaProcessor` pops).
//!
//! - Canvases ([`supported_aspect_ratios`]): `(rows, cols)` for `rows` then `cols` in
//!   `1..=max_image_tiles`, their product at most `max_image_tiles`.
//! - Best canvas ([`optimal_canvas`]): per canvas the scale `min(ch / H, cw / W)` in `float64`;
//!   the smallest scale ≥ 1, else the largest; ties (the same `float64`) to the smallest area,
//!   then the first.
//! - Size on it ([`fit_to_canvas`]): each side clipped to `[s, canvas side]`, the side with the
//!   smaller scale taken whole and the other `floor`ed (at least 1, at most its clipped side).
//!
//! The prompt: `MllamaProcessor` leaves `<|image|>` (128256) as it is — the model attends to
//! the image through cross-attention, no embedding is merged into the prompt — so each image's
//! replacement is its one anchor token, which takes no embedding.

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::pending::{self, Pending, Tiles};
use super::value::{as_bool, as_count, as_hw, hf_keys, hw_value, Common, Value, HALF};
use super::{prepare_all, resize_rgb, Input, Options, Outputs, ProcessorError, Rgb, Tensor};
use crate::image::Filter;

/// Ours: transformers bounds `max_image_tiles` by nothing; the canvases and every image's
/// output grow with it.
pub const MAX_IMAGE_TILES: usize = 64;

/// Llama 3.2 Vision: `MllamaImageProcessor` (an int `size` is a square); `max_image_tiles`,
/// `do_pad` (which must stay true).
pub const MLLAMA: Hf = Hf {
    image_classes: &["MllamaImageProcessor"],
    video_classes: &[],
    normalise: |config| hf_keys(config, &["max_image_tiles", "do_pad"], true),
    processor_keys: &[],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The configuration of Llama 3.2 Vision.
#[derive(Clone, Debug, PartialEq)]
pub struct MllamaConfig {
    pub common: Common,
    /// `size` (`{"height", "width"}`, which must be equal: the tile side).
    pub size: (usize, usize),
    pub max_image_tiles: usize,
    /// `do_pad`: transformers refuses `False`; kept to refuse it too.
    pub do_pad: bool,
}

impl MllamaConfig {
    /// `MllamaImageProcessorPil`'s class defaults: tiles of 224, at most 4, BILINEAR,
    /// mean/std 0.5. (The published Llama-3.2-Vision configs set 560 and the OpenAI CLIP
    /// mean/std.)
    pub fn mllama() -> Self {
        let mut common = Common::new(HALF, HALF);
        common.resample = Filter::Bilinear;
        MllamaConfig {
            common,
            size: (224, 224),
            max_image_tiles: 4,
            do_pad: true,
        }
    }

    fn tile(&self) -> usize {
        self.size.0
    }
}

impl FamilyConfig for MllamaConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.size = as_hw("size", value)?,
            "max_image_tiles" => {
                self.max_image_tiles = as_count("max_image_tiles", value, MAX_IMAGE_TILES)?
            }
            "do_pad" => self.do_pad = as_bool("do_pad", value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("size", hw_value(self.size)),
            ("max_image_tiles", Value::Int(self.max_image_tiles as i64)),
            ("do_pad", Value::Bool(self.do_pad)),
        ]
    }

    /// `_validate_mllama_preprocess_arguments`: padding and resizing on, a square `size`.
    fn validate(&self) -> Result<(), ProcessorError> {
        if !self.do_pad {
            return Err(ProcessorError::config(
                "do_pad",
                "true (MllamaImageProcessor does not support do_pad=False)",
                false,
            ));
        }
        if !self.common.do_resize {
            return Err(ProcessorError::config(
                "do_resize",
                "true (MllamaImageProcessor does not support do_resize=False)",
                false,
            ));
        }
        if self.size.0 != self.size.1 {
            return Err(ProcessorError::config(
                "size",
                "a square tile (height = width), as MllamaImageProcessor requires",
                format!("{}x{} (HxW)", self.size.0, self.size.1),
            ));
        }
        // The largest canvas side must stay a side the resampler takes.
        if self.size.0.saturating_mul(self.max_image_tiles) > super::MAX_SIDE {
            return Err(ProcessorError::config(
                "size",
                format!(
                    "a tile side whose canvas (side x max_image_tiles) is at most {}",
                    super::MAX_SIDE
                ),
                format!("{} x {}", self.size.0, self.max_image_tiles),
            ));
        }
        Ok(())
    }

    pending::planned_images!(plan);

    /// `MllamaProcessor` writes nothing for an image: its `<|image|>` stays one token.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let tiles = i64_values(outputs, "num_tiles")?;
        Some(vec![1; tiles.len()])
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

/// `MllamaProcessor`'s prompt: the chat template's `<|image|>` (Llama 3.2 Vision's
/// `image_token_index` 128256, `MllamaConfig`'s default and the published checkpoints') is
/// kept as the one token; the images reach the model through cross-attention, so no position
/// of the prompt takes an embedding.
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["num_tiles"],
    anchor: "<|image|>",
    embed: "<|image|>",
    tokens: &["<|image|>"],
    defaults: &[("<|image|>", 128256)],
    flat: &[],
    sizes: "",
    per_sample: true,
    joins: &[],
};

/// One image's replacement: its `<|image|>`, which takes no embedding (`grid`: its tile count,
/// 1 ..= `max_image_tiles`).
pub fn prompt_replacement(
    config: &MllamaConfig,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    match *grid {
        [n] if n >= 1 && n as u64 <= config.max_image_tiles as u64 => {}
        _ => {
            return Err(ProcessorError::Config {
                field: "num_tiles",
                expected: format!("one tile count between 1 and {}", config.max_image_tiles),
                actual: format!("{grid:?}"),
            })
        }
    }
    Ok(Replacement {
        tokens: vec![ids.get("<|image|>")?],
        embed: vec![false],
        rows: 1,
    })
}

/// `get_all_supported_aspect_ratios`: `(rows, cols)` tile arrangements of at most `max` tiles,
/// `rows` outer, `cols` inner.
pub fn supported_aspect_ratios(max: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for a in 1..=max {
        for b in 1..=max {
            if a * b <= max {
                out.push((a, b));
            }
        }
    }
    out
}

/// `get_optimal_tiled_canvas`: the canvas `(rows, cols)` of tiles for an image of
/// `height × width` (see the module docs), as numpy computes it in `float64`.
pub fn optimal_canvas(height: usize, width: usize, max: usize, tile: usize) -> (usize, usize) {
    let ratios = supported_aspect_ratios(max);
    let scales: Vec<f64> = ratios
        .iter()
        .map(|&(a, b)| {
            let sh = (a * tile) as f64 / height as f64;
            let sw = (b * tile) as f64 / width as f64;
            // np.where(scale_w > scale_h, scale_h, scale_w)
            if sw > sh {
                sh
            } else {
                sw
            }
        })
        .collect();
    let up = scales
        .iter()
        .copied()
        .filter(|&s| s >= 1.0)
        .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.min(s))));
    let selected = up.unwrap_or_else(|| {
        scales
            .iter()
            .copied()
            .filter(|&s| s < 1.0)
            .fold(f64::NEG_INFINITY, f64::max)
    });
    // Among the canvases at the selected scale, the first of the smallest area (np.argmin).
    let mut best: Option<((usize, usize), usize)> = None;
    for (&(a, b), &s) in ratios.iter().zip(&scales) {
        if s == selected {
            let area = a * tile * b * tile;
            if best.is_none_or(|(_, m)| area < m) {
                best = Some(((a, b), area));
            }
        }
    }
    best.map_or((1, 1), |(ratio, _)| ratio)
}

/// `get_image_size_fit_to_canvas`: the resized `(height, width)` on a `canvas_h × canvas_w`
/// canvas of `tile`-sided tiles.
pub fn fit_to_canvas(
    height: usize,
    width: usize,
    canvas_h: usize,
    canvas_w: usize,
    tile: usize,
) -> (usize, usize) {
    let target_w = width.clamp(tile, canvas_w);
    let target_h = height.clamp(tile, canvas_h);
    let scale_h = target_h as f64 / height as f64;
    let scale_w = target_w as f64 / width as f64;
    let floor_or_one = |x: f64| {
        let f = x.floor();
        if f >= 1.0 {
            f as usize
        } else {
            1
        }
    };
    if scale_w < scale_h {
        (
            floor_or_one(height as f64 * scale_w).min(target_h),
            target_w,
        )
    } else {
        (target_h, floor_or_one(width as f64 * scale_h).min(target_w))
    }
}

/// One image resized, and its canvas in tiles.
struct Prepared<'a> {
    image: Rgb<'a>,
    rows: usize,
    cols: usize,
}

fn prepare<'a>(
    config: &MllamaConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let tile = config.tile();
    let (rows, cols) = optimal_canvas(rgb.height, rgb.width, config.max_image_tiles, tile);
    let (h, w) = fit_to_canvas(rgb.height, rgb.width, rows * tile, cols * tile, tile);
    let image = resize_rgb(rgb, h, w, &config.common, threads)?;
    Ok(Prepared { image, rows, cols })
}

/// Llama 3.2 Vision on a batch (see the module docs): `pixel_values` planned (slot `k` of image
/// `i` a tile of its canvas, row-major, or past its tiles zeros), the other outputs computed.
fn plan<'a>(
    config: &MllamaConfig,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    if inputs.is_empty() {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let s = config.tile();
    let t = config.max_image_tiles;
    let batch = prepared.len();
    let ratios = supported_aspect_ratios(t);
    let mut ids = Vec::with_capacity(batch);
    let mut mask = Vec::with_capacity(batch * t);
    let mut num_tiles = Vec::with_capacity(batch);
    let mut slots = Vec::with_capacity(batch * t);
    let mut images = Vec::with_capacity(batch);
    for (i, p) in prepared.into_iter().enumerate() {
        let n = p.rows * p.cols;
        let id = ratios
            .iter()
            .position(|&r| r == (p.rows, p.cols))
            .map_or(0, |i| i as i64 + 1);
        ids.push(id);
        mask.extend((0..t).map(|k| i64::from(k < n.max(1))));
        num_tiles.push(n as i64);
        // Outside the resized image lies the canvas's black padding: `write_chw` writes the
        // normalised value of a 0 byte there, as transformers pads the u8 image.
        slots.extend((0..t).map(|k| {
            (k < n).then(|| {
                (
                    i,
                    (((k / p.cols) * s) as isize, ((k % p.cols) * s) as isize),
                )
            })
        }));
        images.push(p.image);
    }
    let tiles = Tiles {
        images: images.into(),
        slots,
        size: (s, s),
        normalize: normalize.clone(),
        threads: options.threads,
    };
    let pending = tiles.pending("pixel_values", vec![1, batch, t, 3, s, s])?;
    Ok((
        pending,
        Outputs {
            tensors: vec![
                ("aspect_ratio_ids", Tensor::i64(vec![1, batch], ids)),
                ("aspect_ratio_mask", Tensor::i64(vec![1, batch, t], mask)),
                ("num_tiles", Tensor::i64(vec![1, batch], num_tiles)),
            ],
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor, TensorData};

    #[test]
    fn canvases_as_transformers() {
        assert_eq!(
            supported_aspect_ratios(4),
            [
                (1, 1),
                (1, 2),
                (1, 3),
                (1, 4),
                (2, 1),
                (2, 2),
                (3, 1),
                (4, 1)
            ]
        );
        // A small square upscales to one tile; a wide strip to 1 x 4; a large photo to 2 x 2.
        assert_eq!(optimal_canvas(40, 40, 4, 560), (1, 1));
        assert_eq!(optimal_canvas(100, 2000, 4, 560), (1, 4));
        assert_eq!(optimal_canvas(2000, 2000, 4, 560), (2, 2));
        assert_eq!(optimal_canvas(300, 500, 4, 560), (1, 1));
        assert_eq!(fit_to_canvas(300, 500, 560, 560, 560), (336, 560));
        assert_eq!(fit_to_canvas(1, 1, 560, 560, 560), (560, 560));
        assert_eq!(fit_to_canvas(1, 5000, 560, 2240, 560), (1, 2240));
    }

    #[test]
    fn tiles_masks_and_ids() {
        let wide = vec![255u8; 10 * 30 * 3];
        let inputs = [Input::Pixels {
            data: &wide,
            width: 30,
            height: 10,
            channels: 3,
        }];
        let side = Value::Map(vec![("height".into(), 8), ("width".into(), 8)]);
        let p = Preprocessor::new(Family::Mllama, &[("size".to_owned(), side)]).unwrap();
        let out = p.images(&inputs, &Options::default()).unwrap();
        // 10x30 on tiles of 8: the canvas 1 x 3 -> resized to 8x24.
        assert_eq!(out.get("pixel_values").unwrap().shape, [1, 1, 4, 3, 8, 8]);
        let id = TensorData::I64(vec![3]);
        assert_eq!(out.get("aspect_ratio_ids").unwrap().data, id);
        let mask = TensorData::I64(vec![1, 1, 1, 0]);
        assert_eq!(out.get("aspect_ratio_mask").unwrap().data, mask);
        assert_eq!(out.get("num_tiles").unwrap().data, TensorData::I64(vec![3]));
        let TensorData::F32(values) = &out.get("pixel_values").unwrap().data else {
            panic!("float32 pixels");
        };
        assert!(values[..3 * 3 * 64].iter().all(|&v| v == 1.0));
        assert!(values[3 * 3 * 64..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn replacement_is_the_anchor() {
        let ids = vec![("<|image|>".to_owned(), 128256)];
        let config = MllamaConfig::mllama();
        let one = prompt_replacement(&config, &[3], &TokenIds(&ids)).unwrap();
        assert_eq!(one.tokens, [128256]);
        assert_eq!(one.embed, [false]);
        assert!(prompt_replacement(&config, &[0], &TokenIds(&ids)).is_err());
        assert!(prompt_replacement(&config, &[5], &TokenIds(&ids)).is_err());
        assert!(prompt_replacement(&config, &[1], &TokenIds(&[])).is_err());
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::Mllama, &[(k.to_owned(), v)]).unwrap_err()
        };
        for (key, bad) in [
            ("do_pad", Value::Bool(false)),
            ("do_resize", Value::Bool(false)),
            (
                "size",
                Value::Map(vec![("height".into(), 560), ("width".into(), 448)]),
            ),
            ("max_image_tiles", Value::Int(0)),
            ("max_image_tiles", Value::Int(65)),
        ] {
            assert_eq!(build(key, bad).kind(), "config", "{key}");
        }
    }
}
