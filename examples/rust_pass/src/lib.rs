//! An example thunder_rs pass plugin: one rewrite rule (`x * sigmoid(x)` -> `silu(x)`, the
//! `example_silu` pass), one custom pass (`example_inline_sigmoid`), an identity pass (what remains
//! is the cost of crossing the boundary) and passes that fail on purpose for the tests (one of
//! them applies a rule naming no prim, which thunder_rs refuses naming the rule), exported
//! to thunder_rs as a `thunder_rs_passes` capsule:
//!
//! ```python
//! import thunder_rs, thunder_rs_example_pass
//! thunder_rs.load_passes(thunder_rs_example_pass)
//! jfn = thunder_rs.jit(fn, passes=["example_silu"])
//! ```

use passes::rewrite::{any, call, rewrite, Input, Replacement, Rule};
use passes::PassCx;
use plugin_abi::{pass_entry, plugin_table, PassEntry, PluginTable, CAPSULE_NAME};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::c_void;
use std::ptr::NonNull;
use trace_ir::prims::{Binary, Unary};
use trace_ir::{Arg, BoundSymbol, Result, Scalar, Trace};

/// The custom pass: replaces each `ltorch.sigmoid` call by its decomposition, so that rules over
/// prims (which see through single-prim composites only) can match what it computes.
fn inline_sigmoid(trace: &Trace) -> Result<Trace> {
    let mut bsyms: Vec<BoundSymbol> = Vec::with_capacity(trace.bsyms.len());
    for bsym in &trace.bsyms {
        if bsym.symbol.qualified_name() == "ltorch.sigmoid" && !bsym.subsymbols.is_empty() {
            bsyms.extend(bsym.subsymbols.iter().cloned());
        } else {
            bsyms.push(bsym.clone());
        }
    }
    Ok(trace.with_bsyms(bsyms, trace.outputs.clone()))
}

/// `x * (1 / (exp(-x) + 1))` -> `ltorch.silu(x)`, decomposed as thunder_rs's own `silu` is
/// (`x / (exp(-x) + 1)`), so an executor that claims `ltorch.silu` runs it as one kernel.
const MUL_SIGMOID_TO_SILU: Rule = Rule {
    name: "mul-sigmoid-to-silu",
    pattern: || {
        let sigmoid = call("reciprocal", [call("add", [call("exp", [call("neg", [any("y")])]), any("one")])]);
        call("mul", [any("x"), sigmoid])
    },
    rewrite: |m| {
        let x = m.value("x")?;
        if m.value("y")? != x || !matches!(m.arg("one"), Arg::Scalar(Scalar::Float(v)) if v == 1.0) {
            return None;
        }
        let x = Arg::Value(x);
        Some(Replacement::Composite {
            symbol: "ltorch.silu".into(),
            args: vec![x.clone()],
            decomposition: vec![
                (Unary::Neg.into(), vec![Input::Arg(x.clone())]),
                (Unary::Exp.into(), vec![Input::Result(0)]),
                (Binary::Add.into(), vec![Input::Result(1), Input::Arg(Arg::Scalar(Scalar::Float(1.0)))]),
                (Binary::Div.into(), vec![Input::Arg(x), Input::Result(2)]),
            ],
        })
    },
};

/// The rule set as a pass: inline `sigmoid`, then rewrite.
fn silu(trace: &Trace) -> Result<Trace> {
    Ok(rewrite(&inline_sigmoid(trace)?, &[MUL_SIGMOID_TO_SILU], &PassCx::default())?.0)
}

/// The silu rule's pattern with `reciprocal` misspelt: it could never match, so applying it is an
/// error naming the rule and the name (for the tests).
const MISSPELT: Rule = Rule {
    name: "mul-sigmoid-misspelt",
    pattern: || call("mul", [any("x"), call("reciprocl", [any("y")])]),
    rewrite: |_| None,
};

/// Applies [`MISSPELT`], which thunder_rs refuses.
fn misspelt(trace: &Trace) -> Result<Trace> {
    Ok(rewrite(trace, &[MISSPELT], &PassCx::default())?.0)
}

/// Returns the trace unchanged: what remains is the cost of crossing the plugin boundary.
fn identity(trace: &Trace) -> Result<Trace> {
    Ok(trace.clone())
}

/// Panics, so tests can check that a plugin panic becomes an error naming the pass.
fn explode(_trace: &Trace) -> Result<Trace> {
    panic!("the example's explode pass always panics")
}

/// Returns an error, so tests can check how a failing pass is reported or skipped.
fn refuses(_trace: &Trace) -> Result<Trace> {
    Err(trace_ir::IrError::new(trace_ir::ErrorKind::Value, "example_refuses", "this pass refuses every trace"))
}

/// Drops every call: the tests check that the verifier names a pass that breaks the trace.
fn breaks(trace: &Trace) -> Result<Trace> {
    Ok(trace.with_bsyms(Vec::new(), trace.outputs.clone()))
}

static PASSES: [PassEntry; 7] = [
    pass_entry!("example_silu", "forward", silu),
    pass_entry!("example_inline_sigmoid", "program", inline_sigmoid),
    pass_entry!("example_identity", "program", identity),
    pass_entry!("example_explode", "forward", explode),
    pass_entry!("example_breaks", "forward", breaks),
    pass_entry!("example_misspelt", "forward", misspelt),
    pass_entry!("example_refuses", "program", refuses),
];
static TABLE: PluginTable = plugin_table!(PASSES);

#[pymodule]
fn thunder_rs_example_pass(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let pointer = NonNull::from(&TABLE).cast::<c_void>();
    // SAFETY: the table is a static of this module, which Python never unloads.
    let capsule = unsafe { PyCapsule::new_with_pointer(m.py(), pointer, CAPSULE_NAME) }?;
    m.add("thunder_rs_passes", capsule)
}
