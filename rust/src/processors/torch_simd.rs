//! The torchvision backend's per-value normalisation `(f32(x) − m[c]) / s[c]` of `u8` pixels,
//! sixteen values at a time with AVX-512, for the two output layouts of the patch families:
//! channels-first patches of 8 to 16 pixels a side (Kimi-K2.5, [`Affine::write_patch_chw`])
//! and channels-last runs (Inkling2, [`Affine::write_interleaved`]).
//!
//! Every value goes through one fixed sequence of `f32` operations per lane, whatever its
//! position: either the literal subtraction and IEEE division (the scalar formula itself), or
//! — when it gives the same bits for all 3 × 256 inputs, checked once when built — the
//! subtraction, a multiplication by `1/s` and one fused residual correction
//! (`q + (d − q·s)/s` as `fma(fnmadd(q, s, d), 1/s, q)`), which avoids the slow division.
//! [`Affine::new`] compares the kernel with the caller's table on every input and keeps it
//! only when every bit agrees; otherwise (and without AVX-512) the table is used value by
//! value, so the outputs are the table's bits in every case.
//!
//! The stores are whole unmasked vectors (masked stores are slow on some CPUs, AMD Zen 4 among
//! them): a run shorter than a vector is written by a vector that overlaps the next run,
//! whose own store comes later and overwrites the overlap; only the very last store of a
//! patch, which has nothing after it, is masked.

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
/// reproduce bit for bit, and the AVX-512 kernel when it does.
pub struct Affine {
    table: [[f32; 256]; 3],
    #[cfg(target_arch = "x86_64")]
    kernel: Option<avx512::Kernel>,
}

impl Affine {
    /// `table[c][x]` must be the value wanted for input `x` of channel `c`; `m`, `s` the
    /// constants of the formula the kernel tries (`(x − m[c]) / s[c]` in `f32`). The kernel is
    /// used only if it reproduces `table` for every input.
    pub fn new(table: [[f32; 256]; 3], m: [f32; 3], s: [f32; 3]) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let kernel = avx512::Kernel::new(m, s, &table);
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
        if let Some(kernel) = &self.kernel {
            if n >= avx512::LANES {
                // SAFETY: the kernel exists only where the CPU has AVX-512 F/BW/VBMI
                // (`Kernel::new`); every run lies within `src` and `out` (asserted above) and
                // holds `n ≥ LANES` values; an `Out` is an `f32` slot taking any `f32` written
                // through a pointer cast.
                unsafe { kernel.interleaved(rows, src.as_ptr(), out.as_mut_ptr().cast::<f32>()) };
                return;
            }
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
        if let Some(kernel) = &self.kernel {
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

    /// The constants of the formula: per channel (`m`, `s`, `1/s`) and how a value is divided.
    pub struct Kernel {
        m: [f32; 3],
        s: [f32; 3],
        r: [f32; 3],
        /// `m`, `s`, `1/s` in the lanes of a vector starting at value `phase` of an interleaved
        /// run, by `phase` (0, 1, 2).
        lanes: [[[f32; LANES]; 3]; 3],
        /// `1/s` and a fused residual correction instead of the division.
        fused: bool,
    }

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

    /// Lane `j` of the vector starting at value `phase` of an interleaved run: channel
    /// `(phase + j) % 3`'s constant.
    fn pattern(values: [f32; 3], phase: usize) -> [f32; LANES] {
        std::array::from_fn(|j| values[(phase + j) % 3])
    }

    impl Kernel {
        /// The kernel, if the CPU has AVX-512 and one of the two methods reproduces `table`
        /// (the fused one preferred).
        pub fn new(m: [f32; 3], s: [f32; 3], table: &[[f32; 256]; 3]) -> Option<Self> {
            if !available() {
                return None;
            }
            let r = s.map(|s| 1.0 / s);
            let mut kernel = Kernel {
                m,
                s,
                r,
                lanes: std::array::from_fn(|phase| {
                    [pattern(m, phase), pattern(s, phase), pattern(r, phase)]
                }),
                fused: true,
            };
            // Every (channel, input) pair once, as an interleaved run.
            let all: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
            let want: Vec<u32> = (0..256)
                .flat_map(|v| [0, 1, 2].map(|c| table[c][v].to_bits()))
                .collect();
            for fused in [true, false] {
                kernel.fused = fused;
                let mut got = vec![0f32; all.len()];
                // SAFETY: `available()` holds; both buffers hold 768 ≥ LANES elements.
                unsafe { kernel.interleaved(Rows::one(all.len()), all.as_ptr(), got.as_mut_ptr()) };
                if got.iter().map(|v| v.to_bits()).eq(want.iter().copied()) {
                    // `patch_chw` evaluates each value with the same operations (`value`).
                    return Some(kernel);
                }
            }
            None
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
                // The formula is the table's (the division is IEEE's): wherever AVX-512 is
                // there, a kernel reproduces it.
                #[cfg(target_arch = "x86_64")]
                assert_eq!(
                    fast.vectorised(),
                    crate::simd::avx512_allowed()
                        && is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vbmi")
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
