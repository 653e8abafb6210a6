//! What a model family is to the rest of the crate: [`FamilyConfig`], implemented by each
//! family's configuration in its own module (`qwen.rs`, `clip.rs`, …), which owns its keys, its
//! preprocessing and its placeholder token count; and [`VisionTokens`], the vision-tower
//! settings that the CLIP-like families need to count tokens.
//!
//! The registry ([`super::config`]) maps family names to these types; families import this
//! module and [`super::value`], never the registry.

use std::fmt;

use super::error::ProcessorError;
use super::normalize::Normalize;
use super::value::{BadSize, Common, Raw, RawMap, Value};
use super::{Deferred, Input, Options, Outputs, Tensor, TensorData};

/// The processor settings that turn a processed image into a token count for the families
/// whose count depends on the vision tower rather than on the image processor (CLIP, LLaVA-1.5,
/// SigLIP, LLaVA-NeXT): `LlavaProcessor`'s and `LlavaNextProcessor`'s `patch_size`,
/// `num_additional_image_tokens` and `vision_feature_select_strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionTokens {
    /// The vision tower's patch size (14 for the CLIP ViT-L/14 of LLaVA); at least 1.
    pub patch_size: usize,
    /// Extra embeddings per image (1 for a CLS token).
    pub num_additional_image_tokens: i64,
    /// `vision_feature_select_strategy == "default"`: one token (the CLS) is dropped.
    pub drop_one: bool,
}

impl VisionTokens {
    /// Checks the patch size (`strategy` is `vision_feature_select_strategy`).
    pub fn new(
        patch_size: i64,
        num_additional_image_tokens: i64,
        strategy: Option<&str>,
    ) -> Result<Self, ProcessorError> {
        let patch = usize::try_from(patch_size)
            .ok()
            .filter(|&p| (1..=super::MAX_SIDE).contains(&p))
            .ok_or_else(|| {
                ProcessorError::config(
                    "vision_tokens.patch_size",
                    format!("an integer between 1 and {}", super::MAX_SIDE),
                    patch_size,
                )
            })?;
        Ok(VisionTokens {
            patch_size: patch,
            num_additional_image_tokens,
            drop_one: strategy == Some("default"),
        })
    }

    /// `count`, less the CLS token for the `"default"` strategy.
    pub fn adjust(&self, count: i64) -> i64 {
        if self.drop_one {
            count - 1
        } else {
            count
        }
    }
}

/// Token ids by their transformers spelling (`"<|patch|>"` → 200092): what a family whose
/// prompt replacement is more than a run of one token writes its replacement with.
#[derive(Clone, Copy, Debug)]
pub struct TokenIds<'a>(pub &'a [(String, u32)]);

impl TokenIds<'_> {
    /// The id of `token`, or a configuration error naming it.
    pub fn get(&self, token: &'static str) -> Result<u32, ProcessorError> {
        self.0
            .iter()
            .find(|(name, _)| name == token)
            .map(|&(_, id)| id)
            .ok_or_else(|| ProcessorError::Config {
                field: "token_ids",
                expected: format!("the id of {token}"),
                actual: "none given".to_owned(),
            })
    }

    /// The ids of a piece of *text* the processor writes around its special tokens (Gemma 3's
    /// `"\n\n"`, its pan-and-scan sentences): every entry named `piece`, in the order given,
    /// since the tokenizer may write a piece as several tokens. At least one, or a
    /// configuration error naming the piece.
    pub fn text(&self, piece: &'static str) -> Result<Vec<u32>, ProcessorError> {
        let ids: Vec<u32> = self
            .0
            .iter()
            .filter(|(name, _)| name == piece)
            .map(|&(_, id)| id)
            .collect();
        if ids.is_empty() {
            return Err(ProcessorError::Config {
                field: "token_ids",
                expected: format!("the token ids of the text {piece:?}"),
                actual: "none given".to_owned(),
            });
        }
        Ok(ids)
    }
}

