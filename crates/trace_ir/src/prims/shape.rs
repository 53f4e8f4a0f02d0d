//! The shape prims: they only move or select elements.

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::Operand;
use crate::bail;
use crate::error::Result;
use crate::grad::{number, Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, Scalar, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Shape prims.
    pub enum Shape {
        /// `a`'s dims placed at `dims` of `shape`, size-1 dims stretched.
        BroadcastInDim = "broadcast_in_dim", Operands::Fixed(1),
            { shape: Vec<Dim> = "shape", dims: Vec<usize> = "broadcast_dimensions" };
        /// The same elements in row-major order under `shape` (same number of elements).
        Reshape = "reshape", Operands::Fixed(1), { shape: Vec<Dim> = "shape" };
        /// The dims permuted: output dim `i` is input dim `perm[i]` (`torch.permute`).
        Transpose = "transpose", Operands::Fixed(1), { perm: Vec<usize> = "permutation" };
        /// Elements `start[d]..end[d]` step `strides[d]` along every dim `d`.
        Slice = "slice", Operands::Fixed(1),
            { start: Vec<Dim> = "start_indices", end: Vec<Dim> = "end_indices", strides: Vec<i64> = "strides" };
        /// `a` without its size-1 dims `dims`.
        Squeeze = "squeeze", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
        /// The operands (a list) joined along `dim`; they agree in every other dim.
        Cat = "cat", Operands::List, { dim: usize = "dim" };
        /// `(lo, hi, interior)` padding per dim with `value`; negative `lo`/`hi` crop.
        Pad = "pad", Operands::Fixed(1),
            { value: Scalar = "padding_value", config: Vec<(Dim, Dim, i64)> = "padding_config" };
        /// `a` with the order of elements reversed along each of `dims`.
        Flip = "flip", Operands::Fixed(1), { dims: Vec<usize> = "dims" };
    }
}

impl Family for Shape {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        if let Shape::Cat { dim } = self {
            return cat(op, operands, *dim, facts);
        }
        let a = tensor(op, "a", &operands[0])?;
        let shape = match self {
            Shape::BroadcastInDim { shape, dims } => broadcast_in_dim(op, a, shape, dims, facts)?,
            Shape::Reshape { shape } => reshape(op, a, shape, facts)?,
            Shape::Transpose { perm } => transpose(op, a, perm)?,
            Shape::Slice { start, end, strides } => slice(op, a, start, end, strides, facts)?,
            Shape::Squeeze { dims } => squeeze(op, a, dims, facts)?,
            Shape::Pad { config, .. } => pad(op, a, config, facts)?,
            Shape::Flip { dims } => {
                check_dims(op, "dims", dims, a.ndim())?;
                a.shape.clone()
            }
            Shape::Cat { .. } => unreachable!("cat is handled above"),
        };
        Ok(vec![TensorMeta::with_dims(a.dtype, a.device, shape)])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], _outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        match cots[0] {
            Some(g) => vjp(self, e, operands, g),
            None => Ok(vec![None; operands.len()]),
        }
    }
}

/// Checks that `dims` are unique and within `0..ndim`.
pub(super) fn check_dims(op: &str, what: &str, dims: &[usize], ndim: usize) -> Result<()> {
    let mut seen = vec![false; ndim];
    for &d in dims {
        if d >= ndim {
            bail!(Index, op, "{what} contains {d}, out of range for a tensor of rank {ndim}");
        }
        if std::mem::replace(&mut seen[d], true) {
            bail!(Value, op, "{what} contains {d} more than once");
        }
    }
    Ok(())
}

