//! Reading symbolic sizes: int expressions over size values in arguments (`(2*t0, 12)`), in type
//! comments (`cpu f32[t0, 12]`) and in guard lines (`# guard t0 - t1 == 0`).
//!
//! Expressions are read over the names the text uses, with placeholder hints; once the names are
//! resolved to the builder's values, hints are computed from the size values' own
//! ([`crate::ValueKind::Size`]).

use super::{error, lex, Cursor, Parser, Token, NO_LINE, OP};
use crate::error::{ErrorKind, IrError, Result};
use crate::sym::{Atom, Dim, Guard, Poly, Rel, SymDim};
use crate::symfloat::{FloatExpr, FloatFn, FloatOp, SymFloat};
use crate::trace::TraceBuilder;
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use crate::ValueId;
use std::sync::Arc;

/// The binary operators of size expressions, with their precedence.
#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
    FloorDiv,
    Rem,
}

impl Op {
    fn precedence(self) -> u8 {
        match self {
            Op::Add | Op::Sub => 1,
            Op::Mul | Op::FloorDiv | Op::Rem => 2,
        }
    }
}

impl Cursor<'_> {
    fn peek_op(&self) -> Option<(Op, usize)> {
        match (self.peek(0), self.peek(1)) {
            (Some(Token::Punct('+')), _) => Some((Op::Add, 1)),
            (Some(Token::Punct('-')), _) => Some((Op::Sub, 1)),
            (Some(Token::Punct('*')), _) => Some((Op::Mul, 1)),
            (Some(Token::Punct('/')), Some(Token::Punct('/'))) => Some((Op::FloorDiv, 2)),
            (Some(Token::Punct('%')), _) => Some((Op::Rem, 1)),
            _ => None,
        }
    }

    /// `first`, or the expression it begins when an operator follows it.
    pub(super) fn expression_after(&mut self, first: Arg) -> Result<Arg> {
        if let Some(float) = self.float_operation(&first)? {
            return Ok(float);
        }
        if self.peek_op().is_none() {
            return Ok(first);
        }
        let lhs = self.poly(&first)?;
        let expr = self.climb(lhs, 1)?;
        Ok(poly_arg(expr))
    }

    /// Precedence climbing over the operators of size expressions.
    fn climb(&mut self, mut lhs: Poly, min: u8) -> Result<Poly> {
        while let Some((op, width)) = self.peek_op().filter(|(op, _)| op.precedence() >= min) {
            self.pos += width;
            let first = self.primary()?;
            let mut rhs = self.poly(&first)?;
            while let Some((next, _)) = self.peek_op().filter(|(next, _)| next.precedence() > op.precedence()) {
                rhs = self.climb(rhs, next.precedence())?;
            }
            lhs = self.apply(op, lhs, rhs)?;
        }
        Ok(lhs)
    }

    fn apply(&self, op: Op, lhs: Poly, rhs: Poly) -> Result<Poly> {
        let divisor = || match rhs.as_constant() {
            Some(k) if k > 0 => Ok(k),
            _ => Err(self.error(format!("a size can only be divided by a positive constant, not {rhs}"))),
        };
        Ok(match op {
            Op::Add => lhs.add(&rhs),
            Op::Sub => lhs.add(&rhs.scale(-1)),
            Op::Mul => lhs.mul(&rhs),
            Op::FloorDiv => lhs.floordiv(divisor()?),
            Op::Rem => lhs.rem(divisor()?),
        })
    }

    /// The float operation of a symbolic float (`t0 ** -0.5`, `1.0 / t0`, `t0 * 0.5`) that begins
    /// with `first`, if one does: an operator only floats have (`/`, `**`), or an arithmetic one
    /// with a float operand. Each is printed in parentheses of its own, so one operator follows
    /// `first` at most; `None` (nothing consumed) where the operation is an int one.
    fn float_operation(&mut self, first: &Arg) -> Result<Option<Arg>> {
        let (op, width) = match (self.peek(0), self.peek(1)) {
            (Some(Token::Punct('*')), Some(Token::Punct('*'))) => (FloatOp::Pow, 2),
            (Some(Token::Punct('/')), next) if next != Some(&Token::Punct('/')) => (FloatOp::Div, 1),
            (Some(Token::Punct('+')), _) => (FloatOp::Add, 1),
            (Some(Token::Punct('-')), _) => (FloatOp::Sub, 1),
            (Some(Token::Punct('*')), _) => (FloatOp::Mul, 1),
            _ => return Ok(None),
        };
        let Some(lhs) = float_operand(first) else { return Ok(None) };
        let start = self.pos;
        self.pos += width;
        let second = self.primary()?;
        let Some(rhs) = float_operand(&second) else { return Err(self.error(format!("{second:?} in an expression"))) };
        let floats = is_float(first) || is_float(&second) || matches!(op, FloatOp::Div | FloatOp::Pow);
        if !floats {
            self.pos = start;
            return Ok(None);
        }
        Ok(Some(Arg::SymFloat(Arc::new(SymFloat::new(FloatExpr::bin(op, lhs, rhs), 0.0)))))
    }

    fn poly(&self, arg: &Arg) -> Result<Poly> {
        match arg {
            Arg::Scalar(Scalar::Int(c)) => Ok(Poly::constant(*c)),
            Arg::Value(v) => Ok(Poly::atom(Atom::Value(*v))),
            Arg::Sym(s) => Ok(s.expr.clone()),
            other => Err(self.error(format!("expected an int or a size in an expression, found {other:?}"))),
        }
    }
}

