//! The streaming driver of torch's `uint8` resize ([`super::resize_u8`]) for the SIMD kernels
//! ([`super::avx2`], [`super::avx512`]): a band of output rows is made by running the horizontal
//! pass on the input rows it needs into a small ring of rows, which the vertical pass reads in
//! blocks of [`ROWS`] output rows — never a whole intermediate image.
//!
//! The vertical input rows are paired globally (`2q`, `2q + 1`), so that a kernel interleaves
//! and widens a pair once for all the output rows of a block that read it (a row's weight for
//! a row it does not read is 0).

use super::Int16Coeffs;
use crate::image::resample::ImageRef;

/// Output rows per vertical block.
pub(super) const ROWS: usize = 2;
/// Input rows per horizontal batch.
const BATCH: usize = 4;

/// One instruction set's kernels of the two passes, as [`band`] drives them.
pub(super) trait Kernels {
    /// Samples per vertical step: output rows narrower than this take the scalar formula.
    const STEP: usize;

    /// Output samples of a horizontal row.
    fn samples(&self) -> usize;

    /// Bytes from an input row's start that the horizontal loads may read.
    fn read_len(&self) -> usize;

    /// `R` horizontal output rows (each exactly [`samples`](Self::samples) long) from `R`
    /// input rows (sharing each group's control and weight loads).
    ///
    /// # Safety
    /// The CPU must have the kernel's features; every `src[r]` must be at least
    /// [`read_len`](Self::read_len) long (asserted).
    unsafe fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]);

    /// `R` vertical output rows of `n ≥ STEP` samples: `rows[2q]`, `rows[2q + 1]` are pair
    /// `q`'s input rows, `weights[q · ROWS + r]` output row `r`'s packed `(w₂q, w₂q₊₁)`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features; every `rows[i]` must start `n` readable bytes
    /// and every `out[r]` `n` writable bytes of distinct rows; `weights` must hold
    /// `rows.len() / 2 · ROWS` values.
    unsafe fn vertical<const R: usize>(
        rows: &[*const u8],
        weights: &[i32],
        precision: u32,
        n: usize,
        out: [*mut u8; R],
    );
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
/// The CPU must have what `K`'s kernels need.
pub(super) unsafe fn band<K: Kernels>(
    src: &ImageRef<'_>,
    h: Option<&K>,
    v: Option<&Int16Coeffs>,
    rows: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    let c = src.channels;
    let in_row = src.width * c;
    let n = h.map_or(in_row, |h| h.samples());
    debug_assert_eq!(dst.len(), rows.len() * n);
    // An input row as the horizontal loads may read it: straight from the image when
    // `read_len` bytes follow its start, else a zero-padded copy.
    let read_len = h.map_or(0, |h| h.read_len());
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
        if n >= K::STEP {
            ptrs.clear();
            ptrs.extend((b.lo..b.lo + 2 * b.pairs).map(|i| row_of(i).as_ptr()));
            if count == ROWS {
                let o: [*mut u8; ROWS] = std::array::from_fn(|_| {
                    outs.next().map_or(std::ptr::null_mut(), |o| o.as_mut_ptr())
                });
                // SAFETY: the caller's CPU check; every row pointer starts `n ≥ K::STEP` readable
                // bytes (ring rows or image rows), every output pointer a distinct `n`-byte row
                // of `dst` (`count` rows remain in `dst` for this block); the weights are
                // `pairs × ROWS` long.
                unsafe { K::vertical::<ROWS>(&ptrs, block_weights, v.precision, n, o) };
            } else {
                for (r, o) in outs.by_ref().take(count).enumerate() {
                    single.clear();
                    single.resize(b.pairs * ROWS, 0i32);
                    for q in 0..b.pairs {
                        single[q * ROWS] = block_weights[q * ROWS + r];
                    }
                    // SAFETY: as above, for one output row.
                    unsafe { K::vertical::<1>(&ptrs, &single, v.precision, n, [o.as_mut_ptr()]) };
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
