//! Snapshots: the calls recorded so far as a trace to run now, where the traced program reads a
//! value (`core/lang/values.py`). A snapshot either returns some values, the program from its
//! start ([`TraceBuilder::snapshot`]), or is a segment: the calls no earlier segment of the same
//! recording ran, taking what those computed as inputs and returning every tensor it computes
//! ([`TraceBuilder::segment`]), so a program with many reads runs each call once while tracing.

use super::{BoundSymbol, Trace, TraceBuilder};
use crate::bail;
use crate::error::Result;
use crate::ids::{SymbolId, ValueId};
use crate::sym::{Atom, Facts, Guard, Poly};
use crate::value::{Arg, ValueKind};
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// A segment of a recording (see [`TraceBuilder::segment`]).
pub struct Segment {
    /// Takes the recording's tensor inputs at `taken`, then `known_inputs`, then the size inputs
    /// (the recording's, then those the calls of earlier segments defined); returns `returned`.
    pub trace: Trace,
    /// The positions of the recording's inputs the segment takes: those its calls read or it
    /// returns (a model's parameters are inputs; a segment of its experts loop reads a few).
    pub taken: Vec<usize>,
    /// The recording's size values the trace takes, in order (the trace numbers its values
    /// apart: only those it takes, returns or its calls define, in that order).
    pub sizes: Vec<ValueId>,
    /// The tensors of earlier segments that this one reads, in the order it takes them.
    pub known_inputs: Vec<ValueId>,
    /// What the trace returns: every tensor its calls compute, then the wanted inputs.
    pub returned: Vec<ValueId>,
}

impl TraceBuilder {
    /// The calls recorded so far as a trace returning `outputs`, which no gradient reaches
    /// (their `requires_grad` is cleared); the recording goes on. A data-dependent read
    /// evaluates the program up to the value it reads this way. The open composite calls
    /// contribute the calls of their decompositions so far (they compute the same values); a
    /// grad rule's backward cannot be evaluated (its cotangents have no values yet).
    pub fn snapshot(&self, outputs: &[ValueId]) -> Result<Trace> {
        let mut values = self.snapshot_values()?;
        for &v in outputs {
            match values.get_mut(v.0 as usize) {
                Some(ValueKind::Tensor(t)) => t.requires_grad = false,
                _ => bail!(Runtime, "recorder", "a snapshot's output {v} is not a tensor"),
            }
        }
        let outputs = Arg::Tuple(outputs.iter().map(|&v| Arg::Value(v)).collect());
        let bsyms = self.recorded().cloned().collect();
        Ok(self.snapshot_trace(values, self.all_inputs(), bsyms, outputs))
    }

    /// The calls recorded so far that earlier segments did not run, given the tensors they
    /// returned (`known`): a call all of whose tensor outputs are known ran, and is left out
    /// (its outputs become inputs); `checks` are effects that only compare values (a read's
    /// check), left out once their tensors are known. Every tensor the segment's calls compute
    /// is returned, none requiring grad, and those of `wanted` that are the recording's inputs. `None` when a call to run again has an effect that
    /// running twice would change (a random draw inside a composite that an earlier segment
    /// ran in part, `torch.manual_seed`): the caller then runs the recording from its start.
    pub fn segment(
        &self,
        wanted: &[ValueId],
        known: &FxHashSet<ValueId>,
        checks: &[SymbolId],
    ) -> Result<Option<Segment>> {
        self.segment_returning(wanted, known, checks, true)
    }

    /// The last segment of a recording: as [`TraceBuilder::segment`], returning only the
    /// tensors of `wanted` that no earlier segment returned (the program's outputs). Nothing
    /// runs after it, so its other tensors are not kept: its trace frees each once it is last
    /// used, as eager does, instead of holding all of them to return them.
    pub fn last_segment(
        &self,
        wanted: &[ValueId],
        known: &FxHashSet<ValueId>,
        checks: &[SymbolId],
    ) -> Result<Option<Segment>> {
        self.segment_returning(wanted, known, checks, false)
    }

    fn segment_returning(
        &self,
        wanted: &[ValueId],
        known: &FxHashSet<ValueId>,
        checks: &[SymbolId],
        every: bool,
    ) -> Result<Option<Segment>> {
        if self.stack.iter().any(|frame| frame.grad.is_some()) {
            bail!(Runtime, "recorder", "a snapshot inside a grad rule's backward");
        }
        let values = &self.values;
        let is_known = |v: &ValueId| known.contains(v) || matches!(self.values[v.index()], ValueKind::Size(_));
        let (mut kept, mut ran) = (Vec::new(), Vec::new());
        for bsym in self.recorded() {
            if !bsym.outputs.is_empty() && bsym.outputs.iter().all(is_known) {
                ran.extend(bsym.outputs.iter().copied());
                continue;
            }
            if is_check(bsym, checks) && bsym.inputs().iter().all(is_known) {
                continue; // answered: the values it compares are those the read returned
            }
            if !known.is_empty() && stateful(bsym, checks) && (bsym.outputs.is_empty() || reran(bsym, known)) {
                return Ok(None);
            }
            kept.push(bsym.clone());
        }
        let returned: Vec<ValueId> = if every {
            let computed = kept.iter().flat_map(|b| b.outputs.iter().copied());
            let tensors = computed.filter(|v| matches!(values[v.index()], ValueKind::Tensor(_)));
            tensors.chain(wanted.iter().copied().filter(|v| self.inputs.contains(v) && !known.contains(v))).collect()
        } else {
            let mut seen = FxHashSet::default();
            wanted.iter().copied().filter(|v| !known.contains(v) && seen.insert(*v)).collect()
        };
        Ok(Some(self.segment_of(kept, &ran, known, returned)))
    }