fn broadcast_in_dim(op: &str, a: &TensorMeta, shape: &[Dim], dims: &[usize], facts: &mut Facts) -> Result<Vec<Dim>> {
    if dims.len() != a.ndim() {
        bail!(Value, op, "broadcast_dimensions has {} entries but a has rank {}", dims.len(), a.ndim());
    }
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        bail!(Value, op, "broadcast_dimensions {dims:?} must be strictly increasing");
    }
    for (i, (&d, size)) in dims.iter().zip(&a.shape).enumerate() {
        let Some(target) = shape.get(d) else {
            bail!(Index, op, "broadcast_dimensions[{i}] = {d} is out of range for shape {}", show(shape));
        };
        // Equality first: a size broadcast into the same size is valid whatever its value, with no
        // decision (asking `size == 1` first guarded `size != 1` for every symbolic size); a
        // constant 1 broadcasts into any size, also with no decision (comparing it with a symbolic
        // target guarded that target `!= 1`: a count of 1 then missed a variant that serves it).
        if *size != Dim::Const(1) && !facts.equal(size, target) && !facts.is(size, 1) {
            bail!(
                Value,
                op,
                "a's dimension {i} has size {size}, which cannot broadcast to size {target} (argument shape {})",
                show(shape)
            );
        }
    }
    check_sizes(op, "shape", shape, facts)?;
    Ok(shape.to_vec())
}

fn check_sizes(op: &str, what: &str, shape: &[Dim], facts: &mut Facts) -> Result<()> {
    if let Some(bad) = shape.iter().find(|s| !facts.le(&Dim::Const(0), s)) {
        bail!(Value, op, "{what} {} has a negative size {bad}", show(shape));
    }
    Ok(())
}

fn reshape(op: &str, a: &TensorMeta, shape: &[Dim], facts: &mut Facts) -> Result<Vec<Dim>> {
    check_sizes(op, "shape", shape, facts)?;
    if !facts.equal(&Dim::product(shape), &a.numel()) {
        bail!(Value, op, "shape {} is invalid for input of size {} (argument shape)", show(shape), a.numel());
    }
    Ok(shape.to_vec())
}

fn transpose(op: &str, a: &TensorMeta, perm: &[usize]) -> Result<Vec<Dim>> {
    if perm.len() != a.ndim() {
        bail!(Value, op, "permutation {perm:?} has {} entries but a has rank {}", perm.len(), a.ndim());
    }
    check_dims(op, "permutation", perm, a.ndim())?;
    Ok(perm.iter().map(|&p| a.shape[p].clone()).collect())
}

fn slice(op: &str, a: &TensorMeta, start: &[Dim], end: &[Dim], strides: &[i64], facts: &mut Facts) -> Result<Vec<Dim>> {
    let n = a.ndim();
    if start.len() != n || end.len() != n || strides.len() != n {
        bail!(Value, op, "start_indices, end_indices and strides must have a's rank {n}");
    }
    (0..n)
        .map(|i| {
            let (s, e, st, size) = (&start[i], &end[i], strides[i], &a.shape[i]);
            if st < 1 {
                bail!(Value, op, "strides[{i}] = {st} must be positive");
            }
            if !facts.le(&Dim::Const(0), s) || !facts.le(s, size) {
                bail!(Index, op, "start_indices[{i}] = {s} is out of range for dimension {i} of size {size}");
            }
            if !facts.le(s, e) || !facts.le(e, size) {
                bail!(
                    Index,
                    op,
                    "end_indices[{i}] = {e} is out of range [{s}, {size}] for dimension {i} of size {size}"
                );
            }
            Ok(e.sub(s).add(&Dim::Const(st - 1)).floordiv(st))
        })
        .collect()
}

fn squeeze(op: &str, a: &TensorMeta, dims: &[usize], facts: &mut Facts) -> Result<Vec<Dim>> {
    check_dims(op, "dims", dims, a.ndim())?;
    if let Some(&d) = dims.iter().find(|&&d| !facts.is(&a.shape[d], 1)) {
        bail!(Value, op, "cannot squeeze dimension {d} of size {} (argument dims)", a.shape[d]);
    }
    Ok(a.shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, s)| s.clone()).collect())
}

/// A size after interior dilation: `size + (size - 1) * dilation`, 0 for an empty dim.
fn dilated(size: &Dim, dilation: i64, facts: &mut Facts) -> Dim {
    if dilation == 0 || facts.is(size, 0) {
        return if dilation == 0 { size.clone() } else { Dim::Const(0) };
    }
    size.add(&size.sub(&Dim::Const(1)).mul(&Dim::Const(dilation)))
}

