//! Idefics3 and SmolVLM (`Idefics3ImageProcessorPil`, `SmolVLMImageProcessorPil`: the same
//! pixels, the same class defaults). Every resize uses `resample` (LANCZOS by default) on the
//! `u8` image, chained:
//!
//! 1. with `do_resize`, the longest edge to `size["longest_edge"]` (up or down, the other side
//!    `int()`-scaled and rounded up to even, at least 1), then below 4096 ([`first_size`]);
//! 2. with `do_image_splitting`, to multiples of `max_image_size["longest_edge"]` = `m`
//!    ([`encoder_size`]); an image larger than `m × m` is cut into its `rows × cols` tiles of
//!    `m × m` (row-major), followed by the whole image resized to `m × m` (the global image);
//!    an `m × m` image is its own single tile (rows = cols = 0). Without splitting, the image is
//!    resized to `m × m` (rows = cols = 0).
//!
//! Then rescale and normalize. A flat list of images is one sample for transformers
//! (`make_nested_list_of_images`), and every tile is `m × m`, so `do_pad` (pad the samples to
//! the largest tile count and size) changes no value: it only adds `pixel_attention_mask`.
//!
//! `pixel_values` `(1, Σ tiles, 3, m, m)` float32; with `do_pad`, `pixel_attention_mask`
//! `(1, Σ tiles, m, m)` int64 (all 1); `rows`, `cols` `(1, B)` int64.
//!
//! `image_seq_len` (the processors' `<image>` tokens per tile, 169) is kept for the token
//! count; it changes no pixel.

use std::borrow::Cow;

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::pending::{self, Filled, Plan, Tiles};
use super::value::{as_bool, as_count, hf_keys, BadSize, Common, Raw, RawMap, Value};
use super::{
    check_side, prepare_all, resize_rgb, Input, Options, Outputs, ProcessorError, Rgb, Tensor,
};
use crate::image::Filter;

/// `MAX_IMAGE_SIZE` of transformers' Idefics3/SmolVLM modules.
pub const MAX_IMAGE_SIZE: usize = 4096;
const MAX_SEQ: usize = 1 << 20;

/// Idefics3 and SmolVLM: `size` and `max_image_size` are `{"longest_edge": n}` dicts;
/// `do_image_splitting`, `do_pad` and `image_seq_len` (an `Idefics3Processor`/
/// `SmolVLMProcessor` setting).
fn hf_idefics3(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    hf_keys(
        config,
        &[
            "max_image_size",
            "do_image_splitting",
            "do_pad",
            "image_seq_len",
        ],
        false,
    )
}

