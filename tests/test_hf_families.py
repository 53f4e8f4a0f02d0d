"""More Hugging Face model families under thunder_rs.jit: two AdamW training steps next to an eager
copy, loss, logits and every gradient compared each step.

Tiny configs built in code (nothing downloaded). Decoder families get a causal-LM batch with a
padded second row; encoders a sequence-classification batch; encoder-decoders labels for the
decoder. Float64 where the family's kernels take it, to a tolerance that shows a wrong constant
(1e-10): MixtureOfExperts layers use grouped matrix products, which take no float64.
"""

import copy

import pytest
import torch

import thunder_rs

transformers = pytest.importorskip("transformers")
from test_hf_models import assert_grads_close  # noqa: E402

T = transformers

VOCAB, PAD, IMAGE = 99, 0, 98
IMAGE_TOKENS = 16  # one per patch of a 32-pixel image in patches of 8
COMMON = dict(vocab_size=VOCAB, pad_token_id=PAD)
DECODER = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    **COMMON,
)
DECODER_BODY = {k: v for k, v in DECODER.items() if k != "num_hidden_layers"}
ENCODER = dict(
    num_hidden_layers=2,
    num_attention_heads=2,
    hidden_size=32,
    intermediate_size=64,
    max_position_embeddings=64,
    num_labels=3,
    **COMMON,
)
TOLERANCES = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}

pytestmark = pytest.mark.usefixtures("one_thread")


def _families():
    """name -> (model class, config, kind of batch, dtype)."""
    return {**_decoders(), **_encoders()}


def _decoders():
    f64 = torch.float64
    return {
        "mistral": (
            T.MistralForCausalLM,
            T.MistralConfig(num_key_value_heads=2, sliding_window=4, **DECODER),
            "lm",
            f64,
        ),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(num_key_value_heads=2, **DECODER), "lm", f64),
        "phi": (T.PhiForCausalLM, T.PhiConfig(**DECODER), "lm", f64),
        "gemma": (T.GemmaForCausalLM, T.GemmaConfig(num_key_value_heads=1, head_dim=8, **DECODER), "lm", f64),
        "gpt_neox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig(**DECODER), "lm", f64),
        "stablelm": (T.StableLmForCausalLM, T.StableLmConfig(num_key_value_heads=2, **DECODER), "lm", f64),
        "opt": (
            T.OPTForCausalLM,
            T.OPTConfig(
                num_hidden_layers=2,
                num_attention_heads=4,
                hidden_size=32,
                ffn_dim=64,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
                **COMMON,
            ),
            "lm",
            f64,
        ),
        "bloom": (T.BloomForCausalLM, T.BloomConfig(n_layer=2, n_head=4, hidden_size=32, **COMMON), "lm", f64),
        "falcon": (
            T.FalconForCausalLM,
            T.FalconConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, **COMMON),
            "lm",
            f64,
        ),
        "gptj": (
            T.GPTJForCausalLM,
            T.GPTJConfig(
                n_layer=2, n_head=4, n_embd=32, rotary_dim=4, n_positions=64, bos_token_id=1, eos_token_id=2, **COMMON
            ),
            "lm",
            f64,
        ),
        "mixtral": (
            T.MixtralForCausalLM,
            T.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **DECODER),
            "lm",
            torch.float32,
        ),
        **_routed_and_recurrent(),
    }


def _routed_and_recurrent():
    """Decoders of constructs the others lack."""
    f64 = torch.float64
    return {
        # Latent attention (low-rank queries, keys and values) and routing by the best experts of
        # the best groups of them.
        "deepseek_v3": (
            T.DeepseekV3ForCausalLM,
            T.DeepseekV3Config(
                moe_intermediate_size=16,
                n_routed_experts=8,
                num_experts_per_tok=2,
                n_group=2,
                topk_group=1,
                n_shared_experts=1,
                first_k_dense_replace=1,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_rope_head_dim=4,
                qk_nope_head_dim=8,
                v_head_dim=8,
                **DECODER,
            ),
            "lm",
            torch.float32,
        ),
        # A recurrence over the sequence (RG-LRU) with a gradient clipped by a custom autograd.Function.
        "recurrent_gemma": (
            T.RecurrentGemmaForCausalLM,
            T.RecurrentGemmaConfig(
                num_hidden_layers=3, num_key_value_heads=2, lru_width=32, attention_window_size=4, **DECODER_BODY
            ),
            "lm",
            f64,
        ),
    }


