//! Bound symbols, traces, and the builder that records them.

use crate::bail;
use crate::error::Result;
use crate::ids::{SymbolId, ValueId};
use crate::prims::{Operand, Prim};
use crate::sym::{Dim, Facts};
use crate::symbols::{SymbolKind, SymbolTable};
use crate::value::{Arg, Kwargs, Scalar, TensorMeta, ValueKind};
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock};

mod snapshot;
pub use snapshot::Segment;

/// What a bound symbol calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Symbol {
    /// A prim with its parameters: its outputs come from the prim's meta rule.
    Prim(Prim),
    /// A registered Python decomposition; its bound symbols carry the decomposition.
    Composite(SymbolId),
    /// A torch call without a decomposition, executed eagerly by torch.
    Fallback(SymbolId),
    /// A fusion region (`inductor_fusion0`): its bound symbols are the calls it runs, handed
    /// together to a fusion executor. Its name is unique within its execution trace.
    Region(Arc<str>),
}

impl Symbol {
    /// The name printed in traces: `prims.add`, `ltorch.softmax`, `torch.cumsum`.
    pub fn qualified_name(&self) -> String {
        match self {
            Symbol::Prim(p) => p.qualified_name(),
            Symbol::Composite(id) | Symbol::Fallback(id) => SymbolTable::name(*id).to_string(),
            Symbol::Region(name) => name.to_string(),
        }
    }

    /// The prim, if this symbol is one (passes that match on prims start here).
    pub fn as_prim(&self) -> Option<&Prim> {
        match self {
            Symbol::Prim(p) => Some(p),
            _ => None,
        }
    }

    /// Whether a call acts on state outside the trace: a random prim (it advances a generator)
    /// or an effect symbol (`torch.manual_seed`). Such calls run on every call in program order:
    /// passes never remove, merge, reorder or recompute them.
    pub fn is_effect(&self) -> bool {
        match self {
            Symbol::Prim(p) => p.is_random(),
            // A region's calls carry their own effects (the partitioner admits none).
            Symbol::Composite(_) | Symbol::Region(_) => false,
            Symbol::Fallback(id) => SymbolTable::kind(*id) == SymbolKind::Effect,
        }
    }
}

/// One recorded call: a symbol, its arguments and outputs, and for a composite its decomposition.
///
/// The decomposition and the grad rule are shared, immutable slices: cloning a bound symbol (every
/// pass that keeps one, the manager at every stage) copies its call, never the calls under it. A
/// pass that changes a decomposition builds a new one (`renamed`, `collect()` into the field).
#[derive(Clone, Debug, PartialEq)]
pub struct BoundSymbol {
    /// What is called.
    pub symbol: Symbol,
    /// For prims, the operands only (parameters live in the [`Prim`]); otherwise the positional
    /// arguments as the caller gave them.
    pub args: Vec<Arg>,
    /// Keyword arguments in the order given (composites and fallbacks only; a prim has none).
    pub kwargs: Vec<(String, Arg)>,
    /// The values this call defines, each defined by no other call of the trace.
    pub outputs: Vec<ValueId>,
    /// A composite's decomposition: the calls it made, printed as nested comments under it. Empty
    /// for prims and fallbacks, and for a composite recorded whole.
    pub subsymbols: Arc<[BoundSymbol]>,
    /// For a composite recorded through a registered grad rule: its backward.
    pub grad: Option<Arc<GradRule>>,
}

/// The empty decomposition, one shared allocation: most calls are prims, and an `Arc<[_]>` of
/// nothing still allocates its counts (a decoded trace paid one allocation per call for it).
pub fn no_subsymbols() -> Arc<[BoundSymbol]> {
    static EMPTY: OnceLock<Arc<[BoundSymbol]>> = OnceLock::new();
    EMPTY.get_or_init(|| Arc::from([])).clone()
}

/// The backward of one composite call, recorded by its Python grad rule (`get_grad`/`put_grad`).
///
/// Its bound symbols read the composite's values and one placeholder per cotangent; the VJP pass
/// replaces the placeholders by the cotangents it accumulated and emits the bound symbols.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GradRule {
    /// `(forward value, placeholder)`: `get_grad(value)` returned the placeholder.
    pub cotangents: Vec<(ValueId, ValueId)>,
    /// The calls of the backward, recorded after `get_grad`, reading the placeholders.
    pub bsyms: Vec<BoundSymbol>,
    /// `(forward value, gradient)`: `put_grad(value, gradient)`.
    pub grads: Vec<(ValueId, Arg)>,
}

