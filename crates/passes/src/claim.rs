//! Claiming: each top-level bound symbol is given to the first executor, in priority order, that
//! implements its symbol and whose checker (if any) accepts it. A composite no executor claims is
//! replaced by its decomposition, whose bound symbols are claimed in turn.
//!
//! A fusion executor claims a symbol only together with a fallback: the first later non-fusion
//! executor that also takes it, which runs it when the partitioner leaves it out of a region.

use rustc_hash::FxHashMap;
use trace_ir::pysrc::Callee;
use trace_ir::{bail, BoundSymbol, Result, Symbol, SymbolId, Trace};

/// How an executor's table names a symbol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymKey {
    /// A prim, by name (`add`).
    Prim(String),
    /// A composite or fallback symbol.
    Symbol(SymbolId),
}

impl SymKey {
    pub fn of(symbol: &Symbol) -> SymKey {
        match symbol {
            Symbol::Prim(p) => SymKey::Prim(p.name().to_string()),
            Symbol::Composite(id) | Symbol::Fallback(id) => SymKey::Symbol(*id),
            // Regions exist only after claiming and no table names them: claiming one fails
            // with "no executor implements this symbol".
            Symbol::Region(name) => SymKey::Prim(name.to_string()),
        }
    }
}

/// One implementation an executor offers.
#[derive(Clone, Debug)]
pub struct ImplSpec {
    /// How the generated code calls it.
    pub callee: Callee,
    /// Whether a Python checker must accept each bound symbol first.
    pub has_checker: bool,
}

/// An executor's table, sent once from Python.
#[derive(Clone, Debug, Default)]
pub struct ExecutorSpec {
    pub name: String,
    pub impls: FxHashMap<SymKey, ImplSpec>,
    /// Whether the executor runs regions of symbols (`fuse`) rather than single symbols.
    pub fusion: bool,
}

/// Who runs one top-level bound symbol of a claimed trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    /// The implementation that runs it on its own: a non-fusion executor's.
    pub callee: Callee,
    /// The fusion executor that claimed it (its index in the table) and the implementation its
    /// region's code calls; when its region is dropped, `callee` runs it.
    pub fusion: Option<(usize, Callee)>,
}

/// The checker callback: `(executor index, bound symbol) -> accepted`.
pub type Checker<'a> = dyn FnMut(usize, &BoundSymbol) -> Result<bool> + 'a;

/// Claims every top-level bound symbol. Returns the execution trace (unclaimed composites
/// flattened) and, per bound symbol, who runs it.
pub fn claim(trace: &Trace, executors: &[ExecutorSpec], checker: &mut Checker) -> Result<(Trace, Vec<Assignment>)> {
    let mut bsyms = Vec::with_capacity(trace.bsyms.len());
    let mut assignments = Vec::with_capacity(trace.bsyms.len());
    for bsym in &trace.bsyms {
        claim_one(bsym, executors, checker, &mut bsyms, &mut assignments)?;
    }
    Ok((trace.with_bsyms(bsyms, trace.outputs.clone()), assignments))
}

fn claim_one(
    bsym: &BoundSymbol,
    executors: &[ExecutorSpec],
    checker: &mut Checker,
    bsyms: &mut Vec<BoundSymbol>,
    assignments: &mut Vec<Assignment>,
) -> Result<()> {
    let key = SymKey::of(&bsym.symbol);
    let mut fusion = None;
    for (i, executor) in executors.iter().enumerate() {
        let Some(spec) = executor.impls.get(&key) else { continue };
        if (executor.fusion && fusion.is_some()) || (spec.has_checker && !checker(i, bsym)?) {
            continue;
        }
        if executor.fusion {
            fusion = Some((i, spec.callee.clone()));
            continue;
        }
        bsyms.push(bsym.clone());
        assignments.push(Assignment { callee: spec.callee.clone(), fusion });
        return Ok(());
    }
    if bsym.subsymbols.is_empty() {
        bail!(NotImplemented, bsym.symbol.qualified_name(), "no executor implements this symbol");
    }
    for sub in &bsym.subsymbols {
        claim_one(sub, executors, checker, bsyms, assignments)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder, ValueKind};

    fn executor(name: &str, fusion: bool, prims: &[&str]) -> ExecutorSpec {
        let impls = prims
            .iter()
            .map(|p| {
                let callee = Callee::function(format!("{name}_{p}"));
                (SymKey::Prim(p.to_string()), ImplSpec { callee, has_checker: false })
            })
            .collect();
        ExecutorSpec { name: name.to_string(), impls, fusion }
    }

    #[test]
    fn a_fusion_executor_claims_only_what_a_later_executor_can_run() {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let s = b.record_prim("sin", vec![Arg::Value(e)]).unwrap()[0];
        let trace = b.finish(Arg::Value(s)).unwrap();
        let executors = [executor("fuser", true, &["exp", "sin"]), executor("torch", false, &["exp", "sin"])];
        let (_, got) = claim(&trace, &executors, &mut |_, _| Ok(true)).unwrap();
        assert_eq!(got[0].fusion.as_ref().map(|f| (f.0, &*f.1.function)), Some((0, "fuser_exp")));
        assert_eq!(&*got[0].callee.function, "torch_exp");
        // Without a later executor for sin, the fusion executor does not take it.
        let executors = [
            executor("fuser", true, &["exp", "sin"]),
            executor("torch", false, &["exp"]),
            executor("late", false, &["sin"]),
        ];
        let (_, got) = claim(&trace, &executors, &mut |_, _| Ok(true)).unwrap();
        assert_eq!(got[1].fusion.as_ref().map(|f| f.0), Some(0));
        assert_eq!(&*got[1].callee.function, "late_sin");
        let executors = [executor("fuser", true, &["exp", "sin"]), executor("torch", false, &["exp"])];
        let err = claim(&trace, &executors, &mut |_, _| Ok(true)).unwrap_err();
        assert!(err.to_string().contains("no executor implements"), "{err}");
    }
}
