//! Buffer reuse: a call whose receiver is a fresh intermediate dying at that call writes its
//! result into the receiver (`t3 = t2.mul_(t0)` instead of `t3 = t2.mul(t0)` then `del t2`),
//! which saves allocating the output and creating its tensor object (about 0.4 µs a call on
//! small tensors, and page faults on large ones).
//!
//! A call is rewritten only when all of these hold:
//! - its implementation declares an in-place method computing the same values into its first
//!   argument ([`Callee::inplace`]), and the call is elementwise compute (see [`computes_fresh`]);
//! - its receiver was produced in this trace by a call that returns fresh memory, no call reads
//!   it in a way whose result may alias it (views, fallbacks, regions), it is read nowhere else
//!   in the call, and this call is its last use (the receiver is deleted right after);
//! - its one output has the receiver's dtype, shape and device (no promotion, no broadcast:
//!   torch's in-place forms would silently cast a wider result down, or refuse a bigger one).
//!
//! Autograd never sees these writes where it matters: forwards of differentiated programs and
//! backwards run with grad off, and a program run with grad on returns nothing that requires
//! grad, so no backward reads a value autograd saved (receivers are never leaves or views).
//!
//! For the commutative prims `add` and `mul`, a dying fresh second operand becomes the receiver.

use trace_ir::pysrc::Callee;
use trace_ir::{Arg, BoundSymbol, Prim, Symbol, Trace, ValueId};

/// The execution trace with commuted operands where a second operand became the receiver, and
/// `impls` switched to in-place methods where the rules above allow.
pub fn reuse_receivers(trace: &Trace, impls: &mut [Callee], dels: &[Vec<ValueId>]) -> Trace {
    let fresh = fresh_values(trace);
    let mut bsyms = trace.bsyms.clone();
    for (i, bsym) in bsyms.iter_mut().enumerate() {
        let Some(method) = impls[i].inplace.clone() else { continue };
        if !computes_fresh(bsym) || bsym.outputs.len() != 1 {
            continue;
        }
        let reusable = |v: ValueId| {
            fresh[v.index()] && dels[i].contains(&v) && reads(bsym, v) == 1 && same_meta(trace, v, bsym.outputs[0])
        };
        let receiver = matches!(bsym.args.first(), Some(Arg::Value(v)) if reusable(*v));
        let commuted = !receiver && commutative(bsym) && matches!(bsym.args[1], Arg::Value(v) if reusable(v));
        if !receiver && !commuted {
            continue;
        }
        if commuted {
            bsym.args.swap(0, 1);
        }
        impls[i] = Callee { method: Some(method), inplace: None, ..impls[i].clone() };
    }
    trace.with_bsyms(bsyms, trace.outputs.clone())
}

/// Per value: produced by a call returning fresh memory and never read by a call whose outputs
/// may alias it.
fn fresh_values(trace: &Trace) -> Vec<bool> {
    let mut fresh = vec![false; trace.values.len()];
    for bsym in &trace.bsyms {
        let computes = computes_fresh(bsym);
        if !computes {
            bsym.for_each_input(|v| fresh[v.index()] = false);
        }
        for o in &bsym.outputs {
            fresh[o.index()] = computes;
        }
    }
    fresh
}

/// Whether a call computes new values into new memory: an elementwise, matmul or linear prim,
/// or a composite each of whose outputs such a prim of its decomposition computes (a composite
/// that may return its input, like `to` or `contiguous`, has no such prim producing it).
/// Effects (random draws) never qualify: their in-place forms mean something else.
pub fn computes_fresh(bsym: &BoundSymbol) -> bool {
    if bsym.has_effect() || bsym.outputs.is_empty() {
        return false;
    }
    match &bsym.symbol {
        Symbol::Prim(p) => is_compute(p),
        Symbol::Composite(_) => bsym.outputs.iter().all(|&o| computed_in(&bsym.subsymbols, o)),
        Symbol::Fallback(_) | Symbol::Region(_) => false,
    }
}

fn is_compute(p: &Prim) -> bool {
    matches!(p.family(), "Unary" | "Binary") || matches!(p.name(), "where" | "polygamma" | "matmul" | "linear")
}

/// Whether the last call of `subs` producing `v` computes it (recursively through composites).
fn computed_in(subs: &[BoundSymbol], v: ValueId) -> bool {
    subs.iter().rev().find(|s| s.outputs.contains(&v)).is_some_and(|s| match &s.symbol {
        Symbol::Prim(p) => is_compute(p),
        Symbol::Composite(_) => computed_in(&s.subsymbols, v),
        _ => false,
    })
}

/// The prims `add` and `mul` of two values: their operands may trade places (exactly, in IEEE
/// arithmetic too).
fn commutative(bsym: &BoundSymbol) -> bool {
    let is_add_or_mul = matches!(&bsym.symbol, Symbol::Prim(p) if matches!(p.name(), "add" | "mul"));
    is_add_or_mul && bsym.kwargs.is_empty() && matches!(bsym.args.as_slice(), [Arg::Value(_), Arg::Value(_)])
}

