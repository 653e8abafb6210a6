//! Moving finished values into an output tensor.
//!
//! Outputs are bytes at any address (a tensor inside a serialized message sits at whatever
//! offset the fields before it leave): values are stored with unaligned stores ([`Unaligned`]),
//! or computed into a small staging row (it stays in the L1 cache) and copied out by
//! [`copy_bytes`]. For outputs far larger than the caches that copy uses streaming stores
//! (`movntdq`, SSE2, part of every x86-64 CPU; 64-byte ones with AVX-512): they write whole
//! cache lines straight to memory instead of first reading each line into the cache, which
//! halves the memory traffic of writing a 100 MB `pixel_values`. Only whole lines are streamed.
//! Either way the stored values are the staged ones, bit for bit.
//!
//! Values stored straight from the registers in small pieces (the Qwen layout's 56-byte patch
//! rows) ask for the next piece's lines ahead ([`prefetch_for_write`]): each line then arrives
//! while the current piece is computed, instead of stalling the stores that miss it.

use std::mem::MaybeUninit;

use super::Out;
use crate::tensor::convert::f32_to_bf16;
use crate::tensor::dtype::WireDtype;

/// Outputs of at least this many bytes are written with streaming stores.
pub const STREAM_MIN_BYTES: usize = 8 << 20;

/// Written into a message or segment ([`Produce`](crate::tensor::wire::Produce)), a tensor of at
/// least this many bytes goes out with streaming stores, far below [`STREAM_MIN_BYTES`] (which
/// is for arrays the caller reads next): nobody here reads those bytes back, and in the whole
/// path (decode, resize, serialize, parse) storing them through the caches cost more than it
/// saved — each line read in before it is written, and the decoder's and resizer's buffers
/// evicted for the next image. Qwen2-VL's patches on real photos of 0.14–0.3 MP (3–7 MB of
/// `pixel_values`), one core, whole path: 4–13% faster than with cached stores
/// (`scripts/bench_engines.py`).
pub const PRODUCE_STREAM_MIN_BYTES: usize = 1 << 20;

/// A planned tensor written into an array the caller reads next (`Patches::write`, a pending
/// tensor's `values`) streams from this many bytes on, twice [`STREAM_MIN_BYTES`]: below this size
/// the output (a recycled buffer) stays in the last-level cache (32 MiB on the Zen 3 VM of the
/// benchmarks), and cached stores straight from the registers were 10-25 % faster per
/// MiniMax-M3-VL call on 8.8-10.4 MB of `pixel_values` than staged streaming.
pub const WRITE_STREAM_MIN_BYTES: usize = 16 << 20;

/// How a planned `float32` tensor's values are stored: as `float32`, or as `bfloat16` (rounded
/// from the same `float32` values to the nearest even, as a `float32` tensor converted on the
/// wire would be).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    F32,
    Bf16,
}

impl Element {
    /// The element of a wire dtype, if it is one of the two.
    pub fn of(dtype: WireDtype) -> Option<Self> {
        match dtype {
            WireDtype::Float32 => Some(Element::F32),
            WireDtype::Bfloat16 => Some(Element::Bf16),
            _ => None,
        }
    }

    /// Bytes a value.
    pub const fn size(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::Bf16 => 2,
        }
    }
}

/// The 16 values of `x` as `element`s' little-endian bytes, from the register's first byte (64
/// bytes of `float32`, or 32 of `bfloat16` rounded by [`bf16_vector`]).
///
/// # Safety
///
/// Callable only where AVX-512 F and BW are enabled, as for every `#[target_feature]` function.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub fn element_bytes(element: Element, x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    match element {
        Element::F32 => std::arch::x86_64::_mm512_castps_si512(x),
        Element::Bf16 => bf16_vector(x),
    }
}

/// [`element_bytes`] with `bfloat16` rounded by [`bf16_vector_cpu`]: the same bytes for every
/// value that is not subnormal.
///
/// # Safety
///
/// Callable only where AVX-512 F, BW and BF16 are enabled, as for every `#[target_feature]`
/// function.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub fn element_bytes_hw(
    element: Element,
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512i {
    match element {
        Element::F32 => std::arch::x86_64::_mm512_castps_si512(x),
        Element::Bf16 => bf16_vector_cpu(x),
    }
}

