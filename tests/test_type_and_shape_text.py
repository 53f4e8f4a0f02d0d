"""``type()`` of a traced tensor and the text of a shape of symbolic sizes, against eager.

A traced tensor is a stand-in of another class: ``type(x) is torch.Tensor`` answered False and the
program took the other path on every call, silently. Where eager's answer differs, the compile
fails naming the construct and the line; where it agrees (``type(x) is np.ndarray``), or the class
only builds the message of a ``raise`` that does not run, the program runs as before
(``core.state.tensor_types``). The text of a shape with symbolic sizes (``str(x.shape)``,
``f"{x.shape}"``) was ``torch.Size([t0])``: it is eager's, each call's.
"""

import logging
import re

import numpy as np
import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError

pytestmark = pytest.mark.usefixtures("one_thread")


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _line_of(fn, text: str) -> str:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return f"{__file__}:{first + next(i for i, line in enumerate(lines) if text in line)}"


#: ``type()`` of a traced tensor whose eager answer the stand-in's class cannot give.
DIFFERING = {
    "is": (lambda x: x * 2 if type(x) is torch.Tensor else x - 1, "type(x) is torch.Tensor"),
    "==": (lambda x: x * 2 if type(x) == torch.Tensor else x - 1, "type(x) == torch.Tensor"),  # noqa: E721
    "is not, reflected": (lambda x: x - 1 if torch.Tensor is not type(x) else x * 2, "type(x) is not torch.Tensor"),
    "in": (
        lambda x: x * 2 if type(x) in {torch.Tensor, np.ndarray} else x - 1,
        "type(x) in {torch.Tensor, np.ndarray}",
    ),
    "its name": (lambda x: (x * 2, type(x).__name__), "type(x).__name__"),
    "of a computed tensor": (
        lambda x: (lambda y: y if type(y) is torch.Tensor else -y)(x * 2),
        "type(y) is torch.Tensor",
    ),
}


@pytest.mark.parametrize("use", DIFFERING)
def test_type_of_a_tensor_that_eager_answers_otherwise_is_refused_naming_the_line(use):
    fn, construct = DIFFERING[use]
    fn(torch.randn(3))  # (eager runs it)
    with pytest.raises(
        ThunderNotImplementedError, match=rf"{re.escape(construct)} at {__file__}:\d+: type\(\) of a tensor"
    ):
        thunder_rs.jit(fn)(torch.randn(3))


class _Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        x = x * self.scale if type(self.scale) is not torch.nn.Parameter else x
        return self.lin(x) if type(self.lin.weight) is torch.nn.Parameter else x


def test_type_of_a_parameter_is_refused_and_of_a_buffer_answers_as_eager():
    module = _Gated()
    module(torch.randn(3))
    site = _line_of(_Gated.forward, "self.lin.weight) is")
    expected = rf"type\(self.lin.weight\) is .* at {site}: .*Parameter in eager"
    with pytest.raises(ThunderNotImplementedError, match=expected):
        thunder_rs.jit(module)(torch.randn(3))


def _check_bad(x):
    if x.dim() > 4:
        raise TypeError(f"expected at most 4 dims, got a {type(x).__name__} of {x.dim()}")
    return x * 2


# (compiled apart: pytest rewrites the asserts of a test module)
_ASSERTING = """
def _assert_not_bad(x):
    assert x.dim() <= 4, f"expected at most 4 dims, got a {type(x).__name__}"
    return x * 2
"""
exec(compile(_ASSERTING, __file__, "exec"))


#: Uses whose eager answer the stand-in gives too: they run as before.
AGREEING = {
    "is np.ndarray": lambda x: torch.from_numpy(x) if type(x) is np.ndarray else x * 2,
    "not in (list, tuple)": lambda x: x * 2 if type(x) not in (list, tuple) else x,
    "a computed tensor is not a Parameter": lambda x: (lambda y: y if type(y) is not torch.nn.Parameter else -y)(x + 1),
    "the name in a message that does not raise": _check_bad,
    "the name in an assert's message": _assert_not_bad,  # type: ignore[name-defined]  # noqa: F821
}


@pytest.mark.parametrize("use", AGREEING)
def test_type_of_a_tensor_that_eager_answers_alike_runs(use):
    fn, x = AGREEING[use], torch.randn(3)
    jfn = thunder_rs.jit(fn)
    for _ in range(2):
        assert _same(jfn(x), fn(x))


#: Text a program makes of a shape (or a size) of a tensor whose length changes between calls.
TEXTS = {
    "str": lambda x: (x * 2, str(x.shape)),
    "f-string": lambda x: (x * 2, f"{x.shape}"),
    "repr of size()": lambda x: (x * 2, repr(x.size())),
    "in a list": lambda x: (x * 2, str([x.shape, 1])),
    "a sliced shape": lambda x: (x * 2, str(x.shape[:1])),
}


@pytest.mark.parametrize("use", TEXTS)
def test_text_of_a_shape_of_symbolic_sizes_is_eager_s(use):
    fn = TEXTS[use]
    jfn = thunder_rs.jit(fn)
    for n in (2, 3, 4, 3, 5):
        x = torch.randn(n, 2)
        assert _same(jfn(x), fn(x)), n
    assert "compiled with symbolic sizes" in thunder_rs.compile_stats(jfn).miss_reasons[1]


def test_printed_and_logged_shapes_are_each_call_s_and_keep_the_sizes_symbolic(capsys, caplog):
    log = logging.getLogger("test_type_and_shape_text")

    def fn(x):
        print(x.shape, x.size(0))
        log.warning("shape %s", x.shape)
        return x * 2

    jfn, sizes = thunder_rs.jit(fn), (2, 3, 4, 3, 5)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for n in sizes:
            fn(torch.randn(n))
        eager_out, eager_log = capsys.readouterr().out, [r.getMessage() for r in caplog.records]
        caplog.clear()
        for n in sizes:
            jfn(torch.randn(n))
        out, logged = capsys.readouterr().out, [r.getMessage() for r in caplog.records if r.name == log.name]
    assert out == eager_out and logged == eager_log
    assert thunder_rs.compile_stats(jfn).cache_misses == 2


def test_a_printed_f_string_of_a_shape_is_each_call_s(capsys):
    def fn(x):
        print(f"shape {x.shape}")
        return x * 2

    jfn, sizes = thunder_rs.jit(fn), (2, 3, 4, 3)
    for n in sizes:
        fn(torch.randn(n))
    eager = capsys.readouterr().out
    for n in sizes:
        jfn(torch.randn(n))
    assert capsys.readouterr().out == eager
    assert thunder_rs.compile_stats(jfn).cache_misses == 2  # (text only printed is made by each call: symbolic)


def test_an_assert_message_formatting_a_shape_is_eager_s_and_specialises_nothing():
    def fn(x):
        torch._assert(x.shape[0] < 5, f"too long: {x.shape}")
        return x * 2

    jfn = thunder_rs.jit(fn)
    for n in (2, 3, 4):
        jfn(torch.randn(n))
    with pytest.raises(AssertionError) as eager:
        fn(torch.randn(6))
    with pytest.raises(AssertionError) as got:
        jfn(torch.randn(6))
    assert str(got.value) == str(eager.value) == "too long: torch.Size([6])"
    assert thunder_rs.compile_stats(jfn).cache_misses == 2  # (the first call's, the symbolic one)
