//! The wire codec's fixed limits: a leaf, so that [`super::error`] can quote them in messages
//! without naming [`super::wire`], which names the error type.

/// Bytes of the random nonce that starts every token.
pub const NONCE_LEN: usize = 16;
/// The largest protobuf field number (2^29 − 1).
pub const MAX_FIELD_NUMBER: u32 = (1 << 29) - 1;
/// Deepest message nesting entered along a plan (the top-level message is depth 0).
pub const MAX_DEPTH: usize = 100;
