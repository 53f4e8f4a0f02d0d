"""Shapes that change between calls (issue 26), a twelfth sweep: sizes the program converts with
Python's ``int`` and ``float``, interpolation by any factor, RNNs over packed sequences, jitted
containers, and the patterns the other sweeps left out. Every call's outputs, gradients and
returned numbers are checked against eager over at least five sizes, 0 and 1 among them where
eager takes them, and the compiles counted as in ``test_dynamic_round9``.

What the sweep found, each fixed and pinned here: ``int(x.size(0))``, ``float(len(x))``,
``torch.full((n,), float(n))``, ``math.sqrt(float(T))`` and ``x[: int(T / 2)]`` took the size's
value (Python's ``int`` and ``float`` must return a plain number): a compile per length, where
torch.compile keeps them symbolic. In the program's modules that only call ``int`` and ``float``
they are symbolic now (``core.lang.program_builtins``); a module that reads the classes otherwise
(``isinstance(v, float)``, ``type(v) is int``) keeps the builtins, a compile per length as before.
``F.interpolate`` by a factor with no short binary fraction (1.7, 0.3) compiled once per size; it
is ``T * 17 // 10`` where that is exact. ``pack_padded_sequence`` was refused; RNNs over packed
sequences run eager's kernels, a compile per distinct packed sizes. A jitted ``nn.Sequential``
had no ``len``, indexing or iteration.

Checked and equal to eager, nothing to fix (compiles, thunder_rs / torch.compile(dynamic=None)):
HF GPT-2 and Llama ``generate`` with left padding of varying lengths (3 / -) and training with
right padding (2 / -); ``nn.MultiheadAttention`` with ``kdim``/``vdim`` and a float mask over
varying key lengths (2 / 2), ``nn.Transformer`` with causal target masks (2 / 2); ``F.unfold``,
``F.fold`` (2 / 2); ``torch.stft`` and ``istft(length=)`` (2 / 6); ``box_iou`` with
``generalized_box_iou_loss`` (4 / 17); ``batched_nms``, ``roi_align`` and ``sigmoid_focal_loss``
over the boxes kept (2 / 8). Left: ``int()``/``float()`` in modules that read the classes, and in
library code (``torch_overrides.SIZED_BUILTINS`` lists the modules handled).

This module only calls ``int`` and ``float`` (no other read of the names), as the stand-ins need.
"""

import importlib.util
import linecache
import math
import sys

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.torch.interpolate import _near_fraction
from test_dynamic_round9 import assert_same, grads, misses, run_lengths

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled")]

LENGTHS = (5, 7, 9, 1, 0, 12, 3)


# -- int() and float() of sizes ----------------------------------------------------------------------


def mean_over_length(x):
    n = x.shape[0]
    return x.sum(0) / float(n), torch.full((n,), float(n)) + x[:, 0], float(len(x)) * 2


def int_of_size(x):
    n = int(x.size(0))
    return x.reshape(n * 3) * 2, torch.arange(int(x.shape[0])) * x[:, 0], x[: int(x.shape[0] / 2)] * 3, n


def scaled_by_root(x):
    n = float(x.size(0))
    return x / math.sqrt(n + 1.0), x * torch.tensor(n), int(len(x) * 0.75), round(n / 3), x[: int(n / 2)] * 2


@pytest.mark.parametrize("fn", [mean_over_length, int_of_size, scaled_by_root])
def test_int_and_float_of_a_size_stay_symbolic(fn):
    """``int()`` and ``float()`` of a size took its value, a guard on it: a compile per length (7
    here). They are the size and ``T * 1.0`` (``T * 3 // 4`` for ``int(T * 0.75)``), computed per
    call, as torch.compile keeps them: the first shapes, the symbolic entry, 0 and 1."""
    jfn = run_lengths(fn, lambda T: grads((T, 3)))
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons
    assert "int" not in globals() and "float" not in globals()  # (taken away after tracing)


