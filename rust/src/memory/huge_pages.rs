//! Advice to the kernel about large, freshly allocated output buffers.
//!
//! A new 100 MiB `bytes` object is backed by fresh anonymous pages; touching them for the first
//! time costs one page fault per 4 KiB page, which on a VM can take longer than the copy itself.
//! Asking for transparent huge pages (`MADV_HUGEPAGE`, honoured when THP is in `madvise` or
//! `always` mode) turns 512 faults into one. The advice never changes the buffer's contents or
//! its validity; where it is unavailable nothing happens.
//!
//! Where the host takes free 2 MiB blocks back (a VM whose balloon driver reports free pages,
//! `page_reporting_order` 9), a fresh huge page can cost far more to fault in than 512 small
//! ones: on such a VM a first decode of a 4000 × 4000 16-bit PNG took 0.36–1.1 s with the
//! advice and 0.09 s without, while repeated requests, whose freed pages are still in the
//! guest, were faster with it (docs/security.md). [`HUGE_PAGES_ENV`]`=0` turns it off.

/// Below this size the advice is not worth a system call.
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// The 2 MiB-aligned part of `[addr, addr + len)`, if it holds at least one huge page.
pub fn huge_page_range(addr: usize, len: usize) -> Option<(usize, usize)> {
    if len < HUGE_PAGE_MIN_BYTES {
        return None;
    }
    let start = addr.checked_add(HUGE_PAGE - 1)? & !(HUGE_PAGE - 1);
    let end = addr.checked_add(len)? & !(HUGE_PAGE - 1);
    (end > start).then_some((start, end - start))
}

/// Set to `0` (or `false`, `off`) to never ask for huge pages (read once).
pub const HUGE_PAGES_ENV: &str = "SMG_GRPC_PROTO_HUGE_PAGES";

/// Whether [`HUGE_PAGES_ENV`] leaves the advice on (the default).
#[cfg(target_os = "linux")]
fn advice_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| super::switch_on(HUGE_PAGES_ENV))
}

/// Advises the kernel to back the buffer at `buf` with huge pages (Linux; elsewhere a no-op;
/// nothing when [`HUGE_PAGES_ENV`] turns it off).
pub fn advise_huge_pages<T>(buf: &mut [T]) {
    #[cfg(target_os = "linux")]
    if !advice_on() {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Some((start, len)) =
        huge_page_range(buf.as_mut_ptr() as usize, std::mem::size_of_val(buf))
    {
        // SAFETY: `[start, start + len)` lies inside `buf`, memory we hold exclusively (`&mut`);
        // `madvise(MADV_HUGEPAGE)` only changes how the kernel backs those pages, never their
        // contents or mapping, so no Rust invariant can be broken. Failure (e.g. THP disabled,
        // heap memory the kernel refuses) is harmless and ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_buffers_get_no_advice() {
        assert_eq!(huge_page_range(0, HUGE_PAGE_MIN_BYTES - 1), None);
    }

    #[test]
    fn range_is_the_aligned_interior() {
        let addr = 3 * HUGE_PAGE + 100;
        let (start, len) = huge_page_range(addr, 6 * HUGE_PAGE).unwrap();
        assert_eq!(start, 4 * HUGE_PAGE);
        assert_eq!(len, 5 * HUGE_PAGE);
        assert!(start >= addr && start + len <= addr + 6 * HUGE_PAGE);
    }

    #[test]
    fn no_overflow_at_the_top_of_the_address_space() {
        assert_eq!(huge_page_range(usize::MAX - 10, HUGE_PAGE_MIN_BYTES), None);
    }

    #[test]
    fn advising_leaves_contents_untouched() {
        let mut buf = vec![7u8; 8 << 20];
        advise_huge_pages(&mut buf);
        assert!(buf.iter().all(|&b| b == 7));
    }
}
