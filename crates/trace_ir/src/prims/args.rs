//! Decoding prim calls (`prims.sum(t0, (1,))`) into typed prims, and printing them back.

use super::Prim;
use crate::bail;
use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::value::{Arg, Scalar};

/// The positional arguments of one prim call, consumed left to right.
pub(super) struct CallArgs {
    op: String,
    args: std::vec::IntoIter<Arg>,
    total: usize,
    position: usize,
}

impl CallArgs {
    pub fn new(name: &str, args: Vec<Arg>) -> Self {
        let total = args.len();
        CallArgs { op: format!("prims.{name}"), args: args.into_iter(), total, position: 0 }
    }

    fn next(&mut self, what: &str) -> Result<Arg> {
        self.position += 1;
        match self.args.next() {
            Some(arg) => Ok(arg),
            None => bail!(Type, &self.op, "missing argument {what} (position {})", self.position - 1),
        }
    }

    /// Takes `n` operands: tensor values or numbers.
    pub fn operands(&mut self, n: usize) -> Result<Vec<Arg>> {
        (0..n).map(|i| self.operand(&format!("operand {i}"))).collect()
    }

    pub fn operand(&mut self, what: &str) -> Result<Arg> {
        match self.next(what)? {
            arg @ (Arg::Value(_) | Arg::Scalar(_)) => Ok(arg),
            other => bail!(Type, &self.op, "expected a tensor or number for {what}, got {other:?}"),
        }
    }

    /// Takes a list of tensor values (the operands of `cat`).
    pub fn value_list(&mut self, what: &str) -> Result<Vec<Arg>> {
        match self.next(what)? {
            Arg::List(items) | Arg::Tuple(items) if items.iter().all(|a| a.as_value().is_some()) => {
                Ok(items)
            }
            other => bail!(Type, &self.op, "expected a sequence of tensors for {what}, got {other:?}"),
        }
    }

    pub fn optional_operand(&mut self, what: &str) -> Result<Option<Arg>> {
        match self.next(what)? {
            Arg::None => Ok(None),
            arg @ Arg::Value(_) => Ok(Some(arg)),
            other => bail!(Type, &self.op, "expected a tensor or None for {what}, got {other:?}"),
        }
    }

    pub fn ints(&mut self, what: &str) -> Result<Vec<i64>> {
        match self.next(what)? {
            Arg::Tuple(items) | Arg::List(items) => items
                .iter()
                .map(|a| match a {
                    Arg::Scalar(Scalar::Int(i)) => Ok(*i),
                    other => bail!(Type, &self.op, "expected ints in {what}, got {other:?}"),
                })
                .collect(),
            other => bail!(Type, &self.op, "expected a sequence of ints for {what}, got {other:?}"),
        }
    }

    pub fn dims(&mut self, what: &str) -> Result<Vec<usize>> {
        let op = self.op.clone();
        self.ints(what)?.into_iter().map(|d| non_negative(&op, what, d)).collect()
    }

    pub fn int(&mut self, what: &str) -> Result<i64> {
        match self.next(what)? {
            Arg::Scalar(Scalar::Int(i)) => Ok(i),
            other => bail!(Type, &self.op, "expected an int for {what}, got {other:?}"),
        }
    }

    pub fn dim(&mut self, what: &str) -> Result<usize> {
        let d = self.int(what)?;
        non_negative(&self.op, what, d)
    }

    pub fn optional_dim(&mut self, what: &str) -> Result<Option<usize>> {
        match self.next(what)? {
            Arg::None => Ok(None),
            Arg::Scalar(Scalar::Int(d)) => non_negative(&self.op, what, d).map(Some),
            other => bail!(Type, &self.op, "expected an int or None for {what}, got {other:?}"),
        }
    }

    pub fn boolean(&mut self, what: &str) -> Result<bool> {
        match self.next(what)? {
            Arg::Scalar(Scalar::Bool(b)) => Ok(b),
            other => bail!(Type, &self.op, "expected a bool for {what}, got {other:?}"),
        }
    }

    pub fn scalar(&mut self, what: &str) -> Result<Scalar> {
        match self.next(what)? {
            Arg::Scalar(s) => Ok(s),
            other => bail!(Type, &self.op, "expected a number for {what}, got {other:?}"),
        }
    }

    pub fn dtype(&mut self, what: &str) -> Result<DType> {
        match self.next(what)? {
            Arg::DType(d) => Ok(d),
            other => bail!(Type, &self.op, "expected a dtype for {what}, got {other:?}"),
        }
    }

    pub fn device(&mut self, what: &str) -> Result<Device> {
        match self.next(what)? {
            Arg::Device(d) => Ok(d),
            other => bail!(Type, &self.op, "expected a device for {what}, got {other:?}"),
        }
    }

