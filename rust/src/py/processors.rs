//! Python view of [`crate::processors`]: a configured `Preprocessor` that takes a list of numpy
//! `uint8` images (`HxW` or `HxWxC`, C in 1, 3, 4) and/or encoded `bytes`, and returns the output
//! tensors as `Tensor` objects numpy wraps without a copy (`__array_interface__`).
//!
//! Arrays are read through [`super::array`] while strong references to every input are held; all decoding, resizing and
//! normalisation runs with the GIL released, on all cores the work pays for unless `threads` says otherwise.
//! Every [`ProcessorError`] is raised as the `smg_grpc_proto.errors` class of its kind, with its
//! field, numbers and image index (see [`super::errors`]).

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;
use std::sync::Arc;

use super::array::{is_ndarray, ImageArray};
use super::errors::{self, processor_error, Class};
use crate::memory::recycle;
use crate::processors::family::TokenIds;
use crate::processors::pending::{Filled, Pending};
use crate::processors::qwen::Patches;
use crate::processors::value::{BadSize, Raw};
use crate::processors::{
    Alpha, Deferred, Family, Input, Options, Outputs, Preprocessor, ProcessorError, TensorData,
    Value, VisionTokens,
};
use crate::tensor::wire::Produce;

/// What a configuration value may be (`expected` of a refused one).
const CONFIG_VALUE_TYPES: &str =
    "bool, int (64-bit), float, str, None, a list of numbers, a list of [h, w] pairs or a dict of ints";

/// A configuration value from Python: bool, int, float, str, None, a list of numbers, a list of
/// `[h, w]` pairs, or a dict of ints.
/// Anything else is an `ImageTypeError` with `field='config["key"]'` and the value's `repr` as
/// `actual`.
fn value_of(key: &str, obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let bad = || {
        let actual = repr_of(obj);
        let field = format!("config[{key:?}]");
        errors::raise(
            obj.py(),
            Class::ImageType,
            &format!("{field}: unsupported value {actual}"),
            &field,
            CONFIG_VALUE_TYPES,
            actual,
        )
    };
    if obj.is_none() {
        return Ok(Value::None);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        return obj.extract::<i64>().map(Value::Int).map_err(|_| bad());
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_str()?.to_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let k: String = k.extract().map_err(|_| bad())?;
            if v.cast::<PyBool>().is_ok() {
                return Err(bad());
            }
            let v: i64 = v.extract().map_err(|_| bad())?;
            entries.push((k, v));
        }
        return Ok(Value::Map(entries));
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let items: Vec<Bound<'_, PyAny>> = obj.try_iter()?.collect::<PyResult<_>>()?;
        if items
            .iter()
            .all(|i| i.cast::<PyList>().is_ok() || i.cast::<PyTuple>().is_ok())
        {
            let mut pairs = Vec::with_capacity(items.len());
            for item in &items {
                let pair: Vec<i64> = item.extract().map_err(|_| bad())?;
                let [h, w] = pair[..] else {
                    return Err(bad());
                };
                pairs.push((h, w));
            }
            return Ok(Value::Pairs(pairs));
        }
        let mut floats = Vec::with_capacity(items.len());
        for item in &items {
            if item.cast::<PyBool>().is_ok() {
                return Err(bad());
            }
            floats.push(item.extract::<f64>().map_err(|_| bad())?);
        }
        return Ok(Value::Floats(floats));
    }
    Err(bad())
}

/// `repr(obj)`, or `"?"` when it raises.
fn repr_of(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
}

fn value_to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    match value {
        Value::Bool(b) => b.into_py_any(py),
        Value::Int(i) => i.into_py_any(py),
        Value::Float(f) => f.into_py_any(py),
        Value::Str(s) => s.into_py_any(py),
        Value::Floats(v) => v.clone().into_py_any(py),
        Value::Pairs(v) => {
            let lists: Vec<Vec<i64>> = v.iter().map(|&(h, w)| vec![h, w]).collect();
            lists.into_py_any(py)
        }
        Value::Map(entries) => {
            let d = PyDict::new(py);
            for (k, v) in entries {
                d.set_item(k, v)?;
            }
            d.into_py_any(py)
        }
        Value::None => Ok(py.None()),
    }
}

