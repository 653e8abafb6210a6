//! PNG, read the way Pillow 13's `PngImagePlugin` and `ZipDecode.c` read it (zlib-ng's inflate,
//! as Pillow's wheels bundle it, through its Rust port `zlib-rs`).
//!
//! Modes (Pillow's `_MODES`): 1-bit gray → `1`; 2- and 4-bit gray → `L` scaled by 85 and 17;
//! 16-bit gray → `I;16`; 16-bit RGB, RGBA and gray+alpha keep the **most significant byte**
//! (`RGB;16B`, `RGBA;16B`, `LA;16B`); palettes of 1–8 bits → `P` (entries past `PLTE` black).
//! `tRNS`: for `P` per-index alphas, for `1`/`L`/`I;16`/`RGB` the 16-bit colour key (compared by
//! the conversion after its `& 0xff`, as Pillow does), ignored for images with alpha; the last
//! one wins, even after `IDAT`. EXIF: the `eXIf` chunk, a `tEXt` keyed `exif`, or a
//! `Raw profile type exif` text chunk; XMP: the `XML:com.adobe.xmp` text chunk.
//!
//! Where Pillow refuses a file we refuse it, where it decodes one we give the same pixels:
//!
//! - **Opening** (`_open`): chunks are read up to the first `IDAT`; each must have a valid
//!   type (`\w{4}`), a complete body and a valid CRC; the handlers' own checks apply (short
//!   `IHDR`/`tRNS`/`gAMA`/`cHRM`/`sRGB`/`pHYs`/`acTL`/`fcTL`, a non-zero filter method, an
//!   unknown text or ICC compression method, text that inflates past 1 MiB, APNG sequence
//!   errors). The last `IHDR` wins; any non-zero interlace byte means Adam7.
//! - **Image data** (`load_read` + `ZipDecode`): the `IDAT` bodies (and `DDAT`) are fed to
//!   inflate in pieces of at most 64 KiB, never across a chunk boundary, and inflated row by row.
//!   Every inflate error (bad zlib header, bad deflate data, an **adler32 mismatch**) is an
//!   error — but zlib only reaches the adler32 (and anything after the last row) when it is in
//!   the same piece as the end of the last row, so the checksum is checked exactly when Pillow's
//!   zlib checks it. The image is complete when its last row is, or when the stream ends
//!   exactly at a row boundary (the remaining rows stay zero, as in Pillow); a stream that ends
//!   mid-row, or image data that stops (another chunk, the end of the file) first, is
//!   truncated. Pillow calls inflate only while its piece has input left: rows zlib could still
//!   write from what it holds (the rest of a long match, codes already in its bit buffer) after
//!   the last byte of image data was read for an earlier row are never written, and the image
//!   is truncated too. A row filter type above 4 is an error. Image-data CRCs are not checked.
//! - **After the image** (`load_end`): the rest of the file is walked without CRC checks;
//!   a chunk type that is not `\w{4}` or an incomplete chunk header ends the walk quietly, `IEND`
//!   ends it, and so does an `fcTL` in an animated PNG; every other chunk's body must be
//!   complete and its handler's checks apply (text, `tRNS` and EXIF found here count).
//!
//! Not reproduced (APNG corner cases no real file has): image data in an `fdAT` before any
//! `IDAT` is refused (Pillow decodes it when the sequence numbers fit); an `fcTL` before the
//! `IDAT` declaring a frame smaller than the image does not shrink the decoded region; an `IHDR`
//! after the image data is checked but does not change how later `tRNS` chunks are read.

use std::sync::atomic::{AtomicU64, Ordering};

use super::convert::{ModeImage, Palette, Pixels, Transparency};
use super::{check_size, zeroed, DecodeError, Decoded, Format};

const FORMAT: Format = Format::Png;

/// Pillow's limit on decompressed text and ICC chunks (`MAX_TEXT_CHUNK`): past it, it raises.
const MAX_TEXT_CHUNK: usize = 1 << 20;
/// The first output buffer of [`inflate_text`], doubled as the text needs.
const TEXT_START: usize = 4096;
/// Pillow's limit on the total text kept (`MAX_TEXT_MEMORY`): past it, it raises.
const MAX_TEXT_MEMORY: usize = 64 * MAX_TEXT_CHUNK;
/// How much image data Pillow reads at a time (`ImageFile.MAXBLOCK`).
const MAXBLOCK: usize = 65536;

/// Adam7 as Pillow's `ZipDecode.c` tables give it: (first row, first column, row step,
/// column step) of each pass.
const ADAM7: [(usize, usize, usize, usize); 7] = [
    (0, 0, 8, 8),
    (0, 4, 8, 8),
    (4, 0, 8, 4),
    (0, 2, 4, 4),
    (2, 0, 4, 2),
    (0, 1, 2, 2),
    (1, 0, 2, 1),
];

fn corrupt(reason: impl Into<String>) -> DecodeError {
    DecodeError::corrupt(FORMAT, reason)
}

fn truncated(detail: impl Into<String>) -> DecodeError {
    DecodeError::truncated(FORMAT, detail)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Pillow's `is_cid` (`re.compile(rb"\w\w\w\w").match` on the 4 type bytes).
fn is_cid(cid: &[u8]) -> bool {
    cid.len() == 4 && cid.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_')
}

fn show(cid: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(cid))
}

/// One chunk header as `ChunkStream.read` sees it.
enum Header<'a> {
    /// Fewer than 4 bytes left: `i32` fails (`struct.error`).
    NoLength,
    /// The type is not `\w{4}` (or is cut short): `SyntaxError`.
    BadType(&'a [u8]),
    Chunk {
        cid: &'a [u8],
        /// Where the body starts.
        body: usize,
        len: usize,
    },
}

fn read_header(data: &[u8], pos: usize) -> Header<'_> {
    let head = &data[pos.min(data.len())..(pos + 8).min(data.len())];
    if head.len() < 4 {
        return Header::NoLength;
    }
    let cid = &head[4..];
    if !is_cid(cid) {
        return Header::BadType(cid);
    }
    Header::Chunk {
        cid,
        body: pos + 8,
        len: be32(head) as usize,
    }
}

/// Pillow's `_MODES` keys: (bit depth, colour type) combinations it opens.
fn known_mode(bits: u8, color: u8) -> bool {
    matches!(
        (bits, color),
        (1 | 2 | 4 | 8 | 16, 0) | (8 | 16, 2) | (1 | 2 | 4 | 8, 3) | (8 | 16, 4) | (8 | 16, 6)
    )
}

/// One inflate call of `input` into `output`: its status, and how many bytes it consumed and
/// produced (at most `input.len()` and `output.len()`).
fn inflate_step(
    z: &mut zlib_rs::Inflate,
    input: &[u8],
    output: &mut [u8],
    flush: zlib_rs::InflateFlush,
) -> (Result<zlib_rs::Status, zlib_rs::InflateError>, usize, usize) {
    let before = (z.total_in(), z.total_out());
    let status = z.decompress(input, output, flush);
    let read = (z.total_in() - before.0) as usize;
    let written = (z.total_out() - before.1) as usize;
    (status, read, written)
}

/// What `python zlib.decompressobj().decompress(data, MAX_TEXT_CHUNK)` gives, as Pillow's
/// `_safe_zlib_decompress` uses it: `Ok(Some(text))`, `Ok(None)` for a `zlib.error` (Pillow
/// ignores the chunk's value), `Err` when the text inflates past the limit (Pillow raises).
///
/// The output buffer starts small and doubles as the text fills it, up to the limit: a chunk
/// costs memory and time in proportion to what it inflates to, never the whole limit (a file
/// of thousands of tiny compressed chunks would otherwise clear a megabyte for each).
fn inflate_text(data: &[u8]) -> Result<Option<Vec<u8>>, DecodeError> {
    let mut z = zlib_rs::Inflate::new(true, 15);
    let mut out = vec![0u8; TEXT_START.min(MAX_TEXT_CHUNK)];
    let mut used_in = 0usize;
    let mut used_out = 0usize;
    loop {
        let (status, read, written) = inflate_step(
            &mut z,
            &data[used_in..],
            &mut out[used_out..],
            zlib_rs::InflateFlush::SyncFlush,
        );
        used_in += read;
        used_out += written;
        match status {
            Err(_) => return Ok(None),
            Ok(zlib_rs::Status::StreamEnd) => break,
            // Full below the limit: where one call into a buffer of the whole limit would have
            // gone on writing, grow and go on (the bytes and the errors are those of one call).
            Ok(_) if used_out == out.len() && out.len() < MAX_TEXT_CHUNK => {
                out.resize((2 * out.len()).min(MAX_TEXT_CHUNK), 0);
            }
            Ok(_) if used_in == data.len() => break,
            Ok(_) if used_out == out.len() => {
                return Err(corrupt("Decompressed data too large for a text chunk"))
            }
            Ok(zlib_rs::Status::BufError) => break,
            Ok(zlib_rs::Status::Ok) => {}
        }
    }
    out.truncate(used_out);
    Ok(Some(out))
}

/// The state `PngStream` builds from the chunks: the image header, palette, transparency,
/// metadata and APNG bookkeeping.
#[derive(Default)]
struct Stream {
    width: u32,
    height: u32,
    /// (bit depth, colour type) of the last `IHDR` whose combination Pillow knows.
    mode: Option<(u8, u8)>,
    interlaced: bool,
    palette: Option<Vec<u8>>,
    transparency: Option<Transparency>,
    exif: Option<Vec<u8>>,
    raw_profile_exif: Option<Vec<u8>>,
    xmp: Option<Vec<u8>>,
    text_memory: usize,
    n_frames: Option<u32>,
    seq_num: Option<u32>,
    /// An `fcTL` came before the image data (the `IDAT` image is then the first frame).
    fctl_before_idat: bool,
    /// The image data has been found (`load_end` is reading).
    after_idat: bool,
}

impl Stream {
    fn check_text_memory(&mut self, len: usize) -> Result<(), DecodeError> {
        self.text_memory += len;
        if self.text_memory > MAX_TEXT_MEMORY {
            return Err(corrupt(format!(
                "too much memory used in text chunks: {} > {MAX_TEXT_MEMORY}",
                self.text_memory
            )));
        }
        Ok(())
    }

    fn is_animated(&self) -> bool {
        let frames = self.n_frames.unwrap_or(1);
        let default_image = self.n_frames.is_some() && !self.fctl_before_idat;
        u64::from(frames) + u64::from(default_image) > 1
    }

