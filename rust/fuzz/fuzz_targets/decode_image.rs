//! Arbitrary bytes into the image decoder (JPEG, PNG, GIF, BMP, WebP).
//!
//! Besides "no panic, no crash, no hang": every accepted input yields `width × height × 3`
//! bytes within the pixel limit, the EXIF transpose keeps the pixel count, and decoding is
//! deterministic, on one thread or two (the JPEG Huffman helper thread). The corpus folder is
//! not committed; seed it with small images of each format, e.g. the fuzz seeds of
//! tests/vision/test_decode.py (from the repository root, with the wheel and Pillow installed),
//! and progressive JPEGs rewritten by `jpegtran -progressive` / `-scans` (test_jpeg_progressive.py):
//!   python -c "import sys, hashlib; sys.path[:0] = ['tests']; import test_decode as t;
//!   [open(f'rust/fuzz/corpus/decode_image/{hashlib.sha1(s).hexdigest()[:16]}', 'wb').write(s)
//!    for s in t._seeds()]"
//! then: cd rust/fuzz && cargo +nightly fuzz run decode_image -- -max_total_time=60
#![no_main]

use libfuzzer_sys::fuzz_target;
use smg_grpc_proto::image::decode::{decode, AlphaMode, DecodeOptions};

const LIMIT: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let options = DecodeOptions {
        apply_exif: true,
        max_pixels: Some(LIMIT),
        alpha: AlphaMode::White,
        threads: 1,
    };
    let Ok(image) = decode(data, &options) else {
        return;
    };
    let pixels = u64::from(image.width) * u64::from(image.height);
    assert!(pixels > 0 && pixels <= LIMIT);
    assert_eq!(image.pixels.len() as u64, pixels * 3);
    let plain = decode(
        data,
        &DecodeOptions {
            apply_exif: false,
            alpha: AlphaMode::Drop,
            ..options
        },
    )
    .expect("accepted once, accepted again");
    assert_eq!(plain.pixels.len(), image.pixels.len());
    assert_eq!(decode(data, &options).expect("deterministic"), image);
    // A helper thread for the JPEG Huffman decoding changes nothing.
    let two = DecodeOptions {
        threads: 2,
        ..options
    };
    assert_eq!(decode(data, &two).expect("accepted on two threads"), image);
});