impl BoundSymbol {
    /// A call without keyword arguments, decomposition or grad rule.
    pub fn new(symbol: Symbol, args: Vec<Arg>, outputs: Vec<ValueId>) -> Self {
        BoundSymbol { symbol, args, kwargs: Vec::new(), outputs, subsymbols: no_subsymbols(), grad: None }
    }

    /// Whether this call, or any call in its decomposition, acts on state outside the trace
    /// (see [`Symbol::is_effect`]).
    pub fn has_effect(&self) -> bool {
        self.symbol.is_effect() || self.subsymbols.iter().any(BoundSymbol::has_effect)
    }

    /// Calls `f` on every value the symbol reads.
    pub fn for_each_input(&self, mut f: impl FnMut(ValueId)) {
        self.args.iter().for_each(|a| a.for_each_value(&mut f));
        self.kwargs.iter().for_each(|(_, a)| a.for_each_value(&mut f));
    }

    /// Calls `f` on every value this call reads at any depth: its arguments and, for a
    /// composite, what its decomposition and grad rule read besides (values they define
    /// included). A custom `autograd.Function` given a module reads that module's parameters
    /// inside its forward, not through its arguments.
    pub fn for_each_read(&self, f: &mut impl FnMut(ValueId)) {
        self.for_each_input(&mut *f);
        for s in self.subsymbols.iter() {
            s.for_each_read(f);
        }
        if let Some(rule) = &self.grad {
            for s in &rule.bsyms {
                s.for_each_read(f);
            }
        }
    }

    /// The values this call reads, in argument order, repeats kept (see
    /// [`for_each_input`](Self::for_each_input) to avoid the allocation).
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

    /// Whether this call reads any value of `subst` at any depth (decomposition and grad rule
    /// included).
    pub fn reads_any(&self, subst: &FxHashMap<ValueId, ValueId>) -> bool {
        if subst.is_empty() {
            return false;
        }
        let mut found = false;
        self.for_each_input(|v| found |= subst.contains_key(&v));
        found
            || matches!(&self.symbol, Symbol::Prim(p) if p.params_read(&mut |v| subst.contains_key(&v)))
            || self.subsymbols.iter().any(|s| s.reads_any(subst))
            || self.grad.as_ref().is_some_and(|rule| {
                rule.bsyms.iter().any(|s| s.reads_any(subst))
                    || rule.grads.iter().any(|(_, g)| {
                        let mut hit = false;
                        g.for_each_value(&mut |v| hit |= subst.contains_key(&v));
                        hit
                    })
            })
    }

    /// The same call with its inputs and outputs renamed by `subst` at every depth (a pass that
    /// renumbers values).
    pub fn renamed_everywhere(&self, subst: &FxHashMap<ValueId, ValueId>) -> BoundSymbol {
        let mut out = self.renamed(subst);
        out.outputs = self.outputs.iter().map(|v| *subst.get(v).unwrap_or(v)).collect();
        out.subsymbols = self.subsymbols.iter().map(|s| s.renamed_everywhere(subst)).collect();
        out
    }

    /// The same call with its inputs renamed by `subst`, at every depth (decomposition and grad
    /// rule included). Values not in `subst` keep their names; a call that reads none of them is
    /// returned shared, not rebuilt (checking costs less than copying every argument).
    pub fn renamed(&self, subst: &FxHashMap<ValueId, ValueId>) -> BoundSymbol {
        if !self.reads_any(subst) {
            return self.clone();
        }
        let mut f = |v: ValueId| Arg::Value(*subst.get(&v).unwrap_or(&v));
        let mut out = self.map_inputs(&mut f);
        // A prim's parameters read the size values of its symbolic ones (a slice from `t0`).
        if let Symbol::Prim(p) = &self.symbol {
            if p.params_read(&mut |v| subst.contains_key(&v)) {
                let renamed = p.with_params_mapped(&out.args, &mut f);
                out.symbol = Symbol::Prim(renamed.expect("a prim's parameters decode as they print"));
            }
        }
        if !self.subsymbols.is_empty() {
            out.subsymbols = self.subsymbols.iter().map(|s| s.renamed(subst)).collect();
        }
        // A rule's gradients go to the composite's inputs: renamed with them (CSE merging two
        // equal inputs, `linear(x[0], x[0])`, must send both gradients to the one kept).
        let rename = |v: &ValueId| *subst.get(v).unwrap_or(v);
        out.grad = self.grad.as_ref().map(|rule| {
            Arc::new(GradRule {
                cotangents: rule.cotangents.iter().map(|(v, p)| (rename(v), *p)).collect(),
                bsyms: rule.bsyms.iter().map(|b| b.renamed(subst)).collect(),
                grads: rule.grads.iter().map(|(v, g)| (rename(v), g.map_values(&mut f))).collect(),
            })
        });
        out
    }

