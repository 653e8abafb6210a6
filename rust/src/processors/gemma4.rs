//! Gemma 4 (`Gemma4ImageProcessorPil`, transformers 5.24): each image is resized with its aspect
//! ratio kept ([`target_size`]: the largest size whose sides are multiples of
//! `pooling_kernel_size · patch_size` within `max_soft_tokens · pooling_kernel_size²` patches)
//! with BICUBIC, rescaled by 1/255 (no normalization by default), cut into
//! `patch_size × patch_size` patches in row-major order, each patch flattened channels-last
//! (`(py, px, c)`), and zero-padded to the patch budget:
//!
//! `pixel_values` `(B, max_patches, patch_size² · 3)` float32, `image_position_ids`
//! `(B, max_patches, 2)` int64 (each patch's `(x, y)` in the patch grid, `(-1, -1)` for the
//! padding), `num_soft_tokens_per_image` `(B,)` int64 (patches / `pooling_kernel_size²`: the
//! vision tower pools each `k × k` block into one soft token).
//!
//! Videos (`Gemma4VideoProcessor`, torchvision-only) are not reproduced here.
//!
//! Gemma 4 unified (`gemma4_unified`) wraps this configuration and shares the target size, the
//! patch writer and the prompt replacement. Both plan their `pixel_values` ([`plan_patches`]):
//! written once, where they travel, or into a new buffer for the eager output.

use super::family::{
    i64_values, FamilyConfig, Hf, Replacement, ReplacementSpec, TokenIds, VisionTokens,
};
use super::normalize::Normalize;
use super::pending::{self, Images, Pending, WriteValues};
use super::store::{Element, Unaligned};
use super::value::{as_count, hf_only, Common, Value, HF_COMMON};
use super::{
    check_side, checked_len, parallel, prepare_all, resize_rgb, Input, Options, Outputs,
    ProcessorError, Rgb, Tensor,
};
use crate::memory::fallible;
use std::mem::MaybeUninit;

/// Gemma 4: `Gemma4ImageProcessor` (its `size` is unused: the resize is driven by the patch
/// budget); `patch_size`, `max_soft_tokens`, `pooling_kernel_size`.
pub const GEMMA4: Hf = Hf {
    image_classes: &["Gemma4ImageProcessor"],
    video_classes: &[],
    // `size` is not read: `_validate_preprocess_kwargs` turns it off, `_preprocess` ignores it.
    normalise: |config| {
        let keys: Vec<&str> = HF_COMMON
            .iter()
            .chain(&["patch_size", "max_soft_tokens", "pooling_kernel_size"])
            .copied()
            .collect();
        Ok(hf_only(config, &keys))
    },
    // Gemma4Processor's `image_seq_length` changes no count: each image's is computed.
    processor_keys: &[],
    processor_forces: None,
    published: None,
    count_tensor: None,
};

/// `_SUPPORTED_SOFT_TOKENS`: the soft-token budgets the processor accepts.
pub const SUPPORTED_SOFT_TOKENS: [usize; 5] = [70, 140, 280, 560, 1120];

/// Ours: a patch or pooling kernel side no model approaches (transformers bounds neither).
const MAX_KERNEL: usize = 1024;

/// The configuration of Gemma 4.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Config {
    pub common: Common,
    pub patch_size: usize,
    pub max_soft_tokens: usize,
    pub pooling_kernel_size: usize,
}

impl Gemma4Config {
    /// `Gemma4ImageProcessorPil`'s class defaults (those of the published
    /// `preprocessor_config.json`): BICUBIC, rescale 1/255, no normalization (mean 0, std 1),
    /// patch 16, 280 soft tokens, pooling kernel 3.
    pub fn gemma4() -> Self {
        let mut common = Common::new([0.0; 3], [1.0; 3]);
        common.do_normalize = false;
        Gemma4Config {
            common,
            patch_size: 16,
            max_soft_tokens: 280,
            pooling_kernel_size: 3,
        }
    }

    /// `max_soft_tokens · pooling_kernel_size²`.
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens * self.pooling_kernel_size * self.pooling_kernel_size
    }
}

