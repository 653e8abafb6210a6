//! Idefics3 and SmolVLM (`Idefics3ImageProcessorPil`, `SmolVLMImageProcessorPil`: the same
//! pixels, the same class defaults). Every resize uses `resample` (LANCZOS by default) on the
//! `u8` image, chained:
//!
//! 1. with `do_resize`, the longest edge to `size["longest_edge"]` (up or down, the other side
//!    `int()`-scaled and rounded up to even, at least 1), then below 4096 ([`first_size`]);
//! 2. with `do_image_splitting`, to multiples of `max_image_size["longest_edge"]` = `m`
//!    ([`encoder_size`]); an image larger than `m × m` is cut into its `rows × cols` tiles of
//!    `m × m` (row-major), followed by the whole image resized to `m × m` (the global image);
//!    an `m × m` image is its own single tile (rows = cols = 0). Without splitting, the image is
//!    resized to `m × m` (rows = cols = 0).
//!
//! Then rescale and normalize. A flat list of images is one sample for transformers
//! (`make_nested_list_of_images`), and every tile is `m × m`, so `do_pad` (pad the samples to
//! the largest tile count and size) changes no value: it only adds `pixel_attention_mask`.
//!
//! `pixel_values` `(1, Σ tiles, 3, m, m)` float32; with `do_pad`, `pixel_attention_mask`
//! `(1, Σ tiles, m, m)` int64 (all 1); `rows`, `cols` `(1, B)` int64.
//!
//! `image_seq_len` (the processors' `<image>` tokens per tile, 169) is kept for the token
//! count; it changes no pixel.

use std::borrow::Cow;

use super::family::{i64_values, FamilyConfig, Hf, VisionTokens};
use super::normalize::Normalize;
use super::value::{as_bool, as_count, hf_keys, BadSize, Common, Raw, RawMap, Value};
use super::{
    check_side, checked_len, parallel, prepare_all, resize_rgb, Input, Options, Out, OutBuffer,
    Outputs, ProcessorError, Rgb, Tensor, TensorData,
};
use crate::image::Filter;
use crate::memory::fallible;

/// `MAX_IMAGE_SIZE` of transformers' Idefics3/SmolVLM modules.
pub const MAX_IMAGE_SIZE: usize = 4096;
const MAX_SEQ: usize = 1 << 20;

/// Idefics3 and SmolVLM: `size` and `max_image_size` are `{"longest_edge": n}` dicts;
/// `do_image_splitting`, `do_pad` and `image_seq_len` (an `Idefics3Processor`/
/// `SmolVLMProcessor` setting).
fn hf_idefics3(config: &[(String, Raw)]) -> Result<RawMap, BadSize> {
    hf_keys(
        config,
        &[
            "max_image_size",
            "do_image_splitting",
            "do_pad",
            "image_seq_len",
        ],
        false,
    )
}

/// Idefics3: `Idefics3ImageProcessor`.
pub const IDEFICS3: Hf = Hf {
    image_classes: &["Idefics3ImageProcessor"],
    video_classes: &[],
    normalise: hf_idefics3,
    // Idefics3Processor's.
    processor_keys: &[("image_seq_len", None)],
    processor_forces: None,
};

/// SmolVLM: `SmolVLMImageProcessor`.
pub const SMOLVLM: Hf = Hf {
    image_classes: &["SmolVLMImageProcessor"],
    video_classes: &[],
    normalise: hf_idefics3,
    // SmolVLMProcessor's.
    processor_keys: &[("image_seq_len", None)],
    processor_forces: None,
};

/// The configuration of Idefics3 and SmolVLM.
#[derive(Clone, Debug, PartialEq)]
pub struct Idefics3Config {
    pub common: Common,
    /// `size["longest_edge"]`.
    pub longest_edge: usize,
    /// `max_image_size["longest_edge"]`: the tile side.
    pub max_image_size: usize,
    pub do_image_splitting: bool,
    pub do_pad: bool,
    /// Ours: the processor's `image_seq_len` (`<image>` tokens per tile).
    pub image_seq_len: usize,
}