/// One input held for the duration of a call: encoded bytes or a checked image array.
enum Held<'py> {
    Bytes(Bound<'py, PyBytes>),
    Array(ImageArray<'py>),
}

impl<'py> Held<'py> {
    fn of(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Self> {
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return Ok(Held::Bytes(bytes.clone()));
        }
        if !is_ndarray(obj)? {
            let got = obj.get_type().name()?.to_string();
            let message = format!("{what}: expected bytes or a numpy.ndarray, got {got}");
            let expected = "bytes or numpy.ndarray";
            return Err(errors::raise(
                obj.py(),
                Class::ImageType,
                &message,
                what,
                expected,
                got,
            ));
        }
        Ok(Held::Array(ImageArray::of(obj, what)?))
    }

    fn input(&self) -> Input<'_> {
        match self {
            Held::Bytes(bytes) => Input::Encoded(bytes.as_bytes()),
            Held::Array(array) => Input::Pixels {
                data: array.pixels(),
                width: array.width,
                height: array.height,
                channels: array.channels,
            },
        }
    }
}

fn items<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if obj.cast::<PyList>().is_err() && obj.cast::<PyTuple>().is_err() {
        let got = obj.get_type().name()?.to_string();
        let message = format!("{what}: expected a list, got {got}");
        let expected = "list or tuple";
        return Err(errors::raise(
            obj.py(),
            Class::ImageType,
            &message,
            what,
            expected,
            got,
        ));
    }
    obj.try_iter()?.collect()
}

fn options(
    threads: usize,
    apply_exif: bool,
    alpha: &str,
    max_pixels: Option<u64>,
) -> PyResult<Options> {
    let alpha = match alpha {
        "load_image" => Alpha::LoadImage,
        "white" => Alpha::White,
        "drop" => Alpha::Drop,
        other => {
            let message = format!("alpha must be 'load_image', 'white' or 'drop', got {other:?}");
            return Err(Python::attach(|py| {
                let expected = ("load_image", "white", "drop");
                errors::raise(
                    py,
                    Class::ProcessorConfig,
                    &message,
                    "alpha",
                    expected,
                    other,
                )
            }));
        }
    };
    Ok(Options {
        threads,
        apply_exif,
        max_pixels,
        alpha,
    })
}

/// An output tensor owned by the extension, exposed to numpy through `__array_interface__`
/// (zero copy, writable).
///
/// The buffer is a leaked `Vec<f32>`, `Vec<i64>` or `Vec<u16>` (bfloat16 bits) owned by this object: Rust keeps only its raw
/// parts and never reads or references the memory again (numpy may write to it), and frees it
/// when the object is collected, which numpy delays for as long as any array viewing it is alive
/// (the array's `base` holds a reference to this object).
#[pyclass(module = "smg_grpc_proto._native", name = "Tensor", frozen)]
struct PyTensor {
    addr: usize,
    len: usize,
    capacity: usize,
    kind: Kind,
    shape: Vec<usize>,
}

/// The element type of a [`PyTensor`]'s buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32,
    I64,
    Bf16,
}

impl PyTensor {
    fn new(shape: Vec<usize>, data: TensorData) -> Self {
        fn leak<T>(v: Vec<T>) -> (usize, usize, usize) {
            let mut v = std::mem::ManuallyDrop::new(v);
            (v.as_mut_ptr() as usize, v.len(), v.capacity())
        }
        let ((addr, len, capacity), kind) = match data {
            TensorData::F32(v) => (leak(v), Kind::F32),
            TensorData::I64(v) => (leak(v), Kind::I64),
            TensorData::Bf16(v) => (leak(v), Kind::Bf16),
        };
        PyTensor {
            addr,
            len,
            capacity,
            kind,
            shape,
        }
    }
}

impl Drop for PyTensor {
    fn drop(&mut self) {
        // SAFETY: the raw parts come from a `Vec<f32>`, `Vec<i64>` or `Vec<u16>` (as `kind`
        // says) leaked in `new` and are rebuilt exactly once, here, with the same element type;
        // no array can view the buffer any more (each holds a reference to this object).
        unsafe {
            match self.kind {
                // Large buffers are kept for the next output (see `memory::recycle`).
                Kind::F32 => recycle::give_f32(Vec::from_raw_parts(
                    self.addr as *mut f32,
                    self.len,
                    self.capacity,
                )),
                Kind::I64 => drop(Vec::from_raw_parts(
                    self.addr as *mut i64,
                    self.len,
                    self.capacity,
                )),
                Kind::Bf16 => recycle::give_u16(Vec::from_raw_parts(
                    self.addr as *mut u16,
                    self.len,
                    self.capacity,
                )),
            }
        }
    }
}

