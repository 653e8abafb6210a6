//! Nemotron-H-Omni (`NemotronH_Omni_Reasoning_V3ImageProcessor`, transformers 5.24; torchvision
//! only): each image is resized to a grid of `patch_size` patches chosen by [`patch_grid`]
//! within a per-call patch budget ([`patch_budget`]), **in `float32`** (torch's antialiased
//! float kernel, [`crate::image::torch_aa`]: the bicubic overshoot is kept, not clamped), then
//! rescaled and normalised by the torchvision backend's fused `(x − 255·mean) / (255·std)` in
//! `float32`, and cut into patches:
//!
//! - `pixel_values` `(Σ h·w, 3·p²)` float32: each image's patches in row-major order, each laid
//!   out channel-major `(c, y, x)`, the images one after another;
//! - `image_grid_hw` `(n, 2)` int64: each image's patch grid `(h, w)`.
//!
//! An image whose size is already the grid's is not resized. `NemotronH_Omni_Reasoning_V3Processor`
//! writes `<img>` + `<image>` × `h·w / merge²` + `</img>` per image (`merge = round(1 /
//! downsample_ratio)`). Videos and audio are not reproduced.

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::torch_backend::{check_torch_steps, filter_of};
use super::value::{as_count, as_float, hf_only, Common, Value, HF_COMMON};
use super::{
    check_image, checked_len, parallel, prepare_all, store, Input, Options, Out, OutBuffer,
    Outputs, ProcessorError, Rgb, Tensor, TensorData,
};
use crate::image::torch::TorchFilter;
use crate::image::torch_aa;
use crate::memory::fallible;

/// `OPENAI_CLIP_MEAN` / `OPENAI_CLIP_STD`, the class defaults.
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// Nemotron-H-Omni: `NemotronH_Omni_Reasoning_V3ImageProcessor`. Its `__init__` reads the
/// released checkpoints' `norm_mean` / `norm_std` as `image_mean` / `image_std` when those are
/// absent, and drops `_downsample_factor`.
pub const NEMOTRON_H_OMNI: Hf = Hf {
    image_classes: &["NemotronH_Omni_Reasoning_V3ImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        let keys: Vec<&str> = HF_COMMON.iter().chain(OWN_KEYS).copied().collect();
        let mut renamed: Vec<(String, super::value::Raw)> = config.to_vec();
        for (legacy, key) in [("norm_mean", "image_mean"), ("norm_std", "image_std")] {
            // `kwargs.setdefault(key, legacy)`: the legacy value when the key is not given at
            // all (a key given as None keeps None, the class default).
            if !config.iter().any(|(k, _)| k == key) {
                if let Some((_, v)) = config.iter().find(|(k, _)| k == legacy) {
                    if *v != super::value::Raw::None {
                        renamed.push((key.to_owned(), v.clone()));
                    }
                }
            }
        }
        Ok(hf_only(&renamed, &keys))
    },
    processor_keys: &[],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// The family's own keys.
const OWN_KEYS: &[&str] = &[
    "patch_size",
    "downsample_ratio",
    "min_num_patches",
    "max_num_patches",
    "max_model_len",
];

/// `config.json` model types: transformers' own, and the released checkpoints' remote-code
/// type, which the SMG gateway (1.13, `registry/nemotron_omni.rs`) matches.
pub const MODEL_TYPES: &[(&str, &str)] = &[
    ("nemotron_h_omni", "nemotron_h_omni"),
    ("NemotronH_Nano_Omni_Reasoning_V3", "nemotron_h_omni"),
];

/// Ours: a patch side no model approaches (transformers bounds none of these).
const MAX_PATCH: usize = 1024;
/// Ours: the largest pixel-shuffle factor `round(1 / downsample_ratio)` accepted.
const MAX_MERGE: i64 = 64;
/// Ours: patch counts and the context length, far beyond any model.
const MAX_COUNT: i64 = 1 << 40;

/// The configuration of Nemotron-H-Omni.
#[derive(Clone, Debug, PartialEq)]
pub struct NemotronConfig {
    pub common: Common,
    pub patch_size: usize,
    pub downsample_ratio: f64,
    pub min_num_patches: i64,
    /// 0 disables the cap.
    pub max_num_patches: i64,
    pub max_model_len: i64,
}

impl NemotronConfig {
    /// The class defaults: BICUBIC, CLIP mean/std, patch 16, downsample 0.5, 1 024 – 13 312
    /// patches, context 16 384.
    pub fn nemotron_h_omni() -> Self {
        NemotronConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            patch_size: 16,
            downsample_ratio: 0.5,
            min_num_patches: 1024,
            max_num_patches: 13312,
            max_model_len: 16384,
        }
    }

    /// `round(1 / downsample_ratio)` (Python's `round`: halves to even).
    pub fn merge_size(&self) -> i64 {
        (1.0 / self.downsample_ratio).round_ties_even() as i64
    }
}