/// Idefics3: `Idefics3ImageProcessor`.
pub const IDEFICS3: Hf = Hf {
    image_classes: &["Idefics3ImageProcessor"],
    video_classes: &[],
    normalise: hf_idefics3,
    // Idefics3Processor's.
    processor_keys: &[("image_seq_len", None)],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// SmolVLM: `SmolVLMImageProcessor`.
pub const SMOLVLM: Hf = Hf {
    image_classes: &["SmolVLMImageProcessor"],
    video_classes: &[],
    normalise: hf_idefics3,
    // SmolVLMProcessor's.
    processor_keys: &[("image_seq_len", None)],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The configuration of Idefics3 and SmolVLM.
#[derive(Clone, Debug, PartialEq)]
pub struct Idefics3Config {
    pub common: Common,
    /// `size["longest_edge"]`.
    pub longest_edge: usize,
    /// `max_image_size["longest_edge"]`: the tile side.
    pub max_image_size: usize,
    pub do_image_splitting: bool,
    pub do_pad: bool,
    /// Ours: the processor's `image_seq_len` (`<image>` tokens per tile).
    pub image_seq_len: usize,
    /// Ours: whose tokenizer writes the prompt (the pixels are the same).
    pub variant: Variant,
}

/// Idefics3 or SmolVLM: the same pixels and replacement text, but Idefics3's Llama 3
/// tokenizer spells `<row_r_col_c>` and `<global-img>` in several text tokens where SmolVLM's
/// has one added token each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    Idefics3,
    SmolVlm,
}

fn longest_edge(field: &'static str, value: &Value, max: usize) -> Result<usize, ProcessorError> {
    match value {
        Value::Map(entries) if entries.len() == 1 && entries[0].0 == "longest_edge" => {
            let v = entries[0].1;
            if v >= 1 && v as u64 <= max as u64 {
                Ok(v as usize)
            } else {
                Err(ProcessorError::config(
                    field,
                    format!("a longest_edge between 1 and {max}"),
                    value,
                ))
            }
        }
        _ => Err(ProcessorError::config(
            field,
            "a dict with the one key longest_edge",
            value,
        )),
    }
}

impl Idefics3Config {
    /// The class defaults of `Idefics3ImageProcessorPil`: longest edge 4 · 364 = 1456, tiles
    /// of 364, LANCZOS, mean/std 0.5, splitting and padding on; `image_seq_len` 169 (the
    /// processor's default).
    pub fn idefics3() -> Self {
        let mut common = Common::new([0.5; 3], [0.5; 3]);
        common.resample = Filter::Lanczos;
        Idefics3Config {
            common,
            longest_edge: 4 * 364,
            max_image_size: 364,
            do_image_splitting: true,
            do_pad: true,
            image_seq_len: 169,
            variant: Variant::Idefics3,
        }
    }

    /// `SmolVLMImageProcessorPil`'s class defaults: the same as Idefics3's (the published
    /// SmolVLM configs set other sizes, e.g. 2048 and 512).
    pub fn smolvlm() -> Self {
        Idefics3Config {
            variant: Variant::SmolVlm,
            ..Self::idefics3()
        }
    }
}

impl FamilyConfig for Idefics3Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            // The first resize clamps to MAX_IMAGE_SIZE itself; tiles are ours to bound.
            "size" => self.longest_edge = longest_edge("size", value, super::MAX_SIDE)?,
            "max_image_size" => {
                self.max_image_size = longest_edge("max_image_size", value, MAX_IMAGE_SIZE)?
            }
            "do_image_splitting" => self.do_image_splitting = as_bool("do_image_splitting", value)?,
            "do_pad" => self.do_pad = as_bool("do_pad", value)?,
            "image_seq_len" => self.image_seq_len = as_count("image_seq_len", value, MAX_SEQ)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let edge = |n: usize| Value::Map(vec![("longest_edge".to_owned(), n as i64)]);
        vec![
            ("size", edge(self.longest_edge)),
            ("max_image_size", edge(self.max_image_size)),
            ("do_image_splitting", Value::Bool(self.do_image_splitting)),
            ("do_pad", Value::Bool(self.do_pad)),
            ("image_seq_len", Value::Int(self.image_seq_len as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        Ok(())
    }

    // Idefics3 / SmolVLM on a batch (see the module docs).
    pending::planned_images!(plan);

    /// `get_image_prompt_string`: `(rows · cols + 1) · image_seq_len` `<image>` tokens per
    /// image (`rows == cols == 0`: not split, one global image).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let seq = self.image_seq_len as i64;
        let rows = i64_values(outputs, "rows")?;
        let cols = i64_values(outputs, "cols")?;
        if rows.len() != cols.len() {
            return None;
        }
        Some(
            rows.iter()
                .zip(cols)
                .map(|(&r, &c)| (r * c + 1) * seq)
                .collect(),
        )
    }

    fn replacement_spec(&self) -> Option<ReplacementSpec> {
        Some(match self.variant {
            Variant::Idefics3 => IDEFICS3_REPLACEMENT,
            Variant::SmolVlm => SMOLVLM_REPLACEMENT,
        })
    }

    fn prompt_replacement(
        &self,
        grid: &[i64],
        ids: &TokenIds<'_>,
    ) -> Option<Result<Replacement, ProcessorError>> {
        Some(prompt_replacement(self, grid, ids))
    }
}

/// The row and column numbers Idefics3's `<row_r_col_c>` can carry here: Llama 3 spells each
/// number of up to three digits as one token; these have default ids (16 × 364 > 4096, so any
/// image of `MAX_IMAGE_SIZE` with the published tile side fits).
const NUMBERS: [&str; 16] = [
    "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
];

/// SmolVLM's added `<row_r_col_c>` tokens, row-major, `r, c` in 1..=6.
const SMOLVLM_MARKERS: [&str; 36] = [
    "<row_1_col_1>",
    "<row_1_col_2>",
    "<row_1_col_3>",
    "<row_1_col_4>",
    "<row_1_col_5>",
    "<row_1_col_6>",
    "<row_2_col_1>",
    "<row_2_col_2>",
    "<row_2_col_3>",
    "<row_2_col_4>",
    "<row_2_col_5>",
    "<row_2_col_6>",
    "<row_3_col_1>",
    "<row_3_col_2>",
    "<row_3_col_3>",
    "<row_3_col_4>",
    "<row_3_col_5>",
    "<row_3_col_6>",
    "<row_4_col_1>",
    "<row_4_col_2>",
    "<row_4_col_3>",
    "<row_4_col_4>",
    "<row_4_col_5>",
    "<row_4_col_6>",
    "<row_5_col_1>",
    "<row_5_col_2>",
    "<row_5_col_3>",
    "<row_5_col_4>",
    "<row_5_col_5>",
    "<row_5_col_6>",
    "<row_6_col_1>",
    "<row_6_col_2>",
    "<row_6_col_3>",
    "<row_6_col_4>",
    "<row_6_col_5>",
    "<row_6_col_6>",
];

/// `Idefics3Processor`'s tokens for `HuggingFaceM4/Idefics3-8B-Llama3`: its tokenizer adds only
/// `<fake_token_around_image>`, `<image>` and `<end_of_utterance>` to Llama 3's 128256, so the
/// text `<row_r_col_c>` is the Llama 3 tokens `<` `row` `_` r `_col` `_` c `>`, `<global-img>`
/// is `<` `global` `-img` `>`, and the newlines are `\n` and (after the last tile row, where the
/// row's `\n` meets the global image's) `\n\n`. The chat template writes `<image>` once per
/// image; the `<image>` positions take the embeddings.
pub const IDEFICS3_REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["rows", "cols"],
    anchor: "<image>",
    embed: "<image>",
    tokens: &[
        "<fake_token_around_image>",
        "<image>",
        "<",
        ">",
        "row",
        "_",
        "_col",
        "global",
        "-img",
        "\n",
        "\n\n",
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9",
        "10",
        "11",
        "12",
        "13",
        "14",
        "15",
        "16",
    ],
    // Idefics3Config's image_token_id 128257 (convert_idefics3_weights_to_hf.py: vocab_size
    // + additional_vocab_size 3, less 2); the text pieces are Meta Llama 3's tokenizer ranks
    // (the llama-models package's llama3/tokenizer.model, with its pre-tokenizer pattern).
    defaults: &[
        ("<fake_token_around_image>", 128256),
        ("<image>", 128257),
        ("<", 27),
        (">", 29),
        ("row", 654),
        ("_", 62),
        ("_col", 10422),
        ("global", 9951),
        ("-img", 21743),
        ("\n", 198),
        ("\n\n", 271),
        ("1", 16),
        ("2", 17),
        ("3", 18),
        ("4", 19),
        ("5", 20),
        ("6", 21),
        ("7", 22),
        ("8", 23),
        ("9", 24),
        ("10", 605),
        ("11", 806),
        ("12", 717),
        ("13", 1032),
        ("14", 975),
        ("15", 868),
        ("16", 845),
    ],
    // vLLM's Idefics3ForConditionalGeneration: pixel_values and pixel_attention_mask flat by
    // num_patches (its processor squeezes the sample dimension).
    flat: &["pixel_values", "pixel_attention_mask"],
    sizes: "num_patches",
    per_sample: true,
    joins: &[],
};

