//! The trace verifier: SSA, arities and prim metadata.

use crate::bail;
use crate::error::Result;
use crate::prims::Operand;
use crate::sym::Facts;
use crate::trace::{BoundSymbol, Symbol, Trace};
use crate::value::{Arg, ValueKind};
use crate::ValueId;

/// Checks that every value is defined once before it is used, that every prim has as many
/// operands as its signature allows and outputs that agree with its meta rule, and that the
/// trace's outputs are defined.
///
/// The pass manager runs it after every pass in tests and under `THUNDER_RS_VERIFY=1`, and
/// always on what a plugin pass returns. The error is a [`crate::ErrorKind::Runtime`] naming
/// the offending value or call.
///
/// ```
/// use trace_ir::{parser::parse_trace, verify::verify};
///
/// let trace = parse_trace("def f(t0):\n  # t0: \"cpu f32[4]\"\n  t1 = prims.neg(t0)\n  return t1")?;
/// verify(&trace)?;
///
/// // A pass that drops the call defining the output breaks SSA.
/// let broken = trace.with_bsyms(vec![], trace.outputs.clone());
/// assert!(verify(&broken).unwrap_err().message.contains("t1"));
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn verify(trace: &Trace) -> Result<()> {
    let mut defined = vec![false; trace.values.len()];
    for &v in &trace.inputs {
        define(&mut defined, v, "input")?;
    }
    for &v in &trace.inputs {
        check_sizes(trace, &defined, v, "input")?;
    }
    for bsym in &trace.bsyms {
        check_uses(trace, &defined, bsym)?;
        let mut result = Ok(());
        bsym.for_each_defined(&mut |v| {
            if result.is_ok() {
                result = define(&mut defined, v, &bsym.symbol.qualified_name());
            }
        });
        result?;
        for &v in &bsym.outputs {
            check_sizes(trace, &defined, v, &bsym.symbol.qualified_name())?;
        }
        check_prim(trace, bsym)?;
    }
    let mut missing = None;
    trace.outputs.for_each_value(&mut |v| {
        if !defined.get(v.index()).copied().unwrap_or(false) {
            missing = Some(v);
        }
    });
    if let Some(v) = missing {
        bail!(Runtime, "verify", "output {v} is never defined");
    }
    Ok(())
}

fn define(defined: &mut [bool], v: ValueId, by: &str) -> Result<()> {
    match defined.get_mut(v.index()) {
        None => bail!(Runtime, "verify", "{by} defines {v}, which is not in the value table"),
        Some(true) => bail!(Runtime, "verify", "{by} redefines {v}"),
        Some(slot) => *slot = true,
    }
    Ok(())
}

/// A value's symbolic sizes read only size values defined before it: inputs of the trace, or
/// sizes a call computed from values and defined with its outputs (`nonzero`'s count): the
/// program computes its sizes from what it is called with and what it computed.
fn check_sizes(trace: &Trace, defined: &[bool], v: ValueId, by: &str) -> Result<()> {
    let Some(t) = trace.tensor(v) else { return Ok(()) };
    let mut bad = None;
    for d in &t.shape {
        d.for_each_value(&mut |s| {
            let is_size = matches!(trace.values.get(s.index()), Some(ValueKind::Size(_)))
                && defined.get(s.index()).copied().unwrap_or(false);
            if !is_size {
                bad.get_or_insert(s);
            }
        });
    }
    if let Some(s) = bad {
        bail!(
            Runtime,
            "verify",
            "{by}: {v} is {}, whose size reads {s}, which is no size defined before it",
            t.describe()
        );
    }
    Ok(())
}

fn check_uses(_trace: &Trace, defined: &[bool], bsym: &BoundSymbol) -> Result<()> {
    let mut undefined = None;
    bsym.for_each_input(|v| {
        if !defined.get(v.index()).copied().unwrap_or(false) {
            undefined = Some(v);
        }
    });
    if let Some(v) = undefined {
        bail!(Runtime, "verify", "{} uses {v} before it is defined", bsym.symbol.qualified_name());
    }
    Ok(())
}

fn check_prim(trace: &Trace, bsym: &BoundSymbol) -> Result<()> {
    let Symbol::Prim(prim) = &bsym.symbol else { return Ok(()) };
    let op = prim.qualified_name();
    // Meta rules assume their arity holds.
    if !prim.operands().allows(bsym.args.len()) {
        bail!(Runtime, &op, "has {} operand(s), which its signature does not allow", bsym.args.len());
    }
    if let Some(bad) =
        bsym.args.iter().find(|a| !matches!(a, Arg::Value(_) | Arg::Scalar(_) | Arg::Sym(_) | Arg::SymFloat(_)))
    {
        bail!(Runtime, &op, "operand {bad:?} is not a value or number");
    }
    let operands: Vec<Operand> = bsym.args.iter().map(|a| Operand::of(&trace.values, &op, a)).collect::<Result<_>>()?;
    let mut relied = Facts::default();
    trace.facts.counts().for_each(|v| relied.count(v));
    let metas = prim.meta(&operands, &mut relied)?;
    // What the call relies on must be checked by the compiled program: a pass that dropped the
    // trace's guards would run it where it computes something else.
    if let Some(g) = relied.guards().iter().find(|g| !trace.facts.guards().contains(g)) {
        bail!(Runtime, &op, "relies on `{g}`, which is not among the trace's guards");
    }
    if metas.len() != bsym.outputs.len() {
        bail!(Runtime, &op, "has {} outputs but its meta rule gives {}", bsym.outputs.len(), metas.len());
    }
    for (m, &v) in metas.iter().zip(&bsym.outputs) {
        let Some(t) = trace.tensor(v) else { bail!(Runtime, &op, "output {v} is not a tensor") };
        if (t.dtype, t.device, &t.shape) != (m.dtype, m.device, &m.shape) {
            bail!(Runtime, &op, "output {v} is {} but its meta rule gives {}", t.describe(), m.describe());
        }
    }
    Ok(())
}
