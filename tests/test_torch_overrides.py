"""What thunder_rs changes in torch while it traces: ``torch.compiler.is_compiling()`` is True and
``torch.vmap`` is thunder_rs's, during acquisition only, also with acquisitions in several threads."""

import threading

import pytest
import torch

import thunder_rs


def test_is_compiling_holds_until_the_last_of_concurrent_acquisitions_ends():
    # Each program returns what it saw: 1 when compiling (the flag is read while tracing).
    first_inside, second_done = threading.Event(), threading.Event()
    results = {}

    def slow(x):
        first_inside.set()
        assert second_done.wait(30)
        return x * 0 + float(torch.compiler.is_compiling())  # the other acquisition has ended meanwhile

    def fast(x):
        return x * 0 + float(torch.compiler.is_compiling())

    worker = threading.Thread(target=lambda: results.update(slow=thunder_rs.jit(slow)(torch.ones(2))))
    worker.start()
    assert first_inside.wait(30)
    try:
        results["fast"] = thunder_rs.jit(fast)(torch.ones(2))
    finally:
        second_done.set()
        worker.join(30)
    torch.testing.assert_close(results, {"slow": torch.ones(2), "fast": torch.ones(2)})
    assert not torch.compiler.is_compiling()


def test_overrides_are_restored_after_a_failed_acquisition():
    vmap = torch.vmap

    def fails(x):
        raise KeyError("inside")

    with pytest.raises(KeyError):
        thunder_rs.jit(fails)(torch.ones(2))
    assert not torch.compiler.is_compiling() and torch.vmap is vmap and torch.func.vmap is vmap


def test_programs_take_their_compiled_branch_on_every_call():
    def f(x):
        return x * 2 if torch.compiler.is_compiling() else x * 3

    jf = thunder_rs.jit(f)
    x = torch.ones(2)
    torch.testing.assert_close(jf(x), x * 2)
    torch.testing.assert_close(jf(x), x * 2)  # a cache hit: no read of the flag, nothing to guard
    assert thunder_rs.cache_hits(jf) == 1


def test_a_module_first_imported_while_tracing_gets_torchs_answer_afterwards(tmp_path, monkeypatch):
    # ``from torch.compiler import is_compiling`` run while a program is traced binds thunder_rs's
    # stand-in for good (``torch._dynamo``'s ``mark_static`` asks it: marks were dropped after a
    # compile had imported Dynamo); outside tracing it must answer as torch's does.
    (tmp_path / "imported_while_traced.py").write_text(
        "from torch.compiler import is_compiling\n\ndef scale(x):\n    return x * 2 if is_compiling() else x * 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def program(x):
        import imported_while_traced  # noqa: PLC0415

        return imported_while_traced.scale(x)

    x = torch.ones(3)
    torch.testing.assert_close(thunder_rs.jit(program)(x), x * 2)  # (the compiled branch, as under torch.compile)
    import imported_while_traced  # noqa: PLC0415

    assert imported_while_traced.is_compiling() is torch.compiler.is_compiling() is False
    torch.testing.assert_close(imported_while_traced.scale(x), x * 3)
    z = torch.randn(3, 4)
    torch._dynamo.mark_static(z, 0)
    assert z._dynamo_static_indices == {0}
