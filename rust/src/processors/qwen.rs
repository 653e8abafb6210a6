//! Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5: one algorithm (`Qwen2VLImageProcessorPil`),
//! configured by patch size, merge size, temporal patch size, pixel bounds, mean and std.
//!
//! Per image: [`smart_resize`] picks a size that is a multiple of `patch_size × merge_size`
//! within `[min_pixels, max_pixels]`, the image is resized to it (BICUBIC by default, Pillow-exact),
//! rescaled and normalised, and cut into `patch_size²` patches. Patch rows come in merge-window
//! order (each `merge × merge` window contiguous, windows row-major); a row holds channel, frame,
//! y, x (a still image is repeated over the `temporal_patch_size` frames).
//!
//! Videos (`Qwen2VLVideoProcessor`'s layout): every frame is resized like an image, the frames
//! are grouped `temporal_patch_size` at a time (the last frame repeated to fill the last group)
//! and each group is patched like an image whose frames differ.

use super::config::{as_count, Common, Value, CLIP_MEAN, CLIP_STD, HALF};
use super::normalize::{Normalize, Runs};
use super::{
    checked_len, parallel, prepare_all, recycle_images, resize_rgb, store, Input, Options, Out,
    OutBuffer, Outputs, ProcessorError, Rgb, RgbRef, Tensor, TensorData,
};

/// The configuration of the Qwen families.
#[derive(Clone, Debug, PartialEq)]
pub struct QwenConfig {
    pub common: Common,
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    /// `size["shortest_edge"]` (`min_pixels`).
    pub min_pixels: u64,
    /// `size["longest_edge"]` (`max_pixels`).
    pub max_pixels: u64,
}

const MAX_PATCH: usize = 1024;
const MAX_MERGE: usize = 64;
const MAX_TEMPORAL: usize = 64;

impl QwenConfig {
    /// `Qwen2VLImageProcessorPil`'s class defaults (Qwen2-VL, Qwen2.5-VL).
    pub fn qwen2_vl() -> Self {
        QwenConfig {
            common: Common::new(CLIP_MEAN, CLIP_STD),
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
        }
    }

    /// The values of the published Qwen3-VL / Qwen3.5 `preprocessor_config.json` files.
    pub fn qwen3_vl() -> Self {
        QwenConfig {
            common: Common::new(HALF, HALF),
            patch_size: 16,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
        }
    }

