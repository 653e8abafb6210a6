//! The wire dtype vocabulary and item sizes: a leaf, which the error type can name. Parsing a
//! dtype and `shape × itemsize`, which fail with a [`super::TensorError`], are in
//! [`super::checked`].

use std::fmt;

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
}
