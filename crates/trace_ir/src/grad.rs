//! What VJP rules are written with: an [`Emitter`] that records prims into a trace being built,
//! with the helpers the rules share (undoing broadcasts, zeros, scalars of the right type).
//!
//! The rules themselves live next to each prim's meta rule in its family file, and
//! each family's `Family::vjp` is an exhaustive `match`.

use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::prims::{Binary, Complex, Creation, Elementwise, Prim, Reduce, Shape, Unary};
use crate::sym::{Dim, Facts};
use crate::trace::TraceBuilder;
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use crate::ValueId;

/// Records the prims of a backward into a [`TraceBuilder`].
pub struct Emitter<'a> {
    /// The builder of the joint trace: a rule's prims are recorded after the forward, with their
    /// meta rules run like any recorded prim's.
    pub builder: &'a mut TraceBuilder,
}

/// One operand's gradient: `None` for operands that get none (numbers, indices, masks).
pub type Grads = Vec<Option<ValueId>>;

impl<'a> Emitter<'a> {
    /// An emitter recording into `builder`.
    pub fn new(builder: &'a mut TraceBuilder) -> Self {
        Emitter { builder }
    }

    /// The metadata of a tensor value.
    pub fn meta(&self, v: ValueId) -> TensorMeta {
        match self.builder.value(v) {
            Some(ValueKind::Tensor(t)) => t.clone(),
            other => panic!("VJP rules only ask for tensor metadata; {v} is {other:?}"),
        }
    }

    /// Records a single-output prim.
    pub fn emit(&mut self, prim: impl Into<Prim>, operands: Vec<Arg>) -> Result<ValueId> {
        let prim = prim.into();
        let name = prim.qualified_name();
        let outputs = self.builder.record(prim, operands)?;
        match outputs.as_slice() {
            [one] => Ok(*one),
            _ => bail!(Runtime, &name, "a VJP rule expected one output"),
        }
    }

    /// Records a parameterless unary prim on `a`.
    pub fn unary(&mut self, prim: Unary, a: ValueId) -> Result<ValueId> {
        self.emit(prim, vec![Arg::Value(a)])
    }

    /// Records a parameterless binary prim; either operand may be a number.
    pub fn binary(&mut self, prim: Binary, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.emit(prim, vec![a.into(), b.into()])
    }

