//! Inputs to RGB: decoded pixels (1, 3 or 4 channels) or encoded files.
//!
//! - Encoded bytes go through [`crate::image::decode`] (Pillow-exact), with EXIF and alpha as
//!   the caller's [`Options`] say. [`Alpha::LoadImage`] reproduces what transformers' processors
//!   make of a path: `load_image` (`exif_transpose`, then `convert("RGB")`, which drops alpha but
//!   keeps a single transparent colour in `info["transparency"]`), then `convert_to_rgb`, which
//!   sees that colour and composites every pixel of exactly that colour onto white.
//! - Pixel arrays follow transformers' `convert_to_rgb` for numpy input: 3 channels are used as
//!   they are, 1 channel is repeated, 4 channels are composited onto white as
//!   `np.round(alpha * rgb + (1 - alpha) * 255)` with `alpha = a / 255`, all in `float64`, rounding
//!   half to even.

use std::borrow::Cow;

use crate::image::decode::convert::{self, AlphaMode, ModeImage, Pixels, Transparency};
use crate::image::decode::{self, exif, DecodeError, DecodeOptions, Format, RgbImage};

use super::{Options, ProcessorError, RgbRef, MAX_SIDE};
use crate::memory::fallible;

/// What encoded images with an alpha band or transparency info become.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Alpha {
    /// transformers' processors given a path: `convert_to_rgb(load_image(path))` — alpha
    /// dropped, and the pixels of a single transparent colour (PNG `tRNS` of gray, RGB or one
    /// palette index; GIF transparency) turned white.
    #[default]
    LoadImage,
    /// transformers' processors given `Image.open(...)`: `convert_to_rgb`, alpha composited
    /// onto white.
    White,
    /// Pillow's plain `convert("RGB")`: alpha and transparency ignored.
    Drop,
}

/// The colour `convert_to_rgb` turns white after `load_image`'s `convert("RGB")`: Pillow
/// converts `info["transparency"]` along with the pixels for `L` (a gray value, clipped to 255
/// by `putpixel`) and `P` with one transparent index (its palette colour), keeps an `RGB`
/// colour as it is and leaves the int of `1`/`I;16` untouched, which `convert_transparent`
/// then reads as `(t, 0, 0)`; per-index palette alphas are deleted (with a warning).
fn load_image_key(image: &ModeImage) -> Option<[u8; 3]> {
    let low = |v: u16| (v & 0xff) as u8;
    match (&image.pixels, image.transparency.as_ref()?) {
        (Pixels::L(_), Transparency::Gray(t)) => {
            let v = (*t).min(255) as u8;
            Some([v, v, v])
        }
        (Pixels::Bilevel(_) | Pixels::I16(_), Transparency::Gray(t)) => Some([low(*t), 0, 0]),
        (Pixels::Rgb(_), Transparency::Rgb(r, g, b)) => Some([low(*r), low(*g), low(*b)]),
        (Pixels::P { palette, .. }, Transparency::PaletteIndex(i)) => {
            let [r, g, b, _] = palette.entries[usize::from(*i)];
            Some([r, g, b])
        }
        _ => None,
    }
}

/// `convert_to_rgb(load_image(data))` (see [`Alpha::LoadImage`]).
fn decode_like_load_image(
    data: &[u8],
    apply_exif: bool,
    max_pixels: Option<u64>,
    threads: usize,
) -> Result<RgbImage, DecodeError> {
    let format = match decode::sniff(data) {
        // Only PNG and GIF carry a transparent colour; the rest is plain `convert("RGB")`.
        Some(f @ (Format::Png | Format::Gif)) => f,
        _ => {
            let options = DecodeOptions {
                apply_exif,
                max_pixels,
                alpha: AlphaMode::Drop,
                threads,
            };
            return decode::decode(data, &options);
        }
    };
    let limit = max_pixels.unwrap_or(u64::MAX);
    let decoded = if format == Format::Png {
        decode::png::decode(data, limit)?
    } else {
        decode::gif::decode(data, limit)?
    };
    let orientation = if apply_exif {
        exif::pillow_orientation(format, &decoded)?
    } else {
        1
    };
    let key = load_image_key(&decoded.image);
    let (width, height) = (decoded.image.width, decoded.image.height);
    let oom = |bytes| DecodeError::OutOfMemory { format, bytes };
    let mut pixels = convert::to_rgb(decoded.image, AlphaMode::Drop).map_err(oom)?;
    if let Some(key) = key {
        for px in pixels.chunks_exact_mut(3) {
            if px == key {
                px.copy_from_slice(&[255, 255, 255]);
            }
        }
    }
    let image = RgbImage {
        width,
        height,
        pixels,
    };
    exif::transpose(image, orientation).map_err(oom)
}

