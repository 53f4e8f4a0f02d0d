//! Reverse-mode autodiff: one joint forward+backward trace from a forward trace.
//!
//! The backward walks the forward's bound symbols in reverse. A prim uses its Rust rule
//! ([`trace_ir::Prim::vjp`]); a composite recorded through a Python grad rule emits the backward the rule
//! recorded; any other composite is differentiated through its decomposition (one recorded
//! without it is refused); a fallback gets a
//! `<name>.vjp` call that torch.autograd differentiates at run time. Only tensors that require
//! grad receive gradients, so integer and boolean values never do.

use crate::reentrant::{backprop_checkpointed, Checkpoint, Landed};
use crate::PassCx;
use rustc_hash::{FxHashMap, FxHashSet};
use std::ops::Range;
use std::sync::Arc;
use trace_ir::grad::Emitter;
use trace_ir::{
    bail, Arg, BoundSymbol, GradRule, Result, Symbol, SymbolId, SymbolTable, Trace, TraceBuilder, ValueId, ValueKind,
};

/// A joint trace: the forward's bound symbols, then the backward's.
///
/// Its inputs are the forward's inputs followed by one cotangent per differentiable output; its
/// outputs are `(forward outputs, (gradient or None per forward input))`.
#[derive(Clone, Debug)]
pub struct Joint {
    /// The joint program: the forward's calls, then the backward's.
    pub trace: Trace,
    /// How many leading bound symbols are the forward's.
    pub num_forward: usize,
    /// How many trailing inputs are cotangents.
    pub num_cotangents: usize,
}

/// The output values that gradients flow into: tensors that require grad, in output order
/// (a value returned twice appears twice).
pub fn differentiable_outputs(trace: &Trace) -> Vec<ValueId> {
    let mut out = Vec::new();
    trace.outputs.for_each_value(&mut |v| {
        if trace.tensor(v).is_some_and(|t| t.requires_grad) {
            out.push(v);
        }
    });
    out
}

/// The VJP pass as the pass manager runs it: the joint trace (or the trace unchanged when no
/// output requires grad).
pub fn vjp(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
    Ok(joint(trace)?.map_or_else(|| trace.clone(), |j| j.trace))
}

/// Builds the joint trace, or `None` when no output requires grad.
pub fn joint(trace: &Trace) -> Result<Option<Joint>> {
    joint_with(trace, &[], &[])
}

/// [`joint`] for a backward that reaches only some outputs: the cotangents at the indices
/// `absent` (among the differentiable outputs) are absent, as eager's autograd has them where a
/// loss does not use an output. They stay inputs of the joint trace (its signature is
/// [`joint`]'s), but no gradient flows from them: a call none of whose outputs a present
/// cotangent reaches has no backward, and one that some reach gets None for the others, as
/// eager's node gets an undefined gradient (`qr`'s backward from `Q` alone computes
/// `-Q^H gQ`, not `0 R^H - Q^H gQ`; `eigh`'s from the eigenvalues alone `V diag(gL) V^H`).
/// Values computed only from absent cotangents are never made, so nothing is added to zeros.
pub fn joint_without(trace: &Trace, absent: &[usize]) -> Result<Option<Joint>> {
    joint_with(trace, absent, &[])
}

/// [`joint`] of a program that ran the reentrant activation `checkpoints`, whose gradients it
/// sums as eager does (see [`crate::reentrant`]). A program input whose `.grad` eager adds
/// several gradients to in turn gets the tuple of them, in order, in place of its gradient.
pub fn joint_checkpointed(trace: &Trace, checkpoints: &[Checkpoint]) -> Result<Option<Joint>> {
    joint_with(trace, &[], checkpoints)
}

/// [`joint_without`] and [`joint_checkpointed`] together.
pub fn joint_with(trace: &Trace, absent: &[usize], checkpoints: &[Checkpoint]) -> Result<Option<Joint>> {
    let outputs = differentiable_outputs(trace);
    if outputs.is_empty() {
        return Ok(None);
    }
    let mut builder = TraceBuilder::resume(trace);
    let mut cots = Cotangents::default();
    let mut early = Landed::default();
    {
        let mut e = Emitter::new(&mut builder);
        for (k, &o) in outputs.iter().enumerate() {
            let mut meta = trace.tensor(o).expect("differentiable outputs are tensors").clone();
            meta.requires_grad = false;
            let c = e.builder.add_input(ValueKind::Tensor(meta));
            if !absent.contains(&k) {
                cots.accumulate(&mut e, o, c)?;
            }
        }
        if checkpoints.is_empty() {
            backprop(&mut e, &mut cots, &trace.bsyms)?;
        } else {
            early = backprop_checkpointed(&mut e, &mut cots, trace, checkpoints)?;
        }
    }
    let backward = builder.take_bsyms();
    let facts = Arc::new(builder.facts().clone());
    let (values, inputs) = builder.into_parts();
    // (an input whose `.grad` eager adds several gradients to in turn: all of them, in order)
    let grad = |i: &ValueId| match (cots.get(*i), early.get(i)) {
        (Some(last), Some(pieces)) => Arg::Tuple(pieces.iter().chain([&last]).map(|&g| Arg::Value(g)).collect()),
        (g, _) => g.map_or(Arg::None, Arg::Value),
    };
    let grads = trace.inputs.iter().map(grad).collect();
    let mut bsyms = trace.bsyms.clone();
    let num_forward = bsyms.len();
    bsyms.extend(backward);
    let outputs_joint = Arg::Tuple(vec![trace.outputs.clone(), Arg::Tuple(grads)]);
    let trace = Trace { values: Arc::new(values), inputs, bsyms, outputs: outputs_joint, facts };
    Ok(Some(Joint { trace, num_forward, num_cotangents: outputs.len() }))
}

