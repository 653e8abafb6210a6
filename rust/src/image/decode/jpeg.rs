//! JPEG through libjpeg-turbo (built from source by `turbojpeg-sys`, linked statically), the
//! library Pillow bundles: ISLOW IDCT and fancy upsampling, libjpeg's defaults, which Pillow keeps.
//!
//! Like Pillow's JPEG plugin: the markers up to the first scan are read here for the EXIF
//! (`APP1 Exif`, several concatenated), the XMP (`APP1` Adobe XAP, the last one) and the frame
//! header (8-bit samples and 1, 3 or 4 components only — Pillow refuses anything else); 1
//! component opens as `L`, 3 as `RGB` (libjpeg converts YCbCr), 4 as `CMYK` read with Pillow's
//! `CMYK;I` raw mode (inverted, "Adobe conventions", YCCK converted by libjpeg). Data that ends
//! before the last scanline is a truncation error as in Pillow; a missing EOI marker after
//! complete data is accepted, as in Pillow. libjpeg's warnings are ignored, as in Pillow. The
//! marker walk fails where Pillow's does (see `read_markers`), even when libjpeg would cope.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::convert::{ModeImage, Pixels};
use super::jpeg_huffman::{
    BlockSpec, HuffTable, Resume, Scan, Step, TableClass, MAX_BLOCKS_IN_MCU,
};
use super::jpeg_pipeline::{self, Pipeline};
use super::jpeg_progressive::{Band, ProgressiveScan};
use super::{check_size, exif, overwritten_image, DecodeError, Decoded, Format, MAX_JPEG_SCANS};

// The static libjpeg-turbo comes with turbojpeg-sys; the shim below calls into it.
use turbojpeg_sys as _;

const FORMAT: Format = Format::Jpeg;

#[repr(C)]
struct ShimJpeg {
    _private: [u8; 0],
}

#[repr(C)]
#[derive(Default)]
struct ShimInfo {
    width: c_uint,
    height: c_uint,
    components: c_int,
    jpeg_color_space: c_int,
    data_precision: c_int,
    progressive: c_int,
}

const SHIM_OK: c_int = 0;
const SHIM_ERROR: c_int = 1;
const SHIM_SUSPENDED: c_int = 2;
const SHIM_RETRY: c_int = 3;

/// `jpeg_shim.c`'s `smg_scan_desc`.
#[repr(C)]
struct ScanDesc {
    data: *const u8,
    len: usize,
    blocks_in_mcu: c_int,
    block_component: [c_int; MAX_BLOCKS_IN_MCU],
    block_dc: [c_int; MAX_BLOCKS_IN_MCU],
    block_ac: [c_int; MAX_BLOCKS_IN_MCU],
    table_counts: [*const u8; 8],
    table_symbols: [*const u8; 8],
    restart_interval: c_uint,
    mcus: u64,
    /// 1 for a scan of a progressive file, whose band is `ss`..=`se`, `ah`, `al`.
    progressive: c_int,
    ss: c_int,
    se: c_int,
    ah: c_int,
    al: c_int,
    /// A progressive scan of one component: its MCUs (blocks) per block row; else 0.
    mcus_per_row: c_uint,
}

/// `jpeg_shim.c`'s `smg_entropy_hook`.
#[repr(C)]
struct EntropyHook {
    ctx: *mut c_void,
    start: extern "C" fn(*mut c_void, *const ScanDesc) -> c_int,
    decode_mcu: extern "C" fn(
        *mut c_void,
        *const *mut [i16; 64],
        c_int,
        *mut usize,
        *mut ResumePoint,
    ) -> c_int,
}

/// `jpeg_shim.c`'s `smg_resume_point`: a [`Resume`] as the shim reads it.
#[repr(C)]
struct ResumePoint {
    pos: usize,
    get_buffer: u64,
    bits_left: c_int,
    last_dc_val: [c_int; 4],
    restarts_to_go: c_uint,
    next_restart_num: c_int,
    mcus_left: u64,
    eobrun: c_uint,
}

impl From<Resume> for ResumePoint {
    fn from(r: Resume) -> Self {
        Self {
            pos: r.pos,
            get_buffer: r.get_buffer,
            // At most 63 and 7: no truncation.
            bits_left: r.bits_left as c_int,
            last_dc_val: r.predictions,
            restarts_to_go: r.restarts_to_go,
            next_restart_num: c_int::from(r.next_restart),
            mcus_left: r.mcus_left,
            eobrun: r.eobrun,
        }
    }
}

/// Set to `1` to leave all Huffman decoding to libjpeg-turbo (for comparisons; read once).
pub const STOCK_HUFFMAN_ENV: &str = "SMG_GRPC_PROTO_JPEG_STOCK_HUFFMAN";

/// Scans whose Huffman decoding the hook took: on libjpeg's thread, on a helper thread (of
/// which how many with libjpeg's thread decoding some restart intervals too), how many of all
/// these it gave back to libjpeg (an anomaly: the image decoded again), and how many libjpeg
/// took over where the hook stopped instead. Counted for tests and diagnostics.
static SCANS_INLINE: AtomicU64 = AtomicU64::new(0);
static SCANS_HELPER: AtomicU64 = AtomicU64::new(0);
static SCANS_SHARED: AtomicU64 = AtomicU64::new(0);
static SCANS_RETRIED: AtomicU64 = AtomicU64::new(0);
static SCANS_RESUMED: AtomicU64 = AtomicU64::new(0);
/// Scans of progressive files the hook took ([`super::jpeg_progressive`]).
static SCANS_PROGRESSIVE: AtomicU64 = AtomicU64::new(0);
/// Calls that decoded the rest of a block row of a progressive scan of one component.
static PROGRESSIVE_ROWS: AtomicU64 = AtomicU64::new(0);

