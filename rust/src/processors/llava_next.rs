//! LLaVA-NeXT (`LlavaNextImageProcessorPil`): "anyres" tiles plus a base image.
//!
//! Per image of `(H, W)`:
//! 1. [`select_best_resolution`] among `image_grid_pinpoints`;
//! 2. resize to [`patch_output_size`] (aspect kept, `ceil`), then pad with `0` (on `u8`) to the
//!    pinpoint, centred (`(target − new) // 2` before, the remainder after);
//! 3. cut into `crop_size["height"]`-sized tiles, row-major (edge tiles may be smaller);
//! 4. the base image: the original resized (distorting) to `(size.height, size.width)` or
//!    `(shortest_edge, shortest_edge)`; the items are `[base] + tiles`;
//! 5. each item: resize by `size`, center crop, rescale, normalize.
//!
//! `pixel_values` `(B, P, 3, h, w)` float32 with `P` the most items of any image (others padded
//! with `0.0`), `image_sizes` `(B, 2)` int64 = the original `(H, W)`.

use super::clip::{resize_and_crop, Prepared};
use super::family::{i64_values, FamilyConfig, Hf, Published, VisionTokens};
use super::normalize::Normalize;
use super::pending::{self, Pending, Tiles};
use super::sizes::SizeSpec;
use super::value::{
    as_bool, as_hw, as_size, check_crop, hf_clip_like, resize_crop_entries, Common, Value,
    CLIP_MEAN, CLIP_STD,
};
use super::{
    check_image, check_side, checked_len, prepare_all, resize_rgb, Input, Options, Outputs,
    ProcessorError, Rgb, Tensor,
};
use crate::memory::fallible;
use std::borrow::Cow;

/// LLaVA-NeXT: `LlavaNextImageProcessor` (an int `size` is a shortest edge, an int `crop_size` a
/// square).
pub const LLAVA_NEXT: Hf = Hf {
    image_classes: &["LlavaNextImageProcessor"],
    video_classes: &[],
    normalise: |config| {
        hf_clip_like(
            config,
            &["do_center_crop", "do_pad", "image_grid_pinpoints"],
            false,
        )
    },
    processor_keys: &[],
    processor_forces: None,
    published: Some(Published::LLAVA),
    count_tensor: None,
};

/// The configuration of LLaVA-NeXT.
#[derive(Clone, Debug, PartialEq)]
pub struct LlavaNextConfig {
    pub common: Common,
    pub size: SizeSpec,
    pub do_center_crop: bool,
    /// `(height, width)`.
    pub crop_size: Option<(usize, usize)>,
    /// `(height, width)` of every candidate resolution.
    pub image_grid_pinpoints: Vec<(usize, usize)>,
    /// Pad the item count of every image to the batch's largest.
    pub do_pad: bool,
}

const MAX_PINPOINTS: usize = 1024;

impl LlavaNextConfig {
    /// `LlavaNextImageProcessorPil`'s class defaults.
    pub fn llava_next() -> Self {
        LlavaNextConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            size: SizeSpec::ShortestEdge(224),
            do_center_crop: true,
            crop_size: Some((224, 224)),
            image_grid_pinpoints: vec![
                (336, 672),
                (672, 336),
                (672, 672),
                (1008, 336),
                (336, 1008),
            ],
            do_pad: true,
        }
    }

    /// The base image's `(height, width)`: `size`'s height and width, or its shortest edge twice.
    fn base_size(&self) -> (usize, usize) {
        match self.size {
            SizeSpec::Exact { height, width } => (height, width),
            SizeSpec::ShortestEdge(s) | SizeSpec::ShortestLongest { shortest: s, .. } => (s, s),
            // transformers would resize to (None, None) and fail; use the bounds instead.
            SizeSpec::MaxHeightWidth { height, width } => (height, width),
        }
    }

    /// The tile side: `crop_size["height"]`, else `size["height"]`, else `shortest_edge`.
    fn tile_size(&self) -> usize {
        match (self.crop_size, self.size) {
            (Some((h, _)), _) => h,
            (None, SizeSpec::Exact { height, .. }) => height,
            (None, SizeSpec::ShortestEdge(s) | SizeSpec::ShortestLongest { shortest: s, .. }) => s,
            (None, SizeSpec::MaxHeightWidth { height, .. }) => height,
        }
    }
}

