//! Kimi-K2.5 (`Kimi_K25ImageProcessor`, transformers' torchvision backend; there is no PIL
//! class): MoonViT's NaViT patching, reproduced bit for bit as torch computes it on CPU.
//!
//! Each image is scaled by [`navit_resize`]'s factor (a budget of `max_patches` patches and of
//! `size["max_height"]` patches per side, never enlarged), resized with torch's antialiased
//! `uint8` kernel (`resample`, BICUBIC by default: the port in [`crate::image::torch`]), then
//! padded at the bottom and right with `0` bytes (`TorchvisionBackend.pad`'s `fill_value`) to a
//! multiple of `merge_size · patch_size`. The torchvision backend's fused rescale + normalize
//! (`(f32(x) − mean') / std'` with `mean' = f32(mean) · f32(1 / rescale_factor)`) is one table
//! of 3 × 256 values ([`super::torch_backend::fused_f32_table`]), evaluated sixteen values at
//! a time by [`Affine`] (its kernel checked against the table when built), each patch written
//! once with the padding's `0` bytes normalised like the pixels.
//!
//! Outputs: `pixel_values` `(Σ h·w, 3, patch_size, patch_size)` float32, each image's patches
//! in row-major grid order (no merge-window reordering: `Kimi_K25ImageProcessor.patchify`),
//! and `image_grid_thw` `(B, 3)` int64, `[1, h, w]` per image. `Kimi_K25Processor` writes
//! `h · w / merge_size²` `<|media_pad|>` per image (`replace_image_token`), inside the
//! `<|media_begin|>image<|media_content|>` … `<|media_end|>` its chat template writes.
//!
//! Videos are not reproduced (`Kimi_K25VideoProcessor` cuts frames into chunks of
//! `temporal_patch_size` whose prompt interleaves timestamp text with the media markers).

use super::family::{FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::torch_backend::{self as tb, fused_f32_table};
use super::torch_simd::Affine;
use super::value::{as_count, hf_get, hf_keys, hf_put, BadSize, Common, Raw, RawMap, Value, HALF};
use super::{
    checked_len, parallel, prepare_all, Input, Options, Out, OutBuffer, Outputs, ProcessorError,
    Rgb, Tensor, TensorData,
};

/// Kimi-K2.5: `Kimi_K25ImageProcessor`; `Kimi_K25Config.image_token_id` (`<|media_pad|>`, the
/// published checkpoints' `media_placeholder_token_id`).
pub const KIMI_K25: Hf = Hf {
    image_classes: &["Kimi_K25ImageProcessor"],
    video_classes: &[],
    normalise: hf_kimi,
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published {
        image: 163_605,
        video: None,
        vision_tokens: None,
    }),
    count_tensor: None,
};

/// The `config.json` `model_type` that names the family when its preprocessor file does not
/// (the published checkpoints' file names only remote code). Kimi-K3 (`kimi_k3`) is not an
/// alias: its pipeline composites transparent pixels over a chessboard and its prompt wraps
/// each image with its size, neither of which this family reproduces.
pub const MODEL_TYPES: &[(&str, &str)] = &[("kimi_k25", "kimi_k25")];

const OWN_KEYS: [&str; 3] = ["max_patches", "patch_size", "merge_size"];

/// The keys of the hub checkpoints' nested `media_proc_cfg` (read by their remote-code
/// processor and the SMG gateway) and the transformers keys they stand for.
const MEDIA_KEYS: [(&str, &str); 5] = [
    ("in_patch_limit", "max_patches"),
    ("patch_size", "patch_size"),
    ("merge_kernel_size", "merge_size"),
    ("image_mean", "image_mean"),
    ("image_std", "image_std"),
];

/// `media_proc_cfg` settings that change the pipeline itself (Kimi-K3's transparent
/// background; a fixed token count): passed on when set, for [`KimiConfig::set`] to refuse.
const MEDIA_REFUSED: [&str; 2] = ["transparent_bg_config", "fixed_output_tokens"];

