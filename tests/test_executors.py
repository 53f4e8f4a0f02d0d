"""The executor API: operator executors with checkers claim symbols before the torch executor."""

import dataclasses

import pytest
import torch

import thunder_rs
from thunder_rs import _core
import thunder_rs.torch as ltorch
from thunder_rs.executors import Executor, add_operator_executor, deregister_executor, register_executor


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


def test_torch_executor_prims_agree_with_their_meta_rules():
    # Composites are claimed whole by default, so call the prims directly, as a fusion
    # executor's fallback would run them.
    from thunder_rs import prims

    x = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    sums = thunder_rs.jit(lambda a: (prims.sum(a, (1,)), prims.prod(a + 1, (0, 1))))(x)
    assert [t.dtype for t in sums] == [torch.int32, torch.int32]
    torch.testing.assert_close(sums[0], x.sum(1, dtype=torch.int32))
    torch.testing.assert_close(sums[1], (x + 1).prod(dtype=torch.int32))

    v = torch.randn(2, 3, dtype=torch.float64)
    var1, var0, (vm_var, vm_mean) = thunder_rs.jit(
        lambda a: (prims.var(a, (), 1), prims.var(a, (), 0), prims.var_mean(a, (), 1))
    )(v)
    assert var1.shape == v.shape and bool(var1.isnan().all())
    torch.testing.assert_close(var0, torch.zeros_like(v))
    assert vm_var.shape == v.shape and bool(vm_var.isnan().all())
    torch.testing.assert_close(vm_mean, v)


def test_an_implementation_registered_after_a_compile_runs_in_the_next_compile():
    """Each executor's registry draws a new version on registration, which rebuilds the table."""
    ex = Executor("late_sin_ex")
    calls = []

    def my_sin(a):
        calls.append(a.shape)
        return torch.sin(a)

    register_executor(ex)
    try:
        x = torch.randn(4)
        torch.testing.assert_close(thunder_rs.jit(torch.sin)(x), torch.sin(x))
        assert not calls
        version = ex.registry.version
        impl = ex.register_implementation(ltorch.sin, my_sin, impl_name="my.sin")
        assert ex.registry.version > version and ex.registry[ltorch.sin.symbol_id] is impl and impl.name == "my_sin"
        with pytest.raises(dataclasses.FrozenInstanceError):
            impl.checker = None  # type: ignore[misc]
        torch.testing.assert_close(thunder_rs.jit(torch.sin)(x), torch.sin(x))
        assert calls == [(4,)]
    finally:
        deregister_executor(ex)


def test_an_implementation_of_a_misspelt_prim_fails_when_the_table_is_built():
    """A prim name no prim has is an error at table build naming the executor and the name, not a
    registration that silently never claims anything."""
    ex = Executor("misspelt_ex")
    ex.register_implementation("sinn", torch.sin)
    register_executor(ex)
    try:
        with pytest.raises(ValueError, match="executor `misspelt_ex` registers an implementation of `sinn`"):
            thunder_rs.jit(torch.sin)(torch.randn(4))
    finally:
        deregister_executor(ex)


def test_executor_tables_cross_as_frozen_records():
    entry = _core.ImplEntry(symbol="sin", function="torch_sin", has_checker=False, method="sin")
    row = _core.ExecutorRow(name="torch", fusion=False, impls=[entry])
    assert (entry.symbol, entry.function, entry.has_checker, entry.method, entry.inplace) == (
        "sin",
        "torch_sin",
        False,
        "sin",
        None,
    )
    assert row.impls == (entry,) and not row.fuses_decompositions
    assert repr(entry) == (
        "ImplEntry(symbol='sin', function='torch_sin', has_checker=False, method='sin', inplace=None, method_args=None)"
    )
    with pytest.raises(AttributeError):
        entry.function = "other"  # type: ignore[misc]
    _core.ExecutorTable([row])


def test_the_tables_of_two_executor_lists_each_follow_their_registries():
    """A compile's snapshots and its passes take tables of two lists in turn: each is kept, and
    rebuilt once its executors' registries change."""
    from thunder_rs.core.lang.executor_api import executor_table
    from thunder_rs.executors.torch_ex import torch_ex

    ex = Executor("two_tables_ex")
    both, alone = [ex, torch_ex], [torch_ex]
    table_both, _ = executor_table(both)
    table_alone, _ = executor_table(alone)
    assert executor_table(both)[0] is table_both and executor_table(alone)[0] is table_alone
    ex.register_implementation(ltorch.sin, torch.sin, impl_name="two_tables.sin")
    table, impls = executor_table(both)
    assert table is not table_both and "two_tables_sin" in impls
    assert executor_table(alone)[0] is table_alone


def test_a_fallback_taken_out_of_the_torch_executor_is_registered_again():
    """Fallbacks are synced while neither their number nor the registry changed: a removal
    changes the registry's version, and the next sync puts the fallback back."""
    from thunder_rs.core.lang.fallback import FALLBACK_IMPLS
    from thunder_rs.executors.torch_ex import sync_fallbacks, torch_ex

    sync_fallbacks()
    sid = next(iter(FALLBACK_IMPLS))
    removed = torch_ex.registry.remove([sid])
    assert sid not in torch_ex.registry
    sync_fallbacks()
    assert torch_ex.registry[sid].fn is removed[sid].fn
