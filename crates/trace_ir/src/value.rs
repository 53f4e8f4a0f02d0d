//! Values of a trace and the arguments of bound symbols.

use crate::dtype::{DType, Device};
use crate::ids::ValueId;
use crate::sym::{Dim, SymDim};
use crate::symfloat::SymFloat;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// The metadata of a tensor value: what meta rules compute and what the cache key holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// The element type.
    pub dtype: DType,
    /// Where the storage lives; prims require their tensor operands on one device.
    pub device: Device,
    /// The size of each dimension, outermost first; empty for a 0-d tensor. A size is a constant
    /// (a different size is a cache miss) or symbolic: an expression over the trace's size values,
    /// computed when the program runs (see [`crate::sym`]).
    pub shape: Vec<Dim>,
    /// Whether autodiff flows through this value: set on inputs by the caller and propagated by
    /// the recorder to outputs of differentiable calls, as torch's `requires_grad`.
    pub requires_grad: bool,
}

impl TensorMeta {
    /// A tensor of constant sizes that does not require grad.
    pub fn new(dtype: DType, device: Device, shape: Vec<i64>) -> Self {
        TensorMeta::with_dims(dtype, device, crate::sym::consts(&shape))
    }

    /// A tensor of these sizes, constant or symbolic, that does not require grad.
    pub fn with_dims(dtype: DType, device: Device, shape: Vec<Dim>) -> Self {
        TensorMeta { dtype, device, shape, requires_grad: false }
    }

    /// The sizes as they were when the trace was recorded (each symbolic size's hint).
    pub fn hints(&self) -> Vec<i64> {
        crate::sym::hints(&self.shape)
    }

    /// Whether some size is symbolic.
    pub fn is_symbolic(&self) -> bool {
        self.shape.iter().any(Dim::is_sym)
    }

    /// The number of dimensions (`Tensor.ndim`).
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements: the product of the sizes, 1 for a 0-d tensor.
    pub fn numel(&self) -> Dim {
        Dim::product(&self.shape)
    }

    /// The number of elements when the trace was recorded.
    pub fn numel_hint(&self) -> i64 {
        self.shape.iter().map(Dim::hint).product()
    }

    /// `cpu f32[8, 8]`: the type comment of traces.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
        format!("{} {}[{}]", self.device, self.dtype, dims.join(", "))
    }
}

/// A Python number constant. Floats hash and compare by bits so that CSE can key on them.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    /// A Python `bool`.
    Bool(bool),
    /// A Python `int` (in `i64` range).
    Int(i64),
    /// A Python `float`.
    Float(f64),
}

impl Scalar {
    /// The number as a float, `True` as 1.0: for rules that compute with it (`uniform`'s bounds
    /// check, `var`'s gradient scale).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => b as i64 as f64,
            Scalar::Int(i) => i as f64,
            Scalar::Float(x) => x,
        }
    }

    /// The Python type name: `bool`, `int`, `float`.
    pub fn type_name(self) -> &'static str {
        match self {
            Scalar::Bool(_) => "bool",
            Scalar::Int(_) => "int",
            Scalar::Float(_) => "float",
        }
    }
}

impl PartialEq for Scalar {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Scalar::Bool(a), Scalar::Bool(b)) => a == b,
            (Scalar::Int(a), Scalar::Int(b)) => a == b,
            (Scalar::Float(a), Scalar::Float(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for Scalar {}

impl Hash for Scalar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            Scalar::Bool(b) => b.hash(state),
            Scalar::Int(i) => i.hash(state),
            Scalar::Float(x) => x.to_bits().hash(state),
        }
    }
}

impl fmt::Display for Scalar {
    /// Prints valid Python: `True`, `3`, `2.5`, `float('inf')`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(true) => f.write_str("True"),
            Scalar::Bool(false) => f.write_str("False"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) if x.is_nan() => f.write_str("float('nan')"),
            Scalar::Float(x) if x.is_infinite() => f.write_str(if *x > 0.0 { "float('inf')" } else { "float('-inf')" }),
            Scalar::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// What a value of a trace is.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind {
    /// A tensor with its metadata.
    Tensor(TensorMeta),
    /// A number input, with its value when recorded: a float argument that changes between
    /// calls, which symbolic floats read ([`crate::symfloat::FloatExpr::Input`]) and each call
    /// passes as the caller's float.
    Number(Scalar),
    /// An int that is a size read from the inputs and may change between calls (the symbolic
    /// sizes of [`crate::sym`] are expressions over these), with its value when recorded.
    Size(i64),
}

impl ValueKind {
    /// The same kind with the size values its symbolic sizes read renamed by `f` (a pass that
    /// renumbers values).
    pub fn renamed(&self, f: &impl Fn(ValueId) -> ValueId) -> ValueKind {
        match self {
            ValueKind::Tensor(t) if t.is_symbolic() => {
                let shape = t.shape.iter().map(|d| d.renamed(f)).collect();
                ValueKind::Tensor(TensorMeta { shape, ..t.clone() })
            }
            other => other.clone(),
        }
    }

