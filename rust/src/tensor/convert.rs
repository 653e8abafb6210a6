//! Copying and converting tensor bytes: same-dtype copies, float32 → bfloat16 and float32 →
//! float16, both round-to-nearest-even with NaN and ±Inf preserved.
//!
//! Inputs and outputs are byte slices of little-endian values with no alignment requirement (a
//! numpy view or a `bytes` object may start anywhere). The element kernels are branch-free so
//! the compiler vectorises the loops. Inputs of at least [`PARALLEL_THRESHOLD`] bytes are split
//! into element-aligned chunks converted on scoped threads; every element is converted by the
//! same pure function wherever it lands, so the output never depends on the thread count.

use std::mem::MaybeUninit;
use std::sync::{Mutex, PoisonError};

use super::dtype::WireDtype;
use super::error::TensorError;

/// Inputs at least this large (bytes) are converted on several threads. A single core copies
/// ~10 GB/s while spawning a thread costs 50-250 µs on a busy VM, so below ~4 MiB one thread wins.
pub const PARALLEL_THRESHOLD: usize = 4 << 20;
/// No thread gets less than this much input (bytes): smaller chunks cost more to hand out than
/// they save.
const MIN_CHUNK_BYTES: usize = 512 << 10;
/// Memory bandwidth is saturated well before this many threads.
const MAX_THREADS: usize = 8;
/// Chunks per thread, so that a thread slowed down by other load does not hold up the rest.
const CHUNKS_PER_THREAD: usize = 4;

/// What happens to each element on the way from the source dtype to the wire dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Same dtype: the bytes are copied unchanged (`itemsize` bytes per element).
    Copy { itemsize: usize },
    /// float32 → bfloat16.
    F32ToBf16,
    /// float32 → float16.
    F32ToF16,
}

impl Conversion {
    /// The conversion from `from` to `to`, if offered.
    pub fn new(from: WireDtype, to: WireDtype) -> Result<Self, TensorError> {
        match (from, to) {
            _ if from == to => Ok(Conversion::Copy {
                itemsize: from.itemsize(),
            }),
            (WireDtype::Float32, WireDtype::Bfloat16) => Ok(Conversion::F32ToBf16),
            (WireDtype::Float32, WireDtype::Float16) => Ok(Conversion::F32ToF16),
            _ => Err(TensorError::UnsupportedConversion { from, to }),
        }
    }

    /// Bytes per source element.
    pub const fn src_itemsize(self) -> usize {
        match self {
            Conversion::Copy { itemsize } => itemsize,
            Conversion::F32ToBf16 | Conversion::F32ToF16 => 4,
        }
    }

    /// Bytes per output element.
    pub const fn dst_itemsize(self) -> usize {
        match self {
            Conversion::Copy { itemsize } => itemsize,
            Conversion::F32ToBf16 | Conversion::F32ToF16 => 2,
        }
    }

    /// Output bytes for `src_len` source bytes; `src_len` must be a whole number of elements
    /// (`arg` names the source in the error).
    pub fn output_len(self, src_len: usize, arg: &'static str) -> Result<usize, TensorError> {
        let (si, di) = (self.src_itemsize(), self.dst_itemsize());
        if si == 0 || !src_len.is_multiple_of(si) {
            return Err(TensorError::PartialItem {
                arg,
                len: src_len,
                itemsize: si,
            });
        }
        // di <= si, so this cannot overflow.
        Ok(src_len / si * di)
    }

    /// Converts `src` into `dst` on the calling thread with the best kernel this CPU runs.
    /// Writes `min(src.len() / src_itemsize, dst.len() / dst_itemsize)` elements; callers pass
    /// exactly matching lengths.
    fn run(self, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
        #[cfg(target_arch = "x86_64")]
        if matches!(self, Conversion::F32ToBf16 | Conversion::F32ToF16)
            && std::arch::is_x86_feature_detected!("avx2")
        {
            // SAFETY: `run_avx2` only requires the CPU to support AVX2, checked just above
            // (the detection result is cached by std after the first call).
            unsafe { self.run_avx2(src, dst) };
            return;
        }
        self.run_portable(src, dst);
    }

    /// [`Self::run`] compiled for the baseline target (SSE2 on x86-64).
    pub(crate) fn run_portable(self, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
        self.run_inline(src, dst);
    }

