"""``saved_aten``: what eager's autograd saves of a one-tensor op's tensor and result, answered
without running the call again (``saved_versions``), is eager's own answer for every entry, and
the table is what ``derivatives.yaml`` says (``--run-slow``)."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.core.lang import saved_aten, saved_versions
from thunder_rs.core.lang.saved_ops import ONE_TENSOR_OPS, WRAPPERS, wrapped_saves
from thunder_rs.core.lang.saved_versions import eager_saves

#: The arguments after the tensor of the ops no call of the tensor alone samples.
EXTRA = {
    "_log_softmax": (1, False),
    "_softmax": (1, False),
    "_safe_softmax": (1,),
    "_adaptive_avg_pool2d": ((2, 2),),
    "_adaptive_avg_pool3d": ((2, 2, 2),),
    "adaptive_avg_pool2d": ((2, 2),),
    "avg_pool2d": (2,),
    "avg_pool3d": (2,),
    "max_pool2d": (2,),
    "cumsum": (1,),
    "cumprod": (1,),
    "logcumsumexp": (1,),
    "logsumexp": (1,),
    "all": (1,),
    "any": (1,),
    "expand": ((2, 2, 3),),
    "expand_copy": ((2, 2, 3),),
    "flip": ((0,),),
    "permute": ((1, 0),),
    "permute_copy": ((1, 0),),
    "transpose": (0, 1),
    "transpose_copy": (0, 1),
    "unsqueeze": (0,),
    "unsqueeze_copy": (0,),
    "view": ((-1,),),
    "view_copy": ((-1,),),
    "select": (0, 0),
    "select_copy": (0, 0),
    "narrow_copy": (0, 0, 1),
    "unfold": (0, 1, 1),
    "unfold_copy": (0, 1, 1),
    "repeat": ((2, 1),),
    "roll": (1,),
    "threshold": (0.5, 0.0),
    "constant_pad_nd": ((1, 1),),
    "renorm": (2, 0, 1.0),
    "mvlgamma": (1,),
    "polygamma": (1,),
    "reflection_pad1d": ((1, 1),),
    "reflection_pad2d": ((1, 1, 1, 1),),
    "replication_pad1d": ((1, 1),),
    "replication_pad2d": ((1, 1, 1, 1),),
    "upsample_nearest1d": ((6,),),
    "upsample_nearest2d": ((6, 6),),
    "upsample_bilinear2d": ((6, 6), False),
    "upsample_linear1d": ((6,), False),
    "upsample_bicubic2d": ((6, 6), False),
    "pixel_shuffle": (2,),
    "pixel_unshuffle": (2,),
    "channel_shuffle": (2,),
    "as_strided": ((2,), (1,)),
    "as_strided_copy": ((2,), (1,)),
    "_fft_r2c": ((1,), 0, True),
    "_fft_c2c": ((1,), 0, True),
    "_fft_c2r": ((1,), 0, 4),
}
_SHAPES = ((2, 3), (1, 4, 4), (1, 4, 4, 4), (1, 4, 2, 4, 4), (4,))


def _inputs(func):
    """Tensors ``func`` may take, each requiring grad (a non-leaf for an in-place op)."""
    for shape in _SHAPES:
        for dtype in (torch.float64, torch.complex128):
            x = (torch.rand(shape, dtype=dtype) * 0.5 + 0.25).requires_grad_()
            yield x * 1 if func.__name__.endswith("_") else x


def sample(func):
    """``(args, kwargs)`` of a call of ``func`` that makes an autograd node, or None."""
    extra = EXTRA.get(func.__name__.removesuffix("_"), ())
    for x in _inputs(func):
        try:
            with torch.enable_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = func(x, *extra)
        except (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError):
            continue
        if isinstance(out, torch.Tensor) and out.requires_grad:
            return (x, *extra), {}
    return None


def _named(f) -> str:
    return f"{getattr(f, '__module__', None) or ''}.{f.__qualname__}"


# (sorted: the table's order follows sets of functions, which differs between pytest-xdist's workers)
@pytest.mark.parametrize("func", sorted(ONE_TENSOR_OPS, key=_named), ids=_named)
def test_each_entry_is_eagers_answer(func):
    """The positions eager saves (0: the tensor; 1: the result, which an in-place op writes into
    its tensor, position 0 then) are those the table says."""
    call = sample(func)
    assert call is not None, f"{func.__qualname__}: no sample call (give it arguments in EXTRA)"
    saves_self, saves_result = ONE_TENSOR_OPS[func]
    inplace = func.__name__.endswith("_")
    expected = {0} if saves_self or (inplace and saves_result) else set()
    if saves_result and not inplace:
        expected.add(1)
    assert eager_saves(func, *call) == expected


#: The arguments after the tensor of the wrappers that take more than it.
WRAPPER_EXTRA = {F.threshold: (0.5, 0.0), F.glu: (-1,), torch.softmax: (-1,), torch.log_softmax: (-1,)}
WRAPPER_EXTRA.update({f: (-1,) for f in (F.softmax, F.softmin, F.log_softmax, torch.Tensor.softmax)})
WRAPPER_EXTRA[torch.Tensor.log_softmax] = (-1,)


@pytest.mark.parametrize("func", sorted(WRAPPERS, key=_named), ids=_named)
def test_each_wrapper_is_answered_as_eager(func):
    """A Python function or composite that runs a table op (``F.relu``, ``F.softmax``) is answered by
    the table as eager's autograd saves, with ``inplace`` false and, where it has one, true."""
    extra = WRAPPER_EXTRA.get(func, ())
    modes = [{}] if WRAPPERS[func][2] is None else [{"inplace": False}, {"inplace": True}]
    for kwargs in modes:
        x = torch.rand(2, 4, dtype=torch.float64, requires_grad=True) * 1
        saves = wrapped_saves(func, (x, *extra), kwargs)
        if saves is None:  # (an in-place op whose functional op saves its tensor: run again instead)
            assert kwargs.get("inplace") and WRAPPERS[func][0][0]
            continue
        expected = {0} if saves[0] or (kwargs.get("inplace") and saves[1]) else set()
        if saves[1] and not kwargs.get("inplace"):
            expected.add(1)
        assert eager_saves(func, (x, *extra), kwargs) == expected, kwargs


