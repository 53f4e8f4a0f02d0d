//! The scan prims: cumulative sums, products, extrema and log-sum-exps along one dim.

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::shape::check_dims;
use super::{Binary, Creation, Elementwise, Index, Operand, Shape, Unary};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::grad::{number, Emitter, Grads};
use crate::sym::Facts;
use crate::value::{Arg, Scalar, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Inclusive scans along `dim` (0 for a 0-d tensor), keeping the input's dtype.
    pub enum Scan {
        /// `torch.cumsum`: the running sum along `dim`.
        Cumsum = "cumsum", Operands::Fixed(1), { dim: usize = "dim" };
        /// `torch.cumprod`: the running product along `dim`.
        Cumprod = "cumprod", Operands::Fixed(1), { dim: usize = "dim" };
        /// `(values, indices)`: the running maximum and the last index where it was reached.
        Cummax = "cummax", Operands::Fixed(1), { dim: usize = "dim" };
        /// `(values, indices)`: the running minimum and the last index where it was reached.
        Cummin = "cummin", Operands::Fixed(1), { dim: usize = "dim" };
        /// `torch.logcumsumexp`: `log(cumsum(exp(a)))`, computed without overflow.
        Logcumsumexp = "logcumsumexp", Operands::Fixed(1), { dim: usize = "dim" };
    }
}

impl Family for Scan {
    fn meta(&self, op: &str, operands: &[Operand], _facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let a = tensor(op, "a", &operands[0])?;
        let dim = match self {
            Scan::Cumsum { dim }
            | Scan::Cumprod { dim }
            | Scan::Cummax { dim }
            | Scan::Cummin { dim }
            | Scan::Logcumsumexp { dim } => *dim,
        };
        check_dims(op, "dim", &[dim], a.ndim().max(1))?;
        let same = TensorMeta::with_dims(a.dtype, a.device, a.shape.clone());
        match self {
            Scan::Cumsum { .. } | Scan::Cumprod { .. } if a.dtype.is_bool() => {
                bail!(Type, op, "expected a numeric tensor for a, got bool (convert it first)")
            }
            Scan::Cumsum { .. } | Scan::Cumprod { .. } => Ok(vec![same]),
            Scan::Cummax { .. } | Scan::Cummin { .. } if a.dtype.is_complex() => {
                bail!(NotImplemented, op, "not implemented for {}: expected a real tensor (argument a)", a.dtype)
            }
            Scan::Cummax { .. } | Scan::Cummin { .. } => {
                Ok(vec![same, TensorMeta::with_dims(DType::I64, a.device, a.shape.clone())])
            }
            Scan::Logcumsumexp { .. } if !a.dtype.is_inexact() => {
                bail!(Type, op, "expected a floating-point or complex tensor for a, got {}", a.dtype)
            }
            Scan::Logcumsumexp { .. } => Ok(vec![same]),
        }
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let (Some(x), Some(g)) = (operands[0].as_value(), cots[0]) else { return Ok(vec![None]) };
        let grad = match self {
            Scan::Cumsum { dim } => reversed(e, Scan::Cumsum { dim: *dim }, g, *dim)?,
            Scan::Cumprod { dim } => vjp_cumprod(e, x, outputs[0], g, *dim)?,
            Scan::Cummax { dim } | Scan::Cummin { dim } => {
                let zeros = e.zeros_like(x)?;
                e.emit(Index::ScatterAdd { dim: *dim }, vec![zeros.into(), outputs[1].into(), g.into()])?
            }
            Scan::Logcumsumexp { dim } => vjp_logcumsumexp(e, x, outputs[0], g, *dim)?,
        };
        Ok(vec![Some(grad)])
    }
}

/// `scan` run from the end of `dim` backwards (a 0-d or size-1 dim needs no flip).
fn reversed(e: &mut Emitter, scan: Scan, v: ValueId, dim: usize) -> Result<ValueId> {
    if e.meta(v).ndim() == 0 {
        return e.emit(scan, vec![v.into()]);
    }
    let flipped = e.emit(Shape::Flip { dims: vec![dim] }, vec![v.into()])?;
    let scanned = e.emit(scan, vec![flipped.into()])?;
    e.emit(Shape::Flip { dims: vec![dim] }, vec![scanned.into()])
}

/// `d y_j / d x_k = prod_{i <= j, i != k} x_i`, exact with zeros (as torch): before the first
/// zero it is `y_j / x_k`; at the first zero, the products of `x` with that zero replaced by one;
/// after it, zero.
fn vjp_cumprod(e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId, dim: usize) -> Result<ValueId> {
    let dtype = e.meta(x).dtype;
    let (zero, one) = (Arg::Scalar(number(dtype, 0.0)), Arg::Scalar(number(dtype, 1.0)));
    let is_zero = e.binary(Binary::Eq, x, zero.clone())?;
    let zeros_so_far = e.emit(Elementwise::ConvertElementType { dtype: DType::I64 }, vec![is_zero.into()])?;
    let zeros_so_far = e.emit(Scan::Cumsum { dim }, vec![zeros_so_far.into()])?;
    let before = e.binary(Binary::Eq, zeros_so_far, Arg::Scalar(Scalar::Int(0)))?;
    let first = e.binary(Binary::Eq, zeros_so_far, Arg::Scalar(Scalar::Int(1)))?;
    let first = e.binary(Binary::BitwiseAnd, first, is_zero)?;

    let gy = e.mul(g, y)?;
    let summed = reversed(e, Scan::Cumsum { dim }, gy, dim)?;
    let safe_x = e.where_(before, x, one.clone())?;
    let before_grad = e.div(summed, safe_x)?;

    let skipped = e.where_(first, one, x)?;
    let skipped = e.emit(Scan::Cumprod { dim }, vec![skipped.into()])?;
    let g_skipped = e.mul(g, skipped)?;
    let first_grad = reversed(e, Scan::Cumsum { dim }, g_skipped, dim)?;

    let rest = e.where_(first, first_grad, zero)?;
    e.where_(before, before_grad, rest)
}

/// torch's log-space rule: the positive and negative parts of `g` each go through a reversed
/// logcumsumexp, so that no `exp(x)` or `exp(-y)` overflows. A 0-d input's gradient is the
/// cotangent itself, as eager's `logcumsumexp_backward` returns it.
fn vjp_logcumsumexp(e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId, dim: usize) -> Result<ValueId> {
    let m = e.meta(g);
    if m.ndim() == 0 {
        return Ok(g);
    }
    let zero = Arg::Scalar(number(m.dtype, 0.0));
    let minus_inf = e.emit(
        Creation::Full {
            shape: m.shape.clone(),
            fill: Scalar::Float(f64::NEG_INFINITY),
            device: m.device,
            dtype: m.dtype,
        },
        vec![],
    )?;
    let part = |e: &mut Emitter, positive: bool| -> Result<ValueId> {
        let (keep, magnitude) = if positive {
            (e.binary(Binary::Gt, g, zero.clone())?, g)
        } else {
            (e.binary(Binary::Lt, g, zero.clone())?, e.unary(Unary::Neg, g)?)
        };
        let log_g = e.unary(Unary::Log, magnitude)?;
        let log_g = e.where_(keep, log_g, minus_inf)?;
        let t = e.sub(log_g, y)?;
        let t = reversed(e, Scan::Logcumsumexp { dim }, t, dim)?;
        let t = e.add(t, x)?;
        e.unary(Unary::Exp, t)
    };
    let pos = part(e, true)?;
    let neg = part(e, false)?;
    e.sub(pos, neg)
}
