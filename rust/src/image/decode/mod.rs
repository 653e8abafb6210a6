//! Decoding encoded images to RGB exactly as transformers' loader gets them from Pillow 13.0.0.
//!
//! [`decode`] reproduces, byte for byte,
//! `np.array(convert_to_rgb(ImageOps.exif_transpose(Image.open(BytesIO(data)))))`:
//!
//! 1. the format's decoder produces the image in the Pillow *mode* Pillow would open it in
//!    (`L`, `1`, `LA`, `I;16`, `RGB`, `RGBA`, `CMYK`, `P` + palette), with the same transparency
//!    info (`tRNS`, GIF transparency index) — one module per format:
//!    [`jpeg`] (libjpeg-turbo, linked statically: ISLOW IDCT and fancy upsampling, as Pillow's
//!    bundled libjpeg-turbo), [`png`], [`gif`], [`bmp`] and [`webp`] (libwebp's animation decoder,
//!    as Pillow uses it);
//! 2. [`convert`] turns that into RGB like transformers' `convert_to_rgb`: images with an alpha
//!    band or transparency info are converted to RGBA and alpha-composited onto opaque white
//!    (Pillow's integer `alpha_composite`), everything else goes through Pillow's `convert("RGB")`
//!    (L replicated, palette looked up, CMYK by Pillow's formula, `I;16` clipped at 255).
//!    [`AlphaMode::Drop`] instead gives plain `convert("RGB")` (alpha dropped), which is what
//!    transformers' `load_image` does for paths and URLs;
//! 3. [`exif`] reads the EXIF (or XMP) orientation the way `Image.getexif` does and applies it
//!    like `ImageOps.exif_transpose`.
//!
//! The header's dimensions are checked against [`DecodeOptions::max_pixels`] before any pixel
//! buffer is allocated; allocations are fallible. Every failure is a [`DecodeError`]: no input
//! panics, and the only C code (libjpeg, libwebp) reports errors through return codes.

pub mod bmp;
pub mod convert;
mod error;
pub mod exif;
pub mod gif;
mod inflate;
pub mod jpeg;
mod jpeg_huffman;
mod jpeg_pipeline;
mod jpeg_progressive;
pub mod png;
pub mod webp;

use std::fmt;

pub use convert::AlphaMode;
pub use error::DecodeError;

use convert::ModeImage;

/// Whether the environment variable `name` is set to something other than empty, `0` or
/// `false`: the switches that turn one of our decoders off for comparisons.
pub(crate) fn env_switch(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Pillow's `Image.MAX_IMAGE_PIXELS` (`int(1024 * 1024 * 1024 // 4 // 3)`): above it Pillow warns.
pub const PILLOW_MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// The default pixel limit: Pillow raises `DecompressionBombError` above twice
/// [`PILLOW_MAX_IMAGE_PIXELS`], so every image Pillow opens is accepted and none it refuses.
pub const DEFAULT_MAX_PIXELS: u64 = 2 * PILLOW_MAX_IMAGE_PIXELS;

/// Progressive JPEGs with more scans than this are rejected: each scan costs a pass over the
/// coefficients, so a small file with thousands of scans would take minutes. Real files have
/// fewer than 20; 500 is the limit libjpeg-turbo's own fuzzers and `tjbench -limitscans` use.
/// Pillow has no such limit.
pub const MAX_JPEG_SCANS: u32 = 500;

/// The image formats [`decode`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Jpeg,
    Png,
    Gif,
    Bmp,
    WebP,
}

impl Format {
    /// The name Pillow gives the format (`Image.format`), also used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Jpeg => "JPEG",
            Self::Png => "PNG",
            Self::Gif => "GIF",
            Self::Bmp => "BMP",
            Self::WebP => "WEBP",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How to decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Apply the EXIF orientation like `ImageOps.exif_transpose` (transformers does for paths).
    pub apply_exif: bool,
    /// Reject images whose header declares more pixels than this (`None`: no limit).
    pub max_pixels: Option<u64>,
    /// What to do with alpha and transparency.
    pub alpha: AlphaMode,
    /// Threads the decode may use (0: one per core). With two or more, a large baseline JPEG is
    /// Huffman-decoded on a second thread while the first runs the rest of libjpeg.
    pub threads: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            apply_exif: true,
            max_pixels: Some(DEFAULT_MAX_PIXELS),
            alpha: AlphaMode::White,
            threads: 0,
        }
    }
}

