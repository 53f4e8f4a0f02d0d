//! The primitive operations, declared once per family.
//!
//! Prims are as in Thunder and jax.lax: no broadcasting, no type promotion, no defaults. The
//! Python decompositions (`ltorch`, `clang`) reduce torch calls to prims. Each family lives in one
//! file: its declaration (variants, names, operands, typed parameters; see `declare.rs`), its meta
//! rules and its VJP rules. Everything else — the [`Prim`] enum, names, call decoding, printing,
//! the table Python builds its entry points, ltorch symbols and torch executor from — is derived
//! here from the list of families. Adding a prim to a family touches that family's file only;
//! a prim without a meta or VJP rule does not compile.

mod args;
mod complex;
mod conv;
mod creation;
pub(crate) mod declare;
mod elementwise;
mod fft;
mod holomorphic;
mod indexing;
mod linalg;
mod reduce;
mod scan;
mod shape;

use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::Facts;
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use crate::ValueId;
use args::CallArgs;
use declare::Family;
use rustc_hash::FxHashMap;
use std::sync::LazyLock;

pub use complex::Complex;
pub use conv::Conv;
pub use creation::Creation;
pub use declare::Operands;
pub use elementwise::{Accepts, Binary, Elementwise, Output, Promotion, Unary};
pub use fft::Fft;
pub use indexing::Index;
pub use linalg::Linalg;
pub use reduce::Reduce;
pub use scan::Scan;
pub use shape::Shape;

/// An operand of a prim as its meta rule sees it.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// A tensor operand, by its metadata.
    Tensor(&'a TensorMeta),
    /// A number operand: a literal, or a number value of the trace (its value is known, since
    /// numbers are specialised).
    Number(Scalar),
}

impl<'v> Operand<'v> {
    /// The operand `arg` stands for among `values`: a tensor's metadata, or a number (a size
    /// value or symbolic int at its hint); an error naming `op` for anything else.
    pub fn of(values: &'v [ValueKind], op: &str, arg: &Arg) -> Result<Operand<'v>> {
        match arg {
            Arg::Value(v) => match values.get(v.index()) {
                Some(ValueKind::Tensor(t)) => Ok(Operand::Tensor(t)),
                Some(ValueKind::Number(n)) => Ok(Operand::Number(*n)),
                Some(ValueKind::Size(hint)) => Ok(Operand::Number(Scalar::Int(*hint))),
                None => crate::bail!(Runtime, op, "unknown value {v}"),
            },
            Arg::Scalar(s) => Ok(Operand::Number(*s)),
            Arg::Sym(s) => Ok(Operand::Number(Scalar::Int(s.hint))),
            Arg::SymFloat(s) => Ok(Operand::Number(Scalar::Float(s.hint.0))),
            other => crate::bail!(Type, op, "expected a tensor or number operand, got {other:?}"),
        }
    }

    /// Whether the operand is a tensor with a symbolic size.
    pub fn is_symbolic(&self) -> bool {
        matches!(self, Operand::Tensor(t) if t.is_symbolic())
    }
}

/// One row of the table Python derives its prim entry points and torch implementations from.
#[derive(Clone, Debug)]
pub struct PrimInfo {
    /// The prim's name as printed after `prims.` (the Python entry point's name).
    pub name: &'static str,
    /// The family it is declared in (`Unary`, `Shape`, ...), which tells Python how to build its
    /// entry point.
    pub family: &'static str,
    /// The ltorch type promotion code of a parameterless elementwise prim whose ltorch symbol
    /// is derived (`clang`'s DEFAULT, INT_TO_FLOAT, ...); `None` for the others.
    pub promotion: Option<u8>,
}

/// What a call of a prim takes, known from its name alone (patterns and rewrite rules given as
/// data are checked against it before any trace exists).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// How many operands (tensors or numbers) come before the parameters.
    pub operands: Operands,
    /// The parameters' names, in the order a call prints them after the operands.
    pub params: &'static [&'static str],
}

