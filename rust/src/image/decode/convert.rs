//! Pillow modes to RGB, as transformers' `convert_to_rgb` does it with Pillow 13.0.0.
//!
//! `convert_to_rgb` checks `"A" in image.getbands() or image.info.get("transparency") is not None`.
//! When true, the image goes through `convert("RGBA")` and `Image.alpha_composite` onto an
//! opaque white image, then `convert("RGB")` (alpha dropped); otherwise straight through
//! `convert("RGB")`. The per-mode conversions below are Pillow's (`libImaging/Convert.c`):
//!
//! | mode | → RGB | → RGBA with transparency `t` |
//! |---|---|---|
//! | `1` | 0 → 0, else 255 | alpha 0 where the converted gray equals `t & 0xff` |
//! | `L` | replicated | alpha 0 where the gray equals `t & 0xff` |
//! | `I;16` | values above 255 become 255 | alpha 0 where that clipped gray equals `t & 0xff` |
//! | `RGB` | copied | alpha 0 where (r, g, b) equals `t & 0xff` per channel |
//! | `P` | palette entry (entries past the palette are black) | palette alpha from `tRNS`/index |
//! | `CMYK` | `255 - k - c·(255 - k)/255`, rounded like `MULDIV255` | – |
//! | `LA`, `RGBA` | alpha dropped | as is |
//!
//! and the white composite is Pillow's integer formula with 7 extra bits of precision.

/// What to do with images that have an alpha band or transparency info.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AlphaMode {
    /// Composite onto opaque white, like transformers' `convert_to_rgb` (the processors' path).
    #[default]
    White,
    /// Drop the alpha like Pillow's `convert("RGB")` (transformers' `load_image` for paths).
    Drop,
}

/// A Pillow-style palette: 256 RGBA entries, the ones past the file's palette black and opaque
/// (`ImagingPaletteNew` zero-fills colours and sets alpha 255).
#[derive(Clone, PartialEq, Eq)]
pub struct Palette {
    pub entries: [[u8; 4]; 256],
}

impl std::fmt::Debug for Palette {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Palette({:?}..)", &self.entries[..4])
    }
}

impl Default for Palette {
    fn default() -> Self {
        Self {
            entries: [[0, 0, 0, 255]; 256],
        }
    }
}

impl Palette {
    /// A palette from packed entries of `stride` bytes (3 for RGB, 4 for BGRX…), colour bytes
    /// at `order` within each entry; a trailing partial entry is ignored, entries past 256 too.
    pub fn from_packed(data: &[u8], stride: usize, order: [usize; 3]) -> Self {
        let mut palette = Self::default();
        for (entry, chunk) in palette.entries.iter_mut().zip(data.chunks_exact(stride)) {
            *entry = [chunk[order[0]], chunk[order[1]], chunk[order[2]], 255];
        }
        palette
    }
}

/// The transparency Pillow keeps in `info["transparency"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transparency {
    /// A gray value (modes `1`, `L`, `I;16`).
    Gray(u16),
    /// An RGB colour (mode `RGB`), 16-bit samples as the PNG `tRNS` chunk stores them.
    Rgb(u16, u16, u16),
    /// Alpha per palette index, from index 0 (mode `P`; `putpalettealphas`).
    PaletteAlphas(Vec<u8>),
    /// One fully transparent palette index (mode `P`; `putpalettealpha(index, 0)`).
    PaletteIndex(u8),
}

/// The pixels in one of the Pillow modes the supported formats open as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pixels {
    /// Mode `1`, one byte per pixel (0 or non-zero, like Pillow's unpacked storage).
    Bilevel(Vec<u8>),
    L(Vec<u8>),
    La(Vec<u8>),
    /// Mode `I;16`: native 16-bit values.
    I16(Vec<u16>),
    Rgb(Vec<u8>),
    Rgba(Vec<u8>),
    /// Mode `CMYK` as Pillow stores it (after the `CMYK;I` inversion for JPEG).
    Cmyk(Vec<u8>),
    P {
        indices: Vec<u8>,
        palette: Box<Palette>,
    },
}

impl Pixels {
    /// How many whole pixels the buffer holds.
    fn count(&self) -> usize {
        match self {
            Pixels::Bilevel(v) | Pixels::L(v) => v.len(),
            Pixels::La(v) => v.len() / 2,
            Pixels::I16(v) => v.len(),
            Pixels::Rgb(v) => v.len() / 3,
            Pixels::Rgba(v) | Pixels::Cmyk(v) => v.len() / 4,
            Pixels::P { indices, .. } => indices.len(),
        }
    }
}

/// An image in a Pillow mode, with its transparency info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Pixels,
    pub transparency: Option<Transparency>,
}