    /// `patch_size × merge_size`.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    pub(crate) fn set(&mut self, key: &str, value: &Value) -> Result<bool, ProcessorError> {
        match key {
            "patch_size" => self.patch_size = as_count("patch_size", value, MAX_PATCH)?,
            "merge_size" => self.merge_size = as_count("merge_size", value, MAX_MERGE)?,
            "temporal_patch_size" => {
                self.temporal_patch_size = as_count("temporal_patch_size", value, MAX_TEMPORAL)?
            }
            "min_pixels" => self.min_pixels = pixels("min_pixels", value)?,
            "max_pixels" => self.max_pixels = pixels("max_pixels", value)?,
            "size" => {
                // {"shortest_edge", "longest_edge"}, or the legacy {"min_pixels", "max_pixels"}.
                let bad = || {
                    ProcessorError::config(
                        "size",
                        "a dict with keys shortest_edge and longest_edge (min and max pixels)",
                        value,
                    )
                };
                let Value::Map(entries) = value else {
                    return Err(bad());
                };
                let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
                keys.sort_unstable();
                let (min_key, max_key) = match keys[..] {
                    ["longest_edge", "shortest_edge"] => ("shortest_edge", "longest_edge"),
                    ["max_pixels", "min_pixels"] => ("min_pixels", "max_pixels"),
                    _ => return Err(bad()),
                };
                let get = |k: &str| {
                    entries
                        .iter()
                        .find(|(key, _)| key == k)
                        .map_or(0, |(_, v)| *v)
                };
                self.min_pixels = pixels("size.shortest_edge", &Value::Int(get(min_key)))?;
                self.max_pixels = pixels("size.longest_edge", &Value::Int(get(max_key)))?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    pub(crate) fn entries(&self) -> Vec<(&'static str, Value)> {
        let size = Value::Map(vec![
            ("shortest_edge".to_owned(), self.min_pixels as i64),
            ("longest_edge".to_owned(), self.max_pixels as i64),
        ]);
        vec![
            ("patch_size", Value::Int(self.patch_size as i64)),
            ("merge_size", Value::Int(self.merge_size as i64)),
            (
                "temporal_patch_size",
                Value::Int(self.temporal_patch_size as i64),
            ),
            ("size", size),
        ]
    }

    pub(crate) fn validate(&self) -> Result<(), ProcessorError> {
        // set() checks every value; the config is valid by construction.
        Ok(())
    }
}

fn pixels(field: &'static str, value: &Value) -> Result<u64, ProcessorError> {
    match value {
        // Python treats 0 as "not set" (and the processor then raises).
        Value::Int(v) if *v >= 1 && *v <= 1 << 40 => Ok(*v as u64),
        _ => Err(ProcessorError::config(
            field,
            "an integer between 1 and 2**40",
            value,
        )),
    }
}

/// transformers' `smart_resize(height, width, factor, min_pixels, max_pixels)`, with its Python
/// arithmetic: `round` half to even, `/` in `f64`, `math.floor`/`math.ceil` of `f64` quotients,
/// evaluated in the order the Python code writes them.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), ProcessorError> {
    if ProcessorError::ratio(height, width) > 200.0 {
        return Err(ProcessorError::AspectRatio {
            index: 0,
            height,
            width,
        });
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let fu = factor as u64;
    let mut h_bar = (h / f).round_ties_even() as u64 * fu;
    let mut w_bar = (w / f).round_ties_even() as u64 * fu;
    let area = height as u64 * width as u64;
    if h_bar * w_bar > max_pixels {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = fu.max((h / beta / f).floor() as u64 * fu);
        w_bar = fu.max((w / beta / f).floor() as u64 * fu);
    } else if h_bar * w_bar < min_pixels {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = (h * beta / f).ceil() as u64 * fu;
        w_bar = (w * beta / f).ceil() as u64 * fu;
    }
    let side = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    Ok((side(h_bar), side(w_bar)))
}

/// An image resized and checked, with its patch grid.
struct Prepared<'a> {
    image: Rgb<'a>,
    /// The input size (HxW), before resizing.
    input: (usize, usize),
    grid_h: usize,
    grid_w: usize,
}

fn prepare<'a>(
    config: &QwenConfig,
    rgb: Rgb<'a>,
    threads: usize,
) -> Result<Prepared<'a>, ProcessorError> {
    let input = (rgb.height, rgb.width);
    let ps = config.patch_size;
    let (h, w) = if config.common.do_resize {
        smart_resize(
            rgb.height,
            rgb.width,
            config.factor(),
            config.min_pixels,
            config.max_pixels,
        )?
    } else {
        (rgb.height, rgb.width)
    };
    for (what, len) in [("height", h), ("width", w)] {
        if len % config.factor() != 0 || len == 0 {
            return Err(ProcessorError::shape(
                if config.common.do_resize {
                    "smart_resize size"
                } else {
                    "size (do_resize is off)"
                },
                format!(
                    "a {what} that is a positive multiple of patch_size x merge_size = {}",
                    config.factor()
                ),
                format!("{h}x{w} (HxW)"),
            ));
        }
    }
    let image = resize_rgb(rgb, h, w, &config.common, threads)?;
    Ok(Prepared {
        image,
        input,
        grid_h: h / ps,
        grid_w: w / ps,
    })
}

