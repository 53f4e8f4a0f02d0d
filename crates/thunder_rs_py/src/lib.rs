//! `thunder_rs._core`: the Python bindings of the thunder_rs IR and passes. No logic lives here:
//! conversions, handles, and the one error mapping.

mod compile;
mod convert;
mod errors;
mod identity;
mod observe;
mod plugin;
mod recorder;
mod records;
mod region;
mod rules;
mod sizes;
mod table;
mod trace;

use pyo3::prelude::*;
use trace_ir::{DType, SymbolKind, SymbolTable};

/// Registers a composite (`fallback=False`) or fallback symbol, the latter an effect symbol
/// with `effect=True` (kept, unmerged and in program order by every pass); returns its id.
#[pyfunction]
#[pyo3(signature = (name, fallback=false, effect=false))]
fn register_symbol(name: &str, fallback: bool, effect: bool) -> u32 {
    let kind = match (fallback, effect) {
        (_, true) => SymbolKind::Effect,
        (true, false) => SymbolKind::Fallback,
        (false, false) => SymbolKind::Composite,
    };
    SymbolTable::register(name, kind).0
}

/// torch's names of the dtypes, indexed by dtype code.
#[pyfunction]
fn dtype_names() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.torch_name()).collect()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<recorder::Recorder>()?;
    m.add_class::<trace::PyTrace>()?;
    m.add_class::<table::ExecutorTable>()?;
    m.add_class::<table::ExecutorRow>()?;
    m.add_class::<table::ImplEntry>()?;
    m.add_class::<observe::CallObserver>()?;
    m.add_class::<observe::GcCallback>()?;
    m.add_class::<records::RecordedTensor>()?;
    m.add_class::<records::PyTensorMeta>()?;
    m.add_class::<records::Compiled>()?;
    m.add_class::<records::PrimInfo>()?;
    m.add_class::<records::LoadedPass>()?;
    m.add_class::<region::PyRegionCode>()?;
    m.add_class::<region::LeafCall>()?;
    m.add_class::<sizes::PySymExpr>()?;
    m.add_class::<identity::SlotIdentity>()?;
    m.add_class::<identity::DictStamps>()?;
    m.add_function(wrap_pyfunction!(convert::configure, m)?)?;
    m.add_function(wrap_pyfunction!(compile::compile, m)?)?;
    m.add_function(wrap_pyfunction!(compile::compile_backward, m)?)?;
    m.add_function(wrap_pyfunction!(compile::prim_table, m)?)?;
    m.add_function(wrap_pyfunction!(compile::registered_passes, m)?)?;
    m.add_function(wrap_pyfunction!(plugin::load_plugin_capsule, m)?)?;
    m.add_function(wrap_pyfunction!(rules::register_rule_set, m)?)?;
    m.add_function(wrap_pyfunction!(register_symbol, m)?)?;
    m.add_function(wrap_pyfunction!(dtype_names, m)?)?;
    m.add_function(wrap_pyfunction!(identity::same_objects, m)?)?;
    m.add_function(wrap_pyfunction!(identity::dict_versions_stamped, m)?)?;
    Ok(())
}
