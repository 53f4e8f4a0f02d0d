//! `Recorder`: the Python handle on a [`TraceBuilder`] during acquisition.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::collections::HashSet;
use std::thread::{self, ThreadId};
use trace_ir::{
    BoundSymbol, ErrorKind, IrError, OpenCalls, Scalar, Symbol, SymbolId, TraceBuilder, ValueId, ValueKind,
};

use crate::convert::{tensor_meta, to_arg, to_args, to_kwargs, types};
use crate::errors::{no_panic, py_result, PyIrError};
use crate::records::{PyTensorMeta, RecordedTensor};
use crate::sizes::{dim_of, dim_to_py};
use crate::trace::PyTrace;

/// A segment of a recording for Python: its trace, the known tensors it takes, what it returns.
type Segmented = (PyTrace, Vec<usize>, Vec<u32>, Vec<u32>, Vec<u32>);

/// Records one trace. Python calls one method per prim, composite boundary or fallback.
///
/// Not `unsendable`: the recording is found through a context variable, which a program may
/// carry to worker threads (`contextvars.copy_context().run` in a thread pool), and a traced op
/// there records into the same trace, as eager computes it there (an `unsendable` class would
/// panic instead, in PyO3's own trampoline where no `no_panic` can catch it). Each thread's
/// calls nest in the composite calls that thread opened: the builder holds those of the thread
/// that recorded last, the others wait in `parked`.
#[pyclass(module = "thunder_rs._core", name = "Recorder")]
pub struct Recorder {
    builder: Option<TraceBuilder>,
    consts: Vec<Py<PyAny>>,
    thread: ThreadId,
    parked: Vec<(ThreadId, OpenCalls)>,
    /// For each guard recorded so far, in order: its text and where the program took the
    /// decision that added it (`core.lang.langctx.decision_site`), for miss reasons.
    sites: Vec<(String, Py<PyAny>)>,
}

