//! The cost of crossing the plugin boundary: an identity pass run through a [`PluginTable`] the
//! way `thunder_rs.load_passes` runs it (the host encodes, the plugin decodes and encodes, the
//! host decodes), on the synthetic traces of `make bench-passes` (its 10k-symbol size is the
//! target: <= 1 us per bound symbol), with the text form's cost beside it. Run with
//! `cargo run --release -p thunder_rs_plugin_abi --example crossing_cost`.

use plugin_abi::{encode_text, pass_entry, plugin_table, Buffer, PassEntry, PluginTable, STATUS_OK};
use std::time::Instant;
use trace_ir::binary::{decode, encode};
use trace_ir::parser::parse_trace;
use trace_ir::testing::synthetic_chain;
use trace_ir::{Result, Trace};

fn identity(trace: &Trace) -> Result<Trace> {
    Ok(trace.clone())
}

static PASSES: [PassEntry; 1] = [pass_entry!("identity", "program", identity)];
static TABLE: PluginTable = plugin_table!(PASSES);

/// One crossing, as the host does it.
fn cross(trace: &Trace) -> Trace {
    let input = encode(trace);
    let mut out = Buffer::empty();
    // SAFETY: the input is live for the call and `out` is writable.
    let status = unsafe { (PASSES[0].run)(input.as_ptr(), input.len(), &mut out) };
    // SAFETY: the plugin hands back `len` bytes it owns until `free`.
    let answer = unsafe { std::slice::from_raw_parts(out.ptr, out.len) };
    assert_eq!(status, STATUS_OK, "{}", String::from_utf8_lossy(answer));
    let trace = decode(answer).expect("the host reads what the plugin encoded");
    // SAFETY: freed once, by the table that allocated it.
    unsafe { (TABLE.free)(out) };
    trace
}

/// The CPU time this thread has run, in seconds (Linux's `CLOCK_THREAD_CPUTIME_ID`); `None`
/// elsewhere.
#[cfg(target_os = "linux")]
fn cpu_seconds() -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        seconds: i64,
        nanoseconds: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut time = Timespec { seconds: 0, nanoseconds: 0 };
    // SAFETY: a valid clock id and a writable timespec (64-bit Linux's layout).
    let ok = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut time) } == 0;
    ok.then_some(time.seconds as f64 + time.nanoseconds as f64 * 1e-9)
}

#[cfg(not(target_os = "linux"))]
fn cpu_seconds() -> Option<f64> {
    None
}

/// The fastest of `repeats` runs of `run`, in seconds of wall time and (where it can be read) of
/// CPU time: on a shared machine the wall time counts the time other processes held the core.
fn fastest(repeats: usize, mut run: impl FnMut()) -> (f64, f64) {
    let mut times: Vec<(f64, f64)> = (0..repeats)
        .map(|_| {
            let (start, cpu) = (Instant::now(), cpu_seconds());
            run();
            let wall = start.elapsed().as_secs_f64();
            (wall, cpu.zip(cpu_seconds()).map_or(wall, |(a, b)| b - a))
        })
        .collect();
    let wall = times.iter().map(|t| t.0).fold(f64::INFINITY, f64::min);
    times.sort_by(|a, b| a.1.total_cmp(&b.1));
    (wall, times[0].1)
}

fn main() {
    for n in [1_000, 10_000, 100_000] {
        let trace = synthetic_chain(n);
        let symbols = trace.bsyms.len() as f64;
        assert_eq!(cross(&trace), trace, "an identity crossing returns the same trace");
        let repeats = if n > 10_000 { 7 } else { 51 };
        let (wall, cpu) = fastest(repeats, || drop(std::hint::black_box(cross(&trace))));
        let bytes = encode(&trace);
        let (_, encode_s) = fastest(repeats, || drop(std::hint::black_box(encode(&trace))));
        let (_, decode_s) = fastest(repeats, || drop(std::hint::black_box(decode(&bytes).expect("round trip"))));
        let (_, verify_s) = fastest(repeats, || trace_ir::verify::verify(&trace).expect("valid"));
        let text = encode_text(&trace);
        let (_, text_s) = fastest(3, || {
            drop(std::hint::black_box(parse_trace(&encode_text(&trace)).expect("round trip")));
        });
        let us = |seconds: f64| seconds * 1e6 / symbols;
        println!(
            "{n:>7} symbols: identity crossing {:.3} us/symbol CPU ({:.3} wall), {} bytes; one encode {:.3}, one \
             decode {:.3}, one verify {:.3} us/symbol; as text, one print+parse {:.3} us/symbol, {} bytes",
            us(cpu),
            us(wall),
            bytes.len(),
            us(encode_s),
            us(decode_s),
            us(verify_s),
            us(text_s),
            text.len(),
        );
    }
}
