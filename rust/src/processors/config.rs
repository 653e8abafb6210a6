//! Processor configurations: each family's transformers class defaults, overridden key by key.
//!
//! The keys and their meaning are those of transformers' `preprocessor_config.json`, already
//! normalised by the caller: `size`, `crop_size` and `pad_size` are maps of positive integers,
//! `image_mean`/`image_std` three floats, `resample` a PIL filter id, plus `pass_order`
//! (`"pillow13"`/`"pillow12"`, ours: which Pillow's pass order to reproduce).

use crate::image::{Filter, PassOrder};

use super::clip::ClipConfig;
use super::gemma3::Gemma3Config;
use super::idefics3::Idefics3Config;
use super::internvl::InternVlConfig;
use super::llama4::Llama4Config;
use super::llava_next::LlavaNextConfig;
use super::normalize::Normalize;
use super::phi3v::Phi3VConfig;
use super::phi4::Phi4Config;
use super::pixtral::PixtralConfig;
use super::qwen::QwenConfig;
use super::sizes::SizeSpec;
use super::ProcessorError;

/// `OPENAI_CLIP_MEAN`.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// `OPENAI_CLIP_STD`.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// `IMAGENET_STANDARD_MEAN` = `IMAGENET_STANDARD_STD`.
pub const HALF: [f64; 3] = [0.5, 0.5, 0.5];
/// `1 / 255` as Python computes it.
pub const RESCALE_FACTOR: f64 = 1.0 / 255.0;

/// The model families, by the names transformers' auto classes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Qwen2Vl,
    Qwen25Vl,
    Qwen3Vl,
    Qwen35,
    Clip,
    Llava,
    Siglip,
    LlavaNext,
    Pixtral,
    Gemma3,
    InternVl,
    Idefics3,
    SmolVlm,
    Llama4,
    Phi4Multimodal,
    Phi3V,
}

impl Family {
    pub const ALL: [Family; 16] = [
        Family::Qwen2Vl,
        Family::Qwen25Vl,
        Family::Qwen3Vl,
        Family::Qwen35,
        Family::Clip,
        Family::Llava,
        Family::Siglip,
        Family::LlavaNext,
        Family::Pixtral,
        Family::Gemma3,
        Family::InternVl,
        Family::Idefics3,
        Family::SmolVlm,
        Family::Llama4,
        Family::Phi4Multimodal,
        Family::Phi3V,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Qwen2Vl => "qwen2_vl",
            Family::Qwen25Vl => "qwen2_5_vl",
            Family::Qwen3Vl => "qwen3_vl",
            Family::Qwen35 => "qwen3_5",
            Family::Clip => "clip",
            Family::Llava => "llava",
            Family::Siglip => "siglip",
            Family::LlavaNext => "llava_next",
            Family::Pixtral => "pixtral",
            Family::Gemma3 => "gemma3",
            Family::InternVl => "internvl",
            Family::Idefics3 => "idefics3",
            Family::SmolVlm => "smolvlm",
            Family::Llama4 => "llama4",
            Family::Phi4Multimodal => "phi4_multimodal",
            Family::Phi3V => "phi3_v",
        }
    }

    pub fn from_name(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// A value of a configuration key.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Floats(Vec<f64>),
    /// A list of `[height, width]` pairs (`image_grid_pinpoints`).
    Pairs(Vec<(i64, i64)>),
    /// A size dict: `(key, value)` in the caller's order.
    Map(Vec<(String, i64)>),
    /// `None` (only `pad_size` accepts it).
    None,
}

/// What every family shares: resize filter and pass order, rescale and normalize.
#[derive(Clone, Debug, PartialEq)]
pub struct Common {
    pub do_resize: bool,
    pub resample: Filter,
    pub pass_order: PassOrder,
    pub do_rescale: bool,
    pub rescale_factor: f64,
    pub do_normalize: bool,
    pub image_mean: [f64; 3],
    pub image_std: [f64; 3],
}

impl Common {
    /// BICUBIC, Pillow 13's pass order, rescale by 1/255 and normalize with `mean`/`std`.
    pub fn new(mean: [f64; 3], std: [f64; 3]) -> Self {
        Common {
            do_resize: true,
            resample: Filter::Bicubic,
            pass_order: PassOrder::Pillow13,
            do_rescale: true,
            rescale_factor: RESCALE_FACTOR,
            do_normalize: true,
            image_mean: mean,
            image_std: std,
        }
    }

