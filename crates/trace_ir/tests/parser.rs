//! The trace parser: printing a recorded trace, parsing it and printing again gives the same text
//! and the same trace (and so does the binary form), for every prim family; malformed text fails with the line that is wrong.

use trace_ir::parser::{parse_args, parse_trace, parse_value_type};
use trace_ir::prims::{Binary, Unary};
use trace_ir::printer::print_trace;
use trace_ir::{
    Arg, DType, Device, ErrorKind, Scalar, SymbolKind, SymbolTable, TensorMeta, Trace, TraceBuilder, ValueId,
};
use ErrorKind::{Index, NotImplemented, Value};

fn input(b: &mut TraceBuilder, ty: &str) -> ValueId {
    b.add_input(parse_value_type(ty).unwrap())
}

/// Records `prims.<name>(<args>)`, the arguments written as a trace prints them.
fn rec(b: &mut TraceBuilder, name: &str, args: &str) -> Vec<ValueId> {
    let (args, _) = parse_args(args).unwrap();
    b.record_prim(name, args).unwrap_or_else(|e| panic!("prims.{name}: {e}"))
}

fn composite(b: &mut TraceBuilder, name: &str, args: &str) {
    let (args, kwargs) = parse_args(args).unwrap();
    b.begin_composite(SymbolTable::register(name, SymbolKind::Composite), args, kwargs);
}

fn values(ids: &[ValueId]) -> Arg {
    Arg::Tuple(ids.iter().map(|&v| Arg::Value(v)).collect())
}

fn assert_round_trip(trace: &Trace) {
    let text = print_trace(trace, "computation");
    let parsed = parse_trace(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_trace(&parsed, "computation"), text);
    assert_eq!(&parsed, trace);
    // The binary form crosses the plugin boundary: it must keep everything the text keeps.
    let decoded = trace_ir::binary::decode(&trace_ir::binary::encode(trace)).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&decoded, trace, "binary round trip of\n{text}");
}

#[test]
fn elementwise_prims_round_trip() {
    let mut b = TraceBuilder::new();
    let (x, _y) = (input(&mut b, "cpu f32[2, 3]"), input(&mut b, "cpu f32[2, 3]"));
    let (_i, _p) = (input(&mut b, "cpu i32[2, 3]"), input(&mut b, "cpu b8[2, 3]"));
    input(&mut b, "cpu c64[2, 3]");
    input(&mut b, "float 2.5");
    let mut outs = vec![x];
    let unary = Unary::NAMES.iter().map(|name| (name, 1));
    for (name, arity) in unary.chain(Binary::NAMES.iter().map(|name| (name, 2))) {
        let (a, bb) = if name.starts_with("bitwise") { ("t2", "t2") } else { ("t0", "t1") };
        let args = if arity == 1 { a.to_string() } else { format!("{a}, {bb}") };
        outs.extend(rec(&mut b, name, &args));
    }
    for (name, args) in [
        ("add", "t0, 2.0"),
        ("add", "t0, t5"),
        ("mul", "3, t2"),
        ("sub", "t0, -1e-07"),
        ("maximum", "t0, float('-inf')"),
        ("abs", "t4"),
        ("where", "t3, t0, t1"),
        ("where", "t3, t0, float('nan')"),
        ("convert_element_type", "t0, torch.bfloat16"),
        ("device_put", "t0, torch.device('cuda:1')"),
    ] {
        outs.extend(rec(&mut b, name, args));
    }
    assert_round_trip(&b.finish(values(&outs)).unwrap());
}