    fn pad_config(&mut self) -> Result<Vec<(i64, i64, i64)>> {
        let op = self.op.clone();
        match self.next("padding_config")? {
            Arg::Tuple(items) | Arg::List(items) => items
                .iter()
                .map(|item| match item {
                    Arg::Tuple(t) | Arg::List(t) => match t.as_slice() {
                        [Arg::Scalar(Scalar::Int(lo)), Arg::Scalar(Scalar::Int(hi)), Arg::Scalar(Scalar::Int(dil))] => {
                            Ok((*lo, *hi, *dil))
                        }
                        _ => bail!(Type, &op, "expected (lo, hi, dilation) in padding_config, got {item:?}"),
                    },
                    _ => bail!(Type, &op, "expected (lo, hi, dilation) in padding_config, got {item:?}"),
                })
                .collect(),
            other => bail!(Type, &op, "expected a sequence for padding_config, got {other:?}"),
        }
    }

    /// Fails if arguments are left over.
    pub fn finish(mut self) -> Result<()> {
        if self.args.next().is_some() {
            bail!(Type, &self.op, "takes {} arguments but {} were given", self.position, self.total);
        }
        Ok(())
    }
}

fn non_negative(op: &str, what: &str, d: i64) -> Result<usize> {
    if d < 0 {
        bail!(Index, op, "{what} must be canonical (non-negative) in a prim, got {d}");
    }
    Ok(d as usize)
}

/// Decodes the call of a prim with parameters.
pub(super) fn parse_param_prim(c: &mut CallArgs) -> Result<(Prim, Vec<Arg>)> {
    let name = c.op.trim_start_matches("prims.").to_string();
    let unary = |c: &mut CallArgs| c.operands(1);
    let (prim, operands) = match name.as_str() {
        "convert_element_type" => {
            let a = unary(c)?;
            (Prim::ConvertElementType { dtype: c.dtype("dtype")? }, a)
        }
        "device_put" => {
            let a = unary(c)?;
            (Prim::DevicePut { device: c.device("device")? }, a)
        }
        "broadcast_in_dim" => {
            let a = unary(c)?;
            (Prim::BroadcastInDim { shape: c.ints("shape")?, dims: c.dims("broadcast_dimensions")? }, a)
        }
        "reshape" => {
            let a = unary(c)?;
            (Prim::Reshape { shape: c.ints("shape")? }, a)
        }
        "transpose" => {
            let a = unary(c)?;
            (Prim::Transpose { perm: c.dims("permutation")? }, a)
        }
        "slice" => {
            let a = unary(c)?;
            let (start, end, strides) = (c.ints("start_indices")?, c.ints("end_indices")?, c.ints("strides")?);
            (Prim::Slice { start, end, strides }, a)
        }
        "squeeze" => {
            let a = unary(c)?;
            (Prim::Squeeze { dims: c.dims("dims")? }, a)
        }
        "cat" => {
            let tensors = c.value_list("tensors")?;
            (Prim::Cat { dim: c.dim("dim")? }, tensors)
        }
        "pad" => {
            let a = unary(c)?;
            let value = c.scalar("padding_value")?;
            (Prim::Pad { value, config: c.pad_config()? }, a)
        }
        "polygamma" => {
            let a = unary(c)?;
            (Prim::Polygamma { order: c.int("n")? }, a)
        }
        "flip" => {
            let a = unary(c)?;
            (Prim::Flip { dims: c.dims("dims")? }, a)
        }
        "full" => {
            let (shape, fill) = (c.ints("shape")?, c.scalar("fill_value")?);
            (Prim::Full { shape, fill, device: c.device("device")?, dtype: c.dtype("dtype")? }, vec![])
        }
        "iota" => {
            let (length, start, step) = (c.int("length")?, c.int("start")?, c.int("step")?);
            (Prim::Iota { length, start, step, device: c.device("device")?, dtype: c.dtype("dtype")? }, vec![])
        }
        "uniform" => {
            let (shape, low, high) = (c.ints("shape")?, c.scalar("minval")?, c.scalar("maxval")?);
            (Prim::Uniform { shape, low, high, device: c.device("device")?, dtype: c.dtype("dtype")? }, vec![])
        }
        "sum" | "prod" | "amax" | "amin" => {
            let a = unary(c)?;
            let dims = c.dims("dims")?;
            let prim = match name.as_str() {
                "sum" => Prim::Sum { dims },
                "prod" => Prim::Prod { dims },
                "amax" => Prim::Amax { dims },
                _ => Prim::Amin { dims },
            };
            (prim, a)
        }
        "var" | "var_mean" => {
            let a = unary(c)?;
            let (dims, correction) = (c.dims("dims")?, c.scalar("correction")?);
            let prim = if name == "var" { Prim::Var { dims, correction } } else { Prim::VarMean { dims, correction } };
            (prim, a)
        }
        "argmax" | "argmin" => {
            let a = unary(c)?;
            let dim = c.optional_dim("dim")?;
            (if name == "argmax" { Prim::Argmax { dim } } else { Prim::Argmin { dim } }, a)
        }
        "take" | "take_along_axis" | "gather" => {
            let ab = c.operands(2)?;
            let dim = c.dim("dim")?;
            let prim = match name.as_str() {
                "take" => Prim::Take { dim },
                "take_along_axis" => Prim::TakeAlongAxis { dim },
                _ => Prim::Gather { dim },
            };
            (prim, ab)
        }
        "scatter_add" | "index_add" => {
            let abc = c.operands(3)?;
            let dim = c.dim("dim")?;
            (if name == "scatter_add" { Prim::ScatterAdd { dim } } else { Prim::IndexAdd { dim } }, abc)
        }
        "topk" => {
            let a = unary(c)?;
            let (k, dim) = (c.int("k")?, c.dim("dim")?);
            (Prim::Topk { k, dim, largest: c.boolean("largest")?, sorted: c.boolean("sorted")? }, a)
        }
        "sort" => {
            let a = unary(c)?;
            let dim = c.dim("dim")?;
            (Prim::Sort { dim, descending: c.boolean("descending")?, stable: c.boolean("stable")? }, a)
        }
        "linear" => {
            let mut ops = c.operands(2)?;
            ops.extend(c.optional_operand("bias")?);
            (Prim::Linear, ops)
        }
        _ => bail!(NotImplemented, &c.op, "unknown prim"),
    };
    Ok((prim, operands))
}