/// `thunder_rs.core.lang.langctx.decision_site`, imported at the first guard a recording adds.
static DECISION_SITE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl Recorder {
    /// The builder, holding the calling thread's open composite calls.
    fn builder(&mut self) -> PyResult<&mut TraceBuilder> {
        let builder = self.builder.as_mut().ok_or_else(|| PyRuntimeError::new_err("the recording is finished"))?;
        let me = thread::current().id();
        if me != self.thread {
            let open = builder.take_open();
            if !open.is_empty() {
                self.parked.push((self.thread, open));
            }
            if let Some(i) = self.parked.iter().position(|(t, _)| *t == me) {
                py_result(builder.restore_open(self.parked.swap_remove(i).1))?;
            }
            self.thread = me;
        }
        Ok(builder)
    }

    /// Records `symbol` with outputs of the given metadata, then `sizes`; describes the tensors.
    fn record_call(
        &mut self,
        py: Python<'_>,
        symbol: Symbol,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        outputs: Vec<Bound<'_, PyTensorMeta>>,
        sizes: Vec<ValueId>,
    ) -> PyResult<Vec<RecordedTensor>> {
        let types = types(py)?;
        let args = to_args(args, types, &mut self.consts)?;
        let kwargs = to_kwargs(kwargs, types, &mut self.consts)?;
        let metas = outputs.iter().map(|meta| meta.get().meta.clone()).collect();
        let builder = self.builder()?;
        let ids = no_panic("call", || Ok(builder.record_sized(symbol, args, kwargs, metas, sizes)))?;
        self.describe(&ids)
    }

    /// Notes where the program is (the user's line, the op it called) for each guard the last
    /// call added: the decision that relied on it was taken there. A call adds none most of the
    /// time, which costs a comparison; a failed call dropped the guards it added.
    fn note_sites(&mut self, py: Python<'_>) -> PyResult<()> {
        let Some(builder) = self.builder.as_ref() else { return Ok(()) };
        let guards = builder.facts().guards();
        if guards.len() <= self.sites.len() {
            self.sites.truncate(guards.len());
            return Ok(());
        }
        let site_of = DECISION_SITE.get_or_try_init(py, || {
            py.import("thunder_rs.core.lang.langctx")?.getattr("decision_site").map(Bound::unbind)
        })?;
        // Diagnostics only: a site that cannot be found is unknown, the recording goes on.
        let site = site_of.bind(py).call0().map_or_else(|_| py.None(), Bound::unbind);
        let added = guards[self.sites.len()..].iter().map(|g| (g.to_string(), site.clone_ref(py)));
        let added: Vec<_> = added.collect();
        self.sites.extend(added);
        Ok(())
    }

    /// A segment of the recording (`TraceBuilder::segment`, or `last_segment` unless `every`).
    fn segment_of(
        &mut self,
        wanted: Vec<u32>,
        known: Vec<u32>,
        checks: Vec<u32>,
        every: bool,
    ) -> PyResult<Option<Segmented>> {
        let builder = self.builder()?;
        let wanted: Vec<ValueId> = wanted.into_iter().map(ValueId).collect();
        let known = known.into_iter().map(ValueId).collect();
        let checks: Vec<SymbolId> = checks.into_iter().map(SymbolId).collect();
        let segment = no_panic("segment", || {
            py_result(if every {
                builder.segment(&wanted, &known, &checks)
            } else {
                builder.last_segment(&wanted, &known, &checks)
            })
        })?;
        let ids = |vs: Vec<ValueId>| vs.into_iter().map(|v| v.0).collect();
        Ok(segment
            .map(|s| (PyTrace::new(s.trace, "snapshot"), s.taken, ids(s.known_inputs), ids(s.sizes), ids(s.returned))))
    }

    /// What Python builds each output's proxy from.
    fn describe(&self, outputs: &[ValueId]) -> PyResult<Vec<RecordedTensor>> {
        let builder = self.builder.as_ref().expect("describe runs while recording");
        let describe = |&v: &ValueId| match builder.value(v) {
            Some(ValueKind::Tensor(t)) => Ok(RecordedTensor::new(v, t.clone())),
            _ => Err(PyRuntimeError::new_err(format!("{v} is not a tensor"))),
        };
        outputs.iter().map(describe).collect()
    }
}

#[pymethods]
impl Recorder {
    #[new]
    fn new() -> Self {
        Recorder {
            builder: Some(TraceBuilder::new()),
            consts: Vec::new(),
            thread: thread::current().id(),
            parked: Vec::new(),
            sites: Vec::new(),
        }
    }

    /// Adds a tensor input; returns its value id. Its sizes are ints or `SymExpr`s of size
    /// inputs added before it.
    fn tensor_input(
        &mut self,
        dtype: u8,
        device: &str,
        shape: Vec<Bound<'_, PyAny>>,
        requires_grad: bool,
    ) -> PyResult<u32> {
        let mut meta = tensor_meta(dtype, device, Vec::new(), requires_grad)?;
        meta.shape = shape.iter().map(dim_of).collect::<PyResult<_>>()?;
        let builder = self.builder()?;
        no_panic("tensor_input", || Ok(builder.add_input(ValueKind::Tensor(meta)).0))
    }