#[test]
fn shape_prims_round_trip() {
    let mut b = TraceBuilder::new();
    input(&mut b, "cpu f32[2, 3]");
    input(&mut b, "cpu f32[1, 3]");
    let mut outs = Vec::new();
    for (name, args) in [
        ("broadcast_in_dim", "t1, (4, 2, 3), (1, 2)"),
        ("reshape", "t0, (3, 2)"),
        ("reshape", "t1, (3,)"),
        ("transpose", "t0, (1, 0)"),
        ("slice", "t0, (0, 1), (2, 3), (1, 2)"),
        ("squeeze", "t1, (0,)"),
        ("cat", "[t0, t1, t0], 0"),
        ("pad", "t0, 0.0, ((1, 1, 0), (0, 2, 1))"),
        ("flip", "t0, (0, 1)"),
    ] {
        outs.extend(rec(&mut b, name, args));
    }
    assert_round_trip(&b.finish(Arg::List(outs.into_iter().map(Arg::Value).collect())).unwrap());
}

#[test]
fn creation_prims_round_trip() {
    let mut b = TraceBuilder::new();
    let mut outs = Vec::new();
    for (name, args) in [
        ("full", "(2, 2), 1.5, torch.device('cpu'), torch.float32"),
        ("full", "(), float('inf'), torch.device('cpu'), torch.float64"),
        ("full", "(0, 3), -3, torch.device('meta'), torch.int64"),
        ("full", "(1,), True, torch.device('cpu'), torch.bool"),
        ("iota", "5, 2, 3, torch.device('cpu'), torch.int32"),
        ("uniform", "(4,), 0.0, 1.0, torch.device('cuda:0'), torch.bfloat16"),
    ] {
        outs.extend(rec(&mut b, name, args));
    }
    assert_round_trip(&b.finish(values(&outs)).unwrap());
}

#[test]
fn reduction_prims_round_trip() {
    let mut b = TraceBuilder::new();
    input(&mut b, "cpu f32[2, 3]");
    let mut outs = Vec::new();
    for (name, args) in [
        ("sum", "t0, (1,)"),
        ("prod", "t0, ()"),
        ("amax", "t0, (0, 1)"),
        ("amin", "t0, (0,)"),
        ("var", "t0, (1,), 1"),
        ("var_mean", "t0, (0, 1), 0.5"),
        ("argmax", "t0, None"),
        ("argmin", "t0, 1"),
    ] {
        outs.extend(rec(&mut b, name, args));
    }
    assert_round_trip(&b.finish(values(&outs)).unwrap());
}

#[test]
fn linalg_and_indexing_prims_round_trip() {
    let mut b = TraceBuilder::new();
    for ty in ["cpu f32[4, 5]", "cpu f32[5, 2]", "cpu f32[3, 5]", "cpu f32[3]", "cpu i64[3]", "cpu i64[4, 5]"] {
        input(&mut b, ty);
    }
    let mut outs = Vec::new();
    for (name, args) in [
        ("matmul", "t0, t1"),
        ("linear", "t0, t2, None"),
        ("linear", "t0, t2, t3"),
        ("embedding", "t5, t1"),
        ("take", "t0, t4, 0"),
        ("take_along_axis", "t0, t5, 1"),
        ("gather", "t0, t5, 0"),
        ("scatter_add", "t0, t5, t0, 1"),
        ("index_add", "t0, t4, t2, 0"),
        ("topk", "t0, 2, 1, True, False"),
        ("sort", "t0, 0, False, True"),
    ] {
        outs.extend(rec(&mut b, name, args));
    }
    assert_round_trip(&b.finish(values(&outs)).unwrap());
}