fn longest_edge(field: &'static str, value: &Value, max: usize) -> Result<usize, ProcessorError> {
    match value {
        Value::Map(entries) if entries.len() == 1 && entries[0].0 == "longest_edge" => {
            let v = entries[0].1;
            if v >= 1 && v as u64 <= max as u64 {
                Ok(v as usize)
            } else {
                Err(ProcessorError::config(
                    field,
                    format!("a longest_edge between 1 and {max}"),
                    value,
                ))
            }
        }
        _ => Err(ProcessorError::config(
            field,
            "a dict with the one key longest_edge",
            value,
        )),
    }
}

impl Idefics3Config {
    /// The class defaults of `Idefics3ImageProcessorPil`: longest edge 4 · 364 = 1456, tiles
    /// of 364, LANCZOS, mean/std 0.5, splitting and padding on; `image_seq_len` 169 (the
    /// processor's default).
    pub fn idefics3() -> Self {
        let mut common = Common::new([0.5; 3], [0.5; 3]);
        common.resample = Filter::Lanczos;
        Idefics3Config {
            common,
            longest_edge: 4 * 364,
            max_image_size: 364,
            do_image_splitting: true,
            do_pad: true,
            image_seq_len: 169,
        }
    }

    /// `SmolVLMImageProcessorPil`'s class defaults: the same as Idefics3's (the published
    /// SmolVLM configs set other sizes, e.g. 2048 and 512).
    pub fn smolvlm() -> Self {
        Self::idefics3()
    }
}

impl FamilyConfig for Idefics3Config {
    fn common(&self) -> &Common {
        &self.common
    }

    fn common_mut(&mut self) -> &mut Common {
        &mut self.common
    }

    fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            // The first resize clamps to MAX_IMAGE_SIZE itself; tiles are ours to bound.
            "size" => self.longest_edge = longest_edge("size", value, super::MAX_SIDE)?,
            "max_image_size" => {
                self.max_image_size = longest_edge("max_image_size", value, MAX_IMAGE_SIZE)?
            }
            "do_image_splitting" => self.do_image_splitting = as_bool("do_image_splitting", value)?,
            "do_pad" => self.do_pad = as_bool("do_pad", value)?,
            "image_seq_len" => self.image_seq_len = as_count("image_seq_len", value, MAX_SEQ)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn entries(&self) -> Vec<(&'static str, Value)> {
        let edge = |n: usize| Value::Map(vec![("longest_edge".to_owned(), n as i64)]);
        vec![
            ("size", edge(self.longest_edge)),
            ("max_image_size", edge(self.max_image_size)),
            ("do_image_splitting", Value::Bool(self.do_image_splitting)),
            ("do_pad", Value::Bool(self.do_pad)),
            ("image_seq_len", Value::Int(self.image_seq_len as i64)),
        ]
    }

    fn validate(&self) -> Result<(), ProcessorError> {
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

    /// `get_image_prompt_string`: `(rows · cols + 1) · image_seq_len` `<image>` tokens per
    /// image (`rows == cols == 0`: not split, one global image).
    fn image_tokens(&self, outputs: &Outputs, _vision: Option<&VisionTokens>) -> Option<Vec<i64>> {
        let seq = self.image_seq_len as i64;
        let rows = i64_values(outputs, "rows")?;
        let cols = i64_values(outputs, "cols")?;
        if rows.len() != cols.len() {
            return None;
        }
        Some(
            rows.iter()
                .zip(cols)
                .map(|(&r, &c)| (r * c + 1) * seq)
                .collect(),
        )
    }
}

/// `int(x)` of a positive `f64` (truncation; saturating for out-of-range values).
fn trunc(x: f64) -> usize {
    x as usize
}

/// `get_resize_output_image_size`: `_resize_output_size_rescale_to_max_len` (the longest side
/// becomes `max_len`, the other `int()` of Python's float arithmetic, rounded up to even, at
/// least 1) then `_resize_output_size_scale_below_upper_bound(…, 4096)`.
pub fn first_size(height: usize, width: usize, max_len: usize) -> (usize, usize) {
    let (mut h, mut w) = (height, width);
    let aspect = w as f64 / h as f64;
    if w >= h {
        w = max_len;
        h = trunc(w as f64 / aspect);
        if h % 2 != 0 {
            h += 1;
        }
    } else {
        h = max_len;
        w = trunc(h as f64 * aspect);
        if w % 2 != 0 {
            w += 1;
        }
    }
    h = h.max(1);
    w = w.max(1);
    let aspect = w as f64 / h as f64;
    if w >= h && w > MAX_IMAGE_SIZE {
        w = MAX_IMAGE_SIZE;
        h = trunc(w as f64 / aspect);
    } else if h > w && h > MAX_IMAGE_SIZE {
        h = MAX_IMAGE_SIZE;
        w = trunc(h as f64 * aspect);
    }
    (h.max(1), w.max(1))
}

/// `resize_for_vision_encoder`: the longest side rounded up to a multiple of `m`, the other
/// `int()`-scaled from it, then rounded up to a multiple of `m` (0 stays 0).
pub fn encoder_size(height: usize, width: usize, m: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    if width >= height {
        let w = width.div_ceil(m).saturating_mul(m);
        let h = trunc(w as f64 / aspect).div_ceil(m).saturating_mul(m);
        (h, w)
    } else {
        let h = height.div_ceil(m).saturating_mul(m);
        let w = trunc(h as f64 * aspect).div_ceil(m).saturating_mul(m);
        (h, w)
    }
}

/// One input: its images (0: the tiled image, 1: the global image), tile origins in output
/// order, and its rows/cols.
struct Prepared<'a> {
    images: Vec<Rgb<'a>>,
    tiles: Vec<(usize, (usize, usize))>,
    rows: usize,
    cols: usize,
}