/// Whether the CPU rounds `float32` to `bfloat16` itself (AVX-512 BF16's `vcvtneps2bf16`, Zen 4
/// and Sapphire Rapids on; not Ice Lake), and AVX-512 is not turned off ([`crate::simd`]): the
/// kernels written with [`bf16_twins`] then run their twin.
#[cfg(target_arch = "x86_64")]
pub fn bf16_hardware() -> bool {
    crate::simd::avx512_allowed()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// Defines an AVX-512 kernel twice from one body: `$name` for AVX-512 F, BW, VBMI and FMA, and
/// `$twin` for the same plus AVX-512 BF16. In the body, `to_bytes(element, v)` gives a vector of
/// 16 `float32` values as `element`s' bytes: [`element_bytes`] in `$name` (`bfloat16` rounded
/// with integer operations), [`element_bytes_hw`] in `$twin` (with `vcvtneps2bf16`: 10–25 %
/// faster writers of `bfloat16` on the Zen 4 VM). Both give the same bytes for every value that
/// is not subnormal, so a caller runs `$twin` for `bfloat16` where [`bf16_hardware`] says the
/// CPU can and its values are never subnormal (`avx512::Wide::subnormal_free`).
#[cfg(target_arch = "x86_64")]
macro_rules! bf16_twins {
    (
        $(#[$attr:meta])*
        $vis:vis unsafe fn $name:ident / $twin:ident ($($arg:ident : $ty:ty),* $(,)?) $body:block
    ) => {
        $(#[$attr])*
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma")]
        $vis unsafe fn $name($($arg: $ty),*) {
            #[allow(unused_imports)]
            use $crate::processors::store::element_bytes as to_bytes;
            $body
        }
        $(#[$attr])*
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,fma,avx512bf16")]
        $vis unsafe fn $twin($($arg: $ty),*) {
            #[allow(unused_imports)]
            use $crate::processors::store::element_bytes_hw as to_bytes;
            $body
        }
    };
}
#[cfg(target_arch = "x86_64")]
pub(crate) use bf16_twins;

/// Whether an output of `len` `f32` values should be streamed.
pub fn should_stream(len: usize) -> bool {
    len.saturating_mul(4) >= STREAM_MIN_BYTES
}

/// The bytes of `values` (the same memory, viewed byte by byte).
pub fn bytes_of(values: &mut [Out]) -> &mut [MaybeUninit<u8>] {
    let len = std::mem::size_of_val(values);
    // SAFETY: the pointer and length cover exactly the memory of `values`, which the result
    // reborrows mutably; `MaybeUninit<u8>` has alignment 1 and accepts any (or no) byte value,
    // and whatever bytes are written make valid `MaybeUninit<f32>` values.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<MaybeUninit<u8>>(), len) }
}

/// An output value at any byte address: the four little-endian bytes of an `f32` (a tensor
/// inside a serialized message sits at whatever offset the fields before it leave).
#[repr(transparent)]
pub struct Unaligned([MaybeUninit<u8>; 4]);

impl Unaligned {
    #[inline]
    pub fn set(&mut self, value: f32) {
        self.0 = value.to_le_bytes().map(MaybeUninit::new);
    }

    /// Sets every value of `values` to `0.0`, whose bytes are all zero: one `memset` (a loop of
    /// [`set`](Self::set) stores four bytes at a time).
    pub fn zero(values: &mut [Unaligned]) {
        let len = std::mem::size_of_val(values);
        // SAFETY: `Unaligned` is 4 `MaybeUninit<u8>` (size 4, alignment 1), so the pointer and
        // length cover exactly the memory of `values`, reborrowed mutably; any bytes are valid.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<MaybeUninit<u8>>(), len)
        };
        bytes.fill(MaybeUninit::new(0));
    }
}

/// `bytes` (a whole number of values, at any address) as output values.
pub fn unaligned_of(bytes: &mut [MaybeUninit<u8>]) -> &mut [Unaligned] {
    assert_eq!(bytes.len() % 4, 0, "output bytes are not whole values");
    let len = bytes.len() / 4;
    // SAFETY: `Unaligned` is 4 `MaybeUninit<u8>` (size 4, alignment 1, any bytes valid), so
    // `len` of them cover exactly the memory of `bytes`, which the result reborrows mutably.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<Unaligned>(), len) }
}

/// Writes the little-endian bytes of `src` into `dst` (`4 · src.len()` bytes at any address),
/// with streaming stores when `stream` is set (call [`fence`] after the last streamed copy).
pub fn copy_bytes(dst: &mut [MaybeUninit<u8>], src: &[f32], stream: bool) {
    assert_eq!(
        dst.len(),
        4 * src.len(),
        "staging row and output bytes differ"
    );
    #[cfg(target_endian = "little")]
    {
        // SAFETY: `src` is `dst.len()` initialised bytes (asserted above), read as `u8`
        // (alignment 1); on a little-endian target an `f32`'s memory is its little-endian bytes.
        let bytes = unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), dst.len()) };
        copy_raw(dst, bytes, stream);
    }
    #[cfg(target_endian = "big")]
    {
        let _ = stream;
        for (d, s) in dst.chunks_exact_mut(4).zip(src) {
            for (d, b) in d.iter_mut().zip(s.to_le_bytes()) {
                d.write(b);
            }
        }
    }
}

/// Writes `bytes` into `dst` (the same length, at any address), with streaming stores when
/// `stream` is set (call [`fence`] after the last streamed copy).
pub fn copy_raw(dst: &mut [MaybeUninit<u8>], bytes: &[u8], stream: bool) {
    assert_eq!(
        dst.len(),
        bytes.len(),
        "staging row and output bytes differ"
    );
    #[cfg(target_arch = "x86_64")]
    if stream {
        stream_copy(dst, bytes);
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = stream;
    copy_plain(dst, bytes);
}

/// The little-endian `bfloat16` bytes of `src` into `dst` (`2 · src.len()` bytes), each
/// [`f32_to_bf16`] of the value (round to nearest even, as a wire tensor is converted):
/// sixteen at a time with AVX2.
pub fn bf16_row(src: &[f32], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len(), "bfloat16 row of another length");
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected; the lengths match (asserted above).
        done = unsafe { bf16_row_avx2(src, dst) };
    }
    for (d, v) in dst[2 * done..].chunks_exact_mut(2).zip(&src[done..]) {
        d.copy_from_slice(&f32_to_bf16(v.to_bits()).to_le_bytes());
    }
}