    /// The rescale/normalize table of this configuration.
    pub fn normalize(&self) -> Normalize {
        Normalize::new(
            self.do_rescale.then_some(self.rescale_factor),
            self.do_normalize
                .then_some((self.image_mean, self.image_std)),
        )
    }

    /// Sets a shared key; `Ok(false)` if the key is not one of them.
    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "do_resize" => self.do_resize = as_bool("do_resize", value)?,
            "do_rescale" => self.do_rescale = as_bool("do_rescale", value)?,
            "do_normalize" => self.do_normalize = as_bool("do_normalize", value)?,
            "rescale_factor" => self.rescale_factor = as_float("rescale_factor", value)?,
            "image_mean" => self.image_mean = as_triple("image_mean", value)?,
            "image_std" => self.image_std = as_triple("image_std", value)?,
            "resample" => {
                self.resample = match value {
                    Value::Int(id) => Filter::from_pil_id(*id),
                    Value::Str(name) => Filter::from_name(name),
                    _ => None,
                }
                .ok_or_else(|| {
                    ProcessorError::config(
                        "resample",
                        "a PIL filter id (0 NEAREST, 1 LANCZOS, 2 BILINEAR, 3 BICUBIC, 4 BOX, \
                         5 HAMMING) or name",
                        value,
                    )
                })?
            }
            "pass_order" => {
                self.pass_order = match value {
                    Value::Str(name) => PassOrder::from_name(name),
                    _ => None,
                }
                .ok_or_else(|| {
                    ProcessorError::config("pass_order", "\"pillow13\" or \"pillow12\"", value)
                })?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("do_resize", Value::Bool(self.do_resize)),
            ("resample", Value::Int(i64::from(self.resample.pil_id()))),
            ("pass_order", Value::Str(self.pass_order.name().to_owned())),
            ("do_rescale", Value::Bool(self.do_rescale)),
            ("rescale_factor", Value::Float(self.rescale_factor)),
            ("do_normalize", Value::Bool(self.do_normalize)),
            ("image_mean", Value::Floats(self.image_mean.to_vec())),
            ("image_std", Value::Floats(self.image_std.to_vec())),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if !(self.rescale_factor.is_finite()) {
            return Err(ProcessorError::config(
                "rescale_factor",
                "a finite number",
                self.rescale_factor,
            ));
        }
        for (field, values) in [
            ("image_mean", self.image_mean),
            ("image_std", self.image_std),
        ] {
            if values.iter().any(|v| !v.is_finite()) {
                return Err(ProcessorError::config(field, "finite numbers", values));
            }
        }
        // A zero deviation divides into inf, a negative one flips the signs: no model is
        // trained on either.
        if self.image_std.iter().any(|&v| v <= 0.0) {
            return Err(ProcessorError::config(
                "image_std",
                "positive finite numbers",
                self.image_std,
            ));
        }
        Ok(())
    }
}

/// A complete configuration of one family.
#[derive(Clone, Debug, PartialEq)]
pub enum ProcessorConfig {
    Qwen(QwenConfig),
    /// CLIP, LLaVA-1.5 and SigLIP: resize, center crop, normalize.
    Clip(ClipConfig),
    LlavaNext(LlavaNextConfig),
    Pixtral(PixtralConfig),
    Gemma3(Gemma3Config),
    InternVl(InternVlConfig),
    Idefics3(Idefics3Config),
    Llama4(Llama4Config),
    Phi4(Phi4Config),
    Phi3V(Phi3VConfig),
}