#[pymethods]
impl PyTensor {
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// `"float32"`, `"int64"` or `"bfloat16"` (whose bits numpy sees as `uint16`).
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.kind {
            Kind::F32 => "float32",
            Kind::I64 => "int64",
            Kind::Bf16 => "bfloat16",
        }
    }

    /// numpy's array interface (version 3): C-contiguous, writable.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        out.set_item("version", 3)?;
        out.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        let typestr = match self.kind {
            Kind::F32 => "<f4",
            Kind::I64 => "<i8",
            Kind::Bf16 => "<u2",
        };
        out.set_item("typestr", typestr)?;
        // An empty Vec's pointer is dangling but non-null and aligned, which numpy accepts.
        out.set_item("data", (self.addr, false))?;
        Ok(out)
    }
}

fn outputs_to_py(outputs: Outputs) -> Vec<(&'static str, PyTensor)> {
    outputs
        .tensors
        .into_iter()
        .map(|(name, t)| (name, PyTensor::new(t.shape, t.data)))
        .collect()
}

/// A `pixel_values` (or `pixel_values_videos`) whose values are not written yet: the batch
/// decoded, resized and laid out, owned by this object. `encode_frames` and `convert_into` write
/// it straight into a serialized request or a shared-memory segment (once, no copy);
/// `materialize()` writes it into a new `Tensor`.
#[pyclass(module = "smg_grpc_proto._native", name = "PendingTensor", frozen)]
pub(crate) struct PyPendingTensor {
    /// Shared by the views [`reshaped`](Self::reshaped) gives.
    inner: Arc<PendingKind>,
    /// The shape this object shows (the writer's, or a reshaped view of it).
    shape: Vec<usize>,
}

/// The Qwen families' patches, another family's planned values, or a constant `int64` tensor.
enum PendingKind {
    Patches(Box<Patches<'static>>),
    Values(Pending<'static>),
    Filled(Filled),
}

impl PyPendingTensor {
    /// What writes the tensor's bytes.
    pub(crate) fn producer(&self) -> &dyn Produce {
        match &*self.inner {
            PendingKind::Patches(patches) => &**patches,
            PendingKind::Values(values) => values,
            PendingKind::Filled(filled) => filled,
        }
    }

    /// The dtypes it can be written as, for messages.
    pub(crate) fn wire_dtypes(&self) -> &'static str {
        match &*self.inner {
            PendingKind::Filled(_) => "int64",
            _ => "float32 or bfloat16",
        }
    }

    fn new(kind: PendingKind, shape: Vec<usize>) -> Self {
        PyPendingTensor {
            inner: Arc::new(kind),
            shape,
        }
    }
}

#[pymethods]
impl PyPendingTensor {
    /// transformers' name of the tensor.
    #[getter]
    pub(crate) fn name(&self) -> &'static str {
        match &*self.inner {
            PendingKind::Patches(patches) => patches.name(),
            PendingKind::Values(values) => values.name(),
            PendingKind::Filled(filled) => filled.name(),
        }
    }

    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    /// `"float32"` (the values computed; `bfloat16` on the wire rounds them), or `"int64"` for a
    /// tensor of one constant value (Idefics3's `pixel_attention_mask`).
    #[getter]
    fn dtype(&self) -> &'static str {
        match &*self.inner {
            PendingKind::Filled(_) => "int64",
            _ => "float32",
        }
    }

    /// The size of the tensor in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        match &*self.inner {
            PendingKind::Patches(patches) => patches.byte_len(),
            PendingKind::Values(values) => values.byte_len(),
            PendingKind::Filled(filled) => filled.byte_len(),
        }
    }

    /// materialize() -> Tensor
    /// --
    ///
    /// The values written into a new tensor (GIL released); each call writes them again.
    fn materialize(&self, py: Python<'_>) -> PyResult<PyTensor> {
        let inner = &*self.inner;
        let values = py
            .detach(|| match inner {
                PendingKind::Patches(patches) => patches.values().map(TensorData::F32),
                PendingKind::Values(values) => values.values().map(TensorData::F32),
                PendingKind::Filled(filled) => filled.values().map(TensorData::I64),
            })
            .map_err(|e| processor_error(py, &e))?;
        Ok(PyTensor::new(self.shape(), values))
    }

    /// reshaped(shape) -> PendingTensor
    /// --
    ///
    /// The same values under another shape of as many elements (a view: nothing is written;
    /// both write the same bytes).
    fn reshaped(&self, py: Python<'_>, shape: Vec<usize>) -> PyResult<PyPendingTensor> {
        let count = |s: &[usize]| s.iter().try_fold(1u128, |n, &d| n.checked_mul(d as u128));
        let (have, want) = (count(&self.shape), count(&shape));
        if have != want {
            let message = format!(
                "a PendingTensor ({}) of shape {:?} ({} values) cannot be viewed as {:?} ({} values)",
                self.name(),
                self.shape,
                have.unwrap_or(0),
                shape,
                want.map_or_else(|| "too many".to_owned(), |n| n.to_string()),
            );
            return Err(errors::raise(
                py,
                Class::Tensor,
                &message,
                "shape",
                self.shape.clone(),
                shape,
            ));
        }
        Ok(PyPendingTensor {
            inner: Arc::clone(&self.inner),
            shape,
        })
    }
}