impl FamilyConfig for Gemma4Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size" => self.patch_size = as_count("patch_size", value, MAX_KERNEL)?,
            "pooling_kernel_size" => {
                self.pooling_kernel_size = as_count("pooling_kernel_size", value, MAX_KERNEL)?
            }
            "max_soft_tokens" => {
                self.max_soft_tokens = match value {
                    Value::Int(v) => SUPPORTED_SOFT_TOKENS.into_iter().find(|&s| s as i64 == *v),
                    _ => None,
                }
                .ok_or_else(|| {
                    ProcessorError::config(
                        "max_soft_tokens",
                        format!("one of {SUPPORTED_SOFT_TOKENS:?}"),
                        value,
                    )
                })?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("max_soft_tokens", Value::Int(self.max_soft_tokens as i64)),
            (
                "pooling_kernel_size",
                Value::Int(self.pooling_kernel_size as i64),
            ),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        Ok(())
    }

    pending::planned_images!(plan);

    /// `Gemma4Processor` / `Gemma4UnifiedProcessor`: `num_soft_tokens_per_image` soft tokens
    /// per image.
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        i64_values(outputs, "num_soft_tokens_per_image").map(<[i64]>::to_vec)
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

/// The begin-of-image token (`boi_token`).
pub const BOI: &str = "<|image>";
/// The end-of-image token (`eoi_token`).
pub const EOI: &str = "<image|>";
/// The image token (`image_token`): the chat template's anchor, once per image, and the token
/// whose positions take the soft tokens' embeddings.
pub const IMAGE: &str = "<|image|>";

/// `Gemma4Processor`'s tokens (and `Gemma4UnifiedProcessor`'s: the same tokens, and
/// Gemma4UnifiedConfig has the same default ids).
pub const REPLACEMENT: ReplacementSpec = ReplacementSpec {
    grid: &["num_soft_tokens_per_image"],
    anchor: IMAGE,
    embed: IMAGE,
    tokens: &[BOI, EOI, IMAGE],
    // Gemma4Config's defaults (transformers 5.24 configuration_gemma4.py): boi_token_id 255999,
    // eoi_token_id 258882, image_token_id 258880.
    defaults: &[(BOI, 255_999), (EOI, 258_882), (IMAGE, 258_880)],
    // One (padded) entry of pixel_values and image_position_ids per image.
    flat: &[],
    sizes: "",
    per_sample: false,
    // The replacement starts and ends with special tokens, which the tokenizer splits out
    // before anything else: nothing merges.
    joins: &[],
};

/// `Gemma4Processor.replace_image_token` (and `Gemma4UnifiedProcessor`'s, the same rule):
/// `boi + image_token × n + eoi`, `n` the image's
/// `num_soft_tokens_per_image`. Only the image tokens take embeddings (vLLM:
/// `PromptUpdateDetails.select_token_id(tokens, image_token_id)`); each image is one entry of
/// `pixel_values`.
pub fn prompt_replacement(
    config: &Gemma4Config,
    grid: &[i64],
    ids: &TokenIds<'_>,
) -> Result<Replacement, ProcessorError> {
    let n = match grid {
        &[n] if n >= 0 && n <= config.max_soft_tokens as i64 => n as usize,
        _ => {
            return Err(ProcessorError::Config {
                field: "num_soft_tokens_per_image",
                expected: format!("one count between 0 and {}", config.max_soft_tokens),
                actual: format!("{grid:?}"),
            })
        }
    };
    let boi = ids.get(BOI)?;
    let eoi = ids.get(EOI)?;
    let image = ids.get(IMAGE)?;
    Ok(Replacement::bracketed(boi, image, n, eoi, 1))
}

/// `get_aspect_ratio_preserving_size(height, width, patch, max_patches, pool)`: the
/// `(height, width)` an image is resized to, in Python's arithmetic (`f64` division and
/// `math.sqrt`, `int(math.floor(..))`). Errors as transformers raises them.
pub fn target_size(
    height: usize,
    width: usize,
    patch: usize,
    max_patches: usize,
    pool: usize,
) -> Result<(usize, usize), ProcessorError> {
    let total_px = (height as f64) * (width as f64);
    let target_px = max_patches as u128 * (patch as u128 * patch as u128);
    let factor = (target_px as f64 / total_px).sqrt();
    let side = pool * patch;
    let round_down = |ideal: f64| (ideal / side as f64).floor() as usize * side;
    let mut target_h = round_down(factor * height as f64);
    let mut target_w = round_down(factor * width as f64);
    if target_h == 0 && target_w == 0 {
        return Err(ProcessorError::shape(
            "resized image",
            format!("sides divisible by pooling_kernel_size * patch_size = {side}"),
            format!("0x0 for a {height}x{width} (HxW) image"),
        ));
    }
    let max_side = (max_patches / (pool * pool)) * side;
    if target_h == 0 {
        target_h = side;
        target_w = ((width as f64 / height as f64).floor() as usize * side).min(max_side);
    } else if target_w == 0 {
        target_w = side;
        target_h = ((height as f64 / width as f64).floor() as usize * side).min(max_side);
    }
    if (target_h as u128) * (target_w as u128) > target_px {
        return Err(ProcessorError::shape(
            "resized image",
            format!("at most {max_patches} patches of {patch}x{patch}"),
            format!("{target_h}x{target_w} (HxW) for a {height}x{width} image"),
        ));
    }
    Ok((target_h, target_w))
}