/// A non-negative integer no larger than [`MAX_COUNT`].
fn as_amount(field: &'static str, value: &Value) -> Result<i64, ProcessorError> {
    match value {
        Value::Int(v) if (0..=MAX_COUNT).contains(v) => Ok(*v),
        _ => Err(ProcessorError::config(
            field,
            format!("an integer between 0 and {MAX_COUNT}"),
            value,
        )),
    }
}

impl FamilyConfig for NemotronConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size" => self.patch_size = as_count("patch_size", value, MAX_PATCH)?,
            "downsample_ratio" => {
                let ratio = as_float("downsample_ratio", value)?;
                let merge = (1.0 / ratio).round_ties_even();
                if !(ratio.is_finite() && ratio > 0.0 && (1.0..=MAX_MERGE as f64).contains(&merge))
                {
                    return Err(ProcessorError::config(
                        "downsample_ratio",
                        format!("a ratio whose round(1 / ratio) is between 1 and {MAX_MERGE}"),
                        value,
                    ));
                }
                self.downsample_ratio = ratio;
            }
            "min_num_patches" => self.min_num_patches = as_amount("min_num_patches", value)?,
            "max_num_patches" => self.max_num_patches = as_amount("max_num_patches", value)?,
            "max_model_len" => self.max_model_len = as_amount("max_model_len", value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("downsample_ratio", Value::Float(self.downsample_ratio)),
            ("min_num_patches", Value::Int(self.min_num_patches)),
            ("max_num_patches", Value::Int(self.max_num_patches)),
            ("max_model_len", Value::Int(self.max_model_len)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        // The float kernel covers BILINEAR and BICUBIC; rescale and normalize both on.
        check_torch_steps(&self.common)
    }

    fn images(
        &self,
        _normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        images(self, inputs, options)
    }

    /// `h·w / merge²` per image (`replace_image_token`).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let grid = i64_values(outputs, "image_grid_hw")?;
        let merge2 = self.merge_size() * self.merge_size();
        Some(
            grid.chunks_exact(2)
                .map(|hw| hw[0] * hw[1] / merge2)
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

/// `image_start_token`.
pub const IMG_START: &str = "<img>";
/// `image_end_token`.
pub const IMG_END: &str = "</img>";
/// `image_token`: the anchor the chat template writes once per image, and the run's token.
pub const IMAGE: &str = "<image>";

/// `NemotronH_Omni_Reasoning_V3Processor`'s tokens.
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["image_grid_hw"],
    anchor: IMAGE,
    embed: IMAGE,
    tokens: &[IMG_START, IMG_END, IMAGE],
    // The released checkpoints' ids: `<image>` 18 is config.json's `img_context_token_id`;
    // `<img>` 19 and `</img>` 20 are the Nemotron vocabulary's reserved slots `<SPECIAL_19>` /
    // `<SPECIAL_20>`, renamed in the Omni tokenizer (with `<SPECIAL_18>` -> `<image>`), as
    // NVIDIA's Megatron-Bridge Nemotron 3 Nano Omni provider (`img_start_token_id` 19,
    // `img_end_token_id` 20) and prime-rl's Nemotron-VL assembly script record; the tokenizer
    // file itself was not at hand. A caller with the model's tokenizer passes its own.
    defaults: &[(IMG_START, 19), (IMG_END, 20), (IMAGE, 18)],
    // pixel_values concatenates the images' patches, split by `patches_per_image` as the SMG
    // gateway's packed Nemotron-Omni layout sends them (smg 1.13.0, registry/nemotron_omni.rs:
    // pixel_values flat by patches_per_image, image_grid_hw batched).
    flat: &["pixel_values"],
    sizes: "patches_per_image",
    per_sample: false,
    joins: &[],
};

/// `replace_image_token`: `<img>` + `<image>` × `h·w / merge²` + `</img>`; the image tokens take
/// the embeddings; the image owns `h·w` rows of `pixel_values`.
pub fn prompt_replacement(
    config: &NemotronConfig,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let (h, w) = match grid {
        &[h, w] if h >= 1 && w >= 1 && h.checked_mul(w).is_some_and(|n| n <= MAX_COUNT) => (h, w),
        _ => {
            return Err(ProcessorError::Config {
                field: "image_grid_hw",
                expected: "one (height, width) patch grid of positive sides".to_owned(),
                actual: format!("{grid:?}"),
            })
        }
    };
    let merge2 = config.merge_size() * config.merge_size();
    let n = (h * w / merge2) as usize;
    let start = ids.get(IMG_START)?;
    let end = ids.get(IMG_END)?;
    let image = ids.get(IMAGE)?;
    Ok(Replacement::bracketed(
        start,
        image,
        n,
        end,
        (h * w) as usize,
    ))
}

/// The patches every image of a call of `images` images may use: the context length (less 4,
/// in patches before the pixel shuffle), at least `min_num_patches` per image, capped by
/// `max_num_patches` (unless 0), and never below `min_num_patches`.
pub fn patch_budget(config: &NemotronConfig, images: usize) -> i128 {
    let merge = i128::from(config.merge_size());
    let min = i128::from(config.min_num_patches);
    let mut budget =
        ((i128::from(config.max_model_len) - 4) * merge * merge).max(min * images as i128);
    if config.max_num_patches != 0 {
        budget = budget.min(i128::from(config.max_num_patches));
    }
    budget.max(min)
}

/// `get_patch_grid_size(height, width, patch, merge, min_patches, max_patches)`: the patch grid
/// `(h, w)` an image is resized to, in Python's arithmetic (`round` halves to even, `f64`
/// true division, `math.sqrt`/`floor`/`ceil`). An empty grid (the Python code divides by zero)
/// is an error.
pub fn patch_grid(
    height: usize,
    width: usize,
    patch: usize,
    merge: i128,
    min_patches: i128,
    max_patches: i128,
) -> Result<(i128, i128), ProcessorError> {
    let side = |n: usize| (n as f64 / patch as f64 + 0.5).round_ties_even() as i128;
    let (mut gh, mut gw) = (side(height), side(width));
    let empty = |gh: i128, gw: i128| {
        ProcessorError::shape(
            "patch grid",
            "a non-empty grid (transformers divides by zero)",
            format!("{gh}x{gw} patches for a {height}x{width} (HxW) image"),
        )
    };
    let factor = (max_patches as f64 / (gh * gw) as f64).sqrt().min(1.0);
    gh = (factor * gh as f64).floor() as i128;
    gw = (factor * gw as f64).floor() as i128;
    if max_patches > min_patches && gh * gw < min_patches {
        if gh * gw == 0 {
            return Err(empty(gh, gw));
        }
        let factor = (min_patches as f64 / (gh * gw) as f64).sqrt();
        gh = (factor * gh as f64).ceil() as i128;
        gw = (factor * gw as f64).ceil() as i128;
    }
    let rem = gh.rem_euclid(merge);
    if rem != 0 {
        if (gh + merge - rem) * gw <= max_patches {
            gh += merge - rem;
        } else {
            gh = merge.max(gh - rem);
        }
    }
    let rem = gw.rem_euclid(merge);
    if rem != 0 {
        if gh * (gw + merge - rem) <= max_patches {
            gw += merge - rem;
        } else {
            gw = merge.max(gw - rem);
        }
    }
    if gh <= 0 || gw <= 0 {
        return Err(empty(gh, gw));
    }
    Ok((gh, gw))
}

/// The fused rescale + normalize constants of channel `c`: `(x − m) / s` with
/// `m = f32(mean)·f32(1 / rescale_factor)`, likewise `s`.
fn fused(common: &Common, c: usize) -> (f32, f32) {
    let inverse = (1.0 / common.rescale_factor) as f32;
    (
        common.image_mean[c] as f32 * inverse,
        common.image_std[c] as f32 * inverse,
    )
}

/// One decoded image and the patch grid it is resized to.
struct Prepared<'a> {
    rgb: Rgb<'a>,
    grid: (usize, usize),
}

