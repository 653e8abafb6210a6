//! The two 8-bit convolution passes, one output row at a time, and the choice of kernel.
//!
//! Arithmetic (Pillow's `ImagingResample{Horizontal,Vertical}_8bpc`): per output sample,
//! `acc = 2²¹ + Σ pixel·weight` in `i32`, result `clamp(acc >> 22, 0, 255)` (arithmetic shift).
//! The true sum fits `i32` (|acc| ≤ 2²¹ + 255·Σ|weight|, and Σ|weight| stays near 2²²: about
//! 1.3·2²² for Lanczos; Pillow's own `clip8` table only covers `acc >> 22` in −640…639), so
//! wrapping `i32` operations, exact modulo 2³², give exactly Pillow's value in any order or
//! grouping. That is why the SIMD kernels, which group the terms differently, produce the same
//! bytes.
//!
//! Rows are interleaved `u8` samples (`channels` per pixel, 1, 3 or 4). A horizontal pass maps
//! one input row to one output row; a vertical pass combines several input rows (slices of at
//! least the output row's length) into one output row of the same width.

use super::coeffs::AxisCoeffs;
use super::scalar::{horizontal_row_scalar, vertical_row_scalar};

#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};

/// Which instruction set the passes use; every choice gives identical bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// Portable Rust (auto-vectorised where the compiler can).
    Scalar,
    /// x86-64 AVX2. The token can only be made by [`Isa::detect`], so holding this value
    /// proves the running CPU has AVX2.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2(Detected),
    /// x86-64 AVX2 and AVX-512 (F, BW, VL, VBMI, VNNI; `avx512::available`): the AVX-512
    /// passes, and the AVX2 horizontal pass for the axes the AVX-512 plan refuses. Made only by
    /// [`Isa::detect`], like [`Isa::Avx2`].
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512(Detected),
}

/// Proof that run-time detection found the instruction set (private constructor).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Detected(());

impl Isa {
    /// The best instruction set of the running CPU.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if avx2::available() && avx512::available() {
                return Isa::Avx512(Detected(()));
            }
            if avx2::available() {
                return Isa::Avx2(Detected(()));
            }
        }
        Isa::Scalar
    }
}

/// Rows the horizontal pass computes together (sharing coefficient loads).
pub(crate) const MAX_ROWS: usize = 4;

/// A horizontal pass: per-axis coefficients, the channel count and, for AVX2, a plan.
pub(crate) struct Horizontal {
    coeffs: AxisCoeffs,
    channels: usize,
    #[cfg(target_arch = "x86_64")]
    plan: Option<avx2::HorizontalPlan>,
    /// The AVX-512 plan, used instead of `plan` when the CPU and the axis allow it.
    #[cfg(target_arch = "x86_64")]
    plan512: std::sync::Arc<Option<avx512::HorizontalPlan>>,
}

impl Horizontal {
    pub(crate) fn new(coeffs: AxisCoeffs, channels: usize, isa: Isa) -> Horizontal {
        #[cfg(target_arch = "x86_64")]
        let plan512 = if matches!(isa, Isa::Avx512(_)) {
            avx512::kept_plan(&coeffs, channels)
        } else {
            std::sync::Arc::new(None)
        };
        #[cfg(target_arch = "x86_64")]
        let plan = (matches!(isa, Isa::Avx2(_) | Isa::Avx512(_)) && plan512.is_none())
            .then(|| avx2::HorizontalPlan::new(&coeffs, channels));
        #[cfg(not(target_arch = "x86_64"))]
        let _ = isa;
        Horizontal {
            coeffs,
            channels,
            #[cfg(target_arch = "x86_64")]
            plan,
            #[cfg(target_arch = "x86_64")]
            plan512,
        }
    }

    /// Output samples per row (`out_width × channels`).
    pub(crate) fn out_row_len(&self) -> usize {
        self.coeffs.out_len() * self.channels
    }

    /// The length an input row buffer needs so that every row is computed by the fastest
    /// kernel: `in_row_len` plus what the SIMD loads may read past the row's end.
    pub(crate) fn padded_len(&self, in_row_len: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        if let Some(plan) = self.plan512.as_ref() {
            return in_row_len.max(plan.read_len());
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(plan) = &self.plan {
            return in_row_len.max(plan.read_len());
        }
        in_row_len
    }

    /// Resamples up to [`MAX_ROWS`] rows at once (more in turns). Each `src[r]` starts at an
    /// input row and may extend past it (reads beyond the row never change the result: their
    /// weights are zero); each `out[r]` is exactly one output row.
    pub(crate) fn rows_dyn(&self, src: &[&[u8]], out: &mut [&mut [u8]]) {
        debug_assert_eq!(src.len(), out.len());
        match out {
            [] => {}
            [a] => self.rows([src[0]], [&mut **a]),
            [a, b] => self.rows([src[0], src[1]], [&mut **a, &mut **b]),
            [a, b, c] => {
                self.rows([src[0], src[1]], [&mut **a, &mut **b]);
                self.rows([src[2]], [&mut **c]);
            }
            [a, b, c, d, rest @ ..] => {
                self.rows(
                    [src[0], src[1], src[2], src[3]],
                    [&mut **a, &mut **b, &mut **c, &mut **d],
                );
                self.rows_dyn(&src[4..], rest);
            }
        }
    }

    /// Resamples `R` rows at once (each as in [`Horizontal::rows_dyn`]); the SIMD kernel shares
    /// its coefficient loads between them.
    fn rows<const R: usize>(&self, src: [&[u8]; R], out: [&mut [u8]; R]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(plan) = self.plan512.as_ref() {
            // SAFETY: an AVX-512 plan is only built from an `Isa::Avx512`, whose token only
            // `Isa::detect` makes, after `avx512::available` found the features it needs.
            unsafe { plan.rows(&self.coeffs, self.channels, src, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(plan) = &self.plan {
            // SAFETY: a plan is only built from an `Isa::Avx2` or `Isa::Avx512`, whose token only
            // `Isa::detect` makes, after finding AVX2 on the running CPU.
            unsafe { plan.rows(&self.coeffs, self.channels, src, out) };
            return;
        }
        for (s, o) in src.into_iter().zip(out) {
            debug_assert_eq!(o.len(), self.out_row_len());
            horizontal_row_scalar(&self.coeffs, self.channels, s, o);
        }
    }
}

/// One vertical output row: `out[i] = clip8(2²¹ + Σ_t rows[t][i] · weights[t])`; every row
/// holds at least `out.len()` bytes.
pub(crate) fn vertical_row(isa: Isa, rows: &[&[u8]], weights: &[i32], out: &mut [u8]) {
    debug_assert_eq!(rows.len(), weights.len());
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512(_) => {
            // SAFETY: only `Isa::detect` makes an `Isa::Avx512`, after `avx512::available`
            // found the AVX-512 features the kernel needs on this CPU.
            unsafe { avx512::vertical_row(rows, weights, out) };
            return;
        }
        Isa::Avx2(_) => {
            // SAFETY: only `Isa::detect` makes an `Isa::Avx2`, after finding AVX2 on this CPU.
            unsafe { avx2::vertical_row(rows, weights, out) };
            return;
        }
        Isa::Scalar => {}
    }
    let _ = isa;
    vertical_row_scalar(rows, weights, out);
}