@pytest.mark.slow
def test_the_table_is_derivatives_yaml():
    """Each entry is what torch's own codegen reads from the shipped ``derivatives.yaml``: the
    saved inputs and outputs of the op's node that are tensors (not sizes, dtypes or options)."""
    derived = _derived()
    tables = {
        "": saved_aten.SAVES_NONE,
        "self": saved_aten.SAVES_SELF,
        "result": saved_aten.SAVES_RESULT,
        "selfresult": saved_aten.SAVES_SELF_AND_RESULT,
    }
    for saves, names in tables.items():
        for name in names:
            assert derived.get(name) == saves, name


def _derived() -> dict:
    """``{aten name: saves}`` (``saved_aten``'s groups) of the functional ops whose every overload
    (in ``derivatives.yaml`` and in the dispatcher) takes one tensor and returns one."""
    import torchgen
    from torchgen.model import BaseTy, BaseType, SchemaKind
    from torchgen.packaged.autograd.load_derivatives import load_derivatives

    base = os.path.join(os.path.dirname(torchgen.__file__), "packaged")
    infos, _ = load_derivatives(
        os.path.join(base, "autograd", "derivatives.yaml"),
        os.path.join(base, "ATen", "native", "native_functions.yaml"),
        os.path.join(base, "ATen", "native", "tags.yaml"),
    )
    tensor = BaseType(BaseTy.Tensor)
    found: dict = {}
    for schema, per_key in infos.items():
        if schema.kind() != SchemaKind.functional:
            continue
        name, info = schema.name.name.base, per_key.get("Default")
        tensors = [a for a in schema.arguments.flat_all if a.type.is_tensor_like()]
        if not (
            info is not None
            and [(a.name, a.type) for a in tensors] == [("self", tensor)]
            and [r.type for r in schema.returns] == [tensor]
            and not any("wrap_opt_if" in d.formula for d in info.derivatives)
        ):
            found[name] = None
            continue
        saves = "self" * any(_is_tensor(s, "self") for s in info.all_saved_inputs)
        saves += "result" * any(_is_tensor(s, "result") for s in info.all_saved_outputs)
        found[name] = saves if found.get(name, saves) == saves else None
    for name in list(found):
        for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
            if not schema.is_mutable and sum("Tensor" in str(a.type) for a in schema.arguments) > 1:
                found[name] = None  # (a Python number wrapped as a tensor could reach the overload)
    return {name: saves for name, saves in found.items() if saves is not None}


