//! Bound symbols, traces, and the builder that records them.

use crate::bail;
use crate::error::Result;
use crate::ids::{SymbolId, ValueId};
use crate::prims::{Operand, Prim};
use crate::symbols::SymbolTable;
use crate::value::{Arg, Kwargs, TensorMeta, ValueKind};
use std::sync::Arc;

/// What a bound symbol calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Symbol {
    Prim(Prim),
    /// A registered Python decomposition; its bound symbols carry the decomposition.
    Composite(SymbolId),
    /// A torch call without a decomposition, executed eagerly by torch.
    Fallback(SymbolId),
}

impl Symbol {
    /// The name printed in traces: `prims.add`, `ltorch.softmax`, `torch.cumsum`.
    pub fn qualified_name(&self) -> String {
        match self {
            Symbol::Prim(p) => p.qualified_name(),
            Symbol::Composite(id) | Symbol::Fallback(id) => SymbolTable::name(*id).to_string(),
        }
    }

    pub fn as_prim(&self) -> Option<&Prim> {
        match self {
            Symbol::Prim(p) => Some(p),
            _ => None,
        }
    }
}

/// One recorded call: a symbol, its arguments and outputs, and for a composite its decomposition.
#[derive(Clone, Debug, PartialEq)]
pub struct BoundSymbol {
    pub symbol: Symbol,
    /// For prims, the operands only (parameters live in the [`Prim`]); otherwise the positional
    /// arguments as the caller gave them.
    pub args: Vec<Arg>,
    pub kwargs: Vec<(String, Arg)>,
    pub outputs: Vec<ValueId>,
    pub subsymbols: Vec<BoundSymbol>,
}

impl BoundSymbol {
    /// Calls `f` on every value the symbol reads.
    pub fn for_each_input(&self, mut f: impl FnMut(ValueId)) {
        self.args.iter().for_each(|a| a.for_each_value(&mut f));
        self.kwargs.iter().for_each(|(_, a)| a.for_each_value(&mut f));
    }

    pub fn inputs(&self) -> Vec<ValueId> {
        let mut out = Vec::new();
        self.for_each_input(|v| out.push(v));
        out
    }

    /// The positional arguments as printed (a prim's operands followed by its parameters).
    pub fn call_args(&self) -> Vec<Arg> {
        match &self.symbol {
            Symbol::Prim(p) => p.call_args(&self.args),
            _ => self.args.clone(),
        }
    }

    /// The same call with every input value renamed by `f`.
    pub fn map_inputs(&self, f: &mut impl FnMut(ValueId) -> Arg) -> BoundSymbol {
        BoundSymbol {
            symbol: self.symbol.clone(),
            args: self.args.iter().map(|a| a.map_values(f)).collect(),
            kwargs: self.kwargs.iter().map(|(k, a)| (k.clone(), a.map_values(f))).collect(),
            outputs: self.outputs.clone(),
            subsymbols: self.subsymbols.clone(),
        }
    }
}

/// A recorded program: values, inputs, top-level bound symbols in topological order, outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub values: Arc<Vec<ValueKind>>,
    pub inputs: Vec<ValueId>,
    pub bsyms: Vec<BoundSymbol>,
    pub outputs: Arg,
}

impl Trace {
    pub fn value(&self, id: ValueId) -> &ValueKind {
        &self.values[id.index()]
    }

    pub fn tensor(&self, id: ValueId) -> Option<&TensorMeta> {
        self.values.get(id.index()).and_then(ValueKind::as_tensor)
    }

    /// The same program with other bound symbols (values and inputs shared).
    pub fn with_bsyms(&self, bsyms: Vec<BoundSymbol>, outputs: Arg) -> Trace {
        Trace { values: self.values.clone(), inputs: self.inputs.clone(), bsyms, outputs }
    }

    /// Number of bound symbols, counting decompositions.
    pub fn count_bsyms(&self) -> usize {
        fn count(b: &[BoundSymbol]) -> usize {
            b.iter().map(|s| 1 + count(&s.subsymbols)).sum()
        }
        count(&self.bsyms)
    }
}

/// An open composite call while its decomposition is being recorded.
struct Frame {
    call: Option<(Symbol, Vec<Arg>, Kwargs)>,
    first_value: u32,
    bsyms: Vec<BoundSymbol>,
}

/// Records a trace call by call, as Python acquisition runs the program on proxies.
pub struct TraceBuilder {
    values: Vec<ValueKind>,
    inputs: Vec<ValueId>,
    stack: Vec<Frame>,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        TraceBuilder {
            values: Vec::new(),
            inputs: Vec::new(),
            stack: vec![Frame { call: None, first_value: 0, bsyms: Vec::new() }],
        }
    }
}