    /// Calls `f` on every value this call defines: its outputs and, for a composite, every value
    /// its decomposition defines (the values a VJP may read from inside it).
    pub fn for_each_defined(&self, f: &mut impl FnMut(ValueId)) {
        if self.subsymbols.is_empty() {
            self.outputs.iter().for_each(|&v| f(v));
        } else {
            // A composite's outputs are defined inside its decomposition.
            self.subsymbols.iter().for_each(|s| s.for_each_defined(f));
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
            grad: self.grad.clone(),
        }
    }
}

/// A recorded program: values, inputs, top-level bound symbols in topological order, outputs.
///
/// A trace is immutable once built: a pass reads one and returns a new one (cloning shares the
/// value arena and every decomposition). It prints in Thunder's format ([`std::fmt::Display`],
/// [`crate::printer::print_trace`]), reads back with [`crate::parser::parse_trace`], and
/// [`crate::verify::verify`] checks it.
///
/// ```
/// use trace_ir::parser::parse_trace;
///
/// let text = "def computation(t0):\n  # t0: \"cpu f32[4]\"\n  t1 = prims.exp(t0)  # t1: \"cpu f32[4]\"\n  return t1\n";
/// let trace = parse_trace(text)?;
/// assert_eq!(trace.inputs.len(), 1);
/// assert_eq!(trace.bsyms[0].symbol.qualified_name(), "prims.exp");
/// assert_eq!(trace.tensor(trace.bsyms[0].outputs[0]).unwrap().hints(), vec![4]);
/// assert!(trace.to_string().ends_with(text)); // after a header of imports
/// # Ok::<(), trace_ir::IrError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The arena of values, indexed by [`ValueId`]: inputs and every output at every depth. Shared
    /// between a trace and the traces passes derive from it (`Arc`), so a pass that only drops or
    /// reorders calls copies no metadata.
    pub values: Arc<Vec<ValueKind>>,
    /// The program's parameters, in order (printed as the `def` line's arguments).
    pub inputs: Vec<ValueId>,
    /// The top-level calls in topological order: each reads only inputs and values defined above.
    pub bsyms: Vec<BoundSymbol>,
    /// What the program returns: a value, or a tuple or list of them and literals.
    pub outputs: Arg,
    /// The relations between symbolic sizes that recording and passes decided on hints alone:
    /// guards the compiled program checks on each call. Empty for a trace of constant sizes.
    pub facts: Arc<Facts>,
}

impl Trace {
    /// The metadata of `id`.
    ///
    /// # Panics
    /// If `id` is not a value of this trace.
    pub fn value(&self, id: ValueId) -> &ValueKind {
        &self.values[id.index()]
    }

    /// The metadata of `id` if it is a tensor of this trace; `None` for a number or an unknown id.
    pub fn tensor(&self, id: ValueId) -> Option<&TensorMeta> {
        self.values.get(id.index()).and_then(ValueKind::as_tensor)
    }

    /// The same program with other bound symbols (values and inputs shared).
    pub fn with_bsyms(&self, bsyms: Vec<BoundSymbol>, outputs: Arg) -> Trace {
        Trace { values: self.values.clone(), inputs: self.inputs.clone(), bsyms, outputs, facts: self.facts.clone() }
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
    /// Set once the composite's grad rule asks for a cotangent: from then on calls are recorded
    /// into the backward.
    grad: Option<GradRule>,
}

impl Frame {
    fn new(call: Option<(Symbol, Vec<Arg>, Kwargs)>, first_value: u32) -> Self {
        Frame { call, first_value, bsyms: Vec::new(), grad: None }
    }

