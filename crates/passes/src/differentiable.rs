//! A program compiled to run under torch's autograd rather than differentiated by the VJP pass
//! (`Options::differentiable`): the path of a double backward through a compiled call and of
//! torch.func transforms over one. Its generated code is plain torch calls that torch's autograd
//! records; what the trace says about gradients must then be said to torch at run time.

use trace_ir::{Arg, BoundSymbol, Scalar, Symbol, SymbolTable, Trace, ValueId};

/// Per top-level bound symbol, the outputs the generated code detaches right after it: values
/// the trace computed without grad from a value that requires grad (calls recorded under
/// `torch.no_grad()`, `detach()`), which autograd would otherwise record as it runs them, so
/// that gradients would flow where eager's do not (a power iteration under `no_grad`).
pub fn detached_outputs(trace: &Trace) -> Vec<Vec<ValueId>> {
    let requires_grad = |v: ValueId| trace.tensor(v).is_some_and(|t| t.requires_grad);
    trace
        .bsyms
        .iter()
        .map(|bsym| {
            let mut reads_grad = false;
            bsym.for_each_input(|v| reads_grad |= requires_grad(v));
            if !reads_grad {
                return Vec::new();
            }
            let cut = |o: &&ValueId| trace.tensor(**o).is_some_and(|t| !t.requires_grad && t.dtype.is_inexact());
            bsym.outputs.iter().filter(cut).copied().collect()
        })
        .collect()
}

/// The positions of the trace's inputs that the calls computing its flat outputs at `outputs`
/// read (a single output is position 0). A compiled call that must compute those outputs again
/// (a double backward) needs these inputs as they were.
pub fn inputs_read(trace: &Trace, outputs: &[usize]) -> Vec<usize> {
    let mut live = values_of(trace, outputs);
    for bsym in trace.bsyms.iter().rev() {
        if !bsym.outputs.iter().any(|o| live[o.index()]) {
            continue;
        }
        if updates_statistics_only(bsym, &live) {
            let kept = bsym.args.iter().enumerate().filter(|(i, _)| !RUNNING_STATISTICS.contains(i));
            kept.for_each(|(_, a)| a.for_each_value(&mut |v| live[v.index()] = true));
        } else {
            bsym.for_each_read(&mut |v| live[v.index()] = true);
        }
    }
    positions(trace, &live)
}

/// The arguments of batch norm's training kernel (`ltorch.native_batch_norm(input, weight, bias,
/// running_mean, running_var, training, momentum, eps)`) that only its updated running statistics
/// (outputs 3 and 4) read: its output and batch statistics are the batch's alone, as eager's
/// kernel's, whose autograd node reads the running statistics in eval mode only.
const RUNNING_STATISTICS: [usize; 3] = [3, 4, 6];

/// Whether `bsym` is batch norm's training kernel whose updated running statistics are not
/// `live`: computing its other outputs again reads no running statistic (a double backward through
/// a BatchNorm keeps no copy of the statistics the call writes back, as eager keeps none).
fn updates_statistics_only(bsym: &BoundSymbol, live: &[bool]) -> bool {
    let Symbol::Composite(id) = bsym.symbol else { return false };
    bsym.outputs.len() == 5
        && bsym.kwargs.is_empty()
        && matches!(bsym.args.get(5), Some(Arg::Scalar(Scalar::Bool(true))))
        && !live[bsym.outputs[3].index()]
        && !live[bsym.outputs[4].index()]
        && &*SymbolTable::name(id) == "ltorch.native_batch_norm"
}

/// The positions among `outputs` (flat output positions) whose computation reads one of
/// `values` along values that require grad: the outputs through which a backward reaches the
/// calls that computed `values`, as eager's autograd graph links them (a comparison, a
/// `detach()` or a call under `no_grad` is no link). A backward from one of them runs the
/// autograd node of such a call, and so unpacks what eager saved for it.
pub fn outputs_reaching(trace: &Trace, values: &[ValueId], outputs: &[usize]) -> Vec<usize> {
    let requires_grad = |v: ValueId| trace.tensor(v).is_some_and(|t| t.requires_grad);
    let reaches = |i: usize| {
        let mut live = values_of(trace, &[i]);
        for (v, held) in live.iter_mut().enumerate() {
            *held &= requires_grad(ValueId(v as u32));
        }
        for bsym in trace.bsyms.iter().rev() {
            if bsym.outputs.iter().any(|o| live[o.index()]) {
                bsym.for_each_read(&mut |v| live[v.index()] |= requires_grad(v));
            }
        }
        values.iter().any(|v| live.get(v.index()).copied().unwrap_or(false))
    };
    outputs.iter().copied().filter(|&i| reaches(i)).collect()
}

