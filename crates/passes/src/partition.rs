//! Fusion partitioning: the top-level bound symbols a fusion executor claimed are grouped into
//! regions along data flow, and each region becomes one bound symbol of the execution trace.
//!
//! Groups grow one symbol at a time, in trace order: a symbol joins the group of one of its
//! producers of the same executor (a vertical merge) or, failing that, the executor's most
//! recent group (a horizontal merge of independent symbols), when that is legal; otherwise it
//! starts a group. Every merge is of a group with one new symbol, so a group index per symbol
//! does what union-find would, with no path compression to pay for. Legality is decided by *placements*: every group has a place in the output
//! order, a key `(major, minor)` between trace positions (a symbol outside any group keeps
//! `(position, 0)`). A group's place is after every producer it reads from outside and before
//! every consumer outside it that read it so far (`first_reader`). A symbol joins a group only
//! if the group can be placed after all the symbol's producers and still before its first
//! reader; the group's place then moves later, never earlier. Since every merge keeps one valid
//! order of the condensed graph, no merge can close a cycle, and the check is bounded by trace
//! position: it reads the symbol's own producers and two keys, so the pass is linear in the
//! number of bound symbols and values (plus one sort of the places).
//!
//! A region is placed where its group's place is: after the last producer one of its members
//! reads from outside. Symbols outside regions keep their order exactly, so effects (random
//! draws, `manual_seed`), which never enter a region, run in program order. Groups with fewer
//! than two calls that are not shape ops (shape prims, or composites made only of them) are not
//! worth a region: their symbols run on their fallback implementations at the group's place,
//! in their original order.

use crate::claim::Assignment;
use std::sync::Arc;
use trace_ir::prims::{Elementwise, Prim};
use trace_ir::pysrc::Callee;
use trace_ir::{Arg, BoundSymbol, Result, Symbol, Trace, ValueId, ValueKind};

/// One region of a partitioned trace, for code generation.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionPlan {
    /// The region's name, also its symbol's: `inductor_fusion0`.
    pub name: Arc<str>,
    /// The fusion executor's index in the executor table.
    pub executor: usize,
    /// The index of the region's bound symbol among the trace's top-level bound symbols.
    pub index: usize,
    /// How the region's code calls each of its members, in order.
    pub callees: Vec<Callee>,
}

/// A partitioned execution trace.
#[derive(Clone, Debug)]
pub struct Partition {
    /// The execution trace: each region one bound symbol ([`trace_ir::Symbol::Region`]) whose
    /// decomposition is its members.
    pub trace: Trace,
    /// How the generated code calls each top-level bound symbol (a region: by its name).
    pub callees: Vec<Callee>,
    /// The regions, in the trace's order.
    pub regions: Vec<RegionPlan>,
}

/// An order key between trace positions: `(position, 0)` is the symbol at that position;
/// `(position, k)` with `k > 0` lies after it and before `(position + 1, 0)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    major: u32,
    minor: u32,
}

const NEVER: Place = Place { major: u32::MAX, minor: u32::MAX };
const NO_GROUP: u32 = u32::MAX;

struct Group {
    executor: usize,
    place: Place,
    /// The earliest place of a symbol outside the group that reads one of its values (a lower
    /// bound: readers only move later).
    first_reader: Place,
    members: Vec<u32>,
}

/// The groups of a trace as they grow.
struct Grouping<'a> {
    assignments: &'a [Assignment],
    /// Per value, the top-level bound symbol that defines it (`u32::MAX`: an input).
    producer: Vec<u32>,
    group_of: Vec<u32>,
    groups: Vec<Group>,
    /// Per executor, the group its last symbol joined.
    last_group: Vec<u32>,
    next_minor: u32,
}

/// Whether a bound symbol may enter a region: claimed by a fusion executor, without effects,
/// and without Python constants (their objects are not part of a region's key).
fn fusible(bsym: &BoundSymbol, assignment: &Assignment) -> Option<usize> {
    let mut has_const = false;
    let mut visit = |a: &Arg| has_const |= contains_const(a);
    bsym.args.iter().for_each(&mut visit);
    bsym.kwargs.iter().for_each(|(_, a)| visit(a));
    let (executor, _) = assignment.fusion.as_ref()?;
    (!bsym.has_effect() && !has_const).then_some(*executor)
}