    /// The calls [`sink`](Self::sink) holds.
    fn sunk(&self) -> &[BoundSymbol] {
        match &self.grad {
            Some(rule) => &rule.bsyms,
            None => &self.bsyms,
        }
    }

    fn recorded(&self) -> usize {
        self.sunk().len()
    }

    /// Where the next call is recorded: the decomposition, or the backward once it has begun.
    fn sink(&mut self) -> &mut Vec<BoundSymbol> {
        match &mut self.grad {
            Some(rule) => &mut rule.bsyms,
            None => &mut self.bsyms,
        }
    }
}

/// [`TraceBuilder::relabel_since`] over `bsyms`, decompositions first. Returns a composite
/// recorded whole (an executor's backward kernel) whose outputs now require grad where the VJP
/// pass would differentiate it (`differentiated`: not inside a composite with a grad rule),
/// which it cannot.
fn relabel(values: &mut [ValueKind], bsyms: &[BoundSymbol], enabled: bool, differentiated: bool) -> Option<Symbol> {
    let wants =
        |values: &[ValueKind], v: ValueId| matches!(&values[v.index()], ValueKind::Tensor(t) if t.requires_grad);
    let mut whole = None;
    for bsym in bsyms {
        let inner = relabel(values, &bsym.subsymbols, enabled, differentiated && bsym.grad.is_none());
        whole = whole.or(inner);
        let mut from_input = false;
        bsym.for_each_input(|v| from_input |= wants(values, v));
        let mut defined = false;
        for &o in &bsym.outputs {
            if bsym.args.contains(&Arg::Value(o)) || !bsym.subsymbols.is_empty() {
                continue; // (defined by its decomposition, or not by this call)
            }
            if let ValueKind::Tensor(t) = &mut values[o.index()] {
                t.requires_grad &= enabled && from_input;
                defined |= t.requires_grad;
            }
        }
        let is_whole = matches!(bsym.symbol, Symbol::Composite(_)) && bsym.grad.is_none() && bsym.subsymbols.is_empty();
        if differentiated && is_whole && defined && whole.is_none() {
            whole = Some(bsym.symbol.clone());
        }
    }
    whole
}

/// The composite calls one thread has open, innermost last, taken off a [`TraceBuilder`] while
/// another thread records: a program's worker threads trace ops too, and each thread's calls
/// belong in its own open calls, whatever another thread opened meanwhile. A composite reaches
/// its caller when it ends, after whatever its inputs came from, so the trace stays in order.
pub struct OpenCalls(Vec<Frame>);

impl OpenCalls {
    /// Whether no composite call is open.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many composite calls are open, outermost included.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Records a trace call by call, as Python acquisition runs the program on proxies.
///
/// Each recorded prim's outputs come from its meta rule, so a builder never holds a call whose
/// shapes or dtypes disagree with its operands: [`record`](Self::record) returns the meta
/// rule's error instead. Passes that emit new calls resume a builder over an existing trace
/// ([`resume`](Self::resume)).
///
/// ```
/// use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder, ValueKind};
///
/// let mut b = TraceBuilder::new();
/// let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 3])));
/// let e = b.record_prim("exp", vec![Arg::Value(x)])?[0];
/// let y = b.record_prim("add", vec![Arg::Value(e), Arg::Value(x)])?[0];
/// let trace = b.finish(Arg::Value(y))?;
/// trace_ir::verify::verify(&trace)?;
/// assert_eq!(trace.bsyms.len(), 2);
///
/// // A meta rule refuses operands that disagree, naming the prim.
/// let mut b = TraceBuilder::new();
/// let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2])));
/// let z = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![3])));
/// let error = b.record_prim("add", vec![Arg::Value(x), Arg::Value(z)]).unwrap_err();
/// assert_eq!(error.op, "prims.add");
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub struct TraceBuilder {
    values: Vec<ValueKind>,
    inputs: Vec<ValueId>,
    stack: Vec<Frame>,
    /// torch's grad mode while the calls being recorded ran: when it is off, their outputs do
    /// not require grad, so the VJP pass stops there (`torch.no_grad()` regions).
    grad_enabled: bool,
    /// What meta and VJP rules decided on symbolic sizes' hints alone.
    facts: Facts,
    /// Whether some value is a size (only then are arguments searched for sizes).
    has_sizes: bool,
    /// Size values made by [`TraceBuilder::add_size`]: the trace's last inputs but floats.
    sizes: Vec<ValueId>,
    /// Float inputs made by [`TraceBuilder::add_float_input`]: the trace's last inputs.
    floats: Vec<ValueId>,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        TraceBuilder {
            values: Vec::new(),
            inputs: Vec::new(),
            stack: vec![Frame::new(None, 0)],
            grad_enabled: true,
            facts: Facts::default(),
            has_sizes: false,
            sizes: Vec::new(),
            floats: Vec::new(),
        }
    }
}

impl TraceBuilder {
    /// An empty builder recording at top level with grad mode on.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder over the values of `trace` that records new calls after them (for passes that
    /// emit code, such as the VJP). Its inputs start as the trace's inputs.
    pub fn resume(trace: &Trace) -> Self {
        TraceBuilder {
            values: trace.values.as_ref().clone(),
            inputs: trace.inputs.clone(),
            stack: vec![Frame::new(None, trace.values.len() as u32)],
            grad_enabled: true,
            facts: trace.facts.as_ref().clone(),
            has_sizes: trace.values.iter().any(|k| matches!(k, ValueKind::Size(_))),
            sizes: Vec::new(),
            floats: Vec::new(),
        }
    }

