//! Huffman decoding on a second thread, ahead of libjpeg.
//!
//! With a thread to spare, the entropy hook of [`super::jpeg`] does not decode on libjpeg's
//! thread: a helper thread runs the scan's [`Scan`] over every MCU into a ring of blocks, and
//! libjpeg's thread takes each MCU's blocks from the ring and goes on with the IDCT, upsampling
//! and colour conversion. The two halves of a decode overlap (on `xmp_test`, Huffman decoding is
//! about two thirds of the time, the rest about one third). The blocks are the ones [`Scan`]
//! writes on libjpeg's thread, so the pixels are the same; an anomaly in the helper reaches
//! libjpeg at the MCU where it happened (the helper hands over every MCU before it), and libjpeg
//! takes the scan over there ([`Pipeline::resume_point`]), as without the helper.
//!
//! With restart markers, libjpeg's thread also decodes every few intervals itself when the
//! Huffman decoding is the larger half ([`Plan`]): the helper skips them (finding where they
//! start and end from their markers), libjpeg's thread decodes them with its own copy of the
//! scan and checks that they end at the marker the helper found.
//!
//! The ring protocol: MCU `k` lives in slot `k % slots`. The helper writes a slot (zeroes it, then
//! decodes into it) only while `k < consumed + slots`; libjpeg's thread reads it only while
//! `k < produced`. Only the helper writes the ring, so a block's cache lines travel once, from
//! the helper's core to libjpeg's.
//! Each side publishes its counter with a release store after it is done with the slots below
//! it, and reads the other's with an acquire load, so a slot is never touched by both at once.
//! A side with nothing to do spins briefly, then parks; the other wakes it after publishing.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use super::jpeg_huffman::{find_marker, Anomaly, Resume, Scan, Step, MAX_BLOCKS_IN_MCU};

/// Scans of fewer blocks are decoded on libjpeg's thread: starting and joining a thread costs
/// tens of microseconds, about what 4 096 blocks take to decode.
pub(crate) const MIN_BLOCKS: u64 = 4096;
/// Scans with less entropy-coded data than this (bytes from the scan's start to the end of the
/// file) are decoded on libjpeg's thread too: their Huffman decoding is too short to hide
/// anything behind (a 640 × 480 photo of 21 KB decoded 10 % slower with a helper).
pub(crate) const MIN_SCAN_BYTES: usize = 32 << 10;
/// The ring's size in blocks (128 bytes each): 512 KiB, within the L2 cache.
const RING_BLOCKS: usize = 4096;
/// Each side publishes its progress every this many MCUs, and whenever it is about to wait.
const BATCH: u64 = 8;
/// How many times a side spins before it parks.
const SPINS: u32 = 2048;
/// A parked side looks again after this long even if nobody woke it.
const NAP: Duration = Duration::from_millis(1);

