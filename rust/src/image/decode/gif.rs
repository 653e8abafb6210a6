//! GIF, first frame, decoded the way Pillow 13's `GifImagePlugin` and `GifDecode.c` do it.
//!
//! The image is the logical screen, grown when the first frame reaches past it. Outside the
//! frame it holds the frame's transparency index if it has one, else index 0. The mode is `P`
//! with the frame's palette (the local colour table, else the global one), or `L` when that
//! table is the identity gray ramp (entry *i* = (*i*, *i*, *i*)) or absent — then indices are
//! gray levels. The graphic control extension's transparency index becomes
//! `info["transparency"]`. The LZW decoder follows Pillow's: codes past the table are errors;
//! the image is complete once every row is written (later data is not read). Pillow's decoder
//! returns at an end code, or when the next data block is not wholly in what has been read
//! (64 KiB at a time); it is called again only if reading on gives more data, else the image
//! is truncated — so an end code before the last row is an error unless more than 64 KiB of
//! the file follow the image data's start. GIFs carry no EXIF or XMP orientation for Pillow.

use super::convert::{ModeImage, Palette, Pixels, Transparency};
use super::{check_size, zeroed_image, DecodeError, Decoded, Format};

const FORMAT: Format = Format::Gif;

fn truncated(detail: &str) -> DecodeError {
    DecodeError::truncated(FORMAT, detail)
}

/// A palette Pillow keeps (`_is_palette_needed`): anything but the identity gray ramp.
fn palette_needed(p: &[u8]) -> bool {
    p.chunks(3)
        .enumerate()
        .any(|(i, e)| e.len() < 3 || e.iter().any(|&c| usize::from(c) != i))
}

/// Decodes the first frame of a GIF file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    let header = data
        .get(..13)
        .ok_or_else(|| truncated("the header is incomplete"))?;
    let mut width = u16::from_le_bytes([header[6], header[7]]) as u32;
    let mut height = u16::from_le_bytes([header[8], header[9]]) as u32;
    let flags = header[10];
    let mut pos = 13;
    let mut global: Option<&[u8]> = None;
    if flags & 0x80 != 0 {
        let len = 3 << ((flags & 7) + 1);
        let table = data
            .get(pos..(pos + len).min(data.len()))
            .unwrap_or_default();
        if palette_needed(table) {
            global = Some(table);
        }
        pos += len;
    }
    let byte = |pos: usize| {
        data.get(pos)
            .copied()
            .ok_or_else(|| truncated("no image before the end of the file"))
    };
    // Pillow's `data()`: one sub-block (a length byte, then up to that many bytes), `None` for
    // a terminator or the end of the file; returns the position after it.
    let data_block = |pos: usize| -> (Option<&[u8]>, usize) {
        match data.get(pos) {
            Some(&n) if n > 0 => {
                let end = (pos + 1 + usize::from(n)).min(data.len());
                (Some(&data[pos + 1..end]), end)
            }
            Some(_) => (None, pos + 1),
            None => (None, pos),
        }
    };
    let skip_blocks = |mut pos: usize| loop {
        match data_block(pos) {
            (Some(_), next) => pos = next,
            (None, next) => return next,
        }
    };
    let mut transparency: Option<u8> = None;
    // Extensions, up to the first image descriptor, read as Pillow's `_seek` reads them: the
    // first sub-block is read before the "skip the rest" loop, so an extension whose first
    // sub-block is a terminator still skips one more run of sub-blocks.
    loop {
        match byte(pos)? {
            b'!' => {
                let label = byte(pos + 1)?;
                let (block, next) = data_block(pos + 2);
                pos = next;
                match (label, block) {
                    (249, Some(block)) => {
                        if block.len() < 3 || (block[0] & 1 != 0 && block.len() < 4) {
                            return Err(DecodeError::corrupt(
                                FORMAT,
                                format!("graphic control extension of {} bytes", block.len()),
                            ));
                        }
                        if block[0] & 1 != 0 {
                            transparency = Some(block[3]);
                        }
                        pos = skip_blocks(pos);
                    }
                    (254, Some(_)) => pos = skip_blocks(pos), // comment: the rest of its blocks
                    (254, None) => {}
                    (255, Some(block)) if block.starts_with(b"NETSCAPE2.0") => {
                        let (_, next) = data_block(pos); // the loop count block
                        pos = skip_blocks(next);
                    }
                    _ => pos = skip_blocks(pos),
                }
            }
            b',' => break,
            b';' => return Err(DecodeError::corrupt(FORMAT, "image not found in GIF file")),
            _ => pos += 1, // Pillow skips unknown bytes between blocks
        }
    }
    let desc = data
        .get(pos + 1..pos + 10)
        .ok_or_else(|| truncated("the image descriptor is incomplete"))?;
    let x0 = u32::from(u16::from_le_bytes([desc[0], desc[1]]));
    let y0 = u32::from(u16::from_le_bytes([desc[2], desc[3]]));
    let x1 = x0 + u32::from(u16::from_le_bytes([desc[4], desc[5]]));
    let y1 = y0 + u32::from(u16::from_le_bytes([desc[6], desc[7]]));
    width = width.max(x1);
    height = height.max(y1);
    let frame_flags = desc[8];
    let interlaced = frame_flags & 0x40 != 0;
    pos += 10;
    // Some(Some(table)): a local palette Pillow keeps; Some(None): a local gray ramp.
    let mut local: Option<Option<&[u8]>> = None;
    if frame_flags & 0x80 != 0 {
        let len = 3 << ((frame_flags & 7) + 1);
        let table = data
            .get(pos..(pos + len).min(data.len()))
            .unwrap_or_default();
        local = Some(palette_needed(table).then_some(table));
        pos += len;
    }
    let code_bits = byte(pos)?;
    pos += 1;
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    if x1 == x0 || y1 == y0 {
        return Err(DecodeError::ZeroSize {
            format: FORMAT,
            width: u64::from(x1 - x0),
            height: u64::from(y1 - y0),
        });
    }
    let palette = match local {
        Some(local) => local,
        None => global,
    };
    let mut indices: Vec<u8> = zeroed_image(FORMAT, width, height, 1)?;
    if let Some(t) = transparency {
        indices.fill(t);
    }
    let frame = Frame {
        stride: width as usize,
        x0: x0 as usize,
        y0: y0 as usize,
        width: (x1 - x0) as usize,
        height: (y1 - y0) as usize,
        interlaced,
    };
    lzw_decode(&data[pos..], code_bits, &frame, &mut indices)?;
    let pixels = match palette {
        Some(table) => Pixels::P {
            indices,
            palette: Box::new(Palette::from_packed(table, 3, [0, 1, 2])),
        },
        None => Pixels::L(indices),
    };
    let transparency = transparency.map(|t| match pixels {
        Pixels::P { .. } => Transparency::PaletteIndex(t),
        _ => Transparency::Gray(u16::from(t)),
    });
    Ok(Decoded {
        image: ModeImage {
            width,
            height,
            pixels,
            transparency,
        },
        exif: None,
        xmp: None,
        exif_error: None,
    })
}

