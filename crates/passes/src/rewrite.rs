//! Rewrite rules as data, and the one driver that applies a rule set to a trace.
//!
//! A [`Rule`] is a name, a [`Pat`]tern over the calls that define a value, and a rewrite that
//! builds the [`Replacement`] from what the pattern bound (or declines, when a shape or
//! parameter condition fails). Patterns match prims by name; a composite whose decomposition is
//! a single prim call (`ltorch.reshape`, `ltorch.t`) matches as that prim, and a rule replacing
//! it emits prims. A pattern may also name a registered composite (`ltorch.sigmoid`), matching
//! its calls by their positional arguments. A name that is no prim would never match, nor would
//! a call with the wrong number of operands, so [`check`] refuses them, naming the rule:
//! [`crate::register_rules`] checks a rule set as it registers it, and [`rewrite`] checks every
//! rule set it applies (a plugin's too) before its sweep. Rules given as data (from Python) are
//! [`crate::data_rules::DataRule`]s: the driver is generic over [`RewriteRule`], so the
//! compiled-in rule sets pay nothing for them.
//!
//! [`rewrite`] makes ONE forward sweep over the top-level calls. Each call, with its inputs
//! renamed by the rewrites so far, is matched against the rules in order; when one fires, the
//! replacement's calls are emitted in its place and matched again themselves before the sweep
//! moves on, so rewrites compose: a chain of `n` reshapes folds to one reshape in one sweep.
//! Operands are matched against the calls already emitted, so a pattern sees the rewritten
//! program. A replacement must have the replaced value's shape, dtype and device (the driver
//! checks, and fails naming the rule otherwise). Calls left dead are removed as [`crate::dce::dce`] does at the
//! end of the sweep; intermediates with other uses stay.
//!
//! # Writing a rule and a pass
//!
//! ```
//! use passes::rewrite::{any, call, rewrite, Replacement, Rule};
//! use passes::PassCx;
//! use trace_ir::prims::Shape;
//! use trace_ir::{Arg, DType, Device, Result, TensorMeta, Trace, TraceBuilder, ValueKind};
//!
//! /// reshape(reshape(x, s1), s2) -> reshape(x, s2), when the inner reshape has no other use.
//! const RESHAPE_RESHAPE: Rule = Rule {
//!     name: "reshape-reshape",
//!     pattern: || call("reshape", [call("reshape", [any("x")]).single_use()]).bind("outer"),
//!     rewrite: |m| {
//!         let shape = m.meta("outer")?.shape.clone();
//!         Some(Replacement::call(Shape::Reshape { shape }, [m.arg("x")]))
//!     },
//! };
//!
//! /// A pass applying the rule set, registered under a name like any pass: then
//! /// `thunder_rs.jit(fn, passes=["fold_reshapes"])` runs it.
//! fn fold_reshapes(trace: &Trace, cx: &PassCx) -> Result<Trace> {
//!     Ok(rewrite(trace, &[RESHAPE_RESHAPE], cx)?.0)
//! }
//! passes::register_pass("fold_reshapes", fold_reshapes).unwrap();
//!
//! let mut b = TraceBuilder::new();
//! let x = b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 6])));
//! let r1 = b.record_prim("reshape", vec![Arg::Value(x), Arg::ints(&[3, 4])]).unwrap()[0];
//! let r2 = b.record_prim("reshape", vec![Arg::Value(r1), Arg::ints(&[12])]).unwrap()[0];
//! let trace = b.finish(Arg::Value(r2)).unwrap();
//! let (folded, report) = rewrite(&trace, &[RESHAPE_RESHAPE], &PassCx::default()).unwrap();
//! assert_eq!(folded.bsyms.len(), 1);
//! assert_eq!(report.fired, [("reshape-reshape", 1)]);
//! assert_eq!(fold_reshapes(&trace, &PassCx::default()).unwrap().bsyms.len(), 1);
//! ```
//!
//! The pipeline runs a built-in rule set as a `Rewrite` row of its table
//! ([`crate::pipeline::Run::Rewrite`]), whose record notes the [`RewriteReport`]
//! (`# fired: reshape-reshape x2, ...` in the stage's dump).
//!
//! A fused pattern (TransformerEngine's layer norm followed by a linear, say) is a rule whose
//! pattern nests the calls it fuses and whose replacement is a [`Replacement::Composite`]: the
//! fused symbol, with the calls it replaces as its decomposition.

use crate::dce::live_calls;
use crate::PassCx;
use rustc_hash::{FxHashMap, FxHashSet};
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use trace_ir::prims::{signature, Operands};
use trace_ir::{
    bail, Arg, BoundSymbol, IrError, Prim, Result, Symbol, SymbolKind, SymbolTable, TensorMeta, Trace, TraceBuilder,
    ValueId, ValueKind,
};

/// A name in a pattern: a literal in the rules written in Rust, owned in rules given as data
/// (from Python, see [`crate::data_rules`]).
pub type Name = Cow<'static, str>;

