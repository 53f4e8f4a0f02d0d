"""Key/value-cache generation as serving code and users write it, round 12 (programs in
``user_loops_round12.py``), and training around it. Hand-written decoders over preallocated caches
written in place (``narrow`` views at a Python-int position, ``index_copy_`` at a tensor of
positions, a position buffer the model advances, a ring buffer for a sliding window, beams reordered
in place, slots of a batch at their own lengths for continuous batching), speculative decoding
rolling both caches back, a cache kept on the module or in a dict the call rebinds, generation
under ``no_grad``/``inference_mode`` then a training step on the same module, a model moved to
bfloat16 and back between calls, a LoRA adapter trained, switched off and merged between
generations. Each from one seed eager, with the model jitted and under ``torch.compile(backend=
"thunder_rs")``: results, parameters, gradients, buffers (the caches), optimizer state and the
random state bit for bit, the compile counts read (a decode over a growing cache stays at <= 3).
HF ``generate`` and users' loops over HF caches are in ``test_user_loops_round12_hf.py``."""

import pytest
import torch

import thunder_rs
from thunder_rs.dynamo import compiled_graphs
from user_loops_round12 import (
    VOCAB,
    BeamDecoder,
    CachedOnModule,
    CountingDecoder,
    Decoder,
    DictCached,
    IntCountingDecoder,
    LazyCacheDecoder,
    ReferenceLlama,
    RingDecoder,
    SlottedDecoder,
    TensorStartDecoder,
    beam_decode,
    continuous_batching,
    counted_decode,
    fed_one_by_one,
    lm_loss,
    prefill_and_decode,
    reference_generate,
    ring_decode,
    sampled_decode,
    speculative_greedy,
)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
SLOW = pytest.mark.slow
MODES = ["jit", pytest.param("compile", marks=SLOW)]
PROMPT = torch.randint(1, VOCAB, (2, 4), generator=torch.Generator().manual_seed(1))
REQUESTS = [torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(n)) for n in (3, 5, 2, 4)]


def assert_same(got, expected, path: str = "result") -> None:
    """Tensors bit for bit with eager's dtype and ``requires_grad``; containers item by item."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert (got.dtype, got.requires_grad) == (expected.dtype, expected.requires_grad), path
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{path}[{i}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"


def snapshot(models) -> list:
    """Every model's parameters, gradients and buffers (the caches), copied."""
    out = []
    for model in models:
        for p in model.parameters():
            out += [p.detach().clone(), None if p.grad is None else p.grad.clone()]
        out += [b.clone() for b in model.buffers()]
    return out


def decodes_as_eager(build, recipe, mode: str, models: int = 1) -> list:
    """``recipe(wrap, *built)`` with ``built`` ``models`` models made from seed 0 by ``build``
    and ``wrap(fn)`` compiling ``fn`` as ``mode`` does (the identity in eager), from seed 5: the
    same results, models' state and random state as eager. Returns the compile counts: the cache
    misses of each callable ``wrap`` made (jit), or thunder_rs's compiles of each new graph."""
    results, counts = {}, []
    for m in ("eager", mode):
        torch.manual_seed(0)
        built = [build() for _ in range(models)]
        if m == "compile":
            torch._dynamo.reset()
        before, wrapped = compiled_graphs(), []

        def wrap(fn, m=m, wrapped=wrapped):
            if m == "eager":
                return fn
            wrapped.append(thunder_rs.jit(fn) if m == "jit" else torch.compile(fn, backend="thunder_rs"))
            return wrapped[-1]

        torch.manual_seed(5)
        results[m] = recipe(wrap, *built), snapshot(built), torch.get_rng_state()
        if m == "jit":
            counts = [thunder_rs.cache_misses(call) for call in wrapped]
        elif m == "compile":
            new = [g for g in compiled_graphs() if all(g is not b for b in before)]
            counts = [thunder_rs.cache_misses(g.jitted) for g in new if g.jitted is not None]
            assert counts, "nothing compiled"
    assert_same(results[mode], results["eager"])
    return counts


