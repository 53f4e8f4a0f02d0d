//! Meta rules of the indexing prims: embedding, take, gather, scatter (adding or writing), topk and sort.

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::shape::check_dims;
use super::{Operand, Shape};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{Dim, Facts};
use crate::value::{Arg, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Prims that read or write elements at computed positions.
    pub enum Index {
        /// `weight[indices]`.
        Embedding = "embedding", Operands::Fixed(2), {};
        /// `index_select(a, dim, index)`.
        Take = "take", Operands::Fixed(2), { dim: usize = "dim" };
        /// Elements of `a` at `index` along `dim`, as [`Index::Gather`]: the prim behind
        /// `torch.take_along_dim`, whose broadcasting the decomposition does first.
        TakeAlongAxis = "take_along_axis", Operands::Fixed(2), { dim: usize = "dim" };
        /// `torch.gather(a, dim, index)`: `out[i][j] = a[index[i][j]][j]` for `dim == 0`.
        Gather = "gather", Operands::Fixed(2), { dim: usize = "dim" };
        /// `torch.scatter_add(a, dim, index, source)`: `a` with each `source` element added where
        /// `index` points.
        ScatterAdd = "scatter_add", Operands::Fixed(3), { dim: usize = "dim" };
        /// torch's scatter: `a` with `source` written where `index` points (one of the values
        /// where indices repeat, as in torch).
        Scatter = "scatter", Operands::Fixed(3), { dim: usize = "dim" };
        /// `torch.index_add(a, dim, index, source)`: `a` with the slices of `source` added at the
        /// positions `index` lists along `dim`.
        IndexAdd = "index_add", Operands::Fixed(3), { dim: usize = "dim" };
        /// `(values, indices)`: the `k` largest (or smallest) along `dim`; `k` may be symbolic
        /// (`x.topk(x.shape[1] // 2)`).
        Topk = "topk", Operands::Fixed(1), { k: Dim = "k", dim: usize = "dim", largest: bool = "largest", sorted: bool = "sorted" };
        /// `(values, indices)`.
        Sort = "sort", Operands::Fixed(1), { dim: usize = "dim", descending: bool = "descending", stable: bool = "stable" };
    }
}

impl Family for Index {
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        meta(self, op, operands, facts)
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        vjp(self, e, operands, outputs, cots)
    }
}

fn index_tensor<'a>(op: &str, what: &str, operand: &Operand<'a>) -> Result<&'a TensorMeta> {
    let t = tensor(op, what, operand)?;
    if !t.dtype.is_int() {
        bail!(Type, op, "expected an integer tensor for {what}, got {}", t.dtype);
    }
    Ok(t)
}

fn check_dim(op: &str, dim: usize, a: &TensorMeta) -> Result<()> {
    check_dims(op, "dim", &[dim], a.ndim().max(1))
}

/// torch's scatter_add: index has a's rank, fits in source everywhere and in a outside `dim`.
fn check_scatter(
    op: &str,
    dim: usize,
    a: &TensorMeta,
    index: &TensorMeta,
    src: &TensorMeta,
    facts: &mut Facts,
) -> Result<()> {
    if index.ndim() != a.ndim() {
        bail!(Value, op, "index {:?} must have the rank of a {:?}", index.shape, a.shape);
    }
    for d in 0..a.ndim() {
        if !facts.le(&index.shape[d], &src.shape[d]) {
            bail!(
                Value,
                op,
                "size {} of index at dimension {d} exceeds source's size {}",
                index.shape[d],
                src.shape[d]
            );
        }
        if d != dim && !facts.le(&index.shape[d], &a.shape[d]) {
            bail!(Value, op, "size {} of index at dimension {d} exceeds a's size {}", index.shape[d], a.shape[d]);
        }
    }
    Ok(())
}

