//! The declaration macros of the prim families.
//!
//! A family is declared once: each prim's variant, name, operands and typed parameters (with the
//! names its errors use). The macros derive the enum, its names, the call decoding
//! (`prims.<name>(*args)` into a typed prim) and the printing of its parameters. Each family's
//! file then implements [`Family`]: its meta rule and VJP rule as exhaustive matches, so that a
//! prim without either does not compile.

use super::args::CallArgs;
use super::Operand;
use crate::dtype::{DType, Device};
use crate::error::Result;
use crate::grad::{Emitter, Grads};
use crate::sym::{Dim, Facts};
use crate::value::{Arg, Scalar, TensorMeta};
use crate::ValueId;

/// How many operands a prim takes; operands come before parameters in a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// Exactly this many tensors or numbers.
    Fixed(usize),
    /// One list of tensors (`cat`).
    List,
    /// This many, then one tensor or `None` (`linear`'s bias).
    WithOptional(usize),
}

impl Operands {
    /// Whether a bound symbol with `n` operands fits.
    pub fn allows(self, n: usize) -> bool {
        match self {
            Operands::Fixed(k) => n == k,
            Operands::List => n >= 1,
            Operands::WithOptional(k) => n == k || n == k + 1,
        }
    }

    /// The positional arguments that hold `operands` in a printed call.
    pub fn call_args(self, operands: &[Arg]) -> Vec<Arg> {
        match self {
            Operands::List => vec![Arg::List(operands.to_vec())],
            Operands::WithOptional(k) if operands.len() == k => operands.iter().cloned().chain([Arg::None]).collect(),
            _ => operands.to_vec(),
        }
    }
}

/// A parameter type: how it is read from a call and printed back.
pub trait Param: Sized {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self>;
    fn to_arg(&self) -> Arg;
}

fn int(i: i64) -> Arg {
    Arg::Scalar(Scalar::Int(i))
}

impl Param for Vec<i64> {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.ints(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::ints(self)
    }
}

/// Canonical (non-negative) dims.
impl Param for Vec<usize> {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.dims(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::Tuple(self.iter().map(|&d| int(d as i64)).collect())
    }
}

/// One canonical dim.
impl Param for usize {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.dim(what)
    }
    fn to_arg(&self) -> Arg {
        int(*self as i64)
    }
}

impl Param for Option<usize> {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.optional_dim(what)
    }
    fn to_arg(&self) -> Arg {
        self.map_or(Arg::None, |d| int(d as i64))
    }
}

impl Param for i64 {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.int(what)
    }
    fn to_arg(&self) -> Arg {
        int(*self)
    }
}

impl Param for bool {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.boolean(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::Scalar(Scalar::Bool(*self))
    }
}

impl Param for Scalar {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.scalar(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::Scalar(*self)
    }
}

impl Param for DType {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.dtype(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::DType(*self)
    }
}

impl Param for Device {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.device(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::Device(*self)
    }
}

/// `pad`'s `(lo, hi, interior dilation)` per dim; `lo` and `hi` may be symbolic.
impl Param for Vec<(Dim, Dim, i64)> {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.pad_config(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::Tuple(self.iter().map(|(l, h, d)| Arg::Tuple(vec![Arg::dim(l), Arg::dim(h), int(*d)])).collect())
    }
}

/// Sizes: int literals or symbolic ints.
impl Param for Vec<Dim> {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.sizes(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::dims(self)
    }
}

/// One size: an int literal or a symbolic int.
impl Param for Dim {
    fn take(c: &mut CallArgs, what: &str) -> Result<Self> {
        c.size(what)
    }
    fn to_arg(&self) -> Arg {
        Arg::dim(self)
    }
}

/// What every family provides beyond its declaration: the rules.
pub trait Family: Sized {
    /// The outputs' metadata, or a precise error naming `op` and the argument.
    fn meta(&self, op: &str, operands: &[Operand], facts: &mut Facts) -> Result<Vec<TensorMeta>>;

    /// The gradients of one call (reverse mode): `cots` holds the cotangent of each output
    /// (`None` where no gradient flows); the result has one entry per operand.
    fn vjp(&self, e: &mut Emitter, operands: &[Arg], outputs: &[ValueId], cots: &[Option<ValueId>]) -> Result<Grads>;
}

