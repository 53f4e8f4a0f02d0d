"""The code objects of snapshot segments (``core/run/codes.py``) are shared by segments whose
sources differ only in value ids: each binds its own constants and the implementations the
executors hold when it runs, and the results stay those of eager."""

import torch

import thunder_rs
import thunder_rs.torch as ltorch
from thunder_rs.core.run import codes
from thunder_rs.executors import Executor, deregister_executor, register_executor


def test_the_canonical_form_renumbers_names_and_leaves_strings_and_code_alone():
    source = (
        "_dev0 = torch.device('cpu')\n"
        "def computation(t7, t3):\n"
        '  # t7: "cpu f32[2]"\n'
        '  t9 = eager_op_12(t7, _c4, \'t7 # not a comment\', mode="_c4")  # t9: "cpu f32[2]"\n'
        "  eager_check_value_0(_c2, t9, t3)\n"
        "  return (t9, _c4)\n"
    )
    text, consts = codes.canonical(source)
    assert consts == [4, 2]
    assert text == (
        "_dev0 = torch.device('cpu')\n"
        "def computation(t0, t1):\n"
        "  \n"
        "  t2 = eager_op_12(t0, _c0, 't7 # not a comment', mode=\"_c4\")  \n"
        "  eager_check_value_0(_c1, t2, t1)\n"
        "  return (t2, _c0)\n"
    )


def steps_with_reads(x, steps: int = 6):
    for _ in range(steps):
        x = torch.sin(x) * 2
        x = x - 1 if x.sum() > 0 else x + 1  # a read: a segment as the last one, ids apart
    return x


def test_reads_whose_segments_run_the_same_calls_compile_one_code(monkeypatch):
    monkeypatch.setattr(codes, "_codes", {})
    jfn = thunder_rs.jit(steps_with_reads)
    for data in ([0.5, -2.0, 3.0], [-3.0, -2.0, -1.0], [0.1, 0.2, 0.3]):
        x = torch.tensor(data)
        torch.testing.assert_close(jfn(x), steps_with_reads(x))
    assert len(codes._codes) < 6 * thunder_rs.cache_misses(jfn)


def test_an_implementation_replaced_between_compiles_runs_in_the_snapshots_of_the_next():
    """A kept code object finds the executors' implementations in the scope of each run: the
    implementation registered since, not the one of the compile that compiled the code."""
    ex = Executor("snapshot_sin_ex")
    first, second = [], []

    def counted(calls):
        def my_sin(a):
            calls.append(a.shape)
            return torch.sin(a)

        return my_sin

    register_executor(ex)
    try:
        x = torch.tensor([0.5, -2.0, 3.0])
        ex.register_implementation(ltorch.sin, counted(first), impl_name="my.sin")
        torch.testing.assert_close(thunder_rs.jit(steps_with_reads)(x), steps_with_reads(x))
        assert first
        ex.register_implementation(ltorch.sin, counted(second), impl_name="my.sin")
        calls_before = len(first)
        torch.testing.assert_close(thunder_rs.jit(steps_with_reads)(x), steps_with_reads(x))
        assert len(first) == calls_before and len(second) >= 6  # each read's segment ran the new one
    finally:
        deregister_executor(ex)


@torch.library.custom_op("thunder_rs_tests::scaled_by_name", mutates_args=())
def scaled_by_name(x: torch.Tensor, name: str) -> torch.Tensor:
    return x * (2.0 if name == "t5" else 3.0)


@scaled_by_name.register_fake
def _(x, name):
    return torch.empty_like(x)


def named_then_read(x):
    y = scaled_by_name(x, "t5")
    return y - 1 if y.sum() > 0 else y + 1


def test_a_string_argument_that_looks_like_a_value_id_reaches_the_op_as_written(monkeypatch):
    """Renaming leaves string literals alone: ``"t5"`` passed to an op is not renumbered."""
    sources = []
    canonical = codes.canonical
    monkeypatch.setattr(codes, "canonical", lambda source: sources.append(source) or canonical(source))
    for data in ([0.5, -2.0, 3.0], [-0.5, -2.0, 1.0]):
        x = torch.tensor(data)
        torch.testing.assert_close(thunder_rs.jit(named_then_read)(x), named_then_read(x))
    assert any('"t5"' in source for source in sources)


def sines(x, y):
    return torch.sin(x) * y + torch.cos(y)


def test_a_new_jit_of_the_same_program_execs_the_code_compiled_before(monkeypatch):
    """The generated program is kept by its exact source (``codes.program``): a second jit of
    the same function and inputs compiles no code, and its results stay eager's."""
    monkeypatch.setattr(codes, "_programs", {})
    compiled = []
    monkeypatch.setattr(codes, "compile", lambda *a: compiled.append(a[1]) or compile(*a), raising=False)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for _ in range(2):
        torch.testing.assert_close(thunder_rs.jit(sines)(x, y), sines(x, y), rtol=0, atol=0)
    assert len(codes._programs) == 1 and len(compiled) == 1
    torch.testing.assert_close(thunder_rs.jit(sines)(x[:2], y[:2]), sines(x[:2], y[:2]), rtol=0, atol=0)
    assert len(codes._programs) == 2  # another shape: another source


def test_a_kept_program_binds_the_implementations_registered_since():
    """Like a snapshot's, a kept program finds the executors' implementations in the scope of each
    jit: a second jit of the same program runs the implementation registered since."""
    ex = Executor("program_sin_ex")
    first, second = [], []

    def counted(calls):
        def my_sin(a):
            calls.append(a.shape)
            return torch.sin(a)

        return my_sin

    register_executor(ex)
    try:
        x, y = torch.randn(3, 4), torch.randn(3, 4)
        ex.register_implementation(ltorch.sin, counted(first), impl_name="my.sin")
        torch.testing.assert_close(thunder_rs.jit(sines)(x, y), sines(x, y), rtol=0, atol=0)
        ex.register_implementation(ltorch.sin, counted(second), impl_name="my.sin")
        torch.testing.assert_close(thunder_rs.jit(sines)(x, y), sines(x, y), rtol=0, atol=0)
        assert len(first) == 1 and len(second) == 1
    finally:
        deregister_executor(ex)


def test_a_program_over_the_kept_size_is_compiled_each_time(monkeypatch):
    monkeypatch.setattr(codes, "_programs", {})
    monkeypatch.setattr(codes, "PROGRAM_CHARS", 10)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(thunder_rs.jit(sines)(x, y), sines(x, y), rtol=0, atol=0)
    assert codes._programs == {}
