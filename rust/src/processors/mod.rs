//! Model image processors, bit-exact with transformers' PIL backend (transformers 5.24.0 with
//! Pillow 13.0.0) or, for the torch-only references, with torch 2.14.1 / torchvision 0.29.1.
//!
//! - [`qwen`]: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5 (`smart_resize`, patches in merge-window
//!   order, `image_grid_thw`; videos with temporal patches, `video_grid_thw`);
//! - [`clip`]: CLIP and LLaVA-1.5 (shortest-edge resize, center crop, LLaVA's pad to square);
//! - [`siglip`]: SigLIP (resize to a fixed size);
//! - [`llava_next`]: LLaVA-NeXT (anyres tiles plus the base image, `image_sizes`);
//! - [`pixtral`]: Pixtral (aspect kept, sides rounded up to the patch, batch padded to its
//!   largest image, `image_sizes`);
//! - [`gemma3`]: Gemma 3 (resize to a fixed size, pan-and-scan crops after their image,
//!   `num_crops`);
//! - [`internvl`]: InternVL (`GotOcr2ImageProcessorPil`: the closest aspect-ratio grid of
//!   tiles, then a thumbnail, `num_patches`);
//! - [`idefics3`]: Idefics3 and SmolVLM (longest edge, then multiples of the tile side, tiles
//!   and the global image, `pixel_attention_mask`, `rows`/`cols`);
//! - [`llama4`]: Llama 4 (best-fit canvas of 336 tiles, a global tile, `aspect_ratios`,
//!   `bfloat16` pixels), [`phi4`]: Phi-4-multimodal (dynamic HD crops, attention masks), and
//!   [`phi3v`]: Phi-3-vision (HD transform with `num_crops`): the references are torch-only
//!   (transformers' torchvision backend, the hub's code), bit-exact with torch 2.14.1 on CPU
//!   through [`crate::image::torch`] and [`torch_backend`];
//! - shared pieces: [`normalize`] (rescale and normalize as lookup tables), [`sizes`] (the
//!   generic resize sizes with Python's arithmetic), [`input`] (pixel arrays and encoded files
//!   to RGB), [`value`] (configuration values, the shared keys and their checked conversions),
//!   [`family`] (the [`FamilyConfig`] trait every family implements, and [`VisionTokens`]),
//!   [`config`] (the registry: one line per family), [`parallel`], [`store`] (streaming
//!   stores into large outputs); buffers come from [`crate::memory`].
//!
//! Each family's module owns its configuration keys, its preprocessing and its placeholder
//! token count (`num_image_tokens`, `num_video_tokens`, returned with the tensors). Adding a
//! family: its module, its `pub mod` line here, one line in [`config`]'s registry.
//!
//! A batch runs in two parallel passes over its images: decode, convert and resize each one
//! (`u8`, through [`crate::image::resize`], Pillow-exact), then allocate the output tensor once
//! and write each image's normalised values into its own slice of it. Results never depend on
//! the thread count.

pub mod clip;
pub mod config;
mod error;
pub mod family;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_unified;
pub mod glm;
pub mod idefics3;
pub mod inkling;
pub mod input;
pub mod internvl;
pub mod kimi;
pub mod llama4;
pub mod llava_next;
pub mod minimax;
pub mod mllama;
pub mod nemotron;
pub mod normalize;
pub mod parallel;
pub mod pending;
pub mod phi3v;
pub mod phi4;
pub mod pixtral;
pub mod qwen;
pub mod siglip;
pub mod sizes;
pub mod store;
pub mod torch_backend;
pub mod torch_simd;
pub mod value;

use std::borrow::Cow;
use std::mem::MaybeUninit;

use crate::image::decode::DEFAULT_MAX_PIXELS;
use crate::image::{self as img, ImageRef, ResizeOptions};
use crate::memory::{fallible, recycle};

pub use config::{Family, ProcessorConfig};
pub use error::ProcessorError;
pub use family::{FamilyConfig, VisionTokens};
pub use input::{Alpha, Input, Rgb};
pub use normalize::Normalize;
pub use sizes::SizeSpec;
pub use value::{Common, Value};

