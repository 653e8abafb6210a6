//! Large buffers: how they are backed and reused.
//!
//! - [`huge_pages`]: advice to back fresh buffers of several MB with transparent huge pages
//!   (one page fault per 2 MiB instead of per 4 KiB);
//! - [`prefault`]: a fresh output buffer faulted in with one system call per writing thread
//!   before it is written;
//! - [`zeroed`]: fallible zeroed allocation (calloc, then huge-page advice) and
//!   [`overwritable_bytes`] (a recycled buffer when one fits, else zeroed);
//! - [`fallible`]: fallible forms of `vec!`, `with_capacity`, `to_vec` and `collect`, for every
//!   buffer whose size comes from the input (an [`AllocError`] instead of an abort);
//! - [`recycle`]: a bounded cache of large buffers handed back after use (output tensors Python
//!   dropped, intermediate images), so the next call writes into memory that is already mapped.
//!
//! Used by the tensor codec, the image decoders and the model processors; neither changes a
//! single output byte.

pub mod fallible;
pub mod huge_pages;
pub mod prefault;
pub mod recycle;

pub use fallible::AllocError;
pub use huge_pages::advise_huge_pages;
pub use prefault::prefault;

/// Whether the environment switch `name` is on: anything but `0`, `false` or `off` (unset: on).
/// Callers read it once and keep the answer.
pub(crate) fn switch_on(name: &str) -> bool {
    let value = std::env::var(name).unwrap_or_default();
    !matches!(value.trim(), "0" | "false" | "off")
}

/// A zero-filled buffer of `len` elements, or `Err(bytes)` if it cannot be allocated.
///
/// Unlike `vec![0; len]`, a failed allocation is an error instead of an abort; like it, large
/// buffers come from the allocator's zeroed pages (calloc), so untouched memory costs nothing,
/// and are backed by huge pages where the kernel allows (one fault per 2 MiB when written).
pub fn zeroed<T: Zeroable>(len: usize) -> Result<Vec<T>, u64> {
    let bytes = (len as u128) * (std::mem::size_of::<T>() as u128);
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| bytes as u64)?;
    // SAFETY: `layout` has a non-zero size (len > 0 and no `Zeroable` type is zero-sized). The
    // pointer, if not null, comes from the global allocator with exactly this layout, holds `len`
    // zero-initialised elements (all-zero bytes are a valid `T` for every `Zeroable` type), and is
    // handed to `Vec::from_raw_parts` with capacity `len`, so the Vec frees it with the same
    // layout.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<T>();
        if ptr.is_null() {
            return Err(bytes as u64);
        }
        let mut values = Vec::from_raw_parts(ptr, len, len);
        advise_huge_pages(&mut values);
        Ok(values)
    }
}

/// Element types for which the all-zero bit pattern is a valid value.
///
/// # Safety
///
/// Implementors must be non-zero-sized and valid when every byte is zero ([`zeroed`] relies on
/// both).
pub unsafe trait Zeroable: Copy {}
// SAFETY: each is a primitive integer or IEEE float (zero bits: `0` / `0.0`), non-zero-sized.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for u16 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for i64 {}
// SAFETY: as above.
unsafe impl Zeroable for usize {}
// SAFETY: as above.
unsafe impl Zeroable for f32 {}
// SAFETY: as above.
unsafe impl Zeroable for f64 {}

/// `len` bytes the caller will overwrite entirely: a kept buffer ([`recycle::take_u8`], stale
/// contents) when one fits, else [`zeroed`] memory; `Err(bytes)` if it cannot be allocated.
///
/// Not prefaulted ([`prefault`]): a decoder sizes this buffer from the header it has just read,
/// before the data, and a broken stream declaring a huge image must cost none of it
/// (`test_a_broken_stream_declaring_a_huge_image_touches_none_of_it`).
pub fn overwritable_bytes(len: usize) -> Result<Vec<u8>, u64> {
    match recycle::take_u8(len) {
        Some(buffer) => Ok(buffer),
        None => zeroed(len),
    }
}
