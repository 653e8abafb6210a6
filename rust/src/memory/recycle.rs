//! Recycling of large buffers between calls.
//!
//! A `pixel_values` tensor of a batch is often 100 MB or more of fresh memory, a decoded
//! 12-megapixel photo 36 MB. Fresh anonymous pages cost a page fault and a kernel-side clear each
//! before our first write, which on a VM can take as long as computing the values. The allocator
//! does not keep freed blocks of that size around: above 32 MiB (glibc's largest dynamic mmap
//! threshold) they go back to the system at once, and smaller ones often soon after, when the
//! top of the heap is trimmed — even a 512×600 photo's decoded and resized images (~0.9 MB
//! each) were faulted in again on every call.
//!
//! Buffers come here instead of going back to the system when they are done with: an output
//! tensor or a decoded image once Python drops it (every numpy view of it is gone), a batch's
//! decoded and resized images once its output is written. The next buffer of a similar size is
//! taken from here, its pages mapped already. The cache holds at most a limit of bytes (default
//! [`DEFAULT_LIMIT`]; `SMG_GRPC_PROTO_BUFFER_CACHE_MIB` in the environment sets it at start-up,
//! [`set_limit`] at any time, `0` turns recycling off), dropping the oldest buffers first;
//! buffers below [`MIN_BYTES`] are left to the allocator, which serves those well.
//!
//! Stale contents are never read: [`take_uninit`] returns uninitialised values (`float32`
//! outputs, `bfloat16` bits) that every writer overwrites, and [`take_u8`] buffers go only to
//! writers that write every byte (the resampler, the JPEG decoder).

use std::mem::MaybeUninit;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Buffers smaller than this (in bytes) are not kept.
pub const MIN_BYTES: usize = 128 << 10;
/// The cache limit when the environment does not set one: 256 MiB.
pub const DEFAULT_LIMIT: usize = 256 << 20;
/// The environment variable with the limit in MiB.
pub const LIMIT_ENV: &str = "SMG_GRPC_PROTO_BUFFER_CACHE_MIB";
/// A kept buffer serves a request of `n` bytes only if it has at most this many times as many
/// (so a small request never pins a huge buffer), plus [`MIN_BYTES`] of slack.
const MAX_WASTE: usize = 2;

/// A kept buffer: an output tensor's values (`float32`, or `bfloat16` bits) or an
/// intermediate image's bytes.
pub(crate) enum Spare {
    F32(Vec<f32>),
    U16(Vec<u16>),
    U8(Vec<u8>),
}

impl Spare {
    fn bytes(&self) -> usize {
        match self {
            Spare::F32(v) => v.capacity() * 4,
            Spare::U16(v) => v.capacity() * 2,
            Spare::U8(v) => v.capacity(),
        }
    }
}

/// The element types of kept buffers.
pub(crate) trait Element: Sized {
    fn holds(spare: &Spare) -> bool;
    fn unwrap(spare: Spare) -> Option<Vec<Self>>;
}

