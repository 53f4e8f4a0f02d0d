//! The discrete Fourier transforms, as ATen's three kernels compute them: real to complex
//! (`_fft_r2c`), complex to real (`_fft_c2r`) and complex to complex (`_fft_c2c`), each over a
//! set of dims with a normalization mode (0: none, 1: by `1/sqrt(n)`, 2: by `1/n`).
//!
//! `torch.fft`'s functions reduce to them in Python (`thunder_rs.torch.fft`) as `SpectralOps.cpp`
//! does: type promotion, the input trimmed or zero-padded to the transform's sizes, conjugations.
//! The VJP rules are eager's (`derivatives.yaml`: `fft_r2c_backward`, `fft_c2r_backward`, and
//! `_fft_c2c` of the gradient in the other direction), written with these prims, so gradients are
//! eager's bit for bit; being linear maps, their rules hold for complex values in torch's
//! convention ([`Prim::differentiates_complex`]).
//!
//! [`Prim::differentiates_complex`]: super::Prim::differentiates_complex

use super::declare::{declare_family, Family};
use super::elementwise::tensor;
use super::{Complex, Operand, Shape};
use crate::bail;
use crate::dtype::DType;
use crate::error::Result;
use crate::grad::{number, Emitter, Grads};
use crate::sym::{Dim, Facts};
use crate::value::{Arg, TensorMeta};
use crate::ValueId;

declare_family! {
    /// Discrete Fourier transforms.
    pub enum Fft {
        /// `aten._fft_r2c`: the transform of a real tensor over `dims`, complex; `onesided` keeps
        /// the `n // 2 + 1` frequencies of the last of `dims` that the others mirror.
        FftR2c = "fft_r2c", Operands::Fixed(1),
            { dims: Vec<usize> = "dim", norm: i64 = "normalization", onesided: bool = "onesided" };
        /// `aten._fft_c2r`: the inverse of a one-sided transform, real, with `last_dim_size`
        /// elements along the last of `dims`.
        FftC2r = "fft_c2r", Operands::Fixed(1),
            { dims: Vec<usize> = "dim", norm: i64 = "normalization", last_dim_size: Dim = "last_dim_size" };
        /// `aten._fft_c2c`: the forward or inverse transform of a complex tensor over `dims`.
        FftC2c = "fft_c2c", Operands::Fixed(1),
            { dims: Vec<usize> = "dim", norm: i64 = "normalization", forward: bool = "forward" };
    }
}

/// The checks every transform makes of its dims and normalization.
fn check_dims(op: &str, a: &TensorMeta, dims: &[usize], norm: i64) -> Result<()> {
    if !(0..=2).contains(&norm) {
        bail!(Value, op, "invalid normalization mode {norm} (argument normalization)");
    }
    for (i, &d) in dims.iter().enumerate() {
        if d >= a.ndim() {
            bail!(Index, op, "dim {d} is out of range for a tensor of {} dims (argument dim)", a.ndim());
        }
        if dims[..i].contains(&d) {
            bail!(Runtime, op, "FFT dims must be unique (argument dim)");
        }
    }
    Ok(())
}

/// The last dim a one-sided transform (`r2c`, `c2r`) halves, after `check_dims`; `c2c` takes no
/// dims too (eager's kernel copies its input then).
fn last_dim(op: &str, a: &TensorMeta, dims: &[usize], norm: i64) -> Result<usize> {
    check_dims(op, a, dims, norm)?;
    match dims.last() {
        Some(&d) => Ok(d),
        None => bail!(Runtime, op, "expected at least one dim to transform (argument dim)"),
    }
}

fn complex_input<'a>(op: &str, operand: &Operand<'a>) -> Result<&'a TensorMeta> {
    let a = tensor(op, "a", operand)?;
    if !a.dtype.is_complex() {
        bail!(Type, op, "expected a complex tensor for a, got {}", a.dtype);
    }
    Ok(a)
}

impl Family for Fft {
    fn meta(&self, op: &str, operands: &[Operand], _facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        let out = match self {
            Fft::FftR2c { dims, norm, onesided } => {
                let a = tensor(op, "a", &operands[0])?;
                let dtype = match a.dtype {
                    DType::F32 => DType::C64,
                    DType::F64 => DType::C128,
                    other => bail!(Type, op, "expected a float or double tensor for a, got {other}"),
                };
                let last = last_dim(op, a, dims, *norm)?;
                let mut shape = a.shape.clone();
                if *onesided {
                    shape[last] = shape[last].floordiv(2).add(&Dim::Const(1));
                }
                TensorMeta::with_dims(dtype, a.device, shape)
            }
            Fft::FftC2r { dims, norm, last_dim_size } => {
                let a = complex_input(op, &operands[0])?;
                let last = last_dim(op, a, dims, *norm)?;
                if last_dim_size.hint() < 1 {
                    bail!(
                        Runtime,
                        op,
                        "Invalid number of data points ({last_dim_size}) specified (argument last_dim_size)"
                    );
                }
                let mut shape = a.shape.clone();
                shape[last] = last_dim_size.clone();
                TensorMeta::with_dims(a.dtype.to_real(), a.device, shape)
            }
            Fft::FftC2c { dims, norm, .. } => {
                let a = complex_input(op, &operands[0])?;
                check_dims(op, a, dims, *norm)?;
                TensorMeta::with_dims(a.dtype, a.device, a.shape.clone())
            }
        };
        Ok(vec![out])
    }

