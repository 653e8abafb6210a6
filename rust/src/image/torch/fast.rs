//! torch's antialiased `uint8` resize ([`super::resize_u8`]) with AVX-512 (BW, VBMI, VNNI) on
//! its own `int16` weights: each pass is `clamp((2^(p−1) + Σ wᵢ·xᵢ) >> p, 0, 255)` in `i32`,
//! exactly as the scalar formula (integer sums do not depend on their order, and none of them
//! can overflow: `Σ|wᵢ| < 2^(p+1)` and `2^p·wt_max < 2^14`, so `|Σ wᵢ·xᵢ| < 2^31`).
//!
//! Unlike the Pillow resampler's kernels (22-bit weights split in two `i16` halves, two
//! `vpdpwssd` per tap pair), every tap pair is one `vpdpwssd` here, and:
//!
//! - horizontal pass: 16 output samples per group, each sample's two taps picked from one
//!   64-byte load by a zero-masking `vpermb` (sample bytes within 64 of the group's first: up to
//!   about 3.5× reduction with three channels; larger reductions use the resampler's path), four
//!   input rows at a time sharing the controls and weights;
//! - vertical pass: the input rows paired globally (`2q`, `2q + 1`), so that the byte interleave
//!   and zero extension of a pair, the costly shuffles, are done once for all the output rows of
//!   a block of four that read it (a row's weight for a row it does not read is 0);
//! - the two are streamed: the horizontal rows live in a small ring that the vertical blocks
//!   read, never a whole intermediate image.

use std::arch::x86_64::*;

use super::Int16Coeffs;
use crate::image::resample::ImageRef;

/// Output samples per horizontal group.
const GROUP: usize = 16;
/// Bytes one horizontal load covers.
const WINDOW: usize = 64;
/// `vpermb` writes the even bytes of each `i16` (the tap bytes), zeroes the odd ones.
const EVEN_BYTES: u64 = 0x5555_5555_5555_5555;
/// Samples per vertical step.
const STEP: usize = 64;
/// Output rows per vertical block, input rows per horizontal batch.
const ROWS: usize = 4;

/// Whether the CPU has what these kernels use (and AVX-512 is not turned off).
pub(super) fn available() -> bool {
    crate::image::avx512::available()
}

#[derive(Clone, Copy, Debug)]
struct Group {
    out: usize,
    n: usize,
    pairs: usize,
    base: usize,
}

/// The horizontal pass of one axis for one channel count.
pub(super) struct Horizontal {
    groups: Vec<Group>,
    controls: Vec<[u8; 64]>,
    /// Per group and tap pair, the 16 samples' `(w₂ₚ, w₂ₚ₊₁)`.
    weights: Vec<[i16; 32]>,
    step: usize,
    /// Bytes from a row's start that the loads may read.
    read_len: usize,
    narrow: bool,
    samples: usize,
    precision: u32,
}