impl TraceBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn value(&self, id: ValueId) -> Option<&ValueKind> {
        self.values.get(id.index())
    }

    /// How many values have been recorded; the next value gets this id.
    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    fn push_value(&mut self, kind: ValueKind) -> ValueId {
        self.values.push(kind);
        ValueId(self.values.len() as u32 - 1)
    }

    pub fn add_input(&mut self, kind: ValueKind) -> ValueId {
        let id = self.push_value(kind);
        self.inputs.push(id);
        id
    }

    fn operand(&self, op: &str, arg: &Arg) -> Result<Operand<'_>> {
        match arg {
            Arg::Value(v) => match self.value(*v) {
                Some(ValueKind::Tensor(t)) => Ok(Operand::Tensor(t)),
                Some(ValueKind::Number(n)) => Ok(Operand::Number(*n)),
                None => bail!(Runtime, op, "unknown value {v}"),
            },
            Arg::Scalar(s) => Ok(Operand::Number(*s)),
            other => bail!(Type, op, "expected a tensor or number operand, got {other:?}"),
        }
    }

    /// Records `prims.<name>(*args)`, computing its outputs with the prim's meta rule.
    pub fn record_prim(&mut self, name: &str, args: Vec<Arg>) -> Result<Vec<ValueId>> {
        let (prim, operands) = Prim::from_call(name, args)?;
        let op = prim.qualified_name();
        let resolved: Vec<Operand> =
            operands.iter().map(|a| self.operand(&op, a)).collect::<Result<_>>()?;
        let requires_grad =
            resolved.iter().any(|o| matches!(o, Operand::Tensor(t) if t.requires_grad));
        let metas = prim.meta(&resolved)?;
        let outputs = metas
            .into_iter()
            .map(|mut m| {
                m.requires_grad = requires_grad && m.dtype.is_inexact();
                self.push_value(ValueKind::Tensor(m))
            })
            .collect::<Vec<_>>();
        self.push_bsym(Symbol::Prim(prim), operands, Vec::new(), outputs.clone());
        Ok(outputs)
    }

    /// Records a fallback call whose outputs' metadata were computed by running torch on meta
    /// tensors.
    pub fn record_fallback(
        &mut self,
        symbol: SymbolId,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        outputs: Vec<TensorMeta>,
    ) -> Vec<ValueId> {
        let ids: Vec<ValueId> =
            outputs.into_iter().map(|m| self.push_value(ValueKind::Tensor(m))).collect();
        self.push_bsym(Symbol::Fallback(symbol), args, kwargs, ids.clone());
        ids
    }

    fn push_bsym(&mut self, symbol: Symbol, args: Vec<Arg>, kwargs: Vec<(String, Arg)>, outputs: Vec<ValueId>) {
        let frame = self.stack.last_mut().expect("the top-level frame is never popped");
        frame.bsyms.push(BoundSymbol { symbol, args, kwargs, outputs, subsymbols: Vec::new() });
    }

    /// Opens a composite call; the calls recorded until [`TraceBuilder::end_composite`] are its
    /// decomposition.
    pub fn begin_composite(&mut self, symbol: SymbolId, args: Vec<Arg>, kwargs: Vec<(String, Arg)>) {
        let first_value = self.values.len() as u32;
        self.stack.push(Frame { call: Some((Symbol::Composite(symbol), args, kwargs)), first_value, bsyms: Vec::new() });
    }

    /// Closes the innermost composite with its outputs. A composite that returns a value it did
    /// not produce (`contiguous` of a contiguous tensor) dissolves into its caller.
    pub fn end_composite(&mut self, outputs: Vec<ValueId>) -> Result<()> {
        if self.stack.len() < 2 {
            bail!(Runtime, "recorder", "end_composite without a matching begin_composite");
        }
        let frame = self.stack.pop().expect("checked above");
        let (symbol, args, kwargs) = frame.call.expect("only the top-level frame has no call");
        let parent = self.stack.last_mut().expect("checked above");
        let produced_inside = !outputs.is_empty() && outputs.iter().all(|o| o.0 >= frame.first_value);
        if produced_inside {
            parent.bsyms.push(BoundSymbol { symbol, args, kwargs, outputs, subsymbols: frame.bsyms });
        } else {
            parent.bsyms.extend(frame.bsyms);
        }
        Ok(())
    }

    /// Drops the innermost open composite and what it recorded (its decomposition failed).
    pub fn abort_composite(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
        }
    }

    pub fn depth(&self) -> usize {
        self.stack.len() - 1
    }

    /// Finishes the recording with the program's outputs.
    pub fn finish(mut self, outputs: Arg) -> Result<Trace> {
        if self.stack.len() != 1 {
            bail!(Runtime, "recorder", "{} composite call(s) still open at the end of the trace", self.stack.len() - 1);
        }
        let top = self.stack.pop().expect("checked above");
        Ok(Trace { values: Arc::new(self.values), inputs: self.inputs, bsyms: top.bsyms, outputs })
    }
}