    /// `PngStream.chunk_*` for every chunk but the image data: its checks and what it keeps.
    fn handle(&mut self, cid: &[u8], s: &[u8]) -> Result<(), DecodeError> {
        let short = |what: &str| Err(corrupt(format!("Truncated {what} chunk")));
        match cid {
            b"IHDR" => {
                if s.len() < 13 {
                    return short("IHDR");
                }
                if s[11] != 0 {
                    return Err(corrupt("unknown filter category"));
                }
                if self.after_idat {
                    return Ok(()); // read into the stream, not into the opened image
                }
                self.width = be32(&s[0..]);
                self.height = be32(&s[4..]);
                if known_mode(s[8], s[9]) {
                    self.mode = Some((s[8], s[9]));
                }
                if s[12] != 0 {
                    self.interlaced = true;
                }
            }
            b"PLTE" if !self.after_idat && matches!(self.mode, Some((_, 3))) => {
                self.palette = Some(s.to_vec());
            }
            b"tRNS" => self.trns(s)?,
            b"gAMA" if s.len() < 4 => return short("gAMA"),
            b"cHRM" if s.len() < 32 => return short("cHRM"),
            b"sRGB" if s.is_empty() => return short("sRGB"),
            b"pHYs" if s.len() < 9 => return short("pHYs"),
            b"iCCP" => {
                // `s[s.find(b"\0") + 1]`: the byte after the name, or the first byte.
                let method_at = s.iter().position(|&b| b == 0).map_or(0, |i| i + 1);
                let Some(&method) = s.get(method_at) else {
                    return Err(corrupt("iCCP chunk without a compression method"));
                };
                if method != 0 {
                    return Err(corrupt(format!(
                        "Unknown compression method {method} in iCCP chunk"
                    )));
                }
                inflate_text(&s[method_at + 1..])?;
            }
            b"tEXt" => {
                let (key, value) = split_key(s);
                if !key.is_empty() {
                    self.text(cid, key, value.to_vec());
                    self.check_text_memory(value.len())?;
                }
            }
            b"zTXt" => {
                let (key, value) = split_key(s);
                let method = value.first().copied().unwrap_or(0);
                if method != 0 {
                    return Err(corrupt(format!(
                        "Unknown compression method {method} in zTXt chunk"
                    )));
                }
                let text = inflate_text(value.get(1..).unwrap_or_default())?.unwrap_or_default();
                if !key.is_empty() {
                    let len = text.len();
                    self.text(cid, key, text);
                    self.check_text_memory(len)?;
                }
            }
            b"iTXt" => self.itxt(s)?,
            b"eXIf" => {
                let mut exif = b"Exif\x00\x00".to_vec();
                exif.extend_from_slice(s);
                self.exif = Some(exif);
            }
            b"acTL" => {
                if s.len() < 8 {
                    return Err(corrupt("APNG contains truncated acTL chunk"));
                }
                let n = be32(s);
                if self.n_frames.is_some() {
                    self.n_frames = None;
                } else if n != 0 && n <= 0x8000_0000 {
                    self.n_frames = Some(n);
                }
            }
            b"fcTL" => {
                if s.len() < 26 {
                    return Err(corrupt("APNG contains truncated fcTL chunk"));
                }
                let seq = be32(s);
                let in_order = match self.seq_num {
                    None => seq == 0,
                    Some(prev) => u64::from(prev) + 1 == u64::from(seq),
                };
                if !in_order {
                    return Err(corrupt("APNG contains frame sequence errors"));
                }
                self.seq_num = Some(seq);
                let (w, h, x, y) = (be32(&s[4..]), be32(&s[8..]), be32(&s[12..]), be32(&s[16..]));
                if u64::from(x) + u64::from(w) > u64::from(self.width)
                    || u64::from(y) + u64::from(h) > u64::from(self.height)
                {
                    return Err(corrupt("APNG contains invalid frames"));
                }
                if !self.after_idat {
                    self.fctl_before_idat = true;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `chunk_tRNS`, interpreted for the mode the image has when the chunk is read.
    fn trns(&mut self, s: &[u8]) -> Result<(), DecodeError> {
        let Some((bits, color)) = self.mode else {
            return Ok(());
        };
        let need = match color {
            3 => {
                self.transparency = Some(simple_palette_index(s).map_or_else(
                    || Transparency::PaletteAlphas(s.to_vec()),
                    Transparency::PaletteIndex,
                ));
                return Ok(());
            }
            0 => 2,
            2 => 6,             // 8- and 16-bit RGB: Pillow's mode "RGB" both
            _ => return Ok(()), // modes with alpha
        };
        if s.len() < need {
            return Err(corrupt("Truncated tRNS chunk"));
        }
        self.transparency = Some(match (color, bits) {
            (0, 1) => Transparency::Gray(if be16(s, 0) != 0 { 255 } else { 0 }),
            (0, _) => Transparency::Gray(be16(s, 0)),
            _ => Transparency::Rgb(be16(s, 0), be16(s, 2), be16(s, 4)),
        });
        Ok(())
    }

    /// `chunk_iTXt`: keyword, flag, method, language, translated keyword, text.
    fn itxt(&mut self, s: &[u8]) -> Result<(), DecodeError> {
        let Some(i) = s.iter().position(|&b| b == 0) else {
            return Ok(());
        };
        let (key, r) = (&s[..i], &s[i + 1..]);
        if r.len() < 2 {
            return Ok(());
        }
        let (flag, method, r) = (r[0], r[1], &r[2..]);
        let mut parts = r.splitn(3, |&b| b == 0);
        let (Some(lang), Some(translated), Some(text)) = (parts.next(), parts.next(), parts.next())
        else {
            return Ok(());
        };
        let text = if flag != 0 {
            if method != 0 {
                return Ok(());
            }
            match inflate_text(text)? {
                Some(t) => t,
                None => return Ok(()),
            }
        } else {
            text.to_vec()
        };
        if key == b"XML:com.adobe.xmp" {
            self.xmp = Some(text.clone());
        }
        let (Ok(_), Ok(_), Ok(value)) = (
            std::str::from_utf8(lang),
            std::str::from_utf8(translated),
            std::str::from_utf8(&text),
        ) else {
            return Ok(());
        };
        let chars = value.chars().count();
        self.text(b"iTXt", key, text);
        self.check_text_memory(chars)
    }

    /// The text chunks Pillow's `getexif` and `getxmp` look at.
    fn text(&mut self, cid: &[u8], key: &[u8], value: Vec<u8>) {
        match key {
            b"XML:com.adobe.xmp" => self.xmp = Some(value),
            b"Raw profile type exif" => self.raw_profile_exif = Some(value),
            b"exif" if cid == b"tEXt" => self.exif = Some(value),
            _ => {}
        }
    }
}

/// `s.split(b"\0", 1)`, or the whole chunk as the key when there is no NUL.
fn split_key(s: &[u8]) -> (&[u8], &[u8]) {
    match s.iter().position(|&b| b == 0) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[]),
    }
}

/// `PngImageFile._open`: the chunks up to the first `IDAT`, CRCs checked. Returns the stream
/// state and the first `IDAT`'s body position and length.
fn open(data: &[u8]) -> Result<(Stream, usize, usize), DecodeError> {
    let mut stream = Stream::default();
    let mut pos = 8;
    loop {
        let (cid, body, len) = match read_header(data, pos) {
            Header::NoLength => return Err(truncated("no image data before the end of the file")),
            Header::BadType(cid) => {
                return Err(corrupt(format!("broken PNG file (chunk {})", show(cid))))
            }
            Header::Chunk { cid, body, len } => (cid, body, len),
        };
        match cid {
            b"IDAT" => return Ok((stream, body, len)),
            b"IEND" => return Err(corrupt("no image data before IEND: cannot load this image")),
            b"fdAT" => return Err(corrupt("APNG frame data before the image data")),
            _ => {}
        }
        let Some(s) = body.checked_add(len).and_then(|end| data.get(body..end)) else {
            return Err(truncated(format!("chunk {} is cut short", show(cid))));
        };
        stream.handle(cid, s)?;
        let Some(stored) = data.get(body + len..body + len + 4) else {
            return Err(truncated(format!("incomplete checksum in {}", show(cid))));
        };
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(cid);
        hasher.update(s);
        if hasher.finalize().to_be_bytes() != stored {
            return Err(corrupt(format!(
                "broken PNG file (bad header checksum in {})",
                show(cid)
            )));
        }
        pos = body + len + 4;
    }
}

/// The layout of the inflated image data: every row (of every Adam7 pass) with its filter byte.
struct Layout {
    /// Bytes per complete row of the image, without the filter byte.
    line: usize,
    /// Bits per pixel.
    bits_pp: usize,
    /// (pass, row bytes, number of rows) of each pass that has pixels; one entry when not
    /// interlaced.
    passes: Vec<(usize, usize, usize)>,
    total: usize,
}

impl Layout {
    fn new(width: u32, height: u32, bits_pp: usize, interlaced: bool) -> Option<Self> {
        let (w, h) = (width as usize, height as usize);
        let row_bytes = |cols: usize| cols.checked_mul(bits_pp).map(|b| b.div_ceil(8));
        let line = row_bytes(w)?;
        let passes: Vec<_> = if interlaced {
            ADAM7
                .iter()
                .enumerate()
                .filter_map(|(p, &(y0, x0, dy, dx))| {
                    let cols = w.saturating_sub(x0).div_ceil(dx);
                    let rows = h.saturating_sub(y0).div_ceil(dy);
                    (cols > 0 && rows > 0).then(|| (p, row_bytes(cols).unwrap_or(0), rows))
                })
                .collect()
        } else {
            vec![(0, line, h)]
        };
        let mut total = 0usize;
        for &(_, bytes, rows) in &passes {
            total = total.checked_add(bytes.checked_add(1)?.checked_mul(rows)?)?;
        }
        Some(Self {
            line,
            bits_pp,
            passes,
            total,
        })
    }
}

/// Where the image data reading stopped: the position in the file and the bytes of the current
/// `IDAT` left unread (what `load_end` skips first).
struct DataEnd {
    pos: usize,
    left_in_chunk: usize,
}

/// `load_read` + `ImagingZipDecode`: inflates the image data into `out` (the layout's rows with
/// their filter bytes; whatever it holds is overwritten) with Pillow's outcome. First
/// [`inflate_joined`] (all the data in one call), then, when an error after the last byte or a
/// cut-short chunk leaves it unsure, [`inflate_whole`] (Pillow's pieces); both succeed only
/// when Pillow's row-by-row inflate does, and then give the same bytes. When neither succeeds
/// (a broken or truncated stream, a stream that ends before the last row), the data is
/// inflated again row by row ([`inflate_rows`]) to fail, or stop, where Pillow does.
///
/// The joined call is [`super::inflate`]'s own inflate when the stream is whole and valid and
/// fills the output exactly (the usual case, 1.1–1.5x faster than zlib-rs on the real PNGs),
/// zlib-rs otherwise. libdeflate (about 1.2x faster than zlib-rs too) is not used: it accepts
/// streams zlib refuses, in the middle of the data (length symbols 286/287, distance symbols
/// 30/31, more than 286 or 30 code lengths, the unused codeword of a one-codeword code, an
/// empty distance code used), which no cheap check outside the inflate can rule out.
fn inflate_image(
    data: &[u8],
    first_body: usize,
    first_len: usize,
    layout: &Layout,
    out: &mut [u8],
) -> Result<DataEnd, DecodeError> {
    match inflate_joined(data, first_body, first_len, out) {
        Joined::Done(end) => return Ok(end),
        Joined::Unsure => {
            if let Some(end) = inflate_whole(data, first_body, first_len, out) {
                return Ok(end);
            }
        }
        Joined::Fails => {}
    }
    // `out` is not cleared first: the rows are written in order, and only an image whose
    // stream ends early gets its remaining bytes zeroed (a broken stream that declares a huge
    // image fails after its first bytes without touching the rest of the buffer).
    inflate_rows(data, first_body, first_len, layout, out)
}

/// What [`inflate_joined`] found out.
enum Joined {
    /// Pillow succeeds, with these bytes, and reads on after this point.
    Done(DataEnd),
    /// The output was filled, but then came an error Pillow may never reach (in data it would
    /// not have fed to inflate), or a cut-short chunk: [`inflate_whole`] decides.
    Unsure,
    /// The output was not filled, or filled only by reading every byte of the data without
    /// reaching the stream's end (Pillow's row-by-row calls may stop short of the last row):
    /// [`inflate_whole`] would not succeed either.
    Fails,
}

/// Inflates the image data into all of `out` in one call, the bodies of the consecutive
/// `IDAT`/`DDAT` chunks joined (copied into one buffer when there are several). zlib-rs, like
/// zlib, keeps the output of earlier calls in its own 32 KiB window, and a match reaching back
/// into an earlier call's output is copied from there, a slower path: fed one 8 KiB chunk per
/// call (libpng's default chunk size), most matches take it and inflate is up to ~25 % slower.
///
/// Why `Done` is Pillow's result: up to the symbol that writes the last byte, inflate reads the
/// same bits in the same order whatever the pieces, so it writes the same bytes and meets the
/// same errors ([`inflate_whole`]). After that byte, Pillow's call goes on through the rest of
/// its piece; this call goes on through the same bytes and possibly more, so an error Pillow
/// meets there (a bad adler32, say) is met here too, and its absence here means Pillow has none
/// either. Where Pillow's reading ends matters only through the chunk it ends in: `load_end`
/// starts at the end of that chunk. Here the last byte read can lie in a later chunk; every
/// chunk in between is a whole `IDAT`/`DDAT` chunk, which `load_end` passes over without effect,
/// so starting after this call's last chunk is the same, unless that chunk is cut short by the
/// end of the file (`load_end` would fail on it): then `Unsure`.
///
/// One more condition: Pillow's calls for the last row must start with input left. They do
/// when this call left input unread, or ended the stream (its adler32 is read after the last
/// output byte is written). When it read every byte without reaching the stream's end, the
/// last byte may have been read for an earlier row, the rest coming from what zlib holds (the
/// remainder of a long match): Pillow would then stop there, short of the last row, and
/// report a truncated image. `Fails` leaves that to [`inflate_rows`].
fn inflate_joined(data: &[u8], first_body: usize, first_len: usize, out: &mut [u8]) -> Joined {
    if out.is_empty() {
        return Joined::Unsure;
    }
    // The chunks, as (body, declared length), and the bytes of each that the file holds.
    let mut chunks = Vec::new();
    let (mut body, mut len) = (first_body, first_len);
    let mut total = 0usize;
    loop {
        let end = body.saturating_add(len);
        total += data.len().min(end).saturating_sub(body);
        chunks.push((body, len));
        match read_header(data, end.saturating_add(4)) {
            Header::Chunk {
                cid: b"IDAT" | b"DDAT",
                body: next,
                len: next_len,
            } => (body, len) = (next, next_len),
            _ => break,
        }
    }
    let held = |&(body, len): &(usize, usize)| {
        &data[body.min(data.len())..body.saturating_add(len).min(data.len())]
    };
    let joined;
    let input: &[u8] = if let [only] = chunks[..] {
        held(&only)
    } else {
        let mut buffer = Vec::new();
        if buffer.try_reserve_exact(total).is_err() {
            return Joined::Unsure;
        }
        for chunk in &chunks {
            buffer.extend_from_slice(held(chunk));
        }
        joined = buffer;
        &joined
    };
    let (used, status) = if let Some(used) = fast_inflate(input, out) {
        INFLATED_OURS.fetch_add(1, Ordering::Relaxed);
        (used, Ok(zlib_rs::Status::StreamEnd))
    } else {
        INFLATED_ZLIB.fetch_add(1, Ordering::Relaxed);
        match inflate_all(input, out) {
            Some(done) => done,
            None => return Joined::Fails,
        }
    };
    match status {
        Ok(zlib_rs::Status::StreamEnd) => {}
        Ok(zlib_rs::Status::Ok) if used < input.len() => {}
        Ok(zlib_rs::Status::Ok) => return Joined::Fails,
        _ => return Joined::Unsure,
    }
    // The chunk holding the last byte read (`used` >= 2: the output is not empty).
    let mut before = 0usize;
    for chunk in &chunks {
        before += held(chunk).len();
        if before >= used {
            let end = chunk.0.saturating_add(chunk.1);
            if end > data.len() {
                return Joined::Unsure;
            }
            return Joined::Done(DataEnd {
                pos: end,
                left_in_chunk: 0,
            });
        }
    }
    Joined::Unsure
}

/// Images whose data [`super::inflate`] inflated, and those left to zlib-rs (small, switched
/// off, or not a whole, valid stream filling the image), counted for tests and diagnostics.
static INFLATED_OURS: AtomicU64 = AtomicU64::new(0);
static INFLATED_ZLIB: AtomicU64 = AtomicU64::new(0);

/// The counts of [`INFLATED_OURS`] and [`INFLATED_ZLIB`], by name.
pub fn inflate_stats() -> [(&'static str, u64); 2] {
    [
        ("ours", INFLATED_OURS.load(Ordering::Relaxed)),
        ("zlib", INFLATED_ZLIB.load(Ordering::Relaxed)),
    ]
}

/// Set to `1` to inflate PNG image data with zlib-rs alone, without [`super::inflate`]'s fast
/// path (for comparisons; read once).
pub const ZLIB_INFLATE_ENV: &str = "SMG_GRPC_PROTO_PNG_ZLIB_INFLATE";

/// [`super::inflate::inflate_exact`] unless [`ZLIB_INFLATE_ENV`] is set: `Some(input bytes
/// used)` only for a stream that fills `out` exactly, ends and checks, which zlib inflates to
/// the same bytes with the same input used.
fn fast_inflate(input: &[u8], out: &mut [u8]) -> Option<usize> {
    static ZLIB_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let zlib_only = *ZLIB_ONLY.get_or_init(|| super::env_switch(ZLIB_INFLATE_ENV));
    // Under 2 KiB of compressed image data (a 24 x 24 RGB photo, a 100 x 100 drawing of a few
    // shapes), zlib-rs is as fast or faster: our tables (2 048 entries a block) cost more to
    // build than so few codes save.
    if zlib_only || input.len() < 2048 {
        return None;
    }
    super::inflate::inflate_exact(input, out)
}

/// zlib-rs inflating all of `input` into `out` in one call (several only past 4 GiB):
/// `(input bytes used, last status)` when it filled `out`, `None` when it did not.
#[allow(clippy::type_complexity)]
fn inflate_all(
    input: &[u8],
    out: &mut [u8],
) -> Option<(usize, Result<zlib_rs::Status, zlib_rs::InflateError>)> {
    let mut z = zlib_rs::Inflate::new(true, 15);
    let (mut used, mut filled) = (0usize, 0usize);
    let status = loop {
        // One call, unless the input or output is longer than zlib's 32-bit counts.
        let (status, read, written) = inflate_step(
            &mut z,
            &input[used..],
            &mut out[filled..],
            zlib_rs::InflateFlush::NoFlush,
        );
        used += read;
        filled += written;
        let progress = read + written > 0;
        match status {
            Ok(zlib_rs::Status::Ok) if progress && filled < out.len() && used < input.len() => {}
            _ => break status,
        }
    };
    (filled == out.len()).then_some((used, status))
}

/// Inflates the image data into all of `out` at once, fed in the same pieces as Pillow's
/// (`load_read`: at most [`MAXBLOCK`] bytes, never across a chunk boundary). `Some` only when the
/// output is filled without any inflate error; `None` for everything else (Pillow's outcome is
/// then worked out by [`inflate_rows`]).
///
/// Why this is Pillow's result whenever it is `Some`: the inflated bytes do not depend on how the
/// output is split, and neither do inflate's errors: zlib (and zlib-rs) made with 15 window bits
/// keep a 32 KiB window whatever the stream header declares, so a distance is refused exactly
/// when it reaches before the start of the stream, however many calls produced the bytes before
/// it. The call that fills the last byte has the rest of the same piece as input in both cases,
/// and goes on through the end of the stream and its adler32 exactly when Pillow's call for the
/// last row does (an adler32 mismatch there is an error here too). A stream that ends at a row
/// boundary before the last row (Pillow's early finish) leaves the output short: `None`.
///
/// Pillow makes a row's call only while its piece has input left. A piece that fills the output
/// with input to spare, or that ends the stream (the adler32 is read after the last output
/// byte), had input left for every row. One that fills it by reading its very last byte, the
/// stream not ended, may have read that byte for an earlier row, the later rows coming from what
/// zlib holds: Pillow writes them only from the next piece's call (and there checks what follows
/// them in the stream), or never when no image data follows. `None`: [`inflate_rows`] decides.
fn inflate_whole(
    data: &[u8],
    first_body: usize,
    first_len: usize,
    out: &mut [u8],
) -> Option<DataEnd> {
    let mut z = zlib_rs::Inflate::new(true, 15);
    let mut filled = 0usize;
    let (mut pos, mut left) = (first_body, first_len);
    loop {
        while left == 0 {
            pos = pos.saturating_add(4);
            match read_header(data, pos) {
                Header::Chunk {
                    cid: b"IDAT" | b"DDAT",
                    body,
                    len,
                } => (pos, left) = (body, len),
                _ => return None,
            }
        }
        let want = left.min(MAXBLOCK);
        let piece = &data[pos.min(data.len())..pos.saturating_add(want).min(data.len())];
        left -= want;
        pos += piece.len();
        if piece.is_empty() {
            return None;
        }
        let (status, used, written) = inflate_step(
            &mut z,
            piece,
            &mut out[filled..],
            zlib_rs::InflateFlush::NoFlush,
        );
        filled += written;
        match status {
            Ok(zlib_rs::Status::Ok) if filled == out.len() && used == piece.len() => return None,
            Ok(zlib_rs::Status::Ok | zlib_rs::Status::StreamEnd) if filled == out.len() => {
                return Some(DataEnd {
                    pos,
                    left_in_chunk: left,
                })
            }
            // Output left over: the whole piece was taken, the next one follows.
            Ok(zlib_rs::Status::Ok) if used == piece.len() => {}
            _ => return None,
        }
    }
}

/// [`inflate_image`] as Pillow does it: for each piece one inflate call per row, into that
/// row's remaining bytes. `out` may hold anything: every byte of it is written (inflated, or
/// zero past a stream that ends early) when this succeeds.
fn inflate_rows(
    data: &[u8],
    first_body: usize,
    first_len: usize,
    layout: &Layout,
    out: &mut [u8],
) -> Result<DataEnd, DecodeError> {
    let mut z = zlib_rs::Inflate::new(true, 15);
    let mut rows = layout
        .passes
        .iter()
        .flat_map(|&(_, bytes, rows)| std::iter::repeat_n(bytes + 1, rows));
    let mut filled = 0usize;
    let mut row_end = rows.next().unwrap_or(0);
    // Past a stream end (or a preset-dictionary request) zlib produces nothing more: Pillow
    // keeps reading until the data runs out and reports a truncated image.
    let mut stuck = false;
    let (mut pos, mut left) = (first_body, first_len);
    loop {
        while left == 0 {
            // The CRC (unchecked), then the next chunk header.
            pos = pos.saturating_add(4);
            match read_header(data, pos) {
                Header::NoLength => return Err(truncated("the image data ends early")),
                Header::BadType(cid) => {
                    return Err(corrupt(format!("broken PNG file (chunk {})", show(cid))))
                }
                Header::Chunk { cid, body, len } => match cid {
                    b"IDAT" | b"DDAT" => (pos, left) = (body, len),
                    b"fdAT" => return Err(corrupt("APNG frame data inside the image data")),
                    _ => {
                        return Err(truncated(format!(
                            "the image data ends at chunk {} before the image is complete",
                            show(cid)
                        )))
                    }
                },
            }
        }
        let want = left.min(MAXBLOCK);
        let piece = &data[pos.min(data.len())..pos.saturating_add(want).min(data.len())];
        left -= want;
        pos += piece.len();
        if piece.is_empty() {
            return Err(truncated("the image data ends early"));
        }
        let mut used = 0usize;
        while !stuck && used < piece.len() {
            let (status, read, written) = inflate_step(
                &mut z,
                &piece[used..],
                &mut out[filled..row_end],
                zlib_rs::InflateFlush::NoFlush,
            );
            used += read;
            filled += written;
            let ended = match status {
                Ok(zlib_rs::Status::Ok) => false,
                Ok(zlib_rs::Status::StreamEnd) => true,
                Err(zlib_rs::InflateError::NeedDict { .. }) => {
                    stuck = true;
                    break;
                }
                Ok(zlib_rs::Status::BufError) => {
                    return Err(corrupt("bad configuration when reading image file"))
                }
                Err(zlib_rs::InflateError::MemError) => {
                    return Err(DecodeError::OutOfMemory {
                        format: FORMAT,
                        bytes: 1 << 16,
                    })
                }
                Err(e) => {
                    return Err(corrupt(format!(
                        "broken data stream when reading image file ({})",
                        z.error_message().unwrap_or(e.as_str())
                    )))
                }
            };
            if filled < row_end {
                // The row needs more input (or, past the stream end, never gets it).
                stuck = ended;
                break;
            }
            match rows.next() {
                Some(bytes) if !ended => row_end += bytes,
                // The last row, or a stream that ends with a row: the image is done, its
                // rows past the stream's end zero (Pillow's image starts cleared).
                _ => {
                    out[filled..].fill(0);
                    return Ok(DataEnd {
                        pos,
                        left_in_chunk: left,
                    });
                }
            }
        }
    }
}

/// `PngImageFile.load_end`: the chunks after the image data, CRCs not checked.
fn load_end(data: &[u8], end: DataEnd, stream: &mut Stream) -> Result<(), DecodeError> {
    stream.after_idat = true;
    let animated = stream.is_animated();
    let mut pos = end.pos.saturating_add(end.left_in_chunk);
    loop {
        pos = pos.saturating_add(4);
        let Header::Chunk { cid, body, len } = read_header(data, pos) else {
            return Ok(());
        };
        match cid {
            b"IEND" => return Ok(()),
            b"fcTL" if animated => return Ok(()),
            b"fdAT" if len < 4 => return Err(corrupt("APNG contains truncated fDAT chunk")),
            b"fdAT" => {
                let Some(seq) = data.get(body..body + 4) else {
                    return Err(truncated("chunk \"fdAT\" is cut short"));
                };
                let seq = be32(seq);
                if stream.seq_num.map(|s| u64::from(s) + 1) != Some(u64::from(seq)) {
                    return Err(corrupt("APNG contains frame sequence errors"));
                }
                stream.seq_num = Some(seq);
            }
            _ => {}
        }
        let Some(s) = body.checked_add(len).and_then(|e| data.get(body..e)) else {
            return Err(truncated(format!("chunk {} is cut short", show(cid))));
        };
        stream.handle(cid, s)?;
        pos = body + len;
    }
}

/// Undoes the PNG row filters in place (Pillow's predictors); the row above the first row of
/// each pass is zero.
fn unfilter(buf: &mut [u8], row_bytes: usize, rows: usize, bpp: usize) -> Result<(), DecodeError> {
    let stride = row_bytes + 1;
    let mut r = 0;
    while r < rows {
        let (before, rest) = buf.split_at_mut(r * stride);
        #[cfg(target_arch = "x86_64")]
        if r > 0 && r + 3 < rows && matches!(bpp, 3 | 4) && four_alike(rest, stride) {
            // Four Paeth rows, or four Average rows, under a row: two pairs side by side (see
            // `rows4_sse2`).
            let prev = &before[(r - 1) * stride + 1..];
            let filter = rest[0];
            let (r0, tail) = rest[..4 * stride].split_at_mut(stride);
            let (r1, tail) = tail.split_at_mut(stride);
            let (r2, r3) = tail.split_at_mut(stride);
            let rows4 = [&mut r0[1..], &mut r1[1..], &mut r2[1..], &mut r3[1..]];
            // SAFETY: the functions' only requirement is the `sse2` target feature, which
            // every x86-64 CPU has (it is enabled in the x86_64 targets' baseline).
            unsafe {
                match (bpp, filter) {
                    (3, PAETH) => rows4_sse2::<3, PAETH>(rows4, prev),
                    (3, _) => rows4_sse2::<3, AVERAGE>(rows4, prev),
                    (_, PAETH) => rows4_sse2::<4, PAETH>(rows4, prev),
                    (_, _) => rows4_sse2::<4, AVERAGE>(rows4, prev),
                }
            }
            r += 4;
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if r > 0 && r + 1 < rows && matches!(bpp, 3 | 4) && side_by_side(rest[0], rest[stride]) {
            // Two Paeth or Average rows under a row: side by side (see `rows2_sse2`).
            let prev = &before[(r - 1) * stride + 1..];
            let (first, second) = rest[..2 * stride].split_at_mut(stride);
            let (f0, f1) = (first[0], second[0]);
            let (first, second) = (&mut first[1..], &mut second[1..]);
            // SAFETY: the functions' only requirement is the `sse2` target feature, which
            // every x86-64 CPU has (it is enabled in the x86_64 targets' baseline).
            unsafe {
                if bpp == 3 {
                    rows2_of::<3>(f0, f1, first, second, prev);
                } else {
                    rows2_of::<4>(f0, f1, first, second, prev);
                }
            }
            r += 2;
            continue;
        }
        let prev = (r > 0).then(|| &before[(r - 1) * stride + 1..]);
        let (filter, cur) = rest[..stride].split_at_mut(1);
        unfilter_row(filter[0], cur, prev, bpp)?;
        r += 1;
    }
    Ok(())
}

/// The filter types of PNG rows that [`rows2_sse2`] and [`rows4_sse2`] run side by side (x86-64
/// only; the tests use them everywhere).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVERAGE: u8 = 3;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const PAETH: u8 = 4;

/// Whether the four rows starting at `rows` (each `stride` bytes, filter type first) go through
/// [`rows4_sse2`]: all Paeth or all Average.
#[cfg(target_arch = "x86_64")]
fn four_alike(rows: &[u8], stride: usize) -> bool {
    let f = rows[0];
    matches!(f, AVERAGE | PAETH) && (1..4).all(|k| rows[k * stride] == f)
}

/// Whether two rows with these filter types go through [`rows2_sse2`]: each is Paeth or
/// Average, whose every pixel depends on the one to its left (Sub, Up and None rows are quick
/// one by one).
#[cfg(target_arch = "x86_64")]
fn side_by_side(f0: u8, f1: u8) -> bool {
    matches!(f0, AVERAGE | PAETH) && matches!(f1, AVERAGE | PAETH)
}

/// The PNG specification's Paeth predictor, as Pillow writes it: the neighbour (left `a`, above
/// `b`, upper left `c`) closest to `a + b - c`, ties going to `a`, then `b`. The reference for
/// [`paeth_branchless`].
#[cfg(test)]
fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let (a16, b16, c16) = (i16::from(a), i16::from(b), i16::from(c));
    let pa = (b16 - c16).abs();
    let pb = (a16 - c16).abs();
    let pc = (a16 + b16 - 2 * c16).abs();
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

/// [`paeth`] rewritten so that it compiles to selects, no branches: with `lo = min(a, b)`,
/// `hi = max(a, b)` and `t = 3c - a - b`, the predictor is `hi` when `t <= lo`, else `lo` when
/// `hi <= t`, else `c`. Equal to [`paeth`] for every input: the test `paeth_formulations_agree`
/// compares all 2^24 of them.
#[inline(always)]
fn paeth_branchless(a: i16, b: i16, c: i16) -> i16 {
    let t = 3 * c - a - b;
    let (lo, hi) = (a.min(b), a.max(b));
    let pick = if hi <= t { lo } else { c };
    if t <= lo {
        hi
    } else {
        pick
    }
}

/// Paeth over whole pixels of `BPP` bytes (every row is a whole number of pixels when
/// `BPP > 1`), the left and upper-left pixels kept in `LANES >= BPP` 16-bit lanes (the spare
/// lanes compute on zeros and are never stored), so that a pixel is one pass of vector
/// operations. The first pixel predicts from above, as Pillow's first `bpp` bytes do.
fn paeth_row<const BPP: usize, const LANES: usize>(cur: &mut [u8], prev: &[u8]) {
    let (mut left, mut upper_left) = ([0i16; LANES], [0i16; LANES]);
    for (px, up) in cur.chunks_exact_mut(BPP).zip(prev.chunks_exact(BPP)) {
        let (mut above, mut raw) = ([0i16; LANES], [0i16; LANES]);
        for k in 0..BPP {
            above[k] = i16::from(up[k]);
            raw[k] = i16::from(px[k]);
        }
        for k in 0..LANES {
            let predicted = paeth_branchless(left[k], above[k], upper_left[k]);
            left[k] = (raw[k] + predicted) & 0xff;
        }
        for k in 0..BPP {
            px[k] = left[k] as u8;
        }
        upper_left = above;
    }
}

/// One pixel of Paeth in SSE2 16-bit lanes: the reconstructed pixel from the left `a`, above
/// `b` and upper-left `c` neighbours and the filtered bytes `raw`, with the same selects as
/// [`paeth_branchless`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn paeth_px_sse2(
    a: std::arch::x86_64::__m128i,
    b: std::arch::x86_64::__m128i,
    c: std::arch::x86_64::__m128i,
    raw: std::arch::x86_64::__m128i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::{
        _mm_add_epi16, _mm_and_si128, _mm_andnot_si128, _mm_cmpgt_epi16, _mm_max_epi16,
        _mm_min_epi16, _mm_or_si128, _mm_set1_epi16, _mm_sub_epi16,
    };
    // `3c - b` does not depend on the left pixel: only one subtraction is on the chain from
    // one pixel to the next.
    let t = _mm_sub_epi16(_mm_sub_epi16(_mm_add_epi16(c, _mm_add_epi16(c, c)), b), a);
    let (lo, hi) = (_mm_min_epi16(a, b), _mm_max_epi16(a, b));
    // `if mask { yes } else { no }` per lane is `(mask & yes) | (!mask & no)`.
    let m = _mm_cmpgt_epi16(hi, t);
    let pick = _mm_or_si128(_mm_and_si128(m, c), _mm_andnot_si128(m, lo));
    let m = _mm_cmpgt_epi16(t, lo);
    let predicted = _mm_or_si128(_mm_and_si128(m, pick), _mm_andnot_si128(m, hi));
    _mm_and_si128(_mm_add_epi16(raw, predicted), _mm_set1_epi16(0xff))
}

/// One pixel of Average in SSE2 16-bit lanes: `raw + (a + b) / 2`, the sum exact in 16 bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn average_px_sse2(
    a: std::arch::x86_64::__m128i,
    b: std::arch::x86_64::__m128i,
    raw: std::arch::x86_64::__m128i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::{_mm_add_epi16, _mm_and_si128, _mm_set1_epi16, _mm_srli_epi16};
    let predicted = _mm_srli_epi16::<1>(_mm_add_epi16(a, b));
    _mm_and_si128(_mm_add_epi16(raw, predicted), _mm_set1_epi16(0xff))
}

/// One pixel of filter `F` ([`PAETH`] or [`AVERAGE`]) in SSE2 16-bit lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn px_sse2<const F: u8>(
    a: std::arch::x86_64::__m128i,
    b: std::arch::x86_64::__m128i,
    c: std::arch::x86_64::__m128i,
    raw: std::arch::x86_64::__m128i,
) -> std::arch::x86_64::__m128i {
    if F == PAETH {
        paeth_px_sse2(a, b, c, raw)
    } else {
        average_px_sse2(a, b, raw)
    }
}

/// `BPP` (3 or 4) bytes as the low 16-bit lanes of an SSE2 register, and back.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn load_px<const BPP: usize>(bytes: &[u8]) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::{_mm_cvtsi32_si128, _mm_setzero_si128, _mm_unpacklo_epi8};
    let mut word = [0u8; 4];
    word[..BPP].copy_from_slice(bytes);
    _mm_unpacklo_epi8(
        _mm_cvtsi32_si128(i32::from_le_bytes(word)),
        _mm_setzero_si128(),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn store_px<const BPP: usize>(px: std::arch::x86_64::__m128i, bytes: &mut [u8]) {
    use std::arch::x86_64::{_mm_cvtsi128_si32, _mm_packus_epi16};
    let word = _mm_cvtsi128_si32(_mm_packus_epi16(px, px)).to_le_bytes();
    bytes.copy_from_slice(&word[..BPP]);
}

/// [`paeth_row`] (`F` = [`PAETH`]) or [`average_row`] (`F` = [`AVERAGE`]) for 3- and 4-byte
/// pixels with SSE2: a pixel's samples in 16-bit lanes (the fourth computes on zeros for RGB
/// and is not stored). No pointers: bytes go in and out through `i32`s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn row_sse2<const BPP: usize, const F: u8>(cur: &mut [u8], prev: &[u8]) {
    use std::arch::x86_64::_mm_setzero_si128;
    let (mut left, mut upper_left) = (_mm_setzero_si128(), _mm_setzero_si128());
    for (px, up) in cur.chunks_exact_mut(BPP).zip(prev.chunks_exact(BPP)) {
        let above = load_px::<BPP>(up);
        left = px_sse2::<F>(left, above, upper_left, load_px::<BPP>(px));
        store_px::<BPP>(left, px);
        upper_left = above;
    }
}

/// Two consecutive rows at once, filtered with `F0` and `F1` ([`PAETH`] or [`AVERAGE`]):
/// `first` under `prev`, `second` under `first`. Each pixel depends on the one to its left (a
/// chain of about ten operations for Paeth, four for Average), but the second row's pixel needs
/// only the first row's pixels above it. So one register holds a pixel of each row, the first
/// row's pixel `s` in lanes 0-3 and the second row's pixel `s - 1` in lanes 4-7, and one pass of
/// vector operations does both: the second row's `above` is the first row's previous result,
/// its `upper left` the first row's `above` one step earlier.
///
/// For 3-byte pixels a pixel is loaded and stored as 4 bytes but at the end of a row: a store
/// overwrites the first byte of the next pixel, whose filtered bytes were loaded before it, and
/// that pixel's own store then writes the byte again, unfiltered.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn rows2_sse2<const BPP: usize, const F0: u8, const F1: u8>(
    first: &mut [u8],
    second: &mut [u8],
    prev: &[u8],
) {
    use std::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_srli_si128, _mm_unpacklo_epi64};
    let n = first.len().min(second.len()).min(prev.len()) / BPP;
    if n < 3 {
        // Too short to share loads: one row, then the other.
        row_sse2::<BPP, F0>(&mut first[..n * BPP], &prev[..n * BPP]);
        row_sse2::<BPP, F1>(&mut second[..n * BPP], &first[..n * BPP]);
        return;
    }
    // Pixel `px` of `row` as 4 bytes, or as exactly `BPP` where a 4th would lie past the row.
    let load = |row: &[u8], px: usize| -> __m128i {
        if px + 1 < n {
            load_px::<4>(&row[px * BPP..px * BPP + 4])
        } else {
            load_px::<BPP>(&row[px * BPP..px * BPP + BPP])
        }
    };
    // One step: the two pixels from their left (`res`), above and upper-left neighbours.
    let step = |res: __m128i, upper_left: __m128i, above: __m128i, raw: __m128i| {
        let b = _mm_unpacklo_epi64(above, res);
        (pixel_pair_sse2::<F0, F1>(res, b, upper_left, raw), b)
    };
    let zero = _mm_setzero_si128();
    // s = 0: the second row's lanes compute on zeros (its pixel -1, left of its first).
    let (mut res, mut upper_left) = step(zero, zero, load(prev, 0), load(first, 0));
    let (mut raw0, mut raw1) = (load(first, 1), load(second, 0));
    store_px::<BPP>(res, &mut first[..BPP]);
    for s in 1..n - 1 {
        (res, upper_left) = step(
            res,
            upper_left,
            load(prev, s),
            _mm_unpacklo_epi64(raw0, raw1),
        );
        // The next pixels' bytes, before these 4-byte stores overwrite the first of them.
        (raw0, raw1) = (load(first, s + 1), load(second, s));
        store_px::<4>(res, &mut first[s * BPP..s * BPP + 4]);
        store_px::<4>(
            _mm_srli_si128::<8>(res),
            &mut second[(s - 1) * BPP..(s - 1) * BPP + 4],
        );
    }
    // s = n - 1: the first row's last pixel, exactly `BPP` bytes.
    let s = n - 1;
    (res, upper_left) = step(
        res,
        upper_left,
        load(prev, s),
        _mm_unpacklo_epi64(raw0, raw1),
    );
    raw1 = load(second, s);
    store_px::<BPP>(res, &mut first[s * BPP..s * BPP + BPP]);
    store_px::<4>(
        _mm_srli_si128::<8>(res),
        &mut second[(s - 1) * BPP..(s - 1) * BPP + 4],
    );
    // s = n: the second row's last pixel (the first row's lanes compute on zeros, unstored).
    (res, _) = step(res, upper_left, zero, _mm_unpacklo_epi64(zero, raw1));
    store_px::<BPP>(
        _mm_srli_si128::<8>(res),
        &mut second[s * BPP..s * BPP + BPP],
    );
}