    /// The guards recorded so far (see [`Trace::facts`]).
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// The guards, for rules that decide on symbolic sizes (see [`Facts`]).
    pub fn facts_mut(&mut self) -> &mut Facts {
        &mut self.facts
    }

    /// Sets the grad mode under which the following calls are recorded.
    pub fn set_grad_enabled(&mut self, enabled: bool) {
        self.grad_enabled = enabled;
    }

    /// The grad mode calls are being recorded under (see
    /// [`set_grad_enabled`](Self::set_grad_enabled)).
    pub fn grad_enabled(&self) -> bool {
        self.grad_enabled
    }

    /// Whether the tensor `value` requires grad, as a differentiating transform's level sees it
    /// (which eager's `requires_grad_` checks do not apply to): `Recorder.differentiate_values`.
    pub fn label_requires_grad(&mut self, value: ValueId, flag: bool) {
        if let Some(ValueKind::Tensor(t)) = self.values.get_mut(value.index()) {
            t.requires_grad = flag;
        }
    }

    /// `tensor.requires_grad_(flag)` on a recorded value: later calls that read it follow the
    /// new flag, earlier ones keep theirs (as in eager).
    pub fn set_requires_grad(&mut self, value: ValueId, flag: bool) -> Result<()> {
        if self.inputs.contains(&value) {
            bail!(
                NotImplemented,
                "requires_grad_",
                "changing requires_grad of a tensor the traced program takes as input changes the caller's tensor, \
                 which thunder_rs does not support; set it before the call"
            );
        }
        match self.values.get_mut(value.index()) {
            Some(ValueKind::Tensor(t)) if !flag && t.requires_grad => bail!(
                Runtime,
                "requires_grad_",
                "you can only change requires_grad flags of leaf variables. If you want to use a computed variable \
                 in a subgraph that doesn't require differentiation use var_no_grad = var.detach()."
            ),
            Some(ValueKind::Tensor(t)) if flag && !t.dtype.is_inexact() => {
                bail!(
                    Runtime,
                    "requires_grad_",
                    "only Tensors of floating point and complex dtype can require gradients"
                )
            }
            Some(ValueKind::Tensor(t)) => {
                t.requires_grad = flag;
                Ok(())
            }
            _ => bail!(Type, "requires_grad_", "expected a tensor, got {value}"),
        }
    }

    /// The metadata of a value recorded so far; `None` for an id the builder has not given out.
    pub fn value(&self, id: ValueId) -> Option<&ValueKind> {
        self.values.get(id.index())
    }

    /// How many values have been recorded; the next value gets this id.
    pub fn num_values(&self) -> usize {
        self.values.len()
    }