/// `(name, Tensor)` pairs and `(name, PendingTensor)` for a deferred tensor.
fn deferred_to_py(
    py: Python<'_>,
    deferred: Deferred<'static>,
) -> PyResult<Vec<(&'static str, Py<PyAny>)>> {
    let tensors = |outputs| {
        outputs_to_py(outputs)
            .into_iter()
            .map(|(name, t)| Ok((name, Py::new(py, t)?.into_any())))
            .collect::<PyResult<Vec<_>>>()
    };
    match deferred {
        Deferred::Done(outputs) => tensors(outputs),
        Deferred::Values {
            pending,
            filled,
            rest,
        } => {
            let name = pending.name();
            let shape = pending.shape().to_vec();
            let pending = PyPendingTensor::new(PendingKind::Values(*pending), shape);
            let mut out = vec![(name, Py::new(py, pending)?.into_any())];
            for f in filled {
                let (name, shape) = (f.name(), f.shape().to_vec());
                let f = PyPendingTensor::new(PendingKind::Filled(f), shape);
                out.push((name, Py::new(py, f)?.into_any()));
            }
            out.extend(tensors(rest)?);
            Ok(out)
        }
        Deferred::Patches(patches) => {
            let (grid_name, grid) = patches.grid();
            let (tokens_name, tokens) = patches.tokens();
            let seconds = patches.seconds();
            let name = patches.name();
            let shape = patches.shape().to_vec();
            let pending = PyPendingTensor::new(PendingKind::Patches(patches), shape);
            let mut out = vec![
                (name, Py::new(py, pending)?.into_any()),
                (
                    grid_name,
                    Py::new(py, PyTensor::new(grid.shape, grid.data))?.into_any(),
                ),
                (
                    tokens_name,
                    Py::new(py, PyTensor::new(tokens.shape, tokens.data))?.into_any(),
                ),
            ];
            if let Some((name, t)) = seconds {
                out.push((
                    name,
                    Py::new(py, PyTensor::new(t.shape, t.data))?.into_any(),
                ));
            }
            Ok(out)
        }
    }
}

/// A processor configuration, validated once, applied to batches.
#[pyclass(module = "smg_grpc_proto._native", name = "Preprocessor", frozen)]
struct PyPreprocessor {
    inner: Preprocessor,
}

#[pymethods]
impl PyPreprocessor {
    /// Preprocessor(family, config, vision_tokens=None)
    /// --
    ///
    /// `family`'s transformers class defaults overridden by `config` (normalised keys: see
    /// `smg_grpc_proto.vision`). `vision_tokens` is `(patch_size, num_additional_image_tokens,
    /// vision_feature_select_strategy)`, which the CLIP-like families count their tokens with.
    /// Raises `ProcessorConfigError` for a bad value or key.
    #[new]
    #[pyo3(signature = (family, config, vision_tokens=None))]
    fn new(
        py: Python<'_>,
        family: &str,
        config: &Bound<'_, PyDict>,
        vision_tokens: Option<(i64, i64, Option<String>)>,
    ) -> PyResult<Self> {
        let family = Family::from_name(family).ok_or_else(|| {
            let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
            processor_error(
                py,
                &ProcessorError::Config {
                    field: "family",
                    expected: format!("one of {names:?}"),
                    actual: format!("{family:?}"),
                },
            )
        })?;
        let mut entries = Vec::with_capacity(config.len());
        for (k, v) in config.iter() {
            let key: String = k.extract().map_err(|_| {
                let got = k
                    .get_type()
                    .name()
                    .map_or_else(|_| "?".to_owned(), |n| n.to_string());
                let message = format!("config keys must be str, got {got} {}", repr_of(&k));
                errors::raise(py, Class::ImageType, &message, "config", "str", got)
            })?;
            let value = value_of(&key, &v)?;
            entries.push((key, value));
        }
        let vision = vision_tokens
            .map(|(patch, extra, strategy)| VisionTokens::new(patch, extra, strategy.as_deref()))
            .transpose()
            .map_err(|e| processor_error(py, &e))?;
        let inner = Preprocessor::new(family, &entries)
            .map_err(|e| processor_error(py, &e))?
            .with_vision_tokens(vision);
        Ok(PyPreprocessor { inner })
    }