    /// [`Self::run`] compiled with AVX2 enabled: the same code, vectorised 8 lanes wide.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn run_avx2(self, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
        self.run_inline(src, dst);
    }

    /// The loops themselves, inlined into each target-specific wrapper above. They only ever
    /// store initialised bytes.
    #[inline(always)]
    fn run_inline(self, src: &[u8], dst: &mut [MaybeUninit<u8>]) {
        match self {
            Conversion::Copy { .. } => {
                let n = src.len().min(dst.len());
                // SAFETY: `n` bytes are in bounds of both slices; they cannot overlap, since
                // `dst` is an exclusive borrow and `src` a shared one.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n)
                };
            }
            Conversion::F32ToBf16 => {
                for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
                    let v = f32_to_bf16(u32::from_le_bytes([s[0], s[1], s[2], s[3]])).to_le_bytes();
                    d[0] = MaybeUninit::new(v[0]);
                    d[1] = MaybeUninit::new(v[1]);
                }
            }
            Conversion::F32ToF16 => {
                for (s, d) in src.chunks_exact(4).zip(dst.chunks_exact_mut(2)) {
                    let v = f32_to_f16(u32::from_le_bytes([s[0], s[1], s[2], s[3]])).to_le_bytes();
                    d[0] = MaybeUninit::new(v[0]);
                    d[1] = MaybeUninit::new(v[1]);
                }
            }
        }
    }
}

/// float32 bits → bfloat16 bits, round to nearest even.
///
/// ±Inf stays ±Inf, finite values that round past the largest bfloat16 become ±Inf (as IEEE
/// rounding does), NaN stays NaN: sign and upper payload kept, quiet bit forced so the
/// truncation can never turn a NaN into Inf.
#[inline(always)]
pub fn f32_to_bf16(bits: u32) -> u16 {
    // Bias 0x7fff plus the lowest kept bit: ties go to the even neighbour. Cannot overflow for
    // non-NaN input (the largest is 0xff80_0000 + 0x8000).
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

/// float32 bits → IEEE binary16 bits, round to nearest even, subnormals included.
///
/// Magnitudes that round past 65504 become ±Inf; NaN stays NaN with its sign and upper 10
/// payload bits and the quiet bit set (what x86 F16C and the `half` crate produce).
#[inline(always)]
pub fn f32_to_f16(bits: u32) -> u16 {
    /// 2^16 as f32 bits: at or above it every value rounds to Inf (65520 and up round there
    /// through the normal path too).
    const OVERFLOW: u32 = 143 << 23;
    /// 2^-14, the smallest normal float16.
    const MIN_NORMAL: u32 = 113 << 23;
    /// 0.5: adding it to a value below 2^-14 leaves the float16 subnormal mantissa in the low
    /// bits, rounded to nearest even by the FPU (its ulp is 2^-24, the float16 subnormal step).
    const DENORM_MAGIC: u32 = 126 << 23;
    /// Rebias the exponent (127 → 15, i.e. subtract 112 << 23) plus the rounding bias 0xfff.
    const REBIAS: u32 = 0u32.wrapping_sub(112 << 23).wrapping_add(0xfff);

    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7fff_ffff;
    let mant_odd = (abs >> 13) & 1;
    let normal = abs.wrapping_add(REBIAS).wrapping_add(mant_odd) >> 13;
    let subnormal = (f32::from_bits(abs) + f32::from_bits(DENORM_MAGIC))
        .to_bits()
        .wrapping_sub(DENORM_MAGIC);
    let inf_or_nan = if abs > 0x7f80_0000 {
        0x7e00 | ((abs >> 13) & 0x3ff)
    } else {
        0x7c00
    };
    let magnitude = if abs >= OVERFLOW {
        inf_or_nan
    } else if abs < MIN_NORMAL {
        subnormal
    } else {
        normal
    };
    (sign | magnitude) as u16
}

/// Threads worth using for `len` input bytes: 1 below [`PARALLEL_THRESHOLD`], else one per
/// `MIN_CHUNK_BYTES` (512 KiB) up to the available parallelism (at most `MAX_THREADS` = 8).
pub fn default_threads(len: usize) -> usize {
    if len < PARALLEL_THRESHOLD {
        return 1;
    }
    let available = crate::cores::count();
    available.min(MAX_THREADS).min(len / MIN_CHUNK_BYTES).max(1)
}

/// Converts `src` (dtype `from`) into `dst` (dtype `to`), in parallel when `src` is large.
/// `dst.len()` must be exactly the converted size.
pub fn convert_into(
    src: &[u8],
    from: WireDtype,
    dst: &mut [u8],
    to: WireDtype,
) -> Result<(), TensorError> {
    let conv = Conversion::new(from, to)?;
    conv.convert_uninit(src, as_uninit(dst), default_threads(src.len()))?;
    Ok(())
}

/// [`convert_into`] into memory that need not be initialised (a fresh output buffer): on
/// success every byte has been written and the same memory is returned as `&mut [u8]`.
pub fn convert_into_uninit<'a>(
    src: &[u8],
    from: WireDtype,
    dst: &'a mut [MaybeUninit<u8>],
    to: WireDtype,
) -> Result<&'a mut [u8], TensorError> {
    Conversion::new(from, to)?.convert_uninit(src, dst, default_threads(src.len()))
}