/// A decoded image: `height` rows of `width` RGB pixels, 3 bytes each, no padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// An image as a format decoder hands it over, before conversion to RGB.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub image: ModeImage,
    /// The raw EXIF block as Pillow's `info["exif"]` would hold it (with or without `Exif\0\0`).
    pub exif: Option<Vec<u8>>,
    /// The XMP packet Pillow would search for `tiff:Orientation` when the EXIF has none.
    pub xmp: Option<Vec<u8>>,
    /// Set when Pillow's `getexif()` cannot read the EXIF (see [`exif::ExifError`]).
    pub exif_error: Option<exif::ExifError>,
}

/// Recognises the format from the first bytes, as Pillow's plugins' `_accept` functions do (a
/// bare DIB, which Pillow's BMP plugin also opens, counts as BMP).
pub fn sniff(data: &[u8]) -> Option<Format> {
    if data.starts_with(b"\xff\xd8\xff") {
        Some(Format::Jpeg)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(Format::Png)
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        Some(Format::Gif)
    } else if data.starts_with(b"BM") || bmp::is_dib(data) {
        Some(Format::Bmp)
    } else if data.len() >= 16
        && data.starts_with(b"RIFF")
        && &data[8..12] == b"WEBP"
        && matches!(&data[12..16], b"VP8 " | b"VP8L" | b"VP8X")
    {
        Some(Format::WebP)
    } else {
        None
    }
}

/// Names a few image formats we do not decode, for a clearer error.
fn recognise_other(data: &[u8]) -> Option<&'static str> {
    const OTHERS: &[(&[u8], usize, &str)] = &[
        (b"II*\x00", 0, "TIFF"),
        (b"MM\x00*", 0, "TIFF"),
        (b"II+\x00", 0, "BigTIFF"),
        (b"MM\x00+", 0, "BigTIFF"),
        (b"\x00\x00\x01\x00", 0, "ICO"),
        (b"\x00\x00\x02\x00", 0, "CUR"),
        (b"8BPS", 0, "PSD"),
        (b"\x00\x00\x00\x0cjP  ", 0, "JPEG 2000"),
        (b"\xff\x4f\xff\x51", 0, "JPEG 2000"),
        (b"\xff\x0a", 0, "JPEG XL"),
        (b"\x00\x00\x00\x0cJXL ", 0, "JPEG XL"),
        (b"ftypavif", 4, "AVIF"),
        (b"ftypheic", 4, "HEIF"),
        (b"ftypheix", 4, "HEIF"),
        (b"ftypmif1", 4, "HEIF"),
        (b"qoif", 0, "QOI"),
        (b"DDS ", 0, "DDS"),
        (b"icns", 0, "ICNS"),
        (b"%!PS", 0, "EPS"),
        (b"%PDF", 0, "PDF"),
        (b"RIFF", 0, "RIFF (not a WebP image)"),
    ];
    OTHERS
        .iter()
        .find(|(magic, at, _)| {
            data.len() >= at + magic.len() && &data[*at..at + magic.len()] == *magic
        })
        .map(|(_, _, name)| *name)
}