    #[getter]
    fn family(&self) -> &'static str {
        self.inner.family().name()
    }

    /// config() -> dict
    /// --
    ///
    /// Every key of the configuration and its value (defaults included).
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (key, value) in self.inner.config().entries() {
            out.set_item(key, value_to_py(py, &value)?)?;
        }
        Ok(out)
    }

    /// Whether PIL images with transparency data go to `images` as RGBA arrays (Inkling2's
    /// processor composites alpha itself), not composited onto white.
    #[getter]
    fn keeps_alpha(&self) -> bool {
        self.inner.config().get().keeps_alpha()
    }

    /// replacement_spec() -> ReplacementSpec | None
    /// --
    ///
    /// For a family whose image anchor becomes more than a run of one token (Llama 4, the tiled
    /// families): a dict with `grid` (the output tensors whose values per image are its grid),
    /// `anchor` (the chat template's token), `embed` (the token that takes the embeddings),
    /// `tokens` (every token of the replacement, transformers' spelling), `defaults` (their
    /// published ids), `flat` (the tensors engines take flat), `sizes` (the name of their
    /// rows-per-image tensor), `per_sample` (the outputs carry a sample dimension of 1) and
    /// `joins` (text pieces that merge into one token where a replacement meets the prompt,
    /// e.g. Gemma 3's newline runs; empty for most). `None` for the other families.
    fn replacement_spec<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(spec) = self.inner.config().get().replacement_spec() else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        out.set_item("grid", spec.grid.to_vec())?;
        out.set_item("anchor", spec.anchor)?;
        out.set_item("embed", spec.embed)?;
        out.set_item("tokens", spec.tokens.to_vec())?;
        let defaults = PyDict::new(py);
        for &(name, id) in spec.defaults {
            defaults.set_item(name, id)?;
        }
        out.set_item("defaults", defaults)?;
        out.set_item("flat", spec.flat.to_vec())?;
        out.set_item("sizes", spec.sizes)?;
        out.set_item("per_sample", spec.per_sample)?;
        out.set_item("joins", spec.joins.to_vec())?;
        Ok(Some(out))
    }

    /// published() -> dict | None
    /// --
    ///
    /// The placeholder tokens of the family's published checkpoints when its replacement is a
    /// run of one token: `image` (the anchor and the run's token), `video` (or `None`),
    /// `vision_tokens` (`(patch_size, num_additional_image_tokens, strategy)` of the CLIP-like
    /// towers, or `None`) and `count_tensor` (the per-image count an engine model takes as an
    /// input, or `None`). `None` for a family with a structured replacement (its ids are in
    /// `replacement_spec()["defaults"]`).
    fn published<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let hf = self.inner.family().hf();
        let Some(published) = hf.published else {
            return Ok(None);
        };
        let out = PyDict::new(py);
        out.set_item("image", published.image)?;
        out.set_item("video", published.video)?;
        let tower = published.vision_tokens.map(|v| {
            let strategy = if v.drop_one { "default" } else { "full" };
            (v.patch_size, v.num_additional_image_tokens, strategy)
        });
        out.set_item("vision_tokens", tower)?;
        out.set_item("count_tensor", hf.count_tensor)?;
        Ok(Some(out))
    }

    /// prompt_replacement(grid, token_ids) -> tuple[list[int], list[bool], int]
    /// --
    ///
    /// One image's replacement from its grid row: the token ids, which take embeddings, and the
    /// rows of the primary tensor the image owns. `token_ids` maps the spec's tokens to ids.
    /// Raises `ProcessorConfigError` for a bad grid, a missing id, or a family without a
    /// replacement rule.
    fn prompt_replacement(
        &self,
        py: Python<'_>,
        grid: Vec<i64>,
        token_ids: Vec<(String, u32)>,
    ) -> PyResult<(Vec<u32>, Vec<bool>, usize)> {
        let ids = TokenIds(&token_ids);
        match self.inner.config().get().prompt_replacement(&grid, &ids) {
            Some(Ok(r)) => Ok((r.tokens, r.embed, r.rows)),
            Some(Err(e)) => Err(processor_error(py, &e)),
            None => Err(errors::raise(
                py,
                Class::ProcessorConfig,
                &format!(
                    "{}: the prompt replacement is a run of the placeholder token",
                    self.inner.family().name()
                ),
                "family",
                "a family with a structured prompt replacement",
                self.inner.family().name(),
            )),
        }
    }

    /// images(images, threads, apply_exif, alpha, max_pixels) -> list[tuple[str, Tensor]]
    /// --
    ///
    /// Processes a list of images (numpy uint8 `HxW`/`HxWxC` arrays or encoded `bytes`).
    #[pyo3(signature = (images, threads, apply_exif, alpha, max_pixels))]
    fn images(
        &self,
        py: Python<'_>,
        images: &Bound<'_, PyAny>,
        threads: usize,
        apply_exif: bool,
        alpha: &str,
        max_pixels: Option<u64>,
    ) -> PyResult<Vec<(&'static str, PyTensor)>> {
        let options = options(threads, apply_exif, alpha, max_pixels)?;
        let inputs = held_images(images)?;
        self.run(py, &inputs, |p, i| p.images(i, &options))
            .map(outputs_to_py)
    }

    /// images_deferred(images, threads, apply_exif, alpha, max_pixels) -> list[tuple[str, Tensor | PendingTensor]]
    /// --
    ///
    /// `images`, with the Qwen families' `pixel_values` left as a `PendingTensor`.
    #[pyo3(signature = (images, threads, apply_exif, alpha, max_pixels))]
    fn images_deferred(
        &self,
        py: Python<'_>,
        images: &Bound<'_, PyAny>,
        threads: usize,
        apply_exif: bool,
        alpha: &str,
        max_pixels: Option<u64>,
    ) -> PyResult<Vec<(&'static str, Py<PyAny>)>> {
        let options = options(threads, apply_exif, alpha, max_pixels)?;
        let inputs = held_images(images)?;
        // Owned before the inputs are let go: an unresized input array is copied.
        let deferred = self.run(py, &inputs, |p, i| {
            p.images_deferred(i, &options).and_then(owned)
        })?;
        deferred_to_py(py, deferred)
    }

    /// videos(videos, threads, apply_exif, alpha, max_pixels) -> list[tuple[str, Tensor]]
    /// --
    ///
    /// Processes a list of videos, each a list of frames (arrays or `bytes`), Qwen families only.
    #[pyo3(signature = (videos, threads, apply_exif, alpha, max_pixels))]
    fn videos(
        &self,
        py: Python<'_>,
        videos: &Bound<'_, PyAny>,
        threads: usize,
        apply_exif: bool,
        alpha: &str,
        max_pixels: Option<u64>,
    ) -> PyResult<Vec<(&'static str, PyTensor)>> {
        let options = options(threads, apply_exif, alpha, max_pixels)?;
        let held = held_videos(videos)?;
        self.run_videos(py, &held, |p, v| p.videos(v, &options))
            .map(outputs_to_py)
    }

    /// videos_deferred(videos, threads, apply_exif, alpha, max_pixels) -> list[tuple[str, Tensor | PendingTensor]]
    /// --
    ///
    /// `videos`, with `pixel_values_videos` left as a `PendingTensor`.
    #[pyo3(signature = (videos, threads, apply_exif, alpha, max_pixels))]
    fn videos_deferred(
        &self,
        py: Python<'_>,
        videos: &Bound<'_, PyAny>,
        threads: usize,
        apply_exif: bool,
        alpha: &str,
        max_pixels: Option<u64>,
    ) -> PyResult<Vec<(&'static str, Py<PyAny>)>> {
        let options = options(threads, apply_exif, alpha, max_pixels)?;
        let held = held_videos(videos)?;
        let deferred = self.run_videos(py, &held, |p, v| {
            p.videos_deferred(v, &options).and_then(owned)
        })?;
        deferred_to_py(py, deferred)
    }
}