/// A pattern over the call that defines a value.
#[derive(Clone, Debug, PartialEq)]
pub enum Pat {
    /// The remaining operands of a call, whatever they are (last in a `Call`'s operands; for
    /// prims taking a list, such as `cat`).
    Rest,
    /// Any operand (a value or a number), bound to the name. A name bound twice in one
    /// pattern must bind equal operands.
    Any(Name),
    /// An operand or parameter equal to this one (`1.0` in `mul(x, 1.0)`: a float, not an int).
    Literal(Arg),
    /// A value that is the single output of a call of the prim named `prim` (or of the
    /// composite symbol so named, `ltorch.sigmoid`), whose operands match `operands` (as many
    /// as it has).
    Call {
        /// The prim's name as printed after `prims.` (`mul`); [`check`] refuses one that names no prim.
        prim: Name,
        /// Patterns for the call's operands, in order; a call with another number of operands does not
        /// match (unless the last pattern is [`Pat::Rest`]).
        operands: Vec<Pat>,
        /// Patterns over some of the prim's parameters, by position (`sum`'s `dims` is 0);
        /// the others match whatever they are.
        params: Vec<(usize, Pat)>,
        /// The name the call is bound to (its output and its prim).
        bind: Option<Name>,
        /// The value has no use but the matched one (so rewriting leaves the call dead).
        single_use: bool,
    },
}

/// `Pat::Any(name)`.
pub fn any(name: &'static str) -> Pat {
    Pat::Any(Cow::Borrowed(name))
}

/// A call of `prim` on operands matching `operands`.
pub fn call<const N: usize>(prim: &'static str, operands: [Pat; N]) -> Pat {
    Pat::Call {
        prim: Cow::Borrowed(prim),
        operands: operands.into(),
        params: Vec::new(),
        bind: None,
        single_use: false,
    }
}

impl Pat {
    /// Binds the call to `name`.
    pub fn bind(mut self, name: impl Into<Name>) -> Pat {
        if let Pat::Call { bind, .. } = &mut self {
            *bind = Some(name.into());
        }
        self
    }

    /// Requires the call's output to have no other use.
    pub fn single_use(mut self) -> Pat {
        if let Pat::Call { single_use, .. } = &mut self {
            *single_use = true;
        }
        self
    }

    /// Whether the pattern names a composite symbol anywhere (then the sweep views composites).
    fn names_symbols(&self) -> bool {
        match self {
            Pat::Call { prim, operands, .. } => is_symbol_name(prim) || operands.iter().any(Pat::names_symbols),
            _ => false,
        }
    }
}

/// Whether a pattern's callee names a composite symbol (`ltorch.sigmoid`) rather than a prim.
fn is_symbol_name(name: &str) -> bool {
    name.contains('.')
}

/// An operand of a call a replacement makes: an argument, or the result of an earlier call of
/// the same replacement (by position).
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A value of the trace (one the pattern bound, from [`Match::arg`]) or a literal.
    Arg(Arg),
    /// The output of the replacement's call at this position (0 for its first).
    Result(usize),
}

impl From<Arg> for Input {
    fn from(a: Arg) -> Input {
        Input::Arg(a)
    }
}

/// A prim call a replacement makes.
pub type NewCall = (Prim, Vec<Input>);

/// What replaces the value a rule's pattern matched.
#[derive(Clone, Debug, PartialEq)]
pub enum Replacement {
    /// An existing value (an operand the pattern bound).
    Value(ValueId),
    /// Prim calls in order; the last call's result replaces the value. Each call is matched
    /// against the rules again as it is emitted.
    Calls(Vec<NewCall>),
    /// One call of the composite symbol named `symbol` (`ltorch.tensordot`) on `args`, with
    /// `decomposition` as its decomposition: the executors run the composite whole, and its
    /// meaning is its decomposition's. This is how a fused kernel replaces what it fuses.
    Composite {
        /// The composite's registered name; a name not yet registered is registered as a
        /// composite.
        symbol: Name,
        /// The call's arguments, as the composite's Python function takes them.
        args: Vec<Arg>,
        /// Prim calls computing what the composite computes, the last one's result its output.
        decomposition: Vec<NewCall>,
    },
}

impl Replacement {
    /// One prim call.
    pub fn call<const N: usize>(prim: impl Into<Prim>, operands: [Arg; N]) -> Replacement {
        Replacement::Calls(vec![(prim.into(), operands.into_iter().map(Input::Arg).collect())])
    }
}

/// A named rewrite: `pattern` (a function, so rules can be `const`) and the rewrite that builds
/// the replacement from a match, or returns `None` where it does not apply.
#[derive(Clone, Copy)]
pub struct Rule {
    /// The rule's name: what [`RewriteReport`] counts and errors name (`mul-sigmoid-silu`).
    pub name: &'static str,
    /// Builds the pattern the defining call of each value is matched against.
    pub pattern: fn() -> Pat,
    /// Builds the replacement from what the pattern bound, or `None` to leave the match as it is
    /// (a condition on shapes or parameters that the pattern cannot say).
    pub rewrite: fn(&Match) -> Option<Replacement>,
}

