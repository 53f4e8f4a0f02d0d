//! Emits the Python source of an execution trace: each top-level bound symbol calls the
//! implementation its executor chose, and values are deleted after their last use.

use crate::printer::{write_arg, write_call_with, write_header, write_targets, write_type_comment, ArgStyle};
use crate::trace::{BoundSymbol, Trace};
use crate::value::Arg;
use crate::{Device, ValueId};
use std::fmt::Write;

/// How generated code calls the implementation of a bound symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callee {
    /// The global name of the callable (`torch_sin`).
    pub function: String,
    /// A tensor method with the same signature (`sin`), called as `t0.sin()` when the first
    /// argument is a tensor: method calls are the cheapest way into torch from Python.
    pub method: Option<String>,
}

/// What the code generator needs besides the trace.
pub struct ExecPlan<'a> {
    /// For each top-level bound symbol, how to call the implementation that runs it.
    pub impls: &'a [Callee],
    /// For each top-level bound symbol, the values to delete after it runs.
    pub dels: &'a [Vec<ValueId>],
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

/// Writes the call of `callee`: as a method of the first argument when it is a tensor.
fn write_callee(out: &mut String, trace: &Trace, callee: &Callee, bsym: &BoundSymbol, style: &mut dyn ArgStyle) {
    let args = bsym.call_args();
    match (&callee.method, args.first()) {
        (Some(method), Some(Arg::Value(v))) if trace.tensor(*v).is_some() => {
            write_call_with(out, &format!("{v}.{method}"), &args[1..], &bsym.kwargs, style)
        }
        _ => write_call_with(out, &callee.function, &args, &bsym.kwargs, style),
    }
}

/// `def backward(saved, c0, ...)`, then `t1, t5, = saved` and `saved.clear()`.
fn write_packed_header(out: &mut String, trace: &Trace, name: &str, packed: usize) {
    let (saved, rest) = trace.inputs.split_at(packed);
    let params: String = rest.iter().map(|v| format!(", {v}")).collect();
    writeln!(out, "def {name}(saved{params}):").unwrap();
    for &v in &trace.inputs {
        writeln!(out, "  # {}", crate::printer::describe_value(trace, v)).unwrap();
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
        body.push_str("  ");
        if !bsym.outputs.is_empty() {
            write_targets(&mut body, &bsym.outputs);
            body.push_str(" = ");
        }
        write_callee(&mut body, trace, &plan.impls[i], bsym, &mut devices);
        write_type_comment(&mut body, trace, &bsym.outputs);
        body.push('\n');
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