/// An operand of a float operation: an int, a size, a float or a symbolic float.
fn float_operand(arg: &Arg) -> Option<FloatExpr> {
    match arg {
        Arg::Scalar(Scalar::Float(x)) => Some(FloatExpr::Float(*x)),
        Arg::Scalar(Scalar::Int(c)) => Some(FloatExpr::Int(Dim::Const(*c))),
        Arg::Value(v) => Some(FloatExpr::Int(Dim::size(*v, 0))),
        Arg::Sym(s) => Some(FloatExpr::Int(Dim::Sym(s.clone()))),
        Arg::SymFloat(s) => Some(s.expr.clone()),
        _ => None,
    }
}

fn is_float(arg: &Arg) -> bool {
    matches!(arg, Arg::Scalar(Scalar::Float(_)) | Arg::SymFloat(_))
}

/// `-operand` of a symbolic float, as printed (`(-(t0 ** 0.5))`).
pub(super) fn negated(arg: &Arg) -> Option<Arg> {
    match arg {
        Arg::SymFloat(s) => Some(Arg::SymFloat(Arc::new(SymFloat::new(FloatExpr::Neg(Box::new(s.expr.clone())), 0.0)))),
        _ => None,
    }
}

/// `torch.sym_sqrt(operand)` of a symbolic float, as printed.
pub(super) fn square_root(arg: &Arg) -> Option<Arg> {
    let expr = FloatExpr::Sqrt(Box::new(float_operand(arg)?));
    Some(Arg::SymFloat(Arc::new(SymFloat::new(expr, 0.0))))
}

/// `math.<func>(operand)` of a symbolic float, as printed.
pub(super) fn math_call(func: FloatFn, arg: &Arg) -> Option<Arg> {
    let expr = FloatExpr::Math(func, Box::new(float_operand(arg)?));
    Some(Arg::SymFloat(Arc::new(SymFloat::new(expr, 0.0))))
}

/// An expression as an argument: an int literal when it has no atom; a placeholder hint.
fn poly_arg(expr: Poly) -> Arg {
    match expr.as_constant() {
        Some(c) => Arg::Scalar(Scalar::Int(c)),
        None => Arg::Sym(Arc::new(SymDim { expr, hint: 0 })),
    }
}

