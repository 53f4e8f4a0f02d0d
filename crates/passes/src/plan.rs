//! The plan of an execution trace: who runs each bound symbol, what to delete after it, and the
//! Python source generated from it.

use crate::partition::RegionPlan;
use trace_ir::pysrc::{python_source, region_key, region_source, Callee, ExecPlan};
use trace_ir::{Arg, BoundSymbol, Symbol, Trace, ValueId};

/// How to run an execution trace.
#[derive(Clone, Debug)]
pub struct Plan {
    /// For each top-level bound symbol, how to call the implementation that runs it.
    pub impls: Vec<Callee>,
    /// For each top-level bound symbol, the values to delete after it runs.
    pub dels: Vec<Vec<ValueId>>,
    /// For each top-level bound symbol, the outputs to detach after it runs (empty unless the
    /// program runs under torch's autograd, see [`crate::differentiable`]).
    pub detached: Vec<Vec<ValueId>>,
    /// Leading inputs passed packed in one list (see [`ExecPlan::packed`]).
    pub packed: Option<usize>,
    /// The generated function's name (`computation`, `backward`).
    pub name: &'static str,
    /// The generated Python module.
    pub source: String,
    /// The fusion regions the module calls, in order.
    pub regions: Vec<RegionCode>,
}

/// What a fusion executor's `fuse` is handed for one region.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionCode {
    /// The region's name, the global its call site reads (`inductor_fusion0`).
    pub name: String,
    /// The fusion executor's index in the executor table.
    pub executor: usize,
    /// The module source of `def {name}(inputs...)`, returning a tuple of its outputs.
    pub source: String,
    /// A structural key: equal for regions that compute the same thing on the same metadata.
    pub key: String,
    /// The qualified names of its calls, in order.
    pub symbol_names: Vec<String>,
    /// How many inputs the region's function takes.
    pub num_inputs: usize,
    /// How many values the region's function returns.
    pub num_outputs: usize,
    /// The region's inputs and outputs, in its function's order.
    pub inputs: Vec<ValueId>,
    /// The values the region defines that something outside it reads, in its function's order.
    pub outputs: Vec<ValueId>,
    /// Its calls with every composite replaced by its decomposition, for executors that
    /// translate prims (nvFuser).
    pub calls: Vec<LeafCall>,
}

/// One call of a region's decomposition: a prim (or a symbol without decomposition).
#[derive(Clone, Debug, PartialEq)]
pub struct LeafCall {
    /// `prims.add`; a symbol without decomposition by its qualified name.
    pub name: String,
    /// The positional arguments as printed (a prim's operands, then its parameters).
    pub args: Vec<Arg>,
    /// The values the call defines.
    pub outputs: Vec<ValueId>,
}

/// The calls of `bsyms` with composites replaced by their decompositions, at every depth.
fn leaf_calls(bsyms: &[BoundSymbol], out: &mut Vec<LeafCall>) {
    for bsym in bsyms {
        if bsym.subsymbols.is_empty() || matches!(bsym.symbol, Symbol::Prim(_)) {
            let name = bsym.symbol.qualified_name();
            out.push(LeafCall { name, args: bsym.call_args(), outputs: bsym.outputs.clone() });
        } else {
            leaf_calls(&bsym.subsymbols, out);
        }
    }
}

impl RegionCode {
    fn new(trace: &Trace, region: &RegionPlan) -> RegionCode {
        let bsym = &trace.bsyms[region.index];
        RegionCode {
            name: region.name.to_string(),
            executor: region.executor,
            source: region_source(trace, bsym, &region.callees, &region.name),
            key: region_key(trace, bsym, &region.callees),
            symbol_names: bsym.subsymbols.iter().map(|s| s.symbol.qualified_name()).collect(),
            num_inputs: bsym.inputs().len(),
            num_outputs: bsym.outputs.len(),
            inputs: bsym.inputs(),
            outputs: bsym.outputs.clone(),
            calls: {
                let mut calls = Vec::new();
                leaf_calls(&bsym.subsymbols, &mut calls);
                calls
            },
        }
    }
}

impl Plan {
    /// The plan for `trace` with `impls`, `dels` and `detached`, its source and its regions' generated.
    pub fn new(
        trace: &Trace,
        impls: Vec<Callee>,
        dels: Vec<Vec<ValueId>>,
        packed: Option<usize>,
        name: &'static str,
        regions: &[RegionPlan],
        detached: Vec<Vec<ValueId>>,
    ) -> Plan {
        let exec = ExecPlan { impls: &impls, dels: &dels, detached: &detached, packed };
        let source = python_source(trace, &exec, name);
        let regions = regions.iter().map(|r| RegionCode::new(trace, r)).collect();
        Plan { impls, dels, detached, packed, name, source, regions }
    }
}
