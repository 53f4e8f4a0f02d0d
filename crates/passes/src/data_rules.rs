//! Rewrite rules given as data, for users who do not write Rust (`thunder_rs.register_rules`
//! in Python): a [`Pat`]tern with owned names, and a [`Template`] of the replacement, which the
//! one driver ([`crate::rewrite::rewrite`]) interprets at each match.
//!
//! Everything a template can get wrong without seeing a trace is refused when the rule is made
//! ([`DataRule::new`]), naming the rule and the name: a callee that is no prim or registered
//! composite, a wrong operand count, a parameter the prim does not have or one it lacks, a
//! variable the pattern does not bind. What needs the trace (a replacement of another dtype or
//! shape, a call the meta rule refuses) fails when the rule fires, naming the rule.
//!
//! ```
//! use passes::data_rules::{DataRule, Template};
//! use passes::rewrite::{any, call, rewrite};
//! use passes::PassCx;
//! use trace_ir::{Arg, DType, Device, Scalar, TensorMeta, TraceBuilder, ValueKind};
//!
//! // add(x, x) -> mul(x, 2.0)
//! let double = Template::call("mul", vec![Template::bound("x"), Template::Literal(Arg::Scalar(Scalar::Float(2.0)))]);
//! let rule = DataRule::new("add-self", call("add", [any("x"), any("x")]), double).unwrap();
//!
//! let mut b = TraceBuilder::new();
//! let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![3])));
//! let y = b.record_prim("add", vec![Arg::Value(x), Arg::Value(x)]).unwrap()[0];
//! let trace = b.finish(Arg::Value(y)).unwrap();
//! let rules = [rule];
//! let (out, report) = rewrite(&trace, &rules, &PassCx::default()).unwrap();
//! assert_eq!(out.bsyms[0].symbol.as_prim().unwrap().name(), "mul");
//! assert_eq!(report.fired, [("add-self", 1)]);
//! ```

use crate::rewrite::{check_pattern, takes, Input, Match, Name, NewCall, Pat, Replacement, RewriteRule};
use rustc_hash::FxHashSet;
use std::borrow::Cow;
use trace_ir::prims::{signature, Operands, Signature};
use trace_ir::{bail, Arg, Prim, Result, SymbolTable, ValueId};

/// What replaces a matched value, as data.
#[derive(Clone, Debug, PartialEq)]
pub enum Template {
    /// The operand or parameter the pattern bound to the name (at the top: that value).
    Bound(Name),
    /// An argument as written: a number, an int tuple, a dtype.
    Literal(Arg),
    /// A call of the prim `prim`: its operands (calls are emitted operands first), then every
    /// parameter, in the order a call prints them.
    Call {
        /// The prim's name as printed after `prims.` (`mul`).
        prim: Name,
        /// Its operands, as many as the prim takes.
        operands: Vec<Template>,
        /// Its parameters, every one, in the order a call prints them.
        params: Vec<Template>,
    },
    /// One call of the registered composite `symbol` on `args` (bound values or literals), with
    /// the prim calls of `decomposition` (on the same values) as its meaning: executors that
    /// know the composite run it whole (`ltorch.silu` as `torch.nn.functional.silu`).
    Composite {
        /// The composite's registered name (`ltorch.silu`).
        symbol: Name,
        /// Its arguments, as the composite's Python function takes them.
        args: Vec<Template>,
        /// The prim calls computing what the composite computes, the outermost its output.
        decomposition: Box<Template>,
    },
}

impl Template {
    /// `Template::Bound(name)`.
    pub fn bound(name: impl Into<Name>) -> Template {
        Template::Bound(name.into())
    }

    /// A call of the parameterless prim `prim` on `operands`.
    pub fn call(prim: impl Into<Name>, operands: Vec<Template>) -> Template {
        Template::Call { prim: prim.into(), operands, params: Vec::new() }
    }
}

/// A named rewrite rule given as data.
#[derive(Clone, Debug, PartialEq)]
pub struct DataRule {
    name: String,
    pattern: Pat,
    replacement: Template,
}