    /// `a + b`.
    pub fn add(&mut self, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.binary(Binary::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.binary(Binary::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.binary(Binary::Mul, a, b)
    }

    /// `a / b` (true division).
    pub fn div(&mut self, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.binary(Binary::Div, a, b)
    }

    /// `-a`.
    pub fn neg(&mut self, a: ValueId) -> Result<ValueId> {
        self.unary(Unary::Neg, a)
    }

    /// `pred ? a : b` elementwise (`prims.where`).
    pub fn where_(&mut self, pred: impl Into<Arg>, a: impl Into<Arg>, b: impl Into<Arg>) -> Result<ValueId> {
        self.emit(Elementwise::Where {}, vec![pred.into(), a.into(), b.into()])
    }

    /// A tensor like `v` filled with `fill`.
    pub fn full_like(&mut self, v: ValueId, fill: f64) -> Result<ValueId> {
        let m = self.meta(v);
        let fill = number(m.dtype, fill);
        self.emit(Creation::Full { shape: m.shape, fill, device: m.device, dtype: m.dtype }, vec![])
    }

    /// A tensor of zeros with `v`'s shape, dtype and device.
    pub fn zeros_like(&mut self, v: ValueId) -> Result<ValueId> {
        self.full_like(v, 0.0)
    }

    /// `v` converted to `dtype`; `v` itself when it already has that dtype, so no call is recorded.
    /// A complex `v` converted to a real dtype is its real part (`prims.real`, as torch's
    /// `_to_copy_backward` takes it, without the conversion's warning about discarding parts).
    pub fn convert(&mut self, v: ValueId, dtype: DType) -> Result<ValueId> {
        let from = self.meta(v).dtype;
        if from == dtype {
            return Ok(v);
        }
        if from.is_complex() && !dtype.is_complex() {
            let real = self.emit(Complex::Real {}, vec![Arg::Value(v)])?;
            return self.convert(real, dtype);
        }
        self.emit(Elementwise::ConvertElementType { dtype }, vec![Arg::Value(v)])
    }

    /// The complex conjugate of `a` where it is a complex tensor; `a` itself otherwise.
    pub fn conj(&mut self, a: &Arg) -> Result<Arg> {
        match a.as_value() {
            Some(v) if self.meta(v).dtype.is_complex() => Ok(Arg::Value(self.emit(Complex::Conj {}, vec![a.clone()])?)),
            _ => Ok(a.clone()),
        }
    }

    /// `v` reshaped to `shape`; `v` itself when it already has that shape.
    pub fn reshape(&mut self, v: ValueId, shape: &[Dim]) -> Result<ValueId> {
        if self.meta(v).shape == shape {
            return Ok(v);
        }
        self.emit(Shape::Reshape { shape: shape.to_vec() }, vec![Arg::Value(v)])
    }

    /// Sums `v` over `dims` (no-op for no dims).
    pub fn sum(&mut self, v: ValueId, dims: Vec<usize>) -> Result<ValueId> {
        if dims.is_empty() {
            return Ok(v);
        }
        self.emit(Reduce::Sum { dims }, vec![Arg::Value(v)])
    }

    /// Broadcasts `v` to `shape`, its dimensions mapped to `dims`.
    pub fn broadcast(&mut self, v: ValueId, shape: &[Dim], dims: Vec<usize>) -> Result<ValueId> {
        if self.meta(v).shape == shape {
            return Ok(v);
        }
        self.emit(Shape::BroadcastInDim { shape: shape.to_vec(), dims }, vec![Arg::Value(v)])
    }

    /// Expands a reduction's result over `dims` back to `shape` (the input's shape).
    pub fn unreduce(&mut self, v: ValueId, shape: &[Dim], dims: &[usize]) -> Result<ValueId> {
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
        self.broadcast(v, shape, kept)
    }

    /// Undoes a broadcast of a value of `shape` to `g`'s shape (numpy rules: trailing dims line
    /// up): sums the added leading dims and the dims that were 1, then restores `shape`. A dim of
    /// the same size as data was not stretched, whatever its value (a count of 1 keeps the trace).
    pub fn sum_to(&mut self, g: ValueId, shape: &[Dim]) -> Result<ValueId> {
        let g_shape = self.meta(g).shape;
        let lead = g_shape.len() - shape.len();
        let facts = self.builder.facts_mut();
        let stretched = |facts: &mut Facts, s: &Dim, n: &Dim| s != n && facts.is(s, 1) && !facts.is(n, 1);
        let dims =
            (0..g_shape.len()).filter(|&d| d < lead || stretched(facts, &shape[d - lead], &g_shape[d])).collect();
        let summed = self.sum(g, dims)?;
        self.reshape(summed, shape)
    }

    /// Swaps the last two dims.
    pub fn swap_last(&mut self, v: ValueId) -> Result<ValueId> {
        let n = self.meta(v).ndim();
        let mut perm: Vec<usize> = (0..n).collect();
        perm.swap(n - 2, n - 1);
        self.emit(Shape::Transpose { perm }, vec![Arg::Value(v)])
    }

    /// A number of the kind a prim accepts next to a `dtype` tensor: float for inexact dtypes.
    pub fn scalar(&self, v: ValueId, x: f64) -> Arg {
        Arg::Scalar(number(self.meta(v).dtype, x))
    }
}

/// `x` as the number kind that meets a `dtype` tensor without promotion.
pub fn number(dtype: DType, x: f64) -> Scalar {
    if dtype.is_inexact() {
        Scalar::Float(x)
    } else if dtype.is_bool() {
        Scalar::Bool(x != 0.0)
    } else {
        Scalar::Int(x as i64)
    }
}

impl From<ValueId> for Arg {
    fn from(v: ValueId) -> Arg {
        Arg::Value(v)
    }
}

impl From<f64> for Arg {
    fn from(x: f64) -> Arg {
        Arg::Scalar(Scalar::Float(x))
    }
}