fn prepare<'a>(
    config: &NemotronConfig,
    budget: i128,
    rgb: Rgb<'a>,
) -> Result<Prepared<'a>, ProcessorError> {
    let patch = config.patch_size;
    let (gh, gw) = patch_grid(
        rgb.height,
        rgb.width,
        patch,
        i128::from(config.merge_size()),
        i128::from(config.min_num_patches),
        budget,
    )?;
    let too_large = |side: i128| side > (super::MAX_SIDE / patch) as i128;
    if too_large(gh) || too_large(gw) {
        return Err(ProcessorError::shape(
            "patch grid",
            format!("at most {} pixels a side", super::MAX_SIDE),
            format!("{gh}x{gw} patches of {patch}"),
        ));
    }
    let grid = (gh as usize, gw as usize);
    check_image("resized image", grid.0 * patch, grid.1 * patch)?;
    Ok(Prepared { rgb, grid })
}

/// One image resized to its grid (torch's float kernel; not at all when it has the grid's size
/// already), normalised and written as `convert_image_to_patches` lays it out: `h·w` patches of
/// `3·p²` values, each `(c, y, x)`, into `out`. Every value of `out` is written on `Ok`.
fn write_image(
    common: &Common,
    filter: TorchFilter,
    image: &Prepared<'_>,
    patch: usize,
    out: &mut [Out],
) -> Result<(), ProcessorError> {
    let (gh, gw) = image.grid;
    let (out_h, out_w) = (gh * patch, gw * patch);
    let (in_h, in_w) = (image.rgb.height, image.rgb.width);
    let data = &image.rgb.data;
    let patch_len = 3 * patch * patch;
    debug_assert_eq!(out.len(), gh * gw * patch_len);
    let wide = wide::available();
    let narrow = !wide && narrow::available();
    let consts: [(f32, f32); 3] = [fused(common, 0), fused(common, 1), fused(common, 2)];
    let fill = |r: usize, c: usize, row: &mut [f32]| {
        let src = &data[r * in_w * 3..(r + 1) * in_w * 3];
        if wide {
            // SAFETY: `wide::available()` found the features `channel` needs.
            unsafe { wide::channel(src, c, row) };
        } else if narrow {
            // SAFETY: `narrow::available()` found AVX2.
            unsafe { narrow::channel(src, c, row) };
        } else {
            channel(src, c, row);
        }
    };
    // A large output goes out one band of patches (`patch` resized rows) at a time: the band
    // is assembled in a staging buffer (it stays in the L2 cache while its rows are scattered
    // into patches) and copied out with streaming stores, whole lines straight to memory,
    // instead of each scattered 64-byte piece first reading its line in.
    let band_len = gw * patch_len;
    let stream = store::should_stream(out.len());
    let mut staging = if stream {
        fallible::uninit::<f32>(band_len).map_err(ProcessorError::oom("staging band"))?
    } else {
        Vec::new()
    };
    let emit = |y: usize, c: usize, row: &[f32]| {
        let (m, s) = consts[c];
        let (py, yy) = (y / patch, y % patch);
        let (band, first) = if stream {
            (&mut staging[..], c * patch * patch + yy * patch)
        } else {
            (&mut out[..], py * band_len + c * patch * patch + yy * patch)
        };
        if wide {
            // SAFETY: as above.
            unsafe { wide::scatter(row, m, s, patch, patch_len, first, band) };
        } else if narrow {
            // SAFETY: as above.
            unsafe { narrow::scatter(row, m, s, patch, patch_len, first, band) };
        } else {
            scatter(row, m, s, patch, patch_len, first, band);
        }
        // Output row `y` of every channel comes before row `y + 1` of any: after the last
        // channel's last row of the band, every value of the band has been written.
        if stream && c == 2 && yy == patch - 1 {
            // SAFETY: the band's 3 channels × `patch` rows × `gw` patches × `patch` values
            // were written by the scatters since the last copy (the row just emitted was the
            // band's last), which cover every position of `staging`; `MaybeUninit<f32>` has
            // the layout of `f32`.
            let values =
                unsafe { std::slice::from_raw_parts(staging.as_ptr().cast::<f32>(), band_len) };
            let dst = &mut out[py * band_len..(py + 1) * band_len];
            store::copy_bytes(store::bytes_of(dst), values, true);
        }
    };
    // The three channels together, so each input row is read, and each output row written,
    // while in cache.
    torch_aa::resize_planes(3, (in_h, in_w), (out_h, out_w), filter, fill, emit)
        .map_err(ProcessorError::oom("resized rows"))?;
    store::fence(stream);
    Ok(())
}