impl DataRule {
    /// The rule `name`, once its pattern and replacement are checked (see the module docs);
    /// the error names the rule and what is wrong.
    pub fn new(name: impl Into<String>, pattern: Pat, replacement: Template) -> Result<DataRule> {
        let name = name.into();
        if !matches!(pattern, Pat::Call { .. }) {
            bail!(Value, "register_rules", "rule {name}: a pattern is a call, got {pattern:?}");
        }
        check_pattern(&name, &pattern)?;
        let mut bound = FxHashSet::default();
        bindings(&pattern, &mut bound);
        let checker = Checker { rule: &name, bound: &bound };
        match &replacement {
            Template::Literal(a) => {
                bail!(Value, "register_rules", "rule {name}: replaces a value by the literal {a:?}")
            }
            Template::Composite { symbol, args, decomposition } => checker.composite(symbol, args, decomposition)?,
            other => checker.template(other)?,
        }
        Ok(DataRule { name, pattern, replacement })
    }

    /// Appends the calls `template` makes (its operands' first) to `calls`; returns what the
    /// template is as an input of a later call.
    fn emit(&self, m: &Match, template: &Template, calls: &mut Vec<NewCall>) -> Result<Input> {
        let Template::Call { prim, operands, params } = template else {
            return Ok(Input::Arg(self.leaf(m, template)?));
        };
        let inputs: Vec<Input> = operands.iter().map(|o| self.emit(m, o, calls)).collect::<Result<_>>()?;
        let params: Vec<Arg> = params.iter().map(|p| self.leaf(m, p)).collect::<Result<_>>()?;
        let prim = build_prim(&self.name, prim, &inputs, params)?;
        calls.push((prim, inputs));
        Ok(Input::Result(calls.len() - 1))
    }

    /// A bound operand or a literal.
    fn leaf(&self, m: &Match, template: &Template) -> Result<Arg> {
        match template {
            Template::Bound(name) => match m.bound(name) {
                Some(arg) => Ok(arg.clone()),
                None => bail!(Runtime, "rewrite", "rule {}: the pattern bound no {name:?}", self.name),
            },
            Template::Literal(arg) => Ok(arg.clone()),
            other => bail!(Value, "rewrite", "rule {}: {other:?} is not an argument", self.name),
        }
    }
}

impl RewriteRule for DataRule {
    fn name(&self) -> &str {
        &self.name
    }

    fn pattern(&self) -> Cow<'_, Pat> {
        Cow::Borrowed(&self.pattern)
    }

    fn rewrite(&self, m: &Match) -> Result<Option<Replacement>> {
        let mut calls = Vec::new();
        match &self.replacement {
            // A bound number cannot stand for a tensor: the rule does not apply.
            Template::Bound(name) => Ok(m.value(name).map(Replacement::Value)),
            Template::Composite { symbol, args, decomposition } => {
                let args = args.iter().map(|a| self.leaf(m, a)).collect::<Result<_>>()?;
                self.emit(m, decomposition, &mut calls)?;
                Ok(Some(Replacement::Composite { symbol: symbol.clone(), args, decomposition: calls }))
            }
            call => {
                self.emit(m, call, &mut calls)?;
                Ok(Some(Replacement::Calls(calls)))
            }
        }
    }
}

/// The prim `name` with `params`, decoded as the parser decodes a call (its errors are the
/// parser's, naming the parameter); the operands stand in by position.
fn build_prim(rule: &str, name: &str, inputs: &[Input], params: Vec<Arg>) -> Result<Prim> {
    let Some(sig) = signature(name) else { bail!(Value, "rewrite", "rule {rule} names {name:?}, which is no prim") };
    let operands: Vec<Arg> = inputs
        .iter()
        .enumerate()
        .map(|(i, input)| match input {
            Input::Arg(a) => a.clone(),
            Input::Result(_) => Arg::Value(ValueId(i as u32)),
        })
        .collect();
    let mut call = sig.operands.call_args(&operands);
    call.extend(params);
    Prim::from_call(name, call).map(|(prim, _)| prim).map_err(|mut e| {
        e.message = format!("rule {rule}: {}: {}", e.op, e.message);
        e
    })
}

