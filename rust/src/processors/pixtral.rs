//! Pixtral (`PixtralImageProcessorPil`): each image keeps its aspect ratio and its own size.
//!
//! Per image of `(H, W)`, with `size` read as a bound `(max_h, max_w)` (`{"longest_edge": L}`
//! is `(L, L)`, `{"height": h, "width": w}` is `(h, w)`) and `patch = (ph, pw)`:
//! 1. [`output_size`]: `ratio = max(H / max_h, W / max_w)`; above 1 both sides become
//!    `floor(side / ratio)`; then each side is rounded **up** to a multiple of its patch side
//!    (`((side - 1) // p + 1) * p`, so a side floored to 0 stays 0 and is refused, as
//!    transformers fails on it);
//! 2. resize (BICUBIC by default, Pillow-exact), optional center crop, rescale, normalize;
//! 3. `do_pad` (on by default): every image is padded at the bottom and right with `0.0` to the
//!    largest height and the largest width of the batch.
//!
//! `pixel_values` `(B, 3, H_max, W_max)` float32, `image_sizes` `(B, 2)` int64 = each image's
//! processed `(height, width)` before the padding.
//!
//! `spatial_merge_size` (ours, default 1) multiplies the patch size, as `PixtralProcessor` does
//! when it calls the image processor (`patch_size = patch_size * spatial_merge_size`; 2 for
//! Mistral-Small-3.1), so the sizes are the ones the model's placeholder tokens are counted on.

use super::clip::{write_padded, Prepared};
use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::sizes::center_crop_origin;
use super::value::{
    as_bool, as_count, as_hw, hf_clip_like, hf_get, hf_put, hf_size, hw_value, Common, Raw, Value,
    CLIP_MEAN, CLIP_STD,
};
use super::{
    check_side, checked_len, parallel, prepare_all, resize_rgb, Input, Options, Out, OutBuffer,
    Outputs, ProcessorError, Rgb, Tensor, TensorData,
};

/// `size` as `PixtralImageProcessorPil.resize` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PixtralSize {
    /// `{"longest_edge": l}` (a `shortest_edge` next to it is ignored, as transformers does).
    LongestEdge(usize),
    /// `{"height": h, "width": w}`: separate bounds.
    HeightWidth { height: usize, width: usize },
}

impl PixtralSize {
    /// The `(max_height, max_width)` bound.
    pub fn bound(self) -> (usize, usize) {
        match self {
            PixtralSize::LongestEdge(l) => (l, l),
            PixtralSize::HeightWidth { height, width } => (height, width),
        }
    }
}

/// Pixtral: `PixtralImageProcessor` (`default_to_square`: an int `size` is a square). An int or
/// dict `patch_size` is read as `get_size_dict(patch_size, default_to_square=True)` (anything
/// else is for the processor to reject); `spatial_merge_size` is a `PixtralProcessor` setting.
pub const PIXTRAL: Hf = Hf {
    image_classes: &["PixtralImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        let mut out = hf_clip_like(
            config,
            &["do_center_crop", "do_pad", "spatial_merge_size"],
            true,
        )?;
        if let Some(patch) = hf_get(config, "patch_size") {
            let value = match patch {
                Raw::Int(_) | Raw::Map(_) | Raw::Other { int: true, .. } => {
                    Raw::Map(hf_size(patch, true)?)
                }
                _ => patch.clone(),
            };
            hf_put(&mut out, "patch_size", value);
        }
        Ok(out)
    },
    // PixtralProcessor._process_images: patch_size = patch_size * spatial_merge_size, with
    // the processor's defaults 16 and 1.
    processor_keys: &[("patch_size", Some(16)), ("spatial_merge_size", Some(1))],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The configuration of Pixtral.
#[derive(Clone, Debug, PartialEq)]
pub struct PixtralConfig {
    pub common: Common,
    pub size: PixtralSize,
    /// `(height, width)`.
    pub patch_size: (usize, usize),
    /// Ours: `PixtralProcessor`'s `spatial_merge_size`, multiplying `patch_size`.
    pub spatial_merge_size: usize,
    pub do_center_crop: bool,
    /// `(height, width)`.
    pub crop_size: Option<(usize, usize)>,
    pub do_pad: bool,
}