/// `SmolVLMProcessor`'s tokens for the published SmolVLM / SmolVLM2 checkpoints (SmolLM2
/// tokenizers): `<global-img>` 49152, `<row_1_col_1>` … `<row_6_col_6>` 49153 … 49188
/// row-major, `<fake_token_around_image>` 49189, `<image>` 49190 (`image_token_id`), `"\n"` 198
/// and `"\n\n"` 1116 (the SmolLM2 tokenizer's own token for a blank line standing between two
/// added tokens, as it does after the last tile row; followed by text it would be 198 198).
/// SmolVLM-256M/500M-Instruct and every SmolVLM2; not SmolVLM-Instruct (v1, 2.2B), whose
/// `<global-img>` and row markers are plain text — read its ids with `from_pretrained`.
pub const SMOLVLM_REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["rows", "cols"],
    anchor: "<image>",
    embed: "<image>",
    tokens: &[
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
        "\n",
        "\n\n",
        "<row_1_col_1>",
        "<row_1_col_2>",
        "<row_1_col_3>",
        "<row_1_col_4>",
        "<row_1_col_5>",
        "<row_1_col_6>",
        "<row_2_col_1>",
        "<row_2_col_2>",
        "<row_2_col_3>",
        "<row_2_col_4>",
        "<row_2_col_5>",
        "<row_2_col_6>",
        "<row_3_col_1>",
        "<row_3_col_2>",
        "<row_3_col_3>",
        "<row_3_col_4>",
        "<row_3_col_5>",
        "<row_3_col_6>",
        "<row_4_col_1>",
        "<row_4_col_2>",
        "<row_4_col_3>",
        "<row_4_col_4>",
        "<row_4_col_5>",
        "<row_4_col_6>",
        "<row_5_col_1>",
        "<row_5_col_2>",
        "<row_5_col_3>",
        "<row_5_col_4>",
        "<row_5_col_5>",
        "<row_5_col_6>",
        "<row_6_col_1>",
        "<row_6_col_2>",
        "<row_6_col_3>",
        "<row_6_col_4>",
        "<row_6_col_5>",
        "<row_6_col_6>",
    ],
    defaults: &[
        ("<fake_token_around_image>", 49189),
        ("<image>", 49190),
        ("<global-img>", 49152),
        ("\n", 198),
        ("\n\n", 1116),
        ("<row_1_col_1>", 49153),
        ("<row_1_col_2>", 49154),
        ("<row_1_col_3>", 49155),
        ("<row_1_col_4>", 49156),
        ("<row_1_col_5>", 49157),
        ("<row_1_col_6>", 49158),
        ("<row_2_col_1>", 49159),
        ("<row_2_col_2>", 49160),
        ("<row_2_col_3>", 49161),
        ("<row_2_col_4>", 49162),
        ("<row_2_col_5>", 49163),
        ("<row_2_col_6>", 49164),
        ("<row_3_col_1>", 49165),
        ("<row_3_col_2>", 49166),
        ("<row_3_col_3>", 49167),
        ("<row_3_col_4>", 49168),
        ("<row_3_col_5>", 49169),
        ("<row_3_col_6>", 49170),
        ("<row_4_col_1>", 49171),
        ("<row_4_col_2>", 49172),
        ("<row_4_col_3>", 49173),
        ("<row_4_col_4>", 49174),
        ("<row_4_col_5>", 49175),
        ("<row_4_col_6>", 49176),
        ("<row_5_col_1>", 49177),
        ("<row_5_col_2>", 49178),
        ("<row_5_col_3>", 49179),
        ("<row_5_col_4>", 49180),
        ("<row_5_col_5>", 49181),
        ("<row_5_col_6>", 49182),
        ("<row_6_col_1>", 49183),
        ("<row_6_col_2>", 49184),
        ("<row_6_col_3>", 49185),
        ("<row_6_col_4>", 49186),
        ("<row_6_col_5>", 49187),
        ("<row_6_col_6>", 49188),
    ],
    // vLLM's SmolVLMForConditionalGeneration (Idefics3's processor): as Idefics3.
    flat: &["pixel_values", "pixel_attention_mask"],
    sizes: "num_patches",
    per_sample: true,
    joins: &[],
};

