//! Emits the Python source of an execution trace: each top-level bound symbol calls the
//! implementation its executor chose, and values are deleted after their last use.

use crate::printer::{
    describe_value, write_arg, write_call_with, write_header, write_subsymbol_comments, write_targets,
    write_type_comment, ArgStyle,
};
use crate::trace::{BoundSymbol, Symbol, Trace};
use crate::value::Arg;
use crate::{Device, ValueId};
use rustc_hash::FxHashMap;
use std::fmt::Write;
use std::sync::Arc;

/// How generated code calls the implementation of a bound symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callee {
    /// The global name of the callable (`torch_sin`).
    pub function: Arc<str>,
    /// A tensor method with the same signature (`sin`), called as `t0.sin()` when the first
    /// argument is a tensor: method calls are the cheapest way into torch from Python.
    pub method: Option<Arc<str>>,
    /// A tensor method computing the same values into the first argument (`mul_`), which the
    /// plan calls instead when that argument is a fresh intermediate dying at this call
    /// (see `passes::reuse`). It takes the arguments `method` takes.
    pub inplace: Option<Arc<str>>,
    /// The positions in the call's arguments (a prim's operands, then its parameters) of the
    /// arguments the method forms take after their receiver, in the methods' order; None: all
    /// after the first, in order. The prim `index_add(a, index, source, dim)` is
    /// `a.index_add(dim, index, source)`: `[3, 1, 2]`.
    pub method_args: Option<Arc<[usize]>>,
}

impl Callee {
    /// A plain function call, with no method forms.
    pub fn function(function: impl Into<Arc<str>>) -> Callee {
        Callee { function: function.into(), method: None, inplace: None, method_args: None }
    }

    /// A call of `function` with the method forms `method` and `method_` (`exp`, `exp_`), which
    /// take the call's arguments after the first.
    pub fn with_methods(function: impl Into<Arc<str>>, method: &str) -> Callee {
        let (method, inplace) = (Some(method.into()), Some(format!("{method}_").into()));
        Callee { function: function.into(), method, inplace, method_args: None }
    }
}

/// What the code generator needs besides the trace.
pub struct ExecPlan<'a> {
    /// For each top-level bound symbol, how to call the implementation that runs it.
    pub impls: &'a [Callee],
    /// For each top-level bound symbol, the values to delete after it runs.
    pub dels: &'a [Vec<ValueId>],
    /// For each top-level bound symbol (or none: empty), the outputs to cut from torch's autograd
    /// right after it (`t3 = t3.detach()`): values the trace computed without grad, in code that
    /// runs under autograd.
    pub detached: &'a [Vec<ValueId>],
    /// For a backward: how many leading inputs arrive packed in one list, `saved`, which the
    /// function empties as it unpacks them so that each is freed after its last use.
    pub packed: Option<usize>,
}

/// Devices hoisted to module constants (`_dev0 = torch.device('cpu')`), built once per entry.
#[derive(Default)]
struct HoistedDevices {
    devices: Vec<Device>,
}

impl ArgStyle for HoistedDevices {
    fn device(&mut self, device: Device) -> String {
        let index = match self.devices.iter().position(|d| *d == device) {
            Some(i) => i,
            None => {
                self.devices.push(device);
                self.devices.len() - 1
            }
        };
        format!("_dev{index}")
    }
}

/// Writes the call of `callee`: as a method of the first argument when it is a tensor (and
/// `method_args` names only positions the call has).
fn write_callee(out: &mut String, trace: &Trace, callee: &Callee, bsym: &BoundSymbol, style: &mut dyn ArgStyle) {
    let args = bsym.call_args();
    if let (Some(method), Some(Arg::Value(v))) = (&callee.method, args.first()) {
        let taken = match &callee.method_args {
            Some(order) => order.iter().map(|&i| args.get(i).cloned()).collect(),
            None => Some(args[1..].to_vec()),
        };
        if let (Some(taken), Some(_)) = (taken, trace.tensor(*v)) {
            return write_call_with(out, &format!("{v}.{method}"), &taken, &bsym.kwargs, style);
        }
    }
    write_call_with(out, &callee.function, &args, &bsym.kwargs, style)
}

