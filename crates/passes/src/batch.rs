//! Batching of recorded calls over leading dims: the backward of a forward traced once,
//! unbatched, applied to cotangents batched over a basis (`torch.func.jacrev`'s `vmap` of its vjp
//! function), as functorch batches the backward and not the forward.
//!
//! [`batch_since`] re-records the calls recorded since a mark with some of their values given a
//! batched stand-in: leading dims `lead` before the value's own. A call that reads no batched
//! value is kept as it was (the forward's values it reads stay unbatched: `cos(x @ w)` in `sin`'s
//! backward is computed once, as eager computes it); a prim that reads one is recorded again on
//! the batched operands, its parameters moved past the leading dims (an unbatched operand of an
//! elementwise prim broadcast to the batched shape, which gives each element what eager's
//! broadcasting gives it); a composite is batched through its decomposition, and a kernel recorded
//! whole that the caller says is elementwise (`tanh_backward`, whose torch kernel broadcasts its
//! operands) is recorded again on its operands broadcast to the batched shape. What has no rule
//! here (a fallback, another kernel recorded whole, a random draw, a prim family without one) is
//! refused, naming it, and nothing is recorded: the caller then batches the forward too.

use rustc_hash::{FxHashMap, FxHashSet};
use trace_ir::prims::{Linalg, Reduce, Shape};
use trace_ir::sym::Dim;
use trace_ir::{bail, Arg, BoundSymbol, Prim, Result, Symbol, SymbolId, TraceBuilder, ValueId, ValueKind};

/// Re-records the calls recorded at the builder's current level since `mark`, with the values
/// `batched` maps standing for their batched values (the sizes `lead` before their own shape),
/// the kernels recorded whole of the symbols `elementwise` batched as elementwise: returns that
/// map grown by every value those calls define that reads a batched one. On an error the calls
/// since `mark` are dropped.
pub fn batch_since(
    builder: &mut TraceBuilder,
    mark: usize,
    batched: FxHashMap<ValueId, ValueId>,
    lead: &[Dim],
    elementwise: &FxHashSet<SymbolId>,
) -> Result<FxHashMap<ValueId, ValueId>> {
    let calls = builder.recorded_since(mark).to_vec();
    builder.rewind(mark);
    let mut cx = Batching { lead: lead.to_vec(), batched, elementwise };
    let done = calls.iter().try_for_each(|b| cx.call(builder, b));
    if done.is_err() {
        builder.rewind(mark);
    }
    done.map(|()| cx.batched)
}

struct Batching<'a> {
    lead: Vec<Dim>,
    batched: FxHashMap<ValueId, ValueId>,
    elementwise: &'a FxHashSet<SymbolId>,
}