fn prepare<'a>(
    config: &Idefics3Config,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let common = &config.common;
    let m = config.max_image_size;
    let image = if common.do_resize {
        let (h, w) = first_size(rgb.height, rgb.width, config.longest_edge);
        resize_rgb(rgb, h, w, common, threads)?
    } else {
        rgb
    };
    if !config.do_image_splitting {
        let image = resize_rgb(image, m, m, common, threads)?;
        return Ok(Prepared {
            images: vec![image],
            tiles: vec![(0, (0, 0))],
            rows: 0,
            cols: 0,
        });
    }
    let (h, w) = encoder_size(image.height, image.width, m);
    check_side("resized image", h, w)?;
    let image = resize_rgb(image, h, w, common, threads)?;
    if h <= m && w <= m {
        return Ok(Prepared {
            images: vec![image],
            tiles: vec![(0, (0, 0))],
            rows: 0,
            cols: 0,
        });
    }
    // h, w ≥ m here (multiples of m, non-zero: check_side above).
    let (rows, cols) = (h.saturating_sub(m) / m + 1, w.saturating_sub(m) / m + 1);
    let view = Rgb {
        data: Cow::Borrowed(&image.data[..]),
        width: image.width,
        height: image.height,
    };
    let global = resize_rgb(view, m, m, common, threads)?;
    let global = Rgb {
        width: global.width,
        height: global.height,
        data: Cow::Owned(super::owned_bytes(global.data, "global image")?),
    };
    let mut tiles: Vec<(usize, (usize, usize))> = (0..rows * cols)
        .map(|i| (0, ((i / cols) * m, (i % cols) * m)))
        .collect();
    tiles.push((1, (0, 0)));
    Ok(Prepared {
        images: vec![image, global],
        tiles,
        rows,
        cols,
    })
}

/// One output tile: its image and the tile's top-left corner in it.
type Job<'r, 'a> = (&'r Rgb<'a>, (usize, usize));