/// [`rows2_sse2`] for the filter types `f0` and `f1` (each [`PAETH`] or [`AVERAGE`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn rows2_of<const BPP: usize>(f0: u8, f1: u8, first: &mut [u8], second: &mut [u8], prev: &[u8]) {
    match (f0, f1) {
        (PAETH, PAETH) => rows2_sse2::<BPP, PAETH, PAETH>(first, second, prev),
        (PAETH, _) => rows2_sse2::<BPP, PAETH, AVERAGE>(first, second, prev),
        (_, PAETH) => rows2_sse2::<BPP, AVERAGE, PAETH>(first, second, prev),
        (_, _) => rows2_sse2::<BPP, AVERAGE, AVERAGE>(first, second, prev),
    }
}

/// Four consecutive rows filtered with `F` ([`PAETH`] or [`AVERAGE`]), each under the one
/// before (`rows[0]` under `prev`), as two register pairs like [`rows2_sse2`]'s: step `s` does
/// pixel `s` of row 0 and `s - 1` of row 1 in one register, `s - 2` of row 2 and `s - 3` of
/// row 3 in the other. The second pair's `above` is the first pair's row-1 result of the step
/// before, so the pairs' two chains of dependent operations run side by side, and a step does
/// four pixels in about the time [`rows2_sse2`] does two.
///
/// A pixel left of a row's first (or past its last) computes on zeros and is not stored: at
/// the start its zero result is the left and upper-left neighbour the first pixel needs, and no
/// stored pixel depends on one past a row's end. As in [`rows2_sse2`], a step's stores come
/// after the next step's loads, so a 4-byte store over the next pixel's first byte lands after
/// that byte was read, and a row's last pixel is stored as exactly `BPP` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn rows4_sse2<const BPP: usize, const F: u8>(rows: [&mut [u8]; 4], prev: &[u8]) {
    use std::arch::x86_64::{
        __m128i, _mm_castpd_si128, _mm_castsi128_pd, _mm_setzero_si128, _mm_shuffle_pd,
        _mm_srli_si128, _mm_unpacklo_epi64,
    };
    let n = rows
        .iter()
        .map(|r| r.len())
        .min()
        .unwrap_or(0)
        .min(prev.len())
        / BPP;
    let [r0, r1, r2, r3] = rows;
    // A row's pixel `step - lag` (`minus_lag` is `0 - lag`, wrapping) as 4 bytes (exactly `BPP`
    // for the row's last), zeros outside the row.
    let load = |row: &[u8], step: usize, minus_lag: usize| -> __m128i {
        let p = step.wrapping_add(minus_lag);
        if p >= n {
            _mm_setzero_si128()
        } else if p + 1 < n {
            load_px::<4>(&row[p * BPP..p * BPP + 4])
        } else {
            load_px::<BPP>(&row[p * BPP..p * BPP + BPP])
        }
    };
    // The same pixel stored (nothing outside the row).
    let store = |px: __m128i, row: &mut [u8], step: usize, minus_lag: usize| {
        let p = step.wrapping_add(minus_lag);
        if p < n {
            if p + 1 < n {
                store_px::<4>(px, &mut row[p * BPP..p * BPP + 4]);
            } else {
                store_px::<BPP>(px, &mut row[p * BPP..p * BPP + BPP]);
            }
        }
    };
    let lag = |k: usize| 0usize.wrapping_sub(k);
    let zero = _mm_setzero_si128();
    let (mut res_a, mut res_b, mut up_left_a, mut up_left_b) = (zero, zero, zero, zero);
    let mut raw_a = _mm_unpacklo_epi64(load(r0, 0, 0), zero);
    let mut raw_b = zero;
    // The `above` pixels of a step's two pairs, given row 0's: row 1's is the row-0 result of
    // the step before; row 2's the row-1 result of the step before (the high half of `res_a`),
    // row 3's row 2's.
    let above = |res_a: __m128i, res_b: __m128i, above: __m128i| {
        let b_a = _mm_unpacklo_epi64(above, res_a);
        let b_b = _mm_castpd_si128(_mm_shuffle_pd::<0b01>(
            _mm_castsi128_pd(res_a),
            _mm_castsi128_pd(res_b),
        ));
        (b_a, b_b)
    };
    let mut s = 0;
    while s < n + 3 {
        // Steps 3..n-2 have all four pixels inside their rows, and none of them or of the next
        // step's is a row's last: no bounds to check but the slices'.
        if (3..n.saturating_sub(2)).contains(&s) {
            let end = n - 2;
            while s < end {
                let (b_a, b_b) = above(res_a, res_b, load_px::<4>(&prev[s * BPP..s * BPP + 4]));
                res_a = pixel_pair_sse2::<F, F>(res_a, b_a, up_left_a, raw_a);
                res_b = pixel_pair_sse2::<F, F>(res_b, b_b, up_left_b, raw_b);
                (up_left_a, up_left_b) = (b_a, b_b);
                let t = s + 1;
                let px = |row: &[u8], p: usize| load_px::<4>(&row[p * BPP..p * BPP + 4]);
                (raw_a, raw_b) = (
                    _mm_unpacklo_epi64(px(r0, t), px(r1, t - 1)),
                    _mm_unpacklo_epi64(px(r2, t - 2), px(r3, t - 3)),
                );
                store_px::<4>(res_a, &mut r0[s * BPP..s * BPP + 4]);
                store_px::<4>(
                    _mm_srli_si128::<8>(res_a),
                    &mut r1[(s - 1) * BPP..(s - 1) * BPP + 4],
                );
                store_px::<4>(res_b, &mut r2[(s - 2) * BPP..(s - 2) * BPP + 4]);
                store_px::<4>(
                    _mm_srli_si128::<8>(res_b),
                    &mut r3[(s - 3) * BPP..(s - 3) * BPP + 4],
                );
                s += 1;
            }
            continue;
        }
        let (b_a, b_b) = above(res_a, res_b, load(prev, s, 0));
        res_a = pixel_pair_sse2::<F, F>(res_a, b_a, up_left_a, raw_a);
        res_b = pixel_pair_sse2::<F, F>(res_b, b_b, up_left_b, raw_b);
        (up_left_a, up_left_b) = (b_a, b_b);
        let t = s + 1;
        (raw_a, raw_b) = (
            _mm_unpacklo_epi64(load(r0, t, 0), load(r1, t, lag(1))),
            _mm_unpacklo_epi64(load(r2, t, lag(2)), load(r3, t, lag(3))),
        );
        store(res_a, r0, s, 0);
        store(_mm_srli_si128::<8>(res_a), r1, s, lag(1));
        store(res_b, r2, s, lag(2));
        store(_mm_srli_si128::<8>(res_b), r3, s, lag(3));
        s += 1;
    }
}

