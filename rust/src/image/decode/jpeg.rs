//! JPEG through libjpeg-turbo (built from source by `turbojpeg-sys`, linked statically), the
//! library Pillow bundles: ISLOW IDCT and fancy upsampling, libjpeg's defaults, which Pillow keeps.
//!
//! Like Pillow's JPEG plugin: the markers up to the first scan are read here for the EXIF
//! (`APP1 Exif`, several concatenated), the XMP (`APP1` Adobe XAP, the last one) and the frame
//! header (8-bit samples and 1, 3 or 4 components only — Pillow refuses anything else); 1
//! component opens as `L`, 3 as `RGB` (libjpeg converts YCbCr), 4 as `CMYK` read with Pillow's
//! `CMYK;I` raw mode (inverted, "Adobe conventions", YCCK converted by libjpeg). Data that ends
//! before the last scanline is a truncation error as in Pillow; a missing EOI marker after
//! complete data is accepted, as in Pillow. libjpeg's warnings are ignored, as in Pillow.

use std::ffi::{c_char, c_int, c_uint, CStr};

use super::convert::{ModeImage, Pixels};
use super::{check_size, overwritten_image, DecodeError, Decoded, Format, MAX_JPEG_SCANS};

// The static libjpeg-turbo comes with turbojpeg-sys; the shim below calls into it.
use turbojpeg_sys as _;

const FORMAT: Format = Format::Jpeg;

#[repr(C)]
struct ShimJpeg {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Default)]
struct ShimInfo {
    width: c_uint,
    height: c_uint,
    components: c_int,
    jpeg_color_space: c_int,
    data_precision: c_int,
    progressive: c_int,
}

const SHIM_OK: c_int = 0;
const SHIM_ERROR: c_int = 1;

extern "C" {
    fn smg_jpeg_new() -> *mut ShimJpeg;
    fn smg_jpeg_free(j: *mut ShimJpeg);
    fn smg_jpeg_message(j: *const ShimJpeg) -> *const c_char;
    fn smg_jpeg_read_header(
        j: *mut ShimJpeg,
        data: *const u8,
        len: usize,
        max_scans: c_int,
        info: *mut ShimInfo,
    ) -> c_int;
    fn smg_jpeg_decode(
        j: *mut ShimJpeg,
        out: *mut u8,
        out_len: usize,
        stride: usize,
        out_components: c_int,
        rows: *mut c_uint,
    ) -> c_int;
}

/// Owns one shim decoder; freed on drop.
struct Shim(*mut ShimJpeg);

impl Shim {
    fn new() -> Result<Self, DecodeError> {
        // SAFETY: `smg_jpeg_new` has no preconditions; it returns calloc'ed memory or null.
        let ptr = unsafe { smg_jpeg_new() };
        if ptr.is_null() {
            return Err(DecodeError::OutOfMemory {
                format: FORMAT,
                bytes: 4096,
            });
        }
        Ok(Self(ptr))
    }

