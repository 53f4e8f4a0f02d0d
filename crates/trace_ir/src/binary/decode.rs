//! Reading the binary form back into a [`Trace`], renumbering its values (see the module doc).

use super::*;
use crate::dtype::{DType, Device, DeviceKind};
use crate::error::{ErrorKind, IrError, Result};
use crate::ids::ValueId;
use crate::prims::{Operands, Prim};
use crate::sym::{Atom, Dim, Poly};
use crate::symbols::{SymbolKind, SymbolTable};
use crate::symfloat::{FloatExpr, FloatFn, FloatOp};
use crate::trace::{no_subsymbols, BoundSymbol, GradRule, Symbol, Trace};
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// The operands of a prim call with this signature, from its leading call arguments, when they
/// are what the signature takes (else the arguments back, for the parser's error).
fn operands(signature: Operands, mut call: Vec<Arg>) -> std::result::Result<Vec<Arg>, Vec<Arg>> {
    let is_operand = |a: &Arg| matches!(a, Arg::Value(_) | Arg::Scalar(_));
    match signature {
        Operands::Fixed(k) if call.len() == k && call.iter().all(is_operand) => Ok(call),
        Operands::List if call.len() == 1 => match call.pop() {
            Some(Arg::List(items) | Arg::Tuple(items))
                if !items.is_empty() && items.iter().all(|a| a.as_value().is_some()) =>
            {
                Ok(items)
            }
            other => Err(other.into_iter().collect()),
        },
        Operands::WithOptional(k) if call.len() == k + 1 && call[..k].iter().all(is_operand) => match call[k] {
            Arg::None => {
                call.pop();
                Ok(call)
            }
            Arg::Value(_) => Ok(call),
            _ => Err(call),
        },
        _ => Err(call),
    }
}

/// The op name decode errors carry.
const OP: &str = "trace decoder";

/// Reads a trace that [`super::encode`] wrote (in this or another copy of this crate).
pub fn decode(bytes: &[u8]) -> Result<Trace> {
    let mut r = Reader { bytes, at: 0, names: Vec::new(), wire: Vec::new(), ids: Vec::new(), values: Vec::new() };
    r.header()?;
    let n = r.count()?;
    r.names = r.list(n, Reader::name)?;
    let n = r.count()?;
    r.wire = r.list(n, |r| r.value_kind().map(Some))?;
    r.ids = vec![u32::MAX; n];
    r.values.reserve(n);
    let inputs = r.ids_list()?;
    let bsyms = r.bsyms(0)?;
    let outputs = r.arg(0)?;
    let facts = r.facts()?;
    if r.at != bytes.len() {
        return Err(r.error(format!("{} bytes follow the trace", bytes.len() - r.at)));
    }
    Ok(Trace { values: Arc::new(r.values), inputs, bsyms, outputs, facts: Arc::new(facts) })
}

/// What a name-table entry resolves to in this process.
enum Name {
    Prim(PrimName),
    Symbol(Symbol),
}

/// A prim's name-table entry and what its calls decoded to so far: a trace calls few distinct
/// prims, each with few distinct parameters, so each is decoded (by the parser's
/// [`Prim::from_call`]) once and then found by its parameters' bytes.
struct PrimName {
    name: String,
    /// The prim's signature, known once one call has decoded.
    operands: Option<Operands>,
    by_params: FxHashMap<Box<[u8]>, Prim>,
}

pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    names: Vec<Name>,
    /// The values as the sender numbered them, each taken when first mentioned.
    wire: Vec<Option<ValueKind>>,
    /// The new id of each wire value once mentioned (`u32::MAX` before).
    ids: Vec<u32>,
    values: Vec<ValueKind>,
}