/// One line of generated code calling `callee` for `bsym`. A region's call unpacks the tuple
/// its function always returns, under a comment naming it and with its calls as comments.
fn write_statement(out: &mut String, trace: &Trace, callee: &Callee, bsym: &BoundSymbol, style: &mut dyn ArgStyle) {
    let region = matches!(bsym.symbol, Symbol::Region(_));
    if region {
        writeln!(out, "  # {}: {} symbols", callee.function, bsym.subsymbols.len()).unwrap();
    }
    out.push_str("  ");
    match (region, bsym.outputs.as_slice()) {
        (_, []) => {}
        (true, [one]) => write!(out, "({one},) = ").unwrap(),
        (_, outputs) => {
            write_targets(out, outputs);
            out.push_str(" = ");
        }
    }
    write_callee(out, trace, callee, bsym, style);
    write_type_comment(out, trace, &bsym.outputs);
    out.push('\n');
    if region {
        write_subsymbol_comments(out, trace, bsym, 1);
    }
}

/// `def backward(saved, c0, ...)`, then `t1, t5, = saved` and `saved.clear()`.
fn write_packed_header(out: &mut String, trace: &Trace, name: &str, packed: usize) {
    let (saved, rest) = trace.inputs.split_at(packed);
    let params: String = rest.iter().map(|v| format!(", {v}")).collect();
    writeln!(out, "def {name}(saved{params}):").unwrap();
    for &v in &trace.inputs {
        writeln!(out, "  # {}", describe_value(trace, v)).unwrap();
    }
    if !saved.is_empty() {
        let targets: String = saved.iter().map(|v| format!("{v}, ")).collect();
        writeln!(out, "  {} = saved", targets.trim_end()).unwrap();
    }
    out.push_str("  saved.clear()\n");
}

/// The module source defining `def {name}(...)` for `trace` under `plan`.
pub fn python_source(trace: &Trace, plan: &ExecPlan, name: &str) -> String {
    let mut devices = HoistedDevices::default();
    let mut body = String::new();
    match plan.packed {
        None => write_header(&mut body, trace, name),
        Some(n) => write_packed_header(&mut body, trace, name, n),
    }
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        write_statement(&mut body, trace, &plan.impls[i], bsym, &mut devices);
        for v in plan.detached.get(i).map_or(&[][..], Vec::as_slice) {
            writeln!(body, "  {v} = {v}.detach()").unwrap();
        }
        if let Some(dels) = plan.dels.get(i).filter(|d| !d.is_empty()) {
            let names: Vec<String> = dels.iter().map(|v| v.to_string()).collect();
            writeln!(body, "  del {}", names.join(", ")).unwrap();
        }
    }
    body.push_str("  return ");
    write_arg(&mut body, &trace.outputs, &mut devices);
    body.push('\n');
    let mut out = String::from("# Constructed by thunder_rs (execution trace)\nimport torch\n");
    for (i, d) in devices.devices.iter().enumerate() {
        writeln!(out, "_dev{i} = torch.device('{d}')").unwrap();
    }
    out.push('\n');
    out.push_str(&body);
    out
}

/// The module source of one region's function: `def {name}(inputs...)` runs the region's calls
/// with `callees` (one per call) and always returns a tuple of the region's outputs. Devices
/// are module constants, as in [`python_source`].
pub fn region_source(trace: &Trace, region: &BoundSymbol, callees: &[Callee], name: &str) -> String {
    let mut devices = HoistedDevices::default();
    let params: Vec<String> = region.inputs().iter().map(ValueId::to_string).collect();
    let mut body = format!("def {name}({}):\n", params.join(", "));
    let dels = region_dels(region);
    for (i, (sub, callee)) in region.subsymbols.iter().zip(callees).enumerate() {
        body.push_str("  ");
        if !sub.outputs.is_empty() {
            write_targets(&mut body, &sub.outputs);
            body.push_str(" = ");
        }
        write_callee(&mut body, trace, callee, sub, &mut devices);
        body.push('\n');
        if !dels[i].is_empty() {
            let names: Vec<String> = dels[i].iter().map(ValueId::to_string).collect();
            writeln!(body, "  del {}", names.join(", ")).unwrap();
        }
    }
    let outputs: String = region.outputs.iter().map(|v| format!("{v}, ")).collect();
    writeln!(body, "  return ({})", outputs.trim_end()).unwrap();
    let mut out = String::new();
    for (i, d) in devices.devices.iter().enumerate() {
        writeln!(out, "_dev{i} = torch.device('{d}')").unwrap();
    }
    out.push_str(&body);
    out
}

/// Per call of a region, the intermediates whose last use it is (not the region's outputs).
fn region_dels(region: &BoundSymbol) -> Vec<Vec<ValueId>> {
    let mut last_use: rustc_hash::FxHashMap<ValueId, usize> = Default::default();
    let mut defined: Vec<ValueId> = Vec::new();
    for (i, sub) in region.subsymbols.iter().enumerate() {
        sub.for_each_input(|v| {
            if let Some(last) = last_use.get_mut(&v) {
                *last = i;
            }
        });
        for &v in &sub.outputs {
            last_use.insert(v, i);
            defined.push(v);
        }
    }
    let outputs: rustc_hash::FxHashSet<ValueId> = region.outputs.iter().copied().collect();
    let mut dels = vec![Vec::new(); region.subsymbols.len()];
    for v in defined {
        if !outputs.contains(&v) {
            dels[last_use[&v]].push(v);
        }
    }
    dels
}