fn pad(op: &str, a: &TensorMeta, config: &[(Dim, Dim, i64)], facts: &mut Facts) -> Result<Vec<Dim>> {
    if config.len() != a.ndim() {
        bail!(Value, op, "padding_config has {} entries but a has rank {}", config.len(), a.ndim());
    }
    a.shape
        .iter()
        .zip(config)
        .enumerate()
        .map(|(i, (size, (lo, hi, dilation)))| {
            if *dilation < 0 {
                bail!(Value, op, "padding_config[{i}] has negative dilation {dilation}");
            }
            let out = lo.add(hi).add(&dilated(size, *dilation, facts));
            if !facts.le(&Dim::Const(0), &out) {
                bail!(Value, op, "padding_config[{i}] = ({lo}, {hi}, {dilation}) gives negative size {out}");
            }
            Ok(out)
        })
        .collect()
}

fn cat(op: &str, operands: &[Operand], dim: usize, facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    if operands.is_empty() {
        bail!(Value, op, "expected a non-empty list of tensors (argument tensors)");
    }
    let first = tensor(op, "tensors[0]", &operands[0])?;
    if dim >= first.ndim() {
        bail!(Index, op, "dim {dim} is out of range for tensors of rank {}", first.ndim());
    }
    let mut shape = first.shape.clone();
    shape[dim] = Dim::Const(0);
    for (i, operand) in operands.iter().enumerate() {
        let t = tensor(op, &format!("tensors[{i}]"), operand)?;
        if t.dtype != first.dtype || t.device != first.device {
            bail!(Type, op, "tensors[{i}] is {} but tensors[0] is {}", t.describe(), first.describe());
        }
        let matches = t.ndim() == first.ndim()
            && t.shape.iter().zip(&first.shape).enumerate().all(|(d, (x, y))| d == dim || facts.equal(x, y));
        if !matches {
            bail!(
                Value,
                op,
                "sizes of tensors must match except in dimension {dim}: tensors[0] is {} but tensors[{i}] is {}",
                show(&first.shape),
                show(&t.shape)
            );
        }
        shape[dim] = shape[dim].add(&t.shape[dim]);
    }
    Ok(vec![TensorMeta::with_dims(first.dtype, first.device, shape)])
}

// ---------------------------------------------------------------------------------- VJP rules

/// Shape prims move elements, so their gradients move them back.
fn vjp(prim: &Shape, e: &mut Emitter, operands: &[Arg], g: ValueId) -> Result<Grads> {
    if let Shape::Cat { dim } = prim {
        return vjp_cat(e, operands, *dim, g);
    }
    let Some(x) = operands[0].as_value() else { return Ok(vec![None]) };
    let in_shape = e.meta(x).shape;
    let grad = match prim {
        Shape::BroadcastInDim { shape, dims } => {
            let facts = e.builder.facts_mut();
            let stretched: Vec<usize> = dims
                .iter()
                .zip(&in_shape)
                // (the same size as data is not stretched, whatever its value: no decision)
                .filter(|(&d, s)| *s != &shape[d] && facts.is(s, 1) && !facts.is(&shape[d], 1))
                .map(|(&d, _)| d)
                .collect();
            // An added dim of size 1 is squeezed, not summed: a view of the cotangent, as eager's
            // unsqueeze gives (its backward is a squeeze; a sum is a new tensor).
            let added = (0..shape.len()).filter(|d| !dims.contains(d) && shape[*d] != Dim::Const(1));
            let mut summed: Vec<usize> = added.chain(stretched).collect();
            summed.sort_unstable();
            if summed.is_empty() && dims.len() < shape.len() {
                // Only dims of size 1 added (an unsqueeze): eager's squeeze of them, which keeps
                // the cotangent's strides (a reshape gives a dim of size 1 a stride of its own).
                let added: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
                e.emit(Shape::Squeeze { dims: added }, vec![Arg::Value(g)])?
            } else {
                let s = e.sum(g, summed)?;
                e.reshape(s, &in_shape)?
            }
        }
        Shape::Reshape { .. } | Shape::Squeeze { .. } => e.reshape(g, &in_shape)?,
        Shape::Transpose { perm } => {
            let mut inverse = vec![0; perm.len()];
            perm.iter().enumerate().for_each(|(i, &p)| inverse[p] = i);
            e.emit(Shape::Transpose { perm: inverse }, vec![Arg::Value(g)])?
        }
        Shape::Slice { start, strides, .. } => {
            let out_shape = e.meta(g).shape;
            let facts = e.builder.facts_mut();
            let config = (0..in_shape.len())
                .map(|i| {
                    let (lo, st, n) = (&start[i], strides[i], &out_shape[i]);
                    // With a stride of 1 the slice covers `n` elements, 0 included: no decision.
                    let empty = st != 1 && facts.is(n, 0);
                    let covered = if empty {
                        Dim::Const(0)
                    } else {
                        n.sub(&Dim::Const(1)).mul(&Dim::Const(st)).add(&Dim::Const(1))
                    };
                    (lo.clone(), in_shape[i].sub(lo).sub(&covered), if empty { 0 } else { st - 1 })
                })
                .collect();
            e.emit(Shape::Pad { value: number(e.meta(g).dtype, 0.0), config }, vec![Arg::Value(g)])?
        }
        Shape::Pad { config, .. } => vjp_pad(e, g, &in_shape, config)?,
        Shape::Flip { dims } => e.emit(Shape::Flip { dims: dims.clone() }, vec![Arg::Value(g)])?,
        Shape::Cat { .. } => unreachable!("cat is handled above"),
    };
    Ok(vec![Some(grad)])
}

