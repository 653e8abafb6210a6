//! A family's `float32` tensor whose values are not written yet.
//!
//! A processor that computes its `pixel_values` into a buffer of its own has them copied again
//! when they go into a serialized request or a shared-memory segment: the largest tensor of a
//! request written twice and read once more. Kept as a [`Pending`] instead, the tensor is only
//! planned (every image decoded, resized and laid out; its shape known), and its values are
//! written once, where they travel ([`Produce`]), or into a new buffer when an array is asked
//! for ([`Pending::values`]). The Qwen families have a writer of their own (`qwen::Patches`,
//! which also writes `bfloat16` directly); LLaVA-NeXT, Gemma 3, InternVL, Idefics3 and Llama 3.2
//! Vision plan their batch as [`Tiles`] (windows of resized images, and padding), Gemma 4 as its
//! patches (`gemma4::plan_patches`); their eager path runs the same writer on a new buffer, so
//! both paths give the same bytes by construction. A writer is a [`WriteValues`]. A tensor of
//! one constant value (Idefics3's `pixel_attention_mask`, all ones) is planned as a [`Filled`].

use std::mem::MaybeUninit;

use super::normalize::Normalize;
use super::store::{
    bytes_of, copy_raw, fence, unaligned_of, Element, Unaligned, PRODUCE_STREAM_MIN_BYTES,
};
use super::{
    checked_len, owned_rgb, parallel, recycle_images, Deferred, OutBuffer, Outputs, ProcessorError,
    Rgb, Tensor, TensorData,
};
use crate::memory::{fallible, recycle};
use crate::tensor::convert::Conversion;
use crate::tensor::dtype::WireDtype;
use crate::tensor::wire::Produce;
use crate::tensor::TensorError;

/// What writes a pending tensor's values.
///
/// # Safety
///
/// [`write`](Self::write) must write every value of `out` (all four bytes of each
/// [`Unaligned`]), and [`write_bf16`](Self::write_bf16), when it returns `true`, every byte of
/// its `out`: [`Pending`] then hands that memory out as initialised `float32` values or bytes
/// (an array, a serialized request).
pub unsafe trait WriteValues: Send + Sync {
    /// Writes every value of the tensor into `out`, which holds exactly as many values (at any
    /// byte address).
    fn write(&self, out: &mut [Unaligned]);

    /// Writes every value of the tensor into `out` (exactly as many `bfloat16` values, at any
    /// byte address), each rounded as `f32_to_bf16` rounds, and returns `true`; or writes
    /// nothing and returns `false` where this writer has no such path (the caller then rounds
    /// the `float32` values). A caller reads the bytes only after a `true`.
    fn write_bf16(&self, out: &mut [MaybeUninit<u8>]) -> bool {
        let _ = out;
        false
    }

    /// The same writer owning everything it reads (an input array it would borrow from the
    /// caller is copied).
    fn into_owned(self: Box<Self>) -> Result<Box<dyn WriteValues>, ProcessorError>;
}

/// The bytes of `values` (the same memory, viewed byte by byte).
pub(crate) fn bytes_of_unaligned(values: &mut [Unaligned]) -> &mut [MaybeUninit<u8>] {
    let len = std::mem::size_of_val(values);
    // SAFETY: the pointer and length cover exactly the memory of `values`, which the result
    // reborrows mutably; an `Unaligned` is four `MaybeUninit<u8>` (alignment 1), and whatever
    // bytes are written make valid `Unaligned` values.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<MaybeUninit<u8>>(), len) }
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

/// The images a planned writer reads: handed back to the buffer cache when it is dropped.
pub(crate) struct Images<'a>(Vec<Rgb<'a>>);

impl Images<'_> {
    /// The same images owning their pixels (a borrowed input array is copied, fallibly).
    pub fn into_owned(mut self) -> Result<Images<'static>, ProcessorError> {
        std::mem::take(&mut self.0)
            .into_iter()
            .map(owned_rgb)
            .collect::<Result<_, _>>()
            .map(Images)
    }
}

impl<'a> From<Vec<Rgb<'a>>> for Images<'a> {
    fn from(images: Vec<Rgb<'a>>) -> Self {
        Images(images)
    }
}

impl<'a> std::ops::Deref for Images<'a> {
    type Target = [Rgb<'a>];

    fn deref(&self) -> &[Rgb<'a>] {
        &self.0
    }
}

impl Drop for Images<'_> {
    fn drop(&mut self) {
        recycle_images(std::mem::take(&mut self.0));
    }
}

