//! Prints traces in Thunder's format: runnable-looking Python with type comments and each
//! composite's decomposition as nested comments.

use crate::trace::{BoundSymbol, GradRule, Symbol, Trace};
use crate::value::{Arg, ValueKind};
use crate::ValueId;
use std::fmt::Write;

/// How literals that need names in generated code are spelled.
pub trait ArgStyle {
    /// The Python expression for `device`: inline in printed traces, a name bound once in the
    /// generated module's globals in the Python-source printer.
    fn device(&mut self, device: crate::Device) -> String;
}

/// Devices printed inline as `torch.device('cpu')`.
pub struct InlineDevices;

impl ArgStyle for InlineDevices {
    fn device(&mut self, device: crate::Device) -> String {
        format!("torch.device('{device}')")
    }
}

/// Writes `arg` as Python source.
pub fn write_arg(out: &mut String, arg: &Arg, style: &mut dyn ArgStyle) {
    match arg {
        Arg::Value(v) => write!(out, "{v}").unwrap(),
        Arg::Scalar(s) => write!(out, "{s}").unwrap(),
        Arg::None => out.push_str("None"),
        Arg::Ellipsis => out.push_str("..."),
        Arg::Str(s) => write!(out, "{s:?}").unwrap(),
        Arg::DType(d) => write!(out, "torch.{}", d.torch_name()).unwrap(),
        Arg::Device(d) => out.push_str(&style.device(*d)),
        Arg::Tuple(items) => {
            out.push('(');
            write_list(out, items, style);
            if items.len() == 1 {
                out.push(',');
            }
            out.push(')');
        }
        Arg::List(items) => {
            out.push('[');
            write_list(out, items, style);
            out.push(']');
        }
        Arg::Slice(parts) => {
            out.push_str("slice(");
            write_list(out, &parts[..], style);
            out.push(')');
        }
        Arg::PyConst(i) => write!(out, "_c{i}").unwrap(),
        Arg::Sym(s) => write!(out, "{}", s.expr).unwrap(),
        Arg::SymFloat(s) => write!(out, "{}", s.expr).unwrap(),
    }
}

fn write_list(out: &mut String, items: &[Arg], style: &mut dyn ArgStyle) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        write_arg(out, item, style);
    }
}

/// Writes `callee(args, key=value)` for a bound symbol.
pub fn write_call(out: &mut String, callee: &str, bsym: &BoundSymbol, style: &mut dyn ArgStyle) {
    write_call_with(out, callee, &bsym.call_args(), &bsym.kwargs, style);
}

/// Writes `callee(args, key=value)`.
pub fn write_call_with(
    out: &mut String,
    callee: &str,
    args: &[Arg],
    kwargs: &[(String, Arg)],
    style: &mut dyn ArgStyle,
) {
    out.push_str(callee);
    out.push('(');
    write_list(out, args, style);
    for (i, (key, value)) in kwargs.iter().enumerate() {
        if i > 0 || !args.is_empty() {
            out.push_str(", ");
        }
        write!(out, "{key}=").unwrap();
        write_arg(out, value, style);
    }
    out.push(')');
}

/// `t3` or `(t3, t4)`: the left-hand side of an assignment.
pub fn write_targets(out: &mut String, outputs: &[ValueId]) {
    match outputs {
        [one] => write!(out, "{one}").unwrap(),
        many => {
            out.push('(');
            for (i, v) in many.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write!(out, "{v}").unwrap();
            }
            out.push(')');
        }
    }
}

/// `cpu f32[4]` or `int 3`: the type of a value as trace comments show it.
pub fn describe_kind(kind: &ValueKind) -> String {
    match kind {
        ValueKind::Tensor(t) => t.describe(),
        ValueKind::Number(n) => format!("{} {n}", n.type_name()),
        ValueKind::Size(hint) => format!("size {hint}"),
    }
}

/// `t3: "cpu f32[4]"`: a value and its type, as trace comments show them.
pub fn describe_value(trace: &Trace, v: ValueId) -> String {
    match trace.values.get(v.index()) {
        Some(kind) => format!("{v}: \"{}\"", describe_kind(kind)),
        None => format!("{v}: \"?\""),
    }
}

/// The type comment of a bound symbol's outputs: `  # t3: "cpu f32[4]"`.
pub fn write_type_comment(out: &mut String, trace: &Trace, outputs: &[ValueId]) {
    if outputs.is_empty() {
        return;
    }
    out.push_str("  # ");
    let described: Vec<String> = outputs.iter().map(|&v| describe_value(trace, v)).collect();
    out.push_str(&described.join(", "));
}

