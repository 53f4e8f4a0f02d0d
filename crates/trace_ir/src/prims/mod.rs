//! The primitive operations: one enum with typed parameters, one meta rule each.
//!
//! Prims are as in Thunder and jax.lax: no broadcasting, no type promotion, no defaults. The
//! Python decompositions (`ltorch`, `clang`) reduce torch calls to prims. A prim is built from its
//! call arguments by [`Prim::from_call`], printed back by [`Prim::params`], and its outputs'
//! metadata come from [`Prim::meta`], whose rules live in one file per family.

mod args;
mod creation;
mod elementwise;
mod indexing;
mod linalg;
mod reduce;
mod shape;

use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::value::{Arg, Scalar, TensorMeta, ValueKind};
use crate::ValueId;
use args::CallArgs;

/// An operand of a prim as its meta rule sees it.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    Tensor(&'a TensorMeta),
    Number(Scalar),
}

macro_rules! plain_prims {
    ($($variant:ident => $name:literal),* $(,)?) => {
        impl Prim {
            /// The parameterless prims, by name.
            fn plain_from_name(name: &str) -> Option<Prim> {
                match name {
                    $($name => Some(Prim::$variant),)*
                    _ => None,
                }
            }

            fn plain_name(&self) -> Option<&'static str> {
                match self {
                    $(Prim::$variant => Some($name),)*
                    _ => None,
                }
            }
        }

        /// Names of the parameterless prims.
        pub const PLAIN_PRIM_NAMES: &[&str] = &[$($name),*];
    };
}

/// A primitive operation with its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    // Elementwise unary.
    Abs, Neg, Exp, Exp2, Expm1, Log, Log1p, Log2, Log10, Sin, Cos, Tan, Tanh, Sinh, Cosh, Asin,
    Acos, Atan, Asinh, Acosh, Atanh, Erf, Erfc, Erfinv, Sqrt, Rsqrt, Reciprocal, Sign, Signbit,
    Floor, Ceil, Round, Trunc, IsFinite, BitwiseNot, Lgamma, Digamma,
    /// The `order`-th derivative of digamma (`torch.polygamma(order, a)`).
    Polygamma { order: i64 },
    // Elementwise binary.
    Add, Sub, Mul, Div, Pow, Fmod, Remainder, Maximum, Minimum, Atan2, Eq, Ne, Lt, Le, Gt, Ge,
    BitwiseAnd, BitwiseOr, BitwiseXor,
    // Elementwise ternary.
    Where,
    // Element type and device.
    ConvertElementType { dtype: DType },
    DevicePut { device: Device },
    // Shape.
    BroadcastInDim { shape: Vec<i64>, dims: Vec<usize> },
    Reshape { shape: Vec<i64> },
    Transpose { perm: Vec<usize> },
    Slice { start: Vec<i64>, end: Vec<i64>, strides: Vec<i64> },
    Squeeze { dims: Vec<usize> },
    Cat { dim: usize },
    Pad { value: Scalar, config: Vec<(i64, i64, i64)> },
    Flip { dims: Vec<usize> },
    // Creation.
    Full { shape: Vec<i64>, fill: Scalar, device: Device, dtype: DType },
    Iota { length: i64, start: i64, step: i64, device: Device, dtype: DType },
    Uniform { shape: Vec<i64>, low: Scalar, high: Scalar, device: Device, dtype: DType },
    // Reductions.
    Sum { dims: Vec<usize> },
    Prod { dims: Vec<usize> },
    Amax { dims: Vec<usize> },
    Amin { dims: Vec<usize> },
    Var { dims: Vec<usize>, correction: Scalar },
    VarMean { dims: Vec<usize>, correction: Scalar },
    Argmax { dim: Option<usize> },
    Argmin { dim: Option<usize> },
    // Linear algebra.
    Matmul,
    Linear,
    // Indexing.
    Embedding,
    Take { dim: usize },
    TakeAlongAxis { dim: usize },
    Gather { dim: usize },
    ScatterAdd { dim: usize },
    IndexAdd { dim: usize },
    Topk { k: i64, dim: usize, largest: bool, sorted: bool },
    Sort { dim: usize, descending: bool, stable: bool },
}

plain_prims! {
    Abs => "abs", Neg => "neg", Exp => "exp", Exp2 => "exp2", Expm1 => "expm1", Log => "log",
    Log1p => "log1p", Log2 => "log2", Log10 => "log10", Sin => "sin", Cos => "cos", Tan => "tan",
    Tanh => "tanh", Sinh => "sinh", Cosh => "cosh", Asin => "asin", Acos => "acos", Atan => "atan",
    Asinh => "asinh", Acosh => "acosh", Atanh => "atanh", Erf => "erf", Erfc => "erfc",
    Erfinv => "erfinv", Sqrt => "sqrt", Rsqrt => "rsqrt", Reciprocal => "reciprocal",
    Sign => "sign", Signbit => "signbit", Floor => "floor", Ceil => "ceil", Round => "round",
    Trunc => "trunc", IsFinite => "isfinite", BitwiseNot => "bitwise_not", Lgamma => "lgamma",
    Digamma => "digamma",
    Add => "add", Sub => "sub", Mul => "mul", Div => "div", Pow => "pow", Fmod => "fmod",
    Remainder => "remainder", Maximum => "maximum", Minimum => "minimum", Atan2 => "atan2",
    Eq => "eq", Ne => "ne", Lt => "lt", Le => "le", Gt => "gt", Ge => "ge",
    BitwiseAnd => "bitwise_and", BitwiseOr => "bitwise_or", BitwiseXor => "bitwise_xor",
    Where => "where", Matmul => "matmul", Linear => "linear", Embedding => "embedding",
}