fn vjp_cat(e: &mut Emitter, operands: &[Arg], dim: usize, g: ValueId) -> Result<Grads> {
    let g_shape = e.meta(g).shape;
    let mut offset = Dim::Const(0);
    operands
        .iter()
        .map(|a| {
            let x = a.as_value().expect("cat operands are tensors");
            let size = e.meta(x).shape[dim].clone();
            let mut start = vec![Dim::Const(0); g_shape.len()];
            let mut end = g_shape.clone();
            start[dim] = offset.clone();
            end[dim] = offset.add(&size);
            offset = end[dim].clone();
            let strides = vec![1; g_shape.len()];
            Ok(Some(e.emit(Shape::Slice { start, end, strides }, vec![Arg::Value(g)])?))
        })
        .collect()
}

/// Pad's gradient: restore what negative padding cropped (with zeros), then take every
/// `dilation + 1`-th element of the interior.
fn vjp_pad(e: &mut Emitter, g: ValueId, in_shape: &[Dim], config: &[(Dim, Dim, i64)]) -> Result<ValueId> {
    let zero = Dim::Const(0);
    let facts = e.builder.facts_mut();
    // Each pad amount's sign, decided once (a guard when it is symbolic).
    let negative: Vec<(bool, bool)> =
        config.iter().map(|(lo, hi, _)| (facts.lt(lo, &zero), facts.lt(hi, &zero))).collect();
    let cropped = negative.iter().any(|&(l, h)| l || h);
    let crop = |d: &Dim, neg: bool| if neg { zero.sub(d) } else { zero.clone() };
    let g = if cropped {
        let restore =
            config.iter().zip(&negative).map(|((lo, hi, _), &(nl, nh))| (crop(lo, nl), crop(hi, nh), 0)).collect();
        let value = number(e.meta(g).dtype, 0.0);
        e.emit(Shape::Pad { value, config: restore }, vec![Arg::Value(g)])?
    } else {
        g
    };
    let n = in_shape.len();
    let (mut start, mut end, mut strides) = (vec![zero.clone(); n], vec![zero.clone(); n], vec![1; n]);
    let facts = e.builder.facts_mut();
    for (i, (size, ((lo, _, dilation), &(nl, _)))) in in_shape.iter().zip(config.iter().zip(&negative)).enumerate() {
        start[i] = if nl { zero.clone() } else { lo.clone() };
        end[i] = start[i].add(&dilated(size, *dilation, facts));
        strides[i] = dilation + 1;
    }
    e.emit(Shape::Slice { start, end, strides }, vec![Arg::Value(g)])
}