/// A value alone on its cache line (two lines: the adjacent-line prefetcher pairs them).
#[repr(align(128))]
struct Line<T>(T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

const RUNNING: u8 = 0;
const DONE: u8 = 1;
const FAILED: u8 = 2;

/// What both threads see.
struct Shared {
    /// `slots × per_mcu` blocks.
    ring: Box<[UnsafeCell<[i16; 64]>]>,
    /// MCUs the ring holds.
    slots: u64,
    /// Per slot, for the first MCU of an interval libjpeg's thread decodes itself: where its
    /// data starts and the index of the marker that ends it (found by the helper). Written and
    /// read under the ring protocol (the atomics only spare an `UnsafeCell`).
    marks: Box<[(AtomicUsize, AtomicUsize)]>,
    per_mcu: usize,
    /// MCUs decoded into the ring (written by the helper).
    produced: Line<AtomicU64>,
    /// MCUs taken out of the ring (written by libjpeg's thread), on a cache line of its own: the
    /// two counters are written by different cores.
    consumed: Line<AtomicU64>,
    /// [`RUNNING`], [`DONE`] (set before the last MCU is published) or [`FAILED`].
    state: AtomicU8,
    /// Where the scan's data ended (valid once `state` is [`DONE`]).
    end: AtomicUsize,
    /// Set before `state` becomes [`FAILED`] when the helper's scan stopped on an anomaly in
    /// MCU `k` and can say where libjpeg would stand there: `(k, where)` (see
    /// [`Pipeline::resume_point`]).
    failed_at: OnceLock<(u64, Resume)>,
    /// Set when libjpeg's thread is done with the scan, however it ended.
    cancel: AtomicBool,
    main_waiting: AtomicBool,
    helper_waiting: AtomicBool,
    main: Thread,
    helper: OnceLock<Thread>,
}

// SAFETY: everything but the ring is atomics and thread handles. A ring slot is accessed by one
// thread at a time, as the module docs describe: the helper writes MCU `k`'s slot only after
// loading (acquire) a `consumed` above `k − slots`, which libjpeg's thread stores (release) after
// its last access to that slot; libjpeg's thread accesses it only after loading (acquire) a
// `produced` above `k`, which the helper stores (release) after its last write.
unsafe impl Sync for Shared {}

impl Shared {
    /// The blocks of MCU `k`'s slot.
    ///
    /// # Safety
    ///
    /// The caller must be the thread that owns the slot under the ring protocol, and hold no
    /// other reference into it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, k: u64) -> impl Iterator<Item = &mut [i16; 64]> {
        let first = (k % self.slots) as usize * self.per_mcu;
        // SAFETY: the caller owns the slot (see above), so no other reference to these cells
        // exists while the returned ones live.
        self.ring[first..first + self.per_mcu]
            .iter()
            .map(|cell| unsafe { &mut *cell.get() })
    }

    /// Stores `value` into `counter` and wakes the other side if it is parked.
    fn publish(counter: &AtomicU64, value: u64, waiting: &AtomicBool, who: Option<&Thread>) {
        counter.store(value, Ordering::SeqCst);
        if waiting.load(Ordering::SeqCst) {
            if let Some(thread) = who {
                thread.unpark();
            }
        }
    }

    /// libjpeg's thread: the MCUs below `k` are taken (their slots free for the helper).
    fn give_back(&self, k: u64) {
        Self::publish(&self.consumed, k, &self.helper_waiting, self.helper.get());
    }

    /// The helper: the MCUs below `k` are ready for libjpeg's thread.
    fn hand_over(&self, k: u64) {
        Self::publish(&self.produced, k, &self.main_waiting, Some(&self.main));
    }

    /// Waits until `ready` gives a value: spins, then parks with `waiting` set. The other side
    /// stores its counter and then loads `waiting` (both `SeqCst`), and this side stores
    /// `waiting` and then calls `ready` again before parking: one of the two sees the other's
    /// store, so a wake-up is never lost (and a parked side looks again every [`NAP`]).
    fn wait<T>(waiting: &AtomicBool, mut ready: impl FnMut() -> Option<T>) -> T {
        let mut spins = 0;
        loop {
            if let Some(value) = ready() {
                return value;
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            waiting.store(true, Ordering::SeqCst);
            if let Some(value) = ready() {
                waiting.store(false, Ordering::SeqCst);
                return value;
            }
            std::thread::park_timeout(NAP);
            waiting.store(false, Ordering::SeqCst);
        }
    }

    fn fail(&self) {
        self.state.store(FAILED, Ordering::SeqCst);
        self.main.unpark();
    }
}

/// Which restart intervals libjpeg's thread decodes itself: every `period`-th (the last of each
/// `period`), never the scan's last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// MCUs per restart interval (0: no restart markers).
    interval: u64,
    /// 0: none.
    period: u64,
    intervals: u64,
}

/// Entropy-coded bytes per block from which the Huffman decoding outweighs the rest of the
/// decode enough for libjpeg's thread to take a share of it (`xmp_test`: 18 bytes per block;
/// photos at ~6 bytes per block split about evenly already).
const SHARE_BYTES_PER_BLOCK: u64 = 10;
/// libjpeg's thread decodes one interval in this many (the helper's two in between are decoded
/// in step, see `jpeg_huffman`'s `Ahead`). `xmp_test` with a helper: 12.4 ms taking one in four,
/// 11.9 ms one in three, against 18.6 ms on one thread.
const SHARE_PERIOD: u64 = 3;

impl Plan {
    /// The plan for a scan of `mcus` MCUs of `per_mcu` blocks, `restart_interval` MCUs per
    /// interval, over `bytes` bytes of data.
    pub(crate) fn for_scan(restart_interval: u32, mcus: u64, per_mcu: usize, bytes: usize) -> Self {
        let interval = u64::from(restart_interval);
        let none = Self {
            interval,
            period: 0,
            intervals: 0,
        };
        let blocks = mcus.saturating_mul(per_mcu as u64);
        if interval == 0 || blocks == 0 || (bytes as u64) < SHARE_BYTES_PER_BLOCK * blocks {
            return none;
        }
        let intervals = mcus.div_ceil(interval);
        if intervals < 2 * SHARE_PERIOD {
            return none;
        }
        Self {
            interval,
            period: SHARE_PERIOD,
            intervals,
        }
    }