/// One image, resized (or as it is, with `do_resize` off: then its sides must be multiples of
/// the patch size and its patches within the budget, as transformers' reshape and stack need).
fn prepare<'a>(
    config: &Gemma4Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    let patch = config.patch_size;
    let rgb = if config.common.do_resize {
        let (h, w) = target_size(
            rgb.height,
            rgb.width,
            patch,
            config.max_patches(),
            config.pooling_kernel_size,
        )?;
        check_side("resized image", h, w)?;
        resize_rgb(rgb, h, w, &config.common, threads)?
    } else {
        rgb
    };
    if rgb.height % patch != 0 || rgb.width % patch != 0 {
        return Err(ProcessorError::shape(
            "image",
            format!("sides divisible by patch_size {patch} (do_resize is off)"),
            format!("{}x{} (HxW)", rgb.height, rgb.width),
        ));
    }
    let patches = (rgb.height / patch) * (rgb.width / patch);
    if patches > config.max_patches() {
        return Err(ProcessorError::shape(
            "image",
            format!(
                "at most {} patches (do_resize is off)",
                config.max_patches()
            ),
            format!("{patches} patches of a {}x{} image", rgb.height, rgb.width),
        ));
    }
    Ok(rgb)
}

/// A value per channel and `u8` input: the rescale/normalize of a family as a table.
pub(crate) type Lut = [[f32; 256]; 3];

/// The AVX-512 constants of a table's formula, where there are some (`None` elsewhere, and
/// always off x86-64: the table is used).
#[cfg(target_arch = "x86_64")]
pub(crate) type Simd = Option<super::normalize::avx512::Wide>;
#[cfg(not(target_arch = "x86_64"))]
pub(crate) type Simd = Option<std::convert::Infallible>;

/// [`Normalize::wide`], off x86-64 none.
pub(crate) fn wide_of(normalize: &Normalize) -> Simd {
    #[cfg(target_arch = "x86_64")]
    return normalize.wide();
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = normalize;
        None
    }
}

/// Writes one image's `side × side` patches in row-major order (each flattened channels-last,
/// `(py, px, c)`, through `lut`) and the zero padding after them: every value of `out`, a whole
/// number of patches.
fn write_patches(lut: &Lut, rgb: &Rgb<'_>, side: usize, out: &mut [Unaligned]) {
    let row_len = side * 3;
    let (rows, cols) = (rgb.height / side, rgb.width / side);
    let stride = rgb.width * 3;
    let mut chunks = out.chunks_exact_mut(side * row_len);
    'grid: for gy in 0..rows {
        for gx in 0..cols {
            let Some(dst) = chunks.next() else {
                break 'grid;
            };
            for (py, dst_row) in dst.chunks_exact_mut(row_len).enumerate() {
                let start = (gy * side + py) * stride + gx * row_len;
                let src = &rgb.data[start..start + row_len];
                for (slots, px) in dst_row.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                    slots[0].set(lut[0][usize::from(px[0])]);
                    slots[1].set(lut[1][usize::from(px[1])]);
                    slots[2].set(lut[2][usize::from(px[2])]);
                }
            }
        }
    }
    for dst in chunks {
        Unaligned::zero(dst);
    }
}

