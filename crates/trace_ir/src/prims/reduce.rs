//! The reduction prims.

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::shape::check_dims;
use super::{Binary, Operand};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, Scalar, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Reductions over canonical dims (no dims: nothing is reduced).
    pub enum Reduce {
        /// `torch.sum(a, dims)`.
        Sum = "sum", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
        /// The product over `dims`.
        Prod = "prod", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
        /// `torch.amax(a, dims)`: the maximum over `dims` (NaN if any element is).
        Amax = "amax", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
        /// `torch.amin(a, dims)`: the minimum over `dims`.
        Amin = "amin", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
        /// `torch.var(a, dims, correction=correction)`: the mean squared deviation, its divisor the
        /// count minus `correction`.
        Var = "var", Operands::Fixed(1), { dims: Vec<usize> = "dims", correction: Scalar = "correction" };
        /// `(var, mean)`.
        VarMean = "var_mean", Operands::Fixed(1), { dims: Vec<usize> = "dims", correction: Scalar = "correction" };
        /// The index of the maximum along `dim`, or in the flattened tensor when `dim` is `None`.
        Argmax = "argmax", Operands::Fixed(1), { dim: Option<usize> = "dim" };
        /// The index of the minimum along `dim`, or in the flattened tensor when `dim` is `None`.
        Argmin = "argmin", Operands::Fixed(1), { dim: Option<usize> = "dim" };
    }
}

impl Family for Reduce {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        meta(self, op, operands, facts)
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        match operands[0].as_value() {
            Some(x) => vjp(self, e, x, outputs, cots),
            None => Ok(vec![None]),
        }
    }
}

fn meta(prim: &Reduce, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    let a = tensor(op, "a", &operands[0])?;
    let reduced_over = |what: &str, dims: &[usize]| -> Result<Vec<Dim>> {
        check_dims(op, what, dims, a.ndim())?;
        Ok(a.shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, s)| s.clone()).collect())
    };
    let reduced = |dims: &[usize]| reduced_over("dims", dims);
    let out = |dtype: DType, shape: Vec<Dim>| TensorMeta::with_dims(dtype, a.device, shape);
    match prim {
        Reduce::Sum { dims } | Reduce::Prod { dims } => Ok(vec![out(a.dtype, reduced(dims)?)]),
        Reduce::Amax { dims } | Reduce::Amin { dims } => {
            if let Some(&d) = dims.iter().find(|&&d| d < a.ndim() && facts.is(&a.shape[d], 0)) {
                bail!(Index, op, "cannot reduce dimension {d} of size 0 (argument dims)");
            }
            Ok(vec![out(a.dtype, reduced(dims)?)])
        }
        Reduce::Var { dims, .. } | Reduce::VarMean { dims, .. } => {
            if !a.dtype.is_inexact() {
                bail!(Type, op, "expected a floating-point or complex tensor for a, got {}", a.dtype);
            }
            let shape = reduced(dims)?;
            let var = out(a.dtype.to_real(), shape.clone());
            match prim {
                Reduce::Var { .. } => Ok(vec![var]),
                _ => Ok(vec![var, out(a.dtype, shape)]),
            }
        }
        Reduce::Argmax { dim } | Reduce::Argmin { dim } => {
            let shape = match dim {
                Some(d) => {
                    let shape = reduced_over("dim", &[*d])?;
                    if facts.is(&a.shape[*d], 0) {
                        bail!(Index, op, "cannot reduce dimension {d} of size 0 (argument dim)");
                    }
                    shape
                }
                None if facts.is(&a.numel(), 0) => {
                    bail!(Index, op, "cannot reduce a, an empty tensor {}, with dim=None", show(&a.shape))
                }
                None => vec![],
            };
            Ok(vec![out(DType::I64, shape)])
        }
    }
}

// ---------------------------------------------------------------------------------- VJP rules

/// d prod / d x_i, the product of the other elements, as eager computes it: `prod / x_i` where
/// no element is zero (eager's `grad * (result / input)`); with zeros, at a zero the product of
/// the nonzero elements when it is the only zero, and 0 everywhere else (prod / x gave NaN).
fn product_of_the_others(e: &mut Emitter, x: ValueId, y: ValueId, shape: &[Dim], dims: &[usize]) -> Result<ValueId> {
    let (zero, one) = (e.scalar(x, 0.0), e.scalar(x, 1.0));
    let is_zero = e.binary(Binary::Eq, x, zero.clone())?;
    let zeros = e.convert(is_zero, e.meta(x).dtype)?;
    let zeros = e.sum(zeros, dims.to_vec())?;
    let zeros = e.unreduce(zeros, shape, dims)?;
    let nonzero_x = e.where_(is_zero, one.clone(), x)?;
    let nonzero = e.emit(Reduce::Prod { dims: dims.to_vec() }, vec![Arg::Value(nonzero_x)])?;
    let nonzero = e.unreduce(nonzero, shape, dims)?;
    let only_zero = e.binary(Binary::Eq, zeros, one)?;
    let at_zeros = e.where_(only_zero, nonzero, zero.clone())?;
    let y = e.unreduce(y, shape, dims)?;
    let plain = e.div(y, x)?;
    let none = e.binary(Binary::Eq, zeros, zero.clone())?;
    let elsewhere = e.where_(none, plain, zero)?;
    e.where_(is_zero, at_zeros, elsewhere)
}

