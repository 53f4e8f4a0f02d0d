//! Tests of the prims' call decoding and meta rules, one module per family.
//!
//! Each family lists its cases in tables, as JAX's `LAX_OPS` and Thunder's OpInfos do: a valid
//! call with the types of its outputs, and an invalid call with the kind of its error and the
//! argument its message must name. Tensors are written as type comments print them, with `cpu`
//! implied (`f32[2, 3]`); numbers as `int 3`; calls as traces print their arguments.

/// The two tests of a family whose file defines `VALID` and `INVALID` tables.
macro_rules! family_tests {
    () => {
        #[test]
        fn valid_calls_give_their_output_types() {
            super::check_valid(VALID);
        }

        #[test]
        fn invalid_calls_name_the_op_and_the_argument() {
            super::check_invalid(INVALID);
        }
    };
}

mod complex;
mod conv;
mod creation;
mod elementwise;
mod fft;
mod indexing;
mod linalg;
mod reduce;
mod scan;
mod shape;

use trace_ir::parser::{parse_args, parse_value_type};
use trace_ir::prims::all_names;
use trace_ir::{ErrorKind, IrError, TraceBuilder};

/// A valid call: input types, prim name, arguments, output types.
pub type Valid = (&'static [&'static str], &'static str, &'static str, &'static [&'static str]);

/// An invalid call: input types, prim name, arguments, error kind, and what the message must
/// name: the offending argument first, then other words or phrases.
pub type Invalid = (&'static [&'static str], &'static str, &'static str, ErrorKind, &'static [&'static str]);

/// `f32[2, 3]` -> `cpu f32[2, 3]`; types that name a device or a number type stay as they are.
fn full_type(ty: &str) -> String {
    let head = ty.split(' ').next().unwrap_or("");
    let explicit = ["cpu", "meta", "int", "float", "bool"].contains(&head) || head.starts_with("cuda");
    if explicit {
        ty.to_string()
    } else {
        format!("cpu {ty}")
    }
}

/// Records `prims.<name>(<args>)` over inputs `t0, t1, ...` of the given types; returns the
/// outputs' types.
pub fn call(inputs: &[&str], name: &str, args: &str) -> Result<Vec<String>, IrError> {
    let mut b = TraceBuilder::new();
    for ty in inputs {
        b.add_input(parse_value_type(&full_type(ty)).expect("a valid input type"));
    }
    let (args, _) = parse_args(args).expect("valid argument syntax");
    let outputs = b.record_prim(name, args)?;
    Ok(outputs.iter().map(|&v| b.value(v).and_then(|k| k.as_tensor()).unwrap().describe()).collect())
}

/// Whether `text` contains `phrase` with no identifier character on either side.
fn mentions(text: &str, phrase: &str) -> bool {
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(phrase)
        .any(|(i, _)| !ident(text[..i].chars().next_back()) && !ident(text[i + phrase.len()..].chars().next()))
}

fn valid_case(&(inputs, name, args, outputs): &Valid) -> Result<(), String> {
    let expected: Vec<String> = outputs.iter().map(|t| full_type(t)).collect();
    match call(inputs, name, args) {
        Ok(got) if got == expected => Ok(()),
        Ok(got) => Err(format!("prims.{name}({args}) over {inputs:?} gave {got:?}, expected {expected:?}")),
        Err(e) => Err(format!("prims.{name}({args}) over {inputs:?} failed: {e}")),
    }
}

fn invalid_case(&(inputs, name, args, kind, names): &Invalid) -> Result<(), String> {
    let e = match call(inputs, name, args) {
        Ok(got) => return Err(format!("prims.{name}({args}) over {inputs:?} gave {got:?}, expected an error")),
        Err(e) => e,
    };
    let context = format!("prims.{name}({args}) over {inputs:?}: {kind:?} expected, got {:?}: {e}", e.kind);
    if e.kind != kind || e.op != format!("prims.{name}") {
        return Err(context);
    }
    match names.iter().find(|phrase| !mentions(&e.message, phrase)) {
        Some(phrase) => Err(format!("{phrase:?} not named in {context}")),
        None => Ok(()),
    }
}

fn check_all<T>(cases: &[T], check: fn(&T) -> Result<(), String>) {
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c).err()).collect();
    assert!(failures.is_empty(), "{} case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

pub fn check_valid(cases: &[Valid]) {
    check_all(cases, valid_case);
}

pub fn check_invalid(cases: &[Invalid]) {
    check_all(cases, invalid_case);
}

#[test]
fn every_prim_has_a_valid_case() {
    let covered: Vec<&str> = [
        elementwise::valid(),
        shape::VALID.to_vec(),
        creation::VALID.to_vec(),
        conv::VALID.to_vec(),
        reduce::VALID.to_vec(),
        scan::VALID.to_vec(),
        linalg::VALID.to_vec(),
        indexing::VALID.to_vec(),
        complex::VALID.to_vec(),
        fft::VALID.to_vec(),
    ]
    .iter()
    .flatten()
    .map(|case| case.1)
    .collect();
    let missing: Vec<&str> = all_names().into_iter().filter(|n| !covered.contains(n)).collect();
    assert!(missing.is_empty(), "prims without a valid case: {missing:?}");
}

#[test]
fn mentions_matches_whole_words_only() {
    assert!(mentions("expected a tensor for a, got 2", "a"));
    assert!(mentions("tensors[1] is f64", "tensors"));
    assert!(!mentions("shapes differ", "a"));
    assert!(mentions("dims contains 2", "dims contains 2"));
}
