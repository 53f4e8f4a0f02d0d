//! Reading the positional arguments of prim calls (`prims.sum(t0, (1,))`), as the family
//! declarations (`declare.rs`) decode them.

use super::Operands;
use crate::bail;
use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::sym::Dim;
use crate::value::{Arg, Scalar};

/// The positional arguments of one prim call, consumed left to right.
pub struct CallArgs {
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
            arg @ (Arg::Value(_) | Arg::Scalar(_) | Arg::Sym(_) | Arg::SymFloat(_)) => Ok(arg),
            other => bail!(Type, &self.op, "expected a tensor or number for {what}, got {other:?}"),
        }
    }

    /// Takes the operands of a prim with this signature.
    pub fn take_operands(&mut self, operands: Operands) -> Result<Vec<Arg>> {
        match operands {
            Operands::Fixed(n) => self.operands(n),
            Operands::List => self.value_list("tensors"),
            Operands::WithOptional(n) => {
                let mut out = self.operands(n)?;
                out.extend(self.optional_operand("bias")?);
                Ok(out)
            }
        }
    }

    /// Takes a list of tensor values (the operands of `cat`).
    pub fn value_list(&mut self, what: &str) -> Result<Vec<Arg>> {
        match self.next(what)? {
            Arg::List(items) | Arg::Tuple(items) if items.iter().all(|a| a.as_value().is_some()) => Ok(items),
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

    /// Takes a sequence of sizes: int literals or symbolic ints.
    pub fn sizes(&mut self, what: &str) -> Result<Vec<Dim>> {
        match self.next(what)? {
            Arg::Tuple(items) | Arg::List(items) => items.iter().map(|a| self.size_item(what, a)).collect(),
            other => bail!(Type, &self.op, "expected a sequence of ints for {what}, got {other:?}"),
        }
    }

    /// Takes one size: an int literal or a symbolic int.
    pub fn size(&mut self, what: &str) -> Result<Dim> {
        match self.next(what)? {
            Arg::Scalar(Scalar::Int(i)) => Ok(Dim::Const(i)),
            Arg::Sym(s) => Ok(Dim::Sym(s)),
            other => bail!(Type, &self.op, "expected an int for {what}, got {other:?}"),
        }
    }

    fn size_item(&self, what: &str, a: &Arg) -> Result<Dim> {
        match a {
            Arg::Scalar(Scalar::Int(i)) => Ok(Dim::Const(*i)),
            Arg::Sym(s) => Ok(Dim::Sym(s.clone())),
            other => bail!(Type, &self.op, "expected ints in {what}, got {other:?}"),
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

    pub fn pad_config(&mut self, what: &str) -> Result<Vec<(Dim, Dim, i64)>> {
        let op = self.op.clone();
        match self.next(what)? {
            Arg::Tuple(items) | Arg::List(items) => items
                .iter()
                .map(|item| match item {
                    Arg::Tuple(t) | Arg::List(t) => match t.as_slice() {
                        [lo, hi, Arg::Scalar(Scalar::Int(dil))] => {
                            Ok((self.size_item(what, lo)?, self.size_item(what, hi)?, *dil))
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