/// Largest accepted width or height of any image, input, intermediate or output (Pillow's
/// resampler limit in [`crate::image::resample::MAX_SIDE`]).
pub const MAX_SIDE: usize = img::resample::MAX_SIDE;

/// Largest output tensor, in bytes (16 GiB).
pub const MAX_OUTPUT_BYTES: u64 = 1 << 34;

/// A borrowed RGB image: `height` rows of `width × 3` bytes.
#[derive(Clone, Copy, Debug)]
pub struct RgbRef<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
}

impl RgbRef<'_> {
    /// The bytes of a row, `3 × width`, after checking that `data` holds every row: what a
    /// kernel reading pixels with raw (masked) loads relies on.
    ///
    /// Panics if it does not, or if the size overflows `usize`.
    pub fn checked_stride(&self) -> usize {
        let stride = self.width.checked_mul(3);
        let total = stride.and_then(|s| s.checked_mul(self.height));
        match (stride, total) {
            (Some(stride), Some(total)) if total <= self.data.len() => stride,
            _ => panic!(
                "a {}x{} image in {} bytes",
                self.width,
                self.height,
                self.data.len()
            ),
        }
    }
}

/// The elements of an output tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    I64(Vec<i64>),
    /// `bfloat16` values as their bits.
    Bf16(Vec<u16>),
}

/// One output tensor: row-major, `shape` dimensions.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl Tensor {
    fn i64(shape: Vec<usize>, values: Vec<i64>) -> Self {
        Tensor {
            shape,
            data: TensorData::I64(values),
        }
    }
}

/// The tensors a processor returns, by transformers' names (`pixel_values`, `image_grid_thw`,
/// `image_sizes`, `pixel_values_videos`, `video_grid_thw`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outputs {
    pub tensors: Vec<(&'static str, Tensor)>,
}

impl Outputs {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t)
    }
}

/// How to run a batch.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Threads: 0 uses one per core where the work pays for it ([`parallel::workers_for`]).
    pub threads: usize,
    /// Apply the EXIF orientation of encoded inputs (transformers does for paths).
    pub apply_exif: bool,
    /// Reject encoded images whose header declares more pixels (`None`: no limit).
    pub max_pixels: Option<u64>,
    /// What encoded images with alpha or transparency become.
    pub alpha: Alpha,
}

impl Options {
    /// The options for one item of a batch run on `workers` threads: all the batch's threads
    /// when it runs alone, one otherwise.
    pub(crate) fn per_item(&self, workers: usize) -> Options {
        Options {
            threads: if workers == 1 { self.threads } else { 1 },
            ..*self
        }
    }
}

impl Default for Options {
    /// All cores, EXIF applied, Pillow's decompression-bomb limit, [`Alpha::LoadImage`].
    fn default() -> Self {
        Options {
            threads: 0,
            apply_exif: true,
            max_pixels: Some(DEFAULT_MAX_PIXELS),
            alpha: Alpha::LoadImage,
        }
    }
}

/// A validated configuration of one family, ready to process batches.
#[derive(Clone, Debug)]
pub struct Preprocessor {
    family: Family,
    config: ProcessorConfig,
    normalize: Normalize,
    vision: Option<VisionTokens>,
}

impl Preprocessor {
    /// `family`'s transformers defaults overridden by `entries` (see [`config`]).
    pub fn new(family: Family, entries: &[(String, Value)]) -> Result<Self, ProcessorError> {
        let config = ProcessorConfig::build(family, entries)?;
        Ok(Self::from_config(family, config))
    }

    /// A preprocessor for a complete configuration (validated by [`ProcessorConfig::build`]).
    pub fn from_config(family: Family, config: ProcessorConfig) -> Self {
        let normalize = config.common().normalize();
        Preprocessor {
            family,
            config,
            normalize,
            vision: None,
        }
    }

