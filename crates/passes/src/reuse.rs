//! Buffer reuse: a call whose receiver is a fresh intermediate dying at that call writes its
//! result into the receiver (`t3 = t2.mul_(t0)` instead of `t3 = t2.mul(t0)` then `del t2`),
//! which saves allocating the output and creating its tensor object (about 0.4 µs a call on
//! small tensors, and page faults on large ones). For the writes at indices (`index_add`,
//! `scatter_add`, `scatter` and the composites they compute: `index_copy`, `index_put`, ...)
//! it saves copying the whole receiver: a loop of `out.index_add_(0, rows, y)` into a buffer of
//! zeros, as a mixture of experts adds each expert's rows, runs in place as eager runs it.
//!
//! A call is rewritten only when all of these hold:
//! - its implementation declares an in-place method computing the same values into its first
//!   argument ([`Callee::inplace`]), and the call computes (see [`computes`]): elementwise,
//!   matmul and linear prims, and the writes at indices, whose output is their first operand
//!   with elements added or written;
//! - its receiver was produced in this trace by a call that returns fresh memory (one that
//!   computes, a creation such as `full`, a `clone`, or a backward kernel such as
//!   `convolution_backward`: see [`returns_fresh`]), no call reads it
//!   in a way whose result may alias it (views, fallbacks, regions), it is read nowhere else in
//!   the call, and this call is its last use (the receiver is deleted right after);
//! - its one output has the receiver's dtype, shape and device (no promotion, no broadcast:
//!   torch's in-place forms would silently cast a wider result down, or refuse a bigger one);
//! - its output is not returned, nor is a view or other alias of it ([`returned_memory`]): the
//!   write would bump the returned tensor's `_version` (and its `_base`'s), where eager's
//!   out-of-place call returns a new tensor at version 0 (`x.exp().sin()` would come back at 1, a
//!   backward's gradient would reach `.grad` at its count of writes). Torch cannot count a version
//!   down, so a returned result gets new memory: one allocation per returned value.
//!
//! Autograd never sees these writes where it matters: forwards of differentiated programs and
//! backwards run with grad off, and a program run with grad on returns nothing that requires
//! grad, so no backward reads a value autograd saved (receivers are never leaves or views).
//! What the trace's own backward reads from its forward (the residuals) the forward returns,
//! and a returned value is never a receiver. (The VJP rules of the writes at indices read
//! neither their receiver nor their output anyway: `index_add`'s and `scatter_add`'s read the
//! cotangent and the index, `scatter`'s also the source's shape.)
//!
//! Eager's out-of-place writes at indices (`index_add`, `scatter`, ...) return new row-major
//! tensors, where the in-place forms keep their receiver's layout: the trace clones a receiver that
//! eager lays out otherwise row-major before such a write (`torch/contiguous_writes.py`, which
//! knows the program's strides), and the write runs in place on the clone.
//!
//! The receiver is always the first operand, never a dying second one of `add` or `mul`: eager's
//! result is laid out in the order of the first operand that orders its dims (TensorIterator), which
//! an in-place write into the second would replace by the second's (`g * (y / x)` of a cotangent
//! `g` and a transposed `x` is row-major in eager, where `(y / x).mul_(g)` is transposed). The
//! trace does not know its values' strides, so it cannot tell where the two agree.

use trace_ir::pysrc::Callee;
use trace_ir::{Arg, BoundSymbol, Prim, Symbol, SymbolTable, Trace, ValueId};

