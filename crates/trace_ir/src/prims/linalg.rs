//! Meta rules of `matmul` and `linear` (torch's shape semantics, including batch broadcasting).

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::Operand;
use crate::bail;
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Matrix products.
    pub enum Linalg {
        /// `torch.matmul`, with its rules for 1-D operands and batch broadcasting.
        Matmul = "matmul", Operands::Fixed(2), {};
        /// `x @ weight.T + bias`.
        Linear = "linear", Operands::WithOptional(2), {};
    }
}

impl Family for Linalg {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        meta(self, op, operands, facts)
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], _outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        match cots[0] {
            Some(g) => vjp(self, e, operands, g),
            None => Ok(vec![None; operands.len()]),
        }
    }
}

fn same_kind(op: &str, a: &TensorMeta, b: &TensorMeta, b_name: &str) -> Result<()> {
    if a.dtype != b.dtype {
        bail!(Type, op, "dtypes of a ({}) and {b_name} ({}) differ", a.dtype, b.dtype);
    }
    if a.device != b.device {
        bail!(Value, op, "a is on {} but {b_name} is on {}", a.device, b.device);
    }
    if a.dtype.is_bool() {
        bail!(Type, op, "bool tensors are not supported (argument a)");
    }
    Ok(())
}

/// Broadcasts two batch shapes by torch's rules.
pub(super) fn broadcast_shapes(op: &str, a: &[Dim], b: &[Dim], facts: &mut Facts) -> Result<Vec<Dim>> {
    let n = a.len().max(b.len());
    let one = Dim::Const(1);
    let at = |s: &[Dim], i: usize| if i + s.len() >= n { s[i + s.len() - n].clone() } else { Dim::Const(1) };
    (0..n)
        .map(|i| {
            let (x, y) = (at(a, i), at(b, i));
            if facts.equal(&x, &y) || facts.equal(&y, &one) {
                Ok(x)
            } else if facts.equal(&x, &one) {
                Ok(y)
            } else {
                bail!(Value, op, "batch dimensions of a {} and b {} do not broadcast ({x} vs {y})", show(a), show(b))
            }
        })
        .collect()
}

fn matmul(op: &str, a: &TensorMeta, b: &TensorMeta, facts: &mut Facts) -> Result<Vec<Dim>> {
    same_kind(op, a, b, "b")?;
    if a.ndim() == 0 || b.ndim() == 0 {
        bail!(Value, op, "both arguments need to be at least 1D, got a {} and b {}", show(&a.shape), show(&b.shape));
    }
    let k_a = &a.shape[a.ndim() - 1];
    let k_b = if b.ndim() == 1 { &b.shape[0] } else { &b.shape[b.ndim() - 2] };
    if !facts.equal(k_a, k_b) {
        bail!(
            Value,
            op,
            "a {} and b {} cannot be multiplied (inner dimensions {k_a} and {k_b} differ)",
            show(&a.shape),
            show(&b.shape)
        );
    }
    let a_batch = if a.ndim() > 2 { &a.shape[..a.ndim() - 2] } else { &[][..] };
    let b_batch = if b.ndim() > 2 { &b.shape[..b.ndim() - 2] } else { &[][..] };
    let mut shape = broadcast_shapes(op, a_batch, b_batch, facts)?;
    if a.ndim() >= 2 {
        shape.push(a.shape[a.ndim() - 2].clone());
    }
    if b.ndim() >= 2 {
        shape.push(b.shape[b.ndim() - 1].clone());
    }
    Ok(shape)
}

fn linear(op: &str, a: &TensorMeta, w: &TensorMeta, bias: Option<&TensorMeta>, facts: &mut Facts) -> Result<Vec<Dim>> {
    same_kind(op, a, w, "weight")?;
    if a.ndim() == 0 || w.ndim() == 0 || w.ndim() > 2 {
        bail!(
            Value,
            op,
            "expected a of rank >= 1 and weight of rank 1 or 2, got a {} and weight {}",
            show(&a.shape),
            show(&w.shape)
        );
    }
    let k = &a.shape[a.ndim() - 1];
    let k_w = &w.shape[w.ndim() - 1];
    if !facts.equal(k, k_w) {
        bail!(
            Value,
            op,
            "a {} and weight {} cannot be multiplied ({k} vs {k_w} in features)",
            show(&a.shape),
            show(&w.shape)
        );
    }
    let mut shape = a.shape[..a.ndim() - 1].to_vec();
    if w.ndim() == 2 {
        shape.push(w.shape[0].clone());
    }
    if let Some(bias) = bias {
        same_kind(op, a, bias, "bias")?;
        let fits = broadcast_shapes(op, &shape, &bias.shape, facts).is_ok_and(|out| facts.same_shape(&out, &shape));
        if !fits {
            bail!(Value, op, "bias {} does not broadcast to the output shape {}", show(&bias.shape), show(&shape));
        }
    }
    Ok(shape)
}