/// The transformers keys (the shared ones, `max_patches`, `patch_size`, `merge_size`, `size`
/// as a dict), then — for a key the file does not set at the top level — the hub checkpoints'
/// `media_proc_cfg` values (`in_patch_limit`, `patch_limit_on_one_side` as
/// `size = {max_height, max_width}`, `merge_kernel_size`, …). transformers 5.24 ignores
/// `media_proc_cfg`; the published values are its class defaults, so both read the published
/// file alike.
fn hf_kimi(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    let mut out = hf_keys(config, &OWN_KEYS, true)?;
    let Some(Raw::Map(media)) = hf_get(config, "media_proc_cfg") else {
        return Ok(out);
    };
    for (from, to) in MEDIA_KEYS {
        if hf_get(&out, to).is_none() {
            if let Some(value) = hf_get(media, from) {
                let value = super::value::hf_only(&[(to.to_owned(), value.clone())], &[to]);
                out.extend(value);
            }
        }
    }
    if hf_get(&out, "size").is_none() {
        if let Some(side) = hf_get(media, "patch_limit_on_one_side") {
            let size = vec![
                ("max_height".to_owned(), side.clone()),
                ("max_width".to_owned(), side.clone()),
            ];
            hf_put(&mut out, "size", Raw::Map(size));
        }
    }
    for key in MEDIA_REFUSED {
        if let Some(value) = hf_get(media, key) {
            // A dict (Kimi-K3's chessboard settings) is no configuration value: named only.
            let value = match value {
                Raw::Map(_) | Raw::List(_) | Raw::Other { .. } => Raw::Str("set".to_owned()),
                value => value.clone(),
            };
            hf_put(&mut out, key, value);
        }
    }
    Ok(out)
}

/// The configuration of Kimi-K2.5.
#[derive(Clone, Debug, PartialEq)]
pub struct KimiConfig {
    pub common: Common,
    pub patch_size: usize,
    pub merge_size: usize,
    /// The patch budget of an image (`max_patches`).
    pub max_patches: usize,
    /// `size["max_height"]` (= `size["max_width"]`): at most this many patches per side.
    pub max_side: usize,
}

/// Ours: a bound keeping `max_side · patch_size` and the budgets far inside `usize`/`f64`.
const MAX_COUNT: usize = 1 << 24;

impl KimiConfig {
    /// `Kimi_K25ImageProcessor`'s defaults (also the published checkpoints' `media_proc_cfg`):
    /// patch 14, merge 2, 16 384 patches, 512 patches a side, BICUBIC, mean/std 0.5.
    pub fn kimi_k25() -> Self {
        KimiConfig {
            common: Common::new(HALF, HALF),
            patch_size: 14,
            merge_size: 2,
            max_patches: 16_384,
            max_side: 512,
        }
    }

    /// The resized size and the padded canvas `((h, w), (H, W))` of an image of
    /// `height × width` ([`navit_resize`]), or the image's own size unpadded with `do_resize`
    /// off.
    pub fn layout(&self, height: usize, width: usize) -> ((usize, usize), (usize, usize)) {
        if !self.common.do_resize {
            return ((height, width), (height, width));
        }
        navit_resize(
            height,
            width,
            self.patch_size,
            self.merge_size,
            self.max_patches,
            self.max_side,
        )
    }
}

/// transformers' `navit_resize` with Python's arithmetic: the patch counts `max(1, side //
/// patch)`, scales `sqrt(max_patches / count)` and `max_side · patch / side` (true divisions,
/// correctly rounded in `f64` like Python's), at most 1; each side `max(1, int(side · scale))`
/// capped at `max_side · patch`, then padded up to a multiple of `merge · patch`.
pub fn navit_resize(
    height: usize,
    width: usize,
    patch_size: usize,
    merge_size: usize,
    max_patches: usize,
    max_side: usize,
) -> ((usize, usize), (usize, usize)) {
    let patches_h = (height / patch_size).max(1) as f64;
    let patches_w = (width / patch_size).max(1) as f64;
    let total = (max_patches as f64 / (patches_h * patches_w)).sqrt();
    let limit = max_side * patch_size;
    let per_h = limit as f64 / height as f64;
    let per_w = limit as f64 / width as f64;
    let scale = 1.0f64.min(total).min(per_h).min(per_w);
    let side = |v: usize| (((v as f64 * scale) as usize).max(1)).min(limit);
    let (new_h, new_w) = (side(height), side(width));
    let factor = patch_size * merge_size;
    let pad = |v: usize| v.div_ceil(factor) * factor;
    ((new_h, new_w), (pad(new_h), pad(new_w)))
}