/// One step of [`rows2_sse2`]: lanes 0-3 filtered with `F0`, lanes 4-7 with `F1`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
#[inline]
fn pixel_pair_sse2<const F0: u8, const F1: u8>(
    a: std::arch::x86_64::__m128i,
    b: std::arch::x86_64::__m128i,
    c: std::arch::x86_64::__m128i,
    raw: std::arch::x86_64::__m128i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::{_mm_and_si128, _mm_andnot_si128, _mm_or_si128, _mm_set_epi64x};
    if F0 == F1 {
        return px_sse2::<F0>(a, b, c, raw);
    }
    let high = _mm_set_epi64x(-1, 0);
    let (low_px, high_px) = (px_sse2::<F0>(a, b, c, raw), px_sse2::<F1>(a, b, c, raw));
    _mm_or_si128(_mm_andnot_si128(high, low_px), _mm_and_si128(high, high_px))
}

/// Sub (and Paeth with no row above) over whole pixels of `BPP` bytes, the left pixel kept in
/// registers.
fn sub_row<const BPP: usize>(cur: &mut [u8]) {
    let mut left = [0u8; BPP];
    for px in cur.chunks_exact_mut(BPP) {
        for k in 0..BPP {
            px[k] = px[k].wrapping_add(left[k]);
            left[k] = px[k];
        }
    }
}