/// One size of a type comment: `12`, `t0`, `2*t0 + 1`.
pub(super) fn parse_dim(text: &str) -> Result<Dim> {
    let tokens = lex(NO_LINE, text)?.tokens;
    let mut cursor = Cursor::new(&tokens, NO_LINE);
    let arg = cursor.arg()?;
    cursor.finish()?;
    match arg {
        Arg::Scalar(Scalar::Int(c)) => Ok(Dim::Const(c)),
        Arg::Value(v) => Ok(Dim::Sym(Arc::new(SymDim { expr: Poly::atom(Atom::Value(v)), hint: 0 }))),
        Arg::Sym(s) => Ok(Dim::Sym(s)),
        _ => Err(IrError::new(ErrorKind::Value, OP, format!("cannot read the size \"{text}\""))),
    }
}

/// A guard line's text after `guard `: `t0 - t1 == 0`.
pub(super) fn parse_guard(line: usize, text: &str) -> Result<Guard> {
    let rels = [(" == 0", Rel::Eq), (" != 0", Rel::Ne), (" >= 0", Rel::Ge)];
    let Some((expr, rel)) = rels.iter().find_map(|(suffix, rel)| text.strip_suffix(suffix).map(|e| (e, *rel))) else {
        return Err(error(line, format!("a guard reads `<expr> == 0`, `!= 0` or `>= 0`, not `{text}`")));
    };
    let tokens = lex(line, expr)?.tokens;
    let mut cursor = Cursor::new(&tokens, line);
    let arg = cursor.arg()?;
    cursor.finish()?;
    Ok(Guard { expr: cursor.poly(&arg)?, rel })
}

/// The hint of size value `v` in `builder`, or an error naming it.
fn size_hint(builder: &TraceBuilder, v: ValueId) -> Result<i64> {
    match builder.value(v) {
        Some(ValueKind::Size(hint)) => Ok(*hint),
        _ => Err(IrError::new(ErrorKind::Value, OP, format!("{v} is used as a size but is not a size value"))),
    }
}

/// `poly` over the builder's values, checked to read size values only, with its hint.
fn hinted(builder: &TraceBuilder, expr: Poly) -> Result<Dim> {
    let mut bad = None;
    expr.for_each_value(&mut |v| {
        if bad.is_none() {
            bad = size_hint(builder, v).err();
        }
    });
    if let Some(e) = bad {
        return Err(e);
    }
    let hint = expr.eval(&|v| size_hint(builder, v).expect("checked above")).ok_or_else(|| overflow(&expr))?;
    Ok(Dim::from_poly(expr, hint))
}

fn overflow(expr: &Poly) -> IrError {
    IrError::new(ErrorKind::Value, OP, format!("the size {expr} leaves int64 at its size values' hints"))
}