/// An image handed to a processor.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// Interleaved `u8` pixels, `height` rows of `width × channels` bytes, channels 1, 3 or 4.
    Pixels {
        data: &'a [u8],
        width: usize,
        height: usize,
        channels: usize,
    },
    /// A whole JPEG, PNG, GIF, BMP or WebP file.
    Encoded(&'a [u8]),
}

/// An RGB image, borrowed from the input or owned after a conversion or a decode.
#[derive(Debug)]
pub struct Rgb<'a> {
    pub data: Cow<'a, [u8]>,
    pub width: usize,
    pub height: usize,
}

impl Rgb<'_> {
    pub fn view(&self) -> RgbRef<'_> {
        RgbRef {
            data: &self.data,
            width: self.width,
            height: self.height,
        }
    }
}

/// transformers' compositing of a 4-channel `uint8` array onto white, for one value.
#[inline]
pub fn composite_on_white(value: u8, alpha: u8) -> u8 {
    let a = f64::from(alpha) / 255.0;
    let blended = a * f64::from(value) + (1.0 - a) * 255.0;
    // np.round: half to even; the result lies in [0, 255].
    blended.round_ties_even() as u8
}

/// Width × height from the header of a JPEG (first SOF marker), PNG (IHDR), GIF (logical
/// screen), BMP or WebP file (the `VP8 ` frame header, the `VP8L` header or the `VP8X` canvas),
/// without decoding it; `None` for anything else or a short header. Only a scheduling hint (see
/// [`Input::cost_hint`]): the decoder validates the file for real.
fn header_pixels(data: &[u8]) -> Option<u64> {
    let be16 = |at: usize| -> Option<u64> {
        Some(u64::from(u16::from_be_bytes([
            *data.get(at)?,
            *data.get(at + 1)?,
        ])))
    };
    let le = |at: usize, n: usize| -> Option<u64> {
        let bytes = data.get(at..at + n)?;
        Some(
            bytes
                .iter()
                .rev()
                .fold(0u64, |v, &b| (v << 8) | u64::from(b)),
        )
    };
    if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        let w = u64::from(u32::from_be_bytes(data.get(16..20)?.try_into().ok()?));
        let h = u64::from(u32::from_be_bytes(data.get(20..24)?.try_into().ok()?));
        return Some(w.saturating_mul(h));
    }
    if data.starts_with(b"GIF8") {
        return Some(le(6, 2)? * le(8, 2)?);
    }
    if data.starts_with(b"BM") {
        // BITMAPINFOHEADER: signed 32-bit width and height (negative height: top-down)
        let w = u64::from((le(18, 4)? as u32 as i32).unsigned_abs());
        let h = u64::from((le(22, 4)? as u32 as i32).unsigned_abs());
        return Some(w.saturating_mul(h));
    }
    if data.starts_with(b"RIFF") && data.get(8..12) == Some(b"WEBP") {
        return match data.get(12..16)? {
            // lossy: a 3-byte frame tag and the start code 9D 01 2A, then 14-bit width and height
            b"VP8 " => Some((le(26, 2)? & 0x3FFF) * (le(28, 2)? & 0x3FFF)),
            // lossless: the signature 0x2F, then width − 1 and height − 1 in 14 bits each
            b"VP8L" => {
                let bits = le(21, 4)?;
                Some(((bits & 0x3FFF) + 1) * ((bits >> 14 & 0x3FFF) + 1))
            }
            // extended: flags and reserved bytes, then the canvas's width − 1 and height − 1
            b"VP8X" => Some((le(24, 3)? + 1) * (le(27, 3)? + 1)),
            _ => None,
        };
    }
    if !data.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    loop {
        // a marker: 0xFF (fill bytes allowed), then its code
        while *data.get(at)? != 0xFF {
            at += 1;
        }
        while *data.get(at)? == 0xFF {
            at += 1;
        }
        let code = *data.get(at)?;
        at += 1;
        match code {
            0x01 | 0xD0..=0xD7 => continue,
            0xC0..=0xCF if !matches!(code, 0xC4 | 0xC8 | 0xCC) => {
                // SOFn: length (2), precision (1), height (2), width (2)
                return Some(be16(at + 3)? * be16(at + 5)?);
            }
            0xD9 | 0xDA => return None,
            _ => at += usize::try_from(be16(at)?).ok()?,
        }
    }
}

