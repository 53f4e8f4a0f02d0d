//! View folding: chains of reshapes, transposes, squeezes and unsqueezes collapse into one
//! call, and views feeding a matrix product fold into the product.
//!
//! Every rule keeps the values, shapes and dtypes of the program (traces are functional, so
//! aliasing does not matter); the rewrite driver checks shapes and dtypes of each replacement.
//! Rules that leave an intermediate dead require it to have no other use, so a fold never adds
//! calls. Canonicalising rules turn a squeeze and an unsqueeze (a `broadcast_in_dim` that only
//! adds size-1 dims) into the reshape it is, so that the reshape rules see through them. A
//! transpose that moves only size-1 dims stays one, folding only into a reshape whose result has
//! no size-1 dims: the same elements in the same order, but eager's permute carries those dims'
//! strides along where a reshape gives them row-major ones (`x.permute(0, 3, 1, 2)` of an
//! [N, 1, 1, C] tensor is channels_last to ATen's layout heuristics, so a convolution after it
//! chose channels_last gradients), and a trace's views must stride as eager's.

use crate::rewrite::{any, call, rewrite, Input, Match, NewCall, Pat, Replacement, Rule};
use crate::PassCx;
use trace_ir::prims::{Linalg, Shape};
use trace_ir::{Arg, Dim, Prim, Result, Scalar, Trace};

/// The view-folding rule set, in the order the driver tries it.
pub const RULES: &[Rule] = &[
    RESHAPE_IDENTITY,
    TRANSPOSE_IDENTITY,
    SQUEEZE_AS_RESHAPE,
    UNSQUEEZE_AS_RESHAPE,
    RESHAPE_OF_ONES_TRANSPOSED,
    RESHAPE_RESHAPE,
    RESHAPE_RESHAPE_BACK,
    TRANSPOSE_TRANSPOSE,
    MATMUL_TRANSPOSED_AS_LINEAR,
    FLATTENED_PRODUCT,
    CAT_OF_RESHAPES,
];

/// [`RULES`] with [`FLATTENED_PRODUCT_AS_TENSORDOT`] before `FLATTENED_PRODUCT`: the weight
/// gradient as torch's tensordot, which is slower on the CPU (kept as a rewrite example).
pub fn views_with_tensordot(trace: &Trace, cx: &PassCx) -> Result<Trace> {
    let rules: Vec<Rule> = [FLATTENED_PRODUCT_AS_TENSORDOT].into_iter().chain(RULES.iter().copied()).collect();
    Ok(rewrite(trace, &rules, cx)?.0)
}

/// Applies [`RULES`] (the pipeline runs them as a `Rewrite` row of its table, whose record says
/// which rules fired).
pub fn views(trace: &Trace, cx: &PassCx) -> Result<Trace> {
    Ok(rewrite(trace, RULES, cx)?.0)
}

fn reshape_to(m: &Match, x: &str, shape_of: &str) -> Option<Replacement> {
    let shape = m.meta(shape_of)?.shape.clone();
    Some(Replacement::call(Shape::Reshape { shape }, [m.arg(x)]))
}

fn perm_of(m: &Match, name: &str) -> Option<Vec<usize>> {
    match m.prim(name)? {
        Prim::Shape(Shape::Transpose { perm }) => Some(perm.clone()),
        _ => None,
    }
}

/// reshape(x, shape of x) -> x
const RESHAPE_IDENTITY: Rule = Rule {
    name: "reshape-identity",
    pattern: || call("reshape", [any("x")]).bind("r"),
    rewrite: |m| (m.meta("x")?.shape == m.meta("r")?.shape).then(|| m.value("x").map(Replacement::Value)).flatten(),
};

/// transpose(x, (0, 1, ..., n-1)) -> x
const TRANSPOSE_IDENTITY: Rule = Rule {
    name: "transpose-identity",
    pattern: || call("transpose", [any("x")]).bind("t"),
    rewrite: |m| {
        let perm = perm_of(m, "t")?;
        perm.iter().enumerate().all(|(i, &p)| i == p).then(|| m.value("x").map(Replacement::Value)).flatten()
    },
};

/// squeeze(x, dims) -> reshape(x, shape without dims) when no size-1 dim is left: removing
/// size-1 dims keeps the order, and the strides of the other dims (a reshape would give a size-1
/// dim left a stride of its own, where eager's squeeze keeps it: a gradient's strides).
const SQUEEZE_AS_RESHAPE: Rule = Rule {
    name: "squeeze-as-reshape",
    pattern: || call("squeeze", [any("x")]).bind("s"),
    rewrite: |m| m.meta("s")?.shape.iter().all(|d| *d != Dim::Const(1)).then(|| reshape_to(m, "x", "s")).flatten(),
};

