//! The torchvision backend's per-value normalisation `(f32(x) − m[c]) / s[c]` of `u8` pixels,
//! sixteen values at a time with AVX-512 or eight with AVX2 and FMA, for the two output layouts
//! of the patch families:
//! channels-first patches of 8 to 16 pixels a side (Kimi-K2.5, [`Affine::write_patch_chw`])
//! and channels-last runs (Inkling2, [`Affine::write_interleaved`]).
//!
//! Every value goes through one fixed sequence of `f32` operations per lane, whatever its
//! position: either the literal subtraction and IEEE division (the scalar formula itself), or
//! — when it gives the same bits for all 3 × 256 inputs, checked once when built — the
//! subtraction, a multiplication by `1/s` and one fused residual correction
//! (`q + (d − q·s)/s` as `fma(fnmadd(q, s, d), 1/s, q)`), which avoids the slow division.
//! [`Affine::new`] compares the kernel with the caller's table on every input and keeps it
//! only when every bit agrees; otherwise (and without AVX2 and FMA) the table is used value
//! by value, so the outputs are the table's bits in every case. AVX-512 is preferred when the
//! CPU has it and [`crate::simd::avx512_allowed`]; the AVX2 kernel evaluates each value with
//! the same sequence of operations, eight lanes wide.
//!
//! The stores are whole unmasked vectors (masked stores are slow on some CPUs, AMD Zen 4 among
//! them): a run shorter than a vector is written by a vector that overlaps the next run,
//! whose own store comes later and overwrites the overlap; only the very last store of a
//! patch, which has nothing after it, is masked. The AVX2 kernel writes each patch row of a
//! channel as two vectors of 8, the second ending at the row's end (the same vector twice when
//! the row is 8 long), so it never writes outside the row.

use super::Out;

/// Runs of `n` values, `rows` of them, the input runs `stride` bytes apart and the output runs
/// `out_stride` values apart.
#[derive(Clone, Copy, Debug)]
pub struct Rows {
    pub n: usize,
    pub rows: usize,
    pub stride: usize,
    pub out_stride: usize,
}

impl Rows {
    /// A single run of `n` values.
    pub fn one(n: usize) -> Self {
        Rows {
            n,
            rows: 1,
            stride: n,
            out_stride: n,
        }
    }
}

/// The per-channel constants `m`, `s` of `(x − m[c]) / s[c]` in `f32`, the table they must
/// reproduce bit for bit, and a vector kernel when it does.
pub struct Affine {
    table: [[f32; 256]; 3],
    #[cfg(target_arch = "x86_64")]
    kernel: Option<Kernel>,
}

/// The vector kernel in use: the widest the CPU has that reproduces the table.
#[cfg(target_arch = "x86_64")]
enum Kernel {
    Avx512(Box<avx512::Kernel>),
    Avx2(Box<avx2::Kernel>),
}

/// The constants of a vector kernel of `N` lanes: per channel `m`, `s`, `1/s`, the same in the
/// lanes of a vector starting at value `phase` of an interleaved run (lane `j` holds channel
/// `(phase + j) % 3`'s constant), and how a value is divided. Each kernel module adds its
/// methods to its own width (`avx512::Kernel` is `Constants<16>`, `avx2::Kernel` `Constants<8>`).
#[cfg(target_arch = "x86_64")]
struct Constants<const N: usize> {
    m: [f32; 3],
    s: [f32; 3],
    r: [f32; 3],
    /// `m`, `s`, `1/s` by `phase` (0, 1, 2).
    lanes: [[[f32; N]; 3]; 3],
    /// `1/s` and a fused residual correction instead of the division.
    fused: bool,
}

#[cfg(target_arch = "x86_64")]
impl<const N: usize> Constants<N> {
    /// The constants of `(x − m[c]) / s[c]` with the method (fused preferred) for which `run`
    /// (the kernel's interleaved run of `src` into `out`) gives `table`'s bits on every input;
    /// `None` when neither method does.
    fn reproducing(
        m: [f32; 3],
        s: [f32; 3],
        table: &[[f32; 256]; 3],
        mut run: impl FnMut(&Self, &[u8], &mut [f32]),
    ) -> Option<Self> {
        let r = s.map(|s| 1.0 / s);
        let pattern =
            |values: [f32; 3], phase: usize| std::array::from_fn(|j| values[(phase + j) % 3]);
        let mut kernel = Constants {
            m,
            s,
            r,
            lanes: std::array::from_fn(|phase| {
                [pattern(m, phase), pattern(s, phase), pattern(r, phase)]
            }),
            fused: true,
        };
        kernel.fused = reproducing_method(table, |fused, all, got| {
            kernel.fused = fused;
            run(&kernel, all, got);
        })?;
        Some(kernel)
    }
}

