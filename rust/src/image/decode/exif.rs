//! EXIF orientation, read like Pillow's `Image.getexif()` and applied like
//! `ImageOps.exif_transpose`.
//!
//! Pillow strips one or two leading `Exif\0\0`, reads the 8-byte TIFF header (`II*\0`, `MM\0*`,
//! and the odd `MM*\0` / `II\0*` it also accepts), seeks to the first IFD and keeps the first entry
//! of each tag. Each 12-byte entry is read whole: one cut short by the end of the block ends the
//! directory, even when the bytes its value needs are there. Tag 274 (Orientation) counts when
//! it holds a single number equal to 2…8: any integer type but BYTE and UNDEFINED (Pillow
//! returns those as `bytes`), and also FLOAT, DOUBLE, RATIONAL and SRATIONAL holding an integral
//! value, because Pillow looks the value up in a dict keyed by int. Entries whose out-of-line
//! data would run past the EXIF block, or whose summed out-of-line sizes exceed the block's
//! length, are handled as Pillow does (a short read ends the directory, an over-budget entry is
//! skipped). When there is no Orientation tag, the XMP packet is searched for
//! `tiff:Orientation="N"` / `>N`.
//!
//! An EXIF block Pillow's TIFF reader refuses (a header not among its prefixes, fewer than 8
//! bytes, or the little-endian BigTIFF mark `II+\0`, whose 8-byte offset Pillow reads past its
//! 8-byte header) makes `getexif()` raise: for PNG and WebP `exif_transpose` then raises, and so
//! do we (`ExifError::Raises`). A JPEG's EXIF is first read while opening, where the error is
//! swallowed and the empty result cached (orientation 1, the XMP unread) — unless a JFIF segment
//! gave the dots per inch, in which case that early read is skipped and `exif_transpose`
//! raises. (`MM\0+`, big-endian BigTIFF, is read by Pillow as plain big-endian TIFF.)

use super::{DecodeError, Decoded, Format, RgbImage};

/// What Pillow's `getexif()` does with an EXIF block it cannot read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExifError {
    /// `exif_transpose` raises.
    Raises,
    /// The error was swallowed while opening: no orientation (EXIF or XMP).
    Swallowed,
}

/// True when Pillow's `Exif.load` raises on `exif` (after one or two `Exif\0\0`).
pub(crate) fn pillow_refuses(mut exif: &[u8]) -> bool {
    for _ in 0..2 {
        if let Some(rest) = exif.strip_prefix(b"Exif\x00\x00") {
            exif = rest;
        }
    }
    if exif.is_empty() {
        return false;
    }
    const PREFIXES: [&[u8]; 6] = [
        b"MM\x00*", b"II*\x00", b"MM*\x00", b"II\x00*", b"MM\x00+", b"II+\x00",
    ];
    !PREFIXES.iter().any(|p| exif.starts_with(p)) || exif[2] == b'+' || exif.len() < 8
}

/// The orientation `exif_transpose` applies to `decoded`, or the error it raises.
pub(crate) fn pillow_orientation(format: Format, decoded: &Decoded) -> Result<u8, DecodeError> {
    match decoded.exif_error {
        Some(ExifError::Raises) => Err(DecodeError::corrupt(
            format,
            "unreadable EXIF block (Pillow's getexif raises)",
        )),
        Some(ExifError::Swallowed) => Ok(1),
        None => Ok(orientation(decoded.exif.as_deref(), decoded.xmp.as_deref())),
    }
}

/// The orientation (1…8; 1 when absent or not applicable) from the EXIF block or the XMP packet.
pub fn orientation(exif: Option<&[u8]>, xmp: Option<&[u8]>) -> u8 {
    if let Some(exif) = exif {
        match exif_orientation(exif) {
            Tag::Value(v) => return if (2..=8).contains(&v) { v as u8 } else { 1 },
            Tag::Present => return 1,
            Tag::Absent => {}
        }
    }
    xmp.and_then(xmp_orientation).unwrap_or(1)
}

