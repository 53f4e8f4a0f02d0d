"""KV-cache decoding through compiled code, against eager (Hugging Face transformers 5): a greedy
loop that calls the jitted model with the cache it returned, and ``generate`` on a jitted module
and after ``thunder_rs.compile_module``, for tiny configs of six decoder families and T5 (nothing
downloaded).

The cache is an argument object. Its layers, reached through a list (``cache.layers[i]``), are
guarded through that path; the tensors they hold are trace inputs each call reads there; what the
forward sets on them (``keys``/``values`` grown by ``torch.cat``, Gemma-2's sliding-window count)
every call sets again, with that call's tensors (``core.reached``). The second cache length
compiles with the cache's length symbolic (automatic dynamic shapes, ``core.acquisition.dynamic``),
and ``compile_stats`` names the cache tensor that changed; later lengths reuse that entry. Gemma-2's
sliding layers count the tokens seen in a Python int (``cumulative_length``), which each step sets
one higher: once seen to change it is a size input too, and what the step sets there is that
call's count. Its sliding layers' keys, a slice of the prompt's states and then of each step's,
change strides at the second step, the step its count first changes: that compile makes the count
(and the full layers' lengths) symbolic all the same, three compiles as the others.
"""

import copy
import inspect
import re

import pytest
import torch

import thunder_rs
from thunder_rs.core.run.jit import DEFAULT_CACHE_SIZE
from thunder_rs.errors import ThunderNotImplementedError

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's cache layers (Cache.layers)", allow_module_level=True)
T = transformers

VOCAB = 99
PROMPT = 5
STEPS = 8
WINDOW = 4  # Gemma-2's sliding window: shorter than the prompt, so its layers drop tokens
COMMON = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
DECODER = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    **COMMON,
)
TOL = dict(rtol=1e-4, atol=1e-5)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    # Each decoding step recompiles (a new cache length): the warning at the 8th is expected.
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
    pytest.mark.filterwarnings("ignore:.*past_key_values.* is deprecated:FutureWarning"),
]

FAMILIES = {
    "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, **DECODER)),
    "phi3": lambda: T.Phi3ForCausalLM(T.Phi3Config(**DECODER)),
    "gemma2": lambda: T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, sliding_window=WINDOW, **DECODER)),
    "qwen2_moe": lambda: T.Qwen2MoeForCausalLM(
        T.Qwen2MoeConfig(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=32,
            **DECODER,
        )
    ),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(**DECODER)),
    "gpt2": lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, **COMMON)),
}