/// Idefics3 / SmolVLM on a batch (see the module docs).
pub fn images(
    config: &Idefics3Config,
    normalize: &Normalize,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let m = config.max_image_size;
    let jobs: Vec<Job<'_, '_>> = prepared
        .iter()
        .flat_map(|p| p.tiles.iter().map(move |&(i, o)| (&p.images[i], o)))
        .collect();
    if jobs.is_empty() {
        return Err(ProcessorError::shape(
            "images",
            "at least one image",
            "an empty batch",
        ));
    }
    let count = jobs.len();
    let per_tile = checked_len("pixel_values", &[3, m, m], 4)?;
    let len = checked_len("pixel_values", &[count, 3, m, m], 4)?;
    let mask_len = checked_len("pixel_attention_mask", &[count, m, m], 8)?;
    let mut pixel_values = OutBuffer::new("pixel_values", len)?;
    let slices = pixel_values.slices(&vec![per_tile; count]);
    let work: Vec<(Job<'_, '_>, &mut [Out])> = jobs.into_iter().zip(slices).collect();
    let workers = parallel::workers(options.threads, work.len());
    parallel::map(work, workers, |_, ((image, origin), out)| {
        normalize.write_chw(
            image.view(),
            origin.0 as isize,
            origin.1 as isize,
            m,
            m,
            out,
        )
    });
    // SAFETY: one slice of 3·m·m values per tile covers the buffer, and every tile lies inside
    // its image (tiles of an image of rows·m × cols·m, or an m × m image whole), so
    // `write_chw` writes all of its slice.
    let pixel_values = unsafe { pixel_values.finish() };
    let batch = prepared.len();
    let rows: Vec<i64> = prepared.iter().map(|p| p.rows as i64).collect();
    let cols: Vec<i64> = prepared.iter().map(|p| p.cols as i64).collect();
    super::recycle_images(prepared.into_iter().flat_map(|p| p.images));
    let mut tensors = vec![(
        "pixel_values",
        Tensor {
            shape: vec![1, count, 3, m, m],
            data: TensorData::F32(pixel_values),
        },
    )];
    if config.do_pad {
        let mask = fallible::filled(1i64, mask_len)
            .map_err(ProcessorError::oom("pixel_attention_mask"))?;
        tensors.push((
            "pixel_attention_mask",
            Tensor::i64(vec![1, count, m, m], mask),
        ));
    }
    tensors.push(("rows", Tensor::i64(vec![1, batch], rows)));
    tensors.push(("cols", Tensor::i64(vec![1, batch], cols)));
    Ok(Outputs { tensors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn sizes_as_transformers() {
        assert_eq!(first_size(1, 1, 1456), (1456, 1456));
        assert_eq!(first_size(1, 1, 365), (366, 365));
        assert_eq!(first_size(1, 2000, 1456), (1, 1456));
        assert_eq!(first_size(480, 640, 1456), (1092, 1456));
        assert_eq!(encoder_size(1, 1456, 364), (364, 1456));
        assert_eq!(encoder_size(1092, 1456, 364), (1092, 1456));
        assert_eq!(encoder_size(100, 50, 364), (364, 364));
    }

    #[test]
    fn tiles_then_global() {
        let wide = vec![255u8; 10 * 20 * 3];
        let inputs = [Input::Pixels {
            data: &wide,
            width: 20,
            height: 10,
            channels: 3,
        }];
        let edge = |n| Value::Map(vec![("longest_edge".into(), n)]);
        for family in [Family::Idefics3, Family::SmolVlm] {
            let p = Preprocessor::new(
                family,
                &[
                    ("size".to_owned(), edge(8)),
                    ("max_image_size".to_owned(), edge(4)),
                ],
            )
            .unwrap();
            let out = p.images(&inputs, &Options::default()).unwrap();
            // 10x20 -> 4x8 -> 4x8: 1 row, 2 columns, then the global image.
            assert_eq!(out.get("pixel_values").unwrap().shape, [1, 3, 3, 4, 4]);
            assert_eq!(out.get("rows").unwrap().data, TensorData::I64(vec![1]));
            assert_eq!(out.get("cols").unwrap().data, TensorData::I64(vec![2]));
            assert_eq!(
                out.get("pixel_attention_mask").unwrap().data,
                TensorData::I64(vec![1; 3 * 16])
            );
        }
    }

    #[test]
    fn bad_configs() {
        let build = |k: &str, v: Value| {
            Preprocessor::new(Family::Idefics3, &[(k.to_owned(), v)]).unwrap_err()
        };
        for (key, bad) in [
            (
                "size",
                Value::Map(vec![("height".into(), 4), ("width".into(), 4)]),
            ),
            ("size", Value::Map(vec![("longest_edge".into(), 0)])),
            ("max_image_size", Value::Int(364)),
            (
                "max_image_size",
                Value::Map(vec![("longest_edge".into(), 5000)]),
            ),
            ("do_image_splitting", Value::Int(1)),
            ("do_pad", Value::Str("yes".into())),
            ("image_seq_len", Value::Int(0)),
        ] {
            assert_eq!(build(key, bad).kind(), "config", "{key}");
        }
    }
}