/// The writer of every tiled family here (LLaVA-NeXT, Gemma 3, InternVL, Idefics3, Llama 3.2
/// Vision): `pixel_values` as a run of `3 × h × w` slots, each an `h × w` window of one of
/// `images` written channels-first (`Normalize::write_chw`: outside the image, the normalised
/// zero) or, for a batch's padding, zeros; one slot per job.
pub(crate) struct Tiles<'a> {
    pub images: Images<'a>,
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

    /// Threads [`WriteValues::write`] uses (automatic: as the `float32` output's size pays for,
    /// [`parallel::MIN_BYTES_PER_WORKER`] a thread).
    pub fn workers(&self) -> usize {
        let bytes = self
            .slots
            .len()
            .saturating_mul(self.slot_len())
            .saturating_mul(4);
        parallel::writers(self.threads, self.slots.len(), bytes)
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
            None => Unaligned::zero(out),
        });
    }

    /// Each image slot through [`ChwWriter::write_chw`](super::normalize::ChwWriter), each
    /// padding slot as zeros; one slot per job as in `write`.
    fn write_bf16(&self, out: &mut [MaybeUninit<u8>]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(writer) = self.normalize.chw_writer() {
            let len = self.slot_len() * Element::Bf16.size();
            assert_eq!(
                out.len(),
                self.slots.len() * len,
                "{} slots of {len} bytes",
                self.slots.len()
            );
            let jobs: Vec<_> = self.slots.iter().zip(out.chunks_mut(len.max(1))).collect();
            parallel::map(jobs, self.workers(), |_, (slot, out)| match *slot {
                Some((image, (top, left))) => {
                    let image = self.images[image].view();
                    writer.write_chw(image, top, left, self.size, out, Element::Bf16);
                }
                None => out.fill(MaybeUninit::new(0)),
            });
            return true;
        }
        let _ = out;
        false
    }

    fn into_owned(self: Box<Self>) -> Result<Box<dyn WriteValues>, ProcessorError> {
        let Tiles {
            images,
            slots,
            size,
            normalize,
            threads,
        } = *self;
        Ok(Box::new(Tiles {
            images: images.into_owned()?,
            slots,
            size,
            normalize,
            threads,
        }))
    }
}

/// An `int64` tensor whose values are all one constant (Idefics3's `pixel_attention_mask`, all
/// ones: two fifths of its request), planned like [`Pending`]: its bytes are written once, where
/// they travel, instead of filling a buffer that is then copied.
#[derive(Clone, Debug, PartialEq)]
pub struct Filled {
    name: &'static str,
    shape: Vec<usize>,
    len: usize,
    value: i64,
    /// Threads writing it (a fresh destination is faulted in by as many).
    threads: usize,
}

/// Bytes per thread of a fill (the writers' rule, [`parallel::MIN_BYTES_PER_WORKER`]).
const FILL_PIECE: usize = parallel::MIN_BYTES_PER_WORKER as usize;

impl Filled {
    /// The tensor `name` of `shape`, every value `value`, written with up to `threads` threads
    /// (0: one per core); refused when its size overflows.
    pub fn new(
        name: &'static str,
        shape: Vec<usize>,
        value: i64,
        threads: usize,
    ) -> Result<Self, ProcessorError> {
        let len = checked_len(name, &shape, 8)?;
        let threads = parallel::workers(threads, (len * 8).div_ceil(FILL_PIECE));
        Ok(Filled {
            name,
            shape,
            len,
            value,
            threads,
        })
    }

    /// transformers' name of the tensor.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The size of the values in bytes (`int64`).
    pub fn byte_len(&self) -> usize {
        self.len * 8
    }

    /// The values, in a new buffer.
    pub fn values(&self) -> Result<Vec<i64>, ProcessorError> {
        fallible::filled(self.value, self.len).map_err(ProcessorError::oom(self.name))
    }

    /// The tensor, written into a new buffer.
    pub fn tensor(&self) -> Result<Tensor, ProcessorError> {
        Ok(Tensor {
            shape: self.shape.clone(),
            data: TensorData::I64(self.values()?),
        })
    }
}

// SAFETY: `produce` returns `Ok` only after `fill` has written every byte of `out` (its length
// checked first against `wire_len`).
unsafe impl Produce for Filled {
    /// `int64` only.
    fn wire_len(&self, dtype: WireDtype) -> Option<usize> {
        (dtype == WireDtype::Int64).then_some(self.len * 8)
    }

