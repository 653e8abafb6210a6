//! CLIP and LLaVA-1.5 (`CLIPImageProcessorPil`, `LlavaImageProcessorPil`) — and the generic
//! `PilBackend` pipeline that SigLIP ([`super::siglip`]) also runs:
//!
//! 1. LLaVA's `do_pad` only: pad to a square on `u8`, the image centred (`(max − side) // 2`
//!    before it), the background `int(mean · 255)` per channel — (122, 116, 104) for CLIP's mean;
//! 2. resize (`size`: shortest edge → `int(s · long / short)`, or an exact size, …; BICUBIC by
//!    default, Pillow-exact);
//! 3. center crop to `crop_size` on `u8`: `top = (H − ch) // 2`, or zero padding when the crop is
//!    larger (`ceil((ch − H) / 2)` rows before the image, the rest after);
//! 4. rescale and normalize, channels first → `pixel_values` `(B, 3, H, W)` float32;
//! 5. CLIP/SigLIP's generic `do_pad` only: pad each image at the bottom and right with `0.0` to
//!    `pad_size` (or the largest image of the batch).

use super::family::{FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::sizes::{center_crop_origin, SizeSpec};
use super::value::{
    as_bool, as_hw, as_size, check_crop, hf_clip_like, hf_pad_size, hf_put, hw_value,
    resize_crop_entries, Common, Raw, Value, CLIP_MEAN, CLIP_STD,
};
use super::{
    checked_len, parallel, prepare_all, resize_rgb, Input, Options, Out, OutBuffer, Outputs,
    ProcessorError, Rgb, Tensor, TensorData,
};
use crate::memory::fallible;
use std::borrow::Cow;

/// The keys of the CLIP-like classes over the shared ones.
pub const CLIP_KEYS: [&str; 2] = ["do_center_crop", "do_pad"];

/// CLIP: `CLIPImageProcessor`. An int `size` is a shortest edge, an int `crop_size`/`pad_size`
/// a square; `use_square_size` makes `size` a square of the class's shortest edge, 224 (as
/// `CLIPImageProcessorPil.__init__` does).
pub const CLIP: Hf = Hf {
    image_classes: &["CLIPImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        let mut out = hf_clip_like(config, &CLIP_KEYS, false)?;
        if config
            .iter()
            .any(|(k, v)| k == "use_square_size" && v.truthy())
        {
            let side = Raw::Int(224);
            let square = vec![("height".into(), side.clone()), ("width".into(), side)];
            hf_put(&mut out, "size", Raw::Map(square));
        }
        hf_pad_size(config, &mut out)?;
        Ok(out)
    },
    processor_keys: &[],
    processor_forces: None,
    // A bare CLIP tower has no prompt; its canonical VLM is LLaVA-1.5 (llava-hf/llava-1.5-7b-hf:
    // CLIP ViT-L/14-336 through CLIPImageProcessor).
    published: Some(Published::LLAVA),
    count_tensor: None,
};

/// LLaVA-1.5: `LlavaImageProcessor` (CLIP's keys, without `pad_size`).
pub const LLAVA: Hf = Hf {
    image_classes: &["LlavaImageProcessor"],
    video_classes: &[],
    normalise: |config| hf_clip_like(config, &CLIP_KEYS, false),
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::LLAVA),
    count_tensor: None,
};

/// Which class's meaning `do_pad` has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// `PilBackend`: pad the normalised images to `pad_size` (bottom/right, `0.0`).
    Batch,
    /// `LlavaImageProcessorPil`: pad each `u8` image to a square with the mean colour first.
    Square,
}

/// The configuration of CLIP, LLaVA-1.5 and SigLIP.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipConfig {
    pub common: Common,
    pub size: SizeSpec,
    pub do_center_crop: bool,
    /// `(height, width)`.
    pub crop_size: Option<(usize, usize)>,
    pub pad_mode: PadMode,
    pub do_pad: bool,
    /// `(height, width)` for [`PadMode::Batch`]; `None`: the batch's largest image.
    pub pad_size: Option<(usize, usize)>,
}

impl ClipConfig {
    /// `CLIPImageProcessorPil`'s class defaults.
    pub fn clip() -> Self {
        ClipConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            size: SizeSpec::ShortestEdge(224),
            do_center_crop: true,
            crop_size: Some((224, 224)),
            pad_mode: PadMode::Batch,
            do_pad: false,
            pad_size: None,
        }
    }

    /// `LlavaImageProcessorPil`'s class defaults (`do_pad` off).
    pub fn llava() -> Self {
        ClipConfig {
            pad_mode: PadMode::Square,
            ..Self::clip()
        }
    }

    /// The background of LLaVA's pad to square: `int(mean * 255)` per channel.
    pub fn square_background(&self) -> Result<[u8; 3], ProcessorError> {
        let mut out = [0u8; 3];
        for (slot, mean) in out.iter_mut().zip(self.common.image_mean) {
            let v = (mean * 255.0).trunc();
            if !(0.0..=255.0).contains(&v) {
                return Err(ProcessorError::config(
                    "image_mean",
                    "values whose int(mean * 255) is a uint8 (LLaVA's pad colour)",
                    self.common.image_mean,
                ));
            }
            *slot = v as u8;
        }
        Ok(out)
    }
}

