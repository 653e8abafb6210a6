//! The whole-request fast path over protobuf wire format.
//!
//! A [`Plan`] says where `TensorData` messages can occur inside a message type. Along it,
//! [`decode_frames`] replaces the payload of every `TensorData` by a 20-byte *token*
//! (`nonce ‖ u32_le(index)`) and reports where each original payload lies in the input, so the
//! caller parses a small header with the ordinary protobuf parser and views the payloads without
//! copying them. [`encode_frames`] is the inverse: given such a header and the tensors, it writes
//! each tensor's (converted) bytes straight into the output, once.
//!
//! Both walk records without interpreting them: only fields named by the plan with wire type
//! LEN are entered; everything else is copied verbatim. Since replaced payloads change size, the
//! length prefix of every enclosing message on the path is re-encoded (minimal varint); record
//! keys are kept byte for byte. Repeated and map fields need nothing special: each element or map
//! entry is one LEN record, and a map entry is a message with `key = 1`, `value = 2`.
//!
//! Each operation runs in two steps: a validating walk builds a [`Layout`] (a list of pieces:
//! input ranges, record keys with new lengths, tokens, tensors) whose total size is known before
//! anything is written, then [`Layout::write_into`] fills an exactly sized buffer in one pass.

use std::mem::MaybeUninit;

use super::convert::{as_uninit, default_threads, Conversion};
use super::dtype::WireDtype;
use super::error::TensorError;

pub use super::limits::{MAX_DEPTH, MAX_FIELD_NUMBER, MAX_TENSORS, NONCE_LEN};
/// Bytes of a token: the nonce and a little-endian `u32` index.
pub const TOKEN_LEN: usize = NONCE_LEN + 4;
/// Protobuf's message size limit: 2 GiB − 1.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// Where `TensorData` messages sit inside a message type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// A message: its fields (by number) that lead to tensors, each with the plan of the
    /// message it holds.
    Message(Vec<(u32, Plan)>),
    /// A `TensorData` message; the number is its payload bytes field (1 for SGLang `data` and
    /// vLLM `inline`, 3 for TokenSpeed `inline`).
    Tensor(u32),
}

impl Plan {
    /// Validates a field number given as a signed integer (as it arrives from Python); `path`
    /// locates it in the error.
    pub fn field_number(value: i64, path: &str) -> Result<u32, TensorError> {
        u32::try_from(value)
            .ok()
            .filter(|n| (1..=MAX_FIELD_NUMBER).contains(n))
            .ok_or_else(|| TensorError::PlanFieldNumber {
                path: path.to_owned(),
                value: value.to_string(),
            })
    }

    /// Checks field numbers, duplicates and depth of the whole plan. Costs no allocation when
    /// the plan is valid (paths are only spelled out for an error).
    pub fn validate(&self) -> Result<(), TensorError> {
        self.validate_at(&mut Vec::new())
    }

    /// `trail` holds the index of each field pair from the root to `self`.
    fn validate_at(&self, trail: &mut Vec<usize>) -> Result<(), TensorError> {
        let path = |trail: &[usize], last: &str| {
            let mut path = "plan".to_owned();
            for i in trail {
                path.push_str(&format!("[{i}][1]"));
            }
            path + last
        };
        if trail.len() > MAX_DEPTH {
            return Err(TensorError::PlanTooDeep { max: MAX_DEPTH });
        }
        match self {
            Plan::Tensor(payload) => {
                if !(1..=MAX_FIELD_NUMBER).contains(payload) {
                    return Err(TensorError::PlanFieldNumber {
                        path: path(trail, ""),
                        value: payload.to_string(),
                    });
                }
            }
            Plan::Message(fields) => {
                for (i, (number, child)) in fields.iter().enumerate() {
                    if !(1..=MAX_FIELD_NUMBER).contains(number) {
                        return Err(TensorError::PlanFieldNumber {
                            path: path(trail, &format!("[{i}][0]")),
                            value: number.to_string(),
                        });
                    }
                    if fields[..i].iter().any(|(n, _)| n == number) {
                        return Err(TensorError::PlanDuplicateField {
                            path: path(trail, ""),
                            field: *number,
                        });
                    }
                    trail.push(i);
                    child.validate_at(trail)?;
                    trail.pop();
                }
            }
        }
        Ok(())
    }

    fn child(&self, field: u32) -> Option<&Plan> {
        match self {
            Plan::Message(fields) => fields.iter().find(|(n, _)| *n == field).map(|(_, p)| p),
            Plan::Tensor(_) => None,
        }
    }
}

/// A tensor whose bytes are computed straight into their place in the output of
/// [`encode_frames`] instead of being copied there (an image processor's patches, say): the
/// tensor is written once, where it travels.
///
/// # Safety
///
/// [`produce`](Self::produce) must initialise every byte of `out` whenever it returns `Ok`:
/// [`Layout::write_into_uninit`] then hands the memory out as initialised bytes.
pub unsafe trait Produce: Sync {
    /// The number of bytes it writes as `dtype`; `None` for a dtype it does not write.
    fn wire_len(&self, dtype: WireDtype) -> Option<usize>;

    /// Writes every byte of `out`, which holds exactly [`wire_len`](Self::wire_len)`(dtype)`
    /// bytes, as little-endian `dtype` values.
    fn produce(&self, out: &mut [MaybeUninit<u8>], dtype: WireDtype) -> Result<(), TensorError>;

    /// How many threads [`produce`](Self::produce) writes with (a fresh destination is faulted
    /// in by as many first, see [`crate::memory::prefault`]).
    fn writers(&self) -> usize {
        1
    }
}

/// One tensor to be written by [`encode_frames`]: its bytes and how to convert them, or what
/// produces them.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    bytes: Bytes<'a>,
    out_len: usize,
}

#[derive(Clone, Copy)]
enum Bytes<'a> {
    Memory {
        bytes: &'a [u8],
        conversion: Conversion,
    },
    Produced(&'a dyn Produce, WireDtype),
}

impl std::fmt::Debug for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Source");
        match self.bytes {
            Bytes::Memory { bytes, conversion } => s
                .field("bytes", &bytes.len())
                .field("conversion", &conversion),
            Bytes::Produced(_, dtype) => s.field("produced", &dtype),
        };
        s.field("out_len", &self.out_len).finish()
    }
}

impl<'a> Source<'a> {
    /// `bytes` hold little-endian elements of `from`; they go on the wire as `to`.
    pub fn new(bytes: &'a [u8], from: WireDtype, to: WireDtype) -> Result<Self, TensorError> {
        let conversion = Conversion::new(from, to)?;
        let out_len = conversion.output_len(bytes.len(), "sources")?;
        Ok(Source {
            bytes: Bytes::Memory { bytes, conversion },
            out_len,
        })
    }

