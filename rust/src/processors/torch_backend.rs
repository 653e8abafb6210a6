//! What the torchvision-backend processors share (Llama 4, Phi-3-vision, Phi-4-multimodal):
//! torch's `uint8` resize, `u8` canvases with padding, their rescale/normalize arithmetic as
//! per-channel tables, and writing tiles and a bicubic global image channels-first.
//!
//! Every normalisation here depends only on the channel and the `u8` value, so each is a table
//! of 3 × 256 values computed with torch's own operation order and dtypes; a tile is then one
//! lookup per value, and the global image of Phi-3/Phi-4 is interpolated from rows normalised
//! on the fly ([`crate::image::torch::bicubic_plane`]) without materialising the float image.

use std::borrow::Cow;

use super::normalize::{Normalize, Runs, Slot};
use super::value::Common;
use super::{check_image, check_side, Out, ProcessorError, Rgb, RgbRef};
use crate::image::resample::ImageRef;
use crate::image::torch::{self, bf16_bits, bf16_value, TorchFilter};

/// A value per channel and `u8` input.
pub type Table<T> = [[T; 256]; 3];

/// Llama 4's `rescale_and_normalize` in `bfloat16`, as the bits of each result:
/// `x.to(bf16) * rescale_factor` (the product in `f32` with the factor as `f32`, rounded to
/// bf16), then `tvF.normalize` with `mean`/`std` converted to bf16: a subtraction and a
/// division, each computed in `f32` and rounded to bf16 (nearest even).
pub fn bf16_table(rescale_factor: f64, mean: [f64; 3], std: [f64; 3]) -> Table<u16> {
    let factor = rescale_factor as f32;
    let mut table = [[0u16; 256]; 3];
    for (c, row) in table.iter_mut().enumerate() {
        let m = bf16_value(bf16_bits(mean[c] as f32));
        let s = bf16_value(bf16_bits(std[c] as f32));
        for (v, slot) in row.iter_mut().enumerate() {
            let scaled = bf16_value(bf16_bits(v as f32 * factor));
            let centred = bf16_value(bf16_bits(scaled - m));
            *slot = bf16_bits(centred / s);
        }
    }
    table
}

/// The torchvision backend's fused rescale + normalize (Phi-4-multimodal):
/// `mean' = f32(mean) · f32(1 / rescale_factor)`, likewise `std'`, then `(f32(x) − mean') / std'`
/// in `f32`.
pub fn fused_f32_table(rescale_factor: f64, mean: [f64; 3], std: [f64; 3]) -> Table<f32> {
    let inverse = (1.0 / rescale_factor) as f32;
    let mut table = [[0f32; 256]; 3];
    for (c, row) in table.iter_mut().enumerate() {
        let m = mean[c] as f32 * inverse;
        let s = std[c] as f32 * inverse;
        for (v, slot) in row.iter_mut().enumerate() {
            *slot = (v as f32 - m) / s;
        }
    }
    table
}

/// [`fused_f32_table`] as a [`Normalize`] (for the patch writers shared with the PIL families):
/// with AVX2 + FMA eight values at a time, as `(f32(x) · 1 − mean') / std'` (exact: the
/// constants are `f32` values already and the product by 1 changes nothing).
pub fn fused_normalize(rescale_factor: f64, mean: [f64; 3], std: [f64; 3]) -> Normalize {
    let lut = fused_f32_table(rescale_factor, mean, std);
    let inverse = (1.0 / rescale_factor) as f32;
    let fused = |v: [f64; 3]| v.map(|x| f64::from(x as f32 * inverse));
    Normalize::from_formula(lut, 1.0, fused(mean), fused(std))
}

/// torchvision's `ToTensor` + `Normalize` (Phi-3-vision's hub processor): `f32(x) / 255`, then
/// `(x − f32(mean)) / f32(std)`, each step in `f32`.
pub fn to_tensor_table(mean: [f64; 3], std: [f64; 3]) -> Table<f32> {
    let mut table = [[0f32; 256]; 3];
    for (c, row) in table.iter_mut().enumerate() {
        for (v, slot) in row.iter_mut().enumerate() {
            *slot = (v as f32 / 255.0 - mean[c] as f32) / std[c] as f32;
        }
    }
    table
}