/// A structural key of a region: its source with values renamed in order of first appearance
/// and its name replaced, followed by its inputs' metadata; identical regions (repeated layers)
/// have equal keys.
pub fn region_key(trace: &Trace, region: &BoundSymbol, callees: &[Callee]) -> String {
    let mut key = rename_values(&region_source(trace, region, callees, "region"));
    for (i, v) in region.inputs().into_iter().enumerate() {
        let kind = trace.values.get(v.index()).map_or_else(|| "?".to_string(), crate::printer::describe_kind);
        writeln!(key, "# input {i}: {kind}").unwrap();
    }
    key
}

/// `source` with every value name (`t12`) outside string literals renamed `v0`, `v1`, ... in
/// order of first appearance.
fn rename_values(source: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    map_value_names(source, |name| {
        let index = names.iter().position(|n| n == name).unwrap_or_else(|| {
            names.push(name.to_string());
            names.len() - 1
        });
        format!("v{index}")
    })
}

/// `source` with the value names given in `names` (`t0` -> `l_x`) replaced outside string
/// literals: how traces show the program's inputs under the user's names.
pub fn name_values(source: &str, names: &FxHashMap<String, String>) -> String {
    map_value_names(source, |name| names.get(name).cloned().unwrap_or_else(|| name.to_string()))
}

/// `source` with each value name (`t12`: a word of `t` and digits) outside string literals
/// replaced by `rename(name)`.
fn map_value_names(source: &str, mut rename: impl FnMut(&str) -> String) -> String {
    let bytes = source.as_bytes();
    let mut out = String::with_capacity(source.len());
    let (mut i, mut in_string) = (0, false);
    while i < bytes.len() {
        let c = bytes[i];
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b'.');
        if in_string || c != b't' || !starts_word {
            if c == b'"' && (i == 0 || bytes[i - 1] != b'\\') {
                in_string = !in_string;
            }
            // Copy the whole UTF-8 sequence: non-ASCII bytes never start a value name.
            let end = (i + 1..bytes.len()).find(|&j| source.is_char_boundary(j)).unwrap_or(bytes.len());
            out.push_str(&source[i..end]);
            i = end;
            continue;
        }
        let end = (i + 1..bytes.len()).find(|&j| !bytes[j].is_ascii_digit()).unwrap_or(bytes.len());
        let follows_word = end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_');
        if end == i + 1 || follows_word {
            out.push('t');
            i += 1;
            continue;
        }
        out.push_str(&rename(&source[i..end]));
        i = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_values_renames_whole_value_names_outside_strings() {
        let names: FxHashMap<String, String> =
            [("t0", "l_größe"), ("t1", "w")].into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let source = "def f(t0, t1):\n  t10 = g(t0, \"t0\", t1)  # é t1: \"cpu\"\n  return (t10, t01x, at0)\n";
        let named = name_values(source, &names);
        assert_eq!(
            named,
            "def f(l_größe, w):\n  t10 = g(l_größe, \"t0\", w)  # é w: \"cpu\"\n  return (t10, t01x, at0)\n"
        );
        assert_eq!(name_values(&named, &FxHashMap::default()), named);
    }

    #[test]
    fn method_args_reorder_a_methods_arguments_and_a_bad_position_falls_back_to_the_function() {
        let text = "def computation(t0, t1, t2):\n  # t0: \"cpu f32[6, 4]\"\n  # t1: \"cpu i64[3]\"\n  # t2: \"cpu f32[3, 4]\"\n  t3 = prims.index_add(t0, t1, t2, 0)\n  return t3\n";
        let trace = crate::parser::parse_trace(text).unwrap();
        let call = |order: &[usize]| {
            let callee =
                Callee { method_args: Some(order.into()), ..Callee::with_methods("prim_index_add", "index_add") };
            let plan = ExecPlan { impls: &[callee], dels: &[], detached: &[], packed: None };
            let source = python_source(&trace, &plan, "computation");
            source.lines().find(|l| l.starts_with("  t3 = ")).unwrap().split("  #").next().unwrap().to_string()
        };
        assert_eq!(call(&[3, 1, 2]), "  t3 = t0.index_add(0, t1, t2)");
        assert_eq!(call(&[3, 1, 4]), "  t3 = prim_index_add(t0, t1, t2, 0)");
    }
}