/// Channel `c` of a row of RGB pixels, as `f32`.
#[inline(always)]
fn channel(src: &[u8], c: usize, row: &mut [f32]) {
    for (slot, px) in row.iter_mut().zip(src.chunks_exact(3)) {
        *slot = f32::from(px[c]);
    }
}

/// One resized row of a channel, normalised (`(v − m) / s`) and laid out in patches: the
/// `patch` values of patch column `px` go to `out[first + px·stride ..]`.
#[inline(always)]
fn scatter(
    row: &[f32],
    m: f32,
    s: f32,
    patch: usize,
    stride: usize,
    first: usize,
    out: &mut [Out],
) {
    for (px, values) in row.chunks_exact(patch).enumerate() {
        let at = first + px * stride;
        for (slot, &v) in out[at..at + patch].iter_mut().zip(values) {
            slot.write((v - m) / s);
        }
    }
}

/// `wide::scatter` and `narrow::scatter`: [`scatter`] `$lanes` values at a time with one vector
/// width's broadcast, load, subtraction, division and store (the same IEEE operations as the
/// scalar code), the rest of each patch row as the scalar code; the function compiled for
/// `$features`.
#[cfg(target_arch = "x86_64")]
macro_rules! vector_scatter {
    (
        $features:literal,
        $lanes:literal,
        ($set1:ident, $load:ident, $sub:ident, $div:ident, $store:ident)
    ) => {
        /// [`super::scatter`], one vector of values at a time.
        ///
        /// # Safety
        /// The CPU must have the features this function is compiled for.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn scatter(
            row: &[f32],
            m: f32,
            s: f32,
            patch: usize,
            stride: usize,
            first: usize,
            out: &mut [Out],
        ) {
            let (mv, sv) = ($set1(m), $set1(s));
            for (px, values) in row.chunks_exact(patch).enumerate() {
                let at = first + px * stride;
                let dst = &mut out[at..at + patch];
                let mut k = 0;
                while k + $lanes <= patch {
                    // SAFETY: `values` and `dst` both have `patch ≥ k + lanes` elements;
                    // `MaybeUninit<f32>` has the layout of `f32`; the CPU has the features
                    // (this function's contract).
                    unsafe {
                        let v = $load(values.as_ptr().add(k));
                        let r = $div($sub(v, mv), sv);
                        $store(dst.as_mut_ptr().add(k).cast(), r);
                    }
                    k += $lanes;
                }
                for (slot, &v) in dst[k..].iter_mut().zip(&values[k..]) {
                    slot.write((v - m) / s);
                }
            }
        }
    };
}

