//! Passes over thunder_rs traces, the pass manager that runs them, and the compile pipeline.
//!
//! A pass is a free function `fn(&Trace, &PassCx) -> Result<Trace>` that builds a new trace.
//! Passes are registered by name ([`manager::register_pass`]); the [`pipeline`] runs the built-in
//! stages and a jit's own passes through the [`manager::Manager`], which times, verifies and
//! records each for dumping.

pub mod claim;
pub mod cse;
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
    lookup, register_dyn_pass, register_pass, registered, run_passes, DynPass, Manager, Pass, PassCx, PassFn,
    PassRecord,
};
pub use pipeline::{compile, ClaimChecker, Compiled, Options};
pub use plan::{LeafCall, Plan, RegionCode};
pub use split::{split, Split};
pub use vjp::{joint, Joint};