#[test]
fn composites_fallbacks_and_literals_round_trip() {
    let mut b = TraceBuilder::new();
    let x = input(&mut b, "cpu f32[2, 3]");
    input(&mut b, "int -4");
    input(&mut b, "bool True");
    input(&mut b, "float float('inf')");
    composite(&mut b, "ltorch.softmax", "t0, dim=1, dtype=None");
    let m = rec(&mut b, "amax", "t0, (1,)")[0];
    let m = rec(&mut b, "broadcast_in_dim", &format!("{m}, (2, 3), (0,)"))[0];
    let e = rec(&mut b, "sub", &format!("t0, {m}"))[0];
    let e = rec(&mut b, "exp", &e.to_string())[0];
    composite(&mut b, "ltorch.sum", &format!("{e}, 1, keepdim=True"));
    let s = rec(&mut b, "sum", &format!("{e}, (1,)"))[0];
    let s = rec(&mut b, "broadcast_in_dim", &format!("{s}, (2, 3), (0,)"))[0];
    b.end_composite(vec![s]).unwrap();
    let softmax = rec(&mut b, "div", &format!("{e}, {s}"))[0];
    b.end_composite(vec![softmax]).unwrap();
    composite(&mut b, "ltorch.var_mean", "t0, (0, 1), correction=1");
    let vm = rec(&mut b, "var_mean", "t0, (0, 1), 1");
    b.end_composite(vm.clone()).unwrap();
    let odd = "t0, [1, -2], (1,), (), slice(0, None, 2), ..., None, \"a\\\"b\\\\c\\n\", torch.complex64, \
               torch.device('cuda:1'), float('nan'), _c3, t1, t2, t3";
    let (args, kwargs) = parse_args(&format!("{odd}, key=[(t0,), 'x']")).unwrap();
    let cumsum = SymbolTable::register("torch.cumsum", SymbolKind::Fallback);
    let meta = TensorMeta::new(DType::F64, Device::CPU, vec![2, 3]);
    let f = b.record_fallback(cumsum, args, kwargs, vec![meta.clone(), meta]);
    let outputs =
        Arg::Tuple(vec![Arg::Value(softmax), values(&vm), Arg::List(vec![Arg::Value(f[1])]), Arg::Value(x), Arg::None]);
    assert_round_trip(&b.finish(outputs).unwrap());
}

#[test]
fn nested_composites_that_share_an_output_round_trip() {
    let mut b = TraceBuilder::new();
    input(&mut b, "cpu f32[4]");
    composite(&mut b, "ltorch.mean", "t0");
    let s = rec(&mut b, "sum", "t0, (0,)")[0];
    composite(&mut b, "ltorch.true_divide", &format!("{s}, 4"));
    let m = rec(&mut b, "div", &format!("{s}, 4.0"))[0];
    b.end_composite(vec![m]).unwrap();
    b.end_composite(vec![m]).unwrap();
    let n = rec(&mut b, "neg", &m.to_string())[0];
    assert_round_trip(&b.finish(Arg::Value(n)).unwrap());
}

#[test]
fn trivial_traces_round_trip() {
    let mut b = TraceBuilder::new();
    let x = input(&mut b, "cpu f32[]");
    assert_round_trip(&b.finish(Arg::Value(x)).unwrap());
    let b = TraceBuilder::new();
    assert_round_trip(&b.finish(Arg::Tuple(vec![])).unwrap());
    let mut b = TraceBuilder::new();
    let x = input(&mut b, "cpu f32[3]");
    assert_round_trip(&b.finish(Arg::Tuple(vec![Arg::Value(x)])).unwrap());
}

#[test]
fn parses_hand_written_text_without_preamble_or_type_comments() {
    let text =
        "def f(t0):\n  # t0: \"cpu f32[4]\"\n  t1 = prims.exp(t0)\n  t2 = prims.add(t1, (1.0))\n  return [t2, t1]";
    let trace = parse_trace(text).unwrap();
    assert_eq!(trace.bsyms.len(), 2);
    assert_eq!(trace.bsyms[1].args[1], Arg::Scalar(Scalar::Float(1.0)));
    assert_eq!(trace.tensor(ValueId(2)).unwrap().describe(), "cpu f32[4]");
}