/// The counts of [`SCANS_INLINE`] and the others, by name.
pub fn huffman_stats() -> [(&'static str, u64); 7] {
    [
        ("inline", SCANS_INLINE.load(Ordering::Relaxed)),
        ("helper", SCANS_HELPER.load(Ordering::Relaxed)),
        ("shared", SCANS_SHARED.load(Ordering::Relaxed)),
        ("retried", SCANS_RETRIED.load(Ordering::Relaxed)),
        ("resumed", SCANS_RESUMED.load(Ordering::Relaxed)),
        ("progressive", SCANS_PROGRESSIVE.load(Ordering::Relaxed)),
        ("progressive_rows", PROGRESSIVE_ROWS.load(Ordering::Relaxed)),
    ]
}

fn stock_huffman() -> bool {
    static STOCK: OnceLock<bool> = OnceLock::new();
    *STOCK.get_or_init(|| super::env_switch(STOCK_HUFFMAN_ENV) || !shim_layout_matches())
}

/// Whether the shim's `smg_scan_desc` has [`ScanDesc`]'s size and last field offset, and its
/// `smg_resume_point` [`ResumePoint`]'s size (a build pairing a stale shim object with this code
/// would not: the hook then stays out of it).
fn shim_layout_matches() -> bool {
    let (mut size, mut last_field, mut resume_size) = (0usize, 0usize, 0usize);
    // SAFETY: `smg_scan_desc_layout` writes three `size_t`s through the pointers, which point
    // to the three locals above.
    unsafe { smg_scan_desc_layout(&mut size, &mut last_field, &mut resume_size) };
    size == std::mem::size_of::<ScanDesc>()
        && last_field == std::mem::offset_of!(ScanDesc, mcus_per_row)
        && resume_size == std::mem::size_of::<ResumePoint>()
}

/// The Rust side of the entropy hook: the file's bytes and the scan, once started.
struct HookState {
    data: *const u8,
    len: usize,
    /// The scan, decoded on libjpeg's thread ...
    scan: Option<Scan>,
    /// ... or on a helper thread ([`jpeg_pipeline`]), when `helper` allows one ...
    pipeline: Option<Pipeline>,
    /// ... or, in a progressive file, the current scan.
    progressive: Option<ProgressiveScan>,
    /// The progressive scan stopped inside a row it was decoding: the blocks before the one
    /// it stopped in were handed out, and libjpeg takes the scan over at the next call.
    resume_next: bool,
    helper: bool,
    /// Where the scan's data starts in `data`.
    start: usize,
    /// The code byte of the file's last marker other than a restart marker ([`last_marker`]),
    /// found once per file: a scan starting at or after it runs into the end of the file.
    last_marker: Option<usize>,
}

/// The index of the code byte of the last marker in `data` other than a restart marker, as
/// libjpeg's `next_marker` finds markers: the last `FF` followed by a byte that is neither `00`
/// (a stuffed data byte), `FF` (fill) nor `D0`–`D7`. Markers are exactly those pairs, so the
/// search runs backwards from the end of the file, which a whole file answers at once (its EOI,
/// or the end of what follows it); only a file cut inside a scan is searched further back.
/// Once per file, not per scan: a file of hundreds of scans and megabytes of trailing bytes
/// would otherwise search them again for every scan.
fn last_marker(data: &[u8]) -> Option<usize> {
    data.windows(2)
        .rposition(|w| w[0] == 0xFF && !matches!(w[1], 0x00 | 0xFF | 0xD0..=0xD7))
        .map(|at| at + 1)
}

/// Scans of fewer blocks decode without the tables' whole-symbol lookups
/// ([`HuffTable::build`]): building them costs more than they save below a few hundred blocks
/// (a 32 × 32 photo, 24 blocks, decoded ~50 % slower with them).
const WHOLE_SYMBOLS_MIN_BLOCKS: u64 = 256;

impl HookState {
    /// Where the described scan's data starts in the file (it must run to the file's end), and
    /// its blocks per MCU (1 to [`MAX_BLOCKS_IN_MCU`]).
    ///
    /// A scan whose data never reaches a marker ([`last_marker`]) is declined: it runs
    /// into the end of the file (a truncated upload, a file cut before its EOI), where the hook
    /// would find the data short only after decoding all of it, and libjpeg would decode it all
    /// again. Declined, libjpeg decodes it once, as under Pillow.
    fn placement(&self, desc: &ScanDesc) -> Option<(usize, usize)> {
        let start = (desc.data as usize).checked_sub(self.data as usize)?;
        if start > self.len || desc.len != self.len - start {
            return None;
        }
        // The scan's data reaches a marker when one has its `FF` at `start` or later (its
        // code byte after `start`).
        if self.last_marker.is_none_or(|at| at <= start) {
            return None;
        }
        let count = usize::try_from(desc.blocks_in_mcu).ok()?;
        (1..=MAX_BLOCKS_IN_MCU)
            .contains(&count)
            .then_some((start, count))
    }

    /// Builds the scan from libjpeg's description, and where its data starts; `None` declines.
    fn start(&self, desc: &ScanDesc) -> Option<(Scan, usize)> {
        let (start, count) = self.placement(desc)?;
        // Build the tables the blocks use, each once. Allocation failures decline the scan (the
        // stock decoder needs no more memory).
        let mut slots: [Option<usize>; 8] = [None; 8];
        // Room for the tables the blocks use (usually 4, or 2 for grey), not all eight slots:
        // a table is ~21 KiB.
        let used = (0..8)
            .filter(|&slot| {
                let slot = slot as c_int;
                desc.block_dc[..count].contains(&slot) || desc.block_ac[..count].contains(&slot)
            })
            .count();
        let mut tables = HuffTable::blanks(used)?;
        let mut n = 0;
        let blocks = desc.mcus.saturating_mul(count as u64);
        let whole = blocks >= WHOLE_SYMBOLS_MIN_BLOCKS;
        let mut table = |slot: c_int| -> Option<usize> {
            let slot = usize::try_from(slot).ok().filter(|&s| s < 8)?;
            if slots[slot].is_none() {
                build_table(tables.get_mut(n)?, desc, slot, whole)?;
                slots[slot] = Some(n);
                n += 1;
            }
            slots[slot]
        };
        let mut blocks = Vec::new();
        blocks.try_reserve_exact(count).ok()?;
        for b in 0..count {
            blocks.push(BlockSpec {
                component: usize::try_from(desc.block_component[b]).ok()?,
                dc: table(desc.block_dc[b])?,
                ac: table(desc.block_ac[b])?,
            });
        }
        tables.truncate(n);
        Scan::new(tables, blocks, desc.restart_interval, desc.mcus, start).map(|s| (s, start))
    }

    /// Builds a progressive scan from libjpeg's description (after its `start_pass` accepted
    /// the band), and where its data starts; `None` declines.
    fn start_progressive(&self, desc: &ScanDesc) -> Option<(ProgressiveScan, usize)> {
        let (start, count) = self.placement(desc)?;
        let byte = |v: c_int| u8::try_from(v).ok();
        let band = Band {
            ss: byte(desc.ss)?,
            se: byte(desc.se)?,
            ah: byte(desc.ah)?,
            al: byte(desc.al)?,
        };
        // The table each block reads: its DC table in a DC scan, its AC table in an AC scan
        // (a DC refinement reads none).
        let slots = if band.ss == 0 {
            &desc.block_dc
        } else {
            &desc.block_ac
        };
        // Blank tables for the slots the blocks read (none in a DC refinement), built in place.
        let refine_dc = band.ss == 0 && band.ah != 0;
        let distinct = (0..8)
            .filter(|s| !refine_dc && slots[..count].contains(s))
            .count();
        let mut tables = HuffTable::blanks(distinct)?;
        let mut n = 0;
        let mut built: [Option<usize>; 8] = [None; 8];
        let mut blocks = Vec::new();
        blocks.try_reserve_exact(count).ok()?;
        for (&component, &slot) in desc.block_component[..count].iter().zip(&slots[..count]) {
            let component = usize::try_from(component).ok()?;
            if refine_dc {
                blocks.push((component, 0));
                continue;
            }
            let slot = usize::try_from(slot).ok().filter(|&s| s < 8)?;
            if built[slot].is_none() {
                build_table(tables.get_mut(n)?, desc, slot, false)?;
                built[slot] = Some(n);
                n += 1;
            }
            blocks.push((component, built[slot]?));
        }
        tables.truncate(n);
        ProgressiveScan::new(
            band,
            tables,
            blocks,
            desc.restart_interval,
            desc.mcus,
            start,
        )
        .map(|s| (s.with_rows(desc.mcus_per_row), start))
    }
}

/// Builds into `table` (blank: [`HuffTable::blanks`]) the decoding table in slot `slot` (0–3
/// DC, 4–7 AC, as `jpeg_shim.c` fills them) of the scan `desc` describes, with the
/// whole-symbol lookups when `whole`; `None` for an empty slot or a table libjpeg would refuse.
fn build_table(table: &mut HuffTable, desc: &ScanDesc, slot: usize, whole: bool) -> Option<()> {
    let (counts, symbols) = (
        *desc.table_counts.get(slot)?,
        *desc.table_symbols.get(slot)?,
    );
    if counts.is_null() || symbols.is_null() {
        return None;
    }
    // SAFETY: non-null pointers into libjpeg's JHUFF_TBL of this slot (`bits[17]`,
    // `huffval[256]`), alive and unchanged while the scan decodes.
    let (counts, symbols) = unsafe { (&*counts.cast::<[u8; 17]>(), &*symbols.cast::<[u8; 256]>()) };
    let class = if slot < 4 {
        TableClass::Dc
    } else {
        TableClass::Ac
    };
    table.build(counts, symbols, class, whole)
}

extern "C" fn hook_start(ctx: *mut c_void, desc: *const ScanDesc) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the `HookState` that `decode` passes with the hook, alive and
        // not otherwise borrowed during the shim call; `desc` points to the shim's filled
        // description on its stack.
        let (state, desc) = unsafe { (&mut *ctx.cast::<HookState>(), &*desc) };
        // A scan replaces the one before it (a progressive file has several).
        state.scan = None;
        state.progressive = None;
        state.resume_next = false;
        if desc.progressive != 0 {
            let Some((scan, start)) = state.start_progressive(desc) else {
                return 0;
            };
            state.start = start;
            state.progressive = Some(scan);
            SCANS_PROGRESSIVE.fetch_add(1, Ordering::Relaxed);
            return 1;
        }
        let Some((scan, start)) = state.start(desc) else {
            return 0;
        };
        state.start = start;
        let blocks = desc.mcus.saturating_mul(scan.blocks_in_mcu() as u64);
        if state.helper
            && blocks >= jpeg_pipeline::MIN_BLOCKS
            && desc.len >= jpeg_pipeline::MIN_SCAN_BYTES
        {
            // SAFETY: `data`/`len` are the bytes `decode` borrows for its whole run, and the
            // pipeline lives in `state`, which `decode` drops (joining the helper) before
            // returning.
            state.pipeline =
                unsafe { Pipeline::start(scan, state.data, state.len, start, desc.mcus) };
            // Without a helper (no memory for the ring, no thread), libjpeg decodes the scan.
            let Some(pipeline) = &state.pipeline else {
                return 0;
            };
            SCANS_HELPER.fetch_add(1, Ordering::Relaxed);
            if pipeline.shares_intervals() {
                SCANS_SHARED.fetch_add(1, Ordering::Relaxed);
            }
            return 1;
        }
        state.scan = Some(scan);
        SCANS_INLINE.fetch_add(1, Ordering::Relaxed);
        1
    }))
    .unwrap_or(0)
}