/// `tvF.resize(image, [out_h, out_w], filter, antialias=True)` of an RGB image on CPU: the image
/// itself when the size is unchanged (torchvision returns its input).
pub fn resize<'a>(
    src: Rgb<'a>,
    out_h: usize,
    out_w: usize,
    filter: TorchFilter,
    threads: usize,
) -> Result<Rgb<'a>, ProcessorError> {
    if (out_h, out_w) == (src.height, src.width) {
        return Ok(src);
    }
    let data = resized(src.view(), out_h, out_w, filter, threads)?;
    super::recycle_images([src]);
    Ok(Rgb {
        data: Cow::Owned(data),
        width: out_w,
        height: out_h,
    })
}

/// [`resize`] into a new buffer, leaving `src` as it is.
pub fn resized(
    src: RgbRef<'_>,
    out_h: usize,
    out_w: usize,
    filter: TorchFilter,
    threads: usize,
) -> Result<Vec<u8>, ProcessorError> {
    let len = check_image("resized image", out_h, out_w)?;
    let image = ImageRef {
        data: src.data,
        width: src.width,
        height: src.height,
        channels: 3,
    };
    let mut data =
        crate::memory::overwritable_bytes(len).map_err(|bytes| ProcessorError::OutOfMemory {
            what: "resized image",
            bytes,
        })?;
    torch::resize_u8(&image, &mut data, out_w, out_h, filter, threads)
        .map_err(|error| ProcessorError::Resample { index: 0, error })?;
    Ok(data)
}

/// An `h × w` canvas of `fill` with `src` pasted at `(top, left)` (`tvF.pad` / PIL's expand with
/// a constant). `src` must fit inside.
pub fn pad(
    src: RgbRef<'_>,
    h: usize,
    w: usize,
    top: usize,
    left: usize,
    fill: u8,
) -> Result<Rgb<'static>, ProcessorError> {
    check_side("padded image", h, w)?;
    let len = check_image("padded image", h, w)?;
    debug_assert!(top + src.height <= h && left + src.width <= w);
    // A recycled buffer when one fits (its pages mapped already), else a zeroed one; every byte
    // is written once below either way.
    let mut data =
        crate::memory::overwritable_bytes(len).map_err(|bytes| ProcessorError::OutOfMemory {
            what: "padded image",
            bytes,
        })?;
    let row = src.width * 3;
    for (y, out) in data.chunks_exact_mut(w * 3).enumerate() {
        // Row `y − top` of `src` between `left` and the rest of the canvas's `fill`, or a row of
        // `fill` above and below it (and past the rows `src` holds).
        let line = y
            .checked_sub(top)
            .filter(|&r| r < src.height)
            .and_then(|r| src.data.get(r * row..(r + 1) * row));
        match line {
            Some(line) => {
                let (before, rest) = out.split_at_mut(left * 3);
                let (inside, after) = rest.split_at_mut(row);
                before.fill(fill);
                inside.copy_from_slice(line);
                after.fill(fill);
            }
            None => out.fill(fill),
        }
    }
    Ok(Rgb {
        data: Cow::Owned(data),
        width: w,
        height: h,
    })
}

/// Writes the `h × w` window at `(top, left)` of an image padded right and bottom with `fill`
/// (the canvas of `size`, `image` at its top left, `size` large enough for the window) through
/// `table` into `out` channels-first (`3 × h × w`), without materialising the canvas.
pub fn write_padded_tile<T: Copy>(
    table: &Table<T>,
    image: RgbRef<'_>,
    fill: u8,
    (top, left): (usize, usize),
    (h, w): (usize, usize),
    out: &mut [T],
) {
    debug_assert_eq!(out.len(), 3 * h * w);
    let plane = h * w;
    let inside_h = image.height.saturating_sub(top).min(h);
    let inside_w = image.width.saturating_sub(left).min(w);
    if inside_h > 0 && inside_w > 0 {
        write_window(table, image, (top, left), (inside_h, inside_w), w, out);
    }
    for (c, plane) in out.chunks_exact_mut(plane).enumerate() {
        let value = table[c][usize::from(fill)];
        for (y, row) in plane.chunks_exact_mut(w).enumerate() {
            let from = if y < inside_h { inside_w } else { 0 };
            row[from..].fill(value);
        }
    }
}

/// Writes the `h × w` window at `(top, left)` of `canvas` (inside it) through `table` into
/// `out` channels-first (`3 × h × w`).
pub fn write_tile<T: Copy>(
    table: &Table<T>,
    canvas: RgbRef<'_>,
    origin: (usize, usize),
    (h, w): (usize, usize),
    out: &mut [T],
) {
    debug_assert_eq!(out.len(), 3 * h * w);
    write_window(table, canvas, origin, (h, w), w, out);
}