fn write_bsym(out: &mut String, trace: &Trace, bsym: &BoundSymbol, depth: usize) {
    let indent = "  ".repeat(depth + 1);
    if let Symbol::Region(name) = &bsym.symbol {
        writeln!(out, "{indent}# {name}: {} symbols", bsym.subsymbols.len()).unwrap();
    }
    out.push_str(&indent);
    if depth > 0 {
        out.push_str("# ");
    }
    if !bsym.outputs.is_empty() {
        write_targets(out, &bsym.outputs);
        out.push_str(" = ");
    }
    write_call(out, &bsym.symbol.qualified_name(), bsym, &mut InlineDevices);
    write_type_comment(out, trace, &bsym.outputs);
    out.push('\n');
    write_subsymbol_comments(out, trace, bsym, depth + 1);
    if let Some(rule) = &bsym.grad {
        write_grad_rule(out, trace, rule, depth + 1);
    }
}

/// A call's decomposition (or a region's calls) as comments at `depth`.
pub fn write_subsymbol_comments(out: &mut String, trace: &Trace, bsym: &BoundSymbol, depth: usize) {
    for sub in bsym.subsymbols.iter() {
        write_bsym(out, trace, sub, depth);
    }
}

/// The backward a grad rule recorded, as comments under its composite.
fn write_grad_rule(out: &mut String, trace: &Trace, rule: &GradRule, depth: usize) {
    let indent = "  ".repeat(depth + 1);
    let pairs = |items: Vec<String>| items.join(", ");
    let cots = pairs(rule.cotangents.iter().map(|(v, c)| format!("{c} = get_grad({v})")).collect());
    writeln!(out, "{indent}# grad rule: {cots}").unwrap();
    for sub in &rule.bsyms {
        write_bsym(out, trace, sub, depth + 1);
    }
    for (v, g) in &rule.grads {
        let mut text = String::new();
        write_arg(&mut text, g, &mut InlineDevices);
        writeln!(out, "{indent}# put_grad({v}, {text})").unwrap();
    }
}

/// Writes the signature and the input type comments of a traced function.
pub fn write_header(out: &mut String, trace: &Trace, name: &str) {
    let params: Vec<String> = trace.inputs.iter().map(|v| v.to_string()).collect();
    writeln!(out, "def {name}({}):", params.join(", ")).unwrap();
    for &v in &trace.inputs {
        writeln!(out, "  # {}", describe_value(trace, v)).unwrap();
    }
    for guard in trace.facts.guards() {
        writeln!(out, "  # guard {guard}").unwrap();
    }
}

/// Prints a trace in Thunder's format: a header of imports, `def name(inputs):`, a type comment
/// per input, one line per top-level call with its outputs' types as a comment, each
/// composite's decomposition as nested comments under it, and `return`. The text reads back
/// with [`crate::parser::parse_trace`]; `trace.to_string()` prints it as `computation`.
///
/// ```
/// use trace_ir::{Arg, DType, Device, TensorMeta, TraceBuilder, ValueKind};
///
/// let mut b = TraceBuilder::new();
/// let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
/// let y = b.record_prim("exp", vec![Arg::Value(x)])?[0];
/// let trace = b.finish(Arg::Value(y))?;
/// let text = trace_ir::printer::print_trace(&trace, "f");
/// assert!(text.ends_with(concat!(
///     "def f(t0):\n",
///     "  # t0: \"cpu f32[4]\"\n",
///     "  t1 = prims.exp(t0)  # t1: \"cpu f32[4]\"\n",
///     "  return t1\n",
/// )));
/// assert_eq!(trace_ir::parser::parse_trace(&text)?, trace);
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn print_trace(trace: &Trace, name: &str) -> String {
    let mut out = String::from("# Constructed by thunder_rs\nimport torch\nfrom thunder_rs import prims, ltorch\n\n");
    write_header(&mut out, trace, name);
    for bsym in &trace.bsyms {
        write_bsym(&mut out, trace, bsym, 0);
    }
    out.push_str("  return ");
    write_arg(&mut out, &trace.outputs, &mut InlineDevices);
    out.push('\n');
    out
}

impl std::fmt::Display for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&print_trace(self, "computation"))
    }
}
