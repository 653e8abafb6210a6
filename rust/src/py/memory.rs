//! Python view of [`crate::memory`]: the limit of the cache of large buffers.

use pyo3::prelude::*;

use crate::memory::recycle;

/// buffer_cache(limit=None) -> tuple[int, int]
/// --
///
/// The cache of large buffers (output tensors, decoded images, intermediate images): sets its
/// limit in bytes when `limit` is given (0 turns recycling off and frees what is kept); returns
/// `(limit, held)` in bytes, the limit before any change and what is held after it.
#[pyfunction]
#[pyo3(signature = (limit=None))]
fn buffer_cache(limit: Option<usize>) -> (usize, usize) {
    let previous = match limit {
        Some(bytes) => recycle::set_limit(bytes),
        None => recycle::limit(),
    };
    (previous, recycle::held())
}

/// keep_freed_memory(max_bytes) -> bool
/// --
///
/// Asks the C allocator (glibc) to serve allocations of up to `max_bytes` from its heap and to
/// keep freed memory instead of giving it back to the kernel, process-wide and for the rest of
/// the process. A serialized request (a `bytes` object of tens of MiB) then reuses pages the
/// previous one faulted in: no page faults, no kernel zeroing of fresh pages, which cost as
/// much as writing the request. The price: the process keeps up to its largest freed blocks.
/// `False` (nothing changed) where the allocator is not glibc's or refuses the value.
#[pyfunction]
fn keep_freed_memory(max_bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let (Ok(mmap), Ok(trim)) = (
            libc::c_int::try_from(max_bytes),
            libc::c_int::try_from(max_bytes.saturating_mul(2)),
        ) else {
            return false;
        };
        if mmap <= 0 {
            return false;
        }
        // SAFETY: `mallopt` only changes glibc's allocation parameters (thresholds); it touches
        // no memory of ours and is safe to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = max_bytes;
        false
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(buffer_cache, m)?)?;
    m.add_function(wrap_pyfunction!(keep_freed_memory, m)?)
}
