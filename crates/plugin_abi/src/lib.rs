//! The boundary between thunder_rs and a user's pass plugin: a versioned, `#[repr(C)]` table of
//! `extern "C"` functions, exported by the plugin as a `PyCapsule` named [`CAPSULE_NAME`] and read
//! by `thunder_rs.load_passes`.
//!
//! Nothing Rust-specific crosses it, so the plugin and thunder_rs need not be built by the same
//! compiler, share an allocator or link the same copy of `trace_ir`: a trace crosses in the
//! versioned binary form of [`trace_ir::binary`] (its values renumbered in definition order by the
//! decoder; the printed text, [`encode_text`], stays for people), every buffer is freed by the
//! side that allocated it (the plugin's buffers through [`PluginTable::free`]), and a panic never
//! unwinds across it ([`run_pass`] catches it on the plugin side).
//!
//! A plugin declares its passes with [`pass_entry!`] and its table with [`plugin_table!`]:
//!
//! ```
//! use trace_ir::{Result, Trace};
//!
//! fn identity(trace: &Trace) -> Result<Trace> {
//!     Ok(trace.clone())
//! }
//!
//! static PASSES: [plugin_abi::PassEntry; 1] = [plugin_abi::pass_entry!("my_identity", "program", identity)];
//! static TABLE: plugin_abi::PluginTable = plugin_abi::plugin_table!(PASSES);
//! assert_eq!(TABLE.abi_version, plugin_abi::ABI_VERSION);
//! ```

#![deny(missing_docs)]

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use trace_ir::{binary, Arg, ValueId};
#[doc(hidden)]
pub use trace_ir::{Result as IrResult, Trace};

/// The version of the table's layout and of the trace encoding; bumped on any change to either.
/// Version 1 crossed as text; 2 crosses in [`trace_ir::binary`]'s format version 1.
pub const ABI_VERSION: u32 = 2;

/// The name of the capsule holding a `*const PluginTable`.
pub const CAPSULE_NAME: &CStr = c"thunder_rs.plugin_table";

/// The stages a plugin pass may declare: `program` runs before autodiff (after `dce` and `cse`,
/// where `jit(fn, passes=[...])` runs passes), `forward` and `backward` on the halves after the split.
pub const PLUGIN_STAGES: &[&str] = &["program", "forward", "backward"];

/// What a pass run returns: the new trace, encoded, or an error.
pub const STATUS_OK: i32 = 0;
/// The pass returned an error; the buffer holds its message.
pub const STATUS_ERROR: i32 = 1;
/// The pass panicked; the buffer holds the panic's message.
pub const STATUS_PANIC: i32 = 2;

/// Bytes the plugin allocated, handed to thunder_rs, and given back through [`PluginTable::free`].
#[repr(C)]
#[derive(Debug)]
pub struct Buffer {
    /// The bytes (an encoded trace, or a UTF-8 message); null when `len` is 0.
    pub ptr: *mut u8,
    /// Their count.
    pub len: usize,
}

impl Buffer {
    /// A buffer owning `text`'s bytes, freed by [`free_buffer`] in the same library.
    pub fn from_string(text: String) -> Buffer {
        Buffer::from_bytes(text.into_bytes())
    }

    /// A buffer owning `bytes`, freed by [`free_buffer`] in the same library.
    pub fn from_bytes(bytes: Vec<u8>) -> Buffer {
        let bytes = bytes.into_boxed_slice();
        let len = bytes.len();
        Buffer { ptr: Box::into_raw(bytes).cast(), len }
    }

    /// An empty buffer, which owns nothing.
    pub const fn empty() -> Buffer {
        Buffer { ptr: std::ptr::null_mut(), len: 0 }
    }
}

/// Runs a pass: reads the `len` bytes of an encoded trace at `input`, writes the result (the
/// encoded trace, or the error message, per the returned status) to `*out`.
pub type RunFn = unsafe extern "C" fn(input: *const u8, len: usize, out: *mut Buffer) -> i32;

/// Frees a [`Buffer`] the plugin allocated.
pub type FreeFn = unsafe extern "C" fn(buffer: Buffer);

/// One pass of a plugin.
#[repr(C)]
#[derive(Debug)]
pub struct PassEntry {
    /// The name `jit(fn, passes=[...])` uses, NUL-terminated.
    pub name: *const c_char,
    /// The stage it runs at, one of [`PLUGIN_STAGES`], NUL-terminated.
    pub stage: *const c_char,
    /// Runs it.
    pub run: RunFn,
}

/// The table a plugin exports.
#[repr(C)]
#[derive(Debug)]
pub struct PluginTable {
    /// [`ABI_VERSION`] as the plugin was built; checked before anything else is read.
    pub abi_version: u32,
    /// The number of entries at `passes`.
    pub n_passes: usize,
    /// The passes.
    pub passes: *const PassEntry,
    /// Frees the buffers the passes return.
    pub free: FreeFn,
}