/// [`channel`] and [`scatter`] with AVX-512 (16 values at a time; the same operations).
#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::Out;

    /// Whether the running CPU has AVX-512F, BW and VBMI (and they are not turned off).
    pub(super) fn available() -> bool {
        crate::simd::avx512_allowed()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    }

    /// [`super::channel`]: 16 pixels per 64-byte load, their channel-`c` bytes picked by
    /// `vpermb` and widened to `f32`.
    ///
    /// # Safety
    /// The CPU must support what [`available`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) unsafe fn channel(src: &[u8], c: usize, row: &mut [f32]) {
        let n = row.len().min(src.len() / 3);
        let mut picks = [0u8; 64];
        for (i, p) in picks.iter_mut().take(16).enumerate() {
            *p = (3 * i + c) as u8;
        }
        // SAFETY: 64 bytes.
        let picks = unsafe { _mm512_loadu_si512(picks.as_ptr().cast()) };
        let mut x = 0;
        // Loads read 64 bytes from byte 3x: within `src` while 3x + 64 ≤ src.len().
        while x + 16 <= n && 3 * x + 64 <= src.len() {
            // SAFETY: the load is within `src` (loop condition); the store writes
            // `row[x .. x + 16]`, x + 16 ≤ n ≤ row.len().
            unsafe {
                let v = _mm512_loadu_si512(src.as_ptr().add(3 * x).cast());
                let bytes = _mm512_castsi512_si128(_mm512_permutexvar_epi8(picks, v));
                let values = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
                _mm512_storeu_ps(row.as_mut_ptr().add(x), values);
            }
            x += 16;
        }
        super::channel(&src[3 * x..], c, &mut row[x..]);
    }

    vector_scatter!(
        "avx512f,avx512bw,avx512vbmi",
        16,
        (
            _mm512_set1_ps,
            _mm512_loadu_ps,
            _mm512_sub_ps,
            _mm512_div_ps,
            _mm512_storeu_ps
        )
    );
}