#[test]
fn renumbers_names_with_gaps_and_in_any_order_densely_in_definition_order() {
    let text = "def f(t9, t4):
  # t9: \"cpu f32[2]\"
  # t4: \"cpu f32[2]\"
  t30 = ltorch.sigmoid(t4)  # t30: \"cpu f32[2]\"
    # t12 = prims.neg(t4)  # t12: \"cpu f32[2]\"
    # t30 = prims.exp(t12)  # t30: \"cpu f32[2]\"
  t7 = prims.add(t9, t30)  # t7: \"cpu f32[2]\"
  return (t7, t12)
";
    let trace = parse_trace(text).unwrap();
    let dense = "def f(t0, t1):
  # t0: \"cpu f32[2]\"
  # t1: \"cpu f32[2]\"
  t3 = ltorch.sigmoid(t1)  # t3: \"cpu f32[2]\"
    # t2 = prims.neg(t1)  # t2: \"cpu f32[2]\"
    # t3 = prims.exp(t2)  # t3: \"cpu f32[2]\"
  t4 = prims.add(t0, t3)  # t4: \"cpu f32[2]\"
  return (t4, t2)
";
    let printed = print_trace(&trace, "f");
    assert!(printed.ends_with(dense), "{printed}");
    assert_eq!(parse_trace(dense).unwrap(), trace);
}

const PARSER: &str = "trace parser";

/// Malformed function bodies (after `def computation(t0):` and `# t0: "cpu f32[2, 3]"`, so the
/// body starts at line 3): the error's kind and op, and what its message must contain.
const MALFORMED: &[(&str, ErrorKind, &str, &[&str])] = &[
    // A value is read after the line that defines it, and defined once.
    ("  t1 = prims.exp(t9)\n  return t1\n", Value, PARSER, &["line 3", "t9 is read here but no line above defines it"]),
    ("  t1 = prims.exp(t0)\n  return t7\n", Value, PARSER, &["line 4", "t7 is read here"]),
    ("  t1 = prims.exp(t0)\n  t1 = prims.exp(t1)\n  return t1\n", Value, PARSER, &["line 4", "t1 is defined a second"]),
    ("  t0 = prims.exp(t0)\n  return t0\n", Value, PARSER, &["line 3", "t0 is defined a second"]),
    ("  (t1, t2) = prims.exp(t0)\n  return t1\n", Value, PARSER, &["line 3", "defines 1 value(s)", "(t1, t2)"]),
    // Type comments are checked against the meta rules.
    (
        "  t1 = prims.sum(t0, (1,))  # t1: \"cpu f32[3]\"\n  return t1\n",
        Value,
        PARSER,
        &["line 3", "says \"cpu f32[3]\""],
    ),
    ("  t1 = prims.exp(t0)  # t2: \"cpu f32[2, 3]\"\n  return t1\n", Value, PARSER, &["line 3", "names (t2)"]),
    // Prim errors keep their op and kind, and gain the line.
    ("  t1 = prims.frobnicate(t0)\n  return t1\n", NotImplemented, "prims.frobnicate", &["line 3"]),
    ("  t1 = prims.sum(t0, (2,))\n  return t1\n", Index, "prims.sum", &["line 3", "dims"]),
    ("  t1 = prims.exp(t0, approx=True)\n  return t1\n", Value, PARSER, &["line 3", "keyword", "approx"]),
    // Syntax.
    ("   t1 = prims.exp(t0)\n  return t1\n", Value, PARSER, &["line 3", "indentation"]),
    ("  t1 = prims.exp(t0\n  return t1\n", Value, PARSER, &["line 3", "expected `)`"]),
    ("  t1 = prims.exp(t0) t2\n  return t1\n", Value, PARSER, &["line 3", "`t2`"]),
    ("  t1 = prims.exp(x)\n  return t1\n", Value, PARSER, &["line 3", "unknown name `x`"]),
    ("  t1 = prims.add(t0, \"a)\n  return t1\n", Value, PARSER, &["line 3", "unterminated string"]),
    ("  t1 = prims.add(t0, $)\n  return t1\n", Value, PARSER, &["line 3", "'$'"]),
    ("  t1 = prims.add(t0, torch.device('tpu'))\n  return t1\n", Value, PARSER, &["line 3", "tpu"]),
    ("  t1 = prims.exp(t0)\n", Value, PARSER, &["line 3", "no `return`"]),
    ("  return t0\n  t1 = prims.exp(t0)\n", Value, PARSER, &["line 4", "after `return`"]),
    (
        "  t1 = prims.exp(t0)\n  # t0: \"cpu f32[2, 3]\"\n  return t1\n",
        Value,
        PARSER,
        &["line 4", "right after the `def`"],
    ),
    // Decompositions.
    ("  t1 = prims.exp(t0)\n    t2 = prims.exp(t1)\n  return t1\n", Value, PARSER, &["line 4", "must be a comment"]),
    ("  t1 = prims.exp(t0)\n    # t2 = prims.exp(t1)\n  return t1\n", Value, PARSER, &["line 4", "deeper"]),
    (
        "  t2 = ltorch.exp(t0)\n    # t1 = prims.exp(t0)\n  return t2\n",
        Value,
        PARSER,
        &["line 3", "returns t2", "does not define"],
    ),
    ("  t1 = ltorch.exp(t0)\n  return t1\n", Value, PARSER, &["line 3", "does not define"]),
    ("  ltorch.exp(t0)\n    # t1 = prims.exp(t0)\n  return t1\n", Value, PARSER, &["line 3", "no outputs"]),
    // Fallbacks take their outputs' types from the type comment.
    ("  t1 = torch.cumsum(t0, 1)\n  return t1\n", Value, PARSER, &["line 3", "torch.cumsum", "tensor type comment"]),
];