/// The execution trace, with `impls` switched to in-place methods where the rules above allow.
/// `saves`: the trace is a split forward whose last output is the tuple of residuals its backward
/// saves; no caller sees those, so they may be written in place (as eager's `result += input`).
pub fn reuse_receivers(trace: &Trace, impls: &mut [Callee], dels: &[Vec<ValueId>], saves: bool) -> Trace {
    let fresh = fresh_values(trace);
    let (returned, gradients) = (returned_memory(trace, saves), gradient_values(trace));
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        let Some(method) = impls[i].inplace.clone() else { continue };
        if !computes(bsym) || bsym.outputs.len() != 1 {
            continue;
        }
        let out = bsym.outputs[0];
        let reusable = |v: ValueId| {
            fresh[v.index()]
                && dels[i].contains(&v)
                && reads(bsym, v) == 1
                && same_meta(trace, v, out)
                && (!returned[out.index()] || gradients[v.index()])
        };
        if !matches!(bsym.args.first(), Some(Arg::Value(v)) if reusable(*v)) {
            continue;
        }
        impls[i] = Callee { method: Some(method), inplace: None, ..impls[i].clone() };
    }
    trace.clone()
}

/// Per value: whether the call returns its memory (it is an output, or a call that may alias it
/// makes one: not one returning fresh memory, nor a reduction, scan or convolution). An in-place write there would bump the version counter of a tensor the caller gets
/// (and of its `_base`), where eager's out-of-place call returns a new tensor at version 0
/// (`x.exp().sin()`; a backward's gradient, which autograd then accumulates into `.grad`).
fn returned_memory(trace: &Trace, saves: bool) -> Vec<bool> {
    let mut returned = vec![false; trace.values.len()];
    match &trace.outputs {
        Arg::Tuple(items) if saves && matches!(items.last(), Some(Arg::Tuple(_))) => {
            items[..items.len() - 1].iter().for_each(|a| a.for_each_value(&mut |v| returned[v.index()] = true))
        }
        outputs => outputs.for_each_value(&mut |v| returned[v.index()] = true),
    }
    for bsym in trace.bsyms.iter().rev() {
        let new_memory = returns_fresh(bsym) || made_by(bsym, |p| matches!(p.family(), "Reduce" | "Scan" | "Conv"));
        if !new_memory && bsym.outputs.iter().any(|o| returned[o.index()]) {
            bsym.for_each_input(|v| returned[v.index()] = true);
        }
    }
    returned
}

/// Per value: made by a backward kernel ([`is_new_gradient`], [`is_gradient_kernel`]). A sum of
/// gradients into such a dying value runs in place even where the backward returns it: eager's
/// autograd adds into the first gradient too (`InputBuffer::accumulate`), bumping its version.
fn gradient_values(trace: &Trace) -> Vec<bool> {
    let mut gradient = vec![false; trace.values.len()];
    for bsym in &trace.bsyms {
        if made_by(bsym, is_new_gradient) || is_gradient_kernel(bsym) {
            bsym.outputs.iter().for_each(|o| gradient[o.index()] = true);
        }
    }
    gradient
}

/// Per value: produced by a call returning fresh memory and never read by a call whose outputs
/// may alias it.
fn fresh_values(trace: &Trace) -> Vec<bool> {
    let mut fresh = vec![false; trace.values.len()];
    for bsym in &trace.bsyms {
        let new_memory = returns_fresh(bsym);
        if !new_memory {
            bsym.for_each_input(|v| fresh[v.index()] = false);
        }
        for o in &bsym.outputs {
            fresh[o.index()] = new_memory;
        }
    }
    fresh
}

/// Whether a call computes new values into new memory: a compute prim (elementwise, matmul,
/// linear, a write at indices), or a composite each of whose outputs such a prim of its decomposition computes (a composite that
/// may return its input, like `to` or `contiguous`, has no such prim producing it). Effects
/// (random draws) never qualify: their in-place forms mean something else.
pub fn computes(bsym: &BoundSymbol) -> bool {
    made_by(bsym, is_compute)
}

/// Whether a call's outputs are new memory that nothing else refers to: it [`computes`], it
/// creates a tensor (`full`, `iota`; composites such as `zeros_like` that one produces), or it
/// is a copy (`clone`: see [`is_copy`]).
pub fn returns_fresh(bsym: &BoundSymbol) -> bool {
    made_by(bsym, |p| is_compute(p) || is_creation(p) || is_new_gradient(p))
        || is_copy(bsym)
        || is_gradient_kernel(bsym)
}

