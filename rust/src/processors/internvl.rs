//! InternVL (`GotOcr2ImageProcessorPil` as the InternVL checkpoints configure it): with
//! `crop_to_patches` (on for InternVL) and `max_patches > 1`, each image is tiled; otherwise it
//! is resized to `size` as the generic `PilBackend.resize` does. Then rescale and normalize
//! (ImageNet mean/std in the published checkpoints).
//!
//! Tiling ([`best_grid`]): among the `(columns, rows)` grids with `min_patches ..= max_patches`
//! tiles, the one whose `columns / rows` is closest to the image's `W / H` (ties as transformers
//! breaks them). The whole `u8` image is resized **once** to `(rows · h, columns · w)` and cut
//! into its `h × w` tiles in row-major order; when there is more than one tile, the whole image
//! resized to `h × w` (the thumbnail) follows them. The outputs of one input are its tiles (and
//! thumbnail), input after input:
//!
//! `pixel_values` `(Σ num_patches, 3, h, w)` float32, `num_patches` `(B,)` int64.
//!
//! `image_seq_length` (`InternVLProcessor`'s, 256) is kept in the configuration for the token
//! count (`num_patches · image_seq_length` `<IMG_CONTEXT>` tokens per input); it changes no
//! pixel.

use std::borrow::Cow;

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::pending::{self, Pending, Tiles};
use super::sizes::SizeSpec;
use super::value::{as_bool, as_count, as_size, hf_keys, size_value, Common, Value};
use super::{
    check_side, prepare_all, resize_rgb, Input, Options, Outputs, ProcessorError, Rgb, Tensor,
};
use crate::image::Filter;

/// `IMAGENET_DEFAULT_MEAN`.
pub const IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
/// `IMAGENET_DEFAULT_STD`.
pub const IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// InternVL: `GotOcr2ImageProcessor` (an int `size` is a square); `crop_to_patches`,
/// `min_patches`, `max_patches` and `image_seq_length` (an `InternVLProcessor` setting);
/// `crop_size`, `do_center_crop` and `do_pad`, which its `_preprocess` ignores, are ignored.
pub const INTERNVL: Hf = Hf {
    image_classes: &["GotOcr2ImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        hf_keys(
            config,
            &[
                "crop_to_patches",
                "min_patches",
                "max_patches",
                "image_seq_length",
            ],
            true,
        )
    },
    // InternVLProcessor's.
    processor_keys: &[("image_seq_length", None)],
    // InternVLProcessor.images_kwargs = {"crop_to_patches": True}: passed to the image
    // processor on every call, so it wins over the preprocessor config's value (the published
    // files say false).
    processor_forces: Some(("InternVLProcessor", "crop_to_patches", true)),
    published: None,
    count_tensor: None,
};

/// The configuration of InternVL.
#[derive(Clone, Debug, PartialEq)]
pub struct InternVlConfig {
    pub common: Common,
    pub size: SizeSpec,
    pub crop_to_patches: bool,
    pub min_patches: usize,
    pub max_patches: usize,
    /// Ours: `InternVLProcessor`'s `image_seq_length` (`<IMG_CONTEXT>` tokens per tile).
    pub image_seq_length: usize,
}

const MAX_SEQ: usize = 1 << 20;
/// Ours: transformers bounds neither, but enumerates `max_patches²` grids per call.
pub const MAX_PATCHES: usize = 4096;

impl InternVlConfig {
    /// The published InternVL checkpoints (`OpenGVLab/InternVL3-*-hf`): 448 × 448, BICUBIC
    /// (also the class default), ImageNet mean/std, `crop_to_patches` on (`InternVLProcessor`'s
    /// `images_kwargs`), 1 ..= 12 tiles (the class defaults), `image_seq_length` 256. (The
    /// class's own `size` is 384 × 384, its mean/std CLIP's, `crop_to_patches` off.)
    pub fn internvl() -> Self {
        let mut common = Common::new(IMAGENET_MEAN, IMAGENET_STD);
        common.resample = Filter::Bicubic;
        InternVlConfig {
            common,
            size: SizeSpec::Exact {
                height: 448,
                width: 448,
            },
            crop_to_patches: true,
            min_patches: 1,
            max_patches: 12,
            image_seq_length: 256,
        }
    }