/// Names of the prims with parameters, in the order of [`Prim`].
pub const PARAM_PRIM_NAMES: &[&str] = &[
    "polygamma", "convert_element_type", "device_put", "broadcast_in_dim", "reshape", "transpose", "slice",
    "squeeze", "cat", "pad", "flip", "full", "iota", "uniform", "sum", "prod", "amax", "amin",
    "var", "var_mean", "argmax", "argmin", "take", "take_along_axis", "gather", "scatter_add",
    "index_add", "topk", "sort",
];

/// Every prim name, for the Python entry points generated from this table.
pub fn all_names() -> Vec<&'static str> {
    PLAIN_PRIM_NAMES.iter().chain(PARAM_PRIM_NAMES).copied().collect()
}

impl Prim {
    /// The prim's name as printed after `prims.`.
    pub fn name(&self) -> &'static str {
        if let Some(name) = self.plain_name() {
            return name;
        }
        use Prim::*;
        match self {
            Polygamma { .. } => "polygamma",
            ConvertElementType { .. } => "convert_element_type",
            DevicePut { .. } => "device_put",
            BroadcastInDim { .. } => "broadcast_in_dim",
            Reshape { .. } => "reshape",
            Transpose { .. } => "transpose",
            Slice { .. } => "slice",
            Squeeze { .. } => "squeeze",
            Cat { .. } => "cat",
            Pad { .. } => "pad",
            Flip { .. } => "flip",
            Full { .. } => "full",
            Iota { .. } => "iota",
            Uniform { .. } => "uniform",
            Sum { .. } => "sum",
            Prod { .. } => "prod",
            Amax { .. } => "amax",
            Amin { .. } => "amin",
            Var { .. } => "var",
            VarMean { .. } => "var_mean",
            Argmax { .. } => "argmax",
            Argmin { .. } => "argmin",
            Take { .. } => "take",
            TakeAlongAxis { .. } => "take_along_axis",
            Gather { .. } => "gather",
            ScatterAdd { .. } => "scatter_add",
            IndexAdd { .. } => "index_add",
            Topk { .. } => "topk",
            Sort { .. } => "sort",
            _ => unreachable!("plain prims are named by plain_name"),
        }
    }

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
        if let Some((prim, n)) = Prim::plain_from_name(name).and_then(|p| Some((p.clone(), p.fixed_arity()?))) {
            let operands = call.operands(n)?;
            call.finish()?;
            return Ok((prim, operands));
        }
        let (prim, operands) = args::parse_param_prim(&mut call)?;
        call.finish()?;
        Ok((prim, operands))
    }

    /// The number of operands, or `None` for `cat` (variadic) and `linear` (optional bias).
    pub fn fixed_arity(&self) -> Option<usize> {
        use Prim::*;
        match self {
            Cat { .. } | Linear => None,
            Full { .. } | Iota { .. } | Uniform { .. } => Some(0),
            Where | ScatterAdd { .. } | IndexAdd { .. } => Some(3),
            p if p.is_unary_elementwise() => Some(1),
            p if p.is_binary_elementwise() => Some(2),
            Matmul | Embedding | Take { .. } | TakeAlongAxis { .. } | Gather { .. } => Some(2),
            _ => Some(1),
        }
    }

    /// The parameters as call arguments, printed after the operands.
    pub fn params(&self) -> Vec<Arg> {
        args::params(self)
    }

    /// Computes the outputs' metadata from the operands, or a precise error.
    pub fn meta(&self, operands: &[Operand]) -> Result<Vec<TensorMeta>> {
        use Prim::*;
        let op = self.qualified_name();
        match self {
            p if p.is_unary_elementwise() => elementwise::unary(p, &op, operands),
            p if p.is_binary_elementwise() => elementwise::binary(p, &op, operands),
            Where => elementwise::where_(&op, operands),
            ConvertElementType { .. } | DevicePut { .. } => elementwise::retype(self, &op, operands),
            BroadcastInDim { .. } | Reshape { .. } | Transpose { .. } | Slice { .. }
            | Squeeze { .. } | Cat { .. } | Pad { .. } | Flip { .. } => {
                shape::meta(self, &op, operands)
            }
            Full { .. } | Iota { .. } | Uniform { .. } => creation::meta(self, &op),
            Sum { .. } | Prod { .. } | Amax { .. } | Amin { .. } | Var { .. } | VarMean { .. }
            | Argmax { .. } | Argmin { .. } => reduce::meta(self, &op, operands),
            Matmul | Linear => linalg::meta(self, &op, operands),
            _ => indexing::meta(self, &op, operands),
        }
    }

    /// The gradients of one call of this prim (reverse mode): `cots` holds the cotangent of each
    /// output (`None` where no gradient flows), and the result one gradient per operand, with
    /// the operand's shape and dtype. Every prim is listed: a new prim needs a rule to compile.
    pub fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads> {
        use Prim::*;
        let complex = operands.iter().filter_map(Arg::as_value).any(|v| {
            matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad && t.dtype.is_complex())
        });
        if complex {
            crate::bail!(NotImplemented, &self.qualified_name(), "gradients of complex tensors are not supported");
        }
        let x = || operands[0].as_value().expect("the first operand of a differentiable prim is a tensor");
        let g = || cots[0].expect("a single-output prim is differentiated only with a cotangent");
        match self {
            Abs | Neg | Exp | Exp2 | Expm1 | Log | Log1p | Log2 | Log10 | Sin | Cos | Tan | Tanh
            | Sinh | Cosh | Asin | Acos | Atan | Asinh | Acosh | Atanh | Erf | Erfc | Erfinv
            | Sqrt | Rsqrt | Reciprocal | Sign | Signbit | Floor | Ceil | Round | Trunc
            | IsFinite | BitwiseNot | Lgamma | Digamma | Polygamma { .. } => {
                Ok(vec![elementwise::vjp_unary(self, e, x(), outputs[0], g())?])
            }
            Add | Sub | Mul | Div | Pow | Fmod | Remainder | Maximum | Minimum | Atan2 | Eq | Ne
            | Lt | Le | Gt | Ge | BitwiseAnd | BitwiseOr | BitwiseXor => {
                let (ga, gb) = elementwise::vjp_binary(self, e, (&operands[0], &operands[1]), outputs[0], g())?;
                Ok(vec![ga, gb])
            }
            Where => elementwise::vjp_where(e, &operands[0], g()),
            ConvertElementType { .. } | DevicePut { .. } => Ok(vec![elementwise::vjp_retype(self, e, x(), g())?]),
            BroadcastInDim { .. } | Reshape { .. } | Transpose { .. } | Slice { .. } | Squeeze { .. }
            | Cat { .. } | Pad { .. } | Flip { .. } => shape::vjp(self, e, operands, g()),
            Full { .. } | Iota { .. } | Uniform { .. } => Ok(vec![]),
            Sum { .. } | Prod { .. } | Amax { .. } | Amin { .. } | Var { .. } | VarMean { .. }
            | Argmax { .. } | Argmin { .. } => reduce::vjp(self, e, x(), outputs, cots),
            Matmul | Linear => linalg::vjp(self, e, operands, g()),
            Embedding | Take { .. } | TakeAlongAxis { .. } | Gather { .. } | ScatterAdd { .. }
            | IndexAdd { .. } | Topk { .. } | Sort { .. } => indexing::vjp(self, e, operands, outputs, cots),
        }
    }

    pub fn is_unary_elementwise(&self) -> bool {
        use Prim::*;
        matches!(
            self,
            Abs | Neg | Exp | Exp2 | Expm1 | Log | Log1p | Log2 | Log10 | Sin | Cos | Tan | Tanh
                | Sinh | Cosh | Asin | Acos | Atan | Asinh | Acosh | Atanh | Erf | Erfc | Erfinv
                | Sqrt | Rsqrt | Reciprocal | Sign | Signbit | Floor | Ceil | Round | Trunc
                | IsFinite | BitwiseNot | Lgamma | Digamma | Polygamma { .. }
        )
    }

    pub fn is_binary_elementwise(&self) -> bool {
        use Prim::*;
        matches!(
            self,
            Add | Sub | Mul | Div | Pow | Fmod | Remainder | Maximum | Minimum | Atan2 | Eq | Ne
                | Lt | Le | Gt | Ge | BitwiseAnd | BitwiseOr | BitwiseXor
        )
    }

    /// Elementwise prims map each output element from the same-index input elements.
    pub fn is_elementwise(&self) -> bool {
        self.is_unary_elementwise()
            || self.is_binary_elementwise()
            || matches!(self, Prim::Where | Prim::ConvertElementType { .. })
    }

    /// Prims whose outputs differ between calls with equal inputs; never merged by CSE.
    pub fn is_random(&self) -> bool {
        matches!(self, Prim::Uniform { .. })
    }

    /// Shape prims only move or select elements.
    pub fn is_shape_op(&self) -> bool {
        use Prim::*;
        matches!(
            self,
            BroadcastInDim { .. } | Reshape { .. } | Transpose { .. } | Slice { .. }
                | Squeeze { .. } | Cat { .. } | Pad { .. } | Flip { .. }
        )
    }
}