/// Writes the patches of merge-window row `window_row` (all `grid_w × merge` patch rows of it)
/// of `frames` (`temporal_patch_size` frames of the same size) into `out`.
///
/// Row `((bi·(gw/m) + bj)·m + mi)·m + mj` holds grid cell `(bi·m + mi, bj·m + mj)`; its column
/// `((c·T + t)·ps + y)·ps + x` holds the normalised value of channel `c` of frame `t` at pixel
/// `(i·ps + y, j·ps + x)`. Each patch of a distinct frame is normalised once and stored to every
/// frame slot showing it (a still image fills all `T` slots from one pass): straight from the
/// registers, or with `stream` (see [`store`]) through a staging block copied out with
/// streaming stores.
pub fn write_window_row(
    frames: &[RgbRef<'_>],
    patch_size: usize,
    merge_size: usize,
    window_row: usize,
    normalize: &Normalize,
    out: &mut [Out],
    stream: bool,
) {
    let (ps, m, t_len) = (patch_size, merge_size, frames.len());
    let width = frames[0].width;
    let grid_w = width / ps;
    let block = ps * ps;
    let cols = 3 * t_len * block;
    debug_assert_eq!(out.len(), grid_w * m * cols);
    // Where each distinct frame's block goes in an output row, per channel: once per frame slot
    // showing it. `copies[t]` is empty unless frame `t` is distinct (a frame equal to the one
    // before it is not).
    let mut copies: Vec<Vec<[usize; 3]>> = vec![Vec::new(); t_len];
    let mut source = 0;
    for t in 0..t_len {
        if t > 0 && !same_frame(frames[t], frames[t - 1]) {
            source = t;
        }
        copies[source].push([0, 1, 2].map(|c| (c * t_len + t) * block));
    }
    let runs = Runs {
        width: ps,
        rows: ps,
        stride: width * 3,
        out_stride: ps,
    };
    let mut staging = if stream {
        vec![0f32; 3 * block]
    } else {
        Vec::new()
    };
    let mut rows = out.chunks_exact_mut(cols);
    for bj in 0..grid_w / m {
        for mi in 0..m {
            for mj in 0..m {
                let Some(row) = rows.next() else { break };
                let (i, j) = (window_row * m + mi, bj * m + mj);
                let first = (i * ps * width + j * ps) * 3;
                for (frame, copies) in frames.iter().zip(&copies) {
                    if copies.is_empty() {
                        continue;
                    }
                    let pixels = &frame.data[first..];
                    if stream {
                        // The block of each channel into the staging row, then out.
                        let staged = [[0, block, 2 * block]];
                        normalize.deinterleave_into(pixels, runs, &mut staging, &staged);
                        for copy in copies {
                            for (&start, from) in copy.iter().zip(staging.chunks_exact(block)) {
                                store::copy(&mut row[start..start + block], from, true);
                            }
                        }
                    } else {
                        normalize.deinterleave_into(pixels, runs, row, copies);
                    }
                }
            }
        }
    }
    store::fence(stream);
}

fn same_frame(a: RgbRef<'_>, b: RgbRef<'_>) -> bool {
    std::ptr::eq(a.data, b.data)
}

/// One unit of the writing pass: one merge-window row of one temporal group.
struct Job<'a, 'o> {
    frames: Vec<RgbRef<'a>>,
    window_row: usize,
    out: &'o mut [Out],
}

fn write_jobs(config: &QwenConfig, normalize: &Normalize, jobs: Vec<Job<'_, '_>>, threads: usize) {
    let workers = parallel::workers(threads, jobs.len());
    let (ps, m) = (config.patch_size, config.merge_size);
    let total: usize = jobs.iter().map(|job| job.out.len()).sum();
    let stream = store::should_stream(total);
    parallel::map(jobs, workers, |_, job| {
        write_window_row(
            &job.frames,
            ps,
            m,
            job.window_row,
            normalize,
            job.out,
            stream,
        )
    });
}

/// `Qwen2VLImageProcessorPil` on a batch: `pixel_values` `(Σ grid_h·grid_w, 3·T·ps²)` float32 and
/// `image_grid_thw` `(n, 3)` int64.
pub fn images(
    config: &QwenConfig,
    normalize: &Normalize,
    inputs: &[Input<'_>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    let prepared = prepare_all(inputs, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let (ps, m, t_len) = (
        config.patch_size,
        config.merge_size,
        config.temporal_patch_size,
    );
    let cols = 3 * t_len * ps * ps;
    let rows: usize = prepared.iter().map(|p| p.grid_h * p.grid_w).sum();
    let len = checked_len("pixel_values", &[rows, cols], 4)?;
    let mut pixel_values = OutBuffer::new("pixel_values", len)?;
    // One job per merge-window row of each image, each with its own slice of the output.
    let lengths: Vec<usize> = prepared
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.grid_w * m * cols, p.grid_h / m))
        .collect();
    let mut slices = pixel_values.slices(&lengths).into_iter();
    let mut jobs = Vec::with_capacity(lengths.len());
    for p in &prepared {
        let frame = p.image.view();
        for window_row in 0..p.grid_h / m {
            let out = slices.next().unwrap_or_default();
            jobs.push(Job {
                frames: vec![frame; t_len],
                window_row,
                out,
            });
        }
    }
    write_jobs(config, normalize, jobs, options.threads);
    // SAFETY: the jobs' slices cover the buffer (`lengths` sum to `len`) and each job writes
    // every value of its slice.
    let pixel_values = unsafe { pixel_values.finish() };
    let grid: Vec<i64> = prepared
        .iter()
        .flat_map(|p| [1, p.grid_h as i64, p.grid_w as i64])
        .collect();
    let images = prepared.len();
    recycle_images(prepared.into_iter().map(|p| p.image));
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values",
                Tensor {
                    shape: vec![rows, cols],
                    data: TensorData::F32(pixel_values),
                },
            ),
            ("image_grid_thw", Tensor::i64(vec![images, 3], grid)),
        ],
    })
}