    /// libjpeg's thread decodes one interval in `period` (at least 2) of a scan of `mcus` MCUs
    /// with `restart_interval` MCUs per interval, whatever its data.
    #[cfg(test)]
    pub(crate) fn every(period: u64, restart_interval: u32, mcus: u64) -> Self {
        let interval = u64::from(restart_interval);
        Self {
            interval,
            period: if interval == 0 { 0 } else { period.max(2) },
            intervals: if interval == 0 {
                0
            } else {
                mcus.div_ceil(interval)
            },
        }
    }

    /// Whether interval `i` is libjpeg's thread's.
    fn ours(&self, i: u64) -> bool {
        self.period > 0 && i % self.period == self.period - 1 && i + 1 < self.intervals
    }

    /// The first interval from `i` on that is libjpeg's thread's.
    fn next_ours(&self, i: u64) -> Option<u64> {
        if self.period == 0 {
            return None;
        }
        let next = i + (self.period - 1 - i % self.period);
        (next + 1 < self.intervals).then_some(next)
    }
}

/// libjpeg's side of a scan decoded by a helper thread; dropping it stops and joins the helper.
pub(crate) struct Pipeline {
    shared: Arc<Shared>,
    helper: Option<JoinHandle<()>>,
    mcus: u64,
    plan: Plan,
    /// libjpeg's thread's own copy of the scan, for its intervals (with a [`Plan`] only).
    scan: Option<Scan>,
    /// Where the interval it is decoding must end (the code byte of the marker).
    interval_end: usize,
    /// The next MCU to hand to libjpeg.
    next: u64,
    /// `produced` as last loaded: MCUs below it are ready.
    ready: u64,
}

/// The raw parts of the file's bytes, sent to the helper.
struct Bytes(*const u8, usize);

// SAFETY: a shared view of bytes nobody writes during the decode (see `Pipeline::start`).
unsafe impl Send for Bytes {}

impl Pipeline {
    /// Starts a helper thread decoding `scan` (`mcus` MCUs, its data from `start` on) from
    /// `data`; `None` (nothing started) when the ring cannot be allocated or the thread cannot
    /// be spawned.
    ///
    /// # Safety
    ///
    /// `data[..len]` must stay readable and unchanged until the returned `Pipeline` is dropped
    /// (its `Drop` joins the helper, the only other reader).
    pub(crate) unsafe fn start(
        scan: Scan,
        data: *const u8,
        len: usize,
        start: usize,
        mcus: u64,
    ) -> Option<Self> {
        let per_mcu = scan.blocks_in_mcu();
        let bytes = len.checked_sub(start)?;
        let plan = Plan::for_scan(scan.restart_interval(), mcus, per_mcu, bytes);
        // SAFETY: forwarded from this function's contract.
        unsafe { Self::start_planned(scan, data, len, start, mcus, plan) }
    }