impl Horizontal {
    /// `None` when some group's taps do not fit one 64-byte window, or the precision is 0.
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
            narrow: true,
            samples,
            precision: k.precision,
        };
        for first in (0..samples).step_by(GROUP) {
            let n = GROUP.min(samples - first);
            let (base, last) = (first..first + n)
                .map(first_byte)
                .fold((usize::MAX, 0), |(lo, hi), b| (lo.min(b), hi.max(b)));
            if last - base + c >= WINDOW {
                return None;
            }
            if last - base + c >= WINDOW / 2 {
                plan.narrow = false;
            }
            let taps = (first..first + n)
                .map(|j| k.counts[j / c])
                .max()
                .unwrap_or(0);
            let pairs = taps.div_ceil(2).max(1);
            let at = plan.weights.len();
            plan.weights.resize(at + pairs, [0i16; 32]);
            let mut control = [0u8; 64];
            for s in 0..n {
                let j = first + s;
                let d = first_byte(j) - base;
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
            plan.read_len = plan.read_len.max(base + plan.step * (pairs - 1) + WINDOW);
            plan.groups.push(Group {
                out: first,
                n,
                pairs,
                base,
            });
            plan.controls.push(control);
        }
        Some(plan)
    }

    /// `R` output rows (each exactly `samples` long) from `R` input rows, each readable for
    /// [`read_len`](Self::read_len) bytes from its start.
    ///
    /// # Safety
    /// The CPU must have what [`available`] checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")]
    unsafe fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        assert!(src.iter().all(|s| s.len() >= self.read_len));
        assert!(out.iter().all(|o| o.len() == self.samples));
        let ptrs = src.map(|s| s.as_ptr());
        let zero = _mm512_setzero_si512();
        let rounding = _mm512_set1_epi32(1 << (self.precision - 1));
        let shift = _mm_cvtsi32_si128(self.precision as i32);
        let mut weights = self.weights.as_ptr();
        for (g, control) in self.groups.iter().zip(&self.controls) {
            // SAFETY: `control` is 64 bytes; the loads read 64 (or 32) bytes at `base + p·step`
            // for p < pairs, which end within `read_len ≤ src[r].len()` (asserted); `pairs`
            // weight vectors of 64 bytes follow `weights` (built so in `new`); the stores
            // write `out[r][g.out .. g.out + g.n]`, inside the row (`out + n ≤ samples`).
            unsafe {
                let control = _mm512_loadu_si512(control.as_ptr().cast());
                let mut acc = [rounding; R];
                let mut at = g.base;
                for _ in 0..g.pairs {
                    let w = _mm512_loadu_si512(weights.cast());
                    for r in 0..R {
                        let v = if self.narrow {
                            _mm512_castsi256_si512(_mm256_loadu_si256(ptrs[r].add(at).cast()))
                        } else {
                            _mm512_loadu_si512(ptrs[r].add(at).cast())
                        };
                        let v = _mm512_maskz_permutexvar_epi8(EVEN_BYTES, control, v);
                        acc[r] = _mm512_dpwssd_epi32(acc[r], v, w);
                    }
                    at += self.step;
                    weights = weights.add(1);
                }
                for r in 0..R {
                    let v = _mm512_sra_epi32(acc[r], shift);
                    let bytes = _mm512_cvtusepi32_epi8(_mm512_max_epi32(v, zero));
                    let dst = out[r].as_mut_ptr().add(g.out);
                    if g.n == GROUP {
                        _mm_storeu_si128(dst.cast(), bytes);
                    } else {
                        _mm_mask_storeu_epi8(dst.cast(), (1u16 << g.n) - 1, bytes);
                    }
                }
            }
        }
    }
}

/// A block of up to [`ROWS`] vertical output rows: the input row pairs it reads and each row's
/// `(w₂q, w₂q₊₁)` weights packed in a dword.
struct Block {
    /// First input row of pair 0 (even).
    lo: usize,
    pairs: usize,
    /// `pairs × ROWS` packed weights, pair-major.
    weights: Vec<i32>,
}

fn blocks(k: &Int16Coeffs, from: usize, to: usize) -> Vec<Block> {
    let mut out = Vec::with_capacity((to - from).div_ceil(ROWS));
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
        let mut weights = vec![0i32; pairs * ROWS];
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
                weights[q * ROWS + r] = (tap(i) | (tap(i + 1) << 16)) as i32;
            }
        }
        out.push(Block { lo, pairs, weights });
        y0 += rows;
    }
    out
}