/// [`channel`] and [`scatter`] with AVX2 (8 values at a time; the same operations), for CPUs
/// without what [`wide`] needs.
#[cfg(target_arch = "x86_64")]
mod narrow {
    use std::arch::x86_64::*;

    use super::super::normalize::avx2::WIDEN;
    use super::Out;

    /// Whether the running CPU has AVX2.
    pub(super) fn available() -> bool {
        is_x86_feature_detected!("avx2")
    }

    /// [`super::channel`]: 8 pixels per pair of 16-byte lanes loaded 8 bytes apart, their
    /// channel-`c` bytes picked and widened to `i32` by one `vpshufb` ([`WIDEN`]), then to `f32`.
    ///
    /// # Safety
    /// The CPU must have AVX2; `c < 3`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn channel(src: &[u8], c: usize, row: &mut [f32]) {
        let n = row.len().min(src.len() / 3);
        // SAFETY: a 32-byte array (`c < 3` by the contract), read with an unaligned load.
        let widen = unsafe { _mm256_loadu_si256(WIDEN[c].as_ptr().cast()) };
        let mut x = 0;
        while x + 8 <= n {
            // SAFETY: the lanes read bytes `3x .. 3x + 24`, within `src` as x + 8 ≤ n ≤
            // src.len() / 3; the store writes `row[x .. x + 8]`, x + 8 ≤ n ≤ row.len().
            unsafe {
                let p = src.as_ptr().add(3 * x);
                let v = _mm256_loadu2_m128i(p.add(8).cast(), p.cast());
                let values = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(v, widen));
                _mm256_storeu_ps(row.as_mut_ptr().add(x), values);
            }
            x += 8;
        }
        super::channel(&src[3 * x..], c, &mut row[x..]);
    }

    vector_scatter!(
        "avx2",
        8,
        (
            _mm256_set1_ps,
            _mm256_loadu_ps,
            _mm256_sub_ps,
            _mm256_div_ps,
            _mm256_storeu_ps
        )
    );
}

#[cfg(not(target_arch = "x86_64"))]
mod narrow {
    pub(super) use super::wide::{available, channel, scatter};
}

#[cfg(not(target_arch = "x86_64"))]
mod wide {
    use super::Out;

    pub(super) fn available() -> bool {
        false
    }

    pub(super) unsafe fn channel(src: &[u8], c: usize, row: &mut [f32]) {
        super::channel(src, c, row)
    }

