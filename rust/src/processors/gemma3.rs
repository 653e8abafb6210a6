//! Gemma 3 (`Gemma3ImageProcessorPil`): every image, and each of its pan-and-scan crops, is
//! resized to `size` (896 × 896 in the published checkpoints) with BILINEAR, rescaled and
//! normalized (mean = std = 0.5).
//!
//! Pan-and-scan ([`pan_and_scan`], off by default) cuts an image whose aspect ratio reaches
//! `pan_and_scan_min_ratio_to_activate` into 2 ..= `pan_and_scan_max_num_crops` crops along its
//! long side, on the `u8` image **before** the resize; each crop is then resized on its own. The
//! outputs of one input are its whole image followed by its crops (left to right, or top to
//! bottom), input after input:
//!
//! `pixel_values` `(B + Σ num_crops, 3, H, W)` float32, `num_crops` `(B,)` int64.
//!
//! `image_seq_length` (`Gemma3Processor`'s, 256) is kept in the configuration for the token
//! count (`(1 + num_crops) · image_seq_length` image tokens per input); it changes no pixel.

use std::borrow::Cow;

use super::clip::Prepared;
use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::pending::{self, Pending, Tiles};
use super::sizes::SizeSpec;
use super::value::{
    as_bool, as_count, as_float, as_size, hf_keys, size_value, Common, Value, HALF,
};
use super::{
    check_side, prepare_all, resize_rgb, Input, Options, Outputs, ProcessorError, Rgb, Tensor,
};
use crate::image::Filter;
use crate::memory::fallible;

/// Gemma 3: `Gemma3ImageProcessor` (an int `size` is a square); the pan-and-scan keys and
/// `image_seq_length` (a `Gemma3Processor` setting); `crop_size`, `do_center_crop` and `do_pad`,
/// which its `_preprocess` ignores, are ignored.
pub const GEMMA3: Hf = Hf {
    image_classes: &["Gemma3ImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        hf_keys(
            config,
            &[
                "do_pan_and_scan",
                "pan_and_scan_min_crop_size",
                "pan_and_scan_max_num_crops",
                "pan_and_scan_min_ratio_to_activate",
                "image_seq_length",
            ],
            true,
        )
    },
    // Gemma3Processor's.
    processor_keys: &[("image_seq_length", None)],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The configuration of Gemma 3.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3Config {
    pub common: Common,
    pub size: SizeSpec,
    pub do_pan_and_scan: bool,
    pub pan_and_scan_min_crop_size: usize,
    pub pan_and_scan_max_num_crops: usize,
    pub pan_and_scan_min_ratio_to_activate: f64,
    /// Ours: `Gemma3Processor`'s `image_seq_length` (image tokens per image or crop).
    pub image_seq_length: usize,
}

const MAX_SEQ: usize = 1 << 20;

/// Any integer ≥ 1 (transformers bounds neither pan-and-scan integer; a larger minimum crop or
/// maximum count only means fewer crops, or no cap).
fn as_positive(field: &'static str, value: &Value) -> Result<usize, ProcessorError> {
    match value {
        Value::Int(v) if *v >= 1 => usize::try_from(*v)
            .map_err(|_| ProcessorError::config(field, "a positive integer", value)),
        _ => Err(ProcessorError::config(field, "a positive integer", value)),
    }
}

impl Gemma3Config {
    /// The published checkpoints' `preprocessor_config.json` (896 × 896, BILINEAR, mean/std 0.5)
    /// with `Gemma3Processor`'s pan-and-scan defaults (off; 256, 4, 1.2) and its
    /// `image_seq_length` 256. (The class's own `size` is 224 × 224.)
    pub fn gemma3() -> Self {
        let mut common = Common::new(HALF, HALF);
        common.resample = Filter::Bilinear;
        Gemma3Config {
            common,
            size: SizeSpec::Exact {
                height: 896,
                width: 896,
            },
            do_pan_and_scan: false,
            pan_and_scan_min_crop_size: 256,
            pan_and_scan_max_num_crops: 4,
            pan_and_scan_min_ratio_to_activate: 1.2,
            image_seq_length: 256,
        }
    }
}