/// broadcast_in_dim(x, shape, dims) -> reshape(x, shape) when it only adds size-1 dims
/// (unsqueeze): same number of elements, in the same order.
const UNSQUEEZE_AS_RESHAPE: Rule = Rule {
    name: "unsqueeze-as-reshape",
    pattern: || call("broadcast_in_dim", [any("x")]).bind("b"),
    rewrite: |m| {
        let Prim::Shape(Shape::BroadcastInDim { shape, dims }) = m.prim("b")? else { return None };
        let x = m.meta("x")?;
        let kept = dims.iter().zip(&x.shape).all(|(&d, s)| shape[d] == *s);
        let added_are_ones = (0..shape.len()).filter(|d| !dims.contains(d)).all(|d| shape[d] == Dim::Const(1));
        (kept && added_are_ones).then(|| reshape_to(m, "x", "b")).flatten()
    },
};

/// reshape(transpose(x, perm), s) -> reshape(x, s) when the transpose moves only size-1 dims and
/// `s` has none: the elements keep their order, and a reshape's strides depend on the strides of
/// its input's size-1 dims only through the size-1 dims of its result.
const RESHAPE_OF_ONES_TRANSPOSED: Rule = Rule {
    name: "reshape-of-ones-transposed",
    pattern: || call("reshape", [call("transpose", [any("x")]).bind("t")]).bind("r"),
    rewrite: |m| {
        let perm = perm_of(m, "t")?;
        let x = m.meta("x")?;
        let moved: Vec<usize> = perm.iter().copied().filter(|&p| x.shape[p] != Dim::Const(1)).collect();
        let no_ones = m.meta("r")?.shape.iter().all(|d| *d != Dim::Const(1));
        (no_ones && moved.windows(2).all(|w| w[0] < w[1])).then(|| reshape_to(m, "x", "r")).flatten()
    },
};

/// reshape(reshape(x, s1), s2) -> reshape(x, s2)
const RESHAPE_RESHAPE: Rule = Rule {
    name: "reshape-reshape",
    pattern: || call("reshape", [call("reshape", [any("x")]).single_use()]).bind("outer"),
    rewrite: |m| reshape_to(m, "x", "outer"),
};

/// reshape(reshape(x, s), shape of x) -> x, whatever other uses the inner reshape has
const RESHAPE_RESHAPE_BACK: Rule = Rule {
    name: "reshape-reshape-back",
    pattern: || call("reshape", [call("reshape", [any("x")])]).bind("outer"),
    rewrite: |m| (m.meta("x")?.shape == m.meta("outer")?.shape).then(|| m.value("x").map(Replacement::Value)).flatten(),
};

/// transpose(transpose(x, p), q) -> transpose(x, r) with r[i] = p[q[i]]
const TRANSPOSE_TRANSPOSE: Rule = Rule {
    name: "transpose-transpose",
    pattern: || call("transpose", [call("transpose", [any("x")]).bind("inner").single_use()]).bind("outer"),
    rewrite: |m| {
        let (p, q) = (perm_of(m, "inner")?, perm_of(m, "outer")?);
        let perm = q.iter().map(|&i| p[i]).collect();
        Some(Replacement::call(Shape::Transpose { perm }, [m.arg("x")]))
    },
};

/// matmul(a, transpose(w, (1, 0))) -> linear(a, w): `linear` multiplies by the transposed weight.
/// Not where linear's shape (`a`'s leading dims, then `w`'s rows) is another expression than the
/// product's: symbolic sizes equal only by a guard (`t0 == t1`, list items' lengths the program
/// multiplies) are different expressions, and the rewrite must keep each value's shape.
const MATMUL_TRANSPOSED_AS_LINEAR: Rule = Rule {
    name: "matmul-transposed-as-linear",
    pattern: || call("matmul", [any("a"), call("transpose", [any("w")]).bind("t").single_use()]).bind("mm"),
    rewrite: |m| {
        let (a, w) = (m.meta("a")?, m.meta("w")?);
        let swapped = perm_of(m, "t")? == [1, 0];
        if !(swapped && w.ndim() == 2 && a.ndim() >= 1) {
            return None;
        }
        let linear_shape: Vec<Dim> = a.shape[..a.ndim() - 1].iter().chain([&w.shape[0]]).cloned().collect();
        (m.meta("mm")?.shape == linear_shape).then(|| Replacement::call(Linalg::Linear {}, [m.arg("a"), m.arg("w")]))
    },
};

/// The pattern of a linear layer's weight gradient over a batch:
/// `matmul(transpose(reshape(g, (R, N)), (1, 0)), reshape(x, (R, K)))`, where g and x have the
/// same leading dims of R elements in all.
fn flattened_product_pattern() -> Pat {
    let g2 = call("reshape", [any("g")]).bind("g2").single_use();
    let x2 = call("reshape", [any("x")]).bind("x2").single_use();
    call("matmul", [call("transpose", [g2]).bind("gt").single_use(), x2])
}