/// [`bf16_row`]'s whole groups of sixteen values; returns how many values it converted.
///
/// # Safety
///
/// The CPU must support AVX2; `dst.len() == 2 · src.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn bf16_row_avx2(src: &[f32], dst: &mut [u8]) -> usize {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_and_si256, _mm256_blendv_epi8, _mm256_cmpgt_epi32,
        _mm256_loadu_si256, _mm256_or_si256, _mm256_packus_epi32, _mm256_permute4x64_epi64,
        _mm256_set1_epi32, _mm256_srli_epi32, _mm256_storeu_si256,
    };
    // `f32_to_bf16` on eight lanes: the bits plus 0x7fff and the lowest kept bit, the upper
    // half; a NaN keeps its upper half with the quiet bit set. Each result fits 16 bits.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn round(x: __m256i) -> __m256i {
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, bias));
        let magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f80_0000));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
        _mm256_blendv_epi8(rounded, quiet, nan)
    }
    let groups = src.len() / 16;
    for g in 0..groups {
        // SAFETY: values `16 g .. 16 g + 16` lie within `src` and their 32 bytes at `32 g`
        // within `dst` (`2 · src.len()` bytes): unaligned loads and store.
        unsafe {
            let s = src.as_ptr().add(16 * g);
            let a = round(_mm256_loadu_si256(s.cast()));
            let b = round(_mm256_loadu_si256(s.add(8).cast()));
            // `packus` works per 128-bit lane (a0-3, b0-3, a4-7, b4-7): the 64-bit quarters
            // put back in order. The values fit 16 bits, so nothing saturates.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
            _mm256_storeu_si256(dst.as_mut_ptr().add(32 * g).cast(), packed);
        }
    }
    16 * groups
}

/// Copies `bytes` into `dst` (the same length), streaming its whole cache lines.
#[cfg(target_arch = "x86_64")]
fn stream_copy(dst: &mut [MaybeUninit<u8>], bytes: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let n = dst.len();
    assert_eq!(n, bytes.len(), "copy between slices of different lengths");
    // Whole 64-byte cache lines are streamed; the partial lines at both ends are stored
    // normally. A line must not be part streamed, part stored: the write-combining buffer would
    // then go to memory with a partial line, which costs far more than the stores it saves.
    let misalign = (dst.as_ptr() as usize) % LINE;
    let head = ((LINE - misalign) % LINE).min(n);
    let body = (n - head) / LINE * LINE;
    copy_plain(&mut dst[..head], &bytes[..head]);
    let (d_ptr, s_ptr) = (dst.as_mut_ptr(), bytes.as_ptr());
    if crate::simd::avx512_allowed() && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was just detected; `head..head + body` are whole 64-byte lines of
        // `dst` (aligned) and in bounds of both slices, as `stream_lines` requires.
        unsafe { stream_lines(d_ptr.add(head).cast(), s_ptr.add(head), body / LINE) };
        copy_plain(&mut dst[head + body..], &bytes[head + body..]);
        return;
    }
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX was just detected; `head..head + body` are whole 64-byte lines of `dst`
        // (aligned) and in bounds of both slices, as `stream_lines_avx` requires.
        unsafe { stream_lines_avx(d_ptr.add(head).cast(), s_ptr.add(head), body / LINE) };
        copy_plain(&mut dst[head + body..], &bytes[head + body..]);
        return;
    }
    for i in (head..head + body).step_by(16) {
        // SAFETY: `i + 16 <= head + body <= n`, so the 16 bytes read and the 16 written are in
        // bounds of `bytes` and `dst`; `dst + i` is 16-byte aligned (`head` bytes past a 64-byte
        // boundary, then steps of 16), as `_mm_stream_si128` requires; the load is unaligned;
        // SSE2 is part of the x86-64 baseline. Writing bytes initialises `MaybeUninit<u8>`.
        unsafe {
            let v = _mm_loadu_si128(s_ptr.add(i).cast::<__m128i>());
            _mm_stream_si128(d_ptr.add(i).cast::<__m128i>(), v);
        }
    }
    copy_plain(&mut dst[head + body..], &bytes[head + body..]);
}

