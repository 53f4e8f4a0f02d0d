//! Meta rules of the elementwise prims: same shapes, same dtypes, no promotion.

use super::{Operand, Prim};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::value::{Scalar, TensorMeta};

/// Which element types an elementwise prim accepts.
#[derive(Clone, Copy, PartialEq)]
enum Accepts {
    Any,
    /// Floating or complex (`exp`, `sin`): integer inputs must be converted first.
    Inexact,
    /// Floating only (`erfinv`, `lgamma`, `atan2`).
    Float,
    /// Integers and bool (`bitwise_and`).
    IntOrBool,
    /// Anything but complex (`maximum`, comparisons that order).
    Real,
    /// Anything but bool: torch has no bool kernel (`abs`, `neg`, `sub`, `pow`).
    NotBool,
    /// Real and not bool (`floor`, `fmod`).
    RealNotBool,
}

fn accepts(prim: &Prim) -> Accepts {
    use Prim::*;
    match prim {
        Exp | Exp2 | Expm1 | Log | Log1p | Log2 | Log10 | Sin | Cos | Tan | Tanh | Sinh | Cosh
        | Asin | Acos | Atan | Asinh | Acosh | Atanh | Sqrt | Rsqrt | Reciprocal => {
            Accepts::Inexact
        }
        Erf | Erfc | Erfinv | Lgamma | Digamma | Atan2 => Accepts::Float,
        BitwiseNot | BitwiseAnd | BitwiseOr | BitwiseXor => Accepts::IntOrBool,
        Abs | Neg | Sub | Pow | Div => Accepts::NotBool,
        Floor | Ceil | Round | Trunc | Fmod | Remainder => Accepts::RealNotBool,
        Sign | Signbit | Maximum | Minimum | Lt | Le | Gt | Ge => Accepts::Real,
        _ => Accepts::Any,
    }
}

fn check_dtype(op: &str, what: &str, dtype: DType, rule: Accepts) -> Result<()> {
    let ok = match rule {
        Accepts::Any => true,
        Accepts::Inexact => dtype.is_inexact(),
        Accepts::Float => dtype.is_float(),
        Accepts::IntOrBool => dtype.is_int() || dtype.is_bool(),
        Accepts::Real => !dtype.is_complex(),
        Accepts::NotBool => !dtype.is_bool(),
        Accepts::RealNotBool => !dtype.is_complex() && !dtype.is_bool(),
    };
    if ok {
        return Ok(());
    }
    // Promotion in the decompositions keeps inexact-only prims from seeing integers, so those
    // are type errors; the others are dtypes torch has no kernel for (NotImplementedError).
    match rule {
        Accepts::Inexact => bail!(Type, op, "expected a floating-point or complex tensor for {what}, got {dtype}"),
        Accepts::Float => bail!(Type, op, "expected a floating-point tensor for {what}, got {dtype}"),
        Accepts::IntOrBool => bail!(NotImplemented, op, "not implemented for {dtype}: expected an integer or bool tensor for {what}"),
        Accepts::NotBool => bail!(NotImplemented, op, "not implemented for {dtype} (argument {what})"),
        _ => bail!(NotImplemented, op, "not implemented for {dtype}: expected a real tensor (argument {what})"),
    }
}

/// The output dtype of an elementwise prim whose tensor inputs have `dtype`.
fn output_dtype(prim: &Prim, dtype: DType) -> DType {
    use Prim::*;
    match prim {
        Eq | Ne | Lt | Le | Gt | Ge | Signbit | IsFinite => DType::Bool,
        Abs => dtype.to_real(),
        _ => dtype,
    }
}

pub(super) fn tensor<'a>(op: &str, what: &str, operand: &Operand<'a>) -> Result<&'a TensorMeta> {
    match operand {
        Operand::Tensor(t) => Ok(t),
        Operand::Number(n) => bail!(Type, op, "expected a tensor for {what}, got the number {n}"),
    }
}