#[cfg(target_arch = "x86_64")]
super::store::bf16_twins! {
/// [`write_patches`] with the values computed 16 at a time from the pixel bytes (AVX-512: the
/// fused formula's arithmetic, per lane with its channel's constants, so the table's bits, which
/// [`Normalize`] checked the formula reproduces), each stored as `element` (`bfloat16` rounded as
/// `f32_to_bf16` rounds): every byte of `out`, a whole number of patches of `element`s.
///
/// Panics if `out` is not a whole number of patches or `rgb` holds fewer bytes than its size.
///
/// # Safety
///
/// The CPU must have what `normalize::avx512::available` checks (and AVX-512 BF16 for the twin,
/// `write_patches_wide_bf16`, which rounds `bfloat16` with it: see
/// [`bf16_twins`](super::store::bf16_twins)).
unsafe fn write_patches_wide / write_patches_wide_bf16(
    wide: &super::normalize::avx512::Wide,
    rgb: &Rgb<'_>,
    side: usize,
    out: &mut [MaybeUninit<u8>],
    element: Element,
) {
    use std::arch::x86_64::*;
    let size = element.size();
    let row_len = side * 3;
    let patch_bytes = side * row_len * size;
    assert!(
        patch_bytes > 0 && out.len().is_multiple_of(patch_bytes),
        "{} bytes are not whole patches of {side}x{side}",
        out.len()
    );
    let stride = rgb.view().checked_stride();
    // SAFETY: the CPU features are this function's contract.
    let constants = unsafe { wide.interleaved() };
    let slots = out.len() / patch_bytes;
    let (rows, cols) = (rgb.height / side, rgb.width / side);
    let (src, dst) = (rgb.data.as_ptr(), out.as_mut_ptr().cast::<u8>());
    // Bytes of `out` written so far: whole patches.
    let mut at = 0;
    'grid: for gy in 0..rows {
        for gx in 0..cols {
            if at == slots * patch_bytes {
                break 'grid;
            }
            for py in 0..side {
                // Pixel row `gy·side + py < rows·side ≤ height`, columns `gx·side ..` up to
                // `(gx + 1)·side ≤ cols·side ≤ width`: inside `rgb.data` (asserted above).
                let start = (gy * side + py) * stride + gx * row_len;
                let mut off = 0;
                while off < row_len {
                    let count = (row_len - off).min(16);
                    // SAFETY: the masked load reads only bytes `start + off ..` up to
                    // `start + row_len`, inside the pixel row above; the masked store writes only
                    // `count · size` bytes from `at + off · size`, inside this patch's row of
                    // `out` (`at` is below `slots · patch_bytes = out.len()` and moves by whole
                    // rows). Masked-off bytes are not accessed.
                    unsafe {
                        let load_mask = u64::MAX >> (64 - count);
                        let px = _mm512_maskz_loadu_epi8(load_mask, src.add(start + off).cast());
                        let v = constants.values(_mm512_castsi512_si128(px), off % 3);
                        let store_mask = u64::MAX >> (64 - count * size);
                        let bytes = to_bytes(element, v);
                        _mm512_mask_storeu_epi8(dst.add(at + off * size).cast(), store_mask, bytes);
                    }
                    off += count;
                }
                at += row_len * size;
            }
        }
    }
    out[at..].fill(MaybeUninit::new(0));
}
}

/// Gemma 4 on a batch (see the module docs): `pixel_values` planned.
fn plan<'a>(
    config: &Gemma4Config,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let lut: Lut = std::array::from_fn(|c| std::array::from_fn(|v| normalize.value(c, v as u8)));
    let pool2 = config.pooling_kernel_size * config.pooling_kernel_size;
    plan_patches(
        prepared,
        config.patch_size,
        config.max_patches(),
        pool2,
        (&lut, wide_of(normalize)),
        options,
    )
}

/// The writer of Gemma 4's `pixel_values` (and Gemma 4 unified's): each image's patches, then
/// zeros up to `slots` patches; one image per job.
struct PatchWriter<'a> {
    images: Images<'a>,
    side: usize,
    slots: usize,
    lut: Box<Lut>,
    /// The table's values as the fused formula computes them with AVX-512, where it does
    /// ([`Normalize::wide`]: checked to reproduce the table).
    wide: Simd,
    threads: usize,
}