/// `R` vertical output rows of `n ≥ STEP` samples; `rows[2q]`, `rows[2q + 1]` are pair `q`'s
/// input rows (at least `n` bytes each), `weights` the block's packed weights.
///
/// # Safety
/// The CPU must have what [`available`] checks.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vertical<const R: usize>(
    rows: &[*const u8],
    weights: &[i32],
    precision: u32,
    n: usize,
    out: [*mut u8; R],
) {
    let pairs = rows.len() / 2;
    debug_assert!(n >= STEP && weights.len() >= pairs * ROWS);
    let zero = _mm512_setzero_si512();
    let rounding = _mm512_set1_epi32(1 << (precision - 1));
    let shift = _mm_cvtsi32_si128(precision as i32);
    let mut i = 0;
    loop {
        // The last step overlaps the one before when n is not a multiple of 64: those samples
        // are computed again, to the same values.
        let at = i.min(n - STEP);
        let mut acc = [[rounding; 4]; R];
        for q in 0..pairs {
            // SAFETY: the caller's rows are at least `n ≥ at + 64` bytes.
            let (r0, r1) = unsafe {
                (
                    _mm512_loadu_si512(rows[2 * q].add(at).cast()),
                    _mm512_loadu_si512(rows[2 * q + 1].add(at).cast()),
                )
            };
            let x = _mm512_unpacklo_epi8(r0, r1);
            let y = _mm512_unpackhi_epi8(r0, r1);
            // Per 128-bit lane L: samples 16L + [0..4], [4..8], [8..12], [12..16], each dword
            // (row 2q's byte, row 2q + 1's byte) as two i16.
            let v = [
                _mm512_unpacklo_epi8(x, zero),
                _mm512_unpackhi_epi8(x, zero),
                _mm512_unpacklo_epi8(y, zero),
                _mm512_unpackhi_epi8(y, zero),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_epi32(weights[q * ROWS + r]);
                for k in 0..4 {
                    acc[k] = _mm512_dpwssd_epi32(acc[k], v[k], w);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let s = acc.map(|a| _mm512_sra_epi32(a, shift));
            // In-lane packs put the samples back in order; packus clamps to 0..=255.
            let bytes = _mm512_packus_epi16(
                _mm512_packs_epi32(s[0], s[1]),
                _mm512_packs_epi32(s[2], s[3]),
            );
            // SAFETY: `at + 64 ≤ n`, the length of every output row (the caller's).
            unsafe { _mm512_storeu_si512(out[r].add(at).cast(), bytes) };
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
            if y + ROWS <= rows.end && fits(y + ROWS - 1) {
                let src_rows: [&[u8]; ROWS] = std::array::from_fn(|r| &src.data[(y + r) * in_row..]);
                let out: [&mut [u8]; ROWS] = std::array::from_fn(|_| outs.next().unwrap_or_default());
                // SAFETY: the caller's CPU check; the rows are long enough (`fits`).
                unsafe { h.rows::<ROWS>(src_rows, out) };
                y += ROWS;
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
    let blocks = blocks(v, rows.start, rows.end);
    // The ring of horizontal rows: row i in slot i % cap (the blocks' input rows only move
    // forward, so a slot is reused only when its row is behind every later block).
    let cap = blocks.iter().map(|b| 2 * b.pairs).max().unwrap_or(2) + ROWS;
    let stride = n.next_multiple_of(64);
    let mut ring = if h.is_some() {
        vec![0u8; cap * stride]
    } else {
        Vec::new()
    };
    let mut next = 0; // the next input row the horizontal pass makes
    let mut outs = dst.chunks_exact_mut(n);
    let mut y = rows.start;
    for b in &blocks {
        let count = ROWS.min(rows.end - y);
        let last = (b.lo + 2 * b.pairs).min(src.height); // one past the last real input row
        if let Some(h) = h {
            next = next.max(b.lo);
            while next < last {
                let fits = |y: usize| src.data.len() - y * in_row >= read_len;
                if next + ROWS <= last && fits(next + ROWS - 1) {
                    let src_rows: [&[u8]; ROWS] =
                        std::array::from_fn(|r| &src.data[(next + r) * in_row..]);
                    let slots: [usize; ROWS] = std::array::from_fn(|r| (next + r) % cap);
                    let out = ring_rows(&mut ring, stride, n, slots);
                    // SAFETY: the caller's CPU check; the rows are long enough (`fits`).
                    unsafe { h.rows::<ROWS>(src_rows, out) };
                    next += ROWS;
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
        let slices: Vec<&[u8]> = (b.lo..b.lo + 2 * b.pairs)
            .map(|i| {
                let i = i.min(src.height - 1);
                if h.is_some() {
                    &ring[(i % cap) * stride..][..n]
                } else {
                    &src.data[i * in_row..][..n]
                }
            })
            .collect();
        let mut out: Vec<&mut [u8]> = outs.by_ref().take(count).collect();
        if n >= STEP {
            let ptrs: Vec<*const u8> = slices.iter().map(|s| s.as_ptr()).collect();
            // SAFETY: the caller's CPU check; every row pointer starts `n ≥ STEP` readable bytes
            // (ring rows or image rows), every output pointer a distinct `n`-byte row of `dst`;
            // the weights are `pairs × ROWS` long.
            unsafe {
                if out.len() == ROWS {
                    let mut rows = out.iter_mut();
                    let o: [*mut u8; ROWS] = std::array::from_fn(|_| {
                        rows.next()
                            .map_or(std::ptr::null_mut(), |o| o.as_mut_ptr())
                    });
                    vertical::<ROWS>(&ptrs, &b.weights, v.precision, n, o);
                } else {
                    for (r, o) in out.into_iter().enumerate() {
                        let mut w = vec![0i32; b.pairs * ROWS];
                        for q in 0..b.pairs {
                            w[q * ROWS] = b.weights[q * ROWS + r];
                        }
                        vertical::<1>(&ptrs, &w, v.precision, n, [o.as_mut_ptr()]);
                    }
                }
            }
        } else {
            for (r, o) in out.into_iter().enumerate() {
                vertical_scalar(&slices, &b.weights, r, v.precision, o);
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