pub(super) fn unary(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let a = tensor(op, "a", &operands[0])?;
    check_dtype(op, "a", a.dtype, accepts(prim))?;
    Ok(vec![TensorMeta::new(output_dtype(prim, a.dtype), a.device, a.shape.clone())])
}

/// Checks that a number operand can meet a tensor of `dtype` without promotion.
fn check_number(op: &str, what: &str, n: Scalar, dtype: DType) -> Result<()> {
    let ok = match n {
        Scalar::Bool(_) => true,
        Scalar::Int(_) => !dtype.is_bool(),
        Scalar::Float(_) => dtype.is_inexact(),
    };
    if !ok {
        bail!(Type, op, "number {what}={n} ({}) needs a type promotion to meet a {dtype} tensor", n.type_name());
    }
    Ok(())
}

/// Checks that all tensor operands agree in shape and device; returns the first tensor and its
/// name.
fn common_tensor<'a, 'n>(op: &str, names: &[&'n str], operands: &[Operand<'a>]) -> Result<(&'n str, &'a TensorMeta)> {
    let mut first: Option<(&str, &TensorMeta)> = None;
    for (name, operand) in names.iter().zip(operands) {
        let Operand::Tensor(t) = operand else { continue };
        let Some((first_name, f)) = first else {
            first = Some((name, t));
            continue;
        };
        if t.shape != f.shape {
            bail!(Value, op, "shapes of {first_name} {:?} and {name} {:?} differ (prims do not broadcast)", f.shape, t.shape);
        }
        if t.device != f.device {
            bail!(Value, op, "{first_name} is on {} but {name} is on {}", f.device, t.device);
        }
    }
    match first {
        Some(first) => Ok(first),
        None => bail!(Type, op, "expected a tensor for one of {}, got only numbers", names.join(", ")),
    }
}

pub(super) fn binary(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let names = ["a", "b"];
    let (name_t, t) = common_tensor(op, &names, operands)?;
    let dtype = t.dtype;
    for (name, operand) in names.iter().zip(operands) {
        match operand {
            Operand::Tensor(x) if x.dtype != dtype => {
                bail!(Type, op, "dtypes of a and b differ ({dtype} and {}); prims do not promote", x.dtype)
            }
            Operand::Number(n) => check_number(op, name, *n, dtype)?,
            _ => {}
        }
    }
    check_dtype(op, name_t, dtype, accepts(prim))?;
    Ok(vec![TensorMeta::new(output_dtype(prim, dtype), t.device, t.shape.clone())])
}

pub(super) fn where_(op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let names = ["pred", "a", "b"];
    let (_, t) = common_tensor(op, &names, operands)?;
    match &operands[0] {
        Operand::Tensor(p) if p.dtype != DType::Bool => bail!(Type, op, "expected a bool tensor for pred, got {}", p.dtype),
        Operand::Number(n) if !matches!(n, Scalar::Bool(_)) => bail!(Type, op, "expected a bool for pred, got {n}"),
        _ => {}
    }
    let value_dtype = match (&operands[1], &operands[2]) {
        (Operand::Tensor(a), Operand::Tensor(b)) if a.dtype != b.dtype => {
            bail!(Type, op, "dtypes of a and b differ ({} and {}); prims do not promote", a.dtype, b.dtype)
        }
        (Operand::Tensor(a), other) | (other, Operand::Tensor(a)) => {
            if let Operand::Number(n) = other {
                check_number(op, "a or b", *n, a.dtype)?;
            }
            a.dtype
        }
        _ => bail!(Type, op, "expected a tensor for a or b, got only numbers"),
    };
    Ok(vec![TensorMeta::new(value_dtype, t.device, t.shape.clone())])
}

/// `convert_element_type` and `device_put`.
pub(super) fn retype(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let a = tensor(op, "a", &operands[0])?;
    let mut out = TensorMeta::new(a.dtype, a.device, a.shape.clone());
    match prim {
        Prim::ConvertElementType { dtype } => out.dtype = *dtype,
        Prim::DevicePut { device } => out.device = *device,
        _ => unreachable!("retype handles only convert_element_type and device_put"),
    }
    Ok(vec![out])
}