/// The backward of the calls recorded into `builder` at its current level since `mark` (a
/// program's own: `torch.func.grad` of a function it calls), emitted into `builder` after them:
/// each `(value, cotangent)` of `seeds` flows back through them, and the gradient that reaches
/// each of `wrt` is returned (None where none does). A composite whose values the backward reads
/// is replaced by its decomposition, as `split` replaces one holding a residual. Grad rules'
/// backwards get values of their own, so that the VJP pass can differentiate the program,
/// emitted backward included, again; where the program's gradient may go through it (the calls
/// read a value from before them that requires grad, with the level outside's grad mode
/// `outer_grad` on), composites are differentiated through their decompositions, not their rules'
/// backward kernels. A backward that runs eager fallbacks (torch.autograd at run time, which the
/// VJP pass could not differentiate) is refused.
pub fn backward_into(
    builder: &mut TraceBuilder,
    mark: usize,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
    outer_grad: bool,
) -> Result<Vec<Option<ValueId>>> {
    let end = builder.mark();
    Ok(backward_after(builder, mark..end, seeds, wrt, outer_grad)?.0)
}

/// [`backward_into`] of the calls at the current level that define the values `values` (a
/// forward `torch.func.vjp` recorded, which the program may have used since): its backward is
/// emitted after everything recorded so far, from the forward's own values, and the gradient
/// that reaches each of `wrt` is returned with how many calls the backward recorded. Refused
/// where calls defining other values are interleaved with them.
pub fn backward_of_values(
    builder: &mut TraceBuilder,
    values: Range<usize>,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
    outer_grad: bool,
) -> Result<(Vec<Option<ValueId>>, usize)> {
    let calls = builder.recorded_since(0);
    let defines = |b: &BoundSymbol| {
        let (mut inside, mut outside) = (false, false);
        b.for_each_defined(&mut |v| {
            if !b.args.contains(&Arg::Value(v)) {
                let within = values.contains(&v.index());
                inside |= within;
                outside |= !within;
            }
        });
        (inside, outside)
    };
    let Some(start) = calls.iter().position(|b| defines(b).0) else {
        bail!(NotImplemented, "differentiate", "the calls defining the values to differentiate are gone");
    };
    let end = calls.iter().rposition(|b| defines(b).0).map_or(start, |i| i + 1);
    if calls[start..end].iter().any(|b| defines(b).1) {
        bail!(NotImplemented, "differentiate", "other calls are interleaved with those to differentiate");
    }
    backward_after(builder, start..end, seeds, wrt, outer_grad)
}

/// The backward of the calls `span` at the builder's current level, emitted after all it
/// recorded (those of `span` decomposed where the backward reads their values): the gradients
/// of `wrt` and how many calls the backward recorded.
fn backward_after(
    builder: &mut TraceBuilder,
    span: Range<usize>,
    seeds: &[(ValueId, ValueId)],
    wrt: &[ValueId],
    outer_grad: bool,
) -> Result<(Vec<Option<ValueId>>, usize)> {
    let region = builder.recorded_since(span.start)[..span.end - span.start].to_vec();
    let rest = builder.recorded_since(span.end).to_vec();
    let end = builder.mark();
    let decompose = outer_grad && reads_values_requiring_grad(builder, &region);
    builder.set_grad_enabled(true);
    let mut cots = Cotangents { fresh: true, decompose, ..Cotangents::default() };
    let emitted = emit_backward(builder, &mut cots, &region, seeds).and_then(|()| {
        match builder.recorded_since(end).iter().find(|b| matches!(b.symbol, Symbol::Fallback(_))) {
            Some(b) => bail!(
                NotImplemented,
                "differentiate",
                "the backward runs the eager fallback {}",
                b.symbol.qualified_name()
            ),
            None => Ok(()),
        }
    });
    if let Err(e) = emitted {
        builder.rewind(end); // (what it emitted; the calls it differentiates stay)
        return Err(e);
    }
    let backward = builder.recorded_since(end).to_vec();
    let mut read = vec![false; builder.num_values()];
    backward.iter().for_each(|b| b.for_each_read(&mut |v| read[v.index()] = true));
    builder.rewind(span.start);
    let mut calls = Vec::with_capacity(region.len() + rest.len() + backward.len());
    region.iter().for_each(|b| crate::split::flatten_where_needed(b, &read, &mut calls));
    let recorded = backward.len();
    calls.into_iter().chain(rest).chain(backward).for_each(|b| builder.push_bsym(b));
    Ok((wrt.iter().map(|&w| cots.get(w)).collect(), recorded))
}

