//! Faulting in a fresh output buffer with one system call per writer, before it is written.
//!
//! A fresh multi-MB `bytes` object (a serialized request, a converted tensor) is memory the
//! kernel has not mapped yet: left alone, the first write to each page traps into the kernel,
//! which clears the page and maps it, one fault at a time. `MADV_POPULATE_WRITE` (Linux 5.14)
//! does the same work for a whole range in one call, without a trap per page, and lets the
//! writers start on mapped memory. When several threads write the buffer, each of them
//! populates its own part first: first touches of one process's fresh pages from several
//! threads at once cost far more than from one on the benchmark VMs (`docs/benchmarks.md` §7).
//!
//! Measured on the Intel Xeon VM (2 cores, transparent huge pages in `madvise` mode), a batch of
//! 8 real photos through Qwen2-VL into a 94 MB vLLM request (`scripts/bench_threads.py`): one
//! thread 60 → 49 ms, `threads=0` 38–40 → 27 ms; with huge pages off for the process, one thread
//! 93 → 60 ms.
//!
//! A buffer whose first and last pages are mapped already (a reused heap block, a buffer written
//! before) is left alone. Populating never changes what the buffer holds (a page already mapped
//! stays as it is; a new one is zeroed, as a first write would find it), and it is only asked for
//! on memory we are about to overwrite entirely. A failure (an older kernel: `EINVAL`; no memory
//! left) is ignored: the writes then fault the pages in as before. [`PREFAULT_ENV`]`=0` turns it
//! off.

/// Below this size the system call is not worth it.
pub const PREFAULT_MIN_BYTES: usize = 4 << 20;
/// A part populated by a thread of its own is at least this large (and starts on a 2 MiB
/// boundary, so that two threads never fault the same huge page).
const PART_BYTES: usize = 2 << 20;
const PAGE: usize = 4096;

/// Set to `0` (or `false`, `off`) to never prefault (read once).
pub const PREFAULT_ENV: &str = "SMG_GRPC_PROTO_PREFAULT";

/// Whether [`PREFAULT_ENV`] leaves prefaulting on (the default).
#[cfg(target_os = "linux")]
fn prefault_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::switch_on(PREFAULT_ENV))
}

/// Whether the page at `addr` (page-aligned) is resident.
#[cfg(target_os = "linux")]
fn mapped(addr: usize) -> bool {
    let mut resident = 0u8;
    // SAFETY: `mincore` reads the page tables of the one page at `addr` (page-aligned, inside a
    // buffer the caller holds) and writes one byte into `resident`; it touches no memory of ours.
    let ok = unsafe { libc::mincore(addr as *mut libc::c_void, PAGE, &mut resident) } == 0;
    ok && resident & 1 == 1
}

/// The parts `[start, end)` of the whole pages inside `[addr, addr + len)` that `workers`
/// threads populate: none below [`PREFAULT_MIN_BYTES`], at most one per [`PART_BYTES`], inner
/// boundaries on 2 MiB. Consecutive, disjoint, covering every whole page of the buffer.
pub fn parts(addr: usize, len: usize, workers: usize) -> Vec<(usize, usize)> {
    if len < PREFAULT_MIN_BYTES {
        return Vec::new();
    }
    let (Some(start), Some(end)) = (
        addr.checked_add(PAGE - 1).map(|a| a & !(PAGE - 1)),
        addr.checked_add(len).map(|e| e & !(PAGE - 1)),
    ) else {
        return Vec::new();
    };
    if end <= start {
        return Vec::new();
    }
    let n = workers.clamp(1, ((end - start) / PART_BYTES).max(1));
    let mut out = Vec::with_capacity(n);
    let mut from = start;
    for i in 1..=n {
        let to = if i == n {
            end
        } else {
            let share = start + (end - start) / n * i;
            (share.saturating_add(PART_BYTES - 1) & !(PART_BYTES - 1)).clamp(from, end)
        };
        if to > from {
            out.push((from, to));
            from = to;
        }
    }
    out
}

