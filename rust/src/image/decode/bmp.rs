//! BMP, read the way Pillow 13's `BmpImagePlugin` reads it.
//!
//! A file without the 14-byte file header (a bare DIB, starting with its info header size) is
//! read like Pillow's `DibImageFile`. Headers: OS/2 (12 bytes) and Windows (40, 52, 56, 64, 108,
//! 124 bytes); bottom-up or top-down rows. Depths: 1, 4, 8 (palette; a palette equal to
//! black/white, or to the gray ramp 0…n−1, opens as `1` (at most 2 entries) / `L` like Pillow,
//! and is unpacked as Pillow does, 1 bit or 1 byte per pixel whatever the depth), 16 (5-5-5, or
//! 5-6-5 with BITFIELDS), 24, 32 (the fourth byte is ignored unless BITFIELDS declares an alpha
//! mask: then `RGBA`); the BITFIELDS layouts Pillow knows; RLE8 and RLE4 (on any palette depth,
//! as Pillow does not check) with Pillow's decoder (data that ends before the last pixel is an
//! error, as in Pillow). The palette holds what the file has of the declared entries (more than
//! 256 read is an error, as in Pillow's `putpalette`); a zero pixel data offset means "after
//! the palette". Not supported (Pillow fails too): other depths and bitfield layouts,
//! JPEG/PNG-compressed BMPs.

use super::convert::{ModeImage, Palette, Pixels};
use super::{check_size, zeroed_image, DecodeError, Decoded, Format};

const FORMAT: Format = Format::Bmp;

fn le16(d: &[u8], at: usize) -> u32 {
    u32::from(u16::from_le_bytes([d[at], d[at + 1]]))
}

fn le32(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
}

/// How the pixel bytes unpack (Pillow raw modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Raw {
    /// Palette indices of 1, 4 or 8 bits.
    Index(u8),
    Bgr15,
    Bgr16,
    /// 24/32-bit: byte offsets of R, G, B (and A) within each pixel.
    Bytes {
        size: usize,
        rgb: [usize; 3],
        alpha: Option<usize>,
    },
}

/// Decodes a BMP file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    if !data.starts_with(b"BM") {
        // A bare DIB (no file header), which Pillow opens as "DIB": its `_bitmap()` with the
        // info header at 0 and no pixel data offset.
        return decode_bitmap(data, limit, 0, 0);
    }
    if data.len() < 18 {
        return Err(DecodeError::truncated(
            FORMAT,
            "the file header is incomplete",
        ));
    }
    decode_bitmap(data, limit, 14, le32(data, 10) as usize)
}

/// True when Pillow's DIB plugin accepts `data` (`_dib_accept`: an info header size first).
pub(crate) fn is_dib(data: &[u8]) -> bool {
    data.len() >= 4 && matches!(le32(data, 0), 12 | 40 | 52 | 56 | 64 | 108 | 124)
}