impl Batching<'_> {
    fn reads_batched(&self, b: &BoundSymbol) -> bool {
        let mut hit = false;
        b.for_each_read(&mut |v| hit |= self.batched.contains_key(&v));
        hit
    }

    fn call(&mut self, builder: &mut TraceBuilder, b: &BoundSymbol) -> Result<()> {
        if !self.reads_batched(b) {
            builder.push_bsym(b.clone());
            return Ok(());
        }
        let name = b.symbol.qualified_name();
        match &b.symbol {
            Symbol::Prim(p) if !b.symbol.is_effect() => {
                let outputs = self.prim(builder, p, &b.args)?;
                if outputs.len() != b.outputs.len() {
                    bail!(NotImplemented, "batch", "{name} made {} outputs batched", outputs.len());
                }
                self.batched.extend(b.outputs.iter().copied().zip(outputs));
                Ok(())
            }
            Symbol::Composite(_) if !b.subsymbols.is_empty() => {
                b.subsymbols.iter().try_for_each(|s| self.call(builder, s))?;
                match b.outputs.iter().all(|o| self.batched.contains_key(o)) {
                    true => Ok(()),
                    false => bail!(NotImplemented, "batch", "{name}'s decomposition does not define its outputs"),
                }
            }
            Symbol::Composite(id) if self.elementwise.contains(id) && b.grad.is_none() => self.kernel(builder, b),
            _ => bail!(NotImplemented, "batch", "{name} has no batching rule"),
        }
    }

    fn shape(builder: &TraceBuilder, v: ValueId) -> Result<Vec<Dim>> {
        match builder.value(v) {
            Some(ValueKind::Tensor(t)) => Ok(t.shape.clone()),
            _ => bail!(Runtime, "batch", "{v} is not a tensor"),
        }
    }

    /// An elementwise kernel recorded whole, recorded again on its tensor operands broadcast to
    /// its batched output's shape (the same elements as the kernel's own broadcasting).
    fn kernel(&mut self, builder: &mut TraceBuilder, b: &BoundSymbol) -> Result<()> {
        let metas = b.outputs.iter().map(|&o| match builder.value(o) {
            Some(ValueKind::Tensor(t)) => Ok(t.clone()),
            _ => bail!(NotImplemented, "batch", "{} returns a value that is not a tensor", b.symbol.qualified_name()),
        });
        let metas = metas.collect::<Result<Vec<_>>>()?;
        let Some(shape) = metas.first().map(|m| [self.lead.clone(), m.shape.clone()].concat()) else {
            bail!(NotImplemented, "batch", "{} returns nothing", b.symbol.qualified_name())
        };
        if metas.iter().any(|m| [self.lead.clone(), m.shape.clone()].concat() != shape) {
            bail!(NotImplemented, "batch", "{} returns tensors of several shapes", b.symbol.qualified_name());
        }
        let args = b.args.iter().map(|a| self.broadcast_to(builder, a, &shape)).collect::<Result<Vec<_>>>()?;
        let kwargs = b.kwargs.iter().map(|(k, a)| Ok((k.clone(), self.broadcast_to(builder, a, &shape)?)));
        let kwargs = kwargs.collect::<Result<Vec<_>>>()?;
        let outputs: Vec<ValueId> = metas
            .into_iter()
            .map(|mut m| {
                m.shape = shape.clone();
                builder.add_value(ValueKind::Tensor(m))
            })
            .collect();
        self.batched.extend(b.outputs.iter().copied().zip(outputs.iter().copied()));
        builder.push_bsym(BoundSymbol { args, kwargs, outputs, ..b.clone() });
        Ok(())
    }

    /// The tensor operand `a` (batched or not) broadcast to the batched `shape`, right-aligned
    /// after the leading dims, as a kernel's broadcasting aligns it.
    fn broadcast_to(&self, builder: &mut TraceBuilder, a: &Arg, shape: &[Dim]) -> Result<Arg> {
        let Some(v) = a.as_value() else { return Ok(a.clone()) };
        let k = self.lead.len();
        let (value, own, lead) = match self.batched.get(&v) {
            Some(&b) => (b, Self::shape(builder, b)?, k),
            None if matches!(builder.value(v), Some(ValueKind::Tensor(_))) => (v, Self::shape(builder, v)?, 0),
            None => return Ok(a.clone()),
        };
        if own == shape {
            return Ok(Arg::Value(value));
        }
        let rank = own.len() - lead;
        if rank > shape.len() - k {
            bail!(NotImplemented, "batch", "an operand of rank {rank} of a kernel of rank {}", shape.len() - k);
        }
        let dims = (0..lead).chain((0..rank).map(|i| shape.len() - rank + i)).collect();
        let out =
            builder.record(Shape::BroadcastInDim { shape: shape.to_vec(), dims }.into(), vec![Arg::Value(value)])?;
        Ok(Arg::Value(out[0]))
    }

    /// The batched operand of `a`: its batched value, or a tensor broadcast over the leading dims.
    fn lifted(&self, builder: &mut TraceBuilder, a: &Arg) -> Result<Arg> {
        let Some(v) = a.as_value() else { return Ok(a.clone()) };
        if let Some(&b) = self.batched.get(&v) {
            return Ok(Arg::Value(b));
        }
        let Some(ValueKind::Tensor(t)) = builder.value(v) else { return Ok(a.clone()) };
        let k = self.lead.len();
        let shape = [self.lead.clone(), t.shape.clone()].concat();
        let dims = (k..k + t.shape.len()).collect();
        let out = builder.record(Shape::BroadcastInDim { shape, dims }.into(), vec![a.clone()])?;
        Ok(Arg::Value(out[0]))
    }

    fn prim(&mut self, builder: &mut TraceBuilder, p: &Prim, args: &[Arg]) -> Result<Vec<ValueId>> {
        let k = self.lead.len();
        let moved = |dims: &[usize]| dims.iter().map(|d| d + k).collect::<Vec<_>>();
        let refused = || -> Result<Vec<ValueId>> {
            bail!(NotImplemented, "batch", "{} has no batching rule for {args:?}", p.qualified_name())
        };
        if p.is_elementwise() || matches!(p, Prim::Elementwise(_)) {
            let operands = args.iter().map(|a| self.lifted(builder, a)).collect::<Result<Vec<_>>>()?;
            return builder.record(p.clone(), operands);
        }
        if let (Prim::Shape(Shape::Cat { dim }), [Arg::List(items)]) = (p, args) {
            let items = items.iter().map(|a| self.lifted(builder, a)).collect::<Result<Vec<_>>>()?;
            return builder.record(Shape::Cat { dim: dim + k }.into(), vec![Arg::List(items)]);
        }
        if let Prim::Linalg(Linalg::Matmul {}) = p {
            return self.matmul(builder, args);
        }
        let x = match args {
            [a] => match a.as_value().and_then(|v| self.batched.get(&v)) {
                Some(&x) => x,
                None => return refused(),
            },
            _ => return refused(),
        };
        let lead = self.lead.clone();
        let batched: Prim = match p {
            Prim::Shape(s) => match s {
                Shape::BroadcastInDim { shape, dims } => Shape::BroadcastInDim {
                    shape: [lead, shape.clone()].concat(),
                    dims: (0..k).chain(moved(dims)).collect(),
                },
                Shape::Reshape { shape } => Shape::Reshape { shape: [lead, shape.clone()].concat() },
                Shape::Transpose { perm } => Shape::Transpose { perm: (0..k).chain(moved(perm)).collect() },
                Shape::Slice { start, end, strides } => Shape::Slice {
                    start: [vec![Dim::Const(0); k], start.clone()].concat(),
                    end: [lead, end.clone()].concat(),
                    strides: [vec![1; k], strides.clone()].concat(),
                },
                Shape::Squeeze { dims } => Shape::Squeeze { dims: moved(dims) },
                Shape::Pad { value, config } => Shape::Pad {
                    value: *value,
                    config: [vec![(Dim::Const(0), Dim::Const(0), 0); k], config.clone()].concat(),
                },
                Shape::Flip { dims } => Shape::Flip { dims: moved(dims) },
                Shape::Cat { .. } => return refused(),
            }
            .into(),
            Prim::Reduce(r) => match r {
                Reduce::Sum { dims } => Reduce::Sum { dims: moved(dims) },
                Reduce::Prod { dims } => Reduce::Prod { dims: moved(dims) },
                Reduce::Amax { dims } => Reduce::Amax { dims: moved(dims) },
                Reduce::Amin { dims } => Reduce::Amin { dims: moved(dims) },
                Reduce::Var { dims, correction } => Reduce::Var { dims: moved(dims), correction: *correction },
                Reduce::VarMean { dims, correction } => Reduce::VarMean { dims: moved(dims), correction: *correction },
                Reduce::Argmax { .. } | Reduce::Argmin { .. } => return refused(),
            }
            .into(),
            _ => return refused(),
        };
        builder.record(batched, vec![Arg::Value(x)])
    }

    /// `matmul` with a batched operand: torch's matmul of the batched tensors, where its batch
    /// broadcasting keeps the leading dims in front (each example's product is its own).
    fn matmul(&mut self, builder: &mut TraceBuilder, args: &[Arg]) -> Result<Vec<ValueId>> {
        let [a, b] = args else { bail!(NotImplemented, "batch", "prims.matmul of {args:?}") };
        let (Some(va), Some(vb)) = (a.as_value(), b.as_value()) else {
            bail!(NotImplemented, "batch", "prims.matmul of {args:?}")
        };
        let (ra, rb) = (Self::shape(builder, va)?.len(), Self::shape(builder, vb)?.len());
        let fits = match (self.batched.get(&va), self.batched.get(&vb)) {
            (Some(_), None) => (ra >= 2 && rb <= ra) || (ra == 1 && rb <= 2),
            (None, Some(_)) => rb >= 2 && ra <= rb,
            (Some(_), Some(_)) => ra == rb && ra >= 2,
            (None, None) => false,
        };
        if !fits {
            bail!(NotImplemented, "batch", "prims.matmul of a rank-{ra} and a rank-{rb} tensor batched");
        }
        let operands = [va, vb].map(|v| Arg::Value(self.batched.get(&v).copied().unwrap_or(v)));
        builder.record(Linalg::Matmul {}.into(), operands.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::{DType, Device, TensorMeta};

    fn input(b: &mut TraceBuilder, shape: &[i64]) -> ValueId {
        b.add_input(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, shape.to_vec())))
    }

    fn shape(b: &TraceBuilder, v: ValueId) -> Vec<Dim> {
        Batching::shape(b, v).unwrap()
    }

    /// The calls since the mark that read a batched value are recorded again batched over 6 (a
    /// matmul with an unbatched matrix, a sum over a moved dim); those before stay as they were.
    #[test]
    fn batches_what_reads_a_batched_value_and_keeps_the_rest() {
        let mut b = TraceBuilder::new();
        let (x, g, batched_g) = (input(&mut b, &[4, 2]), input(&mut b, &[2, 3]), input(&mut b, &[6, 2, 3]));
        let mark = b.mark();
        let y = b.record_prim("sin", vec![Arg::Value(g)]).unwrap()[0]; // (stands for a forward value)
        b.record_prim("cos", vec![Arg::Value(y)]).unwrap();
        let prod = b.record_prim("mul", vec![Arg::Value(g), Arg::Value(y)]).unwrap()[0];
        let out = b.record_prim("matmul", vec![Arg::Value(x), Arg::Value(prod)]).unwrap()[0];
        let summed = b.record_prim("sum", vec![Arg::Value(out), Arg::ints(&[0])]).unwrap()[0];
        let given = FxHashMap::from_iter([(prod, batched_g)]);
        let done = batch_since(&mut b, mark + 3, given, &[Dim::Const(6)], &FxHashSet::default()).unwrap();
        assert_eq!(shape(&b, done[&out]), [6, 4, 3].map(Dim::Const));
        assert_eq!(shape(&b, done[&summed]), [6, 3].map(Dim::Const));
        let names: Vec<String> = b.recorded_since(mark).iter().map(|c| c.symbol.qualified_name()).collect();
        assert_eq!(names, ["prims.sin", "prims.cos", "prims.mul", "prims.matmul", "prims.sum"]);
        assert!(
            matches!(b.recorded_since(mark + 4)[0].symbol.as_prim(), Some(Prim::Reduce(Reduce::Sum { dims })) if dims == &[1])
        );
    }

    /// An elementwise operand that is not batched is broadcast over the leading dims.
    #[test]
    fn broadcasts_an_unbatched_operand_of_an_elementwise_prim() {
        let mut b = TraceBuilder::new();
        let (y, g, batched_g) = (input(&mut b, &[2, 3]), input(&mut b, &[2, 3]), input(&mut b, &[6, 2, 3]));
        let mark = b.mark();
        let prod = b.record_prim("mul", vec![Arg::Value(g), Arg::Value(y)]).unwrap()[0];
        let done =
            batch_since(&mut b, mark, FxHashMap::from_iter([(g, batched_g)]), &[Dim::Const(6)], &FxHashSet::default());
        let done = done.unwrap();
        assert_eq!(shape(&b, done[&prod]), [6, 2, 3].map(Dim::Const));
        let names: Vec<String> = b.recorded_since(mark).iter().map(|c| c.symbol.qualified_name()).collect();
        assert_eq!(names, ["prims.broadcast_in_dim", "prims.mul"]);
    }

    /// An elementwise kernel recorded whole is recorded again on its operands broadcast to the
    /// batched shape (a lower-rank operand right-aligned, as the kernel's broadcasting aligns it);
    /// one not said to be elementwise is refused.
    #[test]
    fn records_an_elementwise_kernel_again_on_broadcast_operands() {
        let kernel = trace_ir::SymbolTable::register("test.batched_backward_kernel", trace_ir::SymbolKind::Composite);
        let mut b = TraceBuilder::new();
        let (g, y, batched_g) = (input(&mut b, &[2, 3]), input(&mut b, &[3]), input(&mut b, &[6, 2, 3]));
        let mark = b.mark();
        let out = b.add_value(ValueKind::Tensor(TensorMeta::new(DType::F32, Device::CPU, vec![2, 3])));
        b.push_bsym(BoundSymbol::new(Symbol::Composite(kernel), vec![Arg::Value(g), Arg::Value(y)], vec![out]));
        let given = FxHashMap::from_iter([(g, batched_g)]);
        let refused = batch_since(&mut b, mark, given.clone(), &[Dim::Const(6)], &FxHashSet::default());
        assert!(refused.unwrap_err().to_string().contains("test.batched_backward_kernel has no batching rule"));
        b.push_bsym(BoundSymbol::new(Symbol::Composite(kernel), vec![Arg::Value(g), Arg::Value(y)], vec![out]));
        let done = batch_since(&mut b, mark, given, &[Dim::Const(6)], &FxHashSet::from_iter([kernel])).unwrap();
        assert_eq!(shape(&b, done[&out]), [6, 2, 3].map(Dim::Const));
        let calls = b.recorded_since(mark);
        assert!(
            matches!(calls[0].symbol.as_prim(), Some(Prim::Shape(Shape::BroadcastInDim { dims, .. })) if dims == &[2])
        );
        assert_eq!(calls[1].args[0], Arg::Value(batched_g));
        assert_eq!(calls[1].outputs, [done[&out]]);
    }

    /// What has no rule is refused, and nothing stays recorded.
    #[test]
    fn refuses_a_prim_without_a_rule_recording_nothing() {
        let mut b = TraceBuilder::new();
        let (g, batched_g) = (input(&mut b, &[3]), input(&mut b, &[6, 3]));
        let mark = b.mark();
        b.record_prim("argmax", vec![Arg::Value(g), Arg::Scalar(trace_ir::Scalar::Int(0))]).unwrap();
        let done =
            batch_since(&mut b, mark, FxHashMap::from_iter([(g, batched_g)]), &[Dim::Const(6)], &FxHashSet::default());
        assert!(done.unwrap_err().to_string().contains("prims.argmax has no batching rule"));
        assert!(b.recorded_since(mark).is_empty());
    }
}