/// `expr` with each operand that names a float input (read as a size: `(t0 * 0.5)`) that input.
fn float_inputs(expr: &FloatExpr, builder: &TraceBuilder) -> FloatExpr {
    let input = |d: &Dim| match d.poly().terms() {
        [(atoms, 1)] => match atoms.as_slice() {
            [Atom::Value(v)] => match builder.value(*v) {
                Some(ValueKind::Number(Scalar::Float(x))) => Some(FloatExpr::Input(*v, *x)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    };
    let inner = |a: &FloatExpr| Box::new(float_inputs(a, builder));
    match expr {
        FloatExpr::Int(d) => input(d).unwrap_or_else(|| expr.clone()),
        FloatExpr::Input(..) | FloatExpr::Float(_) => expr.clone(),
        FloatExpr::Neg(a) => FloatExpr::Neg(inner(a)),
        FloatExpr::Sqrt(a) => FloatExpr::Sqrt(inner(a)),
        FloatExpr::Math(func, a) => FloatExpr::Math(*func, inner(a)),
        FloatExpr::Bin(op, a, b) => FloatExpr::Bin(*op, inner(a), inner(b)),
    }
}

/// `arg` (names resolved) with each symbolic int's hint computed from the size values it reads.
pub(super) fn with_hints(arg: &Arg, builder: &TraceBuilder) -> Result<Arg> {
    let all = |items: &[Arg]| items.iter().map(|a| with_hints(a, builder)).collect::<Result<Vec<_>>>();
    Ok(match arg {
        Arg::Sym(s) => Arg::dim(&hinted(builder, s.expr.clone())?),
        Arg::SymFloat(s) => {
            let mut bad = None;
            let expr = float_inputs(&s.expr, builder).map_ints(&mut |d| match d {
                Dim::Sym(s) => hinted(builder, s.expr.clone()).unwrap_or_else(|e| {
                    bad.get_or_insert(e);
                    d.clone()
                }),
                Dim::Const(_) => d.clone(),
            });
            if let Some(e) = bad {
                return Err(e);
            }
            let hint = expr.eval(&|v| size_hint(builder, v).expect("checked above"));
            let hint = hint.ok_or_else(|| IrError::new(ErrorKind::Value, OP, format!("{expr} leaves int64")))?;
            Arg::SymFloat(Arc::new(SymFloat::new(expr, hint)))
        }
        Arg::Value(v) => builder.sized(*v),
        Arg::Tuple(items) => Arg::Tuple(all(items)?),
        Arg::List(items) => Arg::List(all(items)?),
        Arg::Slice(parts) => {
            let [a, b, c]: [Arg; 3] = all(&parts[..])?.try_into().expect("three parts");
            Arg::Slice(Box::new([a, b, c]))
        }
        other => other.clone(),
    })
}

impl Parser {
    /// `expr` over the text's names, over the builder's values instead.
    fn resolve_poly(&self, line: usize, expr: &Poly) -> Result<Poly> {
        let mut unknown = None;
        let resolved = expr.substitute(&mut |v| match self.id(v) {
            Some(id) => Poly::atom(Atom::Value(id)),
            None => {
                unknown.get_or_insert(v);
                Poly::constant(0)
            }
        });
        match unknown {
            Some(v) => Err(error(line, format!("{v} is read here but no line above defines it"))),
            None => Ok(resolved),
        }
    }

    /// A type read from a comment, its sizes over the builder's values with their hints.
    pub(super) fn resolve_kind(&self, line: usize, kind: &ValueKind) -> Result<ValueKind> {
        let ValueKind::Tensor(t) = kind else { return Ok(kind.clone()) };
        let shape = t
            .shape
            .iter()
            .map(|d| match d {
                Dim::Const(_) => Ok(d.clone()),
                Dim::Sym(s) => hinted(&self.builder, self.resolve_poly(line, &s.expr)?).map_err(super::at(line)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ValueKind::Tensor(TensorMeta { shape, ..t.clone() }))
    }

    /// A guard read from the text, over the builder's values.
    pub(super) fn resolve_guard(&self, line: usize, guard: &Guard) -> Result<Guard> {
        Ok(Guard { expr: self.resolve_poly(line, &guard.expr)?, rel: guard.rel })
    }

    /// `kind` with its sizes over the names the text gave the values, to compare with a comment.
    pub(super) fn named_kind(&self, kind: &ValueKind) -> ValueKind {
        let ValueKind::Tensor(t) = kind else { return kind.clone() };
        if !t.is_symbolic() {
            return kind.clone();
        }
        let name_of = |id: ValueId| self.names.iter().find(|(_, &v)| v == id).map_or(id, |(&name, _)| name);
        let shape = t
            .shape
            .iter()
            .map(|d| {
                let expr = d.poly().substitute(&mut |v| Poly::atom(Atom::Value(name_of(v))));
                Dim::from_poly(expr, d.hint())
            })
            .collect();
        ValueKind::Tensor(TensorMeta { shape, ..t.clone() })
    }
}