/// What the driver needs of a rule: the compiled-in [`Rule`], and a rule given as data
/// ([`crate::data_rules::DataRule`]), whose replacement the driver interprets. [`rewrite`] is
/// generic over it, so a rule set of one kind pays nothing for the other.
pub trait RewriteRule {
    /// The name reports and errors use.
    fn name(&self) -> &str;
    /// The pattern, built once per sweep.
    fn pattern(&self) -> Cow<'_, Pat>;
    /// The replacement of a match, `None` where the rule does not apply; an error names the rule.
    fn rewrite(&self, m: &Match) -> Result<Option<Replacement>>;
}

impl RewriteRule for Rule {
    fn name(&self) -> &str {
        self.name
    }

    fn pattern(&self) -> Cow<'_, Pat> {
        Cow::Owned((self.pattern)())
    }

    fn rewrite(&self, m: &Match) -> Result<Option<Replacement>> {
        Ok((self.rewrite)(m))
    }
}

/// How often each rule fired in one application of a rule set, in the rule set's order (rules
/// that never fired are left out).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewriteReport<'r> {
    /// `(rule name, times fired)`, in the rule set's order.
    pub fired: Vec<(&'r str, usize)>,
}

impl std::fmt::Display for RewriteReport<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fired: Vec<String> = self.fired.iter().map(|(name, n)| format!("{name} x{n}")).collect();
        write!(f, "fired: {}", if fired.is_empty() { "nothing".into() } else { fired.join(", ") })
    }
}

/// Checks that every call in `rules`' patterns names a prim (or a registered composite symbol)
/// with as many operands as it takes, and parameters it has; the error names the rule and the
/// name (and the prim meant, for a qualified `prims.mul`).
pub fn check<R: RewriteRule>(rules: &[R]) -> Result<()> {
    rules.iter().try_for_each(|rule| check_pattern(rule.name(), &rule.pattern()))
}

pub(crate) fn check_pattern(rule: &str, pat: &Pat) -> Result<()> {
    let Pat::Call { prim, operands, params, .. } = pat else { return Ok(()) };
    if is_symbol_name(prim) && SymbolTable::lookup(prim).is_some() {
        if !params.is_empty() {
            bail!(Value, "rewrite", "rule {rule}: {prim} is a composite symbol, whose arguments are all operands");
        }
    } else if !is_prim(prim) {
        let hint = match prim.rsplit_once('.') {
            Some((_, bare)) if is_prim(bare) => format!("; patterns name prims without their prefix: {bare:?}"),
            _ => "; patterns name prims (`mul`, `reshape`) or registered composite symbols (`ltorch.sigmoid`)".into(),
        };
        bail!(Value, "rewrite", "rule {rule} names {prim:?}, which is no prim{hint}");
    } else {
        check_counts(rule, prim, operands, params)?;
    }
    operands.iter().chain(params.iter().map(|(_, p)| p)).try_for_each(|operand| check_pattern(rule, operand))
}

/// A prim call's operands are as many as the prim takes, and its parameters some it has.
fn check_counts(rule: &str, prim: &str, operands: &[Pat], params: &[(usize, Pat)]) -> Result<()> {
    let sig = signature(prim).expect("a prim has a signature");
    let rest = matches!(operands.last(), Some(Pat::Rest));
    let n = operands.len() - rest as usize;
    let fits = match sig.operands {
        Operands::Fixed(k) => n == k || (rest && n <= k),
        Operands::List => n >= 1 || rest,
        Operands::WithOptional(k) => n == k || n == k + 1 || (rest && n <= k + 1),
    };
    if !fits {
        bail!(Value, "rewrite", "rule {rule}: {prim} takes {} operands, the pattern gives it {n}", takes(sig.operands));
    }
    if let Some((i, _)) = params.iter().find(|(i, _)| *i >= sig.params.len()) {
        bail!(
            Value,
            "rewrite",
            "rule {rule}: {prim} has {} parameters, the pattern names parameter {i}",
            sig.params.len()
        );
    }
    Ok(())
}

fn is_prim(name: &str) -> bool {
    static NAMES: OnceLock<FxHashSet<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| trace_ir::prims::all_names().into_iter().collect()).contains(name)
}

/// How many operands a prim takes, in words (`2`, `a list of`).
pub(crate) fn takes(operands: Operands) -> String {
    match operands {
        Operands::Fixed(k) => format!("{k}"),
        Operands::List => "a list of".into(),
        Operands::WithOptional(k) => format!("{k} or {}", k + 1),
    }
}

/// A call as patterns see it: the prim call it makes, and the composite it is when the sweep's
/// patterns name composites.
#[derive(Clone, Debug)]
struct CallView {
    /// The prim called (directly, or as a single-prim composite's decomposition).
    prim: Option<Prim>,
    /// The composite's name, for a composite whose positional arguments are these operands.
    symbol: Option<Arc<str>>,
    operands: Vec<Arg>,
}