/// `get_image_prompt_string` (SmolVLM) / `Idefics3Processor.replace_image_token`, tokenized.
/// Not split (`rows == cols == 0`): `<fake_token_around_image>`, `<global-img>`, `<image>` ×
/// `image_seq_len`, `<fake_token_around_image>` (one row of `pixel_values`). Split: per tile
/// row, per tile `<fake_token_around_image>`, `<row_r_col_c>`, `<image>` × `image_seq_len`,
/// then `\n`; then `\n` and the unsplit form for the global image (`rows · cols + 1` rows). The
/// last row's `\n` and the global image's make one `\n\n` token.
pub fn prompt_replacement(
    config: &Idefics3Config,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let max = match config.variant {
        Variant::Idefics3 => NUMBERS.len(),
        Variant::SmolVlm => 6,
    };
    let (rows, cols) = match *grid {
        [0, 0] => (0, 0),
        [r, c] if r >= 1 && c >= 1 && r as u64 <= max as u64 && c as u64 <= max as u64 => {
            (r as usize, c as usize)
        }
        _ => {
            return Err(ProcessorError::Config {
                field: "rows",
                expected: format!(
                    "rows and cols both 0 (not split) or both between 1 and {max} (the \
                     <row_r_col_c> markers with known token ids)"
                ),
                actual: format!("{grid:?}"),
            })
        }
    };
    let fake = ids.get("<fake_token_around_image>")?;
    let image = ids.get("<image>")?;
    let global: Vec<u32> = match config.variant {
        Variant::Idefics3 => vec![
            ids.get("<")?,
            ids.get("global")?,
            ids.get("-img")?,
            ids.get(">")?,
        ],
        Variant::SmolVlm => vec![ids.get("<global-img>")?],
    };
    let seq = config.image_seq_len;
    let mut out = Built::default();
    if rows > 0 {
        let newline = ids.get("\n")?;
        let double = ids.get("\n\n")?;
        for r in 1..=rows {
            for c in 1..=cols {
                let marker = marker(config.variant, r, c, ids)?;
                out.text(&[fake]);
                out.text(&marker);
                out.images(image, seq);
            }
            out.text(&[if r < rows { newline } else { double }]);
        }
    }
    out.text(&[fake]);
    out.text(&global);
    out.images(image, seq);
    out.text(&[fake]);
    Ok(Replacement {
        tokens: out.tokens,
        embed: out.embed,
        rows: rows * cols + 1,
    })
}

