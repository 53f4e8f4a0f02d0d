//! The compile entry point: passes, claiming and code generation in one call.

use passes::dce::dce;
use passes::cse::cse;
use passes::{claim, lifetimes, run_passes, ExecutorSpec, ImplSpec, Pass, PassCx, SymKey};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::time::Instant;
use trace_ir::pysrc::Callee;
use trace_ir::verify::verify;
use trace_ir::{BoundSymbol, SymbolId};

use crate::convert::from_arg;
use crate::errors::{no_panic, py_result};
use crate::trace::{Plan, PyTrace};

/// The passes before claiming, in order.
const PIPELINE: &[Pass] = &[("dce", dce), ("cse", cse)];

/// The executors' tables in priority order, built once from Python.
#[pyclass(frozen, module = "thunder_rs._core", name = "ExecutorTable")]
pub struct ExecutorTable {
    executors: Vec<ExecutorSpec>,
}

#[pymethods]
impl ExecutorTable {
    /// `executors` is `[(name, [(symbol, impl_name, has_checker, method), ...]), ...]`, where
    /// `symbol` is a prim name (str) or a registered symbol id (int), and `method` names a
    /// tensor method with the same signature, or is None.
    #[new]
    fn new(executors: Vec<(String, Vec<(Bound<'_, PyAny>, String, bool, Option<String>)>)>) -> PyResult<Self> {
        let executors = executors
            .into_iter()
            .map(|(name, entries)| {
                let impls = entries
                    .into_iter()
                    .map(|(sym, function, has_checker, method)| {
                        let key = match sym.extract::<u32>() {
                            Ok(id) => SymKey::Symbol(SymbolId(id)),
                            Err(_) => SymKey::Prim(sym.extract::<String>()?),
                        };
                        Ok((key, ImplSpec { callee: Callee { function, method }, has_checker }))
                    })
                    .collect::<PyResult<_>>()?;
                Ok(ExecutorSpec { name, impls })
            })
            .collect::<PyResult<_>>()?;
        Ok(ExecutorTable { executors })
    }
}

/// Runs the pipeline on an acquired trace. For entries that have a checker,
/// `checker(executor_index, symbol_key, args, kwargs)` is called with the bound symbol's arguments
/// (tensors as proxies made by `make_proxy`, constants from `consts`).
///
/// Returns `(traces, backward_traces, grad_outputs)`: the traces after each stage, the last
/// being the execution trace whose `str()` is the Python source to exec; for a program with an
/// output that requires grad, the backward's traces likewise (else an empty list), and the
/// positions of the flat outputs that receive cotangents.
#[pyfunction]
#[pyo3(signature = (acquired, table, checker, make_proxy, consts))]
pub fn compile(
    acquired: &PyTrace,
    table: &ExecutorTable,
    checker: Bound<'_, PyAny>,
    make_proxy: Bound<'_, PyAny>,
    consts: Bound<'_, PyList>,
) -> PyResult<(Vec<PyTrace>, Vec<PyTrace>, Vec<usize>)> {
    no_panic("compile", || compile_stages(acquired, table, &checker, &make_proxy, &consts))
}

fn compile_stages(
    acquired: &PyTrace,
    table: &ExecutorTable,
    checker: &Bound<'_, PyAny>,
    make_proxy: &Bound<'_, PyAny>,
    consts: &Bound<'_, PyList>,
) -> PyResult<(Vec<PyTrace>, Vec<PyTrace>, Vec<usize>)> {
    let cx = PassCx::default();
    let start = Instant::now();
    py_result(verify(&acquired.trace))?;
    let (optimized, records) = py_result(run_passes(&acquired.trace, PIPELINE, &cx))?;
    let mut traces: Vec<PyTrace> = vec![PyTrace::new((*acquired.trace).clone(), "acquired").with_time(start.elapsed().as_secs_f64())];
    traces.extend(records.into_iter().map(PyTrace::from));
    let checker = Checker { checker, make_proxy, consts };

    let start = Instant::now();
    let Some(joint) = py_result(passes::joint(&optimized))? else {
        traces.push(execution(&optimized, table, &checker, None, "computation")?);
        return Ok((traces, Vec::new(), Vec::new()));
    };
    traces.push(PyTrace::new(joint.trace.clone(), "vjp").with_time(start.elapsed().as_secs_f64()));
    let start = Instant::now();
    let split = py_result(passes::split(&joint))?;
    let split_s = start.elapsed().as_secs_f64();
    traces.push(PyTrace::new(split.forward.clone(), "split").with_time(split_s));
    let (forward, records) = py_result(run_passes(&split.forward, &[("dce", dce)], &cx))?;
    traces.extend(records.into_iter().map(PyTrace::from));
    traces.push(execution(&forward, table, &checker, None, "computation")?);

    let mut backward_traces = vec![PyTrace::new(split.backward.clone(), "split").with_time(split_s)];
    let (backward, records) = py_result(run_passes(&split.backward, PIPELINE, &cx))?;
    backward_traces.extend(records.into_iter().map(PyTrace::from));
    backward_traces.push(execution(&backward, table, &checker, Some(split.residuals.len()), "backward")?);
    Ok((traces, backward_traces, grad_output_positions(&optimized)))
}

/// Claims `trace` for the executors and generates its code: the execution trace.
fn execution(trace: &trace_ir::Trace, table: &ExecutorTable, checker: &Checker, packed: Option<usize>, name: &'static str) -> PyResult<PyTrace> {
    let start = Instant::now();
    let mut check = |i: usize, bsym: &BoundSymbol| -> trace_ir::Result<bool> {
        call_checker(checker, trace, i, bsym).map_err(|e| trace_ir::IrError::new(trace_ir::ErrorKind::Runtime, bsym.symbol.qualified_name(), format!("checker failed: {e}")))
    };
    let (claimed, impls) = py_result(claim(trace, &table.executors, &mut check))?;
    let dels = lifetimes::del_last_used(&claimed, packed.unwrap_or(0));
    let exec = PyTrace::new(claimed, "execution").with_plan(Plan { impls, dels, packed, name });
    exec.source();
    Ok(exec.with_time(start.elapsed().as_secs_f64()))
}

/// Positions of the flat outputs (a single output is position 0) that receive cotangents.
fn grad_output_positions(trace: &trace_ir::Trace) -> Vec<usize> {
    let items = match &trace.outputs {
        trace_ir::Arg::Tuple(items) | trace_ir::Arg::List(items) => items.as_slice(),
        single => std::slice::from_ref(single),
    };
    let differentiable = |a: &trace_ir::Arg| a.as_value().and_then(|v| trace.tensor(v)).is_some_and(|t| t.requires_grad);
    items.iter().enumerate().filter(|(_, a)| differentiable(a)).map(|(i, _)| i).collect()
}

/// What a checker call needs besides the bound symbol and its trace.
struct Checker<'a, 'py> {
    checker: &'a Bound<'py, PyAny>,
    make_proxy: &'a Bound<'py, PyAny>,
    consts: &'a Bound<'py, PyList>,
}

/// Calls the Python checker with the executor index, the symbol's table key and its arguments.
fn call_checker(cx: &Checker, trace: &trace_ir::Trace, executor: usize, bsym: &BoundSymbol) -> PyResult<bool> {
    let py = cx.checker.py();
    let convert = |a: &trace_ir::Arg| from_arg(py, a, trace, cx.make_proxy, cx.consts);
    let args = PyTuple::new(py, bsym.call_args().iter().map(convert).collect::<PyResult<Vec<_>>>()?)?;
    let kwargs = PyDict::new(py);
    for (k, v) in &bsym.kwargs {
        kwargs.set_item(k, convert(v)?)?;
    }
    let key = match SymKey::of(&bsym.symbol) {
        SymKey::Prim(name) => name.into_pyobject(py)?.into_any(),
        SymKey::Symbol(id) => id.0.into_pyobject(py)?.into_any(),
    };
    cx.checker.call1((executor, key, args, kwargs))?.extract()
}

/// Every prim as `(name, family, promotion)`: Python derives the prim entry points, the
/// elementwise ltorch symbols (those with a promotion code) and the torch executor's table.
#[pyfunction]
pub fn prim_table() -> Vec<(&'static str, &'static str, Option<u8>)> {
    trace_ir::prims::table().into_iter().map(|p| (p.name, p.family, p.promotion)).collect()
}
