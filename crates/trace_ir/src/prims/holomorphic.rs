//! Gradients of complex values through the holomorphic elementwise prims: their real VJP rules
//! (`elementwise`) conjugated, as torch's convention for complex autograd takes them (the gradient
//! of a real loss with respect to `z` is `g * conj(f'(z))`), and the pieces where eager's complex
//! formula computes otherwise than its real one.

use super::elementwise::{square_plus, Binary, Unary};
use crate::error::Result;
use crate::grad::Emitter;
use crate::value::Arg;
use crate::ValueId;

impl Unary {
    /// Whether the prim is holomorphic on complex values, where its VJP rule holds in torch's
    /// convention conjugated (`conjugated`): the exponentials and logarithms, roots and
    /// reciprocal, the (inverse) circular and hyperbolic functions.
    pub fn is_holomorphic(self) -> bool {
        use Unary::*;
        matches!(
            self,
            Neg | Exp
                | Exp2
                | Expm1
                | Log
                | Log1p
                | Log2
                | Log10
                | Sqrt
                | Rsqrt
                | Reciprocal
                | Sin
                | Cos
                | Tan
                | Tanh
                | Sinh
                | Cosh
                | Asin
                | Acos
                | Atan
                | Asinh
                | Acosh
                | Atanh
        )
    }
}

/// A holomorphic prim's gradient of complex values in torch's convention, `g * conj(f'(x))`, from
/// its real rule `rule(g) = g * f'(x)` (linear in `g`): `conj(rule(conj(g)))`. Each rule's
/// products and quotients are eager's formula's (`grad * result.conj()`, `grad / self.conj()`,
/// ...) with both operands conjugated, which rounds to the same values (IEEE rounding is
/// symmetric under negation).
pub(super) fn conjugated<T>(
    e: &mut Emitter,
    g: ValueId,
    rule: impl FnOnce(&mut Emitter, ValueId) -> Result<T>,
) -> Result<T>
where
    T: Conjugate,
{
    let g = conj(e, g)?;
    let grad = rule(e, g)?;
    grad.conjugate(e)
}

/// The gradients a rule gives, conjugated (`conjugated`).
pub(super) trait Conjugate: Sized {
    fn conjugate(self, e: &mut Emitter) -> Result<Self>;
}

impl Conjugate for Option<ValueId> {
    fn conjugate(self, e: &mut Emitter) -> Result<Self> {
        self.map(|v| conj(e, v)).transpose()
    }
}

impl Conjugate for (Option<ValueId>, Option<ValueId>) {
    fn conjugate(self, e: &mut Emitter) -> Result<Self> {
        Ok((self.0.conjugate(e)?, self.1.conjugate(e)?))
    }
}

/// The conjugate of the value `v` (`v` itself where it is real).
fn conj(e: &mut Emitter, v: ValueId) -> Result<ValueId> {
    Ok(e.conj(&Arg::Value(v))?.as_value().unwrap_or(v))
}

/// `square_plus` with eager's `v.pow(2)` (`tan`, `asinh`, `atanh`'s formulas): of complex values
/// `pow`'s kernel, whose products may round apart from `mul`'s (its scalar loop's contraction);
/// of real ones the same product.
pub(super) fn square_plus_pow(e: &mut Emitter, v: ValueId, sign: f64, add: f64) -> Result<ValueId> {
    if !e.meta(v).dtype.is_complex() {
        return square_plus(e, v, sign, add);
    }
    let sq = e.binary(Binary::Pow, v, e.scalar(v, 2.0))?;
    let sq = if sign < 0.0 { e.neg(sq)? } else { sq };
    e.add(sq, e.scalar(v, add))
}
