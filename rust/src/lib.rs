//! Native core of `smg-grpc-proto`.
//!
//! Each capability lives in its own module and builds, tests and benches without Python.
//! The PyO3 bindings live in [`py`] behind the `python` feature, which the wheel build enables.

pub mod build_info;
pub mod cores;
pub mod hash;
pub mod image;
pub mod memory;
pub mod processors;
pub mod prompt;
pub mod simd;
pub mod tensor;

#[cfg(feature = "python")]
mod py;
