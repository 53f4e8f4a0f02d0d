//! Conversions between Python objects and IR arguments.
//!
//! Python registers, once, the proxy class and torch's dtype and device types
//! ([`configure`]); a recording then converts each call's arguments in one pass.

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PySlice, PyString, PyTuple, PyType};
use std::sync::Arc;
use trace_ir::{Arg, DType, Device, FloatExpr, FloatFn, FloatOp, Scalar, SymFloat, TensorMeta, ValueId};
use trace_ir::{Trace, ValueKind};

use crate::errors::py_result;

/// The Python types a conversion recognises.
pub struct Types {
    proxy: Py<PyType>,
    dtype: Py<PyType>,
    device: Py<PyType>,
    /// `{torch.float32: code, ...}`.
    dtype_codes: Py<PyDict>,
    /// Python's wrapper of a symbolic size (`SymInt`, holding a `SymExpr` as `expr`).
    symint: Option<Py<PyType>>,
    /// Python's symbolic float (`SymFloat(ops, hint)`, see [`float_expr`]).
    symfloat: Option<Py<PyType>>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

/// Registers the proxy class and torch's dtype/device types; called once by `thunder_rs`.
#[pyfunction]
#[pyo3(signature = (proxy, dtype, device, dtype_codes, symint=None, symfloat=None))]
pub fn configure(
    py: Python<'_>,
    proxy: Py<PyType>,
    dtype: Py<PyType>,
    device: Py<PyType>,
    dtype_codes: Py<PyDict>,
    symint: Option<Py<PyType>>,
    symfloat: Option<Py<PyType>>,
) -> PyResult<()> {
    TYPES
        .set(py, Types { proxy, dtype, device, dtype_codes, symint, symfloat })
        .map_err(|_| PyRuntimeError::new_err("thunder_rs._core.configure was called twice"))
}

pub fn types(py: Python<'_>) -> PyResult<&Types> {
    TYPES.get(py).ok_or_else(|| PyRuntimeError::new_err("thunder_rs._core.configure was not called"))
}

/// Converts a Python value to an argument; objects that are not data go to `consts`.
pub fn to_arg(obj: &Bound<'_, PyAny>, types: &Types, consts: &mut Vec<Py<PyAny>>) -> PyResult<Arg> {
    let py = obj.py();
    if obj.is_instance(types.proxy.bind(py))? {
        return Ok(Arg::Value(ValueId(obj.getattr("_vid")?.extract()?)));
    }
    if obj.is_none() {
        return Ok(Arg::None);
    }
    if let Ok(s) = obj.cast::<crate::sizes::PySymExpr>() {
        return Ok(Arg::dim(&trace_ir::Dim::Sym(s.get().dim.clone())));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Arg::Scalar(Scalar::Bool(b.is_true())));
    }
    // A subclass of int or float is read through its own `__index__`/`__float__`: a number the
    // program must not use (a traced draw from `random`, see `pydraws.py`) raises there, where
    // reading the C value directly would bake it into the trace. An int past int64 (a product of
    // sizes returned, as eager's Python int holds it) is kept as the Python object, as other
    // constants are.
    if obj.is_exact_instance_of::<PyInt>() {
        if let Ok(n) = obj.extract() {
            return Ok(Arg::Scalar(Scalar::Int(n)));
        }
    } else if obj.is_instance_of::<PyInt>() {
        return Ok(Arg::Scalar(Scalar::Int(obj.call_method0("__index__")?.extract()?)));
    }
    if let Ok(f) = obj.cast_exact::<PyFloat>() {
        return Ok(Arg::Scalar(Scalar::Float(f.value())));
    }
    if obj.is_instance_of::<PyFloat>() {
        return Ok(Arg::Scalar(Scalar::Float(obj.call_method0("__float__")?.extract()?)));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(Arg::Tuple(t.iter().map(|x| to_arg(&x, types, consts)).collect::<PyResult<_>>()?));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(Arg::List(l.iter().map(|x| to_arg(&x, types, consts)).collect::<PyResult<_>>()?));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Arg::Str(s.to_str()?.to_string()));
    }
    if let Ok(s) = obj.cast::<PySlice>() {
        let mut part = |name: &str| -> PyResult<Arg> { to_arg(&s.getattr(name)?, types, consts) };
        return Ok(Arg::Slice(Box::new([part("start")?, part("stop")?, part("step")?])));
    }
    if obj.is(py.Ellipsis()) {
        return Ok(Arg::Ellipsis);
    }
    if obj.is_instance(types.dtype.bind(py))? {
        return Ok(Arg::DType(dtype_of(obj, types)?));
    }
    if obj.is_instance(types.device.bind(py))? {
        return Ok(Arg::Device(py_result(Device::parse(&obj.str()?.to_string()))?));
    }
    if let Some(symint) = &types.symint {
        if obj.is_instance(symint.bind(py))? {
            return to_arg(&obj.getattr("expr")?, types, consts);
        }
    }
    if let Some(symfloat) = &types.symfloat {
        if obj.is_instance(symfloat.bind(py))? {
            let expr = float_expr(&obj.getattr("ops")?)?;
            return Ok(Arg::SymFloat(Arc::new(SymFloat::new(expr, obj.getattr("hint")?.extract()?))));
        }
    }
    consts.push(obj.clone().unbind());
    Ok(Arg::PyConst(consts.len() as u32 - 1))
}