fn reads(bsym: &BoundSymbol, v: ValueId) -> usize {
    let mut n = 0;
    bsym.for_each_input(|u| n += usize::from(u == v));
    n
}

fn same_meta(trace: &Trace, a: ValueId, b: ValueId) -> bool {
    match (trace.tensor(a), trace.tensor(b)) {
        (Some(x), Some(y)) => x.dtype == y.dtype && x.device == y.device && x.shape == y.shape,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifetimes::del_last_used;
    use trace_ir::parser::parse_trace;

    /// The callees' printed forms after reuse, for a trace whose every call offers `name_`.
    fn reused(body: &str) -> Vec<String> {
        let text = format!("def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[4]\"\n{body}");
        let trace = parse_trace(&text).unwrap();
        let mut impls: Vec<Callee> = trace
            .bsyms
            .iter()
            .map(|b| {
                let name = b.symbol.as_prim().map_or("op", |p| p.name());
                Callee::with_methods(format!("f_{name}"), name)
            })
            .collect();
        let dels = del_last_used(&trace, 0);
        let out = reuse_receivers(&trace, &mut impls, &dels);
        out.bsyms
            .iter()
            .zip(&impls)
            .map(|(b, c)| {
                let args: Vec<String> = b.args.iter().map(|a| format!("{a:?}")).collect();
                format!("{}({})", c.method.as_deref().unwrap(), args.len())
            })
            .collect()
    }

    #[test]
    fn a_chain_of_elementwise_calls_reuses_its_first_intermediate() {
        let got = reused(
            "  t2 = prims.add(t0, t1)\n  t3 = prims.sin(t2)\n  t4 = prims.exp(t3)\n  t5 = prims.mul(t4, t0)\n  return t5\n"
        );
        // t0 and t1 are inputs: the first call cannot write into them.
        assert_eq!(got, ["add(2)", "sin_(1)", "exp_(1)", "mul_(2)"]);
    }

    #[test]
    fn values_read_later_viewed_or_returned_are_not_reused() {
        let got = reused(
            "  t2 = prims.exp(t0)\n  t3 = prims.sin(t2)\n  t4 = prims.cos(t2)\n  t5 = prims.reshape(t4, (2, 2))\n  t6 = prims.neg(t4)\n  t7 = prims.neg(t3)\n  return (t5, t6, t7, t3)\n"
        );
        // t2 dies at cos (reused); t4 is viewed by reshape; t3 is returned.
        assert_eq!(got, ["exp(1)", "sin(1)", "cos_(1)", "reshape(1)", "neg(1)", "neg(1)"]);
    }

    #[test]
    fn a_dying_second_operand_of_add_becomes_the_receiver() {
        let text = "def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[4]\"\n  t2 = prims.exp(t1)\n  t3 = prims.add(t0, t2)\n  t4 = prims.sub(t0, t3)\n  return t4\n";
        let trace = parse_trace(text).unwrap();
        let callee = |n: &str| Callee::with_methods(format!("f_{n}"), n);
        let mut impls = vec![callee("exp"), callee("add"), callee("sub")];
        let dels = del_last_used(&trace, 0);
        let out = reuse_receivers(&trace, &mut impls, &dels);
        assert_eq!(out.bsyms[1].args, vec![Arg::Value(ValueId(2)), Arg::Value(ValueId(0))]);
        assert_eq!(impls[1].method.as_deref(), Some("add_"));
        // sub does not commute: t3 is its second operand, so it allocates.
        assert_eq!(impls[2].method.as_deref(), Some("sub"));
    }

    #[test]
    fn promotion_and_broadcast_block_reuse() {
        let text = "def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[3, 4]\"\n  t2 = prims.exp(t0)\n  t4 = ltorch.add(t2, t1)\n    # t3 = prims.broadcast_in_dim(t2, (3, 4), (1,))\n    # t4 = prims.add(t3, t1)\n  t5 = prims.exp(t4)\n  t6 = prims.lt(t5, 0.5)\n  return (t4, t6)\n";
        let trace = parse_trace(text).unwrap();
        let callee = |n: &str| Callee::with_methods(format!("f_{n}"), n);
        let mut impls = vec![callee("exp"), callee("add"), callee("exp"), callee("lt")];
        let dels = del_last_used(&trace, 0);
        reuse_receivers(&trace, &mut impls, &dels);
        let methods: Vec<_> = impls.iter().map(|c| c.method.as_deref().unwrap().to_string()).collect();
        // add broadcasts t2 to [3, 4]; lt makes bools from floats; t4 is returned.
        assert_eq!(methods, ["exp", "add", "exp", "lt"]);
    }
}
