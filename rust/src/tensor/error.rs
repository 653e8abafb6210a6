//! [`TensorError`]: every way a tensor operation can fail, one variant per failure.
//!
//! Messages name the argument (`src`, `dst`, `plan`, `nonce`, the wire input `data` or `header`)
//! and every number involved, so a caller can tell what to fix without reading code. The Python
//! bindings raise each of them as `smg_grpc_proto.errors.TensorError` with the same message and
//! its fields (`src/py/errors.rs`).

use std::fmt;

use super::dtype::WireDtype;

/// A failed tensor operation. Wire-format variants carry `input` (the argument whose bytes were
/// parsed) and `offset` (the byte within it where the offending record starts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorError {
    /// A dtype name outside the wire vocabulary (`arg` names the argument that held it).
    UnknownDtype { arg: &'static str, name: String },
    /// A numpy dtype (`dtype.str`) that cannot be the source of any wire dtype.
    UnsupportedSourceDtype { arg: &'static str, numpy: String },
    /// A conversion between two known dtypes that is not offered.
    UnsupportedConversion { from: WireDtype, to: WireDtype },
    /// `product(shape) × itemsize` does not fit in memory (`usize`).
    ShapeOverflow { shape: Vec<u64>, itemsize: usize },
    /// A byte buffer whose length is not a whole number of items.
    PartialItem {
        arg: &'static str,
        len: usize,
        itemsize: usize,
    },
    /// The destination does not hold exactly the converted size.
    DestinationSize { expected: usize, actual: usize },
    /// An array that is not C-contiguous.
    NotContiguous { arg: &'static str },
    /// A destination array that is read-only.
    ReadOnly { arg: &'static str },
    /// A destination array whose dtype is not `uint8`.
    DestinationDtype { numpy: String },
    /// Source and destination memory overlap.
    Overlap {
        src: usize,
        src_len: usize,
        dst: usize,
        dst_len: usize,
    },
    /// A nonce that is not exactly [`NONCE_LEN`](super::limits::NONCE_LEN) bytes.
    NonceLength { len: usize },
    /// A plan field number outside `1..=536870911` (`value` as the caller wrote it).
    PlanFieldNumber { path: String, value: String },
    /// The same field number twice in one message plan.
    PlanDuplicateField { path: String, field: u32 },
    /// A plan nested deeper than [`MAX_DEPTH`](super::limits::MAX_DEPTH): messages below that
    /// depth are never entered, which bounds the nesting `decode_frames` and `encode_frames`
    /// follow.
    PlanTooDeep { max: usize },
    /// A varint that runs past the end of its message.
    VarintTruncated { input: &'static str, offset: usize },
    /// A varint longer than 10 bytes.
    VarintTooLong { input: &'static str, offset: usize },
    /// A record key with field number 0.
    FieldNumberZero { input: &'static str, offset: usize },
    /// A record key whose field number exceeds 536870911.
    FieldNumberTooLarge {
        input: &'static str,
        offset: usize,
        field: u64,
    },
    /// Wire type 3 or 4 (groups), which no message we handle uses.
    GroupWireType {
        input: &'static str,
        offset: usize,
        field: u32,
        wire_type: u8,
    },
    /// Wire type 6 or 7, which do not exist.
    InvalidWireType {
        input: &'static str,
        offset: usize,
        field: u32,
        wire_type: u8,
    },
    /// A fixed32/fixed64 value cut short by the end of its message.
    FixedTruncated {
        input: &'static str,
        offset: usize,
        field: u32,
        needed: usize,
        available: usize,
    },
    /// A length-delimited value longer than what remains of its message.
    LengthTruncated {
        input: &'static str,
        offset: usize,
        field: u32,
        length: u64,
        available: usize,
    },
    /// An input or output beyond the protobuf message size limit (2 GiB − 1).
    MessageTooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
    /// More than [`MAX_TENSORS`](super::limits::MAX_TENSORS) tensor payloads in one message.
    TooManyTensors { max: usize },
    /// A token whose index names no attached source.
    TokenIndexOutOfRange {
        offset: usize,
        index: u32,
        count: usize,
    },
    /// A buffer of `bytes` bytes (sized by the input) could not be allocated.
    OutOfMemory { what: &'static str, bytes: u64 },
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TensorError::*;
        match self {
            UnknownDtype { arg, name } => write!(
                f,
                "{arg}: unknown dtype {name:?}; expected one of {}",
                WireDtype::vocabulary()
            ),
            UnsupportedSourceDtype { arg, numpy } => write!(
                f,
                "{arg}: numpy dtype {numpy:?} is not a tensor source; expected one of \
                 '<f4', '<f2', '<u2' (bfloat16 bits), '<i8', '<u4', '|u1' (little-endian)"
            ),
            UnsupportedConversion { from, to } => write!(
                f,
                "wire_dtype: cannot convert {from} to {to}; only same-dtype copies and \
                 float32 to bfloat16 or float16 are supported"
            ),
            ShapeOverflow { shape, itemsize } => write!(
                f,
                "shape: {shape:?} with itemsize {itemsize} overflows the addressable size \
                 ({} bytes)",
                usize::MAX
            ),
            PartialItem { arg, len, itemsize } => write!(
                f,
                "{arg}: {len} bytes is not a whole number of {itemsize}-byte items"
            ),
            DestinationSize { expected, actual } => write!(
                f,
                "dst: holds {actual} bytes, the converted tensor needs exactly {expected}"
            ),
            NotContiguous { arg } => write!(f, "{arg}: array is not C-contiguous"),
            ReadOnly { arg } => write!(f, "{arg}: array is read-only"),
            DestinationDtype { numpy } => {
                write!(f, "dst: dtype must be uint8 ('|u1'), got {numpy:?}")
            }
            Overlap {
                src,
                src_len,
                dst,
                dst_len,
            } => write!(
                f,
                "dst: memory [{dst:#x}, +{dst_len}) overlaps src [{src:#x}, +{src_len})"
            ),
            NonceLength { len } => write!(
                f,
                "nonce: must be exactly {} bytes, got {len}",
                super::limits::NONCE_LEN
            ),
            PlanFieldNumber { path, value } => write!(
                f,
                "plan: field number {value} at {path} is outside 1..={}",
                super::limits::MAX_FIELD_NUMBER
            ),
            PlanDuplicateField { path, field } => {
                write!(
                    f,
                    "plan: field {field} appears twice in the message plan at {path}"
                )
            }
            PlanTooDeep { max } => write!(f, "plan: nested deeper than {max} levels"),
            VarintTruncated { input, offset } => {
                write!(f, "{input}: truncated varint at byte {offset}")
            }
            VarintTooLong { input, offset } => {
                write!(f, "{input}: varint longer than 10 bytes at byte {offset}")
            }
            FieldNumberZero { input, offset } => {
                write!(f, "{input}: field number 0 in the record at byte {offset}")
            }
            FieldNumberTooLarge {
                input,
                offset,
                field,
            } => write!(
                f,
                "{input}: field number {field} in the record at byte {offset} exceeds {}",
                super::limits::MAX_FIELD_NUMBER
            ),
            GroupWireType {
                input,
                offset,
                field,
                wire_type,
            } => write!(
                f,
                "{input}: group wire type {wire_type} (field {field}) at byte {offset} is not \
                 supported"
            ),
            InvalidWireType {
                input,
                offset,
                field,
                wire_type,
            } => write!(
                f,
                "{input}: invalid wire type {wire_type} (field {field}) at byte {offset}"
            ),
            FixedTruncated {
                input,
                offset,
                field,
                needed,
                available,
            } => write!(
                f,
                "{input}: field {field} at byte {offset} needs {needed} bytes, only {available} \
                 remain"
            ),
            LengthTruncated {
                input,
                offset,
                field,
                length,
                available,
            } => write!(
                f,
                "{input}: field {field} at byte {offset} claims {length} bytes, only {available} \
                 remain"
            ),
            MessageTooLarge { what, size, limit } => write!(
                f,
                "{what}: {size} bytes exceeds the protobuf message limit of {limit} bytes; \
                 use shared memory for tensors this large"
            ),
            TooManyTensors { max } => write!(
                f,
                "data: more than {max} tensor payloads in one message (a request holds a few \
                 per item)"
            ),
            TokenIndexOutOfRange {
                offset,
                index,
                count,
            } => write!(
                f,
                "header: token at byte {offset} names tensor {index}, but only {count} \
                 sources are attached"
            ),
            OutOfMemory { what, bytes } => write!(
                f,
                "out of memory: cannot allocate {bytes} bytes for the {what}"
            ),
        }
    }
}

impl std::error::Error for TensorError {}

impl TensorError {
    /// The error for a failed allocation of the buffer for `what` (for `map_err`).
    pub fn oom(what: &'static str) -> impl FnOnce(crate::memory::AllocError) -> Self {
        move |e| TensorError::OutOfMemory {
            what,
            bytes: e.bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_numbers() {
        let e = TensorError::LengthTruncated {
            input: "data",
            offset: 12,
            field: 5,
            length: 300,
            available: 10,
        };
        assert_eq!(
            e.to_string(),
            "data: field 5 at byte 12 claims 300 bytes, only 10 remain"
        );
        let e = TensorError::DestinationSize {
            expected: 8,
            actual: 6,
        };
        assert_eq!(
            e.to_string(),
            "dst: holds 6 bytes, the converted tensor needs exactly 8"
        );
        let e = TensorError::UnknownDtype {
            arg: "wire_dtype",
            name: "float64".into(),
        };
        assert!(e.to_string().starts_with("wire_dtype: "), "{e}");
        assert!(e.to_string().contains("\"float64\""), "{e}");
        assert!(e.to_string().contains("bfloat16"), "{e}");
    }
}