impl PyPreprocessor {
    /// `f` on the held images, with the GIL released; its error raised as Python's.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        held: &[Held<'_>],
        f: impl for<'a> FnOnce(&Preprocessor, &[Input<'a>]) -> Result<T, ProcessorError> + Send,
    ) -> PyResult<T> {
        let inputs: Vec<Input<'_>> = held.iter().map(Held::input).collect();
        let inner = &self.inner;
        py.detach(|| f(inner, &inputs))
            .map_err(|e| processor_error(py, &e))
    }

    /// [`run`](Self::run) for videos (lists of frames).
    fn run_videos<T: Send>(
        &self,
        py: Python<'_>,
        held: &[Vec<Held<'_>>],
        f: impl for<'a> FnOnce(&Preprocessor, &[Vec<Input<'a>>]) -> Result<T, ProcessorError> + Send,
    ) -> PyResult<T> {
        let inputs: Vec<Vec<Input<'_>>> = held
            .iter()
            .map(|frames| frames.iter().map(Held::input).collect())
            .collect();
        let inner = &self.inner;
        py.detach(|| f(inner, &inputs))
            .map_err(|e| processor_error(py, &e))
    }
}

/// A deferred batch that no longer borrows its inputs.
fn owned(deferred: Deferred<'_>) -> Result<Deferred<'static>, ProcessorError> {
    Ok(match deferred {
        Deferred::Patches(patches) => Deferred::Patches(Box::new(patches.into_owned()?)),
        Deferred::Values {
            pending,
            filled,
            rest,
        } => Deferred::Values {
            pending: Box::new(pending.into_owned()?),
            filled,
            rest,
        },
        Deferred::Done(outputs) => Deferred::Done(outputs),
    })
}

fn held_images<'py>(images: &Bound<'py, PyAny>) -> PyResult<Vec<Held<'py>>> {
    items(images, "images")?
        .iter()
        .enumerate()
        .map(|(i, obj)| Held::of(obj, &format!("images[{i}]")))
        .collect()
}