fn contains_const(arg: &Arg) -> bool {
    match arg {
        Arg::PyConst(_) => true,
        Arg::Tuple(items) | Arg::List(items) => items.iter().any(contains_const),
        Arg::Slice(parts) => parts.iter().any(contains_const),
        _ => false,
    }
}

impl<'a> Grouping<'a> {
    fn new(trace: &Trace, assignments: &'a [Assignment]) -> Self {
        let mut producer = vec![u32::MAX; trace.values.len()];
        for (i, bsym) in trace.bsyms.iter().enumerate() {
            bsym.outputs.iter().for_each(|v| producer[v.index()] = i as u32);
        }
        let executors = assignments.iter().filter_map(|a| a.fusion.as_ref().map(|f| f.0 + 1)).max().unwrap_or(0);
        Grouping {
            assignments,
            producer,
            group_of: vec![NO_GROUP; trace.bsyms.len()],
            groups: Vec::new(),
            last_group: vec![NO_GROUP; executors],
            next_minor: 1,
        }
    }

    fn place_of(&self, symbol: u32) -> Place {
        match self.group_of[symbol as usize] {
            NO_GROUP => Place { major: symbol, minor: 0 },
            g => self.groups[g as usize].place,
        }
    }

    /// The top-level producers of the values `bsym` reads, into `out`.
    fn producers(&self, bsym: &BoundSymbol, out: &mut Vec<u32>) {
        out.clear();
        bsym.for_each_input(|v| {
            let p = self.producer[v.index()];
            if p != u32::MAX && !out.contains(&p) {
                out.push(p);
            }
        });
    }

    /// Adds symbol `i` with `producers`, in trace order.
    fn add(&mut self, i: u32, bsym: &BoundSymbol, producers: &[u32]) {
        if let Some(executor) = fusible(bsym, &self.assignments[i as usize]) {
            // Producers' groups first (vertical merges), then the executor's last group.
            let mut joined = false;
            for k in 0..=producers.len() {
                let g = producers.get(k).map_or(self.last_group[executor], |&p| self.group_of[p as usize]);
                if g != NO_GROUP && self.try_join(g, executor, i, producers) {
                    joined = true;
                    break;
                }
            }
            if !joined {
                self.group_of[i as usize] = self.groups.len() as u32;
                let place = Place { major: i, minor: 0 };
                self.groups.push(Group { executor, place, first_reader: NEVER, members: vec![i] });
            }
            self.last_group[executor] = self.group_of[i as usize];
        }
        let place = self.place_of(i);
        let own = self.group_of[i as usize];
        for &p in producers {
            let g = self.group_of[p as usize];
            if g != NO_GROUP && g != own {
                let reader = &mut self.groups[g as usize].first_reader;
                *reader = (*reader).min(place);
            }
        }
    }

    /// Puts symbol `i` into group `g` if `g` can be placed after all of `i`'s producers and
    /// before its own first reader.
    fn try_join(&mut self, g: u32, executor: usize, i: u32, producers: &[u32]) -> bool {
        let group = &self.groups[g as usize];
        if group.executor != executor {
            return false;
        }
        let outside = producers.iter().filter(|&&p| self.group_of[p as usize] != g);
        let latest = outside.map(|&p| self.place_of(p)).max();
        let place = match latest {
            Some(latest) if latest >= group.place => Place { major: latest.major, minor: self.next_minor },
            _ => group.place,
        };
        if place >= group.first_reader {
            return false;
        }
        if place != group.place {
            self.next_minor += 1;
        }
        let group = &mut self.groups[g as usize];
        group.place = place;
        group.members.push(i);
        self.group_of[i as usize] = g;
        true
    }
}

