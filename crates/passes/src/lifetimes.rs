//! Value lifetimes: where each intermediate value is last used, so the generated code can free
//! it at once (`del t3`).

use trace_ir::{Trace, ValueId, ValueKind};

/// For each top-level bound symbol, the values to delete right after it: intermediates whose
/// last use it is, and outputs nobody reads. The trace's outputs are never deleted, nor are its
/// inputs except the first `owned` ones (a backward's residuals, which it alone holds), nor its
/// size values: a prim's size parameters (a reshape to `(t0, t1, 1)`) read them where no
/// operand shows it, and an int costs nothing to keep.
pub fn del_last_used(trace: &Trace, owned: usize) -> Vec<Vec<ValueId>> {
    let n = trace.values.len();
    let mut keep: Vec<bool> = trace.values.iter().map(|k| matches!(k, ValueKind::Size(_))).collect();
    trace.inputs.iter().skip(owned).for_each(|v| keep[v.index()] = true);
    trace.outputs.for_each_value(&mut |v| keep[v.index()] = true);
    let mut last_use: Vec<Option<usize>> = vec![None; n];
    for (i, bsym) in trace.bsyms.iter().enumerate() {
        bsym.for_each_input(|v| last_use[v.index()] = Some(i));
        for o in &bsym.outputs {
            last_use[o.index()].get_or_insert(i);
        }
    }
    let mut dels = vec![Vec::new(); trace.bsyms.len()];
    for (v, last) in last_use.iter().enumerate() {
        if let (Some(i), false) = (last, keep[v]) {
            dels[*i].push(ValueId(v as u32));
        }
    }
    dels
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace_ir::parser::parse_trace;

    fn dels(body: &str) -> Vec<Vec<String>> {
        let text = format!("def computation(t0, t1):\n  # t0: \"cpu f32[4]\"\n  # t1: \"cpu f32[4]\"\n{body}");
        let trace = parse_trace(&text).unwrap();
        del_last_used(&trace, 0).iter().map(|d| d.iter().map(ValueId::to_string).collect()).collect()
    }

    #[test]
    fn keeps_size_values_that_prim_parameters_read() {
        let text = "def backward(t0, t1):
  # t0: \"size 3\"
  # t1: \"cpu f32[t0, 4]\"
  t2 = ltorch.reshape(t1, (t0, 2, 2))
    # t2 = prims.reshape(t1, (t0, 2, 2))
  t3 = prims.sum(t2, (1,))
  t4 = prims.reshape(t3, (t0, 2, 1))
  return t4
";
        let trace = parse_trace(text).unwrap();
        let got: Vec<Vec<String>> =
            del_last_used(&trace, 2).iter().map(|d| d.iter().map(ValueId::to_string).collect()).collect();
        assert_eq!(got, [vec!["t1"], vec!["t2"], vec!["t3"]]);
    }

    #[test]
    fn deletes_intermediates_after_their_last_use() {
        let got = dels(
            "  t2 = prims.exp(t0)
  t3 = prims.sin(t2)
  t4 = prims.add(t2, t3)
  t5 = prims.cos(t4)
  return t5
",
        );
        assert_eq!(got, [vec![], vec![], vec!["t2", "t3"], vec!["t4"]]);
    }

    #[test]
    fn never_deletes_inputs_or_outputs() {
        let got = dels(
            "  t2 = prims.add(t0, t1)
  t3 = prims.mul(t2, t0)
  t4 = prims.neg(t3)
  return (t2, [t4], None)
",
        );
        assert_eq!(got, [vec![], vec![], vec!["t3"]]);
    }

    #[test]
    fn deletes_unread_outputs_at_once() {
        let got = dels(
            "  (t2, t3) = prims.var_mean(t0, (0,), 1)
  t4 = prims.exp(t1)
  t5 = prims.add(t3, 1.0)
  return t5
",
        );
        assert_eq!(got, [vec!["t2"], vec!["t4"], vec!["t3"]]);
    }

    #[test]
    fn sees_only_top_level_symbols() {
        let got = dels(
            "  t4 = ltorch.sigmoid(t0)
    # t2 = prims.neg(t0)
    # t3 = prims.exp(t2)
    # t4 = prims.reciprocal(t3)
  t5 = prims.mul(t4, t4)
  return t5
",
        );
        assert_eq!(got, [vec![], vec!["t4"]]);
    }
}