/// A replacement being written: its tokens and which take embeddings.
#[derive(Default)]
struct Built {
    tokens: Vec<u32>,
    embed: Vec<bool>,
}

impl Built {
    fn text(&mut self, piece: &[u32]) {
        self.tokens.extend_from_slice(piece);
        self.embed.extend(std::iter::repeat_n(false, piece.len()));
    }

    fn images(&mut self, image: u32, n: usize) {
        self.tokens.extend(std::iter::repeat_n(image, n));
        self.embed.extend(std::iter::repeat_n(true, n));
    }
}

/// The tokens of `<row_r_col_c>` (1-based `r`, `c` within the variant's markers).
fn marker(
    variant: Variant,
    r: usize,
    c: usize,
    ids: &TokenIds<'_>,
) -> Result<Vec<u32>, ProcessorError> {
    match variant {
        Variant::Idefics3 => {
            let number = |n: usize| -> Result<u32, ProcessorError> {
                let name = NUMBERS.get(n - 1).ok_or_else(|| ProcessorError::Config {
                    field: "rows",
                    expected: format!("at most {} tile rows and columns", NUMBERS.len()),
                    actual: n.to_string(),
                })?;
                ids.get(name)
            };
            let under = ids.get("_")?;
            Ok(vec![
                ids.get("<")?,
                ids.get("row")?,
                under,
                number(r)?,
                ids.get("_col")?,
                under,
                number(c)?,
                ids.get(">")?,
            ])
        }
        Variant::SmolVlm => {
            let name = SMOLVLM_MARKERS.get((r - 1) * 6 + (c - 1)).ok_or_else(|| {
                ProcessorError::Config {
                    field: "rows",
                    expected: "at most 6 tile rows and columns".to_owned(),
                    actual: format!("{r}x{c}"),
                }
            })?;
            Ok(vec![ids.get(name)?])
        }
    }
}

