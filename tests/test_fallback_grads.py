"""Gradients through eager fallbacks (calls thunder_rs runs as torch calls inside the trace,
``core.lang.fallback``) that are None or absent where eager's are, compared with eager:

- Outputs eager's autograd does not differentiate (``native_batch_norm``'s saved mean and inverse
  standard deviation, the log-sum-exp of ``_scaled_dot_product_flash_attention_for_cpu``) do not
  require grad: a loss of them alone raises eager's error, and a loss of them and another path
  leaves the op's inputs without a gradient (None, not zeros).
- A fallback op whose backward gives an input no gradient (a custom op's backward returning None
  for an output the loss does not read) leaves its ``.grad`` None, and ``autograd.grad(...,
  allow_unused=True)`` gives None.
- An argument batch norm is not differentiable in (its running statistics) requiring grad raises
  eager's error at the call, for the fallback ``native_batch_norm`` and for ``F.batch_norm``.
"""

import pytest
import torch

import thunder_rs
from custom_ops import scaled_pair


def _bn_stats(x, w, b):
    """``native_batch_norm``'s batch statistics (not differentiable) and the weight's own use."""
    _, mean, invstd = torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    return mean, invstd, w * 2


def _sdpa_lse(q, k, v):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)


def _inputs(*shapes):
    torch.manual_seed(0)
    return [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]


BN = ((4, 3), (3,), (3,))
QKV = ((1, 2, 4, 8),) * 3


@pytest.mark.parametrize("program, shapes", [(_bn_stats, BN), (_sdpa_lse, QKV)], ids=["batch_norm", "sdpa_cpu"])
def test_outputs_eager_does_not_differentiate_require_no_grad(program, shapes):
    eager, compiled = program(*_inputs(*shapes)), thunder_rs.jit(program)(*_inputs(*shapes))
    assert [o.requires_grad for o in compiled] == [o.requires_grad for o in eager]
    assert not all(o.requires_grad for o in eager)  # (the case the test is about)


def _grads_of(program, shapes, loss):
    """``autograd.grad(..., allow_unused=True)`` and ``.grad`` after ``backward()`` (None or a
    tensor), or eager's error (type and message)."""
    try:
        args = _inputs(*shapes)
        grads = torch.autograd.grad(loss(program(*args)), args, allow_unused=True)
        args = _inputs(*shapes)
        loss(program(*args)).backward()
        return list(grads), [a.grad for a in args]
    except RuntimeError as e:
        return type(e), str(e)


LOSSES = {
    "batch_norm stats alone": (_bn_stats, BN, lambda o: o[0].sum() + o[1].sum()),
    "batch_norm stats and weight": (_bn_stats, BN, lambda o: o[0].sum() + o[2].sum()),
    "sdpa_cpu logsumexp alone": (_sdpa_lse, QKV, lambda o: o[1].sum()),
    "scaled_pair, first output": (lambda x, y: scaled_pair(x, y), ((3,), (3,)), lambda o: o[0].sum()),
    "scaled_pair, first returned": (lambda x, y: scaled_pair(x, y)[0], ((3,), (3,)), lambda o: o.sum()),
    "scaled_pair of a clone": (lambda x, y: scaled_pair(x, y.clone())[1], ((3,), (3,)), lambda o: o.sum()),
    "scaled_pair, both": (lambda x, y: scaled_pair(x, y), ((3,), (3,)), lambda o: o[0].sum() + o[1].sum()),
}


@pytest.mark.parametrize("case", list(LOSSES))
def test_fallback_gradients_are_none_where_eagers_are(case):
    program, shapes, loss = LOSSES[case]
    eager = _grads_of(program, shapes, loss)
    compiled = _grads_of(thunder_rs.jit(program), shapes, loss)
    if isinstance(eager[1], str):
        assert compiled == eager
        return
    for c, e in zip(compiled[0] + compiled[1], eager[0] + eager[1]):
        assert (c is None) == (e is None), (compiled, eager)
        if e is not None:
            assert torch.equal(c, e)


def test_a_double_backward_through_a_fallback_gives_none_as_eager():
    program = lambda x, y: scaled_pair(x, y)[0]  # noqa: E731
    for fn in (program, thunder_rs.jit(program)):
        x, y = _inputs((3,), (3,))
        gx, gy = torch.autograd.grad(fn(x, y).pow(2).sum(), (x, y), create_graph=True, allow_unused=True)
        assert gy is None and gx.requires_grad


def test_running_stats_requiring_grad_raise_eagers_error():
    """``native_batch_norm`` is not differentiable in its running statistics: eager refuses them
    requiring grad at the call."""
    program = lambda x, m, v: torch.native_batch_norm(x, None, None, m, v, False, 0.1, 1e-5)[0]  # noqa: E731
    args = (torch.randn(4, 3), torch.zeros(3, requires_grad=True), torch.ones(3))
    with pytest.raises(RuntimeError) as eager:
        program(*args)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'running_mean'") as compiled:
        thunder_rs.jit(program)(*args)
    assert str(eager.value) in str(compiled.value)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("which", ["running_mean", "running_var"])
def test_functional_batch_norm_refuses_running_stats_requiring_grad_as_eager(training, which):
    """``F.batch_norm`` (thunder_rs's own decomposition) raises eager's error at the call."""
    stats = {"running_mean": torch.zeros(3), "running_var": torch.ones(3)}
    stats[which].requires_grad_()
    program = lambda x, m, v: torch.nn.functional.batch_norm(x, m, v, training=training)  # noqa: E731
    args = (torch.randn(4, 3), stats["running_mean"], stats["running_var"])
    with pytest.raises(RuntimeError) as eager:
        program(*args)
    with pytest.raises(RuntimeError) as compiled:
        thunder_rs.jit(program)(*args)
    assert str(eager.value) in str(compiled.value)
    with torch.no_grad():  # (eager's check is made with grad on only)
        torch.testing.assert_close(thunder_rs.jit(program)(*args), program(*args))
