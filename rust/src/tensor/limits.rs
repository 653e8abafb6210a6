//! The wire codec's fixed limits: a leaf, so that [`super::error`] can quote them in messages
//! without naming [`super::wire`], which names the error type.

/// Bytes of the random nonce that starts every token.
pub const NONCE_LEN: usize = 16;
/// The largest protobuf field number (2^29 − 1).
pub const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;
/// Deepest message nesting entered along a plan (the top-level message is depth 0).
pub const MAX_DEPTH: usize = 100;
/// Most tensor payloads one decoded message may hold. Each becomes a numpy array and is checked
/// in Python (~4 µs), so without a bound a 6 MB message of 200 000 four-byte tensors cost 1.7 s
/// to parse and check, 11× what protobuf takes to parse it; a real request holds a few per
/// item (2^16 is a thousand-image batch many times over).
pub const MAX_TENSORS: usize = 1 << 16;
