"""Inference tensors the caller passes into a jitted call, against eager PyTorch: whether an input
is one is part of its cache key, and eager's errors for them (an op saving one for backward, an
in-place write outside inference mode) are raised where eager raises them, and only there."""

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

SAVED = "Inference tensors cannot be saved for backward"
WRITTEN = "Inplace update to inference tensor outside InferenceMode"


def _inference(*shape, requires_grad=False):
    with torch.inference_mode():
        return torch.randn(*shape, requires_grad=requires_grad)


def _raises_as_eager(fn, *args, match):
    with pytest.raises(RuntimeError, match=match) as eager:
        fn(*args).sum().backward()
    with pytest.raises(RuntimeError, match=match) as compiled:
        thunder_rs.jit(fn)(*args).sum().backward()
    assert str(compiled.value).startswith(str(eager.value))  # eager's message, then where


def test_a_linear_layer_saving_an_inference_input_raises_as_eager():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    _raises_as_eager(lambda x: lin(x), _inference(2, 4), match=SAVED)


@pytest.mark.parametrize("use", [lambda x, w: x * w, lambda x, w: w * x.view(-1)[0], lambda x, w: (x @ w).exp()])
def test_ops_saving_an_inference_input_raise_as_eager(use):
    w = torch.randn(4, 4, requires_grad=True)
    _raises_as_eager(use, _inference(4, 4), w, match=SAVED)


def _like_eager(fn, *args, grads=()):
    expected = fn(*args)
    expected.sum().backward()
    wanted = [g.grad for g in grads]
    for g in grads:
        g.grad = None
    actual = thunder_rs.jit(fn)(*args)
    torch.testing.assert_close(actual, expected)
    assert actual.is_inference() == expected.is_inference()
    actual.sum().backward()
    torch.testing.assert_close([g.grad for g in grads], wanted)


@pytest.mark.parametrize(
    "use",
    [
        lambda x, w: x + w,  # saves nothing
        lambda x, w: x.exp() * w,  # saves x.exp(), a normal tensor
        lambda x, w: torch.cat([x, w]).sin(),
        lambda x, w: torch.where(x > 0, w, x),
    ],
)
def test_an_inference_input_saved_by_no_op_trains_as_eager(use):
    w = torch.randn(4, 4, requires_grad=True)
    _like_eager(use, _inference(4, 4), w, grads=(w,))


def test_an_inference_input_in_no_grad_code_runs_as_eager():
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)

    def fn(x):
        with torch.no_grad():
            h = lin(x)
        return h * x.sum()

    x = _inference(2, 4)
    torch.testing.assert_close(thunder_rs.jit(fn)(x), fn(x))
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(lin)(x), lin(x))


def test_an_in_place_write_to_an_inference_input_raises_as_eager():
    def fn(x):
        x.add_(1)
        return x * 2

    with pytest.raises(RuntimeError, match=WRITTEN):
        fn(_inference(4))
    jfn = thunder_rs.jit(fn)
    for context in (torch.enable_grad, torch.no_grad):
        with context(), pytest.raises(RuntimeError, match=WRITTEN):
            jfn(_inference(4))
    x = _inference(4)
    with torch.inference_mode():  # allowed there
        expected = fn(x.clone())
        torch.testing.assert_close(jfn(x), expected)
    torch.testing.assert_close(x, expected / 2)


def test_normal_and_inference_inputs_do_not_share_an_entry():
    def fn(x, w):
        return (x * 2 + w).sum(), x.is_inference()

    w = torch.randn(4, requires_grad=True)
    jfn = thunder_rs.jit(fn)
    for x in (torch.randn(4), _inference(4), torch.randn(4), _inference(4)):
        assert jfn(x, w)[1] == fn(x, w)[1] == x.is_inference()
    assert thunder_rs.cache_misses(jfn) == 2
    assert "x: inference False -> True" in thunder_rs.compile_stats(jfn).miss_reasons[1]

    def saves(x, w):
        return (x * w).sum()

    jfn = thunder_rs.jit(saves)
    jfn(torch.randn(4), w).backward()  # compiled for a normal tensor: not reused for an inference one
    with pytest.raises(RuntimeError, match=SAVED):
        jfn(_inference(4), w)


def test_an_inference_input_that_requires_grad_is_refused():
    # Eager gives x * 2 a gradient and x.sin() none: no trace follows that.
    x = _inference(4, requires_grad=True)
    with pytest.raises(ThunderNotImplementedError, match="inference tensor that requires grad"):
        thunder_rs.jit(lambda x: x.sin())(x)
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(lambda x: x.sin())(x), x.sin())


def test_a_module_built_under_inference_mode_is_refused_with_grad_mode_on():
    # Eager's backward runs but leaves the parameters' .grad None; the compiled call filled it.
    with torch.inference_mode():
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
    x, jmodel = torch.randn(2, 4), thunder_rs.jit(model)
    model(x).sum().backward()
    assert model.weight.grad is None
    with pytest.raises(ThunderNotImplementedError, match="inference tensor that requires grad"):
        jmodel(x)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            expected, actual = model(x), jmodel(x)
        torch.testing.assert_close(actual, expected)
        assert actual.is_inference() == expected.is_inference()


def test_a_value_read_from_inference_inputs_while_tracing_is_eagers():
    """The first call returns the outputs computed while tracing a data-dependent read, for the
    inputs they came from unless written since, which the version counter shows; an inference
    tensor has none, and the first call raised torch's error reading it (``generate`` under
    ``inference_mode``: the mask's padding is read by value)."""

    def program(x, mask):
        return x * 2 if mask.all() else x + 1

    jitted = thunder_rs.jit(program)
    with torch.inference_mode():
        x, mask = torch.randn(3), torch.ones(3, dtype=torch.bool)
        for _ in range(2):
            torch.testing.assert_close(jitted(x, mask), program(x, mask), rtol=0, atol=0)
            mask[0] = False


class Held:
    def __init__(self, keys):
        self.keys = keys


@pytest.mark.parametrize("held", [False, True], ids=["argument", "argument_object"])
def test_inference_inputs_of_growing_lengths_compile_one_symbolic_entry(held):
    # A cache of inference tensors (filled under inference mode) read by a call outside it, one
    # longer each call: the second call compiles the length symbolic. The meta tensors standing for
    # them in the check for eager's errors were made of the symbolic sizes, which failed (torch's
    # SymNode.wrap_int): symbolic compiles stopped for the function, which compiled every length.
    def grown(k, x):
        return torch.cat([k, x], 1) * 2

    def grown_held(cache, x):
        return grown(cache.keys, x)

    fn = grown_held if held else grown
    jfn = thunder_rs.jit(fn)
    for n in range(3, 8):
        keys, x = _inference(2, n, 4), torch.randn(2, 1, 4)
        first = Held(keys) if held else keys
        got, expected = jfn(first, x), fn(first, x)
        assert torch.equal(got, expected) and got.is_inference() == expected.is_inference()
    assert thunder_rs.compile_stats(jfn).cache_misses == 2, thunder_rs.compile_stats(jfn).miss_reasons
    # eager's error for a write to one, raised by the symbolic compile too (the second length)
    written = thunder_rs.jit(lambda k, x: torch.cat([k.add_(1), x], 1))
    for n in (3, 4):
        with pytest.raises(RuntimeError, match=WRITTEN):
            written(_inference(2, n, 4), torch.randn(2, 1, 4))
