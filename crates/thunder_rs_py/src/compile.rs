//! The compile entry point: converts the checker callback, and runs
//! the pipeline's table (`passes::pipeline::PIPELINE`, every stage) through `passes::compile`.

use passes::{Checkpoint, Options, PassCx, SymKey};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use trace_ir::{BoundSymbol, ValueId};

use crate::convert::from_arg;
use crate::errors::{no_panic, py_result};
use crate::records::{Compiled, PrimInfo};
use crate::table::ExecutorTable;
use crate::trace::PyTrace;

/// Runs the pipeline (`passes::pipeline::PIPELINE`) on an acquired trace. For entries that have a
/// checker, `checker(executor_index, symbol_key, args, kwargs)` is called with the bound symbol's
/// arguments (tensors as proxies made by `make_proxy`, constants from `consts`). `passes` names
/// registered passes, each run at the `jit passes` row of the half it declares (`program`, after
/// the program's dce and cse, unless declared otherwise).
///
/// `differentiable` compiles the program to run under torch's autograd instead
/// (`passes::differentiable`): no backward, no in-place forms, values computed without grad detached.
/// `checkpoints` are the reentrant activation checkpoints the program ran, `(first value id, end
/// value id, ids of the tensors passed, the user's location of the call)` each, whose gradients the backward sums as eager does.
/// `recomputed` are the non-reentrant ones, `(first value id, end value id)` each, whose calls the
/// backward runs again instead of saving what they define (`passes::split`).
///
/// Returns a `Compiled`: the traces after each stage, the last being the execution trace whose
/// `str()` is the Python source to exec; for a program with an output that requires grad, the
/// backward's traces likewise (else none), and the positions of the flat outputs that receive
/// cotangents.
#[pyfunction]
#[pyo3(signature = (acquired, table, checker, make_proxy, consts, passes=Vec::new(), differentiable=false, checkpoints=Vec::new(), recomputed=Vec::new()))]
#[allow(clippy::too_many_arguments)] // (the Python signature's)
pub fn compile(
    acquired: &PyTrace,
    table: &ExecutorTable,
    checker: Bound<'_, PyAny>,
    make_proxy: Bound<'_, PyAny>,
    consts: Bound<'_, PyList>,
    passes: Vec<String>,
    differentiable: bool,
    checkpoints: Vec<CheckpointSpec>,
    recomputed: Vec<(usize, usize)>,
) -> PyResult<Compiled> {
    let checkpoints = to_checkpoints(checkpoints);
    let recomputed: Vec<_> = recomputed.into_iter().map(|(start, end)| start..end).collect();
    let options = Options {
        executors: &table.executors,
        passes: &passes,
        differentiable,
        absent_cotangents: &[],
        checkpoints: &checkpoints,
        recomputed: &recomputed,
    };
    run(acquired, &options, checker, make_proxy, consts)
}

/// A reentrant checkpoint as Python gives it: `(first value id, end value id, ids of the tensors
/// passed, the user's location of the call)`.
type CheckpointSpec = (usize, usize, Vec<u32>, String);

fn to_checkpoints(specs: Vec<CheckpointSpec>) -> Vec<Checkpoint> {
    let checkpoint = |(start, end, inputs, location): CheckpointSpec| Checkpoint {
        values: start..end,
        inputs: inputs.into_iter().map(ValueId).collect(),
        location,
    };
    specs.into_iter().map(checkpoint).collect()
}