fn held_videos<'py>(videos: &Bound<'py, PyAny>) -> PyResult<Vec<Vec<Held<'py>>>> {
    let mut held = Vec::new();
    for (v, video) in items(videos, "videos")?.iter().enumerate() {
        let frames = items(video, &format!("videos[{v}]"))?
            .iter()
            .enumerate()
            .map(|(f, obj)| Held::of(obj, &format!("videos[{v}][{f}]")))
            .collect::<PyResult<Vec<_>>>()?;
        held.push(frames);
    }
    Ok(held)
}

/// processor_error_kinds() -> list[str]
/// --
///
/// The `kind` of every processing failure, one per Rust error variant, in declaration order.
#[pyfunction]
fn processor_error_kinds() -> Vec<&'static str> {
    ProcessorError::KINDS.to_vec()
}

/// processor_families() -> list[str]
/// --
///
/// The family names `Preprocessor` accepts.
#[pyfunction]
fn processor_families() -> Vec<&'static str> {
    Family::ALL.iter().map(|f| f.name()).collect()
}

/// How deep [`raw_of`] reads nested lists and dicts; deeper values pass through as
/// [`Raw::Other`] (no family reads below the second level).
const RAW_DEPTH: usize = 8;

/// A `preprocessor_config.json` value as [`Raw`]; what it cannot represent is kept in `others`
/// and passed through as [`Raw::Other`].
fn raw_of<'py>(
    obj: &Bound<'py, PyAny>,
    others: &mut Vec<Bound<'py, PyAny>>,
    depth: usize,
) -> PyResult<Raw> {
    if obj.is_none() {
        return Ok(Raw::None);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Raw::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Raw::Int(i));
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Raw::Float(f.value()));
    } else if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Raw::Str(s.to_str()?.to_owned()));
    } else if depth < RAW_DEPTH && (obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok()) {
        let items: Vec<Bound<'py, PyAny>> = obj.try_iter()?.collect::<PyResult<_>>()?;
        return items
            .iter()
            .map(|item| raw_of(item, others, depth + 1))
            .collect::<PyResult<_>>()
            .map(Raw::List);
    } else if let Ok(d) = obj.cast::<PyDict>() {
        if depth < RAW_DEPTH && d.keys().iter().all(|k| k.cast::<PyString>().is_ok()) {
            let mut entries = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                entries.push((k.extract::<String>()?, raw_of(&v, others, depth + 1)?));
            }
            return Ok(Raw::Map(entries));
        }
    }
    others.push(obj.clone());
    Ok(Raw::Other {
        id: others.len() - 1,
        int: obj.cast::<PyInt>().is_ok(),
        truthy: obj.is_truthy()?,
    })
}

