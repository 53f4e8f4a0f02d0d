//! Values of a trace and the arguments of bound symbols.

use crate::dtype::{DType, Device};
use crate::ids::ValueId;
use std::fmt;
use std::hash::{Hash, Hasher};

/// The metadata of a tensor value: what meta rules compute and what the cache key holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    /// The element type.
    pub dtype: DType,
    /// Where the storage lives; prims require their tensor operands on one device.
    pub device: Device,
    /// The size of each dimension, outermost first; empty for a 0-d tensor. Sizes are static: a
    /// size that changes between calls is a cache miss.
    pub shape: Vec<i64>,
    /// Whether autodiff flows through this value: set on inputs by the caller and propagated by
    /// the recorder to outputs of differentiable calls, as torch's `requires_grad`.
    pub requires_grad: bool,
}

impl TensorMeta {
    /// A tensor that does not require grad.
    pub fn new(dtype: DType, device: Device, shape: Vec<i64>) -> Self {
        TensorMeta { dtype, device, shape, requires_grad: false }
    }

    /// The number of dimensions (`Tensor.ndim`).
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements: the product of the sizes, 1 for a 0-d tensor.
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
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
    /// A number input. Numbers are specialised on their value (the value is in the cache key).
    Number(Scalar),
}

impl ValueKind {
    /// The tensor's metadata; `None` for a number.
    pub fn as_tensor(&self) -> Option<&TensorMeta> {
        match self {
            ValueKind::Tensor(t) => Some(t),
            ValueKind::Number(_) => None,
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

    /// Calls `f` on every value this argument refers to, in order.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        match self {
            Arg::Value(v) => f(*v),
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
