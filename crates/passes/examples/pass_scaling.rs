//! Pass-scaling benchmark: time of each pass on synthetic traces of 1k, 10k and 100k bound
//! symbols, per bound symbol. Run with `cargo run --release -p thunder_rs_passes --example pass_scaling`.
//!
//! The synthetic program (`trace_ir::testing::synthetic_chain`) is a chain of elementwise prims over two
//! inputs in which every third step recomputes an earlier value (work for CSE) and every fifth step is never used (work for
//! DCE), so both passes do real rewriting at every size. Both inputs require grad, so the VJP
//! pass differentiates the whole chain, and the split then chooses residuals over it (`split`
//! times the split alone, from a joint trace built beforehand). `partition` groups the chain
//! for a fusion executor that claims every symbol but each seventh (a stand-in for a matmul it
//! leaves to torch), so regions are cut and placed around unfused symbols throughout.
//!
//! `views` is the rewrite driver applying the view-folding rule set, which matches nothing here:
//! what trying a rule set costs each symbol.
//!
//! The `composite` rows run the same program with each step recorded as a composite call whose
//! decomposition negates its first operand twice before the step's prim (as ltorch symbols
//! carry their prims), and `clone` times cloning the whole trace: what every pass that keeps a
//! bound symbol, and the manager at every stage, pays for decompositions.

use passes::claim::Assignment;
use passes::cse::cse;
use passes::dce::dce;
use passes::views::views;
use passes::vjp::vjp;
use passes::{Pass, PassCx};
use std::time::Instant;
use trace_ir::pysrc::Callee;
use trace_ir::testing::synthetic_chain_of;
use trace_ir::Trace;

/// Every symbol but each seventh claimed by fusion executor 0.
fn assignments(trace: &Trace) -> Vec<Assignment> {
    let callee = Callee::function("impl");
    (0..trace.bsyms.len())
        .map(|i| Assignment { callee: callee.clone(), fusion: (i % 7 != 6).then(|| (0, callee.clone())) })
        .collect()
}

fn median_seconds(repeats: usize, mut run: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

fn main() {
    let passes: [Pass; 4] = [("dce", dce), ("cse", cse), ("views", views), ("vjp", vjp)];
    let cx = PassCx { verify: false, dump: Vec::new() };
    println!("{:>8}  {:>9}  {:>12}  {:>14}", "bsyms", "pass", "median (ms)", "per bsym (µs)");
    for (n, composite) in [(1_000, false), (10_000, false), (100_000, false), (10_000, true)] {
        let trace = synthetic_chain_of(n, composite);
        let repeats = if n >= 100_000 { 5 } else { 21 };
        let label = if composite { "composite" } else { "" };
        let report = |name: &str, seconds: f64| {
            println!("{:>8}  {:>9}  {:>12.3}  {:>14.3}  {label}", n, name, seconds * 1e3, seconds * 1e6 / n as f64)
        };
        report("clone", median_seconds(repeats, || drop(std::hint::black_box(trace.clone()))));
        for pass in &passes {
            report(pass.0, median_seconds(repeats, || drop((pass.1)(&trace, &cx).expect("pass succeeds"))));
        }
        let joint = passes::joint(&trace).expect("vjp succeeds").expect("the output requires grad");
        report("split", median_seconds(repeats, || drop(passes::split(&joint, &[]).expect("split succeeds"))));
        let claimed = assignments(&trace);
        let partition =
            || drop(passes::partition::partition(&trace, &claimed, &["fuser"]).expect("partition succeeds"));
        report("partition", median_seconds(repeats, partition));
    }
}
