//! Writes through a slice of the program's own intermediate, run in place: the functional form
//! the recording makes of `y = x * 1; v = y[1:]; v.mul_(2)` (`t2 = y[1:]`, `t3 = t2.mul(2)`,
//! `t7 = ltorch.slice_overwrite(y, t3, 0, 1, 8, 1)`, later reads of `y` reading `t7`) becomes
//! `t3 = t2.mul_(2)` into the slice itself, the write-back dropped and its output read as `y`
//! from then on: eager's own calls, with no copy of the whole base and no new tensor for the
//! slice's values (and the base's version counter bumped as eager's write bumps it).
//!
//! Only the recording's write-backs of in-place ops through slices (`ltorch.slice_overwrite`) are
//! dropped, never a `slice_scatter` the program calls: its result is a new tensor, at version 0.
//! A write-back is dropped only when all of these hold (so that nothing can tell the difference):
//! - it is top-level, with constant dim, start, end and step, of a base of constant sizes that a
//!   call returning new memory made ([`returns_fresh`]: not an input, not a view), with a source
//!   computed by one call (see [`computes`]) that has an in-place form and whose receiver, of the
//!   source's dtype, shape and device, is the slice of the base the write-back writes, taken by a
//!   slice and nothing else (`getitem` of slices, `prims.slice`);
//! - no call after that computing call reads the base or any tensor that may alias it (a view
//!   taken of it, at any depth) except the write-back itself, the computing call reads no such
//!   tensor but its receiver, and none of them is returned: the old values, which the write
//!   now overwrites, are read nowhere after it;
//! - the source is read by the write-back alone.
//!
//! Like [`crate::reuse`], this runs only in traces that autograd does not record (see
//! `pipeline::lifetimes`): a differentiated forward saves values for its backward, which an
//! in-place write would overwrite.

use crate::partition::RegionPlan;
use crate::reuse::{computes, returns_fresh, same_meta};
use rustc_hash::{FxHashMap, FxHashSet};
use trace_ir::prims::Shape;
use trace_ir::pysrc::Callee;
use trace_ir::{Arg, BoundSymbol, Dim, Prim, Scalar, Symbol, SymbolTable, Trace, ValueId};

/// The trace with each write through a slice of a dying intermediate run in place (the rules
/// above): `impls` (one per top-level call) and `regions`' indices follow the calls dropped.
pub fn reinplace_slice_writes(trace: &Trace, impls: &mut Vec<Callee>, regions: &mut [RegionPlan]) -> Trace {
    if !trace.bsyms.iter().any(|b| scatter_args(b).is_some()) {
        return trace.clone();
    }
    let mut trace = trace.clone();
    let mut switched: FxHashSet<ValueId> = FxHashSet::default(); // (the outputs of the calls run in place)
    while let Some((m, i)) = find(&trace, impls, &switched) {
        let method = impls[m].inplace.clone();
        impls[m] = Callee { method, inplace: None, ..impls[m].clone() };
        switched.extend(trace.bsyms[m].outputs.iter().copied());
        let scatter = &trace.bsyms[i];
        let subst: FxHashMap<ValueId, ValueId> =
            FxHashMap::from_iter([(scatter.outputs[0], scatter.args[0].as_value().unwrap())]);
        let mut bsyms = trace.bsyms.clone();
        bsyms.remove(i);
        impls.remove(i);
        for b in &mut bsyms[i..] {
            *b = b.renamed(&subst);
        }
        let outputs = trace.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
        for r in regions.iter_mut().filter(|r| r.index > i) {
            r.index -= 1;
        }
        trace = trace.with_bsyms(bsyms, outputs);
    }
    trace
}

