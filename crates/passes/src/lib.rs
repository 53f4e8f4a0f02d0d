//! Passes over thunder_rs traces, and the pass manager that runs them.
//!
//! A pass is a free function `fn(&Trace, &PassCx) -> Result<Trace>` listed in [`manager`]'s
//! table; timing, verification and dumps belong to the manager. Passes build new traces.

pub mod claim;
pub mod cse;
pub mod dce;
pub mod lifetimes;
pub mod manager;
pub mod split;
pub mod vjp;

pub use claim::{claim, ExecutorSpec, ImplSpec, SymKey};
pub use manager::{run_passes, Pass, PassCx, PassRecord};
pub use split::{split, Split};
pub use vjp::{joint, Joint};
