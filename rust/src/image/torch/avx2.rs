//! torch's antialiased `uint8` resize ([`super::resize_u8`]) with AVX2 on its own `int16`
//! weights: each pass is `clamp((2^(p−1) + Σ wᵢ·xᵢ) >> p, 0, 255)` in `i32`, exactly as the
//! scalar formula (integer sums do not depend on their order, and none of them can overflow:
//! `Σ|wᵢ| < 2^(p+1)` and `2^p·wt_max < 2^14`, so `|Σ wᵢ·xᵢ| < 2^31`).
//!
//! Unlike the Pillow resampler's kernels (22-bit weights split in two `i16` halves, two
//! `vpmaddwd` per tap pair), every tap pair is one `vpmaddwd` here, and:
//!
//! - horizontal pass: 8 output samples per group, four per 128-bit lane, each sample's two taps
//!   picked from one 16-byte load per lane by `vpshufb` (a lane's tap bytes within 16 bytes:
//!   reductions up to about 2.5× with three channels; larger ones use the resampler's path),
//!   four input rows at a time sharing the controls and weights;
//! - vertical pass: the input rows paired globally (`2q`, `2q + 1`), so that the byte interleave
//!   and zero extension of a pair, the shuffles, are done once for all the output rows of a
//!   block of four that read it (a row's weight for a row it does not read is 0);
//! - the two are streamed: the horizontal rows live in a small ring that the vertical blocks
//!   read, never a whole intermediate image.

use std::arch::x86_64::*;

use super::Int16Coeffs;
use crate::image::resample::ImageRef;

/// Output samples per horizontal group (four per 128-bit lane).
const GROUP: usize = 8;
const LANE: usize = 4;
/// Bytes one horizontal lane load covers.
const WINDOW: usize = 16;
/// `vpshufb` index that writes zero.
const ZERO: u8 = 0x80;
/// Samples per vertical step.
const STEP: usize = 32;
/// Output rows per vertical block.
const ROWS: usize = 2;
/// Input rows per horizontal batch.
const BATCH: usize = 4;

/// Whether the CPU has AVX2.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

#[derive(Clone, Copy, Debug)]
struct Group {
    out: usize,
    n: usize,
    pairs: usize,
    /// Byte offsets of the low and high lane's loads for pair 0 from the row's start.
    base: [usize; 2],
    /// The eight samples fit one 16-byte window: one load serves both lanes (`base` equal).
    shared: bool,
}

/// The horizontal pass of one axis for one channel count.
pub(super) struct Horizontal {
    groups: Vec<Group>,
    /// Per group, the two lanes' `vpshufb` controls.
    controls: Vec<[u8; 32]>,
    /// Per group and tap pair, the 8 samples' `(w₂ₚ, w₂ₚ₊₁)`.
    weights: Vec<[i16; 16]>,
    step: usize,
    /// Bytes from a row's start that the loads may read.
    read_len: usize,
    samples: usize,
    precision: u32,
}

impl Horizontal {
    /// `None` when some lane's taps do not fit one 16-byte window, or the precision is 0.
    pub(super) fn new(k: &Int16Coeffs, channels: usize) -> Option<Horizontal> {
        let c = channels;
        if k.precision == 0 || c == 0 {
            return None;
        }
        let samples = k.starts.len() * c;
        let first_byte = |j: usize| k.starts[j / c] * c + j % c;
        let mut plan = Horizontal {
            groups: Vec::with_capacity(samples.div_ceil(GROUP)),
            controls: Vec::with_capacity(samples.div_ceil(GROUP)),
            weights: Vec::new(),
            step: 2 * c,
            read_len: 0,
            samples,
            precision: k.precision,
        };
        for first in (0..samples).step_by(GROUP) {
            let n = GROUP.min(samples - first);
            let mut base = [0usize; 2];
            for lane in 0..2 {
                let from = first + lane * LANE;
                let to = (from + LANE).min(first + n);
                if from >= to {
                    base[lane] = base[0];
                    continue;
                }
                let (lo, hi) = (from..to)
                    .map(first_byte)
                    .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
                if hi - lo + c >= WINDOW {
                    return None;
                }
                base[lane] = lo;
            }
            let (lo, hi) = (first..first + n)
                .map(first_byte)
                .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            let shared = hi - lo + c < WINDOW;
            let taps = (first..first + n)
                .map(|j| k.counts[j / c])
                .max()
                .unwrap_or(0);
            let pairs = taps.div_ceil(2).max(1);
            let at = plan.weights.len();
            plan.weights.resize(at + pairs, [0i16; 16]);
            let mut control = [ZERO; 32];
            for s in 0..n {
                let j = first + s;
                let d = first_byte(j) - base[s / LANE];
                control[4 * s] = d as u8;
                control[4 * s + 2] = (d + c) as u8;
                let x = j / c;
                let w = &k.weights[x * k.ksize..][..k.counts[x]];
                for p in 0..pairs {
                    for t in 0..2 {
                        plan.weights[at + p][2 * s + t] = w.get(2 * p + t).copied().unwrap_or(0);
                    }
                }
            }
            let end = base[0].max(base[1]) + plan.step * (pairs - 1) + WINDOW;
            plan.read_len = plan.read_len.max(end);
            if shared {
                // Both lanes from the group's lowest byte: each lane's offsets move up by its
                // own base's distance from it.
                for (lane, control) in control.chunks_exact_mut(16).enumerate() {
                    for b in control.iter_mut().filter(|b| **b != ZERO) {
                        *b += (base[lane] - lo) as u8;
                    }
                }
                base = [lo, lo];
            }
            plan.groups.push(Group {
                out: first,
                n,
                pairs,
                base,
                shared,
            });
            plan.controls.push(control);
        }
        Some(plan)
    }