impl FamilyConfig for LlavaNextConfig {
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
            "image_grid_pinpoints" => {
                let bad = || {
                    ProcessorError::config(
                        "image_grid_pinpoints",
                        format!(
                            "1 to {MAX_PINPOINTS} [height, width] pairs of sizes between 1 and {}",
                            super::MAX_SIDE
                        ),
                        value,
                    )
                };
                let Value::Pairs(pairs) = value else {
                    return Err(bad());
                };
                if pairs.is_empty() || pairs.len() > MAX_PINPOINTS {
                    return Err(bad());
                }
                let ok = |v: i64| v >= 1 && v as u64 <= super::MAX_SIDE as u64;
                if !pairs.iter().all(|&(h, w)| ok(h) && ok(w)) {
                    return Err(bad());
                }
                self.image_grid_pinpoints = pairs
                    .iter()
                    .map(|&(h, w)| (h as usize, w as usize))
                    .collect();
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let mut out =
            resize_crop_entries(self.size, self.do_center_crop, self.crop_size, self.do_pad);
        out.push((
            "image_grid_pinpoints",
            Value::Pairs(
                self.image_grid_pinpoints
                    .iter()
                    .map(|&(h, w)| (h as i64, w as i64))
                    .collect(),
            ),
        ));
        out
    }

    fn validate(&self) -> Result<(), ProcessorError> {
        check_crop(self.do_center_crop, self.crop_size)
    }

    // LLaVA-NeXT on a batch (see the module docs).
    pending::planned_images!(plan);

    /// `LlavaNextProcessor._get_number_of_features` per image: needs [`VisionTokens`].
    fn image_tokens(&self, outputs: &Outputs, vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let vision = vision?;
        let shape = &outputs.get("pixel_values")?.shape;
        let [.., height, width] = shape[..] else {
            return None;
        };
        let sizes = i64_values(outputs, "image_sizes")?;
        Some(
            sizes
                .chunks_exact(2)
                .map(|hw| {
                    let orig = (hw[0].max(0) as usize, hw[1].max(0) as usize);
                    llava_next_tokens(orig, (height, width), &self.image_grid_pinpoints, vision)
                })
                .collect(),
        )
    }
}

/// transformers' `select_best_resolution((height, width), pinpoints)`: the pinpoint keeping the
/// most pixels (`min(int(W·s)·int(H·s), W·H)`), ties to the least wasted area, first wins.
pub fn select_best_resolution(
    height: usize,
    width: usize,
    pinpoints: &[(usize, usize)],
) -> (usize, usize) {
    let (h, w) = (height as f64, width as f64);
    let mut best = pinpoints[0];
    let mut max_effective: u64 = 0;
    let mut min_wasted = f64::INFINITY;
    for &(ph, pw) in pinpoints {
        let (sw, sh) = (pw as f64 / w, ph as f64 / h);
        // Python's min(a, b): a unless b < a.
        let scale = if sh < sw { sh } else { sw };
        let down_w = (w * scale) as u64;
        let down_h = (h * scale) as u64;
        let effective = (down_w * down_h).min(width as u64 * height as u64);
        let wasted = (pw as u64 * ph as u64) as f64 - effective as f64;
        if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
            max_effective = effective;
            min_wasted = wasted;
            best = (ph, pw);
        }
    }
    best
}