/// How a family's images take their place in the prompt when each anchor is replaced by more
/// than a run of one token (Llama 4's tiles with separators, …), and how its outputs split into
/// images for an engine: what [`FamilyConfig::prompt_replacement`] and the builders need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplacementSpec {
    /// The output tensors whose values for one image, concatenated, are that image's grid; each
    /// is read as `(images, -1)` row-major (Llama 4: `aspect_ratios`; Idefics3: `rows`, `cols`).
    pub grid: &'static [&'static str],
    /// The token the chat template writes once per image (Llama 4: `<|image|>`).
    pub anchor: &'static str,
    /// The token whose positions take the encoder's embeddings (Llama 4: `<|patch|>`).
    pub embed: &'static str,
    /// Every token the replacement is made of, the anchor and embed tokens included (a text
    /// piece the processor tokenizes, such as `"\n"`, is named like a token).
    pub tokens: &'static [&'static str],
    /// The published checkpoints' ids of [`tokens`](Self::tokens), for a caller without the
    /// model's tokenizer.
    pub defaults: &'static [(&'static str, u32)],
    /// The output tensors whose dim 0 concatenates the images' rows ([`Replacement::rows`]
    /// each); engines take them flat, split by [`sizes`](Self::sizes). Empty: every tensor has
    /// one entry per image.
    pub flat: &'static [&'static str],
    /// The name of the 1-D rows-per-image tensor that splits the [`flat`](Self::flat) tensors:
    /// the engine model's own name for it (vLLM Llama 4: `patches_per_image`).
    pub sizes: &'static str,
    /// The outputs carry a leading sample dimension of 1 that engines do not take (Idefics3:
    /// `pixel_values` `(1, tiles, 3, H, W)`); the builders drop it from every tensor.
    pub per_sample: bool,
    /// Text pieces, named by their text like [`tokens`](Self::tokens), that the processor's
    /// tokenizer writes as one token when they meet: transformers' processor substitutes the
    /// replacement into the prompt *text* and tokenizes the whole, so a piece at a
    /// replacement's edge and a piece of the prompt next to it (or of the next replacement)
    /// become the token whose text is their concatenation, when that is one of these pieces
    /// too (Gemma 3: `"\n"` + `"\n\n"` → `"\n\n\n"`). Their ids are in
    /// [`defaults`](Self::defaults) (or the model's tokenizer); the merges are applied by
    /// `expand_placeholders`, repeatedly along a run, never to a run longer than the longest
    /// piece with an id. Empty: the replacement's tokens never merge with the prompt's.
    pub joins: &'static [&'static str],
}

/// One image's prompt replacement: its tokens, which of them take encoder embeddings (vLLM's
/// `PlaceholderRange.is_embed`), and the rows of the primary tensor the image owns (tiles).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub tokens: Vec<u32>,
    pub embed: Vec<bool>,
    pub rows: usize,
}

impl Replacement {
    /// `start`, `n` × `image`, `end`, only the image tokens embedded: the replacement of every
    /// family whose processor brackets a run of one token (Gemma 4, MiniMax-M3-VL,
    /// Nemotron-H-Omni).
    pub fn bracketed(start: u32, image: u32, n: usize, end: u32, rows: usize) -> Self {
        let mut tokens = Vec::with_capacity(n + 2);
        tokens.push(start);
        tokens.extend(std::iter::repeat_n(image, n));
        tokens.push(end);
        let mut embed = vec![true; n + 2];
        embed[0] = false;
        embed[n + 1] = false;
        Self {
            tokens,
            embed,
            rows,
        }
    }
}

/// What a family is to transformers' `preprocessor_config.json`: the classes that name it and
/// how its keys read. Each family's module declares one, named by its registry line.
#[derive(Clone, Copy, Debug)]
pub struct Hf {
    /// The image processor classes (`image_processor_type`) of the family, without the
    /// `Fast`/`Pil` backend suffix.
    pub image_classes: &'static [&'static str],
    /// The video processor classes (`video_processor_type`), likewise.
    pub video_classes: &'static [&'static str],
    /// The keys of a `preprocessor_config.json` the family uses, normalised as transformers'
    /// `__init__`/`_standardize_kwargs` would (an int `size` becomes a dict, …): the
    /// configuration [`FamilyConfig::set`] takes, once converted to [`Value`]s. Keys it does
    /// not use are dropped; `None` values keep the class default.
    pub normalise: Normalise,
    /// The settings of the family's transformers *processor* that reach its image processor,
    /// read from a model directory's `processor_config.json` over the
    /// `preprocessor_config.json`: `(key, default)`, the default applying when the file lacks
    /// the key (`None`: keep the preprocessor config's value, as for a `None` in the file).
    /// Empty: the file gives the [`VisionTokens`] instead (CLIP-like families).
    pub processor_keys: &'static [(&'static str, Option<i64>)],
    /// `(processor_class, key, value)`: when either config names `processor_class`, that
    /// processor passes `key = value` to the image processor on every call, over the file.
    pub processor_forces: Option<(&'static str, &'static str, bool)>,
    /// The placeholder tokens of the family's published checkpoints, for a caller without the
    /// model's `config.json` (`VisionModel.for_family`), when its replacement is a run of one
    /// token; a family with a [`ReplacementSpec`] publishes its ids there instead.
    pub published: Option<Published>,
    /// The name of the per-image placeholder count when the engine's model takes it as an input
    /// tensor that the transformers processor does not return (vLLM's
    /// `Phi4MultimodalForCausalLM`: `num_img_tokens`).
    pub count_tensor: Option<&'static str>,
}

/// A family's published checkpoints, as far as a request needs them: the placeholder token
/// ids of `config.json` and the vision tower's token rule of `processor_config.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// `image_token_id` / `image_token_index`: the anchor the chat template writes once per
    /// image and the token of its run.
    pub image: u32,
    /// `video_token_id`, for a family with videos.
    pub video: Option<u32>,
    /// The CLIP-like families' tower (patch size, extra tokens, CLS dropped).
    pub vision_tokens: Option<VisionTokens>,
}