/// Writes a run of vectors (up to 64 bytes each, appended one after another) into an output at
/// any address as whole 64-byte lines, each line stored with one streaming store straight from
/// the registers (AVX-512 VBMI): no staging row in between.
///
/// A staged row is stored into the L1 cache and read back by the copy that streams it, and its
/// stores wait in the store queue behind the streaming ones before it. Stored from the
/// registers, the values are computed while memory takes the lines. Qwen2-VL's patches of a
/// 0.87 MP photo (21 MB) on the AMD Zen 4 VM: 1.14–1.19 ms per call, against 1.25–2.05 ms
/// staged (0.96 ms in the one quiet hour of the host); see `docs/benchmarks.md`.
///
/// Only lines wholly inside the output are streamed. The partial lines at its two ends, which it
/// shares with whatever lies around it (another thread's rows, a message's other fields), are
/// written with masked stores of the output's own bytes only.
#[cfg(target_arch = "x86_64")]
pub struct LinePacker<'a> {
    dst: &'a mut [MaybeUninit<u8>],
    /// The bytes gathered for the current line: `fill` of them, from its first byte.
    acc: std::arch::x86_64::__m512i,
    fill: usize,
    /// Offset in `dst` of the current line's first byte: negative for a first line that starts
    /// before `dst` (at `dst`'s misalignment).
    line: isize,
    /// Bytes appended so far.
    pos: usize,
}

/// `vpermt2b` indices putting a vector's bytes after the `f` gathered ones:
/// `JOIN[f][k]` is `k` (the gathered byte) below `f`, else byte `k − f` of the vector (`64 +`).
#[cfg(target_arch = "x86_64")]
const JOIN: [[u8; 64]; 64] = {
    let mut t = [[0u8; 64]; 64];
    let mut f = 0;
    while f < 64 {
        let mut k = 0;
        while k < 64 {
            t[f][k] = if k < f { k as u8 } else { (64 + k - f) as u8 };
            k += 1;
        }
        f += 1;
    }
    t
};

/// The first `len` (< 64) bytes of `a` followed by the first `64 − len` of `b` (one
/// `vpermt2b`). [`LinePacker::append`] does the same inline, its two table rows loaded together:
/// written through this function, the Qwen float32 writer ran 10–20 % slower.
///
/// # Safety
///
/// Callable only where AVX-512 F, BW and VBMI are enabled, as for every `#[target_feature]`
/// function.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[inline]
pub fn join(
    a: std::arch::x86_64::__m512i,
    b: std::arch::x86_64::__m512i,
    len: usize,
) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: a 64-byte row of the table (`len & 63` < 64), read with an unaligned load.
    let indices = unsafe { _mm512_loadu_si512(JOIN[len & 63].as_ptr().cast()) };
    _mm512_permutex2var_epi8(a, indices, b)
}

/// `vpermb` indices taking a vector's bytes from `64 − f` on, the part past a line that `f`
/// gathered bytes and the vector completed: `REST[f][k]` is `k + 64 − f` (modulo 64: past the
/// vector's bytes the lanes are never used).
#[cfg(target_arch = "x86_64")]
const REST: [[u8; 64]; 64] = {
    let mut t = [[0u8; 64]; 64];
    let mut f = 0;
    while f < 64 {
        let mut k = 0;
        while k < 64 {
            t[f][k] = ((k + 64 - f) % 64) as u8;
            k += 1;
        }
        f += 1;
    }
    t
};

#[cfg(target_arch = "x86_64")]
impl<'a> LinePacker<'a> {
    /// Whether the CPU has what the packer uses (AVX-512 F, BW and VBMI; and AVX-512 not
    /// turned off, see [`crate::simd`]).
    pub fn available() -> bool {
        crate::simd::avx512_allowed()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi")
    }

    /// A packer writing `dst` from its first byte (its methods need what
    /// [`available`](Self::available) checks).
    pub fn new(dst: &'a mut [MaybeUninit<u8>]) -> Self {
        let misalign = dst.as_ptr() as usize % LINE;
        LinePacker {
            dst,
            // SAFETY: `__m512i` is 64 bytes of plain data (any bits are a valid value); making
            // one from bytes runs no instruction the CPU might lack.
            acc: unsafe { std::mem::transmute::<[u8; 64], std::arch::x86_64::__m512i>([0; 64]) },
            fill: misalign,
            line: -(misalign as isize),
            pos: 0,
        }
    }