impl FamilyConfig for ClipConfig {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "size" => self.size = as_size("size", value)?,
            "do_center_crop" => self.do_center_crop = as_bool("do_center_crop", value)?,
            "crop_size" => self.crop_size = Some(as_hw("crop_size", value)?),
            "do_pad" => self.do_pad = as_bool("do_pad", value)?,
            "pad_size" => {
                self.pad_size = match value {
                    Value::None => None,
                    other => Some(as_hw("pad_size", other)?),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut out =
            resize_crop_entries(self.size, self.do_center_crop, self.crop_size, self.do_pad);
        if self.pad_mode == PadMode::Batch {
            out.push(("pad_size", self.pad_size.map_or(Value::None, hw_value)));
        }
        out
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        check_crop(self.do_center_crop, self.crop_size)?;
        if self.pad_mode == PadMode::Square {
            self.square_background()?;
        }
        Ok(())
    }

    fn images(
        &self,
        normalize: &Normalize,
        inputs: &[Input<'_>],
        options: &Options,
    ) -> Result<Outputs, ProcessorError> {
        images(self, normalize, inputs, options)
    }

    /// `LlavaProcessor`'s count, the same for every image of the batch: needs [`VisionTokens`].
    fn image_tokens(&self, outputs: &Outputs, vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let vision = vision?;
        let shape = &outputs.get("pixel_values")?.shape;
        let [batch, .., height, width] = shape[..] else {
            return None;
        };
        Some(vec![llava_tokens(height, width, vision); batch])
    }
}

/// `LlavaProcessor`: the tokens of a processed image of `height × width`,
/// `(height / p) · (width / p) + num_additional_image_tokens`, less one for the `"default"`
/// strategy.
pub fn llava_tokens(height: usize, width: usize, vision: &VisionTokens) -> i64 {
    let p = vision.patch_size;
    vision.adjust(((height / p) * (width / p)) as i64 + vision.num_additional_image_tokens)
}

/// LLaVA's `pad_to_square`: the image centred on a square of `background`.
pub fn pad_to_square(rgb: Rgb<'_>, background: [u8; 3]) -> Result<Rgb<'_>, ProcessorError> {
    let (h, w) = (rgb.height, rgb.width);
    if h == w {
        return Ok(rgb);
    }
    let side = h.max(w);
    super::check_image("image padded to a square", side, side)?;
    let mut data: Vec<u8> = background.repeat(side * side);
    let (top, left) = if w > h {
        ((side - h) / 2, 0)
    } else {
        (0, (side - w) / 2)
    };
    for (y, row) in rgb.data.chunks_exact(w * 3).enumerate() {
        let at = ((top + y) * side + left) * 3;
        data[at..at + w * 3].copy_from_slice(row);
    }
    Ok(Rgb {
        data: Cow::Owned(data),
        width: side,
        height: side,
    })
}

/// An image resized, with its crop window.
pub(crate) struct Prepared<'a> {
    pub image: Rgb<'a>,
    /// `(top, left)` of the crop window (negative: zero padding).
    pub origin: (isize, isize),
    /// `(height, width)` of the output.
    pub out: (usize, usize),
}

impl Prepared<'_> {
    pub fn write(&self, normalize: &Normalize, out: &mut [Out]) {
        normalize.write_chw(
            self.image.view(),
            self.origin.0,
            self.origin.1,
            self.out.0,
            self.out.1,
            out,
        );
    }
}

/// Resize by `size`, then center crop (as a window) — steps 2 and 3 of the module docs.
pub(crate) fn resize_and_crop<'a>(
    common: &Common,
    size: SizeSpec,
    crop: Option<(usize, usize)>,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let image = if common.do_resize {
        let (h, w) = size.output(rgb.height, rgb.width);
        resize_rgb(rgb, h, w, common, threads)?
    } else {
        rgb
    };
    let (origin, out) = match crop {
        Some((ch, cw)) => (
            center_crop_origin(image.height, image.width, ch, cw),
            (ch, cw),
        ),
        None => ((0, 0), (image.height, image.width)),
    };
    Ok(Prepared { image, origin, out })
}

fn prepare<'a>(
    config: &ClipConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let rgb = if config.pad_mode == PadMode::Square && config.do_pad {
        pad_to_square(rgb, config.square_background()?)?
    } else {
        rgb
    };
    let crop = config.crop_size.filter(|_| config.do_center_crop);
    resize_and_crop(&config.common, config.size, crop, rgb, threads)
}