/// torch's index_add: source is a with dimension `dim` resized to the number of indices.
fn check_index_add(
    op: &str,
    dim: usize,
    a: &TensorMeta,
    index: &TensorMeta,
    src: &TensorMeta,
    facts: &mut Facts,
) -> Result<()> {
    if index.ndim() > 1 {
        bail!(Value, op, "expected index of rank 0 or 1, got {:?}", index.shape);
    }
    for d in 0..a.ndim() {
        let expected = if d == dim { index.numel() } else { a.shape[d].clone() };
        if !facts.equal(&src.shape[d], &expected) {
            let (shape, n) = (&a.shape, index.numel());
            bail!(
                Value,
                op,
                "source has size {} at dimension {d} but a {shape:?} indexed by {n} entries needs {expected}",
                src.shape[d]
            );
        }
    }
    Ok(())
}

fn meta(prim: &Index, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    let out = |like: &TensorMeta, dtype: DType, shape: Vec<Dim>| TensorMeta::with_dims(dtype, like.device, shape);
    match prim {
        Index::Embedding {} => {
            let indices = index_tensor(op, "indices", &operands[0])?;
            let weight = tensor(op, "weight", &operands[1])?;
            if weight.ndim() != 2 {
                bail!(Value, op, "expected weight of rank 2, got {:?}", weight.shape);
            }
            let mut shape = indices.shape.clone();
            shape.push(weight.shape[1].clone());
            Ok(vec![out(weight, weight.dtype, shape)])
        }
        Index::Take { dim } => {
            let a = tensor(op, "a", &operands[0])?;
            let index = index_tensor(op, "index", &operands[1])?;
            check_dim(op, *dim, a)?;
            if index.ndim() > 1 {
                bail!(Value, op, "expected index of rank 0 or 1, got {:?}", index.shape);
            }
            let mut shape = a.shape.clone();
            if !shape.is_empty() {
                shape[*dim] = index.numel();
            }
            Ok(vec![out(a, a.dtype, shape)])
        }
        Index::TakeAlongAxis { dim } | Index::Gather { dim } => {
            let a = tensor(op, "a", &operands[0])?;
            let index = index_tensor(op, "index", &operands[1])?;
            check_dim(op, *dim, a)?;
            if index.ndim() != a.ndim() {
                bail!(Value, op, "index {:?} must have the rank of a {:?}", index.shape, a.shape);
            }
            let mut bad = |d: usize| d != *dim && !facts.le(&index.shape[d], &a.shape[d]);
            if let Some(d) = (0..a.ndim()).find(|&d| bad(d)) {
                bail!(Value, op, "size {} of index at dimension {d} exceeds a's size {}", index.shape[d], a.shape[d]);
            }
            Ok(vec![out(a, a.dtype, index.shape.clone())])
        }
        Index::ScatterAdd { dim } | Index::Scatter { dim } | Index::IndexAdd { dim } => {
            let a = tensor(op, "a", &operands[0])?;
            let index = index_tensor(op, "index", &operands[1])?;
            let src = tensor(op, "source", &operands[2])?;
            check_dim(op, *dim, a)?;
            if src.dtype != a.dtype {
                bail!(Type, op, "dtypes of a ({}) and source ({}) differ", a.dtype, src.dtype);
            }
            if src.ndim() != a.ndim() {
                bail!(Value, op, "source {:?} must have the rank of a {:?}", src.shape, a.shape);
            }
            match prim {
                Index::ScatterAdd { .. } | Index::Scatter { .. } => check_scatter(op, *dim, a, index, src, facts)?,
                _ => check_index_add(op, *dim, a, index, src, facts)?,
            }
            Ok(vec![out(a, a.dtype, a.shape.clone())])
        }
        Index::Topk { k, dim, .. } => {
            let a = tensor(op, "a", &operands[0])?;
            check_dim(op, *dim, a)?;
            let size = a.shape.get(*dim).cloned().unwrap_or(Dim::Const(1));
            if !facts.le(&Dim::Const(0), k) || !facts.le(k, &size) {
                bail!(Index, op, "k = {k} is out of range for dimension {dim} of size {size}");
            }
            let mut shape = a.shape.clone();
            if !shape.is_empty() {
                shape[*dim] = k.clone();
            }
            Ok(vec![out(a, a.dtype, shape.clone()), out(a, DType::I64, shape)])
        }
        Index::Sort { dim, .. } => {
            let a = tensor(op, "a", &operands[0])?;
            check_dim(op, *dim, a)?;
            Ok(vec![out(a, a.dtype, a.shape.clone()), out(a, DType::I64, a.shape.clone())])
        }
    }
}