impl ProcessorConfig {
    /// The transformers class defaults of `family` (for the Qwen3 families, which share
    /// Qwen2-VL's class, the values of their published checkpoints: patch 16, mean/std 0.5,
    /// 65 536 … 16 777 216 pixels).
    pub fn defaults(family: Family) -> Self {
        match family {
            Family::Qwen2Vl | Family::Qwen25Vl => ProcessorConfig::Qwen(QwenConfig::qwen2_vl()),
            Family::Qwen3Vl | Family::Qwen35 => ProcessorConfig::Qwen(QwenConfig::qwen3_vl()),
            Family::Clip => ProcessorConfig::Clip(ClipConfig::clip()),
            Family::Llava => ProcessorConfig::Clip(ClipConfig::llava()),
            Family::Siglip => ProcessorConfig::Clip(ClipConfig::siglip()),
            Family::LlavaNext => ProcessorConfig::LlavaNext(LlavaNextConfig::llava_next()),
            Family::Pixtral => ProcessorConfig::Pixtral(PixtralConfig::pixtral()),
            Family::Gemma3 => ProcessorConfig::Gemma3(Gemma3Config::gemma3()),
            Family::InternVl => ProcessorConfig::InternVl(InternVlConfig::internvl()),
            Family::Idefics3 => ProcessorConfig::Idefics3(Idefics3Config::idefics3()),
            Family::SmolVlm => ProcessorConfig::Idefics3(Idefics3Config::smolvlm()),
            Family::Llama4 => ProcessorConfig::Llama4(Llama4Config::llama4()),
            Family::Phi4Multimodal => ProcessorConfig::Phi4(Phi4Config::phi4_multimodal()),
            Family::Phi3V => ProcessorConfig::Phi3V(Phi3VConfig::phi3_v()),
        }
    }