/// The hook's status for a scan it stopped in: -2 with `point` written for the shim (libjpeg
/// takes the scan over there), or -1 without one (the image is decoded again).
fn hand_over(point: Option<Resume>, out: &mut ResumePoint) -> c_int {
    match point {
        Some(point) => {
            *out = point.into();
            -2
        }
        None => -1,
    }
}

extern "C" fn hook_decode_mcu(
    ctx: *mut c_void,
    blocks: *const *mut [i16; 64],
    count: c_int,
    consumed: *mut usize,
    resume: *mut ResumePoint,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: as in `hook_start`; `consumed` and `resume` are the trampoline's out
        // variables.
        let (state, consumed, resume) =
            unsafe { (&mut *ctx.cast::<HookState>(), &mut *consumed, &mut *resume) };
        // SAFETY: `data`/`len` are the `&[u8]` that `decode` borrows through the shim
        // call; the hook runs only inside it, and nothing writes those bytes meanwhile.
        let data = unsafe { std::slice::from_raw_parts(state.data, state.len) };
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        let expected = match (&state.progressive, &state.scan, &state.pipeline) {
            (Some(scan), _, _) => scan.blocks_in_mcu(),
            (None, Some(scan), _) => scan.blocks_in_mcu(),
            (None, None, Some(pipeline)) => pipeline.blocks_in_mcu(),
            (None, None, None) => return -1,
        };
        if count != expected {
            return -1;
        }
        if let Some(scan) = state.progressive.as_mut() {
            if std::mem::take(&mut state.resume_next) {
                // The block libjpeg asks for now is the one the row stopped in.
                return hand_over(scan.resume_point(), resume);
            }
            let n = scan.row_blocks();
            if n > 1 && count == 1 && !blocks.is_null() {
                // SAFETY: a progressive scan of one component (`row_blocks` is 1 otherwise):
                // libjpeg-turbo's coefficient controller (`jdcoefct.c`'s `consume_data`, the
                // version turbojpeg-sys builds from the source pinned in Cargo.lock) passes
                // the block at column `c` of a block row as `buffer[row] + c`, a row of the
                // component's coefficient array holding at least `MCUs_per_row` consecutive
                // JBLOCKs (64 JCOEF = i16), and calls again for `c + 1` .. the row's end in
                // order, touching none of them in between; `n` reaches at most the row's end
                // (`row_blocks`, from `MCUs_per_row` and the MCUs decoded so far). The shim
                // answers those calls itself (status 3) and checks each pointer is the next.
                let row = unsafe {
                    let first = *blocks;
                    if first.is_null() {
                        return -1;
                    }
                    std::slice::from_raw_parts_mut(first, n)
                };
                return match scan.decode_row(data, row) {
                    Ok(Step::More) => {
                        PROGRESSIVE_ROWS.fetch_add(1, Ordering::Relaxed);
                        *consumed = n - 1;
                        3
                    }
                    // `row_blocks` leaves the scan's last MCU to a call of its own.
                    Ok(Step::Done(_)) => -1,
                    Err(_) => match (scan.resume_point(), scan.blocks_before_failure()) {
                        // The blocks before the one it stopped in are final: the shim answers
                        // libjpeg's calls for them, and the next call resumes.
                        (Some(_), done) if done > 0 => {
                            state.resume_next = true;
                            *consumed = done - 1;
                            3
                        }
                        (point, _) => hand_over(point, resume),
                    },
                };
            }
        }
        let mut out: [Option<&mut [i16; 64]>; MAX_BLOCKS_IN_MCU] = Default::default();
        if !blocks.is_null() {
            for (b, slot) in out[..count].iter_mut().enumerate() {
                // SAFETY: libjpeg's coefficient controller passes `blocks_in_MCU` pointers to
                // distinct JBLOCKs (64 JCOEF = i16) that it does not touch during the call —
                // zeroed in a sequential scan, holding what the earlier scans wrote in a
                // progressive one; `count` is that number, checked against the scan's above.
                *slot = unsafe { (*blocks.add(b)).as_mut() };
            }
        }
        let step = match (&mut state.progressive, &mut state.scan, &mut state.pipeline) {
            (Some(scan), _, _) => scan.decode_mcu(data, &mut out[..count]),
            (None, Some(scan), _) => scan.decode_mcu(data, &mut out[..count]),
            (None, None, Some(pipeline)) => pipeline.next_mcu(data, &mut out[..count]),
            (None, None, None) => return -1,
        };
        match step {
            Ok(Step::More) => 0,
            Ok(Step::Done(pos)) => match pos.checked_sub(state.start) {
                Some(n) => {
                    *consumed = n;
                    1
                }
                None => -1,
            },
            // Why does not matter here: libjpeg decodes the rest of the scan from where the
            // hook stopped, or the image again.
            Err(_) => {
                let point = match (&state.progressive, &state.scan, &state.pipeline) {
                    (Some(scan), _, _) => scan.resume_point(),
                    (None, Some(scan), _) => scan.resume_point(),
                    (None, None, Some(pipeline)) => pipeline.resume_point(),
                    _ => None,
                };
                hand_over(point, resume)
            }
        }
    }))
    .unwrap_or(-1)
}