/// Emits the backward of `region` from `seeds` (`(value, cotangent)`) into `builder`.
fn emit_backward(
    builder: &mut TraceBuilder,
    cots: &mut Cotangents,
    region: &[BoundSymbol],
    seeds: &[(ValueId, ValueId)],
) -> Result<()> {
    let mut e = Emitter::new(builder);
    for &(value, cotangent) in seeds {
        cots.accumulate(&mut e, value, cotangent)?;
    }
    backprop(&mut e, cots, region)
}

/// Whether `bsyms` read a value they do not define (at any depth of their decompositions) that
/// requires grad.
fn reads_values_requiring_grad(builder: &TraceBuilder, bsyms: &[BoundSymbol]) -> bool {
    fn walk(bsyms: &[BoundSymbol], defined: &mut FxHashSet<ValueId>, read: &mut Vec<ValueId>) {
        for b in bsyms {
            b.for_each_input(|v| read.push(v));
            walk(&b.subsymbols, defined, read);
            defined.extend(b.outputs.iter().copied());
        }
    }
    let (mut defined, mut read) = (FxHashSet::default(), Vec::new());
    walk(bsyms, &mut defined, &mut read);
    read.into_iter()
        .any(|v| !defined.contains(&v) && matches!(builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad))
}

/// The cotangent accumulated so far for each value.
#[derive(Default)]
pub(crate) struct Cotangents {
    of: FxHashMap<ValueId, ValueId>,
    /// Whether a grad rule's backward is emitted with values of its own (a backward recorded
    /// into the program it differentiates, which the VJP pass may differentiate again and emit
    /// that rule's backward a second time: [`backward_into`]).
    fresh: bool,
    /// Whether composites are differentiated through their decomposition rather than their grad
    /// rule, whose backward may call kernels recorded whole (`tanh_backward`) that the VJP pass
    /// cannot differentiate again ([`backward_into`] where the program's own gradient goes
    /// through the backward).
    decompose: bool,
}

impl Cotangents {
    /// The values that have a cotangent.
    pub(crate) fn values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.of.keys().copied()
    }

    pub(crate) fn get(&self, v: ValueId) -> Option<ValueId> {
        self.of.get(&v).copied()
    }

    /// Removes and returns the cotangent of `v`.
    pub(crate) fn take(&mut self, v: ValueId) -> Option<ValueId> {
        self.of.remove(&v)
    }

    /// Makes `g` the cotangent of `v`.
    pub(crate) fn set(&mut self, v: ValueId, g: ValueId) {
        self.of.insert(v, g);
    }

    /// Empty cotangents emitted as these are (for a backward summed apart).
    pub(crate) fn apart(&self) -> Cotangents {
        Cotangents { of: FxHashMap::default(), fresh: self.fresh, decompose: self.decompose }
    }

    /// Each value with its cotangent.
    pub(crate) fn into_values(self) -> Vec<(ValueId, ValueId)> {
        self.of.into_iter().collect()
    }

    /// Adds `g` to the cotangent of `v`, if `v` is a tensor that requires grad.
    pub(crate) fn accumulate(&mut self, e: &mut Emitter, v: ValueId, g: ValueId) -> Result<()> {
        let wants = matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad);
        if !wants {
            return Ok(());
        }
        let g = e.convert(g, e.meta(v).dtype)?;
        let total = match self.get(v) {
            Some(previous) => e.add(previous, g)?,
            None => g,
        };
        self.of.insert(v, total);
        Ok(())
    }
}

/// Whether `bsym` is a composite recorded whole (`TraceBuilder::record_given`): no
/// decomposition, yet outputs of its own (a composite that returns its inputs records none).
fn is_whole(bsym: &BoundSymbol) -> bool {
    bsym.subsymbols.is_empty() && bsym.outputs.iter().any(|o| !bsym.args.contains(&Arg::Value(*o)))
}