// SAFETY: the tables are immutable statics pointing at other statics (string literals, functions).
unsafe impl Sync for PassEntry {}
// SAFETY: as above.
unsafe impl Sync for PluginTable {}

/// Frees a buffer made by [`Buffer::from_bytes`] in this copy of the crate.
///
/// # Safety
/// `buffer` came from [`Buffer::from_bytes`] in the same library and is freed once.
pub unsafe extern "C" fn free_buffer(buffer: Buffer) {
    if !buffer.ptr.is_null() {
        // SAFETY: per the contract, the pointer and length are those of a leaked boxed slice.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buffer.ptr, buffer.len)) });
    }
}

/// The plugin side of a pass run: decodes the input, runs `pass` with panics caught, and writes
/// the encoded result or the error into `*out`.
///
/// # Safety
/// `input` points at `len` readable bytes; `out` is writable.
pub unsafe fn run_pass(
    name: &str,
    pass: fn(&Trace) -> trace_ir::Result<Trace>,
    input: *const u8,
    len: usize,
    out: *mut Buffer,
) -> i32 {
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: per the contract.
        unsafe { std::slice::from_raw_parts(input, len) }
    };
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<u8>, String> {
        let trace = binary::decode(bytes).map_err(|e| format!("the plugin could not read the trace: {e}"))?;
        let trace = pass(&trace).map_err(|e| e.to_string())?;
        Ok(binary::encode(&trace))
    }));
    let (status, bytes) = match result {
        Ok(Ok(bytes)) => (STATUS_OK, bytes),
        Ok(Err(message)) => (STATUS_ERROR, message.into_bytes()),
        Err(payload) => (STATUS_PANIC, panic_message(&*payload, name).into_bytes()),
    };
    // SAFETY: per the contract.
    unsafe { out.write(Buffer::from_bytes(bytes)) };
    status
}

fn panic_message(payload: &(dyn std::any::Any + Send), name: &str) -> String {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".to_string());
    format!("pass {name} panicked: {detail}")
}

/// A [`PassEntry`] for the pass `$pass: fn(&Trace) -> trace_ir::Result<Trace>` named `$name`
/// at the stage `$stage` (string literals); usable in a `static`.
#[macro_export]
macro_rules! pass_entry {
    ($name:literal, $stage:literal, $pass:path) => {{
        unsafe extern "C" fn run(input: *const u8, len: usize, out: *mut $crate::Buffer) -> i32 {
            const NAME: &str = $name;
            let pass: fn(&$crate::Trace) -> $crate::IrResult<$crate::Trace> = $pass;
            // SAFETY: thunder_rs passes the input it printed and a writable result slot.
            unsafe { $crate::run_pass(NAME, pass, input, len, out) }
        }
        $crate::PassEntry {
            name: concat!($name, "\0").as_ptr().cast(),
            stage: concat!($stage, "\0").as_ptr().cast(),
            run,
        }
    }};
}

/// The [`PluginTable`] of the static array of [`PassEntry`] `$passes`.
#[macro_export]
macro_rules! plugin_table {
    ($passes:path) => {
        $crate::PluginTable {
            abi_version: $crate::ABI_VERSION,
            n_passes: $passes.len(),
            passes: $passes.as_ptr(),
            free: $crate::free_buffer,
        }
    };
}

/// The printed text of a trace as [`trace_ir::parser::parse_trace`] reads it back, for reading
/// what crosses (dumps, debugging a plugin); the crossing itself is binary ([`trace_ir::binary`]).
/// Values are renumbered in the order they are defined, which the parser requires (a pass's
/// output, a rewrite's say, defines new values with higher numbers before old ones); values no
/// call defines or reads are left out, and grad rules, which the text does not carry.
pub fn encode_text(trace: &Trace) -> String {
    let trace = canonical(trace);
    let text = trace.to_string();
    let grad_inputs: Vec<String> = trace
        .inputs
        .iter()
        .filter(|&&v| matches!(trace.value(v), trace_ir::ValueKind::Tensor(t) if t.requires_grad))
        .map(|v| format!("# {v}: \""))
        .collect();
    if grad_inputs.is_empty() {
        return text;
    }
    // The printer leaves `requires_grad` out of the inputs' type comments; the parser reads it
    // there (and derives it for every other value), so the header carries it.
    let mut out = String::with_capacity(text.len() + 16 * grad_inputs.len());
    let mut header = true;
    for line in text.split_inclusive('\n') {
        let marked = header && grad_inputs.iter().any(|p| line.trim_start().starts_with(p.as_str()));
        match line.trim_end().strip_suffix('"') {
            Some(body) if marked => {
                out.push_str(body);
                out.push_str(" requires_grad\"\n");
            }
            _ => out.push_str(line),
        }
        header &= !line.trim_start().starts_with("return") && !line.contains(" = ");
    }
    out
}