/// What a pattern bound: an operand, and for calls the prim and its operands.
#[derive(Clone, Debug)]
struct Binding {
    arg: Arg,
    call: Option<CallView>,
}

/// The bindings of one match, with the trace's metadata.
pub struct Match<'a> {
    bindings: Vec<(&'a str, Binding)>,
    sweep: &'a Sweep<'a>,
}

impl Match<'_> {
    fn binding(&self, name: &str) -> Option<&Binding> {
        self.bindings.iter().find(|(n, _)| *n == name).map(|(_, b)| b)
    }

    /// The operand bound to `name` (a value or a number).
    ///
    /// # Panics
    /// If the pattern binds no such name: a bug in the rule.
    pub fn arg(&self, name: &str) -> Arg {
        self.binding(name).unwrap_or_else(|| panic!("pattern binds no `{name}`")).arg.clone()
    }

    /// The operand bound to `name`, if the pattern binds it.
    pub fn bound(&self, name: &str) -> Option<&Arg> {
        Some(&self.binding(name)?.arg)
    }

    /// The value bound to `name`, if it is a value.
    pub fn value(&self, name: &str) -> Option<ValueId> {
        self.binding(name)?.arg.as_value()
    }

    /// The tensor metadata of the value bound to `name`.
    pub fn meta(&self, name: &str) -> Option<&TensorMeta> {
        self.sweep.meta(self.value(name)?)
    }

    /// The prim of the call bound to `name` (`None` for a composite that is no single prim).
    pub fn prim(&self, name: &str) -> Option<&Prim> {
        self.binding(name)?.call.as_ref()?.prim.as_ref()
    }

    /// The operands of the call bound to `name`.
    pub fn operands(&self, name: &str) -> Option<&[Arg]> {
        Some(&self.binding(name)?.call.as_ref()?.operands)
    }

    /// The prim call defining `value` (seen through single-prim composites), for rules that
    /// look further than their pattern (over a list of operands, say).
    pub fn producer(&self, value: ValueId) -> Option<(&Prim, &[Arg])> {
        self.sweep.producer(value).and_then(|c| Some((c.prim.as_ref()?, c.operands.as_slice())))
    }

    /// Whether `value` has exactly one use.
    pub fn single_use(&self, value: ValueId) -> bool {
        self.sweep.uses.get(&value).copied().unwrap_or(0) == 1
    }

    /// The metadata of any tensor value.
    pub fn meta_of(&self, value: ValueId) -> Option<&TensorMeta> {
        self.sweep.meta(value)
    }
}

/// The state of one sweep: the calls emitted so far and what patterns need to know of them.
struct Sweep<'r> {
    builder: TraceBuilder,
    emitted: Vec<BoundSymbol>,
    /// The call (as patterns see it) that defines each value emitted so far.
    producers: FxHashMap<ValueId, CallView>,
    uses: FxHashMap<ValueId, usize>,
    subst: FxHashMap<ValueId, ValueId>,
    fired: Vec<usize>,
    /// Each rule's pattern, built once per sweep.
    patterns: Vec<Cow<'r, Pat>>,
    /// Some pattern names a composite symbol: calls are viewed as composites too.
    symbols: bool,
}

/// Rewrites per call at most this many times: a rule set that keeps rewriting its own output
/// is a bug, reported rather than looping.
const MAX_REWRITES_PER_CALL: usize = 64;

impl<'r> Sweep<'r> {
    /// The sweep's state, once every rule's pattern names known prims (see [`check`]).
    fn new<R: RewriteRule>(trace: &Trace, rules: &'r [R]) -> Result<Self> {
        let patterns: Vec<Cow<'r, Pat>> = rules.iter().map(|r| r.pattern()).collect();
        rules.iter().zip(&patterns).try_for_each(|(rule, pat)| check_pattern(rule.name(), pat))?;
        let symbols = patterns.iter().any(|p| p.names_symbols());
        let mut uses: FxHashMap<ValueId, usize> = FxHashMap::default();
        let mut count = |v: ValueId| *uses.entry(v).or_default() += 1;
        trace.bsyms.iter().for_each(|b| b.for_each_input(&mut count));
        trace.outputs.for_each_value(&mut count);
        Ok(Sweep {
            builder: TraceBuilder::resume(trace),
            emitted: Vec::with_capacity(trace.bsyms.len()),
            producers: FxHashMap::default(),
            uses,
            subst: FxHashMap::default(),
            fired: vec![0; rules.len()],
            patterns,
            symbols,
        })
    }

    fn meta(&self, v: ValueId) -> Option<&TensorMeta> {
        self.builder.value(v).and_then(ValueKind::as_tensor)
    }

    fn producer(&self, v: ValueId) -> Option<&CallView> {
        self.producers.get(&v)
    }