    /// The tensor's metadata; `None` for a number.
    pub fn as_tensor(&self) -> Option<&TensorMeta> {
        match self {
            ValueKind::Tensor(t) => Some(t),
            ValueKind::Number(_) | ValueKind::Size(_) => None,
        }
    }
}

/// The keyword arguments of a call, in the order given.
pub type Kwargs = Vec<(String, Arg)>;

/// An argument of a bound symbol: a value of the trace or a literal.
///
/// Prims hold their parameters in the [`crate::Prim`] variant and use `Arg` only for tensor and
/// number operands; composites and fallbacks keep their arguments as the caller gave them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Arg {
    /// A value of the trace, printed by its name (`t3`).
    Value(ValueId),
    /// A number literal, printed as Python prints it.
    Scalar(Scalar),
    /// A symbolic int: an expression over size values, printed as Python (`2*t3 + 1`).
    Sym(Arc<SymDim>),
    /// A symbolic float: Python float operations over sizes, printed as Python (`(t3 ** -0.5)`)
    /// and computed by the program on each call as eager computes it (see [`crate::symfloat`]).
    SymFloat(Arc<SymFloat>),
    /// Python's `None`.
    None,
    /// Python's `...` (in indexing arguments).
    Ellipsis,
    /// A string literal (`reduction="mean"`).
    Str(String),
    /// A dtype literal, printed `torch.float32`.
    DType(DType),
    /// A device literal, printed `torch.device('cuda:0')` (or by name in generated code).
    Device(Device),
    /// A Python tuple of arguments (shapes, dims, several tensors).
    Tuple(Vec<Arg>),
    /// A Python list of arguments, kept apart from a tuple because torch functions can tell them
    /// apart (`torch.cat` takes either; an index list is not an index tuple).
    List(Vec<Arg>),
    /// A Python `slice(start, stop, step)`, each part `None`, a number or a value.
    Slice(Box<[Arg; 3]>),
    /// A Python object that is not representable as data, held by the Python side in a constant
    /// table of the recording and printed as `_c3`.
    PyConst(u32),
}

impl Arg {
    /// A tuple of int literals: how shapes and dims are passed to composites.
    pub fn ints(values: &[i64]) -> Arg {
        Arg::Tuple(values.iter().map(|&i| Arg::Scalar(Scalar::Int(i))).collect())
    }

    /// A size as an argument: an int literal, or a symbolic int.
    pub fn dim(d: &Dim) -> Arg {
        match d {
            Dim::Const(c) => Arg::Scalar(Scalar::Int(*c)),
            Dim::Sym(s) => Arg::Sym(s.clone()),
        }
    }

    /// A tuple of sizes: how symbolic shapes are passed to composites.
    pub fn dims(dims: &[Dim]) -> Arg {
        Arg::Tuple(dims.iter().map(Arg::dim).collect())
    }

    /// Calls `f` on every value this argument refers to, in order.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        match self {
            Arg::Value(v) => f(*v),
            Arg::Sym(s) => s.expr.for_each_value(f),
            Arg::SymFloat(s) => s.expr.for_each_value(f),
            Arg::Tuple(items) | Arg::List(items) => items.iter().for_each(|a| a.for_each_value(f)),
            Arg::Slice(parts) => parts.iter().for_each(|a| a.for_each_value(f)),
            _ => {}
        }
    }

    /// The same argument with every value replaced by `f(value)`.
    pub fn map_values(&self, f: &mut impl FnMut(ValueId) -> Arg) -> Arg {
        match self {
            Arg::Value(v) => f(*v),
            Arg::Tuple(items) => Arg::Tuple(items.iter().map(|a| a.map_values(f)).collect()),
            Arg::List(items) => Arg::List(items.iter().map(|a| a.map_values(f)).collect()),
            Arg::Slice(parts) => {
                Arg::Slice(Box::new([parts[0].map_values(f), parts[1].map_values(f), parts[2].map_values(f)]))
            }
            Arg::Sym(s) => {
                Arg::dim(&Dim::from_poly(s.expr.substitute(&mut |v| crate::sym::arg_poly(&f(v), v)), s.hint))
            }
            Arg::SymFloat(s) => Arg::SymFloat(Arc::new(SymFloat {
                expr: s
                    .expr
                    .renamed(&mut |v| crate::sym::arg_poly(&f(v), v))
                    .map_inputs(&mut |v| f(v).as_value().unwrap_or(v)),
                hint: s.hint,
            })),
            other => other.clone(),
        }
    }

    /// The value this argument is, if it is one (not one nested in a tuple).
    pub fn as_value(&self) -> Option<ValueId> {
        match self {
            Arg::Value(v) => Some(*v),
            _ => None,
        }
    }
}