    fn message(&self) -> String {
        // SAFETY: `self.0` is a live decoder; its message buffer is always NUL-terminated
        // (calloc'ed, then written only by snprintf/format_message, which terminate).
        unsafe { CStr::from_ptr(smg_jpeg_message(self.0)) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `smg_jpeg_new` and is freed exactly once, here.
        unsafe { smg_jpeg_free(self.0) }
    }
}

/// What Pillow's marker walk collects before the first scan.
#[derive(Debug, Default)]
struct Markers {
    exif: Option<Vec<u8>>,
    xmp: Option<Vec<u8>>,
    /// (sample precision, height, width, components) of the last frame header.
    frame: Option<(u8, u16, u16, u8)>,
}

/// Walks the markers from SOI to the first SOS like Pillow's `JpegImageFile._open`.
fn read_markers(data: &[u8]) -> Markers {
    let mut m = Markers::default();
    let mut pos = 2; // after SOI
    loop {
        // Find the next 0xFF, skip fill bytes.
        while pos < data.len() && data[pos] != 0xFF {
            pos += 1;
        }
        while pos < data.len() && data[pos] == 0xFF {
            pos += 1;
        }
        let Some(&marker) = data.get(pos) else { break };
        pos += 1;
        match marker {
            0x00 | 0x01 | 0xD0..=0xD9 => continue, // stuffed byte / standalone markers
            0xDA => break,                         // SOS: the image data starts
            _ => {}
        }
        let Some(len) = data
            .get(pos..pos + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        else {
            break;
        };
        let body = &data[(pos + 2).min(data.len())..(pos + len.max(2)).min(data.len())];
        pos += len.max(2);
        match marker {
            0xE1 if body.starts_with(b"Exif\x00\x00") => match &mut m.exif {
                Some(exif) => exif.extend_from_slice(&body[6..]),
                None => m.exif = Some(body.to_vec()),
            },
            0xE1 if body.starts_with(b"http://ns.adobe.com/xap/1.0/\x00") => {
                m.xmp = Some(body[29..].to_vec());
            }
            0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDE if body.len() >= 6 => {
                m.frame = Some((
                    body[0],
                    u16::from_be_bytes([body[1], body[2]]),
                    u16::from_be_bytes([body[3], body[4]]),
                    body[5],
                ));
            }
            _ => {}
        }
    }
    m
}

/// Decodes a JPEG file into the Pillow mode it opens as.
pub(crate) fn decode(data: &[u8], limit: u64) -> Result<Decoded, DecodeError> {
    let markers = read_markers(data);
    if let Some((bits, height, width, layers)) = markers.frame {
        if bits != 8 {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("sample precision: {bits}-bit (only 8-bit)"),
            ));
        }
        if !matches!(layers, 1 | 3 | 4) {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("number of components: {layers} (only 1, 3 or 4)"),
            ));
        }
        check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    }

    let shim = Shim::new()?;
    let mut info = ShimInfo::default();
    // SAFETY: `shim.0` is a fresh decoder; `data` outlives it (the decoder is dropped at the end
    // of this function and only reads `data` inside the calls below); `info` is a valid out
    // pointer.
    let status = unsafe {
        smg_jpeg_read_header(
            shim.0,
            data.as_ptr(),
            data.len(),
            MAX_JPEG_SCANS as c_int,
            &mut info,
        )
    };
    match status {
        SHIM_OK => {}
        SHIM_ERROR => return Err(DecodeError::corrupt(FORMAT, shim.message())),
        _ => {
            return Err(DecodeError::truncated(
                FORMAT,
                "the data ends inside the headers",
            ))
        }
    }
    let (width, height) = (info.width, info.height);
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    if info.data_precision != 8 {
        return Err(DecodeError::unsupported(
            FORMAT,
            format!("sample precision: {}-bit (only 8-bit)", info.data_precision),
        ));
    }
    let components: usize = match info.components {
        1 => 1,
        3 => 3,
        4 => 4,
        n => {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("number of components: {n} (only 1, 3 or 4)"),
            ))
        }
    };
    let mut pixels: Vec<u8> = overwritten_image(FORMAT, width, height, components)?;
    let stride = width as usize * components;
    let mut rows: c_uint = 0;
    // SAFETY: the header was read successfully; `pixels` holds `height` rows of `stride` bytes
    // and the shim checks that libjpeg's output dimensions fit `out_len` before writing; `data`
    // is still borrowed (alive) and `rows` is a valid out pointer.
    let status = unsafe {
        smg_jpeg_decode(
            shim.0,
            pixels.as_mut_ptr(),
            pixels.len(),
            stride,
            components as c_int,
            &mut rows,
        )
    };
    match status {
        SHIM_OK => {}
        SHIM_ERROR => return Err(DecodeError::corrupt(FORMAT, shim.message())),
        _ => {
            return Err(DecodeError::truncated(
                FORMAT,
                format!(
                    "{rows} of {height} rows decoded{}",
                    if info.progressive != 0 {
                        " (progressive)"
                    } else {
                        ""
                    }
                ),
            ))
        }
    }
    let pixels = match components {
        1 => Pixels::L(pixels),
        3 => Pixels::Rgb(pixels),
        _ => {
            // Pillow reads 4-component JPEGs with raw mode "CMYK;I": every sample inverted.
            for v in &mut pixels {
                *v = !*v;
            }
            Pixels::Cmyk(pixels)
        }
    };
    Ok(Decoded {
        image: ModeImage {
            width,
            height,
            pixels,
            transparency: None,
        },
        exif: markers.exif,
        xmp: markers.xmp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_collect_exif_and_xmp() {
        let mut data = b"\xff\xd8".to_vec();
        let mut seg = |marker: u8, body: &[u8]| {
            data.extend([0xFF, marker]);
            data.extend(((body.len() + 2) as u16).to_be_bytes());
            data.extend(body);
        };
        seg(0xE1, b"Exif\x00\x00II*\x00");
        seg(0xE1, b"Exif\x00\x00more");
        seg(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x/>");
        seg(0xC0, &[8, 0, 2, 0, 3, 3]);
        data.extend([0xFF, 0xDA]);
        let m = read_markers(&data);
        assert_eq!(m.exif.as_deref(), Some(&b"Exif\x00\x00II*\x00more"[..]));
        assert_eq!(m.xmp.as_deref(), Some(&b"<x/>"[..]));
        assert_eq!(m.frame, Some((8, 2, 3, 3)));
    }

    #[test]
    fn garbage_after_soi_is_an_error_not_a_crash() {
        for data in [
            &b"\xff\xd8\xff"[..],
            b"\xff\xd8\xff\xc0\x00\x11",
            b"\xff\xd8\xff\xd9",
            b"\xff\xd8\xffhello",
        ] {
            let err = decode(data, u64::MAX).unwrap_err();
            assert!(matches!(err.kind(), "truncated" | "corrupt"), "{err}");
        }
    }

    #[test]
    fn twelve_bit_is_unsupported() {
        let data =
            b"\xff\xd8\xff\xc0\x00\x11\x0c\x00\x10\x00\x10\x03\x01\x11\x00\x02\x11\x01\x03\x11\x01";
        assert_eq!(decode(data, u64::MAX).unwrap_err().kind(), "unsupported");
    }
}
