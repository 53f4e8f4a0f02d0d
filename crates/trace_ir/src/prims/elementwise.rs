//! The elementwise prims: same shapes, same dtypes, no promotion.
//!
//! `Unary` and `Binary` are tables of parameterless prims, each row with the element types it
//! accepts, its output dtype, and the type promotion of the ltorch symbol derived from it
//! (Python builds `ltorch.exp` and friends from this table). `Elementwise` holds the elementwise
//! prims with parameters or three operands.

use super::declare::{declare_family, elementwise_table, Family};
use super::holomorphic::{conjugated, square_plus_pow};
use super::Operand;
use crate::bail;
use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::grad::{number, Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use crate::ValueId;
use std::f64::consts::{FRAC_2_SQRT_PI, FRAC_PI_2, LN_10, LN_2, PI, SQRT_2};

/// Which element types an elementwise prim accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Accepts {
    /// Every dtype, bool included (`add`, `eq`).
    Any,
    /// Floating or complex (`exp`, `sin`): integer inputs must be converted first.
    Inexact,
    /// Floating only (`erfinv`, `lgamma`, `atan2`).
    Float,
    /// Floating only, and torch has no kernel for the others (`nextafter`): NotImplementedError.
    FloatKernel,
    /// Integers and bool (`bitwise_and`).
    IntOrBool,
    /// Anything but complex (`maximum`, comparisons that order).
    Real,
    /// Anything but bool: torch has no bool kernel (`abs`, `neg`, `sub`, `pow`).
    NotBool,
    /// Real and not bool (`floor`, `fmod`).
    RealNotBool,
}

/// The output dtype of an elementwise prim, given its inputs' dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Output {
    /// The operands' dtype.
    Same,
    /// `bool` (comparisons, `isfinite`, `signbit`).
    Bool,
    /// The real counterpart of a complex dtype (`abs`).
    Real,
}

/// The type promotion of the ltorch symbol derived from a prim, as `clang.promote` codes it;
/// `Custom` where the ltorch symbol is written by hand (`add` takes `alpha`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Promotion {
    /// The operands' promoted dtype.
    Default = 0,
    /// As `Default`, with bool and integer results computed in the default float dtype (`exp` of an
    /// int tensor is float).
    IntToFloat = 1,
    /// `bool`, whatever the operands.
    AlwaysBool = 2,
    /// As `Default`, with a complex result replaced by its real counterpart (`abs`).
    ComplexToFloat = 3,
    /// No derived symbol: ltorch writes this one by hand.
    Custom = 255,
}

elementwise_table! {
    /// Parameterless unary elementwise prims.
    pub enum Unary (1) {
        Abs = "abs", NotBool, Real, ComplexToFloat;
        Neg = "neg", NotBool, Same, Default;
        Exp = "exp", Inexact, Same, IntToFloat;
        Exp2 = "exp2", Inexact, Same, IntToFloat;
        Expm1 = "expm1", Inexact, Same, IntToFloat;
        Log = "log", Inexact, Same, IntToFloat;
        Log1p = "log1p", Inexact, Same, IntToFloat;
        Log2 = "log2", Inexact, Same, IntToFloat;
        Log10 = "log10", Inexact, Same, IntToFloat;
        Sin = "sin", Inexact, Same, IntToFloat;
        Cos = "cos", Inexact, Same, IntToFloat;
        Tan = "tan", Inexact, Same, IntToFloat;
        Tanh = "tanh", Inexact, Same, IntToFloat;
        Sinh = "sinh", Inexact, Same, IntToFloat;
        Cosh = "cosh", Inexact, Same, IntToFloat;
        Asin = "asin", Inexact, Same, IntToFloat;
        Acos = "acos", Inexact, Same, IntToFloat;
        Atan = "atan", Inexact, Same, IntToFloat;
        Asinh = "asinh", Inexact, Same, IntToFloat;
        Acosh = "acosh", Inexact, Same, IntToFloat;
        Atanh = "atanh", Inexact, Same, IntToFloat;
        Erf = "erf", Float, Same, IntToFloat;
        Erfc = "erfc", Float, Same, IntToFloat;
        Erfinv = "erfinv", Float, Same, IntToFloat;
        Sqrt = "sqrt", Inexact, Same, IntToFloat;
        Rsqrt = "rsqrt", Inexact, Same, IntToFloat;
        Reciprocal = "reciprocal", Inexact, Same, IntToFloat;
        Sign = "sign", Real, Same, Default;
        Signbit = "signbit", Real, Bool, AlwaysBool;
        Floor = "floor", RealNotBool, Same, Default;
        Ceil = "ceil", RealNotBool, Same, Default;
        Round = "round", RealNotBool, Same, Custom;
        Trunc = "trunc", RealNotBool, Same, Default;
        IsFinite = "isfinite", Any, Bool, AlwaysBool;
        BitwiseNot = "bitwise_not", IntOrBool, Same, Default;
        Lgamma = "lgamma", Float, Same, IntToFloat;
        Digamma = "digamma", Float, Same, IntToFloat;
        I0 = "i0", Float, Same, IntToFloat;
        I0e = "i0e", Float, Same, IntToFloat;
        I1 = "i1", Float, Same, IntToFloat;
        I1e = "i1e", Float, Same, IntToFloat;
        Ndtri = "ndtri", Float, Same, IntToFloat;
        Erfcx = "erfcx", Float, Same, IntToFloat;
        LogNdtr = "log_ndtr", Float, Same, IntToFloat;
        BesselJ0 = "bessel_j0", Float, Same, IntToFloat;
        BesselJ1 = "bessel_j1", Float, Same, IntToFloat;
        BesselY0 = "bessel_y0", Float, Same, IntToFloat;
        BesselY1 = "bessel_y1", Float, Same, IntToFloat;
        ModifiedBesselI0 = "modified_bessel_i0", Float, Same, IntToFloat;
        ModifiedBesselI1 = "modified_bessel_i1", Float, Same, IntToFloat;
        ModifiedBesselK0 = "modified_bessel_k0", Float, Same, IntToFloat;
        ModifiedBesselK1 = "modified_bessel_k1", Float, Same, IntToFloat;
        ScaledModifiedBesselK0 = "scaled_modified_bessel_k0", Float, Same, IntToFloat;
        ScaledModifiedBesselK1 = "scaled_modified_bessel_k1", Float, Same, IntToFloat;
        AiryAi = "airy_ai", Float, Same, IntToFloat;
        SphericalBesselJ0 = "spherical_bessel_j0", Float, Same, IntToFloat;
    }
}