    /// The vision-tower settings the CLIP-like families count their tokens with.
    pub fn with_vision_tokens(mut self, vision: Option<VisionTokens>) -> Self {
        self.vision = vision;
        self
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn config(&self) -> &ProcessorConfig {
        &self.config
    }

    pub fn vision_tokens(&self) -> Option<&VisionTokens> {
        self.vision.as_ref()
    }

    /// Processes a batch of images: the family's tensors, then `num_image_tokens` `(B,)` int64
    /// when the family can count them.
    pub fn images(
        &self,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        check_batch(inputs)?;
        let outputs = self.config.get().images(&self.normalize, inputs, options)?;
        Ok(self.with_tokens(outputs))
    }

    /// [`images`](Self::images), leaving `pixel_values` unwritten so that they can be written
    /// straight into their destination: the Qwen families' (and GLM's, MiniMax-M3-VL's) as
    /// [`Deferred::Patches`], whose [`qwen::Patches::tokens`] counts the tokens; LLaVA-NeXT's,
    /// Gemma 3's, Gemma 4's, InternVL's, Idefics3's and Llama 3.2 Vision's as
    /// [`Deferred::Values`]; every other family's outputs are computed ([`Deferred::Done`]).
    pub fn images_deferred<'a>(
        &self,
        inputs: &[Input<'a>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        check_batch(inputs)?;
        let deferred = self
            .config
            .get()
            .images_deferred(&self.normalize, inputs, options)?;
        Ok(self.deferred_with_tokens(deferred))
    }

    /// [`videos`](Self::videos) with `pixel_values_videos` left unwritten (see
    /// [`images_deferred`](Self::images_deferred)).
    pub fn videos_deferred<'a>(
        &self,
        videos: &[Vec<Input<'a>>],
        options: &Options,
    ) -> Result<Deferred<'a>, ProcessorError> {
        let deferred = self
            .config
            .get()
            .videos_deferred(&self.normalize, videos, options)
            .unwrap_or_else(|| Err(self.no_videos()))?;
        Ok(self.deferred_with_tokens(deferred))
    }

    /// Processes a batch of videos, each a list of frames (Qwen families only): the tensors,
    /// then `num_video_tokens` `(V,)` int64.
    pub fn videos(
        &self,
        videos: &[Vec<Input<'_>>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        let outputs = self
            .config
            .get()
            .videos(&self.normalize, videos, options)
            .unwrap_or_else(|| Err(self.no_videos()))?;
        Ok(self.with_tokens(outputs))
    }

    fn no_videos(&self) -> ProcessorError {
        ProcessorError::config(
            "videos",
            "a Qwen family (qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5)",
            self.family.name(),
        )
    }

    /// `outputs` with the family's token counts appended (`num_image_tokens`,
    /// `num_video_tokens`), those it can count.
    fn with_tokens(&self, mut outputs: Outputs) -> Outputs {
        let images = self.config.image_tokens(&outputs, self.vision.as_ref());
        let videos = self.config.video_tokens(&outputs);
        if let Some(counts) = images {
            outputs
                .tensors
                .push(("num_image_tokens", family::tokens_tensor(counts)));
        }
        if let Some(counts) = videos {
            outputs
                .tensors
                .push(("num_video_tokens", family::tokens_tensor(counts)));
        }
        outputs
    }

    fn deferred_with_tokens<'a>(&self, deferred: Deferred<'a>) -> Deferred<'a> {
        match deferred {
            Deferred::Done(outputs) => Deferred::Done(self.with_tokens(outputs)),
            Deferred::Values {
                pending,
                filled,
                rest,
            } => {
                // The token rules read the planned tensors' shapes only (never their values):
                // they see them as empty stand-ins of those shapes, dropped again afterwards.
                let mut outputs = rest;
                let stand_in = |shape: &[usize], data| Tensor {
                    shape: shape.to_vec(),
                    data,
                };
                outputs.tensors.push((
                    pending.name(),
                    stand_in(pending.shape(), TensorData::F32(Vec::new())),
                ));
                for f in &filled {
                    outputs
                        .tensors
                        .push((f.name(), stand_in(f.shape(), TensorData::I64(Vec::new()))));
                }
                let mut outputs = self.with_tokens(outputs);
                outputs.tensors.retain(|(name, _)| {
                    *name != pending.name() && filled.iter().all(|f| f.name() != *name)
                });
                Deferred::Values {
                    pending,
                    filled,
                    rest: outputs,
                }
            }
            patches => patches,
        }
    }
}