/// A symbolic float's operations from Python's form of them (`SymFloat.ops`): an int, a float
/// or a `SymExpr` for an operand, `(op, a, b)` for an operation (`op` its Python operator,
/// `"+"`, `"**"`), `("arg", value id, hint)` for a float input, `("neg", a)` for a negation, `("sqrt", a)` for a square root, `("log", a)` for a function of
/// `math` (`FloatFn`).
fn float_expr(node: &Bound<'_, PyAny>) -> PyResult<FloatExpr> {
    if let Ok(s) = node.cast::<crate::sizes::PySymExpr>() {
        return Ok(FloatExpr::Int(trace_ir::Dim::Sym(s.get().dim.clone())));
    }
    if node.is_exact_instance_of::<PyInt>() {
        return Ok(FloatExpr::Int(trace_ir::Dim::Const(node.extract()?)));
    }
    if let Ok(f) = node.cast_exact::<PyFloat>() {
        return Ok(FloatExpr::Float(f.value()));
    }
    let Ok(parts) = node.cast::<PyTuple>() else {
        return Err(PyTypeError::new_err(format!("not a symbolic float's operation: {node}")));
    };
    let op: String = parts.get_item(0)?.extract()?;
    if op == "arg" {
        let v: u32 = parts.get_item(1)?.extract()?;
        return Ok(FloatExpr::Input(ValueId(v), parts.get_item(2)?.extract()?));
    }
    if op == "neg" {
        return Ok(FloatExpr::Neg(Box::new(float_expr(&parts.get_item(1)?)?)));
    }
    if op == "sqrt" {
        return Ok(FloatExpr::Sqrt(Box::new(float_expr(&parts.get_item(1)?)?)));
    }
    if let Some(func) = FloatFn::from_name(&op) {
        return Ok(FloatExpr::Math(func, Box::new(float_expr(&parts.get_item(1)?)?)));
    }
    let op = FloatOp::ALL
        .into_iter()
        .find(|o| o.symbol() == op)
        .ok_or_else(|| PyTypeError::new_err(format!("not a float operation: {op}")))?;
    Ok(FloatExpr::bin(op, float_expr(&parts.get_item(1)?)?, float_expr(&parts.get_item(2)?)?))
}

/// Python's form of a symbolic float's operations (the inverse of [`float_expr`]).
fn float_node<'py>(py: Python<'py>, e: &FloatExpr) -> PyResult<Bound<'py, PyAny>> {
    Ok(match e {
        FloatExpr::Int(d) => crate::sizes::dim_to_py(py, d)?,
        FloatExpr::Float(x) => x.into_pyobject(py)?.into_any(),
        FloatExpr::Input(v, x) => PyTuple::new(
            py,
            [PyString::new(py, "arg").into_any(), v.0.into_pyobject(py)?.into_any(), x.into_pyobject(py)?.into_any()],
        )?
        .into_any(),
        FloatExpr::Neg(a) | FloatExpr::Sqrt(a) => {
            let name = if matches!(e, FloatExpr::Neg(_)) { "neg" } else { "sqrt" };
            PyTuple::new(py, [PyString::new(py, name).into_any(), float_node(py, a)?])?.into_any()
        }
        FloatExpr::Math(func, a) => {
            PyTuple::new(py, [PyString::new(py, func.name()).into_any(), float_node(py, a)?])?.into_any()
        }
        FloatExpr::Bin(op, a, b) => {
            PyTuple::new(py, [PyString::new(py, op.symbol()).into_any(), float_node(py, a)?, float_node(py, b)?])?
                .into_any()
        }
    })
}

pub fn dtype_of(obj: &Bound<'_, PyAny>, types: &Types) -> PyResult<DType> {
    let code: u8 = types
        .dtype_codes
        .bind(obj.py())
        .get_item(obj)?
        .ok_or_else(|| PyTypeError::new_err(format!("thunder_rs does not support the dtype {obj}")))?
        .extract()?;
    DType::from_code(code).ok_or_else(|| PyTypeError::new_err(format!("bad dtype code {code}")))
}