    /// Whether an image is tiled (`_preprocess`: `crop_to_patches and max_patches > 1`).
    pub fn tiles(&self) -> bool {
        self.crop_to_patches && self.max_patches > 1
    }
}

impl FamilyConfig for InternVlConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.size = as_size("size", value)?,
            "crop_to_patches" => self.crop_to_patches = as_bool("crop_to_patches", value)?,
            "min_patches" => self.min_patches = as_count("min_patches", value, MAX_PATCHES)?,
            "max_patches" => self.max_patches = as_count("max_patches", value, MAX_PATCHES)?,
            "image_seq_length" => {
                self.image_seq_length = as_count("image_seq_length", value, MAX_SEQ)?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("size", size_value(self.size)),
            ("crop_to_patches", Value::Bool(self.crop_to_patches)),
            ("min_patches", Value::Int(self.min_patches as i64)),
            ("max_patches", Value::Int(self.max_patches as i64)),
            ("image_seq_length", Value::Int(self.image_seq_length as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        // crop_image_to_patches reads size.height and size.width (None for other size dicts:
        // transformers fails with a TypeError).
        if self.tiles() && !matches!(self.size, SizeSpec::Exact { .. }) {
            return Err(ProcessorError::config(
                "size",
                "a dict with keys height and width (crop_to_patches tiles at that size)",
                size_value(self.size),
            ));
        }
        Ok(())
    }

    // InternVL on a batch (see the module docs).
    pending::planned_images!(plan);

    /// `InternVLProcessor`: `num_patches · image_seq_length` `<IMG_CONTEXT>` tokens per image.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let seq = self.image_seq_length as i64;
        let patches = i64_values(outputs, "num_patches")?;
        Some(patches.iter().map(|&n| n * seq).collect())
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

/// `InternVLProcessor`'s tokens (the tokenizer's `start_image_token`, `end_image_token` and
/// `context_image_token`): the chat template writes `<IMG_CONTEXT>` once per image, and the
/// processor replaces it with `<img>`, `image_seq_length · num_patches` `<IMG_CONTEXT>` and
/// `</img>`; the `<IMG_CONTEXT>` positions take the embeddings (`image_token_id`).
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["num_patches"],
    anchor: "<IMG_CONTEXT>",
    embed: "<IMG_CONTEXT>",
    tokens: &["<img>", "</img>", "<IMG_CONTEXT>"],
    // OpenGVLab/InternVL3-*-hf (Qwen2.5 tokenizers): transformers' convert_internvl_weights_to_hf.py
    // appends <img>, </img>, <IMG_CONTEXT>, … to Qwen2.5-VL's 151665 tokens, and writes
    // image_token_id 151667 into the config (InternVLConfig's default too).
    defaults: &[
        ("<img>", 151665),
        ("</img>", 151666),
        ("<IMG_CONTEXT>", 151667),
    ],
    // vLLM's InternVLForConditionalGeneration (interns1.py): pixel_values flat by
    // image_num_patches.
    flat: &["pixel_values"],
    sizes: "image_num_patches",
    per_sample: false,
    joins: &[],
};

/// `InternVLProcessor.replace_image_token`: `<img>`, `<IMG_CONTEXT>` × `image_seq_length ·
/// num_patches`, `</img>`; the image owns `num_patches` rows of `pixel_values` (its tiles and
/// thumbnail).
pub fn prompt_replacement(
    config: &InternVlConfig,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    // A tiled image has at most max_patches tiles and a thumbnail.
    let rows = match grid {
        &[n] if n >= 1 && n as u64 <= MAX_PATCHES as u64 + 1 => n as usize,
        _ => {
            return Err(ProcessorError::Config {
                field: "num_patches",
                expected: format!("one tile count between 1 and {}", MAX_PATCHES + 1),
                actual: format!("{grid:?}"),
            })
        }
    };
    let start = ids.get("<img>")?;
    let end = ids.get("</img>")?;
    let context = ids.get("<IMG_CONTEXT>")?;
    let run = rows.saturating_mul(config.image_seq_length);
    let mut tokens = Vec::with_capacity(run.saturating_add(2));
    tokens.push(start);
    tokens.extend(std::iter::repeat_n(context, run));
    tokens.push(end);
    let mut embed = vec![true; tokens.len()];
    embed[0] = false;
    embed[run + 1] = false;
    Ok(Replacement {
        tokens,
        embed,
        rows,
    })
}

/// `get_optimal_tiled_canvas` for an image of `height × width` and tiles of
/// `tile_h × tile_w`: the `(columns, rows)` grid. The candidates are
/// `get_all_supported_aspect_ratios(min, max)` — `(w, h)` for `w` then `h` in `1..=max` with
/// `min ≤ w·h ≤ max`, stably sorted by `w·h` — scanned in that order: a strictly smaller
/// `|W / H − w / h|` wins; an equal one wins when `H·W > 0.5 · tile_h · tile_w · w · h`. No
/// candidate (`min > max`) leaves `(1, 1)`. Python's arithmetic: `/` of ints is an `f64`
/// division, the product a left-to-right `f64` product, the int-float comparison exact.
pub fn best_grid(
    height: usize,
    width: usize,
    tile_h: usize,
    tile_w: usize,
    min_patches: usize,
    max_patches: usize,
) -> (usize, usize) {
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for w in 1..=max_patches {
        for h in 1..=max_patches / w {
            if w * h >= min_patches {
                candidates.push((w, h));
            }
        }
    }
    candidates.sort_by_key(|&(w, h)| w * h); // stable, as Python's sorted
    let aspect = width as f64 / height as f64;
    // H·W < 2⁵³ (sides ≤ 2¹⁶): exact as an f64, so the comparison is Python's.
    let area = (height as u64 * width as u64) as f64;
    let mut best_diff = f64::INFINITY;
    let mut best = (1, 1);
    for (w, h) in candidates {
        let diff = (aspect - w as f64 / h as f64).abs();
        if diff < best_diff {
            best_diff = diff;
            best = (w, h);
        } else if diff == best_diff
            && area > 0.5 * tile_h as f64 * tile_w as f64 * w as f64 * h as f64
        {
            best = (w, h);
        }
    }
    best
}

/// One output tile: a window of one of an input's resized images.
struct Tile {
    /// Index into the input's images (0: the grid, 1: the thumbnail).
    image: usize,
    origin: (usize, usize),
    out: (usize, usize),
}

/// One input: its resized images and the tiles cut from them, in output order.
struct Prepared<'a> {
    images: Vec<Rgb<'a>>,
    tiles: Vec<Tile>,
}

