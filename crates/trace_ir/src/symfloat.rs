//! Symbolic floats: Python floats a program computes from sizes that change between calls
//! (`T ** -0.5`, `1.0 / T`, `T * 0.5`), kept as the operations the program performed.
//!
//! Unlike a symbolic int ([`crate::sym`]), whose canonical form is a polynomial, a float is never
//! simplified or re-associated: float arithmetic is not associative, and the compiled program
//! must compute the value eager computes bit for bit. An expression is therefore the tree of the
//! program's own operations, in its order, printed as Python with every operation parenthesised
//! (`(t0 ** -0.5)`, `((t0 * 0.5) + 1.0)`): the generated code evaluates it with the same Python
//! float (and int) operations eager performed.
//!
//! A float the program is called with that changes between calls (a learning rate, a loss
//! weight) is a float input of the trace (a [`crate::ValueKind::Number`] input): an operand
//! [`FloatExpr::Input`], passed on each call as the caller's Python float itself.

use crate::ids::ValueId;
use crate::sym::{Atom, Dim, Poly};
use std::fmt;
use std::hash::{Hash, Hasher};

/// A binary operation of Python floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (true division; of two ints, Python's correctly rounded quotient).
    Div,
    /// `a ** b`.
    Pow,
}

impl FloatOp {
    /// Every operation, in the order of their binary codes.
    pub const ALL: [FloatOp; 5] = [FloatOp::Add, FloatOp::Sub, FloatOp::Mul, FloatOp::Div, FloatOp::Pow];

    /// The Python operator: `+`, `**`.
    pub fn symbol(self) -> &'static str {
        match self {
            FloatOp::Add => "+",
            FloatOp::Sub => "-",
            FloatOp::Mul => "*",
            FloatOp::Div => "/",
            FloatOp::Pow => "**",
        }
    }

    /// The operation's code in the binary form.
    pub fn code(self) -> u8 {
        FloatOp::ALL.iter().position(|&op| op == self).expect("listed") as u8
    }

    /// The operation of a binary code.
    pub fn from_code(code: u8) -> Option<FloatOp> {
        FloatOp::ALL.get(code as usize).copied()
    }

    fn apply(self, a: f64, b: f64) -> f64 {
        match self {
            FloatOp::Add => a + b,
            FloatOp::Sub => a - b,
            FloatOp::Mul => a * b,
            FloatOp::Div => a / b,
            FloatOp::Pow => a.powf(b),
        }
    }
}

/// A function of Python's `math` module of one float: libm's, called on the same double in the
/// compiled program as in eager (`math.log(t0)`), so the value is eager's bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatFn {
    /// `math.exp(a)`.
    Exp,
    /// `math.expm1(a)`.
    Expm1,
    /// `math.log(a)` (one argument: the natural logarithm).
    Log,
    /// `math.log1p(a)`.
    Log1p,
    /// `math.log2(a)`.
    Log2,
    /// `math.log10(a)`.
    Log10,
}

impl FloatFn {
    /// Every function, in the order of their binary codes.
    pub const ALL: [FloatFn; 6] =
        [FloatFn::Exp, FloatFn::Expm1, FloatFn::Log, FloatFn::Log1p, FloatFn::Log2, FloatFn::Log10];

    /// The name in `math`: `log`, `exp`.
    pub fn name(self) -> &'static str {
        match self {
            FloatFn::Exp => "exp",
            FloatFn::Expm1 => "expm1",
            FloatFn::Log => "log",
            FloatFn::Log1p => "log1p",
            FloatFn::Log2 => "log2",
            FloatFn::Log10 => "log10",
        }
    }

    /// The function named `name` in `math`, if it is one of these.
    pub fn from_name(name: &str) -> Option<FloatFn> {
        FloatFn::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The function's code in the binary form.
    pub fn code(self) -> u8 {
        FloatFn::ALL.iter().position(|&f| f == self).expect("listed") as u8
    }

    /// The function of a binary code.
    pub fn from_code(code: u8) -> Option<FloatFn> {
        FloatFn::ALL.get(code as usize).copied()
    }

    /// The value as the platform's libm computes it (a hint: the compiled program calls Python's).
    pub fn apply(self, a: f64) -> f64 {
        match self {
            FloatFn::Exp => a.exp(),
            FloatFn::Expm1 => a.exp_m1(),
            FloatFn::Log => a.ln(),
            FloatFn::Log1p => a.ln_1p(),
            FloatFn::Log2 => a.log2(),
            FloatFn::Log10 => a.log10(),
        }
    }
}