    /// The bytes `producer` writes as `to`; [`TensorError::UnsupportedConversion`] (from
    /// `float32`, what producers compute) when it does not write `to`.
    pub fn produced(producer: &'a dyn Produce, to: WireDtype) -> Result<Self, TensorError> {
        let out_len = producer
            .wire_len(to)
            .ok_or(TensorError::UnsupportedConversion {
                from: WireDtype::Float32,
                to,
            })?;
        Ok(Source {
            bytes: Bytes::Produced(producer, to),
            out_len,
        })
    }

    /// Bytes this tensor occupies on the wire.
    pub fn wire_len(&self) -> usize {
        self.out_len
    }

    /// How many threads [`write`](Self::write) writes with.
    pub fn writers(&self) -> usize {
        match self.bytes {
            Bytes::Memory { bytes, .. } => default_threads(bytes.len()),
            Bytes::Produced(producer, _) => producer.writers(),
        }
    }

    /// Writes the tensor's wire bytes into `dst` (exactly [`wire_len`](Self::wire_len) bytes).
    pub fn write(&self, dst: &mut [MaybeUninit<u8>]) -> Result<(), TensorError> {
        if dst.len() != self.out_len {
            return Err(TensorError::DestinationSize {
                expected: self.out_len,
                actual: dst.len(),
            });
        }
        match self.bytes {
            Bytes::Memory { bytes, conversion } => conversion
                .convert_uninit(bytes, dst, default_threads(bytes.len()))
                .map(|_| ()),
            Bytes::Produced(producer, dtype) => producer.produce(dst, dtype),
        }
    }
}

/// One stretch of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// Input bytes copied unchanged.
    Input { start: usize, end: usize },
    /// A record key (input bytes `start..end`) followed by `len` as a minimal varint.
    Key {
        start: usize,
        end: usize,
        len: usize,
    },
    /// The token with this index.
    Token(u32),
    /// Source `index`, converted.
    Tensor(usize),
}

/// The validated shape of an output: what to write where. Built by [`decode_frames`] and
/// [`encode_frames`]; written by [`Layout::write_into`] or [`Layout::to_vec`].
#[derive(Debug)]
pub struct Layout<'a> {
    data: &'a [u8],
    nonce: [u8; NONCE_LEN],
    sources: &'a [Source<'a>],
    pieces: Vec<Piece>,
    len: usize,
    spans: Vec<(usize, usize)>,
}

impl Layout<'_> {
    /// Exact size of the output in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the output is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many threads [`write_into`](Self::write_into) writes with at most (one for an output
    /// without tensors).
    pub fn writers(&self) -> usize {
        self.sources.iter().map(Source::writers).max().unwrap_or(1)
    }

    /// `(offset, length)` within the input of every payload replaced by a token, in token
    /// order (empty for [`encode_frames`]).
    pub fn spans(&self) -> &[(usize, usize)] {
        &self.spans
    }

    /// Writes the output into `out`, which must be exactly [`len`](Self::len) bytes. Tensors and
    /// verbatim stretches of at least 1 MiB are copied or converted on several threads.
    pub fn write_into(&self, out: &mut [u8]) -> Result<(), TensorError> {
        self.write_into_uninit(as_uninit(out)).map(|_| ())
    }

    /// [`write_into`](Self::write_into) memory that need not be initialised (a fresh output
    /// buffer): on success every byte has been written, and the same memory is returned as
    /// `&mut [u8]`.
    pub fn write_into_uninit<'o>(
        &self,
        out: &'o mut [MaybeUninit<u8>],
    ) -> Result<&'o mut [u8], TensorError> {
        let actual = out.len();
        let mismatch = || TensorError::DestinationSize {
            expected: self.len,
            actual,
        };
        if actual != self.len {
            return Err(mismatch());
        }
        // Every piece's size was summed into `self.len`, so the pieces below fill `out` exactly;
        // each step is checked anyway so that no bug can write out of bounds or leave a gap.
        let mut rest: &mut [MaybeUninit<u8>] = &mut *out;
        for piece in &self.pieces {
            rest = match *piece {
                Piece::Input { start, end } => {
                    put(rest, self.data.get(start..end).ok_or_else(mismatch)?)?
                }
                Piece::Key { start, end, len } => {
                    let rest = put(rest, self.data.get(start..end).ok_or_else(mismatch)?)?;
                    let mut buf = [0u8; 10];
                    let n = put_varint(len as u64, &mut buf);
                    put(rest, &buf[..n])?
                }
                Piece::Token(index) => put(put(rest, &self.nonce)?, &index.to_le_bytes())?,
                Piece::Tensor(index) => {
                    let source = self.sources.get(index).ok_or_else(mismatch)?;
                    let (dst, tail) = rest
                        .split_at_mut_checked(source.out_len)
                        .ok_or_else(mismatch)?;
                    source.write(dst)?;
                    tail
                }
            };
        }
        if !rest.is_empty() {
            return Err(mismatch());
        }
        let (ptr, len) = (out.as_mut_ptr().cast::<u8>(), out.len());
        // SAFETY: the pieces were written one after another from the front of `out`, each
        // taking exactly the bytes it initialised (`put`, `convert_uninit` and a `Produce`r fail
        // unless they fill their whole destination), and nothing is left over, so every byte of `out` is
        // initialised. `MaybeUninit<u8>` has the layout of `u8`; the result reborrows `out`.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// The output as a new vector; [`TensorError::OutOfMemory`] if it cannot be allocated.
    pub fn to_vec(&self) -> Result<Vec<u8>, TensorError> {
        let mut out =
            crate::memory::fallible::zeros(self.len).map_err(TensorError::oom("message"))?;
        self.write_into(&mut out)?;
        Ok(out)
    }
}

/// Copies `bytes` to the front of `buf`; returns the rest of `buf`.
fn put<'b>(
    buf: &'b mut [MaybeUninit<u8>],
    bytes: &[u8],
) -> Result<&'b mut [MaybeUninit<u8>], TensorError> {
    let available = buf.len();
    let (dst, tail) =
        buf.split_at_mut_checked(bytes.len())
            .ok_or(TensorError::DestinationSize {
                expected: bytes.len(),
                actual: available,
            })?;
    COPY.convert_uninit(bytes, dst, default_threads(bytes.len()))?;
    Ok(tail)
}

/// Byte-for-byte copies.
const COPY: Conversion = Conversion::Copy { itemsize: 1 };

/// Parses `data` (a message of type `plan`), replacing every `TensorData` payload by the token
/// `nonce ‖ u32_le(i)` where `i` counts payloads in encounter order. The layout's
/// [`spans`](Layout::spans) give each payload's `(offset, length)` in `data`.
pub fn decode_frames<'a>(
    data: &'a [u8],
    plan: &Plan,
    nonce: &[u8],
) -> Result<Layout<'a>, TensorError> {
    decode_frames_limited(data, plan, nonce, MAX_MESSAGE_BYTES)
}

