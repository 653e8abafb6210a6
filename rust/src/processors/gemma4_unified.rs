//! Gemma 4 unified (`Gemma4UnifiedImageProcessor`, transformers 5.24's torchvision backend;
//! there is no PIL class): Gemma 4's resize target ([`super::gemma4::target_size`]), reached
//! with torch's antialiased `uint8` resize (`tvF.resize`, BICUBIC by default), then the
//! torchvision backend's rescale (`uint8 × rescale_factor` in `float32`) and the teacher
//! patches of `patch_size` merged `k × k` (`k = pooling_kernel_size`, `patches_merge`) into one
//! token each:
//!
//! `pixel_values` `(B, max_soft_tokens, (k · patch_size)² · 3)` float32, `image_position_ids`
//! `(B, max_soft_tokens, 2)` int64, `num_soft_tokens_per_image` `(B,)` int64.
//!
//! `patches_merge` orders the teacher patches kernel by kernel (row-major over the kernels,
//! row-major within one), then lays each group of `k²` out as `(k, p, k, q, c)`: that is the
//! `(k·p) × (k·p)` block of the image under the kernel, row by row, channels-last. So a merged
//! patch is a Gemma 4 patch of side `k · patch_size` ([`super::gemma4::plan_patches`]); its
//! position is the kernel's `(x, y)` (the minimum of its teacher positions divided by `k`),
//! `(-1, -1)` for the padding up to `max_soft_tokens`.
//!
//! The normalisation is a table per channel and `u8` value in torch's dtypes: rescale only
//! (the default) is `f32(x) · f32(rescale_factor)` (a `uint8` tensor times a Python float);
//! with `do_normalize` the backend's fused form ([`tb::fused_f32_table`]).
//!
//! Not reproduced, refused: a resample torch's `uint8` ports do not cover (only BILINEAR and
//! BICUBIC), neither rescale nor normalize (transformers then returns `uint8` values), and
//! with `do_resize` off, an image whose sides are not multiples of `k · patch_size` (the
//! kernel grouping of `patches_merge` needs whole kernels) or that has more than
//! `max_soft_tokens` kernels. Videos (`Gemma4UnifiedVideoProcessor`) are not reproduced.

use super::family::{FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens};
use super::gemma4::{self, plan_patches, target_size, Gemma4Config, Lut, GEMMA4};
use super::normalize::Normalize;
use super::pending::{self, Pending};
use super::torch_backend::{self as tb};
use super::value::{Common, Value};
use super::{check_side, prepare_all, Input, Options, Outputs, ProcessorError, Rgb};