/// An expression of a symbolic float: Python float operations over ints (constant or
/// symbolic sizes), float inputs and float literals.
#[derive(Clone, Debug)]
pub enum FloatExpr {
    /// An int operand: a constant, or a symbolic size.
    Int(Dim),
    /// A float input of the trace (a float argument that changes between calls), with its
    /// value when recorded (compared by bits), printed by the value's name (`t3`).
    Input(ValueId, f64),
    /// A float literal.
    Float(f64),
    /// `-a`.
    Neg(Box<FloatExpr>),
    /// The square root (`math.sqrt`, correctly rounded; not `a ** 0.5`, which may differ in the
    /// last bit), printed `torch.sym_sqrt(a)` (`math.sqrt` of a number).
    Sqrt(Box<FloatExpr>),
    /// A function of `math` (`math.log(a)`), printed so.
    Math(FloatFn, Box<FloatExpr>),
    /// `a op b`.
    Bin(FloatOp, Box<FloatExpr>, Box<FloatExpr>),
}

impl FloatExpr {
    /// `a op b`.
    pub fn bin(op: FloatOp, a: FloatExpr, b: FloatExpr) -> FloatExpr {
        FloatExpr::Bin(op, Box::new(a), Box::new(b))
    }

    /// The value, each size value read by `value` (an int operand meets floats as Python's
    /// `float(int)`, exact for sizes); `None` where an int operand leaves `i64` (`Poly::eval`).
    pub fn eval(&self, value: &impl Fn(ValueId) -> i64) -> Option<f64> {
        Some(match self {
            FloatExpr::Int(d) => d.poly().eval(value)? as f64,
            FloatExpr::Input(_, x) | FloatExpr::Float(x) => *x,
            FloatExpr::Neg(a) => -a.eval(value)?,
            FloatExpr::Sqrt(a) => a.eval(value)?.sqrt(),
            FloatExpr::Math(func, a) => func.apply(a.eval(value)?),
            FloatExpr::Bin(op, a, b) => op.apply(a.eval(value)?, b.eval(value)?),
        })
    }

    /// Calls `f` on every value the expression reads (sizes and float inputs), in order.
    pub fn for_each_value(&self, f: &mut impl FnMut(ValueId)) {
        match self {
            FloatExpr::Int(d) => d.for_each_value(f),
            FloatExpr::Input(v, _) => f(*v),
            FloatExpr::Float(_) => {}
            FloatExpr::Neg(a) | FloatExpr::Sqrt(a) | FloatExpr::Math(_, a) => a.for_each_value(f),
            FloatExpr::Bin(_, a, b) => {
                a.for_each_value(f);
                b.for_each_value(f);
            }
        }
    }

    /// The same operations with each int operand replaced by `f(operand)`.
    pub fn map_ints(&self, f: &mut impl FnMut(&Dim) -> Dim) -> FloatExpr {
        match self {
            FloatExpr::Int(d) => FloatExpr::Int(f(d)),
            FloatExpr::Input(v, x) => FloatExpr::Input(*v, *x),
            FloatExpr::Float(x) => FloatExpr::Float(*x),
            FloatExpr::Neg(a) => FloatExpr::Neg(Box::new(a.map_ints(f))),
            FloatExpr::Sqrt(a) => FloatExpr::Sqrt(Box::new(a.map_ints(f))),
            FloatExpr::Math(func, a) => FloatExpr::Math(*func, Box::new(a.map_ints(f))),
            FloatExpr::Bin(op, a, b) => FloatExpr::bin(*op, a.map_ints(f), b.map_ints(f)),
        }
    }

    /// The same operations over size values renamed by `f` (their hints unchanged).
    pub fn renamed(&self, f: &mut impl FnMut(ValueId) -> Poly) -> FloatExpr {
        self.map_ints(&mut |d| match d {
            Dim::Const(_) => d.clone(),
            Dim::Sym(s) => Dim::from_poly(s.expr.substitute(f), s.hint),
        })
    }

    /// The same operations over float inputs renamed by `f`.
    pub fn map_inputs(&self, f: &mut impl FnMut(ValueId) -> ValueId) -> FloatExpr {
        match self {
            FloatExpr::Input(v, x) => FloatExpr::Input(f(*v), *x),
            FloatExpr::Int(_) | FloatExpr::Float(_) => self.clone(),
            FloatExpr::Neg(a) => FloatExpr::Neg(Box::new(a.map_inputs(f))),
            FloatExpr::Sqrt(a) => FloatExpr::Sqrt(Box::new(a.map_inputs(f))),
            FloatExpr::Math(func, a) => FloatExpr::Math(*func, Box::new(a.map_inputs(f))),
            FloatExpr::Bin(op, a, b) => FloatExpr::bin(*op, a.map_inputs(f), b.map_inputs(f)),
        }
    }