/// [`decode_frames`] with a custom message size limit (tests use small ones).
pub(crate) fn decode_frames_limited<'a>(
    data: &'a [u8],
    plan: &Plan,
    nonce: &[u8],
    limit: usize,
) -> Result<Layout<'a>, TensorError> {
    let nonce = check_nonce(nonce)?;
    plan.validate()?;
    check_size("data", data.len(), limit)?;
    let mut walker = Walker {
        data,
        input: "data",
        pieces: Vec::new(),
        limit,
        rewrite: Decode { spans: Vec::new() },
    };
    let len = walker.walk(0, data.len(), plan)?;
    Ok(Layout {
        data,
        nonce,
        sources: &[],
        pieces: walker.pieces,
        len,
        spans: walker.rewrite.spans,
    })
}

/// Parses `header` (a message of type `plan`) and replaces every `TensorData` payload that is a
/// token of `nonce` by the bytes of `sources[index]`, converted. Other payloads are kept.
pub fn encode_frames<'a>(
    header: &'a [u8],
    plan: &Plan,
    nonce: &[u8],
    sources: &'a [Source<'a>],
) -> Result<Layout<'a>, TensorError> {
    encode_frames_limited(header, plan, nonce, sources, MAX_MESSAGE_BYTES)
}

/// [`encode_frames`] with a custom message size limit (tests use small ones).
pub(crate) fn encode_frames_limited<'a>(
    header: &'a [u8],
    plan: &Plan,
    nonce: &[u8],
    sources: &'a [Source<'a>],
    limit: usize,
) -> Result<Layout<'a>, TensorError> {
    let nonce = check_nonce(nonce)?;
    plan.validate()?;
    check_size("header", header.len(), limit)?;
    let mut walker = Walker {
        data: header,
        input: "header",
        pieces: Vec::new(),
        limit,
        rewrite: Encode { nonce, sources },
    };
    let len = walker.walk(0, header.len(), plan)?;
    Ok(Layout {
        data: header,
        nonce,
        sources,
        pieces: walker.pieces,
        len,
        spans: Vec::new(),
    })
}

fn check_nonce(nonce: &[u8]) -> Result<[u8; NONCE_LEN], TensorError> {
    nonce
        .try_into()
        .map_err(|_| TensorError::NonceLength { len: nonce.len() })
}

fn check_size(what: &'static str, size: usize, limit: usize) -> Result<(), TensorError> {
    if size > limit {
        return Err(TensorError::MessageTooLarge {
            what,
            size: size as u64,
            limit: limit as u64,
        });
    }
    Ok(())
}

/// What replaces a payload: a piece and its length, or `None` to keep the record.
trait Rewrite {
    fn payload(
        &mut self,
        data: &[u8],
        start: usize,
        end: usize,
    ) -> Result<Option<(Piece, usize)>, TensorError>;
}

struct Decode {
    spans: Vec<(usize, usize)>,
}

impl Rewrite for Decode {
    fn payload(
        &mut self,
        _data: &[u8],
        start: usize,
        end: usize,
    ) -> Result<Option<(Piece, usize)>, TensorError> {
        if self.spans.len() == MAX_TENSORS {
            return Err(TensorError::TooManyTensors { max: MAX_TENSORS });
        }
        // Below `MAX_TENSORS` (2^16): the index fits a `u32`.
        let index = self.spans.len() as u32;
        self.spans.push((start, end - start));
        Ok(Some((Piece::Token(index), TOKEN_LEN)))
    }
}

struct Encode<'a> {
    nonce: [u8; NONCE_LEN],
    sources: &'a [Source<'a>],
}

impl Rewrite for Encode<'_> {
    fn payload(
        &mut self,
        data: &[u8],
        start: usize,
        end: usize,
    ) -> Result<Option<(Piece, usize)>, TensorError> {
        let Some(value) = data.get(start..end) else {
            return Ok(None);
        };
        let Some((nonce, index)) = value.split_first_chunk::<NONCE_LEN>() else {
            return Ok(None);
        };
        let Ok(index) = <[u8; 4]>::try_from(index) else {
            return Ok(None);
        };
        if *nonce != self.nonce {
            return Ok(None);
        }
        let index = u32::from_le_bytes(index);
        let out_of_range = || TensorError::TokenIndexOutOfRange {
            offset: start,
            index,
            count: self.sources.len(),
        };
        let i = usize::try_from(index).map_err(|_| out_of_range())?;
        let source = self.sources.get(i).ok_or_else(out_of_range)?;
        Ok(Some((Piece::Tensor(i), source.out_len)))
    }
}

struct Walker<'a, R> {
    data: &'a [u8],
    input: &'static str,
    pieces: Vec<Piece>,
    limit: usize,
    rewrite: R,
}

