//! PNG: pixels from the pure-Rust `png` crate (raw samples, de-interlaced), everything Pillow
//! derives from the chunks read here, the way `PngImagePlugin` does.
//!
//! Modes (Pillow's `_MODES`): 1-bit gray → `1`; 2- and 4-bit gray → `L` scaled by 85 and 17;
//! 16-bit gray → `I;16`; 16-bit RGB, RGBA and gray+alpha keep the **most significant byte**
//! (`RGB;16B`, `RGBA;16B`, `LA;16B`); palettes of 1–8 bits → `P` (entries past `PLTE` black).
//! `tRNS`: for `P` per-index alphas, for `1`/`L`/`I;16`/`RGB` the 16-bit colour key (compared by
//! the conversion after its `& 0xff`, as Pillow does), ignored for images with alpha; the last
//! one wins, even after `IDAT` (Pillow reads the chunks after the image data when loading).
//! EXIF: the `eXIf` chunk, a `tEXt` keyed `exif`, or a `Raw profile type exif` text chunk; XMP:
//! the `XML:com.adobe.xmp` text chunk. Chunks before the first `IDAT` must have valid CRCs
//! (Pillow checks them), the image data's are not checked (nor are they by Pillow).

use std::io::Cursor;

use super::convert::{ModeImage, Palette, Pixels, Transparency};
use super::{check_size, zeroed, DecodeError, Decoded, Format};

const FORMAT: Format = Format::Png;

/// Pillow's limit on decompressed text chunks (`MAX_TEXT_CHUNK`); larger ones are ignored here.
const MAX_TEXT_CHUNK: usize = 1 << 20;

/// Everything read from the chunks, in file order (later chunks override earlier ones).
#[derive(Default)]
struct Chunks {
    palette: Option<Vec<u8>>,
    trns: Option<Vec<u8>>,
    exif: Option<Vec<u8>>,
    raw_profile_exif: Option<Vec<u8>>,
    xmp: Option<Vec<u8>>,
}

fn read_chunks(data: &[u8]) -> Result<Chunks, DecodeError> {
    let mut chunks = Chunks::default();
    let mut pos = 8;
    let mut seen_idat = false;
    while pos + 8 <= data.len() {
        let len =
            u32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]) as usize;
        let cid = &data[pos + 4..pos + 8];
        if !cid.iter().all(u8::is_ascii_alphabetic) {
            if seen_idat {
                break; // Pillow's load_end stops at a broken chunk after the image data
            }
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("broken PNG file (chunk {})", show(cid)),
            ));
        }
        let body_start = pos + 8;
        let Some(body_end) = body_start.checked_add(len).filter(|&e| e <= data.len()) else {
            if seen_idat || cid == b"IDAT" {
                break; // the pixel decoder reports a truncated IDAT; later chunks are optional
            }
            return Err(DecodeError::truncated(
                FORMAT,
                format!("chunk {} is cut short", show(cid)),
            ));
        };
        let body = &data[body_start..body_end];
        if cid == b"IDAT" {
            seen_idat = true;
        } else if !seen_idat {
            let Some(stored) = data.get(body_end..body_end + 4) else {
                return Err(DecodeError::truncated(
                    FORMAT,
                    format!("incomplete checksum in {}", show(cid)),
                ));
            };
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(cid);
            hasher.update(body);
            if hasher.finalize().to_be_bytes() != stored {
                return Err(DecodeError::corrupt(
                    FORMAT,
                    format!("bad header checksum in {}", show(cid)),
                ));
            }
        }
        match cid {
            b"IEND" => break,
            b"PLTE" if !seen_idat => chunks.palette = Some(body.to_vec()),
            b"tRNS" => chunks.trns = Some(body.to_vec()),
            b"eXIf" => {
                let mut exif = b"Exif\x00\x00".to_vec();
                exif.extend_from_slice(body);
                chunks.exif = Some(exif);
            }
            b"tEXt" | b"zTXt" | b"iTXt" => text_chunk(cid, body, &mut chunks),
            _ => {}
        }
        pos = body_end + 4;
    }
    Ok(chunks)
}

fn show(cid: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(cid))
}