def _is_tensor(saved, name: str) -> bool:
    from torchgen.api.types import BaseCType, tensorT

    return saved.nctype.name == name and saved.nctype.type == BaseCType(tensorT)


def _sigmoid_of_input_then_write(x):
    h = x * 1
    y = torch.sigmoid(h)  # saves its result only: writing h leaves its backward valid
    h.mul_(2)
    return (y + h).sum()


def _tanh_then_write_output(x):
    y = torch.tanh(x)
    y.add_(1)
    return y.sum()


def _relu_of_input_then_write(x):
    h = x * 1
    y = F.relu(h)  # saves its result only
    h.mul_(2)
    return (y + h).sum()


def _softmax_then_write_output(x):
    y = F.softmax(x, -1)
    y.mul_(2)
    return y.sum()


def _softmax_of_input_then_write(x):
    h = x * 1
    y = h.softmax(-1)
    h.add_(1)
    return (y + h).sum()


def _gelu_of_input_then_write(x):
    h = x * 1
    y = F.gelu(h)  # saves its tensor
    h.add_(1)
    return y.sum()


def _silu_of_input_then_write(x):
    h = x * 1
    y = F.silu(h)
    h.add_(1)
    return y.sum()


@pytest.mark.parametrize(
    "fn",
    [
        _sigmoid_of_input_then_write,
        _tanh_then_write_output,
        _relu_of_input_then_write,
        _softmax_then_write_output,
        _softmax_of_input_then_write,
        _gelu_of_input_then_write,
        _silu_of_input_then_write,
    ],
)
def test_a_large_call_is_answered_without_a_run(monkeypatch, fn):
    """A call too large to run again on the CPU (where a meta run imports sympy or torch._dynamo)
    is answered by the table, as eager's backward does: a gradient, or eager's error."""
    runs = []
    run = saved_versions._run
    monkeypatch.setattr(saved_versions, "_run", lambda call, device: runs.append(device) or run(call, device))
    x = torch.randn(512, 256, requires_grad=True)
    outcomes = []
    for call in (fn, thunder_rs.jit(fn)):
        x.grad = None
        try:
            call(x).backward()
            outcomes.append(x.grad)
        except RuntimeError as e:
            outcomes.append(str(e).split(" instead.")[0])
    assert runs == []
    if isinstance(outcomes[0], str):
        assert outcomes[1].startswith(outcomes[0])
    else:
        torch.testing.assert_close(outcomes[0], outcomes[1])


def _rrelu_then_write(x):
    y = x * 1
    z = torch.rrelu(y, training=True)  # draws its noise; saves y (run again on the CPU)
    y.mul_(2)
    return z + y


def test_a_call_run_again_on_the_cpu_leaves_the_generator_as_eager_does():
    """The run again draws as the call did; the program's draws, and the generator's state after
    the call, are eager's (``torch.random.fork_rng`` inside a trace is recorded, not run)."""
    x = torch.randn(4, requires_grad=True)
    outcomes = []
    for call in (_rrelu_then_write, thunder_rs.jit(_rrelu_then_write)):
        torch.manual_seed(0)
        out = call(x)
        outcomes.append((out, torch.rand(3)))
    torch.testing.assert_close(outcomes[0], outcomes[1])


_FIRST_COMPILE = """
import sys, torch, thunder_rs
from torch import nn
m = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid())
def f(x):
    y = m(x); y.mul_(2); return y.sum()
thunder_rs.jit(f)(torch.randn(3, 4))
cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(True), nn.Conv2d(4, 4, 3), nn.ReLU(True))
thunder_rs.jit(cnn)(torch.randn(2, 3, 64, 64)).sum().backward()
def g(x):
    h = x * 1; y = torch.sigmoid(h); h.mul_(2); return (y + h).sum()
thunder_rs.jit(g)(torch.randn(512, 256, requires_grad=True)).backward()
def h(x):
    a = x * 1; b = a * 2; a.add_(1); return b.sum()
thunder_rs.jit(h)(torch.randn(3, 4, requires_grad=True)).backward()
print(sorted(m for m in ("sympy", "torch._dynamo") if m in sys.modules))
"""


def test_a_first_compile_imports_neither_sympy_nor_dynamo():
    """The calls a write reaches are answered by the table or a CPU run (C++ kernels), not by a
    meta run, whose Python meta kernels import sympy and torch._dynamo (seconds, once a process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", _FIRST_COMPILE], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr
