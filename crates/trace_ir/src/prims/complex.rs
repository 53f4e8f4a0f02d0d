//! The complex prims: building complex values from real ones and taking them apart.
//!
//! torch computes with complex tensors as pairs of reals (`view_as_real` shows the pair as a
//! trailing dim of 2). These prims cross between the two: `complex`/`polar` build, `real`/`imag`
//! take apart, `view_as_complex`/`view_as_real` reinterpret the trailing pair, `conj` negates the
//! imaginary part. Their VJP rules follow torch's convention for complex autograd (the gradient
//! of a real loss `L` with respect to `z = x + i y` is `dL/dx + i dL/dy`, the conjugate Wirtinger
//! derivative), as its `derivatives.yaml` writes them; [`Prim::differentiates_complex`] lists the
//! other prims whose rules hold for complex values.
//!
//! [`Prim::differentiates_complex`]: super::Prim::differentiates_complex

use super::declare::{declare_family, Family};
use super::elementwise::{common_tensor, tensor};
use super::Operand;
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Complex prims.
    pub enum Complex {
        /// `real + i * imag`, from two real tensors of one dtype (`torch.complex`).
        Complex = "complex", Operands::Fixed(2), {};
        /// `abs * (cos(angle) + i * sin(angle))` (`torch.polar`).
        Polar = "polar", Operands::Fixed(2), {};
        /// The real part of a complex tensor, as a new real tensor.
        Real = "real", Operands::Fixed(1), {};
        /// The imaginary part of a complex tensor, as a new real tensor.
        Imag = "imag", Operands::Fixed(1), {};
        /// The complex conjugate, computed (`torch.conj_physical`); real tensors are unchanged.
        Conj = "conj", Operands::Fixed(1), {};
        /// `a / abs(a)` of a complex tensor, 0 where `a` is 0 (`torch.sgn`).
        Sgn = "sgn", Operands::Fixed(1), {};
        /// A real tensor whose last dim is 2 read as complex numbers (`torch.view_as_complex`);
        /// `contiguous`: of a row-major copy (as torch's backward views its `grad.contiguous()`,
        /// which lays out what is computed from it as eager's does).
        ViewAsComplex = "view_as_complex", Operands::Fixed(1), { contiguous: bool = "contiguous" };
        /// A complex tensor read as real pairs in a new last dim of 2 (`torch.view_as_real`);
        /// `contiguous` as for `view_as_complex`.
        ViewAsReal = "view_as_real", Operands::Fixed(1), { contiguous: bool = "contiguous" };
    }
}

/// The complex dtype whose parts are `dtype`; an error naming `op` for the dtypes torch has no
/// complex counterpart of here (`complex32` of `f16` is not a trace dtype).
fn complex_of(op: &str, what: &str, dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 => Ok(DType::C64),
        DType::F64 => Ok(DType::C128),
        DType::F16 => bail!(NotImplemented, op, "complex32 (of float16 {what}) is not supported"),
        other => bail!(NotImplemented, op, "expected float or double tensors for {what}, got {other}"),
    }
}

/// The first of two tensor operands that agree in shape, device and dtype (as torch's error
/// words a dtype mismatch).
fn same_operands<'a>(
    op: &str,
    names: &[&str; 2],
    operands: &[Operand<'a>],
    facts: &mut Facts,
) -> Result<&'a TensorMeta> {
    let (a, b) = (tensor(op, names[0], &operands[0])?, tensor(op, names[1], &operands[1])?);
    common_tensor(op, names, operands, facts)?;
    if a.dtype != b.dtype {
        bail!(
            Runtime,
            op,
            "Expected object of scalar type {} but got scalar type {} for {}",
            a.dtype,
            b.dtype,
            names[1]
        );
    }
    Ok(a)
}

fn complex_tensor<'a>(op: &str, operand: &Operand<'a>) -> Result<&'a TensorMeta> {
    let a = tensor(op, "a", operand)?;
    if !a.dtype.is_complex() {
        bail!(Type, op, "expected a complex tensor for a, got {}", a.dtype);
    }
    Ok(a)
}

