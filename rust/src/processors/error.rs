//! Every way preprocessing can fail: one variant per failure, each naming the numbers.

use std::fmt;

use crate::image::decode::DecodeError;
use crate::image::ResampleError;
use crate::memory::AllocError;

/// Why a configuration, an image or a batch was rejected.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessorError {
    /// `max(h, w) / min(h, w) > 200` (Qwen's `smart_resize`). The message is transformers'.
    AspectRatio {
        index: usize,
        height: usize,
        width: usize,
    },
    /// A configuration value out of range or inconsistent with the others.
    Config {
        field: &'static str,
        expected: String,
        actual: String,
    },
    /// An image (or video frame) whose shape cannot be processed: no pixels, a channel count other
    /// than 1, 3 or 4, a buffer of the wrong length, or sizes the configuration cannot patchify.
    ImageShape {
        index: usize,
        field: &'static str,
        expected: String,
        actual: String,
    },
    /// An input, intermediate or output beyond the size limits.
    TooLarge {
        what: &'static str,
        limit: u64,
        actual: u64,
    },
    /// The frames of one video differ in size.
    VideoShape {
        video: usize,
        frame: usize,
        expected: (usize, usize),
        actual: (usize, usize),
    },
    /// The items of a batch came out with different shapes where one stacked tensor is needed
    /// (e.g. no center crop and no fixed size, or LLaVA-NeXT tiles of uneven size).
    BatchShape {
        what: &'static str,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// An encoded image failed to decode.
    Decode { index: usize, error: DecodeError },
    /// The resampler refused a resize (only reachable through sizes the checks above let pass).
    Resample { index: usize, error: ResampleError },
    /// A buffer of `bytes` bytes (sized by the input, within the limits) could not be allocated.
    OutOfMemory { what: &'static str, bytes: u64 },
}

impl ProcessorError {
    /// The kind names, in declaration order: one per variant (the Python classes mirror them).
    pub const KINDS: [&'static str; 9] = [
        "aspect_ratio",
        "config",
        "image_shape",
        "too_large",
        "video_shape",
        "batch_shape",
        "decode",
        "resample",
        "out_of_memory",
    ];

    /// The stable name of this failure, one of [`ProcessorError::KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Self::AspectRatio { .. } => Self::KINDS[0],
            Self::Config { .. } => Self::KINDS[1],
            Self::ImageShape { .. } => Self::KINDS[2],
            Self::TooLarge { .. } => Self::KINDS[3],
            Self::VideoShape { .. } => Self::KINDS[4],
            Self::BatchShape { .. } => Self::KINDS[5],
            Self::Decode { .. } => Self::KINDS[6],
            Self::Resample { .. } => Self::KINDS[7],
            Self::OutOfMemory { .. } => Self::KINDS[8],
        }
    }

    /// The index of the image (or, for videos, of the frame counted over all videos) at fault.
    pub fn index(&self) -> Option<usize> {
        match self {
            Self::AspectRatio { index, .. }
            | Self::ImageShape { index, .. }
            | Self::Decode { index, .. }
            | Self::Resample { index, .. } => Some(*index),
            Self::VideoShape { video, .. } => Some(*video),
            _ => None,
        }
    }

    /// Attaches the image index to errors raised without one.
    pub(crate) fn at(self, at: usize) -> Self {
        match self {
            Self::ImageShape {
                field,
                expected,
                actual,
                ..
            } => Self::ImageShape {
                index: at,
                field,
                expected,
                actual,
            },
            Self::AspectRatio { height, width, .. } => Self::AspectRatio {
                index: at,
                height,
                width,
            },
            Self::Decode { error, .. } => Self::Decode { index: at, error },
            Self::Resample { error, .. } => Self::Resample { index: at, error },
            other => other,
        }
    }

    pub(crate) fn config(
        field: &'static str,
        expected: impl Into<String>,
        actual: impl fmt::Debug,
    ) -> Self {
        Self::Config {
            field,
            expected: expected.into(),
            actual: format!("{actual:?}"),
        }
    }

    pub(crate) fn shape(
        field: &'static str,
        expected: impl Into<String>,
        actual: impl Into<String>,
    ) -> Self {
        Self::ImageShape {
            index: 0,
            field,
            expected: expected.into(),
            actual: actual.into(),
        }
    }

    /// The error for a failed allocation of the buffer for `what` (for `map_err`).
    pub(crate) fn oom(what: &'static str) -> impl FnOnce(AllocError) -> Self {
        move |e| Self::OutOfMemory {
            what,
            bytes: e.bytes,
        }
    }

    /// The aspect ratio `smart_resize` rejects, as Python computes it (`max / min`).
    pub fn ratio(height: usize, width: usize) -> f64 {
        height.max(width) as f64 / height.min(width) as f64
    }
}