/// The text chunks Pillow's `getexif` looks at.
fn text_chunk(cid: &[u8], body: &[u8], chunks: &mut Chunks) {
    let (key, rest) = match body.iter().position(|&b| b == 0) {
        Some(i) => (&body[..i], &body[i + 1..]),
        None => (body, &[][..]),
    };
    let value = match cid {
        b"tEXt" => rest.to_vec(),
        b"zTXt" => {
            if rest.first().is_some_and(|&m| m != 0) {
                return;
            }
            inflate(rest.get(1..).unwrap_or_default()).unwrap_or_default()
        }
        _ => {
            // iTXt: flag, method, language\0, translated keyword\0, text.
            if rest.len() < 2 {
                return;
            }
            let (flag, method, rest) = (rest[0], rest[1], &rest[2..]);
            let mut parts = rest.splitn(3, |&b| b == 0);
            let (Some(_), Some(_), Some(text)) = (parts.next(), parts.next(), parts.next()) else {
                return;
            };
            if flag != 0 {
                if method != 0 {
                    return;
                }
                match inflate(text) {
                    Some(v) => v,
                    None => return,
                }
            } else {
                text.to_vec()
            }
        }
    };
    match key {
        b"XML:com.adobe.xmp" => chunks.xmp = Some(value),
        b"Raw profile type exif" => chunks.raw_profile_exif = Some(value),
        b"exif" if cid == b"tEXt" => chunks.exif = Some(value),
        _ => {}
    }
}

fn inflate(data: &[u8]) -> Option<Vec<u8>> {
    miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(data, MAX_TEXT_CHUNK).ok()
}

/// `bytes.fromhex("".join(value.split("\n")[3:]))` of a `Raw profile type exif` chunk.
fn raw_profile(value: &[u8]) -> Option<Vec<u8>> {
    let mut lines = value.split(|&b| b == b'\n');
    for _ in 0..3 {
        lines.next()?;
    }
    let hex: Vec<u8> = lines
        .flatten()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    hex.chunks_exact(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// Decodes a PNG file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    let Some(ihdr) = data.get(8..29).filter(|h| &h[4..8] == b"IHDR") else {
        return Err(if data.len() < 29 {
            DecodeError::truncated(
                FORMAT,
                format!("{} bytes, the IHDR chunk is incomplete", data.len()),
            )
        } else {
            DecodeError::corrupt(FORMAT, "the first chunk is not IHDR")
        });
    };
    let width = u32::from_be_bytes([ihdr[8], ihdr[9], ihdr[10], ihdr[11]]);
    let height = u32::from_be_bytes([ihdr[12], ihdr[13], ihdr[14], ihdr[15]]);
    let (bits, color) = (ihdr[16], ihdr[17]);
    if !matches!(
        (bits, color),
        (1 | 2 | 4 | 8 | 16, 0) | (8 | 16, 2) | (1 | 2 | 4 | 8, 3) | (8 | 16, 4) | (8 | 16, 6)
    ) {
        return Err(DecodeError::unsupported(
            FORMAT,
            format!("bit depth {bits} with colour type {color}"),
        ));
    }
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    let chunks = read_chunks(data)?;

    let mut decoder = png::Decoder::new(Cursor::new(data));
    decoder.set_transformations(png::Transformations::IDENTITY);
    decoder.set_ignore_text_chunk(true);
    decoder.set_ignore_iccp_chunk(true);
    decoder.ignore_checksums(true);
    let mut reader = decoder.read_info().map_err(png_error)?;
    let len = reader
        .output_buffer_size()
        .ok_or_else(|| DecodeError::OutOfMemory {
            format: FORMAT,
            bytes: u64::from(width) * u64::from(height) * 8,
        })?;
    let mut raw: Vec<u8> = zeroed(len).map_err(|bytes| DecodeError::OutOfMemory {
        format: FORMAT,
        bytes,
    })?;
    let frame = reader.next_frame(&mut raw).map_err(png_error)?;
    if (frame.width, frame.height) != (width, height) {
        return Err(DecodeError::corrupt(
            FORMAT,
            format!(
                "first frame is {}x{}, the image {width}x{height}",
                frame.width, frame.height
            ),
        ));
    }
    let line = frame.line_size;
    let image = to_mode_image(&raw, line, width, height, bits, color, &chunks)?;
    let exif = chunks
        .exif
        .or_else(|| chunks.raw_profile_exif.as_deref().and_then(raw_profile));
    Ok(Decoded {
        image,
        exif,
        xmp: chunks.xmp,
    })
}

