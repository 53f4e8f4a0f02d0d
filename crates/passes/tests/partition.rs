//! Partitioning tests: hand-made traces, and properties on random DAGs (a seeded generator):
//! the partitioned trace verifies (every value defined before use, so regions are acyclic),
//! computes the same values as the unpartitioned one (a tiny interpreter over f64), keeps the
//! symbols outside regions in their order, and never puts effects or lone ops in a region.

use passes::claim::Assignment;
use passes::partition::{partition, Partition};
use rustc_hash::FxHashMap;
use trace_ir::pysrc::Callee;
use trace_ir::verify::verify;
use trace_ir::{Arg, BoundSymbol, DType, Device, Scalar, Symbol, TensorMeta, Trace, TraceBuilder, ValueId, ValueKind};

const FUSER: usize = 0;

fn callee(name: &str) -> Callee {
    Callee::function(format!("torch_{name}"))
}

/// Every symbol in `fused` goes to the fusion executor; the rest to the torch executor.
fn assign(trace: &Trace, fused: impl Fn(usize, &BoundSymbol) -> bool) -> Vec<Assignment> {
    trace
        .bsyms
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let name = b.symbol.qualified_name();
            let fusion = fused(i, b).then(|| (FUSER, callee(&name)));
            Assignment { callee: callee(&name), fusion }
        })
        .collect()
}

fn run(trace: &Trace, fused: impl Fn(usize, &BoundSymbol) -> bool) -> Partition {
    let assignments = assign(trace, fused);
    let out = partition(trace, &assignments, &["fuser", "torch"]).expect("partition succeeds");
    verify(&out.trace).unwrap_or_else(|e| panic!("{e}\n{}", out.trace));
    out
}

fn vector(b: &mut TraceBuilder) -> ValueId {
    b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])))
}

fn prim(b: &mut TraceBuilder, name: &str, args: &[ValueId]) -> ValueId {
    b.record_prim(name, args.iter().map(|&v| Arg::Value(v)).collect()).expect("valid prim")[0]
}

fn uniform(b: &mut TraceBuilder) -> ValueId {
    let params = vec![
        Arg::ints(&[4]),
        Arg::Scalar(Scalar::Float(0.0)),
        Arg::Scalar(Scalar::Float(1.0)),
        Arg::Device(Device::CPU),
        Arg::DType(DType::F32),
    ];
    b.record_prim("uniform", params).expect("valid prim")[0]
}

fn names(trace: &Trace) -> Vec<String> {
    trace.bsyms.iter().map(|b| b.symbol.qualified_name()).collect()
}

#[test]
fn a_chain_becomes_one_region_with_its_live_values_as_outputs() {
    let mut b = TraceBuilder::new();
    let (x, y) = (vector(&mut b), vector(&mut b));
    let a = prim(&mut b, "add", &[x, y]);
    let s = prim(&mut b, "sin", &[a]);
    let m = prim(&mut b, "mul", &[s, a]);
    let trace = b.finish(Arg::Tuple(vec![Arg::Value(m), Arg::Value(a)])).unwrap();
    let out = run(&trace, |_, _| true);
    assert_eq!(names(&out.trace), ["fuser_fusion0"]);
    let region = &out.trace.bsyms[0];
    assert_eq!(region.args, [Arg::Value(x), Arg::Value(y)]);
    assert_eq!(region.outputs, [a, m]);
    assert_eq!(region.subsymbols.len(), 3);
    assert_eq!(out.regions.len(), 1);
    assert_eq!((out.regions[0].index, out.regions[0].callees.len()), (0, 3));
    assert_eq!(&*out.callees[0].function, "fuser_fusion0");
}

#[test]
fn a_consumer_between_members_is_not_crossed() {
    // exp and neg fuse around the unfused matmul stand-in (cos), which reads exp's output and
    // feeds nothing the region needs: the region is placed before it.
    let mut b = TraceBuilder::new();
    let x = vector(&mut b);
    let e = prim(&mut b, "exp", &[x]);
    let c = prim(&mut b, "cos", &[e]);
    let n = prim(&mut b, "neg", &[e]);
    let out_v = prim(&mut b, "add", &[c, n]);
    let trace = b.finish(Arg::Value(out_v)).unwrap();
    let out = run(&trace, |_, b| b.symbol.qualified_name() != "prims.cos");
    assert_eq!(names(&out.trace), ["fuser_fusion0", "prims.cos", "prims.add"]);
}

