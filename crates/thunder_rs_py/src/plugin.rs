//! `load_passes`: reads a plugin's [`PluginTable`] from its capsule and registers each of its
//! passes, so `jit(fn, passes=[name])` runs it like a built-in one. The trace crosses as text
//! (see the `plugin_abi` crate); what comes back is parsed (which re-derives every prim's metadata)
//! and then verified by the manager like any stage's output.

use crate::errors::py_result;
use plugin_abi::{Buffer, PluginTable, ABI_VERSION, CAPSULE_NAME, STATUS_OK, STATUS_PANIC};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::ffi::CStr;
use std::sync::Arc;
use trace_ir::parser::parse_trace;
use trace_ir::{bail, IrError, Result, Trace};

/// One plugin pass, as the registry holds it.
struct PluginPass {
    name: String,
    stage: String,
    entry: &'static plugin_abi::PassEntry,
    table: &'static PluginTable,
}

impl PluginPass {
    /// Prints `trace`, runs the plugin on the text and parses its answer.
    fn run(&self, trace: &Trace) -> Result<Trace> {
        // Grad rules are read by the VJP only, which has run before the forward and backward
        // stages (and, without a split, never runs): there they are dropped; at the program
        // stage, dropping one would change the gradient, and the text form does not carry them yet.
        let stripped;
        let trace = if self.stage == "program" {
            trace
        } else {
            stripped = trace.with_bsyms(trace.bsyms.iter().map(without_grad_rules).collect(), trace.outputs.clone());
            &stripped
        };
        if let Some(composite) = trace.bsyms.iter().find_map(with_grad_rule) {
            bail!(
                NotImplemented,
                "plugin pass",
                "pass {} cannot run on a trace holding the registered grad rule of {composite}: grad rules do not \
                 cross the plugin boundary yet; declare the pass at the forward or backward stage, which run after \
                 autodiff",
                self.name
            );
        }
        let text = plugin_abi::encode(trace);
        let mut out = Buffer::empty();
        // SAFETY: the table was checked at load time; the input is live for the call.
        let status = unsafe { (self.entry.run)(text.as_ptr(), text.len(), &mut out) };
        let answer = if out.ptr.is_null() {
            String::new()
        } else {
            // SAFETY: the plugin hands back `len` bytes it owns until `free`.
            String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(out.ptr, out.len) }).into_owned()
        };
        // SAFETY: the buffer came from this plugin and is freed once.
        unsafe { (self.table.free)(out) };
        let name = &self.name;
        match status {
            STATUS_OK => parse_trace(&answer).map_err(|e| {
                IrError::new(e.kind, "plugin pass", format!("pass {name} returned a trace thunder_rs cannot read: {e}"))
            }),
            STATUS_PANIC => bail!(Runtime, "plugin pass", "{answer}"),
            _ => bail!(Runtime, "plugin pass", "pass {name} failed: {answer}"),
        }
    }
}

/// The name of the first composite at or under `bsym` that holds a grad rule.
fn with_grad_rule(bsym: &trace_ir::BoundSymbol) -> Option<String> {
    if bsym.grad.is_some() {
        return Some(bsym.symbol.qualified_name());
    }
    bsym.subsymbols.iter().find_map(with_grad_rule)
}

/// `bsym` without grad rules at any depth.
fn without_grad_rules(bsym: &trace_ir::BoundSymbol) -> trace_ir::BoundSymbol {
    let mut out = bsym.clone();
    out.grad = None;
    out.subsymbols = bsym.subsymbols.iter().map(without_grad_rules).collect();
    out
}

/// Reads the NUL-terminated string a table field points at.
///
/// # Safety
/// `ptr` is null or a NUL-terminated string that lives as long as the plugin.
unsafe fn field(ptr: *const std::ffi::c_char, what: &str) -> Result<String> {
    if ptr.is_null() {
        bail!(Runtime, "load_passes", "the plugin's table has a null {what}");
    }
    // SAFETY: per the contract.
    Ok(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
}

/// Registers every pass of `table`; returns `(name, stage)` per pass.
///
/// # Safety
/// `table` points at a table that lives as long as the process (a static of a loaded module).
unsafe fn register_table(table: &'static PluginTable) -> Result<Vec<(String, String)>> {
    if table.abi_version != ABI_VERSION {
        bail!(
            Runtime,
            "load_passes",
            "the plugin was built for plugin ABI version {}, this thunder_rs reads version {ABI_VERSION}; \
             rebuild the plugin against the plugin_abi crate of this thunder_rs",
            table.abi_version
        );
    }
    if table.n_passes > 0 && table.passes.is_null() {
        bail!(Runtime, "load_passes", "the plugin's table lists {} passes at a null pointer", table.n_passes);
    }
    // SAFETY: the table is a checked static holding `n_passes` entries.
    let entries: &'static [plugin_abi::PassEntry] =
        if table.n_passes == 0 { &[] } else { unsafe { std::slice::from_raw_parts(table.passes, table.n_passes) } };
    let mut loaded = Vec::with_capacity(entries.len());
    for entry in entries {
        // SAFETY: per this function's contract.
        let (name, stage) = unsafe { (field(entry.name, "pass name")?, field(entry.stage, "stage")?) };
        // The pipeline's table says where a jit's passes run (`plugin_abi::PLUGIN_STAGES` documents it).
        let halves = passes::pipeline::jit_pass_halves();
        if !halves.contains(&stage.as_str()) {
            bail!(Value, "load_passes", "plugin pass {name} declares stage {stage:?}; stages: {}", halves.join(", "));
        }
        let pass = PluginPass { name: name.clone(), stage: stage.clone(), entry, table };
        passes::register_dyn_pass(&name, Arc::new(move |trace, _cx| pass.run(trace)))?;
        passes::manager::set_stage(&name, &stage);
        loaded.push((name, stage));
    }
    Ok(loaded)
}

/// Registers the passes of the plugin table in `capsule` (named `thunder_rs.plugin_table`);
/// returns `(name, stage)` per pass.
#[pyfunction]
pub fn load_plugin_capsule(capsule: &Bound<'_, PyCapsule>) -> PyResult<Vec<(String, String)>> {
    let pointer = capsule.pointer_checked(Some(CAPSULE_NAME))?;
    // SAFETY: a capsule of this name holds a pointer to a static `PluginTable` of a module that
    // stays loaded (Python never unloads extension modules).
    let table: &'static PluginTable = unsafe { &*pointer.as_ptr().cast::<PluginTable>() };
    py_result(unsafe { register_table(table) })
}