    /// Appends the first `len` bytes of `v` (`len ≤ 64`) after the bytes appended before.
    ///
    /// Panics if they would run past the output.
    ///
    /// # Safety
    ///
    /// The CPU must have what [`available`](Self::available) checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    pub unsafe fn append(&mut self, v: std::arch::x86_64::__m512i, len: usize) {
        use std::arch::x86_64::*;
        assert!(
            len <= LINE && len <= self.dst.len() - self.pos,
            "{len} bytes appended past an output of {} ({} written)",
            self.dst.len(),
            self.pos
        );
        let f = self.fill;
        // SAFETY: the tables are 64-byte rows, read with unaligned loads (`f < 64`).
        let (join, rest) = unsafe {
            (
                _mm512_loadu_si512(JOIN[f].as_ptr().cast()),
                _mm512_loadu_si512(REST[f].as_ptr().cast()),
            )
        };
        let joined = _mm512_permutex2var_epi8(self.acc, join, v);
        if f + len >= LINE {
            // SAFETY: the CPU features are this function's contract.
            unsafe { self.store(joined, LINE) };
            self.acc = _mm512_permutexvar_epi8(rest, v);
            self.fill = f + len - LINE;
            self.line += LINE as isize;
        } else {
            self.acc = joined;
            self.fill = f + len;
        }
        self.pos += len;
    }

    /// Writes the last, partial line. Panics unless exactly the output's length was appended.
    /// Call [`fence`] afterwards, before the output is handed on.
    ///
    /// # Safety
    ///
    /// The CPU must have what [`available`](Self::available) checks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub unsafe fn finish(mut self) {
        assert_eq!(
            self.pos,
            self.dst.len(),
            "{} bytes written into an output of {}",
            self.pos,
            self.dst.len()
        );
        if self.fill > 0 {
            // SAFETY: the CPU features are this function's contract.
            unsafe { self.store(self.acc, self.fill) };
        }
    }

    /// Stores bytes `..upto` of the current line: one streaming store when the whole line lies
    /// in `dst`, else a masked store of the bytes that lie in `dst` only.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    #[inline]
    unsafe fn store(&mut self, line: std::arch::x86_64::__m512i, upto: usize) {
        use std::arch::x86_64::*;
        let len = self.dst.len() as isize;
        let base = self.dst.as_mut_ptr().cast::<u8>();
        if upto == LINE && self.line >= 0 && self.line + LINE as isize <= len {
            // SAFETY: bytes `line..line + 64` lie in `dst` (checked just above), which is
            // borrowed mutably; `dst + line` is 64-byte aligned (`line` starts at minus the
            // misalignment of `dst` and moves by whole lines), as the streaming store requires.
            unsafe { _mm512_stream_si512(base.offset(self.line).cast(), line) };
            return;
        }
        // Lanes `k` with `0 ≤ line + k < len` and `k < upto`.
        let from = (-self.line).clamp(0, LINE as isize) as u32;
        let to = (len - self.line).clamp(0, upto as isize) as u32;
        if to <= from {
            return;
        }
        let mask = (u64::MAX >> (64 - (to - from))) << from;
        // SAFETY: the masked store writes only the bytes of the lanes in `mask`, which lie in
        // `dst` (`0 ≤ line + k < len` for each), borrowed mutably; masked-off bytes are neither
        // written nor accessed (no fault either), so the line's address may start before `dst`
        // (`wrapping_offset` computes it without claiming it is in bounds).
        unsafe { _mm512_mask_storeu_epi8(base.wrapping_offset(self.line).cast(), mask, line) };
    }
}

/// The 16 `float32` values of `x` as little-endian `bfloat16` in the low 32 bytes of the
/// result (the rest zero): [`f32_to_bf16`] of each (round to nearest even; a NaN keeps its upper
/// half with the quiet bit set), sixteen at a time.
///
/// # Safety
///
/// Callable only where AVX-512 F and BW are enabled (a caller with those target features), as
/// for every `#[target_feature]` function.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub fn bf16_vector(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let x = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
    let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, bias));
    let magnitude = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
    let nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7f80_0000));
    let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
    let halves = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm512_zextsi256_si512(_mm512_cvtepi32_epi16(halves))
}

/// [`bf16_vector`] rounded by the CPU (`vcvtneps2bf16`): the same result for every input that
/// is not subnormal. The instruction rounds to nearest even and quiets NaNs as [`f32_to_bf16`]
/// does, but flushes subnormal inputs to zero; its callers run it only on values that are never
/// subnormal (a normaliser whose table holds none: `avx512::Wide::subnormal_free`).
///
/// # Safety
///
/// Callable only where AVX-512 F, BW and BF16 are enabled, as for every `#[target_feature]`
/// function.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
pub fn bf16_vector_cpu(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    // SAFETY: `__m256bh` and `__m256i` are both 32 bytes of plain data; any bits are a valid
    // value of either.
    let halves = unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)) };
    _mm512_zextsi256_si512(halves)
}

/// A cache line.
#[cfg(target_arch = "x86_64")]
const LINE: usize = 64;

/// Asks the CPU to bring the cache lines of the `len` bytes at `addr` into its L1 cache
/// (`prefetcht0`), ahead of writing them: a line read in while the values before it are
/// computed, and written while only this core holds it, costs the stores no wait. Only a hint:
/// nothing is read or written, and any address may be given (one past an output's end, say).
///
/// `prefetchw` would also take the line for writing, but Rust does not offer its target
/// feature; on a line no other core holds the difference is one state change in the cache.
#[inline]
pub fn prefetch_for_write(addr: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let first = addr as usize & !(LINE - 1);
        let end = (addr as usize).saturating_add(len);
        for line in (first..end).step_by(LINE) {
            // SAFETY: a prefetch never faults and changes no memory, whatever the address;
            // SSE is part of x86-64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    line as *const i8,
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (addr, len);
}

/// Streams `lines` whole cache lines from `src` (any alignment) to `dst` (64-byte aligned), one
/// 64-byte store each.
///
/// # Safety
///
/// The CPU must support AVX-512F; `src[..64·lines]` must be readable and `dst[..64·lines]`
/// writable, not overlapping.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines(dst: *mut u8, src: *const u8, lines: usize) {
    use std::arch::x86_64::{_mm512_loadu_si512, _mm512_stream_si512};
    for k in 0..lines {
        // SAFETY: line `k < lines` of both is in bounds by the contract; `dst + 64·k` is
        // 64-byte aligned as `_mm512_stream_si512` requires; the load is unaligned.
        unsafe {
            let v = _mm512_loadu_si512(src.add(LINE * k).cast());
            _mm512_stream_si512(dst.add(LINE * k).cast(), v);
        }
    }
}