impl FamilyConfig for Gemma3Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.size = as_size("size", value)?,
            "do_pan_and_scan" => self.do_pan_and_scan = as_bool("do_pan_and_scan", value)?,
            "pan_and_scan_min_crop_size" => {
                self.pan_and_scan_min_crop_size = as_positive("pan_and_scan_min_crop_size", value)?
            }
            "pan_and_scan_max_num_crops" => {
                self.pan_and_scan_max_num_crops = as_positive("pan_and_scan_max_num_crops", value)?
            }
            "pan_and_scan_min_ratio_to_activate" => {
                let field = "pan_and_scan_min_ratio_to_activate";
                let ratio = as_float(field, value)?;
                if !ratio.is_finite() {
                    return Err(ProcessorError::config(field, "a finite number", value));
                }
                self.pan_and_scan_min_ratio_to_activate = ratio;
            }
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
            ("do_pan_and_scan", Value::Bool(self.do_pan_and_scan)),
            (
                "pan_and_scan_min_crop_size",
                Value::Int(self.pan_and_scan_min_crop_size as i64),
            ),
            (
                "pan_and_scan_max_num_crops",
                Value::Int(self.pan_and_scan_max_num_crops as i64),
            ),
            (
                "pan_and_scan_min_ratio_to_activate",
                Value::Float(self.pan_and_scan_min_ratio_to_activate),
            ),
            ("image_seq_length", Value::Int(self.image_seq_length as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        Ok(())
    }

    // Gemma 3 on a batch (see the module docs).
    pending::planned_images!(plan);

    /// `Gemma3Processor`: `(1 + num_crops) · image_seq_length` image tokens per image.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let seq = self.image_seq_length as i64;
        let crops = i64_values(outputs, "num_crops")?;
        Some(crops.iter().map(|&c| (1 + c) * seq).collect())
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

/// The begin-of-image token: the chat template's anchor, once per image (`boi_token`).
pub const BOI: &str = "<start_of_image>";
/// The end-of-image token (`eoi_token`).
pub const EOI: &str = "<end_of_image>";
/// The token whose positions take the embeddings (`image_token`, `config.json`'s
/// `image_token_index`).
pub const SOFT: &str = "<image_soft_token>";
/// The text `Gemma3Processor.full_image_sequence` puts on both sides of an image.
pub const NEWLINES: &str = "\n\n";
/// The newline runs it merges with (see [`REPLACEMENT`]'s `joins`).
pub const NEWLINE: &str = "\n";
pub const NEWLINES_3: &str = "\n\n\n";
pub const NEWLINES_4: &str = "\n\n\n\n";
/// The pan-and-scan text, as the tokenizer meets it between special tokens: before the
/// original image, between it and the first crop, between two crops.
pub const PAN_INTRO: &str = "Here is the original image \n\n";
pub const PAN_CROPS: &str = "\n\n and here are some crops to help you see better \n\n";
pub const PAN_BETWEEN: &str = "\n\n \n\n";

/// `Gemma3Processor`'s tokens and text pieces (see [`prompt_replacement`]).
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["num_crops"],
    anchor: BOI,
    embed: SOFT,
    tokens: &[BOI, EOI, SOFT, NEWLINES, PAN_INTRO, PAN_CROPS, PAN_BETWEEN],
    // google/gemma-3-*-it: Gemma3Config boi_token_index 255999, eoi_token_index 256000,
    // image_token_index 262144; "\n\n" is 108 in the Gemma 3 vocabulary ("\n" 107). The
    // pan-and-scan pieces have no default (their ids come from the model's tokenizer.json).
    defaults: &[
        (BOI, 255_999),
        (EOI, 256_000),
        (SOFT, 262_144),
        (NEWLINES, 108),
        (NEWLINE, 107),
        (NEWLINES_3, 109),
        (NEWLINES_4, 110),
    ],
    // vLLM's Gemma3ForConditionalGeneration: pixel_values flat by num_patches = num_crops + 1.
    flat: &["pixel_values"],
    sizes: "num_patches",
    per_sample: false,
    // Gemma3Processor tokenizes the prompt after substituting `full_image_sequence`, so its
    // "\n\n" merges with newlines next to the anchor (the chat template's
    // "<start_of_turn>user\n<start_of_image>" gives "\n\n\n", one token), and two adjacent
    // images' "\n\n" + "\n\n" give "\n\n\n\n". vLLM's Gemma3MultiModalProcessor
    // (`_apply_token_matches`) merges exactly these runs of one to four newlines, by their
    // vocabulary entries; a model's tokenizer.json may give longer runs.
    joins: &[NEWLINE, NEWLINES, NEWLINES_3, NEWLINES_4],
};