/// A prim without its parameters (`sum`, whatever its dims): its position in [`all_names`].
/// Executors' tables claim by it, so a prim name is resolved once, when a table is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrimId(u32);

static NAMES: LazyLock<Vec<&'static str>> = LazyLock::new(all_names);
static IDS: LazyLock<FxHashMap<&'static str, PrimId>> =
    LazyLock::new(|| NAMES.iter().enumerate().map(|(i, &name)| (name, PrimId(i as u32))).collect());

impl PrimId {
    /// The prim named `name` (`add`), if there is one.
    pub fn from_name(name: &str) -> Option<PrimId> {
        IDS.get(name).copied()
    }

    /// The prim's name as printed after `prims.`.
    pub fn name(self) -> &'static str {
        NAMES[self.0 as usize]
    }
}

macro_rules! families {
    ($($fam:ident),* $(,)?) => {
        /// A primitive operation with its parameters: one variant per family.
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum Prim {
            $(#[doc = concat!("A prim of the [`", stringify!($fam), "`] family.")] $fam($fam),)*
        }

        $(impl From<$fam> for Prim {
            fn from(p: $fam) -> Prim {
                Prim::$fam(p)
            }
        })*

        impl Prim {
            /// The prim's name as printed after `prims.`.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Prim::$fam(p) => p.name(),)*
                }
            }

            /// The prim without its parameters.
            pub fn id(&self) -> PrimId {
                #[allow(dead_code)]
                enum Position { $($fam),* }
                const COUNTS: &[usize] = &[$($fam::NAMES.len()),*];
                let (family, index) = match self {
                    $(Prim::$fam(p) => (Position::$fam as usize, p.index()),)*
                };
                PrimId((COUNTS[..family].iter().sum::<usize>() + index) as u32)
            }

            /// The family's name (`Unary`, `Shape`, ...).
            pub fn family(&self) -> &'static str {
                match self {
                    $(Prim::$fam(_) => stringify!($fam),)*
                }
            }

            /// How many operands the prim takes (tensors and numbers, before its parameters).
            pub fn operands(&self) -> Operands {
                match self {
                    $(Prim::$fam(p) => p.operands(),)*
                }
            }

            /// The parameters as call arguments, printed after the operands.
            pub fn params(&self) -> Vec<Arg> {
                match self {
                    $(Prim::$fam(p) => p.params(),)*
                }
            }

            fn parse(name: &str, c: &mut CallArgs) -> Result<(Prim, Vec<Arg>)> {
                $(if let Some(parsed) = $fam::parse(name, c) {
                    return parsed.map(|(p, operands)| (Prim::$fam(p), operands));
                })*
                crate::bail!(NotImplemented, &format!("prims.{name}"), "unknown prim")
            }

            fn family_meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
                match self {
                    $(Prim::$fam(p) => p.meta(op, operands, facts),)*
                }
            }

            fn family_vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
                match self {
                    $(Prim::$fam(p) => p.vjp(e, operands, outputs, cots),)*
                }
            }
        }

        /// The operands and parameter names of the prim named `name` (`sum`: one operand, `dims`).
        pub fn signature(name: &str) -> Option<Signature> {
            None$(.or_else(|| $fam::signature(name)))*
        }

        /// Every prim name, in family order.
        pub fn all_names() -> Vec<&'static str> {
            [$($fam::NAMES),*].concat()
        }

        /// Every prim with its family, for Python.
        pub fn table() -> Vec<PrimInfo> {
            let mut rows = Vec::new();
            $(rows.extend($fam::NAMES.iter().map(|&name| PrimInfo { name, family: stringify!($fam), promotion: None }));)*
            for row in &mut rows {
                row.promotion = elementwise::derived_promotion(row.name);
            }
            rows
        }
    };
}

families!(Unary, Binary, Elementwise, Shape, Creation, Reduce, Scan, Linalg, Conv, Index, Complex, Fft);