    fn produce(&self, out: &mut [MaybeUninit<u8>], dtype: WireDtype) -> Result<(), TensorError> {
        check_destination(self.wire_len(dtype), WireDtype::Int64, dtype, out.len())?;
        // Into a message or segment, not read back here: streamed as the Qwen patches are.
        let stream = out.len() >= PRODUCE_STREAM_MIN_BYTES;
        fill(out, self.value.to_le_bytes(), self.threads, stream);
        Ok(())
    }

    fn writers(&self) -> usize {
        self.threads
    }
}

/// What a planned tensor's `produce` checks first: that it writes `to` (`wire_len`, `None`
/// when not; `from` is the dtype it holds), into exactly `wire_len` bytes (`actual`).
fn check_destination(
    wire_len: Option<usize>,
    from: WireDtype,
    to: WireDtype,
    actual: usize,
) -> Result<(), TensorError> {
    let expected = wire_len.ok_or(TensorError::UnsupportedConversion { from, to })?;
    if actual != expected {
        return Err(TensorError::DestinationSize { expected, actual });
    }
    Ok(())
}

/// Writes `pattern` over and over into every byte of `out` (at any address, a whole number of
/// patterns): from a staging block in the L1 cache, with streaming stores when `stream` is set,
/// in pieces of at least [`FILL_PIECE`] bytes on up to `threads` threads.
fn fill(out: &mut [MaybeUninit<u8>], pattern: [u8; 8], threads: usize, stream: bool) {
    const BLOCK: usize = 4096;
    // One pattern more than a block, so that a copy may start at any phase of the pattern.
    let mut staged = [0u8; BLOCK + 8];
    for (i, b) in staged.iter_mut().enumerate() {
        *b = pattern[i % 8];
    }
    // Pieces split on cache lines of the destination (so that no line is shared by two writers);
    // each remembers its offset in `out`, the phase of the pattern it starts at.
    let piece = out.len().div_ceil(threads.max(1)).max(FILL_PIECE);
    let head = out.as_ptr().align_offset(64).min(out.len());
    let piece = (piece + 63) & !63;
    let mut pieces = Vec::new();
    let (first, mut rest) = out.split_at_mut(head);
    let mut offset = head;
    pieces.push((0, first));
    while !rest.is_empty() {
        let (now, later) = rest.split_at_mut(piece.min(rest.len()));
        let len = now.len();
        pieces.push((offset, now));
        offset += len;
        rest = later;
    }
    let workers = parallel::workers(threads, pieces.len());
    parallel::map(pieces, workers, |_, (start, piece)| {
        let mut at = start;
        for chunk in piece.chunks_mut(BLOCK) {
            let phase = at % 8;
            copy_raw(chunk, &staged[phase..phase + chunk.len()], stream);
            at += chunk.len();
        }
        fence(stream);
    });
}

/// `FamilyConfig::images` and `images_deferred` of a family whose batch is planned by
/// `$plan(self, normalize, inputs, options)` (a [`Plan`], or a pending tensor and the other
/// outputs): [`written`] and [`deferred`] of the same plan.
macro_rules! planned_images {
    ($plan:path) => {
        fn images(
            &self,
            normalize: &$crate::processors::normalize::Normalize,
            inputs: &[$crate::processors::Input<'_>],
            options: &$crate::processors::Options,
        ) -> Result<$crate::processors::Outputs, $crate::processors::ProcessorError> {
            $crate::processors::pending::written($plan(self, normalize, inputs, options))
        }

        fn images_deferred<'a>(
            &self,
            normalize: &$crate::processors::normalize::Normalize,
            inputs: &[$crate::processors::Input<'a>],
            options: &$crate::processors::Options,
        ) -> Result<$crate::processors::Deferred<'a>, $crate::processors::ProcessorError> {
            $crate::processors::pending::deferred($plan(self, normalize, inputs, options))
        }
    };
}
pub(crate) use planned_images;

/// A planned batch: its largest tensor and any constant ones left unwritten, the other outputs
/// computed.
pub struct Plan<'a> {
    pub pending: Pending<'a>,
    pub filled: Vec<Filled>,
    pub rest: Outputs,
}

impl<'a> From<(Pending<'a>, Outputs)> for Plan<'a> {
    fn from((pending, rest): (Pending<'a>, Outputs)) -> Self {
        Plan {
            pending,
            filled: Vec::new(),
            rest,
        }
    }
}

