//! Writing a trace in the binary form (layout in the module doc).

use super::*;
use crate::dtype::{Device, DeviceKind};
use crate::ids::{SymbolId, ValueId};
use crate::prims::{Operands, Prim, PrimId};
use crate::symbols::{SymbolKind, SymbolTable};
use crate::symfloat::FloatExpr;
use crate::trace::{BoundSymbol, GradRule, Symbol, Trace};
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use rustc_hash::FxHashMap;

/// The binary form of `trace`.
pub fn encode(trace: &Trace) -> Vec<u8> {
    // The body is written first: the name table ahead of it lists the symbols it met.
    let mut body = Writer { out: Vec::with_capacity(64 + 24 * trace.values.len()), names: Names::default() };
    body.uint(trace.values.len() as u64);
    trace.values.iter().for_each(|v| body.value_kind(v));
    body.ids(&trace.inputs);
    body.bsyms(&trace.bsyms);
    body.arg(&trace.outputs);
    body.facts(&trace.facts);
    let mut out = Vec::with_capacity(body.out.len() + 16 * body.names.entries.len() + 8);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    let mut head = Writer { out, names: Names::default() };
    head.uint(body.names.entries.len() as u64);
    for (kind, name) in &body.names.entries {
        head.out.push(*kind);
        head.str(name);
    }
    head.out.extend_from_slice(&body.out);
    head.out
}

/// The name table being built: each symbol's index, looked up by what the trace holds.
#[derive(Default)]
struct Names {
    entries: Vec<(u8, String)>,
    /// By prim id, not name: hashing a `u32` per call costs less than hashing its name.
    prims: FxHashMap<PrimId, u32>,
    symbols: FxHashMap<SymbolId, u32>,
    regions: FxHashMap<std::sync::Arc<str>, u32>,
}

impl Names {
    fn index(&mut self, symbol: &Symbol) -> u32 {
        let next = self.entries.len() as u32;
        let (index, new) = match symbol {
            Symbol::Prim(p) => Self::slot(&mut self.prims, p.id(), next),
            Symbol::Composite(id) | Symbol::Fallback(id) => Self::slot(&mut self.symbols, *id, next),
            Symbol::Region(name) => Self::slot(&mut self.regions, name.clone(), next),
        };
        if new {
            self.entries.push(entry(symbol));
        }
        index
    }

    fn slot<K: std::hash::Hash + Eq>(map: &mut FxHashMap<K, u32>, key: K, next: u32) -> (u32, bool) {
        let index = *map.entry(key).or_insert(next);
        (index, index == next)
    }
}

/// The name table's entry for `symbol`.
fn entry(symbol: &Symbol) -> (u8, String) {
    match symbol {
        Symbol::Prim(p) => (NAME_PRIM, p.name().to_string()),
        Symbol::Composite(id) => (NAME_COMPOSITE, SymbolTable::name(*id).to_string()),
        Symbol::Fallback(id) => {
            let kind = if SymbolTable::kind(*id) == SymbolKind::Effect { NAME_EFFECT } else { NAME_FALLBACK };
            (kind, SymbolTable::name(*id).to_string())
        }
        Symbol::Region(name) => (NAME_REGION, name.to_string()),
    }
}

pub(super) struct Writer {
    pub(super) out: Vec<u8>,
    names: Names,
}

impl Writer {
    pub(super) fn uint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    pub(super) fn int(&mut self, v: i64) {
        self.uint(((v << 1) ^ (v >> 63)) as u64);
    }

    fn str(&mut self, s: &str) {
        self.uint(s.len() as u64);
        self.out.extend_from_slice(s.as_bytes());
    }

    fn ids(&mut self, ids: &[ValueId]) {
        self.uint(ids.len() as u64);
        ids.iter().for_each(|v| self.uint(v.0 as u64));
    }

    fn device(&mut self, d: Device) {
        self.out.push(match d.kind {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda => 1,
            DeviceKind::Meta => 2,
        });
        self.uint(d.index.map_or(0, |i| i as u64 + 1));
    }

    fn scalar(&mut self, s: Scalar) {
        match s {
            Scalar::Bool(b) => self.out.push(if b { ARG_TRUE } else { ARG_FALSE }),
            Scalar::Int(i) => {
                self.out.push(ARG_INT);
                self.int(i);
            }
            Scalar::Float(x) => {
                self.out.push(ARG_FLOAT);
                self.out.extend_from_slice(&x.to_bits().to_le_bytes());
            }
        }
    }

    fn value_kind(&mut self, kind: &ValueKind) {
        match kind {
            ValueKind::Tensor(t) => {
                self.out.push(VALUE_TENSOR);
                self.tensor(t);
            }
            ValueKind::Number(s) => {
                self.out.push(VALUE_NUMBER);
                self.scalar(*s);
            }
            ValueKind::Size(hint) => {
                self.out.push(VALUE_SIZE);
                self.int(*hint);
            }
        }
    }

    fn tensor(&mut self, t: &TensorMeta) {
        self.out.push(t.dtype.code());
        self.device(t.device);
        self.out.push(t.requires_grad as u8);
        self.uint(t.shape.len() as u64);
        t.shape.iter().for_each(|d| self.dim(d));
    }