impl<R: Rewrite> Walker<'_, R> {
    /// Walks the records in `start..end` (a message of type `plan`), appending pieces; returns
    /// the size of the rewritten message.
    fn walk(&mut self, start: usize, end: usize, plan: &Plan) -> Result<usize, TensorError> {
        // Recursion follows the plan, whose depth `Plan::validate` bounded by MAX_DEPTH.
        let input = self.input;
        let payload_field = match plan {
            Plan::Tensor(p) => Some(*p),
            Plan::Message(_) => None,
        };
        let mut size = 0usize;
        let mut pos = start;
        while pos < end {
            let record = pos;
            let (key, after_key) = read_varint(self.data, pos, end, input)?;
            let field = key >> 3;
            let wire_type = (key & 7) as u8;
            if field == 0 {
                return Err(TensorError::FieldNumberZero {
                    input,
                    offset: record,
                });
            }
            let field = u32::try_from(field)
                .ok()
                .filter(|f| *f <= MAX_FIELD_NUMBER)
                .ok_or(TensorError::FieldNumberTooLarge {
                    input,
                    offset: record,
                    field,
                })?;
            pos = match wire_type {
                0 => read_varint(self.data, after_key, end, input)?.1,
                1 | 5 => {
                    let needed = if wire_type == 1 { 8 } else { 4 };
                    let available = end - after_key;
                    if available < needed {
                        return Err(TensorError::FixedTruncated {
                            input,
                            offset: record,
                            field,
                            needed,
                            available,
                        });
                    }
                    after_key + needed
                }
                2 => {
                    let (length, body) = read_varint(self.data, after_key, end, input)?;
                    let available = end - body;
                    let value_end = usize::try_from(length)
                        .ok()
                        .filter(|l| *l <= available)
                        .map(|l| body + l)
                        .ok_or(TensorError::LengthTruncated {
                            input,
                            offset: record,
                            field,
                            length,
                            available,
                        })?;
                    let key = (record, after_key);
                    if payload_field == Some(field) {
                        if let Some((piece, len)) =
                            self.rewrite.payload(self.data, body, value_end)?
                        {
                            self.push(Piece::Key {
                                start: key.0,
                                end: key.1,
                                len,
                            });
                            self.push(piece);
                            size = self.add(size, key.1 - key.0, len)?;
                            pos = value_end;
                            continue;
                        }
                    } else if let Some(child) = plan.child(field) {
                        let at = self.pieces.len();
                        self.push(Piece::Key {
                            start: key.0,
                            end: key.1,
                            len: 0,
                        });
                        let len = self.walk(body, value_end, child)?;
                        if let Some(Piece::Key { len: slot, .. }) = self.pieces.get_mut(at) {
                            *slot = len;
                        }
                        size = self.add(size, key.1 - key.0, len)?;
                        pos = value_end;
                        continue;
                    }
                    value_end
                }
                3 | 4 => {
                    return Err(TensorError::GroupWireType {
                        input,
                        offset: record,
                        field,
                        wire_type,
                    })
                }
                _ => {
                    return Err(TensorError::InvalidWireType {
                        input,
                        offset: record,
                        field,
                        wire_type,
                    })
                }
            };
            self.push(Piece::Input {
                start: record,
                end: pos,
            });
            size = self.grow(size, pos - record)?;
        }
        Ok(size)
    }

    /// Appends a piece, merging adjacent input ranges.
    fn push(&mut self, piece: Piece) {
        if let (
            Some(Piece::Input { end, .. }),
            Piece::Input {
                start,
                end: new_end,
            },
        ) = (self.pieces.last_mut(), piece)
        {
            if *end == start {
                *end = new_end;
                return;
            }
        }
        self.pieces.push(piece);
    }

    /// `size` plus a LEN record of `key_len` key bytes and a `len`-byte value.
    fn add(&self, size: usize, key_len: usize, len: usize) -> Result<usize, TensorError> {
        let record = key_len
            .checked_add(varint_len(len as u64))
            .and_then(|n| n.checked_add(len));
        match record {
            Some(n) => self.grow(size, n),
            None => Err(self.too_large(usize::MAX)),
        }
    }

    /// `size + n`, refusing anything beyond the message limit.
    fn grow(&self, size: usize, n: usize) -> Result<usize, TensorError> {
        match size.checked_add(n) {
            Some(total) if total <= self.limit => Ok(total),
            Some(total) => Err(self.too_large(total)),
            None => Err(self.too_large(usize::MAX)),
        }
    }

    fn too_large(&self, size: usize) -> TensorError {
        TensorError::MessageTooLarge {
            what: "output",
            size: size as u64,
            limit: self.limit as u64,
        }
    }
}

/// Reads a varint at `pos` (before `end`): the value (bits beyond 64 dropped, as upb does) and
/// the position after it.
pub(crate) fn read_varint(
    data: &[u8],
    pos: usize,
    end: usize,
    input: &'static str,
) -> Result<(u64, usize), TensorError> {
    let mut value = 0u64;
    for i in 0..10 {
        let at = pos + i;
        let Some(&byte) = data.get(at).filter(|_| at < end) else {
            return Err(TensorError::VarintTruncated { input, offset: pos });
        };
        value |= u64::from(byte & 0x7f).wrapping_shl(7 * i as u32);
        if byte < 0x80 {
            return Ok((value, at + 1));
        }
    }
    Err(TensorError::VarintTooLong { input, offset: pos })
}