def branch_on_float(x):
    n = float(x.shape[0])
    if n > 6.5:
        return x * n
    return x - int(n)


def test_a_branch_on_a_float_of_a_size_is_guarded():
    """The comparison is a relation on the size (``T > 6``), guarded: each side compiles once."""
    jfn = run_lengths(branch_on_float, lambda T: grads((T, 2)), (5, 7, 9, 3, 12, 4, 8, 6))
    assert misses(jfn) <= 3, thunder_rs.compile_stats(jfn).miss_reasons


# -- modules that read the classes keep the builtins ---------------------------------------------------

_READS_THE_CLASS = """
import torch


def is_float(v):
    return type(v) is float


def program(x):
    s = float(x.shape[0])
    return x * s, is_float(s), int(x.shape[0]) + 1
"""


def _module(tmp_path, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module, path


def test_a_module_that_reads_the_class_keeps_the_builtin(tmp_path):
    """``type(v) is float`` in the module would be False of a stand-in's class: its ``float`` stays
    the builtin (a compile per length); ``int``, only called, is symbolic."""
    module, _ = _module(tmp_path, "round12_reads_class", _READS_THE_CLASS)
    jfn = run_lengths(module.program, lambda T: grads((T, 2)), (5, 7, 9, 12))
    assert misses(jfn) == 4
    assert "float" not in vars(module)


_CALLS_ONLY = """
def program(x):
    return x * float(x.shape[0])
"""


def test_code_that_is_not_the_modules_source_keeps_the_builtin(tmp_path):
    """The file changed after the import (its functions are not the source's): the stand-in is
    not put, and each length compiles as before with eager's values."""
    module, path = _module(tmp_path, "round12_stale", _CALLS_ONLY)
    path.write_text(_CALLS_ONLY.replace("float(x.shape[0])", "float(x.shape[0]) + 1.0"))
    linecache.checkcache(str(path))
    jfn = run_lengths(module.program, lambda T: grads((T, 2)), (5, 7, 9, 12))
    assert misses(jfn) == 4
    code = compile("def made(x):\n    return x * float(x.shape[0])\n", str(path), "exec")
    exec(code, vars(module))  # noqa: S102 (code of the module that its source does not hold)
    jfn = run_lengths(module.made, lambda T: grads((T, 2)), (5, 7, 9))
    assert misses(jfn) == 3
    assert_same(module.made(torch.ones(2)), torch.full((2,), 2.0))


# -- interpolation by a factor with no short binary fraction ---------------------------------------------


def rescaled(x):
    up = F.interpolate(x, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)
    return up, F.interpolate(x, scale_factor=(0.3, 1.1), mode="nearest"), up.shape[-1]


def test_interpolation_by_a_factor_with_no_short_binary_fraction_keeps_sizes_symbolic():
    """``floor(float(T) * 1.7)`` was taken at each size's value (1.7 is no short binary fraction):
    a compile per image size. It is ``T * 17 // 10`` wherever ``T * 17 / 10`` is no integer (then
    the double product's rounding cannot reach one); a size of a multiple of 10 is taken at its
    value, a compile of its own, as eager's floor of the rounded product (17, not 16, at 10)."""
    sizes = (5, 7, 9, 12, 3, 6, 11, 13, 10)
    jfn = run_lengths(rescaled, lambda T: [torch.randn(1, 2, T + 1, 2 * T + 1, requires_grad=True)], sizes)
    assert misses(jfn) <= 4, thunder_rs.compile_stats(jfn).miss_reasons


def test_the_near_fraction_gives_the_floor_of_the_double_product():
    for c in (1.7, 0.3, 1.1, 2.2, 1 / 3, 0.1, 0.85, 1.3333, 3.14159):
        a, b, limit = _near_fraction(c)
        sizes = [*range(2, 20000), *(limit - k for k in range(1, 2000)), *range(2**40, 2**40 + 2000)]
        for n in sizes:
            if n < limit and (n * a) % b:
                assert math.floor(float(n) * c) == n * a // b, (c, n)


# -- RNNs over packed sequences -------------------------------------------------------------------------


def doubles(*shapes):
    return [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in shapes]


def _packed_gru():
    torch.manual_seed(0)
    gru = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True).double()

    def program(x, lengths, h0):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=True)
        out, h = gru(packed, h0)
        padded, sizes = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=x.shape[0] + 1, padding_value=-1.0)
        return padded, h, sizes, out.data * 2, out.batch_sizes

    return program