/// `Gemma3Processor.replace_image_token`: an image without crops becomes
/// `full_image_sequence` = `"\n\n" <start_of_image> <image_soft_token>×image_seq_length
/// <end_of_image> "\n\n"`; an image with `n` pan-and-scan crops becomes
/// `"Here is the original image " + full + " and here are some crops to help you see better "
/// + " ".join([full] * n)`. The tokenizer splits the special tokens out first, so the text
/// between two of them is tokenized on its own: the pieces [`PAN_INTRO`], [`PAN_CROPS`] and
/// [`PAN_BETWEEN`] (their ids come from the model's tokenizer), and the closing
/// [`NEWLINES`]. Only the `<image_soft_token>` positions take embeddings (vLLM:
/// `PromptUpdateDetails.select_token_id(repl, image_token_id)`); the image owns `1 + n` rows of
/// `pixel_values` (vLLM's `num_patches`).
pub fn prompt_replacement(
    config: &Gemma3Config,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let crops = match grid {
        &[n] if n >= 0 && n <= MAX_CROPS as i64 => n as usize,
        _ => {
            return Err(ProcessorError::Config {
                field: "num_crops",
                expected: format!("one crop count between 0 and {MAX_CROPS}"),
                actual: format!("{grid:?}"),
            })
        }
    };
    let boi = ids.get(BOI)?;
    let eoi = ids.get(EOI)?;
    let soft = ids.get(SOFT)?;
    let newlines = ids.text(NEWLINES)?;
    let seq = config.image_seq_length;
    let image = |tokens: &mut Vec<u32>| {
        tokens.push(boi);
        tokens.extend(std::iter::repeat_n(soft, seq));
        tokens.push(eoi);
    };
    let mut tokens = Vec::new();
    if crops == 0 {
        tokens.extend_from_slice(&newlines);
        image(&mut tokens);
    } else {
        let (intro, middle, between) = (
            ids.text(PAN_INTRO)?,
            ids.text(PAN_CROPS)?,
            ids.text(PAN_BETWEEN)?,
        );
        tokens.extend_from_slice(&intro);
        image(&mut tokens);
        tokens.extend_from_slice(&middle);
        image(&mut tokens);
        for _ in 1..crops {
            tokens.extend_from_slice(&between);
            image(&mut tokens);
        }
    }
    tokens.extend_from_slice(&newlines);
    let embed = tokens.iter().map(|&t| t == soft).collect();
    Ok(Replacement {
        tokens,
        embed,
        rows: 1 + crops,
    })
}

/// Ours: more crops than any pan-and-scan setting a model ships with (transformers bounds
/// `pan_and_scan_max_num_crops` by nothing; the prompt grows with it).
const MAX_CROPS: usize = 1 << 16;

/// One pan-and-scan crop: `(top, left, height, width)`, already clipped to the image as numpy
/// slicing clips it (so the last crop may be narrower, or even empty).
pub type Crop = (usize, usize, usize, usize);