/// Adds the names `pat` binds (operands, parameters, calls) to `out`.
fn bindings<'p>(pat: &'p Pat, out: &mut FxHashSet<&'p str>) {
    match pat {
        Pat::Any(name) => {
            out.insert(name);
        }
        Pat::Call { operands, params, bind, .. } => {
            out.extend(bind.as_deref());
            operands.iter().chain(params.iter().map(|(_, p)| p)).for_each(|p| bindings(p, out));
        }
        Pat::Rest | Pat::Literal(_) => {}
    }
}

/// Checks a replacement against the names its rule's pattern binds.
struct Checker<'a> {
    rule: &'a str,
    bound: &'a FxHashSet<&'a str>,
}

impl Checker<'_> {
    fn template(&self, template: &Template) -> Result<()> {
        let rule = self.rule;
        match template {
            Template::Bound(name) if !self.bound.contains(name.as_ref()) => {
                let mut known: Vec<&str> = self.bound.iter().copied().collect();
                known.sort();
                bail!(
                    Value,
                    "register_rules",
                    "rule {rule}: the replacement reads {name:?}, which the pattern does not bind (it binds: {})",
                    known.join(", ")
                )
            }
            Template::Bound(_) | Template::Literal(_) => Ok(()),
            Template::Composite { symbol, .. } => {
                bail!(Value, "register_rules", "rule {rule}: the composite {symbol} can only be the whole replacement")
            }
            Template::Call { prim, operands, params } => {
                let Some(sig) = signature(prim) else {
                    bail!(Value, "register_rules", "rule {rule}: the replacement calls {prim:?}, which is no prim")
                };
                check_call(rule, prim, sig, operands.len(), params.len())?;
                operands.iter().chain(params).try_for_each(|t| self.template(t))?;
                if params.iter().all(|p| matches!(p, Template::Literal(_))) {
                    // Literal parameters decode now, so a wrong one is refused before any trace.
                    let inputs: Vec<Input> = (0..operands.len()).map(Input::Result).collect();
                    let literals = params.iter().map(|p| match p {
                        Template::Literal(a) => a.clone(),
                        _ => unreachable!("all literal"),
                    });
                    build_prim(rule, prim, &inputs, literals.collect())?;
                }
                Ok(())
            }
        }
    }

    fn composite(&self, symbol: &str, args: &[Template], decomposition: &Template) -> Result<()> {
        let rule = self.rule;
        if SymbolTable::lookup(symbol).is_none() {
            bail!(
                Value,
                "register_rules",
                "rule {rule}: the replacement calls {symbol:?}, which is no registered composite"
            );
        }
        if let Some(a) = args.iter().find(|a| !matches!(a, Template::Bound(_) | Template::Literal(_))) {
            bail!(
                Value,
                "register_rules",
                "rule {rule}: the arguments of {symbol} are bound values or literals, got {a:?}"
            );
        }
        if !matches!(decomposition, Template::Call { .. }) {
            bail!(Value, "register_rules", "rule {rule}: the decomposition of {symbol} is a prim call");
        }
        args.iter().try_for_each(|a| self.template(a))?;
        self.template(decomposition)
    }
}