    fn arg(&mut self, arg: &Arg) {
        match arg {
            Arg::Value(v) => {
                self.out.push(ARG_VALUE);
                self.uint(v.0 as u64);
            }
            Arg::Scalar(s) => self.scalar(*s),
            Arg::None => self.out.push(ARG_NONE),
            Arg::Ellipsis => self.out.push(ARG_ELLIPSIS),
            Arg::Str(s) => {
                self.out.push(ARG_STR);
                self.str(s);
            }
            Arg::DType(d) => self.out.extend_from_slice(&[ARG_DTYPE, d.code()]),
            Arg::Device(d) => {
                self.out.push(ARG_DEVICE);
                self.device(*d);
            }
            Arg::Tuple(items) | Arg::List(items) => {
                self.out.push(if matches!(arg, Arg::Tuple(_)) { ARG_TUPLE } else { ARG_LIST });
                self.args(items);
            }
            Arg::Slice(parts) => {
                self.out.push(ARG_SLICE);
                parts.iter().for_each(|a| self.arg(a));
            }
            Arg::PyConst(i) => {
                self.out.push(ARG_PYCONST);
                self.uint(*i as u64);
            }
            Arg::Sym(s) => {
                self.out.push(ARG_SYM);
                self.poly(&s.expr);
                self.int(s.hint);
            }
            Arg::SymFloat(s) => {
                self.out.push(ARG_SYMFLOAT);
                self.float_expr(&s.expr);
                self.out.extend_from_slice(&s.hint.0.to_bits().to_le_bytes());
            }
        }
    }

    /// A symbolic float's operations, operands after their operation: an int operand as its
    /// argument (an int or a symbolic int), a literal as a float argument, a float input as its
    /// value's argument followed by its hint's bits.
    fn float_expr(&mut self, e: &FloatExpr) {
        match e {
            FloatExpr::Int(d) => {
                self.out.push(FLOAT_LEAF);
                self.arg(&Arg::dim(d));
            }
            FloatExpr::Float(x) => {
                self.out.push(FLOAT_LEAF);
                self.scalar(Scalar::Float(*x));
            }
            FloatExpr::Input(v, x) => {
                self.out.push(FLOAT_LEAF);
                self.arg(&Arg::Value(*v));
                self.out.extend_from_slice(&x.to_bits().to_le_bytes());
            }
            FloatExpr::Neg(a) | FloatExpr::Sqrt(a) => {
                self.out.push(if matches!(e, FloatExpr::Neg(_)) { FLOAT_NEG } else { FLOAT_SQRT });
                self.float_expr(a);
            }
            FloatExpr::Math(func, a) => {
                self.out.extend_from_slice(&[FLOAT_MATH, func.code()]);
                self.float_expr(a);
            }
            FloatExpr::Bin(op, a, b) => {
                self.out.extend_from_slice(&[FLOAT_BIN, op.code()]);
                self.float_expr(a);
                self.float_expr(b);
            }
        }
    }

    fn args(&mut self, args: &[Arg]) {
        self.uint(args.len() as u64);
        args.iter().for_each(|a| self.arg(a));
    }

    /// A prim's parameters live in the `Prim`: they cross as its printed call arguments
    /// ([`Prim::call_args`]), written without building them.
    fn prim_call(&mut self, prim: &Prim, operands: &[Arg]) {
        let params = prim.params();
        match prim.operands() {
            Operands::List => {
                self.uint(1 + params.len() as u64);
                self.out.push(ARG_LIST);
                self.args(operands);
            }
            Operands::WithOptional(k) if operands.len() == k => {
                self.uint((k + 1 + params.len()) as u64);
                operands.iter().for_each(|a| self.arg(a));
                self.out.push(ARG_NONE);
            }
            _ => {
                self.uint((operands.len() + params.len()) as u64);
                operands.iter().for_each(|a| self.arg(a));
            }
        }
        params.iter().for_each(|a| self.arg(a));
    }

    fn bsyms(&mut self, bsyms: &[BoundSymbol]) {
        self.uint(bsyms.len() as u64);
        bsyms.iter().for_each(|b| self.bsym(b));
    }

    /// One call; the order of its parts is the order the decoder numbers values in.
    fn bsym(&mut self, bsym: &BoundSymbol) {
        let name = self.names.index(&bsym.symbol);
        self.uint(name as u64);
        match &bsym.symbol {
            Symbol::Prim(p) => self.prim_call(p, &bsym.args),
            _ => self.args(&bsym.args),
        }
        self.uint(bsym.kwargs.len() as u64);
        for (key, value) in &bsym.kwargs {
            self.str(key);
            self.arg(value);
        }
        self.bsyms(&bsym.subsymbols);
        self.ids(&bsym.outputs);
        match &bsym.grad {
            None => self.out.push(0),
            Some(rule) => {
                self.out.push(1);
                self.grad_rule(rule);
            }
        }
    }

    fn grad_rule(&mut self, rule: &GradRule) {
        self.uint(rule.cotangents.len() as u64);
        for (value, placeholder) in &rule.cotangents {
            self.uint(value.0 as u64);
            self.uint(placeholder.0 as u64);
        }
        self.bsyms(&rule.bsyms);
        self.uint(rule.grads.len() as u64);
        for (value, grad) in &rule.grads {
            self.uint(value.0 as u64);
            self.arg(grad);
        }
    }
}