    /// `family`'s defaults with `entries` applied in order, validated.
    pub fn build(family: Family, entries: &[(String, Value)]) -> Result<Self, ProcessorError> {
        let mut config = Self::defaults(family);
        for (key, value) in entries {
            config.set(key, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    pub fn common(&self) -> &Common {
        match self {
            ProcessorConfig::Qwen(c) => &c.common,
            ProcessorConfig::Clip(c) => &c.common,
            ProcessorConfig::LlavaNext(c) => &c.common,
            ProcessorConfig::Pixtral(c) => &c.common,
            ProcessorConfig::Gemma3(c) => &c.common,
            ProcessorConfig::InternVl(c) => &c.common,
            ProcessorConfig::Idefics3(c) => &c.common,
            ProcessorConfig::Llama4(c) => &c.common,
            ProcessorConfig::Phi4(c) => &c.common,
            ProcessorConfig::Phi3V(c) => &c.common,
        }
    }

    fn common_mut(&mut self) -> &mut Common {
        match self {
            ProcessorConfig::Qwen(c) => &mut c.common,
            ProcessorConfig::Clip(c) => &mut c.common,
            ProcessorConfig::LlavaNext(c) => &mut c.common,
            ProcessorConfig::Pixtral(c) => &mut c.common,
            ProcessorConfig::Gemma3(c) => &mut c.common,
            ProcessorConfig::InternVl(c) => &mut c.common,
            ProcessorConfig::Idefics3(c) => &mut c.common,
            ProcessorConfig::Llama4(c) => &mut c.common,
            ProcessorConfig::Phi4(c) => &mut c.common,
            ProcessorConfig::Phi3V(c) => &mut c.common,
        }
    }

    /// Sets one key.
    pub fn set(&mut self, key: &str, value: &Value) -> Result<(), ProcessorError> {
        if self.common_mut().set(key, value)? {
            return Ok(());
        }
        let known = match self {
            ProcessorConfig::Qwen(c) => c.set(key, value)?,
            ProcessorConfig::Clip(c) => c.set(key, value)?,
            ProcessorConfig::LlavaNext(c) => c.set(key, value)?,
            ProcessorConfig::Pixtral(c) => c.set(key, value)?,
            ProcessorConfig::Gemma3(c) => c.set(key, value)?,
            ProcessorConfig::InternVl(c) => c.set(key, value)?,
            ProcessorConfig::Idefics3(c) => c.set(key, value)?,
            ProcessorConfig::Llama4(c) => c.set(key, value)?,
            ProcessorConfig::Phi4(c) => c.set(key, value)?,
            ProcessorConfig::Phi3V(c) => c.set(key, value)?,
        };
        if known {
            Ok(())
        } else {
            Err(ProcessorError::Config {
                field: "key",
                expected: "a key of this family's configuration".to_owned(),
                actual: format!("{key:?}"),
            })
        }
    }

    /// Every key and its value.
    pub fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut out = self.common().entries();
        out.extend(match self {
            ProcessorConfig::Qwen(c) => c.entries(),
            ProcessorConfig::Clip(c) => c.entries(),
            ProcessorConfig::LlavaNext(c) => c.entries(),
            ProcessorConfig::Pixtral(c) => c.entries(),
            ProcessorConfig::Gemma3(c) => c.entries(),
            ProcessorConfig::InternVl(c) => c.entries(),
            ProcessorConfig::Idefics3(c) => c.entries(),
            ProcessorConfig::Llama4(c) => c.entries(),
            ProcessorConfig::Phi4(c) => c.entries(),
            ProcessorConfig::Phi3V(c) => c.entries(),
        });
        out
    }

    pub fn validate(&self) -> Result<(), ProcessorError> {
        self.common().validate()?;
        match self {
            ProcessorConfig::Qwen(c) => c.validate(),
            ProcessorConfig::Clip(c) => c.validate(),
            ProcessorConfig::LlavaNext(c) => c.validate(),
            ProcessorConfig::Pixtral(c) => c.validate(),
            ProcessorConfig::Gemma3(c) => c.validate(),
            ProcessorConfig::InternVl(c) => c.validate(),
            ProcessorConfig::Idefics3(c) => c.validate(),
            ProcessorConfig::Llama4(c) => c.validate(),
            ProcessorConfig::Phi4(c) => c.validate(),
            ProcessorConfig::Phi3V(c) => c.validate(),
        }
    }
}

pub(crate) fn as_bool(field: &'static str, value: &Value) -> Result<bool, ProcessorError> {
    match value {
        Value::Bool(b) => Ok(*b),
        _ => Err(ProcessorError::config(field, "true or false", value)),
    }
}

pub(crate) fn as_float(field: &'static str, value: &Value) -> Result<f64, ProcessorError> {
    match value {
        Value::Float(v) => Ok(*v),
        Value::Int(v) => Ok(*v as f64),
        _ => Err(ProcessorError::config(field, "a number", value)),
    }
}

/// A positive integer no larger than `max`.
pub(crate) fn as_count(
    field: &'static str,
    value: &Value,
    max: usize,
) -> Result<usize, ProcessorError> {
    match value {
        Value::Int(v) if *v >= 1 && (*v as u64) <= max as u64 => Ok(*v as usize),
        _ => Err(ProcessorError::config(
            field,
            format!("an integer between 1 and {max}"),
            value,
        )),
    }
}

fn as_triple(field: &'static str, value: &Value) -> Result<[f64; 3], ProcessorError> {
    match value {
        Value::Float(v) => Ok([*v; 3]),
        Value::Int(v) => Ok([*v as f64; 3]),
        Value::Floats(v) if v.len() == 3 => Ok([v[0], v[1], v[2]]),
        _ => Err(ProcessorError::config(
            field,
            "a number or 3 numbers (one per RGB channel)",
            value,
        )),
    }
}

/// A size dict as the [`SizeSpec`] `PilBackend.resize` would use, checking the key set is one
/// transformers accepts.
pub(crate) fn as_size(field: &'static str, value: &Value) -> Result<SizeSpec, ProcessorError> {
    let Value::Map(entries) = value else {
        return Err(ProcessorError::config(field, "a dict of sizes", value));
    };
    let get = |k: &str| entries.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
    let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    let positive = |v: i64| -> Result<usize, ProcessorError> {
        if v >= 1 && v as u64 <= super::MAX_SIDE as u64 {
            Ok(v as usize)
        } else {
            Err(ProcessorError::config(
                field,
                format!("sizes between 1 and {}", super::MAX_SIDE),
                value,
            ))
        }
    };
    let spec = match keys[..] {
        ["height", "width"] => SizeSpec::Exact {
            height: positive(get("height").unwrap_or(0))?,
            width: positive(get("width").unwrap_or(0))?,
        },
        ["shortest_edge"] => SizeSpec::ShortestEdge(positive(get("shortest_edge").unwrap_or(0))?),
        ["longest_edge", "shortest_edge"] => SizeSpec::ShortestLongest {
            shortest: positive(get("shortest_edge").unwrap_or(0))?,
            longest: positive(get("longest_edge").unwrap_or(0))?,
        },
        ["max_height", "max_width"] => SizeSpec::MaxHeightWidth {
            height: positive(get("max_height").unwrap_or(0))?,
            width: positive(get("max_width").unwrap_or(0))?,
        },
        _ => {
            return Err(ProcessorError::config(
                field,
                "keys {height, width}, {shortest_edge}, {shortest_edge, longest_edge} or \
                 {max_height, max_width}",
                value,
            ))
        }
    };
    Ok(spec)
}

/// `{"height": h, "width": w}` as `(h, w)`.
pub(crate) fn as_hw(field: &'static str, value: &Value) -> Result<(usize, usize), ProcessorError> {
    match as_size(field, value)? {
        SizeSpec::Exact { height, width } => Ok((height, width)),
        _ => Err(ProcessorError::config(
            field,
            "a dict with keys height and width",
            value,
        )),
    }
}

pub(crate) fn size_value(spec: SizeSpec) -> Value {
    let pairs: Vec<(&str, usize)> = match spec {
        SizeSpec::Exact { height, width } => vec![("height", height), ("width", width)],
        SizeSpec::ShortestEdge(s) => vec![("shortest_edge", s)],
        SizeSpec::ShortestLongest { shortest, longest } => {
            vec![("shortest_edge", shortest), ("longest_edge", longest)]
        }
        SizeSpec::MaxHeightWidth { height, width } => {
            vec![("max_height", height), ("max_width", width)]
        }
    };
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v as i64))
            .collect(),
    )
}