impl fmt::Display for ProcessorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // "image N: " and then transformers' own message, f"absolute aspect ratio must be
            // smaller than 200, got {ratio}"; Rust's `{:?}` of an f64 is Python's repr (shortest
            // round trip, `.0` on integral values).
            Self::AspectRatio {
                index,
                height,
                width,
            } => write!(
                f,
                "image {index}: absolute aspect ratio must be smaller than 200, got {:?}",
                Self::ratio(*height, *width)
            ),
            Self::Config {
                field,
                expected,
                actual,
            } => write!(f, "config {field}: expected {expected}, got {actual}"),
            Self::ImageShape {
                index,
                field,
                expected,
                actual,
            } => write!(
                f,
                "image {index}: {field}: expected {expected}, got {actual}"
            ),
            Self::TooLarge {
                what,
                limit,
                actual,
            } => write!(f, "{what} is too large: {actual} (at most {limit})"),
            Self::VideoShape {
                video,
                frame,
                expected,
                actual,
            } => write!(
                f,
                "video {video}: frame {frame} is {}x{} (HxW) but frame 0 is {}x{}; all frames of \
                 a video must have the same size",
                actual.0, actual.1, expected.0, expected.1
            ),
            Self::BatchShape {
                what,
                expected,
                actual,
            } => write!(
                f,
                "{what} have different shapes {expected:?} and {actual:?}; they cannot be stacked \
                 into one tensor"
            ),
            Self::Decode { index, error } => write!(f, "image {index}: {error}"),
            Self::Resample { index, error } => write!(f, "image {index}: resize: {error}"),
            Self::OutOfMemory { what, bytes } => write!(
                f,
                "out of memory: cannot allocate {bytes} bytes for the {what}"
            ),
        }
    }
}

impl std::error::Error for ProcessorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Decode { error, .. } => Some(error),
            Self::Resample { error, .. } => Some(error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aspect_ratio_message_is_transformers() {
        let err = ProcessorError::AspectRatio {
            index: 0,
            height: 1,
            width: 201,
        };
        assert_eq!(
            err.to_string(),
            "image 0: absolute aspect ratio must be smaller than 200, got 201.0"
        );
        let err = ProcessorError::AspectRatio {
            index: 4,
            height: 3,
            width: 604,
        };
        // Python: 604 / 3 = 201.33333333333334
        assert_eq!(
            err.to_string(),
            "image 4: absolute aspect ratio must be smaller than 200, got 201.33333333333334"
        );
    }

    #[test]
    fn kinds_match_variants() {
        let all = [
            ProcessorError::AspectRatio {
                index: 0,
                height: 1,
                width: 300,
            },
            ProcessorError::config("x", "y", 1),
            ProcessorError::shape("x", "y", "z"),
            ProcessorError::TooLarge {
                what: "x",
                limit: 1,
                actual: 2,
            },
            ProcessorError::VideoShape {
                video: 0,
                frame: 1,
                expected: (1, 1),
                actual: (2, 2),
            },
            ProcessorError::BatchShape {
                what: "x",
                expected: vec![],
                actual: vec![],
            },
            ProcessorError::Decode {
                index: 0,
                error: DecodeError::UnknownFormat {
                    head: vec![],
                    recognised: None,
                },
            },
            ProcessorError::Resample {
                index: 0,
                error: ResampleError::Channels { channels: 2 },
            },
            ProcessorError::oom("x")(AllocError { bytes: 3 }),
        ];
        let kinds: Vec<_> = all.iter().map(ProcessorError::kind).collect();
        assert_eq!(kinds, ProcessorError::KINDS);
        assert_eq!(all[2].clone().at(7).index(), Some(7));
        assert_eq!(
            all[8].to_string(),
            "out of memory: cannot allocate 3 bytes for the x"
        );
    }
}