/// The file's format, its pixels in their own mode, and Pillow's EXIF orientation (1 unless
/// `apply_exif`): what [`decode`] and [`decode_keeping_alpha`] share before converting.
fn decode_mode(
    data: &[u8],
    apply_exif: bool,
    max_pixels: Option<u64>,
    threads: usize,
) -> Result<(Format, Decoded, u8), DecodeError> {
    let limit = max_pixels.unwrap_or(u64::MAX);
    let format = sniff(data).ok_or_else(|| DecodeError::UnknownFormat {
        head: data[..data.len().min(12)].to_vec(),
        recognised: recognise_other(data),
    })?;
    let decoded = match format {
        Format::Jpeg => jpeg::decode(data, limit, threads)?,
        Format::Png => png::decode(data, limit)?,
        Format::Gif => gif::decode(data, limit)?,
        Format::Bmp => bmp::decode(data, limit)?,
        Format::WebP => webp::decode(data, limit)?,
    };
    let orientation = if apply_exif {
        exif::pillow_orientation(format, &decoded)?
    } else {
        1
    };
    Ok((format, decoded, orientation))
}

/// Decodes `data` (a whole JPEG, PNG, GIF, BMP or WebP file) to RGB; see the module docs.
pub fn decode(data: &[u8], options: &DecodeOptions) -> Result<RgbImage, DecodeError> {
    let (format, decoded, orientation) = decode_mode(
        data,
        options.apply_exif,
        options.max_pixels,
        options.threads,
    )?;
    let (width, height) = (decoded.image.width, decoded.image.height);
    let rgb = convert::to_rgb(decoded.image, options.alpha)
        .map_err(|bytes| DecodeError::OutOfMemory { format, bytes })?;
    let image = RgbImage {
        width,
        height,
        pixels: rgb,
    };
    exif::transpose(image, orientation).map_err(|bytes| DecodeError::OutOfMemory { format, bytes })
}

/// What `image.convert("RGBA" if image.has_transparency_data else "RGB")` gives (Inkling2's
/// processor given a PIL image): RGB pixels, or RGBA ones for an image with transparency data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RgbaImage {
    Rgb(RgbImage),
    Rgba {
        width: u32,
        height: u32,
        pixels: Vec<u8>,
    },
}

/// Decodes `data` as [`decode`] does, but an image with transparency data (an alpha band or a
/// transparent colour or palette alpha) comes back as RGBA, as Pillow's `convert("RGBA")`
/// makes it ([`convert::to_rgba`]); the EXIF orientation applied when `apply_exif`; `threads`
/// as in [`DecodeOptions::threads`].
pub fn decode_keeping_alpha(
    data: &[u8],
    apply_exif: bool,
    max_pixels: Option<u64>,
    threads: usize,
) -> Result<RgbaImage, DecodeError> {
    let (format, decoded, orientation) = decode_mode(data, apply_exif, max_pixels, threads)?;
    let oom = |bytes| DecodeError::OutOfMemory { format, bytes };
    let (width, height) = (decoded.image.width, decoded.image.height);
    if !decoded.image.has_alpha() {
        let pixels = convert::to_rgb(decoded.image, convert::AlphaMode::Drop).map_err(oom)?;
        let image = RgbImage {
            width,
            height,
            pixels,
        };
        return Ok(RgbaImage::Rgb(
            exif::transpose(image, orientation).map_err(oom)?,
        ));
    }
    let rgba = convert::to_rgba(decoded.image).map_err(oom)?;
    let (pixels, w, h) =
        exif::transpose_pixels(rgba, width as usize, height as usize, 4, orientation)
            .map_err(oom)?;
    Ok(RgbaImage::Rgba {
        width: w as u32,
        height: h as u32,
        pixels,
    })
}

/// Checks the declared size against the limits before anything is allocated.
pub(crate) fn check_size(
    format: Format,
    width: u64,
    height: u64,
    limit: u64,
) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::ZeroSize {
            format,
            width,
            height,
        });
    }
    if u128::from(width) * u128::from(height) > u128::from(limit) {
        return Err(DecodeError::TooManyPixels {
            format,
            width,
            height,
            limit,
        });
    }
    Ok(())
}

/// The byte length of a `width × height × channels` image, if it fits in `usize`.
fn image_len(width: u32, height: u32, channels: usize) -> Option<usize> {
    (width as usize)
        .checked_mul(height as usize)
        .and_then(|n| n.checked_mul(channels))
}