    fn push_value(&mut self, kind: ValueKind) -> ValueId {
        self.has_sizes |= matches!(kind, ValueKind::Size(_));
        self.values.push(kind);
        ValueId(self.values.len() as u32 - 1)
    }

    /// Adds a size read from the program's inputs when it runs (`hint` now): a parameter that
    /// comes after all those [`TraceBuilder::add_input`] adds, whenever it is made, so that the
    /// other inputs keep their positions (the caller appends the sizes to its arguments).
    pub fn add_size(&mut self, hint: i64) -> ValueId {
        let v = self.push_value(ValueKind::Size(hint));
        self.sizes.push(v);
        v
    }

    /// Adds a size that a call of the trace computes from values (the count of `nonzero`'s
    /// indices, `hint` now): defined by the call that [`TraceBuilder::record_given`] records with
    /// it among its `sizes`, not an input. The caller checks, where the call made it, what the
    /// trace relied on about it.
    /// It is a count ([`crate::sym::Facts::count`]): the program may see it at 0 or 1.
    pub fn add_unbacked_size(&mut self, hint: i64) -> ValueId {
        let v = self.push_value(ValueKind::Size(hint));
        self.facts.count(v);
        v
    }

    /// The sizes [`TraceBuilder::add_size`] made, in order.
    pub fn size_inputs(&self) -> &[ValueId] {
        &self.sizes
    }

    /// Adds a float the program is called with that changes between calls (`hint` now): a
    /// parameter after all others, sizes included, whenever it is made; symbolic floats read it
    /// ([`crate::symfloat::FloatExpr::Input`]).
    pub fn add_float_input(&mut self, hint: f64) -> ValueId {
        let v = self.push_value(ValueKind::Number(Scalar::Float(hint)));
        self.floats.push(v);
        v
    }

    /// The inputs, the sizes of [`TraceBuilder::add_size`] and then the floats of
    /// [`TraceBuilder::add_float_input`] last.
    fn all_inputs(&self) -> Vec<ValueId> {
        self.inputs.iter().chain(&self.sizes).chain(&self.floats).copied().collect()
    }

    /// Adds a parameter of the program (in `def` order) and returns its value.
    pub fn add_input(&mut self, kind: ValueKind) -> ValueId {
        let id = self.push_value(kind);
        self.inputs.push(id);
        id
    }

    /// `Arg::Value(v)`, or the symbolic int `v` when `v` is a size value: sizes are written as
    /// symbolic ints wherever they are arguments, so one form is matched and decoded.
    pub fn sized(&self, v: ValueId) -> Arg {
        match self.value(v) {
            Some(ValueKind::Size(hint)) => Arg::dim(&Dim::size(v, *hint)),
            _ => Arg::Value(v),
        }
    }

    /// Records `prims.<name>(*args)`, computing its outputs with the prim's meta rule.
    pub fn record_prim(&mut self, name: &str, args: Vec<Arg>) -> Result<Vec<ValueId>> {
        // Only a trace with size values pays for looking for them.
        let args = match self.has_sizes {
            true => args.iter().map(|a| a.map_values(&mut |v| self.sized(v))).collect(),
            false => args,
        };
        let (prim, operands) = Prim::from_call(name, args)?;
        self.record(prim, operands)
    }

    /// Records `prim` on `operands`, computing its outputs with the prim's meta rule. Outputs
    /// require grad when grad mode is on, an operand requires grad and their dtype is inexact.
    pub fn record(&mut self, prim: Prim, operands: Vec<Arg>) -> Result<Vec<ValueId>> {
        let op = prim.qualified_name();
        let resolved: Vec<Operand> =
            operands.iter().map(|a| Operand::of(&self.values, &op, a)).collect::<Result<_>>()?;
        let requires_grad = self.grad_enabled
            && prim.is_differentiable()
            && resolved.iter().any(|o| matches!(o, Operand::Tensor(t) if t.requires_grad));
        // A failed call leaves the guards as they were.
        let before = self.facts.guards().len();
        let metas = prim.meta(&resolved, &mut self.facts);
        if metas.is_err() {
            self.facts.truncate(before);
        }
        let metas = metas?;
        let outputs = metas
            .into_iter()
            .map(|mut m| {
                m.requires_grad = requires_grad && m.dtype.is_inexact();
                self.push_value(ValueKind::Tensor(m))
            })
            .collect::<Vec<_>>();
        self.push_bsym(BoundSymbol::new(Symbol::Prim(prim), operands, outputs.clone()));
        Ok(outputs)
    }