impl Published {
    /// Qwen2/2.5/3-VL's `<|image_pad|>` and `<|video_pad|>`.
    pub const QWEN: Published = Published {
        image: 151655,
        video: Some(151656),
        vision_tokens: None,
    };
    /// The CLIP ViT-L/14 tower of LLaVA-1.5 / LLaVA-NeXT with its CLS token dropped (the
    /// "default" strategy): 576 tokens at 336 px; `<image>` 32000 (`LlavaConfig`
    /// `image_token_index`).
    pub const LLAVA: Published = Published {
        image: 32000,
        video: None,
        vision_tokens: Some(VisionTokens {
            patch_size: 14,
            num_additional_image_tokens: 1,
            drop_one: true,
        }),
    };
}

/// A family's reading of a `preprocessor_config.json` (see [`Hf::normalise`]).
pub type Normalise = fn(&[(String, Raw)]) -> Result<RawMap, BadSize>;

/// One family's configuration: its keys over [`Common`], its preprocessing and its token count.
///
/// Adding a family: a module with a type implementing this trait and its [`Hf`], one line in
/// the registry ([`super::config`]), and the module's `mod` line.
pub trait FamilyConfig: fmt::Debug + Send + Sync {
    /// The keys every family shares.
    fn common(&self) -> &Common;
    fn common_mut(&mut self) -> &mut Common;
    /// Sets one of the family's own keys; `Ok(false)` if `key` is not one of them.
    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError>;
    /// The family's own keys and their values (the shared ones are [`Common`]'s).
    fn entries(&self) -> Vec<(&'static str, Value)>;
    /// Checks the combination of values (each `set` checked its own).
    fn validate(&self) -> Result<(), ProcessorError>;

    /// Whether the family's processor keeps the alpha of a PIL image (Inkling2:
    /// `convert("RGBA" if has_transparency_data else "RGB")`, then its own compositing), so
    /// Python hands such images over as RGBA arrays instead of compositing them onto white.
    fn keeps_alpha(&self) -> bool {
        false
    }

    /// Processes a non-empty batch of images.
    fn images(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError>;

    /// [`images`](Self::images) with the largest tensor left unwritten where the family can
    /// (see [`super::Preprocessor::images_deferred`]); computed by default.
    fn images_deferred<'a>(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        self.images(normalize, inputs, options).map(Deferred::Done)
    }

    /// Processes a batch of videos, each a list of frames; `Ok(None)` for a family without
    /// videos.
    fn videos(
        &self,
        _normalize: &Normalize,
        _videos: &[Vec<Input<'_>>],
        _options: &Options,
    ) -> Option<Result<Outputs, ProcessorError>> {
        None
    }

    /// [`videos`](Self::videos) with the largest tensor left unwritten where the family can.
    fn videos_deferred<'a>(
        &self,
        normalize: &Normalize,
        videos: &[Vec<Input<'a>>],
        options: &Options,
    ) -> Option<Result<Deferred<'a>, ProcessorError>> {
        self.videos(normalize, videos, options)
            .map(|r| r.map(Deferred::Done))
    }

    /// Placeholder tokens per image of `outputs` (what this family's images returned), as the
    /// family's transformers processor writes them into the prompt; `None` when they cannot be
    /// known (the CLIP-like families without [`VisionTokens`]).
    fn image_tokens(&self, outputs: &Outputs, vision: Option<&VisionTokens>) -> Option<Vec<i64>>;

    /// Placeholder tokens per video of `outputs`; `None` for a family without videos.
    fn video_tokens(&self, _outputs: &Outputs) -> Option<Vec<i64>> {
        None
    }

    /// The family's prompt replacement rule, when an image's anchor becomes more than a run of
    /// one token (tiled families); `None` for a run of [`image_tokens`](Self::image_tokens)
    /// copies of the anchor.
    fn replacement_spec(&self) -> Option<ReplacementSpec> {
        None
    }

    /// One image's replacement from its grid (its row of [`ReplacementSpec::grid`]), exactly as
    /// the family's transformers processor writes it; `None` without a
    /// [`replacement_spec`](Self::replacement_spec).
    fn prompt_replacement(
        &self,
        _grid: &[i64],
        _ids: &TokenIds<'_>,
    ) -> Option<Result<Replacement, ProcessorError>> {
        None
    }
}

/// The values of an `int64` tensor of `outputs`, if it has one named `name`.
pub fn i64_values<'o>(outputs: &'o Outputs, name: &str) -> Option<&'o [i64]> {
    match outputs.get(name) {
        Some(Tensor {
            data: TensorData::I64(values),
            ..
        }) => Some(values),
        _ => None,
    }
}

/// The token counts as the `(n,)` `int64` tensor the processors return them in
/// (`num_image_tokens`, `num_video_tokens`).
pub fn tokens_tensor(counts: Vec<i64>) -> Tensor {
    Tensor {
        shape: vec![counts.len()],
        data: TensorData::I64(counts),
    }
}
