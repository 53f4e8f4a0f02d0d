//! Meta rules of the shape prims.

use super::elementwise::tensor;
use super::{Operand, Prim};
use crate::bail;
use crate::error::Result;
use crate::value::TensorMeta;

pub(super) fn meta(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    if let Prim::Cat { dim } = prim {
        return cat(op, operands, *dim);
    }
    let a = tensor(op, "a", &operands[0])?;
    let shape = match prim {
        Prim::BroadcastInDim { shape, dims } => broadcast_in_dim(op, a, shape, dims)?,
        Prim::Reshape { shape } => reshape(op, a, shape)?,
        Prim::Transpose { perm } => transpose(op, a, perm)?,
        Prim::Slice { start, end, strides } => slice(op, a, start, end, strides)?,
        Prim::Squeeze { dims } => squeeze(op, a, dims)?,
        Prim::Pad { config, .. } => pad(op, a, config)?,
        Prim::Flip { dims } => {
            check_dims(op, "dims", dims, a.ndim())?;
            a.shape.clone()
        }
        _ => unreachable!("shape::meta handles only shape prims"),
    };
    Ok(vec![TensorMeta::new(a.dtype, a.device, shape)])
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

fn broadcast_in_dim(op: &str, a: &TensorMeta, shape: &[i64], dims: &[usize]) -> Result<Vec<i64>> {
    if dims.len() != a.ndim() {
        bail!(Value, op, "broadcast_dimensions has {} entries but a has rank {}", dims.len(), a.ndim());
    }
    if dims.windows(2).any(|w| w[0] >= w[1]) {
        bail!(Value, op, "broadcast_dimensions {dims:?} must be strictly increasing");
    }
    for (i, (&d, &size)) in dims.iter().zip(&a.shape).enumerate() {
        let Some(&target) = shape.get(d) else {
            bail!(Index, op, "broadcast_dimensions[{i}] = {d} is out of range for shape {shape:?}");
        };
        if size != 1 && size != target {
            bail!(Value, op, "a's dimension {i} has size {size}, which cannot broadcast to size {target} (argument shape {shape:?})");
        }
    }
    check_sizes(op, "shape", shape)?;
    Ok(shape.to_vec())
}

fn check_sizes(op: &str, what: &str, shape: &[i64]) -> Result<()> {
    if let Some(bad) = shape.iter().find(|&&s| s < 0) {
        bail!(Value, op, "{what} {shape:?} has a negative size {bad}");
    }
    Ok(())
}

fn reshape(op: &str, a: &TensorMeta, shape: &[i64]) -> Result<Vec<i64>> {
    check_sizes(op, "shape", shape)?;
    let numel: i64 = shape.iter().product();
    if numel != a.numel() {
        bail!(Value, op, "shape {shape:?} is invalid for input of size {} (argument shape)", a.numel());
    }
    Ok(shape.to_vec())
}

fn transpose(op: &str, a: &TensorMeta, perm: &[usize]) -> Result<Vec<i64>> {
    if perm.len() != a.ndim() {
        bail!(Value, op, "permutation {perm:?} has {} entries but a has rank {}", perm.len(), a.ndim());
    }
    check_dims(op, "permutation", perm, a.ndim())?;
    Ok(perm.iter().map(|&p| a.shape[p]).collect())
}

fn slice(op: &str, a: &TensorMeta, start: &[i64], end: &[i64], strides: &[i64]) -> Result<Vec<i64>> {
    let n = a.ndim();
    if start.len() != n || end.len() != n || strides.len() != n {
        bail!(Value, op, "start_indices, end_indices and strides must have a's rank {n}");
    }
    (0..n)
        .map(|i| {
            let (s, e, st, size) = (start[i], end[i], strides[i], a.shape[i]);
            if st < 1 {
                bail!(Value, op, "strides[{i}] = {st} must be positive");
            }
            if s < 0 || s > size {
                bail!(Index, op, "start_indices[{i}] = {s} is out of range for dimension {i} of size {size}");
            }
            if e < s || e > size {
                bail!(Index, op, "end_indices[{i}] = {e} is out of range [{s}, {size}] for dimension {i} of size {size}");
            }
            Ok((e - s + st - 1) / st)
        })
        .collect()
}

fn squeeze(op: &str, a: &TensorMeta, dims: &[usize]) -> Result<Vec<i64>> {
    check_dims(op, "dims", dims, a.ndim())?;
    if let Some(&d) = dims.iter().find(|&&d| a.shape[d] != 1) {
        bail!(Value, op, "cannot squeeze dimension {d} of size {} (argument dims)", a.shape[d]);
    }
    Ok(a.shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, &s)| s).collect())
}

fn pad(op: &str, a: &TensorMeta, config: &[(i64, i64, i64)]) -> Result<Vec<i64>> {
    if config.len() != a.ndim() {
        bail!(Value, op, "padding_config has {} entries but a has rank {}", config.len(), a.ndim());
    }
    a.shape
        .iter()
        .zip(config)
        .enumerate()
        .map(|(i, (&size, &(lo, hi, dilation)))| {
            if dilation < 0 {
                bail!(Value, op, "padding_config[{i}] has negative dilation {dilation}");
            }
            let inner = if size == 0 { 0 } else { size + (size - 1) * dilation };
            let out = lo + hi + inner;
            if out < 0 {
                bail!(Value, op, "padding_config[{i}] = ({lo}, {hi}, {dilation}) gives negative size {out}");
            }
            Ok(out)
        })
        .collect()
}

fn cat(op: &str, operands: &[Operand], dim: usize) -> Result<Vec<TensorMeta>> {
    if operands.is_empty() {
        bail!(Value, op, "expected a non-empty list of tensors (argument tensors)");
    }
    let first = tensor(op, "tensors[0]", &operands[0])?;
    if dim >= first.ndim() {
        bail!(Index, op, "dim {dim} is out of range for tensors of rank {}", first.ndim());
    }
    let mut shape = first.shape.clone();
    shape[dim] = 0;
    for (i, operand) in operands.iter().enumerate() {
        let t = tensor(op, &format!("tensors[{i}]"), operand)?;
        if t.dtype != first.dtype || t.device != first.device {
            bail!(Type, op, "tensors[{i}] is {} but tensors[0] is {}", t.describe(), first.describe());
        }
        let matches = t.ndim() == first.ndim()
            && t.shape.iter().zip(&first.shape).enumerate().all(|(d, (x, y))| d == dim || x == y);
        if !matches {
            bail!(Value, op, "sizes of tensors must match except in dimension {dim}: tensors[0] is {:?} but tensors[{i}] is {:?}", first.shape, t.shape);
        }
        shape[dim] += t.shape[dim];
    }
    Ok(vec![TensorMeta::new(first.dtype, first.device, shape)])
}