/// The `h × w` window at `(top, left)` of `canvas` (inside it) into the top left of three
/// planes of rows of `out_w` values (`out` holds the three planes, `out.len() / 3` each).
fn write_window<T: Copy>(
    table: &Table<T>,
    canvas: RgbRef<'_>,
    (top, left): (usize, usize),
    (h, w): (usize, usize),
    out_w: usize,
    out: &mut [T],
) {
    debug_assert!(top + h <= canvas.height && left + w <= canvas.width && w <= out_w);
    let plane = out.len() / 3;
    let stride = canvas.width * 3;
    // Plane by plane, each pass one sequential stream through one table: writing the three
    // planes in one pass took about twice as long (Llama 4's tiles, AMD Zen 3).
    for (c, (out, table)) in out.chunks_exact_mut(plane).zip(table).enumerate() {
        for y in 0..h {
            let start = (top + y) * stride + left * 3;
            let pixels = &canvas.data[start..start + w * 3];
            let dst = &mut out[y * out_w..y * out_w + w];
            for (px, slot) in pixels.chunks_exact(3).zip(dst) {
                *slot = table[usize::from(px[c])];
            }
        }
    }
}

/// `F.interpolate(normalised[None], (out_h, out_w), mode="bicubic", align_corners=False)[0]` of
/// the whole `canvas` normalised through `normalize` (one channel of a row at a time,
/// [`Normalize::channel_into`]), into `out` (`3 × out_h × out_w`): the global
/// image of Phi-3-vision and Phi-4-multimodal (torch returns the input itself when the size is
/// unchanged, which the interpolation reproduces exactly).
pub fn write_bicubic<S: Slot>(
    normalize: &Normalize,
    canvas: RgbRef<'_>,
    (out_h, out_w): (usize, usize),
    out: &mut [S],
) -> Result<(), ProcessorError> {
    debug_assert_eq!(out.len(), 3 * out_h * out_w);
    let stride = canvas.width * 3;
    for (c, plane) in out.chunks_exact_mut(out_h * out_w).enumerate() {
        torch::bicubic_plane(
            canvas.height,
            canvas.width,
            out_h,
            out_w,
            plane,
            |r, row| normalize.channel_into(&canvas.data[r * stride..(r + 1) * stride], c, row),
        )
        .map_err(ProcessorError::oom("interpolation rows"))?;
    }
    Ok(())
}

/// The global image (`canvas` interpolated to `tile`, [`write_bicubic`]) followed by the
/// canvas's `tile`-sized tiles in row-major order, all normalised through `normalize`, into
/// `out` (`(1 + rows · cols) × 3 × tile.0 × tile.1`, every value written): the crops of
/// Phi-3-vision and Phi-4-multimodal. The tiles are plain windows of the canvas, written by
/// [`Normalize::deinterleave_into`] (eight or sixteen values at a time where its formula
/// reproduces the table). The canvas sides are multiples of the tile's. On `Err` (the global
/// image's rows could not be allocated) nothing has been written.
pub fn write_global_and_tiles(
    normalize: &Normalize,
    canvas: RgbRef<'_>,
    tile: (usize, usize),
    out: &mut [Out],
) -> Result<(), ProcessorError> {
    let plane = tile.0 * tile.1;
    let (global, tiles) = out.split_at_mut(3 * plane);
    write_bicubic(normalize, canvas, tile, global)?;
    let cols = canvas.width / tile.1;
    let runs = Runs {
        width: tile.1,
        rows: tile.0,
        stride: canvas.width * 3,
        out_stride: tile.1,
    };
    for (i, slot) in tiles.chunks_exact_mut(3 * plane).enumerate() {
        let (top, left) = ((i / cols) * tile.0, (i % cols) * tile.1);
        let first = (top * canvas.width + left) * 3;
        normalize.deinterleave_into(&canvas.data[first..], runs, slot, &[[0, plane, 2 * plane]]);
    }
    Ok(())
}

/// A torch resample mode from a configuration's PIL filter: BILINEAR and BICUBIC (the modes the
/// torch ports cover).
pub fn filter_of(filter: crate::image::Filter) -> Option<TorchFilter> {
    match filter {
        crate::image::Filter::Bilinear => Some(TorchFilter::Bilinear),
        crate::image::Filter::Bicubic => Some(TorchFilter::Bicubic),
        _ => None,
    }
}

