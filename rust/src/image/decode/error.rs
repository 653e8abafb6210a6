//! Every way decoding can fail: one variant per failure, each naming the format and the numbers.

use std::fmt;

use super::Format;

/// Why [`decode`](super::decode) rejected its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The bytes are not an image in a format this decoder recognises (or are empty).
    UnknownFormat {
        /// The first bytes of the input (at most 12), for the message.
        head: Vec<u8>,
        /// A format the bytes were recognised as but which is not decoded here (`"TIFF"`, …).
        recognised: Option<&'static str>,
    },
    /// A recognised format using a feature this decoder (like Pillow) does not handle.
    Unsupported {
        format: Format,
        /// What is unsupported, with its value.
        feature: String,
    },
    /// The data ends before the image is complete.
    Truncated {
        format: Format,
        /// Where it ended (which part was incomplete).
        detail: String,
    },
    /// The data is malformed (a bad header, bad compressed data, a libjpeg/libwebp error).
    Corrupt { format: Format, reason: String },
    /// The header declares a width or height of 0.
    ZeroSize {
        format: Format,
        width: u64,
        height: u64,
    },
    /// The header declares more pixels than the configured limit (checked before allocating).
    TooManyPixels {
        format: Format,
        width: u64,
        height: u64,
        limit: u64,
    },
    /// Allocating the pixel buffers failed.
    OutOfMemory { format: Format, bytes: u64 },
}

impl DecodeError {
    /// The kind names, in declaration order: one per variant (the Python classes mirror them).
    pub const KINDS: [&'static str; 7] = [
        "unknown_format",
        "unsupported",
        "truncated",
        "corrupt",
        "zero_size",
        "too_many_pixels",
        "out_of_memory",
    ];

    /// The stable name of this failure, one of [`DecodeError::KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownFormat { .. } => Self::KINDS[0],
            Self::Unsupported { .. } => Self::KINDS[1],
            Self::Truncated { .. } => Self::KINDS[2],
            Self::Corrupt { .. } => Self::KINDS[3],
            Self::ZeroSize { .. } => Self::KINDS[4],
            Self::TooManyPixels { .. } => Self::KINDS[5],
            Self::OutOfMemory { .. } => Self::KINDS[6],
        }
    }

    /// The image format, when it was recognised.
    pub fn format(&self) -> Option<Format> {
        match self {
            Self::UnknownFormat { .. } => None,
            Self::Unsupported { format, .. }
            | Self::Truncated { format, .. }
            | Self::Corrupt { format, .. }
            | Self::ZeroSize { format, .. }
            | Self::TooManyPixels { format, .. }
            | Self::OutOfMemory { format, .. } => Some(*format),
        }
    }

    pub(crate) fn corrupt(format: Format, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            format,
            reason: reason.into(),
        }
    }

    pub(crate) fn truncated(format: Format, detail: impl Into<String>) -> Self {
        Self::Truncated {
            format,
            detail: detail.into(),
        }
    }

    pub(crate) fn unsupported(format: Format, feature: impl Into<String>) -> Self {
        Self::Unsupported {
            format,
            feature: feature.into(),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownFormat {
                head,
                recognised: Some(name),
            } => write!(
                f,
                "cannot decode {name} images (supported: JPEG, PNG, GIF, BMP, WebP); \
                 the data starts with {}",
                hex(head)
            ),
            Self::UnknownFormat {
                head,
                recognised: None,
            } if head.is_empty() => write!(f, "cannot identify an image in 0 bytes of data"),
            Self::UnknownFormat {
                head,
                recognised: None,
            } => write!(
                f,
                "cannot identify the image format (supported: JPEG, PNG, GIF, BMP, WebP); \
                 the data starts with {}",
                hex(head)
            ),
            Self::Unsupported { format, feature } => {
                write!(f, "{format}: unsupported {feature}")
            }
            Self::Truncated { format, detail } => {
                write!(f, "{format}: image file is truncated ({detail})")
            }
            Self::Corrupt { format, reason } => write!(f, "{format}: corrupt image data: {reason}"),
            Self::ZeroSize {
                format,
                width,
                height,
            } => write!(f, "{format}: image has zero size ({width}x{height})"),
            Self::TooManyPixels {
                format,
                width,
                height,
                limit,
            } => write!(
                f,
                "{format}: image size ({width}x{height} = {} pixels) exceeds the limit of \
                 {limit} pixels, could be a decompression bomb",
                u128::from(*width) * u128::from(*height)
            ),
            Self::OutOfMemory { format, bytes } => {
                write!(f, "{format}: cannot allocate {bytes} bytes for the image")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}
