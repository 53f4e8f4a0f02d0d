//! Passes over thunder_rs traces, the pass manager that runs them, and the compile pipeline.
//!
//! A pass is a free function `fn(&Trace, &PassCx) -> Result<Trace>` that builds a new trace.
//! Passes are registered by name ([`manager::register_pass`]); the [`pipeline`] is one table of
//! stages, built-in ones and a row per half for a jit's own passes, which [`manager::compile`]
//! runs through the [`manager::Manager`], timing, verifying and recording each for dumping.

pub mod claim;
pub mod cse;
pub mod data_rules;
pub mod dce;
pub mod differentiable;
pub mod lifetimes;
pub mod manager;
pub mod partition;
pub mod pipeline;
pub mod plan;
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
pub use split::{split, Split};
pub use vjp::{joint, Joint};