def _packed_lstm():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, batch_first=True, proj_size=2).double()

    def program(x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, c) = lstm(packed)
        return torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0], h, c

    return program


def test_rnns_over_packed_sequences_of_every_length_run_as_eager():
    """``pack_padded_sequence`` in the program was refused naming the line (torch's meta kernel
    failed on it). Its sizes are the lengths' (data): read from the values, so the packing, the
    RNN's packed kernel and the unpacking run as eager's, a compile per distinct packed sizes (the
    lengths' sum and maximum; a call of other lengths with the same sizes runs the same variant),
    up to the 16 variants of a call signature, past which calls run as eager code with a warning."""
    gru = _packed_gru()
    run_lengths(
        gru,
        lambda T: [*doubles((T + 2, 3, 3)), torch.tensor([T + 2, T, 1]), *doubles((4, 3, 4))],
        (5, 7, 9, 1, 12),
    )
    jlstm = thunder_rs.jit(lstm := _packed_lstm())
    for lengths in ([5, 3, 2], [5, 4, 1], [2, 5, 3], [1, 4, 5], [3, 3, 3]):
        x = doubles((3, 5, 3))[0]
        copies = [x.detach().clone().requires_grad_() for _ in range(2)]
        expected, got = lstm(copies[0], torch.tensor(lengths)), jlstm(copies[1], torch.tensor(lengths))
        assert_same(expected, got)
        for outs in (expected, got):
            torch.stack([t.sin().sum() for t in outs]).sum().backward()
        assert_same(copies[0].grad, copies[1].grad)
    assert misses(jlstm) == 2, thunder_rs.compile_stats(jlstm).miss_reasons  # (sums 10, 10, 10, 10 and 9)


# -- a jitted container ---------------------------------------------------------------------------


def test_a_jitted_container_answers_the_container_protocol_as_the_module():
    """``len``, indexing, slicing, iteration and ``in`` of a jitted ``nn.Sequential``, ``ModuleList``
    or ``ModuleDict`` raised TypeError (the wrapper had none of them); they are the module's, an
    empty one is false as the module is, and ``jm += [layer]`` keeps ``jm`` the jitted module."""
    seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    jseq = thunder_rs.jit(seq)
    assert len(jseq) == 3 and jseq[0] is seq[0] and list(jseq) == list(seq) and list(reversed(jseq)) == list(seq)[::-1]
    assert list(jseq[1:]) == list(seq[1:]) and jseq[-1] is seq[-1]
    assert not thunder_rs.jit(torch.nn.Sequential()) and thunder_rs.jit(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError):
        len(thunder_rs.jit(torch.nn.Linear(2, 2)))
    x = torch.randn(5, 3, dtype=torch.float64)
    assert_same(seq(x), jseq(x))
    jseq[1] = torch.nn.Tanh()  # (the wrapped module's layer: the next call runs it)
    assert isinstance(seq[1], torch.nn.Tanh)
    assert_same(seq(x), jseq(x))
    layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    jlayers = before = thunder_rs.jit(layers)
    jlayers += [torch.nn.Linear(2, 2)]
    assert jlayers is before and len(layers) == 2 and jlayers[1] is layers[1]
    heads = thunder_rs.jit(torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2)}))
    assert "a" in heads and "b" not in heads and list(heads) == ["a"] and heads["a"].out_features == 2