def _encoders():
    """Sequence classifiers and encoder-decoders."""
    f64 = torch.float64
    return {
        "roberta": (T.RobertaForSequenceClassification, T.RobertaConfig(**{**ENCODER, "pad_token_id": 1}), "cls", f64),
        "distilbert": (
            T.DistilBertForSequenceClassification,
            T.DistilBertConfig(
                n_layers=2, n_heads=2, dim=32, hidden_dim=64, max_position_embeddings=64, num_labels=3, **COMMON
            ),
            "cls",
            f64,
        ),
        "deberta": (
            T.DebertaForSequenceClassification,
            T.DebertaConfig(relative_attention=True, max_relative_positions=16, pos_att_type=["c2p", "p2c"], **ENCODER),
            "cls",
            f64,
        ),
        "albert": (T.AlbertForSequenceClassification, T.AlbertConfig(embedding_size=16, **ENCODER), "cls", f64),
        # sliding-window chunks: a chunk count computed as a tensor read as sizes, as_strided of a view
        "longformer": (
            T.LongformerForSequenceClassification,
            T.LongformerConfig(attention_window=4, **{**ENCODER, "pad_token_id": 1}),
            "cls",
            f64,
        ),
        # image features merged into the text by masked_scatter; get_input_embeddings compares
        # getattr(self, "language_model") with self
        "llava": (
            T.LlavaForConditionalGeneration,
            T.LlavaConfig(
                vision_config=T.CLIPVisionConfig(
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    intermediate_size=64,
                    image_size=32,
                    patch_size=8,
                ),
                text_config=T.LlamaConfig(**{**DECODER, "num_attention_heads": 2}),
                image_token_index=IMAGE,
                vision_feature_layer=-1,
            ),
            "image_lm",
            f64,
        ),
        "t5": (
            T.T5ForConditionalGeneration,
            T.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, decoder_start_token_id=0, **COMMON),
            "seq2seq",
            f64,
        ),
        "bart": (
            T.BartForConditionalGeneration,
            T.BartConfig(
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                d_model=32,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                max_position_embeddings=64,
                **COMMON,
            ),
            "seq2seq",
            f64,
        ),
    }


FAMILIES = _families()


def _tokens(seed: int, length: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length - 3 :] = 0  # the second text is padded on the right
    return ids, mask


def _batch(kind: str, seed: int) -> dict:
    ids, mask = _tokens(seed, 8)
    if kind == "lm":
        return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    if kind == "image_lm":
        ids = torch.cat([torch.full((2, IMAGE_TOKENS), IMAGE), ids.masked_fill(ids == IMAGE, 3)], 1)
        mask = torch.cat([torch.ones(2, IMAGE_TOKENS, dtype=torch.long), mask], 1)
        pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels, labels=ids.masked_fill(mask == 0, -100))
    if kind == "cls":
        return dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    return dict(input_ids=ids, attention_mask=mask, labels=_tokens(seed + 7, 6)[0])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_trains_like_eager(name):
    cls, config, kind, dtype = FAMILIES[name]
    torch.manual_seed(0)
    model = cls(config).to(dtype).train()
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, eager)]
    tol = TOLERANCES[dtype]
    for step in range(2):
        batch = _batch(kind, step)
        outs = []
        for fn, opt in ((jmodel, optimizers[0]), (eager, optimizers[1])):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)  # dropout draws the same masks
            out = fn(**batch)
            out.loss.backward()
            outs.append(out)
        torch.testing.assert_close(outs[0].loss, outs[1].loss, **tol)
        torch.testing.assert_close(outs[0].logits, outs[1].logits, **tol)
        assert_grads_close(model, eager, tol)
        for opt in optimizers:
            opt.step()