impl ModeImage {
    /// The Pillow mode name, for messages and tests.
    pub fn mode(&self) -> &'static str {
        match self.pixels {
            Pixels::Bilevel(_) => "1",
            Pixels::L(_) => "L",
            Pixels::La(_) => "LA",
            Pixels::I16(_) => "I;16",
            Pixels::Rgb(_) => "RGB",
            Pixels::Rgba(_) => "RGBA",
            Pixels::Cmyk(_) => "CMYK",
            Pixels::P { .. } => "P",
        }
    }

    /// `"A" in getbands() or info.get("transparency") is not None`.
    pub fn has_alpha(&self) -> bool {
        matches!(self.pixels, Pixels::La(_) | Pixels::Rgba(_)) || self.transparency.is_some()
    }
}

/// Pillow's `MULDIV255`: `a * b / 255`, rounded, for 8-bit operands.
#[inline]
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// Pillow's `cmyk2rgb` for one sample.
#[inline]
fn cmyk_channel(c: u8, k: u8) -> u8 {
    let nk = 255 - u32::from(k);
    // nk - muldiv255(c, nk) is in 0..=255, so CLIP8 never clips.
    (nk - muldiv255(u32::from(c), nk)) as u8
}

/// `Image.alpha_composite(white, rgba)` for one colour sample (Pillow's `AlphaComposite.c`
/// with the destination opaque white: `coef1 = a·128`, `coef2 = (255 − a)·128`).
#[inline]
fn over_white(c: u8, a: u8) -> u8 {
    if a == 0 {
        return 255;
    }
    let a = u32::from(a);
    let tmp = u32::from(c) * (a << 7) + 255 * ((255 - a) << 7) + (0x80 << 7);
    ((((tmp >> 8) + tmp) >> 8) >> 7) as u8
}

/// The RGB image for `image`, per [`AlphaMode`]; `Err(bytes)` if the output cannot be allocated.
pub fn to_rgb(image: ModeImage, alpha: AlphaMode) -> Result<Vec<u8>, u64> {
    let composite = alpha == AlphaMode::White && image.has_alpha();
    let n = image.width as usize * image.height as usize;
    let ModeImage {
        pixels,
        transparency,
        ..
    } = image;
    // The conversions that reuse their input buffer.
    match pixels {
        Pixels::Rgb(rgb) if !composite || transparency.is_none() => Ok(rgb),
        Pixels::Rgb(mut rgb) => {
            if let Some(Transparency::Rgb(r, g, b)) = transparency {
                let key = [r as u8, g as u8, b as u8];
                for px in rgb.chunks_exact_mut(3) {
                    if px == key {
                        px.copy_from_slice(&[255, 255, 255]);
                    }
                }
            }
            Ok(rgb)
        }
        pixels => {
            // `convert_into` writes every output pixel that has a source pixel: when all `n`
            // have one, a recycled buffer (stale bytes, no page faults) is filled completely.
            let mut out: Vec<u8> = if pixels.count() >= n {
                crate::memory::overwritable_bytes(n * 3)?
            } else {
                super::zeroed(n * 3)?
            };
            convert_into(&pixels, transparency.as_ref(), composite, &mut out);
            Ok(out)
        }
    }
}

/// Pillow's `convert("RGBA")` of an image with transparency data ([`ModeImage::has_alpha`]):
/// `RGBA` as it is, `LA` spread to `(l, l, l, a)`, a palette with its per-index alphas or
/// transparent index applied (`putpalettealphas` / `putpalettealpha`), and `1`, `L`, `I;16`,
/// `RGB` with a transparent colour through `convert_transparent` (alpha 0 where the converted
/// colour equals it, else 255); `Err(bytes)` if the output cannot be allocated. An image without
/// transparency data is converted with an opaque alpha.
pub fn to_rgba(image: ModeImage) -> Result<Vec<u8>, u64> {
    let n = image.width as usize * image.height as usize;
    let ModeImage {
        pixels,
        transparency,
        ..
    } = image;
    if let Pixels::Rgba(rgba) = pixels {
        return Ok(rgba);
    }
    let mut out: Vec<u8> = super::zeroed(n * 4)?;
    match &pixels {
        Pixels::La(la) => {
            for (px, s) in out.chunks_exact_mut(4).zip(la.chunks_exact(2)) {
                px.copy_from_slice(&[s[0], s[0], s[0], s[1]]);
            }
        }
        Pixels::P { indices, palette } => {
            let mut table = palette.entries;
            match &transparency {
                Some(Transparency::PaletteAlphas(alphas)) => {
                    for (entry, &a) in table.iter_mut().zip(alphas) {
                        entry[3] = a;
                    }
                }
                Some(Transparency::PaletteIndex(i)) => table[usize::from(*i)][3] = 0,
                _ => {}
            }
            for (px, &i) in out.chunks_exact_mut(4).zip(indices) {
                px.copy_from_slice(&table[usize::from(i)]);
            }
        }
        other => {
            let mut rgb: Vec<u8> = super::zeroed(n * 3)?;
            convert_into_or_copy(other, &mut rgb);
            let key = match transparency {
                Some(Transparency::Gray(t)) => Some([t as u8; 3]),
                Some(Transparency::Rgb(r, g, b)) => Some([r as u8, g as u8, b as u8]),
                _ => None,
            };
            for (px, s) in out.chunks_exact_mut(4).zip(rgb.chunks_exact(3)) {
                let a = if key.is_some_and(|k| k == s) { 0 } else { 255 };
                px.copy_from_slice(&[s[0], s[1], s[2], a]);
            }
        }
    }
    Ok(out)
}

