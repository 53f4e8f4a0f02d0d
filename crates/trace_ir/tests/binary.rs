//! The binary form of traces: encoding then decoding gives the same trace (and so the same
//! printed text) for the passes' golden traces, the synthetic benchmark chain and a trace with
//! every kind of symbol and argument; values are renumbered in definition order; truncated and
//! corrupted buffers are errors, never panics.

use std::sync::Arc;
use trace_ir::binary::{decode, encode, FORMAT_VERSION};
use trace_ir::parser::{parse_args, parse_trace, parse_value_type};
use trace_ir::printer::print_trace;
use trace_ir::testing::synthetic_chain;
use trace_ir::{
    Arg, BoundSymbol, GradRule, Symbol, SymbolKind, SymbolTable, TensorMeta, Trace, TraceBuilder, ValueId, ValueKind,
};

fn assert_round_trip(trace: &Trace) {
    let decoded = decode(&encode(trace)).unwrap();
    assert_eq!(print_trace(&decoded, "computation"), print_trace(trace, "computation"));
    assert_eq!(&decoded, trace);
}

fn golden_traces() -> Vec<(String, Trace)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../passes/tests/golden");
    let mut traces: Vec<(String, Trace)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "trace"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let trace = parse_trace(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.display().to_string(), trace)
        })
        .collect();
    traces.sort_by(|a, b| a.0.cmp(&b.0));
    traces
}