/// Pillow's `BmpImageFile._bitmap`: the info header at `base`, the pixel data at `offset` (0:
/// where reading the header and palette stopped).
fn decode_bitmap(
    data: &[u8],
    limit: u64,
    base: usize,
    mut offset: usize,
) -> Result<Decoded, DecodeError> {
    let truncated = |what: &str| DecodeError::truncated(FORMAT, what.to_owned());
    if data.len() < base + 4 {
        return Err(truncated("the info header is incomplete"));
    }
    let header_size = le32(data, base) as usize;
    let header = data
        .get(base + 4..base + header_size.max(4))
        .ok_or_else(|| truncated("the info header is incomplete"))?;
    let (width, height, bits, compression, colors, top_down, palette_padding);
    let mut masks: Option<[u32; 4]> = None;
    let mut after_header = base + header_size;
    match header_size {
        12 => {
            width = le16(header, 0);
            height = le16(header, 2);
            bits = le16(header, 6);
            compression = 0;
            colors = 0;
            top_down = false;
            palette_padding = 3;
        }
        40 | 52 | 56 | 64 | 108 | 124 => {
            top_down = header[7] == 0xFF;
            width = le32(header, 0);
            let raw_height = le32(header, 4);
            height = if top_down {
                raw_height.wrapping_neg()
            } else {
                raw_height
            };
            bits = le16(header, 10);
            compression = le32(header, 12);
            colors = le32(header, 28);
            palette_padding = 4;
            if compression == 3 {
                masks = Some(if header.len() >= 48 {
                    let a = if header.len() >= 52 {
                        le32(header, 48)
                    } else {
                        0
                    };
                    [le32(header, 36), le32(header, 40), le32(header, 44), a]
                } else {
                    let m = data
                        .get(after_header..after_header + 12)
                        .ok_or_else(|| truncated("the bitfield masks are incomplete"))?;
                    after_header += 12;
                    [le32(m, 0), le32(m, 4), le32(m, 8), 0]
                });
            }
        }
        n => return Err(DecodeError::unsupported(FORMAT, format!("header size {n}"))),
    }
    let colors = if colors == 0 {
        1u64 << bits.min(32)
    } else {
        u64::from(colors)
    };
    if offset == 14 + header_size && bits <= 8 {
        offset += palette_padding * colors as usize;
    }
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;

    let mut raw = match bits {
        1 | 4 | 8 => Raw::Index(bits as u8),
        16 => Raw::Bgr15,
        24 => Raw::Bytes {
            size: 3,
            rgb: [2, 1, 0],
            alpha: None,
        },
        32 => Raw::Bytes {
            size: 4,
            rgb: [2, 1, 0],
            alpha: None,
        },
        n => return Err(DecodeError::unsupported(FORMAT, format!("pixel depth {n}"))),
    };
    let mut rle = false;
    match compression {
        0 => {}
        1 | 2 => {
            rle = true;
            // Pillow does not match RLE8/RLE4 to the depth: the decoder's bytes are indices.
            if bits > 8 {
                return Err(DecodeError::unsupported(
                    FORMAT,
                    format!("RLE compression with {bits}-bit pixels"),
                ));
            }
        }
        3 => {
            let m = masks.unwrap_or_default();
            let layout = |rgb, alpha| Raw::Bytes {
                size: 4,
                rgb,
                alpha,
            };
            raw = match (bits, m) {
                (32, [0xFF0000, 0xFF00, 0xFF, 0]) => layout([2, 1, 0], None), // BGRX
                (32, [0xFF00_0000, 0xFF_0000, 0xFF00, 0]) => layout([3, 2, 1], None), // XBGR
                (32, [0xFF00_0000, 0xFF00, 0xFF, 0]) => layout([3, 1, 0], None), // BGXR
                (32, [0xFF00_0000, 0xFF_0000, 0xFF00, 0xFF]) => layout([3, 2, 1], Some(0)), // ABGR
                (32, [0xFF, 0xFF00, 0xFF_0000, 0xFF00_0000]) => layout([0, 1, 2], Some(3)), // RGBA
                (32, [0xFF_0000, 0xFF00, 0xFF, 0xFF00_0000]) => layout([2, 1, 0], Some(3)), // BGRA
                (32, [0xFF00_0000, 0xFF00, 0xFF, 0xFF_0000]) => layout([3, 1, 0], Some(2)), // BGAR
                (32, [0, 0, 0, 0]) => layout([2, 1, 0], Some(3)),             // BGRA
                (24, [0xFF_0000, 0xFF00, 0xFF, _]) => Raw::Bytes {
                    size: 3,
                    rgb: [2, 1, 0],
                    alpha: None,
                },
                (16, [0xF800, 0x7E0, 0x1F, _]) => Raw::Bgr16,
                (16, [0x7C00, 0x3E0, 0x1F, _]) => Raw::Bgr15,
                _ => {
                    return Err(DecodeError::unsupported(
                        FORMAT,
                        format!("bitfields layout {m:x?} at {bits} bits"),
                    ))
                }
            };
        }
        n => return Err(DecodeError::unsupported(FORMAT, format!("compression {n}"))),
    }

    // Palette (and Pillow's gray detection).
    let mut gray = false;
    let mut palette = Palette::default();
    let mut palette_read = 0;
    if let Raw::Index(_) = raw {
        if !(1..=65536).contains(&colors) {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("palette size {colors}"),
            ));
        }
        let start = after_header.min(data.len());
        let end = (after_header + palette_padding * colors as usize).min(data.len());
        let table = &data[start..end];
        let entry = |i: usize| table.get(i * palette_padding..i * palette_padding + 3);
        gray = if colors == 2 {
            entry(0) == Some(&[0, 0, 0][..]) && entry(1) == Some(&[255, 255, 255][..])
        } else {
            (0..colors as usize)
                .all(|i| entry(i).is_some_and(|e| e.iter().all(|&c| usize::from(c) == i)))
        };
        // Pillow: mode "1" for a gray palette of at most 2 entries, else "L", unpacked with that
        // mode as the raw mode: other depths are misread (1 bit or 1 byte per pixel from rows
        // of the file's stride), which is reproduced below for uncompressed data.
        // RLE data is set with raw mode "L" whatever the mode: into mode "1" Pillow 13 unpacks
        // it one byte per pixel, any non-zero index being white, which is what `Bilevel` holds
        // (the decoded indices, read as 0 or non-zero).
        // `putpalette` takes at most 256 entries of what was read (the file may hold fewer
        // than the header declares).
        if !gray && table.len() / palette_padding > 256 {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("palette size {colors} (max 256)"),
            ));
        }
        if !gray {
            palette = Palette::from_packed(table, palette_padding, [2, 1, 0]);
        }
        palette_read = table.len();
    }

    let (w, h) = (width as usize, height as usize);
    let channels = match raw {
        Raw::Index(_) => 1,
        Raw::Bytes { alpha: Some(_), .. } => 4,
        _ => 3,
    };
    let mut out: Vec<u8> = zeroed_image(FORMAT, width, height, channels)?;
    // A zero offset means "where the header (and palette) reading stopped" in Pillow.
    let start = if offset == 0 {
        after_header + palette_read
    } else {
        offset
    };
    let pixel_data = data.get(start..).unwrap_or_default();
    if rle {
        rle_decode(pixel_data, start, compression == 2, w, h, &mut out)?;
        if !top_down {
            flip_rows(&mut out, w);
        }
    } else {
        let bits_pp = match raw {
            Raw::Index(b) => usize::from(b),
            Raw::Bgr15 | Raw::Bgr16 => 16,
            Raw::Bytes { size, .. } => size * 8,
        };
        let stride = ((w * bits_pp + 31) >> 3) & !3;
        // A gray palette unpacks with Pillow's raw mode "1" or "L" whatever the depth.
        let unpack = match raw {
            Raw::Index(_) if gray => Raw::Index(if colors <= 2 { 1 } else { 8 }),
            other => other,
        };
        let unpack_bits = match unpack {
            Raw::Index(b) => usize::from(b),
            _ => bits_pp,
        };
        let row_bytes = (w * unpack_bits).div_ceil(8);
        if row_bytes > stride {
            // RawDecode: a negative padding is a configuration error.
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("gray palette of {colors} entries on {bits}-bit pixels"),
            ));
        }
        let needed = stride * (h - 1) + row_bytes;
        if pixel_data.len() < needed {
            return Err(DecodeError::truncated(
                FORMAT,
                format!("{} bytes of pixel data, {needed} needed", pixel_data.len()),
            ));
        }
        for y in 0..h {
            let src = &pixel_data[y * stride..y * stride + row_bytes];
            let dst_row = if top_down { y } else { h - 1 - y };
            let dst = &mut out[dst_row * w * channels..(dst_row + 1) * w * channels];
            unpack_row(unpack, src, dst);
        }
    }
    let pixels = match raw {
        Raw::Index(_) if gray && colors <= 2 => Pixels::Bilevel(out),
        Raw::Index(_) if gray => Pixels::L(out),
        Raw::Index(_) => Pixels::P {
            indices: out,
            palette: Box::new(palette),
        },
        Raw::Bytes { alpha: Some(_), .. } => Pixels::Rgba(out),
        _ => Pixels::Rgb(out),
    };
    Ok(Decoded {
        image: ModeImage {
            width,
            height,
            pixels,
            transparency: None,
        },
        exif: None,
        xmp: None,
        exif_error: None,
    })
}