const MAX_PATCH: usize = 1024;
const MAX_MERGE: usize = 64;

impl PixtralConfig {
    /// `PixtralImageProcessorPil`'s class defaults.
    pub fn pixtral() -> Self {
        PixtralConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            size: PixtralSize::LongestEdge(1024),
            patch_size: (16, 16),
            spatial_merge_size: 1,
            do_center_crop: false,
            crop_size: None,
            do_pad: true,
        }
    }

    /// The patch the sides are rounded up to: `patch_size × spatial_merge_size`.
    pub fn effective_patch(&self) -> (usize, usize) {
        let m = self.spatial_merge_size;
        (self.patch_size.0 * m, self.patch_size.1 * m)
    }
}

impl FamilyConfig for PixtralConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.size = as_pixtral_size(value)?,
            "patch_size" => self.patch_size = as_patch(value)?,
            "spatial_merge_size" => {
                self.spatial_merge_size = as_count("spatial_merge_size", value, MAX_MERGE)?
            }
            "do_center_crop" => self.do_center_crop = as_bool("do_center_crop", value)?,
            "crop_size" => {
                self.crop_size = match value {
                    Value::None => None,
                    other => Some(as_hw("crop_size", other)?),
                }
            }
            "do_pad" => self.do_pad = as_bool("do_pad", value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let size = match self.size {
            PixtralSize::LongestEdge(l) => Value::Map(vec![("longest_edge".into(), l as i64)]),
            PixtralSize::HeightWidth { height, width } => hw_value((height, width)),
        };
        vec![
            ("size", size),
            ("patch_size", hw_value(self.patch_size)),
            (
                "spatial_merge_size",
                Value::Int(self.spatial_merge_size as i64),
            ),
            ("do_center_crop", Value::Bool(self.do_center_crop)),
            ("crop_size", self.crop_size.map_or(Value::None, hw_value)),
            ("do_pad", Value::Bool(self.do_pad)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        super::value::check_crop(self.do_center_crop, self.crop_size)
    }

    fn images(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        images(self, normalize, inputs, options)
    }

    /// `PixtralProcessor`: `rows · (cols + 1)` per image (`[IMG]` per merged patch, a break or
    /// the end after each row) of its processed `image_sizes`.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let (ph, pw) = self.effective_patch();
        let sizes = i64_values(outputs, "image_sizes")?;
        Some(
            sizes
                .chunks_exact(2)
                .map(|hw| {
                    let (rows, cols) = (hw[0] / ph as i64, hw[1] / pw as i64);
                    rows * (cols + 1)
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

/// `PixtralProcessor`'s tokens: `[IMG]` is both the chat template's anchor (once per image)
/// and the token whose positions take the embeddings (`config.json`'s `image_token_index`).
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["image_sizes"],
    anchor: "[IMG]",
    embed: "[IMG]",
    tokens: &["[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    // mistral-community/pixtral-12b (the tekken special tokens: [IMG] 10, [IMG_BREAK] 12,
    // [IMG_END] 13; config.json image_token_index 10).
    defaults: &[("[IMG]", 10), ("[IMG_BREAK]", 12), ("[IMG_END]", 13)],
    // One (padded) entry of pixel_values per image, image_sizes beside it.
    flat: &[],
    sizes: "",
    per_sample: false,
    joins: &[],
};

/// `PixtralProcessor.replace_image_token` for an image whose processed size (its
/// `image_sizes` row) is `(h, w)`, with `p = patch_size × spatial_merge_size`: `h // p` rows of
/// `w // p` `[IMG]` each ended by `[IMG_BREAK]`, the last one by `[IMG_END]` instead. Only the
/// `[IMG]` positions take embeddings (vLLM: `PromptUpdateDetails.select_token_id(tokens,
/// image_token_id)`); each image is one entry of `pixel_values`.
pub fn prompt_replacement(
    config: &PixtralConfig,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let (ph, pw) = config.effective_patch();
    let (rows, cols) = match grid {
        &[h, w] if h >= ph as i64 && w >= pw as i64 && h.max(w) <= super::MAX_SIDE as i64 => {
            (h as usize / ph, w as usize / pw)
        }
        _ => {
            return Err(ProcessorError::Config {
                field: "image_sizes",
                expected: format!(
                    "a processed (height, width) of at least one {ph}x{pw} patch and at most {} \
                     per side",
                    super::MAX_SIDE
                ),
                actual: format!("{grid:?}"),
            })
        }
    };
    let image = ids.get("[IMG]")?;
    let row_break = ids.get("[IMG_BREAK]")?;
    let end = ids.get("[IMG_END]")?;
    let mut tokens = Vec::with_capacity(rows * (cols + 1));
    for r in 0..rows {
        tokens.extend(std::iter::repeat_n(image, cols));
        tokens.push(if r + 1 == rows { end } else { row_break });
    }
    let embed = tokens.iter().map(|&t| t == image).collect();
    Ok(Replacement {
        tokens,
        embed,
        rows: 1,
    })
}

fn as_pixtral_size(value: &Value) -> Result<PixtralSize, ProcessorError> {
    let expected = || {
        format!(
            "a dict with key longest_edge (optionally with shortest_edge, unused) or keys height \
             and width, sizes between 1 and {}",
            super::MAX_SIDE
        )
    };
    let Value::Map(entries) = value else {
        return Err(ProcessorError::config("size", expected(), value));
    };
    let get = |k: &str| entries.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
    let side = |v: Option<i64>| match v {
        Some(v) if v >= 1 && v as u64 <= super::MAX_SIDE as u64 => Ok(v as usize),
        _ => Err(ProcessorError::config("size", expected(), value)),
    };
    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    match keys[..] {
        ["longest_edge"] | ["longest_edge", "shortest_edge"] => {
            Ok(PixtralSize::LongestEdge(side(get("longest_edge"))?))
        }
        ["height", "width"] => Ok(PixtralSize::HeightWidth {
            height: side(get("height"))?,
            width: side(get("width"))?,
        }),
        _ => Err(ProcessorError::config("size", expected(), value)),
    }
}

fn as_patch(value: &Value) -> Result<(usize, usize), ProcessorError> {
    let expected =
        || format!("an integer or a dict with keys height and width, between 1 and {MAX_PATCH}");
    let ok = |v: i64| v >= 1 && v as u64 <= MAX_PATCH as u64;
    match value {
        Value::Int(p) if ok(*p) => Ok((*p as usize, *p as usize)),
        Value::Map(entries) => {
            let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
            keys.sort_unstable();
            let get = |k: &str| {
                entries
                    .iter()
                    .find(|(key, _)| key == k)
                    .map_or(0, |(_, v)| *v)
            };
            let (h, w) = (get("height"), get("width"));
            if keys[..] == ["height", "width"] && ok(h) && ok(w) {
                Ok((h as usize, w as usize))
            } else {
                Err(ProcessorError::config("patch_size", expected(), value))
            }
        }
        _ => Err(ProcessorError::config("patch_size", expected(), value)),
    }
}

/// `ceil(len / p)` as transformers' `_num_image_tokens` writes it: `(len - 1) // p + 1`, which
/// is 0 for a length of 0 (Python's floor division of −1).
fn tokens(len: usize, p: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len - 1) / p + 1
    }
}

/// transformers' Pixtral `get_resize_output_image_size((height, width), bound, patch)`.
pub fn output_size(
    height: usize,
    width: usize,
    (max_h, max_w): (usize, usize),
    (ph, pw): (usize, usize),
) -> (usize, usize) {
    let (rh, rw) = (height as f64 / max_h as f64, width as f64 / max_w as f64);
    // Python's max(a, b): a unless b > a.
    let ratio = if rw > rh { rw } else { rh };
    let (mut h, mut w) = (height, width);
    if ratio > 1.0 {
        h = (height as f64 / ratio).floor() as usize;
        w = (width as f64 / ratio).floor() as usize;
    }
    (tokens(h, ph) * ph, tokens(w, pw) * pw)
}

fn prepare<'a>(
    config: &PixtralConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let image = if config.common.do_resize {
        let (h, w) = output_size(
            rgb.height,
            rgb.width,
            config.size.bound(),
            config.effective_patch(),
        );
        if h == 0 || w == 0 {
            return Err(ProcessorError::shape(
                "resized size",
                format!(
                    "sides of at least 1 pixel (each side is floored to fit size {:?} before it is \
                     rounded up to the patch)",
                    config.size.bound()
                ),
                format!("{h}x{w} (HxW) for an image of {}x{}", rgb.height, rgb.width),
            ));
        }
        check_side("resized image", h, w)?;
        resize_rgb(rgb, h, w, &config.common, threads)?
    } else {
        rgb
    };
    let (origin, out) = match config.crop_size.filter(|_| config.do_center_crop) {
        Some((ch, cw)) => (
            center_crop_origin(image.height, image.width, ch, cw),
            (ch, cw),
        ),
        None => ((0, 0), (image.height, image.width)),
    };
    Ok(Prepared { image, origin, out })
}

/// Pixtral on a batch (see the module docs).
pub fn images(
    config: &PixtralConfig,
    normalize: &Normalize,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let (h, w) = if config.do_pad {
        (
            prepared.iter().map(|p| p.out.0).max().unwrap_or(0),
            prepared.iter().map(|p| p.out.1).max().unwrap_or(0),
        )
    } else {
        let first = prepared[0].out;
        if let Some(p) = prepared.iter().find(|p| p.out != first) {
            return Err(ProcessorError::BatchShape {
                what: "processed images (do_pad is off)",
                expected: vec![3, first.0, first.1],
                actual: vec![3, p.out.0, p.out.1],
            });
        }
        first
    };
    let per_image = checked_len("pixel_values", &[3, h, w], 4)?;
    let len = checked_len("pixel_values", &[prepared.len(), 3, h, w], 4)?;
    let mut pixel_values = OutBuffer::new("pixel_values", len)?;
    let slices = pixel_values.slices(&vec![per_image; prepared.len()]);
    let jobs: Vec<(&Prepared<'_>, &mut [Out])> = prepared.iter().zip(slices).collect();
    let workers = parallel::writers(options.threads, jobs.len(), 4 * len);
    parallel::map(jobs, workers, |_, (p, out)| {
        write_padded(p, normalize, (h, w), out)
    })
    .into_iter()
    .collect::<Result<(), _>>()?;
    // SAFETY: one slice per image covers the buffer, and write_padded wrote all of it (every
    // image succeeded, or we returned above).
    let pixel_values = unsafe { pixel_values.finish() };
    let sizes: Vec<i64> = prepared
        .iter()
        .flat_map(|p| [p.out.0 as i64, p.out.1 as i64])
        .collect();
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![prepared.len(), 3, h, w],
                    data: TensorData::F32(pixel_values),
                },
            ),
            ("image_sizes", Tensor::i64(vec![prepared.len(), 2], sizes)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn sizes_as_transformers() {
        let p16 = (16, 16);
        // grace_hopper 600x512 fits 1024: rounded up to 608x512.
        assert_eq!(output_size(600, 512, (1024, 1024), p16), (608, 512));
        // 30x2000: ratio 1.953125 -> floor 15.36 = 15, 1024 -> 16x1024.
        assert_eq!(output_size(30, 2000, (1024, 1024), p16), (16, 1024));
        assert_eq!(output_size(1, 1, (1024, 1024), p16), (16, 16));
        // Floored to zero: refused later.
        assert_eq!(output_size(1, 2000, (1024, 1024), p16), (0, 1024));
        // Exactly at the bound and just above it.
        assert_eq!(output_size(1024, 1024, (1024, 1024), p16), (1024, 1024));
        assert_eq!(output_size(1025, 1000, (1024, 1024), p16), (1024, 1008));
        // Separate bounds; the rounding up may pass the bound (300 -> 304).
        assert_eq!(output_size(600, 512, (300, 500), p16), (304, 256));
        assert_eq!(output_size(600, 512, (1024, 1024), (14, 16)), (602, 512));
    }

    #[test]
    fn batch_is_padded_to_the_largest() {
        let big = vec![255u8; 40 * 20 * 3];
        let small = vec![255u8; 10 * 50 * 3];
        let inputs = [
            Input::Pixels {
                data: &big,
                width: 20,
                height: 40,
                channels: 3,
            },
            Input::Pixels {
                data: &small,
                width: 50,
                height: 10,
                channels: 3,
            },
        ];
        let p = Preprocessor::new(Family::Pixtral, &[]).unwrap();
        let out = p.images(&inputs, &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, [2, 3, 48, 64]);
        assert_eq!(
            out.get("image_sizes").unwrap().data,
            TensorData::I64(vec![48, 32, 16, 64])
        );
        let p =
            Preprocessor::new(Family::Pixtral, &[("do_pad".into(), Value::Bool(false))]).unwrap();
        let err = p.images(&inputs, &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "batch_shape");
        let tall = vec![0u8; 3000 * 3];
        let tall = Input::Pixels {
            data: &tall,
            width: 1,
            height: 3000,
            channels: 3,
        };
        let err = p
            .images(&[inputs[0], tall], &Options::default())
            .unwrap_err();
        assert_eq!((err.kind(), err.index()), ("image_shape", Some(1)));
    }

    #[test]
    fn replacement_as_pixtral_processor() {
        let owned: Vec<(String, u32)> = [("[IMG]", 10), ("[IMG_BREAK]", 12), ("[IMG_END]", 13)]
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        let ids = TokenIds(&owned);
        let config = PixtralConfig::pixtral();
        // 48 x 32 with patch 16: 3 rows of 2.
        let r = prompt_replacement(&config, &[48, 32], &ids).unwrap();
        assert_eq!(r.tokens, [10, 10, 12, 10, 10, 12, 10, 10, 13]);
        assert_eq!(r.embed.iter().filter(|&&e| e).count(), 6);
        assert_eq!(r.rows, 1);
        let one = prompt_replacement(&config, &[16, 16], &ids).unwrap();
        assert_eq!(one.tokens, [10, 13]);
        // spatial_merge_size 2: the patch is 32.
        let merged = PixtralConfig {
            spatial_merge_size: 2,
            ..PixtralConfig::pixtral()
        };
        let m = prompt_replacement(&merged, &[64, 96], &ids).unwrap();
        assert_eq!(m.tokens, [10, 10, 10, 12, 10, 10, 10, 13]);
        assert!(prompt_replacement(&config, &[8, 32], &ids).is_err());
        assert!(prompt_replacement(&config, &[48], &ids).is_err());
        assert!(prompt_replacement(&config, &[48, 32], &TokenIds(&[])).is_err());
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::Pixtral, &[(k.to_owned(), v)]).unwrap_err()
        };
        let map = |pairs: &[(&str, i64)]| {
            Value::Map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        };
        for bad in [
            map(&[("shortest_edge", 5)]),
            map(&[("longest_edge", 0)]),
            map(&[("max_height", 5), ("max_width", 5)]),
            Value::Int(5),
        ] {
            let err = build("size", bad);
            assert!(err.to_string().starts_with("config size:"), "{err}");
        }
        for bad in [
            Value::Int(0),
            map(&[("height", 16)]),
            map(&[("height", 16), ("width", 0)]),
            Value::Float(16.0),
        ] {
            assert!(build("patch_size", bad).to_string().contains("patch_size"));
        }
        assert!(build("spatial_merge_size", Value::Int(0))
            .to_string()
            .contains("spatial_merge_size"));
        assert!(build("do_center_crop", Value::Bool(true))
            .to_string()
            .contains("crop_size"));
    }
}
