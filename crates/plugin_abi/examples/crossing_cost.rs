//! The cost of crossing the plugin boundary: an identity pass run through a [`PluginTable`] the
//! way `thunder_rs.load_passes` runs it (encode, the plugin's parse and print, parse again), on
//! the synthetic traces of `make bench-passes` (its 10k-symbol size is the target: <= 1 us per
//! bound symbol). Run with `cargo run --release -p plugin_abi --example crossing_cost`.

use plugin_abi::{encode, pass_entry, plugin_table, Buffer, PassEntry, PluginTable, STATUS_OK};
use std::time::Instant;
use trace_ir::parser::parse_trace;
use trace_ir::{Arg, DType, Device, Result, TensorMeta, Trace, TraceBuilder, ValueKind};

fn identity(trace: &Trace) -> Result<Trace> {
    Ok(trace.clone())
}

static PASSES: [PassEntry; 1] = [pass_entry!("identity", "program", identity)];
static TABLE: PluginTable = plugin_table!(PASSES);

/// The chain of `crates/passes/examples/pass_scaling.rs` (kept in step with it by hand), after
/// DCE would have run there: the dead `sin`s are kept, as the acquired trace has them.
fn synthetic(n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let meta = TensorMeta { requires_grad: true, ..TensorMeta::new(DType::F32, Device::CPU, vec![16, 16]) };
    let x = b.add_input(ValueKind::Tensor(meta.clone()));
    let y = b.add_input(ValueKind::Tensor(meta));
    let (mut live, mut previous) = (x, y);
    for i in 0..n {
        let out = match i % 5 {
            0 => b.record_prim("exp", vec![Arg::Value(previous)]),
            1 => b.record_prim("add", vec![Arg::Value(live), Arg::Value(y)]),
            2 => b.record_prim("exp", vec![Arg::Value(previous)]),
            3 => b.record_prim("mul", vec![Arg::Value(live), Arg::Value(live)]),
            _ => b.record_prim("sin", vec![Arg::Value(x)]),
        }
        .expect("synthetic prims are valid")[0];
        if i % 5 != 4 {
            previous = live;
            live = out;
        }
    }
    b.finish(Arg::Value(live)).expect("synthetic trace is complete")
}

/// One crossing, as the host does it.
fn cross(trace: &Trace) -> Trace {
    let text = encode(trace);
    let mut out = Buffer::empty();
    let entry = &PASSES[0];
    // SAFETY: the input is live for the call and `out` is writable.
    let status = unsafe { (entry.run)(text.as_ptr(), text.len(), &mut out) };
    // SAFETY: the plugin hands back `len` bytes it owns until `free`.
    let answer = std::str::from_utf8(unsafe { std::slice::from_raw_parts(out.ptr, out.len) }).unwrap().to_owned();
    // SAFETY: freed once, by the table that allocated it.
    unsafe { (TABLE.free)(out) };
    assert_eq!(status, STATUS_OK, "{answer}");
    parse_trace(&answer).expect("the host reads what the plugin printed")
}

fn main() {
    for n in [1_000, 10_000, 100_000] {
        let trace = synthetic(n);
        let symbols = trace.bsyms.len();
        assert_eq!(cross(&trace), trace, "an identity crossing returns the same trace");
        let repeats = if n > 10_000 { 3 } else { 11 };
        let mut times: Vec<f64> = (0..repeats)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(cross(&trace));
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(|a, b| a.total_cmp(b));
        let median = times[times.len() / 2];
        let text = encode(&trace);
        let start = Instant::now();
        std::hint::black_box(encode(&trace));
        let encode_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        std::hint::black_box(parse_trace(&text).expect("round trip"));
        let parse_s = start.elapsed().as_secs_f64();
        println!(
            "{symbols:>7} symbols: identity crossing {:8.3} ms, {:6.3} us/symbol ({} bytes of text; \
             one encode {:.3} us/symbol, one parse {:.3} us/symbol)",
            median * 1e3,
            median * 1e6 / symbols as f64,
            text.len(),
            encode_s * 1e6 / symbols as f64,
            parse_s * 1e6 / symbols as f64
        );
    }
}