def tiny(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return FAMILIES[name]().eval()


def prompt(seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(seed))


def cache_keyword(model) -> str:
    """transformers 5.24 renamed the forward's ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(out):
    return out["cache"] if "cache" in out else out["past_key_values"]


def decode(call, model, ids: torch.Tensor, steps: int = STEPS):
    """Greedy decoding: the prompt, then ``steps`` calls of one token each with the cache the last
    call returned. Returns the tokens, each call's logits and the final cache."""
    keyword, logits, tokens = cache_keyword(model), [], []
    with torch.no_grad():
        out = call(input_ids=ids, use_cache=True)
        for _ in range(steps):
            logits.append(out.logits)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
            out = call(input_ids=tokens[-1], **{keyword: returned_cache(out)}, use_cache=True)
        logits.append(out.logits)
    return torch.cat(tokens, 1), logits, returned_cache(out)


def assert_same_cache(cache, expected) -> None:
    """The layers hold eager's tensors and counts (a sliding layer's ``cumulative_length``)."""
    assert len(cache.layers) == len(expected.layers)
    for layer, ref in zip(cache.layers, expected.layers):
        assert type(layer) is type(ref) and vars(layer).keys() == vars(ref).keys()
        for name, value in vars(ref).items():
            if isinstance(value, torch.Tensor):
                assert type(vars(layer)[name]) is torch.Tensor
                torch.testing.assert_close(vars(layer)[name], value, **TOL)
            else:
                assert vars(layer)[name] == value, name


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_decoding_with_the_returned_cache_matches_eager(name):
    model = tiny(name)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    expected_tokens, expected_logits, expected_cache = decode(eager, eager, prompt())
    tokens, logits, cache = decode(jmodel, model, prompt())
    torch.testing.assert_close(tokens, expected_tokens)
    for actual, expected in zip(logits, expected_logits, strict=True):
        torch.testing.assert_close(actual, expected, **TOL)
    assert_same_cache(cache, expected_cache)
    # The prompt, the first step, then the second cache length with the length symbolic, naming
    # what changed; the later steps reuse it (Gemma-2's sliding keys' strides change at that
    # step too, which made it compile once more when that hid the changed lengths).
    stats = thunder_rs.compile_stats(jmodel)
    compiles = 3
    assert (stats.calls, stats.cache_misses, stats.cache_hits, stats.evictions) == (
        STEPS + 1,
        compiles,
        STEPS + 1 - compiles,
        0,
    )
    assert stats.cache_misses < DEFAULT_CACHE_SIZE
    assert stats.miss_reasons[:2] == ["first call", "number of inputs changed from 2 to 3"]
    keyword = cache_keyword(model)
    for reason in stats.miss_reasons[2:]:
        assert re.match(rf"{keyword}\.layers\[\d\]\.\w+ changed from ", reason), reason


def test_compiled_entries_keep_no_finished_cache_alive():
    # A compiled entry must not keep a decode's cache (and the tensors of its layers) alive: it is
    # freed when the program drops it, as eager frees it (held by entries, 128 of them kept up to
    # 128 caches). A cache is keyed by its type, its layers guarded through their paths: a new
    # cache reuses the entries of the first.
    import gc  # noqa: PLC0415
    import weakref  # noqa: PLC0415

    model = tiny("llama")
    jmodel = thunder_rs.jit(model)
    caches = []
    for seed in range(3):
        tokens, logits, cache = decode(jmodel, model, prompt(seed), steps=2)
        caches.append(weakref.ref(cache))
        del tokens, logits, cache
    gc.collect()
    assert [ref() for ref in caches] == [None, None, None]
    stats = thunder_rs.compile_stats(jmodel)
    # The prompt, the first decode step, and the first cache's second step with the cache's length
    # symbolic, which the later caches use (each cache compiled its first step before).
    assert (stats.cache_misses, stats.cache_hits) == (3, 6) and len(jmodel._jfn._variants) < 5
    tokens, _, _ = decode(jmodel, model, prompt(0), steps=2)
    torch.testing.assert_close(tokens, decode(model, model, prompt(0), steps=2)[0])


def test_the_same_cache_length_again_runs_the_compiled_step():
    # A decode step whose cache has a length seen before (same cache object, the same tensor
    # metadata) hits: the layer's tensors are read from the cache at each call, not kept.
    model = tiny("llama")
    jmodel, keyword = thunder_rs.jit(model), cache_keyword(model)
    with torch.no_grad():
        cache = returned_cache(model(input_ids=prompt(), use_cache=True))
        saved = [(layer.keys, layer.values) for layer in cache.layers]
        for step in range(3):
            for layer, (keys, values) in zip(cache.layers, saved):  # back to the prompt's cache
                layer.keys, layer.values = keys + step, values - step
            ref_cache = copy.deepcopy(cache)
            token = torch.full((2, 1), 7 + step)
            actual = jmodel(input_ids=token, **{keyword: cache}).logits
            expected = model(input_ids=token, **{keyword: ref_cache}).logits
            torch.testing.assert_close(actual, expected, **TOL)
            assert_same_cache(cache, ref_cache)
    assert (thunder_rs.cache_misses(jmodel), thunder_rs.cache_hits(jmodel)) == (1, 2)


GENERATE = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)


def padded_prompt() -> dict:
    ids = prompt(1)
    mask = torch.ones_like(ids)
    ids[1, :2], mask[1, :2] = 0, 0  # the second text is shorter, padded on the left as generate wants
    return dict(input_ids=ids, attention_mask=mask)


def assert_generate_ran_compiled(jfn, compiles: int = 2) -> None:
    """Every forward ``generate`` made (the prompt and one per token but the last) was a
    compiled call: the prompt, then the first step with the lengths of the mask and of the cache
    the prompt filled symbolic (``dynamic.held_grown``), which the later steps reuse (the first
    step compiled with the cache's length constant, the second again, before). Gemma-2's window
    (4) is shorter than the prompt: its sliding keys are a slice of the prompt's, then of each
    step's, whose strides change at the second step (3)."""
    stats = thunder_rs.compile_stats(jfn)
    forwards = GENERATE["max_new_tokens"]
    assert (stats.calls, stats.cache_misses, stats.evictions) == (forwards, compiles, 0)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_generate_on_a_jitted_module_runs_compiled_forwards(name):
    model = tiny(name)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    expected = eager.generate(**padded_prompt(), **GENERATE)
    torch.testing.assert_close(jmodel.generate(**padded_prompt(), **GENERATE), expected)
    assert_generate_ran_compiled(jmodel, 3 if name == "gemma2" else 2)
    # The wrapped module's own calls are eager again afterwards.
    assert model.__dict__["_compiled_call_impl"] is None
    with torch.no_grad():
        model(**padded_prompt())
    assert thunder_rs.compile_stats(jmodel).calls == GENERATE["max_new_tokens"]