/// Gemma 4 unified: `Gemma4UnifiedImageProcessor`, with Gemma 4's keys (`size` unused;
/// `patch_size`, `max_soft_tokens`, `pooling_kernel_size`).
pub const GEMMA4_UNIFIED: Hf = Hf {
    image_classes: &["Gemma4UnifiedImageProcessor"],
    video_classes: &[],
    normalise: GEMMA4.normalise,
    // Gemma4UnifiedProcessor's `image_seq_length` changes no count: each image's is computed.
    processor_keys: &[],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The `config.json` model type (its image processor class names the family too).
pub const MODEL_TYPES: &[(&str, &str)] = &[("gemma4_unified", "gemma4_unified")];

/// The configuration of Gemma 4 unified: Gemma 4's keys, read the same way.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4UnifiedConfig(pub Gemma4Config);

impl Gemma4UnifiedConfig {
    /// `Gemma4UnifiedImageProcessor`'s class defaults, Gemma 4's: BICUBIC, rescale 1/255
    /// without normalization, patch 16, 280 soft tokens, pooling kernel 3.
    pub fn gemma4_unified() -> Self {
        Gemma4UnifiedConfig(Gemma4Config::gemma4())
    }
}

impl FamilyConfig for Gemma4UnifiedConfig {
    fn common(&self) -> &Common {
        &self.0.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.0.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        self.0.set(key, value)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        self.0.entries()
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        self.0.validate()?;
        validate(&self.0)
    }

    pending::planned_images!(plan);

    /// `Gemma4UnifiedProcessor`: `num_soft_tokens_per_image` soft tokens per image.
    fn image_tokens(&self, outputs: &Outputs, vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        self.0.image_tokens(outputs, vision)
    }

    /// Gemma 4's tokens (Gemma4UnifiedConfig has the same default ids).
    fn replacement_spec(&self) -> Option<ReplacementSpec> {
        Some(gemma4::REPLACEMENT)
    }

    /// `Gemma4UnifiedProcessor.replace_image_token`, Gemma 4's rule:
    /// `boi + image_token × n + eoi`.
    fn prompt_replacement(
        &self,
        grid: &[i64],
        ids: &TokenIds<'_>,
    ) -> Option<Result<Replacement, ProcessorError>> {
        Some(gemma4::prompt_replacement(&self.0, grid, ids))
    }
}

/// What the torch port covers (see the module docs).
pub fn validate(config: &Gemma4Config) -> Result<(), ProcessorError> {
    let common = &config.common;
    if tb::filter_of(common.resample).is_none() {
        return Err(ProcessorError::config(
            "resample",
            "BILINEAR (2) or BICUBIC (3): the torch uint8 kernels ported",
            common.resample.pil_id(),
        ));
    }
    if !common.do_rescale && !common.do_normalize {
        return Err(ProcessorError::config(
            "do_rescale",
            "true, or do_normalize true (without either transformers returns uint8 values, \
             which are not reproduced)",
            false,
        ));
    }
    if common.do_normalize && common.image_std.contains(&0.0) {
        return Err(ProcessorError::config(
            "image_std",
            "non-zero values",
            common.image_std,
        ));
    }
    Ok(())
}

/// The rescale/normalize of the torchvision backend per channel and `u8` value.
fn table(config: &Gemma4Config) -> Lut {
    let common = &config.common;
    if common.do_normalize {
        let factor = if common.do_rescale {
            common.rescale_factor
        } else {
            1.0
        };
        tb::fused_f32_table(factor, common.image_mean, common.image_std)
    } else {
        // `image * scale`: a uint8 tensor times a Python float is a float32 product of
        // f32(x) and f32(scale).
        let scale = common.rescale_factor as f32;
        std::array::from_fn(|_| std::array::from_fn(|v| v as f32 * scale))
    }
}

/// [`table`]'s values as the fused formula computes them 16 at a time, kept only where it
/// reproduces the table ([`Normalize::from_formula`]). With normalization, the torch formula's
/// constants. Rescale alone is `f32(x) · f32(scale)`: the formula with the factor `f32(scale)`
/// (whose low part is then 0, so its `x·hi + x·lo` is that one rounded product) and mean 0, std
/// 1 (which leave it as it is).
fn formula_of(config: &Gemma4Config, lut: &Lut) -> Normalize {
    let common = &config.common;
    if !common.do_normalize {
        let scale = f64::from(common.rescale_factor as f32);
        return Normalize::from_formula(*lut, scale, [0.0; 3], [1.0; 3]);
    }
    let factor = if common.do_rescale {
        common.rescale_factor
    } else {
        1.0
    };
    Normalize::from_formula(*lut, factor, common.image_mean, common.image_std)
}

/// One image, resized with torch's kernel (or as it is, with `do_resize` off: then whole
/// kernels, at most `max_soft_tokens` of them).
fn prepare<'a>(
    config: &Gemma4Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    let side = config.pooling_kernel_size * config.patch_size;
    let rgb = if config.common.do_resize {
        let (h, w) = target_size(
            rgb.height,
            rgb.width,
            config.patch_size,
            config.max_patches(),
            config.pooling_kernel_size,
        )?;
        check_side("resized image", h, w)?;
        let filter = tb::filter_of(config.common.resample)
            .unwrap_or(crate::image::torch::TorchFilter::Bicubic);
        tb::resize(rgb, h, w, filter, threads)?
    } else {
        rgb
    };
    if rgb.height % side != 0 || rgb.width % side != 0 {
        return Err(ProcessorError::shape(
            "image",
            format!(
                "sides divisible by pooling_kernel_size * patch_size = {side} (do_resize is off)"
            ),
            format!("{}x{} (HxW)", rgb.height, rgb.width),
        ));
    }
    let kernels = (rgb.height / side) * (rgb.width / side);
    if kernels > config.max_soft_tokens {
        return Err(ProcessorError::shape(
            "image",
            format!(
                "at most max_soft_tokens = {} merged patches (do_resize is off)",
                config.max_soft_tokens
            ),
            format!(
                "{kernels} merged patches of a {}x{} image",
                rgb.height, rgb.width
            ),
        ));
    }
    Ok(rgb)
}