/// `LlavaNextProcessor._get_number_of_features` (then less one for the `"default"` strategy):
/// the tokens of an image of `orig` `(height, width)` processed into tiles of `tile`
/// `(height, width)` (`pixel_values`' last two sides).
pub fn llava_next_tokens(
    orig: (usize, usize),
    tile: (usize, usize),
    pinpoints: &[(usize, usize)],
    vision: &VisionTokens,
) -> i64 {
    let (orig_h, orig_w) = orig;
    let (height, width) = tile;
    if orig_h == 0 || orig_w == 0 || height == 0 || width == 0 || pinpoints.is_empty() {
        return 0;
    }
    let (best_h, best_w) = select_best_resolution(orig_h, orig_w, pinpoints);
    let (scale_h, scale_w) = (best_h / height, best_w / width);
    let patches_h = height / vision.patch_size;
    let patches_w = width / vision.patch_size;
    let mut current_h = (patches_h * scale_h) as i64;
    let mut current_w = (patches_w * scale_w) as i64;
    if current_h == 0 || current_w == 0 {
        return 0;
    }
    let original_aspect = orig_w as f64 / orig_h as f64;
    let current_aspect = current_w as f64 / current_h as f64;
    if original_aspect > current_aspect {
        let new_h = round7_trunc(orig_h as f64 * (current_w as f64 / orig_w as f64));
        let padding = (current_h - new_h).div_euclid(2);
        current_h -= padding * 2;
    } else {
        let new_w = round7_trunc(orig_w as f64 * (current_h as f64 / orig_h as f64));
        let padding = (current_w - new_w).div_euclid(2);
        current_w -= padding * 2;
    }
    let unpadded = current_h * current_w;
    let newline = current_h;
    let base = (patches_h * patches_w) as i64 + vision.num_additional_image_tokens;
    vision.adjust(unpadded + newline + base)
}

/// Python's `int(round(x, 7))` for a non-negative `x`: `x` rounded to 7 decimals, truncated.
/// Only whether `x` lies within `5e-8` below an integer matters to the truncation; `x · 1e7`
/// rounded tells that apart except at an exact tie, which the ratios of image sides never hit.
fn round7_trunc(x: f64) -> i64 {
    ((x * 1e7).round() / 1e7).trunc() as i64
}

/// transformers' `get_patch_output_size`: the size the image is resized to inside `target`.
pub fn patch_output_size(height: usize, width: usize, target: (usize, usize)) -> (usize, usize) {
    let (th, tw) = target;
    let scale_w = tw as f64 / width as f64;
    let scale_h = th as f64 / height as f64;
    if scale_w < scale_h {
        let new_h = ((height as f64 * scale_w).ceil() as usize).min(th);
        (new_h, tw)
    } else {
        let new_w = ((width as f64 * scale_h).ceil() as usize).min(tw);
        (th, new_w)
    }
}

/// `image` (`new_h × new_w`) centred on a zero canvas of `target`, `(target − new) // 2` before.
fn pad_centred(image: Rgb<'_>, target: (usize, usize)) -> Result<Rgb<'static>, ProcessorError> {
    let (th, tw) = target;
    let top = (th - image.height) / 2;
    let left = (tw - image.width) / 2;
    let mut data = fallible::zeros(th * tw * 3).map_err(ProcessorError::oom("padded image"))?;
    for (y, row) in image.data.chunks_exact(image.width * 3).enumerate() {
        let at = ((top + y) * tw + left) * 3;
        data[at..at + row.len()].copy_from_slice(row);
    }
    Ok(Rgb {
        data: Cow::Owned(data),
        width: tw,
        height: th,
    })
}

/// `divide_to_patches`: row-major `tile × tile` crops (smaller at the right and bottom edges).
fn tiles(image: &Rgb<'_>, tile: usize) -> Result<Vec<Rgb<'static>>, ProcessorError> {
    let mut out = Vec::new();
    for y0 in (0..image.height).step_by(tile) {
        for x0 in (0..image.width).step_by(tile) {
            let (h, w) = (tile.min(image.height - y0), tile.min(image.width - x0));
            let mut data =
                fallible::with_capacity(h * w * 3).map_err(ProcessorError::oom("tile"))?;
            for y in y0..y0 + h {
                let at = (y * image.width + x0) * 3;
                data.extend_from_slice(&image.data[at..at + w * 3]);
            }
            out.push(Rgb {
                data: Cow::Owned(data),
                width: w,
                height: h,
            });
        }
    }
    Ok(out)
}

struct Image<'a> {
    items: Vec<Prepared<'a>>,
    size: (usize, usize),
}

fn prepare<'a>(
    config: &LlavaNextConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Image<'a>, ProcessorError> {
    let common = &config.common;
    let size = (rgb.height, rgb.width);
    let best = select_best_resolution(rgb.height, rgb.width, &config.image_grid_pinpoints);
    let (nh, nw) = patch_output_size(rgb.height, rgb.width, best);
    check_side("resized image", nh, nw)?;
    // The two resizes of the original read the same input: borrow it for the first.
    let view = Rgb {
        data: Cow::Borrowed(&rgb.data[..]),
        width: rgb.width,
        height: rgb.height,
    };
    let resized = resize_rgb(view, nh, nw, common, threads)?;
    check_image("image padded to its best resolution", best.0, best.1)?;
    let padded = pad_centred(resized, best)?;
    let tile = config.tile_size();
    let n_tiles = best.0.div_ceil(tile) * best.1.div_ceil(tile);
    let (ih, iw) = config
        .crop_size
        .filter(|_| config.do_center_crop)
        .unwrap_or((tile, tile));
    checked_len("pixel_values", &[n_tiles + 1, 3, ih, iw], 4)?;
    let mut raw_items = Vec::with_capacity(1 + best.0.div_ceil(tile) * best.1.div_ceil(tile));
    let (bh, bw) = config.base_size();
    raw_items.push(resize_rgb(rgb, bh, bw, common, threads)?);
    raw_items.extend(tiles(&padded, tile)?);
    let crop = config.crop_size.filter(|_| config.do_center_crop);
    let items = raw_items
        .into_iter()
        .map(|item| resize_and_crop(common, config.size, crop, item, threads))
        .collect::<Result<Vec<_>, _>>()?;
    let first = items[0].out;
    if let Some(p) = items.iter().find(|p| p.out != first) {
        return Err(ProcessorError::BatchShape {
            what: "the base image and the tiles of one image",
            expected: vec![3, first.0, first.1],
            actual: vec![3, p.out.0, p.out.1],
        });
    }
    Ok(Image { items, size })
}

