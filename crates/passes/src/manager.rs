//! The pass manager: runs a table of named passes, times each one, verifies after each in debug
//! builds (and when asked), keeps each pass's output, and dumps the passes named in
//! `THUNDER_RS_DUMP` (comma separated, or `all`) to stderr.

use std::time::Instant;
use trace_ir::verify::verify;
use trace_ir::{Result, Trace};

/// Settings shared by the passes of one compilation.
#[derive(Clone, Debug)]
pub struct PassCx {
    /// Verify the trace after every pass (always on in debug builds).
    pub verify: bool,
    /// Passes whose output is printed to stderr.
    pub dump: Vec<String>,
}

impl Default for PassCx {
    fn default() -> Self {
        let dump = std::env::var("THUNDER_RS_DUMP")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default();
        PassCx { verify: cfg!(debug_assertions), dump }
    }
}

/// A named pass.
pub type Pass = (&'static str, fn(&Trace, &PassCx) -> Result<Trace>);

/// One pass's result: its output and how long it took.
#[derive(Clone, Debug)]
pub struct PassRecord {
    pub name: &'static str,
    pub seconds: f64,
    pub trace: Trace,
}

/// Runs `passes` in order from `trace`, returning the final trace and a record per pass.
pub fn run_passes(trace: &Trace, passes: &[Pass], cx: &PassCx) -> Result<(Trace, Vec<PassRecord>)> {
    let mut current = trace.clone();
    let mut records = Vec::with_capacity(passes.len());
    for (name, pass) in passes {
        let start = Instant::now();
        let next = pass(&current, cx)?;
        let seconds = start.elapsed().as_secs_f64();
        if cx.verify {
            verify(&next).map_err(|mut e| {
                e.message = format!("after pass {name}: {}", e.message);
                e
            })?;
        }
        if cx.dump.iter().any(|d| d == name || d == "all") {
            eprintln!("# thunder_rs: after {name} ({:.1} µs)\n{next}", seconds * 1e6);
        }
        records.push(PassRecord { name, seconds, trace: next.clone() });
        current = next;
    }
    Ok((current, records))
}