/// Gemma 4 unified on a batch (see the module docs): `pixel_values` planned (its own table of
/// values stands in for `normalize`).
fn plan<'a>(
    Gemma4UnifiedConfig(config): &Gemma4UnifiedConfig,
    _normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let lut = table(config);
    plan_patches(
        prepared,
        config.pooling_kernel_size * config.patch_size,
        config.max_soft_tokens,
        1,
        (&lut, gemma4::wide_of(&formula_of(config, &lut))),
        options,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::value::Value;
    use crate::processors::{Family, Preprocessor, TensorData};

    /// `patches_merge` of the teacher patches, written out as transformers computes it (sort
    /// by kernel order, then `(l, k, p, k, q, c)`), against the merged patches.
    #[test]
    fn merged_patches_are_the_kernel_blocks() {
        let (h, w, p, k) = (96, 144, 16, 3);
        let data: Vec<u8> = (0..h * w * 3).map(|i| ((i * 7) % 253) as u8).collect();
        let input = Input::Pixels {
            data: &data,
            width: w,
            height: h,
            channels: 3,
        };
        let entries = [
            ("max_soft_tokens".to_owned(), Value::Int(70)),
            ("do_resize".to_owned(), Value::Bool(false)),
        ];
        let pre = Preprocessor::new(Family::Gemma4Unified, &entries).unwrap();
        let out = pre.images(&[input], &Options::default()).unwrap();
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [1, 70, 48 * 48 * 3]);
        let TensorData::F32(values) = &pv.data else {
            panic!("f32 expected");
        };
        let (ph, pw) = (h / p, w / p);
        // Teacher patches, row-major, each (py, px, c).
        let teacher = |gy: usize, gx: usize| -> Vec<u8> {
            let mut v = Vec::new();
            for py in 0..p {
                for px in 0..p {
                    for c in 0..3 {
                        v.push(data[((gy * p + py) * w + gx * p + px) * 3 + c]);
                    }
                }
            }
            v
        };
        // Kernel order: target = wx + wy·k + k²·kx + k·pw·ky; sorted.
        let mut order: Vec<(usize, usize, usize)> = (0..ph)
            .flat_map(|gy| (0..pw).map(move |gx| (gy, gx)))
            .map(|(gy, gx)| {
                let t = gx % k + (gy % k) * k + k * k * (gx / k) + k * pw * (gy / k);
                (t, gy, gx)
            })
            .collect();
        order.sort();
        let length = ph * pw / (k * k);
        for l in 0..length {
            let group: Vec<Vec<u8>> = order[l * k * k..(l + 1) * k * k]
                .iter()
                .map(|&(_, gy, gx)| teacher(gy, gx))
                .collect();
            let mut want = Vec::new();
            for a in 0..k {
                for py in 0..p {
                    for b in 0..k {
                        for px in 0..p {
                            for c in 0..3 {
                                want.push(group[a * k + b][(py * p + px) * 3 + c]);
                            }
                        }
                    }
                }
            }
            let got = &values[l * want.len()..(l + 1) * want.len()];
            for (g, &v) in got.iter().zip(&want) {
                assert_eq!(*g, v as f32 * (1.0f64 / 255.0) as f32);
            }
        }
        assert!(values[length * 6912..].iter().all(|&v| v == 0.0));
        let ids = out.get("image_position_ids").unwrap();
        let TensorData::I64(ids) = &ids.data else {
            panic!("i64 expected");
        };
        assert_eq!(&ids[..8], &[0, 0, 1, 0, 2, 0, 0, 1]);
        assert!(ids[2 * length..].iter().all(|&v| v == -1));
        assert_eq!(
            out.get("num_soft_tokens_per_image").unwrap().data,
            TensorData::I64(vec![6])
        );
    }

    #[test]
    fn refusals() {
        for (key, bad) in [
            ("resample", Value::Int(0)),
            ("max_soft_tokens", Value::Int(100)),
        ] {
            let err =
                Preprocessor::new(Family::Gemma4Unified, &[(key.to_owned(), bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("config {key}:")),
                "{err}"
            );
        }
        let off = [
            ("do_rescale".to_owned(), Value::Bool(false)),
            ("do_normalize".to_owned(), Value::Bool(false)),
        ];
        let err = Preprocessor::new(Family::Gemma4Unified, &off).unwrap_err();
        assert!(err.to_string().contains("do_rescale"), "{err}");
        // do_resize off: whole 48-pixel kernels only.
        let data = vec![0u8; 32 * 48 * 3];
        let input = Input::Pixels {
            data: &data,
            width: 48,
            height: 32,
            channels: 3,
        };
        let entries = [("do_resize".to_owned(), Value::Bool(false))];
        let pre = Preprocessor::new(Family::Gemma4Unified, &entries).unwrap();
        let err = pre.images(&[input], &Options::default()).unwrap_err();
        assert!(err.to_string().contains("48"), "{err}");
    }

    /// The table's formula is kept for the AVX-512 patch writer where it reproduces the table:
    /// always for the default rescale (`f32(x) · f32(scale)`, one rounded product), and never
    /// where it does not (`from_formula` checks every input).
    #[test]
    fn the_formula_is_kept_only_where_it_is_the_table() {
        let Gemma4UnifiedConfig(mut config) = Gemma4UnifiedConfig::gemma4_unified();
        let lut = table(&config);
        let formula = formula_of(&config, &lut);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            formula.wide().is_some(),
            crate::processors::normalize::avx512::available(),
            "the default rescale's formula was not kept"
        );
        for v in 0..=255u8 {
            assert_eq!(
                formula.value(1, v).to_bits(),
                lut[1][usize::from(v)].to_bits()
            );
        }
        config.common.do_normalize = true;
        config.common.image_mean = [0.5, 0.25, 0.125];
        config.common.image_std = [0.5, 2.0, 0.3];
        let lut = table(&config);
        let formula = formula_of(&config, &lut);
        #[cfg(target_arch = "x86_64")]
        if formula.wide().is_some() {
            let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
            let mut out = vec![0f32; all.len()];
            for (c, table) in lut.iter().enumerate() {
                formula.channel_into(&all, c, &mut out[..256]);
                for (v, (got, want)) in out.iter().zip(table).enumerate() {
                    assert_eq!(got.to_bits(), want.to_bits(), "c {c}, v {v}");
                }
            }
        }
    }
}