    /// Whether the expression reads a float input (its value is the caller's on each call).
    pub fn has_inputs(&self) -> bool {
        match self {
            FloatExpr::Input(..) => true,
            FloatExpr::Int(_) | FloatExpr::Float(_) => false,
            FloatExpr::Neg(a) | FloatExpr::Sqrt(a) | FloatExpr::Math(_, a) => a.has_inputs(),
            FloatExpr::Bin(_, a, b) => a.has_inputs() || b.has_inputs(),
        }
    }
}

impl PartialEq for FloatExpr {
    /// Equality as data, floats by their bits (as [`crate::Scalar`] compares them).
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (FloatExpr::Int(a), FloatExpr::Int(b)) => a == b,
            (FloatExpr::Input(v, a), FloatExpr::Input(w, b)) => v == w && a.to_bits() == b.to_bits(),
            (FloatExpr::Float(a), FloatExpr::Float(b)) => a.to_bits() == b.to_bits(),
            (FloatExpr::Neg(a), FloatExpr::Neg(b)) | (FloatExpr::Sqrt(a), FloatExpr::Sqrt(b)) => a == b,
            (FloatExpr::Math(f, a), FloatExpr::Math(g, b)) => f == g && a == b,
            (FloatExpr::Bin(o, a, b), FloatExpr::Bin(p, c, d)) => o == p && a == c && b == d,
            _ => false,
        }
    }
}

impl Eq for FloatExpr {}

impl Hash for FloatExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            FloatExpr::Int(d) => d.hash(state),
            FloatExpr::Input(v, x) => {
                v.hash(state);
                x.to_bits().hash(state);
            }
            FloatExpr::Float(x) => x.to_bits().hash(state),
            FloatExpr::Neg(a) | FloatExpr::Sqrt(a) => a.hash(state),
            FloatExpr::Math(func, a) => {
                func.hash(state);
                a.hash(state);
            }
            FloatExpr::Bin(op, a, b) => {
                op.hash(state);
                a.hash(state);
                b.hash(state);
            }
        }
    }
}

impl fmt::Display for FloatExpr {
    /// Python that computes the value as the program did: each operation parenthesised, an
    /// operand that is not a plain name or non-negative literal too (`(-0.5) ** t0` is not
    /// `-0.5 ** t0`, which Python reads as `-(0.5 ** t0)`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FloatExpr::Int(Dim::Const(c)) if *c < 0 => write!(f, "({c})"),
            FloatExpr::Int(Dim::Const(c)) => write!(f, "{c}"),
            FloatExpr::Int(Dim::Sym(s)) => match s.expr.terms() {
                [(atoms, 1)] if matches!(atoms.as_slice(), [Atom::Value(_)]) => write!(f, "{}", s.expr),
                _ => write!(f, "({})", s.expr),
            },
            FloatExpr::Input(v, _) => write!(f, "{v}"),
            FloatExpr::Float(x) => {
                let text = crate::Scalar::Float(*x).to_string();
                if x.is_sign_negative() || !x.is_finite() {
                    write!(f, "({text})")
                } else {
                    f.write_str(&text)
                }
            }
            FloatExpr::Neg(a) => write!(f, "(-{a})"),
            FloatExpr::Sqrt(a) => write!(f, "torch.sym_sqrt({a})"),
            FloatExpr::Math(func, a) => write!(f, "math.{}({a})", func.name()),
            FloatExpr::Bin(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
        }
    }
}

/// A symbolic float: its operations and the value it had when recorded.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SymFloat {
    /// The operations over sizes and literals.
    pub expr: FloatExpr,
    /// Its value when the trace was recorded, as the program computed it (compared by bits).
    pub hint: HintF64,
}

impl SymFloat {
    /// A symbolic float of these operations whose value was `hint`.
    pub fn new(expr: FloatExpr, hint: f64) -> SymFloat {
        SymFloat { expr, hint: HintF64(hint) }
    }
}

/// A float that compares and hashes by its bits (a hint, which CSE keys on with the rest).
#[derive(Clone, Copy, Debug)]
pub struct HintF64(pub f64);

impl PartialEq for HintF64 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for HintF64 {}

impl Hash for HintF64 {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}
