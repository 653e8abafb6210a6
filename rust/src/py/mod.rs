//! The PyO3 layer: the only code that knows about Python. One file per capability; each
//! converts types, releases the GIL around heavy work and maps errors — nothing else.

use pyo3::prelude::*;

mod array;
mod build_info;
mod decode;
mod errors;
mod hash;
mod image;
mod memory;
mod processors;
mod prompt;
mod tensor;

/// `smg_grpc_proto._native`: the private extension module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    build_info::register(m)?;
    decode::register(m)?;
    errors::register(m)?;
    hash::register(m)?;
    image::register(m)?;
    memory::register(m)?;
    processors::register(m)?;
    prompt::register(m)?;
    tensor::register(m)?;
    Ok(())
}