fn check_batch(inputs: &[Input<'_>]) -> Result<(), ProcessorError> {
    if inputs.is_empty() {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    Ok(())
}

/// A batch processed but for its largest tensor, which is written later, where it is needed.
#[derive(Debug)]
pub enum Deferred<'a> {
    /// Qwen: the patches to write (`pixel_values` or `pixel_values_videos`); the grid is known.
    Patches(Box<qwen::Patches<'a>>),
    /// A family with a [`pending::WriteValues`] writer: its largest tensor planned, the other
    /// outputs (token counts included) computed.
    Values {
        pending: Box<pending::Pending<'a>>,
        /// Tensors of one constant value, planned too (Idefics3's `pixel_attention_mask`).
        filled: Vec<pending::Filled>,
        rest: Outputs,
    },
    /// Every other family: the outputs, computed.
    Done(Outputs),
}

/// Pillow's `Image.resize((out_w, out_h), filter, reducing_gap=None)` of an RGB image; the
/// image itself when the size is unchanged (Pillow copies it).
pub(crate) fn resize_rgb<'a>(
    src: Rgb<'a>,
    out_h: usize,
    out_w: usize,
    common: &Common,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    if (out_h, out_w) == (src.height, src.width) {
        return Ok(src);
    }
    check_side("resized image", out_h, out_w)?;
    let options = ResizeOptions {
        filter: common.resample,
        pass_order: common.pass_order,
        region: None,
        threads,
        simd: true,
    };
    let image = ImageRef {
        data: &src.data,
        width: src.width,
        height: src.height,
        channels: 3,
    };
    let len = out_h * out_w * 3;
    let mut data =
        crate::memory::overwritable_bytes(len).map_err(|bytes| ProcessorError::OutOfMemory {
            what: "resized image",
            bytes,
        })?;
    img::resize_into(&image, &mut data, out_w, out_h, &options)
        .map_err(|error| ProcessorError::Resample { index: 0, error })?;
    recycle_images([src]);
    Ok(Rgb {
        data: Cow::Owned(data),
        width: out_w,
        height: out_h,
    })
}

/// The bytes of `data` as an owned vector: moved when already owned, else copied (fallibly: a
/// borrowed input array can be large).
pub(crate) fn owned_bytes(
    data: Cow<'_, [u8]>,
    what: &'static str,
) -> Result<Vec<u8>, ProcessorError> {
    match data {
        Cow::Owned(bytes) => Ok(bytes),
        Cow::Borrowed(bytes) => fallible::copied(bytes).map_err(ProcessorError::oom(what)),
    }
}

/// `rgb` owning its pixels: moved when owned already, else copied (fallibly: a borrowed input
/// array can be large).
pub(crate) fn owned_rgb(rgb: Rgb<'_>) -> Result<Rgb<'static>, ProcessorError> {
    Ok(Rgb {
        width: rgb.width,
        height: rgb.height,
        data: Cow::Owned(owned_bytes(rgb.data, "copy of an image")?),
    })
}

/// Hands the images a batch owns (resized or decoded, not the caller's arrays) to [`recycle`] for
/// the next batch.
pub(crate) fn recycle_images<'a>(images: impl IntoIterator<Item = Rgb<'a>>) {
    for image in images {
        if let Cow::Owned(data) = image.data {
            recycle::give_u8(data);
        }
    }
}

/// Largest `u8` image made along the way (the resampler's limit): `height × width × 3` bytes.
pub const MAX_IMAGE_BYTES: usize = img::resample::MAX_BYTES;

/// An RGB image of `height × width` within [`MAX_SIDE`] and [`MAX_IMAGE_BYTES`]; its length.
pub(crate) fn check_image(
    what: &'static str,
    height: usize,
    width: usize,
) -> Result<usize, ProcessorError> {
    check_side(what, height, width)?;
    let bytes = height as u64 * width as u64 * 3;
    if bytes > MAX_IMAGE_BYTES as u64 {
        return Err(ProcessorError::TooLarge {
            what,
            limit: MAX_IMAGE_BYTES as u64,
            actual: bytes,
        });
    }
    Ok(bytes as usize)
}

/// Both sides within 1 ..= [`MAX_SIDE`].
pub(crate) fn check_side(
    what: &'static str,
    height: usize,
    width: usize,
) -> Result<(), ProcessorError> {
    if height == 0 || width == 0 {
        return Err(ProcessorError::shape(
            what,
            "a non-empty size",
            format!("{height}x{width} (HxW)"),
        ));
    }
    if height > MAX_SIDE || width > MAX_SIDE {
        return Err(ProcessorError::TooLarge {
            what,
            limit: MAX_SIDE as u64,
            actual: height.max(width) as u64,
        });
    }
    Ok(())
}

/// The product of `dims`, checked against [`MAX_OUTPUT_BYTES`] for `itemsize`-byte elements.
pub(crate) fn checked_len(
    what: &'static str,
    dims: &[usize],
    itemsize: usize,
) -> Result<usize, ProcessorError> {
    let mut n: u128 = 1;
    for &d in dims {
        n = n.saturating_mul(d as u128);
    }
    let bytes = n.saturating_mul(itemsize as u128);
    if bytes > u128::from(MAX_OUTPUT_BYTES) {
        return Err(ProcessorError::TooLarge {
            what,
            limit: MAX_OUTPUT_BYTES,
            actual: u64::try_from(bytes).unwrap_or(u64::MAX),
        });
    }
    Ok(n as usize)
}

/// An output value before it is written.
pub(crate) type Out = MaybeUninit<f32>;

/// An output buffer of `len` values (`float32`, or `bfloat16` bits as `u16`), not yet written,
/// or an error instead of an abort when the memory cannot be had; a recycled one ([`recycle`])
/// when one fits. Not zeroing it saves a pass over tens of MB: every writer writes every value of
/// its slice, and [`OutBuf::finish`] is only called once all slices are written.
pub(crate) struct OutBuf<T>(Vec<MaybeUninit<T>>);

/// The `float32` output buffer of most families.
pub(crate) type OutBuffer = OutBuf<f32>;

impl<T: recycle::Element> OutBuf<T> {
    pub fn new(what: &'static str, len: usize) -> Result<Self, ProcessorError> {
        if let Some(values) = recycle::take_uninit::<T>(len) {
            return Ok(OutBuf(values));
        }
        let mut values = fallible::uninit::<T>(len).map_err(ProcessorError::oom(what))?;
        // Fresh pages, not yet touched: one fault per 2 MiB instead of per 4 KiB, and all of
        // them mapped at once. Every value is written next: an output is allocated once every
        // image of the batch has been decoded and resized, and sized from them.
        crate::memory::advise_huge_pages(&mut values);
        crate::memory::prefault(&mut values, 1);
        Ok(OutBuf(values))
    }

    pub fn slices(&mut self, lengths: &[usize]) -> Vec<&mut [MaybeUninit<T>]> {
        split_lengths(&mut self.0, lengths)
    }

    /// The values, once every one has been written.
    ///
    /// # Safety
    ///
    /// Every element must have been written (`MaybeUninit::write` or a copy of a written value).
    pub unsafe fn finish(self) -> Vec<T> {
        let mut values = std::mem::ManuallyDrop::new(self.0);
        let (ptr, len, capacity) = (values.as_mut_ptr(), values.len(), values.capacity());
        // SAFETY: `MaybeUninit<T>` has the size, alignment and layout of `T`; the buffer comes
        // from a `Vec<MaybeUninit<T>>` with this length and capacity, whose ownership moves to
        // the new Vec (the old one is never dropped); the caller guarantees that all `len`
        // values are initialised.
        unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, capacity) }
    }
}