    fn vjp(&self, e: &mut Emitter, operands: &[Arg], _outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        let Some(g) = cots[0] else { return Ok(vec![None]) };
        let grad = match self {
            Fft::FftC2c { dims, norm, forward } => {
                e.emit(Fft::FftC2c { dims: dims.clone(), norm: *norm, forward: !forward }, vec![Arg::Value(g)])?
            }
            Fft::FftR2c { dims, norm, onesided } => {
                let last = *dims.last().expect("the meta rule checked the dims");
                let full = match (*onesided, operands[0].as_value()) {
                    (true, Some(a)) => {
                        let n = e.meta(a).shape[last].clone();
                        zero_filled(e, g, last, &n)?
                    }
                    _ => g,
                };
                let c2c = Fft::FftC2c { dims: dims.clone(), norm: *norm, forward: false };
                let spectrum = e.emit(c2c, vec![Arg::Value(full)])?;
                e.emit(Complex::Real {}, vec![Arg::Value(spectrum)])?
            }
            Fft::FftC2r { dims, norm, .. } => {
                let r2c = Fft::FftR2c { dims: dims.clone(), norm: *norm, onesided: true };
                let half = e.emit(r2c, vec![Arg::Value(g)])?;
                let last = *dims.last().expect("the meta rule checked the dims");
                let n = e.meta(g).shape[last].clone();
                doubled_mirrors(e, half, last, &n)?
            }
        };
        Ok(vec![Some(grad)])
    }
}

/// `fft_r2c_backward`'s one-sided gradient `g` extended with zeros to the `n` elements the input
/// has along `dim` (the frequencies the forward dropped got no gradient).
fn zero_filled(e: &mut Emitter, g: ValueId, dim: usize, n: &Dim) -> Result<ValueId> {
    let m = e.meta(g);
    let missing = n.sub(&m.shape[dim]);
    if missing.as_const() == Some(0) {
        return Ok(g);
    }
    let config = (0..m.ndim())
        .map(|d| if d == dim { (Dim::Const(0), missing.clone(), 0) } else { (Dim::Const(0), Dim::Const(0), 0) })
        .collect();
    e.emit(Shape::Pad { value: number(m.dtype, 0.0), config }, vec![Arg::Value(g)])
}

/// `fft_c2r_backward`'s accumulation by conjugate symmetry: of the one-sided gradient `half`,
/// the entries `1 ..= n - (n // 2 + 1)` along `dim` (those whose mirror image the forward
/// filled in) doubled, for an output of `n` elements along `dim`. In `half`'s layout, as eager's
/// `mul_(2)` of a narrowed `_fft_r2c` output leaves it (the transformed dim innermost): `half`
/// plus those entries padded with `-0.0` (each part), which adds `x + x = 2x` there and leaves
/// every other entry as it is, `-0.0` and infinities too. (A `cat` of the three pieces would be
/// dense, and a complex product of the gradient then takes another kernel path, rounding
/// Autoformer's autocorrelation gradients otherwise.)
fn doubled_mirrors(e: &mut Emitter, half: ValueId, dim: usize, n: &Dim) -> Result<ValueId> {
    let m = e.meta(half);
    let doubled = n.sub(&m.shape[dim]);
    if doubled.as_const() == Some(0) {
        return Ok(half);
    }
    let end = Dim::Const(1).add(&doubled);
    let start = (0..m.ndim()).map(|d| if d == dim { Dim::Const(1) } else { Dim::Const(0) }).collect();
    let stop = (0..m.ndim()).map(|d| if d == dim { end.clone() } else { m.shape[d].clone() }).collect();
    let middle = e.emit(Shape::Slice { start, end: stop, strides: vec![1; m.ndim()] }, vec![Arg::Value(half)])?;
    let after = m.shape[dim].sub(&end);
    let config: Vec<_> = (0..m.ndim())
        .map(|d| if d == dim { (Dim::Const(1), after.clone(), 0) } else { (Dim::Const(0), Dim::Const(0), 0) })
        .collect();
    let mut parts = Vec::with_capacity(2);
    for part in [Complex::Real {}, Complex::Imag {}] {
        let p = e.emit(part, vec![Arg::Value(middle)])?;
        let value = number(m.dtype.to_real(), -0.0);
        parts.push(Arg::Value(e.emit(Shape::Pad { value, config: config.clone() }, vec![Arg::Value(p)])?));
    }
    let mirrored = e.emit(Complex::Complex {}, parts)?;
    e.add(half, mirrored)
}