/// [`convert_into`] split into chunks for exactly `threads` threads (at least one); for tests
/// and benchmarks.
pub fn convert_into_threads(
    src: &[u8],
    from: WireDtype,
    dst: &mut [u8],
    to: WireDtype,
    threads: usize,
) -> Result<(), TensorError> {
    Conversion::new(from, to)?.convert_uninit(src, as_uninit(dst), threads)?;
    Ok(())
}

/// Converts `src` into a new vector.
pub fn convert_to_vec(src: &[u8], from: WireDtype, to: WireDtype) -> Result<Vec<u8>, TensorError> {
    let conv = Conversion::new(from, to)?;
    let len = conv.output_len(src.len(), "src")?;
    let mut out =
        crate::memory::fallible::zeros(len).map_err(TensorError::oom("converted tensor"))?;
    conv.convert_uninit(src, as_uninit(&mut out), default_threads(src.len()))?;
    Ok(out)
}

/// Views initialised bytes as possibly-uninitialised ones, for the writers below.
pub(crate) fn as_uninit(bytes: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    let (ptr, len) = (bytes.as_mut_ptr().cast::<MaybeUninit<u8>>(), bytes.len());
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the result reborrows `bytes`
    // exclusively for its lifetime. Writing uninitialised values through it would
    // de-initialise `bytes`; the only writers it is handed to (the kernels in this module and
    // `wire::Produce` implementations) store initialised bytes only.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}

impl Conversion {
    /// Converts `src` into `dst`, which must be exactly `output_len(src.len())` bytes, split for
    /// `threads` threads; returns `dst` as initialised bytes.
    pub(crate) fn convert_uninit<'a>(
        self,
        src: &[u8],
        dst: &'a mut [MaybeUninit<u8>],
        threads: usize,
    ) -> Result<&'a mut [u8], TensorError> {
        let expected = self.output_len(src.len(), "src")?;
        if dst.len() != expected {
            return Err(TensorError::DestinationSize {
                expected,
                actual: dst.len(),
            });
        }
        run_chunked(self, src, dst, threads);
        let (ptr, len) = (dst.as_mut_ptr().cast::<u8>(), dst.len());
        // SAFETY: `src` holds exactly `len / dst_itemsize` whole elements (checked by
        // `output_len` and the length test above), and `run_chunked` converts every one of
        // them into `dst`: its chunks partition both slices in step, and all of them are done
        // when it returns. So every byte of `dst` is initialised. `MaybeUninit<u8>` has the
        // layout of `u8`; the result reborrows `dst` exclusively for the same lifetime.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

/// Splits the work into element-aligned chunks handed out from a shared queue to `threads`
/// threads, the calling thread included. A thread that cannot be spawned is simply missing: the
/// others drain the queue, so this never fails and never panics. Either way every chunk is
/// converted before this returns.
fn run_chunked(conv: Conversion, src: &[u8], dst: &mut [MaybeUninit<u8>], threads: usize) {
    let (si, di) = (conv.src_itemsize(), conv.dst_itemsize());
    let elements = src.len() / si.max(1);
    if threads <= 1 || elements < 2 {
        conv.run(src, dst);
        return;
    }
    // A few chunks per thread balance the load when a core is busy with something else.
    let chunks = threads.saturating_mul(CHUNKS_PER_THREAD).min(elements);
    let per_chunk = elements.div_ceil(chunks);
    let queue = Mutex::new(
        src.chunks(per_chunk * si)
            .zip(dst.chunks_mut(per_chunk * di)),
    );
    let work = || loop {
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
        match next {
            Some((s, d)) => conv.run(s, d),
            None => break,
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // `spawn_scoped` reports failure instead of panicking; the queue still gets drained.
            if std::thread::Builder::new()
                .spawn_scoped(scope, work)
                .is_err()
            {
                break;
            }
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic xorshift for test data.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    /// Every upper half combined with the low halves where rounding decisions happen, plus
    /// random ones.
    fn boundary_patterns(lows: &[u32]) -> impl Iterator<Item = u32> + '_ {
        (0..=0xffffu32).flat_map(move |hi| lows.iter().map(move |lo| (hi << 16) | lo))
    }

    fn reference_bf16(bits: u32) -> u16 {
        half::bf16::from_f32(f32::from_bits(bits)).to_bits()
    }

    fn reference_f16(bits: u32) -> u16 {
        half::f16::from_f32(f32::from_bits(bits)).to_bits()
    }

    #[test]
    fn bf16_matches_reference_on_all_rounding_boundaries() {
        let mut next = rng(1);
        let mut lows = vec![0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000];
        lows.extend((0..8).map(|_| (next() & 0xffff) as u32));
        for bits in boundary_patterns(&lows) {
            assert_eq!(f32_to_bf16(bits), reference_bf16(bits), "{bits:#010x}");
        }
    }

    #[test]
    fn bf16_special_values() {
        let cases: [(f32, u16); 9] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3f80),
            (f32::INFINITY, 0x7f80),
            (f32::NEG_INFINITY, 0xff80),
            (f32::MAX, 0x7f80), // rounds past the largest bf16
            (f32::MIN, 0xff80),
            (f32::from_bits(0x3f80_8000), 0x3f80), // tie, even stays
            (f32::from_bits(0x3f81_8000), 0x3f82), // tie, odd rounds up
        ];
        for (value, expected) in cases {
            assert_eq!(f32_to_bf16(value.to_bits()), expected, "{value}");
        }
        // NaNs whose payload lives only in the low half would truncate to Inf without the
        // forced quiet bit.
        for nan in [
            0x7f80_0001u32,
            0xff80_0001,
            0x7fc0_0000,
            0x7fff_ffff,
            0xffbf_ffff,
        ] {
            let out = f32_to_bf16(nan);
            assert!(half::bf16::from_bits(out).is_nan(), "{nan:#x} -> {out:#x}");
            assert_eq!(
                out & 0x8000,
                ((nan >> 16) & 0x8000) as u16,
                "sign of {nan:#x}"
            );
            assert_eq!(out & 0x0040, 0x0040, "quiet bit of {nan:#x}");
        }
    }

    #[test]
    fn f16_matches_reference_on_all_rounding_boundaries() {
        let mut next = rng(2);
        let mut lows = vec![
            0, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000,
        ];
        lows.extend([0x8001, 0xffff, 0xe000, 0xf000]);
        lows.extend((0..6).map(|_| (next() & 0xffff) as u32));
        for bits in boundary_patterns(&lows) {
            assert_eq!(f32_to_f16(bits), reference_f16(bits), "{bits:#010x}");
        }
    }

    #[test]
    fn f16_matches_reference_around_every_float16_and_midpoint() {
        // For every float16 h: h itself, the midpoint to its successor (a tie), and the f32
        // values one ulp either side of both — every rounding decision, subnormals included.
        for h in 0..=0xffffu16 {
            let value = half::f16::from_bits(h);
            if !value.is_finite() {
                continue;
            }
            let here = f64::from(value.to_f32());
            let next = f64::from(half::f16::from_bits(h.wrapping_add(1)).to_f32());
            let mut candidates = vec![here as f32];
            if next.is_finite() && (h & 0x7fff) != 0x7bff {
                candidates.push(((here + next) / 2.0) as f32);
            } else if h & 0x7fff == 0x7bff {
                candidates.push(65520.0f32.copysign(here as f32)); // tie to Inf
            }
            for c in candidates {
                let b = c.to_bits();
                for bits in [b.wrapping_sub(1), b, b.wrapping_add(1)] {
                    assert_eq!(f32_to_f16(bits), reference_f16(bits), "{bits:#010x}");
                }
            }
        }
    }

    #[test]
    fn f16_special_values() {
        let cases: [(u32, u16); 10] = [
            (0x0000_0000, 0x0000),
            (0x8000_0000, 0x8000),
            (65504f32.to_bits(), 0x7bff),
            (65519.996f32.to_bits(), 0x7bff),
            (65520f32.to_bits(), 0x7c00), // tie between 65504 (odd) and Inf: Inf
            (f32::MAX.to_bits(), 0x7c00),
            (f32::NEG_INFINITY.to_bits(), 0xfc00),
            (5.960_464_5e-8f32.to_bits(), 0x0001), // 2^-24, smallest subnormal
            (2.980_232_2e-8f32.to_bits(), 0x0000), // 2^-25: tie, rounds to even 0
            (1e-30f32.to_bits(), 0x0000),
        ];
        for (bits, expected) in cases {
            assert_eq!(f32_to_f16(bits), expected, "{bits:#010x}");
        }
        for nan in [
            0x7f80_0001u32,
            0xff80_0001,
            0x7fc0_0000,
            0x7fff_ffff,
            0xffa0_0000,
        ] {
            let out = f32_to_f16(nan);
            assert!(half::f16::from_bits(out).is_nan(), "{nan:#x} -> {out:#x}");
            assert_eq!(
                out & 0x8000,
                ((nan >> 16) & 0x8000) as u16,
                "sign of {nan:#x}"
            );
            assert_eq!(out & 0x0200, 0x0200, "quiet bit of {nan:#x}");
        }
    }

    /// All 2^32 float32 bit patterns against the reference, for both conversions. Minutes in a
    /// debug build: run with `cargo test --release -- --ignored exhaustive`.
    #[test]
    #[ignore = "exhaustive; run in release with --ignored"]
    fn exhaustive_all_f32_bit_patterns() {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let span = (1u64 << 32).div_ceil(threads);
        std::thread::scope(|scope| {
            for t in 0..threads {
                scope.spawn(move || {
                    let end = ((t + 1) * span).min(1 << 32);
                    for bits in (t * span..end).map(|b| b as u32) {
                        assert_eq!(f32_to_bf16(bits), reference_bf16(bits), "{bits:#010x}");
                        assert_eq!(f32_to_f16(bits), reference_f16(bits), "{bits:#010x}");
                    }
                });
            }
        });
    }

    fn random_f32_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut next = rng(seed);
        let mut out: Vec<u8> = (0..n).flat_map(|_| (next() as u32).to_le_bytes()).collect();
        // Some specials among the random patterns.
        for (i, v) in [f32::NAN, f32::INFINITY, -0.0, 65520.0, 1e-7]
            .iter()
            .enumerate()
        {
            if let Some(slot) = out.get_mut(i * 4..i * 4 + 4) {
                slot.copy_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn kernels_apply_the_element_functions_to_unaligned_buffers() {
        let src = random_f32_bytes(1001, 3);
        for (to, f) in [
            (WireDtype::Bfloat16, f32_to_bf16 as fn(u32) -> u16),
            (WireDtype::Float16, f32_to_f16),
        ] {
            // Offset by one byte on both sides: no alignment assumed.
            let mut dst = vec![0u8; 2 * 1001 + 1];
            convert_into(&src[..], WireDtype::Float32, &mut dst[1..], to).unwrap();
            for (i, (s, d)) in src
                .chunks_exact(4)
                .zip(dst[1..].chunks_exact(2))
                .enumerate()
            {
                let want = f(u32::from_le_bytes([s[0], s[1], s[2], s[3]]));
                assert_eq!(u16::from_le_bytes([d[0], d[1]]), want, "element {i}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_portable_kernels_agree() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let src = random_f32_bytes(100_003, 4);
        for conv in [Conversion::F32ToBf16, Conversion::F32ToF16] {
            let mut a = vec![0u8; 200_006];
            let mut b = vec![0u8; 200_006];
            conv.run_portable(&src, as_uninit(&mut a));
            // SAFETY: AVX2 support was checked at the top of the test.
            unsafe { conv.run_avx2(&src, as_uninit(&mut b)) };
            assert!(a == b, "{conv:?}");
        }
    }

    #[test]
    fn output_does_not_depend_on_the_thread_count() {
        let n = (PARALLEL_THRESHOLD + 12) / 4 + 3;
        let src = random_f32_bytes(n, 5);
        for to in [WireDtype::Float32, WireDtype::Bfloat16, WireDtype::Float16] {
            let single = {
                let mut d = vec![0u8; n * to.itemsize()];
                convert_into_threads(&src, WireDtype::Float32, &mut d, to, 1).unwrap();
                d
            };
            for threads in [2, 3, 5, 8, 64] {
                let mut d = vec![0u8; n * to.itemsize()];
                convert_into_threads(&src, WireDtype::Float32, &mut d, to, threads).unwrap();
                assert!(d == single, "{to} on {threads} threads");
            }
            assert_eq!(
                convert_to_vec(&src, WireDtype::Float32, to).unwrap(),
                single
            );
        }
        // Tiny inputs with many threads.
        let mut d = [0u8; 2];
        convert_into_threads(
            &src[..4],
            WireDtype::Float32,
            &mut d,
            WireDtype::Bfloat16,
            8,
        )
        .unwrap();
        assert_eq!(
            u16::from_le_bytes(d),
            f32_to_bf16(u32::from_le_bytes(src[..4].try_into().unwrap()))
        );
        convert_into_threads(&[], WireDtype::Float32, &mut [], WireDtype::Bfloat16, 8).unwrap();
    }

    #[test]
    fn copies_are_byte_exact_for_every_dtype() {
        let src: Vec<u8> = (0..=255u8).cycle().take(8 * 1000).collect();
        for d in WireDtype::ALL {
            assert_eq!(convert_to_vec(&src, d, d).unwrap(), src, "{d}");
        }
    }

    #[test]
    fn unsupported_conversions_name_both_dtypes() {
        for from in WireDtype::ALL {
            for to in WireDtype::ALL {
                let offered = from == to
                    || (from == WireDtype::Float32
                        && matches!(to, WireDtype::Bfloat16 | WireDtype::Float16));
                let got = Conversion::new(from, to);
                if offered {
                    assert!(got.is_ok(), "{from} -> {to}");
                } else {
                    let err = got.unwrap_err();
                    assert_eq!(err, TensorError::UnsupportedConversion { from, to });
                    let msg = err.to_string();
                    assert!(
                        msg.contains(&format!("cannot convert {from} to {to}")),
                        "{msg}"
                    );
                }
            }
        }
    }

    #[test]
    fn partial_items_are_rejected() {
        let err = convert_to_vec(&[0u8; 7], WireDtype::Float32, WireDtype::Bfloat16).unwrap_err();
        assert_eq!(
            err,
            TensorError::PartialItem {
                arg: "src",
                len: 7,
                itemsize: 4
            }
        );
        assert_eq!(
            err.to_string(),
            "src: 7 bytes is not a whole number of 4-byte items"
        );
    }

    #[test]
    fn destination_size_must_be_exact() {
        let src = [0u8; 16];
        for (len, expected) in [(7, 8), (9, 8), (0, 8)] {
            let mut dst = vec![0u8; len];
            let err =
                convert_into(&src, WireDtype::Float32, &mut dst, WireDtype::Float16).unwrap_err();
            assert_eq!(
                err,
                TensorError::DestinationSize {
                    expected,
                    actual: len
                }
            );
        }
    }

    #[test]
    fn uninit_destinations_come_back_initialised() {
        let src = random_f32_bytes(PARALLEL_THRESHOLD / 4 + 5, 6);
        for to in [WireDtype::Float32, WireDtype::Bfloat16, WireDtype::Float16] {
            let expected = convert_to_vec(&src, WireDtype::Float32, to).unwrap();
            let mut buf = vec![MaybeUninit::<u8>::uninit(); expected.len()];
            let out = convert_into_uninit(&src, WireDtype::Float32, &mut buf, to).unwrap();
            assert!(*out == *expected, "{to}");
            let mut short = vec![MaybeUninit::<u8>::uninit(); expected.len() - 1];
            assert_eq!(
                convert_into_uninit(&src, WireDtype::Float32, &mut short, to).unwrap_err(),
                TensorError::DestinationSize {
                    expected: expected.len(),
                    actual: expected.len() - 1
                }
            );
        }
    }
}