impl Reader<'_> {
    pub(super) fn error(&self, message: impl std::fmt::Display) -> IrError {
        IrError::new(ErrorKind::Value, OP, format!("byte {}: {message}", self.at))
    }

    #[inline]
    pub(super) fn byte(&mut self) -> Result<u8> {
        let b = *self.bytes.get(self.at).ok_or_else(|| self.error("the buffer ends inside the trace"))?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.bytes.len() - self.at < n {
            return Err(self.error(format!("the buffer ends inside a field of {n} bytes")));
        }
        self.at += n;
        Ok(&self.bytes[self.at - n..self.at])
    }

    #[inline(always)]
    pub(super) fn uint(&mut self) -> Result<u64> {
        // Most varints (ids below 128, counts, tags) are one byte: that path is inlined at each
        // of the ten or so reads per call (through a call it cost a tenth of a decode).
        match self.bytes.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(b as u64)
            }
            _ => self.long_uint(),
        }
    }

    #[cold]
    fn long_uint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.error("a varint longer than 64 bits"))
    }

    pub(super) fn int(&mut self) -> Result<i64> {
        let v = self.uint()?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32> {
        let v = self.uint()?;
        u32::try_from(v).map_err(|_| self.error(format!("{what} {v} does not fit 32 bits")))
    }

    /// A count of items that each take at least one byte: more than the bytes left is corrupt
    /// (and must not reach `Vec::with_capacity`).
    #[inline]
    pub(super) fn count(&mut self) -> Result<usize> {
        let n = self.uint()?;
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(self.error(format!("a count of {n} items with {} bytes left", self.bytes.len() - self.at)));
        }
        Ok(n as usize)
    }

    /// `n` items read by `item` (`n` is a checked [`Reader::count`]: the allocation is bounded by
    /// the buffer's size).
    fn list<T>(&mut self, n: usize, mut item: impl FnMut(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(item(self)?);
        }
        Ok(out)
    }

    fn str(&mut self) -> Result<String> {
        let n = self.count()?;
        let bytes = self.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.error(format!("a string that is not UTF-8: {e}"))),
        }
    }

    fn header(&mut self) -> Result<()> {
        if self.bytes.len() < 6 || self.bytes[..4] != MAGIC {
            return Err(self.error("not an encoded trace (no TRB magic)"));
        }
        let version = u16::from_le_bytes([self.bytes[4], self.bytes[5]]);
        if version != FORMAT_VERSION {
            return Err(self.error(format!(
                "the trace is in binary format version {version}, this thunder_rs reads version {FORMAT_VERSION}"
            )));
        }
        self.at = 6;
        Ok(())
    }

    fn name(&mut self) -> Result<Name> {
        let kind = self.byte()?;
        let name = self.str()?;
        let registered = |kind| SymbolTable::register(&name, kind);
        Ok(match kind {
            NAME_PRIM => Name::Prim(PrimName { name, operands: None, by_params: FxHashMap::default() }),
            NAME_COMPOSITE => Name::Symbol(Symbol::Composite(registered(SymbolKind::Composite))),
            NAME_FALLBACK => Name::Symbol(Symbol::Fallback(registered(SymbolKind::Fallback))),
            NAME_EFFECT => Name::Symbol(Symbol::Fallback(registered(SymbolKind::Effect))),
            NAME_REGION => Name::Symbol(Symbol::Region(name.into())),
            other => return Err(self.error(format!("unknown name kind {other}"))),
        })
    }

    fn device(&mut self) -> Result<Device> {
        let kind = match self.byte()? {
            0 => DeviceKind::Cpu,
            1 => DeviceKind::Cuda,
            2 => DeviceKind::Meta,
            other => return Err(self.error(format!("unknown device kind {other}"))),
        };
        let index = match self.uint()? {
            0 => None,
            i => Some(u16::try_from(i - 1).map_err(|_| self.error(format!("device index {} too large", i - 1)))?),
        };
        Ok(Device { kind, index })
    }

    fn dtype(&mut self) -> Result<DType> {
        let code = self.byte()?;
        DType::from_code(code).ok_or_else(|| self.error(format!("unknown dtype code {code}")))
    }

    /// A scalar whose tag has been read; `None` when the tag is not a scalar's.
    fn scalar(&mut self, tag: u8) -> Result<Option<Scalar>> {
        Ok(Some(match tag {
            ARG_FALSE => Scalar::Bool(false),
            ARG_TRUE => Scalar::Bool(true),
            ARG_INT => Scalar::Int(self.int()?),
            ARG_FLOAT => {
                let bits = self.take(8)?.try_into().expect("took 8 bytes");
                Scalar::Float(f64::from_bits(u64::from_le_bytes(bits)))
            }
            _ => return Ok(None),
        }))
    }

    fn value_kind(&mut self) -> Result<ValueKind> {
        match self.byte()? {
            VALUE_TENSOR => {
                let dtype = self.dtype()?;
                let device = self.device()?;
                let requires_grad = match self.byte()? {
                    0 => false,
                    1 => true,
                    other => return Err(self.error(format!("requires_grad is {other}, not 0 or 1"))),
                };
                let n = self.count()?;
                let shape = self.list(n, |r| r.wire_dim(0))?;
                Ok(ValueKind::Tensor(TensorMeta { dtype, device, shape, requires_grad }))
            }
            VALUE_NUMBER => {
                let tag = self.byte()?;
                match self.scalar(tag)? {
                    Some(s) => Ok(ValueKind::Number(s)),
                    None => Err(self.error(format!("a number value with tag {tag}"))),
                }
            }
            VALUE_SIZE => Ok(ValueKind::Size(self.int()?)),
            other => Err(self.error(format!("unknown value kind {other}"))),
        }
    }

    /// A value id, renumbered: the first mention of a wire value gives it the next new id.
    #[inline]
    fn id(&mut self) -> Result<ValueId> {
        let wire = self.u32("value id")?;
        self.mention(wire)
    }

    /// The new id of wire value `wire`, given when first mentioned; a tensor's symbolic sizes
    /// mention the size values they read.
    pub(super) fn mention(&mut self, wire: u32) -> Result<ValueId> {
        let wire = wire as usize;
        let Some(&new) = self.ids.get(wire) else {
            return Err(self.error(format!("value t{wire} is not in the table of {} values", self.ids.len())));
        };
        if new != u32::MAX {
            return Ok(ValueId(new));
        }
        let Some(mut kind) = self.wire[wire].take() else {
            return Err(self.error(format!("value t{wire}'s sizes read itself")));
        };
        if let ValueKind::Tensor(t) = &mut kind {
            for d in t.shape.iter_mut().filter(|d| d.is_sym()) {
                let expr =
                    d.poly().substitute_fallible(&mut |v| self.mention(v.0).map(|id| Poly::atom(Atom::Value(id))))?;
                *d = Dim::from_poly(expr, d.hint());
            }
        }
        let new = self.values.len() as u32;
        self.values.push(kind);
        self.ids[wire] = new;
        Ok(ValueId(new))
    }

    fn ids_list(&mut self) -> Result<Vec<ValueId>> {
        let n = self.count()?;
        self.list(n, Reader::id)
    }

    fn arg(&mut self, depth: usize) -> Result<Arg> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("arguments nested deeper than {MAX_DEPTH}")));
        }
        let tag = self.byte()?;
        if let Some(s) = self.scalar(tag)? {
            return Ok(Arg::Scalar(s));
        }
        Ok(match tag {
            ARG_VALUE => Arg::Value(self.id()?),
            ARG_NONE => Arg::None,
            ARG_ELLIPSIS => Arg::Ellipsis,
            ARG_STR => Arg::Str(self.str()?),
            ARG_DTYPE => Arg::DType(self.dtype()?),
            ARG_DEVICE => Arg::Device(self.device()?),
            ARG_TUPLE => Arg::Tuple(self.args(depth + 1)?),
            ARG_LIST => Arg::List(self.args(depth + 1)?),
            ARG_SLICE => Arg::Slice(Box::new([self.arg(depth + 1)?, self.arg(depth + 1)?, self.arg(depth + 1)?])),
            ARG_PYCONST => Arg::PyConst(self.u32("constant index")?),
            ARG_SYM => {
                let expr = self.body_poly()?;
                Arg::dim(&Dim::from_poly(expr, self.int()?))
            }
            ARG_SYMFLOAT => {
                let expr = self.float_expr(depth + 1)?;
                Arg::SymFloat(Arc::new(crate::SymFloat::new(expr, self.f64()?)))
            }
            other => return Err(self.error(format!("unknown argument tag {other}"))),
        })
    }

    /// A symbolic float's operations (layout in `Writer::float_expr`).
    fn float_expr(&mut self, depth: usize) -> Result<FloatExpr> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("expressions nested deeper than {MAX_DEPTH}")));
        }
        Ok(match self.byte()? {
            FLOAT_LEAF => match self.arg(depth + 1)? {
                Arg::Scalar(Scalar::Float(x)) => FloatExpr::Float(x),
                Arg::Scalar(Scalar::Int(c)) => FloatExpr::Int(Dim::Const(c)),
                Arg::Sym(s) => FloatExpr::Int(Dim::Sym(s)),
                Arg::Value(v) => FloatExpr::Input(v, self.f64()?),
                other => return Err(self.error(format!("a symbolic float's operand is {other:?}"))),
            },
            FLOAT_NEG => FloatExpr::Neg(Box::new(self.float_expr(depth + 1)?)),
            FLOAT_SQRT => FloatExpr::Sqrt(Box::new(self.float_expr(depth + 1)?)),
            FLOAT_MATH => {
                let code = self.byte()?;
                let func =
                    FloatFn::from_code(code).ok_or_else(|| self.error(format!("unknown float function {code}")))?;
                FloatExpr::Math(func, Box::new(self.float_expr(depth + 1)?))
            }
            FLOAT_BIN => {
                let code = self.byte()?;
                let op =
                    FloatOp::from_code(code).ok_or_else(|| self.error(format!("unknown float operation {code}")))?;
                FloatExpr::bin(op, self.float_expr(depth + 1)?, self.float_expr(depth + 1)?)
            }
            other => return Err(self.error(format!("unknown float expression tag {other}"))),
        })
    }

    fn f64(&mut self) -> Result<f64> {
        let bits = self.take(8)?.try_into().expect("took 8 bytes");
        Ok(f64::from_bits(u64::from_le_bytes(bits)))
    }

    fn args(&mut self, depth: usize) -> Result<Vec<Arg>> {
        let n = self.count()?;
        self.list(n, |r| r.arg(depth))
    }

    fn bsyms(&mut self, depth: usize) -> Result<Vec<BoundSymbol>> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("decompositions nested deeper than {MAX_DEPTH}")));
        }
        let n = self.count()?;
        self.list(n, |r| r.bsym(depth))
    }

    fn bsym(&mut self, depth: usize) -> Result<BoundSymbol> {
        let index = self.u32("name index")? as usize;
        if index >= self.names.len() {
            return Err(self.error(format!("name {index} is not in the table of {} names", self.names.len())));
        }
        let (symbol, args) = match &self.names[index] {
            Name::Symbol(symbol) => (symbol.clone(), self.args(depth)?),
            Name::Prim(_) => self.prim_call(index, depth)?,
        };
        let n = self.count()?;
        let kwargs = self.list(n, |r| Ok((r.str()?, r.arg(depth)?)))?;
        let subsymbols = self.bsyms(depth + 1)?;
        let outputs = self.ids_list()?;
        let grad = match self.byte()? {
            0 => None,
            1 => Some(std::sync::Arc::new(self.grad_rule(depth + 1)?)),
            other => return Err(self.error(format!("grad rule flag {other}, not 0 or 1"))),
        };
        let subsymbols = if subsymbols.is_empty() { no_subsymbols() } else { subsymbols.into() };
        Ok(BoundSymbol { symbol, args, kwargs, outputs, subsymbols, grad })
    }

    /// A prim call: its printed call arguments, decoded into the prim and its operands.
    fn prim_call(&mut self, index: usize, depth: usize) -> Result<(Symbol, Vec<Arg>)> {
        let n = self.count()?;
        let Name::Prim(PrimName { operands: Some(signature), .. }) = &self.names[index] else {
            let call = self.list(n, |r| r.arg(depth))?;
            return self.prim_from_call(index, call, None);
        };
        let signature = *signature;
        let leading = match signature {
            Operands::Fixed(k) => k,
            Operands::List => 1,
            Operands::WithOptional(k) => k + 1,
        };
        let mut call = Vec::with_capacity(n);
        for _ in 0..leading.min(n) {
            call.push(self.arg(depth)?);
        }
        let start = self.at;
        for _ in leading.min(n)..n {
            call.push(self.arg(depth)?);
        }
        let Name::Prim(entry) = &self.names[index] else { unreachable!("checked above") };
        let params = &self.bytes[start..self.at];
        match entry.by_params.get(params) {
            Some(prim) if n >= leading => match operands(signature, call) {
                Ok(operands) => Ok((Symbol::Prim(prim.clone()), operands)),
                Err(call) => self.prim_from_call(index, call, None),
            },
            _ => self.prim_from_call(index, call, Some(start)),
        }
    }

    /// Decodes a prim call the parser's way (its errors are the parser's), and remembers the
    /// prim by its parameters' bytes (from `params_at` to here) when they are known.
    fn prim_from_call(&mut self, index: usize, call: Vec<Arg>, params_at: Option<usize>) -> Result<(Symbol, Vec<Arg>)> {
        let Name::Prim(entry) = &mut self.names[index] else { unreachable!("only prim entries get here") };
        let (prim, operands) = Prim::from_call(&entry.name, call)
            .map_err(|e| IrError::new(e.kind, OP, format!("byte {}: {}: {}", self.at, e.op, e.message)))?;
        entry.operands = Some(prim.operands());
        if let Some(start) = params_at {
            entry.by_params.insert(self.bytes[start..self.at].into(), prim.clone());
        }
        Ok((Symbol::Prim(prim), operands))
    }

    fn grad_rule(&mut self, depth: usize) -> Result<GradRule> {
        let n = self.count()?;
        let cotangents = self.list(n, |r| Ok((r.id()?, r.id()?)))?;
        let bsyms = self.bsyms(depth)?;
        let n = self.count()?;
        let grads = self.list(n, |r| Ok((r.id()?, r.arg(depth)?)))?;
        Ok(GradRule { cotangents, bsyms, grads })
    }
}