    /// `R` output rows (each exactly `samples` long) from `R` input rows, each readable for
    /// [`read_len`](Self::read_len) bytes from its start.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        assert!(src.iter().all(|s| s.len() >= self.read_len));
        assert!(out.iter().all(|o| o.len() == self.samples));
        let ptrs = src.map(|s| s.as_ptr());
        let rounding = _mm256_set1_epi32(1 << (self.precision - 1));
        let shift = _mm_cvtsi32_si128(self.precision as i32);
        // Dwords 0 and 4: the low lane's four bytes, then the high lane's.
        let gather = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
        // Two groups packed together: the first's lanes (dwords 0, 4), then the second's (1, 5).
        let gather2 = _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0);
        let mut weights = self.weights.as_ptr();
        let mut i = 0;
        while i < self.groups.len() {
            let g = self.groups[i];
            // SAFETY: `accumulate`'s contract: `weights` is group `i`'s first weight vector
            // (the groups' vectors follow each other, `pairs` each, as built in `new`), and the
            // rows are `read_len` long (asserted). The stores write `out[r][g.out..][..16]` for
            // two full adjacent groups (`g.out + 16 ≤ samples`) or `out[r][g.out..][..g.n]`,
            // inside the row.
            unsafe {
                let (acc, next) = self.accumulate::<R>(i, weights, ptrs, rounding);
                weights = next;
                let paired = self
                    .groups
                    .get(i + 1)
                    .filter(|h| g.n == GROUP && h.n == GROUP && h.out == g.out + GROUP);
                if paired.is_some() {
                    let (acc2, next) = self.accumulate::<R>(i + 1, weights, ptrs, rounding);
                    weights = next;
                    for r in 0..R {
                        let a = _mm256_sra_epi32(acc[r], shift);
                        let b = _mm256_sra_epi32(acc2[r], shift);
                        // Saturating packs clamp to 0..=255, in-lane: per lane the first
                        // group's 4 bytes, then the second's.
                        let p = _mm256_packs_epi32(a, b);
                        let bytes = _mm256_packus_epi16(p, p);
                        let bytes = _mm256_permutevar8x32_epi32(bytes, gather2);
                        let dst = out[r].as_mut_ptr().add(g.out);
                        _mm_storeu_si128(dst.cast(), _mm256_castsi256_si128(bytes));
                    }
                    i += 2;
                    continue;
                }
                for r in 0..R {
                    let v = _mm256_sra_epi32(acc[r], shift);
                    // Saturating packs clamp to 0..=255 (in-lane: each lane's 4 bytes first).
                    let p = _mm256_packs_epi32(v, v);
                    let b = _mm256_packus_epi16(p, p);
                    let b = _mm256_permutevar8x32_epi32(b, gather);
                    let bytes = _mm256_castsi256_si128(b);
                    let dst = out[r].as_mut_ptr().add(g.out);
                    if g.n == GROUP {
                        _mm_storel_epi64(dst.cast(), bytes);
                    } else {
                        let mut tmp = [0u8; 16];
                        _mm_storeu_si128(tmp.as_mut_ptr().cast(), bytes);
                        std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, g.n);
                    }
                }
                i += 1;
            }
        }
    }

    /// The `R` rows' sums (rounding term included) of group `i`, whose weight vectors start
    /// at `weights`, and the pointer past them.
    ///
    /// # Safety
    /// The CPU must have AVX2; `weights` must point at group `i`'s first weight vector in
    /// `self.weights`; every `ptrs[r]` must start [`read_len`](Self::read_len) readable bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn accumulate<const R: usize>(
        &self,
        i: usize,
        mut weights: *const [i16; 16],
        ptrs: [*const u8; R],
        rounding: __m256i,
    ) -> ([__m256i; R], *const [i16; 16]) {
        let g = self.groups[i];
        let control = &self.controls[i];
        // SAFETY: `control` is 32 bytes; the lane loads read 16 bytes at `base[l] + p·step` for
        // p < pairs, which end within `read_len` (built so in `new`) and so within each row
        // (the caller's); the group's `pairs` weight vectors of 32 bytes follow `weights`.
        unsafe {
            let control = _mm256_loadu_si256(control.as_ptr().cast());
            let mut acc = [rounding; R];
            let (mut lo, mut hi) = (g.base[0], g.base[1]);
            for _ in 0..g.pairs {
                let w = _mm256_loadu_si256(weights.cast());
                for r in 0..R {
                    let v = if g.shared {
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(ptrs[r].add(lo).cast()))
                    } else {
                        _mm256_loadu2_m128i(ptrs[r].add(hi).cast(), ptrs[r].add(lo).cast())
                    };
                    let v = _mm256_shuffle_epi8(v, control);
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(v, w));
                }
                lo += self.step;
                hi += self.step;
                weights = weights.add(1);
            }
            (acc, weights)
        }
    }
}

