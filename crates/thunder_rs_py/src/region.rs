//! The fusion regions of an execution trace as Python reads them: one frozen `RegionCode` per
//! region ([`passes::RegionCode`]), and its decomposed calls as `LeafCall`s.
//!
//! A record holds its plan and trace and converts a field when it is read: a fusion executor
//! that runs the region's source never pays for the decomposition that a translating one reads.

use passes::Plan;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use std::sync::Arc;
use trace_ir::{Arg, Trace, ValueId};

use crate::records::record_repr;

/// One fusion region of an execution trace.
#[pyclass(frozen, eq, module = "thunder_rs._core", name = "RegionCode")]
pub struct PyRegionCode {
    plan: Arc<Plan>,
    trace: Arc<Trace>,
    index: usize,
}

impl PartialEq for PyRegionCode {
    fn eq(&self, other: &Self) -> bool {
        self.code() == other.code()
    }
}

impl PyRegionCode {
    /// The regions of `plan`, an execution plan of `trace`, in order.
    pub fn all(plan: &Arc<Plan>, trace: &Arc<Trace>) -> Vec<PyRegionCode> {
        let region = |index| PyRegionCode { plan: plan.clone(), trace: trace.clone(), index };
        (0..plan.regions.len()).map(region).collect()
    }

    fn code(&self) -> &passes::RegionCode {
        &self.plan.regions[self.index]
    }
}

#[pymethods]
impl PyRegionCode {
    /// Unique within its execution trace: the global its call site reads (`inductor_fusion0`).
    #[getter]
    fn name(&self) -> &str {
        &self.code().name
    }

    /// The fusion executor's index in the executor table.
    #[getter]
    fn executor(&self) -> usize {
        self.code().executor
    }

    /// The module source of `def {name}(inputs...)`, returning a tuple of its outputs.
    #[getter]
    fn source(&self) -> &str {
        &self.code().source
    }

    /// Equal for regions that compute the same thing on inputs of the same metadata.
    #[getter]
    fn key(&self) -> &str {
        &self.code().key
    }

    /// The qualified names of its calls, in order.
    #[getter]
    fn symbol_names(&self) -> Vec<String> {
        self.code().symbol_names.clone()
    }

    #[getter]
    fn num_inputs(&self) -> usize {
        self.code().num_inputs
    }

    #[getter]
    fn num_outputs(&self) -> usize {
        self.code().num_outputs
    }

    /// The inputs' value names (`t12`), in the function's order.
    #[getter]
    fn inputs(&self) -> Vec<String> {
        names(&self.code().inputs)
    }

    /// Each input's sizes as the trace knows them, in the function's order: a tensor's shape
    /// (ints, and `SymExpr`s where a dimension is symbolic), a size value's own `SymExpr`, and
    /// `None` for a number. Fusion executors read which extents may change between calls here.
    #[getter]
    fn input_shapes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let shapes = self.code().inputs.iter().map(|&v| match self.trace.values.get(v.index()) {
            Some(trace_ir::ValueKind::Tensor(t)) => Ok(crate::sizes::shape_to_py(py, &t.shape)?.into_any()),
            Some(trace_ir::ValueKind::Size(hint)) => crate::sizes::dim_to_py(py, &trace_ir::Dim::size(v, *hint)),
            _ => Ok(py.None().into_bound(py)),
        });
        PyTuple::new(py, shapes.collect::<PyResult<Vec<_>>>()?)
    }

    /// The outputs' value names, in the function's order.
    #[getter]
    fn outputs(&self) -> Vec<String> {
        names(&self.code().outputs)
    }

    /// Its calls, every composite replaced by its decomposition.
    #[getter]
    fn calls(&self) -> Vec<LeafCall> {
        self.code().calls.iter().map(|call| LeafCall(call.clone())).collect()
    }

    /// The torch dtype of each tensor among the inputs and the calls' outputs, by value name.
    #[getter]
    fn dtypes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let code = self.code();
        let dtypes = PyDict::new(py);
        for &v in code.inputs.iter().chain(code.calls.iter().flat_map(|c| c.outputs.iter())) {
            if let Some(meta) = self.trace.tensor(v) {
                dtypes.set_item(v.to_string(), dtype_to_py(py, meta.dtype)?)?;
            }
        }
        Ok(dtypes)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["name", "executor", "symbol_names", "num_inputs", "num_outputs"])
    }
}

/// One call of a region's decomposition: a prim, or a symbol without decomposition.
#[pyclass(frozen, eq, module = "thunder_rs._core", name = "LeafCall")]
#[derive(PartialEq)]
pub struct LeafCall(passes::LeafCall);

#[pymethods]
impl LeafCall {
    /// `prims.add`; a symbol without decomposition by its qualified name.
    #[getter]
    fn name(&self) -> &str {
        &self.0.name
    }

    /// The positional arguments as printed (a prim's operands, then its parameters), values
    /// named as strings (`t12`): prims take no string parameters, so a str is always a value.
    #[getter]
    fn args<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.0.args.iter().map(|a| named_arg(py, a)).collect::<PyResult<Vec<_>>>()?)
    }

    /// The outputs' value names.
    #[getter]
    fn outputs(&self) -> Vec<String> {
        names(&self.0.outputs)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        record_repr(slf.as_any(), &["name", "args", "outputs"])
    }
}

fn names(values: &[ValueId]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// A dtype as the torch dtype it stands for.
fn dtype_to_py(py: Python<'_>, dtype: trace_ir::DType) -> PyResult<Bound<'_, PyAny>> {
    crate::convert::to_py(py, &Arg::DType(dtype), &mut |leaf| {
        Err(pyo3::exceptions::PyTypeError::new_err(format!("not a dtype: {leaf:?}")))
    })
}

/// An argument as Python data, values by name (`t12`). Prims take no Python objects; a symbol
/// without decomposition may, but it is never translated: its constants show as their names.
fn named_arg<'py>(py: Python<'py>, arg: &Arg) -> PyResult<Bound<'py, PyAny>> {
    crate::convert::to_py(py, arg, &mut |leaf| {
        let name = match leaf {
            Arg::Value(v) => v.to_string(),
            Arg::PyConst(i) => format!("_c{i}"),
            other => return Err(pyo3::exceptions::PyTypeError::new_err(format!("not a leaf argument: {other:?}"))),
        };
        Ok(PyString::new(py, &name).into_any())
    })
}