def check_counts(mode: str, counts: list, jit: list, graph_limit: int = 3) -> None:
    """Under ``jit``, the counts measured; under ``torch.compile``, each of Dynamo's graphs
    compiled at most ``graph_limit`` times by thunder_rs (Dynamo makes a graph per recompile)."""
    if mode == "jit":
        assert counts == jit
    else:
        assert max(counts) <= graph_limit, counts


def no_grad(recipe):
    """``recipe`` under ``torch.no_grad()``."""

    def run(*args):
        with torch.no_grad():
            return recipe(*args)

    return run


# ------------------------------------------------------------------ prefill, then decode


@pytest.mark.parametrize("mode", MODES)
def test_prefill_then_decode_writing_narrow_views_at_an_int_position_is_eagers(mode):
    """The position a Python int the loop advances: the first decode step compiles the int
    symbolic, the rest are served (the caches after: eager's, the unwritten tail zero)."""
    counts = decodes_as_eager(Decoder, no_grad(lambda wrap, m: prefill_and_decode(wrap(m), PROMPT)), mode)
    check_counts(mode, counts, [2])


@pytest.mark.parametrize("mode", MODES)
def test_prefill_then_decode_by_index_copy_at_a_tensor_of_positions_is_eagers(mode):
    run = no_grad(lambda wrap, m: prefill_and_decode(wrap(m), PROMPT, as_tensor=True))
    check_counts(mode, decodes_as_eager(Decoder, run, mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_top_k_sampling_from_a_seeded_generator_over_the_cache_is_eagers(mode):
    """The generator's state after the run is eager's, and the global one untouched as in eager."""

    def run(wrap, m):
        generator = torch.Generator().manual_seed(3)
        return sampled_decode(wrap(m), PROMPT, generator), generator.get_state()

    check_counts(mode, decodes_as_eager(Decoder, no_grad(run), mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_position_buffer_the_model_advances_and_the_loop_rewinds_is_eagers(mode):
    """``filled += n`` inside the call (written back), ``filled.sub_(2)`` by the loop between
    calls (a retry): the rewound steps overwrite the cache as eager's do."""
    counts = decodes_as_eager(CountingDecoder, no_grad(lambda wrap, m: counted_decode(wrap(m), m, PROMPT)), mode)
    check_counts(mode, counts, [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_python_int_position_the_model_keeps_on_itself_is_eagers(mode):
    """``self.pos += n`` in ``forward``: every call advances it as eager's do (the attribute read
    is a guard, the write replayed), and the int then compiles symbolic."""

    def run(wrap, m):
        return fed_one_by_one(wrap(m), PROMPT), m.pos

    check_counts(mode, decodes_as_eager(IntCountingDecoder, no_grad(run), mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_cache_written_through_narrow_at_a_tensor_start_is_eagers(mode):
    """``narrow(2, start, n)`` with ``start`` a 0-d tensor, and a slice write ``[start:start + n]``
    (the tensor's value read as an int where eager reads it)."""

    def run(wrap, m):
        return fed_one_by_one(wrap(m), PROMPT, start=lambda i: torch.tensor(i))

    check_counts(mode, decodes_as_eager(TensorStartDecoder, no_grad(run), mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_returned_narrow_view_of_the_cache_aliases_it_as_in_eager(mode):
    """The keys returned as ``narrow`` views of the buffer: a later call's write shows through
    the view an earlier call returned, as in eager."""

    def run(wrap, m):
        call = wrap(m.keys_too)
        logits, first = call(PROMPT, 0)
        before = first.clone()
        logits, second = call(logits[:, -1:].argmax(-1), 4)
        call(logits[:, -1:].argmax(-1), 5)
        return before, first, second, second.data_ptr() == m.layers[0].keys.data_ptr()

    counts = decodes_as_eager(Decoder, no_grad(run), mode)
    check_counts(mode, counts, [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_cache_the_model_rebinds_on_itself_by_cat_is_eagers(mode):
    """``self.keys = torch.cat([self.keys, k], 1)``: the attribute holds eager's tensor after
    every call (the rebinding replayed, the growing length symbolic)."""

    def run(wrap, m):
        return fed_one_by_one(wrap(m), PROMPT, start=None), m.keys, m.values

    check_counts(mode, decodes_as_eager(CachedOnModule, no_grad(run), mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_cache_dict_the_call_rebinds_items_of_is_eagers(mode):
    def run(wrap, m):
        cache = {"keys": torch.zeros(2, 0, 16), "values": torch.zeros(2, 0, 16)}
        call = wrap(m)
        return fed_one_by_one(lambda ids, _: call(ids, cache), PROMPT), cache["keys"], cache["values"]

    check_counts(mode, decodes_as_eager(DictCached, no_grad(run), mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_metas_reference_llama_generate_is_eagers(mode):
    """Meta's reference Llama and its ``generate``, in small: the caches plain attributes
    rebound by ``.to(xq)`` and written by slice at ``start_pos``, complex rotary embeddings, the
    ``forward`` under ``@torch.inference_mode()``, prompts of three lengths sampled from where the
    shortest ends: tokens, logits, the caches and the RNG state as eager's. The prompt, then
    every later step with ``start_pos`` symbolic."""

    def run(wrap, m):
        tokens, logits = reference_generate(wrap(m), [[5, 7, 9, 11], [3, 4], [8, 1, 2]])
        caches = [(layer.cache_k, layer.cache_v, layer.cache_k.is_inference()) for layer in m.layers]
        return tokens, logits, caches, [t.is_inference() for t in logits]

    check_counts(mode, decodes_as_eager(ReferenceLlama, run, mode), [2])


# -------------------------------------------------------- beams, windows, slots, speculation


@pytest.mark.parametrize("mode", MODES)
def test_beam_search_reordering_the_cache_in_place_is_eagers(mode):
    """Each step's ``parents`` reorder the cache buffers in place (``copy_`` of an
    ``index_select`` of themselves) before the beams' tokens are written."""
    run = no_grad(lambda wrap, m: beam_decode(wrap(m), PROMPT[:1]))
    check_counts(mode, decodes_as_eager(lambda: BeamDecoder(3), run, mode), [2])


@pytest.mark.parametrize("mode", MODES)
def test_a_sliding_window_ring_buffer_cache_is_eagers(mode):
    """Position ``p`` written at ``p % 5`` of the ring: past the window, the oldest entry is
    overwritten and every entry is attended to; one compile for every position (a 0-d tensor)."""
    run = no_grad(lambda wrap, m: ring_decode(wrap(m), PROMPT[:1]))
    check_counts(mode, decodes_as_eager(RingDecoder, run, mode), [1])


@pytest.mark.parametrize("mode", MODES)
def test_continuous_batching_with_slots_finishing_at_different_steps_is_eagers(mode):
    """Two slots serving four requests: a slot whose request reaches its budget (or the end token)
    is refilled by prefilling the next prompt into it while the other keeps decoding. The decode
    step (per-slot lengths a tensor, advanced-index writes) compiles once; the prefill (its prompt
    length and slot) compiles the first prompt, then both symbolic, then the slot's other value."""

    def run(wrap, m):
        return continuous_batching(wrap(m.decode), wrap(m.prefill), REQUESTS, [4, 2, 5, 3])

    check_counts(mode, decodes_as_eager(SlottedDecoder, no_grad(run), mode), [1, 3])


@pytest.mark.parametrize("mode", MODES)
def test_greedy_speculative_decoding_rolling_both_caches_back_is_eagers(mode):
    """The draft's three guesses checked by the target in one call; both caches move back to the
    agreeing prefix by their filled lengths (ints), their stale entries overwritten later."""

    def run(wrap, target, draft):
        return speculative_greedy(wrap(target), wrap(draft), PROMPT[:1])

    counts = decodes_as_eager(lambda: Decoder(1), no_grad(run), mode, models=2)
    check_counts(mode, counts, [3, 2])


# ------------------------------------------------------------ training around generation


def generate_then_train(wrap, model, grad_off=torch.no_grad, steps: int = 3):
    """``steps`` times: four greedy tokens under ``grad_off``, then an AdamW step on the
    language-model loss of prompt and tokens through the same compiled model."""
    call, optimizer, out = wrap(model), torch.optim.AdamW(model.parameters(), lr=0.01), []
    for _ in range(steps):
        with grad_off():
            tokens, _ = prefill_and_decode(call, PROMPT, new=4)
        loss = lm_loss(call, torch.cat([PROMPT, tokens], 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        out.append((tokens, loss.detach()))
    return out, [t.clone() for kept in optimizer.state.values() for t in kept.values() if torch.is_tensor(t)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("grad_off", [torch.no_grad, torch.inference_mode])
def test_generation_without_grad_then_a_training_step_on_the_same_module_is_eagers(mode, grad_off):
    """The training step writes the cache (detached keys) and reads it: gradients, AdamW's state
    and the caches as eager's. Under ``inference_mode`` the cache buffers written stay ordinary
    tensors (in-place writes to them), as in eager; one more compile for the other grad mode."""
    counts = decodes_as_eager(Decoder, lambda wrap, m: generate_then_train(wrap, m, grad_off), mode)
    check_counts(mode, counts, [3 if grad_off is torch.no_grad else 4], graph_limit=4)


@pytest.mark.parametrize("mode", MODES)
def test_a_cache_holding_the_last_steps_graph_fails_the_next_backward_as_in_eager(mode):
    """A model that writes undetached keys into its cache buffer: the second training step's
    backward reaches the first's freed graph through the cache. Eager raises; so do both. (The
    gradients the failed backward leaves differ: eager's engine has accumulated those of the
    layers it reached before the freed graph, the compiled model's one autograd node none; they
    are cleared before comparing.)"""
    errors = []

    def run(wrap, m):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            generate_then_train(wrap, m)
        errors.append(m)
        m.zero_grad()
        return m.layers[0].keys.requires_grad

    decodes_as_eager(lambda: Decoder(detach_cache=False), run, mode)
    assert len(errors) == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_cache_made_under_inference_mode_refuses_the_training_steps_write_as_eager_does(mode):
    """The cache tensors the first call makes under ``inference_mode`` are inference tensors: the
    training step's write into them raises eager's error (a ``RuntimeError``), the caches left
    as eager leaves them."""

    def run(wrap, m):
        call = wrap(m)
        with torch.inference_mode():
            tokens, _ = prefill_and_decode(call, PROMPT, new=3)
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            lm_loss(call, torch.cat([PROMPT, tokens], 1))
        return tokens, [(layer.keys, layer.values, layer.keys.is_inference()) for layer in m.layers]

    check_counts(mode, decodes_as_eager(LazyCacheDecoder, run, mode), [3], graph_limit=4)


@pytest.mark.parametrize("mode", MODES)
def test_a_model_moved_to_bfloat16_and_back_between_decodes_is_eagers(mode):
    """``model.to(torch.bfloat16)`` between decodes (the caches too), then back: the bfloat16
    decode compiles its own entries, and the float32 one again is served by the first."""

    def run(wrap, m):
        call, out = wrap(m), []
        for dtype in (torch.float32, torch.bfloat16, torch.float32):
            m.to(dtype)
            out.append(prefill_and_decode(call, PROMPT, new=3))
        return out

    check_counts(mode, decodes_as_eager(Decoder, no_grad(run), mode), [4])


def lora_session(wrap, model):
    """Generate with the adapter; one SGD step on the adapter alone (the body frozen); generate;
    switch it off (``scale = 0``); merge it into the frozen weights in place; generate each time."""
    for name, p in model.named_parameters():
        p.requires_grad_("lora" in name)
    call, out = wrap(model), []
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with torch.no_grad():
        out.append(prefill_and_decode(call, PROMPT, new=3))
    loss = lm_loss(call, torch.cat([PROMPT, out[-1][0]], 1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        out.append(prefill_and_decode(call, PROMPT, new=3))
        for layer in model.layers:
            layer.scale = 0.0
        out.append(prefill_and_decode(call, PROMPT, new=3))
        for layer in model.layers:
            layer.qkv.weight += layer.lora_b @ layer.lora_a
        out.append(prefill_and_decode(call, PROMPT, new=3))
    return out, loss.detach()


@pytest.mark.parametrize("mode", MODES)
def test_lora_generation_trained_switched_off_and_merged_is_eagers(mode):
    """Compiles: the decode (2), the training step (1), the decode with the adapter off (its
    ``scale`` a guarded attribute: 2); the merge writes a frozen weight in place (served)."""
    counts = decodes_as_eager(lambda: Decoder(lora=2), lora_session, mode)
    check_counts(mode, counts, [5])