/// `Gemma3ImageProcessorPil.pan_and_scan` on an image of `height × width` (both ≥ 1): the crop
/// windows in transformers' order (`itertools.product(rows, columns)`), or none. Python's
/// arithmetic: `/` of ints is an `f64` division, `int(math.floor(..))`/`int(math.ceil(..))`.
pub fn pan_and_scan(
    height: usize,
    width: usize,
    min_crop_size: usize,
    max_num_crops: usize,
    min_ratio_to_activate: f64,
) -> Vec<Crop> {
    let (h, w, min_crop) = (height as f64, width as f64, min_crop_size as f64);
    let max_crops = i64::try_from(max_num_crops).unwrap_or(i64::MAX);
    let (num_w, num_h) = if width >= height {
        if w / h < min_ratio_to_activate {
            return Vec::new();
        }
        let n = ((w / h + 0.5).floor() as i64).min((w / min_crop).floor() as i64);
        (n.max(2).min(max_crops), 1)
    } else {
        if h / w < min_ratio_to_activate {
            return Vec::new();
        }
        let n = ((h / w + 0.5).floor() as i64).min((h / min_crop).floor() as i64);
        (1, n.max(2).min(max_crops))
    };
    // num_w, num_h >= 1: max_num_crops >= 1 (checked by the configuration).
    let crop_w = (w / num_w as f64).ceil() as usize;
    let crop_h = (h / num_h as f64).ceil() as usize;
    if crop_w.min(crop_h) < min_crop_size {
        return Vec::new();
    }
    // numpy's image[:, a:a + n, b:b + m]: both bounds clipped to the image.
    let clip = |pos: usize, len: usize, side: usize| {
        let start = pos.min(side);
        (start, pos.saturating_add(len).min(side) - start)
    };
    let mut crops = Vec::with_capacity((num_w * num_h) as usize);
    for i in 0..num_h as usize {
        let (top, ch) = clip(crop_h.saturating_mul(i), crop_h, height);
        for j in 0..num_w as usize {
            let (left, cw) = clip(crop_w.saturating_mul(j), crop_w, width);
            crops.push((top, left, ch, cw));
        }
    }
    crops
}

/// A copy of `rgb`'s window `crop`.
fn cut(rgb: &Rgb<'_>, (top, left, ch, cw): Crop) -> Result<Rgb<'static>, ProcessorError> {
    let mut data =
        fallible::with_capacity(ch * cw * 3).map_err(ProcessorError::oom("pan-and-scan crop"))?;
    for row in rgb.data.chunks_exact(rgb.width * 3).skip(top).take(ch) {
        data.extend_from_slice(&row[left * 3..(left + cw) * 3]);
    }
    Ok(Rgb {
        data: Cow::Owned(data),
        width: cw,
        height: ch,
    })
}

/// Resize as `PilBackend.resize` does. An empty crop (possible with a small
/// `pan_and_scan_min_crop_size`) becomes black: Pillow's resize of a 0-pixel-wide image has no
/// taps, so every value is its rounding constant shifted away, 0.
fn resize<'a>(
    config: &Gemma3Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    if !config.common.do_resize {
        if rgb.width == 0 || rgb.height == 0 {
            return Err(ProcessorError::shape(
                "pan-and-scan crop",
                "a non-empty crop (do_resize is off)",
                format!("{}x{} (HxW)", rgb.height, rgb.width),
            ));
        }
        return Ok(rgb);
    }
    let (h, w) = config.size.output(rgb.height, rgb.width);
    if rgb.width == 0 || rgb.height == 0 {
        check_side("resized image", h, w)?;
        let len = super::check_image("resized image", h, w)?;
        return Ok(Rgb {
            data: Cow::Owned(fallible::zeros(len).map_err(ProcessorError::oom("resized image"))?),
            width: w,
            height: h,
        });
    }
    check_side("resized image", h, w)?;
    resize_rgb(rgb, h, w, &config.common, threads)
}

/// One input: its image and its crops, resized.
fn prepare<'a>(
    config: &Gemma3Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Vec<Prepared<'a>>, ProcessorError> {
    let crops: Vec<Rgb<'static>> = if config.do_pan_and_scan {
        pan_and_scan(
            rgb.height,
            rgb.width,
            config.pan_and_scan_min_crop_size,
            config.pan_and_scan_max_num_crops,
            config.pan_and_scan_min_ratio_to_activate,
        )
        .into_iter()
        .map(|crop| cut(&rgb, crop))
        .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let mut out = Vec::with_capacity(1 + crops.len());
    for image in std::iter::once(rgb).chain(crops) {
        let image = resize(config, image, threads)?;
        let size = (image.height, image.width);
        out.push(Prepared {
            image,
            origin: (0, 0),
            out: size,
        });
    }
    Ok(out)
}