    /// Adds a size input: an int read from the inputs when the program runs, `hint` now. Sizes
    /// are the trace's last inputs, in the order made, whenever they are made.
    fn size_input(&mut self, py: Python<'_>, hint: i64) -> PyResult<Py<PyAny>> {
        if hint < 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("a size is never negative, got {hint}")));
        }
        let builder = self.builder()?;
        let v = builder.add_size(hint);
        Ok(dim_to_py(py, &trace_ir::Dim::size(v, hint))?.unbind())
    }

    /// Adds a size that the next `call` given it among its `sizes` computes from values (the
    /// count of `nonzero`'s indices), `hint` now.
    fn unbacked_size(&mut self, py: Python<'_>, hint: i64) -> PyResult<Py<PyAny>> {
        if hint < 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!("a size is never negative, got {hint}")));
        }
        let v = self.builder()?.add_unbacked_size(hint);
        Ok(dim_to_py(py, &trace_ir::Dim::size(v, hint))?.unbind())
    }

    /// The size inputs made so far, as sizes (`SymExpr`s), in order.
    fn size_inputs(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let builder = self.builder()?;
        let sizes = builder.size_inputs().to_vec();
        let hint = |v: ValueId| match builder.value(v) {
            Some(ValueKind::Size(h)) => *h,
            _ => 0,
        };
        sizes.into_iter().map(|v| Ok(dim_to_py(py, &trace_ir::Dim::size(v, hint(v)))?.unbind())).collect()
    }

    /// The size value `value` alone, with the size it was traced at: what `SymExpr.values()`
    /// names, for code that rebuilds a size from its values (a fallback's symbolic metadata); a
    /// float input's value when traced.
    fn size_value(&mut self, py: Python<'_>, value: u32) -> PyResult<Py<PyAny>> {
        let v = ValueId(value);
        match self.builder()?.value(v) {
            Some(ValueKind::Size(hint)) => Ok(dim_to_py(py, &trace_ir::Dim::size(v, *hint))?.unbind()),
            Some(ValueKind::Number(Scalar::Float(hint))) => Ok(hint.into_pyobject(py)?.into_any().unbind()),
            _ => {
                Err(pyo3::exceptions::PyValueError::new_err(format!("t{value} is not a size value of this recording")))
            }
        }
    }

    /// Decides `a <op> b` (`eq`, `ne`, `lt`, `le`, `gt`, `ge`) for sizes (ints or `SymExpr`s)
    /// on their hints, recording the guard the answer relies on.
    fn decide(&mut self, op: &str, a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = a.py();
        let (a, b) = (dim_of(a)?, dim_of(b)?);
        // The facts compare by the difference: past int64, the caller decides on the values.
        if a.checked_sub(&b).is_none() {
            return Err(pyo3::exceptions::PyOverflowError::new_err(format!("the sizes {a} and {b} differ past int64")));
        }
        let facts = self.builder()?.facts_mut();
        let answer = match op {
            "eq" => facts.equal(&a, &b),
            "ne" => !facts.equal(&a, &b),
            "lt" => facts.lt(&a, &b),
            "le" => facts.le(&a, &b),
            "gt" => facts.lt(&b, &a),
            "ge" => facts.le(&b, &a),
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!("decide: unknown comparison {other}")))
            }
        };
        self.note_sites(py)?;
        Ok(answer)
    }

    /// The hint of a size, assumed from now on (a guard): where the program needs a plain int.
    fn specialise(&mut self, a: &Bound<'_, PyAny>) -> PyResult<i64> {
        let py = a.py();
        let a = dim_of(a)?;
        let value = self.builder()?.facts_mut().specialise(&a);
        self.note_sites(py)?;
        Ok(value)
    }

    /// The guards recorded, each with where the program took the decision that added it:
    /// `[(guard text, site)]` in the order recorded (`core.lang.langctx.decision_site`).
    fn guard_sites(&self, py: Python<'_>) -> Vec<(String, Py<PyAny>)> {
        self.sites.iter().map(|(g, site)| (g.clone(), site.clone_ref(py))).collect()
    }

    /// Adds a float input: a float argument read from the call when the program runs, `hint`
    /// now. Float inputs are the trace's last inputs (after the sizes), in the order made.
    fn float_input(&mut self, hint: f64) -> PyResult<u32> {
        let builder = self.builder()?;
        no_panic("float_input", || Ok(builder.add_float_input(hint).0))
    }

    /// Adds a number input, specialised on `value`.
    fn number_input(&mut self, value: &Bound<'_, PyAny>) -> PyResult<u32> {
        let py = value.py();
        let scalar = match to_arg(value, types(py)?, &mut self.consts)? {
            trace_ir::Arg::Scalar(s) => s,
            _ => Scalar::Float(value.extract()?),
        };
        let builder = self.builder()?;
        no_panic("number_input", || Ok(builder.add_input(ValueKind::Number(scalar)).0))
    }

    /// Records `prims.<name>(*args)` under torch's grad mode `grad_enabled` (read by the caller
    /// as the call is made, so `no_grad` regions are seen); returns its outputs.
    fn prim(
        &mut self,
        py: Python<'_>,
        name: &str,
        args: &Bound<'_, PyTuple>,
        grad_enabled: bool,
    ) -> PyResult<Vec<RecordedTensor>> {
        let args = to_args(args, types(py)?, &mut self.consts)?;
        let builder = self.builder()?;
        builder.set_grad_enabled(grad_enabled);
        let outputs = no_panic(&format!("prims.{name}"), || py_result(builder.record_prim(name, args)));
        self.note_sites(py)?;
        self.describe(&outputs?)
    }

    /// `tensor.requires_grad_(flag)` on the recorded value `value`.
    fn set_requires_grad(&mut self, value: u32, flag: bool) -> PyResult<()> {
        let builder = self.builder()?;
        no_panic("requires_grad_", || py_result(builder.set_requires_grad(ValueId(value), flag)))
    }

    /// How many composite calls the calling thread has open: 0 while the program itself calls torch.
    #[getter]
    fn depth(&self) -> usize {
        let me = thread::current().id();
        if me == self.thread {
            return self.builder.as_ref().map_or(0, TraceBuilder::depth);
        }
        self.parked.iter().find(|(t, _)| *t == me).map_or(0, |(_, open)| open.len())
    }

    /// Opens a composite call of `symbol`.
    #[pyo3(signature = (symbol, args, kwargs=None))]
    fn begin(
        &mut self,
        py: Python<'_>,
        symbol: u32,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let types = types(py)?;
        let args = to_args(args, types, &mut self.consts)?;
        let kwargs = to_kwargs(kwargs, types, &mut self.consts)?;
        let builder = self.builder()?;
        no_panic("begin", || {
            builder.begin_composite(SymbolId(symbol), args, kwargs);
            Ok(())
        })
    }

    /// Closes the innermost composite call with the value ids of its outputs.
    fn end(&mut self, outputs: Vec<u32>) -> PyResult<()> {
        let builder = self.builder()?;
        no_panic("end", || py_result(builder.end_composite(outputs.into_iter().map(ValueId).collect())))
    }

    /// `get_grad(value)` in a grad rule: the cotangent placeholder. Calls recorded after it,
    /// until the composite ends, form the composite's backward.
    fn get_grad(&mut self, value: u32) -> PyResult<Vec<RecordedTensor>> {
        let builder = self.builder()?;
        let placeholder = no_panic("get_grad", || py_result(builder.get_grad(ValueId(value))))?;
        self.describe(&[placeholder])
    }

    /// `put_grad(value, grad)` in a grad rule.
    fn put_grad(&mut self, value: u32, grad: &Bound<'_, PyAny>) -> PyResult<()> {
        let grad = to_arg(grad, types(grad.py())?, &mut self.consts)?;
        let builder = self.builder()?;
        no_panic("put_grad", || py_result(builder.put_grad(ValueId(value), grad)))
    }

    /// A mark of what the current level has recorded, for `differentiate` and `rewind`.
    fn mark(&mut self) -> PyResult<usize> {
        Ok(self.builder()?.mark())
    }

    /// Drops the calls recorded at the current level since `mark`.
    fn rewind(&mut self, mark: usize) -> PyResult<()> {
        self.builder()?.rewind(mark);
        Ok(())
    }

    /// Differentiates the calls recorded since `mark` (`torch.func.grad` of a function the
    /// program calls, traced with the inputs `wrt` requiring grad): each `(value, cotangent)` of
    /// `seeds` flows back through them, and the backward is recorded after them. Returns the
    /// gradient of each of `wrt` (None where none reaches it). Then the values since `mark`
    /// require grad as the level outside sees them, under its grad mode `enabled`
    /// (`TraceBuilder::relabel_since`). A backward that runs eager fallbacks is refused
    /// (`passes::vjp::backward_into`).
    fn differentiate(
        &mut self,
        mark: usize,
        seeds: Vec<(u32, u32)>,
        wrt: Vec<u32>,
        enabled: bool,
    ) -> PyResult<Vec<Option<RecordedTensor>>> {
        let builder = self.builder()?;
        let seeds: Vec<_> = seeds.into_iter().map(|(v, c)| (ValueId(v), ValueId(c))).collect();
        let wrt: Vec<ValueId> = wrt.into_iter().map(ValueId).collect();
        let grads =
            no_panic("differentiate", || py_result(passes::vjp::backward_into(builder, mark, &seeds, &wrt, enabled)))?;
        py_result(builder.relabel_since(mark, enabled))?;
        grads.into_iter().map(|g| g.map(|g| self.describe(&[g]).map(|mut d| d.remove(0))).transpose()).collect()
    }

    /// Whether each tensor value made from `first` to before `end` requires grad now: what
    /// `differentiate_values` restores while it differentiates them.
    fn grad_labels(&mut self, first: usize, end: usize) -> PyResult<Vec<(u32, bool)>> {
        let builder = self.builder()?;
        Ok((first..end.min(builder.num_values()))
            .filter_map(|i| match builder.value(ValueId(i as u32)) {
                Some(ValueKind::Tensor(t)) => Some((i as u32, t.requires_grad)),
                _ => None,
            })
            .collect())
    }

    /// `differentiate` of the calls at the current level that define the values made from
    /// `first` to before `end` (a `torch.func.vjp`'s forward, which the program may have used
    /// since), with those values requiring grad as `inner` (their `grad_labels` when the forward
    /// was traced) says while their backward is emitted, after all that was recorded; then they
    /// require grad as they did, and the backward's values as the level outside sees them.
    #[allow(clippy::too_many_arguments)]
    fn differentiate_values(
        &mut self,
        first: usize,
        end: usize,
        inner: Vec<(u32, bool)>,
        seeds: Vec<(u32, u32)>,
        wrt: Vec<u32>,
        enabled: bool,
    ) -> PyResult<Vec<Option<RecordedTensor>>> {
        let outside = self.grad_labels(first, end)?;
        let builder = self.builder()?;
        let label = |builder: &mut TraceBuilder, labels: &[(u32, bool)]| {
            labels.iter().for_each(|&(v, flag)| builder.label_requires_grad(ValueId(v), flag));
        };
        label(builder, &inner);
        let seeds: Vec<_> = seeds.into_iter().map(|(v, c)| (ValueId(v), ValueId(c))).collect();
        let wrt: Vec<ValueId> = wrt.into_iter().map(ValueId).collect();
        let done = no_panic("differentiate", || {
            py_result(passes::vjp::backward_of_values(builder, first..end, &seeds, &wrt, enabled))
        });
        label(builder, &outside);
        let (grads, recorded) = done?;
        let mark = builder.mark() - recorded;
        py_result(builder.relabel_since(mark, enabled))?;
        grads.into_iter().map(|g| g.map(|g| self.describe(&[g]).map(|mut d| d.remove(0))).transpose()).collect()
    }

    /// The last calls recorded at the current level, those that define only values made from
    /// `first` on (a backward just emitted: the VJP pass may have decomposed calls before it),
    /// recorded again with the values of `batched`'s `(value, batched value)` pairs batched over
    /// the leading sizes `lead` (`passes::batch::batch_since`: the backward of a forward traced
    /// unbatched, from cotangents batched over a jacobian's basis): `(value, batched value)` for
    /// every value they define that reads a batched one; they then require grad as the level
    /// outside sees them, under its grad mode `enabled`. The kernels recorded whole of the symbols
    /// `elementwise` are batched as elementwise. On an error those calls are dropped.
    fn batch_since(
        &mut self,
        first: usize,
        batched: Vec<(u32, u32)>,
        lead: Vec<Bound<'_, PyAny>>,
        enabled: bool,
        elementwise: Vec<u32>,
    ) -> PyResult<Vec<(u32, RecordedTensor)>> {
        let lead = lead.iter().map(dim_of).collect::<PyResult<Vec<_>>>()?;
        let elementwise: rustc_hash::FxHashSet<SymbolId> = elementwise.into_iter().map(SymbolId).collect();
        let given: rustc_hash::FxHashMap<ValueId, ValueId> =
            batched.iter().map(|&(v, b)| (ValueId(v), ValueId(b))).collect();
        let builder = self.builder()?;
        let calls = builder.recorded_since(0);
        let made_since = |b: &BoundSymbol| b.outputs.iter().all(|v| v.index() >= first);
        let mark = calls.iter().rposition(|b| !made_since(b)).map_or(0, |i| i + 1);
        let done = no_panic("batch", || {
            py_result(passes::batch::batch_since(builder, mark, given.clone(), &lead, &elementwise))
        })?;
        py_result(builder.relabel_since(mark, enabled))?;
        let mut pairs: Vec<(ValueId, ValueId)> = done.into_iter().filter(|(v, _)| !given.contains_key(v)).collect();
        pairs.sort_by_key(|&(v, _)| v.0);
        pairs.into_iter().map(|(v, b)| Ok((v.0, self.describe(&[b])?.remove(0)))).collect()
    }

    /// Whether each tensor value made from `first` on carries a tangent of the dual tensors
    /// `sources` (`torch.autograd.forward_ad.make_dual`'s stand-ins): an inexact output of a call
    /// recorded at the current level since `mark` (or in its decomposition) that reads one that
    /// does, but for `cuts` (what `unpack_dual` returned, which carries none). The labels
    /// `differentiate_values` differentiates a dual's computation under.
    fn dual_labels(
        &mut self,
        mark: usize,
        first: usize,
        sources: Vec<u32>,
        cuts: Vec<u32>,
    ) -> PyResult<Vec<(u32, bool)>> {
        let builder = self.builder()?;
        let mut dual: HashSet<ValueId> = sources.into_iter().map(ValueId).collect();
        let cuts: HashSet<ValueId> = cuts.into_iter().map(ValueId).collect();
        spread_duals(builder, builder.recorded_since(mark), &mut dual, &cuts);
        Ok((first..builder.num_values())
            .filter_map(|i| match builder.value(ValueId(i as u32)) {
                Some(ValueKind::Tensor(_)) => Some((i as u32, dual.contains(&ValueId(i as u32)))),
                _ => None,
            })
            .collect())
    }

    /// How many values the recording has made: the next value's id.
    #[getter]
    fn num_values(&mut self) -> PyResult<usize> {
        Ok(self.builder()?.num_values())
    }

    /// Whether a call recorded at the current level since `mark` acts on state outside the
    /// trace (a random draw), which tracing it again would repeat.
    fn effects_since(&mut self, mark: usize) -> PyResult<bool> {
        Ok(self.builder()?.recorded_since(mark).iter().any(trace_ir::BoundSymbol::has_effect))
    }

    /// What Python builds the proxies of the values `values` from (their metadata now).
    fn tensors(&self, values: Vec<u32>) -> PyResult<Vec<RecordedTensor>> {
        self.describe(&values.into_iter().map(ValueId).collect::<Vec<_>>())
    }

    /// Whether a call recorded so far reads the value `value`.
    fn is_read(&mut self, value: u32) -> PyResult<bool> {
        let builder = self.builder()?;
        Ok(builder.is_read(ValueId(value)))
    }

    /// Drops the innermost open composite call.
    fn abort(&mut self) -> PyResult<()> {
        let builder = self.builder()?;
        no_panic("abort", || {
            builder.abort_composite();
            Ok(())
        })
    }

    /// Records a call of `symbol` whose outputs' metadata are given: an eager fallback, or
    /// with `whole` a composite recorded without its decomposition.
    #[pyo3(signature = (symbol, args, kwargs, outputs, whole=false))]
    fn call(
        &mut self,
        py: Python<'_>,
        symbol: u32,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        outputs: Vec<Bound<'_, PyTensorMeta>>,
        whole: bool,
    ) -> PyResult<Vec<RecordedTensor>> {
        let symbol = if whole { Symbol::Composite(SymbolId(symbol)) } else { Symbol::Fallback(SymbolId(symbol)) };
        self.record_call(py, symbol, args, kwargs, outputs, Vec::new())
    }

    /// Records a fallback call of `symbol`, as `call` does, that also defines `sizes` (made by
    /// `unbacked_size`) after its tensors, which are returned.
    fn call_sized(
        &mut self,
        py: Python<'_>,
        symbol: u32,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
        outputs: Vec<Bound<'_, PyTensorMeta>>,
        sizes: Vec<u32>,
    ) -> PyResult<Vec<RecordedTensor>> {
        let sizes = sizes.into_iter().map(ValueId).collect();
        self.record_call(py, Symbol::Fallback(SymbolId(symbol)), args, kwargs, outputs, sizes)
    }

    /// The constants that arguments referred to (`_c0`, `_c1`, ...).
    fn consts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.consts.iter().map(|c| c.bind(py)))
    }

    /// What is recorded so far as a trace returning the values `outputs` (a tuple of them), no
    /// gradient reaching them; the recording goes on (`core/values.py` evaluates it).
    fn snapshot(&mut self, outputs: Vec<u32>) -> PyResult<PyTrace> {
        let builder = self.builder()?;
        let outputs: Vec<ValueId> = outputs.into_iter().map(ValueId).collect();
        Ok(PyTrace::new(no_panic("snapshot", || py_result(builder.snapshot(&outputs)))?, "snapshot"))
    }

    /// The calls no earlier segment ran, as `(trace, taken, known_inputs, sizes, returned)` (see
    /// `TraceBuilder::segment`: `known` are the tensors earlier segments returned, `checks` the
    /// symbols of reads' checks), or None when the recording must run from its start.
    fn segment(&mut self, wanted: Vec<u32>, known: Vec<u32>, checks: Vec<u32>) -> PyResult<Option<Segmented>> {
        self.segment_of(wanted, known, checks, true)
    }

    /// The last segment (`TraceBuilder::last_segment`): as `segment`, returning only the tensors
    /// of `wanted` that are not `known`.
    fn last_segment(&mut self, wanted: Vec<u32>, known: Vec<u32>, checks: Vec<u32>) -> PyResult<Option<Segmented>> {
        self.segment_of(wanted, known, checks, false)
    }

    /// Finishes the recording with the program's outputs (proxies, numbers, tuples, lists).
    fn finish(&mut self, py: Python<'_>, outputs: &Bound<'_, PyAny>) -> PyResult<PyTrace> {
        let outputs = to_arg(outputs, types(py)?, &mut self.consts)?;
        self.builder()?;
        if let Some((_, open)) = self.parked.first() {
            let message = format!("{} composite call(s) still open on another thread", open.len());
            return Err(PyIrError(IrError::new(ErrorKind::Runtime, "recorder", message)).into());
        }
        let builder = self.builder.take().ok_or_else(|| PyRuntimeError::new_err("the recording is finished"))?;
        Ok(PyTrace::new(no_panic("finish", || py_result(builder.finish(outputs)))?, "acquired"))
    }
}

/// Adds to `dual` the inexact tensors `bsyms` (and their decompositions) compute from one in it,
/// but for `cuts` (`Recorder.dual_labels`).
fn spread_duals(builder: &TraceBuilder, bsyms: &[BoundSymbol], dual: &mut HashSet<ValueId>, cuts: &HashSet<ValueId>) {
    for bsym in bsyms {
        spread_duals(builder, &bsym.subsymbols, dual, cuts);
        let mut reads = false;
        bsym.for_each_input(|v| reads |= dual.contains(&v));
        if !reads {
            continue;
        }
        for &o in &bsym.outputs {
            if !cuts.contains(&o) && matches!(builder.value(o), Some(ValueKind::Tensor(t)) if t.dtype.is_inexact()) {
                dual.insert(o);
            }
        }
    }
}
