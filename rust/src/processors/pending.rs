//! A family's `float32` tensor whose values are not written yet.
//!
//! A processor that computes its `pixel_values` into a buffer of its own has them copied again
//! when they go into a serialized request or a shared-memory segment: the largest tensor of a
//! request written twice and read once more. Kept as a [`Pending`] instead, the tensor is only
//! planned (every image decoded, resized and laid out; its shape known), and its values are
//! written once, where they travel ([`Produce`]), or into a new buffer when an array is asked
//! for ([`Pending::values`]). The Qwen families have a writer of their own (`qwen::Patches`,
//! which also writes `bfloat16` directly); LLaVA-NeXT, Gemma 3, InternVL and Idefics3 plan their
//! batch as [`Tiles`] (windows of resized images, and padding), and their eager path runs the
//! same writer on a new buffer, so both paths give the same bytes by construction. A writer is
//! a [`WriteValues`].

use std::mem::MaybeUninit;

use super::normalize::Normalize;
use super::store::{bytes_of, unaligned_of, Unaligned};
use super::{
    checked_len, owned_rgb, parallel, recycle_images, Deferred, OutBuffer, Outputs, ProcessorError,
    Rgb, Tensor, TensorData,
};
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

/// The writer of every tiled family here (LLaVA-NeXT, Gemma 3, InternVL, Idefics3): `pixel_values`
/// as a run of `3 × h × w` slots, each an `h × w` window of one of `images` written
/// channels-first (`Normalize::write_chw`: outside the image, the normalised zero) or, for a
/// batch's padding, zeros; one slot per job.
pub(crate) struct Tiles<'a> {
    pub images: Vec<Rgb<'a>>,
    /// Per slot: the image and the window's top-left corner in it, or `None` for zeros.
    pub slots: Vec<Option<(usize, (isize, isize))>>,
    /// `(h, w)` of every slot.
    pub size: (usize, usize),
    pub normalize: Normalize,
    pub threads: usize,
}

impl<'a> Tiles<'a> {
    /// Values per slot.
    fn slot_len(&self) -> usize {
        3 * self.size.0 * self.size.1
    }

    /// Threads [`WriteValues::write`] uses.
    pub fn workers(&self) -> usize {
        parallel::workers(self.threads, self.slots.len())
    }

    /// The planned tensor `name` of `shape` (as many values as the slots hold).
    pub fn pending(
        self,
        name: &'static str,
        shape: Vec<usize>,
    ) -> Result<Pending<'a>, ProcessorError> {
        let workers = self.workers();
        Pending::new(name, shape, workers, Box::new(self))
    }
}

// SAFETY: `write` checks that `out` holds `slots.len() · 3·h·w` values and hands each slot the
// next `3·h·w` of them: `write_chw` writes every value of its `3 × h × w` output (the image's
// pixels or, outside them, the normalised zero), and a padding slot is filled with zeros.
unsafe impl WriteValues for Tiles<'_> {
    fn write(&self, out: &mut [Unaligned]) {
        let len = self.slot_len();
        // `Pending` passes exactly the tensor's values; anything else would leave some unwritten.
        assert_eq!(
            out.len(),
            self.slots.len() * len,
            "{} slots",
            self.slots.len()
        );
        let (h, w) = self.size;
        let jobs: Vec<_> = self.slots.iter().zip(out.chunks_mut(len)).collect();
        parallel::map(jobs, self.workers(), |_, (slot, out)| match *slot {
            Some((image, (top, left))) => {
                self.normalize
                    .write_chw(self.images[image].view(), top, left, h, w, out)
            }
            None => out.iter_mut().for_each(|v| v.set(0.0)),
        });
    }

    fn into_owned(mut self: Box<Self>) -> Result<Box<dyn WriteValues>, ProcessorError> {
        let images = std::mem::take(&mut self.images)
            .into_iter()
            .map(owned_rgb)
            .collect::<Result<_, _>>()?;
        Ok(Box::new(Tiles {
            images,
            slots: std::mem::take(&mut self.slots),
            size: self.size,
            normalize: self.normalize.clone(),
            threads: self.threads,
        }))
    }
}

impl Drop for Tiles<'_> {
    fn drop(&mut self) {
        recycle_images(std::mem::take(&mut self.images));
    }
}

/// A planned batch's outputs: the pending tensor written into a new buffer, first, then the
/// others (a family's eager `images`).
pub fn written(
    planned: Result<(Pending<'_>, Outputs), ProcessorError>,
) -> Result<Outputs, ProcessorError> {
    let (pending, mut outputs) = planned?;
    outputs
        .tensors
        .insert(0, (pending.name(), pending.tensor()?));
    Ok(outputs)
}

/// A planned batch left unwritten ([`Deferred::Values`], a family's `images_deferred`).
pub fn deferred(
    planned: Result<(Pending<'_>, Outputs), ProcessorError>,
) -> Result<Deferred<'_>, ProcessorError> {
    let (pending, rest) = planned?;
    Ok(Deferred::Values {
        pending: Box::new(pending),
        rest,
    })
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
