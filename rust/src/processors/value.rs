//! Configuration values and the helpers every family reads them with: the [`Value`] of a key,
//! the keys all families share ([`Common`]), the transformers constants, and checked
//! conversions of values into sizes, counts and flags.
//!
//! The keys and their meaning are those of transformers' `preprocessor_config.json`, already
//! normalised by the caller: `size`, `crop_size` and `pad_size` are maps of positive integers,
//! `image_mean`/`image_std` three floats, `resample` a PIL filter id, plus `pass_order`
//! (`"pillow13"`/`"pillow12"`, ours: which Pillow's pass order to reproduce).
//!
//! A leaf of the family modules: they import it (and [`super::family`]), never the registry
//! ([`super::config`]), so that the arrows between the modules run one way.

use crate::image::{Filter, PassOrder};

use super::error::ProcessorError;
use super::normalize::Normalize;
use super::sizes::SizeSpec;

/// `OPENAI_CLIP_MEAN`.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// `OPENAI_CLIP_STD`.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// `IMAGENET_STANDARD_MEAN` = `IMAGENET_STANDARD_STD`.
pub const HALF: [f64; 3] = [0.5, 0.5, 0.5];
/// `1 / 255` as Python computes it.
pub const RESCALE_FACTOR: f64 = 1.0 / 255.0;

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
    pub(crate) fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
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

    pub(crate) fn entries(&self) -> Vec<(&'static str, Value)> {
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

    pub(crate) fn validate(&self) -> Result<(), ProcessorError> {
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

pub(crate) fn as_triple(field: &'static str, value: &Value) -> Result<[f64; 3], ProcessorError> {
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

/// A value of a transformers `preprocessor_config.json` as read (parsed JSON, or a Python
/// dict): what a family's [`Hf::normalise`](super::family::Hf) turns into the keys the native
/// processor reads ([`Value`]s once converted).
#[derive(Clone, Debug, PartialEq)]
pub enum Raw {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// A list (or a tuple).
    List(Vec<Raw>),
    /// A dict with string keys, in order.
    Map(RawMap),
    /// Anything else (an integer beyond `i64`, a dict with other keys, any other object),
    /// passed through untouched: `id` is the caller's handle on it, `int` whether it is an
    /// integer and `truthy` its truth value.
    Other {
        id: usize,
        int: bool,
        truthy: bool,
    },
}

/// A dict of [`Raw`] values, in order (a key appears once).
pub type RawMap = Vec<(String, Raw)>;

impl Raw {
    /// Python's truth value.
    pub fn truthy(&self) -> bool {
        match self {
            Raw::None => false,
            Raw::Bool(b) => *b,
            Raw::Int(i) => *i != 0,
            Raw::Float(f) => *f != 0.0,
            Raw::Str(s) => !s.is_empty(),
            Raw::List(v) => !v.is_empty(),
            Raw::Map(m) => !m.is_empty(),
            Raw::Other { truthy, .. } => *truthy,
        }
    }

    /// An `int` (not a `bool`).
    fn is_int(&self) -> bool {
        matches!(self, Raw::Int(_) | Raw::Other { int: true, .. })
    }
}

/// A value that is no size (`get_size_dict` would fail on it).
#[derive(Clone, Debug, PartialEq)]
pub struct BadSize(pub Raw);

/// `config[key]`, unless missing or `None`.
pub fn hf_get<'a>(config: &'a [(String, Raw)], key: &str) -> Option<&'a Raw> {
    config
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .filter(|v| **v != Raw::None)
}

/// Sets `key` (in place if present, else at the end).
pub fn hf_put(out: &mut RawMap, key: &str, value: Raw) {
    match out.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => out.push((key.to_owned(), value)),
    }
}

/// The keys every family reads, as transformers names them (plus our `pass_order`).
pub const HF_COMMON: [&str; 8] = [
    "do_resize",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "pass_order",
];

/// The values of `keys` in `config` (missing and `None` ones left out), `image_mean` and
/// `image_std` lists as floats.
pub fn hf_only(config: &[(String, Raw)], keys: &[&str]) -> RawMap {
    let mut out = RawMap::new();
    for &key in keys {
        let Some(value) = hf_get(config, key) else {
            continue;
        };
        let value = match (key, value) {
            ("image_mean" | "image_std", Raw::List(items)) => floats(items)
                .map(|v| Raw::List(v.into_iter().map(Raw::Float).collect()))
                .unwrap_or_else(|| value.clone()),
            _ => value.clone(),
        };
        out.push((key.to_owned(), value));
    }
    out
}

/// `[float(v) for v in items]`, when each converts (anything else is left for the processor to
/// reject).
fn floats(items: &[Raw]) -> Option<Vec<f64>> {
    items
        .iter()
        .map(|v| match v {
            Raw::Bool(b) => Some(f64::from(u8::from(*b))),
            Raw::Int(i) => Some(*i as f64),
            Raw::Float(f) => Some(*f),
            Raw::Str(s) => s.trim().parse().ok(),
            _ => None,
        })
        .collect()
}

/// The [`HF_COMMON`] keys and `own`, then `size` as `get_size_dict` reads it (`square`: the
/// class's `default_to_square`, an int is a square rather than a shortest edge).
pub fn hf_keys(config: &[(String, Raw)], own: &[&str], square: bool) -> Result<RawMap, BadSize> {
    let keys: Vec<&str> = HF_COMMON.iter().chain(own).copied().collect();
    let mut out = hf_only(config, &keys);
    if let Some(size) = hf_get(config, "size") {
        hf_put(&mut out, "size", Raw::Map(hf_size(size, square)?));
    }
    Ok(out)
}

/// A size as `get_size_dict` reads it: a dict (its `None` entries dropped), an int (a square
/// when `square`, else a shortest edge) or a `[height, width]` pair.
pub fn hf_size(value: &Raw, square: bool) -> Result<RawMap, BadSize> {
    match value {
        Raw::Map(entries) => Ok(entries
            .iter()
            .filter(|(_, v)| *v != Raw::None)
            .cloned()
            .collect()),
        v if v.is_int() => Ok(if square {
            vec![("height".into(), v.clone()), ("width".into(), v.clone())]
        } else {
            vec![("shortest_edge".into(), v.clone())]
        }),
        Raw::List(pair) if pair.len() == 2 => Ok(vec![
            ("height".into(), pair[0].clone()),
            ("width".into(), pair[1].clone()),
        ]),
        _ => Err(BadSize(value.clone())),
    }
}

/// [`hf_keys`] and the CLIP-like families' `crop_size` (an int is a square). (Their
/// `image_grid_pinpoints` pairs are lists already: a [`Raw::List`] holds tuples too.)
pub fn hf_clip_like(
    config: &[(String, Raw)],
    own: &[&str],
    square: bool,
) -> Result<RawMap, BadSize> {
    let mut out = hf_keys(config, own, square)?;
    if let Some(crop) = hf_get(config, "crop_size") {
        hf_put(&mut out, "crop_size", Raw::Map(hf_size(crop, true)?));
    }
    Ok(out)
}

/// `pad_size` when `config` has the key (`None` included: no fixed pad size).
pub fn hf_pad_size(config: &[(String, Raw)], out: &mut RawMap) -> Result<(), BadSize> {
    if let Some((_, pad)) = config.iter().find(|(k, _)| k == "pad_size") {
        let value = match pad {
            Raw::None => Raw::None,
            pad => Raw::Map(hf_size(pad, true)?),
        };
        hf_put(out, "pad_size", value);
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