elementwise_table! {
    /// Parameterless binary elementwise prims; either operand may be a number.
    pub enum Binary (2) {
        Add = "add", Any, Same, Custom;
        Sub = "sub", NotBool, Same, Custom;
        Mul = "mul", Any, Same, Default;
        Div = "div", NotBool, Same, Custom;
        Pow = "pow", NotBool, Same, Default;
        Fmod = "fmod", RealNotBool, Same, Default;
        Remainder = "remainder", RealNotBool, Same, Default;
        Maximum = "maximum", Real, Same, Default;
        Minimum = "minimum", Real, Same, Default;
        Atan2 = "atan2", Float, Same, IntToFloat;
        Eq = "eq", Any, Bool, AlwaysBool;
        Ne = "ne", Any, Bool, AlwaysBool;
        Lt = "lt", Real, Bool, AlwaysBool;
        Le = "le", Real, Bool, AlwaysBool;
        Gt = "gt", Real, Bool, AlwaysBool;
        Ge = "ge", Real, Bool, AlwaysBool;
        BitwiseAnd = "bitwise_and", IntOrBool, Same, Default;
        BitwiseOr = "bitwise_or", IntOrBool, Same, Default;
        BitwiseXor = "bitwise_xor", IntOrBool, Same, Default;
        Nextafter = "nextafter", FloatKernel, Same, Default;
        /// The Hurwitz zeta function `zeta(x, q)`.
        Zeta = "zeta", Float, Same, IntToFloat;
        /// The regularized lower and upper incomplete gamma functions `igamma(a, x)` and
        /// `igammac(a, x)`; their symbols (`ltorch.igamma`) are written by hand, with the grad
        /// rules (in `x` only, as torch).
        Igamma = "igamma", FloatKernel, Same, Custom;
        Igammac = "igammac", FloatKernel, Same, Custom;
        /// Orthogonal polynomials `p_n(x)` (torch.special), with no derivative.
        ChebyshevPolynomialT = "chebyshev_polynomial_t", Float, Same, IntToFloat;
        ChebyshevPolynomialU = "chebyshev_polynomial_u", Float, Same, IntToFloat;
        ChebyshevPolynomialV = "chebyshev_polynomial_v", Float, Same, IntToFloat;
        ChebyshevPolynomialW = "chebyshev_polynomial_w", Float, Same, IntToFloat;
        ShiftedChebyshevPolynomialT = "shifted_chebyshev_polynomial_t", Float, Same, IntToFloat;
        ShiftedChebyshevPolynomialU = "shifted_chebyshev_polynomial_u", Float, Same, IntToFloat;
        ShiftedChebyshevPolynomialV = "shifted_chebyshev_polynomial_v", Float, Same, IntToFloat;
        ShiftedChebyshevPolynomialW = "shifted_chebyshev_polynomial_w", Float, Same, IntToFloat;
        HermitePolynomialH = "hermite_polynomial_h", Float, Same, IntToFloat;
        HermitePolynomialHe = "hermite_polynomial_he", Float, Same, IntToFloat;
        LaguerrePolynomialL = "laguerre_polynomial_l", Float, Same, IntToFloat;
        LegendrePolynomialP = "legendre_polynomial_p", Float, Same, IntToFloat;
    }
}

declare_family! {
    /// Elementwise prims with parameters, or with three operands.
    pub enum Elementwise {
        /// `where(pred, a, b)`.
        Where = "where", Operands::Fixed(3), {};
        /// `a.to(dtype)`: each element converted as torch converts it.
        ConvertElementType = "convert_element_type", Operands::Fixed(1), { dtype: DType = "dtype" };
        /// `a.to(device)`: the same elements on `device` (not elementwise for executors: it moves
        /// memory).
        DevicePut = "device_put", Operands::Fixed(1), { device: Device = "device" };
        /// The `order`-th derivative of digamma (`torch.polygamma(order, a)`).
        Polygamma = "polygamma", Operands::Fixed(1), { order: i64 = "n" };
        /// `(mantissa, exponent)` with `a = mantissa * 2^exponent`, the exponent in int32.
        Frexp = "frexp", Operands::Fixed(1), {};
    }
}