def test_generate_again_reuses_the_compiled_forwards():
    # Each generate makes a new cache: keyed by its type and guarded through its layers' paths,
    # it runs the entries the first generate compiled (it compiled once more per generate when
    # the cache was keyed by identity).
    model = tiny("llama")
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    for seed in (1, 2, 3):
        ids = prompt(seed)
        mask = torch.ones_like(ids)
        mask[0, :seed] = 0
        expected = eager.generate(input_ids=ids, attention_mask=mask, **GENERATE)
        torch.testing.assert_close(jmodel.generate(input_ids=ids, attention_mask=mask, **GENERATE), expected)
    stats = thunder_rs.compile_stats(jmodel)
    assert (stats.calls, stats.cache_misses) == (3 * GENERATE["max_new_tokens"], 2), stats.miss_reasons


@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_generate_after_compile_module_runs_compiled_forwards(name):
    model = tiny(name)
    eager = copy.deepcopy(model)
    thunder_rs.compile_module(model)
    expected = eager.generate(**padded_prompt(), **GENERATE)
    torch.testing.assert_close(model.generate(**padded_prompt(), **GENERATE), expected)
    assert_generate_ran_compiled(model._compiled_call_impl)


def test_generate_of_an_encoder_decoder_runs_compiled_forwards():
    # T5's EncoderDecoderCache marks each layer's cross-attention cache filled on the first step
    # (``cache.is_updated[i] = True``, an item of a dict of the argument): every call sets it again.
    torch.manual_seed(0)
    model = T.T5ForConditionalGeneration(
        T.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0, **COMMON)
    ).eval()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    torch.testing.assert_close(
        jmodel.generate(**padded_prompt(), **GENERATE), eager.generate(**padded_prompt(), **GENERATE)
    )
    # (the decoder's first token fills the cache, of one token: its second then its third compile)
    assert_generate_ran_compiled(jmodel, 3)


def test_beam_search_of_an_encoder_decoder_again_reuses_the_compiled_forwards():
    # Each generate makes a new EncoderDecoderCache holding two new DynamicCaches, read by the
    # decoder as cache.self_attention_cache: guarded through their paths, not by identity (every
    # generate compiled its prompt, first step and symbolic step again).
    torch.manual_seed(0)
    model = T.T5ForConditionalGeneration(
        T.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0, **COMMON)
    ).eval()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    beams = dict(GENERATE, num_beams=2)
    for seed in (1, 2):
        ids = prompt(seed)
        mask = torch.ones_like(ids)
        mask[1, -2:] = 0
        expected = eager.generate(input_ids=ids, attention_mask=mask, **beams)
        torch.testing.assert_close(jmodel.generate(input_ids=ids, attention_mask=mask, **beams), expected)
    stats = thunder_rs.compile_stats(jmodel)
    assert (stats.calls, stats.cache_misses) == (2 * GENERATE["max_new_tokens"], 3), stats.miss_reasons


def test_a_cache_that_makes_its_layers_in_the_call_is_refused_and_left_as_it_was():
    # DynamicCache() without a config appends a layer per model layer on the first update; a
    # compiled call would not append them again. DynamicCache(config=model.config) makes them first.
    model = tiny("llama")
    cache = T.DynamicCache()
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"changed the list (cache|past_key_values)\.layers, which it "
        r"reached through its arguments, leaving objects in it",
    ):
        with torch.no_grad():
            thunder_rs.jit(model)(input_ids=prompt(), **{cache_keyword(model): cache})
    assert cache.layers == []
    made_first = T.DynamicCache(config=model.config)
    ref_cache = T.DynamicCache(config=model.config)
    with torch.no_grad():
        actual = thunder_rs.jit(model)(input_ids=prompt(), **{cache_keyword(model): made_first}).logits
        expected = model(input_ids=prompt(), **{cache_keyword(model): ref_cache}).logits
    torch.testing.assert_close(actual, expected, **TOL)
    assert_same_cache(made_first, ref_cache)
