"""Decoding loops as users write them, round 11 (programs in ``user_loops_round11.py``), over a
causal language model whose key/value cache the loop passes in and gets back: speculative sampling
with a draft model (accepting by ``torch.rand``, the caches rolled back by slicing), beam search
reordering the cache by ``index_select``, contrastive decoding of an expert against an amateur,
and locally typical sampling. Each from the same seed eager, with the models jitted and with them
under ``torch.compile(backend="thunder_rs")``: the tokens, scores and random state after eager's,
the compile counts read."""

import pytest
import torch

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from user_loops_round6 import wrap
from user_loops_round11 import (
    CachedLM,
    StaticCachedLM,
    beam_search_cached,
    contrastive_decode,
    speculative_cached,
    speculative_static,
    typical_sample,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
SLOW = pytest.mark.slow
MODES = ["jit", pytest.param("compile", marks=SLOW)]
F32 = dict(rtol=1.3e-6, atol=1e-5)


def decodes_as_eager(recipe, mode: str, models: int = 1, seed: int = 5, model=CachedLM, **tol) -> tuple:
    """``recipe(*calls)`` under ``no_grad`` over ``models`` ``model``s (built from one seed), eager
    and in ``mode`` from ``seed``: the same results, buffers and random state after. Returns eager's
    results and the compile counts: each jitted model's cache misses, or thunder_rs's compiles per
    new graph."""
    results, counts = {}, []
    for m in ("eager", mode):
        torch.manual_seed(0)
        built = [model().eval() for _ in range(models)]
        if m == "compile":
            torch._dynamo.reset()
        before = compiled_graphs()
        calls = [wrap(m, model) for model in built]
        torch.manual_seed(seed)
        with torch.no_grad():
            results[m] = recipe(*calls), [b.clone() for b in built for b in b.buffers()], torch.get_rng_state()
        if m == "jit":
            counts = [thunder_rs.cache_misses(call) for call in calls]
        elif m == "compile":
            new = [g for g in compiled_graphs() if all(g is not b for b in before)]
            counts = [thunder_rs.cache_misses(g.jitted) for g in new if g.jitted is not None]
            assert counts, "nothing compiled"
    torch.testing.assert_close(results[mode], results["eager"], **(tol or dict(rtol=0, atol=0)))
    return results["eager"][0], counts


PROMPT = torch.randint(0, 11, (1, 4), generator=torch.Generator().manual_seed(3))
PROMPTS = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("mode", MODES)
def test_speculative_sampling_with_caches_rolled_back_on_rejection_is_eagers(mode):
    """Four rounds of three drafted tokens: rejected at the first, in the middle, all accepted (a
    bonus token from the target), the caches sliced back to the accepted prefix each time (the
    draft then fed the tokens its cache lacks: one, or two after a full acceptance)."""

    def recipe(target, draft):
        return speculative_cached(target, draft, PROMPT, rounds=4)

    (ids, accepted, *lengths), counts = decodes_as_eager(recipe, mode, models=2, seed=4)
    assert 0 in accepted and 3 in accepted and lengths == [ids.shape[1] - 1] * 2
    if mode == "jit":
        assert counts == [3, 3]


@pytest.mark.parametrize("mode", MODES)
def test_beam_search_reordering_a_cache_by_index_select_is_eagers(mode):
    ids, counts = decodes_as_eager(lambda model: beam_search_cached(model, PROMPT), mode)
    assert ids[0].shape == (3, 8)
    if mode == "jit":
        assert counts == [2]


@pytest.mark.parametrize("mode", MODES)
def test_contrastive_decoding_of_an_expert_against_an_amateur_is_eagers(mode):
    """Greedy over the expert's log-probabilities less the amateur's, among the tokens the expert
    finds plausible; both models over their own caches (the amateur another draw of the model)."""
    _, counts = decodes_as_eager(lambda expert, amateur: contrastive_decode(expert, amateur, PROMPTS), mode, models=2)
    if mode == "jit":
        assert counts == [2, 2]


@pytest.mark.parametrize("mode", MODES)
def test_locally_typical_sampling_over_a_cache_is_eagers(mode):
    _, counts = decodes_as_eager(lambda model: typical_sample(model, PROMPTS), mode)
    if mode == "jit":
        assert counts == [2]


@pytest.mark.parametrize("mode", MODES)
def test_speculative_sampling_over_static_caches_written_in_place_is_eagers(mode):
    """The caches are buffers the jitted forwards write in place (``index_copy_`` at the positions
    fed); a rollback leaves stale entries, masked until overwritten: the buffers after the run are
    eager's, stale entries included."""
    (ids, accepted), counts = decodes_as_eager(
        lambda target, draft: speculative_static(target, draft, PROMPT), mode, models=2, seed=4, model=StaticCachedLM
    )
    assert 0 in accepted and 3 in accepted
    if mode == "jit":
        assert counts == [2, 3]  # (the target always fed the prompt, then four tokens)
