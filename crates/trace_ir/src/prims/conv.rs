//! Convolution (and transposed convolution) over 1-3 spatial dims, and its backward.
//!
//! Both are claimed whole by an executor (torch runs them as `torch.convolution` and aten's
//! `convolution_backward`), so a compiled training step makes the same kernel calls as eager.

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::Operand;
use crate::bail;
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{Dim, Facts, Poly};
use crate::value::{Arg, TensorMeta, ValueKind};
use crate::ValueId;

declare_family! {
    /// Convolution prims; inputs are batched (`N, C, *spatial`).
    pub enum Conv {
        /// `torch.convolution(a, weight, bias, ...)`.
        Convolution = "convolution", Operands::WithOptional(2), {
            stride: Vec<i64> = "stride", padding: Vec<i64> = "padding", dilation: Vec<i64> = "dilation",
            transposed: bool = "transposed", output_padding: Vec<i64> = "output_padding", groups: Dim = "groups",
        };
        /// The gradients of `convolution` with respect to `(input, weight, bias)` given `grad`, the
        /// ones asked for in that order (aten's `convolution_backward`).
        ConvolutionBackward = "convolution_backward", Operands::Fixed(3), {
            stride: Vec<i64> = "stride", padding: Vec<i64> = "padding", dilation: Vec<i64> = "dilation",
            transposed: bool = "transposed", output_padding: Vec<i64> = "output_padding", groups: Dim = "groups",
            input_grad: bool = "input_grad", weight_grad: bool = "weight_grad", bias_grad: bool = "bias_grad",
        };
    }
}

/// The geometry both prims share.
struct Geometry<'a> {
    stride: &'a [i64],
    padding: &'a [i64],
    dilation: &'a [i64],
    transposed: bool,
    output_padding: &'a [i64],
    /// symbolic where vmap folds per-example weights into groups (one group per example)
    groups: &'a Dim,
}

impl Conv {
    fn geometry(&self) -> Geometry<'_> {
        match self {
            Conv::Convolution { stride, padding, dilation, transposed, output_padding, groups }
            | Conv::ConvolutionBackward { stride, padding, dilation, transposed, output_padding, groups, .. } => {
                Geometry { stride, padding, dilation, transposed: *transposed, output_padding, groups }
            }
        }
    }
}

impl Family for Conv {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let geometry = self.geometry();
        match self {
            Conv::Convolution { .. } => {
                let folded = geometry.groups.is_sym();
                let a = &batched(tensor(op, "a", &operands[0])?, folded, facts);
                let w = &constant(tensor(op, "weight", &operands[1])?, folded, facts);
                let bias =
                    operands.get(2).map(|b| tensor(op, "bias", b)).transpose()?.map(|b| constant(b, folded, facts));
                Ok(vec![convolution(op, &geometry, a, w, bias.as_ref(), facts)?])
            }
            Conv::ConvolutionBackward { input_grad, weight_grad, bias_grad, .. } => {
                let folded = geometry.groups.is_sym();
                let g = &batched(tensor(op, "grad", &operands[0])?, folded, facts);
                let a = &batched(tensor(op, "a", &operands[1])?, folded, facts);
                let w = &constant(tensor(op, "weight", &operands[2])?, folded, facts);
                let out = convolution(op, &geometry, a, w, None, facts)?;
                if !facts.same_shape(&out.shape, &g.shape) || out.dtype != g.dtype {
                    bail!(Value, op, "grad is {} but the convolution gives {}", g.describe(), out.describe());
                }
                let bias = TensorMeta::with_dims(g.dtype, g.device, vec![out.shape[1].clone()]);
                let wanted = [(*input_grad, a.clone()), (*weight_grad, w.clone()), (*bias_grad, bias)];
                Ok(wanted.into_iter().filter(|(want, _)| *want).map(|(_, m)| m).collect())
            }
        }
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], _outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let Conv::Convolution { stride, padding, dilation, transposed, output_padding, groups } = self else {
            bail!(
                NotImplemented,
                "prims.convolution_backward",
                "the second derivative of a convolution is not supported"
            );
        };
        let Some(g) = cots[0] else { return Ok(vec![None; operands.len()]) };
        let wants = |e: &Emitter, i: usize| {
            operands
                .get(i)
                .and_then(Arg::as_value)
                .is_some_and(|v| matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad))
        };
        let (input_grad, weight_grad, bias_grad) = (wants(e, 0), wants(e, 1), wants(e, 2));
        if !(input_grad || weight_grad || bias_grad) {
            return Ok(vec![None; operands.len()]);
        }
        let backward = Conv::ConvolutionBackward {
            stride: stride.clone(),
            padding: padding.clone(),
            dilation: dilation.clone(),
            transposed: *transposed,
            output_padding: output_padding.clone(),
            groups: groups.clone(),
            input_grad,
            weight_grad,
            bias_grad,
        };
        let args = vec![g.into(), operands[0].clone(), operands[1].clone()];
        let mut grads = e.builder.record(backward.into(), args)?.into_iter();
        let mut next = |want: bool| if want { grads.next() } else { None };
        let mut out = vec![next(input_grad), next(weight_grad)];
        if operands.len() == 3 {
            out.push(next(bias_grad));
        }
        Ok(out)
    }
}