/// The same fused rescale + normalize as an [`Affine`] (`(f32(x) − mean') / std'`, its
/// vector kernel checked against [`fused_f32_table`]) for the patches inside the image.
fn torch_affine(common: &Common) -> Affine {
    let inverse = (1.0 / common.rescale_factor) as f32;
    let scaled = |v: [f64; 3]| v.map(|x| x as f32 * inverse);
    Affine::new(
        fused_f32_table(common.rescale_factor, common.image_mean, common.image_std),
        scaled(common.image_mean),
        scaled(common.image_std),
    )
}

impl FamilyConfig for KimiConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size" => self.patch_size = as_count("patch_size", value, 1 << 12)?,
            "merge_size" => self.merge_size = as_count("merge_size", value, 1 << 12)?,
            "max_patches" => self.max_patches = as_count("max_patches", value, MAX_COUNT)?,
            "size" => {
                let get = |k: &str| match value {
                    Value::Map(entries) => entries.iter().find(|(n, _)| n == k).map(|&(_, v)| v),
                    _ => None,
                };
                let keys_ok = matches!(value, Value::Map(e) if e.len() == 2);
                match (keys_ok, get("max_height"), get("max_width")) {
                    (true, Some(h), Some(w)) if h == w => {
                        self.max_side = as_count("size", &Value::Int(h), MAX_COUNT)?;
                    }
                    _ => {
                        return Err(ProcessorError::config(
                            "size",
                            "a dict with keys max_height and max_width of identical values \
                             (patches per side)",
                            value,
                        ))
                    }
                }
            }
            "transparent_bg_config" | "fixed_output_tokens" => {
                return Err(ProcessorError::config(
                    if key == "transparent_bg_config" {
                        "media_proc_cfg.transparent_bg_config"
                    } else {
                        "media_proc_cfg.fixed_output_tokens"
                    },
                    "unset (Kimi-K2.5's pipeline; a transparent-background fill or a fixed \
                     token count is not reproduced)",
                    value,
                ));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let side = self.max_side as i64;
        vec![
            (
                "size",
                Value::Map(vec![
                    ("max_height".to_owned(), side),
                    ("max_width".to_owned(), side),
                ]),
            ),
            ("max_patches", Value::Int(self.max_patches as i64)),
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("merge_size", Value::Int(self.merge_size as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        if self.max_side.saturating_mul(self.patch_size) > super::MAX_SIDE {
            return Err(ProcessorError::config(
                "size",
                format!("max_height · patch_size at most {} pixels", super::MAX_SIDE),
                self.max_side * self.patch_size,
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

    /// `h · w / merge_size²` per image (`image_grid_thw`), as `Kimi_K25Processor` writes
    /// `<|media_pad|>` (`prod // merge_length`, floored: a grid is a multiple of the merge
    /// size unless `do_resize` is off).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let grid = super::family::i64_values(outputs, "image_grid_thw")?;
        let merge = (self.merge_size * self.merge_size) as i64;
        Some(
            grid.chunks_exact(3)
                .map(|g| g[0] * g[1] * g[2] / merge)
                .collect(),
        )
    }
}

/// One image resized (not yet padded: the pad is written on the fly) and its canvas.
struct Prepared<'a> {
    image: Rgb<'a>,
    /// The padded canvas `(H, W)`, multiples of the patch size.
    canvas: (usize, usize),
}

fn prepare<'a>(
    config: &KimiConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let (h, w) = (rgb.height, rgb.width);
    let ((new_h, new_w), canvas) = config.layout(h, w);
    let p = config.patch_size;
    if !config.common.do_resize && (h % p != 0 || w % p != 0) {
        // transformers' `patchify` fails to reshape such an image.
        return Err(ProcessorError::shape(
            "image",
            format!("sides that are multiples of patch_size {p} (do_resize is off)"),
            format!("{h}x{w} (HxW)"),
        ));
    }
    let filter =
        tb::filter_of(config.common.resample).unwrap_or(crate::image::torch::TorchFilter::Bicubic);
    let image = tb::resize(rgb, new_h, new_w, filter, threads)?;
    super::check_side("padded image", canvas.0, canvas.1)?;
    Ok(Prepared { image, canvas })
}

/// Kimi-K2.5 on a batch (see the module docs).
pub fn images(
    config: &KimiConfig,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let ps = config.patch_size;
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let per_patch = 3 * ps * ps;
    let grids: Vec<(usize, usize)> = prepared
        .iter()
        .map(|p| (p.canvas.0 / ps, p.canvas.1 / ps))
        .collect();
    let patches: usize = grids.iter().map(|&(h, w)| h * w).sum();
    let len = checked_len("pixel_values", &[patches, 3, ps, ps], 4)?;
    let mut buffer = OutBuffer::new("pixel_values", len)?;
    // One job per row of patches of each image.
    let lengths: Vec<usize> = grids
        .iter()
        .flat_map(|&(h, w)| std::iter::repeat_n(w * per_patch, h))
        .collect();
    let mut slices = buffer.slices(&lengths).into_iter();
    let mut jobs = Vec::with_capacity(lengths.len());
    for (p, &(grid_h, _)) in prepared.iter().zip(&grids) {
        for row in 0..grid_h {
            if let Some(out) = slices.next() {
                jobs.push((p, row, out));
            }
        }
    }
    let workers = parallel::writers(options.threads, jobs.len(), 4 * len);
    let affine = torch_affine(&config.common);
    parallel::map(jobs, workers, |_, (p, row, out)| {
        write_patch_row(&affine, p, ps, row, out);
    });
    // SAFETY: the slices cover the whole buffer (their lengths sum to `len`: `grid_h` rows of
    // `grid_w · 3 · ps²` values per image), and `write_patch_row` writes every value of its
    // slice (the image's pixels and the padding both).
    let values = unsafe { buffer.finish() };
    let grid: Vec<i64> = grids
        .iter()
        .flat_map(|&(h, w)| [1, h as i64, w as i64])
        .collect();
    super::recycle_images(prepared.into_iter().map(|p| p.image));
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![patches, 3, ps, ps],
                    data: TensorData::F32(values),
                },
            ),
            ("image_grid_thw", Tensor::i64(vec![grids.len(), 3], grid)),
        ],
    })
}