impl<'a> Input<'a> {
    /// A rough cost of processing this input: its pixel count (read from the header of an
    /// encoded file), else its byte length. It decides how many threads an automatic batch
    /// takes and hands the largest images out first.
    pub fn cost_hint(&self) -> u64 {
        match *self {
            Input::Pixels { width, height, .. } => (width as u64).saturating_mul(height as u64),
            Input::Encoded(bytes) => header_pixels(bytes).unwrap_or(bytes.len() as u64),
        }
    }

    /// The image as RGB.
    pub fn to_rgb(self, options: &Options) -> Result<Rgb<'a>, ProcessorError> {
        match self {
            Input::Encoded(bytes) => {
                let decoded = match options.alpha {
                    Alpha::LoadImage => decode_like_load_image(
                        bytes,
                        options.apply_exif,
                        options.max_pixels,
                        options.threads,
                    ),
                    Alpha::White | Alpha::Drop => {
                        let decode_options = DecodeOptions {
                            apply_exif: options.apply_exif,
                            max_pixels: options.max_pixels,
                            alpha: if options.alpha == Alpha::White {
                                AlphaMode::White
                            } else {
                                AlphaMode::Drop
                            },
                            threads: options.threads,
                        };
                        decode::decode(bytes, &decode_options)
                    }
                };
                let image = decoded.map_err(|error| ProcessorError::Decode { index: 0, error })?;
                Ok(Rgb {
                    data: Cow::Owned(image.pixels),
                    width: image.width as usize,
                    height: image.height as usize,
                })
            }
            Input::Pixels {
                data,
                width,
                height,
                channels,
            } => {
                check_pixels(data.len(), width, height, channels)?;
                if channels != 3 {
                    super::check_image("image converted to RGB", height, width)?;
                }
                let rgb_len = width * height * 3;
                let oom = ProcessorError::oom("image converted to RGB");
                let data = match channels {
                    3 => Cow::Borrowed(data),
                    1 => Cow::Owned(
                        fallible::collect(rgb_len, data.iter().flat_map(|&v| [v, v, v]))
                            .map_err(oom)?,
                    ),
                    _ => {
                        let mut out = fallible::with_capacity(rgb_len).map_err(oom)?;
                        for px in data.chunks_exact(4) {
                            let a = px[3];
                            out.extend(px[..3].iter().map(|&v| composite_on_white(v, a)));
                        }
                        Cow::Owned(out)
                    }
                };
                Ok(Rgb {
                    data,
                    width,
                    height,
                })
            }
        }
    }
}