/// Every image decoded, resized and tiled: `pixel_values` planned, and `image_sizes`.
fn plan<'a>(
    config: &LlavaNextConfig,
    normalize: &Normalize,
    inputs: &[Input<'a>],
    options: &Options,
) -> Result<(Pending<'a>, Outputs), ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let (h, w) = prepared[0].items[0].out;
    if let Some(p) = prepared.iter().find(|p| p.items[0].out != (h, w)) {
        let (ph, pw) = p.items[0].out;
        return Err(ProcessorError::BatchShape {
            what: "processed images",
            expected: vec![3, h, w],
            actual: vec![3, ph, pw],
        });
    }
    let max_items = prepared.iter().map(|p| p.items.len()).max().unwrap_or(0);
    if !config.do_pad {
        if let Some(p) = prepared.iter().find(|p| p.items.len() != max_items) {
            return Err(ProcessorError::BatchShape {
                what: "images with different tile counts (do_pad is off)",
                expected: vec![max_items, 3, h, w],
                actual: vec![p.items.len(), 3, h, w],
            });
        }
    }
    let sizes: Vec<i64> = prepared
        .iter()
        .flat_map(|p| [p.size.0 as i64, p.size.1 as i64])
        .collect();
    let shape = vec![prepared.len(), max_items, 3, h, w];
    // Each image's items (the base image, then its tiles; all h × w, checked above), then
    // zeros for the batch padding.
    let (mut images, mut slots) = (Vec::new(), Vec::new());
    for image in prepared {
        let padding = max_items - image.items.len();
        for item in image.items {
            slots.push(Some((images.len(), item.origin)));
            images.push(item.image);
        }
        slots.extend(std::iter::repeat_n(None, padding));
    }
    let tiles = Tiles {
        images: images.into(),
        slots,
        size: (h, w),
        normalize: normalize.clone(),
        threads: options.threads,
    };
    let pending = tiles.pending("pixel_values", shape)?;
    let outputs = Outputs {
        tensors: vec![("image_sizes", Tensor::i64(vec![sizes.len() / 2, 2], sizes))],
    };
    Ok((pending, outputs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Deferred, Family, Preprocessor, TensorData};

    const PINPOINTS: [(usize, usize); 5] =
        [(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)];

    /// The planned `pixel_values` written into a message (float32 at an odd byte offset,
    /// bfloat16) are the eager tensor's bytes, and the other outputs are the eager ones.
    #[test]
    fn deferred_values_are_the_eager_ones() {
        use crate::tensor::convert::f32_to_bf16;
        use crate::tensor::dtype::WireDtype;
        use crate::tensor::wire::Produce;
        use std::mem::MaybeUninit;

        let p = Preprocessor::new(Family::LlavaNext, &[]).unwrap();
        let mut seed = 7u32;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 24) as u8
                })
                .collect()
        };
        // A tall image and a small one (fewer tiles: batch padding), and one used unresized.
        let (a, b, c) = (
            noise(700 * 300 * 3),
            noise(40 * 90 * 3),
            noise(336 * 336 * 3),
        );
        fn pixels(data: &[u8], width: usize, height: usize) -> Input<'_> {
            Input::Pixels {
                data,
                width,
                height,
                channels: 3,
            }
        }
        let inputs = [
            pixels(&a, 300, 700),
            pixels(&b, 90, 40),
            pixels(&c, 336, 336),
        ];
        for threads in [1, 2] {
            let options = Options {
                threads,
                ..Options::default()
            };
            let eager = p.images(&inputs, &options).unwrap();
            let Deferred::Values { pending, rest, .. } =
                p.images_deferred(&inputs, &options).unwrap()
            else {
                panic!("LLaVA-NeXT plans its pixel_values");
            };
            let pending = pending.into_owned().unwrap();
            let want = eager.get("pixel_values").unwrap();
            assert_eq!(pending.shape(), &want.shape[..]);
            let TensorData::F32(want) = &want.data else {
                panic!("float32 pixel_values");
            };
            assert!(want.contains(&0.0) && want.iter().any(|&v| v != 0.0));
            for (name, tensor) in &rest.tensors {
                assert_eq!(eager.get(name), Some(tensor), "{name}");
            }
            assert_eq!(rest.tensors.len() + 1, eager.tensors.len());
            let mut buffer = vec![MaybeUninit::new(0xAAu8); 4 * want.len() + 3];
            let out = &mut buffer[3..];
            pending.produce(out, WireDtype::Float32).unwrap();
            // SAFETY: `produce` returned Ok, so every byte of `out` is initialised.
            let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
            let bytes: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(got == bytes, "float32 bytes differ (threads {threads})");
            let mut half = vec![MaybeUninit::new(0u8); 2 * want.len()];
            pending.produce(&mut half, WireDtype::Bfloat16).unwrap();
            // SAFETY: as above.
            let got: Vec<u8> = half.iter().map(|b| unsafe { b.assume_init() }).collect();
            let bytes: Vec<u8> = want
                .iter()
                .flat_map(|v| f32_to_bf16(v.to_bits()).to_le_bytes())
                .collect();
            assert!(got == bytes, "bfloat16 bytes differ (threads {threads})");
            assert!(pending
                .produce(&mut half[1..], WireDtype::Bfloat16)
                .is_err());
            assert_eq!(pending.wire_len(WireDtype::Float16), None);
        }
    }

    #[test]
    fn best_resolution() {
        assert_eq!(select_best_resolution(600, 512, &PINPOINTS), (672, 672));
        assert_eq!(select_best_resolution(100, 100, &PINPOINTS), (336, 672));
        assert_eq!(select_best_resolution(1000, 300, &PINPOINTS), (1008, 336));
        assert_eq!(patch_output_size(600, 512, (672, 672)), (672, 574));
        assert_eq!(patch_output_size(100, 100, (336, 672)), (336, 336));
    }

    #[test]
    fn grace_hopper_shape() {
        let data = vec![7u8; 600 * 512 * 3];
        let input = Input::Pixels {
            data: &data,
            width: 512,
            height: 600,
            channels: 3,
        };
        let p = Preprocessor::new(
            Family::LlavaNext,
            &[
                (
                    "size".into(),
                    Value::Map(vec![("shortest_edge".into(), 336)]),
                ),
                (
                    "crop_size".into(),
                    Value::Map(vec![("height".into(), 336), ("width".into(), 336)]),
                ),
            ],
        )
        .unwrap();
        let small = vec![7u8; 10 * 40 * 3];
        let small = Input::Pixels {
            data: &small,
            width: 40,
            height: 10,
            channels: 3,
        };
        let out = p.images(&[input, small], &Options::default()).unwrap();
        assert_eq!(out.get("pixel_values").unwrap().shape, [2, 5, 3, 336, 336]);
        assert_eq!(
            out.get("image_sizes").unwrap().data,
            TensorData::I64(vec![600, 512, 10, 40])
        );
    }
}