/// Emits the backward of `bsyms` (in reverse), accumulating into `cots`.
pub(crate) fn backprop(e: &mut Emitter, cots: &mut Cotangents, bsyms: &[BoundSymbol]) -> Result<()> {
    for bsym in bsyms.iter().rev() {
        if let Some(mirror) = effect_in_backward(bsym) {
            e.builder.push_bsym(mirror);
            continue;
        }
        let out_cots: Vec<Option<ValueId>> = bsym.outputs.iter().map(|&o| cots.get(o)).collect();
        if out_cots.iter().all(Option::is_none) {
            continue;
        }
        match &bsym.symbol {
            Symbol::Prim(prim) => {
                let grads = prim.vjp(e, &bsym.args, &bsym.outputs, &out_cots)?;
                for (arg, g) in bsym.args.iter().zip(grads) {
                    if let (Arg::Value(v), Some(g)) = (arg, g) {
                        cots.accumulate(e, *v, g)?;
                    }
                }
            }
            Symbol::Composite(id) => match &bsym.grad {
                Some(rule) if !cots.decompose || bsym.subsymbols.is_empty() => apply_rule(e, cots, rule)?,
                _ if is_whole(bsym) => bail!(
                    NotImplemented,
                    &*SymbolTable::name(*id),
                    "was recorded without its decomposition (an executor runs it whole), which its gradient needs"
                ),
                _ => backprop(e, cots, &bsym.subsymbols)?,
            },
            Symbol::Region(_) => backprop(e, cots, &bsym.subsymbols)?,
            Symbol::Fallback(id) => fallback_vjp(e, cots, bsym, *id, &out_cots)?,
        }
    }
    Ok(())
}

/// The call the backward makes where it passes `bsym`, an effect of no outputs with a
/// `<name>.in_backward` effect registered (the switch into a stream at the end of a
/// `with torch.cuda.stream(s)` block, back out of it at its start: eager's autograd runs the
/// backward of each call on the stream its forward ran on), with `bsym`'s arguments; else None.
fn effect_in_backward(bsym: &BoundSymbol) -> Option<BoundSymbol> {
    let Symbol::Fallback(id) = &bsym.symbol else { return None };
    if !bsym.outputs.is_empty() || !bsym.symbol.is_effect() {
        return None;
    }
    let mirror = SymbolTable::lookup(&format!("{}.in_backward", SymbolTable::name(*id)))?;
    let mut call = BoundSymbol::new(Symbol::Fallback(mirror), bsym.args.clone(), Vec::new());
    call.kwargs = bsym.kwargs.clone();
    Some(call)
}

/// `backward` without the switches into and out of a block's stream where its backward runs
/// nothing on it: the mirror of a block's end (`<...>.__exit__.in_backward`) followed at once by
/// that of its start (`<...>.__enter__.in_backward`; blocks nest, so the two are one block's).
/// Eager's autograd runs nothing on a stream where the block's forward made no node, and waits
/// for nothing there.
pub(crate) fn without_empty_switches(backward: Vec<BoundSymbol>) -> Vec<BoundSymbol> {
    let mut kept: Vec<BoundSymbol> = Vec::with_capacity(backward.len());
    for bsym in backward {
        if is_mirror_of(&bsym, "__enter__") && kept.last().is_some_and(|last| is_mirror_of(last, "__exit__")) {
            kept.pop();
            continue;
        }
        kept.push(bsym);
    }
    kept
}

/// Whether `bsym` is what the backward runs where it passes an effect named `<...>.<method>`.
fn is_mirror_of(bsym: &BoundSymbol, method: &str) -> bool {
    let Symbol::Fallback(id) = &bsym.symbol else { return false };
    bsym.outputs.is_empty()
        && SymbolTable::name(*id).strip_suffix(".in_backward").is_some_and(|name| name.ends_with(method))
}