extern "C" {
    fn smg_scan_desc_layout(size: *mut usize, last_field: *mut usize, resume_size: *mut usize);
    fn smg_jpeg_resumed(j: *const ShimJpeg) -> c_int;
    fn smg_jpeg_new() -> *mut ShimJpeg;
    fn smg_jpeg_free(j: *mut ShimJpeg);
    fn smg_jpeg_message(j: *const ShimJpeg) -> *const c_char;
    fn smg_jpeg_read_header(
        j: *mut ShimJpeg,
        data: *const u8,
        len: usize,
        max_scans: c_int,
        info: *mut ShimInfo,
    ) -> c_int;
    fn smg_jpeg_decode(
        j: *mut ShimJpeg,
        out: *mut u8,
        out_len: usize,
        stride: usize,
        out_components: c_int,
        hook: *const EntropyHook,
        rows: *mut c_uint,
    ) -> c_int;
}

/// Owns one shim decoder; freed on drop.
struct Shim(*mut ShimJpeg);

impl Shim {
    fn new() -> Result<Self, DecodeError> {
        // SAFETY: `smg_jpeg_new` has no preconditions; it returns calloc'ed memory or null.
        let ptr = unsafe { smg_jpeg_new() };
        if ptr.is_null() {
            return Err(DecodeError::OutOfMemory {
                format: FORMAT,
                bytes: 4096,
            });
        }
        Ok(Self(ptr))
    }