enum Tag {
    /// The tag holds this integral value.
    Value(i64),
    /// The tag exists but is not a single integral number (Pillow's dict lookup misses).
    Present,
    /// No Orientation tag: Pillow falls back to the XMP.
    Absent,
}

fn exif_orientation(mut data: &[u8]) -> Tag {
    for _ in 0..2 {
        if let Some(rest) = data.strip_prefix(b"Exif\x00\x00") {
            data = rest;
        }
    }
    if data.len() < 8 {
        return Tag::Absent;
    }
    let little = match &data[..4] {
        b"II*\x00" | b"II\x00*" => true,
        b"MM\x00*" | b"MM*\x00" | b"MM\x00+" => false,
        _ => return Tag::Absent,
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b = data.get(at..at + 2)?;
        Some(if little {
            u16::from_le_bytes([b[0], b[1]])
        } else {
            u16::from_be_bytes([b[0], b[1]])
        })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b = data.get(at..at + 4)?;
        let b = [b[0], b[1], b[2], b[3]];
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    let Some(ifd) = u32_at(4) else {
        return Tag::Absent;
    };
    let ifd = ifd as usize;
    let Some(count) = u16_at(ifd) else {
        return Tag::Absent;
    };
    let limit = data.len() as u64;
    let mut total_out_of_line = 0u64;
    for i in 0..usize::from(count) {
        let entry = ifd + 2 + i * 12;
        // Pillow reads the whole 12-byte entry first (`_ensure_read`): a short read ends the
        // directory, keeping the tags seen so far, even when the entry's tag, type, count and
        // the bytes its inline value needs are all there.
        if data.len() < entry + 12 {
            return Tag::Absent;
        }
        let (Some(tag), Some(typ), Some(n)) = (u16_at(entry), u16_at(entry + 2), u32_at(entry + 4))
        else {
            return Tag::Absent;
        };
        let unit: u64 = match typ {
            1 | 2 | 6 | 7 => 1,
            3 | 8 => 2,
            4 | 9 | 11 | 13 => 4,
            5 | 10 | 12 | 16 => 8,
            _ => continue, // unsupported type: ignored
        };
        let size = unit * u64::from(n);
        let value_at = if size > 4 {
            let Some(offset) = u32_at(entry + 8) else {
                return Tag::Absent;
            };
            total_out_of_line += size;
            if total_out_of_line > limit {
                continue; // "Tag data larger than file"
            }
            let end = u64::from(offset) + size;
            if end > limit {
                // `_safe_read` raises on the short read, ending the IFD (earlier tags stay).
                return Tag::Absent;
            }
            offset as usize
        } else {
            entry + 8
        };
        if size == 0 || tag != 274 {
            continue;
        }
        if n != 1 {
            return Tag::Present;
        }
        let value = match typ {
            3 => u16_at(value_at).map(i64::from),
            8 => u16_at(value_at).map(|v| i64::from(v as i16)),
            4 | 13 => u32_at(value_at).map(i64::from),
            9 => u32_at(value_at).map(|v| i64::from(v as i32)),
            6 => data.get(value_at).map(|&v| i64::from(v as i8)),
            16 => {
                let (Some(a), Some(b)) = (u32_at(value_at), u32_at(value_at + 4)) else {
                    return Tag::Present;
                };
                let v = if little {
                    (u64::from(b) << 32) | u64::from(a)
                } else {
                    (u64::from(a) << 32) | u64::from(b)
                };
                i64::try_from(v).ok()
            }
            11 => u32_at(value_at).and_then(|v| integral(f64::from(f32::from_bits(v)))),
            12 => {
                let (Some(a), Some(b)) = (u32_at(value_at), u32_at(value_at + 4)) else {
                    return Tag::Present;
                };
                let bits = if little {
                    (u64::from(b) << 32) | u64::from(a)
                } else {
                    (u64::from(a) << 32) | u64::from(b)
                };
                integral(f64::from_bits(bits))
            }
            5 | 10 => {
                let (Some(num), Some(den)) = (u32_at(value_at), u32_at(value_at + 4)) else {
                    return Tag::Present;
                };
                let (num, den) = if typ == 5 {
                    (i64::from(num), i64::from(den))
                } else {
                    (i64::from(num as i32), i64::from(den as i32))
                };
                (den != 0 && num % den == 0).then(|| num / den)
            }
            _ => None, // BYTE, ASCII, UNDEFINED: bytes or str in Pillow, never equal to an int
        };
        return value.map_or(Tag::Present, Tag::Value);
    }
    Tag::Absent
}

fn integral(v: f64) -> Option<i64> {
    (v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15).then_some(v as i64)
}

/// `re.search(rb'tiff:Orientation(="|>)([0-9])', xmp)` → `int(match[2])`, valid when 2…8.
fn xmp_orientation(xmp: &[u8]) -> Option<u8> {
    const NEEDLE: &[u8] = b"tiff:Orientation";
    let mut from = 0;
    while let Some(pos) = find(&xmp[from..], NEEDLE) {
        let at = from + pos + NEEDLE.len();
        let rest = &xmp[at..];
        let digit = if rest.starts_with(b"=\"") {
            rest.get(2)
        } else if rest.starts_with(b">") {
            rest.get(1)
        } else {
            None
        };
        if let Some(d) = digit.filter(|d| d.is_ascii_digit()) {
            let v = d - b'0';
            return Some(if (2..=8).contains(&v) { v } else { 1 });
        }
        from = at;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Applies `ImageOps.exif_transpose` for `orientation`; `Err(bytes)` if allocation fails.
pub fn transpose(image: RgbImage, orientation: u8) -> Result<RgbImage, u64> {
    let (w, h) = (image.width as usize, image.height as usize);
    let (pixels, ow, oh) = transpose_pixels(image.pixels, w, h, 3, orientation)?;
    Ok(RgbImage {
        width: ow as u32,
        height: oh as u32,
        pixels,
    })
}

/// [`transpose`] of `w × h` interleaved pixels of `channels` bytes: the pixels and their new
/// `(width, height)`.
pub fn transpose_pixels(
    src: Vec<u8>,
    w: usize,
    h: usize,
    channels: usize,
    orientation: u8,
) -> Result<(Vec<u8>, usize, usize), u64> {
    // (out_w, out_h, source pixel index for output (x, y)).
    let (ow, oh): (usize, usize) = match orientation {
        2..=4 => (w, h),
        5..=8 => (h, w),
        _ => return Ok((src, w, h)),
    };
    let mut out: Vec<u8> = super::zeroed(w * h * channels)?;
    for y in 0..oh {
        let row = &mut out[y * ow * channels..(y + 1) * ow * channels];
        for (x, px) in row.chunks_exact_mut(channels).enumerate() {
            let (sx, sy) = match orientation {
                2 => (w - 1 - x, y),         // FLIP_LEFT_RIGHT
                3 => (w - 1 - x, h - 1 - y), // ROTATE_180
                4 => (x, h - 1 - y),         // FLIP_TOP_BOTTOM
                5 => (y, x),                 // TRANSPOSE
                6 => (y, h - 1 - x),         // ROTATE_270 (clockwise 90)
                7 => (w - 1 - y, h - 1 - x), // TRANSVERSE
                _ => (w - 1 - y, x),         // 8: ROTATE_90 (counter-clockwise)
            };
            let s = (sy * w + sx) * channels;
            px.copy_from_slice(&src[s..s + channels]);
        }
    }
    Ok((out, ow, oh))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_pillow_refuses() {
        assert!(!pillow_refuses(b""));
        assert!(!pillow_refuses(b"Exif\x00\x00Exif\x00\x00"));
        assert!(!pillow_refuses(b"Exif\x00\x00MM\x00*\x00\x00\x00\x08"));
        assert!(!pillow_refuses(b"MM\x00+\x00\x00\x00\x08"));
        assert!(pillow_refuses(b"II+\x00\x08\x00\x00\x00\x00\x00\x00\x00"));
        assert!(pillow_refuses(b"XX*\x00\x08\x00\x00\x00"));
        assert!(pillow_refuses(b"II*\x00\x08"));
        assert!(pillow_refuses(b"II"));
    }

    fn tiff(little: bool, entries: &[(u16, u16, u32, [u8; 4])]) -> Vec<u8> {
        let mut v = Vec::new();
        let p16 = |v: &mut Vec<u8>, x: u16| {
            v.extend(if little {
                x.to_le_bytes()
            } else {
                x.to_be_bytes()
            })
        };
        let p32 = |v: &mut Vec<u8>, x: u32| {
            v.extend(if little {
                x.to_le_bytes()
            } else {
                x.to_be_bytes()
            })
        };
        v.extend(if little { b"II*\x00" } else { b"MM\x00*" });
        p32(&mut v, 8);
        p16(&mut v, entries.len() as u16);
        for &(tag, typ, n, value) in entries {
            p16(&mut v, tag);
            p16(&mut v, typ);
            p32(&mut v, n);
            v.extend(value);
        }
        p32(&mut v, 0);
        v
    }

    #[test]
    fn reads_short_orientation_both_endians() {
        let le = tiff(true, &[(274, 3, 1, [6, 0, 0, 0])]);
        assert_eq!(orientation(Some(&le), None), 6);
        let be = tiff(false, &[(274, 3, 1, [0, 8, 0, 0])]);
        let mut with_header = b"Exif\x00\x00".to_vec();
        with_header.extend(&be);
        assert_eq!(orientation(Some(&with_header), None), 8);
    }

    #[test]
    fn an_entry_cut_short_ends_the_directory() {
        // The block ends 2 bytes into the value field: the SHORT value is there, but Pillow's
        // 12-byte read of the entry fails first. The XMP is searched instead.
        let whole = tiff(false, &[(274, 3, 1, [0, 6, 0, 0])]);
        let cut = &whole[..whole.len() - 6];
        assert_eq!(orientation(Some(&whole[..whole.len() - 4]), None), 6);
        assert_eq!(orientation(Some(cut), None), 1);
        assert_eq!(orientation(Some(cut), Some(b"<tiff:Orientation>3<")), 3);
    }

    #[test]
    fn byte_orientation_is_ignored_like_pillow() {
        let t = tiff(true, &[(274, 1, 1, [6, 0, 0, 0])]);
        assert_eq!(orientation(Some(&t), Some(b"<tiff:Orientation>3<")), 1);
    }

    #[test]
    fn first_entry_wins_and_out_of_range_is_1() {
        let t = tiff(
            true,
            &[(274, 3, 1, [9, 0, 0, 0]), (274, 3, 1, [6, 0, 0, 0])],
        );
        assert_eq!(orientation(Some(&t), None), 1);
    }

    #[test]
    fn xmp_fallback() {
        let t = tiff(true, &[(256, 3, 1, [1, 0, 0, 0])]);
        assert_eq!(
            orientation(Some(&t), Some(b"x tiff:Orientation=\"3\" y")),
            3
        );
        assert_eq!(
            orientation(None, Some(b"<tiff:Orientation>7</tiff:Orientation>")),
            7
        );
        assert_eq!(
            orientation(None, Some(b"tiff:Orientation=x tiff:Orientation>5")),
            5
        );
        assert_eq!(orientation(Some(b"garbage"), None), 1);
    }

    #[test]
    fn transposes() {
        // 2 × 1 image: pixels a, b.
        let img = RgbImage {
            width: 2,
            height: 1,
            pixels: vec![1, 1, 1, 2, 2, 2],
        };
        let t = transpose(img.clone(), 6).unwrap();
        assert_eq!((t.width, t.height), (1, 2));
        assert_eq!(t.pixels, [1, 1, 1, 2, 2, 2]);
        let t = transpose(img.clone(), 8).unwrap();
        assert_eq!(t.pixels, [2, 2, 2, 1, 1, 1]);
        let t = transpose(img.clone(), 2).unwrap();
        assert_eq!(t.pixels, [2, 2, 2, 1, 1, 1]);
        assert_eq!(transpose(img.clone(), 1).unwrap(), img);
    }
}
