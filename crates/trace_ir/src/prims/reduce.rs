//! Meta rules of the reduction prims.

use super::elementwise::tensor;
use super::shape::check_dims;
use super::{Operand, Prim};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::value::TensorMeta;

pub(super) fn meta(prim: &Prim, op: &str, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
    let a = tensor(op, "a", &operands[0])?;
    let reduced_over = |what: &str, dims: &[usize]| -> Result<Vec<i64>> {
        check_dims(op, what, dims, a.ndim())?;
        Ok(a.shape.iter().enumerate().filter(|(i, _)| !dims.contains(i)).map(|(_, &s)| s).collect())
    };
    let reduced = |dims: &[usize]| reduced_over("dims", dims);
    let out = |dtype: DType, shape: Vec<i64>| TensorMeta::new(dtype, a.device, shape);
    match prim {
        Prim::Sum { dims } | Prim::Prod { dims } => Ok(vec![out(a.dtype, reduced(dims)?)]),
        Prim::Amax { dims } | Prim::Amin { dims } => {
            if let Some(&d) = dims.iter().find(|&&d| d < a.ndim() && a.shape[d] == 0) {
                bail!(Index, op, "cannot reduce dimension {d} of size 0 (argument dims)");
            }
            Ok(vec![out(a.dtype, reduced(dims)?)])
        }
        Prim::Var { dims, .. } | Prim::VarMean { dims, .. } => {
            if !a.dtype.is_inexact() {
                bail!(Type, op, "expected a floating-point or complex tensor for a, got {}", a.dtype);
            }
            let shape = reduced(dims)?;
            let var = out(a.dtype.to_real(), shape.clone());
            match prim {
                Prim::Var { .. } => Ok(vec![var]),
                _ => Ok(vec![var, out(a.dtype, shape)]),
            }
        }
        Prim::Argmax { dim } | Prim::Argmin { dim } => {
            let shape = match dim {
                Some(d) => {
                    let shape = reduced_over("dim", &[*d])?;
                    if a.shape[*d] == 0 {
                        bail!(Index, op, "cannot reduce dimension {d} of size 0 (argument dim)");
                    }
                    shape
                }
                None if a.numel() == 0 => bail!(Index, op, "cannot reduce a, an empty tensor {:?}, with dim=None", a.shape),
                None => vec![],
            };
            Ok(vec![out(DType::I64, shape)])
        }
        _ => unreachable!("reduce::meta handles only reductions"),
    }
}