/// Average over whole pixels of `BPP` bytes; `prev` is the row above (zero for the first row of
/// a pass). `(l + u) / 2` is computed in 8 bits as `(l & u) + ((l ^ u) >> 1)`.
fn average_row<const BPP: usize>(cur: &mut [u8], prev: Option<&[u8]>) {
    let mut left = [0u8; BPP];
    match prev {
        Some(prev) => {
            for (px, up) in cur.chunks_exact_mut(BPP).zip(prev.chunks_exact(BPP)) {
                for k in 0..BPP {
                    let (l, u) = (left[k], up[k]);
                    px[k] = px[k].wrapping_add((l & u) + ((l ^ u) >> 1));
                    left[k] = px[k];
                }
            }
        }
        None => {
            for px in cur.chunks_exact_mut(BPP) {
                for k in 0..BPP {
                    px[k] = px[k].wrapping_add(left[k] >> 1);
                    left[k] = px[k];
                }
            }
        }
    }
}

/// Calls `$kernel::<BPP>` for the bytes per pixel PNG rows have (1 for sub-byte samples).
macro_rules! per_bpp {
    ($bpp:expr, $kernel:ident ( $($arg:expr),* )) => {
        match $bpp {
            1 => $kernel::<1>($($arg),*),
            2 => $kernel::<2>($($arg),*),
            3 => $kernel::<3>($($arg),*),
            4 => $kernel::<4>($($arg),*),
            6 => $kernel::<6>($($arg),*),
            _ => $kernel::<8>($($arg),*),
        }
    };
}