#[test]
fn a_region_is_placed_after_the_producers_its_later_members_read() {
    // exp, then an independent unfused cos, then mul(exp, cos): the region {exp, mul, sin} is
    // placed after cos; cos keeps its place among the unfused symbols.
    let mut b = TraceBuilder::new();
    let (x, y) = (vector(&mut b), vector(&mut b));
    let e = prim(&mut b, "exp", &[x]);
    let c = prim(&mut b, "cos", &[y]);
    let m = prim(&mut b, "mul", &[e, c]);
    let s = prim(&mut b, "sin", &[m]);
    let trace = b.finish(Arg::Value(s)).unwrap();
    let out = run(&trace, |_, b| b.symbol.qualified_name() != "prims.cos");
    assert_eq!(names(&out.trace), ["prims.cos", "fuser_fusion0"]);
    assert_eq!(out.trace.bsyms[1].args, [Arg::Value(x), Arg::Value(c)]);
}

#[test]
fn a_merge_that_would_close_a_cycle_is_refused() {
    // exp -> cos (unfused) -> add(exp, cos): add cannot join exp's group.
    let mut b = TraceBuilder::new();
    let x = vector(&mut b);
    let e = prim(&mut b, "exp", &[x]);
    let s = prim(&mut b, "sin", &[e]);
    let c = prim(&mut b, "cos", &[s]);
    let a = prim(&mut b, "add", &[s, c]);
    let m = prim(&mut b, "mul", &[a, a]);
    let trace = b.finish(Arg::Value(m)).unwrap();
    let out = run(&trace, |_, b| b.symbol.qualified_name() != "prims.cos");
    assert_eq!(names(&out.trace), ["fuser_fusion0", "prims.cos", "fuser_fusion1"]);
}

#[test]
fn lone_ops_and_shape_only_groups_are_dropped() {
    let mut b = TraceBuilder::new();
    let x = vector(&mut b);
    let e = prim(&mut b, "exp", &[x]);
    let c = prim(&mut b, "cos", &[e]);
    let r = b.record_prim("reshape", vec![Arg::Value(c), Arg::ints(&[2, 2])]).unwrap()[0];
    let t = b.record_prim("reshape", vec![Arg::Value(r), Arg::ints(&[4])]).unwrap()[0];
    let trace = b.finish(Arg::Value(t)).unwrap();
    let out = run(&trace, |_, b| b.symbol.qualified_name() != "prims.cos");
    assert_eq!(names(&out.trace), ["prims.exp", "prims.cos", "prims.reshape", "prims.reshape"]);
    assert!(out.regions.is_empty());
    assert_eq!(&*out.callees[0].function, "torch_prims.exp");
}

#[test]
fn conversions_to_the_inputs_own_dtype_are_not_worth_a_region() {
    // `stop_gradient` of two saved statistics: converts that change nothing.
    let convert = |b: &mut TraceBuilder, v: ValueId, dtype: DType| {
        b.record_prim("convert_element_type", vec![Arg::Value(v), Arg::DType(dtype)]).unwrap()[0]
    };
    let mut b = TraceBuilder::new();
    let (x, y) = (vector(&mut b), vector(&mut b));
    let (cx, cy) = (convert(&mut b, x, DType::F32), convert(&mut b, y, DType::F32));
    let trace = b.finish(Arg::Tuple(vec![Arg::Value(cx), Arg::Value(cy)])).unwrap();
    assert!(run(&trace, |_, _| true).regions.is_empty());

    // Converts to another dtype compute: two of them make a region.
    let mut b = TraceBuilder::new();
    let (x, y) = (vector(&mut b), vector(&mut b));
    let (cx, cy) = (convert(&mut b, x, DType::F64), convert(&mut b, y, DType::F16));
    let trace = b.finish(Arg::Tuple(vec![Arg::Value(cx), Arg::Value(cy)])).unwrap();
    assert_eq!(run(&trace, |_, _| true).regions.len(), 1);
}

#[test]
fn effects_stay_out_of_regions_and_in_order() {
    let mut b = TraceBuilder::new();
    let x = vector(&mut b);
    let e = prim(&mut b, "exp", &[x]);
    let u = uniform(&mut b);
    let s = prim(&mut b, "sin", &[e]);
    let a = prim(&mut b, "add", &[s, u]);
    let trace = b.finish(Arg::Value(a)).unwrap();
    let out = run(&trace, |_, _| true);
    assert_eq!(names(&out.trace), ["prims.uniform", "fuser_fusion0"]);
    assert_eq!(out.trace.bsyms[1].subsymbols.len(), 3);
}

// -- properties on random DAGs ---------------------------------------------------------------