/// Streams `lines` whole cache lines from `src` (any alignment) to `dst` (64-byte aligned), two
/// 32-byte stores each (half the store instructions of 16-byte ones: a streamed tensor is bound
/// by how fast the stores drain, and every store holds a store-queue entry until it does).
///
/// # Safety
///
/// The CPU must support AVX; `src[..64·lines]` must be readable and `dst[..64·lines]` writable,
/// not overlapping.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_lines_avx(dst: *mut u8, src: *const u8, lines: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    for k in 0..lines {
        // SAFETY: line `k < lines` of both is in bounds by the contract; `dst + 64·k` and
        // `dst + 64·k + 32` are 32-byte aligned as `_mm256_stream_si256` requires; the loads
        // are unaligned.
        unsafe {
            let (s, d) = (src.add(LINE * k), dst.add(LINE * k));
            let a = _mm256_loadu_si256(s.cast::<__m256i>());
            let b = _mm256_loadu_si256(s.add(32).cast::<__m256i>());
            _mm256_stream_si256(d.cast::<__m256i>(), a);
            _mm256_stream_si256(d.add(32).cast::<__m256i>(), b);
        }
    }
}

/// `dst.copy_from_slice(src)` into memory that may be uninitialised.
fn copy_plain(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    // SAFETY: both are `dst.len()` bytes (asserted), `dst` is exclusively borrowed so they do
    // not overlap, `u8` and `MaybeUninit<u8>` have alignment 1 and copying initialises `dst`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            src.as_ptr().cast::<MaybeUninit<u8>>(),
            dst.as_mut_ptr(),
            dst.len(),
        )
    }
}