impl Family for Complex {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let out = match self {
            Complex::Complex {} | Complex::Polar {} => {
                let names = if matches!(self, Complex::Complex {}) { ["real", "imag"] } else { ["abs", "angle"] };
                let a = same_operands(op, &names, operands, facts)?;
                let dtype = complex_of(op, &names.join(" and "), a.dtype)?;
                TensorMeta::with_dims(dtype, a.device, a.shape.clone())
            }
            Complex::Real {} | Complex::Imag {} => {
                let a = complex_tensor(op, &operands[0])?;
                TensorMeta::with_dims(a.dtype.to_real(), a.device, a.shape.clone())
            }
            Complex::Sgn {} => {
                let a = complex_tensor(op, &operands[0])?;
                TensorMeta::with_dims(a.dtype, a.device, a.shape.clone())
            }
            Complex::Conj {} => {
                let a = tensor(op, "a", &operands[0])?;
                TensorMeta::with_dims(a.dtype, a.device, a.shape.clone())
            }
            Complex::ViewAsComplex { .. } => {
                let a = tensor(op, "a", &operands[0])?;
                let dtype = complex_of(op, "a", a.dtype)?;
                let Some((last, rest)) = a.shape.split_last() else {
                    bail!(Runtime, op, "Input tensor must have one or more dimensions (argument a)");
                };
                if !facts.is(last, 2) {
                    bail!(Runtime, op, "Tensor must have a last dimension of size 2 (a is {})", show(&a.shape));
                }
                TensorMeta::with_dims(dtype, a.device, rest.to_vec())
            }
            Complex::ViewAsReal { .. } => {
                let a = complex_tensor(op, &operands[0])?;
                let shape = a.shape.iter().cloned().chain([Dim::Const(2)]).collect();
                TensorMeta::with_dims(a.dtype.to_real(), a.device, shape)
            }
        };
        Ok(vec![out])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let Some(g) = cots[0] else { return Ok(vec![None; operands.len()]) };
        let one = |e: &mut Emitter, prim: Complex, v: ValueId| e.emit(prim, vec![Arg::Value(v)]);
        Ok(match self {
            Complex::Complex {} => vec![Some(one(e, Complex::Real {}, g)?), Some(one(e, Complex::Imag {}, g)?)],
            Complex::Polar {} => vjp_polar(e, outputs[0], g)?,
            Complex::Real {} | Complex::Imag {} => {
                // Of the pair (re, im), the part taken gets the gradient and the other zero.
                let zero = e.zeros_like(g)?;
                let parts = if matches!(self, Complex::Real {}) { [g, zero] } else { [zero, g] };
                vec![Some(e.emit(Complex::Complex {}, parts.map(Arg::Value).to_vec())?)]
            }
            Complex::Conj {} => vec![Some(one(e, Complex::Conj {}, g)?)],
            Complex::Sgn {} => bail!(NotImplemented, "prims.sgn", "gradients through sgn are not supported"),
            Complex::ViewAsComplex { .. } => vec![Some(one(e, Complex::ViewAsReal { contiguous: true }, g)?)],
            Complex::ViewAsReal { .. } => vec![Some(one(e, Complex::ViewAsComplex { contiguous: true }, g)?)],
        })
    }
}

/// torch's `polar_backward`, with `r` the output: `abs` gets `real(conj(g) * sgn(r))` and
/// `angle` gets `real(conj(g) * (r * 1j))`, computed by the same complex kernels.
fn vjp_polar(e: &mut Emitter, r: ValueId, g: ValueId) -> Result<Grads> {
    let one = |e: &mut Emitter, prim: Complex, v: ValueId| e.emit(prim, vec![Arg::Value(v)]);
    let conj_g = one(e, Complex::Conj {}, g)?;
    let sgn = one(e, Complex::Sgn {}, r)?;
    let t = e.mul(conj_g, sgn)?;
    let grad_abs = one(e, Complex::Real {}, t)?;
    // r * 1j = (re * 0 - im * 1) + i (re * 1 + im * 0) = -im + i re
    let (re, im) = (one(e, Complex::Real {}, r)?, one(e, Complex::Imag {}, r)?);
    let minus_im = e.neg(im)?;
    let r_1j = e.emit(Complex::Complex {}, vec![Arg::Value(minus_im), Arg::Value(re)])?;
    let t = e.mul(conj_g, r_1j)?;
    let grad_angle = one(e, Complex::Real {}, t)?;
    Ok(vec![Some(grad_abs), Some(grad_angle)])
}
