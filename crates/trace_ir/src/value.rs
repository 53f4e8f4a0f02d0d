//! Values of a trace and the arguments of bound symbols.

use crate::dtype::{DType, Device};
use crate::ids::ValueId;
use std::fmt;
use std::hash::{Hash, Hasher};

/// The metadata of a tensor value: what meta rules compute and what the cache key holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMeta {
    pub dtype: DType,
    pub device: Device,
    pub shape: Vec<i64>,
    pub requires_grad: bool,
}

impl TensorMeta {
    pub fn new(dtype: DType, device: Device, shape: Vec<i64>) -> Self {
        TensorMeta { dtype, device, shape, requires_grad: false }
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

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
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl Scalar {
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
    Tensor(TensorMeta),
    /// A number input. Numbers are specialised on their value (the value is in the cache key).
    Number(Scalar),
}

impl ValueKind {
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
    Value(ValueId),
    Scalar(Scalar),
    None,
    Ellipsis,
    Str(String),
    DType(DType),
    Device(Device),
    Tuple(Vec<Arg>),
    List(Vec<Arg>),
    Slice(Box<[Arg; 3]>),
    /// A Python object that is not representable as data, held by the Python side in a constant
    /// table of the recording and printed as `_c3`.
    PyConst(u32),
}

impl Arg {
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

    pub fn as_value(&self) -> Option<ValueId> {
        match self {
            Arg::Value(v) => Some(*v),
            _ => None,
        }
    }
}