/// Whether a group is worth a region: at least two calls that are not shape ops.
fn worth_fusing(trace: &Trace, members: &[u32]) -> bool {
    members.iter().filter(|&&m| !only_moves_elements(trace, &trace.bsyms[m as usize])).take(2).count() == 2
}

/// Whether a call only moves or selects elements: a shape prim, a conversion to the dtype its
/// input has (`ltorch.stop_gradient`), or a composite whose whole decomposition is such calls
/// (`ltorch.reshape`, `ltorch.permute`).
fn only_moves_elements(trace: &Trace, bsym: &BoundSymbol) -> bool {
    match &bsym.symbol {
        Symbol::Prim(Prim::Elementwise(Elementwise::ConvertElementType { dtype })) => {
            matches!(bsym.args.first(), Some(Arg::Value(v)) if trace.tensor(*v).is_some_and(|t| t.dtype == *dtype))
        }
        Symbol::Prim(p) => p.is_shape_op(),
        Symbol::Composite(_) => {
            !bsym.subsymbols.is_empty() && bsym.subsymbols.iter().all(|s| only_moves_elements(trace, s))
        }
        Symbol::Fallback(_) | Symbol::Region(_) => false,
    }
}

/// What is emitted at one place: a symbol outside any group, or a group.
#[derive(Clone, Copy)]
enum Item {
    Symbol(u32),
    Group(u32),
}

/// Groups the symbols fusion executors claimed into regions (see the module doc).
/// `assignments` has one entry per top-level bound symbol; `executor_names` names the
/// executors of the table, for the regions' names.
pub fn partition(trace: &Trace, assignments: &[Assignment], executor_names: &[&str]) -> Result<Partition> {
    if assignments.len() != trace.bsyms.len() {
        trace_ir::bail!(
            Runtime,
            "partition",
            "{} assignments for {} bound symbols",
            assignments.len(),
            trace.bsyms.len()
        );
    }
    if assignments.iter().all(|a| a.fusion.is_none()) {
        let callees = assignments.iter().map(|a| a.callee.clone()).collect();
        return Ok(Partition { trace: trace.clone(), callees, regions: Vec::new() });
    }
    let mut grouping = Grouping::new(trace, assignments);
    let mut producers = Vec::new();
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        grouping.producers(bsym, &mut producers);
        grouping.add(i as u32, bsym, &producers);
    }
    let mut order: Vec<(Place, Item)> = Vec::with_capacity(trace.bsyms.len());
    order.extend(
        grouping
            .group_of
            .iter()
            .enumerate()
            .filter(|(_, &g)| g == NO_GROUP)
            .map(|(i, _)| (Place { major: i as u32, minor: 0 }, Item::Symbol(i as u32))),
    );
    order.extend(grouping.groups.iter().enumerate().map(|(g, group)| (group.place, Item::Group(g as u32))));
    order.sort_unstable_by_key(|&(place, _)| place);
    emit(trace, assignments, &grouping, &order, executor_names)
}

/// Builds the partitioned trace from the emission order.
fn emit(
    trace: &Trace,
    assignments: &[Assignment],
    grouping: &Grouping,
    order: &[(Place, Item)],
    executor_names: &[&str],
) -> Result<Partition> {
    let read_outside = values_read_outside(trace, &grouping.group_of, &grouping.producer);
    let mut marks = RegionMarks { stamp: vec![u32::MAX; trace.values.len()], current: 0 };
    let mut bsyms = Vec::with_capacity(order.len());
    let mut callees = Vec::with_capacity(order.len());
    let mut regions = Vec::new();
    let mut counters = vec![0usize; executor_names.len()];
    for &(_, item) in order {
        let group = match item {
            Item::Symbol(i) => {
                bsyms.push(trace.bsyms[i as usize].clone());
                callees.push(assignments[i as usize].callee.clone());
                continue;
            }
            Item::Group(g) => &grouping.groups[g as usize],
        };
        let members = group.members.as_slice();
        if !worth_fusing(trace, members) {
            for &m in members {
                bsyms.push(trace.bsyms[m as usize].clone());
                callees.push(assignments[m as usize].callee.clone());
            }
            continue;
        }
        let Some(executor_name) = executor_names.get(group.executor) else {
            trace_ir::bail!(Runtime, "partition", "no name for fusion executor {}", group.executor);
        };
        let name: Arc<str> = format!("{executor_name}_fusion{}", counters[group.executor]).into();
        counters[group.executor] += 1;
        bsyms.push(marks.region_bsym(trace, members, &read_outside, name.clone()));
        callees.push(Callee::function(name.clone()));
        let member_callees = members.iter().map(|&m| fusion_callee(&assignments[m as usize])).collect::<Result<_>>()?;
        regions.push(RegionPlan { name, executor: group.executor, index: bsyms.len() - 1, callees: member_callees });
    }
    Ok(Partition { trace: trace.with_bsyms(bsyms, trace.outputs.clone()), callees, regions })
}