/// `t` with its channels (dim 1) constant: its batch and spatial sizes may stay symbolic (a CNN
/// over batches or images of several sizes), its channels are the weight's; a symbolic one is
/// taken at its hint (a guard). Under symbolic groups (`folded`: vmap's examples folded into
/// the channels, a group each) the channels stay symbolic.
fn batched(t: &TensorMeta, folded: bool, facts: &mut Facts) -> TensorMeta {
    let mut t = t.clone();
    if let Some(c) = t.shape.get_mut(1).filter(|_| !folded) {
        *c = Dim::Const(facts.specialise(c));
    }
    t
}

/// `t` with every size constant (a weight or bias), symbolic ones taken at their hints; under
/// symbolic groups (`folded`) its first dim, which holds the examples' weights, stays symbolic.
fn constant(t: &TensorMeta, folded: bool, facts: &mut Facts) -> TensorMeta {
    let mut t = t.clone();
    for d in t.shape.iter_mut().skip(usize::from(folded)) {
        *d = Dim::Const(facts.specialise(d));
    }
    t
}

/// The output of a convolution of `a` with `w` (torch's shape rules), checking every argument;
/// `w` and `bias` are constant, `a`'s channels too (`batched`, `constant`).
fn convolution(
    op: &str,
    geo: &Geometry,
    a: &TensorMeta,
    w: &TensorMeta,
    bias: Option<&TensorMeta>,
    facts: &mut Facts,
) -> Result<TensorMeta> {
    let spatial = check_operands(op, a, w, bias)?;
    check_geometry(op, geo, spatial)?;
    let out_channels = check_channels(op, geo, a, w, bias, facts)?;
    let mut shape = vec![a.shape[0].clone(), out_channels];
    for i in 0..spatial {
        shape.push(spatial_output(op, geo, a, w, i, facts)?);
    }
    Ok(TensorMeta::with_dims(a.dtype, a.device, shape))
}

/// The number of spatial dims of a convolution of `a` with `w`, checking their ranks, dtypes and
/// devices.
fn check_operands(op: &str, a: &TensorMeta, w: &TensorMeta, bias: Option<&TensorMeta>) -> Result<usize> {
    let spatial = w.ndim().saturating_sub(2);
    if !(1..=3).contains(&spatial) {
        bail!(Value, op, "expected a weight of rank 3, 4 or 5, got {:?} (argument weight)", w.shape);
    }
    if a.ndim() != w.ndim() {
        bail!(
            Value,
            op,
            "expected a batched input of rank {} for a weight of rank {}, got {:?} (argument a)",
            w.ndim(),
            w.ndim(),
            a.shape
        );
    }
    for other in [Some(w), bias].into_iter().flatten() {
        if other.dtype != a.dtype || other.device != a.device {
            bail!(Type, op, "a is {} but weight or bias is {}", a.describe(), other.describe());
        }
    }
    Ok(spatial)
}