impl PatchWriter<'_> {
    /// Threads for the writes (automatic: as the `float32` output's size pays for).
    fn workers(&self) -> usize {
        let bytes = [self.slots, self.side, self.side, 3, 4]
            .iter()
            .fold(self.images.len(), |n, &k| n.saturating_mul(k));
        parallel::writers(self.threads, self.images.len(), bytes)
    }

    /// Every image's patches and padding into `out` as `element`s, one image per job, with the
    /// AVX-512 kernel; `false` (nothing written) where there is none.
    fn write_wide(&self, out: &mut [MaybeUninit<u8>], element: Element) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(wide) = &self.wide {
            let per_image = self.slots * self.side * self.side * 3 * element.size();
            // `Pending` passes exactly the tensor's values; anything else would leave some
            // unwritten.
            assert_eq!(out.len(), self.images.len() * per_image, "patch slots");
            if per_image == 0 {
                return true;
            }
            let jobs: Vec<_> = self.images.iter().zip(out.chunks_mut(per_image)).collect();
            let hardware = wide.rounds_on_cpu(element);
            parallel::map(jobs, self.workers(), |_, (rgb, out)| {
                // SAFETY: `wide` is only set from `Normalize::wide`, which gives constants only
                // where the CPU has what the AVX-512 kernels need; the twin runs only where
                // `bf16_hardware` found AVX-512 BF16 as well (and only on values that are never
                // subnormal, which it would round wrongly).
                unsafe {
                    if hardware {
                        write_patches_wide_bf16(wide, rgb, self.side, out, element)
                    } else {
                        write_patches_wide(wide, rgb, self.side, out, element)
                    }
                }
            });
            return true;
        }
        let _ = (out, element);
        false
    }
}

// SAFETY: `write` checks that `out` holds `slots · side² · 3` values per image and hands each
// image exactly its share: `write_patches` writes every value of it (its patches, at most
// `slots`, then zeros for every remaining patch; a grid of more patches than `slots`, which the
// callers' `prepare` refuses, would stop at the last slot).
unsafe impl WriteValues for PatchWriter<'_> {
    fn write(&self, out: &mut [Unaligned]) {
        if self.write_wide(pending::bytes_of_unaligned(out), Element::F32) {
            return;
        }
        let per_image = self.slots * self.side * self.side * 3;
        // `Pending` passes exactly the tensor's values; anything else would leave some unwritten.
        assert_eq!(out.len(), self.images.len() * per_image, "patch slots");
        if per_image == 0 {
            return;
        }
        let jobs: Vec<_> = self.images.iter().zip(out.chunks_mut(per_image)).collect();
        parallel::map(jobs, self.workers(), |_, (rgb, out)| {
            write_patches(&self.lut, rgb, self.side, out)
        });
    }

    fn write_bf16(&self, out: &mut [MaybeUninit<u8>]) -> bool {
        self.write_wide(out, Element::Bf16)
    }

    fn into_owned(self: Box<Self>) -> Result<Box<dyn WriteValues>, ProcessorError> {
        let PatchWriter {
            images,
            side,
            slots,
            lut,
            wide,
            threads,
        } = *self;
        Ok(Box::new(PatchWriter {
            images: images.into_owned()?,
            side,
            slots,
            lut,
            wide,
            threads,
        }))
    }
}

