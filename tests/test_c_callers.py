"""Effects a traced program hands to a C caller, which calls them where the observer's hook does
not see (``functools.partial(f.write, s)()``, ``list(map(f.write, xs))``,
``operator.methodcaller("write", s)(f)``, ``sorted(xs, key=f.write)``): they ran on the first call
only; now refused naming the line (``core/acquisition/c_callers.py``), while the callers used
otherwise run as eager."""

import functools
import io
import itertools
import operator
import os

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


@pytest.mark.parametrize("how", ["partial", "map", "filter", "starmap", "methodcaller", "sorted", "max", "os_write"])
def test_an_effect_handed_to_a_c_caller_is_refused_naming_the_line(tmp_path, how):
    held = open(tmp_path / "held", "w")  # noqa: SIM115
    fd = os.open(tmp_path / "fd", os.O_WRONLY | os.O_CREAT)
    cases = {
        "partial": lambda x: (functools.partial(held.write, "x")(), x + 1)[1],
        "map": lambda x: (list(map(held.write, ["a", "b"])), x + 1)[1],
        "filter": lambda x: (list(filter(held.write, ["a"])), x + 1)[1],
        "starmap": lambda x: (list(itertools.starmap(held.write, [("a",)])), x + 1)[1],
        "methodcaller": lambda x: (operator.methodcaller("write", "m")(held), x + 1)[1],
        "sorted": lambda x: (sorted(["b", "a"], key=held.write), x + 1)[1],
        "max": lambda x: (max(["b", "a"], key=held.write), x + 1)[1],
        "os_write": lambda x: (functools.partial(os.write, fd, b"k")(), x + 1)[1],
    }
    fn = cases[how]
    line = fn.__code__.co_firstlineno
    what = "os.write" if how == "os_write" else r"_io.TextIOWrapper.write"
    jf = thunder_rs.jit(fn)
    try:
        for _ in range(2):
            with pytest.raises(ThunderNotImplementedError, match=rf"{what}: the program hands it to .*s.py:{line}"):
                jf(torch.ones(3))
    finally:
        held.close()
        os.close(fd)
    assert (tmp_path / "held").read_text() == "" and os.path.getsize(tmp_path / "fd") == 0
    assert functools.partial is functools.partial.__call__.__objclass__  # (the real one, put back)


def test_c_callers_used_otherwise_run_as_eager():
    def fn(x):
        buffer = io.StringIO()  # (the program's own stream)
        list(map(buffer.write, ["a", "bc"]))
        scale = functools.partial(torch.mul, 2.0)

        class Scaled(functools.partial):
            pass

        assert isinstance(scale, functools.partial) and issubclass(Scaled, functools.partial)
        words = sorted(["ccc", "a", "bb"], key=len) + list(filter(None, ["", "d"]))
        upper = list(map(operator.methodcaller("upper"), words))
        assert isinstance(operator.methodcaller("upper"), operator.methodcaller)
        assert functools.partial(dict, function=1)() == {"function": 1}
        counts = len(buffer.getvalue()) + len("".join(upper)) + max(words, key=len).count("c")
        return Scaled(torch.add, 1.0)(scale(x)) * counts

    jf = thunder_rs.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(3)), fn(torch.ones(3)), rtol=0, atol=0)