    /// Records an already-built call (a pass copying a bound symbol into a new trace).
    pub fn push_bsym(&mut self, bsym: BoundSymbol) {
        let frame = self.stack.last_mut().expect("the top-level frame is never popped");
        frame.sink().push(bsym);
    }

    /// Adds a value defined by no call (a placeholder the caller substitutes later).
    pub fn add_value(&mut self, kind: ValueKind) -> ValueId {
        self.push_value(kind)
    }

    /// The bound symbols recorded at top level so far, removed from the builder.
    pub fn take_bsyms(&mut self) -> Vec<BoundSymbol> {
        std::mem::take(&mut self.stack[0].bsyms)
    }

    /// The values and inputs recorded so far, for a trace built from
    /// [`TraceBuilder::take_bsyms`].
    pub fn into_parts(self) -> (Vec<ValueKind>, Vec<ValueId>) {
        (self.values, self.inputs)
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
        self.record_given(Symbol::Fallback(symbol), args, kwargs, outputs)
    }

    /// Records a call of `symbol` with outputs of the given metadata: a fallback, or a composite
    /// recorded whole, without its decomposition (an executor runs it whole, and the VJP pass
    /// refuses to differentiate it).
    pub fn record_given(
        &mut self,
        symbol: Symbol,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        outputs: Vec<TensorMeta>,
    ) -> Vec<ValueId> {
        self.record_sized(symbol, args, kwargs, outputs, Vec::new())
    }

    /// [`TraceBuilder::record_given`] of a call that also defines `sizes` (made by
    /// [`TraceBuilder::add_unbacked_size`]; the outputs' shapes may read them): its outputs are
    /// the tensors, then those sizes. Returns the tensors' ids.
    pub fn record_sized(
        &mut self,
        symbol: Symbol,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
        outputs: Vec<TensorMeta>,
        sizes: Vec<ValueId>,
    ) -> Vec<ValueId> {
        let ids: Vec<ValueId> = outputs.into_iter().map(|m| self.push_value(ValueKind::Tensor(m))).collect();
        let mut bsym = BoundSymbol::new(symbol, args, ids.iter().chain(&sizes).copied().collect());
        bsym.kwargs = kwargs;
        self.push_bsym(bsym);
        ids
    }

    /// Opens a composite call; the calls recorded until [`TraceBuilder::end_composite`] are its
    /// decomposition.
    pub fn begin_composite(&mut self, symbol: SymbolId, args: Vec<Arg>, kwargs: Vec<(String, Arg)>) {
        let first_value = self.values.len() as u32;
        self.stack.push(Frame::new(Some((Symbol::Composite(symbol), args, kwargs)), first_value));
    }

    /// The innermost open composite, which a grad rule's `get_grad`/`put_grad` refer to.
    fn rule_frame(&mut self, op: &str) -> Result<&mut Frame> {
        if self.stack.len() < 2 {
            bail!(Runtime, op, "can only be called inside a grad rule registered with register_grad");
        }
        Ok(self.stack.last_mut().expect("checked above"))
    }

    /// `get_grad(value)` in a grad rule: a placeholder for the cotangent of `value`. The calls
    /// recorded from now on until the composite ends form its backward.
    pub fn get_grad(&mut self, value: ValueId) -> Result<ValueId> {
        let Some(ValueKind::Tensor(meta)) = self.value(value) else {
            bail!(Type, "get_grad", "expected a tensor produced by the rule's forward, got {value}");
        };
        let meta = TensorMeta { requires_grad: false, ..meta.clone() };
        let placeholder = self.push_value(ValueKind::Tensor(meta));
        let frame = self.rule_frame("get_grad")?;
        frame.grad.get_or_insert_with(GradRule::default).cotangents.push((value, placeholder));
        Ok(placeholder)
    }