fn fusion_callee(assignment: &Assignment) -> Result<Callee> {
    match &assignment.fusion {
        Some((_, callee)) => Ok(callee.clone()),
        None => trace_ir::bail!(Runtime, "partition", "a region member was not claimed by a fusion executor"),
    }
}

/// Per value, whether a symbol of another group (or none), or the trace's outputs, read it.
fn values_read_outside(trace: &Trace, group_of: &[u32], producer: &[u32]) -> Vec<bool> {
    let mut read = vec![false; trace.values.len()];
    trace.outputs.for_each_value(&mut |v| read[v.index()] = true);
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        let own = group_of[i];
        bsym.for_each_input(|v| {
            let p = producer[v.index()];
            if p != u32::MAX && (own == NO_GROUP || group_of[p as usize] != own) {
                read[v.index()] = true;
            }
        });
    }
    read
}

/// Calls `f` on the size values the prims of `bsym` read through their parameters (a reshape to
/// `(t0, 4)`, a broadcast to `(t0, t1)`), at every depth of its decomposition: the region's code
/// reads them where no operand shows it, and an executor that translates the decomposition needs
/// them as inputs too.
pub(crate) fn for_each_param_size(trace: &Trace, bsym: &BoundSymbol, f: &mut impl FnMut(ValueId)) {
    if let Symbol::Prim(p) = &bsym.symbol {
        for arg in p.params() {
            arg.for_each_value(&mut |v| {
                if matches!(trace.values.get(v.index()), Some(ValueKind::Size(_))) {
                    f(v)
                }
            });
        }
    }
    bsym.subsymbols.iter().for_each(|s| for_each_param_size(trace, s, f));
}

/// Per value, the last region that saw it (stamps, so no set is cleared between regions).
struct RegionMarks {
    stamp: Vec<u32>,
    current: u32,
}

impl RegionMarks {
    /// The region's bound symbol: it reads the values its members read from outside, in order
    /// of first use, and returns the values its members define that are read outside it.
    fn region_bsym(&mut self, trace: &Trace, members: &[u32], read_outside: &[bool], name: Arc<str>) -> BoundSymbol {
        self.current += 1;
        let (stamp, current) = (&mut self.stamp, self.current);
        let subsymbols: Vec<BoundSymbol> = members.iter().map(|&m| trace.bsyms[m as usize].clone()).collect();
        let mut inputs: Vec<ValueId> = Vec::new();
        let mut outputs: Vec<ValueId> = Vec::new();
        for sub in &subsymbols {
            let mut read = |v: ValueId| {
                if stamp[v.index()] != current {
                    stamp[v.index()] = current;
                    inputs.push(v);
                }
            };
            sub.for_each_input(&mut read);
            for_each_param_size(trace, sub, &mut read);
            for &v in &sub.outputs {
                stamp[v.index()] = current;
                if read_outside[v.index()] {
                    outputs.push(v);
                }
            }
        }
        let mut region = BoundSymbol::new(Symbol::Region(name), inputs.into_iter().map(Arg::Value).collect(), outputs);
        region.subsymbols = subsymbols.into();
        region
    }
}
