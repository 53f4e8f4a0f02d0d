//! Meta rules of the indexing prims: embedding, take, gather, scatter, topk and sort.

use super::elementwise::tensor;
use super::shape::check_dims;
use super::{Operand, Prim};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::value::TensorMeta;

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
fn check_scatter(op: &str, dim: usize, a: &TensorMeta, index: &TensorMeta, src: &TensorMeta) -> Result<()> {
    if index.ndim() != a.ndim() {
        bail!(Value, op, "index {:?} must have the rank of a {:?}", index.shape, a.shape);
    }
    for d in 0..a.ndim() {
        if index.shape[d] > src.shape[d] {
            bail!(Value, op, "size {} of index at dimension {d} exceeds source's size {}", index.shape[d], src.shape[d]);
        }
        if d != dim && index.shape[d] > a.shape[d] {
            bail!(Value, op, "size {} of index at dimension {d} exceeds a's size {}", index.shape[d], a.shape[d]);
        }
    }
    Ok(())
}

/// torch's index_add: source is a with dimension `dim` resized to the number of indices.
fn check_index_add(op: &str, dim: usize, a: &TensorMeta, index: &TensorMeta, src: &TensorMeta) -> Result<()> {
    if index.ndim() > 1 {
        bail!(Value, op, "expected index of rank 0 or 1, got {:?}", index.shape);
    }
    for d in 0..a.ndim() {
        let expected = if d == dim { index.numel() } else { a.shape[d] };
        if src.shape[d] != expected {
            let (shape, n) = (&a.shape, index.numel());
            bail!(Value, op, "source has size {} at dimension {d} but a {shape:?} indexed by {n} entries needs {expected}", src.shape[d]);
        }
    }
    Ok(())
}

pub(super) fn meta(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let out = |like: &TensorMeta, dtype: DType, shape: Vec<i64>| TensorMeta::new(dtype, like.device, shape);
    match prim {
        Prim::Embedding => {
            let indices = index_tensor(op, "indices", &operands[0])?;
            let weight = tensor(op, "weight", &operands[1])?;
            if weight.ndim() != 2 {
                bail!(Value, op, "expected weight of rank 2, got {:?}", weight.shape);
            }
            let mut shape = indices.shape.clone();
            shape.push(weight.shape[1]);
            Ok(vec![out(weight, weight.dtype, shape)])
        }
        Prim::Take { dim } => {
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
        Prim::TakeAlongAxis { dim } | Prim::Gather { dim } => {
            let a = tensor(op, "a", &operands[0])?;
            let index = index_tensor(op, "index", &operands[1])?;
            check_dim(op, *dim, a)?;
            if index.ndim() != a.ndim() {
                bail!(Value, op, "index {:?} must have the rank of a {:?}", index.shape, a.shape);
            }
            let bad = |d: usize| d != *dim && index.shape[d] > a.shape[d];
            if let Some(d) = (0..a.ndim()).find(|&d| bad(d)) {
                bail!(Value, op, "size {} of index at dimension {d} exceeds a's size {}", index.shape[d], a.shape[d]);
            }
            Ok(vec![out(a, a.dtype, index.shape.clone())])
        }
        Prim::ScatterAdd { dim } | Prim::IndexAdd { dim } => {
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
                Prim::ScatterAdd { .. } => check_scatter(op, *dim, a, index, src)?,
                _ => check_index_add(op, *dim, a, index, src)?,
            }
            Ok(vec![out(a, a.dtype, a.shape.clone())])
        }
        Prim::Topk { k, dim, .. } => {
            let a = tensor(op, "a", &operands[0])?;
            check_dim(op, *dim, a)?;
            let size = a.shape.get(*dim).copied().unwrap_or(1);
            if *k < 0 || *k > size {
                bail!(Index, op, "k = {k} is out of range for dimension {dim} of size {size}");
            }
            let mut shape = a.shape.clone();
            if !shape.is_empty() {
                shape[*dim] = *k;
            }
            Ok(vec![out(a, a.dtype, shape.clone()), out(a, DType::I64, shape)])
        }
        Prim::Sort { dim, .. } => {
            let a = tensor(op, "a", &operands[0])?;
            check_dim(op, *dim, a)?;
            Ok(vec![out(a, a.dtype, a.shape.clone()), out(a, DType::I64, a.shape.clone())])
        }
        _ => unreachable!("indexing::meta handles only indexing prims"),
    }
}