fn raw_to_py<'py>(
    py: Python<'py>,
    raw: &Raw,
    others: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match raw {
        Raw::None => py.None().into_bound(py),
        Raw::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Raw::Int(i) => i.into_bound_py_any(py)?,
        Raw::Float(f) => f.into_bound_py_any(py)?,
        Raw::Str(s) => PyString::new(py, s).into_any(),
        Raw::List(items) => {
            let items = items
                .iter()
                .map(|item| raw_to_py(py, item, others))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Raw::Map(entries) => {
            let d = PyDict::new(py);
            for (k, v) in entries {
                d.set_item(k, raw_to_py(py, v, others)?)?;
            }
            d.into_any()
        }
        Raw::Other { id, .. } => others[*id].clone(),
    })
}

/// normalise_config(family, config) -> dict[str, Any]
/// --
///
/// The keys of a transformers `preprocessor_config.json` (`config`) that `family` uses, in the
/// form `Preprocessor` takes (the family's own reading, in `rust/src/processors/<family>.rs`).
/// Raises `ProcessorConfigError` (a `ValueError`) for an unknown family or a value that is no
/// size.
#[pyfunction]
fn normalise_config<'py>(
    py: Python<'py>,
    family: &str,
    config: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyDict>> {
    let Some(family) = Family::from_name(family) else {
        let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        return Err(errors::raise(
            py,
            Class::ProcessorConfig,
            &format!(
                "unknown family {family:?}: expected one of {}",
                names.join(", ")
            ),
            "family",
            names,
            family,
        ));
    };
    let mut others = Vec::new();
    let mut raw = Vec::with_capacity(config.len());
    for (k, v) in config.iter() {
        // Keys that are not strings are keys no family reads.
        if let Ok(key) = k.cast::<PyString>() {
            raw.push((key.to_str()?.to_owned(), raw_of(&v, &mut others, 0)?));
        }
    }
    let out = (family.hf().normalise)(&raw).map_err(|BadSize(value)| {
        match raw_to_py(py, &value, &others).and_then(|v| Ok(v.repr()?.to_string())) {
            Ok(repr) => errors::raise(
                py,
                Class::ProcessorConfig,
                &format!("cannot read a size from {repr}"),
                "config",
                "an int, [height, width] or a dict of ints",
                repr,
            ),
            Err(err) => err,
        }
    })?;
    let d = PyDict::new(py);
    for (k, v) in &out {
        d.set_item(k, raw_to_py(py, v, &others)?)?;
    }
    Ok(d)
}

/// The metadata [`families`] returns for one family.
type FamilyInfo = (
    &'static str,
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<(&'static str, Option<i64>)>,
    Option<(&'static str, &'static str, bool)>,
);

/// families() -> list[tuple[str, list[str], list[str], list[tuple[str, int | None]], tuple[str, str, bool] | None]]
/// --
///
/// Every family in registry order: `(name, image_classes, video_classes, processor_keys,
/// processor_forces)`: the transformers image and video processor classes that name it
/// (without the `Fast`/`Pil` suffix), the `(key, default)` settings it reads from a model's
/// `processor_config.json` (none: the file gives `VisionTokens`), and the
/// `(processor_class, key, value)` that processor class forces, if any.
#[pyfunction]
fn families() -> Vec<FamilyInfo> {
    Family::ALL
        .iter()
        .map(|f| {
            let hf = f.hf();
            (
                f.name(),
                hf.image_classes.to_vec(),
                hf.video_classes.to_vec(),
                hf.processor_keys.to_vec(),
                hf.processor_forces,
            )
        })
        .collect()
}

/// The family a `config.json` `model_type` names (its own name or an alias its module lists,
/// e.g. `qwen4_exp` -> `qwen3_5`), or `None`.
#[pyfunction]
fn family_of_model_type(model_type: &str) -> Option<&'static str> {
    Family::from_model_type(model_type).map(Family::name)
}

/// The family a transformers `processor_class` names over its image processor class (e.g.
/// `Qwen3OmniMoeProcessor` -> `qwen3_omni_moe`), or `None`.
#[pyfunction]
fn family_of_processor_class(name: &str) -> Option<&'static str> {
    Family::from_processor_class(name).map(Family::name)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(normalise_config, m)?)?;
    m.add_function(wrap_pyfunction!(family_of_model_type, m)?)?;
    m.add_function(wrap_pyfunction!(family_of_processor_class, m)?)?;
    m.add_function(wrap_pyfunction!(families, m)?)?;
    m.add_class::<PyPreprocessor>()?;
    m.add_class::<PyTensor>()?;
    m.add_class::<PyPendingTensor>()?;
    m.add_function(wrap_pyfunction!(processor_error_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(processor_families, m)?)
}