/// Whether a call is a backward kernel recorded whole that aten computes into new tensors
/// (`native_batch_norm_backward`): it neither returns nor views its operands, so a gradient it
/// reads stays a fresh receiver for the sum of gradients after it ([`is_new_gradient`]).
fn is_gradient_kernel(bsym: &BoundSymbol) -> bool {
    matches!(bsym.symbol, Symbol::Composite(id) if is_whole_gradient(&SymbolTable::name(id))) && !bsym.has_effect()
}

fn is_whole_gradient(name: &str) -> bool {
    matches!(name, "ltorch.native_batch_norm_backward")
}

/// Prims whose outputs are gradients aten computes into new tensors (`convolution_backward`).
/// A sum of gradients whose first is such a dying tensor then adds the next into it, as eager's
/// autograd accumulates into the first gradient it receives (`InputBuffer::accumulate`, where it
/// holds the last reference): the sum keeps that gradient's strides. They differ from an
/// out-of-place sum's where a channels_last `[N, C, 1, 1]` gradient is also contiguous (torch's
/// `add` then writes contiguous strides), and batch norm's backward reads them: it runs its
/// channels_last kernel, other roundings, only on an input and gradient both laid out so.
fn is_new_gradient(p: &Prim) -> bool {
    p.name() == "convolution_backward"
}

/// Whether a call is `ltorch.clone`, which torch runs as `Tensor.clone`: always new memory, though
/// its decomposition's prim (`convert_element_type` to the same dtype, `a.to(dtype)`) may return
/// its input. The writes at indices that eager computes into a new row-major tensor clone a
/// receiver laid out otherwise first (`torch/contiguous_writes.py`), then write into the clone.
fn is_copy(bsym: &BoundSymbol) -> bool {
    matches!(bsym.symbol, Symbol::Composite(id) if &*SymbolTable::name(id) == "ltorch.clone")
}

/// Whether each output of a call without effects is made by a prim that `makes` (the call
/// itself, or the last prim producing it in a composite's decomposition).
fn made_by(bsym: &BoundSymbol, makes: fn(&Prim) -> bool) -> bool {
    if bsym.has_effect() || bsym.outputs.is_empty() {
        return false;
    }
    match &bsym.symbol {
        Symbol::Prim(p) => makes(p),
        Symbol::Composite(_) => bsym.outputs.iter().all(|&o| made_in(&bsym.subsymbols, o, makes)),
        Symbol::Fallback(_) | Symbol::Region(_) => false,
    }
}

/// Elementwise, matmul and linear prims, and the writes at indices (their output is their first
/// operand with elements added or written, which their in-place forms do to it).
fn is_compute(p: &Prim) -> bool {
    matches!(p.family(), "Unary" | "Binary")
        || matches!(p.name(), "where" | "polygamma" | "matmul" | "linear" | "index_add" | "scatter_add" | "scatter")
}

/// Prims that create a tensor from their parameters alone (random draws are effects).
fn is_creation(p: &Prim) -> bool {
    p.family() == "Creation" && !p.is_random()
}

/// Whether the last call of `subs` producing `v` is a prim that `makes` (recursively through
/// composites).
fn made_in(subs: &[BoundSymbol], v: ValueId, makes: fn(&Prim) -> bool) -> bool {
    subs.iter().rev().find(|s| s.outputs.contains(&v)).is_some_and(|s| match &s.symbol {
        Symbol::Prim(p) => makes(p),
        Symbol::Composite(_) => made_in(&s.subsymbols, v, makes),
        _ => false,
    })
}

fn reads(bsym: &BoundSymbol, v: ValueId) -> usize {
    let mut n = 0;
    bsym.for_each_input(|u| n += usize::from(u == v));
    n
}