/// `(m, i)`: the first scatter `i` the rules allow to drop, and the call `m` computing its source.
fn find(trace: &Trace, impls: &[Callee], switched: &FxHashSet<ValueId>) -> Option<(usize, usize)> {
    let mut producer: FxHashMap<ValueId, usize> = FxHashMap::default();
    for (k, b) in trace.bsyms.iter().enumerate() {
        producer.extend(b.outputs.iter().map(|&o| (o, k)));
    }
    for (i, b) in trace.bsyms.iter().enumerate() {
        let Some((base, src, region)) = scatter_args(b) else { continue };
        let (Some(&p), Some(&m)) = (producer.get(&base), producer.get(&src)) else { continue };
        let computing = &trace.bsyms[m];
        if !returns_fresh(&trace.bsyms[p]) || impls[m].inplace.is_none() || !computes(computing) {
            continue;
        }
        let Some(Arg::Value(view)) = computing.args.first() else { continue };
        let Some(&g) = producer.get(view) else { continue };
        if computing.outputs.len() != 1 || !same_meta(trace, *view, src) {
            continue;
        }
        if slices(&trace.bsyms[g], *view, base, trace, region)
            && unread_after(trace, (p, m, i), base, *view, src, switched)
        {
            return Some((m, i));
        }
    }
    None
}

/// `(base, source, (dim, start, end, step))` of a top-level `ltorch.slice_overwrite` with constant
/// int parameters.
fn scatter_args(b: &BoundSymbol) -> Option<(ValueId, ValueId, [i64; 4])> {
    let Symbol::Composite(id) = b.symbol else { return None };
    if &*SymbolTable::name(id) != "ltorch.slice_overwrite" || !b.kwargs.is_empty() || b.outputs.len() != 1 {
        return None;
    }
    let [Arg::Value(base), Arg::Value(src), rest @ ..] = b.args.as_slice() else { return None };
    if rest.len() != 4 {
        return None;
    }
    let ints: Vec<i64> =
        rest.iter().map_while(|a| if let Arg::Scalar(Scalar::Int(n)) = a { Some(*n) } else { None }).collect();
    let region: [i64; 4] = ints.try_into().ok()?;
    (base != src).then_some((*base, *src, region))
}

/// Whether `g` takes `view` of `base` as a slice and nothing else, exactly the elements
/// `region` (`slice_scatter`'s dim, start, end, step) selects, at constant sizes.
fn slices(g: &BoundSymbol, view: ValueId, base: ValueId, trace: &Trace, region: [i64; 4]) -> bool {
    let slice = match (&g.symbol, &*g.subsymbols) {
        (Symbol::Prim(_), _) => g,
        (Symbol::Composite(_), [only]) if only.outputs == g.outputs => only,
        _ => return false,
    };
    let Some(Prim::Shape(Shape::Slice { start, end, strides })) = slice.symbol.as_prim() else { return false };
    if g.outputs != [view] || slice.args != [Arg::Value(base)] || g.args.first() != Some(&Arg::Value(base)) {
        return false;
    }
    let Some(meta) = trace.tensor(base) else { return false };
    let sizes: Option<Vec<i64>> =
        meta.shape.iter().map(|d| if let Dim::Const(c) = d { Some(*c) } else { None }).collect();
    let Some(sizes) = sizes else { return false };
    let rank = sizes.len() as i64;
    let [dim, from, to, step] = region;
    let dim = if dim < 0 { dim + rank } else { dim };
    if !(0..rank).contains(&dim) || step < 1 || start.len() != sizes.len() || end.len() != sizes.len() {
        return false;
    }
    let size = sizes[dim as usize];
    let clamp = |n: i64| (if n < 0 { n + size } else { n }).clamp(0, size);
    let (from, to) = (clamp(from), clamp(to));
    (0..sizes.len()).all(|d| {
        let want = if d as i64 == dim { (from, to, step) } else { (0, sizes[d], 1) };
        start[d] == Dim::Const(want.0) && end[d] == Dim::Const(want.1) && strides[d] == want.2
    })
}