/// Bytes of the minimal varint encoding of `value`.
pub(crate) const fn varint_len(value: u64) -> usize {
    // 1 + floor(bits / 7), with 0 taking one byte.
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// The minimal varints of `values` (little-endian `u32`s) one after the other: the payload of a
/// packed `repeated uint32` field holding them, as protobuf writes it (a prompt's token ids,
/// which Python would otherwise hand to protobuf one `int` object at a time).
/// [`TensorError::PartialItem`] when `values` is not a whole number of `u32`s.
pub fn uint32_varints(values: &[u8]) -> Result<Vec<u8>, TensorError> {
    if !values.len().is_multiple_of(4) {
        return Err(TensorError::PartialItem {
            arg: "values",
            len: values.len(),
            itemsize: 4,
        });
    }
    let words = || {
        values
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let len: usize = words().map(|v| varint_len(u64::from(v))).sum();
    let mut out =
        crate::memory::fallible::with_capacity(len).map_err(TensorError::oom("varints"))?;
    // Pushed byte by byte rather than through `put_varint` and a copy: half the time (33 against
    // 62 µs for 8 000 ids).
    for mut v in words() {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    Ok(out)
}

/// Writes the minimal varint of `value` into `out` (at least 10 bytes); returns its length.
pub(crate) fn put_varint(mut value: u64, out: &mut [u8; 10]) -> usize {
    let mut n = 0;
    while value >= 0x80 {
        out[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    out[n] = value as u8;
    n + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: [u8; NONCE_LEN] = *b"0123456789abcdef";

    /// Every varint length (1 to 5 bytes) at its edges, against `put_varint` of each value.
    #[test]
    fn uint32_varints_are_each_values_minimal_varint() {
        let mut values = vec![
            0u32,
            1,
            127,
            128,
            129,
            300,
            16_383,
            16_384,
            151_646,
            u32::MAX,
        ];
        for shift in [7, 14, 21, 28] {
            values.extend([(1u32 << shift) - 1, 1 << shift, (1 << shift) + 1]);
        }
        let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut expected = Vec::new();
        for &v in &values {
            let mut buf = [0u8; 10];
            let n = put_varint(u64::from(v), &mut buf);
            expected.extend_from_slice(&buf[..n]);
        }
        assert_eq!(uint32_varints(&le).unwrap(), expected);
        assert_eq!(uint32_varints(&[]).unwrap(), Vec::<u8>::new());
        assert!(matches!(
            uint32_varints(&le[..7]),
            Err(TensorError::PartialItem {
                arg: "values",
                len: 7,
                itemsize: 4
            })
        ));
    }

    fn varint(v: u64) -> Vec<u8> {
        let mut buf = [0u8; 10];
        let n = put_varint(v, &mut buf);
        buf[..n].to_vec()
    }

    fn key(field: u32, wire_type: u8) -> Vec<u8> {
        varint((u64::from(field) << 3) | u64::from(wire_type))
    }

    fn len_record(field: u32, value: &[u8]) -> Vec<u8> {
        [key(field, 2), varint(value.len() as u64), value.to_vec()].concat()
    }

    fn varint_record(field: u32, v: u64) -> Vec<u8> {
        [key(field, 0), varint(v)].concat()
    }

    fn token(i: u32) -> Vec<u8> {
        [&NONCE[..], &i.to_le_bytes()].concat()
    }

    fn tensor(payload: &[u8]) -> Vec<u8> {
        // SGLang / vLLM layout: payload = 1, shape = 2 (packed), dtype = 3.
        [
            len_record(1, payload),
            len_record(2, &[4, 2]),
            len_record(3, b"uint8"),
        ]
        .concat()
    }

    /// vLLM: GenerateRequest { mm_inputs = 7, extra_mm_inputs = 11 },
    /// MultimodalInputs { pixel_values = 2, model_specific_tensors = 3 (map) }.
    fn vllm_plan() -> Plan {
        let mm = Plan::Message(vec![
            (2, Plan::Tensor(1)),
            (3, Plan::Message(vec![(2, Plan::Tensor(1))])),
        ]);
        Plan::Message(vec![(7, mm.clone()), (11, mm)])
    }

    fn vllm_request(pixels: &[u8], grid: &[u8], extra: &[u8]) -> Vec<u8> {
        let entry = [
            len_record(1, b"image_grid_thw"),
            len_record(2, &tensor(grid)),
        ]
        .concat();
        let mm = [
            len_record(2, &tensor(pixels)),
            len_record(3, &entry),
            varint_record(4, 151655),
            len_record(6, b"hash"),
        ]
        .concat();
        let extra_mm = len_record(2, &tensor(extra));
        [
            len_record(1, b"request-1"),
            len_record(7, &mm),
            varint_record(9, 1),
            len_record(11, &extra_mm),
        ]
        .concat()
    }

    type Decoded = (Vec<u8>, Vec<(usize, usize)>);

    fn decode(data: &[u8], plan: &Plan) -> Result<Decoded, TensorError> {
        let layout = decode_frames(data, plan, &NONCE)?;
        Ok((layout.to_vec()?, layout.spans().to_vec()))
    }

    fn encode(header: &[u8], plan: &Plan, sources: &[Source<'_>]) -> Result<Vec<u8>, TensorError> {
        encode_frames(header, plan, &NONCE, sources)?.to_vec()
    }

    fn raw(bytes: &[u8]) -> Source<'_> {
        Source::new(bytes, WireDtype::Uint8, WireDtype::Uint8).unwrap()
    }

    #[test]
    fn varints_are_minimal_and_read_back() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let bytes = varint(v);
            assert_eq!(bytes.len(), varint_len(v), "{v}");
            assert_eq!(
                read_varint(&bytes, 0, bytes.len(), "data"),
                Ok((v, bytes.len()))
            );
        }
        // Bits beyond 64 in the tenth byte are dropped, as upb does.
        let over = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(read_varint(&over, 0, 10, "data"), Ok((u64::MAX, 10)));
    }

    #[test]
    fn decode_replaces_payloads_along_the_plan() {
        let pixels: Vec<u8> = (0..=255).collect();
        let data = vllm_request(&pixels, b"grid-bytes", b"extra");
        let (header, spans) = decode(&data, &vllm_plan()).unwrap();
        assert_eq!(header, vllm_request(&token(0), &token(1), &token(2)));
        let payloads: Vec<&[u8]> = spans.iter().map(|&(o, l)| &data[o..o + l]).collect();
        assert_eq!(payloads, [&pixels[..], b"grid-bytes", b"extra"]);
    }

    #[test]
    fn encode_is_the_inverse_of_decode() {
        let pixels = vec![7u8; 1000];
        let data = vllm_request(&pixels, b"grid", b"");
        let (header, spans) = decode(&data, &vllm_plan()).unwrap();
        let sources: Vec<Source<'_>> = spans.iter().map(|&(o, l)| raw(&data[o..o + l])).collect();
        assert_eq!(encode(&header, &vllm_plan(), &sources).unwrap(), data);
    }

    #[test]
    fn a_bare_tensor_plan_and_repeated_payloads() {
        let data = [
            len_record(1, b"first"),
            len_record(3, b"uint8"),
            len_record(1, b"second"),
        ]
        .concat();
        let (header, spans) = decode(&data, &Plan::Tensor(1)).unwrap();
        let expected = [
            len_record(1, &token(0)),
            len_record(3, b"uint8"),
            len_record(1, &token(1)),
        ]
        .concat();
        assert_eq!(header, expected);
        assert_eq!(spans, [(2, 5), (16, 6)]);
        // TokenSpeed: payload is field 3, so field 1 (packed shape) stays as it is.
        let ts = [
            len_record(1, &[2, 3]),
            len_record(2, b"uint8"),
            len_record(3, b"xyzxyz"),
        ]
        .concat();
        let (header, spans) = decode(&ts, &Plan::Tensor(3)).unwrap();
        assert_eq!(
            header,
            [
                len_record(1, &[2, 3]),
                len_record(2, b"uint8"),
                len_record(3, &token(0))
            ]
            .concat()
        );
        assert_eq!(spans, [(ts.len() - 6, 6)]);
    }

    #[test]
    fn other_wire_types_and_unplanned_fields_are_copied_verbatim() {
        let data = [
            varint_record(7, 5),                    // planned field, varint wire type
            [key(7, 1), vec![1; 8]].concat(),       // planned field, fixed64
            [key(7, 5), vec![2; 4]].concat(),       // planned field, fixed32
            len_record(8, &tensor(b"not planned")), // unplanned LEN
            len_record(1, b"payload number, top level"),
        ]
        .concat();
        let (header, spans) = decode(&data, &vllm_plan()).unwrap();
        assert_eq!(header, data);
        assert!(spans.is_empty());
        // Inside a tensor, a non-LEN record of the payload field is kept too.
        let data = [varint_record(1, 3), len_record(1, b"p")].concat();
        let (header, _) = decode(&data, &Plan::Tensor(1)).unwrap();
        assert_eq!(
            header,
            [varint_record(1, 3), len_record(1, &token(0))].concat()
        );
    }

    #[test]
    fn enclosing_lengths_are_reencoded_minimally() {
        // A 200-byte payload needs a 2-byte length; its token a 1-byte one, and the enclosing
        // message shrinks from a 2-byte to a 1-byte length prefix.
        let inner = len_record(1, &[9u8; 200]);
        let data = len_record(5, &inner);
        let plan = Plan::Message(vec![(5, Plan::Tensor(1))]);
        let (header, spans) = decode(&data, &plan).unwrap();
        assert_eq!(header, len_record(5, &len_record(1, &token(0))));
        assert_eq!(spans, [(6, 200)]);
        // A non-minimal input length prefix (0x85 0x00 = 5) comes out minimal.
        let padded = [key(5, 2), vec![0x85, 0x00], len_record(3, b"abc")].concat();
        let (header, _) = decode(&padded, &plan).unwrap();
        assert_eq!(header, len_record(5, &len_record(3, b"abc")));
    }

    #[test]
    fn a_message_holds_at_most_max_tensors_payloads() {
        let plan = Plan::Message(vec![(5, Plan::Tensor(1))]);
        let one = len_record(5, &len_record(1, b"abcd"));
        let full = one.repeat(MAX_TENSORS);
        let (_, spans) = decode(&full, &plan).unwrap();
        assert_eq!(spans.len(), MAX_TENSORS);
        let over = [full, one].concat();
        let err = decode_frames(&over, &plan, &NONCE).unwrap_err();
        assert_eq!(err, TensorError::TooManyTensors { max: MAX_TENSORS });
        assert_eq!(
            err.to_string(),
            "data: more than 65536 tensor payloads in one message (a request holds a few per \
             item)"
        );
    }

    #[test]
    fn encode_converts_sources_and_keeps_foreign_payloads() {
        let floats: Vec<u8> = [1.0f32, -2.5, f32::NAN]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let foreign = [&b"fedcba9876543210"[..], &0u32.to_le_bytes()].concat(); // other nonce
        let header = [
            len_record(1, &token(0)),
            len_record(1, &foreign),
            len_record(1, b"short"),
            len_record(1, &token(1)),
            len_record(1, &token(0)),
        ]
        .concat();
        let sources = [
            Source::new(&floats, WireDtype::Float32, WireDtype::Bfloat16).unwrap(),
            Source::new(&floats, WireDtype::Float32, WireDtype::Float16).unwrap(),
        ];
        let bf16 =
            super::super::convert::convert_to_vec(&floats, WireDtype::Float32, WireDtype::Bfloat16)
                .unwrap();
        let f16 =
            super::super::convert::convert_to_vec(&floats, WireDtype::Float32, WireDtype::Float16)
                .unwrap();
        let out = encode(&header, &Plan::Tensor(1), &sources).unwrap();
        let expected = [
            len_record(1, &bf16),
            len_record(1, &foreign),
            len_record(1, b"short"),
            len_record(1, &f16),
            len_record(1, &bf16),
        ]
        .concat();
        assert_eq!(out, expected);
        assert_eq!(sources[0].wire_len(), 6);
    }

    #[test]
    fn large_tensors_are_written_in_parallel_identically() {
        let big: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let header = len_record(
            4,
            &[len_record(1, &token(0)), len_record(3, b"float32")].concat(),
        );
        let plan = Plan::Message(vec![(4, Plan::Tensor(1))]);
        let sources = [Source::new(&big, WireDtype::Float32, WireDtype::Bfloat16).unwrap()];
        let out = encode(&header, &plan, &sources).unwrap();
        let bf16 =
            super::super::convert::convert_to_vec(&big, WireDtype::Float32, WireDtype::Bfloat16)
                .unwrap();
        let expected = len_record(
            4,
            &[len_record(1, &bf16), len_record(3, b"float32")].concat(),
        );
        assert!(out == expected);
        let (header_again, spans) = decode(&out, &plan).unwrap();
        assert_eq!(header_again, header);
        assert_eq!(&out[spans[0].0..spans[0].0 + spans[0].1], &bf16[..]);
    }

    /// A producer that writes a constant byte and says how many threads it writes with.
    struct Constant(usize, usize);

    // SAFETY: `produce` fills every byte of `out` (or fails on a wrong size).
    unsafe impl Produce for Constant {
        fn wire_len(&self, _: WireDtype) -> Option<usize> {
            Some(self.0)
        }
        fn produce(&self, out: &mut [MaybeUninit<u8>], _: WireDtype) -> Result<(), TensorError> {
            if out.len() != self.0 {
                return Err(TensorError::DestinationSize {
                    expected: self.0,
                    actual: out.len(),
                });
            }
            out.fill(MaybeUninit::new(9));
            Ok(())
        }
        fn writers(&self) -> usize {
            self.1
        }
    }

    #[test]
    fn writers_are_the_busiest_tensors() {
        let header = [
            len_record(1, &len_record(1, &token(0))),
            len_record(2, &len_record(1, &token(1))),
        ]
        .concat();
        let plan = Plan::Message(vec![(1, Plan::Tensor(1)), (2, Plan::Tensor(1))]);
        let big = vec![0u8; 64 << 20];
        let small = Constant(10, 1);
        let busy = Constant(10, 5);
        for (sources, expected) in [
            (
                vec![
                    raw(b"ab"),
                    Source::produced(&small, WireDtype::Uint8).unwrap(),
                ],
                1,
            ),
            (
                vec![
                    raw(b"ab"),
                    Source::produced(&busy, WireDtype::Uint8).unwrap(),
                ],
                5,
            ),
            (vec![raw(&big), raw(b"ab")], default_threads(big.len())),
        ] {
            let layout = encode_frames(&header, &plan, &NONCE, &sources).unwrap();
            assert_eq!(layout.writers(), expected);
        }
        assert!(default_threads(big.len()) >= 1);
        let message = len_record(1, &big);
        let decoded = decode_frames(&message, &Plan::Tensor(1), &NONCE).unwrap();
        assert_eq!(decoded.writers(), 1, "a header has no tensors to write");
    }

    // ---- every error variant from hand-crafted bytes ----

    fn decode_err(data: &[u8], plan: &Plan) -> TensorError {
        decode_frames(data, plan, &NONCE).unwrap_err()
    }

    #[test]
    fn truncated_varints() {
        let plan = Plan::Tensor(1);
        // Key cut short.
        assert_eq!(
            decode_err(&[0x08, 0x01, 0x80], &plan),
            TensorError::VarintTruncated {
                input: "data",
                offset: 2
            }
        );
        // Varint value cut short.
        assert_eq!(
            decode_err(&[0x08, 0xff], &plan),
            TensorError::VarintTruncated {
                input: "data",
                offset: 1
            }
        );
        // Length cut short, and a varint cut by the end of an enclosing message (not the
        // buffer): the nested message claims 2 bytes, "0x08 0x96" then "0x01" outside.
        let nested = [0x2a, 0x02, 0x08, 0x96, 0x01];
        let err = decode_err(&nested, &Plan::Message(vec![(5, Plan::Tensor(1))]));
        assert_eq!(
            err,
            TensorError::VarintTruncated {
                input: "data",
                offset: 3
            }
        );
        assert_eq!(err.to_string(), "data: truncated varint at byte 3");
    }

    #[test]
    fn overlong_varint() {
        let data = [&[0x08][..], &[0x80; 10], &[0x01]].concat();
        let err = decode_err(&data, &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::VarintTooLong {
                input: "data",
                offset: 1
            }
        );
        assert!(err.to_string().contains("longer than 10 bytes at byte 1"));
    }

    #[test]
    fn field_number_zero() {
        let err = decode_err(&[0x08, 0x00, 0x02, 0x00], &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::FieldNumberZero {
                input: "data",
                offset: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "data: field number 0 in the record at byte 2"
        );
    }

    #[test]
    fn field_number_too_large() {
        // Field 2^29 (one past the maximum): key = 2^32, a 5-byte varint.
        let data = [varint(1 << 32), vec![0]].concat();
        let err = decode_err(&data, &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::FieldNumberTooLarge {
                input: "data",
                offset: 0,
                field: 1 << 29
            }
        );
        assert!(err.to_string().contains("536870912"), "{err}");
        // The largest field number is fine.
        let ok = [key(MAX_FIELD_NUMBER, 0), vec![0]].concat();
        assert_eq!(decode(&ok, &Plan::Tensor(1)).unwrap().0, ok);
        // 19000..=19999 (reserved for the implementation) is allowed on the wire.
        let reserved = varint_record(19_500, 1);
        assert_eq!(decode(&reserved, &Plan::Tensor(1)).unwrap().0, reserved);
    }

    #[test]
    fn group_wire_types() {
        for wire_type in [3u8, 4] {
            let data = [varint_record(1, 0), key(9, wire_type)].concat();
            let err = decode_err(&data, &Plan::Tensor(1));
            assert_eq!(
                err,
                TensorError::GroupWireType {
                    input: "data",
                    offset: 2,
                    field: 9,
                    wire_type
                }
            );
            assert!(err.to_string().contains("(field 9) at byte 2"), "{err}");
        }
    }

    #[test]
    fn invalid_wire_types() {
        for wire_type in [6u8, 7] {
            let err = decode_err(&key(2, wire_type), &Plan::Tensor(1));
            assert_eq!(
                err,
                TensorError::InvalidWireType {
                    input: "data",
                    offset: 0,
                    field: 2,
                    wire_type
                }
            );
            assert!(err
                .to_string()
                .contains(&format!("invalid wire type {wire_type}")));
        }
    }

    #[test]
    fn fixed_values_cut_short() {
        let err = decode_err(&[key(3, 1), vec![0; 7]].concat(), &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::FixedTruncated {
                input: "data",
                offset: 0,
                field: 3,
                needed: 8,
                available: 7
            }
        );
        let err = decode_err(&[key(3, 5), vec![0; 3]].concat(), &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::FixedTruncated {
                input: "data",
                offset: 0,
                field: 3,
                needed: 4,
                available: 3
            }
        );
        assert_eq!(
            err.to_string(),
            "data: field 3 at byte 0 needs 4 bytes, only 3 remain"
        );
    }

    #[test]
    fn lengths_beyond_the_message() {
        let err = decode_err(&[0x0a, 0x05, 1, 2, 3], &Plan::Tensor(1));
        assert_eq!(
            err,
            TensorError::LengthTruncated {
                input: "data",
                offset: 0,
                field: 1,
                length: 5,
                available: 3
            }
        );
        // Offsets are absolute: the bad record is inside a nested message at byte 2, and its
        // limit is the nested message's end, not the buffer's.
        let data = [0x2a, 0x03, 0x0a, 0x02, 0x61, 0x62, 0x63];
        let err = decode_err(&data, &Plan::Message(vec![(5, Plan::Tensor(1))]));
        assert_eq!(
            err,
            TensorError::LengthTruncated {
                input: "data",
                offset: 2,
                field: 1,
                length: 2,
                available: 1
            }
        );
        // A length beyond u64 → usize range is the same error.
        let huge = [key(1, 2), varint(u64::MAX)].concat();
        assert!(matches!(
            decode_err(&huge, &Plan::Tensor(1)),
            TensorError::LengthTruncated {
                length: u64::MAX,
                available: 0,
                ..
            }
        ));
    }

    #[test]
    fn nonce_must_be_16_bytes() {
        for len in [0, 15, 17, 20] {
            let nonce = vec![0u8; len];
            assert_eq!(
                decode_frames(b"", &Plan::Tensor(1), &nonce).unwrap_err(),
                TensorError::NonceLength { len }
            );
            assert_eq!(
                encode_frames(b"", &Plan::Tensor(1), &nonce, &[]).unwrap_err(),
                TensorError::NonceLength { len }
            );
        }
        assert_eq!(
            TensorError::NonceLength { len: 3 }.to_string(),
            "nonce: must be exactly 16 bytes, got 3"
        );
    }

    #[test]
    fn token_index_out_of_range() {
        let header = [len_record(2, b"x"), len_record(1, &token(2))].concat();
        let floats = [0u8; 8];
        let sources = [raw(&floats), raw(&floats)];
        let err = encode_frames(&header, &Plan::Tensor(1), &NONCE, &sources).unwrap_err();
        assert_eq!(
            err,
            TensorError::TokenIndexOutOfRange {
                offset: 5,
                index: 2,
                count: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "header: token at byte 5 names tensor 2, but only 2 sources are attached"
        );
        let err = encode_frames(
            &len_record(1, &token(u32::MAX)),
            &Plan::Tensor(1),
            &NONCE,
            &[],
        )
        .unwrap_err();
        assert!(matches!(
            err,
            TensorError::TokenIndexOutOfRange {
                index: u32::MAX,
                count: 0,
                ..
            }
        ));
    }

    #[test]
    fn messages_beyond_the_size_limit() {
        let data = len_record(1, &[0u8; 20]);
        assert_eq!(
            decode_frames_limited(&data, &Plan::Tensor(1), &NONCE, 21).unwrap_err(),
            TensorError::MessageTooLarge {
                what: "data",
                size: 22,
                limit: 21
            }
        );
        assert_eq!(
            encode_frames_limited(&data, &Plan::Tensor(1), &NONCE, &[], 21).unwrap_err(),
            TensorError::MessageTooLarge {
                what: "header",
                size: 22,
                limit: 21
            }
        );
        // The header fits, the tensor written into it does not: key 1 + length 1 + 100 > 64.
        let big = [0u8; 100];
        let sources = [raw(&big)];
        let header = len_record(1, &token(0));
        let err =
            encode_frames_limited(&header, &Plan::Tensor(1), &NONCE, &sources, 64).unwrap_err();
        assert_eq!(
            err,
            TensorError::MessageTooLarge {
                what: "output",
                size: 102,
                limit: 64
            }
        );
        assert!(err
            .to_string()
            .contains("102 bytes exceeds the protobuf message limit of 64"));
        // Exactly at the limit is fine.
        assert!(encode_frames_limited(&header, &Plan::Tensor(1), &NONCE, &sources, 101).is_err());
        assert!(encode_frames_limited(&header, &Plan::Tensor(1), &NONCE, &sources, 102).is_ok());
    }

    #[test]
    fn write_into_uninit_initialises_everything() {
        let big = vec![3u8; (1 << 20) + 3]; // a verbatim stretch of more than 1 MiB
        let data = [len_record(9, &big), len_record(1, b"abc")].concat();
        let layout = decode_frames(&data, &Plan::Tensor(1), &NONCE).unwrap();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); layout.len()];
        let out = layout.write_into_uninit(&mut buf).unwrap();
        assert!(*out == *[len_record(9, &big), len_record(1, &token(0))].concat());
        let mut short = vec![MaybeUninit::<u8>::uninit(); layout.len() - 1];
        assert!(matches!(
            layout.write_into_uninit(&mut short),
            Err(TensorError::DestinationSize { .. })
        ));
    }

    #[test]
    fn write_into_needs_the_exact_size() {
        let data = len_record(1, b"abc");
        let layout = decode_frames(&data, &Plan::Tensor(1), &NONCE).unwrap();
        assert_eq!(layout.len(), 22);
        assert!(!layout.is_empty());
        for wrong in [21, 23] {
            let mut out = vec![0u8; wrong];
            assert_eq!(
                layout.write_into(&mut out).unwrap_err(),
                TensorError::DestinationSize {
                    expected: 22,
                    actual: wrong
                }
            );
        }
    }

    #[test]
    fn sources_must_hold_whole_items() {
        let odd = [0u8; 6];
        assert_eq!(
            Source::new(&odd, WireDtype::Float32, WireDtype::Float32).unwrap_err(),
            TensorError::PartialItem {
                arg: "sources",
                len: 6,
                itemsize: 4
            }
        );
        assert_eq!(
            Source::new(&odd, WireDtype::Int64, WireDtype::Float16).unwrap_err(),
            TensorError::UnsupportedConversion {
                from: WireDtype::Int64,
                to: WireDtype::Float16
            }
        );
    }

    #[test]
    fn plans_are_validated() {
        for (bad, path) in [
            (Plan::Tensor(0), "plan"),
            (Plan::Tensor(MAX_FIELD_NUMBER + 1), "plan"),
            (Plan::Message(vec![(0, Plan::Tensor(1))]), "plan[0][0]"),
            (
                Plan::Message(vec![(3, Plan::Message(vec![(1, Plan::Tensor(0))]))]),
                "plan[0][1][0][1]",
            ),
        ] {
            let err = decode_frames(b"", &bad, &NONCE).unwrap_err();
            assert!(
                matches!(&err, TensorError::PlanFieldNumber { path: p, .. } if p == path),
                "{err:?}"
            );
        }
        assert_eq!(
            Plan::field_number(-1, "plan[2][0]")
                .unwrap_err()
                .to_string(),
            "plan: field number -1 at plan[2][0] is outside 1..=536870911"
        );
        assert_eq!(
            Plan::field_number(536_870_911, "plan"),
            Ok(MAX_FIELD_NUMBER)
        );

        let dup = Plan::Message(vec![
            (3, Plan::Tensor(1)),
            (4, Plan::Tensor(1)),
            (3, Plan::Tensor(1)),
        ]);
        let err = encode_frames(b"", &dup, &NONCE, &[]).unwrap_err();
        assert_eq!(
            err,
            TensorError::PlanDuplicateField {
                path: "plan".into(),
                field: 3
            }
        );
        assert_eq!(
            err.to_string(),
            "plan: field 3 appears twice in the message plan at plan"
        );

        let mut deep = Plan::Tensor(1);
        for _ in 0..=MAX_DEPTH {
            deep = Plan::Message(vec![(1, deep)]);
        }
        let err = decode_frames(b"", &deep, &NONCE).unwrap_err();
        assert!(
            matches!(err, TensorError::PlanTooDeep { max: MAX_DEPTH, .. }),
            "{err:?}"
        );
        // One level less is allowed, and data nested that deep decodes.
        let Plan::Message(mut fields) = deep else {
            unreachable!()
        };
        let ok = fields.remove(0).1;
        let mut data = len_record(1, b"payload");
        for _ in 0..MAX_DEPTH {
            data = len_record(1, &data);
        }
        let (_, spans) = decode(&data, &ok).unwrap();
        assert_eq!(spans.len(), 1);
    }

    #[test]
    fn binding_only_errors_have_messages() {
        let cases = [
            (
                TensorError::NotContiguous { arg: "src" },
                "src: array is not C-contiguous",
            ),
            (
                TensorError::ReadOnly { arg: "dst" },
                "dst: array is read-only",
            ),
            (
                TensorError::DestinationDtype {
                    numpy: "<f4".into(),
                },
                "dst: dtype must be uint8 ('|u1'), got \"<f4\"",
            ),
            (
                TensorError::Overlap {
                    src: 16,
                    src_len: 8,
                    dst: 20,
                    dst_len: 8,
                },
                "dst: memory [0x14, +8) overlaps src [0x10, +8)",
            ),
        ];
        for (err, msg) in cases {
            assert_eq!(err.to_string(), msg);
        }
    }

    /// Deterministic mutation fuzzing of the parser: only `Ok` or `Err`, never a panic, and
    /// every `Ok` layout writes and re-decodes consistently.
    #[test]
    fn mutated_inputs_never_panic() {
        let seeds = [
            vllm_request(&[1u8; 40], b"grid", b"e"),
            [
                len_record(1, b"payload"),
                len_record(3, b"float32"),
                varint_record(2, 7),
            ]
            .concat(),
            len_record(5, &len_record(5, &len_record(1, b"deep"))),
        ];
        let plans = [
            vllm_plan(),
            Plan::Tensor(1),
            Plan::Message(vec![(5, Plan::Message(vec![(5, Plan::Tensor(1))]))]),
        ];
        let iterations = if cfg!(debug_assertions) {
            20_000
        } else {
            200_000
        };
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ok, mut err) = (0usize, 0usize);
        let mut input = Vec::new();
        for i in 0..iterations {
            let seed = &seeds[i % seeds.len()];
            input.clear();
            input.extend_from_slice(seed);
            for _ in 0..=(next() % 4) {
                let r = next();
                let at = (r >> 8) as usize % (input.len() + 1);
                match r % 6 {
                    0 if at < input.len() => input[at] = (r >> 40) as u8,
                    1 if at < input.len() => input[at] ^= 1 << ((r >> 40) % 8),
                    2 => input.insert(at, (r >> 40) as u8),
                    3 if at < input.len() => {
                        input.remove(at);
                    }
                    4 => input.truncate(at),
                    _ => input
                        .splice(
                            at..at,
                            [0x80, 0xff, 0x0a, 0x7f][..(r >> 50) as usize % 4 + 1]
                                .iter()
                                .copied(),
                        )
                        .for_each(drop),
                }
            }
            let plan = &plans[(next() % plans.len() as u64) as usize];
            match decode_frames(&input, plan, &NONCE) {
                Ok(layout) => {
                    ok += 1;
                    let header = layout.to_vec().unwrap();
                    let again = decode_frames(&header, plan, &NONCE).map(|l| l.spans().len());
                    assert_eq!(again, Ok(layout.spans().len()));
                    for &(o, l) in layout.spans() {
                        assert!(o + l <= input.len());
                    }
                }
                Err(_) => err += 1,
            }
            let _ = encode_frames(&input, plan, &NONCE, &[]);
        }
        assert!(
            ok > iterations / 20 && err > iterations / 20,
            "ok {ok}, err {err}"
        );
    }
}