    /// [`Self::start`] with the intervals of libjpeg's thread given (`plan.period` 0: none).
    ///
    /// # Safety
    ///
    /// As [`Self::start`].
    pub(crate) unsafe fn start_planned(
        scan: Scan,
        data: *const u8,
        len: usize,
        start: usize,
        mcus: u64,
        mut plan: Plan,
    ) -> Option<Self> {
        let per_mcu = scan.blocks_in_mcu();
        if per_mcu == 0 || per_mcu > MAX_BLOCKS_IN_MCU || start > len {
            return None;
        }
        if plan.interval != u64::from(scan.restart_interval()) {
            plan.period = 0;
        }
        if plan.interval > 0 {
            plan.intervals = mcus.div_ceil(plan.interval);
        }
        let ours = if plan.period > 0 { scan.fork() } else { None };
        if ours.is_none() {
            plan.period = 0;
        }
        let slots = (RING_BLOCKS / per_mcu).max(1);
        let mut ring = Vec::new();
        ring.try_reserve_exact(slots * per_mcu).ok()?;
        ring.resize_with(slots * per_mcu, || UnsafeCell::new([0i16; 64]));
        let mut marks = Vec::new();
        marks.try_reserve_exact(slots).ok()?;
        marks.resize_with(slots, || (AtomicUsize::new(0), AtomicUsize::new(0)));
        let shared = Arc::new(Shared {
            ring: ring.into_boxed_slice(),
            slots: slots as u64,
            marks: marks.into_boxed_slice(),
            per_mcu,
            produced: Line(AtomicU64::new(0)),
            consumed: Line(AtomicU64::new(0)),
            state: AtomicU8::new(RUNNING),
            end: AtomicUsize::new(0),
            failed_at: OnceLock::new(),
            cancel: AtomicBool::new(false),
            main_waiting: AtomicBool::new(false),
            helper_waiting: AtomicBool::new(false),
            main: std::thread::current(),
            helper: OnceLock::new(),
        });
        let theirs = Arc::clone(&shared);
        let bytes = Bytes(data, len);
        let helper = std::thread::Builder::new()
            .name("smg-jpeg-huffman".into())
            .spawn(move || {
                let bytes = bytes;
                // SAFETY: the caller keeps `data[..len]` readable and unchanged until the
                // `Pipeline` is dropped, which joins this thread first.
                let data = unsafe { std::slice::from_raw_parts(bytes.0, bytes.1) };
                let shared = &*theirs;
                let _ = shared.helper.set(std::thread::current());
                let run = || decode_ahead(shared, scan, data, start, mcus, plan);
                if catch_unwind(AssertUnwindSafe(run)).is_err() {
                    shared.fail();
                }
            })
            .ok()?;
        Some(Self {
            shared,
            helper: Some(helper),
            mcus,
            plan,
            scan: ours,
            interval_end: 0,
            next: 0,
            ready: 0,
        })
    }

    /// The number of blocks in an MCU.
    pub(crate) fn blocks_in_mcu(&self) -> usize {
        self.shared.per_mcu
    }

    /// Whether libjpeg's thread decodes some restart intervals itself.
    pub(crate) fn shares_intervals(&self) -> bool {
        self.plan.period > 0
    }

    /// Waits until MCU `k` is ready (giving back every MCU before it first).
    fn wait_for(&mut self, k: u64) -> Result<(), Anomaly> {
        let shared = &*self.shared;
        // Everything taken so far is given back before waiting, so the helper is never kept
        // waiting for a slot while this thread waits for it.
        shared.give_back(k);
        self.ready = Shared::wait(&shared.main_waiting, || {
            let produced = shared.produced.load(Ordering::SeqCst);
            if produced > k {
                Some(Ok(produced))
            } else if shared.state.load(Ordering::SeqCst) == FAILED {
                // A failing helper publishes the MCUs before the one it failed in first: loaded
                // again after the failure is seen, `produced` holds them all, so this thread
                // stops exactly at that MCU (where libjpeg can take the scan over).
                match shared.produced.load(Ordering::SeqCst) {
                    produced if produced > k => Some(Ok(produced)),
                    _ => Some(Err(Anomaly("the helper thread stopped"))),
                }
            } else {
                None
            }
        })?;
        Ok(())
    }

    /// The next MCU's blocks into `out` (one zeroed block per block of the MCU; `None` blocks
    /// are dropped), as [`Scan::decode_mcu`] gives them; `data` is the file.
    pub(crate) fn next_mcu(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        let k = self.next;
        if out.len() != self.shared.per_mcu {
            return Err(Anomaly("an MCU of another size"));
        }
        if k >= self.mcus {
            return Err(Anomaly("more MCUs than the frame has"));
        }
        let r = self.plan.interval;
        if r > 0 && self.plan.ours(k / r) {
            self.decode_ours(data, k, out)?;
        } else {
            if k >= self.ready {
                self.wait_for(k)?;
            }
            let shared = &*self.shared;
            // SAFETY: `k < produced` (loaded with acquire ordering): the helper has written slot
            // `k` and will not touch it again until `consumed` passes `k`, which this thread
            // publishes only after the loop below.
            for (theirs, block) in unsafe { shared.slot(k) }.zip(out.iter_mut()) {
                if let Some(block) = block.as_deref_mut() {
                    *block = *theirs;
                }
            }
        }
        let shared = &*self.shared;
        self.next = k + 1;
        if self.next == self.mcus {
            // The helper set `state` (and `end`) before publishing the last MCU (always its).
            return match shared.state.load(Ordering::SeqCst) {
                DONE => Ok(Step::Done(shared.end.load(Ordering::SeqCst))),
                _ => Err(Anomaly("the helper thread did not finish the scan")),
            };
        }
        if self.next.is_multiple_of(BATCH) {
            shared.give_back(self.next);
        }
        Ok(Step::More)
    }