/// What the torch ports cover of the shared keys: BILINEAR or BICUBIC, rescale and normalize
/// both on, a non-zero `std`.
pub(crate) fn check_torch_steps(common: &Common) -> Result<(), ProcessorError> {
    if filter_of(common.resample).is_none() {
        return Err(ProcessorError::config(
            "resample",
            "BILINEAR (2) or BICUBIC (3): the torch uint8 kernels ported",
            common.resample.pil_id(),
        ));
    }
    for (field, on) in [
        ("do_rescale", common.do_rescale),
        ("do_normalize", common.do_normalize),
    ] {
        if !on {
            return Err(ProcessorError::config(
                field,
                "true (only the rescale-and-normalize path of the torchvision backend is ported)",
                false,
            ));
        }
    }
    if common.image_std.contains(&0.0) {
        return Err(ProcessorError::config(
            "image_std",
            "non-zero values",
            common.image_std,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A canvas large enough to come from the buffer cache is `fill` wherever the image is not,
    /// whatever a recycled buffer held; a canvas of the image's own size is the image.
    #[test]
    fn pad_overwrites_a_recycled_buffer() {
        let (w, h) = (200, 150);
        let (ch, cw, top, left) = (330, 290, 100, 40);
        // Dirty buffers of both sizes for the cache to hand out (another test may take one, or
        // this one another's: every byte is checked all the same).
        for len in [ch * cw * 3, h * w * 3] {
            for _ in 0..3 {
                crate::memory::recycle::give_u8(vec![0xAB; len]);
            }
        }
        let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
        let src = RgbRef {
            data: &pixels,
            width: w,
            height: h,
        };
        let same = pad(src, h, w, 0, 0, 255).unwrap();
        assert_eq!(&same.data[..], &pixels[..]);
        let padded = pad(src, ch, cw, top, left, 255).unwrap();
        assert_eq!((padded.height, padded.width), (ch, cw));
        for (y, row) in padded.data.chunks_exact(cw * 3).enumerate() {
            for (x, px) in row.chunks_exact(3).enumerate() {
                let inside = (top..top + h).contains(&y) && (left..left + w).contains(&x);
                let want: &[u8] = if inside {
                    &pixels[((y - top) * w + x - left) * 3..][..3]
                } else {
                    &[255; 3]
                };
                assert_eq!(px, want, "pixel ({y}, {x})");
            }
        }
    }

    #[test]
    fn bf16_table_of_half() {
        let t = bf16_table(1.0 / 255.0, [0.5; 3], [0.5; 3]);
        assert_eq!(bf16_value(t[0][0]), -1.0);
        assert_eq!(bf16_value(t[1][255]), 1.0);
        // 128/255 = 0.501961 lies just above the midpoint of bf16's 0.5 and 0.50390625 (steps
        // of 2⁻⁸ there): up; minus 0.5, over 0.5.
        assert_eq!(bf16_value(t[2][128]), 0.0078125);
    }

    #[test]
    fn pad_and_tiles() {
        let data: Vec<u8> = (0..2 * 3 * 3).map(|v| v as u8).collect();
        let src = RgbRef {
            data: &data,
            width: 3,
            height: 2,
        };
        let canvas = pad(src, 4, 4, 1, 0, 255).unwrap();
        assert_eq!(&canvas.data[..12], &[255; 12]);
        assert_eq!(&canvas.data[12..21], &data[..9]);
        assert_eq!(&canvas.data[21..24], &[255; 3]);
        let mut identity = [[0u8; 256]; 3];
        for row in &mut identity {
            for (v, slot) in row.iter_mut().enumerate() {
                *slot = v as u8;
            }
        }
        let mut out = [0u8; 3 * 2 * 2];
        write_tile(&identity, canvas.view(), (1, 1), (2, 2), &mut out);
        // Channel 0 of pixels (1,1), (1,2), (2,1), (2,2) of the canvas.
        assert_eq!(&out[..4], &[3, 6, 12, 15]);
        assert_eq!(&out[8..], &[5, 8, 14, 17]);
        // The same windows of the canvas padded on the fly, over the pad too.
        let plain = pad(src, 4, 5, 0, 0, 255).unwrap();
        for (origin, size) in [
            ((0, 0), (4, 5)),
            ((1, 2), (3, 3)),
            ((3, 4), (1, 1)),
            ((0, 1), (2, 2)),
        ] {
            let mut want = vec![0u8; 3 * size.0 * size.1];
            let mut got = want.clone();
            write_tile(&identity, plain.view(), origin, size, &mut want);
            write_padded_tile(&identity, src, 255, origin, size, &mut got);
            assert_eq!(got, want, "{origin:?} {size:?}");
        }
    }
}