/// `trace` with its values numbered in definition order (inputs, then each call's, its
/// decomposition's first).
pub fn canonical(trace: &Trace) -> Trace {
    let mut order: Vec<ValueId> = trace.inputs.clone();
    trace.bsyms.iter().for_each(|b| b.for_each_defined(&mut |v| order.push(v)));
    let mut map: HashMap<ValueId, ValueId> = HashMap::with_capacity(order.len());
    let mut values = Vec::with_capacity(order.len());
    for old in order {
        if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(old) {
            slot.insert(ValueId(values.len() as u32));
            values.push(trace.value(old).clone());
        }
    }
    if map.iter().all(|(old, new)| old == new) && values.len() == trace.values.len() {
        return trace.clone();
    }
    let subst: rustc_hash::FxHashMap<ValueId, ValueId> = map.into_iter().collect();
    let outputs = trace.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
    let rename = |v: ValueId| *subst.get(&v).unwrap_or(&v);
    Trace {
        values: Arc::new(values.iter().map(|k| k.renamed(&rename)).collect()),
        inputs: trace.inputs.iter().map(|v| subst[v]).collect(),
        bsyms: trace.bsyms.iter().map(|b| b.renamed_everywhere(&subst)).collect(),
        outputs,
        facts: Arc::new(trace.facts.renamed(&rename)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, SymbolKind, SymbolTable, TensorMeta, TraceBuilder, ValueKind};

    fn identity(trace: &Trace) -> trace_ir::Result<Trace> {
        Ok(trace.clone())
    }

    fn explode(_trace: &Trace) -> trace_ir::Result<Trace> {
        panic!("boom")
    }

    static PASSES: [PassEntry; 2] =
        [pass_entry!("id", "program", identity), pass_entry!("explode", "forward", explode)];
    static TABLE: PluginTable = plugin_table!(PASSES);

    /// A composite over a grad-requiring input, then a prim: the structure a crossing must keep.
    fn sample() -> Trace {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![2, 3]) };
        let x = b.add_input(ValueKind::Tensor(meta));
        b.begin_composite(SymbolTable::register("ltorch.sigmoid", SymbolKind::Composite), vec![Arg::Value(x)], vec![]);
        let n = b.record_prim("neg", vec![Arg::Value(x)]).unwrap()[0];
        let e = b.record_prim("exp", vec![Arg::Value(n)]).unwrap()[0];
        b.end_composite(vec![e]).unwrap();
        let y = b.record_prim("mul", vec![Arg::Value(x), Arg::Value(e)]).unwrap()[0];
        b.finish(Arg::Value(y)).unwrap()
    }

    fn run(entry: &PassEntry, input: &[u8]) -> (i32, Vec<u8>) {
        let mut out = Buffer::empty();
        // SAFETY: a live input and a writable slot.
        let status = unsafe { (entry.run)(input.as_ptr(), input.len(), &mut out) };
        // SAFETY: the buffer holds `len` bytes until freed.
        let answer = unsafe { std::slice::from_raw_parts(out.ptr, out.len) }.to_vec();
        // SAFETY: freed once.
        unsafe { (TABLE.free)(out) };
        (status, answer)
    }

    #[test]
    fn an_identity_crossing_keeps_the_trace() {
        let trace = sample();
        let (status, answer) = run(&PASSES[0], &binary::encode(&trace));
        assert_eq!(status, STATUS_OK, "{}", String::from_utf8_lossy(&answer));
        assert_eq!(binary::decode(&answer).unwrap(), trace);
    }

    #[test]
    fn a_panic_is_caught_and_names_the_pass() {
        let (status, answer) = run(&PASSES[1], &binary::encode(&sample()));
        assert_eq!(status, STATUS_PANIC);
        assert_eq!(answer, b"pass explode panicked: boom");
    }

    #[test]
    fn a_corrupt_input_is_an_error_naming_the_byte() {
        let mut input = binary::encode(&sample());
        input.truncate(input.len() - 3);
        let (status, answer) = run(&PASSES[0], &input);
        assert_eq!(status, STATUS_ERROR);
        let message = String::from_utf8(answer).unwrap();
        assert!(message.starts_with("the plugin could not read the trace: trace decoder: byte"), "{message}");
        assert_eq!(run(&PASSES[0], &[]).0, STATUS_ERROR);
    }

    #[test]
    fn the_text_form_reads_back() {
        let trace = sample();
        assert_eq!(trace_ir::parser::parse_trace(&encode_text(&trace)).unwrap(), trace);
    }

    #[test]
    fn values_are_renumbered_in_definition_order() {
        let trace = sample();
        // The same calls with the mul's output numbered before the composite's values.
        let mut shuffled = trace.clone();
        let mut values = (*trace.values).clone();
        values.swap(1, 3);
        shuffled.values = Arc::new(values);
        let swap: rustc_hash::FxHashMap<ValueId, ValueId> =
            [(ValueId(1), ValueId(3)), (ValueId(3), ValueId(1))].into_iter().collect();
        shuffled.bsyms = trace.bsyms.iter().map(|b| b.renamed_everywhere(&swap)).collect();
        shuffled.outputs = Arg::Value(ValueId(1));
        assert_eq!(canonical(&shuffled), trace);
    }
}