/// Orders this thread's streaming stores before anything it does next (publishing the output to
/// other threads included).
pub fn fence(streamed: bool) {
    #[cfg(target_arch = "x86_64")]
    if streamed {
        // SAFETY: `sfence` has no operands and no preconditions (SSE, x86-64 baseline).
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = streamed;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Unaligned::zero` writes the bytes of `0.0` over every value it is given, at any address,
    /// and nothing around them.
    #[test]
    fn zero_writes_exactly_its_values() {
        for (offset, count) in [(0, 0), (1, 1), (3, 17), (2, 4099)] {
            let mut bytes = vec![MaybeUninit::new(0xAAu8); offset + 4 * count + 5];
            let values = unaligned_of(&mut bytes[offset..offset + 4 * count]);
            values.iter_mut().for_each(|v| v.set(-1.5));
            Unaligned::zero(values);
            // SAFETY: every byte was initialised above.
            let got: Vec<u8> = bytes.iter().map(|b| unsafe { b.assume_init() }).collect();
            assert!(got[..offset].iter().all(|&b| b == 0xAA));
            assert!(got[offset..offset + 4 * count].iter().all(|&b| b == 0));
            assert!(got[offset + 4 * count..].iter().all(|&b| b == 0xAA));
        }
    }

    #[test]
    fn bf16_rows_round_like_the_wire_conversion() {
        // Rounding boundaries (ties to even both ways), the largest finite values rounding to
        // Inf, Inf, NaNs (signalling and quiet, both signs), subnormals; lengths with and
        // without a whole group of sixteen, so both the AVX2 and the scalar code run.
        let mut bits: Vec<u32> = Vec::new();
        for hi in [
            0x0000u32, 0x0001, 0x3f80, 0x3f81, 0x7f7f, 0x7f80, 0x7fc0, 0xbf80, 0xff80,
        ] {
            for lo in [0x0000u32, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000] {
                bits.push(hi << 16 | lo);
            }
        }
        bits.extend([
            0x7f80_0001,
            0xff80_0001,
            0x7fa0_0000,
            0x0000_0001,
            0x8000_0000,
        ]);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        bits.extend((0..300).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        }));
        for len in [bits.len(), 16, 15, 33] {
            let src: Vec<f32> = bits[..len].iter().map(|&b| f32::from_bits(b)).collect();
            let mut dst = vec![0u8; 2 * len];
            bf16_row(&src, &mut dst);
            for (i, (&b, d)) in bits.iter().zip(dst.chunks_exact(2)).enumerate() {
                let got = u16::from_le_bytes([d[0], d[1]]);
                assert_eq!(got, f32_to_bf16(b), "value {i}: {b:#010x}");
            }
        }
    }

    #[test]
    fn byte_copies_at_every_alignment() {
        // Offsets through a whole cache line and lengths up to four lines: heads, streamed
        // lines and tails in every combination.
        let src: Vec<f32> = (0..67).map(|i| i as f32 * -0.75 + 0.1).collect();
        let want: Vec<u8> = src.iter().flat_map(|v| v.to_le_bytes()).collect();
        for stream in [false, true] {
            for offset in 0..68 {
                for len in [0, 1, 3, 4, 5, 15, 16, 17, 31, 33, 48, 67] {
                    let mut out = vec![MaybeUninit::new(0xAAu8); 4 * src.len() + 68];
                    copy_bytes(&mut out[offset..offset + 4 * len], &src[..len], stream);
                    fence(stream);
                    for (i, b) in out.iter().enumerate() {
                        // SAFETY: every byte was initialised (0xAA, then maybe copied over).
                        let b = unsafe { b.assume_init() };
                        if (offset..offset + 4 * len).contains(&i) {
                            assert_eq!(b, want[i - offset], "offset {offset}, len {len}");
                        } else {
                            assert_eq!(b, 0xAA, "byte {i} outside the copy was touched");
                        }
                    }
                }
            }
        }
        assert!(should_stream(2 << 20) && !should_stream(1 << 20));
    }

    #[test]
    fn byte_views_of_values() {
        let mut values = vec![Out::new(0.0); 3];
        assert_eq!(bytes_of(&mut values).len(), 12);
        let mut bytes = [MaybeUninit::new(0u8); 13];
        let slots = unaligned_of(&mut bytes[1..]);
        assert_eq!(slots.len(), 3);
        slots[2].set(-2.5);
        // SAFETY: every byte was initialised.
        let last: Vec<u8> = bytes[9..13]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        assert_eq!(last, (-2.5f32).to_le_bytes());
    }

    /// Bytes `0, 1, 2, …` (mod 251) of `len`, appended in pieces of 1 to 64 bytes, into an
    /// output at every misalignment: the output holds them in order, every byte around it is
    /// untouched, and whole lines went through the streaming path.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn line_packer_writes_the_bytes_appended_and_nothing_else() {
        use std::arch::x86_64::_mm512_loadu_si512;
        if !LinePacker::available() {
            eprintln!("skipped: no AVX-512 VBMI here");
            return;
        }
        let pattern = |k: usize| (k % 251) as u8;
        let mut seed = 7u32;
        for len in [0, 1, 5, 56, 63, 64, 65, 100, 128, 200, 1000, 4704] {
            for misalign in 0..64 {
                let mut buffer = vec![MaybeUninit::new(0xEEu8); len + 256];
                let base = buffer.as_ptr() as usize;
                let start = 64 + (misalign + 64 - base % 64) % 64;
                let (head, rest) = buffer.split_at_mut(start);
                let (out, _) = rest.split_at_mut(len);
                let _ = head;
                let mut packer = LinePacker::new(out);
                let mut pos = 0;
                while pos < len {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    let piece = (1 + (seed >> 16) as usize % 64).min(len - pos);
                    let bytes: Vec<u8> = (0..64).map(|k| pattern(pos + k)).collect();
                    // SAFETY: AVX-512 VBMI was detected above; `bytes` is 64 bytes.
                    unsafe {
                        packer.append(_mm512_loadu_si512(bytes.as_ptr().cast()), piece);
                    }
                    pos += piece;
                }
                // SAFETY: as above.
                unsafe { packer.finish() };
                fence(true);
                // SAFETY: every byte was initialised (0xEE, then maybe overwritten).
                let all: Vec<u8> = buffer.iter().map(|b| unsafe { b.assume_init() }).collect();
                assert!(
                    all[..start].iter().all(|&b| b == 0xEE),
                    "len {len}, misalignment {misalign}: a byte before the output was written"
                );
                assert!(
                    all[start + len..].iter().all(|&b| b == 0xEE),
                    "len {len}, misalignment {misalign}: a byte after the output was written"
                );
                let want: Vec<u8> = (0..len).map(pattern).collect();
                assert_eq!(
                    &all[start..start + len],
                    &want[..],
                    "len {len}, misalignment {misalign}"
                );
            }
        }
    }

    /// Appending past the output, or finishing short of it, panics (before any byte is
    /// written out of bounds).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn line_packer_refuses_to_run_past_or_stop_short() {
        use std::arch::x86_64::_mm512_setzero_si512;
        if !LinePacker::available() {
            eprintln!("skipped: no AVX-512 VBMI here");
            return;
        }
        let past = std::panic::catch_unwind(|| {
            let mut out = vec![MaybeUninit::new(0u8); 100];
            let mut packer = LinePacker::new(&mut out);
            // SAFETY: AVX-512 VBMI was detected above.
            unsafe {
                packer.append(_mm512_setzero_si512(), 64);
                packer.append(_mm512_setzero_si512(), 37);
            }
        });
        let message = past.expect_err("appended past the output");
        assert!(
            message
                .downcast_ref::<String>()
                .is_some_and(|m| m.contains("37 bytes appended past an output of 100 (64 written)")),
            "{message:?}"
        );
        let short = std::panic::catch_unwind(|| {
            let mut out = vec![MaybeUninit::new(0u8); 100];
            let mut packer = LinePacker::new(&mut out);
            // SAFETY: AVX-512 VBMI was detected above.
            unsafe {
                packer.append(_mm512_setzero_si512(), 64);
                packer.finish();
            }
        });
        assert!(short.is_err(), "finished 36 bytes short");
    }

    /// `bf16_vector` gives `f32_to_bf16` of every lane: ties both ways, the largest finite
    /// values, infinities, NaNs with payloads, subnormals, zeros of both signs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_vector_is_f32_to_bf16() {
        use std::arch::x86_64::{_mm512_loadu_ps, _mm512_storeu_si512};
        if !LinePacker::available() {
            eprintln!("skipped: no AVX-512 here");
            return;
        }
        let mut bits: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x3f80_8001,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0xffc1_2345,
            0x7fff_ffff,
            0x0000_0001,
            0x807f_ffff,
            0x3eaa_aaab,
        ];
        let mut seed = 1u64;
        while bits.len() < 16 * 4096 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            bits.push((seed >> 32) as u32);
        }
        for chunk in bits.chunks_exact(16) {
            let floats: Vec<f32> = chunk.iter().map(|&b| f32::from_bits(b)).collect();
            let mut out = [0u8; 64];
            // SAFETY: AVX-512 F/BW were detected above; 16 floats read, 64 bytes written.
            unsafe {
                let v = bf16_vector(_mm512_loadu_ps(floats.as_ptr()));
                _mm512_storeu_si512(out.as_mut_ptr().cast(), v);
            }
            for (k, &b) in chunk.iter().enumerate() {
                let got = u16::from_le_bytes([out[2 * k], out[2 * k + 1]]);
                assert_eq!(got, f32_to_bf16(b), "bits {b:#010x}");
            }
            assert!(out[32..].iter().all(|&b| b == 0), "upper half not zero");
        }
    }

    /// Where `bf16_vector_cpu` and `bf16_vector` differ on a lane that is not subnormal among
    /// the vectors of 16 consecutive bit patterns from each of `starts`: the first such vector's
    /// start.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn cpu_mismatch(starts: impl Iterator<Item = u32>) -> Option<u32> {
        use std::arch::x86_64::*;
        let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        for start in starts {
            let bits = _mm512_add_epi32(_mm512_set1_epi32(start as i32), lanes);
            let x = _mm512_castsi512_ps(bits);
            let exponent = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x7f80_0000));
            let mantissa = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x007f_ffff));
            let subnormal = mantissa & !exponent;
            // Halves of lanes: 16-bit lane `k` holds lane `k`'s bfloat16.
            let differ = _mm512_cmpneq_epi16_mask(bf16_vector_cpu(x), bf16_vector(x)) as u16;
            if differ & !subnormal != 0 {
                return Some(start);
            }
        }
        None
    }

    /// `bf16_vector_cpu` (the CPU's rounding) gives `bf16_vector`'s bytes for every input that
    /// is not subnormal: for every sign, exponent (zeros, infinities and NaNs included) and kept
    /// mantissa, the 16 patterns around the rounding tie and at both ends of the dropped bits
    /// (3.1 million patterns); every one of the 2³² patterns in
    /// `bf16_vector_cpu_is_bf16_vector_for_all_2_32_inputs` (ignored: 160 s unoptimised, under a
    /// second optimised). Subnormals are flushed, which is why the writers use it only on
    /// values that never are.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_vector_cpu_is_bf16_vector() {
        use std::arch::x86_64::*;
        if !bf16_hardware() {
            eprintln!("skipped: no AVX-512 BF16 here");
            return;
        }
        let starts = (0..1u32 << 16)
            .flat_map(|kept| [0x0000u32, 0x7ff8, 0xfff0].map(move |dropped| kept << 16 | dropped));
        // SAFETY: `bf16_hardware` found AVX-512 F, BW and BF16.
        let bad = unsafe { cpu_mismatch(starts) };
        assert_eq!(
            bad,
            None,
            "the vector from {:#010x} differs",
            bad.unwrap_or(0)
        );
        // A subnormal is flushed: the reason for `Wide::subnormal_free`.
        let tiny = f32::from_bits(0x0000_8001);
        let mut out = [0u8; 64];
        // SAFETY: the features were detected above; 64 bytes written.
        unsafe {
            _mm512_storeu_si512(
                out.as_mut_ptr().cast(),
                bf16_vector_cpu(_mm512_set1_ps(tiny)),
            )
        };
        assert_eq!(u16::from_le_bytes([out[0], out[1]]), 0);
        assert_ne!(f32_to_bf16(tiny.to_bits()), 0);
    }

    /// Every one of the 2³² bit patterns that is not subnormal (run with `--ignored`: 0.8 s in
    /// the `fast` profile).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore = "all 2^32 inputs: 160 s unoptimised"]
    fn bf16_vector_cpu_is_bf16_vector_for_all_2_32_inputs() {
        if !bf16_hardware() {
            eprintln!("skipped: no AVX-512 BF16 here");
            return;
        }
        // SAFETY: `bf16_hardware` found AVX-512 F, BW and BF16.
        let bad = unsafe { cpu_mismatch((0..1u32 << 28).map(|k| k << 4)) };
        assert_eq!(
            bad,
            None,
            "the vector from {:#010x} differs",
            bad.unwrap_or(0)
        );
    }
}
