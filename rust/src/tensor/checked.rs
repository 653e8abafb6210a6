//! What can fail about dtypes and shapes: parsing a wire or numpy dtype name and
//! `shape × itemsize` with checked arithmetic, each failure a [`TensorError`].
//!
//! Apart from [`super::dtype`] so that the dtype vocabulary stays a leaf that [`super::error`]
//! can name without the two naming each other.

use super::dtype::WireDtype;
use super::error::TensorError;

impl WireDtype {
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
