"""Where q, k and v start in their storage decides which fused attention kernel torch offers (the
efficient kernel wants aligned starts): a call whose inputs start elsewhere compiles again with
torch's choice for it, offsets are guarded only where a choice depends on them, and views of an
input or of a computed projection are chosen for where eager's would start. Checked on fake CUDA
tensors as ``test_attention_kernels.py`` does.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch import fused_attention as fa

from test_attention_kernels import EFFICIENT, MATH, attention, backward, fake_leaf, observed_kernels


@pytest.fixture
def fake():
    return FakeTensorMode()


# -- where q, k and v start in their storage --------------------------------------------------------


def efficient_where_aligned(q, k, v, *args, **kwargs):
    """Torch's choice on an sm80+ GPU with flash and cuDNN switched off: the memory-efficient
    kernel where q, k and v start on a 16-byte boundary (``check_data_ptr_alignment_mem_efficient``
    in sdp_utils.cpp), else the math path."""
    aligned = all(x.storage_offset() * x.element_size() % 16 == 0 for x in (q, k, v))
    return EFFICIENT if aligned else MATH


def packed_qkv(start: int):
    """q, k, v split from one packed projection that starts ``start`` elements into its buffer:
    [2, 4, 16, 64] views, leaves requiring grad."""
    buffer = torch.empty(2, 16, 3 * 256 + 8, dtype=torch.bfloat16, device="cuda")
    qkv = buffer[..., start : start + 3 * 256].unflatten(-1, (3, 4, 64))
    return [qkv[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3)]


def test_a_call_whose_query_starts_off_the_kernels_boundary_compiles_again_with_torchs_choice(fake, monkeypatch):
    """The cache key leaves storage offsets out: q, k and v sliced at an odd offset of a packed
    buffer hit the entry traced at offset 0, whose memory-efficient kernel torch does not choose
    for them (it refuses misaligned storage; eager runs the math path). The entry guards the
    offsets' alignment to the kernel's 8 bfloat16 elements: such a call compiles again, one at
    another offset on the same side of the boundary hits."""
    monkeypatch.setattr(fa, "eager_choice", efficient_where_aligned)
    fa._choices.clear()
    jfn = thunder_rs.jit(attention({}))
    with fake, observed_kernels() as seen:
        for start in (0, 0, 1, 8, 3):
            backward(jfn(*packed_qkv(start)))
    fa._choices.clear()
    assert len(seen["ran"]["efficient_attention"]) == 3  # (at 0, 0 and 8)
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.cache_hits) == (2, 3), stats.miss_reasons
    assert "efficient_attention" not in str(thunder_rs.last_traces(jfn)[-1])
    reason = stats.miss_reasons[1]
    assert re.match(r"the storage offset of \w+ changed from 0 to 1 \(modulo 8 elements: torch chose the", reason)


def test_a_view_into_an_input_is_chosen_for_where_it_starts_not_where_the_input_does(fake, monkeypatch):
    """The program slices q, k and v from its input one element in: the input at offset 7 puts them
    on the boundary, at 1 off it, though the input is off it both times."""
    monkeypatch.setattr(fa, "eager_choice", efficient_where_aligned)
    fa._choices.clear()

    def sliced(buffer):
        qkv = buffer[..., 1 : 1 + 3 * 256].unflatten(-1, (3, 4, 64))
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        return F.scaled_dot_product_attention(q, k, v)

    jfn = thunder_rs.jit(sliced)
    with fake, observed_kernels() as seen:
        storage = torch.empty(2, 16, 3 * 256 + 16, dtype=torch.bfloat16, device="cuda")
        for start in (7, 1, 15):
            backward(jfn(storage[..., start : start + 3 * 256 + 1].detach().requires_grad_()))
    fa._choices.clear()
    assert len(seen["ran"]["efficient_attention"]) == 2  # (at 7 and 15)
    assert thunder_rs.compile_stats(jfn).cache_misses == 2, thunder_rs.compile_stats(jfn).miss_reasons


def test_offsets_are_not_guarded_where_torchs_choice_does_not_depend_on_them(fake, monkeypatch):
    monkeypatch.setattr(fa, "eager_choice", lambda *args, **kwargs: EFFICIENT)
    fa._choices.clear()
    jfn = thunder_rs.jit(attention({}))
    with fake:
        for start in (0, 1):
            jfn(*packed_qkv(start))
    fa._choices.clear()
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


def test_views_of_a_computed_projection_are_chosen_for_at_eagers_offsets(fake, monkeypatch):
    """q, k and v viewed in the program from a projection it computed start where eager's do: at
    an odd offset (a bias column sliced off) torch chooses the math path, as the trace does."""
    seen = []

    def choice(q, k, v, *args, **kwargs):
        seen.append(tuple(x.storage_offset() for x in (q, k, v)))
        return efficient_where_aligned(q, k, v)

    monkeypatch.setattr(fa, "eager_choice", choice)
    fa._choices.clear()

    def block(x, w):
        q, k, v = (x @ w)[..., 1:].unflatten(-1, (3, 4, 64)).unbind(2)
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))

    jfn = thunder_rs.jit(block)
    with fake:
        x = fake_leaf((2, 16, 32), torch.bfloat16)
        w = fake_leaf((32, 3 * 256 + 1), torch.bfloat16)
        backward(jfn(x, w))
        eager = [t.storage_offset() for t in (x @ w)[..., 1:].unflatten(-1, (3, 4, 64)).unbind(2)]
    fa._choices.clear()
    assert seen == [tuple(eager)] and eager == [1, 257, 513]
    assert "efficient_attention" not in str(thunder_rs.last_traces(jfn)[-1])
    assert thunder_rs.compile_stats(jfn).cache_misses == 1


@pytest.mark.parametrize("computed", [False, True], ids=["of_the_input", "of_a_computed_tensor"])
def test_a_choice_that_depends_on_an_offset_no_rule_tells_is_refused(fake, monkeypatch, computed):
    """A query taken by a view op run as a fallback (``unfold``): where it starts is not worked
    out, and torch's choice depends on it."""
    monkeypatch.setattr(fa, "eager_choice", efficient_where_aligned)
    fa._choices.clear()

    def windows(x, k, v):
        return F.scaled_dot_product_attention((x * 2 if computed else x).unfold(2, 64, 64), k, v)

    with fake, pytest.raises(ThunderNotImplementedError, match=r"where the query starts in its storage.*contiguous"):
        k, v = (fake_leaf((2, 4, 16, 64), torch.bfloat16) for _ in range(2))
        thunder_rs.jit(windows)(fake_leaf((2, 4, 16 * 64), torch.bfloat16), k, v)
    fa._choices.clear()


