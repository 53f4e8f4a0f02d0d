"""Programs that thunder_rs once computed otherwise than eager PyTorch without an error, against
eager: each now matches eager or is refused naming the construct and the user's line."""

from dataclasses import dataclass

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

REENTRANCY = pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])


def _at(fn, lines: int) -> str:
    """A pattern for the user's line ``lines`` below ``fn``'s ``def``."""
    return rf"test_silent_differences\.py:{fn.__code__.co_firstlineno + lines}"


# ----------------------------------------------------------------------------- random draws in checkpoints


def _noised(y, g):
    return y * torch.rand(y.shape, generator=g)


@REENTRANCY
def test_a_draw_from_a_generator_argument_inside_a_checkpoint_is_refused_naming_the_line(use_reentrant):
    """Eager's backward runs the checkpointed function again, which draws other numbers from ``g``
    (``preserve_rng_state`` restores only the default generators): its gradient is ``x``'s noise of
    the second draw, the compiled call's was the forward's."""

    def program(x, g):
        return checkpoint(_noised, x, g, use_reentrant=use_reentrant)

    x = torch.randn(4, 8, requires_grad=True)
    g = torch.Generator().manual_seed(3)
    program(x, g).sum().backward()
    assert not torch.equal(x.grad, torch.rand(4, 8, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(ThunderNotImplementedError, match=_at(_noised, 1) + ": a random draw from a torch"):
        thunder_rs.jit(program)(x, torch.Generator().manual_seed(3))
    with torch.no_grad():  # nothing is computed again: the draws are eager's
        out = thunder_rs.jit(program)(x, torch.Generator().manual_seed(3))
        assert torch.equal(out, program(x, torch.Generator().manual_seed(3)))


@REENTRANCY
def test_a_draw_from_the_default_generator_inside_a_checkpoint_not_preserving_its_state_is_refused(use_reentrant):
    """``torch.rand`` without a generator (a ``prims.uniform``, not a fallback) was not refused
    under ``preserve_rng_state=False``: eager's gradient used new draws, the compiled call's the forward's."""

    def program(x):
        return checkpoint(lambda y: y * torch.rand(y.shape), x, use_reentrant=use_reentrant, preserve_rng_state=False)

    with pytest.raises(ThunderNotImplementedError, match=_at(program, 1) + ": .*preserve_rng_state=False"):
        thunder_rs.jit(program)(torch.randn(4, 8, requires_grad=True))


@REENTRANCY
@pytest.mark.parametrize("draw", ["rand", "dropout"])
def test_default_generator_draws_inside_a_checkpoint_preserving_its_state_train_as_eager(use_reentrant, draw):
    def block(y):
        return y * torch.rand(y.shape) if draw == "rand" else torch.nn.functional.dropout(y * 2, 0.5)

    def program(x):
        return checkpoint(block, x, use_reentrant=use_reentrant)

    results = []
    for fn in (program, thunder_rs.jit(program)):
        torch.manual_seed(0)
        x = torch.randn(4, 8, requires_grad=True)
        out = fn(x)
        out.sum().backward()
        results.append((out, x.grad, torch.get_rng_state()))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


# ----------------------------------------------------------------------------- inference tensors argument objects hold

SAVED = "Inference tensors cannot be saved for backward"


@dataclass
class Scale:
    weight: torch.Tensor


def _scaled(x, cfg):
    return x * cfg.weight


def _inference(*shape):
    with torch.inference_mode():
        return torch.randn(*shape)


def _dot(x, cfg):
    return (x @ cfg.weight).reshape(1)


@pytest.mark.parametrize("program", [_scaled, _dot])
@pytest.mark.parametrize("first", ["normal", "inference"])
def test_an_inference_tensor_an_argument_object_holds_raises_as_eager(first, program):
    """``x * cfg.weight`` saves the weight for ``x``'s gradient: eager raises for an inference
    tensor there. The held tensor's guard lacked the flag (an inference tensor swapped in ran the
    entry compiled for a normal one), and a first call with one did not raise either."""
    jitted = thunder_rs.jit(program)
    x = torch.randn(4, requires_grad=True)
    if first == "normal":
        w = torch.randn(4)
        torch.testing.assert_close(jitted(x, Scale(w)), program(x, Scale(w)), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=SAVED):
        program(x, Scale(_inference(4)))
    with pytest.raises(RuntimeError, match=SAVED):
        jitted(x, Scale(_inference(4)))
    w = torch.randn(4)  # a normal tensor again, and an inference one where nothing is saved
    torch.testing.assert_close(jitted(x, Scale(w)), program(x, Scale(w)), rtol=0, atol=0)
    with torch.no_grad():
        w = _inference(4)
        torch.testing.assert_close(jitted(x, Scale(w)), program(x, Scale(w)), rtol=0, atol=0)


def test_an_in_place_write_to_an_inference_tensor_an_argument_object_holds_raises_as_eager():
    def program(x, cfg):
        cfg.weight.add_(1)
        return x * 2

    jitted = thunder_rs.jit(program)
    jitted(torch.randn(4), Scale(torch.randn(4)))
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        program(torch.randn(4), Scale(_inference(4)))
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        jitted(torch.randn(4), Scale(_inference(4)))


# ----------------------------------------------------------------------------- signed zeros of writes through views


def _mul_row_by_minus_zero(x):
    y = x * 1
    y[0].mul_(-0.0)
    return y


def _write_two_rows(x):
    y = x * 1
    y[2].clamp_(max=0.0)
    y[0].mul_(-0.0)
    return y


def _write_a_block(x):
    y = x * 1
    y[1:, 2:].mul_(-0.0)
    y[:, 1] /= -1e30
    return y


def _write_then_zero_cotangent(x):
    y = x * 1
    y[1].masked_fill_(y[1] > 0, 1.0)
    return y * torch.tensor([[-0.0], [1.0], [2.0]])


_MASK = torch.tensor([[True, False, True, False]] * 3)


def _masked_assignment(x):
    y = x * -1
    y[_MASK] = 0.0
    return y * -0.0


def _masked_assignment_through_a_view(x):
    y = x * -1
    y[1:][_MASK[1:]] = 0.0
    return y * torch.tensor([-0.0, 1.0, -0.0, -0.0])


def _copy_of_a_function_of_the_view(x):
    y = x * 1
    v = y[1:]
    v.copy_(v * -0.0)
    return y


@pytest.mark.parametrize(
    "program",
    [
        _mul_row_by_minus_zero,
        _write_two_rows,
        _write_a_block,
        _write_then_zero_cotangent,
        _copy_of_a_function_of_the_view,
        _masked_assignment,
        _masked_assignment_through_a_view,
    ],
)
def test_gradients_of_writes_through_views_are_eager_s_bit_for_bit(program):
    """Eager's CopySlices puts an in-place op's gradient of a view's old value in its base's
    gradient there (``y[0].mul_(-0.0)``: -0.0); the trace added it to zeros (+0.0), and the
    gradient of the op's read of the view added zeros elsewhere (a -0.0 cotangent became +0.0)."""
    grads = []
    for fn in (program, thunder_rs.jit(program)):
        x = torch.linspace(-1, 1, 12).reshape(3, 4).requires_grad_()
        out = fn(x)
        out.backward(torch.ones_like(out))
        grads.append((out.detach(), x.grad))
    for eager, compiled in zip(*grads):
        assert torch.equal(eager, compiled) and torch.equal(eager.signbit(), compiled.signbit())


# ----------------------------------------------------------------------------- layouts of written inputs


def _divided(x, w):
    x /= 3.0
    return x.sin()


def _rows_multiplied(x, w):
    x[1:3].mul_(w)
    return x.exp() * 3


def _rows_assigned(x, w):
    x[1:3] = w
    return x.sin()


@pytest.mark.parametrize("program", [_divided, _rows_multiplied, _rows_assigned])
def test_a_transposed_input_written_in_place_gives_its_base_eager_s_gradient_to_the_bit(program):
    """``x``, a transposed view of ``base``, written in place: eager's CopySlices lays ``base``'s
    gradient out as ``base`` (contiguous); the compiled gradient of ``x`` was contiguous, so
    ``base``'s was transposed and the sum over its rows (``leaf``'s expand) was ulps apart."""
    results = []
    for fn in (program, thunder_rs.jit(program)):
        leaf = torch.linspace(-2, 2, 301).reshape(1, 301).requires_grad_()
        w = torch.linspace(-1, 1, 257).requires_grad_()
        base = leaf.expand(257, 301) * 1.0
        out = fn(base.t(), w)
        out.backward(torch.cos(torch.arange(out.numel(), dtype=torch.float32)).reshape(out.shape))
        results.append((out.detach(), leaf.grad, w.grad if program is not _divided else w.sum()))
    for eager, compiled in zip(*results):
        assert torch.equal(eager, compiled)


# -- a leaf view that requires grad, into an op recorded whole -------------------------------------


def _leaf_view(x: torch.Tensor) -> torch.Tensor:
    """A view of a base that does not require grad, made a leaf that does (op_db's upper=True samples)."""
    view = x.clone().mT.detach().mT
    assert view._is_view()
    return view.requires_grad_()


_BASE = torch.rand(3, 3) + 0.5
_SPD_UPPER = torch.linalg.cholesky(_BASE @ _BASE.mT + 3 * torch.eye(3)).mT


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.cholesky_inverse(x, upper=True),  # an opaque linalg symbol
        lambda x: torch.cholesky_solve(torch.ones(3, 2), x, upper=True),
        lambda x: torch.polar(x, torch.ones(3, 3)),  # an eager fallback
    ],
    ids=["cholesky_inverse", "cholesky_solve", "polar"],
)
def test_a_leaf_view_into_an_op_recorded_whole_gets_its_gradient(fn):
    """The op's result requires grad and the view its gradient, as in eager; the op recorded whole
    (an opaque symbol, an eager fallback) did not note the gradient flowing into the view, which the
    call then passed detached: no grad_fn and no gradient, silently."""
    grads = []
    for f in (fn, thunder_rs.jit(fn)):
        x = _leaf_view(_SPD_UPPER)
        out = f(x)
        assert out.requires_grad
        (out.abs() if out.is_complex() else out).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])