/// Every image and crop decoded and resized: `pixel_values` planned, and `num_crops`.
fn plan<'a>(
    config: &Gemma3Config,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    let per_input = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let num_crops: Vec<i64> = per_input.iter().map(|p| p.len() as i64 - 1).collect();
    let prepared: Vec<Prepared<'_>> = per_input.into_iter().flatten().collect();
    let Some(first) = prepared.first().map(|p| p.out) else {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    };
    if let Some(p) = prepared.iter().find(|p| p.out != first) {
        return Err(ProcessorError::BatchShape {
            what: "processed images and crops",
            expected: vec![3, first.0, first.1],
            actual: vec![3, p.out.0, p.out.1],
        });
    }
    let (h, w) = first;
    let shape = vec![prepared.len(), 3, h, w];
    // Every image and crop is h × w (checked above), one slot each.
    let (mut images, mut slots) = (Vec::new(), Vec::new());
    for p in prepared {
        slots.push(Some((images.len(), p.origin)));
        images.push(p.image);
    }
    let tiles = Tiles {
        images: images.into(),
        slots,
        size: (h, w),
        normalize: normalize.clone(),
        threads: options.threads,
    };
    let pending = tiles.pending("pixel_values", shape)?;
    let batch = num_crops.len();
    let outputs = Outputs {
        tensors: vec![("num_crops", Tensor::i64(vec![batch], num_crops))],
    };
    Ok((pending, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::TensorData;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn crop_grids_as_transformers() {
        // Landscape 2:1 with the processor's defaults: two 200-wide crops of 400x200.
        assert_eq!(
            pan_and_scan(200, 400, 256, 4, 1.2),
            Vec::<Crop>::new(), // 200 < 256: too small
        );
        assert_eq!(
            pan_and_scan(300, 700, 256, 4, 1.2),
            vec![(0, 0, 300, 350), (0, 350, 300, 350)]
        );
        // Portrait, ratio 3.33 -> 3 crops of ceil(1000 / 3) = 334 rows, the last one clipped.
        assert_eq!(
            pan_and_scan(1000, 300, 256, 4, 1.2),
            vec![(0, 0, 334, 300), (334, 0, 334, 300), (668, 0, 332, 300)]
        );
        // Below the ratio: none; max crops caps the count.
        assert!(pan_and_scan(500, 590, 256, 4, 1.2).is_empty());
        assert_eq!(pan_and_scan(300, 3000, 256, 4, 1.2).len(), 4);
        assert_eq!(
            pan_and_scan(300, 3000, 256, 1, 1.2),
            vec![(0, 0, 300, 3000)]
        );
        // Neither integer is bounded: a huge minimum never crops, a huge maximum never caps.
        assert!(pan_and_scan(300, 3000, usize::MAX, 4, 1.2).is_empty());
        assert_eq!(pan_and_scan(300, 3000, 256, usize::MAX, 1.2).len(), 10);
        // A small minimum crop: the last window starts past the image and is empty.
        assert_eq!(
            pan_and_scan(2, 9, 2, 4, 1.2),
            vec![(0, 0, 2, 3), (0, 3, 2, 3), (0, 6, 2, 3), (0, 9, 2, 0)]
        );
    }

    #[test]
    fn crops_follow_their_image() {
        let wide = vec![255u8; 300 * 700 * 3];
        let square = vec![0u8; 50 * 50 * 3];
        let inputs = [
            Input::Pixels {
                data: &wide,
                width: 700,
                height: 300,
                channels: 3,
            },
            Input::Pixels {
                data: &square,
                width: 50,
                height: 50,
                channels: 3,
            },
        ];
        let entries = [
            ("do_pan_and_scan".to_owned(), Value::Bool(true)),
            (
                "size".to_owned(),
                Value::Map(vec![("height".into(), 4), ("width".into(), 4)]),
            ),
        ];
        let p = Preprocessor::new(Family::Gemma3, &entries).unwrap();
        let out = p.images(&inputs, &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, [4, 3, 4, 4]);
        assert_eq!(
            out.get("num_crops").unwrap().data,
            TensorData::I64(vec![2, 0])
        );
        let TensorData::F32(values) = &out.get("pixel_values").unwrap().data else {
            panic!("f32 expected");
        };
        // White image and crops (1.0), then the black square (-1.0).
        assert!(values[..3 * 48].iter().all(|&v| v == 1.0));
        assert!(values[3 * 48..].iter().all(|&v| v == -1.0));
        let off = Preprocessor::new(
            Family::Gemma3,
            &[
                entries[0].clone(),
                ("do_resize".to_owned(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let err = off.images(&inputs, &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "batch_shape");
    }

    #[test]
    fn replacement_as_gemma3_processor() {
        let mut owned: Vec<(String, u32)> = [(BOI, 255_999), (EOI, 256_000), (SOFT, 262_144)]
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        owned.push((NEWLINES.to_owned(), 108));
        let config = Gemma3Config::gemma3();
        let plain = prompt_replacement(&config, &[0], &TokenIds(&owned)).unwrap();
        assert_eq!(plain.tokens.len(), 256 + 4);
        assert_eq!(&plain.tokens[..2], &[108, 255_999]);
        assert_eq!(&plain.tokens[258..], &[256_000, 108]);
        assert_eq!(plain.embed.iter().filter(|&&e| e).count(), 256);
        assert_eq!(plain.rows, 1);
        // Crops need the sentence pieces: a configuration error naming the first.
        let err = prompt_replacement(&config, &[2], &TokenIds(&owned)).unwrap_err();
        assert!(
            err.to_string().contains("Here is the original image"),
            "{err}"
        );
        // Pieces of several tokens keep their order.
        for (piece, ids) in [
            (PAN_INTRO, [1, 2]),
            (PAN_CROPS, [3, 4]),
            (PAN_BETWEEN, [5, 6]),
        ] {
            owned.extend(ids.iter().map(|&i| (piece.to_owned(), i)));
        }
        let three = prompt_replacement(&config, &[3], &TokenIds(&owned)).unwrap();
        let block = 258;
        assert_eq!(
            three.tokens.len(),
            2 + block + 2 + block + 2 * (2 + block) + 1
        );
        assert_eq!(&three.tokens[..3], &[1, 2, 255_999]);
        assert_eq!(&three.tokens[2 + block..2 + block + 3], &[3, 4, 255_999]);
        assert_eq!(three.tokens[4 + 2 * block], 5);
        assert_eq!(three.tokens.last(), Some(&108));
        assert_eq!(three.embed.iter().filter(|&&e| e).count(), 4 * 256);
        assert_eq!(three.rows, 4);
        assert!(prompt_replacement(&config, &[-1], &TokenIds(&owned)).is_err());
        assert!(prompt_replacement(&config, &[1, 1], &TokenIds(&owned)).is_err());
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::Gemma3, &[(k.to_owned(), v)]).unwrap_err()
        };
        for (key, bad) in [
            ("pan_and_scan_min_crop_size", Value::Int(0)),
            ("pan_and_scan_min_crop_size", Value::Float(256.0)),
            ("pan_and_scan_max_num_crops", Value::Int(0)),
            ("pan_and_scan_max_num_crops", Value::Int(-1)),
            ("pan_and_scan_min_ratio_to_activate", Value::Float(f64::NAN)),
            (
                "pan_and_scan_min_ratio_to_activate",
                Value::Str("1.2".into()),
            ),
            ("do_pan_and_scan", Value::Int(1)),
            ("image_seq_length", Value::Int(0)),
            ("size", Value::Map(vec![("height".into(), 896)])),
        ] {
            let err = build(key, bad);
            assert!(
                err.to_string().starts_with(&format!("config {key}:")),
                "{err}"
            );
        }
        assert_eq!(build("crop_size", Value::Int(3)).kind(), "config");
    }
}