fn unpack_row(raw: Raw, src: &[u8], dst: &mut [u8]) {
    match raw {
        Raw::Index(8) => dst.copy_from_slice(&src[..dst.len()]),
        Raw::Index(b) => {
            let per_byte = 8 / usize::from(b);
            let mask = (1u8 << b) - 1;
            for (i, d) in dst.iter_mut().enumerate() {
                let shift = 8 - usize::from(b) * (i % per_byte + 1);
                *d = (src[i / per_byte] >> shift) & mask;
            }
        }
        Raw::Bgr15 | Raw::Bgr16 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                let p = u32::from(s[0]) | (u32::from(s[1]) << 8);
                let (r, g) = if raw == Raw::Bgr16 {
                    ((p >> 11) & 31, ((p >> 5) & 63) * 255 / 63)
                } else {
                    ((p >> 10) & 31, ((p >> 5) & 31) * 255 / 31)
                };
                d.copy_from_slice(&[(r * 255 / 31) as u8, g as u8, ((p & 31) * 255 / 31) as u8]);
            }
        }
        Raw::Bytes { size, rgb, alpha } => {
            let channels = if alpha.is_some() { 4 } else { 3 };
            for (d, s) in dst.chunks_exact_mut(channels).zip(src.chunks_exact(size)) {
                d[0] = s[rgb[0]];
                d[1] = s[rgb[1]];
                d[2] = s[rgb[2]];
                if let Some(a) = alpha {
                    d[3] = s[a];
                }
            }
        }
    }
}