/// Emits the backward a Python grad rule recorded, its cotangent placeholders replaced by the
/// cotangents accumulated. Where none flowed to some outputs, eager's node gets undefined
/// gradients for them, and its formula leaves their terms out (`std_mean`'s from the std alone
/// adds no zeros, whose sum is +0 where the std's term is -0): the rule's backward is pruned of
/// what only they reach ([`crate::absent::prune`]; an input whose gradient only they reach gets
/// zeros, the gradient the rule gives it: `native_group_norm`'s weight from its statistics alone,
/// as eager's), else, where they meet the others' cotangents other than in an add, given zeros.
fn apply_rule(e: &mut Emitter, cots: &mut Cotangents, rule: &GradRule) -> Result<()> {
    let mut subst = FxHashMap::default();
    let (mut absent, mut present) = (Vec::new(), FxHashMap::default());
    for &(value, placeholder) in &rule.cotangents {
        match cots.get(value) {
            Some(c) => {
                subst.insert(placeholder, c);
                present.insert(placeholder, placeholder);
            }
            None => absent.push((value, placeholder)),
        }
    }
    let pruned = if absent.is_empty() {
        None
    } else {
        let zeros = absent.iter().map(|&(_, p)| (p, p)).collect();
        let builder = &*e.builder;
        let meta = |v: ValueId| match builder.value(v) {
            Some(ValueKind::Tensor(t)) => Some(t),
            _ => None,
        };
        crate::absent::prune(&rule.bsyms, zeros, present, &|a, b| crate::absent::same_tensor(meta(a), meta(b)))
    };
    if pruned.is_none() {
        for &(value, placeholder) in &absent {
            subst.insert(placeholder, e.zeros_like(value)?);
        }
    }
    let bsyms = pruned.as_ref().map_or(rule.bsyms.as_slice(), |p| p.kept.as_slice());
    if cots.fresh {
        for bsym in bsyms {
            bsym.for_each_defined(&mut |v| {
                let kind = e.builder.value(v).expect("a rule's values are the recording's").clone();
                subst.insert(v, e.builder.add_value(kind));
            });
        }
    }
    for bsym in bsyms {
        let bsym = if cots.fresh { bsym.renamed_everywhere(&subst) } else { bsym.renamed(&subst) };
        if cots.fresh {
            label_from_inputs(e.builder, std::slice::from_ref(&bsym));
        }
        e.builder.push_bsym(bsym);
    }
    for (value, grad) in &rule.grads {
        match grad {
            Arg::Value(g) => {
                let g = match pruned.as_ref().map_or(Some(*g), |p| p.resolve(*g)) {
                    Some(g) => *subst.get(&g).unwrap_or(&g),
                    None => e.zeros_like(*value)?, // (the rule gives one: the zeros eager's node gives)
                };
                cots.accumulate(e, *value, g)?
            }
            Arg::None => {}
            other => bail!(Type, "put_grad", "expected a tensor gradient for {value}, got {other:?}"),
        }
    }
    Ok(())
}

/// Marks the values `bsyms` define as requiring grad where an input of their call now does (a
/// differentiable call of inexact outputs), as recording them would: a rule's backward was
/// recorded with its cotangent placeholders not requiring grad, which the cotangents given to it
/// may (`torch.func.jvp`'s backward of a backward, from a cotangent that requires grad). Only
/// adds labels: the caller's `relabel_since` then takes off those the level outside does not see.
fn label_from_inputs(builder: &mut TraceBuilder, bsyms: &[BoundSymbol]) {
    let wants =
        |builder: &TraceBuilder, v: ValueId| matches!(builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad);
    for bsym in bsyms {
        label_from_inputs(builder, &bsym.subsymbols);
        if !bsym.subsymbols.is_empty() || matches!(&bsym.symbol, Symbol::Prim(p) if !p.is_differentiable()) {
            continue; // (defined by its decomposition, or not differentiable)
        }
        let mut from_input = false;
        bsym.for_each_input(|v| from_input |= wants(builder, v));
        if !from_input {
            continue;
        }
        for &o in &bsym.outputs {
            if let Some(ValueKind::Tensor(t)) = builder.value(o) {
                if t.dtype.is_inexact() && !bsym.args.contains(&Arg::Value(o)) {
                    builder.label_requires_grad(o, true);
                }
            }
        }
    }
}