/// Per value of `values`, whether a top-level call of the trace computing a value that requires
/// grad reads it along gradients (it requires grad too): one walk for all of them. Only such a
/// value may be reached by the backward of an output other than its own ([`outputs_reaching`],
/// a walk per value): `loss` computed from a returned `logits`.
pub fn values_read_along_gradients(trace: &Trace, values: &[ValueId]) -> Vec<bool> {
    let requires_grad = |v: ValueId| trace.tensor(v).is_some_and(|t| t.requires_grad);
    let mut read = vec![false; trace.values.len()];
    for bsym in trace.bsyms.iter().filter(|b| b.outputs.iter().any(|&o| requires_grad(o))) {
        bsym.for_each_read(&mut |v| read[v.index()] |= requires_grad(v));
    }
    values.iter().map(|v| read.get(v.index()).copied().unwrap_or(false)).collect()
}

/// The positions of the trace's inputs a run of it reads: those the calls DCE keeps read (the
/// outputs' computations and calls with an effect, [`crate::dce`]'s roots) and those the outputs
/// hold. A compiled call needs no other input: its caller may leave them out (torch's autograd
/// then keeps no edge to a parameter the call never reads).
pub fn inputs_needed(trace: &Trace) -> Vec<usize> {
    let mut live = vec![false; trace.values.len()];
    trace.outputs.for_each_value(&mut |v| live[v.index()] = true);
    for bsym in trace.bsyms.iter().rev() {
        if bsym.outputs.iter().any(|o| live[o.index()]) || bsym.has_effect() {
            bsym.for_each_read(&mut |v| live[v.index()] = true);
        }
    }
    positions(trace, &live)
}

/// The positions of the trace's inputs that its flat outputs at `outputs` hold as they are, at
/// any depth (the inputs a differentiated program's forward saves among its residuals).
pub fn inputs_returned(trace: &Trace, outputs: &[usize]) -> Vec<usize> {
    positions(trace, &values_of(trace, outputs))
}

/// For each flat output of a differentiated forward (the first item of its outputs, which are
/// `(outputs, residuals)`: one value or a tuple or list of them), the index of the top-level call
/// that made its memory, or None for one no call computes (an input, a number, None): the call
/// computing it, or where that call writes into its receiver and returns it (`writes_receiver`:
/// an in-place form [`crate::reuse`] picked), the call that made the receiver's. The caller asks
/// that call's implementation whether what it returns may be a view (`autograd._own_views`).
pub fn output_producers(trace: &Trace, writes_receiver: impl Fn(usize) -> bool) -> Vec<Option<usize>> {
    let outputs = match &trace.outputs {
        Arg::Tuple(items) | Arg::List(items) => items.first(),
        _ => None,
    };
    let flat = match outputs {
        Some(Arg::Tuple(items) | Arg::List(items)) => items.as_slice(),
        Some(single) => std::slice::from_ref(single),
        None => &[],
    };
    let producer = |v: ValueId| trace.bsyms.iter().position(|b| b.outputs.contains(&v));
    let made = |mut v: ValueId| loop {
        let i = producer(v)?;
        match trace.bsyms[i].args.first() {
            Some(Arg::Value(receiver)) if writes_receiver(i) => v = *receiver,
            _ => return Some(i),
        }
    };
    flat.iter().map(|a| if let Arg::Value(v) = a { made(*v) } else { None }).collect()
}

/// Per value, whether the flat outputs at `outputs` hold it.
fn values_of(trace: &Trace, outputs: &[usize]) -> Vec<bool> {
    let items = match &trace.outputs {
        Arg::Tuple(items) | Arg::List(items) => items.as_slice(),
        single => std::slice::from_ref(single),
    };
    let mut held = vec![false; trace.values.len()];
    for item in outputs.iter().filter_map(|&i| items.get(i)) {
        item.for_each_value(&mut |v| held[v.index()] = true);
    }
    held
}