/// A call of `prim` with `n` operands and `p` parameters fits its signature.
fn check_call(rule: &str, prim: &str, sig: Signature, n: usize, p: usize) -> Result<()> {
    let fits = match sig.operands {
        Operands::Fixed(k) => n == k,
        Operands::List => n >= 1,
        Operands::WithOptional(k) => n == k || n == k + 1,
    };
    if !fits {
        bail!(
            Value,
            "register_rules",
            "rule {rule}: {prim} takes {} operands, the replacement gives it {n}",
            takes(sig.operands)
        );
    }
    if p != sig.params.len() {
        bail!(
            Value,
            "register_rules",
            "rule {rule}: {prim} takes the parameters ({}), the replacement gives {p}",
            sig.params.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::{any, call, rewrite};
    use crate::PassCx;
    use trace_ir::{DType, Device, Scalar, SymbolKind, TensorMeta, Trace, TraceBuilder, ValueKind};

    fn float(x: f64) -> Template {
        Template::Literal(Arg::Scalar(Scalar::Float(x)))
    }

    /// `exp(x) * 2.0` over a `[2, 3]` input, with `sum(_, dims)` after it when `dims` is given.
    fn program(dims: Option<&[i64]>) -> Trace {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 3])));
        let e = b.record_prim("exp", vec![Arg::Value(x)]).unwrap()[0];
        let mut out = b.record_prim("mul", vec![Arg::Value(e), Arg::Scalar(Scalar::Float(2.0))]).unwrap()[0];
        if let Some(dims) = dims {
            out = b.record_prim("sum", vec![Arg::Value(out), Arg::ints(dims)]).unwrap()[0];
        }
        b.finish(Arg::Value(out)).unwrap()
    }

    fn names(trace: &Trace) -> Vec<String> {
        trace.bsyms.iter().map(|b| b.symbol.qualified_name()).collect()
    }

    #[test]
    fn a_nested_replacement_is_emitted_operands_first() {
        // mul(exp(x), 2.0) -> add(exp(x), exp(x)), its operand a call of its own
        let pattern = call("mul", [call("exp", [any("x")]).bind("e"), Pat::Literal(Arg::Scalar(Scalar::Float(2.0)))]);
        let twice =
            Template::call("add", vec![Template::bound("e"), Template::call("exp", vec![Template::bound("x")])]);
        let rule = DataRule::new("double", pattern, twice).unwrap();
        let rules = [rule];
        let (out, report) = rewrite(&program(None), &rules, &PassCx::default()).unwrap();
        assert_eq!(names(&out), ["prims.exp", "prims.exp", "prims.add"]);
        assert_eq!(report.to_string(), "fired: double x1");
    }

    #[test]
    fn parameters_match_and_bind() {
        // sum(mul(x, 2.0), dims) -> mul(sum(x, dims), 2.0), for dims (1,) only
        let scaled = call("mul", [any("x"), any("k")]).single_use();
        let pattern = |dims: Pat| match call("sum", [scaled.clone()]) {
            Pat::Call { prim, operands, bind, single_use, .. } => {
                Pat::Call { prim, operands, params: vec![(0, dims)], bind, single_use }
            }
            _ => unreachable!(),
        };
        let summed = Template::Call {
            prim: "sum".into(),
            operands: vec![Template::bound("x")],
            params: vec![Template::bound("dims")],
        };
        let replacement = Template::call("mul", vec![summed, Template::bound("k")]);
        let bound = DataRule::new("sum-of-scaled", pattern(Pat::Any("dims".into())), replacement.clone()).unwrap();
        let (out, _) = rewrite(&program(Some(&[1])), std::slice::from_ref(&bound), &PassCx::default()).unwrap();
        assert_eq!(names(&out), ["prims.exp", "prims.sum", "prims.mul"]);
        let only_0 = DataRule::new("sum-0", pattern(Pat::Literal(Arg::ints(&[0]))), Template::bound("x"));
        // The replacement reads `x` only; `x` has the shape of the sum's input, not its output.
        let rules = [only_0.unwrap()];
        let (_, report) = rewrite(&program(Some(&[1])), &rules, &PassCx::default()).unwrap();
        assert!(report.fired.is_empty(), "dims (1,) is not (0,)");
    }

    #[test]
    fn a_composite_pattern_matches_the_composite_by_name() {
        let mut b = TraceBuilder::new();
        let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![4])));
        let id = SymbolTable::register("test.sigmoid", SymbolKind::Composite);
        b.begin_composite(id, vec![Arg::Value(x)], Vec::new());
        let n = b.record_prim("neg", vec![Arg::Value(x)]).unwrap()[0];
        let e = b.record_prim("exp", vec![Arg::Value(n)]).unwrap()[0];
        let a = b.record_prim("add", vec![Arg::Value(e), Arg::Scalar(Scalar::Float(1.0))]).unwrap()[0];
        let s = b.record_prim("reciprocal", vec![Arg::Value(a)]).unwrap()[0];
        b.end_composite(vec![s]).unwrap();
        let y = b.record_prim("mul", vec![Arg::Value(x), Arg::Value(s)]).unwrap()[0];
        let trace = b.finish(Arg::Value(y)).unwrap();
        SymbolTable::register("test.silu", SymbolKind::Composite);
        let x_ = || Template::bound("x");
        let decomposition = Template::call(
            "div",
            vec![
                x_(),
                Template::call("add", vec![Template::call("exp", vec![Template::call("neg", vec![x_()])]), float(1.0)]),
            ],
        );
        let silu = Template::Composite {
            symbol: "test.silu".into(),
            args: vec![x_()],
            decomposition: Box::new(decomposition),
        };
        let rule = DataRule::new("swish", call("mul", [any("x"), call("test.sigmoid", [any("x")])]), silu).unwrap();
        let rules = [rule];
        let (out, report) = rewrite(&trace, &rules, &PassCx::default()).unwrap();
        assert_eq!(names(&out), ["test.silu"]);
        assert_eq!(out.bsyms[0].subsymbols.len(), 4);
        assert_eq!(report.fired, [("swish", 1)]);
    }

    #[test]
    fn registration_refuses_what_can_never_work_naming_the_rule_and_the_name() {
        let unbound = DataRule::new("r1", call("exp", [any("x")]), Template::call("neg", vec![Template::bound("y")]));
        assert!(unbound
            .unwrap_err()
            .message
            .contains("rule r1: the replacement reads \"y\", which the pattern does not bind"));
        let no_prim = DataRule::new("r2", call("exq", [any("x")]), Template::bound("x"));
        assert!(no_prim.unwrap_err().message.contains("rule r2 names \"exq\", which is no prim"));
        let no_prim = DataRule::new("r3", call("exp", [any("x")]), Template::call("nge", vec![Template::bound("x")]));
        assert!(no_prim.unwrap_err().message.contains("rule r3: the replacement calls \"nge\", which is no prim"));
        let count = DataRule::new("r4", call("exp", [any("x"), any("y")]), Template::bound("x"));
        assert!(count.unwrap_err().message.contains("rule r4: exp takes 1 operands, the pattern gives it 2"));
        let count = DataRule::new("r5", call("exp", [any("x")]), Template::call("add", vec![Template::bound("x")]));
        assert!(count.unwrap_err().message.contains("rule r5: add takes 2 operands, the replacement gives it 1"));
        let params = DataRule::new("r6", call("exp", [any("x")]), Template::call("sum", vec![Template::bound("x")]));
        assert!(params
            .unwrap_err()
            .message
            .contains("rule r6: sum takes the parameters (dims), the replacement gives 0"));
        let bad = Template::Call { prim: "sum".into(), operands: vec![Template::bound("x")], params: vec![float(1.5)] };
        let err = DataRule::new("r7", call("exp", [any("x")]), bad).unwrap_err();
        assert!(err.message.starts_with("rule r7: prims.sum:"), "{err}");
    }

    #[test]
    fn a_replacement_of_another_dtype_fails_naming_the_rule() {
        let to_f64 = Template::Call {
            prim: "convert_element_type".into(),
            operands: vec![Template::bound("x")],
            params: vec![Template::Literal(Arg::DType(DType::F64))],
        };
        let rule = DataRule::new("widen", call("exp", [any("x")]), to_f64).unwrap();
        let err = rewrite(&program(None), &[rule], &PassCx::default()).unwrap_err();
        assert!(err.message.contains("rule widen replaced") && err.message.contains("f64"), "{err}");
    }
}