/// A fallback's backward: `<name>.vjp((args), (cotangents), (inputs wanting grads), **kwargs)`,
/// which runs the torch call under torch.autograd and returns one gradient per wanted input, or,
/// where one is registered, `<name>.saved_vjp((args), (outputs), (cotangents), (wanted), **kwargs)`,
/// which computes them from the forward's outputs as eager's derivative formula does. A
/// random (effect) fallback also gets the generator state it returned last, to draw again what
/// the forward drew.
fn fallback_vjp(
    e: &mut Emitter,
    cots: &mut Cotangents,
    bsym: &BoundSymbol,
    id: SymbolId,
    out_cots: &[Option<ValueId>],
) -> Result<()> {
    let mut wanted: Vec<ValueId> = Vec::new();
    bsym.for_each_input(|v| {
        let rg = matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.requires_grad);
        if rg && !wanted.contains(&v) {
            wanted.push(v);
        }
    });
    if wanted.is_empty() {
        return Ok(());
    }
    let name = SymbolTable::name(id);
    if let Some(vjp_id) = SymbolTable::lookup(&format!("{name}.outputs_vjp")) {
        let complex = SymbolTable::lookup(&format!("{name}.outputs_vjp.complex")).is_some();
        if let Some(&[a]) = reads_one_first_argument(e, bsym, complex).as_deref() {
            return outputs_vjp(e, cots, bsym, (&name, vjp_id), a, out_cots);
        }
    }
    // A backward from the forward's outputs (eager's derivative formula on what its node saved,
    // a factorisation's) where one is registered; else torch.autograd on the saved inputs.
    let saved = SymbolTable::lookup(&format!("{name}.saved_vjp"));
    let Some(vjp_id) = saved.or_else(|| SymbolTable::lookup(&format!("{name}.vjp"))) else {
        bail!(NotImplemented, &*name, "no gradient is registered for this eager fallback");
    };
    let outputs: Vec<ValueId> = wanted
        .iter()
        .map(|&w| {
            let meta = trace_ir::TensorMeta { requires_grad: false, ..e.meta(w) };
            e.builder.add_value(ValueKind::Tensor(meta))
        })
        .collect();
    let cot_args = out_cots.iter().map(|c| c.map_or(Arg::None, Arg::Value)).collect();
    let mut args = vec![Arg::Tuple(bsym.args.clone())];
    let mut wanted_args: Vec<Arg> = wanted.iter().map(|&w| Arg::Value(w)).collect();
    if saved.is_some() {
        let args_read = read_arguments(e, &name, bsym, &wanted, &mut wanted_args);
        args = vec![Arg::Tuple(args_read), read_outputs(&name, &bsym.outputs)];
    }
    args.extend([Arg::Tuple(cot_args), Arg::Tuple(wanted_args)]);
    if bsym.symbol.is_effect() {
        // A random call returns, last, the generator state its draws started from; its backward
        // draws the same numbers again from that state.
        let Some(&state) = bsym.outputs.last() else {
            bail!(Runtime, &*name, "a differentiable random call returns the generator state it drew from");
        };
        args.push(Arg::Value(state));
    }
    let mut call = BoundSymbol::new(Symbol::Fallback(vjp_id), args, outputs.clone());
    call.kwargs = bsym.kwargs.clone();
    e.builder.push_bsym(call);
    for (w, g) in wanted.into_iter().zip(outputs) {
        cots.accumulate(e, w, g)?;
    }
    Ok(())
}

/// Whether the backward from the outputs of `name` declares its `i`th `what` (`output`,
/// `arg`) unread (`<name>.unread_<what>.<i>` registered): eager's node does not save it.
fn unread(name: &str, what: &str, i: usize) -> bool {
    SymbolTable::lookup(&format!("{name}.unread_{what}.{i}")).is_some()
}

/// The forward's outputs a backward from the outputs reads: None for those it declares unread
/// (slogdet's log, the info of `cholesky_ex` and `inv_ex`), which the forward then does not save.
fn read_outputs(name: &str, outputs: &[ValueId]) -> Arg {
    Arg::Tuple(
        outputs
            .iter()
            .enumerate()
            .map(|(i, &o)| if unread(name, "output", i) { Arg::None } else { Arg::Value(o) })
            .collect(),
    )
}

/// The arguments a backward from the outputs reads: the shape (a tuple of sizes) in place of a
/// tensor it declares unread and reads nowhere else (solve's `B`, whose gradient needs its shape
/// alone), also in `wanted`, so that the forward does not save it.
fn read_arguments(
    e: &Emitter,
    name: &str,
    bsym: &BoundSymbol,
    wanted: &[ValueId],
    wanted_args: &mut [Arg],
) -> Vec<Arg> {
    let unread_at = |i: usize, a: &Arg| matches!(a, Arg::Value(_)) && unread(name, "arg", i);
    let mut read: Vec<ValueId> = Vec::new();
    for (i, a) in bsym.args.iter().enumerate() {
        if !unread_at(i, a) {
            a.for_each_value(&mut |v| read.push(v));
        }
    }
    bsym.kwargs.iter().for_each(|(_, a)| a.for_each_value(&mut |v| read.push(v)));
    let shape_of = |v: ValueId| Arg::dims(&e.meta(v).shape);
    for (w, arg) in wanted.iter().zip(wanted_args.iter_mut()) {
        if !read.contains(w) {
            *arg = shape_of(*w);
        }
    }
    let swap = |(i, a): (usize, &Arg)| match a {
        Arg::Value(v) if unread_at(i, a) && !read.contains(v) => shape_of(*v),
        _ => a.clone(),
    };
    bsym.args.iter().enumerate().map(swap).collect()
}

/// The call's one tensor input, where it is its first argument, read once, and real, or complex
/// where the backward from the outputs alone covers complex inputs (`<name>.outputs_vjp.complex`
/// registered: cholesky's, inv's), else None.
fn reads_one_first_argument(e: &Emitter, bsym: &BoundSymbol, complex: bool) -> Option<Vec<ValueId>> {
    let mut read = Vec::new();
    bsym.for_each_input(|v| read.push(v));
    let covered = |v| matches!(e.builder.value(v), Some(ValueKind::Tensor(t)) if t.dtype.is_float() || (complex && t.dtype.is_complex()));
    (read.len() == 1 && bsym.args.first() == Some(&Arg::Value(read[0])) && covered(read[0])).then_some(read)
}

