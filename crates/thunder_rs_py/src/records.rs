//! The plain records that cross the FFI: what the recorder made of a call, the metadata Python
//! gives for a call's outputs, a compile's result, a prim's row and a loaded plugin pass.
//!
//! Each is a frozen class read through named getters, so a consumer says which field it means
//! (`out.requires_grad`, not `out[4]`) and a new field breaks no unpacking.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use trace_ir::{TensorMeta, ValueId};

use crate::convert::tensor_meta;
use crate::trace::PyTrace;

/// `Name(field=repr(value), ...)` of a record, each field read through its getter.
pub fn record_repr(record: &Bound<'_, PyAny>, fields: &[&str]) -> PyResult<String> {
    let name = record.get_type().name()?;
    let fields = fields
        .iter()
        .map(|&field| Ok(format!("{field}={}", record.getattr(field)?.repr()?)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(format!("{name}({})", fields.join(", ")))
}

/// A tensor value the recorder made (an output of a recorded call, a cotangent placeholder):
/// its id and metadata, as Python builds its proxy from them.
#[pyclass(frozen, eq, hash, module = "thunder_rs._core", name = "RecordedTensor")]
#[derive(PartialEq, Eq, Hash)]
pub struct RecordedTensor {
    vid: ValueId,
    meta: TensorMeta,
}

impl RecordedTensor {
    pub fn new(vid: ValueId, meta: TensorMeta) -> Self {
        RecordedTensor { vid, meta }
    }
}

#[pymethods]
impl RecordedTensor {
    /// The value id, which arguments refer to the value by.
    #[getter]
    fn vid(&self) -> u32 {
        self.vid.0
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        crate::sizes::shape_to_py(py, &self.meta.shape)
    }

    /// The dtype's code (an index into `dtype_names()`).
    #[getter]
    fn dtype_code(&self) -> u8 {
        self.meta.dtype.code()
    }

    /// The device as torch spells it (`cpu`, `cuda:0`).
    #[getter]
    fn device(&self) -> String {
        self.meta.device.to_string()
    }

    #[getter]
    fn requires_grad(&self) -> bool {
        self.meta.requires_grad
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["vid", "shape", "dtype_code", "device", "requires_grad"])
    }
}

/// The metadata of one output of a call whose outputs Python computes (a fallback run on fake
/// tensors, a kernel recorded whole), checked when it is made: a bad dtype code or device
/// fails here, naming the field.
#[pyclass(frozen, eq, hash, module = "thunder_rs._core", name = "TensorMeta")]
#[derive(PartialEq, Eq, Hash)]
pub struct PyTensorMeta {
    pub meta: TensorMeta,
}

#[pymethods]
impl PyTensorMeta {
    #[new]
    #[pyo3(signature = (*, dtype_code, device, shape, requires_grad))]
    fn new(dtype_code: u8, device: &str, shape: Vec<Bound<'_, PyAny>>, requires_grad: bool) -> PyResult<Self> {
        let mut meta = tensor_meta(dtype_code, device, Vec::new(), requires_grad)?;
        meta.shape = shape.iter().map(crate::sizes::dim_of).collect::<PyResult<_>>()?;
        Ok(PyTensorMeta { meta })
    }

    /// The dtype's code (an index into `dtype_names()`).
    #[getter]
    fn dtype_code(&self) -> u8 {
        self.meta.dtype.code()
    }

    #[getter]
    fn device(&self) -> String {
        self.meta.device.to_string()
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        crate::sizes::shape_to_py(py, &self.meta.shape)
    }

    #[getter]
    fn requires_grad(&self) -> bool {
        self.meta.requires_grad
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["dtype_code", "device", "shape", "requires_grad"])
    }
}

/// What `compile` made: the traces after each stage of the forward (the last one the execution
/// trace), those of the backward (empty when no output requires grad), and the positions of the
/// flat outputs that receive cotangents.
#[pyclass(frozen, module = "thunder_rs._core", name = "Compiled")]
pub struct Compiled {
    forward: Vec<Py<PyTrace>>,
    backward: Vec<Py<PyTrace>>,
    grad_outputs: Vec<usize>,
}

impl Compiled {
    pub fn new(
        py: Python<'_>,
        forward: Vec<PyTrace>,
        backward: Vec<PyTrace>,
        grad_outputs: Vec<usize>,
    ) -> PyResult<Self> {
        let handles = |traces: Vec<PyTrace>| traces.into_iter().map(|t| Py::new(py, t)).collect::<PyResult<Vec<_>>>();
        Ok(Compiled { forward: handles(forward)?, backward: handles(backward)?, grad_outputs })
    }
}

#[pymethods]
impl Compiled {
    #[getter]
    fn forward<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.forward.iter().map(|t| t.bind(py)))
    }

    #[getter]
    fn backward<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.backward.iter().map(|t| t.bind(py)))
    }

    #[getter]
    fn grad_outputs(&self) -> Vec<usize> {
        self.grad_outputs.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Compiled(forward=<{} traces>, backward=<{} traces>, grad_outputs={:?})",
            self.forward.len(),
            self.backward.len(),
            self.grad_outputs
        )
    }
}

/// One prim as Python derives its entry point, elementwise ltorch symbol and torch
/// implementation from it: its name, its family (`Unary`, `Reduce`, ...) and, for a
/// parameterless elementwise prim whose ltorch symbol is derived, its type promotion code.
#[pyclass(frozen, eq, hash, module = "thunder_rs._core", name = "PrimInfo")]
#[derive(PartialEq, Eq, Hash)]
pub struct PrimInfo {
    #[pyo3(get)]
    name: &'static str,
    #[pyo3(get)]
    family: &'static str,
    #[pyo3(get)]
    promotion: Option<u8>,
}

impl From<trace_ir::prims::PrimInfo> for PrimInfo {
    fn from(info: trace_ir::prims::PrimInfo) -> Self {
        PrimInfo { name: info.name, family: info.family, promotion: info.promotion }
    }
}

#[pymethods]
impl PrimInfo {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["name", "family", "promotion"])
    }
}

/// A pass a plugin registered: its name, which `jit(fn, passes=[...])` takes, and the stage it
/// declared (where in the pipeline it runs).
#[pyclass(frozen, eq, hash, module = "thunder_rs._core", name = "LoadedPass")]
#[derive(PartialEq, Eq, Hash)]
pub struct LoadedPass {
    #[pyo3(get)]
    name: String,
    #[pyo3(get)]
    stage: String,
}

impl LoadedPass {
    pub fn new(name: String, stage: String) -> Self {
        LoadedPass { name, stage }
    }
}

#[pymethods]
impl LoadedPass {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["name", "stage"])
    }
}