/// A block of up to [`ROWS`] vertical output rows: the input row pairs it reads and where its
/// rows' `(w₂q, w₂q₊₁)` weights, packed in a dword, start in the blocks' shared weights.
struct Block {
    /// First input row of pair 0 (even).
    lo: usize,
    pairs: usize,
    /// Offset of the block's `pairs × ROWS` packed weights (pair-major).
    at: usize,
}

/// The blocks of output rows `from..to` and their packed weights (one allocation for all).
fn blocks(k: &Int16Coeffs, from: usize, to: usize) -> (Vec<Block>, Vec<i32>) {
    let mut out = Vec::with_capacity((to - from).div_ceil(ROWS));
    let mut weights = Vec::new();
    let mut y0 = from;
    while y0 < to {
        let rows = ROWS.min(to - y0);
        let lo = k.starts[y0] & !1;
        let end = (y0..y0 + rows)
            .map(|y| k.starts[y] + k.counts[y])
            .max()
            .unwrap_or(lo)
            .max(lo + 1);
        let pairs = (end - lo).div_ceil(2);
        let at = weights.len();
        weights.resize(at + pairs * ROWS, 0i32);
        for r in 0..rows {
            let y = y0 + r;
            let w = &k.weights[y * k.ksize..][..k.counts[y]];
            let tap = |i: usize| {
                i.checked_sub(k.starts[y])
                    .and_then(|t| w.get(t))
                    .map_or(0u32, |&v| u32::from(v as u16))
            };
            for q in 0..pairs {
                let i = lo + 2 * q;
                weights[at + q * ROWS + r] = (tap(i) | (tap(i + 1) << 16)) as i32;
            }
        }
        out.push(Block { lo, pairs, at });
        y0 += rows;
    }
    (out, weights)
}