/// A factorization's backward from its outputs alone, as eager's node that saves no input
/// (cholesky's L, inv's result, eigh's eigenpairs):
/// `<name>.outputs_vjp((args, the tensor None), (outputs), (cotangents), **kwargs)`, the
/// gradient of the input `a`. The backward does not read `a`, so the forward does not save it.
fn outputs_vjp(
    e: &mut Emitter,
    cots: &mut Cotangents,
    bsym: &BoundSymbol,
    (name, vjp_id): (&str, SymbolId),
    a: ValueId,
    out_cots: &[Option<ValueId>],
) -> Result<()> {
    let meta = trace_ir::TensorMeta { requires_grad: false, ..e.meta(a) };
    let grad = e.builder.add_value(ValueKind::Tensor(meta));
    let args = bsym.args.iter().map(|x| if matches!(x, Arg::Value(_)) { Arg::None } else { x.clone() });
    let outputs = read_outputs(name, &bsym.outputs);
    let cot_args = out_cots.iter().map(|c| c.map_or(Arg::None, Arg::Value)).collect();
    let args = vec![Arg::Tuple(args.collect()), outputs, Arg::Tuple(cot_args)];
    let mut call = BoundSymbol::new(Symbol::Fallback(vjp_id), args, vec![grad]);
    call.kwargs = bsym.kwargs.clone();
    e.builder.push_bsym(call);
    cots.accumulate(e, a, grad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, SymbolKind, TensorMeta};

    fn input(b: &mut TraceBuilder) -> ValueId {
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        b.add_input(ValueKind::Tensor(meta))
    }

    #[test]
    fn a_composite_recorded_whole_is_refused_where_a_gradient_needs_its_decomposition() {
        let id = SymbolTable::register("ltorch.test_whole_kernel", SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let x = input(&mut b);
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let y = b.record_given(Symbol::Composite(id), vec![Arg::Value(x)], vec![], vec![meta])[0];
        let trace = b.finish(Arg::Value(y)).unwrap();
        let err = joint(&trace).unwrap_err().to_string();
        assert!(err.contains("ltorch.test_whole_kernel") && err.contains("without its decomposition"), "{err}");
    }

    #[test]
    fn a_fallback_with_a_saved_backward_gets_its_outputs() {
        // y = f(x), f a fallback whose `saved_vjp` computes the gradient from y (a factorization's).
        let id = SymbolTable::register("ltorch.test_saved_factor", SymbolKind::Fallback);
        for name in ["ltorch.test_saved_factor.vjp", "ltorch.test_saved_factor.saved_vjp"] {
            SymbolTable::register(name, SymbolKind::Fallback);
        }
        let mut b = TraceBuilder::new();
        let x = input(&mut b);
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let y = b.record_given(Symbol::Fallback(id), vec![Arg::Value(x)], vec![], vec![meta])[0];
        let trace = b.finish(Arg::Value(y)).unwrap();
        let joint = joint(&trace).unwrap().expect("x requires grad");
        let call = joint.trace.bsyms[joint.num_forward..]
            .iter()
            .find(|b| matches!(b.symbol, Symbol::Fallback(_)))
            .expect("the backward calls the fallback's");
        assert_eq!(call.symbol.qualified_name(), "ltorch.test_saved_factor.saved_vjp");
        // (args), (outputs), (cotangents), (wanted)
        assert_eq!(call.args.len(), 4);
        assert_eq!(call.args[1], Arg::Tuple(vec![Arg::Value(y)]));
    }

    #[test]
    fn a_fallback_with_a_backward_from_its_outputs_alone_does_not_read_its_input() {
        // y = f(x), f a fallback whose `outputs_vjp` computes the gradient from y alone (cholesky's).
        let id = SymbolTable::register("ltorch.test_outputs_factor", SymbolKind::Fallback);
        for name in ["vjp", "saved_vjp", "outputs_vjp"] {
            SymbolTable::register(&format!("ltorch.test_outputs_factor.{name}"), SymbolKind::Fallback);
        }
        let mut b = TraceBuilder::new();
        let x = input(&mut b);
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let args = vec![Arg::Value(x), Arg::Scalar(trace_ir::Scalar::Bool(true))];
        let y = b.record_given(Symbol::Fallback(id), args, vec![], vec![meta])[0];
        let trace = b.finish(Arg::Value(y)).unwrap();
        let joint = joint(&trace).unwrap().expect("x requires grad");
        let call = joint.trace.bsyms[joint.num_forward..]
            .iter()
            .find(|b| matches!(b.symbol, Symbol::Fallback(_)))
            .expect("the backward calls the fallback's");
        assert_eq!(call.symbol.qualified_name(), "ltorch.test_outputs_factor.outputs_vjp");
        // (args without the input), (outputs), (cotangents)
        assert_eq!(call.args.len(), 3);
        assert_eq!(call.args[0], Arg::Tuple(vec![Arg::None, Arg::Scalar(trace_ir::Scalar::Bool(true))]));
        assert_eq!(call.args[1], Arg::Tuple(vec![Arg::Value(y)]));
    }

    #[test]
    fn a_saved_backward_is_not_given_what_it_declares_unread() {
        // (y, info) = f(x, b), f's saved backward reads neither `info` nor `b` but b's shape
        // (solve's B, cholesky_ex's info): the forward does not save them.
        let id = SymbolTable::register("ltorch.test_unread_factor", SymbolKind::Fallback);
        for name in ["saved_vjp", "unread_output.1", "unread_arg.1"] {
            SymbolTable::register(&format!("ltorch.test_unread_factor.{name}"), SymbolKind::Fallback);
        }
        let mut b = TraceBuilder::new();
        let (x, rhs) = (input(&mut b), input(&mut b));
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![4]) };
        let info = TensorMeta::new(DType::I32, Device::CPU, vec![]);
        let outs = b.record_given(Symbol::Fallback(id), vec![Arg::Value(x), Arg::Value(rhs)], vec![], vec![meta, info]);
        let trace = b.finish(Arg::Value(outs[0])).unwrap();
        let joint = joint(&trace).unwrap().expect("x requires grad");
        let call = joint.trace.bsyms[joint.num_forward..]
            .iter()
            .find(|b| matches!(b.symbol, Symbol::Fallback(_)))
            .expect("the backward calls the fallback's");
        let shape = Arg::Tuple(vec![Arg::Scalar(trace_ir::Scalar::Int(4))]);
        assert_eq!(call.args[0], Arg::Tuple(vec![Arg::Value(x), shape.clone()]));
        assert_eq!(call.args[1], Arg::Tuple(vec![Arg::Value(outs[0]), Arg::None]));
        assert_eq!(call.args[3], Arg::Tuple(vec![Arg::Value(x), shape]));
    }

    #[test]
    fn a_backward_recorded_into_the_program_is_differentiable_again() {
        // y = sum(x' * x'), x' an alias of x that requires grad: dy/dx' = 2x', recorded after y.
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(meta));
        let mark = b.mark();
        let alias = b.record_prim("neg", vec![Arg::Value(x)]).unwrap()[0];
        b.set_requires_grad(alias, true).unwrap();
        let sq = b.record_prim("mul", vec![Arg::Value(alias), Arg::Value(alias)]).unwrap()[0];
        let y = b.record_prim("sum", vec![Arg::Value(sq), Arg::ints(&[0])]).unwrap()[0];
        let seed = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![])));
        let grads = backward_into(&mut b, mark, &[(y, seed)], &[alias], true).unwrap();
        let g = grads[0].expect("x' reaches y");
        assert!(b.recorded_since(mark).len() > 3, "the backward follows the forward");
        // Outside the transform x does not require grad: neither does the gradient.
        b.relabel_since(mark, true).unwrap();
        assert!(matches!(b.value(g), Some(ValueKind::Tensor(t)) if !t.requires_grad));
        let trace = b.finish(Arg::Value(g)).unwrap();
        trace_ir::verify::verify(&trace).unwrap();
    }

    #[test]
    fn the_backward_of_earlier_values_follows_what_was_recorded_since() {
        // A vjp's forward y = sum(x' * x'), then a call of the program's own, then the backward of
        // the forward's values, after it.
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let first = b.num_values();
        let alias = b.record_prim("neg", vec![Arg::Value(x)]).unwrap()[0];
        b.set_requires_grad(alias, true).unwrap();
        let sq = b.record_prim("mul", vec![Arg::Value(alias), Arg::Value(alias)]).unwrap()[0];
        let y = b.record_prim("sum", vec![Arg::Value(sq), Arg::ints(&[0])]).unwrap()[0];
        let end = b.num_values();
        let other = b.record_prim("neg", vec![Arg::Value(x)]).unwrap()[0];
        let seed = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![])));
        let (grads, recorded) = backward_of_values(&mut b, first..end, &[(y, seed)], &[alias], true).unwrap();
        let calls = b.recorded_since(0);
        assert_eq!(calls.len(), 4 + recorded, "the forward, the program's call, then the backward");
        assert_eq!(calls[3].outputs, vec![other]);
        let g = grads[0].expect("x' reaches y");
        let trace = b.finish(Arg::Value(g)).unwrap();
        trace_ir::verify::verify(&trace).unwrap();
    }

    #[test]
    fn a_composite_returning_its_input_needs_no_decomposition() {
        let id = SymbolTable::register("ltorch.test_identity", SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let x = input(&mut b);
        b.begin_composite(id, vec![Arg::Value(x)], vec![]);
        b.end_composite(vec![x]).unwrap();
        let trace = b.finish(Arg::Value(x)).unwrap();
        assert!(joint(&trace).unwrap().is_some());
    }
}
