"""``generate`` on a jitted Hugging Face decoder as users call it around the model, next to eager:
under ``torch.inference_mode``, then again outside it, then a training step on what it generated
(tokens, every step's logits and the gradients bit for bit); and the model's forward compiled by
``torch.compile(backend="thunder_rs")`` for greedy, beam and sampled decoding with the dynamic and
the static cache, bit for bit as Dynamo's own ``backend="eager"`` (transformers takes other paths
when it is told it is compiled: pure eager differs from both in float32's last bits), each of its
at most three graphs compiled once over 32 tokens. Tiny configs built in code.

What differed: under ``inference_mode`` the prompt's compile raised torch's "Inference tensors do
not track version counter" (the first call's outputs, computed while tracing the mask's read,
were checked against the inputs' versions)."""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("transformers 5's generation", allow_module_level=True)

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:thunder_rs.*recompiled"),
]
T = transformers
VOCAB = 99
EXACT = dict(rtol=0, atol=0)
SLOW = pytest.mark.slow  # (Dynamo's tracing: 16 s for llama's greedy 32 tokens)
DECODERS = {
    "llama": lambda: T.LlamaForCausalLM(
        T.LlamaConfig(
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=32,
            intermediate_size=64,
            max_position_embeddings=128,
            vocab_size=VOCAB,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    ),
    "gpt2": lambda: T.GPT2LMHeadModel(
        T.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=128, vocab_size=VOCAB, pad_token_id=0)
    ),
}
OPTIONS = dict(max_new_tokens=8, pad_token_id=0, eos_token_id=None, return_dict_in_generate=True, output_logits=True)


def _prompts() -> dict:
    """Three prompts of 7, 4 and 6 tokens, padded on the left."""
    ids = torch.randint(3, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for row, pads in ((1, 3), (2, 1)):
        ids[row, :pads], mask[row, :pads] = 0, 0
    return dict(input_ids=ids, attention_mask=mask)


def _generate_then_train(model, call) -> list:
    with torch.inference_mode():
        first = call.generate(**_prompts(), **OPTIONS)
    again = call.generate(**_prompts(), num_beams=2, **OPTIONS)
    loss = call(input_ids=again.sequences, labels=again.sequences).loss
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    return [first.sequences, *first.logits, again.sequences, *again.logits, loss, *grads]


@pytest.mark.parametrize("name", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_generate_under_inference_mode_then_outside_it_then_training_is_eagers(name):
    torch.manual_seed(0)
    model = DECODERS[name]().eval()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    actual, expected = _generate_then_train(model, jmodel), _generate_then_train(eager, eager)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, **EXACT, msg=lambda m, i=i: f"value {i}: {m}")


def _compiled_generate(name: str, backend: str, options: dict) -> tuple[list, list]:
    """32 tokens from the model with its forward compiled by Dynamo for ``backend``; what it
    generated, and how often thunder_rs compiled each graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = DECODERS[name]().eval()
    model.forward = torch.compile(model.forward, backend=backend)
    torch.manual_seed(3)
    out = model.generate(**_prompts(), **dict(OPTIONS, max_new_tokens=32), **options)
    compiles = [thunder_rs.compile_stats(g.jitted).cache_misses for g in thunder_rs.dynamo.compiled_graphs()]
    return [out.sequences, *out.logits], compiles


COMPILED_OPTIONS = {
    "greedy": {},
    "beams": dict(num_beams=3),
    "static_sampled": dict(cache_implementation="static", do_sample=True, repetition_penalty=1.3),
}


@pytest.mark.parametrize(
    "name, options",
    [
        pytest.param(name, options, id=f"{name}-{kind}", marks=SLOW)
        for name in DECODERS
        for kind, options in COMPILED_OPTIONS.items()
    ],
)
def test_generate_with_the_forward_compiled_by_dynamo_is_dynamos_eager(name, options):
    actual, compiles = _compiled_generate(name, "thunder_rs", options)
    expected, _ = _compiled_generate(name, "eager", options)
    assert len(actual) == len(expected) == 33
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, **EXACT, msg=lambda m, i=i: f"value {i}: {m}")
    assert 1 <= len(compiles) <= 3 and set(compiles) == {1}, compiles