    /// `put_grad(value, grad)` in a grad rule: `grad` is the gradient of `value`, an input of
    /// the composite.
    pub fn put_grad(&mut self, value: ValueId, grad: Arg) -> Result<()> {
        let frame = self.rule_frame("put_grad")?;
        frame.grad.get_or_insert_with(GradRule::default).grads.push((value, grad));
        Ok(())
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
        if produced_inside || frame.grad.is_some() {
            let grad = frame.grad.map(Arc::new);
            let subsymbols = frame.bsyms.into();
            parent.sink().push(BoundSymbol { symbol, args, kwargs, outputs, subsymbols, grad });
        } else {
            parent.sink().extend(frame.bsyms);
        }
        Ok(())
    }

    /// How many calls the innermost open call (or the top level) has recorded so far: a mark
    /// that [`recorded_since`](Self::recorded_since) and [`rewind`](Self::rewind) take.
    pub fn mark(&self) -> usize {
        self.stack.last().map_or(0, Frame::recorded)
    }

    /// The calls recorded at the current level since `mark`.
    pub fn recorded_since(&self, mark: usize) -> &[BoundSymbol] {
        let frame = self.stack.last().expect("the top-level frame is never popped");
        frame.sunk().get(mark..).unwrap_or(&[])
    }

    /// Drops the calls recorded at the current level since `mark` (a transform traced them, then
    /// runs eagerly instead); their values stay defined by no call.
    pub fn rewind(&mut self, mark: usize) {
        let frame = self.stack.last_mut().expect("the top-level frame is never popped");
        frame.sink().truncate(mark);
    }

    /// Recomputes whether the values the calls since `mark` define require grad, in order, as
    /// the level outside a transform sees them: a value requires grad where it did, grad mode
    /// was `enabled` and one of its call's inputs requires grad now. A differentiating transform
    /// (`torch.func.grad`) traced its function with its inputs requiring grad, which its
    /// outputs need not outside it. Refuses (after relabelling) a composite recorded whole that a
    /// gradient would now have to go through: the VJP pass cannot differentiate it.
    pub fn relabel_since(&mut self, mark: usize, enabled: bool) -> Result<()> {
        let bsyms = self.recorded_since(mark).to_vec();
        match relabel(&mut self.values, &bsyms, enabled, true) {
            Some(symbol) => bail!(
                NotImplemented,
                "differentiate",
                "{} was recorded without its decomposition, which a gradient through it needs",
                symbol.qualified_name()
            ),
            None => Ok(()),
        }
    }

    /// Drops the innermost open composite and what it recorded (its decomposition failed).
    pub fn abort_composite(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
        }
    }

    /// Whether a call recorded so far reads `value` (at top level, in an open composite's
    /// decomposition, or as an argument of an open composite).
    pub fn is_read(&self, value: ValueId) -> bool {
        self.stack.iter().any(|frame| {
            let mut read = false;
            if let Some((_, args, kwargs)) = &frame.call {
                args.iter()
                    .chain(kwargs.iter().map(|(_, a)| a))
                    .for_each(|a| a.for_each_value(&mut |v| read |= v == value));
            }
            frame.bsyms.iter().for_each(|b| b.for_each_input(|v| read |= v == value));
            read
        })
    }

    /// How many composite calls are open: 0 while recording at top level.
    pub fn depth(&self) -> usize {
        self.stack.len() - 1
    }

    /// Takes the open composite calls off the builder, which then records at the top level.
    pub fn take_open(&mut self) -> OpenCalls {
        OpenCalls(self.stack.split_off(1))
    }

    /// Puts back calls [`TraceBuilder::take_open`] took; the builder must have none open.
    pub fn restore_open(&mut self, open: OpenCalls) -> Result<()> {
        if self.stack.len() != 1 {
            bail!(Runtime, "recorder", "restore_open while {} composite call(s) are open", self.stack.len() - 1);
        }
        self.stack.extend(open.0);
        Ok(())
    }

    /// Finishes the recording with the program's outputs.
    pub fn finish(mut self, outputs: Arg) -> Result<Trace> {
        if self.stack.len() != 1 {
            bail!(Runtime, "recorder", "{} composite call(s) still open at the end of the trace", self.stack.len() - 1);
        }
        let top = self.stack.pop().expect("checked above");
        let inputs = self.all_inputs();
        Ok(Trace { values: Arc::new(self.values), inputs, bsyms: top.bsyms, outputs, facts: Arc::new(self.facts) })
    }
}