#[test]
fn rejects_malformed_bodies_with_their_line() {
    for &(body, kind, op, fragments) in MALFORMED {
        let text = format!("def computation(t0):\n  # t0: \"cpu f32[2, 3]\"\n{body}");
        let e = parse_trace(&text).expect_err(body);
        assert_eq!((e.kind, e.op.as_str()), (kind, op), "{e}\n{body}");
        for fragment in fragments {
            assert!(e.message.contains(fragment), "{fragment:?} not in {e}\n{body}");
        }
    }
}

#[test]
fn rejects_malformed_headers() {
    let cases = [
        ("import torch\n", "line 1", "expected `def"),
        ("def f(t1, t1):\n  # t1: \"cpu f32[2]\"\n  return t1\n", "line 1", "input 2 is t1, which names an earlier"),
        ("def f(t0, t1):\n  # t0: \"cpu f32[2]\"\n  return t0\n", "line 3", "t1 has no type comment"),
        ("def f(t0):\n  # t0: \"cpu q32[2]\"\n  return t0\n", "line 2", "q32"),
        ("def f(t0):\n  # t1: \"cpu f32[2]\"\n  return t0\n", "line 2", "t1 is not an input"),
        ("def f(t0)\n", "line 1", "expected `:`"),
    ];
    for (text, line, fragment) in cases {
        let e = parse_trace(text).expect_err(text);
        assert_eq!((e.kind, e.op.as_str()), (Value, PARSER), "{e}");
        assert!(e.message.contains(line) && e.message.contains(fragment), "{e}\n{text}");
    }
}

#[test]
fn parses_literal_arguments() {
    let (args, kwargs) = parse_args("(1,), (), (1), [], -0.0, 1e20, 'q', slice(None, -1, None), x=...").unwrap();
    let expected = vec![
        Arg::ints(&[1]),
        Arg::Tuple(vec![]),
        Arg::Scalar(Scalar::Int(1)),
        Arg::List(vec![]),
        Arg::Scalar(Scalar::Float(-0.0)),
        Arg::Scalar(Scalar::Float(1e20)),
        Arg::Str("q".into()),
        Arg::Slice(Box::new([Arg::None, Arg::Scalar(Scalar::Int(-1)), Arg::None])),
    ];
    assert_eq!(args, expected);
    assert_eq!(kwargs, vec![("x".to_string(), Arg::Ellipsis)]);
    assert!(parse_args("x=1, 2").unwrap_err().message.contains("positional argument after a keyword"));
    assert!(parse_args("slice(1, 2)").unwrap_err().message.contains("exactly 3"));
    assert!(parse_args("torch.float33").unwrap_err().message.contains("unknown dtype torch.float33"));
    assert!(parse_args("99999999999999999999").unwrap_err().message.contains("bad number"));
}