pub(crate) fn hw_value((height, width): (usize, usize)) -> Value {
    size_value(SizeSpec::Exact { height, width })
}

/// The entries CLIP-like configurations share: `size`, `do_center_crop`, `crop_size` (when set)
/// and `do_pad`.
pub(crate) fn resize_crop_entries(
    size: SizeSpec,
    do_center_crop: bool,
    crop_size: Option<(usize, usize)>,
    do_pad: bool,
) -> Vec<(&'static str, Value)> {
    let mut out = vec![
        ("size", size_value(size)),
        ("do_center_crop", Value::Bool(do_center_crop)),
    ];
    if let Some(crop) = crop_size {
        out.push(("crop_size", hw_value(crop)));
    }
    out.push(("do_pad", Value::Bool(do_pad)));
    out
}

/// A center crop needs a crop size.
pub(crate) fn check_crop(
    do_center_crop: bool,
    crop_size: Option<(usize, usize)>,
) -> Result<(), ProcessorError> {
    if do_center_crop && crop_size.is_none() {
        return Err(ProcessorError::config(
            "crop_size",
            "a crop size when do_center_crop is on",
            "None",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, i64)]) -> Value {
        Value::Map(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    #[test]
    fn families_round_trip() {
        for family in Family::ALL {
            assert_eq!(Family::from_name(family.name()), Some(family));
            let config = ProcessorConfig::defaults(family);
            config.validate().unwrap();
            // Every entry can be set back.
            let entries: Vec<(String, Value)> = config
                .entries()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            assert_eq!(ProcessorConfig::build(family, &entries).unwrap(), config);
        }
        assert_eq!(Family::from_name("gemma"), None);
    }

    #[test]
    fn bad_values() {
        let build = |k: &str, v: Value| {
            ProcessorConfig::build(Family::Clip, &[(k.to_owned(), v)]).unwrap_err()
        };
        assert!(build("resample", Value::Int(9))
            .to_string()
            .contains("resample"));
        assert!(build("image_mean", Value::Floats(vec![0.5; 2]))
            .to_string()
            .contains("image_mean"));
        assert!(build("size", map(&[("height", 2)]))
            .to_string()
            .contains("keys"));
        assert!(build("size", map(&[("shortest_edge", 0)]))
            .to_string()
            .contains("between"));
        assert!(build("crop_size", map(&[("shortest_edge", 5)]))
            .to_string()
            .contains("height and width"));
        assert!(build("patch_size", Value::Int(14))
            .to_string()
            .contains("key"));
        assert_eq!(
            build("rescale_factor", Value::Float(f64::NAN)).kind(),
            "config"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(
            as_size("size", &map(&[("longest_edge", 9), ("shortest_edge", 3)])).unwrap(),
            SizeSpec::ShortestLongest {
                shortest: 3,
                longest: 9
            }
        );
        let spec = SizeSpec::MaxHeightWidth {
            height: 4,
            width: 5,
        };
        assert_eq!(as_size("size", &size_value(spec)).unwrap(), spec);
    }
}
