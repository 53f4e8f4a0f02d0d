//! `Trace`: an immutable Python handle on a trace (or an execution trace with its plan).

use passes::Plan;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use std::sync::{Arc, OnceLock};
use trace_ir::Trace;

use crate::region::PyRegionCode;

#[pyclass(frozen, module = "thunder_rs._core", name = "Trace")]
pub struct PyTrace {
    pub trace: Arc<Trace>,
    pub plan: Option<Arc<Plan>>,
    label: String,
    seconds: f64,
    /// Whether `THUNDER_RS_DUMP` asked for this stage.
    dump: bool,
    /// What the stage reported besides its trace.
    note: String,
    /// The user's names of the trace's inputs (`t0` -> `l_x`), shown instead of theirs.
    input_names: Arc<FxHashMap<String, String>>,
    text: OnceLock<String>,
}

impl PyTrace {
    pub fn new(trace: Trace, label: &str) -> Self {
        PyTrace {
            trace: Arc::new(trace),
            plan: None,
            label: label.to_string(),
            seconds: 0.0,
            dump: false,
            note: String::new(),
            input_names: Arc::default(),
            text: OnceLock::new(),
        }
    }

    pub fn with_time(mut self, seconds: f64) -> Self {
        self.seconds = seconds;
        self
    }

    pub fn source(&self) -> &str {
        if self.input_names.is_empty() {
            if let Some(plan) = &self.plan {
                return &plan.source;
            }
        }
        self.text.get_or_init(|| {
            let text = match &self.plan {
                Some(plan) => plan.source.clone(),
                None => trace_ir::printer::print_trace(&self.trace, "computation"),
            };
            if self.input_names.is_empty() {
                text
            } else {
                trace_ir::pysrc::name_values(&text, &self.input_names)
            }
        })
    }
}

impl From<passes::PassRecord> for PyTrace {
    fn from(record: passes::PassRecord) -> Self {
        let mut trace = PyTrace::new(record.trace, &record.name).with_time(record.seconds);
        trace.plan = record.plan;
        trace.dump = record.dump;
        trace.note = record.note;
        trace
    }
}

#[pymethods]
impl PyTrace {
    /// The pass (or stage) that produced this trace.
    #[getter]
    fn label(&self) -> &str {
        &self.label
    }

    /// How long the pass that produced this trace took, in seconds.
    #[getter]
    fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Whether `THUNDER_RS_DUMP` names this stage (the jit logs it).
    #[getter]
    fn dump(&self) -> bool {
        self.dump
    }

    /// What the stage reported besides its trace (for a rewrite, which rules fired), or "".
    #[getter]
    fn note(&self) -> &str {
        &self.note
    }

    /// Number of bound symbols, counting decompositions.
    /// How many inputs the trace takes.
    #[getter]
    fn num_inputs(&self) -> usize {
        self.trace.inputs.len()
    }

    #[getter]
    fn num_bsyms(&self) -> usize {
        self.trace.count_bsyms()
    }

    /// Names of the top-level symbols, in order.
    fn symbol_names(&self) -> Vec<String> {
        self.trace.bsyms.iter().map(|b| b.symbol.qualified_name()).collect()
    }

    /// Names of every symbol at every depth, in order (decompositions included).
    fn all_symbol_names(&self) -> Vec<String> {
        fn walk(bsyms: &[trace_ir::BoundSymbol], out: &mut Vec<String>) {
            for b in bsyms {
                out.push(b.symbol.qualified_name());
                walk(&b.subsymbols, out);
            }
        }
        let mut out = Vec::new();
        walk(&self.trace.bsyms, &mut out);
        out
    }

    /// Whether a call of the trace has an effect (a random draw, a generator-state call).
    fn has_effects(&self) -> bool {
        self.trace.bsyms.iter().any(trace_ir::BoundSymbol::has_effect)
    }

    /// The positions of the inputs that the calls computing the flat outputs at `outputs` read
    /// (`passes::differentiable::inputs_read`).
    fn inputs_read(&self, outputs: Vec<usize>) -> Vec<usize> {
        passes::differentiable::inputs_read(&self.trace, &outputs)
    }

    /// The positions among `outputs` whose computation reads one of `values` along values that
    /// require grad (`passes::differentiable::outputs_reaching`).
    fn outputs_reaching(&self, values: Vec<u32>, outputs: Vec<usize>) -> Vec<usize> {
        let values: Vec<trace_ir::ValueId> = values.into_iter().map(trace_ir::ValueId).collect();
        passes::differentiable::outputs_reaching(&self.trace, &values, &outputs)
    }

    /// Per value of `values`, whether a call of the trace reads it along gradients
    /// (`passes::differentiable::values_read_along_gradients`).
    fn values_read_along_gradients(&self, values: Vec<u32>) -> Vec<bool> {
        let values: Vec<trace_ir::ValueId> = values.into_iter().map(trace_ir::ValueId).collect();
        passes::differentiable::values_read_along_gradients(&self.trace, &values)
    }

    /// The positions among a backward's outputs (a tuple) of the gradients that are absent where
    /// the values `absent` are and the values `materialized` are not, the last `num_cotangents`
    /// inputs being its cotangents (`passes::absent::absent_outputs`).
    fn absent_outputs(&self, absent: Vec<u32>, num_cotangents: usize, materialized: Vec<u32>) -> Vec<usize> {
        let ids = |vs: Vec<u32>| vs.into_iter().map(trace_ir::ValueId).collect::<Vec<_>>();
        passes::absent::absent_outputs(&self.trace, num_cotangents, &ids(absent), &ids(materialized))
    }