/// The common `(height, width)` of a batch: all equal, or the padding target.
fn batch_size(
    config: &ClipConfig,
    prepared: &[Prepared<'_>],
) -> Result<(usize, usize), ProcessorError> {
    let batch_pad = config.pad_mode == PadMode::Batch && config.do_pad;
    if !batch_pad {
        let first = prepared[0].out;
        if let Some(p) = prepared.iter().find(|p| p.out != first) {
            return Err(ProcessorError::BatchShape {
                what: "processed images",
                expected: vec![3, first.0, first.1],
                actual: vec![3, p.out.0, p.out.1],
            });
        }
        return Ok(first);
    }
    let target = config.pad_size.unwrap_or_else(|| {
        let h = prepared.iter().map(|p| p.out.0).max().unwrap_or(0);
        let w = prepared.iter().map(|p| p.out.1).max().unwrap_or(0);
        (h, w)
    });
    if let Some(p) = prepared
        .iter()
        .find(|p| p.out.0 > target.0 || p.out.1 > target.1)
    {
        return Err(ProcessorError::config(
            "pad_size",
            format!("at least the image size {}x{}", p.out.0, p.out.1),
            target,
        ));
    }
    Ok(target)
}

/// Writes one prepared image into its `3 × h × w` output, padded bottom/right with `0.0`. On
/// `Err` (a smaller image's staging buffer could not be allocated) nothing has been written.
pub(crate) fn write_padded(
    p: &Prepared<'_>,
    normalize: &Normalize,
    (h, w): (usize, usize),
    out: &mut [Out],
) -> Result<(), ProcessorError> {
    if p.out == (h, w) {
        p.write(normalize, out);
        return Ok(());
    }
    let (ih, iw) = p.out;
    let mut own =
        fallible::filled(Out::new(0.0), 3 * ih * iw).map_err(ProcessorError::oom("image"))?;
    p.write(normalize, &mut own);
    out.fill(Out::new(0.0));
    for c in 0..3 {
        for y in 0..ih {
            let src = &own[(c * ih + y) * iw..][..iw];
            out[(c * h + y) * w..][..iw].copy_from_slice(src);
        }
    }
    Ok(())
}

/// The pipeline of the module docs on a batch: `pixel_values` `(B, 3, H, W)` float32.
pub fn images(
    config: &ClipConfig,
    normalize: &Normalize,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let (h, w) = batch_size(config, &prepared)?;
    let per_image = checked_len("pixel_values", &[3, h, w], 4)?;
    let len = checked_len("pixel_values", &[prepared.len(), 3, h, w], 4)?;
    let mut pixel_values = OutBuffer::new("pixel_values", len)?;
    let slices = pixel_values.slices(&vec![per_image; prepared.len()]);
    let jobs: Vec<(&Prepared<'_>, &mut [Out])> = prepared.iter().zip(slices).collect();
    let workers = parallel::writers(options.threads, jobs.len(), 4 * len);
    parallel::map(jobs, workers, |_, (p, out)| {
        write_padded(p, normalize, (h, w), out)
    })
    .into_iter()
    .collect::<Result<(), _>>()?;
    // SAFETY: one slice per image covers the buffer, and write_padded wrote all of it (every
    // image succeeded, or we returned above).
    let pixel_values = unsafe { pixel_values.finish() };
    Ok(Outputs {
        tensors: vec![(
            "pixel_values",
            Tensor {
                shape: vec![prepared.len(), 3, h, w],
                data: TensorData::F32(pixel_values),
            },
        )],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn llava_background_truncates() {
        assert_eq!(
            ClipConfig::llava().square_background().unwrap(),
            [122, 116, 104]
        );
    }

    #[test]
    fn square_padding_is_centred() {
        let rgb = Rgb {
            data: Cow::Owned(vec![9; 3 * 2 * 3]),
            width: 3,
            height: 2,
        };
        let sq = pad_to_square(rgb, [1, 2, 3]).unwrap();
        assert_eq!((sq.width, sq.height), (3, 3));
        // (3 - 2) // 2 = 0 rows before: rows 0 and 1 are the image, row 2 background.
        assert_eq!(&sq.data[..9], &[9; 9]);
        assert_eq!(&sq.data[18..], &[1, 2, 3, 1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn clip_shapes() {
        let data = vec![128u8; 600 * 512 * 3];
        let input = Input::Pixels {
            data: &data,
            width: 512,
            height: 600,
            channels: 3,
        };
        let p = Preprocessor::new(Family::Clip, &[]).unwrap();
        let out = p.images(&[input, input], &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, [2, 3, 224, 224]);
        // No crop and a shortest-edge size: images of different shapes cannot be stacked.
        let other = vec![0u8; 10 * 20 * 3];
        let small = Input::Pixels {
            data: &other,
            width: 20,
            height: 10,
            channels: 3,
        };
        let p = Preprocessor::new(
            Family::Clip,
            &[("do_center_crop".into(), Value::Bool(false))],
        )
        .unwrap();
        let err = p.images(&[input, small], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "batch_shape");
        // ... unless padded.
        let p = Preprocessor::new(
            Family::Clip,
            &[
                ("do_center_crop".into(), Value::Bool(false)),
                ("do_pad".into(), Value::Bool(true)),
            ],
        )
        .unwrap();
        let out = p.images(&[input, small], &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, [2, 3, 262, 448]);
    }
}