/// Undoes one row's filter in place; `prev` is the unfiltered row above (`None` for the first
/// row of a pass, which Pillow treats as zero). `bpp` is 1, 2, 3, 4, 6 or 8, and a row is a
/// whole number of `bpp`-byte pixels whenever `bpp > 1`.
fn unfilter_row(
    filter: u8,
    cur: &mut [u8],
    prev: Option<&[u8]>,
    bpp: usize,
) -> Result<(), DecodeError> {
    let n = cur.len();
    match (filter, prev) {
        (0, _) | (2, None) => {}
        (1, _) | (4, None) => per_bpp!(bpp, sub_row(cur)),
        (2, Some(prev)) => {
            for (c, &p) in cur.iter_mut().zip(&prev[..n]) {
                *c = c.wrapping_add(p);
            }
        }
        // SAFETY: the function's only requirement is the `sse2` target feature, which every
        // x86-64 CPU has (it is enabled in the x86_64 targets' baseline).
        #[cfg(target_arch = "x86_64")]
        (3, Some(prev)) if bpp == 3 => unsafe { row_sse2::<3, AVERAGE>(cur, &prev[..n]) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        (3, Some(prev)) if bpp == 4 => unsafe { row_sse2::<4, AVERAGE>(cur, &prev[..n]) },
        (3, prev) => per_bpp!(bpp, average_row(cur, prev.map(|p| &p[..n]))),
        (4, Some(prev)) => match bpp {
            1 => paeth_row::<1, 1>(cur, &prev[..n]),
            2 => paeth_row::<2, 4>(cur, &prev[..n]),
            // SAFETY: the function's only requirement is the `sse2` target feature, which every
            // x86-64 CPU has (it is enabled in the x86_64 targets' baseline).
            #[cfg(target_arch = "x86_64")]
            3 => unsafe { row_sse2::<3, PAETH>(cur, &prev[..n]) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            4 => unsafe { row_sse2::<4, PAETH>(cur, &prev[..n]) },
            #[cfg(not(target_arch = "x86_64"))]
            3 => paeth_row::<3, 4>(cur, &prev[..n]),
            #[cfg(not(target_arch = "x86_64"))]
            4 => paeth_row::<4, 4>(cur, &prev[..n]),
            6 => paeth_row::<6, 8>(cur, &prev[..n]),
            _ => paeth_row::<8, 8>(cur, &prev[..n]),
        },
        (f, _) => return Err(corrupt(format!("unknown row filter type {f}"))),
    }
    Ok(())
}

/// Unfilters every pass and, for Adam7, spreads the passes over full rows. Returns the image
/// rows with a leading (ignored) byte each: `height` rows of `line + 1` bytes.
fn reconstruct(
    mut inflated: Vec<u8>,
    layout: &Layout,
    width: u32,
    height: u32,
    interlaced: bool,
) -> Result<Vec<u8>, DecodeError> {
    let bpp = layout.bits_pp.div_ceil(8);
    if !interlaced {
        unfilter(&mut inflated, layout.line, height as usize, bpp)?;
        return Ok(inflated);
    }
    let stride = layout.line + 1;
    let mut image: Vec<u8> =
        zeroed(stride * height as usize).map_err(|bytes| DecodeError::OutOfMemory {
            format: FORMAT,
            bytes,
        })?;
    let w = width as usize;
    let mut at = 0;
    for &(pass, bytes, rows) in &layout.passes {
        let (y0, x0, dy, dx) = ADAM7[pass];
        let size = (bytes + 1) * rows;
        let part = &mut inflated[at..at + size];
        at += size;
        unfilter(part, bytes, rows, bpp)?;
        for (r, src) in part.chunks_exact(bytes + 1).enumerate() {
            let dst = &mut image[(y0 + r * dy) * stride + 1..][..layout.line];
            let src = &src[1..];
            for (i, x) in (x0..w).step_by(dx).enumerate() {
                if layout.bits_pp >= 8 {
                    let n = layout.bits_pp / 8;
                    dst[x * n..(x + 1) * n].copy_from_slice(&src[i * n..(i + 1) * n]);
                } else {
                    let b = layout.bits_pp;
                    let mask = ((1u16 << b) - 1) as u8;
                    let v = (src[i * b / 8] >> (8 - b - (i * b) % 8)) & mask;
                    let shift = 8 - b - (x * b) % 8;
                    dst[x * b / 8] |= v << shift;
                }
            }
        }
    }
    Ok(image)
}

/// Decodes a PNG file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    if data.len() < 16 {
        return Err(truncated(format!(
            "{} bytes, the first chunk is incomplete",
            data.len()
        )));
    }
    // A quick look at a leading IHDR: refuse what Pillow cannot open before reading further.
    if let Some(ihdr) = data
        .get(8..29)
        .filter(|h| &h[4..8] == b"IHDR" && be32(h) >= 13)
    {
        let (bits, color) = (ihdr[16], ihdr[17]);
        if !known_mode(bits, color) {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("bit depth {bits} with colour type {color}"),
            ));
        }
        check_size(
            FORMAT,
            u64::from(be32(&ihdr[8..])),
            u64::from(be32(&ihdr[12..])),
            limit,
        )?;
    }
    let (mut stream, body, len) = open(data)?;
    let Some((bits, color)) = stream.mode else {
        return Err(corrupt("no valid IHDR chunk: cannot identify the image"));
    };
    let (width, height) = (stream.width, stream.height);
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    let channels = match color {
        2 => 3,
        4 => 2,
        6 => 4,
        _ => 1,
    };
    let oom = || DecodeError::OutOfMemory {
        format: FORMAT,
        bytes: u64::from(width) * u64::from(height) * 8,
    };
    let layout = Layout::new(
        width,
        height,
        usize::from(bits) * channels,
        stream.interlaced,
    )
    .ok_or_else(oom)?;
    // Recycled when a kept buffer fits (no page faults of fresh memory): when `inflate_image`
    // succeeds it has written every byte (the rows past a stream that ends early as zeros), so
    // stale bytes are never read.
    let mut inflated: Vec<u8> =
        crate::memory::overwritable_bytes(layout.total).map_err(|bytes| {
            DecodeError::OutOfMemory {
                format: FORMAT,
                bytes,
            }
        })?;
    let end = inflate_image(data, body, len, &layout, &mut inflated)?;
    let rows = reconstruct(inflated, &layout, width, height, stream.interlaced)?;
    load_end(data, end, &mut stream)?;
    let image = to_mode_image(rows, layout.line + 1, width, height, bits, color, &stream)?;
    // Pillow's getexif: info["exif"], else `bytes.fromhex` of the raw profile (a ValueError
    // when it is not hex).
    let (exif, exif_error) = match stream.exif {
        Some(exif) => (Some(exif), None),
        None => match stream.raw_profile_exif.as_deref().map(raw_profile) {
            Some(Err(())) => (None, Some(super::exif::ExifError::Raises)),
            Some(Ok(bytes)) => (Some(bytes), None),
            None => (None, None),
        },
    };
    let exif_error = exif_error.or_else(|| {
        exif.as_deref()
            .filter(|e| super::exif::pillow_refuses(e))
            .map(|_| super::exif::ExifError::Raises)
    });
    Ok(Decoded {
        image,
        exif,
        xmp: stream.xmp,
        exif_error,
    })
}

