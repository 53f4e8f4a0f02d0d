"""``generate`` on jitted Hugging Face decoders as a user calls it: the default DynamicCache, a
batch of prompts of different lengths padded on the left, greedy and sampled decoding of 32 new
tokens, every step's logits compared with eager's bit for bit (float32), and the compiles counted
(issue 26: a growing cache must not compile per token). Tiny configs built in code.

What differed: transformers' SDPA attention packs a single query's grouped heads (``pack_gqa``)
unless it is told it is being compiled, when it repeats the keys' heads instead; thunder_rs
answered ``is_compiling()`` True there too, so GQA models (Llama, Mistral, Qwen2, Gemma) decoded
with other kernels than eager's: logits differing in float32's last bits from the first step with
a padding mask (``torch_overrides.EAGER_ANSWERS``)."""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's attention interface", allow_module_level=True)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
]
T = transformers
VOCAB = 99
BODY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=128,
    vocab_size=VOCAB,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
DECODERS = {
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **BODY)),
    "mistral": lambda: T.MistralForCausalLM(T.MistralConfig(num_key_value_heads=2, sliding_window=8, **BODY)),
    "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(num_key_value_heads=2, **BODY)),
    "gemma": lambda: T.GemmaForCausalLM(T.GemmaConfig(num_key_value_heads=1, head_dim=8, **BODY)),
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**BODY)),
    "phi": lambda: T.PhiForCausalLM(T.PhiConfig(**BODY)),
    "gpt2": lambda: T.GPT2LMHeadModel(
        T.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=128, vocab_size=VOCAB, pad_token_id=0)
    ),
}


def _prompts() -> dict:
    """Three prompts of 7, 4 and 6 tokens, padded on the left."""
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for row, pads in ((1, 3), (2, 1)):
        ids[row, :pads], mask[row, :pads] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def _fast_but(fast: str) -> list:
    return [n if n == fast else pytest.param(n, marks=pytest.mark.slow) for n in DECODERS]


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", _fast_but("llama"))
def test_generate_gives_eagers_tokens_and_logits_bit_for_bit_in_two_compiles(name, sampled):
    torch.manual_seed(0)
    model = DECODERS[name]().eval()
    eager, jmodel = copy.deepcopy(model), thunder_rs.jit(model)
    options = dict(max_new_tokens=32, do_sample=sampled, eos_token_id=None, pad_token_id=0)
    options.update(return_dict_in_generate=True, output_logits=True)
    if sampled:
        options.update(top_k=20, temperature=0.9)
    torch.manual_seed(5)
    expected = eager.generate(**_prompts(), **options)
    torch.manual_seed(5)
    got = jmodel.generate(**_prompts(), **options)
    torch.testing.assert_close(got.sequences, expected.sequences, rtol=0, atol=0)
    assert len(got.logits) == len(expected.logits) == 32
    for step, (g, e) in enumerate(zip(got.logits, expected.logits)):
        torch.testing.assert_close(g, e, rtol=0, atol=0, msg=lambda m, step=step: f"step {step}: {m}")
    # the prompt, then the steps with the lengths of the mask and of the cache the prompt filled
    # symbolic; Mistral's window (8) is full from the first step (the prompt's 7 tokens): its
    # keys are a slice of the prompt's, then of each step's, whose strides change at the second
    stats = thunder_rs.compile_stats(jmodel)
    assert stats.cache_misses == (3 if name == "mistral" else 2), stats.miss_reasons
