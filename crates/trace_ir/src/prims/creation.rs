//! Meta rules of the creation prims.

use super::Prim;
use crate::bail;
use crate::error::Result;
use crate::value::TensorMeta;

pub(super) fn meta(prim: &Prim, op: &str) -> Result<Vec<TensorMeta>> {
    let (shape, device, dtype) = match prim {
        Prim::Full { shape, device, dtype, .. } => (shape.clone(), *device, *dtype),
        Prim::Iota { length, device, dtype, .. } => {
            if *length < 0 {
                bail!(Value, op, "length must be non-negative, got {length}");
            }
            if !(dtype.is_int() || dtype.is_float()) {
                bail!(Type, op, "expected an integer or floating dtype, got {dtype}");
            }
            (vec![*length], *device, *dtype)
        }
        Prim::Uniform { shape, low, high, device, dtype } => {
            if !dtype.is_float() {
                bail!(Type, op, "expected a floating dtype, got {dtype}");
            }
            if low.as_f64() > high.as_f64() {
                bail!(Value, op, "minval {low} is greater than maxval {high}");
            }
            (shape.clone(), *device, *dtype)
        }
        _ => unreachable!("creation::meta handles only creation prims"),
    };
    if let Some(bad) = shape.iter().find(|&&s| s < 0) {
        bail!(Value, op, "shape {shape:?} has a negative size {bad}");
    }
    Ok(vec![TensorMeta::new(dtype, device, shape)])
}