fn out_of_memory(format: Format, width: u32, height: u32, channels: usize) -> DecodeError {
    DecodeError::OutOfMemory {
        format,
        bytes: u64::from(width) * u64::from(height) * channels as u64,
    }
}

/// `zeroed` for a `width × height × channels` image, with the product checked.
pub(crate) fn zeroed_image<T: Zeroable>(
    format: Format,
    width: u32,
    height: u32,
    channels: usize,
) -> Result<Vec<T>, DecodeError> {
    let len = image_len(width, height, channels)
        .ok_or_else(|| out_of_memory(format, width, height, channels))?;
    zeroed(len).map_err(|bytes| DecodeError::OutOfMemory { format, bytes })
}

/// A buffer for a `width × height × channels` image that the decoder will overwrite entirely
/// ([`crate::memory::overwritable_bytes`]: recycled when one fits). Only for decoders that write
/// every byte before success (libjpeg writes every output row; on an error the buffer is dropped
/// unread).
pub(crate) fn overwritten_image(
    format: Format,
    width: u32,
    height: u32,
    channels: usize,
) -> Result<Vec<u8>, DecodeError> {
    let len = image_len(width, height, channels)
        .ok_or_else(|| out_of_memory(format, width, height, channels))?;
    crate::memory::overwritable_bytes(len)
        .map_err(|bytes| DecodeError::OutOfMemory { format, bytes })
}

pub(crate) use crate::memory::{zeroed, Zeroable};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_every_format() {
        assert_eq!(sniff(b"\xff\xd8\xff\xe0"), Some(Format::Jpeg));
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n"), Some(Format::Png));
        assert_eq!(sniff(b"GIF89a"), Some(Format::Gif));
        assert_eq!(sniff(b"BM"), Some(Format::Bmp));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8L"), Some(Format::WebP));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(sniff(b""), None);
    }

    #[test]
    fn unknown_formats_are_named() {
        let err = decode(b"II*\x00\x08\x00\x00\x00", &DecodeOptions::default()).unwrap_err();
        assert_eq!(err.kind(), "unknown_format");
        assert!(err.to_string().contains("TIFF"), "{err}");
        let err = decode(b"", &DecodeOptions::default()).unwrap_err();
        assert!(err.to_string().contains("0 bytes"), "{err}");
        let err = decode(b"hello world!!!", &DecodeOptions::default()).unwrap_err();
        assert!(err.to_string().contains("68 65 6c"), "{err}");
    }

    #[test]
    fn size_checks() {
        assert_eq!(
            check_size(Format::Png, 0, 5, 10).unwrap_err().kind(),
            "zero_size"
        );
        assert_eq!(
            check_size(Format::Png, 4, 3, 11).unwrap_err().kind(),
            "too_many_pixels"
        );
        assert!(check_size(Format::Png, 4, 3, 12).is_ok());
        assert!(check_size(
            Format::Png,
            u64::from(u32::MAX),
            u64::from(u32::MAX),
            u64::MAX
        )
        .is_ok());
    }

    #[test]
    fn kinds_match_variants() {
        let format = Format::Gif;
        let all = [
            DecodeError::UnknownFormat {
                head: vec![],
                recognised: None,
            },
            DecodeError::unsupported(format, "x"),
            DecodeError::truncated(format, "x"),
            DecodeError::corrupt(format, "x"),
            DecodeError::ZeroSize {
                format,
                width: 0,
                height: 1,
            },
            DecodeError::TooManyPixels {
                format,
                width: 1,
                height: 1,
                limit: 0,
            },
            DecodeError::OutOfMemory { format, bytes: 1 },
        ];
        let kinds: Vec<_> = all.iter().map(DecodeError::kind).collect();
        assert_eq!(kinds, DecodeError::KINDS);
    }

    #[test]
    fn zeroed_allocates_or_fails_cleanly() {
        let v: Vec<u16> = zeroed(1000).unwrap();
        assert!(v.iter().all(|&x| x == 0));
        assert!(std::hint::black_box(zeroed::<u8>(std::hint::black_box(usize::MAX / 2))).is_err());
    }
}