fn positions(trace: &Trace, marked: &[bool]) -> Vec<usize> {
    trace.inputs.iter().enumerate().filter(|(_, v)| marked[v.index()]).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, TensorMeta, TraceBuilder, ValueKind};

    /// `(exp(x) * sin(x), cos(w))` with `sin` recorded under `no_grad`; `x` requires grad.
    fn no_grad_scale() -> Trace {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(TensorMeta { requires_grad: true, ..meta.clone() }));
        let w = b.add_input(ValueKind::Tensor(meta));
        let prim = |b: &mut TraceBuilder, name: &str, args: &[ValueId]| {
            b.record_prim(name, args.iter().map(|&v| Arg::Value(v)).collect()).unwrap()[0]
        };
        let e = prim(&mut b, "exp", &[x]);
        b.set_grad_enabled(false);
        let s = prim(&mut b, "sin", &[x]);
        b.set_grad_enabled(true);
        let c = prim(&mut b, "cos", &[w]);
        let m = prim(&mut b, "mul", &[e, s]);
        b.finish(Arg::Tuple(vec![Arg::Value(m), Arg::Value(c)])).unwrap()
    }

    #[test]
    fn outputs_reach_the_values_they_are_computed_from_along_gradients() {
        let trace = no_grad_scale();
        // t2 = exp(x) reaches output 0 (mul); t3 = sin(x) under no_grad does not link it; cos(w)
        // (w needs no grad) reaches nothing along gradients.
        let at = |v: u32| outputs_reaching(&trace, &[ValueId(v)], &[0, 1]);
        assert_eq!(at(2), vec![0]);
        assert!(at(3).is_empty());
        assert!(at(4).is_empty());
        assert_eq!(at(0), vec![0]);
    }

    #[test]
    fn values_read_along_gradients_are_those_a_call_requiring_grad_reads() {
        let trace = no_grad_scale();
        // exp(x) and mul(t2, t3) read x, t2 and t3 (t3 needs no grad); the outputs t5, t4 no call reads.
        let read = values_read_along_gradients(&trace, &[ValueId(0), ValueId(2), ValueId(3), ValueId(4), ValueId(5)]);
        assert_eq!(read, [true, true, false, false, false]);
    }

    #[test]
    fn detaches_values_computed_without_grad_from_values_that_require_it() {
        let trace = no_grad_scale();
        let detached: Vec<Vec<String>> =
            detached_outputs(&trace).iter().map(|d| d.iter().map(ValueId::to_string).collect()).collect();
        // exp requires grad, sin ran under no_grad, cos reads nothing that requires grad.
        assert_eq!(detached, [vec![], vec!["t3".to_string()], vec![], vec![]]);
    }

    /// The generated source of `trace` compiled for a torch-like executor with in-place forms.
    fn source(trace: &Trace, differentiable: bool) -> String {
        use crate::{ExecutorSpec, ImplSpec, Options, PassCx, SymKey};
        use trace_ir::pysrc::Callee;
        let impls = ["exp", "sin", "cos", "mul"]
            .iter()
            .map(|name| {
                let callee = Callee::with_methods(format!("torch_{name}"), name);
                (SymKey::Prim(trace_ir::PrimId::from_name(name).unwrap()), ImplSpec { callee, has_checker: false })
            })
            .collect();
        let executors = [ExecutorSpec { name: "torch".into(), impls, ..Default::default() }];
        let options = Options {
            executors: &executors,
            passes: &[],
            differentiable,
            absent_cotangents: &[],
            checkpoints: &[],
            recomputed: &[],
        };
        let compiled = crate::compile(trace, &options, &mut |_, _, _| Ok(true), &PassCx::default()).unwrap();
        let record = compiled.forward.last().unwrap();
        assert_eq!(compiled.backward.is_empty(), differentiable);
        record.plan.as_ref().unwrap().source.clone()
    }

    #[test]
    fn a_differentiable_program_detaches_and_writes_nothing_in_place() {
        let program = source(&no_grad_scale(), true);
        assert!(program.contains("  t3 = t3.detach()\n"), "{program}");
        assert!(program.contains("t5 = t2.mul(t3)"), "{program}");
        assert!(!program.contains("_("), "{program}");
        // Run with grad off, nothing is detached; t5 is returned, so it gets new memory (eager's
        // version 0) rather than exp's buffer.
        let forward = source(&no_grad_scale(), false);
        assert!(!forward.contains("detach") && forward.contains("t5 = t2.mul(t3)"), "{forward}");
    }

    #[test]
    fn inputs_read_follows_only_the_outputs_asked_for() {
        let trace = no_grad_scale();
        assert_eq!(inputs_read(&trace, &[0]), [0]);
        assert_eq!(inputs_read(&trace, &[1]), [1]);
        assert_eq!(inputs_read(&trace, &[0, 1]), [0, 1]);
        assert!(inputs_read(&trace, &[]).is_empty());
    }

    #[test]
    fn inputs_needed_are_those_the_outputs_and_the_effects_read() {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let unused = b.add_input(ValueKind::Tensor(meta.clone()));
        let dead = b.add_input(ValueKind::Tensor(meta.clone()));
        let held = b.add_input(ValueKind::Tensor(meta));
        let _ = (unused, b.record_prim("exp", vec![Arg::Value(dead)]).unwrap());
        let y = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(y), Arg::Value(held)])).unwrap();
        assert_eq!(inputs_needed(&trace), [0, 3]);
    }

    #[test]
    fn inputs_a_composite_reads_inside_its_decomposition_are_needed_and_read() {
        // A custom autograd.Function given a module: its forward reads the module's weight,
        // which is not among the composite's arguments.
        let id =
            trace_ir::SymbolTable::register("autograd_function.test_reads_inside", trace_ir::SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let w = b.add_input(ValueKind::Tensor(meta));
        b.begin_composite(id, vec![Arg::Value(x)], vec![]);
        let y = b.record_prim("mul", vec![Arg::Value(x), Arg::Value(w)]).unwrap()[0];
        b.end_composite(vec![y]).unwrap();
        let trace = b.finish(Arg::Value(y)).unwrap();
        assert_eq!(inputs_needed(&trace), [0, 1]);
        assert_eq!(inputs_read(&trace, &[0]), [0, 1]);
    }

    #[test]
    fn batch_norms_output_reads_no_running_statistic_in_training() {
        let id = trace_ir::SymbolTable::register("ltorch.native_batch_norm", trace_ir::SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let inputs: Vec<ValueId> = (0..5).map(|_| b.add_input(ValueKind::Tensor(meta.clone()))).collect();
        let outputs: Vec<ValueId> = (0..5).map(|_| b.add_value(ValueKind::Tensor(meta.clone()))).collect();
        let call = |training: bool| {
            let mut args: Vec<Arg> = inputs.iter().map(|&v| Arg::Value(v)).collect();
            args.extend([Scalar::Bool(training), Scalar::Float(0.1), Scalar::Float(1e-5)].map(Arg::Scalar));
            BoundSymbol::new(Symbol::Composite(id), args, outputs.clone())
        };
        b.push_bsym(call(true));
        let returned = Arg::Tuple(vec![Arg::Value(outputs[0]), Arg::Value(outputs[1]), Arg::Value(outputs[3])]);
        let trace = b.finish(returned).unwrap();
        assert_eq!(inputs_read(&trace, &[0, 1]), [0, 1, 2]);
        assert_eq!(inputs_read(&trace, &[0, 2]), [0, 1, 2, 3, 4]);
        let eval = trace.with_bsyms(vec![call(false)], trace.outputs.clone());
        assert_eq!(inputs_read(&eval, &[0]), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn output_producers_are_the_calls_computing_the_forwards_outputs() {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let w = b.add_input(ValueKind::Tensor(meta));
        let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let y = b.record_prim("mul", vec![Arg::Value(e), Arg::Value(w)]).unwrap()[0];
        let outputs = Arg::Tuple(vec![Arg::Value(y), Arg::None, Arg::Value(x)]);
        let trace = b.finish(Arg::Tuple(vec![outputs, Arg::Tuple(vec![Arg::Value(e)])])).unwrap();
        assert_eq!(output_producers(&trace, |_| false), [Some(1), None, None]);
        // `mul` written into its receiver (`t2.mul_(t1)`) returns `exp`'s memory.
        assert_eq!(output_producers(&trace, |i| i == 1), [Some(0), None, None]);
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let y = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let single = b.finish(Arg::Tuple(vec![Arg::Value(y), Arg::Tuple(vec![])])).unwrap();
        assert_eq!(output_producers(&single, |_| false), [Some(0)]);
    }

    #[test]
    fn inputs_returned_are_those_an_output_holds_as_they_are() {
        let mut b = TraceBuilder::new();
        let meta = TensorMeta::new(DType::F32, Device::CPU, vec![4]);
        let x = b.add_input(ValueKind::Tensor(meta.clone()));
        let w = b.add_input(ValueKind::Tensor(meta));
        let y = b.record_prim("mul", vec![Arg::Value(x), Arg::Value(w)]).unwrap()[0];
        let residuals = Arg::Tuple(vec![Arg::Value(y), Arg::Value(w)]);
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(y), residuals])).unwrap();
        assert!(inputs_returned(&trace, &[0]).is_empty());
        assert_eq!(inputs_returned(&trace, &[1]), [1]);
    }
}
