//! The plan of an execution trace: who runs each bound symbol, what to delete after it, and the
//! Python source generated from it.

use trace_ir::pysrc::{python_source, Callee, ExecPlan};
use trace_ir::{Trace, ValueId};

/// How to run an execution trace.
#[derive(Clone, Debug)]
pub struct Plan {
    /// For each top-level bound symbol, how to call the implementation that runs it.
    pub impls: Vec<Callee>,
    /// For each top-level bound symbol, the values to delete after it runs.
    pub dels: Vec<Vec<ValueId>>,
    /// Leading inputs passed packed in one list (see [`ExecPlan::packed`]).
    pub packed: Option<usize>,
    /// The generated function's name (`computation`, `backward`).
    pub name: &'static str,
    /// The generated Python module.
    pub source: String,
}

impl Plan {
    /// The plan for `trace` with `impls` and `dels`, its source generated.
    pub fn new(trace: &Trace, impls: Vec<Callee>, dels: Vec<Vec<ValueId>>, packed: Option<usize>, name: &'static str) -> Plan {
        let source = python_source(trace, &ExecPlan { impls: &impls, dels: &dels, packed }, name);
        Plan { impls, dels, packed, name, source }
    }
}