/// Compiles the backward alone (`Compiled.forward` is the program half's stages), as `compile`
/// would, for a backward that reaches only some of the program's outputs: `absent_cotangents`
/// are the indices, among the cotangents, of those it does not reach. No gradient flows from
/// them, as in eager's autograd (`passes::vjp::joint_without`: an op's backward gets None for
/// them), and the backward runs from the residuals the whole forward saves; where it needs a
/// value those cannot give, the whole backward is pruned of what only they reach
/// (`passes::absent`). Raises NotImplementedError where that fails too (the caller then passes
/// zeros to the whole backward).
#[pyfunction]
#[pyo3(signature = (acquired, table, checker, make_proxy, consts, passes, absent_cotangents, checkpoints=Vec::new(), recomputed=Vec::new()))]
#[allow(clippy::too_many_arguments)] // (the Python signature's)
pub fn compile_backward(
    acquired: &PyTrace,
    table: &ExecutorTable,
    checker: Bound<'_, PyAny>,
    make_proxy: Bound<'_, PyAny>,
    consts: Bound<'_, PyList>,
    passes: Vec<String>,
    absent_cotangents: Vec<usize>,
    checkpoints: Vec<CheckpointSpec>,
    recomputed: Vec<(usize, usize)>,
) -> PyResult<Compiled> {
    let recomputed: Vec<_> = recomputed.into_iter().map(|(start, end)| start..end).collect();
    let absent_cotangents = absent_cotangents.as_slice();
    if absent_cotangents.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err("compile_backward: no absent cotangent"));
    }
    let checkpoints = to_checkpoints(checkpoints);
    let options = Options {
        executors: &table.executors,
        passes: &passes,
        differentiable: false,
        absent_cotangents,
        checkpoints: &checkpoints,
        recomputed: &recomputed,
    };
    run(acquired, &options, checker, make_proxy, consts)
}

/// Runs `passes::compile` with `options`, the checker's Python errors kept (see `checked`).
fn run(
    acquired: &PyTrace,
    options: &Options,
    checker: Bound<'_, PyAny>,
    make_proxy: Bound<'_, PyAny>,
    consts: Bound<'_, PyList>,
) -> PyResult<Compiled> {
    let py = checker.py();
    no_panic("compile", || {
        let cx = py_result(PassCx::from_env())?;
        let checker = Checker { checker: &checker, make_proxy: &make_proxy, consts: &consts };
        let mut raised = None;
        let mut check = |i: usize, trace: &trace_ir::Trace, bsym: &BoundSymbol| -> trace_ir::Result<bool> {
            call_checker(&checker, trace, i, bsym).map_err(|e| {
                let message = format!("checker failed: {e}");
                raised.get_or_insert(e);
                trace_ir::IrError::new(trace_ir::ErrorKind::Runtime, bsym.symbol.qualified_name(), message)
            })
        };
        let compiled = passes::compile(&acquired.trace, options, &mut check, &cx);
        let compiled = checked(py, py_result(compiled), raised)?;
        let convert = |records: Vec<passes::PassRecord>| records.into_iter().map(PyTrace::from).collect();
        Compiled::new(py, convert(compiled.forward), convert(compiled.backward), compiled.grad_outputs)
    })
}

/// The compile's result given the first error a checker raised: that error itself when it is
/// no `Exception` (Ctrl-C's `KeyboardInterrupt`, `SystemExit`), whatever the passes made of it;
/// else the compile's error, caused by it (`raise ... from e`).
fn checked<T>(py: Python<'_>, result: PyResult<T>, raised: Option<PyErr>) -> PyResult<T> {
    match (result, raised) {
        (_, Some(original)) if !original.is_instance_of::<PyException>(py) => Err(original),
        (Err(err), Some(original)) => {
            err.set_cause(py, Some(original));
            Err(err)
        }
        (result, _) => result,
    }
}

/// The names of the registered passes, which `jit(fn, passes=[...])` can name.
#[pyfunction]
pub fn registered_passes() -> Vec<String> {
    passes::registered()
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
    // Python's registries key a prim by its name.
    let key = match SymKey::of(&bsym.symbol) {
        Some(SymKey::Prim(prim)) => prim.name().into_pyobject(py)?.into_any(),
        Some(SymKey::Symbol(id)) => id.0.into_pyobject(py)?.into_any(),
        None => bsym.symbol.qualified_name().into_pyobject(py)?.into_any(),
    };
    cx.checker.call1((executor, key, args, kwargs))?.extract()
}

/// Every prim's `PrimInfo`: Python derives the prim entry points, the elementwise ltorch
/// symbols (those with a promotion code) and the torch executor's table.
#[pyfunction]
pub fn prim_table() -> Vec<PrimInfo> {
    trace_ir::prims::table().into_iter().map(PrimInfo::from).collect()
}