fn dims_arg(dims: &[usize]) -> Arg {
    Arg::Tuple(dims.iter().map(|&d| Arg::Scalar(Scalar::Int(d as i64))).collect())
}

/// The parameters of a prim as call arguments (printed after its operands).
pub(super) fn params(prim: &Prim) -> Vec<Arg> {
    use Prim::*;
    let int = |i: i64| Arg::Scalar(Scalar::Int(i));
    let boolean = |b: bool| Arg::Scalar(Scalar::Bool(b));
    let opt_dim = |d: &Option<usize>| d.map_or(Arg::None, |d| int(d as i64));
    match prim {
        Polygamma { order } => vec![int(*order)],
        ConvertElementType { dtype } => vec![Arg::DType(*dtype)],
        DevicePut { device } => vec![Arg::Device(*device)],
        BroadcastInDim { shape, dims } => vec![Arg::ints(shape), dims_arg(dims)],
        Reshape { shape } => vec![Arg::ints(shape)],
        Transpose { perm } => vec![dims_arg(perm)],
        Slice { start, end, strides } => vec![Arg::ints(start), Arg::ints(end), Arg::ints(strides)],
        Squeeze { dims } | Flip { dims } | Sum { dims } | Prod { dims } | Amax { dims } | Amin { dims } => {
            vec![dims_arg(dims)]
        }
        Cat { dim } | Take { dim } | TakeAlongAxis { dim } | Gather { dim } | ScatterAdd { dim }
        | IndexAdd { dim } => vec![int(*dim as i64)],
        Pad { value, config } => vec![
            Arg::Scalar(*value),
            Arg::Tuple(config.iter().map(|&(l, h, d)| Arg::ints(&[l, h, d])).collect()),
        ],
        Full { shape, fill, device, dtype } => {
            vec![Arg::ints(shape), Arg::Scalar(*fill), Arg::Device(*device), Arg::DType(*dtype)]
        }
        Iota { length, start, step, device, dtype } => {
            vec![int(*length), int(*start), int(*step), Arg::Device(*device), Arg::DType(*dtype)]
        }
        Uniform { shape, low, high, device, dtype } => vec![
            Arg::ints(shape),
            Arg::Scalar(*low),
            Arg::Scalar(*high),
            Arg::Device(*device),
            Arg::DType(*dtype),
        ],
        Var { dims, correction } | VarMean { dims, correction } => {
            vec![dims_arg(dims), Arg::Scalar(*correction)]
        }
        Argmax { dim } | Argmin { dim } => vec![opt_dim(dim)],
        Topk { k, dim, largest, sorted } => {
            vec![int(*k), int(*dim as i64), boolean(*largest), boolean(*sorted)]
        }
        Sort { dim, descending, stable } => {
            vec![int(*dim as i64), boolean(*descending), boolean(*stable)]
        }
        _ => vec![],
    }
}

impl Prim {
    /// The full positional argument list of a call to this prim with `operands`, as printed.
    pub fn call_args(&self, operands: &[Arg]) -> Vec<Arg> {
        let mut out = match self {
            Prim::Cat { .. } => vec![Arg::List(operands.to_vec())],
            Prim::Linear if operands.len() == 2 => vec![operands[0].clone(), operands[1].clone(), Arg::None],
            _ => operands.to_vec(),
        };
        out.extend(self.params());
        out
    }
}