impl Element for f32 {
    fn holds(spare: &Spare) -> bool {
        matches!(spare, Spare::F32(_))
    }
    fn unwrap(spare: Spare) -> Option<Vec<f32>> {
        match spare {
            Spare::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for u16 {
    fn holds(spare: &Spare) -> bool {
        matches!(spare, Spare::U16(_))
    }
    fn unwrap(spare: Spare) -> Option<Vec<u16>> {
        match spare {
            Spare::U16(v) => Some(v),
            _ => None,
        }
    }
}

impl Element for u8 {
    fn holds(spare: &Spare) -> bool {
        matches!(spare, Spare::U8(_))
    }
    fn unwrap(spare: Spare) -> Option<Vec<u8>> {
        match spare {
            Spare::U8(v) => Some(v),
            _ => None,
        }
    }
}

/// Kept buffers under a byte limit (the process has one, behind the functions below).
pub struct Cache {
    limit: usize,
    /// Kept buffers, oldest first.
    spares: Vec<Spare>,
}

impl Cache {
    pub const fn new(limit: usize) -> Self {
        Cache {
            limit,
            spares: Vec::new(),
        }
    }

    /// Bytes held by kept buffers.
    pub fn held(&self) -> usize {
        self.spares.iter().map(Spare::bytes).sum()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Sets the limit, dropping the oldest buffers above it; returns the previous one.
    pub fn set_limit(&mut self, bytes: usize) -> usize {
        let previous = std::mem::replace(&mut self.limit, bytes);
        self.shrink();
        previous
    }

    /// Drops the oldest buffers until the total fits the limit.
    fn shrink(&mut self) {
        while self.held() > self.limit {
            self.spares.remove(0);
        }
    }

    /// Removes the smallest kept `T` buffer of `bytes` bytes or a little more.
    fn pick<T: Element>(&mut self, bytes: usize) -> Option<Vec<T>> {
        if bytes < MIN_BYTES {
            return None;
        }
        let most = bytes.saturating_mul(MAX_WASTE).saturating_add(MIN_BYTES);
        let (at, _) = self
            .spares
            .iter()
            .enumerate()
            .filter(|(_, s)| T::holds(s) && (bytes..=most).contains(&s.bytes()))
            .min_by_key(|(_, s)| s.bytes())?;
        T::unwrap(self.spares.remove(at))
    }

    /// The smallest kept output buffer of `T` (`f32`, or `u16` for `bfloat16` bits) for `len`
    /// values, as `len` uninitialised values, if one fits.
    pub(crate) fn take_uninit<T: Element>(&mut self, len: usize) -> Option<Vec<MaybeUninit<T>>> {
        let buffer: Vec<T> = self.pick(len.saturating_mul(std::mem::size_of::<T>()))?;
        let mut buffer = std::mem::ManuallyDrop::new(buffer);
        let (ptr, capacity) = (buffer.as_mut_ptr(), buffer.capacity());
        // SAFETY: the parts are those of a `Vec<T>` whose ownership moves to the new Vec (the
        // old one is never dropped); `MaybeUninit<T>` has the layout of `T`, so the
        // allocation's layout is unchanged; `len <= capacity` (`pick` only returns buffers of at
        // least `len` values) and any `MaybeUninit` value is valid, initialised or not.
        Some(unsafe { Vec::from_raw_parts(ptr.cast::<MaybeUninit<T>>(), len, capacity) })
    }

    /// The smallest kept byte buffer for `len` bytes, resized to `len` (stale contents), if one
    /// fits.
    pub fn take_u8(&mut self, len: usize) -> Option<Vec<u8>> {
        let mut buffer: Vec<u8> = self.pick(len)?;
        // Within capacity: no allocation, and `truncate` or a fill of the few new bytes.
        buffer.resize(len, 0);
        Some(buffer)
    }

    fn keep(&mut self, spare: Spare) {
        let bytes = spare.bytes();
        if bytes >= MIN_BYTES && bytes <= self.limit {
            self.spares.push(spare);
            self.shrink();
        }
    }

    /// Keeps an output buffer if it is large enough and fits the limit (dropping the oldest
    /// kept ones to make room); frees it otherwise.
    pub fn give_f32(&mut self, buffer: Vec<f32>) {
        self.keep(Spare::F32(buffer));
    }

    /// Keeps a `bfloat16` output buffer like [`Cache::give_f32`].
    pub fn give_u16(&mut self, buffer: Vec<u16>) {
        self.keep(Spare::U16(buffer));
    }

    /// Keeps a byte buffer like [`Cache::give_f32`].
    pub fn give_u8(&mut self, buffer: Vec<u8>) {
        self.keep(Spare::U8(buffer));
    }
}

fn limit_from_env(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_LIMIT, |mib| mib.saturating_mul(1 << 20))
}

/// The process's cache (the lock is held only to pick or push a buffer, never while computing).
fn cache() -> MutexGuard<'static, Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            Mutex::new(Cache::new(limit_from_env(
                std::env::var(LIMIT_ENV).ok().as_deref(),
            )))
        })
        .lock()
        // A Vec of Vecs holds no invariant a panic could break half-way.
        .unwrap_or_else(|e| e.into_inner())
}

/// [`Cache::take_u8`] on the process's cache.
pub fn take_u8(len: usize) -> Option<Vec<u8>> {
    cache().take_u8(len)
}

/// [`Cache::give_f32`] on the process's cache.
pub fn give_f32(buffer: Vec<f32>) {
    cache().give_f32(buffer);
}

/// The smallest kept `T` buffer for `len` values on the process's cache, as `len`
/// uninitialised values (an output of `float32` values or `bfloat16` bits).
pub(crate) fn take_uninit<T: Element>(len: usize) -> Option<Vec<MaybeUninit<T>>> {
    cache().take_uninit(len)
}

/// [`Cache::give_u16`] on the process's cache.
pub fn give_u16(buffer: Vec<u16>) {
    cache().give_u16(buffer);
}