/// A planned batch's outputs: the pending tensor written into a new buffer, first, then the
/// filled ones, then the others (a family's eager `images`).
pub fn written<'a>(
    planned: Result<impl Into<Plan<'a>>, ProcessorError>,
) -> Result<Outputs, ProcessorError> {
    let Plan {
        pending,
        filled,
        rest,
    } = planned?.into();
    let mut tensors = Vec::with_capacity(1 + filled.len() + rest.tensors.len());
    tensors.push((pending.name(), pending.tensor()?));
    for f in &filled {
        tensors.push((f.name(), f.tensor()?));
    }
    tensors.extend(rest.tensors);
    Ok(Outputs { tensors })
}

/// A planned batch left unwritten ([`Deferred::Values`], a family's `images_deferred`).
pub fn deferred<'a>(
    planned: Result<impl Into<Plan<'a>>, ProcessorError>,
) -> Result<Deferred<'a>, ProcessorError> {
    let Plan {
        pending,
        filled,
        rest,
    } = planned?.into();
    Ok(Deferred::Values {
        pending: Box::new(pending),
        filled,
        rest,
    })
}

// SAFETY: `produce` returns `Ok` only after every byte of `out` is written: as `float32` by the
// writer, which writes every value of its output (`WriteValues::write`), over exactly
// `out.len() / 4` values (the length is checked first); as `bfloat16` by the writer's
// `write_bf16` when it returns `true` (then every byte of `out`, `out.len() / 2` values), else by
// `convert_uninit`, which initialises all of its destination when it returns `Ok`.
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
        check_destination(self.wire_len(dtype), WireDtype::Float32, dtype, out.len())?;
        match dtype {
            WireDtype::Float32 => self.writer.write(unaligned_of(out)),
            WireDtype::Bfloat16 if self.writer.write_bf16(out) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::processors::store::STREAM_MIN_BYTES;

    /// `fill` writes the pattern from its first byte on, whatever the destination's address,
    /// length and thread count, streamed or not: small, around a staging block, around a
    /// cache-line head, and pieces on several threads.
    #[test]
    fn fill_writes_the_pattern_everywhere() {
        let pattern = 0x0102_0304_0506_0708_i64.to_le_bytes();
        let mut buffer = vec![0u8; STREAM_MIN_BYTES + 4096 + 64];
        for (offset, len, threads) in [
            (0, 0, 1),
            (3, 8, 1),
            (1, 64 * 8, 1),
            (5, 4096 + 8 * 7, 2),
            (0, 4096 * 3, 3),
            (13, 8 * ((1 << 20) / 8 * 3 + 5), 2),
            (7, STREAM_MIN_BYTES + 4096, 2),
            (0, STREAM_MIN_BYTES, 1),
        ] {
            for stream in [false, true] {
                buffer.fill(0xAA);
                let out = &mut buffer[offset..offset + len];
                // SAFETY: `u8` and `MaybeUninit<u8>` have the same layout; the bytes are
                // initialised.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<u8>>(), len)
                };
                fill(out, pattern, threads, stream);
                assert!(buffer[..offset].iter().all(|&b| b == 0xAA));
                assert!(buffer[offset + len..].iter().all(|&b| b == 0xAA));
                for (i, &b) in buffer[offset..offset + len].iter().enumerate() {
                    assert_eq!(
                        b,
                        pattern[i % 8],
                        "byte {i} of {len} at offset {offset}, {stream}"
                    );
                }
            }
        }
    }

    /// A filled tensor writes the bytes of its values, as `int64` only, and refuses a
    /// destination of another size.
    #[test]
    fn filled_produces_its_values_bytes() {
        let filled = Filled::new("pixel_attention_mask", vec![2, 3, 5], 1, 2).unwrap();
        assert_eq!(filled.byte_len(), 2 * 3 * 5 * 8);
        let values = filled.values().unwrap();
        assert_eq!(values, vec![1i64; 30]);
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![MaybeUninit::new(0u8); want.len() + 1];
        filled.produce(&mut out[1..], WireDtype::Int64).unwrap();
        // SAFETY: every byte was initialised above.
        let got: Vec<u8> = out[1..]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        assert_eq!(got, want);
        assert_eq!(filled.wire_len(WireDtype::Float32), None);
        assert!(matches!(
            filled.produce(&mut out[1..], WireDtype::Float32),
            Err(TensorError::UnsupportedConversion { .. })
        ));
        assert!(matches!(
            filled.produce(&mut out, WireDtype::Int64),
            Err(TensorError::DestinationSize {
                expected: 240,
                actual: 241
            })
        ));
        assert!(Filled::new("mask", vec![usize::MAX, 2], 1, 1).is_err());
    }

    /// Tiles of two images (windows inside, across edges, around an image) and padding slots,
    /// with `h × w` of `size`, on `threads`.
    fn tiles<'a>(data: &'a [Vec<u8>; 2], size: (usize, usize), threads: usize) -> Tiles<'a> {
        use std::borrow::Cow;
        let images: Vec<Rgb<'a>> = vec![
            Rgb {
                data: Cow::Borrowed(&data[0]),
                width: 61,
                height: 47,
            },
            Rgb {
                data: Cow::Borrowed(&data[1]),
                width: 30,
                height: 40,
            },
        ];
        let (clip_mean, clip_std) = (
            [0.48145466, 0.4578275, 0.40821073],
            [0.26862954, 0.26130258, 0.27577711],
        );
        Tiles {
            images: images.into(),
            slots: vec![
                Some((0, (0, 0))),
                None,
                Some((1, (-3, 5))),
                Some((0, (30, -2))),
                Some((1, (-10, -10))),
                None,
            ],
            size,
            normalize: Normalize::new(Some(1.0 / 255.0), Some((clip_mean, clip_std))),
            threads,
        }
    }

    fn image_bytes() -> [Vec<u8>; 2] {
        [
            (0..3 * 61 * 47)
                .map(|i| ((i * 89 + 3) % 256) as u8)
                .collect(),
            (0..3 * 30 * 40)
                .map(|i| ((i * 41 + 200) % 256) as u8)
                .collect(),
        ]
    }

    /// `write_bf16` writes `write`'s values rounded to `bfloat16`, on one thread and on two, at
    /// any offset; or, on a CPU without the path, nothing.
    #[test]
    fn tiles_bf16_are_written_values_rounded() {
        use crate::tensor::convert::f32_to_bf16;
        let data = image_bytes();
        for threads in [1, 2] {
            let tiles = tiles(&data, (21, 35), threads);
            let mut cached = vec![MaybeUninit::new(0u8); 4 * tiles.slots.len() * tiles.slot_len()];
            tiles.write(unaligned_of(&mut cached));
            // SAFETY: `write` wrote every value.
            let cached: Vec<u8> = cached.iter().map(|b| unsafe { b.assume_init() }).collect();
            let want: Vec<u8> = cached
                .chunks_exact(4)
                .flat_map(|v| {
                    let bits = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                    f32_to_bf16(bits).to_le_bytes()
                })
                .collect();
            for offset in [0, 1, 17, 63] {
                let mut out = vec![MaybeUninit::new(0x5Au8); offset + want.len() + 64];
                let written = tiles.write_bf16(&mut out[offset..offset + want.len()]);
                // SAFETY: every byte was initialised above.
                let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
                if !written {
                    assert!(got.iter().all(|&b| b == 0x5A), "refused, yet written");
                    #[cfg(target_arch = "x86_64")]
                    assert!(tiles.normalize.chw_writer().is_none());
                    continue;
                }
                assert!(got[..offset].iter().all(|&b| b == 0x5A));
                assert!(got[offset + want.len()..].iter().all(|&b| b == 0x5A));
                assert!(
                    got[offset..offset + want.len()] == want[..],
                    "{threads} threads, offset {offset}"
                );
            }
        }
    }

    /// Produced into a message (streamed from `PRODUCE_STREAM_MIN_BYTES` on), a tiled tensor's
    /// bytes are its eager values', as `float32` and as `bfloat16`.
    #[test]
    fn tiles_produce_their_values_bytes() {
        use crate::tensor::convert::f32_to_bf16;
        let data = image_bytes();
        let pending = tiles(&data, (160, 200), 2)
            .pending("pixel_values", vec![6, 3, 160, 200])
            .unwrap();
        // Both dtypes as large as a message's tensors that are streamed.
        assert!(pending.byte_len() / 2 >= PRODUCE_STREAM_MIN_BYTES);
        let values = pending.values().unwrap();
        for dtype in [WireDtype::Float32, WireDtype::Bfloat16] {
            let want: Vec<u8> = match dtype {
                WireDtype::Float32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                _ => values
                    .iter()
                    .flat_map(|v| f32_to_bf16(v.to_bits()).to_le_bytes())
                    .collect(),
            };
            let mut out = vec![MaybeUninit::new(0u8); want.len() + 3];
            pending.produce(&mut out[3..], dtype).unwrap();
            // SAFETY: `produce` returned `Ok`: every byte of its destination was written.
            let got: Vec<u8> = out[3..]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            assert!(got == want, "{dtype:?}");
        }
    }
}