    /// Drops one use of `v`; a value left without uses releases the operands of its call (which
    /// DCE removes at the end), so that use counts stay exact through chains of rewrites.
    fn release(&mut self, v: ValueId) {
        let Some(n) = self.uses.get_mut(&v) else { return };
        *n = n.saturating_sub(1);
        if *n == 0 {
            let operands: Vec<ValueId> = match self.producers.get(&v) {
                Some(view) => view.operands.iter().filter_map(Arg::as_value).collect(),
                None => return,
            };
            operands.into_iter().for_each(|o| self.release(o));
        }
    }

    /// Adds the uses of what `replacement` reads at top level: an existing value takes over
    /// the uses of `old`; calls read their argument values once each.
    fn retain(&mut self, replacement: &Replacement, old: ValueId) {
        let taken_over = self.uses.get(&old).copied().unwrap_or(0);
        let mut count = |v: ValueId, n: usize| *self.uses.entry(v).or_default() += n;
        match replacement {
            Replacement::Value(v) => count(*v, taken_over),
            Replacement::Calls(calls) => calls.iter().flat_map(|(_, inputs)| inputs).for_each(|input| {
                if let Input::Arg(a) = input {
                    a.for_each_value(&mut |v| count(v, 1));
                }
            }),
            Replacement::Composite { args, .. } => args.iter().for_each(|a| a.for_each_value(&mut |v| count(v, 1))),
        }
    }

    /// Emits `bsym` as is and records what defines its output.
    fn keep(&mut self, bsym: BoundSymbol) {
        let view = call_view(&bsym, self.symbols);
        self.keep_viewed(bsym, view);
    }

    /// [`Sweep::keep`] with the call as patterns see it already computed.
    fn keep_viewed(&mut self, bsym: BoundSymbol, view: Option<CallView>) {
        if let Some(view) = view {
            self.producers.insert(bsym.outputs[0], view);
        }
        self.emitted.push(bsym);
    }

    /// Matches `bsym` against the rules; emits it, or its replacement (matched again in turn).
    fn visit<R: RewriteRule>(&mut self, bsym: BoundSymbol, rules: &[R], depth: usize) -> Result<()> {
        let Some(view) = call_view(&bsym, self.symbols) else {
            self.keep_viewed(bsym, None);
            return Ok(());
        };
        for (i, rule) in rules.iter().enumerate() {
            let mut bindings = Vec::new();
            let root = Arg::Value(bsym.outputs[0]);
            if !matches_call(self, &self.patterns[i], &view, &root, &mut bindings) {
                continue;
            }
            let replacement = rule.rewrite(&Match { bindings, sweep: self })?;
            // A value replaced by itself is no rewrite (and dropping its call would lose it).
            let Some(replacement) = replacement.filter(|r| *r != Replacement::Value(bsym.outputs[0])) else {
                continue;
            };
            if depth >= MAX_REWRITES_PER_CALL {
                bail!(Runtime, "rewrite", "rule {} keeps rewriting its own result at {}", rule.name(), bsym.outputs[0]);
            }
            self.fired[i] += 1;
            // Count what the replacement reads before releasing what the call read, so that
            // counts never drop to zero on the way (releasing a value's producer for nothing).
            self.retain(&replacement, bsym.outputs[0]);
            bsym.for_each_input(|v| self.release(v));
            return self.replace(&bsym, rule.name(), replacement, rules, depth);
        }
        self.keep_viewed(bsym, Some(view));
        Ok(())
    }

    /// Emits `replacement` for `bsym`'s output and renames the output's later uses.
    fn replace<R: RewriteRule>(
        &mut self,
        bsym: &BoundSymbol,
        rule: &str,
        replacement: Replacement,
        rules: &[R],
        depth: usize,
    ) -> Result<()> {
        let old = bsym.outputs[0];
        let new = match replacement {
            Replacement::Value(v) => {
                self.check_same_meta(rule, old, v)?;
                self.subst.insert(old, v);
                return Ok(());
            }
            Replacement::Calls(calls) => self.emit_calls(rule, calls, Some((rules, depth)))?,
            Replacement::Composite { symbol, args, decomposition } => {
                let id = SymbolTable::register(&symbol, SymbolKind::Composite);
                self.builder.begin_composite(id, args, Vec::new());
                let result = self.emit_calls::<R>(rule, decomposition, None);
                let end = result.and_then(|r| self.builder.end_composite(vec![r]).map(|()| r));
                if end.is_err() {
                    self.builder.abort_composite();
                }
                let result = end?;
                self.builder.take_bsyms().into_iter().for_each(|b| self.keep(b));
                result
            }
        };
        self.check_same_meta(rule, old, new)?;
        let moved = self.uses.get(&old).copied().unwrap_or(0);
        *self.uses.entry(new).or_default() += moved;
        self.subst.insert(old, new);
        Ok(())
    }