    fn segment_of(
        &self,
        kept: Vec<BoundSymbol>,
        ran: &[ValueId],
        known: &FxHashSet<ValueId>,
        returned: Vec<ValueId>,
    ) -> Segment {
        let mut read = FxHashSet::default();
        kept.iter().for_each(|b| reads_in(b, &mut read));
        let is_size = |v: &&ValueId| matches!(self.values[v.index()], ValueKind::Size(_));
        let known_inputs: Vec<ValueId> =
            ran.iter().filter(|v| known.contains(v) && read.contains(v) && !is_size(v)).copied().collect();
        let ran_sizes = ran.iter().filter(is_size).copied();
        let out: FxHashSet<ValueId> = returned.iter().copied().collect();
        let taken: Vec<usize> = (0..self.inputs.len())
            .filter(|&i| read.contains(&self.inputs[i]) || out.contains(&self.inputs[i]))
            .collect();
        // (float inputs are passed as sizes are: the call's own values)
        let sizes: Vec<ValueId> = self.sizes.iter().chain(&self.floats).copied().chain(ran_sizes).collect();
        let tensors = taken.iter().map(|&i| self.inputs[i]);
        let inputs = tensors.chain(known_inputs.iter().copied()).chain(sizes.iter().copied()).collect();
        Segment { trace: self.compact(inputs, kept, &returned), taken, sizes, known_inputs, returned }
    }

    /// A trace of `bsyms` taking `inputs` and returning `returned`, over its own values only:
    /// those, numbered in that order (a copy of the recording's every value, per read, grew with
    /// the trace: 1.3 ms a read at 16 layers of a Qwen2-MoE). None requires grad.
    fn compact(&self, inputs: Vec<ValueId>, bsyms: Vec<BoundSymbol>, returned: &[ValueId]) -> Trace {
        let mut subst: FxHashMap<ValueId, ValueId> = FxHashMap::default();
        let mut old: Vec<ValueId> = Vec::new();
        let mut number = |v: ValueId| {
            subst.entry(v).or_insert_with(|| {
                old.push(v);
                ValueId(old.len() as u32 - 1)
            });
        };
        inputs.iter().for_each(|&v| number(v));
        bsyms.iter().for_each(|b| b.for_each_defined(&mut number));
        let rename = |v: ValueId| *subst.get(&v).unwrap_or(&v);
        let values = old.iter().map(|v| without_grad(self.values[v.index()].renamed(&rename))).collect();
        let mut facts = Facts::default();
        self.facts.counts().filter(|v| subst.contains_key(v)).for_each(|v| facts.count(subst[&v]));
        for guard in self.facts.guards() {
            let mut mapped = true;
            guard.expr.for_each_value(&mut |v| mapped &= subst.contains_key(&v));
            if mapped {
                let expr = guard.expr.substitute(&mut |v| Poly::atom(Atom::Value(subst[&v])));
                facts.assume(Guard { expr, rel: guard.rel });
            }
        }
        Trace {
            values: Arc::new(values),
            inputs: inputs.iter().map(|v| subst[v]).collect(),
            bsyms: bsyms.iter().map(|b| b.renamed_everywhere(&subst)).collect(),
            outputs: Arg::Tuple(returned.iter().map(|v| Arg::Value(rename(*v))).collect()),
            facts: Arc::new(facts),
        }
    }

    /// The calls recorded so far, those of the open composites' decompositions in place.
    fn recorded(&self) -> impl Iterator<Item = &BoundSymbol> {
        self.stack.iter().flat_map(|frame| frame.bsyms.iter())
    }

    fn snapshot_values(&self) -> Result<Vec<ValueKind>> {
        if self.stack.iter().any(|frame| frame.grad.is_some()) {
            bail!(Runtime, "recorder", "a snapshot inside a grad rule's backward");
        }
        Ok(self.values.clone())
    }

    fn snapshot_trace(
        &self,
        values: Vec<ValueKind>,
        inputs: Vec<ValueId>,
        bsyms: Vec<BoundSymbol>,
        outputs: Arg,
    ) -> Trace {
        Trace { values: Arc::new(values), inputs, bsyms, outputs, facts: Arc::new(self.facts.clone()) }
    }
}

fn without_grad(mut kind: ValueKind) -> ValueKind {
    if let ValueKind::Tensor(t) = &mut kind {
        t.requires_grad = false;
    }
    kind
}

fn is_check(bsym: &BoundSymbol, checks: &[SymbolId]) -> bool {
    matches!(bsym.symbol, super::Symbol::Fallback(id) if checks.contains(&id))
}

/// Whether running `bsym` changes state outside the trace (an effect other than a check).
fn stateful(bsym: &BoundSymbol, checks: &[SymbolId]) -> bool {
    (bsym.symbol.is_effect() && !is_check(bsym, checks)) || bsym.subsymbols.iter().any(|s| stateful(s, checks))
}

/// Whether some call in `bsym` (itself or its decomposition) ran in an earlier segment.
fn reran(bsym: &BoundSymbol, known: &FxHashSet<ValueId>) -> bool {
    bsym.outputs.iter().any(|v| known.contains(v)) || bsym.subsymbols.iter().any(|s| reran(s, known))
}

/// Adds the values `bsym` and its decomposition read to `read`.
fn reads_in(bsym: &BoundSymbol, read: &mut FxHashSet<ValueId>) {
    bsym.for_each_input(|v| {
        read.insert(v);
    });
    bsym.subsymbols.iter().for_each(|s| reads_in(s, read));
}
