//! A family's `float32` tensor whose values are not written yet.
//!
//! A processor that computes its `pixel_values` into a buffer of its own has them copied again
//! when they go into a serialized request or a shared-memory segment: the largest tensor of a
//! request written twice and read once more. Kept as a [`Pending`] instead, the tensor is only
//! planned (every image decoded, resized and laid out; its shape known), and its values are
//! written once, where they travel ([`Produce`]), or into a new buffer when an array is asked
//! for ([`Pending::values`]). The Qwen families have a writer of their own (`qwen::Patches`,
//! which also writes `bfloat16` directly); a family whose writes go through
//! [`super::normalize::Slot`]s implements [`WriteValues`] once, and its eager path calls the
//! same writer on a new buffer, so both paths give the same bytes by construction.

use std::mem::MaybeUninit;

use super::store::{bytes_of, unaligned_of, Unaligned};
use super::{checked_len, OutBuffer, ProcessorError, Tensor, TensorData};
use crate::memory::recycle;
use crate::tensor::convert::Conversion;
use crate::tensor::dtype::WireDtype;
use crate::tensor::wire::Produce;
use crate::tensor::TensorError;

/// What writes a pending tensor's values.
///
/// # Safety
///
/// [`write`](Self::write) must write every value of `out` (all four bytes of each
/// [`Unaligned`]): [`Pending`] then hands that memory out as initialised `float32` values or
/// bytes (an array, a serialized request).
pub unsafe trait WriteValues: Send + Sync {
    /// Writes every value of the tensor into `out`, which holds exactly as many values (at any
    /// byte address).
    fn write(&self, out: &mut [Unaligned]);

    /// The same writer owning everything it reads (an input array it would borrow from the
    /// caller is copied).
    fn into_owned(self: Box<Self>) -> Result<Box<dyn WriteValues>, ProcessorError>;
}

/// A `float32` tensor planned but not written (see the module docs).
pub struct Pending<'a> {
    name: &'static str,
    shape: Vec<usize>,
    len: usize,
    /// Threads the writer writes with (a fresh destination is faulted in by as many).
    threads: usize,
    writer: Box<dyn WriteValues + 'a>,
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("threads", &self.threads)
            .finish()
    }
}

impl<'a> Pending<'a> {
    /// A tensor `name` of `shape` that `writer` writes with `threads` threads; refused when its
    /// size overflows.
    pub fn new(
        name: &'static str,
        shape: Vec<usize>,
        threads: usize,
        writer: Box<dyn WriteValues + 'a>,
    ) -> Result<Self, ProcessorError> {
        let len = checked_len(name, &shape, 4)?;
        Ok(Pending {
            name,
            shape,
            len,
            threads: threads.max(1),
            writer,
        })
    }

    /// transformers' name of the tensor.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The size of the values in bytes (`float32`).
    pub fn byte_len(&self) -> usize {
        self.len * 4
    }

    /// The values, written into a new buffer (a recycled one when the cache has it).
    pub fn values(&self) -> Result<Vec<f32>, ProcessorError> {
        let mut values = OutBuffer::new(self.name, self.len)?;
        if let Some(out) = values.slices(&[self.len]).pop() {
            self.writer.write(unaligned_of(bytes_of(out)));
        }
        // SAFETY: the single slice covers the whole buffer, and `WriteValues::write` writes
        // every value of its output.
        Ok(unsafe { values.finish() })
    }

    /// The tensor, written into a new buffer.
    pub fn tensor(&self) -> Result<Tensor, ProcessorError> {
        Ok(Tensor {
            shape: self.shape.clone(),
            data: TensorData::F32(self.values()?),
        })
    }

    /// The same tensor owning everything its writer reads.
    pub fn into_owned(self) -> Result<Pending<'static>, ProcessorError> {
        Ok(Pending {
            name: self.name,
            shape: self.shape,
            len: self.len,
            threads: self.threads,
            writer: self.writer.into_owned()?,
        })
    }
}

// SAFETY: `produce` returns `Ok` only after every byte of `out` is written: as `float32` by the
// writer, which writes every value of its output (`WriteValues::write`), over exactly
// `out.len() / 4` values (the length is checked first); as `bfloat16` by `convert_uninit`,
// which initialises all of its destination when it returns `Ok`.
unsafe impl Produce for Pending<'_> {
    /// `float32`, or `bfloat16` (the same values rounded to nearest even).
    fn wire_len(&self, dtype: WireDtype) -> Option<usize> {
        match dtype {
            WireDtype::Float32 => Some(self.len * 4),
            WireDtype::Bfloat16 => Some(self.len * 2),
            _ => None,
        }
    }

    fn produce(&self, out: &mut [MaybeUninit<u8>], dtype: WireDtype) -> Result<(), TensorError> {
        let expected = self
            .wire_len(dtype)
            .ok_or(TensorError::UnsupportedConversion {
                from: WireDtype::Float32,
                to: dtype,
            })?;
        if out.len() != expected {
            return Err(TensorError::DestinationSize {
                expected,
                actual: out.len(),
            });
        }
        match dtype {
            WireDtype::Float32 => self.writer.write(unaligned_of(out)),
            _ => {
                // bfloat16: the float32 values first (a buffer the cache keeps for the next
                // call), then rounded into place, as `tensors.convert` rounds them.
                let values = self.values().map_err(|_| TensorError::OutOfMemory {
                    what: self.name,
                    bytes: self.byte_len() as u64,
                })?;
                // SAFETY: the bytes of `values`, a live `Vec<f32>` (any `f32` is 4 initialised
                // bytes); borrowed only until the conversion below returns.
                let bytes = unsafe {
                    std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), values.len() * 4)
                };
                let converted = Conversion::new(WireDtype::Float32, dtype)?.convert_uninit(
                    bytes,
                    out,
                    self.threads,
                );
                recycle::give_f32(values);
                converted?;
            }
        }
        Ok(())
    }

    fn writers(&self) -> usize {
        self.threads
    }
}