struct Frame {
    stride: usize,
    x0: usize,
    y0: usize,
    width: usize,
    height: usize,
    interlaced: bool,
}

const TABLE: usize = 1 << 12;

/// How much data `ImageFile.load` reads at a time (`ImageFile.MAXBLOCK`).
const MAXBLOCK: usize = 65536;

/// Pillow's `ImagingGifDecode` over all the data after the code size byte.
fn lzw_decode(data: &[u8], bits: u8, frame: &Frame, out: &mut [u8]) -> Result<(), DecodeError> {
    if bits > 12 {
        return Err(DecodeError::corrupt(
            FORMAT,
            format!("LZW minimum code size {bits} (max 12)"),
        ));
    }
    let clear = 1usize << bits;
    let end = clear + 1;
    let mut link = vec![0u16; TABLE];
    let mut suffix = vec![0u8; TABLE];
    let mut stack = vec![0u8; TABLE];
    let (mut next, mut codesize, mut codemask) = (0usize, 0u32, 0usize);
    let mut lastcode = 0usize;
    let mut lastdata = 0u8;
    let mut first = true; // Pillow's state 2: the first code after a clear
    let mut reset = true; // Pillow's state 1
    let (mut bitbuffer, mut bitcount) = (0u32, 0u32);
    let (mut blocksize, mut pos) = (0usize, 0usize);
    // How much of the file Pillow has read (`ImageFile.load` reads 64 KiB at a time): the
    // decoder sees `data[..avail]`, and returning for more data when none is left is an error.
    let mut avail = data.len().min(MAXBLOCK);
    let read_more = |avail: &mut usize| {
        if *avail >= data.len() {
            return Err(truncated(
                "the image data ends before the image is complete",
            ));
        }
        *avail = data.len().min(*avail + MAXBLOCK);
        Ok(())
    };
    // Interlace state: pass 0 = not interlaced, passes 1..=4.
    let (mut pass, mut step) = if frame.interlaced { (1, 8) } else { (0, 1) };
    let (mut x, mut y) = (0usize, 0usize);
    loop {
        if reset {
            next = clear + 2;
            codesize = u32::from(bits) + 1;
            codemask = (1 << codesize) - 1;
            first = true;
            reset = false;
        }
        while bitcount < codesize {
            if blocksize > 0 {
                // Inside a block, which was wholly available when it started.
                let c = data[pos];
                pos += 1;
                blocksize -= 1;
                bitbuffer |= u32::from(c) << bitcount;
                bitcount += 8;
            } else {
                // Pillow's decoder starts a block only once all of it has been read.
                let whole = data.get(pos).is_some_and(|&c| pos + usize::from(c) < avail);
                if !whole {
                    read_more(&mut avail)?;
                    continue;
                }
                blocksize = usize::from(data[pos]);
                pos += 1;
            }
        }
        let mut c = bitbuffer as usize & codemask;
        bitbuffer >>= codesize;
        bitcount -= codesize;
        if c == clear {
            if !first {
                reset = true;
            }
            continue;
        }
        if c == end {
            // Pillow's decoder returns here; it is called again only if reading the file on
            // gives more data (the rest of what it already holds is kept for that call).
            read_more(&mut avail)?;
            continue;
        }
        let mut sp = TABLE; // the string is stack[sp..TABLE]
        let string: &[u8] = if first {
            if c > clear {
                return Err(DecodeError::corrupt(
                    FORMAT,
                    format!("LZW code {c} after a clear code"),
                ));
            }
            lastdata = c as u8;
            lastcode = c;
            first = false;
            std::slice::from_ref(&lastdata)
        } else {
            let thiscode = c;
            if c > next {
                return Err(DecodeError::corrupt(
                    FORMAT,
                    format!("LZW code {c} past the table ({next})"),
                ));
            }
            if c == next {
                sp -= 1;
                stack[sp] = lastdata;
                c = lastcode;
            }
            while c >= clear {
                if sp == 0 || c >= TABLE {
                    return Err(DecodeError::corrupt(FORMAT, "LZW string too long"));
                }
                sp -= 1;
                stack[sp] = suffix[c];
                c = usize::from(link[c]);
            }
            lastdata = c as u8;
            if next < TABLE {
                suffix[next] = c as u8;
                link[next] = lastcode as u16;
                if next == codemask && codesize < 12 {
                    codesize += 1;
                    codemask = (1 << codesize) - 1;
                }
                next += 1;
            }
            lastcode = thiscode;
            // Pillow emits `lastdata` then the stacked suffixes: the string's first byte is
            // the root code `c` (now in lastdata) followed by stack[sp..].
            sp -= 1;
            stack[sp] = lastdata;
            &stack[sp..]
        };
        if y >= frame.height {
            return Err(DecodeError::corrupt(FORMAT, "LZW data overruns the frame"));
        }
        for &v in string {
            out[(frame.y0 + y) * frame.stride + frame.x0 + x] = v;
            x += 1;
            if x >= frame.width {
                x = 0;
                y += step;
                while y >= frame.height {
                    match pass {
                        1 => {
                            y = 4;
                            pass = 2;
                        }
                        2 => {
                            step = 4;
                            y = 2;
                            pass = 3;
                        }
                        3 => {
                            step = 2;
                            y = 1;
                            pass = 4;
                        }
                        _ => return Ok(()), // every row written
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ramp_detection() {
        assert!(!palette_needed(&[0, 0, 0, 1, 1, 1]));
        assert!(palette_needed(&[0, 0, 0, 1, 1, 2]));
        assert!(palette_needed(&[0, 0, 0, 1]));
        assert!(!palette_needed(&[]));
    }

    /// A 2×2 GIF: code size 2, codes clear(4), 0, 1, 0, 1, end(5), packed LSB first.
    fn tiny(extra: &[u8]) -> Vec<u8> {
        let mut d = b"GIF89a\x02\x00\x02\x00\x80\x00\x00".to_vec();
        d.extend([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]); // 2-entry table = 3 << 1 = 6 bytes? (bits=1)
        d.truncate(13 + 6);
        d.extend(extra);
        d.extend(b",\x00\x00\x00\x00\x02\x00\x02\x00\x00\x02");
        // codes 4,0,1,0,1,5 at 3 bits: 100 000 001 000 001 101
        // After entry 7 is added (the 4th code) codes are 4 bits wide.
        let codes = [(4u32, 3), (0, 3), (1, 3), (0, 3), (1, 4), (5, 4)];
        let mut bits = 0u32;
        let mut n = 0u32;
        for (c, width) in codes {
            bits |= c << n;
            n += width;
        }
        let bytes: Vec<u8> = (0..n.div_ceil(8))
            .map(|i| (bits >> (8 * i)) as u8)
            .collect();
        d.push(bytes.len() as u8);
        d.extend(&bytes);
        d.extend(b"\x00;");
        d
    }

    #[test]
    fn decodes_a_tiny_gif() {
        let d = tiny(&[]);
        let out = decode(&d, u64::MAX).unwrap();
        match out.image.pixels {
            Pixels::P { indices, palette } => {
                assert_eq!(indices, [0, 1, 0, 1]);
                assert_eq!(palette.entries[1], [255, 0, 0, 255]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(out.image.transparency, None);
        let d = tiny(b"!\xf9\x04\x01\x00\x00\x01\x00");
        let out = decode(&d, u64::MAX).unwrap();
        assert_eq!(out.image.transparency, Some(Transparency::PaletteIndex(1)));
    }

    #[test]
    fn truncation_is_reported() {
        let d = tiny(&[]);
        for cut in 0..d.len() - 3 {
            let r = decode(&d[..cut], u64::MAX);
            assert!(r.is_err(), "cut at {cut}");
        }
    }
}
