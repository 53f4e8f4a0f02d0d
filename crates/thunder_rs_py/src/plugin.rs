//! `load_passes`: reads a plugin's [`PluginTable`] from its capsule and registers each of its
//! passes, so `jit(fn, passes=[name])` runs it like a built-in one. The trace crosses in the
//! binary form of `trace_ir::binary` (see the `plugin_abi` crate), grad rules included; what
//! comes back is decoded (renumbered, its metadata as the plugin's meta rules computed it) and
//! then always verified (every prim's meta rule re-run), before the manager sees it.

use crate::errors::py_result;
use crate::records::LoadedPass;
use plugin_abi::{Buffer, PluginTable, ABI_VERSION, CAPSULE_NAME, STATUS_OK, STATUS_PANIC};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods};
use std::ffi::CStr;
use std::sync::Arc;
use trace_ir::verify::verify;
use trace_ir::{bail, binary, ErrorKind, IrError, Result, Trace};

/// What a failing plugin pass does to the compile that runs it (`load_passes(on_error=...)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnError {
    /// The compile fails with the pass's error (the default).
    Raise,
    /// The compile goes on without the pass, with a warning naming it and its error.
    Skip,
}

impl OnError {
    fn parse(text: &str) -> Result<OnError> {
        match text {
            "raise" => Ok(OnError::Raise),
            "skip" => Ok(OnError::Skip),
            other => {
                bail!(Value, "load_passes", "on_error is \"raise\" or \"skip\", got {other:?} (argument on_error)")
            }
        }
    }
}

/// One plugin pass, as the registry holds it.
struct PluginPass {
    name: String,
    entry: &'static plugin_abi::PassEntry,
    table: &'static PluginTable,
    on_error: OnError,
}

impl PluginPass {
    /// Runs the pass; when it fails (an error, a panic, a trace that does not decode or verify)
    /// and its plugin was loaded with `on_error="skip"`, warns and returns `trace` unchanged.
    fn run_or_skip(&self, trace: &Trace) -> Result<Trace> {
        match (self.run(trace), self.on_error) {
            (Ok(out), _) => Ok(out),
            (Err(e), OnError::Raise) => Err(e),
            (Err(e), OnError::Skip) => {
                warn_skipped(&self.name, &e)?;
                Ok(trace.clone())
            }
        }
    }

    /// Encodes `trace`, runs the plugin on the bytes and decodes its answer.
    fn run(&self, trace: &Trace) -> Result<Trace> {
        let input = binary::encode(trace);
        let mut out = Buffer::empty();
        // SAFETY: the table was checked at load time; the input is live for the call.
        let status = unsafe { (self.entry.run)(input.as_ptr(), input.len(), &mut out) };
        let answer = if out.ptr.is_null() {
            &[][..]
        } else {
            // SAFETY: the plugin hands back `len` bytes it owns until `free`.
            unsafe { std::slice::from_raw_parts(out.ptr, out.len) }
        };
        let name = &self.name;
        // What the plugin returned is its fault, whatever the kind of the error that finds it.
        let misbehaved = |what: &str, e: IrError| {
            IrError::new(ErrorKind::Runtime, "plugin pass", format!("pass {name} returned {what}: {e}"))
        };
        let result = match status {
            STATUS_OK => {
                binary::decode(answer).map_err(|e| misbehaved("a trace thunder_rs cannot read", e)).and_then(|trace| {
                    // Always, whatever `THUNDER_RS_VERIFY` says: the metadata crossed as the
                    // plugin computed it, and a wrong shape would run (0.25 us per symbol).
                    verify(&trace).map_err(|e| misbehaved("an invalid trace", e))?;
                    Ok(trace)
                })
            }
            STATUS_PANIC => Err(IrError::new(ErrorKind::Runtime, "plugin pass", String::from_utf8_lossy(answer))),
            _ => Err(IrError::new(
                ErrorKind::Runtime,
                "plugin pass",
                format!("pass {name} failed: {}", String::from_utf8_lossy(answer)),
            )),
        };
        // SAFETY: the buffer came from this plugin and is freed once, after its last read.
        unsafe { (self.table.free)(out) };
        result
    }
}

/// Warns (a `RuntimeWarning`) that the pass `name` failed with `error` and was skipped. Under
/// `-W error` the warning is raised: the compile then fails with it.
fn warn_skipped(name: &str, error: &IrError) -> Result<()> {
    let message = format!("thunder_rs: plugin pass {name} failed and was skipped (on_error=\"skip\"): {error}");
    let message = std::ffi::CString::new(message.replace('\0', " ")).expect("NUL bytes were replaced");
    Python::attach(|py| PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyRuntimeWarning>(), &message, 1))
        .map_err(|e| IrError::new(ErrorKind::Runtime, "plugin pass", e.to_string()))
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

/// Registers every pass of `table`, failing as `on_error` says; returns `(name, stage)` per pass.
///
/// # Safety
/// `table` points at a table that lives as long as the process (a static of a loaded module).
unsafe fn register_table(table: &'static PluginTable, on_error: OnError) -> Result<Vec<(String, String)>> {
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
        let pass = PluginPass { name: name.clone(), entry, table, on_error };
        passes::register_dyn_pass(&name, Arc::new(move |trace, _cx| pass.run_or_skip(trace)))?;
        passes::manager::set_stage(&name, &stage);
        loaded.push((name, stage));
    }
    Ok(loaded)
}

/// Registers the passes of the plugin table in `capsule` (named `thunder_rs.plugin_table`), each
/// failing as `on_error` (`"raise"` or `"skip"`) says; returns each pass's name and stage.
#[pyfunction]
#[pyo3(signature = (capsule, on_error = "raise"))]
pub fn load_plugin_capsule(capsule: &Bound<'_, PyCapsule>, on_error: &str) -> PyResult<Vec<LoadedPass>> {
    let on_error = py_result(OnError::parse(on_error))?;
    let pointer = capsule.pointer_checked(Some(CAPSULE_NAME))?;
    // SAFETY: a capsule of this name holds a pointer to a static `PluginTable` of a module that
    // stays loaded (Python never unloads extension modules).
    let table: &'static PluginTable = unsafe { &*pointer.as_ptr().cast::<PluginTable>() };
    let loaded = py_result(unsafe { register_table(table, on_error) })?;
    Ok(loaded.into_iter().map(|(name, stage)| LoadedPass::new(name, stage)).collect())
}