pub(crate) fn same_meta(trace: &Trace, a: ValueId, b: ValueId) -> bool {
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
    use trace_ir::pysrc::{python_source, ExecPlan};

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
        let out = reuse_receivers(&trace, &mut impls, &dels, false);
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
        // t0 and t1 are inputs: the first call cannot write into them; t5 is returned, in new
        // memory at eager's version 0.
        assert_eq!(got, ["add(2)", "sin_(1)", "exp_(1)", "mul(2)"]);
    }

    #[test]
    fn values_read_later_viewed_or_returned_are_not_reused() {
        let got = reused(
            "  t2 = prims.exp(t0)\n  t3 = prims.sin(t2)\n  t4 = prims.cos(t2)\n  t5 = prims.reshape(t4, (2, 2))\n  t6 = prims.neg(t4)\n  t7 = prims.neg(t3)\n  return (t6, t7, t3)\n"
        );
        // t2 dies at cos (reused); t4 is viewed by reshape; t3 is returned; t6 and t7 are returned
        // (new memory, at eager's version 0).
        assert_eq!(got, ["exp(1)", "sin(1)", "cos_(1)", "reshape(1)", "neg(1)", "neg(1)"]);
    }

    #[test]
    fn results_returned_or_viewed_by_a_returned_value_get_new_memory() {
        // t3 is returned through a view, t5 itself: an in-place write would bump the version of
        // a tensor the caller gets, where eager's out-of-place calls return new tensors at 0.
        let got = reused(
            "  t2 = prims.exp(t0)\n  t3 = prims.sin(t2)\n  t4 = prims.reshape(t3, (2, 2))\n  t5 = prims.exp(t1)\n  t6 = prims.cos(t5)\n  t7 = prims.neg(t6)\n  return (t4, t7)\n"
        );
        assert_eq!(got, ["exp(1)", "sin(1)", "reshape(1)", "exp(1)", "cos_(1)", "neg(1)"]);
    }

    #[test]
    fn a_dying_second_operand_is_never_the_receiver() {
        let text = "def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[4]\"\n  t2 = prims.exp(t1)\n  t3 = prims.add(t0, t2)\n  t4 = prims.sub(t0, t3)\n  return t4\n";
        let trace = parse_trace(text).unwrap();
        let callee = |n: &str| Callee::with_methods(format!("f_{n}"), n);
        let mut impls = vec![callee("exp"), callee("add"), callee("sub")];
        let dels = del_last_used(&trace, 0);
        let out = reuse_receivers(&trace, &mut impls, &dels, false);
        // Written into t2, add's result would take t2's layout where eager's takes t0's.
        assert_eq!(out.bsyms[1].args, vec![Arg::Value(ValueId(0)), Arg::Value(ValueId(2))]);
        assert_eq!(impls[1].method.as_deref(), Some("add"));
        assert_eq!(impls[2].method.as_deref(), Some("sub"));
    }

    #[test]
    fn a_sum_of_gradients_adds_into_a_dying_first_gradient_from_a_backward_kernel() {
        // As eager's autograd adds a second gradient into the first (`InputBuffer::accumulate`),
        // keeping its strides.
        let mut text = String::from("def computation(t0, t1, t2, t3):\n");
        text.push_str(
            "  # t0: \"cpu f32[2, 4, 1, 1]\"\n  # t1: \"cpu f32[2, 4, 1, 1]\"\n  # t2: \"cpu f32[4, 4, 1, 1]\"\n",
        );
        text.push_str("  # t3: \"cpu f32[2, 4, 1, 1]\"\n");
        text.push_str("  t4 = prims.convolution_backward(t0, t1, t2, (1, 1), (0, 0), (1, 1), False, (0, 0), 1, True, False, False)\n");
        text.push_str("  t5 = prims.add(t4, t3)\n  return t5\n");
        let trace = parse_trace(&text).unwrap();
        let callee = |n: &str| Callee::with_methods(format!("f_{n}"), n);
        let mut impls = vec![callee("convolution_backward"), callee("add")];
        let dels = del_last_used(&trace, 0);
        reuse_receivers(&trace, &mut impls, &dels, false);
        assert_eq!(impls[1].method.as_deref(), Some("add_"));
    }

    #[test]
    fn promotion_and_broadcast_block_reuse() {
        let text = "def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[3, 4]\"\n  t2 = prims.exp(t0)\n  t4 = ltorch.add(t2, t1)\n    # t3 = prims.broadcast_in_dim(t2, (3, 4), (1,))\n    # t4 = prims.add(t3, t1)\n  t5 = prims.exp(t4)\n  t6 = prims.lt(t5, 0.5)\n  return (t4, t6)\n";
        let trace = parse_trace(text).unwrap();
        let callee = |n: &str| Callee::with_methods(format!("f_{n}"), n);
        let mut impls = vec![callee("exp"), callee("add"), callee("exp"), callee("lt")];
        let dels = del_last_used(&trace, 0);
        reuse_receivers(&trace, &mut impls, &dels, false);
        let methods: Vec<_> = impls.iter().map(|c| c.method.as_deref().unwrap().to_string()).collect();
        // add broadcasts t2 to [3, 4]; lt makes bools from floats; t4 is returned.
        assert_eq!(methods, ["exp", "add", "exp", "lt"]);
    }

    /// The generated code's calls (`t4 = t3.index_add_(0, t1, t2)`) after reuse, for a trace
    /// of `lines` whose inputs are a buffer `t0`, rows `t1` and their values `t2`, with callees
    /// as the torch executor's: prim `index_add(a, index, source, dim)` as `a.index_add(dim,
    /// index, source)`, `full` and `zeros_like` as functions, the other symbols as methods.
    fn index_calls(lines: &[&str]) -> Vec<String> {
        let mut text = String::from("def computation(t0, t1, t2):\n");
        text.push_str("  # t0: \"cpu f32[6, 4]\"\n  # t1: \"cpu i64[3]\"\n  # t2: \"cpu f32[3, 4]\"\n");
        text.extend(lines.iter().map(|line| format!("  {line}\n")));
        let trace = parse_trace(&text).unwrap();
        let callee = |b: &BoundSymbol| {
            let name = b.symbol.qualified_name().rsplit('.').next().unwrap().to_string();
            match b.symbol.as_prim().map(|p| p.name()) {
                _ if name == "full" || name == "zeros_like" => Callee::function(format!("torch_{name}")),
                Some(p @ ("index_add" | "scatter_add")) => {
                    Callee { method_args: Some([3, 1, 2].into()), ..Callee::with_methods(format!("prim_{p}"), p) }
                }
                _ => Callee::with_methods(format!("torch_{name}"), &name),
            }
        };
        let mut impls: Vec<Callee> = trace.bsyms.iter().map(callee).collect();
        let dels = del_last_used(&trace, 0);
        let exec = reuse_receivers(&trace, &mut impls, &dels, false);
        let plan = ExecPlan { impls: &impls, dels: &dels, detached: &[], packed: None };
        let source = python_source(&exec, &plan, "computation");
        let statements = source.lines().filter(|l| l.starts_with("  t") && l.contains(" = "));
        statements.map(|l| l.split("  #").next().unwrap().trim().to_string()).collect()
    }

    const ZEROS: &str = "t3 = prims.full((6, 4), 0.0, torch.device('cpu'), torch.float32)";

    #[test]
    fn a_loop_of_index_adds_into_a_buffer_of_zeros_runs_in_place() {
        let got = index_calls(&[
            ZEROS,
            "t4 = prims.index_add(t3, t1, t2, 0)",
            "t5 = prims.exp(t2)",
            "t6 = prims.index_add(t4, t1, t5, 0)",
            "t7 = prims.neg(t6)",
            "return t7",
        ]);
        // The method forms take `dim` first; t2 (an input) is never written, t5 is the source.
        let expected = [
            "t3 = torch_full((6, 4), 0.0, _dev0, torch.float32)",
            "t4 = t3.index_add_(0, t1, t2)",
            "t5 = t2.exp()",
            "t6 = t4.index_add_(0, t1, t5)",
            "t7 = t6.neg()",
        ];
        assert_eq!(got, expected);
    }

    #[test]
    fn composites_made_by_a_creation_and_an_index_write_run_in_place() {
        let got = index_calls(&[
            "t3 = ltorch.zeros_like(t0)  # t3: \"cpu f32[6, 4]\"",
            "  # t3 = prims.full((6, 4), 0.0, torch.device('cpu'), torch.float32)  # t3: \"cpu f32[6, 4]\"",
            "t4 = ltorch.index_add(t3, 0, t1, t2)  # t4: \"cpu f32[6, 4]\"",
            "  # t4 = prims.index_add(t3, t1, t2, 0)  # t4: \"cpu f32[6, 4]\"",
            "t5 = prims.neg(t4)",
            "return t5",
        ]);
        assert_eq!(got, ["t3 = torch_zeros_like(t0)", "t4 = t3.index_add_(0, t1, t2)", "t5 = t4.neg()"]);
    }

    #[test]
    fn a_clone_is_new_memory_to_write_into_where_a_conversion_may_be_its_input() {
        let lines = |symbol: &str| {
            [
                "t3 = prims.exp(t0)".to_string(),
                format!("t4 = ltorch.{symbol}(t3)  # t4: \"cpu f32[6, 4]\""),
                "  # t4 = prims.convert_element_type(t3, torch.float32)  # t4: \"cpu f32[6, 4]\"".to_string(),
                "t5 = prims.index_add(t4, t1, t2, 0)".to_string(),
                "t6 = prims.neg(t5)".to_string(),
                "return t6".to_string(),
            ]
        };
        let calls = |symbol: &str| index_calls(&lines(symbol).iter().map(String::as_str).collect::<Vec<_>>());
        // `clone` always copies (a row-major copy of a transposed buffer, which eager's
        // `index_add` writes into); `to` of the same dtype returns its input.
        assert_eq!(calls("clone")[..3], ["t3 = t0.exp()", "t4 = t3.clone()", "t5 = t4.index_add_(0, t1, t2)"]);
        assert_eq!(calls("to")[..3], ["t3 = t0.exp()", "t4 = t3.to()", "t5 = t4.index_add(0, t1, t2)"]);
    }

    #[test]
    fn index_writes_into_inputs_returned_viewed_or_later_read_values_allocate() {
        let cases: [(&[&str], &str); 5] = [
            // Into an input.
            (&["t4 = prims.index_add(t0, t1, t2, 0)", "return t4"], "t4 = t0.index_add(0, t1, t2)"),
            // The buffer is read after the write.
            (
                &["t4 = prims.index_add(t3, t1, t2, 0)", "t5 = prims.sub(t4, t3)", "return t5"],
                "t4 = t3.index_add(0, t1, t2)",
            ),
            // The buffer is returned.
            (&["t4 = prims.index_add(t3, t1, t2, 0)", "return (t4, t3)"], "t4 = t3.index_add(0, t1, t2)"),
            // A view of the buffer lives on.
            (
                &["t4 = prims.reshape(t3, (24,))", "t5 = prims.index_add(t3, t1, t2, 0)", "return (t5, t4)"],
                "t5 = t3.index_add(0, t1, t2)",
            ),
            // The buffer is also the source.
            (
                &[
                    "t4 = prims.full((6, 4), 1, torch.device('cpu'), torch.int64)",
                    "t5 = prims.scatter_add(t3, t4, t3, 0)",
                    "return t5",
                ],
                "t5 = t3.scatter_add(0, t4, t3)",
            ),
        ];
        for (lines, expected) in cases {
            let got = index_calls(&[&[ZEROS], lines].concat());
            assert!(got.iter().any(|line| line == expected), "{lines:?}: {got:?}");
        }
    }
}