fn png_error(err: png::DecodingError) -> DecodeError {
    match err {
        png::DecodingError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            DecodeError::truncated(FORMAT, "the image data ends early")
        }
        png::DecodingError::LimitsExceeded => {
            DecodeError::corrupt(FORMAT, "decoder memory limit exceeded")
        }
        other => DecodeError::corrupt(FORMAT, other.to_string()),
    }
}

fn to_mode_image(
    raw: &[u8],
    line: usize,
    width: u32,
    height: u32,
    bits: u8,
    color: u8,
    chunks: &Chunks,
) -> Result<ModeImage, DecodeError> {
    let (w, h) = (width as usize, height as usize);
    let n = w * h;
    let alloc = |len: usize| {
        zeroed::<u8>(len).map_err(|bytes| DecodeError::OutOfMemory {
            format: FORMAT,
            bytes,
        })
    };
    let rows = || raw.chunks_exact(line).take(h);
    let trns = chunks.trns.as_deref();
    let key = |len: usize| -> Result<Option<&[u8]>, DecodeError> {
        match trns {
            Some(t) if t.len() < len => Err(DecodeError::corrupt(FORMAT, "Truncated tRNS chunk")),
            Some(t) => Ok(Some(t)),
            None => Ok(None),
        }
    };
    let be = |b: &[u8], i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let (pixels, transparency) = match (color, bits) {
        (0, 16) => {
            let mut v = zeroed::<u16>(n).map_err(|bytes| DecodeError::OutOfMemory {
                format: FORMAT,
                bytes,
            })?;
            for (dst, row) in v.chunks_exact_mut(w).zip(rows()) {
                for (d, s) in dst.iter_mut().zip(row.chunks_exact(2)) {
                    *d = u16::from_be_bytes([s[0], s[1]]);
                }
            }
            (
                Pixels::I16(v),
                key(2)?.map(|t| Transparency::Gray(be(t, 0))),
            )
        }
        (0, _) | (3, _) => {
            let mut v = alloc(n)?;
            for (dst, row) in v.chunks_exact_mut(w).zip(rows()) {
                unpack_bits(row, bits, dst);
            }
            if color == 3 {
                let palette = Palette::from_packed(
                    chunks.palette.as_deref().unwrap_or_default(),
                    3,
                    [0, 1, 2],
                );
                let transparency = match trns {
                    Some(t) if t.len() > 256 => {
                        return Err(DecodeError::corrupt(
                            FORMAT,
                            format!("tRNS has {} entries (max 256)", t.len()),
                        ))
                    }
                    Some(t) => Some(simple_palette_index(t).map_or_else(
                        || Transparency::PaletteAlphas(t.to_vec()),
                        Transparency::PaletteIndex,
                    )),
                    None => None,
                };
                (
                    Pixels::P {
                        indices: v,
                        palette: Box::new(palette),
                    },
                    transparency,
                )
            } else {
                let scale = match bits {
                    1 => 255,
                    2 => 0x55,
                    4 => 0x11,
                    _ => 1,
                };
                if scale != 1 {
                    for x in &mut v {
                        *x = x.wrapping_mul(scale);
                    }
                }
                let t = key(2)?.map(|t| be(t, 0));
                if bits == 1 {
                    (
                        Pixels::Bilevel(v),
                        t.map(|t| Transparency::Gray(if t != 0 { 255 } else { 0 })),
                    )
                } else {
                    (Pixels::L(v), t.map(Transparency::Gray))
                }
            }
        }
        (2, _) => {
            let step = usize::from(bits / 8) * 3;
            let mut v = alloc(n * 3)?;
            for (dst, row) in v.chunks_exact_mut(w * 3).zip(rows()) {
                if bits == 8 {
                    dst.copy_from_slice(&row[..w * 3]);
                } else {
                    for (d, s) in dst.chunks_exact_mut(3).zip(row.chunks_exact(step)) {
                        d.copy_from_slice(&[s[0], s[2], s[4]]);
                    }
                }
            }
            let t = key(6)?.map(|t| Transparency::Rgb(be(t, 0), be(t, 2), be(t, 4)));
            (Pixels::Rgb(v), t)
        }
        (4, _) => {
            let step = usize::from(bits / 8) * 2;
            let mut v = alloc(n * 2)?;
            for (dst, row) in v.chunks_exact_mut(w * 2).zip(rows()) {
                for (d, s) in dst.chunks_exact_mut(2).zip(row.chunks_exact(step)) {
                    d.copy_from_slice(&[s[0], s[step / 2]]);
                }
            }
            (Pixels::La(v), None)
        }
        _ => {
            let step = usize::from(bits / 8) * 4;
            let mut v = alloc(n * 4)?;
            for (dst, row) in v.chunks_exact_mut(w * 4).zip(rows()) {
                if bits == 8 {
                    dst.copy_from_slice(&row[..w * 4]);
                } else {
                    for (d, s) in dst.chunks_exact_mut(4).zip(row.chunks_exact(step)) {
                        d.copy_from_slice(&[s[0], s[2], s[4], s[6]]);
                    }
                }
            }
            (Pixels::Rgba(v), None)
        }
    };
    Ok(ModeImage {
        width,
        height,
        pixels,
        transparency,
    })
}