/// `int(x)` of a positive `f64` (truncation; saturating for out-of-range values).
fn trunc(x: f64) -> usize {
    x as usize
}

/// `get_resize_output_image_size`: `_resize_output_size_rescale_to_max_len` (the longest side
/// becomes `max_len`, the other `int()` of Python's float arithmetic, rounded up to even, at
/// least 1) then `_resize_output_size_scale_below_upper_bound(…, 4096)`.
pub fn first_size(height: usize, width: usize, max_len: usize) -> (usize, usize) {
    let (mut h, mut w) = (height, width);
    let aspect = w as f64 / h as f64;
    if w >= h {
        w = max_len;
        h = trunc(w as f64 / aspect);
        if h % 2 != 0 {
            h += 1;
        }
    } else {
        h = max_len;
        w = trunc(h as f64 * aspect);
        if w % 2 != 0 {
            w += 1;
        }
    }
    h = h.max(1);
    w = w.max(1);
    let aspect = w as f64 / h as f64;
    if w >= h && w > MAX_IMAGE_SIZE {
        w = MAX_IMAGE_SIZE;
        h = trunc(w as f64 / aspect);
    } else if h > w && h > MAX_IMAGE_SIZE {
        h = MAX_IMAGE_SIZE;
        w = trunc(h as f64 * aspect);
    }
    (h.max(1), w.max(1))
}

/// `resize_for_vision_encoder`: the longest side rounded up to a multiple of `m`, the other
/// `int()`-scaled from it, then rounded up to a multiple of `m` (0 stays 0).
pub fn encoder_size(height: usize, width: usize, m: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    if width >= height {
        let w = width.div_ceil(m).saturating_mul(m);
        let h = trunc(w as f64 / aspect).div_ceil(m).saturating_mul(m);
        (h, w)
    } else {
        let h = height.div_ceil(m).saturating_mul(m);
        let w = trunc(h as f64 * aspect).div_ceil(m).saturating_mul(m);
        (h, w)
    }
}

/// One input: its images (0: the tiled image, 1: the global image), tile origins in output
/// order, and its rows/cols.
struct Prepared<'a> {
    images: Vec<Rgb<'a>>,
    tiles: Vec<(usize, (usize, usize))>,
    rows: usize,
    cols: usize,
}

fn prepare<'a>(
    config: &Idefics3Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let common = &config.common;
    let m = config.max_image_size;
    let image = if common.do_resize {
        let (h, w) = first_size(rgb.height, rgb.width, config.longest_edge);
        resize_rgb(rgb, h, w, common, threads)?
    } else {
        rgb
    };
    if !config.do_image_splitting {
        let image = resize_rgb(image, m, m, common, threads)?;
        return Ok(Prepared {
            images: vec![image],
            tiles: vec![(0, (0, 0))],
            rows: 0,
            cols: 0,
        });
    }
    let (h, w) = encoder_size(image.height, image.width, m);
    check_side("resized image", h, w)?;
    let image = resize_rgb(image, h, w, common, threads)?;
    if h <= m && w <= m {
        return Ok(Prepared {
            images: vec![image],
            tiles: vec![(0, (0, 0))],
            rows: 0,
            cols: 0,
        });
    }
    // h, w ≥ m here (multiples of m, non-zero: check_side above).
    let (rows, cols) = (h.saturating_sub(m) / m + 1, w.saturating_sub(m) / m + 1);
    let view = Rgb {
        data: Cow::Borrowed(&image.data[..]),
        width: image.width,
        height: image.height,
    };
    let global = resize_rgb(view, m, m, common, threads)?;
    let global = Rgb {
        width: global.width,
        height: global.height,
        data: Cow::Owned(super::owned_bytes(global.data, "global image")?),
    };
    let mut tiles: Vec<(usize, (usize, usize))> = (0..rows * cols)
        .map(|i| (0, ((i / cols) * m, (i % cols) * m)))
        .collect();
    tiles.push((1, (0, 0)));
    Ok(Prepared {
        images: vec![image, global],
        tiles,
        rows,
        cols,
    })
}