/// Gradients of the reductions: the cotangent is expanded back over the reduced dims.
fn vjp(prim: &Reduce, e: &mut Emitter, x: ValueId, outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
    let shape = e.meta(x).shape;
    let grad = match prim {
        Reduce::Sum { dims } => e.unreduce(cots[0].expect("one cotangent"), &shape, dims)?,
        Reduce::Prod { dims } => {
            let g = e.unreduce(cots[0].expect("one cotangent"), &shape, dims)?;
            let others = product_of_the_others(e, x, outputs[0], &shape, dims)?;
            e.mul(g, others)?
        }
        Reduce::Amax { dims } | Reduce::Amin { dims } => {
            // Ties share the gradient equally, as torch does.
            let y = e.unreduce(outputs[0], &shape, dims)?;
            let hit = e.binary(Binary::Eq, x, y)?;
            let hit = e.convert(hit, e.meta(x).dtype)?;
            let count = e.sum(hit, dims.clone())?;
            let g = e.div(cots[0].expect("one cotangent"), count)?;
            let g = e.unreduce(g, &shape, dims)?;
            e.mul(g, hit)?
        }
        Reduce::Var { dims, correction } | Reduce::VarMean { dims, correction } => {
            let count = Dim::product(dims.iter().map(|&d| &shape[d]));
            return var_grads(e, x, &shape, dims, &count, correction.as_f64(), cots);
        }
        Reduce::Argmax { .. } | Reduce::Argmin { .. } => return Ok(vec![None]),
    };
    Ok(vec![Some(grad)])
}

/// The gradient of `var` (and `var_mean`) of `x` over `dims`, which hold `count` elements. A
/// symbolic count divides as the size it is (an int correction keeps `count - correction` one);
/// a constant one, or a fractional correction, scales by a literal (the count at its hint).
fn var_grads(
    e: &mut Emitter,
    x: ValueId,
    shape: &[Dim],
    dims: &[usize],
    count: &Dim,
    correction: f64,
    cots: &[Option<ValueId>],
) -> Result<Grads> {
    let whole = correction.fract() == 0.0;
    let n = if count.is_sym() && whole { None } else { Some(e.builder.facts_mut().specialise(count) as f64) };
    let by_count = |e: &Emitter, v: ValueId| n.map_or_else(|| Arg::dim(count), |n| e.scalar(v, n));
    let mut grad = None;
    if let Some(g) = cots[0] {
        // d var / dx = 2 (x - mean) / (n - correction), rounded as eager's `var_backward`:
        // `(2 / (n - correction)) * grad * (x - mean)`, the scalar times the cotangent first
        // eager's `x.mean(dims, keepdim=True)`: ATen's CPU mean of a half or bfloat16 tensor
        // sums and divides in float32 and rounds once
        let dtype = e.meta(x).dtype;
        let reduced = matches!(dtype, DType::F16 | DType::BF16);
        let wide = if reduced { e.convert(x, DType::F32)? } else { x };
        let mean = e.sum(wide, dims.to_vec())?;
        let mean = e.div(mean, by_count(e, wide))?;
        let mean = if reduced { e.convert(mean, dtype)? } else { mean };
        let mean = e.unreduce(mean, shape, dims)?;
        let centered = e.sub(x, mean)?;
        let g = e.unreduce(g, shape, dims)?;
        grad = Some(match n {
            Some(n) => {
                let scaled = e.mul(g, e.scalar(x, 2.0 / (n - correction)))?;
                e.mul(scaled, centered)?
            }
            None => {
                let twice = e.mul(centered, e.scalar(x, 2.0))?;
                let t = e.div(twice, Arg::dim(&count.sub(&Dim::Const(correction as i64))))?;
                e.mul(g, t)?
            }
        });
    }
    if let Some(g_mean) = cots.get(1).copied().flatten() {
        let t = e.div(g_mean, by_count(e, x))?;
        let t = e.unreduce(t, shape, dims)?;
        grad = Some(match grad {
            Some(g) => e.add(g, t)?,
            None => t,
        });
    }
    Ok(vec![grad])
}