    /// Records `calls` and returns the last one's result. With `visit`, each call is matched
    /// against the rules as it is emitted (at top level); without, they stay in the builder (a
    /// composite's decomposition).
    fn emit_calls<R: RewriteRule>(
        &mut self,
        rule: &str,
        calls: Vec<NewCall>,
        visit: Option<(&[R], usize)>,
    ) -> Result<ValueId> {
        let mut results: Vec<ValueId> = Vec::with_capacity(calls.len());
        for (prim, inputs) in calls {
            let mut operands = Vec::with_capacity(inputs.len());
            for input in inputs {
                operands.push(match input {
                    Input::Arg(a) => a,
                    Input::Result(i) => match results.get(i) {
                        Some(&v) => {
                            if visit.is_some() {
                                *self.uses.entry(v).or_default() += 1;
                            }
                            Arg::Value(v)
                        }
                        None => bail!(Runtime, "rewrite", "rule {rule} reads result {i} before it is made"),
                    },
                });
            }
            // A call the meta rule refuses is the rule's error: say which rule made it.
            let outputs = self.builder.record(prim, operands).map_err(|e| named(rule, e))?;
            let [result] = outputs[..] else {
                bail!(Runtime, "rewrite", "rule {rule} emitted a call with {} outputs", outputs.len());
            };
            if let Some((rules, depth)) = visit {
                for emitted in self.builder.take_bsyms() {
                    self.visit(emitted, rules, depth + 1)?;
                }
            }
            results.push(*self.subst.get(&result).unwrap_or(&result));
        }
        match results.last() {
            Some(&last) => Ok(last),
            None => bail!(Runtime, "rewrite", "rule {rule} replaced a value by no call"),
        }
    }

    fn check_same_meta(&self, rule: &str, old: ValueId, new: ValueId) -> Result<()> {
        let (Some(a), Some(b)) = (self.meta(old), self.meta(new)) else {
            bail!(Runtime, "rewrite", "rule {rule} replaced {old} by {new}, which is not a tensor");
        };
        if (a.dtype, a.device, &a.shape) != (b.dtype, b.device, &b.shape) {
            bail!(Runtime, "rewrite", "rule {rule} replaced {old} ({}) by {new} ({})", a.describe(), b.describe());
        }
        Ok(())
    }
}

/// `error` as the rule `rule`'s.
fn named(rule: &str, mut error: IrError) -> IrError {
    error.message = format!("rule {rule}: {}", error.message);
    error
}

/// The call a bound symbol makes, as patterns see it: a prim call, or a composite whose
/// decomposition is exactly one prim call computing the composite's single output. With
/// `symbols` (some pattern names a composite), a composite without keyword arguments is also
/// seen by its name, its positional arguments as operands (a single-prim composite only when
/// they are its prim's operands). Calls with an effect and calls with several outputs match
/// nothing.
fn call_view(bsym: &BoundSymbol, symbols: bool) -> Option<CallView> {
    if bsym.outputs.len() != 1 || bsym.has_effect() {
        return None;
    }
    let mut leaf = bsym;
    while let [only] = &leaf.subsymbols[..] {
        leaf = only;
    }
    let symbol = || match bsym.symbol {
        Symbol::Composite(id) if bsym.kwargs.is_empty() => Some(SymbolTable::name(id)),
        _ => None,
    };
    match &leaf.symbol {
        Symbol::Prim(prim) if leaf.subsymbols.is_empty() && leaf.outputs == bsym.outputs && leaf.kwargs.is_empty() => {
            let composite = symbols && !std::ptr::eq(leaf, bsym) && leaf.args == bsym.args;
            let symbol = if composite { symbol() } else { None };
            Some(CallView { prim: Some(prim.clone()), symbol, operands: leaf.args.clone() })
        }
        _ if symbols => {
            symbol().map(|symbol| CallView { prim: None, symbol: Some(symbol), operands: bsym.args.clone() })
        }
        _ => None,
    }
}

/// Matches `pat` against `operand`, adding to `bindings`.
fn matches_arg<'p>(sweep: &Sweep, pat: &'p Pat, operand: &Arg, bindings: &mut Vec<(&'p str, Binding)>) -> bool {
    match pat {
        Pat::Rest => true,
        Pat::Any(name) => bind(bindings, name, Binding { arg: operand.clone(), call: None }),
        Pat::Literal(literal) => literal == operand,
        Pat::Call { single_use, .. } => {
            let Some(v) = operand.as_value() else { return false };
            if *single_use && sweep.uses.get(&v).copied().unwrap_or(0) != 1 {
                return false;
            }
            let Some(view) = sweep.producer(v) else { return false };
            matches_call(sweep, pat, view, operand, bindings)
        }
    }
}