/// xorshift64*: a seeded generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random program over two inputs: elementwise prims reading random earlier values, shape
/// ops, and random draws; a few values are returned.
fn random_trace(rng: &mut Rng, n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let mut values = vec![vector(&mut b), vector(&mut b)];
    for _ in 0..n {
        let pick = |rng: &mut Rng| values[values.len() - 1 - rng.below(values.len().min(6))];
        let v = match rng.below(10) {
            0..=2 => {
                let unary = ["sin", "cos", "neg", "tanh"][rng.below(4)];
                let a = pick(rng);
                prim(&mut b, unary, &[a])
            }
            3..=6 => {
                let binary = ["add", "mul", "sub"][rng.below(3)];
                let (a, c) = (pick(rng), pick(rng));
                prim(&mut b, binary, &[a, c])
            }
            7 | 8 => {
                let a = pick(rng);
                b.record_prim("reshape", vec![Arg::Value(a), Arg::ints(&[4])]).unwrap()[0]
            }
            _ => uniform(&mut b),
        };
        values.push(v);
    }
    let outputs = (0..3).map(|_| Arg::Value(values[2 + rng.below(values.len() - 2)])).collect();
    b.finish(Arg::Tuple(outputs)).unwrap()
}

/// Evaluates a trace with every tensor a number: elementwise prims as on f64, shape ops as the
/// identity, random draws from a counter (so a reordered draw changes the results). A region
/// sees only its arguments and exports only its outputs.
fn evaluate(trace: &Trace, inputs: &[f64]) -> Vec<f64> {
    let mut env: FxHashMap<ValueId, f64> = trace.inputs.iter().copied().zip(inputs.iter().copied()).collect();
    let mut draws = 0.0;
    for bsym in &trace.bsyms {
        eval_bsym(bsym, &mut env, &mut draws);
    }
    let mut out = Vec::new();
    trace.outputs.for_each_value(&mut |v| out.push(env[&v]));
    out
}

fn eval_bsym(bsym: &BoundSymbol, env: &mut FxHashMap<ValueId, f64>, draws: &mut f64) {
    let args: Vec<f64> = bsym.args.iter().filter_map(Arg::as_value).map(|v| env[&v]).collect();
    if let Symbol::Region(_) = bsym.symbol {
        let mut local: FxHashMap<ValueId, f64> = bsym.inputs().into_iter().zip(args).collect();
        bsym.subsymbols.iter().for_each(|s| eval_bsym(s, &mut local, draws));
        for o in &bsym.outputs {
            env.insert(*o, local[o]);
        }
        return;
    }
    let value = match bsym.symbol.qualified_name().as_str() {
        "prims.sin" => args[0].sin(),
        "prims.cos" => args[0].cos(),
        "prims.neg" => -args[0],
        "prims.tanh" => args[0].tanh(),
        "prims.add" => args[0] + args[1],
        "prims.mul" => args[0] * args[1],
        "prims.sub" => args[0] - args[1],
        "prims.reshape" => args[0],
        "prims.uniform" => {
            *draws += 1.0;
            *draws
        }
        other => panic!("the interpreter has no {other}"),
    };
    env.insert(bsym.outputs[0], value);
}

/// The outputs of the top-level symbols `keep` selects, in order.
fn order_of(trace: &Trace, keep: impl Fn(&BoundSymbol) -> bool) -> Vec<Vec<ValueId>> {
    trace.bsyms.iter().filter(|b| keep(b)).map(|b| b.outputs.clone()).collect()
}

#[test]
fn random_dags_partition_into_acyclic_regions_that_compute_the_same_values() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut fused_regions = 0;
    for case in 0..400 {
        let n = 5 + rng.below(60);
        let trace = random_trace(&mut rng, n);
        let fused: Vec<bool> = (0..trace.bsyms.len()).map(|_| rng.below(4) != 0).collect();
        let out = run(&trace, |i, _| fused[i]);
        let inputs = [0.3 + case as f64 * 1e-3, -1.7];
        assert_eq!(evaluate(&trace, &inputs), evaluate(&out.trace, &inputs), "case {case}\n{trace}\n{}", out.trace);
        // Symbols no fusion executor claimed, effects among them, keep their relative order.
        let claimed: Vec<Vec<ValueId>> =
            (0..trace.bsyms.len()).filter(|&i| fused[i]).map(|i| trace.bsyms[i].outputs.clone()).collect();
        let unclaimed = |b: &BoundSymbol| b.subsymbols.is_empty() && !claimed.contains(&b.outputs);
        assert_eq!(order_of(&out.trace, unclaimed), order_of(&trace, unclaimed), "case {case}");
        assert_eq!(
            order_of(&out.trace, BoundSymbol::has_effect),
            order_of(&trace, BoundSymbol::has_effect),
            "case {case}"
        );
        for region in out.trace.bsyms.iter().filter(|b| matches!(b.symbol, Symbol::Region(_))) {
            fused_regions += 1;
            assert!(region.subsymbols.iter().all(|s| !s.has_effect()), "case {case}: an effect in a region");
            let compute = region.subsymbols.iter().filter(|s| !s.symbol.as_prim().is_some_and(|p| p.is_shape_op()));
            assert!(compute.count() >= 2, "case {case}: a region without two compute calls");
        }
        assert_eq!(out.callees.len(), out.trace.bsyms.len());
    }
    assert!(fused_regions > 400, "the generator must exercise regions, got {fused_regions}");
}