fn check_pixels(
    len: usize,
    width: usize,
    height: usize,
    channels: usize,
) -> Result<(), ProcessorError> {
    if !matches!(channels, 1 | 3 | 4) {
        return Err(ProcessorError::shape(
            "channels",
            "1, 3 or 4 (HxWxC uint8)",
            channels.to_string(),
        ));
    }
    if width == 0 || height == 0 {
        return Err(ProcessorError::shape(
            "size",
            "at least 1x1",
            format!("{height}x{width} (HxW)"),
        ));
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(ProcessorError::TooLarge {
            what: "image side",
            limit: MAX_SIDE as u64,
            actual: width.max(height) as u64,
        });
    }
    let expected = width * height * channels;
    if len != expected {
        return Err(ProcessorError::shape(
            "data length",
            format!("{expected} bytes ({height}x{width}x{channels})"),
            len.to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_pixels_reads_the_size_without_decoding() {
        let jpeg = include_bytes!("../../../src/smg_grpc_proto/data/grace_hopper.jpg");
        assert_eq!(header_pixels(jpeg), Some(512 * 600));
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        png.extend_from_slice(&741u32.to_be_bytes());
        png.extend_from_slice(&500u32.to_be_bytes());
        assert_eq!(header_pixels(&png), Some(741 * 500));
        assert_eq!(header_pixels(b"GIF89a\x10\x00\x20\x00"), Some(16 * 32));
        let mut bmp = vec![0u8; 26];
        bmp[..2].copy_from_slice(b"BM");
        bmp[18..22].copy_from_slice(&300i32.to_le_bytes());
        bmp[22..26].copy_from_slice(&(-200i32).to_le_bytes());
        assert_eq!(header_pixels(&bmp), Some(300 * 200));
        // WebP: the first 40 bytes of 300 x 200 images saved by Pillow 13 (lossy, lossless, and
        // lossy with EXIF, which makes an extended file)
        for hex in [
            "52494646b00000005745425056503820a40000007010009d012a2c01c8003e6d369949a42322a120",
            "5249464624000000574542505650384c180000002f2bc1310007508a2ad4a3ff010045faff9f22fa",
            "52494646d400000057454250565038580a000000080000002b0100c7000056503820a40000007010",
        ] {
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            assert_eq!(header_pixels(&bytes), Some(300 * 200), "{}", &hex[24..32]);
            assert_eq!(header_pixels(&bytes[..20]), None, "a short WebP header");
        }
        // Hostile WebP headers: any bytes after the signature, any length, read without a panic
        // and within the 14- and 24-bit fields' bounds.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for n in 0..2000usize {
            let mut bytes = b"RIFF\0\0\0\0WEBP".to_vec();
            bytes.extend_from_slice([b"VP8 ", b"VP8L", b"VP8X"][n % 3]);
            for _ in 0..n % 40 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(state as u8);
            }
            assert!(header_pixels(&bytes).is_none_or(|p| p <= 1 << 48));
        }
        // truncated or unknown: no hint, the byte length is used instead
        for junk in [
            &jpeg[..100],
            &png[..20],
            b"GIF8".as_slice(),
            b"RIFF....WEBP",
            b"",
        ] {
            assert_eq!(header_pixels(junk), None);
        }
        assert_eq!(Input::Encoded(b"RIFF....WEBP").cost_hint(), 12);
        let pixels = Input::Pixels {
            data: &[],
            width: 7,
            height: 3,
            channels: 3,
        };
        assert_eq!(pixels.cost_hint(), 21);
    }

    #[test]
    fn composite_matches_numpy() {
        // np.round(np.array([[[10, 200, 30, 128]]])[..., 3:4] / 255 * ... ) values computed in
        // numpy: alpha 128/255; 10 -> 132.0 (131.98...), 200 -> 227.39 -> 227, 30 -> 142.0
        assert_eq!(composite_on_white(10, 128), 132);
        assert_eq!(composite_on_white(200, 128), 227);
        assert_eq!(composite_on_white(30, 128), 142);
        assert_eq!(composite_on_white(77, 255), 77);
        assert_eq!(composite_on_white(77, 0), 255);
    }

    #[test]
    fn channels() {
        let opts = Options::default();
        let gray = Input::Pixels {
            data: &[1, 2],
            width: 2,
            height: 1,
            channels: 1,
        };
        assert_eq!(&*gray.to_rgb(&opts).unwrap().data, &[1, 1, 1, 2, 2, 2]);
        let bad = Input::Pixels {
            data: &[1, 2],
            width: 1,
            height: 1,
            channels: 2,
        };
        assert_eq!(bad.to_rgb(&opts).unwrap_err().kind(), "image_shape");
        let short = Input::Pixels {
            data: &[1, 2],
            width: 1,
            height: 1,
            channels: 3,
        };
        assert_eq!(short.to_rgb(&opts).unwrap_err().kind(), "image_shape");
        let empty = Input::Pixels {
            data: &[],
            width: 0,
            height: 1,
            channels: 3,
        };
        assert_eq!(empty.to_rgb(&opts).unwrap_err().kind(), "image_shape");
        let err = Input::Encoded(b"nope").to_rgb(&opts).unwrap_err();
        assert_eq!(err.kind(), "decode");
    }
}
