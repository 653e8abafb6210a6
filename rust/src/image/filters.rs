//! The resampling filters of Pillow's `Resample.c`, evaluated in `f64` exactly as Pillow does.
//!
//! Every kernel reproduces Pillow's operation order and constant types, because the
//! coefficients are later rounded to 22-bit fixed point and a one-ulp difference can move a
//! weight by one unit: the Hamming window uses the `float` constants `0.54f` and `0.46f`
//! promoted to `double`, the cubic kernel is Keys' with `a = -0.5`, Lanczos is the 3-lobe
//! `sinc(x)·sinc(x/3)` on `[-3, 3)`. `sin` and `cos` are the platform's libm, as in Pillow.

use std::f64::consts::PI;
use std::fmt;

/// A resampling filter, with Pillow's integer ids (`Image.Resampling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `NEAREST` (0): Pillow does not convolve; it samples through an affine transform
    /// (see [`crate::image::resample`]).
    Nearest,
    /// `BOX` (4): support 0.5.
    Box,
    /// `BILINEAR` (2): triangle, support 1.
    Bilinear,
    /// `HAMMING` (5): Hamming-windowed sinc, support 1.
    Hamming,
    /// `BICUBIC` (3): Keys cubic with `a = -0.5`, support 2.
    Bicubic,
    /// `LANCZOS` (1): 3-lobe Lanczos, support 3.
    Lanczos,
}

impl Filter {
    /// Every filter, in Pillow id order.
    pub const ALL: [Filter; 6] = [
        Filter::Nearest,
        Filter::Lanczos,
        Filter::Bilinear,
        Filter::Bicubic,
        Filter::Box,
        Filter::Hamming,
    ];

    /// The filter of a Pillow `Image.Resampling` id (0 … 5).
    pub fn from_pil_id(id: i64) -> Option<Filter> {
        Some(match id {
            0 => Filter::Nearest,
            1 => Filter::Lanczos,
            2 => Filter::Bilinear,
            3 => Filter::Bicubic,
            4 => Filter::Box,
            5 => Filter::Hamming,
            _ => return None,
        })
    }

    /// Pillow's `Image.Resampling` id.
    pub fn pil_id(self) -> u8 {
        match self {
            Filter::Nearest => 0,
            Filter::Lanczos => 1,
            Filter::Bilinear => 2,
            Filter::Bicubic => 3,
            Filter::Box => 4,
            Filter::Hamming => 5,
        }
    }

    /// The filter of a lowercase name: `nearest`, `box`, `bilinear`, `hamming`, `bicubic`,
    /// `lanczos`.
    pub fn from_name(name: &str) -> Option<Filter> {
        Filter::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Nearest => "nearest",
            Filter::Box => "box",
            Filter::Bilinear => "bilinear",
            Filter::Hamming => "hamming",
            Filter::Bicubic => "bicubic",
            Filter::Lanczos => "lanczos",
        }
    }

    /// Half-width of the kernel in input pixels at scale 1 (`struct filter.support`); 0 for
    /// `Nearest`, which has no kernel.
    pub fn support(self) -> f64 {
        match self {
            Filter::Nearest => 0.0,
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The kernel value at `x` (in units of the possibly widened support).
    pub fn eval(self, x: f64) -> f64 {
        match self {
            Filter::Nearest => 0.0,
            Filter::Box => box_filter(x),
            Filter::Bilinear => bilinear_filter(x),
            Filter::Hamming => hamming_filter(x),
            Filter::Bicubic => bicubic_filter(x),
            Filter::Lanczos => lanczos_filter(x),
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn box_filter(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 {
        1.0
    } else {
        0.0
    }
}

fn bilinear_filter(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn hamming_filter(x: f64) -> f64 {
    let x = x.abs();
    if x == 0.0 {
        return 1.0;
    }
    if x >= 1.0 {
        return 0.0;
    }
    let x = x * PI;
    // Pillow writes `0.54f + 0.46f * cos(x)`: single-precision constants widened to double.
    let window = f64::from(0.54f32) + f64::from(0.46f32) * x.cos();
    x.sin() / x * window
}

fn bicubic_filter(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * PI;
    x.sin() / x
}

fn lanczos_filter(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for f in Filter::ALL {
            assert_eq!(Filter::from_pil_id(i64::from(f.pil_id())), Some(f));
            assert_eq!(Filter::from_name(f.name()), Some(f));
        }
        assert_eq!(Filter::from_pil_id(6), None);
        assert_eq!(Filter::from_pil_id(-1), None);
        assert_eq!(Filter::from_name("Bicubic"), None);
    }

    #[test]
    fn kernels_at_known_points() {
        assert_eq!(Filter::Box.eval(0.5), 1.0);
        assert_eq!(Filter::Box.eval(-0.5), 0.0);
        assert_eq!(Filter::Bilinear.eval(-0.25), 0.75);
        assert_eq!(Filter::Bilinear.eval(1.0), 0.0);
        assert_eq!(Filter::Bicubic.eval(0.0), 1.0);
        assert_eq!(Filter::Bicubic.eval(1.0), 0.0);
        assert_eq!(Filter::Bicubic.eval(2.0), 0.0);
        // Keys a = -0.5 at 0.5 and 1.5.
        assert_eq!(Filter::Bicubic.eval(0.5), 0.5625);
        assert_eq!(Filter::Bicubic.eval(-1.5), -0.0625);
        assert_eq!(Filter::Lanczos.eval(0.0), 1.0);
        assert_eq!(Filter::Lanczos.eval(3.0), 0.0);
        assert!(Filter::Lanczos.eval(-3.0).abs() < 1e-15);
        assert_eq!(Filter::Hamming.eval(0.0), 1.0);
        assert_eq!(Filter::Hamming.eval(1.0), 0.0);
        // The window uses float constants: 0.54f + 0.46f = 1.0000000149011612 at x -> 0.
        let w = Filter::Hamming.eval(1e-9);
        assert!(w > 1.0, "{w}");
    }
}