class KVCache:
    def __init__(self, k, v):
        self.k, self.v = k, v


def test_keys_an_argument_object_holds_are_guarded_where_they_start(fake, monkeypatch):
    """Tensors an argument object holds are read per call from it (a KV cache): their offsets too."""
    monkeypatch.setattr(fa, "eager_choice", efficient_where_aligned)
    fa._choices.clear()
    jfn = thunder_rs.jit(lambda q, cache: F.scaled_dot_product_attention(q, cache.k, cache.v))
    with fake, observed_kernels() as seen:
        for start in (0, 1, 8):
            q, k, v = packed_qkv(start)
            backward(jfn(packed_qkv(0)[0], KVCache(k, v)))
    fa._choices.clear()
    assert len(seen["ran"]["efficient_attention"]) == 2  # (at 0 and 8)
    stats = thunder_rs.compile_stats(jfn)
    assert (stats.cache_misses, stats.cache_hits) == (2, 1), stats.miss_reasons
    assert re.match(r"the storage offset of cache\.k changed from 256 to 257 ", stats.miss_reasons[1])


@pytest.mark.slow
def test_hf_gpt2_with_padding_lengths_on_fake_cuda_runs_the_fused_kernel_in_two_compiles(fake, monkeypatch):
    """The CPU side of test_cuda.py's HF GPT-2 test, which compiled once per length on an H200 (run
    1): torch's attention (sdpa) with HF's padding mask at five lengths, q, k and v split from one
    projection; with the memory-efficient kernel chosen where they start on its boundary, every
    length runs it and the symbolic entry serves the lengths after the second."""
    transformers = pytest.importorskip("transformers")
    asked = []

    def choice(q, k, v, *args, **kwargs):
        asked.append(q.shape[2])
        return efficient_where_aligned(q, k, v)

    monkeypatch.setattr(fa, "eager_choice", choice)
    fa._choices.clear()
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, vocab_size=100, n_positions=128, attn_implementation="sdpa", attn_pdrop=0.0
    )
    with fake, torch.device("cuda"), observed_kernels() as seen:
        model = transformers.GPT2LMHeadModel(config)
        jm = thunder_rs.jit(model)
        for n in [16, 24, 40, 17, 33]:
            ids = torch.randint(0, 100, (2, n))
            mask = (torch.arange(n)[None, :] < torch.tensor([[n], [n - 3]])).long()
            jm(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    fa._choices.clear()
    stats = thunder_rs.compile_stats(jm)
    assert stats.cache_misses == 2, stats.miss_reasons
    assert len(seen["ran"]["efficient_attention"]) == 5 * config.n_layer
    assert sorted(set(asked)) == [16, 17, 24, 33, 40]  # (the symbolic entry asks torch at each new length)