/// `bytes.fromhex("".join(value.split("\n")[3:]))` of a `Raw profile type exif` chunk: hex
/// digit pairs, whitespace allowed between pairs only; `Err` where Python raises `ValueError`.
fn raw_profile(value: &[u8]) -> Result<Vec<u8>, ()> {
    let hex: Vec<u8> = value
        .split(|&b| b == b'\n')
        .skip(3)
        .flatten()
        .copied()
        .collect();
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8).ok_or(());
    let mut out = Vec::with_capacity(hex.len() / 2);
    let mut i = 0;
    while i < hex.len() {
        if matches!(hex[i], b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c') {
            i += 1;
            continue;
        }
        let high = digit(hex[i])?;
        let low = digit(*hex.get(i + 1).ok_or(())?)?;
        out.push(high << 4 | low);
        i += 2;
    }
    Ok(out)
}

/// Drops the filter byte that starts each of the `rows` rows of `stride` bytes, in place: the
/// rows' samples, packed.
fn without_filter_bytes(mut raw: Vec<u8>, stride: usize, rows: usize) -> Vec<u8> {
    let line = stride - 1;
    for r in 0..rows {
        raw.copy_within(r * stride + 1..(r + 1) * stride, r * line);
    }
    raw.truncate(rows * line);
    raw
}