    /// After [`Self::next_mcu`] failed: where libjpeg would stand at the start of the MCU it
    /// failed in, when the scan that decoded that MCU (the helper's, or this thread's own for
    /// its intervals) stopped on an anomaly there; `None` otherwise.
    pub(crate) fn resume_point(&self) -> Option<Resume> {
        let k = self.next;
        let helper = self
            .shared
            .failed_at
            .get()
            .filter(|(at, _)| *at == k)
            .map(|(_, point)| *point);
        let r = self.plan.interval;
        let own = || {
            (r > 0 && self.plan.ours(k / r))
                .then(|| self.scan.as_ref()?.resume_point())
                .flatten()
        };
        // Both scans count MCUs from where they were last positioned: the scan's own count.
        helper.or_else(own).map(|point| Resume {
            mcus_left: self.mcus - k,
            ..point
        })
    }

    /// MCU `k`, of one of this thread's intervals, decoded here into `out`.
    fn decode_ours(
        &mut self,
        data: &[u8],
        k: u64,
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<(), Anomaly> {
        let r = self.plan.interval;
        if k.is_multiple_of(r) {
            // The helper publishes past the interval (in one store) once its marks are written.
            if k >= self.ready {
                self.wait_for(k)?;
            }
            let (first, end) = &self.shared.marks[(k % self.shared.slots) as usize];
            self.interval_end = end.load(Ordering::Relaxed);
            let first = first.load(Ordering::Relaxed);
            let scan = self.scan.as_mut().ok_or(Anomaly("no scan of its own"))?;
            scan.reposition(first, k / r, r);
        }
        let scan = self.scan.as_mut().ok_or(Anomaly("no scan of its own"))?;
        match (scan.decode_mcu(data, out)?, k % r == r - 1) {
            (Step::More, false) => Ok(()),
            (Step::Done(_), true) if scan.end_marker(data)? == self.interval_end => Ok(()),
            _ => Err(Anomaly("an interval that does not end where its marker is")),
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shared.cancel.store(true, Ordering::SeqCst);
        if let Some(helper) = self.helper.take() {
            helper.thread().unpark();
            // A panic in the helper was caught there; the join cannot fail otherwise.
            let _ = helper.join();
        }
    }
}

/// Waits until MCU `k`'s slot may be written; `None` when libjpeg's thread is done.
fn wait_writable(shared: &Shared, k: u64, writable: &mut u64) -> Option<()> {
    if k < *writable {
        return Some(());
    }
    shared.hand_over(k);
    let free = Shared::wait(&shared.helper_waiting, || {
        if shared.cancel.load(Ordering::SeqCst) {
            return Some(None);
        }
        let consumed = shared.consumed.load(Ordering::SeqCst);
        (k < consumed + shared.slots).then_some(Some(consumed + shared.slots))
    })?;
    *writable = free;
    Some(())
}

/// The helper's loop: every MCU of the scan into the ring, as far ahead as the ring allows,
/// but for the intervals `plan` gives libjpeg's thread, whose bounds it finds and records.
fn decode_ahead(shared: &Shared, mut scan: Scan, data: &[u8], start: usize, mcus: u64, plan: Plan) {
    let per_mcu = shared.per_mcu;
    // MCUs below this may be written: `consumed + slots` as last loaded.
    let mut writable = shared.slots;
    let (mut k, mut interval, mut pos) = (0u64, 0u64, start);
    loop {
        // A run of intervals up to the next one of libjpeg's thread (or the end).
        let theirs = plan.next_ours(interval);
        let run_end = theirs.map_or(mcus, |m| m * plan.interval);
        scan.reposition(pos, interval, run_end - k);
        while k < run_end {
            if wait_writable(shared, k, &mut writable).is_none() {
                return;
            }
            let step = {
                let mut out: [Option<&mut [i16; 64]>; MAX_BLOCKS_IN_MCU] = Default::default();
                // SAFETY: `k < consumed + slots` (loaded with acquire ordering): libjpeg's thread
                // is done with this slot and will not touch it until `produced` passes `k`,
                // which this thread publishes only after writing it; `out` ends with this block.
                for (slot, theirs) in out.iter_mut().zip(unsafe { shared.slot(k) }) {
                    *theirs = [0; 64];
                    *slot = Some(theirs);
                }
                scan.decode_mcu(data, &mut out[..per_mcu])
            };
            match step {
                Ok(Step::More) if k + 1 < run_end => {}
                Ok(Step::Done(end)) if k + 1 == run_end => {
                    if theirs.is_none() {
                        shared.end.store(end, Ordering::SeqCst);
                        shared.state.store(DONE, Ordering::SeqCst);
                    }
                }
                Err(_) => {
                    fail_at(shared, k, scan.resume_point());
                    return;
                }
                _ => {
                    shared.fail();
                    return;
                }
            }
            k += 1;
            if (k.is_multiple_of(BATCH) || k == mcus) && !publish_produced(shared, k) {
                return;
            }
        }
        let Some(m) = theirs else {
            return;
        };
        // Interval `m` is libjpeg's thread's: it starts after the marker that ends this run and
        // ends at the next marker, each the restart marker its number calls for.
        let rst = |i: u64| 0xD0 + (i & 7) as u8;
        let bounds = scan.end_marker(data).ok().and_then(|at| {
            let end = find_marker(data, at + 1)?;
            (data[at] == rst(m - 1) && data[end] == rst(m)).then_some((at + 1, end))
        });
        let Some((first, end)) = bounds else {
            // The run ended where libjpeg's thread's interval should start, without the
            // markers around it: libjpeg takes the scan over there.
            fail_at(shared, k, scan.resume_point_here(data));
            return;
        };
        if wait_writable(shared, k, &mut writable).is_none() {
            return;
        }
        let (first_at, end_at) = &shared.marks[(k % shared.slots) as usize];
        first_at.store(first, Ordering::Relaxed);
        end_at.store(end, Ordering::Relaxed);
        // Its MCUs are "produced" at once: libjpeg's thread decodes them.
        (k, interval, pos) = ((m + 1) * plan.interval, m + 1, end + 1);
        if !publish_produced(shared, k) {
            return;
        }
    }
}

/// The helper stops at MCU `k`. With `point` (where libjpeg would stand there), the MCUs before
/// `k`, all whole, are handed over first, so that libjpeg's thread takes them and stops at `k`
/// itself, where libjpeg can take the scan over.
fn fail_at(shared: &Shared, k: u64, point: Option<Resume>) {
    if let Some(point) = point {
        let _ = shared.failed_at.set((k, point));
        if !publish_produced(shared, k) {
            return;
        }
    }
    shared.fail();
}

/// Publishes `produced = k` (waking libjpeg's thread if it waits); `false`, publishing nothing,
/// once libjpeg's thread is done with the scan.
fn publish_produced(shared: &Shared, k: u64) -> bool {
    if shared.cancel.load(Ordering::SeqCst) {
        return false;
    }
    shared.hand_over(k);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_share_dense_scans_with_restart_markers_only() {
        // 100 intervals of 10 MCUs of 6 blocks: 6 000 blocks.
        let dense = Plan::for_scan(10, 1000, 6, 6000 * 12);
        assert_eq!(dense.period, SHARE_PERIOD);
        assert_eq!(
            Plan::for_scan(10, 1000, 6, 6000 * 5).period,
            0,
            "sparse data"
        );
        assert_eq!(
            Plan::for_scan(0, 1000, 6, 6000 * 20).period,
            0,
            "no restart markers"
        );
        assert_eq!(
            Plan::for_scan(500, 1000, 6, 6000 * 20).period,
            0,
            "two intervals"
        );
        let ours: Vec<u64> = (0..100).filter(|&i| dense.ours(i)).collect();
        assert_eq!(ours.len(), 33, "2, 5, … 98");
        assert!(ours.iter().all(|i| i % 3 == 2));
        assert_eq!(dense.next_ours(0), Some(2));
        assert_eq!(dense.next_ours(2), Some(2));
        assert_eq!(dense.next_ours(3), Some(5));
        assert_eq!(dense.next_ours(97), Some(98));
        assert_eq!(dense.next_ours(99), None, "never the last interval");
        let p = Plan::every(2, 3, 10); // intervals 0..4, the last (3) is the helper's
        assert_eq!((0..4).filter(|&i| p.ours(i)).collect::<Vec<_>>(), [1]);
        assert_eq!(p.next_ours(2), None);
    }
}