/// Whether, after the computing call `m` (which reads `view` as its receiver and nothing else
/// aliasing `base`), no call but the scatter `i` reads `base` or a tensor that may alias it
/// (made from it, at any depth, by calls that do not return new memory), none is returned, and
/// `src` is read by the scatter alone, once (and returned only where no write-back, and no call
/// `switched` to run in place, follows the scatter).
fn unread_after(
    trace: &Trace,
    (p, m, i): (usize, usize, usize),
    base: ValueId,
    view: ValueId,
    src: ValueId,
    switched: &FxHashSet<ValueId>,
) -> bool {
    let mut aliases: FxHashSet<ValueId> = FxHashSet::from_iter([base]);
    for (k, b) in trace.bsyms.iter().enumerate().skip(p + 1) {
        let mut read_alias = 0usize;
        let mut read_src = 0usize;
        b.for_each_input(|v| {
            read_alias += usize::from(aliases.contains(&v));
            read_src += usize::from(v == src);
        });
        let allowed = match k {
            _ if k == m => read_alias == 1 && b.args.first() == Some(&Arg::Value(view)),
            _ if k == i => read_src == 1,
            _ if k > m => read_alias == 0 && read_src == 0,
            _ => true,
        };
        if !allowed {
            return false;
        }
        if read_alias > 0 && k != i && !returns_fresh(b) {
            aliases.extend(b.outputs.iter().copied());
        }
    }
    // The computed values may be returned where no write-back follows the scatter (which this
    // pass may run in place, into the same memory) and no call it ran in place: run in place,
    // they are the slice of the base then, with the values the scatter would have written, which
    // calls that only read them leave as they are (a program's view returned after its write,
    // `output_views`, is that slice itself).
    let written_after = trace.bsyms[i + 1..]
        .iter()
        .any(|b| scatter_args(b).is_some() || b.outputs.iter().any(|o| switched.contains(o)));
    let mut returned = false;
    trace.outputs.for_each_value(&mut |v| returned |= aliases.contains(&v) || (v == src && written_after));
    !returned
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::parser::parse_trace;

    const SCATTER: &str = "t7 = ltorch.slice_overwrite(t1, t3, 0, 1, 8, 1)  # t7: \"cpu f32[8, 8]\"
    # t4 = prims.pad(t3, 0.0, ((1, 0, 0), (0, 0, 0)))  # t4: \"cpu f32[8, 8]\"
    # t5 = prims.full((7, 8), True, torch.device('cpu'), torch.bool)  # t5: \"cpu b8[7, 8]\"
    # t6 = prims.pad(t5, False, ((1, 0, 0), (0, 0, 0)))  # t6: \"cpu b8[8, 8]\"
    # t7 = prims.where(t6, t4, t1)  # t7: \"cpu f32[8, 8]\"";

    /// The calls' methods after the pass (`-` for the dropped scatter's place gone) and what the
    /// trace returns, for `lines` over an input `t0` of `f32[8, 8]`.
    fn reinplaced(lines: &[&str]) -> (Vec<String>, String) {
        let mut text = String::from("def computation(t0):\n  # t0: \"cpu f32[8, 8]\"\n");
        text.extend(lines.iter().map(|line| format!("  {line}\n")));
        let trace = parse_trace(&text).unwrap();
        let mut impls: Vec<Callee> = trace
            .bsyms
            .iter()
            .map(|b| {
                let name = b.symbol.qualified_name().rsplit('.').next().unwrap().to_string();
                Callee::with_methods(format!("f_{name}"), &name)
            })
            .collect();
        let out = reinplace_slice_writes(&trace, &mut impls, &mut []);
        assert_eq!(out.bsyms.len(), impls.len());
        let methods = impls.iter().map(|c| c.method.as_deref().unwrap().to_string()).collect();
        (methods, format!("{:?}", out.outputs))
    }

    const MADE: &str = "t1 = prims.mul(t0, 1.0)  # t1: \"cpu f32[8, 8]\"";
    const VIEW: &str = "t2 = prims.slice(t1, (1, 0), (8, 8), (1, 1))  # t2: \"cpu f32[7, 8]\"";
    const WRITE: &str = "t3 = prims.mul(t2, 2.0)  # t3: \"cpu f32[7, 8]\"";
    const SECOND_WRITE: &str = "t9 = prims.slice(t7, (0, 0), (2, 8), (1, 1))  # t9: \"cpu f32[2, 8]\"
  t11 = prims.add(t9, 1.0)  # t11: \"cpu f32[2, 8]\"";
    const SECOND_SCATTER: &str = "t12 = ltorch.slice_overwrite(t7, t11, 0, 0, 2, 1)  # t12: \"cpu f32[8, 8]\"
    # t13 = prims.pad(t11, 0.0, ((0, 6, 0), (0, 0, 0)))  # t13: \"cpu f32[8, 8]\"
    # t14 = prims.full((2, 8), True, torch.device('cpu'), torch.bool)  # t14: \"cpu b8[2, 8]\"
    # t15 = prims.pad(t14, False, ((0, 6, 0), (0, 0, 0)))  # t15: \"cpu b8[8, 8]\"
    # t12 = prims.where(t15, t13, t7)  # t12: \"cpu f32[8, 8]\"";

    #[test]
    fn a_write_through_a_slice_of_a_made_tensor_runs_in_place() {
        let (methods, outputs) = reinplaced(&[MADE, VIEW, WRITE, SCATTER, "return t7"]);
        assert_eq!(methods, ["mul", "slice", "mul_"]);
        assert_eq!(outputs, format!("{:?}", Arg::Value(ValueId(1))));
        // Read after the write: the new values, now the base's.
        let (methods, _) = reinplaced(&[MADE, VIEW, WRITE, SCATTER, "t8 = prims.exp(t7)", "return t8"]);
        assert_eq!(methods, ["mul", "slice", "mul_", "exp"]);
        // The computed values returned with the base, nothing writing it after: the slice itself.
        let (methods, outputs) = reinplaced(&[MADE, VIEW, WRITE, SCATTER, "return (t7, t3)"]);
        assert_eq!(methods, ["mul", "slice", "mul_"]);
        assert_eq!(outputs, format!("{:?}", Arg::Tuple(vec![Arg::Value(ValueId(1)), Arg::Value(ValueId(3))])));
        // The base only read after: its values stay the slice's.
        let sum = "t8 = prims.sum(t7, (0, 1))  # t8: \"cpu f32[]\"";
        let (methods, _) = reinplaced(&[MADE, VIEW, WRITE, SCATTER, sum, "return (t7, t3, t8)"]);
        assert_eq!(methods, ["mul", "slice", "mul_", "sum"]);
    }

    #[test]
    fn old_values_read_after_the_write_keep_the_scatter() {
        let after_write = "t8 = prims.exp(t1)  # t8: \"cpu f32[8, 8]\"";
        let alias = "t9 = prims.slice(t1, (0, 0), (2, 8), (1, 1))  # t9: \"cpu f32[2, 8]\"";
        let other_rows = "t2 = prims.slice(t1, (0, 0), (7, 8), (1, 1))  # t2: \"cpu f32[7, 8]\"";
        let argument = "t2 = prims.slice(t0, (1, 0), (8, 8), (1, 1))  # t2: \"cpu f32[7, 8]\"";
        let of_argument = SCATTER.replace("(t1, t3", "(t0, t3").replace("t4, t1)", "t4, t0)");
        let cases: [Vec<&str>; 6] = [
            // The base read between the write and the scatter.
            vec![MADE, VIEW, WRITE, after_write, SCATTER, "return (t7, t8)"],
            // A view of the base taken before the write, read after it.
            vec![MADE, alias, VIEW, WRITE, SCATTER, "return (t7, t9)"],
            // The base's old values returned.
            vec![MADE, VIEW, WRITE, SCATTER, "return (t7, t1)"],
            // The computed values returned too, the base written again after the write (the second
            // write-back, which runs in place, first).
            vec![MADE, VIEW, WRITE, SCATTER, SECOND_WRITE, SECOND_SCATTER, "return (t12, t3)"],
            // The slice of an argument.
            vec![argument, WRITE, &of_argument, "return t7"],
            // Another slice than the one the scatter writes.
            vec![MADE, other_rows, WRITE, SCATTER, "return t7"],
        ];
        for lines in cases {
            let (methods, _) = reinplaced(&lines);
            assert!(methods.iter().any(|m| m == "slice_overwrite"), "{lines:?}: {methods:?}");
            assert!(!methods.iter().any(|m| m == "mul_"), "{lines:?}: {methods:?}");
        }
    }
}