/// `R` vertical output rows of `n ≥ STEP` samples; `rows[2q]`, `rows[2q + 1]` are pair `q`'s
/// input rows (at least `n` bytes each), `weights` the block's packed weights.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn vertical<const R: usize>(
    rows: &[*const u8],
    weights: &[i32],
    precision: u32,
    n: usize,
    out: [*mut u8; R],
) {
    let pairs = rows.len() / 2;
    assert!(n >= STEP && weights.len() >= pairs * ROWS);
    let rounding = _mm256_set1_epi32(1 << (precision - 1));
    let shift = _mm_cvtsi32_si128(precision as i32);
    let zero = _mm256_setzero_si256();
    let mut i = 0;
    loop {
        // The last step overlaps the one before when n is not a multiple of 32: those samples
        // are computed again, to the same values.
        let at = i.min(n - STEP);
        let mut acc = [[rounding; 4]; R];
        for q in 0..pairs {
            // SAFETY: the caller's rows are at least `n ≥ at + 32` bytes.
            let (r0, r1) = unsafe {
                (
                    _mm256_loadu_si256(rows[2 * q].add(at).cast()),
                    _mm256_loadu_si256(rows[2 * q + 1].add(at).cast()),
                )
            };
            let x = _mm256_unpacklo_epi8(r0, r1);
            let y = _mm256_unpackhi_epi8(r0, r1);
            // Per 128-bit lane L: samples 16L + [0..4], [4..8], [8..12], [12..16], each dword
            // (row 2q's byte, row 2q + 1's byte) as two i16.
            let v = [
                _mm256_unpacklo_epi8(x, zero),
                _mm256_unpackhi_epi8(x, zero),
                _mm256_unpacklo_epi8(y, zero),
                _mm256_unpackhi_epi8(y, zero),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let w = _mm256_set1_epi32(weights[q * ROWS + r]);
                for k in 0..4 {
                    acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(v[k], w));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let s = [0, 1, 2, 3].map(|k| _mm256_sra_epi32(acc[k], shift));
            // In-lane packs put each lane's 16 samples back in order; packus clamps to 0..=255.
            let bytes = _mm256_packus_epi16(
                _mm256_packs_epi32(s[0], s[1]),
                _mm256_packs_epi32(s[2], s[3]),
            );
            // SAFETY: `at + 32 ≤ n`, the length of every output row (the caller's).
            unsafe { _mm256_storeu_si256(out[r].add(at).cast(), bytes) };
        }
        if at + STEP >= n {
            break;
        }
        i += STEP;
    }
}

/// The vertical formula sample by sample (rows shorter than a vector).
fn vertical_scalar(rows: &[&[u8]], weights: &[i32], r: usize, precision: u32, out: &mut [u8]) {
    for (x, o) in out.iter_mut().enumerate() {
        let mut acc: i32 = 1 << (precision - 1);
        for (q, pair) in rows.chunks_exact(2).enumerate() {
            let w = weights[q * ROWS + r];
            acc += i32::from(w as i16) * i32::from(pair[0][x]);
            acc += (w >> 16) * i32::from(pair[1][x]);
        }
        *o = (acc >> precision).clamp(0, 255) as u8;
    }
}

/// Output rows `rows` of the resize (`dst` exactly those rows), horizontal pass `h` (absent
/// when the width is kept), vertical weights `v` (absent when the height is kept), at least one
/// of them present.
///
/// # Safety
/// The CPU must have what [`available`] checks.
pub(super) unsafe fn band(
    src: &ImageRef<'_>,
    h: Option<&Horizontal>,
    v: Option<&Int16Coeffs>,
    rows: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    let c = src.channels;
    let in_row = src.width * c;
    let n = h.map_or(in_row, |h| h.samples);
    debug_assert_eq!(dst.len(), rows.len() * n);
    // An input row as the horizontal loads may read it: straight from the image when
    // `read_len` bytes follow its start, else a zero-padded copy.
    let read_len = h.map_or(0, |h| h.read_len);
    let mut pad = vec![0u8; read_len.max(in_row)];
    let Some(v) = v else {
        let Some(h) = h else { return };
        // Rows keep their height: each output row is the horizontal pass of its input row.
        let mut y = rows.start;
        let mut outs = dst.chunks_exact_mut(n);
        while y < rows.end {
            let fits = |y: usize| src.data.len() - y * in_row >= read_len;
            if y + BATCH <= rows.end && fits(y + BATCH - 1) {
                let src_rows: [&[u8]; BATCH] =
                    std::array::from_fn(|r| &src.data[(y + r) * in_row..]);
                let out: [&mut [u8]; BATCH] =
                    std::array::from_fn(|_| outs.next().unwrap_or_default());
                // SAFETY: the caller's CPU check; the rows are long enough (`fits`).
                unsafe { h.rows::<BATCH>(src_rows, out) };
                y += BATCH;
            } else {
                let row = padded(src, y, read_len, &mut pad);
                let out = outs.next().unwrap_or_default();
                // SAFETY: as above; `padded` gives `read_len` bytes.
                unsafe { h.rows::<1>([row], [out]) };
                y += 1;
            }
        }
        return;
    };
    let (blocks, weights) = blocks(v, rows.start, rows.end);
    // The ring of horizontal rows: row i in slot i % cap (the blocks' input rows only move
    // forward, so a slot is reused only when its row is behind every later block).
    // Batches run up to `BATCH − 1` rows ahead of the block that needs them.
    let cap = blocks.iter().map(|b| 2 * b.pairs).max().unwrap_or(2) + BATCH;
    let stride = n.next_multiple_of(64);
    let mut ring = if h.is_some() {
        vec![0u8; cap * stride]
    } else {
        Vec::new()
    };
    let mut next = 0; // the next input row the horizontal pass makes
    let mut outs = dst.chunks_exact_mut(n);
    let mut y = rows.start;
    // Each block's input row pointers (reused from block to block).
    let mut ptrs: Vec<*const u8> = Vec::with_capacity(cap);
    let mut single = Vec::new();
    for b in &blocks {
        let count = ROWS.min(rows.end - y);
        let last = (b.lo + 2 * b.pairs).min(src.height); // one past the last real input row
        if let Some(h) = h {
            next = next.max(b.lo);
            while next < last {
                let fits = |y: usize| src.data.len() - y * in_row >= read_len;
                // A whole batch when it stays in the image and in the ring (its rows overwrite
                // only rows before this block's first).
                if next + BATCH <= src.height
                    && next + BATCH <= b.lo + cap
                    && fits(next + BATCH - 1)
                {
                    let src_rows: [&[u8]; BATCH] =
                        std::array::from_fn(|r| &src.data[(next + r) * in_row..]);
                    let slots: [usize; BATCH] = std::array::from_fn(|r| (next + r) % cap);
                    let out = ring_rows(&mut ring, stride, n, slots);
                    // SAFETY: the caller's CPU check; the rows are long enough (`fits`).
                    unsafe { h.rows::<BATCH>(src_rows, out) };
                    next += BATCH;
                } else {
                    let row = padded(src, next, read_len, &mut pad);
                    let [out] = ring_rows(&mut ring, stride, n, [next % cap]);
                    // SAFETY: as above; `padded` gives `read_len` bytes.
                    unsafe { h.rows::<1>([row], [out]) };
                    next += 1;
                }
            }
        }
        // Pair q's rows; a row past the image (odd height) is the last one, with weight 0.
        let row_of = |i: usize| -> &[u8] {
            let i = i.min(src.height - 1);
            if h.is_some() {
                &ring[(i % cap) * stride..][..n]
            } else {
                &src.data[i * in_row..][..n]
            }
        };
        let block_weights = &weights[b.at..b.at + b.pairs * ROWS];
        if n >= STEP {
            ptrs.clear();
            ptrs.extend((b.lo..b.lo + 2 * b.pairs).map(|i| row_of(i).as_ptr()));
            if count == ROWS {
                let o: [*mut u8; ROWS] = std::array::from_fn(|_| {
                    outs.next().map_or(std::ptr::null_mut(), |o| o.as_mut_ptr())
                });
                // SAFETY: the caller's CPU check; every row pointer starts `n ≥ STEP` readable
                // bytes (ring rows or image rows), every output pointer a distinct `n`-byte row
                // of `dst` (`count` rows remain in `dst` for this block); the weights are
                // `pairs × ROWS` long.
                unsafe { vertical::<ROWS>(&ptrs, block_weights, v.precision, n, o) };
            } else {
                for (r, o) in outs.by_ref().take(count).enumerate() {
                    single.clear();
                    single.resize(b.pairs * ROWS, 0i32);
                    for q in 0..b.pairs {
                        single[q * ROWS] = block_weights[q * ROWS + r];
                    }
                    // SAFETY: as above, for one output row.
                    unsafe { vertical::<1>(&ptrs, &single, v.precision, n, [o.as_mut_ptr()]) };
                }
            }
        } else {
            let slices: Vec<&[u8]> = (b.lo..b.lo + 2 * b.pairs).map(row_of).collect();
            for (r, o) in outs.by_ref().take(count).enumerate() {
                vertical_scalar(&slices, block_weights, r, v.precision, o);
            }
        }
        y += count;
    }
}

/// Input row `y` readable for `read_len` bytes: the image itself, or a zero-padded copy.
fn padded<'a>(src: &'a ImageRef<'_>, y: usize, read_len: usize, pad: &'a mut [u8]) -> &'a [u8] {
    let row = &src.data[y * src.width * src.channels..];
    if row.len() >= read_len {
        return row;
    }
    pad.fill(0);
    pad[..row.len()].copy_from_slice(row);
    pad
}

/// Distinct rows `slots` of the ring, each `n` bytes.
fn ring_rows<const R: usize>(
    ring: &mut [u8],
    stride: usize,
    n: usize,
    slots: [usize; R],
) -> [&mut [u8]; R] {
    let mut rows: Vec<Option<&mut [u8]>> = ring
        .chunks_exact_mut(stride)
        .map(|r| Some(&mut r[..n]))
        .collect();
    std::array::from_fn(|r| rows[slots[r]].take().unwrap_or_default())
}