    /// The value ids of the outputs of each top-level call whose symbol's name is among `names`,
    /// in program order.
    fn call_outputs(&self, names: std::collections::HashSet<String>) -> Vec<Vec<u32>> {
        let named = |b: &&trace_ir::BoundSymbol| names.contains(&b.symbol.qualified_name());
        self.trace.bsyms.iter().filter(named).map(|b| b.outputs.iter().map(|v| v.0).collect()).collect()
    }

    /// Per top-level call whose symbol's name is among `names`, in program order (as
    /// `call_outputs`): per positional argument, whether it is a tensor that requires grad.
    fn call_args_requiring_grad(&self, names: std::collections::HashSet<String>) -> Vec<Vec<bool>> {
        let named = |b: &&trace_ir::BoundSymbol| names.contains(&b.symbol.qualified_name());
        let requires_grad = |a: &trace_ir::Arg| match a {
            trace_ir::Arg::Value(v) => self.trace.tensor(*v).is_some_and(|t| t.requires_grad),
            _ => false,
        };
        self.trace.bsyms.iter().filter(named).map(|b| b.args.iter().map(requires_grad).collect()).collect()
    }

    /// The positions of the inputs a run of the trace reads
    /// (`passes::differentiable::inputs_needed`).
    fn inputs_needed(&self) -> Vec<usize> {
        passes::differentiable::inputs_needed(&self.trace)
    }

    /// The positions of the inputs that the flat outputs at `outputs` hold as they are
    /// (`passes::differentiable::inputs_returned`).
    fn inputs_returned(&self, outputs: Vec<usize>) -> Vec<usize> {
        passes::differentiable::inputs_returned(&self.trace, &outputs)
    }

    /// For each flat output of a differentiated execution trace's forward, the global name of the
    /// callable whose call computes it (`torch_mul`, a fusion region's name), or None for one no
    /// call computes (an input, a number, None) (`passes::differentiable::output_producers`);
    /// None for a trace without an execution plan.
    /// An output a call writes into its receiver (an in-place method: torch names them with one
    /// trailing underscore) is named by the call that made the receiver.
    fn output_callees(&self) -> Option<Vec<Option<String>>> {
        let plan = self.plan.as_ref()?;
        let writes_receiver =
            |i: usize| plan.impls[i].method.as_deref().is_some_and(|m| m.ends_with('_') && !m.ends_with("__"));
        let producers = passes::differentiable::output_producers(&self.trace, writes_receiver);
        Some(producers.into_iter().map(|i| i.map(|i| plan.impls[i].function.to_string())).collect())
    }

    /// The top-level symbol whose call computes value `vid` (inside its decomposition or as an
    /// output), or None for an input or an unknown value.
    fn producer(&self, vid: u32) -> Option<String> {
        let target = trace_ir::ValueId(vid);
        let mut found = false;
        self.trace
            .bsyms
            .iter()
            .find(|b| {
                b.for_each_defined(&mut |v| found |= v == target);
                found || b.outputs.contains(&target)
            })
            .map(|b| b.symbol.qualified_name())
    }

    /// The fusion regions of an execution trace, in order (none for a trace without a plan).
    fn regions(&self) -> Vec<PyRegionCode> {
        self.plan.as_ref().map_or_else(Vec::new, |plan| PyRegionCode::all(plan, &self.trace))
    }

    /// Whether each input requires grad.
    fn input_requires_grad(&self) -> Vec<bool> {
        self.trace.inputs.iter().map(|&v| self.trace.tensor(v).is_some_and(|t| t.requires_grad)).collect()
    }

    fn __str__(&self) -> &str {
        self.source()
    }

    /// The relations between sizes the trace relies on, as Python conditions over the size
    /// inputs' names (`t0 - 1 >= 0`); empty for a trace of constant sizes.
    fn guards(&self) -> Vec<String> {
        self.trace.facts.guards().iter().map(|g| g.to_string()).collect()
    }

    /// The value ids of the size inputs (`ValueKind::Size`), in input order.
    fn size_inputs(&self) -> Vec<u32> {
        let is_size = |v: &&trace_ir::ValueId| matches!(self.trace.value(**v), trace_ir::ValueKind::Size(_));
        self.trace.inputs.iter().filter(is_size).map(|v| v.0).collect()
    }

    /// The value ids of the float inputs (`ValueKind::Number`: float arguments that change
    /// between calls), in input order: the last.
    fn float_inputs(&self) -> Vec<u32> {
        let is_float = |v: &&trace_ir::ValueId| matches!(self.trace.value(**v), trace_ir::ValueKind::Number(_));
        self.trace.inputs.iter().filter(is_float).map(|v| v.0).collect()
    }

    /// This trace showing (and, as an execution trace, taking) its inputs under `names`, one per
    /// input; an empty name keeps the input's own. The names must be distinct identifiers that
    /// no generated name (`t12`, `_c0`, the executors' callables) takes: the caller ensures it.
    fn with_input_names(&self, names: Vec<String>) -> PyResult<PyTrace> {
        if names.len() != self.trace.inputs.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "Trace.with_input_names: expected {} names, got {} (argument names)",
                self.trace.inputs.len(),
                names.len()
            )));
        }
        let table = self.trace.inputs.iter().zip(names).filter(|(_, n)| !n.is_empty()).map(|(v, n)| (v.to_string(), n));
        Ok(PyTrace {
            trace: self.trace.clone(),
            plan: self.plan.clone(),
            label: self.label.clone(),
            seconds: self.seconds,
            dump: self.dump,
            note: self.note.clone(),
            input_names: Arc::new(table.collect()),
            text: OnceLock::new(),
        })
    }

    fn __repr__(&self) -> String {
        format!("<thunder_rs Trace '{}': {} bound symbols>", self.label, self.trace.count_bsyms())
    }
}
