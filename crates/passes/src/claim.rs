//! Claiming: each top-level bound symbol is given to the first executor, in priority order, that
//! implements its symbol and whose checker (if any) accepts it. A composite no executor claims is
//! replaced by its decomposition, whose bound symbols are claimed in turn.
//!
//! A fusion executor claims a symbol only together with a fallback: the first later non-fusion
//! executor that also takes it, which runs it when the partitioner leaves it out of a region.
//! A fusion executor that translates prims (`fuses_decompositions`, nvFuser) also claims a
//! composite it has no entry for when it claims every prim of the composite's decomposition;
//! the region's code then calls the fallback's implementation of the composite.

use rustc_hash::FxHashMap;
use trace_ir::pysrc::Callee;
use trace_ir::{bail, BoundSymbol, PrimId, Result, Symbol, SymbolId, Trace};

/// How an executor's table names a symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymKey {
    /// A prim, whatever its parameters (`add`, `sum`).
    Prim(PrimId),
    /// A composite or fallback symbol.
    Symbol(SymbolId),
}

impl SymKey {
    /// The key tables name `symbol` by; `None` for a region, which exists only after claiming
    /// and which no table names.
    pub fn of(symbol: &Symbol) -> Option<SymKey> {
        match symbol {
            Symbol::Prim(p) => Some(SymKey::Prim(p.id())),
            Symbol::Composite(id) | Symbol::Fallback(id) => Some(SymKey::Symbol(*id)),
            Symbol::Region(_) => None,
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
    /// The executor's name (`torch`, `inductor`), as errors and `examine` show it.
    pub name: String,
    /// What it implements: one entry per prim or symbol it can run.
    pub impls: FxHashMap<SymKey, ImplSpec>,
    /// Whether the executor runs regions of symbols (`fuse`) rather than single symbols.
    pub fusion: bool,
    /// Whether the (fusion) executor claims composites whose whole decomposition it claims.
    pub fuses_decompositions: bool,
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
    // A fusion executor that claims the composite's decomposition; its region calls the
    // fallback's implementation of the composite.
    let mut by_decomposition = None;
    for (i, executor) in executors.iter().enumerate() {
        let Some(spec) = key.and_then(|key| executor.impls.get(&key)) else {
            if executor.fuses_decompositions
                && fusion.is_none()
                && by_decomposition.is_none()
                && decomposition_claimed(bsym, executor, i, checker)?
            {
                by_decomposition = Some(i);
            }
            continue;
        };
        if (executor.fusion && (fusion.is_some() || by_decomposition.is_some()))
            || (spec.has_checker && !checker(i, bsym)?)
        {
            continue;
        }
        if executor.fusion {
            fusion = Some((i, spec.callee.clone()));
            continue;
        }
        let fusion = fusion.or_else(|| by_decomposition.map(|f| (f, spec.callee.clone())));
        bsyms.push(bsym.clone());
        assignments.push(Assignment { callee: spec.callee.clone(), fusion });
        return Ok(());
    }
    if bsym.subsymbols.is_empty() {
        bail!(NotImplemented, bsym.symbol.qualified_name(), "no executor implements this symbol");
    }
    for sub in bsym.subsymbols.iter() {
        claim_one(sub, executors, checker, bsyms, assignments)?;
    }
    Ok(())
}

/// Whether `bsym` is a composite whose decomposition, at every depth, is prims that `executor`
/// (at index `index`) claims, its checkers accepting them.
fn decomposition_claimed(
    bsym: &BoundSymbol,
    executor: &ExecutorSpec,
    index: usize,
    checker: &mut Checker,
) -> Result<bool> {
    if !matches!(bsym.symbol, Symbol::Composite(_)) || bsym.subsymbols.is_empty() {
        return Ok(false);
    }
    for sub in bsym.subsymbols.iter() {
        let claimed = match &sub.symbol {
            Symbol::Prim(p) => match executor.impls.get(&SymKey::Prim(p.id())) {
                Some(spec) => !spec.has_checker || checker(index, sub)?,
                None => false,
            },
            _ => decomposition_claimed(sub, executor, index, checker)?,
        };
        if !claimed {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{Arg, BoundSymbol, DType, Device, SymbolKind, SymbolTable, TensorMeta, TraceBuilder, ValueKind};

    fn prim(name: &str) -> SymKey {
        SymKey::Prim(PrimId::from_name(name).unwrap())
    }

    fn executor(name: &str, fusion: bool, prims: &[&str]) -> ExecutorSpec {
        let impls = prims
            .iter()
            .map(|p| {
                let callee = Callee::function(format!("{name}_{p}"));
                (prim(p), ImplSpec { callee, has_checker: false })
            })
            .collect();
        ExecutorSpec { name: name.to_string(), impls, fusion, fuses_decompositions: false }
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

    #[test]
    fn a_prim_fusion_executor_claims_composites_by_their_decomposition() {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let s = b.record_prim("sin", vec![Arg::Value(e)]).unwrap()[0];
        let prims = b.finish(Arg::Value(s)).unwrap();
        let id = SymbolTable::register("ltorch.test_exp_sin", SymbolKind::Composite);
        let mut composite = BoundSymbol::new(Symbol::Composite(id), vec![Arg::Value(x)], vec![s]);
        composite.subsymbols = prims.bsyms.as_slice().into();
        let trace = prims.with_bsyms(vec![composite], Arg::Value(s));
        let mut torch = executor("torch", false, &["exp", "sin"]);
        let whole = Callee::function("torch_exp_sin");
        torch.impls.insert(SymKey::Symbol(id), ImplSpec { callee: whole, has_checker: false });
        let mut fuser = executor("fuser", true, &["exp", "sin"]);
        // Without the flag the fallback runs the composite whole.
        let (claimed, got) = claim(&trace, &[fuser.clone(), torch.clone()], &mut |_, _| Ok(true)).unwrap();
        assert_eq!((claimed.bsyms.len(), got[0].fusion.is_none()), (1, true));
        fuser.fuses_decompositions = true;
        let (claimed, got) = claim(&trace, &[fuser.clone(), torch.clone()], &mut |_, _| Ok(true)).unwrap();
        assert_eq!(claimed.bsyms.len(), 1, "the composite stays whole, its region code calls the fallback");
        assert_eq!(got[0].fusion.as_ref().map(|f| (f.0, &*f.1.function)), Some((0, "torch_exp_sin")));
        // A checker refusing one prim of the decomposition keeps the composite out.
        fuser.impls.get_mut(&prim("sin")).unwrap().has_checker = true;
        let (_, got) =
            claim(&trace, &[fuser.clone(), torch.clone()], &mut |_, b| Ok(b.symbol != prims.bsyms[1].symbol)).unwrap();
        assert!(got[0].fusion.is_none());
        // A prim the fuser lacks keeps it out too.
        fuser.impls.remove(&prim("sin"));
        let (_, got) = claim(&trace, &[fuser, torch], &mut |_, _| Ok(true)).unwrap();
        assert!(got[0].fusion.is_none());
    }
}