fn flip_rows(buf: &mut [u8], w: usize) {
    let h = buf.len() / w.max(1);
    for y in 0..h / 2 {
        let (top, bottom) = buf.split_at_mut((h - 1 - y) * w);
        top[y * w..(y + 1) * w].swap_with_slice(&mut bottom[..w]);
    }
}

/// Pillow's `BmpRleDecoder`: fills `out` (w × h indices, in file row order) or fails with
/// "not enough image data" when the codes end early.
fn rle_decode(
    data: &[u8],
    base: usize,
    rle4: bool,
    w: usize,
    h: usize,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let dest = w * h;
    let mut len = 0usize; // pixels written (Pillow's len(data))
    let mut x = 0usize;
    let mut pos = 0usize;
    let push = |out: &mut [u8], len: &mut usize, v: u8| {
        if *len < dest {
            out[*len] = v;
        }
        *len += 1;
    };
    while len < dest {
        let (Some(&count), Some(&byte)) = (data.get(pos), data.get(pos + 1)) else {
            break;
        };
        pos += 2;
        if count != 0 {
            let mut n = usize::from(count);
            if x + n > w {
                n = w.saturating_sub(x);
            }
            for i in 0..n {
                let v = if rle4 {
                    if i % 2 == 0 {
                        byte >> 4
                    } else {
                        byte & 0x0F
                    }
                } else {
                    byte
                };
                push(out, &mut len, v);
            }
            x += n;
        } else {
            match byte {
                0 => {
                    while !len.is_multiple_of(w) {
                        push(out, &mut len, 0);
                    }
                    x = 0;
                }
                1 => break,
                2 => {
                    let Some(delta) = data.get(pos..pos + 2) else {
                        break;
                    };
                    pos += 2;
                    let skip = (usize::from(delta[0]) + usize::from(delta[1]) * w)
                        .min(dest.saturating_sub(len));
                    len += skip;
                    x = len % w;
                }
                n => {
                    let count = usize::from(n).min(dest.saturating_sub(len));
                    let byte_count = if rle4 { count.div_ceil(2) } else { count };
                    let chunk = &data[pos.min(data.len())..(pos + byte_count).min(data.len())];
                    pos += chunk.len();
                    for (i, &b) in chunk.iter().enumerate() {
                        if rle4 {
                            push(out, &mut len, b >> 4);
                            if i * 2 + 1 < count {
                                push(out, &mut len, b & 0x0F);
                            }
                        } else {
                            push(out, &mut len, b);
                        }
                    }
                    if chunk.len() < byte_count || len == dest {
                        break;
                    }
                    x += usize::from(n);
                    // Pillow aligns the file position, not the offset into the pixel data.
                    if !(base + pos).is_multiple_of(2) {
                        pos += 1;
                    }
                }
            }
        }
    }
    if len < dest {
        return Err(DecodeError::truncated(
            FORMAT,
            format!("RLE data ends after {len} of {dest} pixels"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bmp24(w: u32, h: i32, pixels: &[u8]) -> Vec<u8> {
        let mut d = b"BM".to_vec();
        d.extend(0u32.to_le_bytes());
        d.extend(0u32.to_le_bytes());
        d.extend(54u32.to_le_bytes());
        d.extend(40u32.to_le_bytes());
        d.extend(w.to_le_bytes());
        d.extend(h.to_le_bytes());
        d.extend(1u16.to_le_bytes());
        d.extend(24u16.to_le_bytes());
        d.extend([0u8; 24]);
        d.extend(pixels);
        d
    }

    #[test]
    fn bottom_up_and_top_down() {
        // 1×2, rows padded to 4 bytes; file order: first row in file is the bottom one.
        let px = [1, 2, 3, 0, 4, 5, 6, 0];
        let up = decode(&bmp24(1, 2, &px), u64::MAX).unwrap();
        assert_eq!(up.image.pixels, Pixels::Rgb(vec![6, 5, 4, 3, 2, 1]));
        let down = decode(&bmp24(1, -2, &px), u64::MAX).unwrap();
        assert_eq!(down.image.pixels, Pixels::Rgb(vec![3, 2, 1, 6, 5, 4]));
        assert_eq!(
            decode(&bmp24(1, 2, &px[..6]), u64::MAX).unwrap_err().kind(),
            "truncated"
        );
        assert_eq!(
            decode(&bmp24(0, 2, &px), u64::MAX).unwrap_err().kind(),
            "zero_size"
        );
    }

    #[test]
    fn rle8() {
        let mut out = [9u8; 6];
        // 3×2: run of 3 × 7, end of line, absolute run of 3 (1, 2, 3) + pad, end of bitmap.
        rle_decode(
            &[3, 7, 0, 0, 0, 3, 1, 2, 3, 0, 0, 1],
            0,
            false,
            3,
            2,
            &mut out,
        )
        .unwrap();
        assert_eq!(out, [7, 7, 7, 1, 2, 3]);
        // Delta (0, 2, dx, dy) skips pixels, leaving zeros.
        let mut out = [9u8; 6];
        rle_decode(&[1, 5, 0, 2, 1, 1, 1, 6], 0, false, 3, 2, &mut out).unwrap();
        assert_eq!(out, [5, 9, 9, 9, 9, 6]);
        assert!(rle_decode(&[2, 7, 0, 1], 0, false, 3, 2, &mut out).is_err());
    }

    #[test]
    fn flips() {
        let mut b = [1, 2, 3, 4, 5, 6];
        flip_rows(&mut b, 2);
        assert_eq!(b, [5, 6, 3, 4, 1, 2]);
    }
}