impl Prim {
    /// `prims.add`: the name that errors and traces use.
    pub fn qualified_name(&self) -> String {
        format!("prims.{}", self.name())
    }

    /// Builds a prim from the positional arguments of a call `prims.<name>(*args)`.
    ///
    /// Returns the prim and its operands (tensor values and numbers); the other arguments become
    /// the prim's parameters. Operands always come first in a prim's signature.
    pub fn from_call(name: &str, args: Vec<Arg>) -> Result<(Prim, Vec<Arg>)> {
        let mut call = CallArgs::new(name, args);
        let parsed = Prim::parse(name, &mut call)?;
        call.finish()?;
        Ok(parsed)
    }

    /// The full positional argument list of a call to this prim with `operands`, as printed.
    pub fn call_args(&self, operands: &[Arg]) -> Vec<Arg> {
        let mut out = self.operands().call_args(operands);
        out.extend(self.params());
        out
    }

    /// Whether the parameters read a value for which `read` is true: the size values of symbolic
    /// parameters (a slice from `t0`, a reshape to `(t0, 4)`), which no operand shows.
    pub fn params_read(&self, read: &mut impl FnMut(ValueId) -> bool) -> bool {
        let mut hit = false;
        self.params().iter().for_each(|a| a.for_each_value(&mut |v| hit |= read(v)));
        hit
    }

    /// The prim with the values its parameters read replaced by `f` (a trace that numbers its
    /// values anew), decoded again from its call; `operands` are the call's.
    pub fn with_params_mapped(&self, operands: &[Arg], f: &mut impl FnMut(ValueId) -> Arg) -> Result<Prim> {
        let mut call = self.operands().call_args(operands);
        call.extend(self.params().iter().map(|a| a.map_values(f)));
        Ok(Prim::from_call(self.name(), call)?.0)
    }

    /// Computes the outputs' metadata from the operands, or a precise error; what it decided on
    /// symbolic sizes' hints alone goes into `facts`. Every meta rule computes with symbolic
    /// sizes (a rule that needs a number where a size is symbolic specialises it: a guard).
    pub fn meta(&self, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>> {
        self.family_meta(&self.qualified_name(), operands, facts)
    }

    /// The gradients of one call of this prim (reverse mode): `cots` holds the cotangent of each
    /// output (`None` where no gradient flows), and the result one gradient per operand, with
    /// the operand's shape and dtype.
    pub fn vjp(
        &self,
        e: &mut Emitter,
        operands: &[Arg],
        outputs: &[ValueId],
        cots: &[Option<ValueId>],
    ) -> Result<Grads> {
        let complex = operands.iter().filter_map(Arg::as_value).any(
            |v| matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad && t.dtype.is_complex()),
        );
        if complex && !self.differentiates_complex() {
            crate::bail!(NotImplemented, &self.qualified_name(), "gradients of complex tensors are not supported");
        }
        let mut grads = self.family_vjp(e, operands, outputs, cots)?;
        // As torch's engine casts each gradient to its input's dtype: a complex gradient of a real
        // input is its real part, a real gradient of a complex input has no imaginary part.
        for (grad, operand) in grads.iter_mut().zip(operands) {
            let (Some(g), Some(x)) = (*grad, operand.as_value()) else { continue };
            let Some(ValueKind::Tensor(t)) = e.builder.value(x) else { continue };
            let dtype = t.dtype;
            if dtype.is_inexact() && e.meta(g).dtype.is_complex() != dtype.is_complex() {
                *grad = Some(e.convert(g, dtype)?);
            }
        }
        Ok(grads)
    }