/// [`Cache::give_u8`] on the process's cache.
pub fn give_u8(buffer: Vec<u8>) {
    cache().give_u8(buffer);
}

/// The process's cache limit in bytes.
pub fn limit() -> usize {
    cache().limit()
}

/// [`Cache::set_limit`] on the process's cache.
pub fn set_limit(bytes: usize) -> usize {
    cache().set_limit(bytes)
}

/// Bytes held by the process's cache.
pub fn held() -> usize {
    cache().held()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bfloat16_buffers_serve_only_bfloat16_requests() {
        let mut cache = Cache::new(64 << 20);
        let big = vec![7u16; 4 << 20]; // 8 MiB
        let addr = big.as_ptr() as usize;
        cache.give_u16(big);
        assert_eq!(cache.held(), 8 << 20);
        // Neither a float32 nor a byte request takes it, and a far smaller one does not either.
        assert!(cache.take_uninit::<f32>(2 << 20).is_none());
        assert!(cache.take_u8(8 << 20).is_none());
        assert!(cache.take_uninit::<u16>(1 << 20).is_none());
        let reused = cache
            .take_uninit::<u16>(3 << 20)
            .expect("a kept bfloat16 buffer fits");
        assert_eq!(reused.as_ptr() as usize, addr);
        assert_eq!((reused.len(), reused.capacity()), (3 << 20, 4 << 20));
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn keep_reuse_limit_and_evict() {
        let mut cache = Cache::new(128 << 20);
        let mib = (1 << 20) / 4; // f32 values per MiB

        // Small buffers are not kept; large ones are, and serve a request of a similar size.
        cache.give_f32(vec![1.0; MIN_BYTES / 4 - 1]);
        assert_eq!(cache.held(), 0);
        let big = vec![2.0f32; 16 * mib];
        let addr = big.as_ptr() as usize;
        cache.give_f32(big);
        assert_eq!(cache.held(), 16 << 20);
        // A request of 7 MiB is not served by a 16 MiB buffer (over twice its size + 1 MiB),
        // nor is a byte request.
        assert!(cache.take_uninit::<f32>(7 * mib).is_none());
        assert!(cache.take_u8(10 << 20).is_none());
        let reused = cache
            .take_uninit::<f32>(10 * mib)
            .expect("a kept buffer fits");
        assert_eq!(reused.as_ptr() as usize, addr);
        assert_eq!((reused.len(), reused.capacity()), (10 * mib, 16 * mib));
        assert_eq!(cache.held(), 0);

        // Byte buffers come back resized, and only as bytes.
        cache.give_u8(vec![5u8; 3 << 20]);
        assert!(cache.take_uninit::<f32>(mib).is_none());
        let bytes = cache.take_u8(2 << 20).expect("a kept byte buffer fits");
        assert_eq!((bytes.len(), bytes.capacity()), (2 << 20, 3 << 20));

        // Lowering the limit evicts the oldest first.
        let first = vec![0.0f32; 32 * mib];
        let first_addr = first.as_ptr() as usize;
        cache.give_f32(first);
        cache.give_f32(vec![0.0f32; 32 * mib]);
        cache.give_u8(vec![0u8; 32 << 20]);
        assert_eq!(cache.held(), 96 << 20);
        assert_eq!(cache.set_limit(64 << 20), 128 << 20);
        assert_eq!(cache.held(), 64 << 20);
        let kept = cache
            .take_uninit::<f32>(32 * mib)
            .expect("the second one is kept");
        assert_ne!(kept.as_ptr() as usize, first_addr);
        assert!(cache.take_uninit::<f32>(32 * mib).is_none());
        assert!(cache.take_u8(32 << 20).is_some());
        // A buffer above the limit is not kept; limit 0 keeps nothing.
        cache.give_f32(vec![0.0f32; 80 * mib]);
        assert_eq!(cache.held(), 0);
        cache.set_limit(0);
        cache.give_f32(vec![0.0f32; 8 * mib]);
        assert_eq!(cache.held(), 0);
    }

    #[test]
    fn environment_values() {
        assert_eq!(limit_from_env(None), DEFAULT_LIMIT);
        assert_eq!(limit_from_env(Some("0")), 0);
        assert_eq!(limit_from_env(Some(" 512 ")), 512 << 20);
        assert_eq!(limit_from_env(Some("lots")), DEFAULT_LIMIT);
    }
}
