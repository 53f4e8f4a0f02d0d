//! `register_rule_set`: rewrite rules given as data from Python (`thunder_rs.rules`), converted
//! into `passes::data_rules` and registered as a pass that runs at the stage the user names.
//!
//! Python sends each pattern and replacement as nested tuples: `("var", name)`, `("lit", value)`,
//! `("rest",)`, `("list", (node, ...))`, `("call", callee, (node, ...), ((param, node), ...),
//! bind, single_use)` and `("composite", symbol, (node, ...), node)`. A prim's parameters are
//! given by name or after its operands; the prim's signature says which is which.

use crate::convert::{to_arg, types};
use crate::errors::{py_result, PyIrError};
use passes::data_rules::{DataRule, Template};
use passes::rewrite::Pat;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use trace_ir::prims::{signature, Operands, Signature};
use trace_ir::{bail, Arg, ErrorKind, IrError, Result};

/// One node of a pattern or replacement, as Python sent it.
enum Node {
    Var(String),
    Literal(Arg),
    Rest,
    List(Vec<Node>),
    Call { callee: String, args: Vec<Node>, params: Vec<(String, Node)>, bind: Option<String>, single_use: bool },
    Composite { symbol: String, args: Vec<Node>, decomposition: Box<Node> },
}

/// Reads a node; a literal that is not data (an arbitrary object) is an error naming it, after
/// `rule` (the rule set and the rule).
fn node<'py>(obj: &Bound<'py, PyAny>, rule: &str) -> PyResult<Node> {
    let tuple = obj.cast::<PyTuple>()?;
    let tag: String = tuple.get_item(0)?.extract()?;
    let nodes = |i: usize| -> PyResult<Vec<Node>> { tuple.get_item(i)?.try_iter()?.map(|x| node(&x?, rule)).collect() };
    Ok(match tag.as_str() {
        "var" => Node::Var(tuple.get_item(1)?.extract()?),
        "rest" => Node::Rest,
        "list" => Node::List(nodes(1)?),
        "lit" => {
            let value = tuple.get_item(1)?;
            let mut consts = Vec::new();
            let arg = to_arg(&value, types(obj.py())?, &mut consts)?;
            if !consts.is_empty() {
                let text = value.repr()?.to_string();
                return Err(py_error(format!(
                    "{rule}: a literal is a number, a tuple of ints, a dtype or None, got {text}"
                )));
            }
            Node::Literal(arg)
        }
        "call" => Node::Call {
            callee: tuple.get_item(1)?.extract()?,
            args: nodes(2)?,
            params: tuple
                .get_item(3)?
                .try_iter()?
                .map(|kv| {
                    let (key, value): (String, Bound<'py, PyAny>) = kv?.extract()?;
                    Ok((key, node(&value, rule)?))
                })
                .collect::<PyResult<_>>()?,
            bind: tuple.get_item(4)?.extract()?,
            single_use: tuple.get_item(5)?.extract()?,
        },
        "composite" => Node::Composite {
            symbol: tuple.get_item(1)?.extract()?,
            args: nodes(2)?,
            decomposition: Box::new(node(&tuple.get_item(3)?, rule)?),
        },
        other => return Err(py_error(format!("unknown rule node {other:?}"))),
    })
}

fn py_error(message: String) -> PyErr {
    PyIrError(IrError::new(ErrorKind::Value, "register_rules", message)).into()
}

/// A call's arguments split into operands and `(parameter position, node)`, by its signature.
struct Split<'n> {
    operands: Vec<&'n Node>,
    params: Vec<(usize, &'n Node)>,
}

fn split<'n>(callee: &str, sig: Signature, args: &'n [Node], params: &'n [(String, Node)]) -> Result<Split<'n>> {
    let n = match sig.operands {
        Operands::List => 1,
        Operands::Fixed(k) => k,
        // The optional operand is there when more arguments follow than parameters.
        Operands::WithOptional(k) => k + (args.len() > k + sig.params.len()) as usize,
    };
    let n = n.min(args.len());
    let mut operands: Vec<&Node> = Vec::with_capacity(n);
    for arg in &args[..n] {
        match (sig.operands, arg) {
            (Operands::List, Node::List(items)) => operands.extend(items),
            (Operands::List, _) => bail!(Value, "register_rules", "{callee} takes a list of operands first"),
            _ => operands.push(arg),
        }
    }
    let mut out: Vec<(usize, &Node)> = args[n..].iter().enumerate().collect();
    for (key, value) in params {
        let Some(i) = sig.params.iter().position(|p| p == key) else {
            bail!(
                Value,
                "register_rules",
                "{callee} has no parameter {key:?}; its parameters: ({})",
                sig.params.join(", ")
            );
        };
        if out.iter().any(|(j, _)| *j == i) {
            bail!(Value, "register_rules", "{callee}'s parameter {key} is given twice");
        }
        out.push((i, value));
    }
    if let Some((i, _)) = out.iter().find(|(i, _)| *i >= sig.params.len()) {
        bail!(Value, "register_rules", "{callee} takes {} arguments at most, got {}", n + sig.params.len(), n + i + 1);
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(Split { operands, params: out })
}

/// A pattern node as a [`Pat`].
fn pattern(n: &Node) -> Result<Pat> {
    Ok(match n {
        Node::Var(name) => Pat::Any(name.clone().into()),
        Node::Literal(arg) => Pat::Literal(arg.clone()),
        Node::Rest => Pat::Rest,
        Node::List(_) => bail!(Value, "register_rules", "a list is the operands of a prim that takes a list (cat)"),
        Node::Composite { symbol, .. } => {
            bail!(Value, "register_rules", "a pattern matches calls; {symbol} is a replacement")
        }
        Node::Call { callee, args, params, bind, single_use } => {
            let (operands, params) = match signature(callee) {
                Some(sig) => {
                    let s = split(callee, sig, args, params)?;
                    let params = s.params.into_iter().map(|(i, p)| Ok((i, pattern(p)?))).collect::<Result<_>>()?;
                    (s.operands.into_iter().map(pattern).collect::<Result<_>>()?, params)
                }
                // A composite's (or an unknown name's, which the rule's check names) arguments.
                None if params.is_empty() => (args.iter().map(pattern).collect::<Result<_>>()?, Vec::new()),
                None => bail!(Value, "register_rules", "{callee} takes no keyword arguments in a pattern"),
            };
            Pat::Call {
                prim: callee.clone().into(),
                operands,
                params,
                bind: bind.clone().map(Into::into),
                single_use: *single_use,
            }
        }
    })
}

/// A replacement node as a [`Template`]: every parameter of a prim call is given.
fn template(n: &Node) -> Result<Template> {
    Ok(match n {
        Node::Var(name) => Template::Bound(name.clone().into()),
        Node::Literal(arg) => Template::Literal(arg.clone()),
        Node::Rest | Node::List(_) => {
            bail!(Value, "register_rules", "a replacement is a call, a bound value or a literal")
        }
        Node::Composite { symbol, args, decomposition } => Template::Composite {
            symbol: symbol.clone().into(),
            args: args.iter().map(template).collect::<Result<_>>()?,
            decomposition: Box::new(template(decomposition)?),
        },
        Node::Call { callee, args, params, .. } => {
            let Some(sig) = signature(callee) else {
                bail!(Value, "register_rules", "the replacement calls {callee:?}, which is no prim")
            };
            let s = split(callee, sig, args, params)?;
            if let Some(missing) = (0..sig.params.len()).find(|i| !s.params.iter().any(|(j, _)| j == i)) {
                bail!(
                    Value,
                    "register_rules",
                    "the replacement's {callee} needs its parameter {}",
                    sig.params[missing]
                );
            }
            Template::Call {
                prim: callee.clone().into(),
                operands: s.operands.into_iter().map(template).collect::<Result<_>>()?,
                params: s.params.into_iter().map(|(_, p)| template(p)).collect::<Result<_>>()?,
            }
        }
    })
}

/// One rule from its Python parts; errors name the rule set and the rule.
fn rule(set: &str, name: &str, pat: &Node, replacement: &Node) -> Result<DataRule> {
    let made = pattern(pat).and_then(|p| Ok((p, template(replacement)?))).map_err(|mut e| {
        e.message = format!("rule {name}: {}", e.message);
        e
    });
    made.and_then(|(p, t)| DataRule::new(name, p, t)).map_err(|mut e| {
        e.message = format!("rule set {set:?}: {}", e.message);
        e
    })
}

/// Registers `rules` (`(name, pattern, replacement)` as nested tuples) as the pass `name`, run
/// at `stage` (`program`, `forward` or `backward`) when a jit names it; registering a name again
/// replaces its rules. Refuses, naming the rule set, the rule and the name, what can never work.
#[pyfunction]
pub fn register_rule_set(
    name: &str,
    stage: &str,
    rules: Vec<(String, Bound<'_, PyAny>, Bound<'_, PyAny>)>,
) -> PyResult<()> {
    let halves = passes::pipeline::jit_pass_halves();
    if !halves.contains(&stage) {
        return Err(py_error(format!(
            "rule set {name:?}: stage is one of {}, got {stage:?} (argument stage)",
            halves.join(", ")
        )));
    }
    let mut made = Vec::with_capacity(rules.len());
    for (rule_name, pat, replacement) in &rules {
        let context = format!("rule set {name:?}: rule {rule_name}");
        let (pat, replacement) = (node(pat, &context)?, node(replacement, &context)?);
        made.push(py_result(rule(name, rule_name, &pat, &replacement))?);
    }
    py_result(passes::register_rules(name, made))?;
    passes::manager::set_stage(name, stage);
    Ok(())
}
