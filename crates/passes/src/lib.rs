//! Passes over thunder_rs traces, the pass manager that runs them, and the compile pipeline.
//!
//! A pass is a free function `fn(&Trace, &PassCx) -> Result<Trace>` that builds a new trace.
//! Passes are registered by name ([`manager::register_pass`]); the [`pipeline`] is one table of
//! stages, built-in ones and a row per half for a jit's own passes, which [`manager::compile`]
//! runs through the [`manager::Manager`], timing, verifying and recording each for dumping.
//!
//! The entry points:
//!
//! - [`compile`]: the whole pipeline, from an acquired trace to execution traces with their
//!   [`Plan`]s (generated Python source, which executor runs each call), forward and backward.
//! - [`register_pass`] (a plain function), [`register_dyn_pass`] (a closure, such as a plugin's
//!   pass) and [`register_rules`] (a [`rewrite::Rule`] set) name a pass, so that
//!   `thunder_rs.jit(fn, passes=[name])` runs it and `THUNDER_RS_DUMP=name` dumps it.
//! - [`run_passes`]: a list of passes run through a [`Manager`], each timed and recorded (and
//!   verified when the [`PassCx`] says so).
//! - The passes themselves: [`dce::dce`], [`cse::cse`], [`vjp::joint`] and [`split()`],
//!   [`claim()`], [`partition::partition`], [`lifetimes::del_last_used`]; and the rewrite driver
//!   [`rewrite::rewrite`].
//!
//! A pass of your own, registered and run with the built-in ones:
//!
//! ```
//! use passes::{register_pass, run_passes, PassCx};
//! use trace_ir::{bail, parser::parse_trace, Result, Symbol, Trace};
//!
//! /// Refuses a program that would run any torch call eagerly (a fallback), naming the first:
//! /// for code that must be traced whole.
//! fn no_fallbacks(trace: &Trace, _cx: &PassCx) -> Result<Trace> {
//!     if let Some(b) = trace.bsyms.iter().find(|b| matches!(b.symbol, Symbol::Fallback(_))) {
//!         bail!(Value, "no_fallbacks", "{} runs eagerly", b.symbol.qualified_name());
//!     }
//!     Ok(trace.clone())
//! }
//! register_pass("no_fallbacks", no_fallbacks)?;
//!
//! let trace = parse_trace(concat!(
//!     "def computation(t0):\n",
//!     "  # t0: \"cpu f32[4]\"\n",
//!     "  t1 = prims.exp(t0)  # t1: \"cpu f32[4]\"\n",
//!     "  t2 = prims.exp(t0)  # t2: \"cpu f32[4]\"\n",
//!     "  t3 = prims.neg(t0)  # t3: \"cpu f32[4]\"\n",
//!     "  t4 = prims.add(t1, t2)  # t4: \"cpu f32[4]\"\n",
//!     "  return t4\n",
//! ))?;
//! let cx = PassCx { verify: true, dump: vec![] };
//! let stages = ["dce", "cse", "no_fallbacks"].map(|name| (name, passes::lookup(name).unwrap()));
//! let (optimised, records) = run_passes(&trace, &stages, &cx)?;
//! // dce removed the unused neg, cse merged the two exps; no_fallbacks found none.
//! assert_eq!(optimised.bsyms.len(), 2);
//! assert_eq!(records.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["dce", "cse", "no_fallbacks"]);
//!
//! // A pipeline stage's name is refused, as is a name another function holds.
//! assert!(register_pass("claim", no_fallbacks).is_err());
//! # Ok::<(), trace_ir::IrError>(())
//! ```

#![deny(missing_docs)]

pub mod absent;
pub mod batch;
pub mod claim;
pub mod cse;
pub mod data_rules;
pub mod dce;
pub mod differentiable;
pub mod lifetimes;
pub mod manager;
pub mod materialized;
pub mod partition;
pub mod pipeline;
pub mod plan;
pub mod reentrant;
pub mod reinplace;
pub mod reuse;
pub mod rewrite;
pub mod split;
pub mod views;
pub mod vjp;

pub use claim::{claim, ExecutorSpec, ImplSpec, SymKey};
pub use manager::{
    compile, lookup, register_dyn_pass, register_pass, register_rules, registered, run_passes, Compiled, DynPass,
    Manager, Pass, PassFn, PassRecord,
};
pub use pipeline::{ClaimChecker, Options, PassCx};
pub use plan::{LeafCall, Plan, RegionCode};
pub use reentrant::Checkpoint;
pub use split::{split, Split};
pub use vjp::{joint, joint_checkpointed, Joint};