/// The plain RGB of `pixels` (no transparency applied) into `out` (n × 3).
fn convert_into_or_copy(pixels: &Pixels, out: &mut [u8]) {
    match pixels {
        Pixels::Rgb(rgb) => out.copy_from_slice(rgb),
        other => convert_into(other, None, false, out),
    }
}

/// Gray values replicated into RGB `out`; the value `key` (a transparent gray composited onto
/// white) becomes white.
fn gray_into(out: &mut [u8], values: impl Iterator<Item = u8>, key: Option<u8>) {
    for (px, v) in out.chunks_exact_mut(3).zip(values) {
        let v = if key == Some(v) { 255 } else { v };
        px.copy_from_slice(&[v, v, v]);
    }
}

/// Fills `out` (n × 3) from pixels whose conversion needs a new buffer.
fn convert_into(
    pixels: &Pixels,
    transparency: Option<&Transparency>,
    composite: bool,
    out: &mut [u8],
) {
    // The transparent gray of `1`, `L`, `I;16` images, compared after conversion (rgbT2a).
    let gray_key = match transparency {
        Some(Transparency::Gray(t)) if composite => Some(*t as u8),
        _ => None,
    };
    match pixels {
        Pixels::Bilevel(bits) => gray_into(
            out,
            bits.iter().map(|&b| if b != 0 { 255 } else { 0 }),
            gray_key,
        ),
        Pixels::L(l) => gray_into(out, l.iter().copied(), gray_key),
        Pixels::I16(v) => gray_into(
            out,
            v.iter().map(|&x| if x > 255 { 255 } else { x as u8 }),
            gray_key,
        ),
        Pixels::La(la) => {
            for (px, s) in out.chunks_exact_mut(3).zip(la.chunks_exact(2)) {
                let v = if composite {
                    over_white(s[0], s[1])
                } else {
                    s[0]
                };
                px.copy_from_slice(&[v, v, v]);
            }
        }
        Pixels::Rgba(rgba) => {
            for (px, s) in out.chunks_exact_mut(3).zip(rgba.chunks_exact(4)) {
                if composite {
                    let a = s[3];
                    px.copy_from_slice(&[
                        over_white(s[0], a),
                        over_white(s[1], a),
                        over_white(s[2], a),
                    ]);
                } else {
                    px.copy_from_slice(&s[..3]);
                }
            }
        }
        Pixels::Cmyk(cmyk) => {
            for (px, s) in out.chunks_exact_mut(3).zip(cmyk.chunks_exact(4)) {
                let k = s[3];
                px.copy_from_slice(&[
                    cmyk_channel(s[0], k),
                    cmyk_channel(s[1], k),
                    cmyk_channel(s[2], k),
                ]);
            }
        }
        Pixels::P { indices, palette } => {
            let mut table = palette.entries;
            if composite {
                match transparency {
                    Some(Transparency::PaletteAlphas(alphas)) => {
                        for (entry, &a) in table.iter_mut().zip(alphas) {
                            entry[3] = a;
                        }
                    }
                    Some(Transparency::PaletteIndex(i)) => table[usize::from(*i)][3] = 0,
                    _ => {}
                }
            }
            // One RGB triple per index, composited once per palette entry.
            let mut rgb = [[0u8; 3]; 256];
            for (dst, e) in rgb.iter_mut().zip(&table) {
                *dst = if composite {
                    [
                        over_white(e[0], e[3]),
                        over_white(e[1], e[3]),
                        over_white(e[2], e[3]),
                    ]
                } else {
                    [e[0], e[1], e[2]]
                };
            }
            for (px, &i) in out.chunks_exact_mut(3).zip(indices) {
                px.copy_from_slice(&rgb[usize::from(i)]);
            }
        }
        Pixels::Rgb(_) => unreachable!("RGB converts in place"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pillow's `AlphaComposite.c`, written out in full for a general destination.
    fn pillow_composite(dst: [u32; 4], src: [u32; 4]) -> [u32; 4] {
        if src[3] == 0 {
            return dst;
        }
        let blend = dst[3] * (255 - src[3]);
        let outa255 = src[3] * 255 + blend;
        let coef1 = src[3] * 255 * 255 * (1 << 7) / outa255;
        let coef2 = 255 * (1 << 7) - coef1;
        let ch = |s: u32, d: u32| {
            let t = s * coef1 + d * coef2 + (0x80 << 7);
            (((t >> 8) + t) >> 8) >> 7
        };
        let t = outa255 + 0x80;
        [
            ch(src[0], dst[0]),
            ch(src[1], dst[1]),
            ch(src[2], dst[2]),
            ((t >> 8) + t) >> 8,
        ]
    }

    #[test]
    fn over_white_is_pillows_alpha_composite() {
        for a in 0..=255u32 {
            for c in 0..=255u32 {
                let want = pillow_composite([255, 255, 255, 255], [c, c, c, a]);
                assert_eq!(
                    u32::from(over_white(c as u8, a as u8)),
                    want[0],
                    "c={c} a={a}"
                );
                assert_eq!(want[3], 255);
            }
        }
        assert_eq!(over_white(17, 255), 17);
    }

    #[test]
    fn cmyk_matches_pillow_formula() {
        // Pillow: nk = 255 - k; CLIP8(nk - MULDIV255(c, nk)).
        assert_eq!(cmyk_channel(0, 0), 255);
        assert_eq!(cmyk_channel(255, 0), 0);
        assert_eq!(cmyk_channel(0, 255), 0);
        assert_eq!(cmyk_channel(128, 128), 127 - muldiv255(128, 127) as u8);
    }

    fn image(pixels: Pixels, transparency: Option<Transparency>, w: u32, h: u32) -> ModeImage {
        ModeImage {
            width: w,
            height: h,
            pixels,
            transparency,
        }
    }

    #[test]
    fn recycled_output_is_written_completely() {
        // A kept buffer full of stale bytes, large enough to be recycled for the output.
        let (w, h) = (256u32, 256u32);
        let n = (w * h) as usize;
        let gray: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let want: Vec<u8> = gray.iter().flat_map(|&v| [v, v, v]).collect();
        for short in [false, true] {
            crate::memory::recycle::give_u8(vec![0xAB; n * 3 + 64]);
            let mut pixels = gray.clone();
            if short {
                // A source missing pixels (no decoder makes one): the rest stays zero.
                pixels.truncate(n - 10);
            }
            let out = to_rgb(image(Pixels::L(pixels), None, w, h), AlphaMode::White).unwrap();
            assert_eq!(out.len(), n * 3);
            let end = if short { (n - 10) * 3 } else { n * 3 };
            assert_eq!(out[..end], want[..end]);
            assert!(out[end..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn gray_transparency_compares_after_conversion() {
        // I;16 300 clips to 255; t = 0x01ff → key 0xff → both 255-valued pixels turn white.
        let img = image(
            Pixels::I16(vec![300, 255, 7]),
            Some(Transparency::Gray(0x1ff)),
            3,
            1,
        );
        assert_eq!(
            to_rgb(img, AlphaMode::White).unwrap(),
            [255, 255, 255, 255, 255, 255, 7, 7, 7]
        );
        let img = image(Pixels::L(vec![3, 4]), Some(Transparency::Gray(4)), 2, 1);
        assert_eq!(
            to_rgb(img.clone(), AlphaMode::White).unwrap(),
            [3, 3, 3, 255, 255, 255]
        );
        assert_eq!(to_rgb(img, AlphaMode::Drop).unwrap(), [3, 3, 3, 4, 4, 4]);
    }

    #[test]
    fn palette_lookup_and_alpha() {
        let mut palette = Palette::from_packed(&[10, 20, 30, 40, 50, 60], 3, [0, 1, 2]);
        palette.entries[5] = [1, 2, 3, 255];
        let img = image(
            Pixels::P {
                indices: vec![0, 1, 5, 9],
                palette: Box::new(palette),
            },
            Some(Transparency::PaletteAlphas(vec![255, 0])),
            4,
            1,
        );
        assert_eq!(
            to_rgb(img.clone(), AlphaMode::White).unwrap(),
            [10, 20, 30, 255, 255, 255, 1, 2, 3, 0, 0, 0]
        );
        assert_eq!(
            to_rgb(img, AlphaMode::Drop).unwrap(),
            [10, 20, 30, 40, 50, 60, 1, 2, 3, 0, 0, 0]
        );
    }

    #[test]
    fn rgb_transparency_uses_low_bytes() {
        let img = image(
            Pixels::Rgb(vec![1, 2, 3, 1, 2, 4]),
            Some(Transparency::Rgb(0x101, 2, 3)),
            2,
            1,
        );
        assert_eq!(
            to_rgb(img, AlphaMode::White).unwrap(),
            [255, 255, 255, 1, 2, 4]
        );
    }
}