fn to_mode_image(
    raw: Vec<u8>,
    stride: usize,
    width: u32,
    height: u32,
    bits: u8,
    color: u8,
    stream: &Stream,
) -> Result<ModeImage, DecodeError> {
    let (w, h) = (width as usize, height as usize);
    let n = w * h;
    let alloc = |len: usize| {
        zeroed::<u8>(len).map_err(|bytes| DecodeError::OutOfMemory {
            format: FORMAT,
            bytes,
        })
    };
    // Each row starts with a byte that is not a sample (the filter type).
    let rows = || raw.chunks_exact(stride).take(h).map(|r| &r[1..]);
    let transparency = stream.transparency.clone();
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
            (Pixels::I16(v), transparency)
        }
        (0, _) | (3, _) => {
            let mut v = if bits == 8 {
                without_filter_bytes(raw, stride, h)
            } else {
                let mut v = alloc(n)?;
                for (dst, row) in v.chunks_exact_mut(w).zip(rows()) {
                    unpack_bits(row, bits, dst);
                }
                v
            };
            if color == 3 {
                let palette = Palette::from_packed(
                    stream.palette.as_deref().unwrap_or_default(),
                    3,
                    [0, 1, 2],
                );
                if let Some(Transparency::PaletteAlphas(t)) = &transparency {
                    if t.len() > 256 {
                        return Err(corrupt(format!("tRNS has {} entries (max 256)", t.len())));
                    }
                }
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
                if bits == 1 {
                    (Pixels::Bilevel(v), transparency)
                } else {
                    (Pixels::L(v), transparency)
                }
            }
        }
        (2, 8) => (
            Pixels::Rgb(without_filter_bytes(raw, stride, h)),
            transparency,
        ),
        (6, 8) => (Pixels::Rgba(without_filter_bytes(raw, stride, h)), None),
        // 16-bit RGB: the most significant byte of each sample.
        (2, _) => {
            let mut v = alloc(n * 3)?;
            for (dst, row) in v.chunks_exact_mut(w * 3).zip(rows()) {
                for (d, s) in dst.chunks_exact_mut(3).zip(row.chunks_exact(6)) {
                    d.copy_from_slice(&[s[0], s[2], s[4]]);
                }
            }
            (Pixels::Rgb(v), transparency)
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
        // 16-bit RGBA.
        _ => {
            let mut v = alloc(n * 4)?;
            for (dst, row) in v.chunks_exact_mut(w * 4).zip(rows()) {
                for (d, s) in dst.chunks_exact_mut(4).zip(row.chunks_exact(8)) {
                    d.copy_from_slice(&[s[0], s[2], s[4], s[6]]);
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
/// Python's `$` also matches before a final newline, so one trailing `\n` is allowed.
fn simple_palette_index(t: &[u8]) -> Option<u8> {
    let t = match t.split_last() {
        Some((b'\n', rest)) if rest.contains(&0) => rest,
        _ => t,
    };
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
            for (samples, &byte) in dst.chunks_mut(per_byte).zip(row) {
                for (j, d) in samples.iter_mut().enumerate() {
                    let shift = 8 - usize::from(bits) * (j + 1);
                    *d = (byte >> shift) & mask;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `inflate_text` as it was: one output buffer of the whole limit, cleared up front.
    fn inflate_text_one_buffer(data: &[u8]) -> Result<Option<Vec<u8>>, DecodeError> {
        let mut z = zlib_rs::Inflate::new(true, 15);
        let mut out = vec![0u8; MAX_TEXT_CHUNK];
        let (mut used_in, mut used_out) = (0, 0);
        loop {
            let (status, read, written) = inflate_step(
                &mut z,
                &data[used_in..],
                &mut out[used_out..],
                zlib_rs::InflateFlush::SyncFlush,
            );
            used_in += read;
            used_out += written;
            match status {
                Err(_) => return Ok(None),
                Ok(zlib_rs::Status::StreamEnd) => break,
                Ok(_) if used_in == data.len() => break,
                Ok(_) if used_out == out.len() => return Err(corrupt("too large")),
                Ok(zlib_rs::Status::BufError) => break,
                Ok(zlib_rs::Status::Ok) => {}
            }
        }
        out.truncate(used_out);
        Ok(Some(out))
    }

    fn zlib_compress(data: &[u8], level: i32) -> Vec<u8> {
        let mut out = vec![0u8; data.len() + data.len() / 100 + 64];
        let config = zlib_rs::DeflateConfig::new(level);
        let (done, rc) = zlib_rs::compress_slice(&mut out, data, config);
        assert_eq!(rc as i32, 0, "compress failed");
        done.to_vec()
    }

    #[test]
    fn text_chunks_inflate_into_a_growing_buffer_as_into_one_of_the_limit() {
        // Texts on both sides of each doubling and of the limit, whole, cut short, damaged
        // and with bytes after their end: the same text, the same "ignored" and the same
        // error as the one-buffer loop.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|i| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Half runs, half noise: both literals and long matches.
                    if (i / 512) % 2 == 0 {
                        b'a' + (i % 7) as u8
                    } else {
                        seed as u8
                    }
                })
                .collect()
        };
        let limit = MAX_TEXT_CHUNK;
        let mut checked = 0;
        for n in [
            0,
            1,
            100,
            4095,
            4096,
            4097,
            8192,
            70_000,
            limit - 1,
            limit,
            limit + 1,
            3 * limit,
        ] {
            let text = noise(n);
            for level in [0, 1, 9] {
                let whole = zlib_compress(&text, level);
                let mut cases = vec![whole.clone(), whole[..whole.len() / 2].to_vec()];
                let mut after = whole.clone();
                after.extend_from_slice(b"trailing bytes");
                cases.push(after);
                for at in [2, whole.len() / 3, whole.len() - 3] {
                    let mut bad = whole.clone();
                    if let Some(b) = bad.get_mut(at) {
                        *b ^= 0x55;
                    }
                    cases.push(bad);
                }
                for case in &cases {
                    let ours = inflate_text(case);
                    let theirs = inflate_text_one_buffer(case);
                    match (&ours, &theirs) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "text of {n} bytes, level {level}"),
                        (Err(_), Err(_)) => {}
                        _ => {
                            panic!("text of {n} bytes, level {level}: {ours:?} against {theirs:?}")
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 12 * 3 * 6);
        // The whole text back, and the limit still refused.
        let text = noise(70_000);
        assert_eq!(
            inflate_text(&zlib_compress(&text, 6)).unwrap().unwrap(),
            text
        );
        assert!(inflate_text(&zlib_compress(&noise(limit + 1), 6)).is_err());
    }

    #[test]
    fn a_small_text_chunk_takes_a_small_buffer() {
        // The buffer grows with the text: thousands of tiny chunks must not clear a
        // megabyte each.
        let text = inflate_text(&zlib_compress(b"an ICC profile, say", 6))
            .unwrap()
            .unwrap();
        assert_eq!(text, b"an ICC profile, say");
        assert!(
            text.capacity() <= TEXT_START,
            "{} bytes kept",
            text.capacity()
        );
        let big = vec![7u8; 100_000];
        let text = inflate_text(&zlib_compress(&big, 6)).unwrap().unwrap();
        assert_eq!(text, big);
        assert!(
            text.capacity() < 2 * big.len(),
            "{} bytes kept",
            text.capacity()
        );
    }

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
            Ok(b"Exif\x00\x00".to_vec())
        );
        assert_eq!(raw_profile(b"\nexif\n"), Ok(vec![]));
        assert_eq!(raw_profile(b"\nexif"), Ok(vec![]));
        assert_eq!(raw_profile(b"\n\n\nzz"), Err(()));
        assert_eq!(raw_profile(b"\n\n\n4 5"), Err(()));
        assert_eq!(raw_profile(b"\n\n\n45 46"), Ok(b"EF".to_vec()));
    }

    #[test]
    fn chunk_types_are_word_characters() {
        assert!(is_cid(b"IDAT"));
        assert!(is_cid(b"a_9Z"));
        assert!(!is_cid(b"ID T"));
        assert!(!is_cid(b"IDA"));
    }

    #[test]
    fn adam7_layout() {
        // 3x3 gray 8-bit: passes 2 and 3 start at column 4 and row 4, so they are empty.
        let l = Layout::new(3, 3, 8, true).unwrap();
        let shapes: Vec<_> = l.passes.iter().map(|&(p, b, r)| (p, b, r)).collect();
        assert_eq!(
            shapes,
            [(0, 1, 1), (3, 1, 1), (4, 2, 1), (5, 1, 2), (6, 3, 1)]
        );
        assert_eq!(l.total, 2 + 2 + 3 + 4 + 4);
        let plain = Layout::new(3, 2, 1, false).unwrap();
        assert_eq!((plain.line, plain.total), (1, 4));
    }

    #[test]
    fn paeth_formulations_agree() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for c in 0..=255u8 {
                    let (a16, b16, c16) = (i16::from(a), i16::from(b), i16::from(c));
                    let fast = paeth_branchless(a16, b16, c16);
                    assert_eq!(fast, i16::from(paeth(a, b, c)), "{a} {b} {c}");
                }
            }
        }
    }

    /// [`unfilter_row`] with the portable kernels only (no SSE2): the reference for the SIMD
    /// paths.
    fn unfilter_row_portable(filter: u8, cur: &mut [u8], prev: Option<&[u8]>, bpp: usize) {
        let n = cur.len();
        match (filter, prev) {
            (4, Some(prev)) => match bpp {
                1 => paeth_row::<1, 1>(cur, &prev[..n]),
                2 => paeth_row::<2, 4>(cur, &prev[..n]),
                3 => paeth_row::<3, 4>(cur, &prev[..n]),
                4 => paeth_row::<4, 4>(cur, &prev[..n]),
                6 => paeth_row::<6, 8>(cur, &prev[..n]),
                _ => paeth_row::<8, 8>(cur, &prev[..n]),
            },
            (3, prev) => per_bpp!(bpp, average_row(cur, prev.map(|p| &p[..n]))),
            _ => unfilter_row(filter, cur, prev, bpp).unwrap(),
        }
    }

    #[cfg(target_arch = "x86_64")]
    /// `buf` (rows of `stride` bytes, filter type first) unfiltered by the portable kernels
    /// one row at a time: what `unfilter` must give.
    fn unfiltered_one_by_one(buf: &[u8], stride: usize, rows: usize, bpp: usize) -> Vec<u8> {
        let mut out = buf.to_vec();
        for r in 0..rows {
            let (before, rest) = out.split_at_mut(r * stride);
            let prev = (r > 0).then(|| &before[(r - 1) * stride + 1..]);
            let (filter, cur) = rest[..stride].split_at_mut(1);
            unfilter_row_portable(filter[0], cur, prev, bpp);
        }
        out
    }

    /// Pseudo-random bytes (a fixed LCG from `seed`), one in `small / 256` of them below
    /// `mask + 1`, so that runs of equal neighbours (Paeth's ties) occur.
    fn tie_prone_bytes(seed: u32, small: u8, mask: u8) -> impl FnMut() -> u8 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let v = (state >> 24) as u8;
            if v < small {
                v & mask
            } else {
                v
            }
        }
    }

    #[test]
    fn paeth_and_average_row_pairs_equal_rows_one_by_one() {
        // Random filtered images, mostly Paeth and Average rows (so every pair of the two and
        // odd rows occur), through `unfilter` and through the portable kernels one row at a
        // time.
        let mut state = 0x1234_5678u32;
        let mut next = || {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            (state >> 24) as u8
        };
        for bpp in [1usize, 2, 3, 4, 6, 8] {
            for (width, rows) in [
                (1usize, 1usize),
                (1, 7),
                (2, 6),
                (3, 4),
                (5, 2),
                (17, 9),
                (64, 33),
            ] {
                let row_bytes = width * bpp;
                let stride = row_bytes + 1;
                let mut buf: Vec<u8> = (0..stride * rows).map(|_| next()).collect();
                for r in 0..rows {
                    let f = next();
                    buf[r * stride] = match f {
                        0..100 => PAETH,
                        100..200 => AVERAGE,
                        _ => f % 5,
                    };
                }
                let want = unfiltered_one_by_one(&buf, stride, rows, bpp);
                unfilter(&mut buf, row_bytes, rows, bpp).unwrap();
                assert_eq!(buf, want, "bpp {bpp}, {width} x {rows}");
            }
        }
    }

    #[test]
    fn runs_of_four_alike_rows_equal_rows_one_by_one() {
        // Images whose rows come in runs of one filter type (Paeth or Average), so that four
        // alike rows go through `rows4_sse2`, at every width from 1 pixel (the checked steps
        // alone) to widths with many unchecked steps, and run lengths that leave 1-3 rows to
        // the pair and single kernels; against the portable kernels one row at a time. The
        // bytes are drawn with many small values, so Paeth's ties occur.
        let mut next = tie_prone_bytes(0x9e37_79b9, 80, 7);
        for bpp in [3usize, 4] {
            for width in (1usize..=12).chain([31, 64, 255]) {
                for pattern in [
                    &[PAETH; 9][..],
                    &[AVERAGE; 10][..],
                    &[
                        1, PAETH, PAETH, PAETH, PAETH, AVERAGE, AVERAGE, AVERAGE, AVERAGE, PAETH,
                    ],
                    &[
                        0, AVERAGE, AVERAGE, AVERAGE, PAETH, PAETH, PAETH, PAETH, PAETH, 2,
                    ],
                ] {
                    let rows = pattern.len();
                    let row_bytes = width * bpp;
                    let stride = row_bytes + 1;
                    let mut buf: Vec<u8> = (0..stride * rows).map(|_| next()).collect();
                    for (r, &f) in pattern.iter().enumerate() {
                        buf[r * stride] = f;
                    }
                    let want = unfiltered_one_by_one(&buf, stride, rows, bpp);
                    unfilter(&mut buf, row_bytes, rows, bpp).unwrap();
                    assert_eq!(buf, want, "bpp {bpp}, width {width}, filters {pattern:?}");
                }
            }
        }
    }

    #[test]
    fn paeth_and_average_sse2_match_the_portable_kernels() {
        // Pseudo-random rows, with runs of equal bytes for the ties.
        let mut next = tie_prone_bytes(0x2545_f491, 64, 3);
        for bpp in [3usize, 4] {
            for len in [bpp, 2 * bpp, 99 * bpp] {
                let prev: Vec<u8> = (0..len).map(|_| next()).collect();
                let row: Vec<u8> = (0..len).map(|_| next()).collect();
                let (mut want, mut got) = (row.clone(), row.clone());
                if bpp == 3 {
                    paeth_row::<3, 4>(&mut want, &prev);
                    // SAFETY: sse2 is in every x86-64 CPU's baseline.
                    unsafe { row_sse2::<3, PAETH>(&mut got, &prev) };
                } else {
                    paeth_row::<4, 4>(&mut want, &prev);
                    // SAFETY: as above.
                    unsafe { row_sse2::<4, PAETH>(&mut got, &prev) };
                }
                assert_eq!(got, want, "bpp {bpp} len {len}");
                // And both are the specification's predictor, byte by byte.
                let mut spec = row.clone();
                for i in 0..len {
                    let (a, c) = if i >= bpp {
                        (spec[i - bpp], prev[i - bpp])
                    } else {
                        (0, 0)
                    };
                    spec[i] = spec[i].wrapping_add(paeth(a, prev[i], c));
                }
                assert_eq!(want, spec, "bpp {bpp} len {len}");
                // Average: the SSE2 kernel against the portable one.
                let (mut want, mut got) = (row.clone(), row.clone());
                if bpp == 3 {
                    average_row::<3>(&mut want, Some(&prev));
                    // SAFETY: sse2 is in every x86-64 CPU's baseline.
                    unsafe { row_sse2::<3, AVERAGE>(&mut got, &prev) };
                } else {
                    average_row::<4>(&mut want, Some(&prev));
                    // SAFETY: as above.
                    unsafe { row_sse2::<4, AVERAGE>(&mut got, &prev) };
                }
                assert_eq!(got, want, "average, bpp {bpp} len {len}");
            }
        }
    }

    #[test]
    fn unfilters_like_pillow() {
        // Two rows of 2 pixels, 2 bytes each: Sub then Paeth (bpp 2).
        let mut buf = vec![1, 10, 20, 5, 5, 4, 1, 2, 3, 4];
        unfilter(&mut buf, 4, 2, 2).unwrap();
        assert_eq!(&buf[1..5], &[10, 20, 15, 25]);
        // Paeth: first pixel predicts from above (b), the second from min distance.
        assert_eq!(&buf[6..10], &[11, 22, 18, 29]);
        let mut bad = vec![5, 0];
        assert!(unfilter(&mut bad, 1, 1, 1).is_err());
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
