"""The executor API: operator executors with checkers claim symbols before the torch executor."""

import torch

import thunder_rs
from thunder_rs.executors import add_operator_executor, deregister_executor


def test_operator_executor_claims_only_what_its_checker_accepts():
    calls = []

    def my_softmax(a, dim=None, _stacklevel=3, dtype=None):
        calls.append(dim)
        return torch.softmax(a, dim)

    def last_dim_only(a, dim=None, _stacklevel=3, dtype=None):
        assert isinstance(a, torch.Tensor) and a.shape == (3, 5)
        return dim in (-1, a.ndim - 1)

    ex = add_operator_executor(
        "my_softmax_ex", {"torch.nn.functional.softmax": ("my_softmax", last_dim_only, my_softmax)}
    )
    try:
        def f(x):
            return torch.nn.functional.softmax(x, dim=-1) + torch.nn.functional.softmax(x, dim=0)

        x = torch.randn(3, 5)
        jf = thunder_rs.jit(f)
        torch.testing.assert_close(jf(x), f(x))
        execution = str(thunder_rs.last_traces(jf)[-1])
        assert execution.count("my_softmax(") == 1
        assert calls == [-1]
    finally:
        deregister_executor(ex)