#[test]
fn golden_traces_round_trip() {
    let traces = golden_traces();
    assert!(traces.len() >= 10, "found {} golden traces", traces.len());
    for (path, trace) in &traces {
        let decoded = decode(&encode(trace)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(print_trace(&decoded, "computation"), print_trace(trace, "computation"), "{path}");
        assert_eq!(&decoded, trace, "{path}");
    }
}

#[test]
fn the_synthetic_chain_round_trips_compactly() {
    let trace = synthetic_chain(10_000);
    let bytes = encode(&trace);
    assert_round_trip(&trace);
    // A prim call is a few bytes and each value's metadata about ten: far less than its text.
    assert!(bytes.len() < 20 * trace.bsyms.len(), "{} bytes", bytes.len());
}

/// A composite with kwargs holding a grad rule, a fallback, an effect, a region and every kind
/// of literal argument.
fn everything() -> Trace {
    let mut b = TraceBuilder::new();
    let x = b.add_input(ValueKind::Tensor(TensorMeta {
        requires_grad: true,
        ..parse_value_type("cuda:1 f32[2, 3]").unwrap().as_tensor().unwrap().clone()
    }));
    let n = b.add_input(parse_value_type("float -2.5").unwrap());
    let (args, kwargs) =
        parse_args("t0, 1, dim=-1, name='a\\'b', dtype=torch.bfloat16, s=slice(None, 3, ...), c=[1, (2.0, False)]")
            .unwrap();
    b.begin_composite(SymbolTable::register("ltorch.binary_test_op", SymbolKind::Composite), args, kwargs);
    let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
    let cot = b.get_grad(e).unwrap();
    let g = b.record_prim("mul", vec![Arg::Value(cot), Arg::Value(e)]).unwrap()[0];
    b.put_grad(x, Arg::Value(g)).unwrap();
    b.end_composite(vec![e]).unwrap();
    let meta = parse_value_type("cuda:1 f32[3]").unwrap().as_tensor().unwrap().clone();
    let fallback = SymbolTable::register("torch.binary_test_fallback", SymbolKind::Fallback);
    let f = b.record_given(Symbol::Fallback(fallback), vec![Arg::Value(e), Arg::PyConst(7)], vec![], vec![meta])[0];
    let effect = SymbolTable::register("torch.binary_test_seed", SymbolKind::Effect);
    b.record_given(Symbol::Fallback(effect), vec![Arg::Value(n)], vec![("seed".into(), Arg::None)], vec![]);
    let s = b.record_prim("sum", vec![Arg::Value(f), Arg::ints(&[0])]).unwrap()[0];
    let trace = b.finish(Arg::Tuple(vec![Arg::Value(s), Arg::List(vec![Arg::Value(n), Arg::Ellipsis])])).unwrap();
    // The last call wrapped as a fusion region, as the partitioner leaves it.
    let mut bsyms = trace.bsyms.clone();
    let last = bsyms.pop().unwrap();
    let mut region = BoundSymbol::new(Symbol::Region(Arc::from("inductor_fusion0")), vec![Arg::Value(f)], vec![s]);
    region.subsymbols = vec![last].into();
    bsyms.push(region);
    trace.with_bsyms(bsyms, trace.outputs.clone())
}

#[test]
fn every_kind_of_symbol_argument_and_grad_rule_round_trips() {
    let trace = everything();
    assert!(trace.bsyms[0].grad.as_deref().is_some_and(|g: &GradRule| !g.bsyms.is_empty()));
    assert_round_trip(&trace);
}

#[test]
fn values_are_renumbered_in_definition_order() {
    let trace =
        parse_trace("def f(t0):\n  # t0: \"cpu f32[2]\"\n  t1 = prims.exp(t0)\n  t2 = prims.neg(t1)\n  return t2\n")
            .unwrap();
    // The same calls with the neg's output numbered first and an unused value left behind, as
    // a rewrite leaves them.
    let mut values = (*trace.values).clone();
    values.swap(1, 2);
    values.push(values[0].clone());
    let exp = BoundSymbol { outputs: vec![ValueId(2)], ..trace.bsyms[0].clone() };
    let neg = BoundSymbol { args: vec![Arg::Value(ValueId(2))], outputs: vec![ValueId(1)], ..trace.bsyms[1].clone() };
    let shuffled = Trace {
        values: Arc::new(values),
        inputs: vec![ValueId(0)],
        bsyms: vec![exp, neg],
        outputs: Arg::Value(ValueId(1)),
        facts: trace.facts.clone(),
    };
    assert_eq!(decode(&encode(&shuffled)).unwrap(), trace);
}

#[test]
fn truncated_buffers_are_errors() {
    let bytes = encode(&everything());
    for len in 0..bytes.len() {
        let err = decode(&bytes[..len]).expect_err("a truncated buffer must not decode");
        assert_eq!(err.op, "trace decoder", "{err}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(decode(&longer).unwrap_err().message.contains("1 bytes follow the trace"));
}

#[test]
fn corrupted_buffers_are_errors_or_traces_never_panics() {
    let bytes = encode(&everything());
    // Every byte set to a few values each, and a deterministic spray of random flips.
    for at in 0..bytes.len() {
        for v in [0u8, 1, 0x7f, 0x80, 0xff, bytes[at] ^ 0x10] {
            let mut corrupt = bytes.clone();
            corrupt[at] = v;
            let _ = decode(&corrupt);
        }
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut corrupt = bytes.clone();
        for k in 0..(state % 4 + 1) {
            let at = ((state >> (8 * k)) as usize) % corrupt.len();
            corrupt[at] = (state >> (16 + 8 * k)) as u8;
        }
        let _ = decode(&corrupt);
    }
}

#[test]
fn deep_nesting_and_huge_counts_are_errors() {
    let header = {
        let mut h = b"TRB\0".to_vec();
        h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        h
    };
    // No names, no values, no inputs, no calls, then a tuple nested a million deep.
    let mut nested = header.clone();
    nested.extend_from_slice(&[0, 0, 0, 0]);
    for _ in 0..1_000_000 {
        nested.extend_from_slice(&[10, 1]);
    }
    assert!(decode(&nested).unwrap_err().message.contains("nested deeper"));
    // A value count of 2^62.
    let mut huge = header.clone();
    huge.extend_from_slice(&[0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    assert!(decode(&huge).unwrap_err().message.contains("items with"));
    let mut other = header;
    other[4] = other[4].wrapping_add(1);
    assert!(decode(&other).unwrap_err().message.contains("binary format version"));
    assert!(decode(b"def f():").unwrap_err().message.contains("no TRB magic"));
}