/// Patch row `row` of an image (its `grid_w` patches, each `3 × ps × ps` channels-first) into
/// `out`: the image's pixels normalised, the zero padding right and below as the normalised
/// `0`.
fn write_patch_row(affine: &Affine, p: &Prepared<'_>, ps: usize, row: usize, out: &mut [Out]) {
    let image = p.image.view();
    let plane = ps * ps;
    let top = row * ps;
    let rows_in = image.height.saturating_sub(top).min(ps);
    let per_patch = 3 * plane;
    // The next patch's lines asked for while this one is computed
    // (`store::prefetch_for_write`): a large output's stores then do not wait for memory one
    // line at a time (`xmp_test`, 26 MB: a call 2.7–3.1 → 1.7–2.0 ms).
    let (start, bytes) = (out.as_ptr().cast::<u8>(), size_of_val(out));
    let patch_bytes = per_patch * size_of::<Out>();
    for (j, patch) in out.chunks_exact_mut(per_patch).enumerate() {
        let ahead = (j + 1) * patch_bytes;
        if ahead < bytes {
            super::store::prefetch_for_write(start.wrapping_add(ahead), patch_bytes);
        }
        let left = j * ps;
        let cols_in = image.width.saturating_sub(left).min(ps);
        // The pad's 0 bytes go through the same normalisation as the pixels.
        let pixels = if rows_in > 0 && cols_in > 0 {
            &image.data[(top * image.width + left) * 3..]
        } else {
            &[]
        };
        affine.write_padded_patch_chw(pixels, image.width * 3, ps, (rows_in, cols_in), patch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_transformers() {
        // transformers 5.24 navit_resize(h, w, 14, 2, 16384, 512).
        let r = |h, w| navit_resize(h, w, 14, 2, 16_384, 512);
        assert_eq!(r(1, 1), ((1, 1), (28, 28)));
        assert_eq!(r(400, 600), ((400, 600), (420, 616)));
        assert_eq!(r(3000, 4000), ((1554, 2073), (1568, 2100)));
        assert_eq!(r(4032, 3024), ((2069, 1551), (2072, 1568)));
        assert_eq!(r(20000, 1), ((7168, 1), (7168, 28)));
        assert_eq!(r(1, 20000), ((1, 7168), (28, 7168)));
        assert_eq!(r(100, 100), ((100, 100), (112, 112)));
    }

    #[test]
    fn tokens_are_the_merged_grid() {
        let config = KimiConfig::kimi_k25();
        let outputs = Outputs {
            tensors: vec![(
                "image_grid_thw",
                Tensor::i64(vec![2, 3], vec![1, 30, 44, 1, 2, 2]),
            )],
        };
        assert_eq!(config.image_tokens(&outputs, None), Some(vec![330, 1]));
    }
}