/// Pillow's `_simple_palette` (`^\xff*\x00\xff*$`): exactly one fully transparent entry.
fn simple_palette_index(t: &[u8]) -> Option<u8> {
    let zero = t.iter().position(|&b| b == 0)?;
    let simple = t.iter().enumerate().all(|(i, &b)| b == 0xFF || i == zero);
    (simple && zero < 256).then_some(zero as u8)
}

/// Unpacks `dst.len()` samples of `bits` bits (MSB first) from `row`.
fn unpack_bits(row: &[u8], bits: u8, dst: &mut [u8]) {
    match bits {
        8 => dst.copy_from_slice(&row[..dst.len()]),
        _ => {
            let per_byte = 8 / usize::from(bits);
            let mask = (1u8 << bits) - 1;
            for (i, d) in dst.iter_mut().enumerate() {
                let byte = row[i / per_byte];
                let shift = 8 - bits as usize * (i % per_byte + 1);
                *d = (byte >> shift) & mask;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_sub_byte_samples() {
        let mut d = [0u8; 5];
        unpack_bits(&[0b1011_0001, 0b1000_0000], 1, &mut d);
        assert_eq!(d, [1, 0, 1, 1, 0]);
        let mut d = [0u8; 3];
        unpack_bits(&[0b1110_0100], 2, &mut d);
        assert_eq!(d, [3, 2, 1]);
        let mut d = [0u8; 3];
        unpack_bits(&[0xAB, 0xC0], 4, &mut d);
        assert_eq!(d, [0xA, 0xB, 0xC]);
    }

    #[test]
    fn simple_palette() {
        assert_eq!(simple_palette_index(b"\xff\xff\x00\xff"), Some(2));
        assert_eq!(simple_palette_index(b"\x00"), Some(0));
        assert_eq!(simple_palette_index(b"\xff\x80\x00"), None);
        assert_eq!(simple_palette_index(b"\x00\x00"), None);
        assert_eq!(simple_palette_index(b""), None);
    }

    #[test]
    fn raw_profile_hex() {
        assert_eq!(
            raw_profile(b"\nexif\n       4\n45786966\n0000\n"),
            Some(b"Exif\x00\x00".to_vec())
        );
        assert_eq!(raw_profile(b"\nexif\n"), Some(vec![]));
        assert_eq!(raw_profile(b"\nexif"), None);
        assert_eq!(raw_profile(b"\n\n\nzz"), None);
    }

    #[test]
    fn bad_headers() {
        let opts = u64::MAX;
        assert_eq!(
            decode(b"\x89PNG\r\n\x1a\n", opts).unwrap_err().kind(),
            "truncated"
        );
        let mut d = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
        d.extend([0, 0, 0, 0, 0, 0, 0, 1, 8, 0, 0, 0, 0]);
        assert_eq!(decode(&d, opts).unwrap_err().kind(), "zero_size");
        d[16 + 3] = 1;
        d[24] = 3; // bit depth 3
        assert_eq!(decode(&d, opts).unwrap_err().kind(), "unsupported");
    }
}