/// Which method of a vector kernel reproduces `table` bit for bit: `Some(true)` the fused one
/// (preferred), `Some(false)` the literal division, `None` neither. `run(fused, src, out)`
/// evaluates the interleaved run `src` (every (channel, input) pair once, 768 values) into
/// `out`, which has the same length.
#[cfg(target_arch = "x86_64")]
fn reproducing_method(
    table: &[[f32; 256]; 3],
    mut run: impl FnMut(bool, &[u8], &mut [f32]),
) -> Option<bool> {
    let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
    let want: Vec<u32> = (0..256)
        .flat_map(|v| [0, 1, 2].map(|c| table[c][v].to_bits()))
        .collect();
    [true, false].into_iter().find(|&fused| {
        let mut got = vec![0f32; all.len()];
        run(fused, &all, &mut got);
        got.iter().map(|v| v.to_bits()).eq(want.iter().copied())
    })
}

impl Affine {
    /// `table[c][x]` must be the value wanted for input `x` of channel `c`; `m`, `s` the
    /// constants of the formula the kernel tries (`(x − m[c]) / s[c]` in `f32`). The kernel is
    /// used only if it reproduces `table` for every input.
    pub fn new(table: [[f32; 256]; 3], m: [f32; 3], s: [f32; 3]) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let kernel = match avx512::Kernel::new(m, s, &table) {
                Some(k) => Some(Kernel::Avx512(Box::new(k))),
                None => avx2::Kernel::new(m, s, &table).map(|k| Kernel::Avx2(Box::new(k))),
            };
            Affine { table, kernel }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (m, s);
            Affine { table }
        }
    }

    /// The same values without SIMD (tests compare the two).
    #[cfg(test)]
    pub fn without_simd(mut self) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            self.kernel = None;
        }
        self
    }

    /// The same values with the AVX2 kernel, if the CPU has AVX2 and FMA and the kernel
    /// reproduces the table (tests compare it with the table on AVX-512 CPUs too).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub fn with_avx2(mut self, m: [f32; 3], s: [f32; 3]) -> Self {
        self.kernel = avx2::Kernel::new(m, s, &self.table).map(|k| Kernel::Avx2(Box::new(k)));
        self
    }

    /// Whether the vector kernel is in use.
    pub fn vectorised(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.kernel.is_some()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The value of input `x` in channel `c`.
    #[inline]
    pub fn value(&self, c: usize, x: u8) -> f32 {
        self.table[c][usize::from(x)]
    }

    /// Writes `src` (interleaved RGB, starting at a red byte) into `out` value for value:
    /// `out[i]` is the value of `src[i]` in channel `i % 3`. Panics if the lengths differ.
    pub fn write_interleaved(&self, src: &[u8], out: &mut [Out]) {
        assert_eq!(src.len(), out.len(), "run lengths");
        self.write_interleaved_rows(src, Rows::one(src.len()), out);
    }

    /// [`Affine::write_interleaved`] on `rows.rows` runs of `rows.n` values: run `y` from
    /// `src[y · stride..]` to `out[y · out_stride..]`. Panics if a run lies outside `src` or
    /// `out`.
    pub fn write_interleaved_rows(&self, src: &[u8], rows: Rows, out: &mut [Out]) {
        let Rows {
            n,
            rows: count,
            stride,
            out_stride,
        } = rows;
        if n == 0 || count == 0 {
            return;
        }
        let end = |step: usize| (count - 1).checked_mul(step)?.checked_add(n);
        assert!(
            end(stride).is_some_and(|e| e <= src.len())
                && end(out_stride).is_some_and(|e| e <= out.len()),
            "{rows:?} outside {} bytes or {} values",
            src.len(),
            out.len()
        );
        #[cfg(target_arch = "x86_64")]
        match &self.kernel {
            Some(Kernel::Avx512(kernel)) if n >= avx512::LANES => {
                // SAFETY: the kernel exists only where the CPU has AVX-512 F/BW/VBMI
                // (`Kernel::new`); every run lies within `src` and `out` (asserted above) and
                // holds `n ≥ LANES` values; an `Out` is an `f32` slot taking any `f32` written
                // through a pointer cast.
                unsafe { kernel.interleaved(rows, src.as_ptr(), out.as_mut_ptr().cast::<f32>()) };
                return;
            }
            Some(Kernel::Avx2(kernel)) if n >= avx2::LANES => {
                // SAFETY: as above, with AVX2 and FMA (`avx2::Kernel::new`) and
                // `n ≥ avx2::LANES`.
                unsafe { kernel.interleaved(rows, src.as_ptr(), out.as_mut_ptr().cast::<f32>()) };
                return;
            }
            _ => {}
        }
        for y in 0..count {
            let src = &src[y * stride..y * stride + n];
            let out = &mut out[y * out_stride..y * out_stride + n];
            for (i, (slot, &x)) in out.iter_mut().zip(src).enumerate() {
                *slot = Out::new(self.table[i % 3][usize::from(x)]);
            }
        }
    }

    /// Writes the `ps × ps` block of interleaved RGB pixels whose rows start at
    /// `pixels[y · stride]` channels-first into `out` (`3 × ps × ps` values, every one
    /// written). Panics if a row lies outside `pixels` or `out` has another length.
    pub fn write_patch_chw(&self, pixels: &[u8], stride: usize, ps: usize, out: &mut [Out]) {
        self.write_padded_patch_chw(pixels, stride, ps, (ps, ps), out);
    }

    /// [`Affine::write_patch_chw`] of a block of which only the top-left `rows × cols` pixels
    /// are read from `pixels`, the rest being `0` bytes (an image padded right and below with
    /// zeros, as the torchvision backend's `pad` fills): every value of `out` written. Panics
    /// if a row read lies outside `pixels`, `rows` or `cols` exceed `ps`, or `out` has another
    /// length. `pixels` is not read when `rows` or `cols` is 0.
    pub fn write_padded_patch_chw(
        &self,
        pixels: &[u8],
        stride: usize,
        ps: usize,
        (rows, cols): (usize, usize),
        out: &mut [Out],
    ) {
        assert_eq!(out.len(), 3 * ps * ps, "patch length");
        assert!(
            rows <= ps && cols <= ps,
            "{rows}x{cols} pixels of a {ps}-patch"
        );
        let (rows, cols) = if rows == 0 || cols == 0 {
            (0, 0)
        } else {
            (rows, cols)
        };
        if rows > 0 {
            assert!(
                (rows - 1)
                    .checked_mul(stride)
                    .and_then(|v| v.checked_add(3 * cols))
                    .is_some_and(|end| end <= pixels.len()),
                "{rows}x{cols} pixels of rows {stride} apart outside {} bytes",
                pixels.len()
            );
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(Kernel::Avx2(kernel)) = &self.kernel {
            if (avx2::LANES..=avx2::MAX_PATCH).contains(&ps) {
                // SAFETY: the kernel exists only where the CPU has AVX2 and FMA
                // (`avx2::Kernel::new`); `out` holds the `3·ps²` values (asserted above), `ps`
                // is within the kernel's range and `rows, cols ≤ ps`; `pixels` is read through
                // the slice.
                unsafe {
                    kernel.patch_chw(
                        pixels,
                        stride,
                        ps,
                        (rows, cols),
                        out.as_mut_ptr().cast::<f32>(),
                    )
                };
                return;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(Kernel::Avx512(kernel)) = &self.kernel {
            if (avx512::MIN_PATCH..=avx512::LANES).contains(&ps) {
                // SAFETY: as in `write_interleaved` for the CPU; rows `y < rows` of `3·cols`
                // bytes at `y · stride` lie within `pixels` (asserted above; none is read when
                // `rows` is 0), `rows, cols ≤ ps`, `out` holds the `3·ps²` values and `ps` is
                // within the kernel's range.
                unsafe {
                    kernel.patch_chw(
                        pixels.as_ptr(),
                        stride,
                        ps,
                        (rows, cols),
                        out.as_mut_ptr().cast::<f32>(),
                    )
                };
                return;
            }
        }
        let plane = ps * ps;
        for y in 0..ps {
            for x in 0..ps {
                for c in 0..3 {
                    let v = if y < rows && x < cols {
                        pixels[y * stride + 3 * x + c]
                    } else {
                        0
                    };
                    out[c * plane + y * ps + x] = Out::new(self.table[c][usize::from(v)]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Rows;
    use std::arch::x86_64::*;

    /// Values per vector.
    pub const LANES: usize = 16;
    /// The smallest patch side [`Kernel::patch_chw`] takes: with at least 8, every store but a
    /// patch's last ends inside the patch (`3·ps² − 2·ps + 16 ≤ 3·ps²`).
    pub const MIN_PATCH: usize = 8;

    fn available() -> bool {
        crate::simd::avx512_allowed()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    }

    /// The constants of the formula; the kernel's methods below.
    pub type Kernel = super::Constants<LANES>;

    /// `(v − m) / s` per lane: the division itself, or (`FUSED`) `q = d·r` corrected once.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn value<const FUSED: bool>(v: __m512, m: __m512, s: __m512, r: __m512) -> __m512 {
        let d = _mm512_sub_ps(v, m);
        if FUSED {
            let q = _mm512_mul_ps(d, r);
            _mm512_fmadd_ps(_mm512_fnmadd_ps(q, s, d), r, q)
        } else {
            _mm512_div_ps(d, s)
        }
    }

    /// The 16 bytes as `f32` values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn floats(bytes: __m128i) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes))
    }

    impl Kernel {
        /// The kernel, if the CPU has AVX-512 and one of the two methods reproduces `table`
        /// (the fused one preferred).
        pub fn new(m: [f32; 3], s: [f32; 3], table: &[[f32; 256]; 3]) -> Option<Self> {
            if !available() {
                return None;
            }
            // `patch_chw` evaluates each value with the same operations (`value`).
            Kernel::reproducing(m, s, table, |kernel, all, got| {
                // SAFETY: `available()` holds; `all` and `got` both hold 768 ≥ LANES elements.
                unsafe { kernel.interleaved(Rows::one(all.len()), all.as_ptr(), got.as_mut_ptr()) };
            })
        }

        /// For each row `y < rows.rows`: `out[y · out_stride + i] = f(src[y · stride + i])` in
        /// channel `i % 3`, for `i < rows.n`.
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F (checked by [`Kernel::new`]); `rows.n ≥ LANES`; for every
        /// row, `src[y · stride..][..n]` is readable and `out[y · out_stride..][..n]` writable
        /// and not accessed by anyone else during the call.
        pub unsafe fn interleaved(&self, rows: Rows, src: *const u8, out: *mut f32) {
            // SAFETY: forwarded.
            unsafe {
                if self.fused {
                    interleaved::<true>(self, rows, src, out);
                } else {
                    interleaved::<false>(self, rows, src, out);
                }
            }
        }

        /// A `ps × ps` patch channels-first: channel `c` of pixel `x` of row `y`
        /// (`src[y · stride + 3·x + c]` for `y < rows`, `x < cols` with `block = (rows, cols)`,
        /// a `0` byte elsewhere) to `out[c·ps² + y·ps + x]`.
        ///
        /// # Safety
        ///
        /// The CPU has AVX-512 F/BW/VBMI (checked by [`Kernel::new`]);
        /// `MIN_PATCH ≤ ps ≤ LANES`; `rows, cols ≤ ps`; `src[y · stride..][..3·cols]` is
        /// readable for every `y < rows`; `out[..3·ps²]` is writable and not accessed by
        /// anyone else during the call.
        pub unsafe fn patch_chw(
            &self,
            src: *const u8,
            stride: usize,
            ps: usize,
            block: (usize, usize),
            out: *mut f32,
        ) {
            // SAFETY: forwarded.
            unsafe {
                if self.fused {
                    patch_chw::<true>(self, src, stride, ps, block, out);
                } else {
                    patch_chw::<false>(self, src, stride, ps, block, out);
                }
            }
        }
    }

    /// [`Kernel::interleaved`] with the method fixed, row by row: groups of three vectors
    /// (48 values, the lane constants of phases 0, 1, 2 in turn), then single vectors, then a
    /// last one ending at `n` (overlapping the one before, whose values it writes again,
    /// unchanged) with the lane constants of its phase (`start % 3`).
    ///
    /// # Safety
    ///
    /// As [`Kernel::interleaved`].
    #[target_feature(enable = "avx512f")]
    unsafe fn interleaved<const FUSED: bool>(
        k: &Kernel,
        rows: Rows,
        src: *const u8,
        out: *mut f32,
    ) {
        let n = rows.n;
        debug_assert!(n >= LANES);
        // SAFETY: 16-value arrays read with unaligned loads.
        let load =
            |phase: usize, kind: usize| unsafe { _mm512_loadu_ps(k.lanes[phase][kind].as_ptr()) };
        let phases = [
            (load(0, 0), load(0, 1), load(0, 2)),
            (load(1, 0), load(1, 1), load(1, 2)),
            (load(2, 0), load(2, 1), load(2, 2)),
        ];
        let pick = |at: usize| match at % 3 {
            0 => phases[0],
            1 => phases[1],
            _ => phases[2],
        };
        for y in 0..rows.rows {
            // SAFETY: row `y`'s `n` bytes and `n` values lie within the buffers (the
            // contract); every vector below reads and writes at `start..start + LANES` with
            // `start + LANES ≤ n`, unaligned.
            unsafe {
                let (src, out) = (src.add(y * rows.stride), out.add(y * rows.out_stride));
                prefetch_next(src, n);
                let one = |start: usize, (m, s, r): (__m512, __m512, __m512)| {
                    let bytes = _mm_loadu_si128(src.add(start).cast());
                    _mm512_storeu_ps(out.add(start), value::<FUSED>(floats(bytes), m, s, r));
                };
                let mut at = 0;
                while at + 3 * LANES <= n {
                    one(at, phases[0]);
                    one(at + LANES, phases[1]);
                    one(at + 2 * LANES, phases[2]);
                    at += 3 * LANES;
                }
                while at + LANES <= n {
                    one(at, pick(at));
                    at += LANES;
                }
                if at < n {
                    let start = n - LANES;
                    one(start, pick(start));
                }
            }
        }
    }

    /// Asks for the `n` bytes after the run of `n` at `src` — the same row of the next patch
    /// of a caller walking patches left to right — early: the rows of a patch lie a whole image
    /// row apart, more streams than the hardware prefetcher follows, and a load that misses
    /// stalls the kernel while a store that misses does not. The addresses may lie past the
    /// image (`wrapping_add` claims nothing about them; a prefetch never faults).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn prefetch_next(src: *const u8, n: usize) {
        let next = src.wrapping_add(n);
        let mut off = 0;
        while off < n {
            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(off).cast::<i8>());
            off += 64;
        }
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(n - 1).cast::<i8>());
    }

    // `vpermb` controls gathering each channel of 16 interleaved RGB pixels into bytes 0–15.
    use crate::processors::normalize::avx512::CONTROLS;

    /// [`Kernel::patch_chw`] with the method fixed. Each row's pixels are loaded once (a
    /// masked load of its `3·ps` bytes); then plane by plane, row by row, a whole vector of 16
    /// values is stored at the row's start: its `16 − ps` values past the row fall on the start
    /// of the next row (or plane), which the next store overwrites. The last row of the last
    /// plane, with nothing after it, is stored masked.
    ///
    /// # Safety
    ///
    /// As [`Kernel::patch_chw`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    unsafe fn patch_chw<const FUSED: bool>(
        k: &Kernel,
        src: *const u8,
        stride: usize,
        ps: usize,
        (block_rows, cols): (usize, usize),
        out: *mut f32,
    ) {
        debug_assert!((MIN_PATCH..=LANES).contains(&ps) && block_rows <= ps && cols <= ps);
        let bytes_mask: u64 = (1u64 << (3 * cols)) - 1; // 3·cols ≤ 48 bits
        let last_mask: u16 = ((1u32 << ps) - 1) as u16;
        // Rows past `block_rows` stay 0 bytes, as do the bytes past `3·cols` of the others.
        let mut rows = [_mm512_setzero_si512(); LANES];
        for (y, row) in rows.iter_mut().enumerate().take(block_rows) {
            // The next patches' bytes of this row, asked for early (see `prefetch_next`).
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(y * stride + 3 * ps + 128).cast::<i8>());
            // SAFETY: the masked load touches only the `3·cols` bytes of row `y < rows`,
            // readable by the contract (masked-off bytes are never accessed).
            *row = unsafe { _mm512_maskz_loadu_epi8(bytes_mask, src.add(y * stride).cast()) };
        }
        let plane = ps * ps;
        for (c, control) in CONTROLS.iter().enumerate() {
            // SAFETY: a 64-byte array read with an unaligned load.
            let control = unsafe { _mm512_loadu_si512(control.as_ptr().cast()) };
            let (m, s, r) = (
                _mm512_set1_ps(k.m[c]),
                _mm512_set1_ps(k.s[c]),
                _mm512_set1_ps(k.r[c]),
            );
            for (y, &row) in rows.iter().enumerate().take(ps) {
                let bytes = _mm512_castsi512_si128(_mm512_permutexvar_epi8(control, row));
                let v = value::<FUSED>(floats(bytes), m, s, r);
                let at = c * plane + y * ps;
                // SAFETY: every store but the last covers `at..at + 16` with
                // `at ≤ 3·ps² − 2·ps` (`c ≤ 2`, and `y ≤ ps − 2` when `c = 2`), so it ends at
                // most at `3·ps² − 2·ps + 16 ≤ 3·ps²` (`ps ≥ 8`): inside `out`. The last one
                // writes only its `ps` values (masked), ending at `3·ps²`.
                unsafe {
                    if c == 2 && y == ps - 1 {
                        _mm512_mask_storeu_ps(out.add(at), last_mask, v);
                    } else {
                        _mm512_storeu_ps(out.add(at), v);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Rows;
    use crate::processors::normalize::avx2::{window_vectors, WIDEN};
    use std::arch::x86_64::*;

    /// Values per vector, and the smallest run or patch side the kernel takes.
    pub const LANES: usize = 8;
    /// The largest patch side [`Kernel::patch_chw`] takes: a row is at most two vectors.
    pub const MAX_PATCH: usize = 2 * LANES;
    /// The bytes of a patch row of `MAX_PATCH` pixels: the zeroed copy a partial row is read
    /// from.
    const WINDOW: usize = 3 * MAX_PATCH;

    /// The constants of the formula; the kernel's methods below.
    pub type Kernel = super::Constants<LANES>;

    /// `(v − m) / s` per lane, with the AVX-512 kernel's operations in the same order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn value<const FUSED: bool>(v: __m256, m: __m256, s: __m256, r: __m256) -> __m256 {
        let d = _mm256_sub_ps(v, m);
        if FUSED {
            let q = _mm256_mul_ps(d, r);
            _mm256_fmadd_ps(_mm256_fnmadd_ps(q, s, d), r, q)
        } else {
            _mm256_div_ps(d, s)
        }
    }

    /// The low 8 bytes as `f32` values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn floats(bytes: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes))
    }

    impl Kernel {
        /// The kernel, if the CPU has AVX2 and FMA and one of the two methods reproduces
        /// `table` (the fused one preferred).
        pub fn new(m: [f32; 3], s: [f32; 3], table: &[[f32; 256]; 3]) -> Option<Self> {
            if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
                return None;
            }
            // `patch_chw` evaluates each value with the same operations (`value`).
            Kernel::reproducing(m, s, table, |kernel, all, got| {
                // SAFETY: AVX2 and FMA checked above; `all` and `got` both hold 768 ≥ LANES
                // elements.
                unsafe { kernel.interleaved(Rows::one(all.len()), all.as_ptr(), got.as_mut_ptr()) };
            })
        }

        /// As the AVX-512 kernel's `interleaved`.
        ///
        /// # Safety
        ///
        /// The CPU has AVX2 and FMA (checked by [`Kernel::new`]); `rows.n ≥ LANES`; for every
        /// row, `src[y · stride..][..n]` is readable and `out[y · out_stride..][..n]` writable
        /// and not accessed by anyone else during the call.
        pub unsafe fn interleaved(&self, rows: Rows, src: *const u8, out: *mut f32) {
            // SAFETY: forwarded.
            unsafe {
                if self.fused {
                    interleaved::<true>(self, rows, src, out);
                } else {
                    interleaved::<false>(self, rows, src, out);
                }
            }
        }

        /// A `ps × ps` patch channels-first: channel `c` of pixel `x` of row `y`
        /// (`pixels[y · stride + 3·x + c]` for `y < rows`, `x < cols` with
        /// `block = (rows, cols)`, a `0` byte elsewhere) to `out[c·ps² + y·ps + x]`. Bytes
        /// outside `pixels` are never read (they count as 0).
        ///
        /// # Safety
        ///
        /// The CPU has AVX2 and FMA (checked by [`Kernel::new`]); `LANES ≤ ps ≤ MAX_PATCH`;
        /// `out[..3·ps²]` is writable and not accessed by anyone else during the call.
        pub unsafe fn patch_chw(
            &self,
            pixels: &[u8],
            stride: usize,
            ps: usize,
            block: (usize, usize),
            out: *mut f32,
        ) {
            // SAFETY: forwarded.
            unsafe {
                if self.fused {
                    patch_chw::<true>(self, pixels, stride, ps, block, out);
                } else {
                    patch_chw::<false>(self, pixels, stride, ps, block, out);
                }
            }
        }
    }

    /// [`Kernel::interleaved`] with the method fixed: vectors of 8 from the start of each run,
    /// the last one ending at `n` (overlapping the one before, whose values it writes again,
    /// unchanged), each with the lane constants of its phase (`start % 3`).
    ///
    /// # Safety
    ///
    /// As [`Kernel::interleaved`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn interleaved<const FUSED: bool>(
        k: &Kernel,
        rows: Rows,
        src: *const u8,
        out: *mut f32,
    ) {
        let n = rows.n;
        debug_assert!(n >= LANES);
        // SAFETY: 8-value arrays read with unaligned loads.
        let load =
            |phase: usize, kind: usize| unsafe { _mm256_loadu_ps(k.lanes[phase][kind].as_ptr()) };
        let phases = [0, 1, 2].map(|p| (load(p, 0), load(p, 1), load(p, 2)));
        for y in 0..rows.rows {
            let (src, out) = (
                src.wrapping_add(y * rows.stride),
                out.wrapping_add(y * rows.out_stride),
            );
            // The same row of the next patch, asked for early (a prefetch never faults, and
            // `wrapping_add` claims nothing about the address).
            _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(2 * n - 1).cast::<i8>());
            let mut next = 0;
            loop {
                let at = next.min(n - LANES);
                let (m, s, r) = phases[at % 3];
                // SAFETY: `at + LANES ≤ n`, so the 8 bytes read at `src + at` and the 8 values
                // written at `out + at` lie within row `y`'s run, in bounds by the contract;
                // unaligned loads and stores.
                unsafe {
                    let bytes = _mm_loadl_epi64(src.add(at).cast());
                    _mm256_storeu_ps(out.add(at), value::<FUSED>(floats(bytes), m, s, r));
                }
                if at + LANES >= n {
                    break;
                }
                next += LANES;
            }
        }
    }

    /// [`Kernel::patch_chw`] with the method fixed. Each row is read from its first `3·ps ≤ 48`
    /// bytes — in `pixels` when the row is whole and they lie inside it, else a zeroed copy of
    /// its `3·cols` bytes — as two vectors of two 16-byte lanes: bytes `0..16` and `8..24`
    /// (pixels `0..8`), and `b..b + 16` and `b + 8..b + 24` with `b = 3·(ps − 8)` (pixels
    /// `ps − 8..ps`, the same vector as the first when `ps` is 8: [`window_vectors`]). One
    /// `vpshufb` per channel and vector ([`WIDEN`]) picks that channel's eight pixels out of
    /// the interleaved bytes, already widened to `i32`; they are stored at the start of the
    /// row's output and at `ps − 8` from it.
    ///
    /// # Safety
    ///
    /// As [`Kernel::patch_chw`].
    #[target_feature(enable = "avx2,fma")]
    unsafe fn patch_chw<const FUSED: bool>(
        k: &Kernel,
        pixels: &[u8],
        stride: usize,
        ps: usize,
        (block_rows, cols): (usize, usize),
        out: *mut f32,
    ) {
        debug_assert!((LANES..=MAX_PATCH).contains(&ps) && block_rows <= ps && cols <= ps);
        if !(LANES..=MAX_PATCH).contains(&ps) {
            return;
        }
        // SAFETY: 32-byte arrays read with unaligned loads.
        let widen = WIDEN.map(|m| unsafe { _mm256_loadu_si256(m.as_ptr().cast()) });
        let consts: [(__m256, __m256, __m256); 3] = std::array::from_fn(|c| {
            (
                _mm256_set1_ps(k.m[c]),
                _mm256_set1_ps(k.s[c]),
                _mm256_set1_ps(k.r[c]),
            )
        });
        let plane = ps * ps;
        let len = 3 * ps;
        for y in 0..ps {
            let start = y.wrapping_mul(stride);
            let row = match pixels.get(start..) {
                Some(row) if y < block_rows => row,
                _ => &[],
            };
            let mut copy = [0u8; WINDOW];
            let window: &[u8] = match row.get(..len) {
                Some(window) if cols == ps => window,
                _ => {
                    for (to, &from) in copy.iter_mut().zip(row.iter().take(3 * cols)) {
                        *to = from;
                    }
                    &copy[..len]
                }
            };
            // SAFETY: `window` holds `3·ps` bytes and `LANES ≤ ps` (checked above).
            let (front, back) = unsafe { window_vectors(window.as_ptr(), ps) };
            for (c, (&mask, &(m, s, r))) in widen.iter().zip(&consts).enumerate() {
                let low = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(front, mask));
                let high = _mm256_cvtepi32_ps(_mm256_shuffle_epi8(back, mask));
                let low = value::<FUSED>(low, m, s, r);
                let high = value::<FUSED>(high, m, s, r);
                let at = c * plane + y * ps;
                // SAFETY: row `y < ps` of plane `c < 3` is `out[at..at + ps]`, inside the
                // `3·ps²` values of the contract; the stores cover `at..at + 8` and
                // `at + ps − 8..at + ps`, both inside it as `8 ≤ ps`; unaligned stores.
                unsafe {
                    _mm256_storeu_ps(out.add(at), low);
                    _mm256_storeu_ps(out.add(at + ps - LANES), high);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processors::torch_backend::fused_f32_table;

    fn affine(mean: [f64; 3], std: [f64; 3], factor: f64) -> Affine {
        let table = fused_f32_table(factor, mean, std);
        let inverse = (1.0 / factor) as f32;
        Affine::new(
            table,
            mean.map(|v| v as f32 * inverse),
            std.map(|v| v as f32 * inverse),
        )
    }

    /// As [`affine`], with the AVX2 kernel (where the CPU has AVX2 and FMA).
    #[cfg(target_arch = "x86_64")]
    fn affine_avx2(mean: [f64; 3], std: [f64; 3], factor: f64) -> Affine {
        let inverse = (1.0 / factor) as f32;
        affine(mean, std, factor).with_avx2(
            mean.map(|v| v as f32 * inverse),
            std.map(|v| v as f32 * inverse),
        )
    }

    #[cfg(target_arch = "x86_64")]
    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// The AVX2 kernel against the table on every patch side it takes (8 to 16), whole and
    /// padded blocks, odd strides, a last row ending exactly at the end of the buffer (its
    /// `3·ps` bytes read to the last one), and runs of 8 to 50 values, one or several rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_kernel_equals_the_table() {
        // Any 256 consecutive bytes are distinct (7919 is odd), so a value taken from the
        // wrong byte — a wrong `vpshufb` control, phase or offset — changes the output.
        let pixels: Vec<u8> = (0..37 * 53 * 3).map(|i| (i * 7919 % 256) as u8).collect();
        for (mean, std, factor) in [
            ([0.5; 3], [0.5; 3], 1.0 / 255.0),
            (
                [0.48145466, 0.4578275, 0.40821073],
                [0.26862954, 0.26130258, 0.27577711],
                1.0 / 255.0,
            ),
            ([127.5, 120.0, 100.25], [64.0, 58.5, 70.125], 1.0),
        ] {
            let fast = affine_avx2(mean, std, factor);
            let slow = affine(mean, std, factor).without_simd();
            assert_eq!(fast.vectorised(), has_avx2(), "{mean:?} {std:?} {factor}");
            for ps in 8..=16 {
                for stride in [3 * ps, 3 * ps + 1, 53 * 3 + 2] {
                    let blocks = [(ps, ps), (ps - 1, ps), (ps, ps - 3), (3, 1), (0, 0)];
                    for at in [0, 7, pixels.len() - ((ps - 1) * stride + 3 * ps)] {
                        for block in blocks {
                            let (mut a, mut b) = (
                                vec![Out::uninit(); 3 * ps * ps],
                                vec![Out::uninit(); 3 * ps * ps],
                            );
                            let src = &pixels[at..];
                            fast.write_padded_patch_chw(src, stride, ps, block, &mut a);
                            slow.write_padded_patch_chw(src, stride, ps, block, &mut b);
                            let what = format!("patch {ps} at {at} stride {stride} {block:?}");
                            assert_eq!(bits(&a), bits(&b), "{what}");
                        }
                    }
                }
            }
            for n in 8..=50 {
                for (count, stride, out_stride) in [(1, n, n), (3, n + 5, n + 3), (5, 3 * 53, n)] {
                    let rows = Rows {
                        n,
                        rows: count,
                        stride,
                        out_stride,
                    };
                    let len = (count - 1) * out_stride + n;
                    let (mut a, mut b) = (vec![Out::new(0.5); len], vec![Out::new(0.5); len]);
                    fast.write_interleaved_rows(&pixels[1..], rows, &mut a);
                    slow.write_interleaved_rows(&pixels[1..], rows, &mut b);
                    assert_eq!(bits(&a), bits(&b), "{rows:?}");
                }
            }
        }
    }

    /// A table the formula does not reproduce (one value off by one bit) keeps every vector
    /// kernel out, and the outputs are the table's.
    #[test]
    fn a_kernel_off_by_one_bit_is_not_used() {
        let (mean, std) = ([0.5; 3], [0.5; 3]);
        let mut table = fused_f32_table(1.0 / 255.0, mean, std);
        table[1][200] = f32::from_bits(table[1][200].to_bits() + 1);
        let m = mean.map(|v| v as f32 * 255.0);
        let s = std.map(|v| v as f32 * 255.0);
        let affine = Affine::new(table, m, s);
        assert!(!affine.vectorised());
        #[cfg(target_arch = "x86_64")]
        assert!(!Affine::new(table, m, s).with_avx2(m, s).vectorised());
        let src = [200u8; 48];
        let mut out = vec![Out::uninit(); 48];
        affine.write_interleaved(&src, &mut out);
        assert_eq!(bits(&out)[1], table[1][200].to_bits());
        // Without the off value, the same constants give a kernel (where the CPU has one).
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            Affine::new(fused_f32_table(1.0 / 255.0, mean, std), m, s)
                .with_avx2(m, s)
                .vectorised(),
            has_avx2()
        );
    }

    fn bits(out: &[Out]) -> Vec<u32> {
        // SAFETY: the tests read only outputs every value of which was written.
        out.iter()
            .map(|v| unsafe { v.assume_init() }.to_bits())
            .collect()
    }

    #[test]
    fn kernels_equal_the_table() {
        let pixels: Vec<u8> = (0..40 * 61 * 3).map(|i| (i * 7919 % 256) as u8).collect();
        for (mean, std) in [
            ([0.5; 3], [0.5; 3]),
            (
                [0.48145466, 0.4578275, 0.40821073],
                [0.26862954, 0.26130258, 0.27577711],
            ),
        ] {
            for factor in [1.0 / 255.0, 1.0 / 127.0] {
                let fast = affine(mean, std, factor);
                let slow = affine(mean, std, factor).without_simd();
                // The formula is the table's (the division is IEEE's): wherever AVX-512 or
                // AVX2 and FMA are there, a kernel reproduces it.
                #[cfg(target_arch = "x86_64")]
                assert_eq!(
                    fast.vectorised(),
                    (crate::simd::avx512_allowed()
                        && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vbmi"))
                        || has_avx2()
                );
                for n in [0, 1, 15, 16, 17, 47, 48, 120, 121, 3 * 61] {
                    let src = &pixels[..n];
                    let (mut a, mut b) = (vec![Out::uninit(); n], vec![Out::uninit(); n]);
                    fast.write_interleaved(src, &mut a);
                    slow.write_interleaved(src, &mut b);
                    assert_eq!(bits(&a), bits(&b), "run of {n}");
                    for (i, &x) in src.iter().enumerate() {
                        assert_eq!(bits(&a)[i], fast.value(i % 3, x).to_bits());
                    }
                }
                for n in [5, 16, 40, 120, 3 * 61] {
                    let rows = Rows {
                        n,
                        rows: 4,
                        stride: 61 * 3,
                        out_stride: n + 7,
                    };
                    let len = 3 * (n + 7) + n;
                    let (mut a, mut b) = (vec![Out::new(0.5); len], vec![Out::new(0.5); len]);
                    fast.write_interleaved_rows(&pixels[3..], rows, &mut a);
                    slow.write_interleaved_rows(&pixels[3..], rows, &mut b);
                    assert_eq!(bits(&a), bits(&b), "rows of {n}");
                    // The gaps between runs are left alone.
                    assert_eq!(bits(&a)[n..n + 7], [0.5f32.to_bits(); 7]);
                }
                for (ps, block) in [
                    (14, (14, 3)),
                    (14, (5, 14)),
                    (14, (1, 1)),
                    (14, (0, 9)),
                    (9, (8, 0)),
                    (16, (2, 16)),
                    (20, (3, 7)),
                ] {
                    let stride = 61 * 3;
                    let (mut a, mut b) = (
                        vec![Out::uninit(); 3 * ps * ps],
                        vec![Out::uninit(); 3 * ps * ps],
                    );
                    fast.write_padded_patch_chw(&pixels[5..], stride, ps, block, &mut a);
                    slow.write_padded_patch_chw(&pixels[5..], stride, ps, block, &mut b);
                    assert_eq!(bits(&a), bits(&b), "padded patch of {ps} {block:?}");
                    assert_eq!(bits(&a)[3 * ps * ps - 1], fast.value(2, 0).to_bits());
                }
                for ps in [1, 7, 8, 14, 16, 17, 40] {
                    let stride = 61 * 3;
                    let (mut a, mut b) = (
                        vec![Out::uninit(); 3 * ps * ps],
                        vec![Out::uninit(); 3 * ps * ps],
                    );
                    fast.write_patch_chw(&pixels[5..], stride, ps, &mut a);
                    slow.write_patch_chw(&pixels[5..], stride, ps, &mut b);
                    assert_eq!(bits(&a), bits(&b), "patch of {ps}");
                    let (c, y, x) = (2, ps - 1, ps - 1);
                    let want = fast.value(c, pixels[5 + y * stride + 3 * x + c]);
                    assert_eq!(bits(&a)[c * ps * ps + y * ps + x], want.to_bits());
                }
            }
        }
    }
}