/// `resize_rgb` of a borrowed image, owned (a copy when the size is unchanged, as Pillow's).
fn resized_copy(
    rgb: &Rgb<'_>,
    h: usize,
    w: usize,
    common: &Common,
    threads: usize,
) -> Result<Rgb<'static>, ProcessorError> {
    let view = Rgb {
        data: Cow::Borrowed(&rgb.data[..]),
        width: rgb.width,
        height: rgb.height,
    };
    let out = resize_rgb(view, h, w, common, threads)?;
    Ok(Rgb {
        width: out.width,
        height: out.height,
        data: Cow::Owned(super::owned_bytes(out.data, "resized image")?),
    })
}

fn prepare<'a>(
    config: &InternVlConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    if !config.tiles() {
        let image = if config.common.do_resize {
            let (h, w) = config.size.output(rgb.height, rgb.width);
            check_side("resized image", h, w)?;
            resize_rgb(rgb, h, w, &config.common, threads)?
        } else {
            rgb
        };
        let out = (image.height, image.width);
        return Ok(Prepared {
            images: vec![image],
            tiles: vec![Tile {
                image: 0,
                origin: (0, 0),
                out,
            }],
        });
    }
    // Tiling resizes whatever do_resize says (crop_image_to_patches ignores it).
    let SizeSpec::Exact {
        height: th,
        width: tw,
    } = config.size
    else {
        // validate() refuses other sizes when tiling.
        return Err(ProcessorError::config(
            "size",
            "a dict with keys height and width",
            size_value(config.size),
        ));
    };
    let (cols, rows) = best_grid(
        rgb.height,
        rgb.width,
        th,
        tw,
        config.min_patches,
        config.max_patches,
    );
    let (grid_h, grid_w) = (th.saturating_mul(rows), tw.saturating_mul(cols));
    check_side("tiled image", grid_h, grid_w)?;
    let mut tiles: Vec<Tile> = (0..rows * cols)
        .map(|i| Tile {
            image: 0,
            origin: ((i / cols) * th, (i % cols) * tw),
            out: (th, tw),
        })
        .collect();
    let mut images = Vec::with_capacity(2);
    if tiles.len() != 1 {
        let thumbnail = resized_copy(&rgb, th, tw, &config.common, threads)?;
        images.push(resize_rgb(rgb, grid_h, grid_w, &config.common, threads)?);
        images.push(thumbnail);
        tiles.push(Tile {
            image: 1,
            origin: (0, 0),
            out: (th, tw),
        });
    } else {
        images.push(resize_rgb(rgb, grid_h, grid_w, &config.common, threads)?);
    }
    Ok(Prepared { images, tiles })
}