/// Every image decoded, resized and tiled: `pixel_values` `(1, tiles, 3, m, m)` planned, and
/// `pixel_attention_mask`, `rows` and `cols`.
fn plan<'a>(
    config: &Idefics3Config,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<Plan<'a>, ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let m = config.max_image_size;
    let count: usize = prepared.iter().map(|p| p.tiles.len()).sum();
    if count == 0 {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    let batch = prepared.len();
    let rows: Vec<i64> = prepared.iter().map(|p| p.rows as i64).collect();
    let cols: Vec<i64> = prepared.iter().map(|p| p.cols as i64).collect();
    // Every tile lies inside its image (tiles of an image of rows·m × cols·m, or an m × m
    // image whole).
    let (mut images, mut slots) = (Vec::new(), Vec::with_capacity(count));
    for p in prepared {
        let base = images.len();
        for &(i, (top, left)) in &p.tiles {
            slots.push(Some((base + i, (top as isize, left as isize))));
        }
        images.extend(p.images);
    }
    let tiles = Tiles {
        images: images.into(),
        slots,
        size: (m, m),
        normalize: normalize.clone(),
        threads: options.threads,
    };
    let pending = tiles.pending("pixel_values", vec![1, count, 3, m, m])?;
    // Every tile is a whole `m × m` window of its image: the mask is all ones, written where
    // it travels.
    let mut filled = Vec::new();
    if config.do_pad {
        filled.push(Filled::new(
            "pixel_attention_mask",
            vec![1, count, m, m],
            1,
            options.threads,
        )?);
    }
    let tensors = vec![
        ("rows", Tensor::i64(vec![1, batch], rows)),
        ("cols", Tensor::i64(vec![1, batch], cols)),
    ];
    Ok(Plan {
        pending,
        filled,
        rest: Outputs { tensors },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::TensorData;
    use crate::processors::{Family, Preprocessor};

    fn default_ids(spec: &ReplacementSpec) -> Vec<(String, u32)> {
        spec.defaults
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect()
    }

    #[test]
    fn replacement_as_idefics3_processor() {
        let owned = default_ids(&IDEFICS3_REPLACEMENT);
        let ids = TokenIds(&owned);
        let mut config = Idefics3Config::idefics3();
        config.image_seq_len = 2;
        let global = [128256, 27, 9951, 21743, 29, 128257, 128257, 128256];
        let one = prompt_replacement(&config, &[0, 0], &ids).unwrap();
        assert_eq!(one.tokens, global);
        assert_eq!(one.rows, 1);
        assert_eq!(
            one.embed,
            [false, false, false, false, false, true, true, false]
        );
        // 2 x 1: <row_1_col_1>, \n, <row_2_col_1>, \n\n, global.
        let tiles = prompt_replacement(&config, &[2, 1], &ids).unwrap();
        let row = |r: u32| [128256, 27, 654, 62, r, 10422, 62, 16, 29, 128257, 128257];
        let want: Vec<u32> = [&row(16)[..], &[198], &row(17)[..], &[271], &global[..]].concat();
        assert_eq!(tiles.tokens, want);
        assert_eq!(tiles.rows, 3);
        assert_eq!(tiles.embed.iter().filter(|&&e| e).count(), 6);
        let twelve = prompt_replacement(&config, &[12, 16], &ids).unwrap();
        assert_eq!(twelve.rows, 12 * 16 + 1);
        assert!(prompt_replacement(&config, &[17, 1], &ids).is_err());
        assert!(prompt_replacement(&config, &[0, 1], &ids).is_err());
        assert!(prompt_replacement(&config, &[1], &ids).is_err());
        assert!(prompt_replacement(&config, &[0, 0], &TokenIds(&[])).is_err());
    }

    #[test]
    fn replacement_as_smolvlm_processor() {
        let owned = default_ids(&SMOLVLM_REPLACEMENT);
        let ids = TokenIds(&owned);
        let mut config = Idefics3Config::smolvlm();
        config.image_seq_len = 1;
        assert_eq!(config.replacement_spec(), Some(SMOLVLM_REPLACEMENT));
        let one = prompt_replacement(&config, &[0, 0], &ids).unwrap();
        assert_eq!(one.tokens, [49189, 49152, 49190, 49189]);
        let tiles = prompt_replacement(&config, &[2, 2], &ids).unwrap();
        assert_eq!(
            tiles.tokens,
            [
                49189, 49153, 49190, 49189, 49154, 49190, 198, 49189, 49159, 49190, 49189, 49160,
                49190, 1116, 49189, 49152, 49190, 49189
            ]
        );
        assert_eq!(tiles.rows, 5);
        let six = prompt_replacement(&config, &[6, 6], &ids).unwrap();
        assert!(six.tokens.contains(&49188));
        assert!(prompt_replacement(&config, &[7, 1], &ids).is_err());
        // Split images need the id of \n\n.
        let without: Vec<(String, u32)> =
            owned.iter().filter(|(t, _)| t != "\n\n").cloned().collect();
        assert!(prompt_replacement(&config, &[1, 2], &TokenIds(&without)).is_err());
        assert!(prompt_replacement(&config, &[0, 0], &TokenIds(&owned)).is_ok());
    }

    #[test]
    fn sizes_as_transformers() {
        assert_eq!(first_size(1, 1, 1456), (1456, 1456));
        assert_eq!(first_size(1, 1, 365), (366, 365));
        assert_eq!(first_size(1, 2000, 1456), (1, 1456));
        assert_eq!(first_size(480, 640, 1456), (1092, 1456));
        assert_eq!(encoder_size(1, 1456, 364), (364, 1456));
        assert_eq!(encoder_size(1092, 1456, 364), (1092, 1456));
        assert_eq!(encoder_size(100, 50, 364), (364, 364));
    }

    #[test]
    fn tiles_then_global() {
        let wide = vec![255u8; 10 * 20 * 3];
        let inputs = [Input::Pixels {
            data: &wide,
            width: 20,
            height: 10,
            channels: 3,
        }];
        let edge = |n| Value::Map(vec![("longest_edge".into(), n)]);
        for family in [Family::Idefics3, Family::SmolVlm] {
            let p = Preprocessor::new(
                family,
                &[
                    ("size".to_owned(), edge(8)),
                    ("max_image_size".to_owned(), edge(4)),
                ],
            )
            .unwrap();
            let out = p.images(&inputs, &Options::default()).unwrap();
            // 10x20 -> 4x8 -> 4x8: 1 row, 2 columns, then the global image.
            assert_eq!(out.get("pixel_values").unwrap().shape, [1, 3, 3, 4, 4]);
            assert_eq!(out.get("rows").unwrap().data, TensorData::I64(vec![1]));
            assert_eq!(out.get("cols").unwrap().data, TensorData::I64(vec![2]));
            assert_eq!(
                out.get("pixel_attention_mask").unwrap().data,
                TensorData::I64(vec![1; 3 * 16])
            );
        }
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::Idefics3, &[(k.to_owned(), v)]).unwrap_err()
        };
        for (key, bad) in [
            (
                "size",
                Value::Map(vec![("height".into(), 4), ("width".into(), 4)]),
            ),
            ("size", Value::Map(vec![("longest_edge".into(), 0)])),
            ("max_image_size", Value::Int(364)),
            (
                "max_image_size",
                Value::Map(vec![("longest_edge".into(), 5000)]),
            ),
            ("do_image_splitting", Value::Int(1)),
            ("do_pad", Value::Str("yes".into())),
            ("image_seq_len", Value::Int(0)),
        ] {
            assert_eq!(build(key, bad).kind(), "config", "{key}");
        }
    }
}