pub fn to_args(seq: &Bound<'_, PyTuple>, types: &Types, consts: &mut Vec<Py<PyAny>>) -> PyResult<Vec<Arg>> {
    seq.iter().map(|x| to_arg(&x, types, consts)).collect()
}

pub fn to_kwargs(
    kwargs: Option<&Bound<'_, PyDict>>,
    types: &Types,
    consts: &mut Vec<Py<PyAny>>,
) -> PyResult<Vec<(String, Arg)>> {
    let Some(kwargs) = kwargs else { return Ok(Vec::new()) };
    kwargs.iter().map(|(k, v)| Ok((k.extract::<String>()?, to_arg(&v, types, consts)?))).collect()
}

/// `(dtype_code, device, shape, requires_grad)` from Python into a tensor's metadata.
pub fn tensor_meta(code: u8, device: &str, shape: Vec<i64>, requires_grad: bool) -> PyResult<TensorMeta> {
    let dtype = DType::from_code(code).ok_or_else(|| PyTypeError::new_err(format!("bad dtype code {code}")))?;
    let device = py_result(Device::parse(device))?;
    Ok(TensorMeta { dtype, device, shape: trace_ir::sym::consts(&shape), requires_grad })
}

/// Converts an argument back to Python for a checker: tensor values become proxies made by
/// `make_proxy(vid, shape, dtype_code, device, requires_grad)`, constants come from `consts`.
pub fn from_arg<'py>(
    py: Python<'py>,
    arg: &Arg,
    trace: &Trace,
    make_proxy: &Bound<'py, PyAny>,
    consts: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyAny>> {
    to_py(py, arg, &mut |leaf| match leaf {
        Arg::Value(v) => match trace.value(*v) {
            ValueKind::Tensor(t) => make_proxy.call1((
                v.0,
                crate::sizes::shape_to_py(py, &t.shape)?,
                t.dtype.code(),
                t.device.to_string(),
                t.requires_grad,
            )),
            ValueKind::Number(n) => from_arg(py, &Arg::Scalar(*n), trace, make_proxy, consts),
            ValueKind::Size(hint) => crate::sizes::dim_to_py(py, &trace_ir::Dim::size(*v, *hint)),
        },
        Arg::PyConst(i) => consts.get_item(*i as usize),
        other => Err(PyTypeError::new_err(format!("not a leaf argument: {other:?}"))),
    })
}

/// An argument as Python data; `leaf` converts the values and Python constants in it (`Arg::Value`
/// and `Arg::PyConst`), which only the caller knows how to show.
pub fn to_py<'py>(
    py: Python<'py>,
    arg: &Arg,
    leaf: &mut dyn FnMut(&Arg) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let types = types(py)?;
    let mut seq =
        |items: &[Arg]| -> PyResult<Vec<Bound<'py, PyAny>>> { items.iter().map(|a| to_py(py, a, leaf)).collect() };
    Ok(match arg {
        Arg::Value(_) | Arg::PyConst(_) => leaf(arg)?,
        Arg::Scalar(Scalar::Bool(b)) => PyBool::new(py, *b).to_owned().into_any(),
        Arg::Scalar(Scalar::Int(i)) => i.into_pyobject(py)?.into_any(),
        Arg::Scalar(Scalar::Float(x)) => x.into_pyobject(py)?.into_any(),
        Arg::None => py.None().into_bound(py),
        Arg::Ellipsis => py.Ellipsis().into_bound(py),
        Arg::Str(s) => PyString::new(py, s).into_any(),
        Arg::DType(d) => {
            let codes = types.dtype_codes.bind(py);
            let found = codes.iter().find(|(_, code)| code.extract::<u8>().ok() == Some(d.code()));
            found.map(|(dtype, _)| dtype).ok_or_else(|| PyTypeError::new_err(format!("unknown dtype {d}")))?
        }
        Arg::Device(d) => types.device.bind(py).call1((d.to_string(),))?,
        Arg::Tuple(items) => PyTuple::new(py, seq(items)?)?.into_any(),
        Arg::List(items) => PyList::new(py, seq(items)?)?.into_any(),
        Arg::Slice(parts) => py.get_type::<PySlice>().call1(PyTuple::new(py, seq(&parts[..])?)?)?,
        Arg::Sym(s) => crate::sizes::dim_to_py(py, &trace_ir::Dim::Sym(s.clone()))?,
        Arg::SymFloat(s) => {
            let symfloat = types.symfloat.as_ref().ok_or_else(|| PyRuntimeError::new_err("no SymFloat registered"))?;
            symfloat.bind(py).call1((float_node(py, &s.expr)?, s.hint.0))?
        }
    })
}
