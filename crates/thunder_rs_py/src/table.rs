//! The executors' tables as Python sends them: frozen records (`ImplEntry`, `ExecutorRow`), read
//! once into `ExecutorTable`, where each prim name becomes its `PrimId` so that a misspelt name
//! fails there, naming the executor, instead of silently claiming nothing.

use passes::{ExecutorSpec, ImplSpec, SymKey};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use trace_ir::pysrc::Callee;
use trace_ir::{ErrorKind, IrError, PrimId, SymbolId};

use crate::errors::PyIrError;

/// What an implementation runs, as Python names it: a prim's name or a registered symbol's id.
#[derive(Clone)]
enum Named {
    Prim(String),
    Symbol(u32),
}

/// One implementation an executor offers.
#[pyclass(frozen, module = "thunder_rs._core", name = "ImplEntry")]
pub struct ImplEntry {
    symbol: Named,
    function: String,
    has_checker: bool,
    method: Option<String>,
    inplace: Option<String>,
    method_args: Option<Vec<usize>>,
}

#[pymethods]
impl ImplEntry {
    /// `symbol` is a prim name (str) or a registered symbol id (int); `function` the global the
    /// generated code calls; `method` a tensor method with the same signature and `inplace` one
    /// computing the same values into its receiver (either may be None); `method_args` the
    /// positions of the call's arguments both methods take after their receiver, in their order
    /// (None: those after the first).
    #[new]
    #[pyo3(signature = (*, symbol, function, has_checker, method=None, inplace=None, method_args=None))]
    fn new(
        symbol: Bound<'_, PyAny>,
        function: String,
        has_checker: bool,
        method: Option<String>,
        inplace: Option<String>,
        method_args: Option<Vec<usize>>,
    ) -> PyResult<Self> {
        let symbol = match symbol.extract::<u32>() {
            Ok(id) => Named::Symbol(id),
            Err(_) => Named::Prim(symbol.extract::<String>()?),
        };
        Ok(ImplEntry { symbol, function, has_checker, method, inplace, method_args })
    }

    #[getter]
    fn symbol<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match &self.symbol {
            Named::Prim(name) => name.into_pyobject(py)?.into_any(),
            Named::Symbol(id) => id.into_pyobject(py)?.into_any(),
        })
    }

    #[getter]
    fn function(&self) -> &str {
        &self.function
    }

    #[getter]
    fn has_checker(&self) -> bool {
        self.has_checker
    }

    #[getter]
    fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }

    #[getter]
    fn inplace(&self) -> Option<&str> {
        self.inplace.as_deref()
    }

    #[getter]
    fn method_args(&self) -> Option<Vec<usize>> {
        self.method_args.clone()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let repr = |value: Bound<'_, PyAny>| value.repr().map(|r| r.to_string());
        Ok(format!(
            "ImplEntry(symbol={}, function={}, has_checker={}, method={}, inplace={}, method_args={})",
            repr(self.symbol(py)?)?,
            repr(self.function.as_str().into_pyobject(py)?.into_any())?,
            repr(self.has_checker.into_pyobject(py)?.to_owned().into_any())?,
            repr(self.method.as_deref().into_pyobject(py)?)?,
            repr(self.inplace.as_deref().into_pyobject(py)?)?,
            repr(self.method_args.clone().into_pyobject(py)?)?,
        ))
    }
}

impl ImplEntry {
    /// The entry as the claim pass keys it; `executor` names the table in the error.
    fn spec(&self, executor: &str) -> PyResult<(SymKey, ImplSpec)> {
        let key = match &self.symbol {
            Named::Symbol(id) => SymKey::Symbol(SymbolId(*id)),
            Named::Prim(name) => SymKey::Prim(PrimId::from_name(name).ok_or_else(|| {
                let message =
                    format!("executor `{executor}` registers an implementation of `{name}`, which is no prim");
                PyIrError(IrError::new(ErrorKind::Value, "ExecutorTable", message))
            })?),
        };
        let callee = Callee {
            function: self.function.as_str().into(),
            method: self.method.as_deref().map(Into::into),
            inplace: self.inplace.as_deref().map(Into::into),
            method_args: self.method_args.as_deref().map(Into::into),
        };
        Ok((key, ImplSpec { callee, has_checker: self.has_checker }))
    }
}

/// One executor's table.
#[pyclass(frozen, module = "thunder_rs._core", name = "ExecutorRow")]
pub struct ExecutorRow {
    name: String,
    fusion: bool,
    impls: Vec<Py<ImplEntry>>,
    fuses_decompositions: bool,
}

#[pymethods]
impl ExecutorRow {
    /// `fusion` says whether the executor runs regions of symbols rather than single symbols,
    /// `fuses_decompositions` whether a fusion executor claims composites whose whole
    /// decomposition it claims.
    #[new]
    #[pyo3(signature = (*, name, fusion, impls, fuses_decompositions=false))]
    fn new(name: String, fusion: bool, impls: Vec<Py<ImplEntry>>, fuses_decompositions: bool) -> Self {
        ExecutorRow { name, fusion, impls, fuses_decompositions }
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[getter]
    fn fusion(&self) -> bool {
        self.fusion
    }

    #[getter]
    fn impls<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.impls.iter().map(|entry| entry.clone_ref(py)))
    }

    #[getter]
    fn fuses_decompositions(&self) -> bool {
        self.fuses_decompositions
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let name = self.name.as_str().into_pyobject(py)?.into_any().repr()?;
        let flag = |b: bool| if b { "True" } else { "False" };
        Ok(format!(
            "ExecutorRow(name={name}, fusion={}, impls=<{} entries>, fuses_decompositions={})",
            flag(self.fusion),
            self.impls.len(),
            flag(self.fuses_decompositions),
        ))
    }
}

/// The executors' tables in priority order, built once from Python.
#[pyclass(frozen, module = "thunder_rs._core", name = "ExecutorTable")]
pub struct ExecutorTable {
    pub(crate) executors: Vec<ExecutorSpec>,
}

#[pymethods]
impl ExecutorTable {
    /// `executors` in priority order. A prim name no prim has is a `ThunderValueError` naming the
    /// executor and the name.
    #[new]
    fn new(executors: Vec<Bound<'_, ExecutorRow>>) -> PyResult<Self> {
        let executors = executors.iter().map(|row| spec(row.get())).collect::<PyResult<_>>()?;
        Ok(ExecutorTable { executors })
    }
}

/// The claim pass's table of one executor.
fn spec(row: &ExecutorRow) -> PyResult<ExecutorSpec> {
    let impls = row.impls.iter().map(|entry| entry.get().spec(&row.name)).collect::<PyResult<_>>()?;
    Ok(ExecutorSpec {
        name: row.name.clone(),
        impls,
        fusion: row.fusion,
        fuses_decompositions: row.fuses_decompositions,
    })
}