    fn message(&self) -> String {
        // SAFETY: `self.0` is a live decoder; its message buffer is always NUL-terminated
        // (calloc'ed, then written only by snprintf/format_message, which terminate).
        unsafe { CStr::from_ptr(smg_jpeg_message(self.0)) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `smg_jpeg_new` and is freed exactly once, here.
        unsafe { smg_jpeg_free(self.0) }
    }
}

/// What Pillow's marker walk collects before the first scan.
#[derive(Debug, Default)]
struct Markers {
    exif: Option<Vec<u8>>,
    xmp: Option<Vec<u8>>,
    /// (sample precision, height, width, components) of the last frame header.
    frame: Option<(u8, u16, u16, u8)>,
    /// A JFIF segment gave the resolution in dots per inch or cm (Pillow's `info["dpi"]`).
    jfif_dpi: bool,
}

/// A fresh decoder with the headers up to the first scan read.
fn read_header(data: &[u8]) -> Result<(Shim, ShimInfo), DecodeError> {
    let shim = Shim::new()?;
    let mut info = ShimInfo::default();
    // SAFETY: `shim.0` is a fresh decoder; `data` outlives it within the caller (the decoder is
    // dropped before `data`'s borrow ends and only reads `data` inside the shim's calls); `info`
    // is a valid out pointer.
    let status = unsafe {
        smg_jpeg_read_header(
            shim.0,
            data.as_ptr(),
            data.len(),
            MAX_JPEG_SCANS as c_int,
            &mut info,
        )
    };
    match status {
        SHIM_OK => Ok((shim, info)),
        SHIM_ERROR => Err(DecodeError::corrupt(FORMAT, shim.message())),
        _ => Err(DecodeError::truncated(
            FORMAT,
            "the data ends inside the headers",
        )),
    }
}

/// Walks the markers from SOI to the first SOS like Pillow's `JpegImageFile._open`, failing
/// where it fails: a marker `0xFF01`–`0xFFBF`, a segment cut short, a frame header too short or
/// not 8-bit with 1, 3 or 4 components, a bad quantization table, a short JFIF or Adobe
/// segment, a Photoshop resource cut before its name, an ICC segment too short for its
/// sequence number.
fn read_markers(data: &[u8]) -> Result<Markers, DecodeError> {
    let corrupt = |reason: String| DecodeError::corrupt(FORMAT, reason);
    let mut m = Markers::default();
    let mut icc: Vec<&[u8]> = Vec::new();
    // `pos` is the byte Pillow holds in `s` (the third byte, 0xFF, to begin with).
    let mut pos = 2;
    while let Some(&byte) = data.get(pos) {
        if byte != 0xFF {
            pos += 1; // junk between markers
            continue;
        }
        let Some(&marker) = data.get(pos + 1) else {
            break;
        };
        match marker {
            0xFF => {
                pos += 1; // fill byte: the second 0xFF starts the marker
                continue;
            }
            0x00 => {
                pos += 2;
                continue;
            }
            0x01..=0xBF => {
                return Err(corrupt(format!("no marker found (0xFF{marker:02X})")));
            }
            // Markers without a segment.
            0xC8 | 0xD0..=0xD9 | 0xF0..=0xFD => {
                pos += 2;
                continue;
            }
            _ => {}
        }
        let Some(len) = data.get(pos + 2..pos + 4) else {
            return Err(DecodeError::truncated(
                FORMAT,
                format!("the length of marker 0xFF{marker:02X} is cut short"),
            ));
        };
        let n = usize::from(u16::from_be_bytes([len[0], len[1]])).saturating_sub(2);
        let Some(body) = data.get(pos + 4..pos + 4 + n) else {
            return Err(DecodeError::truncated(
                FORMAT,
                format!("the segment of marker 0xFF{marker:02X} is cut short"),
            ));
        };
        pos += 4 + n;
        match marker {
            0xDA => break, // SOS: the image data starts
            0xC0..=0xC3 | 0xC5..=0xC7 | 0xC9..=0xCB | 0xCD..=0xCF | 0xDE => {
                if body.len() < 5 {
                    return Err(corrupt(format!("frame header of {} bytes", body.len())));
                }
                if body[0] != 8 {
                    return Err(DecodeError::unsupported(
                        FORMAT,
                        format!("sample precision: {}-bit (only 8-bit)", body[0]),
                    ));
                }
                let Some(&layers) = body.get(5) else {
                    return Err(corrupt(format!("frame header of {} bytes", body.len())));
                };
                if !matches!(layers, 1 | 3 | 4) {
                    return Err(DecodeError::unsupported(
                        FORMAT,
                        format!("number of components: {layers} (only 1, 3 or 4)"),
                    ));
                }
                if let Some(first) = icc.iter().min() {
                    if first.len() < 14 {
                        return Err(corrupt("ICC profile segment too short".to_owned()));
                    }
                }
                icc.clear();
                m.frame = Some((
                    body[0],
                    u16::from_be_bytes([body[1], body[2]]),
                    u16::from_be_bytes([body[3], body[4]]),
                    layers,
                ));
            }
            0xDB => {
                let mut s = body;
                while let Some(&v) = s.first() {
                    let table = 1 + if v / 16 == 0 { 64 } else { 128 };
                    if s.len() < table {
                        return Err(corrupt("bad quantization table marker".to_owned()));
                    }
                    s = &s[table..];
                }
            }
            0xE0 if body.starts_with(b"JFIF") && body.len() < 7 => {
                return Err(corrupt("JFIF segment cut short".to_owned()));
            }
            0xE0 if body.starts_with(b"JFIF") && body.len() >= 12 && matches!(body[7], 1 | 2) => {
                m.jfif_dpi = true;
            }
            0xEE if body.starts_with(b"Adobe") && body.len() < 7 => {
                return Err(corrupt("Adobe segment cut short".to_owned()));
            }
            0xED if body.starts_with(b"Photoshop 3.0\x00") && photoshop_cut(body) => {
                return Err(corrupt("Photoshop resource cut short".to_owned()));
            }
            0xE2 if body.starts_with(b"ICC_PROFILE\x00") => icc.push(body),
            0xE1 if body.starts_with(b"Exif\x00\x00") => match &mut m.exif {
                Some(exif) => exif.extend_from_slice(&body[6..]),
                None => m.exif = Some(body.to_vec()),
            },
            0xE1 if body.starts_with(b"http://ns.adobe.com/xap/1.0/\x00") => {
                m.xmp = Some(body[29..].to_vec());
            }
            _ => {}
        }
    }
    Ok(m)
}

/// True when Pillow's Photoshop resource walk indexes past the segment (an `IndexError` it
/// does not catch): a resource whose name length byte is missing.
fn photoshop_cut(s: &[u8]) -> bool {
    let mut offset = 14usize;
    while s.get(offset..offset + 4) == Some(b"8BIM") {
        offset += 4;
        if offset + 2 > s.len() {
            return false; // struct.error: caught
        }
        offset += 2;
        let Some(&name_len) = s.get(offset) else {
            return true;
        };
        offset += 1 + usize::from(name_len);
        offset += offset & 1;
        let Some(size) = s.get(offset..offset + 4) else {
            return false;
        };
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]) as usize;
        offset += 4;
        offset = offset.saturating_add(size);
        offset += offset & 1;
    }
    false
}