/// Splits `out` into consecutive slices of the given lengths (which must sum to `out.len()`).
pub(crate) fn split_lengths<'a, T>(mut out: &'a mut [T], lengths: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (head, tail) = out.split_at_mut(len.min(out.len()));
        parts.push(head);
        out = tail;
    }
    parts
}

/// Phase 1 of a batch: `f` on every input on up to `options.threads` threads (automatic: one per
/// [`parallel::MIN_PIXELS_PER_WORKER`] of the inputs), the first error (by input index)
/// returned. `f` gets the resize thread count to use.
pub(crate) fn prepare_all<'a, P, F>(
    inputs: &[Input<'a>],
    options: &Options,
    f: F,
) -> Result<Vec<P>, ProcessorError>
where
    P: Send,
    F: Fn(Rgb<'a>, usize) -> Result<P, ProcessorError> + Sync,
{
    prepare_all_indexed(inputs, options, |_, rgb, threads| f(rgb, threads))
}

/// [`prepare_all`] with `f` also given the input's index in the batch.
pub(crate) fn prepare_all_indexed<'a, P, F>(
    inputs: &[Input<'a>],
    options: &Options,
    f: F,
) -> Result<Vec<P>, ProcessorError>
where
    P: Send,
    F: Fn(usize, Rgb<'a>, usize) -> Result<P, ProcessorError> + Sync,
{
    // Pixels by the headers (bytes where a header does not say), read only when they matter: an
    // automatic thread count for several images, or their order on several threads.
    let costs: Vec<u64> = if inputs.len() > 1 && options.threads != 1 {
        inputs.iter().map(Input::cost_hint).collect()
    } else {
        Vec::new()
    };
    let work = costs.iter().fold(0u64, |sum, &c| sum.saturating_add(c));
    let workers = parallel::decoders(options.threads, inputs.len(), work);
    // One image decodes and resizes with all the batch's threads (a batch too small to share
    // out: each image in turn), several with one each.
    let item = options.per_item(workers);
    // the largest images first, so that none is left for last to one thread while the others idle
    let order = if workers > 1 {
        parallel::costliest_first(&costs)
    } else {
        Vec::new()
    };
    let inputs = fallible::copied(inputs).map_err(ProcessorError::oom("batch"))?;
    let results = parallel::map_in_order(inputs, workers, &order, |i, input| {
        input
            .to_rgb(&item)
            .and_then(|rgb| f(i, rgb, item.threads))
            .map_err(|e| e.at(i))
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_alloc() {
        let mut buffer = OutBuffer::new("t", 10).unwrap();
        let parts = buffer.slices(&[3, 0, 7]);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [3, 0, 7]);
        for part in parts {
            part.fill(Out::new(1.5));
        }
        // SAFETY: every value was just written.
        assert_eq!(unsafe { buffer.finish() }, vec![1.5; 10]);
        assert!(checked_len("t", &[1 << 20, 1 << 20, 1 << 20], 4).is_err());
        assert_eq!(checked_len("t", &[2, 3], 4).unwrap(), 6);
    }

    #[test]
    fn an_automatic_batch_shares_out_only_the_work_that_pays() {
        // Each image's closure sees the thread count it may use itself and runs on some thread.
        let run = |side: usize, images: usize, threads: usize| {
            let data = vec![9u8; side * side * 3];
            let input = Input::Pixels {
                data: &data,
                width: side,
                height: side,
                channels: 3,
            };
            let options = Options {
                threads,
                ..Options::default()
            };
            prepare_all_indexed(&vec![input; images], &options, |_, _, item_threads| {
                Ok((item_threads, std::thread::current().id()))
            })
            .unwrap()
        };
        let here = std::thread::current().id();
        // Two 128 x 128 images (32 768 pixels in all, under one thread's share): in turn on the
        // calling thread, each with the batch's automatic count for its own decode and resize.
        assert_eq!(run(128, 2, 0), vec![(0, here); 2]);
        // Two 256 x 256 images (131 072 pixels: two shares): one thread each where there are two
        // cores, each image on one.
        let shared = run(256, 2, 0);
        let expected = if crate::cores::count() >= 2 { 1 } else { 0 };
        assert!(shared.iter().all(|&(t, _)| t == expected), "{shared:?}");
        // A count the caller gave is kept, however small the batch.
        assert!(run(16, 2, 2).iter().all(|&(t, _)| t == 1));
        assert_eq!(run(16, 2, 1), vec![(1, here); 2]);
    }

    #[test]
    fn empty_batch_and_videos_elsewhere() {
        let p = Preprocessor::new(Family::Clip, &[]).unwrap();
        assert_eq!(
            p.images(&[], &Options::default()).unwrap_err().kind(),
            "image_shape"
        );
        let err = p.videos(&[], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "config");
    }
}