/// Declares a family of prims with parameters:
///
/// ```text
/// declare_family! {
///     pub enum Shape {
///         /// Doc of the prim.
///         Reshape = "reshape", Operands::Fixed(1), { shape: Vec<i64> = "shape" };
///     }
/// }
/// ```
///
/// Each parameter's type is a [`Param`]; the string is the name errors give the argument.
macro_rules! declare_family {
    ($(#[$m:meta])* pub enum $fam:ident {
        $($(#[$vm:meta])* $var:ident = $name:literal, $operands:expr,
            { $($field:ident : $ty:ty = $what:literal),* $(,)? };)*
    }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $fam {
            // Each prim's doc ends with its printed call, generated so that no prim goes
            // without one; the fields' docs say how each parameter prints and parses.
            $($(#[$vm])*
            #[doc = ""]
            #[doc = concat!("In traces: `prims.", $name, "(<operands>", $(", <", $what, ">",)* ")`.")]
            $var { $(#[doc = concat!("The `", $what, "` parameter of `prims.", $name, "`, printed after the operands.")] $field: $ty),* },)*
        }

        impl $fam {
            /// The names of this family's prims.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The prim's name as printed after `prims.`.
            pub fn name(&self) -> &'static str {
                match self {
                    $($fam::$var { .. } => $name,)*
                }
            }

            /// The prim's position in [`Self::NAMES`].
            pub fn index(&self) -> usize {
                // A fieldless twin of the variants numbers them in declaration order.
                #[allow(dead_code)]
                enum Position { $($var),* }
                match self {
                    $($fam::$var { .. } => Position::$var as usize,)*
                }
            }

            /// How many operands the prim takes (tensors and numbers, before its parameters).
            pub fn operands(&self) -> $crate::prims::Operands {
                #[allow(unused_imports)]
                use $crate::prims::Operands;
                match self {
                    $($fam::$var { .. } => $operands,)*
                }
            }

            /// The operands and parameter names of the prim named `name`; `None` when it is not
            /// in this family.
            pub fn signature(name: &str) -> Option<$crate::prims::Signature> {
                #[allow(unused_imports)]
                use $crate::prims::Operands;
                match name {
                    $($name => Some($crate::prims::Signature { operands: $operands, params: &[$($what),*] }),)*
                    _ => None,
                }
            }

            /// Decodes `prims.<name>(*args)`; `None` when `name` is not in this family.
            pub(crate) fn parse(name: &str, c: &mut $crate::prims::args::CallArgs) -> Option<$crate::error::Result<(Self, Vec<$crate::value::Arg>)>> {
                #[allow(unused_imports)]
                use $crate::prims::Operands;
                match name {
                    $($name => Some((|| {
                        let operands = c.take_operands($operands)?;
                        $(let $field = <$ty as $crate::prims::declare::Param>::take(c, $what)?;)*
                        Ok(($fam::$var { $($field),* }, operands))
                    })()),)*
                    _ => None,
                }
            }

            /// The parameters as call arguments, printed after the operands.
            pub fn params(&self) -> Vec<$crate::value::Arg> {
                match self {
                    $($fam::$var { $($field),* } => vec![$($crate::prims::declare::Param::to_arg($field)),*],)*
                }
            }
        }
    };
}

/// Declares a family of parameterless elementwise prims (`Unary`, `Binary`), each with the
/// element types it accepts, the dtype of its output, and the type promotion of the ltorch
/// symbol Python derives from it (`Custom`: the ltorch symbol is written by hand).
macro_rules! elementwise_table {
    ($(#[$m:meta])* pub enum $fam:ident ($arity:literal) {
        $($(#[$vm:meta])* $var:ident = $name:literal, $accepts:ident, $output:ident, $promotion:ident;)*
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $fam {
            // Each prim's doc is its row of the table, generated so that no prim goes without one.
            $($(#[$vm])*
            #[doc = concat!(
                "`prims.", $name, "`: elementwise over ", $arity, " operand(s) of one shape. Element types: [`Accepts::",
                stringify!($accepts), "`]; output dtype: [`Output::", stringify!($output),
                "`]; the derived ltorch symbol's type promotion: [`Promotion::", stringify!($promotion), "`]."
            )]
            $var,)*
        }

        impl $fam {
            /// Every prim of the family, in declaration order.
            pub const ALL: &'static [$fam] = &[$($fam::$var),*];
            /// The names of this family's prims, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($name),*];

            /// The prim's name as printed after `prims.`.
            pub fn name(&self) -> &'static str {
                match self {
                    $($fam::$var => $name,)*
                }
            }

            /// The prim's position in [`Self::NAMES`].
            pub fn index(&self) -> usize {
                *self as usize
            }

            /// How many operands the prim takes: the family's arity.
            pub fn operands(&self) -> $crate::prims::Operands {
                $crate::prims::Operands::Fixed($arity)
            }

            /// The element types the meta rule accepts; others are a `TypeError` naming the prim.
            pub fn accepts(self) -> Accepts {
                match self {
                    $($fam::$var => Accepts::$accepts,)*
                }
            }

            /// The output's dtype, given the operands' (which are equal).
            pub fn output(self) -> Output {
                match self {
                    $($fam::$var => Output::$output,)*
                }
            }

            /// The type promotion of the ltorch symbol Python derives from this prim.
            pub fn promotion(self) -> Promotion {
                match self {
                    $($fam::$var => Promotion::$promotion,)*
                }
            }

            /// The operands of the prim named `name` (it has no parameters); `None` when it is
            /// not in this family.
            pub fn signature(name: &str) -> Option<$crate::prims::Signature> {
                Self::NAMES.contains(&name)
                    .then_some($crate::prims::Signature { operands: $crate::prims::Operands::Fixed($arity), params: &[] })
            }

            pub(crate) fn parse(name: &str, c: &mut $crate::prims::args::CallArgs) -> Option<$crate::error::Result<(Self, Vec<$crate::value::Arg>)>> {
                let prim = match name {
                    $($name => $fam::$var,)*
                    _ => return None,
                };
                Some(c.operands($arity).map(|operands| (prim, operands)))
            }

            /// The parameters as call arguments: none, for these prims.
            pub fn params(&self) -> Vec<$crate::value::Arg> {
                vec![]
            }
        }
    };
}

pub(crate) use {declare_family, elementwise_table};