/// Checks that stride, padding, dilation and output padding hold one valid value per spatial
/// dim, and that groups is positive.
fn check_geometry(op: &str, geo: &Geometry, spatial: usize) -> Result<()> {
    let lists = [
        ("stride", geo.stride),
        ("padding", geo.padding),
        ("dilation", geo.dilation),
        ("output_padding", geo.output_padding),
    ];
    for (name, list) in lists {
        if list.len() != spatial {
            bail!(Value, op, "expected {spatial} values for {name}, got {list:?}");
        }
    }
    if geo.stride.iter().chain(geo.dilation).any(|&s| s < 1)
        || geo.padding.iter().chain(geo.output_padding).any(|&p| p < 0)
    {
        bail!(
            Value,
            op,
            "stride and dilation must be positive and padding non-negative (stride {:?}, dilation {:?}, padding {:?})",
            geo.stride,
            geo.dilation,
            geo.padding
        );
    }
    if geo.groups.hint() < 1 {
        bail!(Value, op, "non-positive groups is not supported (argument groups = {})", geo.groups);
    }
    Ok(())
}

/// The output channels, checking the input's channels, the weight's groups and the bias's shape
/// (symbolic sizes: by the relations their hints satisfy, recorded in `facts`).
fn check_channels(
    op: &str,
    geo: &Geometry,
    a: &TensorMeta,
    w: &TensorMeta,
    bias: Option<&TensorMeta>,
    facts: &mut Facts,
) -> Result<Dim> {
    let groups = geo.groups;
    let (in_channels, out_channels) = if geo.transposed {
        (w.shape[0].clone(), w.shape[1].mul(groups))
    } else {
        (w.shape[1].mul(groups), w.shape[0].clone())
    };
    if !facts.equal(&a.shape[1], &in_channels) {
        bail!(Runtime, op, "expected input {:?} to have {in_channels} channels (weight {:?}, groups {groups}), but got {} channels instead (argument a)", a.shape, w.shape, a.shape[1]);
    }
    if !divisible(&w.shape[0], groups, facts) {
        bail!(
            Runtime,
            op,
            "expected weight {:?} to be divisible by groups = {groups} at dimension 0 (argument weight)",
            w.shape
        );
    }
    if let Some(b) = bias {
        if !facts.same_shape(&b.shape, std::slice::from_ref(&out_channels)) {
            bail!(Runtime, op, "expected a bias of shape [{out_channels}], got {:?} (argument bias)", b.shape);
        }
    }
    Ok(out_channels)
}

/// Whether `size` is a multiple of `groups`, decided as the other rules decide a size's remainder
/// (`Facts::is` of `size % k`, a guard where it is symbolic). A symbolic count (vmap's examples
/// folded into the groups, `2*t0`) divides `size` by its atoms as a polynomial first, leaving the
/// remainder by its coefficient (`t0*t1 % (2*t0)` is `t1 % 2`); a count of another form is taken at
/// its hint (a guard).
fn divisible(size: &Dim, groups: &Dim, facts: &mut Facts) -> bool {
    if let Some(k) = groups.as_const() {
        return facts.is(&size.rem(k), 0);
    }
    if size.poly().exact_div(&groups.poly()).is_some() {
        return true;
    }
    if let [(atoms, k)] = groups.poly().terms() {
        if let Some(quotient) = size.poly().exact_div(&Poly::from_terms(vec![(atoms.clone(), 1)])) {
            let hint = size.hint() / (groups.hint() / k);
            return facts.is(&Dim::from_poly(quotient, hint).rem(*k), 0);
        }
    }
    size.hint() % facts.specialise(groups) == 0
}

/// The output size of spatial dim `i`: an expression of the input's size where it is symbolic.
fn spatial_output(
    op: &str,
    geo: &Geometry,
    a: &TensorMeta,
    w: &TensorMeta,
    i: usize,
    facts: &mut Facts,
) -> Result<Dim> {
    let (size, k) = (&a.shape[2 + i], w.shape[2 + i].hint());
    let (s, p, d, op_) = (geo.stride[i], geo.padding[i], geo.dilation[i], geo.output_padding[i]);
    let out = if geo.transposed {
        size.sub(&Dim::Const(1)).mul(&Dim::Const(s)).add(&Dim::Const(-2 * p + d * (k - 1) + op_ + 1))
    } else {
        size.add(&Dim::Const(2 * p - d * (k - 1) - 1)).floordiv(s).add(&Dim::Const(1))
    };
    if !facts.le(&Dim::Const(1), &out) {
        bail!(
            Runtime,
            op,
            "calculated output size {out} at spatial dim {i} is too small (input {:?}, kernel {:?}) (argument a)",
            a.shape,
            w.shape
        );
    }
    Ok(out)
}
