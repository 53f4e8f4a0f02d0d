"""``generate`` on a jitted Hugging Face decoder as users call it around the model, next to eager:
under ``torch.inference_mode``, then again outside it, then a training step on what it generated
(tokens, every step's logits and the gradients bit for bit). Tiny configs built in code.

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