/// Matches a `Pat::Call` against `view`, the call defining `output`.
fn matches_call<'p>(
    sweep: &Sweep,
    pat: &'p Pat,
    view: &CallView,
    output: &Arg,
    bindings: &mut Vec<(&'p str, Binding)>,
) -> bool {
    let Pat::Call { prim, operands, params, bind: name, .. } = pat else { return false };
    let named = match &view.prim {
        Some(p) if p.name() == prim.as_ref() => true,
        _ => view.symbol.as_deref() == Some(prim.as_ref()),
    };
    if !named {
        return false;
    }
    let fixed = match operands.last() {
        Some(Pat::Rest) => operands.len() - 1,
        _ => operands.len(),
    };
    let count_fits = if fixed < operands.len() { view.operands.len() >= fixed } else { view.operands.len() == fixed };
    if !count_fits {
        return false;
    }
    if !operands.iter().zip(&view.operands).all(|(p, a)| matches_arg(sweep, p, a, bindings)) {
        return false;
    }
    if !params.is_empty() {
        // Only data rules constrain parameters; built-in rules read them in their rewrite.
        let actual = view.prim.as_ref().map(Prim::params).unwrap_or_default();
        if !params.iter().all(|(i, p)| actual.get(*i).is_some_and(|a| matches_arg(sweep, p, a, bindings))) {
            return false;
        }
    }
    match name {
        Some(name) => bind(bindings, name, Binding { arg: output.clone(), call: Some(view.clone()) }),
        None => true,
    }
}

fn bind<'p>(bindings: &mut Vec<(&'p str, Binding)>, name: &'p str, binding: Binding) -> bool {
    match bindings.iter().find(|(n, _)| *n == name) {
        Some((_, earlier)) => earlier.arg == binding.arg,
        None => {
            bindings.push((name, binding));
            true
        }
    }
}