    pub(super) unsafe fn scatter(
        row: &[f32],
        m: f32,
        s: f32,
        patch: usize,
        stride: usize,
        first: usize,
        out: &mut [Out],
    ) {
        super::scatter(row, m, s, patch, stride, first, out)
    }
}

/// Nemotron-H-Omni on a batch (see the module docs).
pub fn images(
    config: &NemotronConfig,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    if inputs.is_empty() {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    let filter = filter_of(config.common.resample).ok_or_else(|| {
        ProcessorError::config(
            "resample",
            "BILINEAR (2) or BICUBIC (3)",
            config.common.resample.pil_id(),
        )
    })?;
    let budget = patch_budget(config, inputs.len());
    let prepared = prepare_all(inputs, options, |rgb, _threads| {
        prepare(config, budget, rgb)
    })?;
    let patch = config.patch_size;
    let patch_len = 3 * patch * patch;
    let rows: Vec<usize> = prepared.iter().map(|p| p.grid.0 * p.grid.1).collect();
    let total: usize = rows.iter().sum();
    let len = checked_len("pixel_values", &[total, patch_len], 4)?;
    let mut pixel_values = OutBuffer::new("pixel_values", len)?;
    let lengths: Vec<usize> = rows.iter().map(|r| r * patch_len).collect();
    let slices = pixel_values.slices(&lengths);
    let jobs: Vec<(&Prepared<'_>, &mut [Out])> = prepared.iter().zip(slices).collect();
    let workers = parallel::writers(options.threads, jobs.len(), 4 * len);
    let written = parallel::map(jobs, workers, |i, (image, out)| {
        write_image(&config.common, filter, image, patch, out).map_err(|e| e.at(i))
    });
    written.into_iter().collect::<Result<Vec<()>, _>>()?;
    // SAFETY: the slices cover the buffer (their lengths sum to `len`), and every
    // `write_image` returned `Ok`, having written every value of its slice: each of the 3
    // channels emits all `h·p` rows of `w·p` values, which land on distinct positions covering
    // the image's `h·w·3·p²` values.
    let pixel_values = unsafe { pixel_values.finish() };
    let grid: Vec<i64> = prepared
        .iter()
        .flat_map(|p| [p.grid.0 as i64, p.grid.1 as i64])
        .collect();
    let n = prepared.len();
    super::recycle_images(prepared.into_iter().map(|p| p.rgb));
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![total, patch_len],
                    data: TensorData::F32(pixel_values),
                },
            ),
            ("image_grid_hw", Tensor::i64(vec![n, 2], grid)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    /// The AVX2 channel extraction and patch normalisation against the scalar code, bit for
    /// bit: every channel, rows of 0 to 40 pixels (the vector loop, its tail, and rows whose
    /// source ends right after them), patches of 8 to 20 values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_paths_equal_the_scalar_code() {
        if !narrow::available() {
            return;
        }
        let src: Vec<u8> = (0..200).map(|i| (i * 89 + 7) as u8).collect();
        for n in 0..=40 {
            for c in 0..3 {
                for slack in [0, 1, 30] {
                    let src = &src[..3 * n + slack];
                    let (mut want, mut got) = (vec![-1.0f32; n], vec![-2.0f32; n]);
                    channel(src, c, &mut want);
                    // SAFETY: `narrow::available()` found AVX2; `c < 3`.
                    unsafe { narrow::channel(src, c, &mut got) };
                    assert_eq!(want, got, "{n} pixels, channel {c}, slack {slack}");
                }
            }
        }
        let row: Vec<f32> = (0..240).map(|i| (i * 37 % 256) as f32).collect();
        let (m, s) = (122.770_935_f32, 68.500_53_f32);
        for patch in 8..=20 {
            let cols = row.len() / patch;
            let row = &row[..cols * patch];
            let (stride, first) = (3 * patch, patch / 2);
            let len = first + (cols - 1) * stride + patch;
            let (mut want, mut got) = (vec![Out::new(0.5); len], vec![Out::new(0.5); len]);
            scatter(row, m, s, patch, stride, first, &mut want);
            // SAFETY: `narrow::available()` found AVX2.
            unsafe { narrow::scatter(row, m, s, patch, stride, first, &mut got) };
            let bits = |v: &[Out]| {
                v.iter()
                    // SAFETY: both were filled with initialised values, some overwritten.
                    .map(|x| unsafe { x.assume_init() }.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&want), bits(&got), "patch {patch}");
        }
    }

    #[test]
    fn grids_as_transformers() {
        let c = NemotronConfig::nemotron_h_omni();
        let budget = patch_budget(&c, 1);
        assert_eq!(budget, 13312);
        // 640x480: round(40.5) = 40 (half to even), round(30.5) = 30: 1200 patches, kept.
        assert_eq!(patch_grid(640, 480, 16, 2, 1024, budget).unwrap(), (40, 30));
        // 48x48: round(3.5) = 4: 16 patches, scaled up to 1024: 32x32.
        assert_eq!(patch_grid(48, 48, 16, 2, 1024, budget).unwrap(), (32, 32));
        // 4032x3024: 253x190 scaled down into 13312 patches, sides made even.
        let (h, w) = patch_grid(4032, 3024, 16, 2, 1024, budget).unwrap();
        assert!(h * w <= 13312 && h % 2 == 0 && w % 2 == 0, "{h}x{w}");
        // Far too thin: floor(factor * 1) = 0, and transformers divides by zero.
        assert!(patch_grid(1, 400_000, 16, 2, 1024, budget).is_err());
        // The budget: 16 images of 1024 each exceed the cap.
        let mut small = c.clone();
        small.max_model_len = 100;
        assert_eq!(patch_budget(&small, 1), 1024);
        assert_eq!(patch_budget(&small, 3), 3072);
        small.max_num_patches = 0;
        assert_eq!(patch_budget(&small, 30), 30720);
    }

    #[test]
    fn patches_and_tokens() {
        let data: Vec<u8> = (0..64 * 32 * 3).map(|i| (i % 251) as u8).collect();
        let input = Input::Pixels {
            data: &data,
            width: 32,
            height: 64,
            channels: 3,
        };
        let entries = [
            ("min_num_patches".to_owned(), Value::Int(8)),
            ("max_num_patches".to_owned(), Value::Int(8)),
        ];
        let p = Preprocessor::new(Family::NemotronHOmni, &entries).unwrap();
        let out = p.images(&[input], &Options::default()).unwrap();
        // 64x32 is 4x2 patches already: not resized.
        assert_eq!(
            out.get("image_grid_hw").unwrap().data,
            TensorData::I64(vec![4, 2])
        );
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [8, 768]);
        let TensorData::F32(values) = &pv.data else {
            panic!("f32 expected");
        };
        // Patch 3 (row 1, column 1), channel 2, row 5, column 7 is pixel (21, 23) blue.
        let pixel = data[(21 * 32 + 23) * 3 + 2];
        let (m, s) = fused(&p.config().common().clone(), 2);
        assert_eq!(
            values[3 * 768 + 2 * 256 + 5 * 16 + 7],
            (f32::from(pixel) - m) / s
        );
        let config = NemotronConfig::nemotron_h_omni();
        let owned: Vec<(String, u32)> = REPLACEMENT
            .defaults
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        let r = prompt_replacement(&config, &[4, 2], &TokenIds(&owned)).unwrap();
        assert_eq!(r.tokens, [19, 18, 18, 20].to_vec());
        assert_eq!(r.embed, [false, true, true, false].to_vec());
        assert_eq!(r.rows, 8);
        assert!(prompt_replacement(&config, &[0, 2], &TokenIds(&owned)).is_err());
    }

    #[test]
    fn bad_configs() {
        for (key, bad) in [
            ("downsample_ratio", Value::Float(0.0)),
            ("downsample_ratio", Value::Float(3.0)),
            ("patch_size", Value::Int(0)),
            ("min_num_patches", Value::Int(-1)),
            ("resample", Value::Int(1)),
            ("do_normalize", Value::Bool(false)),
        ] {
            let err =
                Preprocessor::new(Family::NemotronHOmni, &[(key.to_owned(), bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("config {key}:")),
                "{err}"
            );
        }
    }
}
