//! Output sizes of transformers' generic `resize`, with Python's arithmetic.
//!
//! Python semantics kept literally: `/` of two ints is a correctly rounded `f64` division (exact
//! here, the operands being below 2⁵³), `int()` truncates toward zero, `round()` rounds half to
//! even, and every expression is evaluated in the order transformers writes it.

use super::ProcessorError;

/// transformers' `size` dict, by the keys `PilBackend.resize` looks at (in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeSpec {
    /// `{"shortest_edge": s, "longest_edge": l}`: `get_size_with_aspect_ratio`.
    ShortestLongest { shortest: usize, longest: usize },
    /// `{"shortest_edge": s}`: the short side becomes `s`, the long side `int(s * long / short)`.
    ShortestEdge(usize),
    /// `{"max_height": h, "max_width": w}`: `get_image_size_for_max_height_width`.
    MaxHeightWidth { height: usize, width: usize },
    /// `{"height": h, "width": w}`: exactly that size.
    Exact { height: usize, width: usize },
}

impl SizeSpec {
    /// The `(height, width)` an image of `(height, width)` is resized to.
    pub fn output(self, height: usize, width: usize) -> (usize, usize) {
        match self {
            SizeSpec::ShortestLongest { shortest, longest } => {
                size_with_aspect_ratio(height, width, shortest, Some(longest))
            }
            SizeSpec::ShortestEdge(s) => shortest_edge(height, width, s),
            SizeSpec::MaxHeightWidth {
                height: mh,
                width: mw,
            } => for_max_height_width(height, width, mh, mw),
            SizeSpec::Exact { height, width } => (height, width),
        }
    }

    /// Checks every value is positive (Python treats 0 as "not set").
    pub fn validate(self, field: &'static str) -> Result<(), ProcessorError> {
        let values: &[usize] = match &self {
            SizeSpec::ShortestLongest { shortest, longest } => &[*shortest, *longest],
            SizeSpec::ShortestEdge(s) => &[*s],
            SizeSpec::MaxHeightWidth { height, width } | SizeSpec::Exact { height, width } => {
                &[*height, *width]
            }
        };
        if values.iter().any(|&v| v == 0 || v > super::MAX_SIDE) {
            return Err(ProcessorError::config(
                field,
                format!("sizes between 1 and {}", super::MAX_SIDE),
                self,
            ));
        }
        Ok(())
    }
}

/// `int(x)` of a non-negative finite `f64` (values beyond `usize` saturate; checked later).
fn trunc(x: f64) -> usize {
    x as usize
}

/// `get_resize_output_image_size(image, size=s, default_to_square=False)`.
pub fn shortest_edge(height: usize, width: usize, s: usize) -> (usize, usize) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    // int(requested_new_short * long / short): an int product, then true division.
    let new_long = trunc((s as u64 * long as u64) as f64 / short as f64);
    if width <= height {
        (new_long, s)
    } else {
        (s, new_long)
    }
}

/// `get_size_with_aspect_ratio((height, width), size, max_size)`.
pub fn size_with_aspect_ratio(
    height: usize,
    width: usize,
    size: usize,
    max_size: Option<usize>,
) -> (usize, usize) {
    let mut size = size;
    let mut raw_size: Option<f64> = None;
    if let Some(max_size) = max_size {
        let min_original = height.min(width) as f64;
        let max_original = height.max(width) as f64;
        if max_original / min_original * size as f64 > max_size as f64 {
            let raw = max_size as f64 * min_original / max_original;
            raw_size = Some(raw);
            size = raw.round_ties_even() as usize;
        }
    }
    if (height <= width && height == size) || (width <= height && width == size) {
        (height, width)
    } else if width < height {
        let oh = match raw_size {
            Some(raw) => trunc(raw * height as f64 / width as f64),
            None => trunc((size as u64 * height as u64) as f64 / width as f64),
        };
        (oh, size)
    } else {
        let ow = match raw_size {
            Some(raw) => trunc(raw * width as f64 / height as f64),
            None => trunc((size as u64 * width as u64) as f64 / height as f64),
        };
        (size, ow)
    }
}

/// `get_image_size_for_max_height_width((height, width), max_height, max_width)`.
pub fn for_max_height_width(
    height: usize,
    width: usize,
    max_height: usize,
    max_width: usize,
) -> (usize, usize) {
    let height_scale = max_height as f64 / height as f64;
    let width_scale = max_width as f64 / width as f64;
    // Python's min(a, b) returns a unless b < a.
    let scale = if width_scale < height_scale {
        width_scale
    } else {
        height_scale
    };
    (trunc(height as f64 * scale), trunc(width as f64 * scale))
}

/// transformers' `center_crop` on channels-first data: the `(top, left)` of the crop window in
/// the image, negative when the crop is larger than the image (zero padding).
///
/// In range: `top = (H - ch) // 2`. Larger: the image is pasted into a zero canvas at
/// `ceil((ch - H) / 2)` (the extra row goes before the image), so `top = -ceil((ch - H) / 2)`.
pub fn center_crop_origin(
    height: usize,
    width: usize,
    crop_h: usize,
    crop_w: usize,
) -> (isize, isize) {
    fn axis(len: usize, crop: usize) -> isize {
        if crop <= len {
            ((len - crop) / 2) as isize
        } else {
            -((crop - len).div_ceil(2) as isize)
        }
    }
    (axis(height, crop_h), axis(width, crop_w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_edge_truncates() {
        // grace_hopper 600x512 (HxW), CLIP 224: long = int(224 * 600 / 512) = 262
        assert_eq!(shortest_edge(600, 512, 224), (262, 224));
        assert_eq!(shortest_edge(512, 600, 336), (336, 393));
        assert_eq!(shortest_edge(10, 10, 224), (224, 224));
        assert_eq!(shortest_edge(1, 3, 2), (2, 6));
    }

    #[test]
    fn aspect_ratio_sizes() {
        // Python: get_size_with_aspect_ratio((600, 512), 224, 300) == (262, 224)? 600/512*224 =
        // 262.5 <= 300 -> no cap -> (int(224*600/512), 224) = (262, 224)
        assert_eq!(size_with_aspect_ratio(600, 512, 224, Some(300)), (262, 224));
        // capped: raw = 250 * 512 / 1000 = 128.0 -> size 128 -> (250, 128)
        assert_eq!(
            size_with_aspect_ratio(1000, 512, 224, Some(250)),
            (250, 128)
        );
        // height == size shortcut
        assert_eq!(size_with_aspect_ratio(224, 500, 224, None), (224, 500));
    }

    #[test]
    fn max_height_width() {
        assert_eq!(for_max_height_width(100, 200, 50, 50), (25, 50));
        assert_eq!(for_max_height_width(100, 200, 200, 500), (200, 400));
    }

    #[test]
    fn crop_origin() {
        assert_eq!(center_crop_origin(262, 224, 224, 224), (19, 0));
        assert_eq!(center_crop_origin(5, 5, 8, 8), (-2, -2));
        assert_eq!(center_crop_origin(5, 6, 8, 8), (-2, -1));
        assert_eq!(center_crop_origin(10, 5, 8, 8), (1, -2));
    }
}