fn meta(prim: &Linalg, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    let a = tensor(op, "a", &operands[0])?;
    let b = tensor(op, if *prim == (Linalg::Matmul {}) { "b" } else { "weight" }, &operands[1])?;
    let shape = match prim {
        Linalg::Matmul {} => matmul(op, a, b, facts)?,
        Linalg::Linear {} => {
            let bias = operands.get(2).map(|o| tensor(op, "bias", o)).transpose()?;
            linear(op, a, b, bias, facts)?
        }
    };
    Ok(vec![TensorMeta::with_dims(a.dtype, a.device, shape)])
}

// ---------------------------------------------------------------------------------- VJP rules

fn vjp(prim: &Linalg, e: &mut Emitter, operands: &[Arg], g: ValueId) -> Result<Grads> {
    let a = operands[0].as_value().expect("linalg operands are tensors");
    let b = operands[1].as_value().expect("linalg operands are tensors");
    match prim {
        Linalg::Matmul {} => vjp_matmul(e, a, b, g),
        Linalg::Linear {} => {
            let mut grads = vjp_linear(e, a, b, g)?;
            if let Some(bias) = operands.get(2).and_then(Arg::as_value) {
                let shape = e.meta(bias).shape;
                grads.push(Some(e.sum_to(g, &shape)?));
            }
            Ok(grads)
        }
    }
}

/// `matmul` with torch's rules for 1-D operands (a vector is a row on the left and a column on
/// the right) and broadcast batch dimensions, which the gradients sum back.
fn vjp_matmul(e: &mut Emitter, a: ValueId, b: ValueId, g: ValueId) -> Result<Grads> {
    let (sa, sb) = (e.meta(a).shape, e.meta(b).shape);
    if sa.len() == 1 && sb.len() == 1 {
        let ga = e.broadcast(g, &sa, vec![])?;
        let gb = e.broadcast(g, &sb, vec![])?;
        return Ok(vec![Some(e.mul(ga, b)?), Some(e.mul(gb, a)?)]);
    }
    let one = Dim::Const(1);
    let a2 = if sa.len() == 1 { e.reshape(a, &[one.clone(), sa[0].clone()])? } else { a };
    let b2 = if sb.len() == 1 { e.reshape(b, &[sb[0].clone(), one.clone()])? } else { b };
    let (sa2, sb2) = (e.meta(a2).shape, e.meta(b2).shape);
    let mut g_shape = e.meta(g).shape;
    if sa.len() == 1 {
        g_shape.insert(g_shape.len() - usize::from(sb.len() > 1), one.clone());
    }
    if sb.len() == 1 {
        g_shape.push(one);
    }
    let g2 = e.reshape(g, &g_shape)?;
    let bt = e.swap_last(b2)?;
    let ga = e.emit(Linalg::Matmul {}, vec![g2.into(), bt.into()])?;
    let ga = e.sum_to(ga, &sa2)?;
    let at = e.swap_last(a2)?;
    let gb = e.emit(Linalg::Matmul {}, vec![at.into(), g2.into()])?;
    let gb = e.sum_to(gb, &sb2)?;
    Ok(vec![Some(e.reshape(ga, &sa)?), Some(e.reshape(gb, &sb)?)])
}

/// `linear(x, w) = x @ w.T` with `w` of rank 2 or 1; the bias is handled by the caller.
fn vjp_linear(e: &mut Emitter, x: ValueId, w: ValueId, g: ValueId) -> Result<Grads> {
    let (sx, sw) = (e.meta(x).shape, e.meta(w).shape);
    let r = sx.len();
    if sw.len() == 1 {
        let gb = e.broadcast(g, &sx, (0..r - 1).collect())?;
        let wb = e.broadcast(w, &sx, vec![r - 1])?;
        let gx = e.mul(gb, wb)?;
        let gw = e.mul(gb, x)?;
        let gw = e.sum(gw, (0..r - 1).collect())?;
        return Ok(vec![Some(gx), Some(gw)]);
    }
    let gx = e.emit(Linalg::Matmul {}, vec![g.into(), w.into()])?;
    let rows = Dim::product(&sx[..r - 1]);
    let g2 = e.reshape(g, &[rows.clone(), sw[0].clone()])?;
    let x2 = e.reshape(x, &[rows, sw[1].clone()])?;
    let gt = e.swap_last(g2)?;
    let gw = e.emit(Linalg::Matmul {}, vec![gt.into(), x2.into()])?;
    Ok(vec![Some(gx), Some(gw)])
}
