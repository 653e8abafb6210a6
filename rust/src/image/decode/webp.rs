//! WebP through libwebp (built from source by `libwebp-sys`, linked statically), the way Pillow
//! 13's `_webp.c` uses it: the mode is `RGBA` when `WebPGetFeatures` reports alpha, else `RGB`;
//! the pixels are the first frame of `WebPAnimDecoder` with its defaults (RGBA output, fancy
//! upsampling, no threads), i.e. for a still image exactly `WebPDecode`'s RGBA and for an
//! animation the first frame on the transparent canvas. EXIF and XMP come from the `EXIF` and
//! `XMP ` chunks.

use std::ffi::{c_int, CStr};

use libwebp_sys as webp;

use super::convert::{ModeImage, Pixels};
use super::{check_size, exif, zeroed_image, DecodeError, Decoded, Format};

const FORMAT: Format = Format::WebP;

/// Owns a `WebPAnimDecoder`; deleted on drop.
struct AnimDecoder(*mut webp::WebPAnimDecoder);

impl Drop for AnimDecoder {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `WebPAnimDecoderNew` (non-null) and is deleted once.
        unsafe { webp::WebPAnimDecoderDelete(self.0) }
    }
}

/// True when the RIFF header declares more bytes than there are.
fn is_truncated(data: &[u8]) -> bool {
    data.get(4..8).is_some_and(|b| {
        let riff = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64;
        riff + 8 > data.len() as u64
    })
}

fn failure(data: &[u8], what: &str) -> DecodeError {
    if is_truncated(data) {
        DecodeError::truncated(
            FORMAT,
            format!("{what}: the RIFF header declares more data than the file holds"),
        )
    } else {
        DecodeError::corrupt(FORMAT, what.to_owned())
    }
}

/// Decodes a WebP file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    // SAFETY: all-zero bytes are a valid `WebPBitstreamFeatures` (integers and padding).
    let mut features: webp::WebPBitstreamFeatures = unsafe { std::mem::zeroed() };
    // SAFETY: `data` is a valid slice for the duration of the call; `features` is a valid out
    // pointer. libwebp only reads `data`.
    let status = unsafe { webp::WebPGetFeatures(data.as_ptr(), data.len(), &mut features) };
    match status {
        webp::VP8StatusCode::VP8_STATUS_OK => {}
        webp::VP8StatusCode::VP8_STATUS_NOT_ENOUGH_DATA => {
            return Err(DecodeError::truncated(
                FORMAT,
                "the bitstream header is incomplete",
            ))
        }
        other => {
            return Err(DecodeError::corrupt(
                FORMAT,
                format!("bad bitstream header ({other:?})"),
            ))
        }
    }
    let (fw, fh) = (features.width.max(0) as u64, features.height.max(0) as u64);
    check_size(FORMAT, fw, fh, limit)?;
    let has_alpha = features.has_alpha != 0;

    let input = webp::WebPData {
        bytes: data.as_ptr(),
        size: data.len(),
    };
    // SAFETY: `input` points into `data`, which outlives the decoder (dropped before return);
    // null options select the defaults (MODE_RGBA, no threads), as Pillow passes.
    let raw = unsafe { webp::WebPAnimDecoderNew(&input, std::ptr::null()) };
    if raw.is_null() {
        return Err(failure(data, "libwebp could not parse the file"));
    }
    let decoder = AnimDecoder(raw);
    let mut info = webp::WebPAnimInfo::default();
    // SAFETY: `decoder.0` is a live decoder and `info` a valid out pointer.
    if unsafe { webp::WebPAnimDecoderGetInfo(decoder.0, &mut info) } == 0 {
        return Err(failure(data, "libwebp could not read the canvas"));
    }
    let (width, height) = (info.canvas_width, info.canvas_height);
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    let mut frame: *mut u8 = std::ptr::null_mut();
    let mut timestamp: c_int = 0;
    // SAFETY: live decoder, valid out pointers. On success `frame` points to the decoder's
    // canvas of width × height × 4 bytes, valid until the next call or the decoder's deletion.
    if unsafe { webp::WebPAnimDecoderGetNext(decoder.0, &mut frame, &mut timestamp) } == 0
        || frame.is_null()
    {
        return Err(failure(data, "libwebp could not decode the first frame"));
    }
    let n = width as usize * height as usize;
    // SAFETY: see above: the canvas holds `n * 4` initialised bytes while `decoder` lives, and
    // this borrow ends before `decoder` is dropped.
    let canvas = unsafe { std::slice::from_raw_parts(frame, n * 4) };
    let pixels = if has_alpha {
        let mut rgba: Vec<u8> = zeroed_image(FORMAT, width, height, 4)?;
        rgba.copy_from_slice(canvas);
        Pixels::Rgba(rgba)
    } else {
        let mut rgb: Vec<u8> = zeroed_image(FORMAT, width, height, 3)?;
        for (d, s) in rgb.chunks_exact_mut(3).zip(canvas.chunks_exact(4)) {
            d.copy_from_slice(&s[..3]);
        }
        Pixels::Rgb(rgb)
    };
    // SAFETY: live decoder; the demuxer it returns lives as long as the decoder.
    let demux = unsafe { webp::WebPAnimDecoderGetDemuxer(decoder.0) };
    let exif = chunk(demux, c"EXIF");
    let xmp = chunk(demux, c"XMP ");
    drop(decoder);
    Ok(Decoded {
        image: ModeImage {
            width,
            height,
            pixels,
            transparency: None,
        },
        exif_error: exif
            .as_deref()
            .filter(|e| exif::pillow_refuses(e))
            .map(|_| exif::ExifError::Raises),
        exif,
        xmp,
    })
}

/// The first chunk named `fourcc`, copied (Pillow's `get_chunk`).
fn chunk(demux: *const webp::WebPDemuxer, fourcc: &CStr) -> Option<Vec<u8>> {
    if demux.is_null() {
        return None;
    }
    // SAFETY: all-zero bytes are a valid iterator (integers, a null data pointer, padding).
    let mut iter: webp::WebPChunkIterator = unsafe { std::mem::zeroed() };
    // SAFETY: `demux` is the live decoder's demuxer; `fourcc` is a 4-character C string.
    if unsafe { webp::WebPDemuxGetChunk(demux, fourcc.as_ptr(), 1, &mut iter) } == 0 {
        return None;
    }
    let bytes = if iter.chunk.bytes.is_null() {
        Vec::new()
    } else {
        // SAFETY: on success the iterator's chunk points into the demuxed data (our input slice)
        // for `size` bytes, valid until the iterator is released below.
        unsafe { std::slice::from_raw_parts(iter.chunk.bytes, iter.chunk.size) }.to_vec()
    };
    // SAFETY: the iterator was filled by `WebPDemuxGetChunk` and is released once.
    unsafe { webp::WebPDemuxReleaseChunkIterator(&mut iter) };
    (!bytes.is_empty()).then_some(bytes)
}
