//! Value lifetimes: where each intermediate value is last used, so the generated code can free
//! it at once (`del t3`).

use trace_ir::{Trace, ValueId};

/// For each top-level bound symbol, the values to delete right after it: intermediates whose
/// last use it is, and outputs nobody reads. Inputs and the trace's outputs are never deleted.
pub fn del_last_used(trace: &Trace) -> Vec<Vec<ValueId>> {
    let n = trace.values.len();
    let mut keep = vec![false; n];
    trace.inputs.iter().for_each(|v| keep[v.index()] = true);
    trace.outputs.for_each_value(&mut |v| keep[v.index()] = true);
    let mut last_use: Vec<Option<usize>> = vec![None; n];
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        bsym.for_each_input(|v| last_use[v.index()] = Some(i));
        for o in &bsym.outputs {
            last_use[o.index()].get_or_insert(i);
        }
    }
    let mut dels = vec![Vec::new(); trace.bsyms.len()];
    for (v, last) in last_use.iter().enumerate() {
        if let (Some(i), false) = (last, keep[v]) {
            dels[*i].push(ValueId(v as u32));
        }
    }
    dels
}
