"""Training a jitted module next to an eager copy of it, and the compile counts, for the tests of
shapes that change between calls (``test_dynamic_images``, ``test_dynamic_fallbacks``)."""

import copy

import torch

import thunder_rs


def train_like_eager(model, batches, read=lambda out: out, executors=None, **tol) -> thunder_rs.ThunderModule:
    """Trains ``model`` jitted (with ``executors``) next to an eager copy, one call per batch (a
    tensor, or a dict of keyword arguments), the random state seeded alike for both calls
    (dropout): what ``read`` takes from the outputs, every gradient of ``read(out).square().mean()``
    and the buffers (running statistics) equal to eager's. Returns the jitted module."""
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=executors)
    for i, batch in enumerate(batches):
        args, kwargs = ((), batch) if isinstance(batch, dict) else ((batch,), {})
        torch.manual_seed(i)
        out = read(jmodel(*args, **kwargs))
        torch.manual_seed(i)
        expected = read(eager(*args, **kwargs))
        torch.testing.assert_close(out, expected, **tol)
        out.square().mean().backward()
        expected.square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            if q.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)
        for (name, b), c in zip(model.named_buffers(), eager.buffers()):
            torch.testing.assert_close(b, c, msg=name, **tol)
        model.zero_grad()
        eager.zero_grad()
    return jmodel


def misses(jfn) -> int:
    """How many times ``jfn`` compiled."""
    return thunder_rs.compile_stats(jfn).cache_misses


def stays_symbolic(jfn) -> bool:
    """Whether ``jfn`` still compiles with symbolic sizes (no symbolic compile failed)."""
    jfn = jfn._jfn if isinstance(jfn, thunder_rs.ThunderModule) else jfn
    return jfn._dynamic_off is None