    /// Whether the VJP rule holds for complex values in torch's convention (see the `complex`
    /// family): the complex prims, the linear ones whose rule involves no conjugation (moving
    /// elements, sums and cumulative sums, `where`, conversions, the Fourier transforms), and
    /// `mul`, whose rule conjugates. Others refuse
    /// complex inputs that require grad: eager's op runs them (`core.lang.complex_calls`).
    pub fn differentiates_complex(&self) -> bool {
        match self {
            Prim::Complex(_) | Prim::Shape(_) | Prim::Fft(_) => true,
            Prim::Unary(p) => p.is_holomorphic(),
            Prim::Binary(p) => matches!(p, Binary::Add | Binary::Sub | Binary::Mul | Binary::Div),
            Prim::Elementwise(p) => matches!(p, Elementwise::Where {} | Elementwise::ConvertElementType { .. }),
            Prim::Reduce(p) => matches!(p, Reduce::Sum { .. }),
            // (a cumulative sum's rule is the reversed cumulative sum: linear, no conjugation)
            Prim::Scan(p) => matches!(p, Scan::Cumsum { .. }),
            Prim::Creation(_) | Prim::Linalg(_) | Prim::Conv(_) | Prim::Index(_) => false,
        }
    }

    /// Elementwise prims map each output element from the same-index input elements.
    pub fn is_elementwise(&self) -> bool {
        match self {
            Prim::Unary(_) | Prim::Binary(_) => true,
            Prim::Elementwise(p) => !matches!(p, Elementwise::DevicePut { .. }),
            Prim::Complex(p) => !matches!(p, Complex::ViewAsComplex { .. } | Complex::ViewAsReal { .. }),
            _ => false,
        }
    }

    /// Whether outputs can require grad (see [`Unary::is_differentiable`]).
    pub fn is_differentiable(&self) -> bool {
        match self {
            Prim::Unary(p) => p.is_differentiable(),
            Prim::Binary(p) => p.is_differentiable(),
            _ => true,
        }
    }

    /// Prims whose outputs differ between calls with equal inputs; never merged by CSE.
    pub fn is_random(&self) -> bool {
        matches!(self, Prim::Creation(c) if c.is_random())
    }

    /// Shape prims only move or select elements.
    pub fn is_shape_op(&self) -> bool {
        matches!(self, Prim::Shape(_))
    }

    /// Prims cheap enough to recompute in the backward instead of saving their output.
    pub fn is_cheap_to_recompute(&self) -> bool {
        self.is_elementwise()
            || self.is_shape_op()
            || matches!(self, Prim::Creation(c) if !c.is_random())
            || matches!(self, Prim::Complex(Complex::ViewAsComplex { .. } | Complex::ViewAsReal { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prims_id_is_its_names_position() {
        for (name, args) in
            [("sin", vec![Arg::Value(ValueId(0))]), ("reshape", vec![Arg::Value(ValueId(0)), Arg::ints(&[2])])]
        {
            let (prim, _) = Prim::from_call(name, args).unwrap();
            assert_eq!(PrimId::from_name(name), Some(prim.id()));
            assert_eq!(prim.id().name(), name);
        }
        assert!(all_names().iter().all(|&name| PrimId::from_name(name).map(PrimId::name) == Some(name)));
        assert_eq!(PrimId::from_name("sinn"), None);
        assert_eq!(signature("sum"), Some(Signature { operands: Operands::Fixed(1), params: &["dims"] }));
        assert_eq!(signature("add").map(|s| s.operands), Some(Operands::Fixed(2)));
        assert!(all_names().iter().all(|name| signature(name).is_some()));
        assert_eq!(signature("sinn"), None);
    }

    #[test]
    fn a_cumulative_sum_differentiates_complex_values_and_a_cumulative_product_does_not() {
        let prim =
            |name: &str| Prim::from_call(name, vec![Arg::Value(ValueId(0)), Arg::Scalar(Scalar::Int(0))]).unwrap().0;
        assert!(prim("cumsum").differentiates_complex());
        assert!(!prim("cumprod").differentiates_complex());
        assert!(!prim("logcumsumexp").differentiates_complex());
    }
}