/// The promotion code Python derives `ltorch.<name>` with, for table prims not written by hand.
pub(super) fn derived_promotion(name: &str) -> Option<u8> {
    let promotion = Unary::ALL
        .iter()
        .find(|p| p.name() == name)
        .map(|p| p.promotion())
        .or_else(|| Binary::ALL.iter().find(|p| p.name() == name).map(|p| p.promotion()))?;
    (promotion != Promotion::Custom).then_some(promotion as u8)
}

impl Unary {
    /// Whether outputs carry gradients; torch defines none for these, so their outputs never
    /// require grad.
    pub fn is_differentiable(self) -> bool {
        use Unary::*;
        !matches!(self, ScaledModifiedBesselK0 | ScaledModifiedBesselK1 | AiryAi | SphericalBesselJ0)
    }
}

impl Binary {
    /// Whether outputs carry gradients (torch defines none for the orthogonal polynomials).
    pub fn is_differentiable(self) -> bool {
        use Binary::*;
        !matches!(
            self,
            ChebyshevPolynomialT
                | ChebyshevPolynomialU
                | ChebyshevPolynomialV
                | ChebyshevPolynomialW
                | ShiftedChebyshevPolynomialT
                | ShiftedChebyshevPolynomialU
                | ShiftedChebyshevPolynomialV
                | ShiftedChebyshevPolynomialW
                | HermitePolynomialH
                | HermitePolynomialHe
                | LaguerrePolynomialL
                | LegendrePolynomialP
        )
    }
}

impl Output {
    fn dtype(self, input: DType) -> DType {
        match self {
            Output::Same => input,
            Output::Bool => DType::Bool,
            Output::Real => input.to_real(),
        }
    }
}

fn check_dtype(op: &str, what: &str, dtype: DType, rule: Accepts) -> Result<()> {
    let ok = match rule {
        Accepts::Any => true,
        Accepts::Inexact => dtype.is_inexact(),
        Accepts::Float | Accepts::FloatKernel => dtype.is_float(),
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
        Accepts::FloatKernel => {
            bail!(NotImplemented, op, "not implemented for {dtype}: expected a floating-point tensor for {what}")
        }
        Accepts::IntOrBool => {
            bail!(NotImplemented, op, "not implemented for {dtype}: expected an integer or bool tensor for {what}")
        }
        Accepts::NotBool => bail!(NotImplemented, op, "not implemented for {dtype} (argument {what})"),
        _ => bail!(NotImplemented, op, "not implemented for {dtype}: expected a real tensor (argument {what})"),
    }
}

pub(super) fn tensor<'a>(op: &str, what: &str, operand: &Operand<'a>) -> Result<&'a TensorMeta> {
    match operand {
        Operand::Tensor(t) => Ok(t),
        Operand::Number(n) => bail!(Type, op, "expected a tensor for {what}, got the number {n}"),
    }
}