/// Every image decoded, resized and tiled: `pixel_values` planned, and `num_patches`.
fn plan<'a>(
    config: &InternVlConfig,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let num_patches: Vec<i64> = prepared.iter().map(|p| p.tiles.len() as i64).collect();
    let mut tiles = prepared.iter().flat_map(|p| p.tiles.iter());
    let Some(first) = tiles.next().map(|t| t.out) else {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    };
    if let Some(t) = tiles.find(|t| t.out != first) {
        return Err(ProcessorError::BatchShape {
            what: "processed images",
            expected: vec![3, first.0, first.1],
            actual: vec![3, t.out.0, t.out.1],
        });
    }
    let (h, w) = first;
    let count = num_patches.iter().sum::<i64>() as usize;
    // Every tile is h × w (checked above) and lies inside its image (the grid image is
    // rows·h × cols·w).
    let (mut images, mut slots) = (Vec::new(), Vec::with_capacity(count));
    for p in prepared {
        let base = images.len();
        for t in &p.tiles {
            slots.push(Some((
                base + t.image,
                (t.origin.0 as isize, t.origin.1 as isize),
            )));
        }
        images.extend(p.images);
    }
    let tiles = Tiles {
        images: images.into(),
        slots,
        size: (h, w),
        normalize: normalize.clone(),
        threads: options.threads,
    };
    let pending = tiles.pending("pixel_values", vec![count, 3, h, w])?;
    let batch = num_patches.len();
    let outputs = Outputs {
        tensors: vec![("num_patches", Tensor::i64(vec![batch], num_patches))],
    };
    Ok((pending, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::TensorData;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn replacement_as_internvl_processor() {
        let owned: Vec<(String, u32)> = REPLACEMENT
            .defaults
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        let ids = TokenIds(&owned);
        let mut config = InternVlConfig::internvl();
        let one = prompt_replacement(&config, &[1], &ids).unwrap();
        assert_eq!(one.tokens.len(), 258);
        assert_eq!(
            (one.tokens[0], one.tokens[1], one.tokens[257]),
            (151665, 151667, 151666)
        );
        assert_eq!(one.embed.iter().filter(|&&e| e).count(), 256);
        assert!(!one.embed[0] && !one.embed[257]);
        assert_eq!(one.rows, 1);
        // 6 tiles + thumbnail, 64 tokens per tile (InternVL2-1B's image_seq_length).
        config.image_seq_length = 64;
        let seven = prompt_replacement(&config, &[7], &ids).unwrap();
        assert_eq!(seven.tokens.len(), 7 * 64 + 2);
        assert_eq!(seven.rows, 7);
        assert!(seven.tokens[1..=7 * 64].iter().all(|&t| t == 151667));
        assert!(prompt_replacement(&config, &[0], &ids).is_err());
        assert!(prompt_replacement(&config, &[1, 1], &ids).is_err());
        assert!(prompt_replacement(&config, &[1], &TokenIds(&[])).is_err());
    }

    #[test]
    fn grids_as_transformers() {
        // Square: ties go to more tiles while the image covers over half of them.
        assert_eq!(best_grid(448, 448, 448, 448, 1, 12), (1, 1));
        assert_eq!(best_grid(1000, 1000, 448, 448, 1, 12), (3, 3));
        assert_eq!(best_grid(1, 1, 448, 448, 1, 12), (1, 1));
        // 2:1 landscape, portrait.
        assert_eq!(best_grid(448, 896, 448, 448, 1, 12), (2, 1));
        assert_eq!(best_grid(896, 448, 448, 448, 1, 12), (1, 2));
        // Very wide: the widest grid allowed.
        assert_eq!(best_grid(2, 2000, 448, 448, 1, 12), (12, 1));
        // min > max: no candidate, (1, 1).
        assert_eq!(best_grid(100, 900, 448, 448, 5, 3), (1, 1));
        // min 4: 1x1..3x1 excluded.
        assert_eq!(best_grid(448, 448, 448, 448, 4, 12), (2, 2));
    }

    #[test]
    fn tiles_then_thumbnail() {
        let wide = vec![255u8; 10 * 20 * 3];
        let square = vec![0u8; 5 * 5 * 3];
        let inputs = [
            Input::Pixels {
                data: &wide,
                width: 20,
                height: 10,
                channels: 3,
            },
            Input::Pixels {
                data: &square,
                width: 5,
                height: 5,
                channels: 3,
            },
        ];
        let entries = [(
            "size".to_owned(),
            Value::Map(vec![("height".into(), 4), ("width".into(), 4)]),
        )];
        let p = Preprocessor::new(Family::InternVl, &entries).unwrap();
        let out = p.images(&inputs, &Options::default()).unwrap();
        // 10x20 in 4x4 tiles: a 4x2 grid and the thumbnail; 5x5: one tile.
        assert_eq!(out.get("pixel_values").unwrap().shape, [10, 3, 4, 4]);
        assert_eq!(
            out.get("num_patches").unwrap().data,
            TensorData::I64(vec![9, 1])
        );
        let off = Preprocessor::new(
            Family::InternVl,
            &[
                ("crop_to_patches".to_owned(), Value::Bool(false)),
                ("do_resize".to_owned(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let err = off.images(&inputs, &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "batch_shape");
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::InternVl, &[(k.to_owned(), v)]).unwrap_err()
        };
        for (key, bad) in [
            ("min_patches", Value::Int(0)),
            ("min_patches", Value::Float(1.0)),
            ("max_patches", Value::Int(0)),
            ("max_patches", Value::Int(-1)),
            ("max_patches", Value::Int(MAX_PATCHES as i64 + 1)),
            ("max_patches", Value::Bool(true)),
            ("crop_to_patches", Value::Int(1)),
            ("image_seq_length", Value::Int(0)),
            ("size", Value::Map(vec![("height".into(), 448)])),
            ("size", Value::Map(vec![("shortest_edge".into(), 448)])),
        ] {
            let err = build(key, bad);
            assert!(
                err.to_string().starts_with(&format!("config {key}:")),
                "{err}"
            );
        }
        // Any size dict without tiling.
        let entries = [
            ("crop_to_patches".to_owned(), Value::Bool(false)),
            (
                "size".to_owned(),
                Value::Map(vec![("shortest_edge".into(), 448)]),
            ),
        ];
        assert!(Preprocessor::new(Family::InternVl, &entries).is_ok());
    }
}