/// `Qwen2VLVideoProcessor`'s layout with the PIL backend's arithmetic: `pixel_values_videos`
/// `(Σ grid_t·grid_h·grid_w, 3·T·ps²)` float32 and `video_grid_thw` `(n, 3)` int64.
pub fn videos(
    config: &QwenConfig,
    normalize: &Normalize,
    videos: &[Vec<Input<'_>>],
    options: &Options,
) -> Result<Outputs, ProcessorError> {
    if videos.is_empty() {
        return Err(ProcessorError::shape(
            "videos",
            "at least one video",
            "an empty batch",
        ));
    }
    if let Some(v) = videos.iter().position(Vec::is_empty) {
        return Err(ProcessorError::shape(
            "frames",
            "at least one frame per video",
            format!("video {v} with no frames"),
        ));
    }
    let frames: Vec<Input<'_>> = videos.iter().flatten().copied().collect();
    let prepared = prepare_all(&frames, options, |rgb, threads| {
        prepare(config, rgb, threads)
    })?;
    let (ps, m, t_len) = (
        config.patch_size,
        config.merge_size,
        config.temporal_patch_size,
    );
    let cols = 3 * t_len * ps * ps;
    // Split the frames back into videos and check each video's frames agree in size.
    let mut per_video: Vec<&[Prepared<'_>]> = Vec::with_capacity(videos.len());
    let mut rest = &prepared[..];
    for (v, video) in videos.iter().enumerate() {
        let (head, tail) = rest.split_at(video.len());
        rest = tail;
        let first = head[0].input;
        if let Some((f, p)) = head.iter().enumerate().find(|(_, p)| p.input != first) {
            return Err(ProcessorError::VideoShape {
                video: v,
                frame: f,
                expected: first,
                actual: p.input,
            });
        }
        per_video.push(head);
    }
    let groups = |n: usize| n.div_ceil(t_len);
    let rows: usize = per_video
        .iter()
        .map(|f| groups(f.len()) * f[0].grid_h * f[0].grid_w)
        .sum();
    let len = checked_len("pixel_values_videos", &[rows, cols], 4)?;
    let mut pixel_values = OutBuffer::new("pixel_values_videos", len)?;
    let lengths: Vec<usize> = per_video
        .iter()
        .flat_map(|f| {
            std::iter::repeat_n(f[0].grid_w * m * cols, groups(f.len()) * (f[0].grid_h / m))
        })
        .collect();
    let mut slices = pixel_values.slices(&lengths).into_iter();
    let mut jobs = Vec::with_capacity(lengths.len());
    for frames in &per_video {
        for g in 0..groups(frames.len()) {
            // The last frame fills an incomplete group, as the video processor's padding does.
            let group: Vec<RgbRef<'_>> = (0..t_len)
                .map(|t| frames[(g * t_len + t).min(frames.len() - 1)].image.view())
                .collect();
            for window_row in 0..frames[0].grid_h / m {
                let out = slices.next().unwrap_or_default();
                jobs.push(Job {
                    frames: group.clone(),
                    window_row,
                    out,
                });
            }
        }
    }
    write_jobs(config, normalize, jobs, options.threads);
    // SAFETY: the jobs' slices cover the buffer (`lengths` sum to `len`) and each job writes
    // every value of its slice.
    let pixel_values = unsafe { pixel_values.finish() };
    let grid: Vec<i64> = per_video
        .iter()
        .flat_map(|f| {
            [
                groups(f.len()) as i64,
                f[0].grid_h as i64,
                f[0].grid_w as i64,
            ]
        })
        .collect();
    let videos_count = per_video.len();
    recycle_images(prepared.into_iter().map(|p| p.image));
    Ok(Outputs {
        tensors: vec![
            (
                "pixel_values_videos",
                Tensor {
                    shape: vec![rows, cols],
                    data: TensorData::F32(pixel_values),
                },
            ),
            ("video_grid_thw", Tensor::i64(vec![videos_count, 3], grid)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::{Family, Preprocessor};

    #[test]
    fn smart_resize_table() {
        // The reference table (§5.1) and Python's round-half-even: 70/28 = 2.5 -> 2.
        let q2 = |h, w| smart_resize(h, w, 28, 3136, 12_845_056).unwrap();
        let q2d = |h, w| smart_resize(h, w, 28, 3136, 1_003_520).unwrap();
        let q3 = |h, w| smart_resize(h, w, 32, 65_536, 16_777_216).unwrap();
        assert_eq!(q2(70, 70), (56, 56));
        assert_eq!(q2(600, 512), (588, 504));
        assert_eq!(q3(600, 512), (608, 512));
        assert_eq!(q2(1000, 3000), (1008, 2996));
        assert_eq!(q2d(1000, 3000), (560, 1708));
        assert_eq!(q3(1000, 3000), (992, 3008));
        assert_eq!(q2(4000, 3000), (4004, 2996));
        assert_eq!(q2d(4000, 3000), (1148, 840));
        assert_eq!(q3(4000, 3000), (4000, 3008));
        assert_eq!(q2(1080, 1920), (1092, 1932));
        assert_eq!(q2d(1080, 1920), (728, 1316));
        assert_eq!(q3(1080, 1920), (1088, 1920));
        assert_eq!(q2(10, 10), (56, 56));
        assert_eq!(q3(10, 10), (256, 256));
        assert_eq!(q2(1, 1), (56, 56));
        assert_eq!(q2(1, 200), (28, 812));
        let err = smart_resize(1, 201, 28, 3136, 12_845_056).unwrap_err();
        assert_eq!(err.kind(), "aspect_ratio");
        assert_eq!(
            err.to_string(),
            "absolute aspect ratio must be smaller than 200, got 201.0"
        );
    }

    #[test]
    fn window_rows_direct_and_streamed_match_the_layout() {
        // Frames A, A, B (A repeated: one computation stored twice), ps 14 (vectors) and 3
        // (scalar), merge 2; every value against the documented layout, both store paths, with
        // and without SIMD.
        let normalize = Normalize::new(Some(1.0 / 255.0), Some(([0.4, 0.5, 0.6], [0.2, 0.3, 0.4])));
        for ps in [3, 14] {
            let (m, t_len) = (2, 3);
            let (width, height) = (4 * ps, 2 * ps);
            let frame = |seed: usize| -> Vec<u8> {
                (0..width * height * 3)
                    .map(|i| ((i * 31 + seed * 7) % 251) as u8)
                    .collect()
            };
            let (a, b) = (frame(1), frame(2));
            let rgb = |data| RgbRef {
                data,
                width,
                height,
            };
            let frames = [rgb(a.as_slice()), rgb(a.as_slice()), rgb(b.as_slice())];
            let (grid_w, cols) = (width / ps, 3 * t_len * ps * ps);
            for window_row in 0..height / ps / m {
                let expected: Vec<u32> = (0..grid_w * m * cols)
                    .map(|k| {
                        let (r, col) = (k / cols, k % cols);
                        let (bj, mi, mj) = (r / (m * m), r / m % m, r % m);
                        let (i, j) = (window_row * m + mi, bj * m + mj);
                        let (c, t, y, x) = (
                            col / (t_len * ps * ps),
                            col / (ps * ps) % t_len,
                            col / ps % ps,
                            col % ps,
                        );
                        let px = ((i * ps + y) * width + j * ps + x) * 3 + c;
                        normalize.value(c, frames[t].data[px]).to_bits()
                    })
                    .collect();
                for n in [normalize.clone(), normalize.clone().without_simd()] {
                    for stream in [false, true] {
                        let mut out = vec![Out::new(f32::NAN); expected.len()];
                        write_window_row(&frames, ps, m, window_row, &n, &mut out, stream);
                        // SAFETY: every value was initialised (NaN, then maybe overwritten).
                        let got: Vec<u32> = out
                            .iter()
                            .map(|v| unsafe { v.assume_init() }.to_bits())
                            .collect();
                        assert_eq!(
                            got, expected,
                            "ps {ps}, window row {window_row}, stream {stream}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn patch_order() {
        // A 4x4 image, patch 1, merge 2, T 2: rows in merge-window order, values repeated over T.
        let data: Vec<u8> = (0..48).collect();
        let input = Input::Pixels {
            data: &data,
            width: 4,
            height: 4,
            channels: 3,
        };
        let p = Preprocessor::new(
            Family::Qwen2Vl,
            &[
                ("patch_size".into(), Value::Int(1)),
                ("do_resize".into(), Value::Bool(false)),
                ("do_rescale".into(), Value::Bool(false)),
                ("do_normalize".into(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let out = p.images(&[input], &Options::default()).unwrap();
        let pv = out.get("pixel_values").unwrap();
        assert_eq!(pv.shape, [16, 6]);
        let TensorData::F32(v) = &pv.data else {
            panic!()
        };
        // Row 2 = grid cell (1, 0): pixel (1, 0) = bytes 12..15 -> columns (c, t).
        assert_eq!(&v[2 * 6..3 * 6], &[12., 12., 13., 13., 14., 14.]);
        // Row 4 = window (0, 1), cell (0, 2): pixel (0, 2) = bytes 6..9.
        assert_eq!(&v[4 * 6..5 * 6], &[6., 6., 7., 7., 8., 8.]);
        assert_eq!(
            out.get("image_grid_thw").unwrap().data,
            TensorData::I64(vec![1, 4, 4])
        );
    }

    #[test]
    fn video_groups_repeat_the_last_frame() {
        let frames: Vec<Vec<u8>> = (0..3u8).map(|f| vec![f * 10; 2 * 2 * 3]).collect();
        let inputs: Vec<Input<'_>> = frames
            .iter()
            .map(|d| Input::Pixels {
                data: d,
                width: 2,
                height: 2,
                channels: 3,
            })
            .collect();
        let p = Preprocessor::new(
            Family::Qwen2Vl,
            &[
                ("patch_size".into(), Value::Int(1)),
                ("do_resize".into(), Value::Bool(false)),
                ("do_rescale".into(), Value::Bool(false)),
                ("do_normalize".into(), Value::Bool(false)),
            ],
        )
        .unwrap();
        let out = p
            .videos(std::slice::from_ref(&inputs), &Options::default())
            .unwrap();
        let pv = out.get("pixel_values_videos").unwrap();
        assert_eq!(pv.shape, [8, 6]);
        let TensorData::F32(v) = &pv.data else {
            panic!()
        };
        assert_eq!(&v[..6], &[0., 10., 0., 10., 0., 10.]);
        assert_eq!(&v[4 * 6..5 * 6], &[20., 20., 20., 20., 20., 20.]);
        assert_eq!(
            out.get("video_grid_thw").unwrap().data,
            TensorData::I64(vec![2, 2, 2])
        );
        // Frames of different sizes are refused.
        let small = [0u8; 4 * 2 * 3];
        let mut mixed = inputs.clone();
        mixed.push(Input::Pixels {
            data: &small,
            width: 2,
            height: 4,
            channels: 3,
        });
        let err = p.videos(&[mixed], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "video_shape");
        assert_eq!(
            p.videos(&[vec![]], &Options::default()).unwrap_err().kind(),
            "image_shape"
        );
    }

    #[test]
    fn do_resize_off_needs_multiples() {
        let data = vec![0u8; 30 * 28 * 3];
        let input = Input::Pixels {
            data: &data,
            width: 28,
            height: 30,
            channels: 3,
        };
        let p = Preprocessor::new(Family::Qwen2Vl, &[("do_resize".into(), Value::Bool(false))])
            .unwrap();
        let err = p.images(&[input], &Options::default()).unwrap_err();
        assert_eq!(err.kind(), "image_shape");
        assert!(err.to_string().contains("28"), "{err}");
    }
}