/// The composite `symbol` on `args` for a match of [`flattened_product_pattern`], with the calls
/// it replaces as its decomposition; `None` where the operands do not fit.
fn flattened_product(m: &Match, symbol: &'static str, args: impl FnOnce(usize) -> Vec<Arg>) -> Option<Replacement> {
    let (g, x, g2, x2) = (m.meta("g")?, m.meta("x")?, m.meta("g2")?, m.meta("x2")?);
    let lead = g.ndim().checked_sub(1)?;
    let fits = perm_of(m, "gt")? == [1, 0]
        && lead >= 2
        && x.ndim() == g.ndim()
        && g.shape[..lead] == x.shape[..lead]
        && g2.shape == [Dim::product(&g.shape[..lead]), g.shape[lead].clone()]
        && x2.shape == [g2.shape[0].clone(), x.shape[lead].clone()];
    if !fits {
        return None;
    }
    let r = Input::Result;
    let decomposition: Vec<NewCall> = vec![
        (Shape::Reshape { shape: g2.shape.clone() }.into(), vec![m.arg("g").into()]),
        (Shape::Transpose { perm: vec![1, 0] }.into(), vec![r(0)]),
        (Shape::Reshape { shape: x2.shape.clone() }.into(), vec![m.arg("x").into()]),
        (Linalg::Matmul {}.into(), vec![r(1), r(2)]),
    ];
    Some(Replacement::Composite { symbol: symbol.into(), args: args(lead), decomposition })
}

/// [`flattened_product_pattern`] -> `ltorch.flattened_product(g, x)`: one call (the torch
/// executor's `mm` of the flattened operands, about 5% faster than the four calls on a GPT
/// block's shapes, one CPU thread), so a linear layer's weight gradient is one call.
const FLATTENED_PRODUCT: Rule = Rule {
    name: "flattened-product",
    pattern: flattened_product_pattern,
    rewrite: |m| flattened_product(m, "ltorch.flattened_product", |_| vec![m.arg("g"), m.arg("x")]),
};

/// `flattened_product_pattern` -> tensordot(g, x, over the leading dims): torch's tensordot
/// makes the same product on the same layouts, but takes longer than the calls it replaces
/// (about 16 µs more per call for [4, 32, 64] operands, one CPU thread).
pub const FLATTENED_PRODUCT_AS_TENSORDOT: Rule = Rule {
    name: "flattened-product-as-tensordot",
    pattern: flattened_product_pattern,
    rewrite: |m| {
        flattened_product(m, "ltorch.tensordot", |lead| {
            let dims = Arg::List((0..lead as i64).map(|d| Arg::Scalar(Scalar::Int(d))).collect());
            vec![m.arg("g"), m.arg("x"), Arg::Tuple(vec![dims.clone(), dims])]
        })
    },
};

/// The operands of the list call bound to `name` that are each the single-use result of a
/// `prim` call, as (call operand, prim) pairs; `None` unless all are.
fn list_of(m: &Match, name: &str, prim: &str) -> Option<Vec<(Arg, Prim)>> {
    m.operands(name)?
        .iter()
        .map(|a| {
            let v = a.as_value().filter(|&v| m.single_use(v))?;
            let (p, operands) = m.producer(v)?;
            (p.name() == prim && operands.len() == 1).then(|| (operands[0].clone(), p.clone()))
        })
        .collect()
}

fn cat_dim(m: &Match) -> Option<usize> {
    match m.prim("cat")? {
        Prim::Shape(Shape::Cat { dim }) => Some(*dim),
        _ => None,
    }
}

/// cat([reshape(x_i, s_i), ...], d) -> reshape(cat([x_i, ...], d), s) when each reshape keeps
/// the dims before d and merges dims d..m of x_i (of which only the first differs between the
/// x_i) into dim d: then the merged blocks are concatenated in the same order.
const CAT_OF_RESHAPES: Rule = Rule {
    name: "cat-of-reshapes",
    pattern: || call("cat", [Pat::Rest]).bind("cat"),
    rewrite: |m| {
        let d = cat_dim(m)?;
        let parts = list_of(m, "cat", "reshape").filter(|p| p.len() >= 2)?;
        let first = m.meta_of(parts[0].0.as_value()?)?.shape.clone();
        let fits = parts.iter().zip(m.operands("cat")?).all(|((x, _), y)| {
            let (Some(x), Some(y)) = (x.as_value().and_then(|v| m.meta_of(v)), y.as_value().and_then(|v| m.meta_of(v)))
            else {
                return false;
            };
            let Some(merged_end) = (x.ndim() + d + 1).checked_sub(y.ndim()) else { return false };
            merged_end > d + 1
                && x.ndim() == first.len()
                && x.shape[..d] == y.shape[..d]
                && x.shape[merged_end..] == y.shape[d + 1..]
                && x.shape[d + 1..merged_end] == first[d + 1..merged_end]
        });
        if !fits {
            return None;
        }
        let inputs = parts.into_iter().map(|(x, _)| Input::Arg(x)).collect();
        let shape = m.meta("cat")?.shape.clone();
        Some(Replacement::Calls(vec![
            (Shape::Cat { dim: d }.into(), inputs),
            (Shape::Reshape { shape }.into(), vec![Input::Result(0)]),
        ]))
    },
};