/// The outputs of images whose sides are multiples of `side`: `pixel_values`
/// `(B, slots, side² · 3)` planned (each image's `side × side` patches, row-major,
/// channels-last through `lut`, zero-padded to `slots`), `image_position_ids` `(B, slots, 2)`
/// (`(x, y)` of each patch, `(-1, -1)` for the padding) and `num_soft_tokens_per_image`
/// (patches / `per_token`). Every image has at most `slots` patches.
pub(crate) fn plan_patches<'a>(
    prepared: Vec<Rgb<'a>>,
    side: usize,
    slots: usize,
    per_token: usize,
    (lut, wide): (&Lut, Simd),
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    if prepared.is_empty() {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    let batch = prepared.len();
    let patch_len = side * side * 3;
    let positions_len = checked_len("image_position_ids", &[batch, slots, 2], 8)?;
    let mut positions = fallible::with_capacity(positions_len)
        .map_err(ProcessorError::oom("image_position_ids"))?;
    let mut soft = Vec::with_capacity(batch);
    for rgb in &prepared {
        let (rows, cols) = (rgb.height / side, rgb.width / side);
        for y in 0..rows {
            for x in 0..cols {
                positions.extend_from_slice(&[x as i64, y as i64]);
            }
        }
        let n = rows * cols;
        positions.extend(std::iter::repeat_n(-1i64, (slots - n) * 2));
        soft.push((n / per_token) as i64);
    }
    let writer = PatchWriter {
        images: prepared.into(),
        side,
        slots,
        lut: Box::new(*lut),
        wide,
        threads: options.threads,
    };
    let workers = writer.workers();
    let pending = Pending::new(
        "pixel_values",
        vec![batch, slots, patch_len],
        workers,
        Box::new(writer),
    )?;
    Ok((
        pending,
        Outputs {
            tensors: vec![
                (
                    "image_position_ids",
                    Tensor::i64(vec![batch, slots, 2], positions),
                ),
                ("num_soft_tokens_per_image", Tensor::i64(vec![batch], soft)),
            ],
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor, TensorData};

    #[test]
    fn sizes_as_transformers() {
        // Square: 16 x 16 blocks of 48 px = 256 soft tokens.
        assert_eq!(target_size(1000, 1000, 16, 2520, 3).unwrap(), (768, 768));
        assert_eq!(target_size(1, 1, 16, 2520, 3).unwrap(), (768, 768));
        // A strip: one block high, the budget's width.
        assert_eq!(target_size(1, 5000, 16, 2520, 3).unwrap(), (48, 13440));
        assert_eq!(target_size(5000, 1, 16, 2520, 3).unwrap(), (13440, 48));
        assert_eq!(target_size(10, 200, 16, 2520, 3).unwrap(), (144, 3552));
        assert_eq!(target_size(3, 900, 16, 2520, 3).unwrap(), (48, 13440));
    }

    #[test]
    fn patches_positions_and_padding() {
        let data: Vec<u8> = (0..96 * 48 * 3).map(|i| (i % 251) as u8).collect();
        let input = Input::Pixels {
            data: &data,
            width: 96,
            height: 48,
            channels: 3,
        };
        let entries = [
            ("max_soft_tokens".to_owned(), Value::Int(70)),
            ("do_resize".to_owned(), Value::Bool(false)),
        ];
        let p = Preprocessor::new(Family::Gemma4, &entries).unwrap();
        let out = p.images(&[input], &Options::default()).unwrap();
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [1, 630, 768]);
        let TensorData::F32(values) = &pv.data else {
            panic!("f32 expected");
        };
        // Patch (x 1, y 0) row 1 starts at pixel (16, 1).
        let at = 768 + 16 * 3;
        let src = (96 + 16) * 3;
        assert_eq!(values[at], (f64::from(data[src]) / 255.0) as f32);
        assert!(values[18 * 768..].iter().all(|&v| v == 0.0));
        let ids = out.get("image_position_ids").unwrap();
        let TensorData::I64(ids) = &ids.data else {
            panic!("i64 expected");
        };
        assert_eq!(&ids[..6], &[0, 0, 1, 0, 2, 0]);
        assert_eq!(&ids[12..14], &[0, 1]);
        assert!(ids[36..].iter().all(|&v| v == -1));
        assert_eq!(
            out.get("num_soft_tokens_per_image").unwrap().data,
            TensorData::I64(vec![2])
        );
    }

    /// The AVX-512 patch writer gives the table's values bit for bit (and, as `bfloat16`, those
    /// rounded): rescale alone (Gemma 4's default), with normalization, and Gemma 4 unified's
    /// torch table where its formula reproduces it; patch sides whose rows are whole vectors (16)
    /// and not (14: runs of 16, 16 and 10 values), images of several grids, padding slots, one
    /// thread and two.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn wide_patches_are_the_tables_values() {
        use crate::tensor::convert::f32_to_bf16;
        let clip = (
            [0.48145466, 0.4578275, 0.40821073],
            [0.26862954, 0.26130258, 0.27577711],
        );
        let normalizers = [
            Normalize::new(Some(1.0 / 255.0), None),
            Normalize::new(Some(1.0 / 255.0), Some(clip)),
            Normalize::new(Some(0.5), None),
        ];
        let mut tested = 0;
        for normalize in &normalizers {
            let Some(wide) = normalize.wide() else {
                assert!(!super::super::normalize::avx512::available());
                continue;
            };
            let lut: Lut =
                std::array::from_fn(|c| std::array::from_fn(|v| normalize.value(c, v as u8)));
            for side in [16, 14] {
                let sizes = [
                    (3 * side, 2 * side),
                    (side, 5 * side),
                    (2 * side + 3, side + 1),
                ];
                let images: Vec<Vec<u8>> = sizes
                    .iter()
                    .enumerate()
                    .map(|(k, &(w, h))| {
                        (0..w * h * 3)
                            .map(|i| ((i * 131 + k * 7) % 256) as u8)
                            .collect()
                    })
                    .collect();
                for threads in [1, 2] {
                    let writer = |wide| PatchWriter {
                        images: sizes
                            .iter()
                            .zip(&images)
                            .map(|(&(width, height), data)| Rgb {
                                data: std::borrow::Cow::Borrowed(data.as_slice()),
                                width,
                                height,
                            })
                            .collect::<Vec<_>>()
                            .into(),
                        side,
                        slots: 7,
                        lut: Box::new(lut),
                        wide,
                        threads,
                    };
                    let len = sizes.len() * 7 * side * side * 3;
                    let mut want = vec![MaybeUninit::new(0xEEu8); 4 * len];
                    writer(None).write(super::super::store::unaligned_of(&mut want));
                    let mut got = vec![MaybeUninit::new(0x11u8); 4 * len];
                    writer(Some(wide)).write(super::super::store::unaligned_of(&mut got));
                    // SAFETY: both writers wrote every value.
                    let (want, got): (Vec<u8>, Vec<u8>) = unsafe {
                        (
                            want.iter().map(|b| b.assume_init()).collect(),
                            got.iter().map(|b| b.assume_init()).collect(),
                        )
                    };
                    assert!(
                        got == want,
                        "side {side}, {threads} threads: float32 differs"
                    );
                    let rounded: Vec<u8> = want
                        .chunks_exact(4)
                        .flat_map(|v| {
                            f32_to_bf16(u32::from_le_bytes([v[0], v[1], v[2], v[3]])).to_le_bytes()
                        })
                        .collect();
                    let mut half = vec![MaybeUninit::new(0x22u8); 2 * len + 1];
                    assert!(writer(Some(wide)).write_bf16(&mut half[1..]));
                    // The build rounding with integer operations, called directly (the writer
                    // runs the one rounding on the CPU where it can).
                    let mut plain = vec![MaybeUninit::new(0x44u8); 2 * len];
                    for (k, (data, &(width, height))) in images.iter().zip(&sizes).enumerate() {
                        let rgb = Rgb {
                            data: std::borrow::Cow::Borrowed(data.as_slice()),
                            width,
                            height,
                        };
                        let per = 2 * 7 * side * side * 3;
                        // SAFETY: `wide` is given only where the AVX-512 kernels run.
                        unsafe {
                            write_patches_wide(
                                &wide,
                                &rgb,
                                side,
                                &mut plain[k * per..(k + 1) * per],
                                Element::Bf16,
                            )
                        };
                    }
                    // SAFETY: every byte was written by the kernel.
                    let plain: Vec<u8> = plain.iter().map(|b| unsafe { b.assume_init() }).collect();
                    assert!(
                        plain == rounded,
                        "side {side}: the integer rounding differs"
                    );
                    assert!(
                        !writer(None).write_bf16(&mut half[1..]),
                        "a table-only writer wrote"
                    );
                    // SAFETY: every byte was initialised above.
                    let half: Vec<u8> = half.iter().map(|b| unsafe { b.assume_init() }).collect();
                    assert_eq!(half[0], 0x22, "the byte before the output was written");
                    assert!(
                        half[1..] == rounded[..],
                        "side {side}, {threads} threads: bfloat16 differs"
                    );
                    tested += 1;
                }
            }
        }
        if super::super::normalize::avx512::available() {
            assert_eq!(tested, 12, "every configuration ran the AVX-512 writer");
        }
    }

    #[test]
    fn replacement_and_bad_configs() {
        let owned: Vec<(String, u32)> = REPLACEMENT
            .defaults
            .iter()
            .map(|&(n, i)| (n.to_owned(), i))
            .collect();
        let config = Gemma4Config::gemma4();
        let r = prompt_replacement(&config, &[3], &TokenIds(&owned)).unwrap();
        assert_eq!(
            r.tokens,
            [255_999, 258_880, 258_880, 258_880, 258_882].to_vec()
        );
        assert_eq!(r.embed, [false, true, true, true, false].to_vec());
        assert!(prompt_replacement(&config, &[281], &TokenIds(&owned)).is_err());
        assert!(prompt_replacement(&config, &[1, 1], &TokenIds(&owned)).is_err());
        for (key, bad) in [
            ("max_soft_tokens", Value::Int(100)),
            ("max_soft_tokens", Value::Float(280.0)),
            ("patch_size", Value::Int(0)),
            ("pooling_kernel_size", Value::Int(-1)),
        ] {
            let err = Preprocessor::new(Family::Gemma4, &[(key.to_owned(), bad)]).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("config {key}:")),
                "{err}"
            );
        }
    }
}
