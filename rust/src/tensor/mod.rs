//! Tensor transport: the dtype vocabulary, dtype conversion and the protobuf frame codec.
//!
//! Every engine's `TensorData` carries raw little-endian, C-contiguous bytes plus a `dtype`
//! string and a `uint32` shape. This module holds everything about those bytes that does not
//! need Python:
//!
//! - [`dtype`]: the wire vocabulary (`float32`, `bfloat16`, `float16`, `int64`, `uint32`,
//!   `uint8`) and item sizes; [`checked`]: parsing wire names and the numpy storage dtypes we
//!   accept as sources, and `shape × itemsize` with checked arithmetic; [`limits`]: the wire
//!   codec's fixed limits.
//! - [`convert`]: copying and converting tensor bytes (`float32` → `bfloat16` / `float16`, round
//!   to nearest even, NaN and Inf preserved), split over threads for large tensors; the result
//!   never depends on the thread count.
//! - [`wire`]: the whole-request fast path over protobuf wire format. [`wire::decode_frames`]
//!   replaces every tensor payload of a message by a 20-byte token and reports where the payload
//!   bytes are, so they can be viewed without a copy; [`wire::encode_frames`] does the inverse,
//!   writing each tensor's (converted) bytes straight into the output in one pass.
//! - [`error`]: [`TensorError`], one variant per failure, each message naming the numbers.
//! - [`memory`]: advice to the kernel about fresh output buffers (transparent huge pages).
//!
//! Untrusted bytes are validated completely (every sum through checked arithmetic, every slice
//! taken after its bounds were checked) before anything is written; nothing here panics on bad
//! input.

pub mod checked;
pub mod convert;
pub mod dtype;
pub mod error;
pub mod limits;
pub mod wire;

pub use checked::byte_len;
pub use dtype::WireDtype;
pub use error::TensorError;
