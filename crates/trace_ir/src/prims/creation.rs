//! The creation prims: tensors made from parameters alone.

use super::declare::{declare_family, Family};
use super::Operand;
use crate::bail;
use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{show, Dim, Facts};
use crate::value::{Arg, Scalar, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Creation prims.
    pub enum Creation {
        /// A tensor of `shape` filled with `fill`.
        Full = "full", Operands::Fixed(0),
            { shape: Vec<Dim> = "shape", fill: Scalar = "fill_value", device: Device = "device", dtype: DType = "dtype" };
        /// `start, start + step, ...`, `length` values.
        Iota = "iota", Operands::Fixed(0),
            { length: Dim = "length", start: Dim = "start", step: i64 = "step", device: Device = "device", dtype: DType = "dtype" };
        /// Uniform samples in `[low, high)` from torch's generator.
        Uniform = "uniform", Operands::Fixed(0),
            { shape: Vec<Dim> = "shape", low: Scalar = "minval", high: Scalar = "maxval", device: Device = "device", dtype: DType = "dtype" };
    }
}

impl Creation {
    /// Whether the prim draws from torch's generator (see [`Prim::is_random`](super::Prim::is_random)).
    pub fn is_random(&self) -> bool {
        match self {
            Creation::Uniform { .. } => true,
            Creation::Full { .. } | Creation::Iota { .. } => false,
        }
    }
}

impl Family for Creation {
    fn meta(&self, op: &str, _operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        meta(self, op, facts)
    }

    fn vjp(
        &self,
        _e: &mut Emitter,
        _operands: &[Arg],
        _outputs: &[ValueId],
        _cots: &[Option<ValueId>],
    ) -> Result<Grads> {
        Ok(vec![])
    }
}

fn meta(prim: &Creation, op: &str, facts: &mut Facts) -> Result<Vec<TensorMeta>> {
    let (shape, device, dtype) = match prim {
        Creation::Full { shape, device, dtype, .. } => (shape.clone(), *device, *dtype),
        Creation::Iota { length, device, dtype, .. } => {
            if !facts.le(&Dim::Const(0), length) {
                bail!(Value, op, "length must be non-negative, got {length}");
            }
            if !(dtype.is_int() || dtype.is_float()) {
                bail!(Type, op, "expected an integer or floating dtype, got {dtype}");
            }
            (vec![length.clone()], *device, *dtype)
        }
        Creation::Uniform { shape, low, high, device, dtype } => {
            if !dtype.is_float() {
                bail!(Type, op, "expected a floating dtype, got {dtype}");
            }
            if low.as_f64() > high.as_f64() {
                bail!(Value, op, "minval {low} is greater than maxval {high}");
            }
            (shape.clone(), *device, *dtype)
        }
    };
    if let Some(bad) = shape.iter().find(|s| !facts.le(&Dim::Const(0), s)) {
        bail!(Value, op, "shape {} has a negative size {bad}", show(&shape));
    }
    Ok(vec![TensorMeta::with_dims(dtype, device, shape)])
}