impl Family for Unary {
    fn meta(&self, op: &str, operands: &[Operand], _facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let a = tensor(op, "a", &operands[0])?;
        check_dtype(op, "a", a.dtype, self.accepts())?;
        Ok(vec![TensorMeta::with_dims(self.output().dtype(a.dtype), a.device, a.shape.clone())])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let (Some(x), Some(g)) = (operands[0].as_value(), cots[0]) else { return Ok(vec![None]) };
        if e.meta(x).dtype.is_complex() && *self != Unary::Neg {
            return Ok(vec![conjugated(e, g, |e, g| vjp_unary(*self, e, x, outputs[0], g))?]);
        }
        Ok(vec![vjp_unary(*self, e, x, outputs[0], g)?])
    }
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
pub(super) fn common_tensor<'a, 'n>(
    op: &str,
    names: &[&'n str],
    operands: &[Operand<'a>],
    facts: &mut Facts,
) -> Result<(&'n str, &'a TensorMeta)> {
    let mut first: Option<(&str, &TensorMeta)> = None;
    for (name, operand) in names.iter().zip(operands) {
        let Operand::Tensor(t) = operand else { continue };
        let Some((first_name, f)) = first else {
            first = Some((name, t));
            continue;
        };
        if !facts.same_shape(&t.shape, &f.shape) {
            bail!(
                Value,
                op,
                "shapes of {first_name} {} and {name} {} differ (prims do not broadcast)",
                show(&f.shape),
                show(&t.shape)
            );
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

impl Family for Binary {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let names = ["a", "b"];
        let (name_t, t) = common_tensor(op, &names, operands, facts)?;
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
        check_dtype(op, name_t, dtype, self.accepts())?;
        Ok(vec![TensorMeta::with_dims(self.output().dtype(dtype), t.device, t.shape.clone())])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let Some(g) = cots[0] else { return Ok(vec![None, None]) };
        let y = outputs[0];
        let (ga, gb) = if *self == Binary::Div && e.meta(y).dtype.is_complex() {
            conjugated(e, g, |e, g| vjp_binary(Binary::Div, e, (&operands[0], &operands[1]), y, g))?
        } else {
            vjp_binary(*self, e, (&operands[0], &operands[1]), y, g)?
        };
        Ok(vec![ga, gb])
    }
}

fn where_(op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    let names = ["pred", "a", "b"];
    let (_, t) = common_tensor(op, &names, operands, facts)?;
    match &operands[0] {
        Operand::Tensor(p) if p.dtype != DType::Bool => {
            bail!(Type, op, "expected a bool tensor for pred, got {}", p.dtype)
        }
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
    Ok(vec![TensorMeta::with_dims(value_dtype, t.device, t.shape.clone())])
}

impl Family for Elementwise {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        if let Elementwise::Where {} = self {
            return where_(op, operands, facts);
        }
        let a = tensor(op, "a", &operands[0])?;
        let mut out = TensorMeta::with_dims(a.dtype, a.device, a.shape.clone());
        match self {
            Elementwise::ConvertElementType { dtype } => out.dtype = *dtype,
            Elementwise::DevicePut { device } => out.device = *device,
            Elementwise::Polygamma { .. } => check_dtype(op, "a", a.dtype, Accepts::Float)?,
            Elementwise::Frexp {} => {
                check_dtype(op, "a", a.dtype, Accepts::Float)?;
                return Ok(vec![out, TensorMeta::with_dims(DType::I32, a.device, a.shape.clone())]);
            }
            Elementwise::Where {} => unreachable!("where is handled above"),
        }
        Ok(vec![out])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let Some(g) = cots[0] else { return Ok(vec![None; operands.len()]) };
        if let Elementwise::Where {} = self {
            return vjp_where(e, &operands[0], g);
        }
        let Some(x) = operands[0].as_value() else { return Ok(vec![None]) };
        Ok(match self {
            Elementwise::Where {} => unreachable!("where is handled above"),
            Elementwise::Polygamma { order } => {
                let t = e.emit(Elementwise::Polygamma { order: order + 1 }, vec![Arg::Value(x)])?;
                vec![Some(e.mul(g, t)?)]
            }
            Elementwise::ConvertElementType { .. } | Elementwise::DevicePut { .. } => vec![vjp_retype(self, e, x, g)?],
            Elementwise::Frexp {} => {
                // mantissa = a / 2^exponent, the exponent piecewise constant.
                let exponent = e.convert(outputs[1], e.meta(x).dtype)?;
                let scale = e.unary(Unary::Neg, exponent)?;
                let scale = e.unary(Unary::Exp2, scale)?;
                vec![Some(e.mul(g, scale)?)]
            }
        })
    }
}

// ---------------------------------------------------------------------------------- VJP rules

/// `g * f'(x)` for a unary prim `y = f(x)`; `None` where the output carries no gradient.
fn vjp_unary(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<Option<ValueId>> {
    use Unary::*;
    let grad = match prim {
        Abs | Neg | Sqrt | Rsqrt | Reciprocal | Sign | Floor | Ceil | Round | Trunc => vjp_algebraic(prim, e, x, y, g)?,
        Exp | Exp2 | Expm1 | Log | Log1p | Log2 | Log10 => vjp_exp_log(prim, e, x, y, g)?,
        Sin | Cos | Tan | Tanh | Sinh | Cosh => vjp_trigonometric(prim, e, x, y, g)?,
        Asin | Acos | Atan | Asinh | Acosh | Atanh => vjp_inverse_trigonometric(prim, e, x, g)?,
        Erf | Erfc | Erfinv | Ndtri | Erfcx | LogNdtr => vjp_error_function(prim, e, x, y, g)?,
        Lgamma | Digamma | I0 | I0e | I1 | I1e => vjp_gamma_bessel_i(prim, e, x, y, g)?,
        BesselJ0 | BesselY0 | ModifiedBesselK0 | ModifiedBesselI0 | BesselJ1 | BesselY1 | ModifiedBesselI1
        | ModifiedBesselK1 => vjp_bessel(prim, e, x, y, g)?,
        ScaledModifiedBesselK0 | ScaledModifiedBesselK1 | AiryAi | SphericalBesselJ0 => return Ok(None),
        Signbit | IsFinite | BitwiseNot => return Ok(None),
    };
    Ok(Some(grad))
}

// Each family's rule below is reached only through `vjp_unary`'s dispatch, which sends it the
// prims of its family: the catch-all arm is that dispatch's invariant, not a case.

/// `1 - v*v`, `v*v + 1` and friends: the shared pieces of the (inverse) trigonometric rules.
pub(super) fn square_plus(e: &mut Emitter, v: ValueId, sign: f64, add: f64) -> Result<ValueId> {
    let sq = e.mul(v, v)?;
    let sq = if sign < 0.0 { e.neg(sq)? } else { sq };
    e.add(sq, e.scalar(v, add))
}

/// abs, neg, the roots and reciprocal, and the piecewise-constant rounding and sign (zero).
fn vjp_algebraic(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Abs => {
            let s = e.unary(Sign, x)?;
            e.mul(g, s)?
        }
        Neg => e.neg(g)?,
        Sqrt => {
            let t = e.mul(y, e.scalar(x, 2.0))?;
            e.div(g, t)?
        }
        Rsqrt if e.meta(x).dtype.is_complex() => {
            // As eager's `-0.5 * grad * result.pow(3)`: a complex cube is `pow`'s (not two products)
            let cube = e.binary(Binary::Pow, y, e.scalar(y, 3.0))?;
            let t = e.mul(g, e.scalar(x, -0.5))?;
            e.mul(t, cube)?
        }
        Rsqrt => {
            let t = e.mul(y, y)?;
            let t = e.mul(t, y)?;
            let t = e.mul(t, e.scalar(x, -0.5))?;
            e.mul(g, t)?
        }
        Reciprocal => {
            let t = e.mul(y, y)?;
            let t = e.mul(g, t)?;
            e.neg(t)?
        }
        Sign | Floor | Ceil | Round | Trunc => e.zeros_like(x)?,
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The exponentials and logarithms.
fn vjp_exp_log(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Exp => e.mul(g, y)?,
        Exp2 => {
            let t = e.mul(g, y)?;
            e.mul(t, e.scalar(x, LN_2))?
        }
        Expm1 => {
            let t = e.add(y, e.scalar(x, 1.0))?;
            e.mul(g, t)?
        }
        Log => e.div(g, x)?,
        Log1p => {
            let t = e.add(x, e.scalar(x, 1.0))?;
            e.div(g, t)?
        }
        Log2 => {
            let t = e.mul(x, e.scalar(x, LN_2))?;
            e.div(g, t)?
        }
        Log10 => {
            let t = e.mul(x, e.scalar(x, LN_10))?;
            e.div(g, t)?
        }
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The circular and hyperbolic functions.
fn vjp_trigonometric(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Sin => {
            let t = e.unary(Cos, x)?;
            e.mul(g, t)?
        }
        Cos => {
            let t = e.unary(Sin, x)?;
            let t = e.mul(g, t)?;
            e.neg(t)?
        }
        Tan => {
            let t = square_plus_pow(e, y, 1.0, 1.0)?;
            e.mul(g, t)?
        }
        Tanh => {
            let t = square_plus(e, y, -1.0, 1.0)?;
            e.mul(g, t)?
        }
        Sinh => {
            let t = e.unary(Cosh, x)?;
            e.mul(g, t)?
        }
        Cosh => {
            let t = e.unary(Sinh, x)?;
            e.mul(g, t)?
        }
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The inverse circular and hyperbolic functions, all of `x` alone.
fn vjp_inverse_trigonometric(prim: Unary, e: &mut Emitter, x: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Asin | Acos => {
            let t = square_plus(e, x, -1.0, 1.0)?;
            let r = e.unary(Rsqrt, t)?;
            let t = e.mul(g, r)?;
            if prim == Acos {
                e.neg(t)?
            } else {
                t
            }
        }
        Atan => {
            let t = square_plus(e, x, 1.0, 1.0)?;
            e.div(g, t)?
        }
        Asinh => {
            let t = square_plus_pow(e, x, 1.0, 1.0)?;
            let r = e.unary(Rsqrt, t)?;
            e.mul(g, r)?
        }
        Acosh if e.meta(x).dtype.is_complex() => {
            // As eager's complex formula: `(x + 1).rsqrt() * (x - 1).rsqrt()` (sqrt(ab) is not
            // sqrt(a) sqrt(b) off the positive reals).
            let above = e.add(x, e.scalar(x, 1.0))?;
            let above = e.unary(Rsqrt, above)?;
            let below = e.add(x, e.scalar(x, -1.0))?;
            let below = e.unary(Rsqrt, below)?;
            let r = e.mul(above, below)?;
            e.mul(g, r)?
        }
        Acosh => {
            let t = square_plus(e, x, 1.0, -1.0)?;
            let r = e.unary(Rsqrt, t)?;
            e.mul(g, r)?
        }
        Atanh => {
            let t = square_plus_pow(e, x, -1.0, 1.0)?;
            e.div(g, t)?
        }
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The error function, its inverse and complement, and the normal distribution's functions.
fn vjp_error_function(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Erf | Erfc => {
            let t = square_plus(e, x, -1.0, 0.0)?;
            let t = e.unary(Exp, t)?;
            let sign = if prim == Erf { 1.0 } else { -1.0 };
            let t = e.mul(t, e.scalar(x, sign * 2.0 / PI.sqrt()))?;
            e.mul(g, t)?
        }
        Erfinv => {
            let t = e.mul(y, y)?;
            let t = e.unary(Exp, t)?;
            let t = e.mul(t, e.scalar(x, PI.sqrt() / 2.0))?;
            e.mul(g, t)?
        }
        Ndtri => {
            // eager's `grad * (M_PI_2 * M_SQRT2 * M_2_SQRTPI) * (result.square() * 0.5).exp()`
            let scaled = e.mul(g, e.scalar(x, FRAC_PI_2 * SQRT_2 * FRAC_2_SQRT_PI))?;
            let t = e.mul(y, y)?;
            let t = e.mul(t, e.scalar(x, 0.5))?;
            let t = e.unary(Exp, t)?;
            e.mul(scaled, t)?
        }
        Erfcx => {
            let t = e.mul(x, y)?;
            let t = e.mul(t, e.scalar(x, 2.0))?;
            let t = e.sub(t, e.scalar(x, 2.0 / PI.sqrt()))?;
            e.mul(g, t)?
        }
        LogNdtr => {
            // eager's `grad * (M_2_SQRTPI * M_SQRT2 * 0.25) * (result + self.pow(2) * 0.5).neg().exp()`
            let scaled = e.mul(g, e.scalar(x, FRAC_2_SQRT_PI * SQRT_2 * 0.25))?;
            let t = e.mul(x, x)?;
            let t = e.mul(t, e.scalar(x, 0.5))?;
            let t = e.add(y, t)?;
            let t = e.neg(t)?;
            let t = e.unary(Exp, t)?;
            e.mul(scaled, t)?
        }
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The gamma functions and the modified Bessel functions of the first kind `i0`, `i1` and their
/// scaled forms (torch's `special.i0`...).
fn vjp_gamma_bessel_i(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        Lgamma => {
            let t = e.unary(Digamma, x)?;
            e.mul(g, t)?
        }
        Digamma => {
            let t = e.emit(Elementwise::Polygamma { order: 1 }, vec![Arg::Value(x)])?;
            e.mul(g, t)?
        }
        I0 => {
            let t = e.unary(I1, x)?;
            e.mul(g, t)?
        }
        I0e => {
            let s = e.unary(Sign, x)?;
            let t = e.mul(s, y)?;
            let i1e = e.unary(I1e, x)?;
            let t = e.sub(i1e, t)?;
            e.mul(g, t)?
        }
        I1 => divided_by_x_backward(e, I0, false, x, y, g)?,
        I1e => divided_by_x_backward(e, I0e, true, x, y, g)?,
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// `torch.finfo(dtype).eps` of a floating dtype.
fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => f64::powi(2.0, -10),
        DType::BF16 => f64::powi(2.0, -7),
        DType::F32 | DType::C64 => f64::from(f32::EPSILON),
        _ => f64::EPSILON,
    }
}

/// Eager's backward of `i1`, `i1e` and `bessel_j1` (`i1_backward`, `i1e_backward`,
/// `bessel_j1_backward`): `g * where(|x| > eps, zeroth(s) - y * (sgn(s) + 1/s), 1/2)`, `sgn(s)` only
/// for the scaled `i1e`, where `s` is `x` with the values `|x| <= eps` replaced by `eps` (the
/// dtype's machine epsilon), so that the rounding near 0 is eager's.
fn divided_by_x_backward(
    e: &mut Emitter,
    zeroth: Unary,
    scaled: bool,
    x: ValueId,
    y: ValueId,
    g: ValueId,
) -> Result<ValueId> {
    let eps = machine_epsilon(e.meta(x).dtype);
    let magnitude = e.unary(Unary::Abs, x)?;
    let not_tiny = e.binary(Binary::Gt, magnitude, e.scalar(x, eps))?;
    let safe = e.where_(not_tiny, x, e.scalar(x, eps))?;
    let b = e.unary(zeroth, safe)?;
    let mut r = e.unary(Unary::Reciprocal, safe)?;
    if scaled {
        let s = e.unary(Unary::Sign, safe)?;
        r = e.add(s, r)?;
    }
    let t = e.mul(y, r)?;
    let t = e.sub(b, t)?;
    let t = e.where_(not_tiny, t, e.scalar(x, 0.5))?;
    e.mul(g, t)
}

/// The Bessel functions of orders 0 and 1 (torch's `special.bessel_j0`...).
fn vjp_bessel(prim: Unary, e: &mut Emitter, x: ValueId, y: ValueId, g: ValueId) -> Result<ValueId> {
    use Unary::*;
    Ok(match prim {
        BesselJ0 | BesselY0 | ModifiedBesselK0 => {
            // j0' = -j1, y0' = -y1, k0' = -k1.
            let first = match prim {
                BesselJ0 => BesselJ1,
                BesselY0 => BesselY1,
                _ => ModifiedBesselK1,
            };
            let t = e.unary(first, x)?;
            let t = e.mul(g, t)?;
            e.neg(t)?
        }
        ModifiedBesselI0 => {
            let t = e.unary(ModifiedBesselI1, x)?;
            e.mul(g, t)?
        }
        // j1' = j0 - j1/x and i1' = i0 - i1/x (eager's `i1_backward` takes `i0`), 1/2 near 0.
        BesselJ1 => divided_by_x_backward(e, BesselJ0, false, x, y, g)?,
        ModifiedBesselI1 => divided_by_x_backward(e, I0, false, x, y, g)?,
        BesselY1 => {
            // eager's `grad * where(x == 0, inf, y0(x) - result * x.reciprocal())`
            let z = e.unary(BesselY0, x)?;
            let r = e.unary(Reciprocal, x)?;
            let t = e.mul(y, r)?;
            let t = e.sub(z, t)?;
            let at_zero = e.binary(Binary::Eq, x, e.scalar(x, 0.0))?;
            let t = e.where_(at_zero, e.scalar(x, f64::INFINITY), t)?;
            e.mul(g, t)?
        }
        ModifiedBesselK1 => {
            // eager's `grad * -(k0(x) + result * x.reciprocal())`
            let z = e.unary(ModifiedBesselK0, x)?;
            let r = e.unary(Reciprocal, x)?;
            let t = e.mul(y, r)?;
            let t = e.add(z, t)?;
            let t = e.neg(t)?;
            e.mul(g, t)?
        }
        _ => unreachable!("vjp_unary sends {prim:?} elsewhere"),
    })
}

/// The gradients of a binary elementwise prim `y = f(a, b)`; `ta`/`tb` are the operands that
/// are tensors (numbers get no gradient).
fn vjp_binary(
    prim: Binary,
    e: &mut Emitter,
    (a, b): (&Arg, &Arg),
    y: ValueId,
    g: ValueId,
) -> Result<(Option<ValueId>, Option<ValueId>)> {
    use Binary::*;
    let zero = e.scalar(g, 0.0);
    Ok(match prim {
        Add => (Some(g), Some(g)),
        Sub => (Some(g), Some(e.neg(g)?)),
        Mul => {
            // As torch's `mul_tensor_backward`: `g * conj(other)` (no-op for real operands).
            let (conj_a, conj_b) = (e.conj(a)?, e.conj(b)?);
            (Some(e.mul(g, conj_b)?), Some(e.mul(g, conj_a)?))
        }
        Div => {
            // As torch: g / b, and -g * ((a / b) / b), whose a / b is the output.
            let ga = e.div(g, b.clone())?;
            let t = e.div(y, b.clone())?;
            let t = e.mul(g, t)?;
            (Some(ga), Some(e.neg(t)?))
        }
        Pow => (pow_grad_base(e, a, b, g)?, pow_grad_exponent(e, a, b, y, g)?),
        Fmod | Remainder => {
            let q = e.div(a.clone(), b.clone())?;
            let q = e.unary(if prim == Fmod { Unary::Trunc } else { Unary::Floor }, q)?;
            let t = e.mul(g, q)?;
            (Some(g), Some(e.neg(t)?))
        }
        Maximum | Minimum => vjp_extremum(prim, e, (a, b), g, zero)?,
        Atan2 => vjp_atan2(e, (a, b), g)?,
        Nextafter => {
            // As torch: the gradient passes to a where a != b, and never to b.
            let equal = e.binary(Eq, a.clone(), b.clone())?;
            (Some(e.where_(equal, zero.clone(), g)?), Some(e.zeros_like(g)?))
        }
        Zeta => vjp_zeta(e, (a, b), g)?,
        Igamma | Igammac => bail!(
            NotImplemented,
            format!("prims.{}", prim.name()),
            "differentiated by the grad rule of ltorch.{}, not by the prim's",
            prim.name()
        ),
        Eq | Ne | Lt | Le | Gt | Ge | BitwiseAnd | BitwiseOr | BitwiseXor => (None, None),
        ChebyshevPolynomialT
        | ChebyshevPolynomialU
        | ChebyshevPolynomialV
        | ChebyshevPolynomialW
        | ShiftedChebyshevPolynomialT
        | ShiftedChebyshevPolynomialU
        | ShiftedChebyshevPolynomialV
        | ShiftedChebyshevPolynomialW
        | HermitePolynomialH
        | HermitePolynomialHe
        | LaguerrePolynomialL
        | LegendrePolynomialP => (None, None),
    })
}

/// maximum and minimum: ties split the gradient in halves, and an operand gets none only where
/// the other strictly wins (so both get it where either is NaN), as torch.
fn vjp_extremum(
    prim: Binary,
    e: &mut Emitter,
    (a, b): (&Arg, &Arg),
    g: ValueId,
    zero: Arg,
) -> Result<(Option<ValueId>, Option<ValueId>)> {
    use Binary::*;
    let half = e.mul(g, e.scalar(g, 0.5))?;
    let tie = e.binary(Eq, a.clone(), b.clone())?;
    let (a_loses, b_loses) = if prim == Maximum { (Lt, Gt) } else { (Gt, Lt) };
    let a_loses = e.binary(a_loses, a.clone(), b.clone())?;
    let b_loses = e.binary(b_loses, a.clone(), b.clone())?;
    let ga = e.where_(a_loses, zero.clone(), g)?;
    let ga = e.where_(tie, half, ga)?;
    let gb = e.where_(b_loses, zero.clone(), g)?;
    let gb = e.where_(tie, half, gb)?;
    Ok((Some(ga), Some(gb)))
}

/// atan2 as torch: g * b * recip and g * -a * recip, recip = 1 / (a^2 + b^2), 0 at the origin.
fn vjp_atan2(e: &mut Emitter, (a, b): (&Arg, &Arg), g: ValueId) -> Result<(Option<ValueId>, Option<ValueId>)> {
    let aa = e.mul(a.clone(), a.clone())?;
    let bb = e.mul(b.clone(), b.clone())?;
    let denom = e.add(aa, bb)?;
    let (zero, one) = (e.scalar(denom, 0.0), e.scalar(denom, 1.0));
    let recip = e.div(one, denom)?;
    let origin = e.binary(Binary::Eq, denom, zero.clone())?;
    let recip = e.where_(origin, zero, recip)?;
    let ga = e.mul(g, b.clone())?;
    let ga = e.mul(ga, recip)?;
    // -(g * a * recip) is g * -a * recip exactly: negation commutes with rounding.
    let gb = e.mul(g, a.clone())?;
    let gb = e.mul(gb, recip)?;
    Ok((Some(ga), Some(e.neg(gb)?)))
}

/// zeta as torch: d/dq zeta(x, q) = -x zeta(x + 1, q); there is no derivative in x.
fn vjp_zeta(e: &mut Emitter, (a, b): (&Arg, &Arg), g: ValueId) -> Result<(Option<ValueId>, Option<ValueId>)> {
    let x_requires_grad =
        a.as_value().is_some_and(|v| matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad));
    if x_requires_grad {
        bail!(
            NotImplemented,
            "prims.zeta",
            "the derivative of zeta with respect to x is not implemented (in torch either); detach x (argument a)"
        );
    }
    let x1 = match number_value(e, a) {
        Some(x) => Arg::Scalar(number(e.meta(g).dtype, x + 1.0)),
        None => Arg::Value(e.add(a.clone(), e.scalar(g, 1.0))?),
    };
    let z = e.binary(Binary::Zeta, x1, b.clone())?;
    let t = e.mul(z, a.clone())?;
    let t = e.mul(g, t)?;
    Ok((None, Some(e.neg(t)?)))
}

/// The value of a number operand (a literal or a number input); `None` for tensors.
fn number_value(e: &Emitter, a: &Arg) -> Option<f64> {
    match a {
        Arg::Scalar(s) => Some(s.as_f64()),
        Arg::Value(v) => match e.builder.value(*v) {
            Some(ValueKind::Number(n)) => Some(n.as_f64()),
            _ => None,
        },
        _ => None,
    }
}

/// Whether an operand is a tensor: not a number literal, a number input or a symbolic int.
fn is_tensor(e: &Emitter, a: &Arg) -> bool {
    matches!(a, Arg::Value(_)) && number_value(e, a).is_none()
}

/// `g * b * a^(b-1)`, zero where `b == 0` (as torch).
fn pow_grad_base(e: &mut Emitter, a: &Arg, b: &Arg, g: ValueId) -> Result<Option<ValueId>> {
    if !is_tensor(e, a) {
        return Ok(None);
    }
    let zero = e.scalar(g, 0.0);
    if let Some(exponent) = number_value(e, b) {
        if exponent == 0.0 {
            return Ok(Some(e.zeros_like(g)?));
        }
        let p = e.binary(Binary::Pow, a.clone(), e.scalar(g, exponent - 1.0))?;
        let t = e.mul(p, e.scalar(g, exponent))?;
        return Ok(Some(e.mul(g, t)?));
    }
    if let Arg::Sym(s) = b {
        // A symbolic exponent (a size, `x ** T`): an int, as eager's, whose value 0 is decided.
        let exponent = Dim::Sym(s.clone());
        if e.builder.facts_mut().is(&exponent, 0) {
            return Ok(Some(e.zeros_like(g)?));
        }
        let p = e.binary(Binary::Pow, a.clone(), Arg::dim(&exponent.sub(&Dim::Const(1))))?;
        let t = e.mul(p, b.clone())?;
        return Ok(Some(e.mul(g, t)?));
    }
    let bm1 = e.sub(b.clone(), e.scalar(g, 1.0))?;
    let p = e.binary(Binary::Pow, a.clone(), bm1)?;
    let t = e.mul(p, b.clone())?;
    let t = e.mul(g, t)?;
    let b_zero = e.binary(Binary::Eq, b.clone(), zero.clone())?;
    Ok(Some(e.where_(b_zero, zero, t)?))
}

/// `g * where(a == 0 and b >= 0, 0, y * log(a))`, as torch computes it: the cotangent first, so
/// that the gradient has its layout (TensorIterator's order of the first operand), not the mask's.
fn pow_grad_exponent(e: &mut Emitter, a: &Arg, b: &Arg, y: ValueId, g: ValueId) -> Result<Option<ValueId>> {
    if !is_tensor(e, b) {
        return Ok(None);
    }
    let zero = e.scalar(g, 0.0);
    let (t, a_zero) = match (number_value(e, a), a.as_value()) {
        (Some(base), _) => (e.mul(y, e.scalar(g, base.ln()))?, Arg::Scalar(Scalar::Bool(base == 0.0))),
        (None, Some(a)) => {
            let la = e.unary(Unary::Log, a)?;
            (e.mul(y, la)?, Arg::Value(e.binary(Binary::Eq, a, zero.clone())?))
        }
        // A symbolic base (a size, `T ** x`): its log in float64, as eager takes a number's, then
        // in the gradient's dtype.
        (None, None) => {
            let zeros = e.full_like(g, 0.0)?;
            let zeros = e.convert(zeros, DType::F64)?;
            let base = e.add(zeros, a.clone())?;
            let la = e.unary(Unary::Log, base)?;
            let la = e.convert(la, e.meta(g).dtype)?;
            (e.mul(y, la)?, Arg::Value(e.binary(Binary::Eq, base, e.scalar(base, 0.0))?))
        }
    };
    let b_nonneg = e.binary(Binary::Ge, b.clone(), zero.clone())?;
    let mask = e.binary(Binary::BitwiseAnd, b_nonneg, a_zero)?;
    let t = e.where_(mask, zero, t)?;
    Ok(Some(e.mul(g, t)?))
}

/// `where(pred, a, b)`: the gradient goes to the branch each element came from.
fn vjp_where(e: &mut Emitter, pred: &Arg, g: ValueId) -> Result<Grads> {
    let zero = e.scalar(g, 0.0);
    let ga = e.where_(pred.clone(), g, zero.clone())?;
    let gb = e.where_(pred.clone(), zero, g)?;
    Ok(vec![None, Some(ga), Some(gb)])
}

/// `convert_element_type` and `device_put`: the gradient goes back to the input's dtype/device.
fn vjp_retype(prim: &Elementwise, e: &mut Emitter, x: ValueId, g: ValueId) -> Result<Option<ValueId>> {
    let m = e.meta(x);
    Ok(match prim {
        Elementwise::ConvertElementType { .. } if m.dtype.is_inexact() => Some(e.convert(g, m.dtype)?),
        Elementwise::DevicePut { .. } => {
            Some(e.emit(Elementwise::DevicePut { device: m.device }, vec![Arg::Value(g)])?)
        }
        _ => None,
    })
}
