//! Claiming: each top-level bound symbol is given to the first executor, in priority order, that
//! implements its symbol and whose checker (if any) accepts it. A composite no executor claims is
//! replaced by its decomposition, whose bound symbols are claimed in turn.

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
}

/// The checker callback: `(executor index, bound symbol) -> accepted`.
pub type Checker<'a> = dyn FnMut(usize, &BoundSymbol) -> Result<bool> + 'a;

/// Claims every top-level bound symbol. Returns the execution trace (unclaimed composites
/// flattened) and, per bound symbol, how to call the implementation that runs it.
pub fn claim(trace: &Trace, executors: &[ExecutorSpec], checker: &mut Checker) -> Result<(Trace, Vec<Callee>)> {
    let mut bsyms = Vec::with_capacity(trace.bsyms.len());
    let mut impls = Vec::with_capacity(trace.bsyms.len());
    for bsym in &trace.bsyms {
        claim_one(bsym, executors, checker, &mut bsyms, &mut impls)?;
    }
    Ok((trace.with_bsyms(bsyms, trace.outputs.clone()), impls))
}

fn claim_one(
    bsym: &BoundSymbol,
    executors: &[ExecutorSpec],
    checker: &mut Checker,
    bsyms: &mut Vec<BoundSymbol>,
    impls: &mut Vec<Callee>,
) -> Result<()> {
    let key = SymKey::of(&bsym.symbol);
    for (i, executor) in executors.iter().enumerate() {
        let Some(spec) = executor.impls.get(&key) else { continue };
        if spec.has_checker && !checker(i, bsym)? {
            continue;
        }
        bsyms.push(bsym.clone());
        impls.push(spec.callee.clone());
        return Ok(());
    }
    if bsym.subsymbols.is_empty() {
        bail!(NotImplemented, bsym.symbol.qualified_name(), "no executor implements this symbol");
    }
    for sub in &bsym.subsymbols {
        claim_one(sub, executors, checker, bsyms, impls)?;
    }
    Ok(())
}
