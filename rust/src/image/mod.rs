//! Image operations of the vision preprocessing, in pure Rust.
//!
//! - [`resample`]: `Image.resize` of Pillow 13.0.0 for 8-bit images, byte for byte — the
//!   nearest, box, bilinear, hamming, bicubic and lanczos filters, Pillow's fixed-point
//!   arithmetic, the `u8` image between the two passes, and both pass orders (Pillow 13 and
//!   Pillow ≤ 12.2). SIMD (AVX2, and AVX-512 VNNI for the vertical pass, detected at run
//!   time) and threads never change a byte.
//! - [`decode`]: JPEG, PNG, GIF, BMP and WebP files to RGB exactly as transformers' loader
//!   gets them from Pillow 13.0.0 (libjpeg-turbo and libwebp linked statically).
//! - [`filters`]: the filter kernels and Pillow's filter ids.
//! - [`coeffs`]: the per-axis coefficients (`precompute_coeffs`, 22-bit fixed point).
//! - [`torch`]: torch's CPU resampling (antialiased `uint8` bilinear/bicubic, float bicubic
//!   without antialiasing) and `bfloat16` rounding, bit for bit, for the torchvision-only
//!   processors.
//! - [`torch_aa`]: torch's antialiased `float32` resize (bicubic, bilinear), bit for bit.
//!
//! Images are interleaved `u8`, `height` rows of `width × channels` bytes, channels 1, 3 or 4.

pub mod coeffs;
pub mod decode;
pub mod filters;
mod kernels;
pub mod resample;
mod scalar;
pub mod torch;
pub mod torch_aa;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

pub use filters::Filter;
pub use resample::{resize, resize_into, ImageRef, PassOrder, ResampleError, ResizeOptions};
