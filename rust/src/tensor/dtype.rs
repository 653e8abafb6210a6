//! The wire dtype vocabulary, item sizes, accepted numpy source dtypes, and byte lengths.

use std::fmt;

use super::error::TensorError;

/// A dtype name every engine's `TensorData.dtype` may carry. Bytes are always little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireDtype {
    Float32,
    /// The upper half of an IEEE float32.
    Bfloat16,
    Float16,
    Int64,
    Uint32,
    Uint8,
}

impl WireDtype {
    /// The whole vocabulary, in the order error messages list it.
    pub const ALL: [WireDtype; 6] = [
        WireDtype::Float32,
        WireDtype::Bfloat16,
        WireDtype::Float16,
        WireDtype::Int64,
        WireDtype::Uint32,
        WireDtype::Uint8,
    ];

    /// The wire name (lowercase, as in `TensorData.dtype`).
    pub const fn name(self) -> &'static str {
        match self {
            WireDtype::Float32 => "float32",
            WireDtype::Bfloat16 => "bfloat16",
            WireDtype::Float16 => "float16",
            WireDtype::Int64 => "int64",
            WireDtype::Uint32 => "uint32",
            WireDtype::Uint8 => "uint8",
        }
    }

    /// Bytes per element.
    pub const fn itemsize(self) -> usize {
        match self {
            WireDtype::Float32 | WireDtype::Uint32 => 4,
            WireDtype::Bfloat16 | WireDtype::Float16 => 2,
            WireDtype::Int64 => 8,
            WireDtype::Uint8 => 1,
        }
    }

    /// Parses a wire name (exact, lowercase); `arg` names the argument in the error.
    pub fn from_name(name: &str, arg: &'static str) -> Result<Self, TensorError> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| TensorError::UnknownDtype {
                arg,
                name: name.to_owned(),
            })
    }

    /// The wire dtype whose bytes a numpy array of dtype `numpy` (its `dtype.str`) holds.
    ///
    /// Only little-endian storage is accepted; bfloat16 arrives as raw `<u2` bits. `arg` names
    /// the argument in the error.
    pub fn from_numpy_str(numpy: &str, arg: &'static str) -> Result<Self, TensorError> {
        match numpy {
            "<f4" => Ok(WireDtype::Float32),
            "<u2" => Ok(WireDtype::Bfloat16),
            "<f2" => Ok(WireDtype::Float16),
            "<i8" => Ok(WireDtype::Int64),
            "<u4" => Ok(WireDtype::Uint32),
            "|u1" => Ok(WireDtype::Uint8),
            _ => Err(TensorError::UnsupportedSourceDtype {
                arg,
                numpy: numpy.to_owned(),
            }),
        }
    }

    /// `'float32', 'bfloat16', …` for error messages.
    pub fn vocabulary() -> String {
        Self::ALL
            .iter()
            .map(|d| format!("'{}'", d.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for WireDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes of a C-contiguous tensor of `shape` and `dtype`: `product(shape) × itemsize`, with every
/// multiplication checked. An empty shape is a scalar (one element).
pub fn byte_len(shape: &[u64], dtype: WireDtype) -> Result<usize, TensorError> {
    let overflow = || TensorError::ShapeOverflow {
        shape: shape.to_vec(),
        itemsize: dtype.itemsize(),
    };
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &dim| acc.checked_mul(dim))
        .ok_or_else(overflow)?;
    usize::try_from(elements)
        .ok()
        .and_then(|n| n.checked_mul(dtype.itemsize()))
        .ok_or_else(overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_and_itemsizes() {
        let table: Vec<(&str, usize)> = WireDtype::ALL
            .iter()
            .map(|d| (d.name(), d.itemsize()))
            .collect();
        assert_eq!(
            table,
            [
                ("float32", 4),
                ("bfloat16", 2),
                ("float16", 2),
                ("int64", 8),
                ("uint32", 4),
                ("uint8", 1)
            ]
        );
        for d in WireDtype::ALL {
            assert_eq!(WireDtype::from_name(d.name(), "dtype"), Ok(d));
            assert_eq!(d.to_string(), d.name());
        }
    }

    #[test]
    fn unknown_dtype_lists_the_vocabulary() {
        for bad in ["float64", "Float32", "", "bf16", "float32 "] {
            let err = WireDtype::from_name(bad, "wire_dtype").unwrap_err();
            assert_eq!(
                err,
                TensorError::UnknownDtype {
                    arg: "wire_dtype",
                    name: bad.to_owned()
                }
            );
            assert!(
                err.to_string().starts_with("wire_dtype: unknown dtype"),
                "{err}"
            );
            let msg = err.to_string();
            for d in WireDtype::ALL {
                assert!(msg.contains(d.name()), "{msg}");
            }
        }
    }

    #[test]
    fn numpy_sources() {
        let cases = [
            ("<f4", WireDtype::Float32),
            ("<u2", WireDtype::Bfloat16),
            ("<f2", WireDtype::Float16),
            ("<i8", WireDtype::Int64),
            ("<u4", WireDtype::Uint32),
            ("|u1", WireDtype::Uint8),
        ];
        for (s, d) in cases {
            assert_eq!(WireDtype::from_numpy_str(s, "src"), Ok(d));
        }
        for bad in [">f4", "<f8", "|i1", "|b1", "<i4", ">u2", "<c8", "f4"] {
            let err = WireDtype::from_numpy_str(bad, "src").unwrap_err();
            assert_eq!(
                err,
                TensorError::UnsupportedSourceDtype {
                    arg: "src",
                    numpy: bad.to_owned()
                }
            );
            assert!(err.to_string().starts_with("src: numpy dtype"), "{err}");
        }
    }

    #[test]
    fn byte_len_multiplies_with_checks() {
        assert_eq!(byte_len(&[], WireDtype::Float32), Ok(4));
        assert_eq!(byte_len(&[0, 7], WireDtype::Int64), Ok(0));
        assert_eq!(byte_len(&[5476, 1176], WireDtype::Float32), Ok(25_759_104));
        assert_eq!(byte_len(&[3, 2], WireDtype::Bfloat16), Ok(12));
        #[cfg(target_pointer_width = "64")]
        assert_eq!(byte_len(&[u64::MAX], WireDtype::Uint8), Ok(usize::MAX));
    }

    #[test]
    fn byte_len_overflow_is_reported() {
        let shape = [u64::from(u32::MAX), u64::from(u32::MAX), 2];
        let err = byte_len(&shape, WireDtype::Float32).unwrap_err();
        assert_eq!(
            err,
            TensorError::ShapeOverflow {
                shape: shape.to_vec(),
                itemsize: 4
            }
        );
        assert!(err.to_string().contains("itemsize 4"), "{err}");
        // Element count fits, bytes do not.
        let err = byte_len(&[u64::MAX / 2], WireDtype::Int64).unwrap_err();
        assert!(matches!(
            err,
            TensorError::ShapeOverflow { itemsize: 8, .. }
        ));
    }
}