#[test]
fn only_legal_merges_are_refused_on_chains() {
    // A chain fully claimed by the fusion executor becomes one region, whatever its length.
    let mut b = TraceBuilder::new();
    let (x, y) = (vector(&mut b), vector(&mut b));
    let mut v = x;
    for i in 0..1000 {
        v = if i % 2 == 0 { prim(&mut b, "sin", &[v]) } else { prim(&mut b, "add", &[v, y]) };
    }
    let trace = b.finish(Arg::Value(v)).unwrap();
    let out = run(&trace, |_, _| true);
    assert_eq!(out.trace.bsyms.len(), 1);
    assert_eq!(out.trace.bsyms[0].subsymbols.len(), 1000);
}

#[test]
fn region_code_returns_a_tuple_and_identical_regions_share_a_key() {
    // Two identical chains separated by an unfused call: two regions, one key.
    let mut b = TraceBuilder::new();
    let x = vector(&mut b);
    let mut v = x;
    for _ in 0..2 {
        let s = prim(&mut b, "sin", &[v]);
        let m = prim(&mut b, "mul", &[s, s]);
        v = prim(&mut b, "cos", &[m]);
    }
    let trace = b.finish(Arg::Value(v)).unwrap();
    let out = run(&trace, |_, b| b.symbol.qualified_name() != "prims.cos");
    assert_eq!(names(&out.trace), ["fuser_fusion0", "prims.cos", "fuser_fusion1", "prims.cos"]);
    let (first, second) = (&out.regions[0], &out.regions[1]);
    let source = |r: &passes::partition::RegionPlan| {
        trace_ir::pysrc::region_source(&out.trace, &out.trace.bsyms[r.index], &r.callees, &r.name)
    };
    assert_eq!(source(first), "def fuser_fusion0(t0):\n  t1 = torch_prims.sin(t0)\n  t2 = torch_prims.mul(t1, t1)\n  del t1\n  return (t2,)\n");
    let key = |r: &passes::partition::RegionPlan| {
        trace_ir::pysrc::region_key(&out.trace, &out.trace.bsyms[r.index], &r.callees)
    };
    assert_eq!(key(first), key(second));
    assert!(key(first).ends_with("# input 0: cpu f32[4]\n"), "{}", key(first));
    let plan_source = trace_ir::pysrc::python_source(
        &out.trace,
        &trace_ir::pysrc::ExecPlan { impls: &out.callees, dels: &[], detached: &[], packed: None },
        "computation",
    );
    assert!(plan_source.contains("  # fuser_fusion0: 2 symbols\n  (t2,) = fuser_fusion0(t0)"), "{plan_source}");
    assert!(plan_source.contains("    # t1 = prims.sin(t0)"), "{plan_source}");
}

#[test]
fn a_region_takes_the_size_values_its_prims_parameters_read() {
    // The broadcast's shape reads t0, which no operand shows: the region's code reads it, so it
    // is one of the region's inputs.
    let text = "def backward(t0, t1):
  # t0: \"size 3\"
  # t1: \"cpu f32[t0, 4]\"
  t2 = prims.exp(t1)
  t3 = prims.sum(t2, (1,))
  t4 = prims.broadcast_in_dim(t3, (t0, 4), (0,))
  t5 = prims.mul(t4, t2)
  return t5
";
    let trace = trace_ir::parser::parse_trace(text).unwrap();
    let out = run(&trace, |_, _| true);
    assert_eq!(names(&out.trace), ["fuser_fusion0"]);
    let region = &out.trace.bsyms[0];
    assert_eq!(region.args, [Arg::Value(ValueId(1)), Arg::Value(ValueId(0))]);
}