/// Whether `threads` (0: one per core) leaves a thread for a Huffman helper.
fn helper_allowed(threads: usize) -> bool {
    match threads {
        0 => crate::cores::count() >= 2,
        n => n >= 2,
    }
}

/// Decodes a JPEG file into the Pillow mode it opens as, the Huffman decoding by
/// [`super::jpeg_huffman`] where it applies (unless [`STOCK_HUFFMAN_ENV`] is set).
///
/// `threads` is how many threads the decode may use (0: one per core): with two or more, a
/// scan of at least [`jpeg_pipeline::MIN_BLOCKS`] blocks and [`jpeg_pipeline::MIN_SCAN_BYTES`]
/// bytes is Huffman-decoded on a helper thread while this one runs the rest of libjpeg
/// ([`jpeg_pipeline`]); the pixels are the same.
pub(crate) fn decode(data: &[u8], limit: u64, threads: usize) -> Result<Decoded, DecodeError> {
    let markers = read_markers(data)?;
    if let Some((_, height, width, _)) = markers.frame {
        check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    }
    let (mut shim, info) = read_header(data)?;
    let (width, height) = (info.width, info.height);
    check_size(FORMAT, u64::from(width), u64::from(height), limit)?;
    if info.data_precision != 8 {
        return Err(DecodeError::unsupported(
            FORMAT,
            format!("sample precision: {}-bit (only 8-bit)", info.data_precision),
        ));
    }
    let components: usize = match info.components {
        1 => 1,
        3 => 3,
        4 => 4,
        n => {
            return Err(DecodeError::unsupported(
                FORMAT,
                format!("number of components: {n} (only 1, 3 or 4)"),
            ))
        }
    };
    let mut pixels: Vec<u8> = overwritten_image(FORMAT, width, height, components)?;
    let stride = width as usize * components;
    let mut state = HookState {
        data: data.as_ptr(),
        len: data.len(),
        scan: None,
        pipeline: None,
        progressive: None,
        resume_next: false,
        helper: helper_allowed(threads),
        start: 0,
        last_marker: last_marker(data),
    };
    let hook = EntropyHook {
        ctx: std::ptr::addr_of_mut!(state).cast(),
        start: hook_start,
        decode_mcu: hook_decode_mcu,
    };
    let mut rows: c_uint = 0;
    let mut run = |shim: &Shim, hook: *const EntropyHook| {
        // SAFETY: the header was read successfully; `pixels` holds `height` rows of `stride`
        // bytes and the shim checks that libjpeg's output dimensions fit `out_len` before
        // writing; `data` is still borrowed (alive); `hook` (null, or the hook above) and the
        // `state` it points to live on this frame through the call, and nothing else touches
        // `state` during it; `rows` is a valid out pointer.
        unsafe {
            smg_jpeg_decode(
                shim.0,
                pixels.as_mut_ptr(),
                pixels.len(),
                stride,
                components as c_int,
                hook,
                &mut rows,
            )
        }
    };
    let mut status = run(
        &shim,
        if stock_huffman() {
            std::ptr::null()
        } else {
            &hook
        },
    );
    // A helper thread is stopped and joined here, before anything else happens to the image.
    state.pipeline = None;
    // SAFETY: `shim.0` is a live decoder.
    if status != SHIM_RETRY && unsafe { smg_jpeg_resumed(shim.0) } != 0 {
        SCANS_RESUMED.fetch_add(1, Ordering::Relaxed);
    }
    if status == SHIM_RETRY {
        SCANS_RETRIED.fetch_add(1, Ordering::Relaxed);
        // The hook gave the image back: a fresh decoder reads it from the start, alone.
        shim = read_header(data)?.0;
        status = run(&shim, std::ptr::null());
    }
    match status {
        SHIM_OK => {}
        SHIM_SUSPENDED => {
            return Err(DecodeError::truncated(
                FORMAT,
                format!(
                    "{rows} of {height} rows decoded{}",
                    if info.progressive != 0 {
                        " (progressive)"
                    } else {
                        ""
                    }
                ),
            ))
        }
        _ => return Err(DecodeError::corrupt(FORMAT, shim.message())),
    }
    let pixels = match components {
        1 => Pixels::L(pixels),
        3 => Pixels::Rgb(pixels),
        _ => {
            // Pillow reads 4-component JPEGs with raw mode "CMYK;I": every sample inverted.
            for v in &mut pixels {
                *v = !*v;
            }
            Pixels::Cmyk(pixels)
        }
    };
    Ok(Decoded {
        image: ModeImage {
            width,
            height,
            pixels,
            transparency: None,
        },
        exif_error: markers
            .exif
            .as_deref()
            .filter(|e| exif::pillow_refuses(e))
            .map(|_| {
                // Read (and the error swallowed) while opening, unless JFIF gave the dpi.
                if markers.jfif_dpi {
                    exif::ExifError::Raises
                } else {
                    exif::ExifError::Swallowed
                }
            }),
        exif: markers.exif,
        xmp: markers.xmp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shims_scan_description_has_this_layout() {
        // Else every hook would be left out (and the decoder would be libjpeg's alone).
        assert!(shim_layout_matches());
    }

    /// Whether a scan starting at `start` reaches a marker, by [`last_marker`] as
    /// [`HookState::placement`] asks it, against the forward walk libjpeg makes (`find_marker`,
    /// restart markers passed over) on hand-made endings and 20 000 random byte strings rich in
    /// `FF`, `00` and restart codes, from every start.
    #[test]
    fn the_backward_search_finds_what_the_forward_walk_finds() {
        use super::super::jpeg_huffman::find_marker;
        use super::super::jpeg_huffman::tests::Rng;
        let ends_at_a_marker =
            |data: &[u8], start: usize| last_marker(data).is_some_and(|at| at > start);
        let forward = |data: &[u8], mut pos: usize| {
            while let Some(at) = find_marker(data, pos) {
                if !(0xD0..=0xD7).contains(&data[at]) {
                    return true;
                }
                pos = at + 1;
            }
            false
        };
        let cases: [(&[u8], bool); 9] = [
            (b"\x12\x34\xff\xd9", true),
            (b"\x12\xff\xd9garbage", true),
            (b"\x12\xff\xff\xff\xd9", true),
            (b"\x12\xff\x00\x34", false),
            (b"\x12\xff\xff\x00", false),
            (b"\x12\xff\xd0\x34\xff\xd7", false),
            (b"\x12\xff\xd3\x34\xff\xc4\x00", true),
            (b"\x12\x34", false),
            (b"", false),
        ];
        for (data, want) in cases {
            assert_eq!(ends_at_a_marker(data, 0), want, "{data:x?}");
            assert_eq!(forward(data, 0), want, "{data:x?}");
        }
        assert!(!ends_at_a_marker(b"\xff\xd9", 3));
        let mut rng = Rng(0x5EED_0005);
        let mut found = [0; 2];
        for _ in 0..20_000 {
            let len = rng.below(24) as usize;
            let data: Vec<u8> = (0..len)
                .map(|_| match rng.below(8) {
                    0..=2 => 0xFF,
                    3 => 0x00,
                    4 => 0xD0 + rng.below(8) as u8,
                    _ => rng.below(256) as u8,
                })
                .collect();
            for start in 0..=len {
                let want = forward(&data, start);
                assert_eq!(
                    ends_at_a_marker(&data, start),
                    want,
                    "{data:x?} from {start}"
                );
                found[usize::from(want)] += 1;
            }
        }
        assert!(found[0] > 10_000 && found[1] > 10_000, "{found:?}");
    }

    #[test]
    fn markers_collect_exif_and_xmp() {
        let mut data = b"\xff\xd8".to_vec();
        let mut seg = |marker: u8, body: &[u8]| {
            data.extend([0xFF, marker]);
            data.extend(((body.len() + 2) as u16).to_be_bytes());
            data.extend(body);
        };
        seg(0xE1, b"Exif\x00\x00II*\x00");
        seg(0xE1, b"Exif\x00\x00more");
        seg(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x/>");
        seg(0xC0, &[8, 0, 2, 0, 3, 3]);
        data.extend([0xFF, 0xDA, 0x00, 0x02]);
        let m = read_markers(&data).unwrap();
        assert_eq!(m.exif.as_deref(), Some(&b"Exif\x00\x00II*\x00more"[..]));
        assert_eq!(m.xmp.as_deref(), Some(&b"<x/>"[..]));
        assert_eq!(m.frame, Some((8, 2, 3, 3)));
    }

    #[test]
    fn marker_walk_fails_where_pillow_does() {
        let ok = b"\xff\xd8\xff\xe0\x00\x04ab\x00\x12\xff\xff\xff\x00\xff\xd0\xff\xda\x00\x02";
        assert!(read_markers(ok).is_ok());
        for bad in [
            &b"\xff\xd8\xff\x01\xff\xda\x00\x02"[..], // TEM: "no marker found"
            b"\xff\xd8\xff\xbf\xff\xda\x00\x02",
            b"\xff\xd8\xff\xe0\x00\x07JFIF\x00\xff\xda\x00\x02", // JFIF cut short
            b"\xff\xd8\xff\xdb\x00\x05\x00\x01\x02\xff\xda\x00\x02", // short DQT
            b"\xff\xd8\xff\xc0\x00\x06\x08\x00\x01\x00\xff\xda\x00\x02", // short SOF
            b"\xff\xd8\xff\xe1\x00\x10Exif",                     // segment cut short
        ] {
            assert!(read_markers(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn photoshop_resources() {
        let head = b"Photoshop 3.0\x00".to_vec();
        assert!(!photoshop_cut(&head));
        let mut cut = head.clone();
        cut.extend(b"8BIM\x03\xed");
        assert!(photoshop_cut(&cut));
        let mut whole = head;
        whole.extend(b"8BIM\x03\xed\x00\x00\x00\x00\x00\x02ab");
        assert!(!photoshop_cut(&whole));
    }

    #[test]
    fn garbage_after_soi_is_an_error_not_a_crash() {
        for data in [
            &b"\xff\xd8\xff"[..],
            b"\xff\xd8\xff\xc0\x00\x11",
            b"\xff\xd8\xff\xd9",
            b"\xff\xd8\xffhello",
        ] {
            let err = decode(data, u64::MAX, 1).unwrap_err();
            assert!(matches!(err.kind(), "truncated" | "corrupt"), "{err}");
        }
    }

    #[test]
    fn twelve_bit_is_unsupported() {
        let data =
            b"\xff\xd8\xff\xc0\x00\x11\x0c\x00\x10\x00\x10\x03\x01\x11\x00\x02\x11\x01\x03\x11\x01";
        assert_eq!(decode(data, u64::MAX, 1).unwrap_err().kind(), "unsupported");
    }
}