// ---------------------------------------------------------------------------------- VJP rules

/// Gradients of the indexing prims: what was read is added back where it was read from.
fn vjp(
    prim: &Index,
    e: &mut Emitter,
    operands: &[Arg],
    outputs: &[ValueId],
    cots: &[Option<ValueId>],
) -> Result<Grads> {
    let operand = |i: usize| operands[i].as_value().expect("indexing operands are tensors");
    let scatter = |e: &mut Emitter, prim: Index, into: ValueId, index: ValueId, g: ValueId| -> Result<ValueId> {
        let zeros = e.zeros_like(into)?;
        e.emit(prim, vec![Arg::Value(zeros), Arg::Value(index), Arg::Value(g)])
    };
    let g = cots[0];
    Ok(match prim {
        Index::Embedding {} => {
            let (indices, weight) = (operand(0), operand(1));
            let dim = e.meta(weight).shape[1].clone();
            let flat_index = e.reshape(indices, &[e.meta(indices).numel()])?;
            let rows = e.reshape(g.expect("one cotangent"), &[e.meta(indices).numel(), dim])?;
            vec![None, Some(scatter(e, Index::IndexAdd { dim: 0 }, weight, flat_index, rows)?)]
        }
        Index::Take { dim } => {
            vec![
                Some(scatter(e, Index::IndexAdd { dim: *dim }, operand(0), operand(1), g.expect("one cotangent"))?),
                None,
            ]
        }
        Index::TakeAlongAxis { dim } | Index::Gather { dim } => {
            vec![
                Some(scatter(e, Index::ScatterAdd { dim: *dim }, operand(0), operand(1), g.expect("one cotangent"))?),
                None,
            ]
        }
        Index::ScatterAdd { dim } => {
            let g = g.expect("one cotangent");
            let (index, src) = (operand(1), operand(2));
            let picked = e.emit(Index::Gather { dim: *dim }, vec![Arg::Value(g), Arg::Value(index)])?;
            vec![Some(g), None, Some(pad_to(e, picked, &e.meta(src).shape)?)]
        }
        Index::Scatter { dim } => {
            // torch's: zeros where anything was written, and each source element gets the
            // gradient of the position it was written to (all of them where indices repeat).
            let g = g.expect("one cotangent");
            let (index, src) = (operand(1), operand(2));
            let zeros = e.zeros_like(src)?;
            let kept =
                e.emit(Index::Scatter { dim: *dim }, vec![Arg::Value(g), Arg::Value(index), Arg::Value(zeros)])?;
            let picked = e.emit(Index::Gather { dim: *dim }, vec![Arg::Value(g), Arg::Value(index)])?;
            vec![Some(kept), None, Some(pad_to(e, picked, &e.meta(src).shape)?)]
        }
        Index::IndexAdd { dim } => {
            let g = g.expect("one cotangent");
            let picked = e.emit(Index::Take { dim: *dim }, vec![Arg::Value(g), Arg::Value(operand(1))])?;
            vec![Some(g), None, Some(picked)]
        }
        Index::Topk { dim, .. } | Index::Sort { dim, .. } => match g {
            Some(g) => vec![Some(scatter(e, Index::ScatterAdd { dim: *dim }, operand(0), outputs[1], g)?)],
            None => vec![None],
        },
    })
}

/// Pads `v` with zeros at the end of each dim up to `shape` (scatter sources larger than their
/// index get no gradient past it).
fn pad_to(e: &mut Emitter, v: ValueId, shape: &[Dim]) -> Result<ValueId> {
    let m = e.meta(v);
    if m.shape == shape {
        return Ok(v);
    }
    let config = m.shape.iter().zip(shape).map(|(have, want)| (Dim::Const(0), want.sub(have), 0)).collect();
    e.emit(Shape::Pad { value: crate::grad::number(m.dtype, 0.0), config }, vec![Arg::Value(v)])
}