/// Applies `rules` to `trace` in one forward sweep (see the module docs), then removes the
/// calls left dead. Returns the rewritten trace and how often each rule fired. A rule whose
/// pattern names no prim is an error (see [`check`]).
pub fn rewrite<'r, R: RewriteRule>(trace: &Trace, rules: &'r [R], _cx: &PassCx) -> Result<(Trace, RewriteReport<'r>)> {
    let mut sweep = Sweep::new(trace, rules)?;
    for bsym in &trace.bsyms {
        let renamed = bsym.renamed(&sweep.subst);
        sweep.visit(renamed, rules, 0)?;
    }
    let subst = &sweep.subst;
    let outputs = trace.outputs.map_values(&mut |v| Arg::Value(*subst.get(&v).unwrap_or(&v)));
    let fired = rules.iter().zip(&sweep.fired).filter(|(_, &n)| n > 0).map(|(r, &n)| (r.name(), n)).collect();
    let Sweep { builder, mut emitted, .. } = sweep;
    let facts = std::sync::Arc::new(builder.facts().clone());
    let (values, _) = builder.into_parts();
    // What the rewrites left dead goes, as DCE removes it (without copying the calls again).
    let live = live_calls(&emitted, &outputs, values.len());
    let mut flags = live.into_iter();
    emitted.retain(|_| flags.next().unwrap_or(true));
    let rewritten = Trace { values: values.into(), inputs: trace.inputs.clone(), bsyms: emitted, outputs, facts };
    Ok((rewritten, RewriteReport { fired }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::prims::{Binary, Shape};
    use trace_ir::{DType, Device};

    fn input(b: &mut TraceBuilder, shape: &[i64]) -> ValueId {
        b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, shape.to_vec())))
    }

    /// add(x, x) -> mul(x, 2): a name bound twice must bind the same operand.
    const ADD_SELF: Rule = Rule {
        name: "add-self",
        pattern: || call("add", [any("x"), any("x")]),
        rewrite: |m| Some(Replacement::call(Binary::Mul, [m.arg("x"), Arg::Scalar(trace_ir::Scalar::Float(2.0))])),
    };

    /// A wrong rule: replaces a reshape by its input, whatever the shapes.
    const DROP_RESHAPE: Rule = Rule {
        name: "drop-reshape",
        pattern: || call("reshape", [any("x")]),
        rewrite: |m| m.value("x").map(Replacement::Value),
    };

    #[test]
    fn repeated_names_match_equal_operands_only() {
        let mut b = TraceBuilder::new();
        let (x, y) = (input(&mut b, &[3]), input(&mut b, &[3]));
        let same = b.record_prim("add", vec![Arg::Value(x), Arg::Value(x)]).unwrap()[0];
        let other = b.record_prim("add", vec![Arg::Value(x), Arg::Value(y)]).unwrap()[0];
        let trace = b.finish(Arg::Tuple(vec![Arg::Value(same), Arg::Value(other)])).unwrap();
        let (out, report) = rewrite(&trace, &[ADD_SELF], &PassCx::default()).unwrap();
        let names: Vec<&str> = out.bsyms.iter().map(|b| b.symbol.as_prim().unwrap().name()).collect();
        assert_eq!(names, ["mul", "add"]);
        assert_eq!(report.fired, [("add-self", 1)]);
        assert_eq!(report.to_string(), "fired: add-self x1");
    }

    #[test]
    fn a_replacement_of_another_shape_is_an_error_naming_the_rule() {
        let mut b = TraceBuilder::new();
        let x = input(&mut b, &[2, 3]);
        let r = b.record_prim("reshape", vec![Arg::Value(x), Arg::ints(&[6])]).unwrap()[0];
        let trace = b.finish(Arg::Value(r)).unwrap();
        let err = rewrite(&trace, &[DROP_RESHAPE], &PassCx::default()).unwrap_err();
        assert!(err.message.contains("drop-reshape"), "{err}");
    }

    #[test]
    fn rules_that_never_fire_are_not_reported() {
        let mut b = TraceBuilder::new();
        let x = input(&mut b, &[3]);
        let s = b.record_prim("sin", vec![Arg::Value(x)]).unwrap()[0];
        let trace = b.finish(Arg::Value(s)).unwrap();
        let (out, report) = rewrite(&trace, &[ADD_SELF, DROP_RESHAPE], &PassCx::default()).unwrap();
        assert_eq!(out.bsyms, trace.bsyms);
        assert!(report.fired.is_empty());
        assert_eq!(report.to_string(), "fired: nothing");
    }

    #[test]
    fn a_composite_of_one_prim_matches_as_that_prim() {
        let mut b = TraceBuilder::new();
        let x = input(&mut b, &[2, 3]);
        let id = SymbolTable::register("ltorch.reshape", SymbolKind::Composite);
        b.begin_composite(id, vec![Arg::Value(x), Arg::ints(&[6])], Vec::new());
        let inner = b.record(Shape::Reshape { shape: vec![6.into()] }.into(), vec![Arg::Value(x)]).unwrap()[0];
        b.end_composite(vec![inner]).unwrap();
        let outer =
            b.record(Shape::Reshape { shape: vec![3.into(), 2.into()] }.into(), vec![Arg::Value(inner)]).unwrap()[0];
        let trace = b.finish(Arg::Value(outer)).unwrap();
        let rules = crate::views::RULES;
        let (out, report) = rewrite(&trace, rules, &PassCx::default()).unwrap();
        assert_eq!(out.bsyms.len(), 1);
        assert_eq!(out.bsyms[0].args, [Arg::Value(x)]);
        assert_eq!(report.fired, [("reshape-reshape", 1)]);
    }

    /// mul(x, 1) -> x, with the prim misspelt.
    const MISSPELT: Rule = Rule {
        name: "mul-one",
        pattern: || call("add", [call("mull", [any("x"), any("one")]), any("y")]),
        rewrite: |m| m.value("x").map(Replacement::Value),
    };

    #[test]
    fn a_pattern_naming_no_prim_is_an_error_naming_the_rule_and_the_name() {
        let err = check(&[ADD_SELF, MISSPELT]).unwrap_err();
        assert!(err.message.contains("rule mul-one names \"mull\", which is no prim"), "{err}");
        let err = crate::register_rules("test_misspelt", [MISSPELT]).unwrap_err();
        assert!(err.message.contains("test_misspelt") && err.message.contains("\"mull\""), "{err}");
        assert!(!crate::registered().contains(&"test_misspelt".to_string()));
        let qualified = Rule { pattern: || call("prims.mul", [any("x"), any("y")]), ..MISSPELT };
        let err = check(&[qualified]).unwrap_err();
        assert!(err.message.contains("\"prims.mul\"") && err.message.contains("\"mul\""), "{err}");
        // Applying a rule set checks it too (a plugin's rules are applied, never registered here).
        let mut b = TraceBuilder::new();
        let x = input(&mut b, &[3]);
        let trace = b.finish(Arg::Value(x)).unwrap();
        let err = rewrite(&trace, &[MISSPELT], &PassCx::default()).unwrap_err();
        assert!(err.message.contains("mul-one") && err.message.contains("\"mull\""), "{err}");
    }

    #[test]
    fn a_registered_rule_set_runs_as_a_pass() {
        crate::register_rules("test_add_self", [ADD_SELF]).unwrap();
        let mut b = TraceBuilder::new();
        let x = input(&mut b, &[3]);
        let same = b.record_prim("add", vec![Arg::Value(x), Arg::Value(x)]).unwrap()[0];
        let trace = b.finish(Arg::Value(same)).unwrap();
        let run = crate::manager::lookup_any("test_add_self").unwrap();
        let out = run(&trace, &PassCx::default()).unwrap();
        assert_eq!(out.trace.bsyms[0].symbol.as_prim().unwrap().name(), "mul");
        assert_eq!(out.note, "fired: add-self x1");
    }

    #[test]
    fn random_draws_are_never_matched() {
        let mut b = TraceBuilder::new();
        let params = vec![
            Arg::ints(&[3]),
            Arg::Scalar(trace_ir::Scalar::Float(0.0)),
            Arg::Scalar(trace_ir::Scalar::Float(1.0)),
            Arg::Device(Device::CPU),
            Arg::DType(DType::F32),
        ];
        let u = b.record_prim("uniform", params).unwrap()[0];
        let r = b.record_prim("reshape", vec![Arg::Value(u), Arg::ints(&[3])]).unwrap()[0];
        let trace = b.finish(Arg::Value(r)).unwrap();
        let (out, _) = rewrite(&trace, crate::views::RULES, &PassCx::default()).unwrap();
        assert_eq!(out.bsyms.len(), 1, "the random draw stays, the identity reshape goes");
        assert_eq!(out.outputs, Arg::Value(u));
    }
}