/// Faults in the whole pages of `buf`, a buffer about to be overwritten by `workers` threads,
/// split over as many threads (the calling one included; Linux from 5.14, elsewhere a no-op).
pub fn prefault<T>(buf: &mut [T], workers: usize) {
    #[cfg(target_os = "linux")]
    {
        if !prefault_on() {
            return;
        }
        let parts = parts(
            buf.as_mut_ptr() as usize,
            std::mem::size_of_val(buf),
            workers,
        );
        // Memory mapped already (a reused heap block, a buffer written before) is left alone:
        // walking its pages would cost ~0.1 ms per 20 MB for nothing. Its first and last whole
        // pages tell (one `mincore` each).
        if let (Some(&(start, _)), Some(&(_, end))) = (parts.first(), parts.last()) {
            if mapped(start) && mapped(end - PAGE) {
                return;
            }
        }
        let populate = |&(start, end): &(usize, usize)| {
            // SAFETY: `[start, end)` is a page-aligned range inside `buf`, memory we hold
            // exclusively (`&mut`) for the duration of this call (the scoped threads below end
            // before it returns). `MADV_POPULATE_WRITE` only makes the kernel map those pages
            // writable now rather than at the first write; it never changes their contents
            // (mapped pages are left alone, new anonymous pages are zero, as a first write
            // would find them), so no Rust invariant can be broken. A failure is harmless.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        };
        let Some((first, rest)) = parts.split_first() else {
            return;
        };
        std::thread::scope(|scope| {
            for part in rest {
                // A thread that cannot be started leaves its part to the calling thread.
                if std::thread::Builder::new()
                    .spawn_scoped(scope, move || populate(part))
                    .is_err()
                {
                    populate(part);
                }
            }
            populate(first);
        });
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (buf, workers);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_are_left_alone() {
        assert!(parts(0, PREFAULT_MIN_BYTES - 1, 4).is_empty());
        assert!(parts(usize::MAX - 10, PREFAULT_MIN_BYTES, 1).is_empty());
    }

    #[test]
    fn parts_cover_the_whole_pages_once() {
        for (addr, len, workers) in [
            (4096 * 3 + 17, 9 << 20, 1),
            (4096 * 3 + 17, 9 << 20, 2),
            (0, 64 << 20, 3),
            (12345, (5 << 20) + 3, 8),
            (2 << 20, 4 << 20, 0),
        ] {
            let parts = parts(addr, len, workers);
            let start = (addr + PAGE - 1) & !(PAGE - 1);
            let end = (addr + len) & !(PAGE - 1);
            assert_eq!(parts.first().map(|p| p.0), Some(start));
            assert_eq!(parts.last().map(|p| p.1), Some(end));
            assert!(parts.len() <= workers.max(1) && parts.len() <= len / PART_BYTES);
            for pair in parts.windows(2) {
                assert_eq!(pair[0].1, pair[1].0, "consecutive");
                assert_eq!(pair[0].1 % PART_BYTES, 0, "inner boundaries on 2 MiB");
            }
            assert!(parts
                .iter()
                .all(|&(a, b)| a < b && a % PAGE == 0 && b % PAGE == 0));
        }
        assert_eq!(
            parts(0, 64 << 20, 2),
            vec![(0, 32 << 20), (32 << 20, 64 << 20)]
        );
    }

    #[test]
    fn contents_stay_as_they_were() {
        let mut buf: Vec<u8> = (0..(9usize << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let copy = buf.clone();
        for workers in [1, 2, 3] {
            prefault(&mut buf, workers);
            assert!(buf == copy);
        }
    }

    /// On a fresh anonymous mapping, every page is resident afterwards (kernels with
    /// `MADV_POPULATE_WRITE`; older ones refuse it, and nothing is asserted there).
    #[cfg(target_os = "linux")]
    #[test]
    fn fresh_pages_are_mapped() {
        let len = 8 << 20;
        for workers in [1, 2] {
            // SAFETY: a new private anonymous mapping of `len` bytes, only used through the
            // slice below and unmapped at the end; `mincore` writes one byte per page into
            // `resident`, which has that many.
            unsafe {
                let ptr = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(ptr, libc::MAP_FAILED);
                let last = ptr as usize + len - PAGE;
                assert!(!mapped(ptr as usize) && !mapped(last), "fresh pages");
                let supported = libc::madvise(ptr, PAGE, libc::MADV_POPULATE_WRITE) == 0;
                // The first page mapped and the last not: the probe still finds work to do.
                assert_eq!(mapped(ptr as usize), supported);
                let mut resident = vec![0u8; len / PAGE];
                libc::mincore(ptr, len, resident.as_mut_ptr());
                let before = resident.iter().filter(|&&r| r & 1 == 1).count();
                let buf = std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len);
                prefault(buf, workers);
                libc::mincore(ptr, len, resident.as_mut_ptr());
                let after = resident.iter().filter(|&&r| r & 1 == 1).count();
                let zeros = buf.iter().all(|&b| b == 0);
                let last_mapped = mapped(last);
                libc::munmap(ptr, len);
                assert!(zeros);
                if supported && prefault_on() {
                    assert!(before <= 512, "{before} pages mapped before");
                    assert_eq!(after, len / PAGE, "workers {workers}");
                    assert!(last_mapped);
                }
            }
        }
    }
}
