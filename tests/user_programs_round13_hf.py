"""The generation programs of ``test_user_programs_round13.py``: transformers models (tiny configs
built in code) stepped by a user's loop or ``generate``, with the model compiled: Whisper's
``EncoderDecoderCache`` stepped by hand, a ``DynamicCache`` cropped between calls (a speculative
decoder's rejected positions) and reordered between calls (a beam search's), a ``StaticCache``
reset between prompts, Mistral's sliding window generated past the window, a beam search generated
on a jitted Llama, and transformers 4's tuples as ``past_key_values``. Each returns the logits,
tokens and the cache's tensors after."""

import torch

transformers = __import__("transformers")
T = transformers
COMMON = dict(vocab_size=61, pad_token_id=0, bos_token_id=1, eos_token_id=2)
BODY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_size=32,
    intermediate_size=48,
    max_position_embeddings=64,
    **COMMON,
)


def _layers(cache) -> list:
    """The keys and values each layer of ``cache`` holds, cloned."""
    if isinstance(cache, T.EncoderDecoderCache):
        return _layers(cache.self_attention_cache) + _layers(cache.cross_attention_cache)
    return [t.clone() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None]


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(**BODY)).eval()


def whisper_encoder_decoder_cache(compile_it) -> list:
    """Whisper's decoder stepped over an ``EncoderDecoderCache``, the encoder run once."""
    torch.manual_seed(0)
    config = T.WhisperConfig(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_mel_bins=8,
        max_source_positions=8,
        max_target_positions=16,
        decoder_start_token_id=1,
        **COMMON,
    )
    model = T.WhisperForConditionalGeneration(config).eval()
    run, seen = compile_it(model), []
    with torch.no_grad():
        encoded = model.model.encoder(torch.randn(1, 8, 16))
        cache = T.EncoderDecoderCache(T.DynamicCache(config=config), T.DynamicCache(config=config))
        ids = torch.tensor([[1, 5, 7]])
        for _ in range(4):
            out = run(decoder_input_ids=ids, encoder_outputs=encoded, past_key_values=cache, use_cache=True)
            ids = out.logits[:, -1:].argmax(-1)
            seen += [out.logits, ids]
    return seen + _layers(cache)


def dynamic_cache_cropped_between_calls(compile_it) -> list:
    """A speculative decoder's loop: drafts of three tokens, the cache cropped back to the
    accepted length (``DynamicCache.crop``) between the calls."""
    model = _llama()
    run, seen = compile_it(model), []
    cache = T.DynamicCache(config=model.config)
    with torch.no_grad():
        out = run(torch.tensor([[1, 9, 4, 7]]), past_key_values=cache)
        for accepted in (1, 3, 0, 2, 2):
            draft = torch.randint(3, 61, (1, 3))
            out = run(draft, past_key_values=cache)
            seen.append(out.logits)
            if accepted < 3:
                cache.crop(accepted - 3)  # (the rejected positions, counted from the end)
            seen += [cache.get_seq_length(), *_layers(cache)]
    return seen


def dynamic_cache_reordered_between_calls(compile_it) -> list:
    """A beam search by hand: the cache's rows reordered (``reorder_cache``) between the steps."""
    model = _llama()
    run, seen = compile_it(model), []
    cache = T.DynamicCache(config=model.config)
    with torch.no_grad():
        ids = torch.tensor([[1, 9, 4], [1, 8, 3]])
        for beams in ([0, 1], [1, 1], [1, 0], [0, 0]):
            out = run(ids, past_key_values=cache)
            cache.reorder_cache(torch.tensor(beams))
            ids = out.logits[:, -1:].argmax(-1)
            seen += [out.logits, ids]
    return seen + _layers(cache)


def static_cache_reset_between_prompts(compile_it) -> list:
    """A ``StaticCache`` filled by one prompt's decode, reset, then filled by another prompt."""
    model = _llama()
    run, seen = compile_it(model), []
    cache = T.StaticCache(config=model.config, max_cache_len=12)
    with torch.no_grad():
        for prompt in ([[1, 9, 4, 7]], [[1, 3]]):
            cache.reset()
            ids, position = torch.tensor(prompt), 0
            for _ in range(3):
                positions = torch.arange(position, position + ids.shape[1])
                out = run(ids, past_key_values=cache, cache_position=positions)
                position += ids.shape[1]
                ids = out.logits[:, -1:].argmax(-1)
                seen += [out.logits, ids]
    return seen + _layers(cache)


def sliding_window_generate_past_the_window(compile_it) -> list:
    """Mistral's sliding window (4) generated on past it, greedy, with its cache returned."""
    torch.manual_seed(0)
    model = T.MistralForCausalLM(T.MistralConfig(sliding_window=4, **BODY)).eval()
    model.forward = compile_it(model.forward)
    out = model.generate(
        torch.tensor([[1, 9, 4, 7, 5, 6]]),
        max_new_tokens=6,
        do_sample=False,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return [out.sequences, *out.logits, *_layers(out.past_key_values)]


def beam_search_generate(compile_it) -> list:
    """A beam search (three beams, two prompts of other lengths, left padded) on a jitted Llama."""
    model = _llama()
    model.forward = compile_it(model.forward)
    out = model.generate(
        input_ids=torch.tensor([[0, 1, 9, 4], [1, 8, 3, 5]]),
        attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]),
        max_new_tokens=5,
        num_beams=3,
        do_sample=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    return [out.sequences, out.sequences_scores, *out.scores]


def legacy_tuple_past_key_values(compile_it) -> list:
    """A cache handed over as transformers 4's tuples of keys and values: eager's error, then the
    same tuples made into a ``DynamicCache`` and stepped."""
    model = _llama()
    run, seen = compile_it(model), []
    with torch.no_grad():
        out = model(torch.tensor([[1, 9, 4]]), use_cache=True)
        legacy = tuple((layer.keys, layer.values) for layer in out.past_key_values.layers)
        try:
            run(torch.tensor([[5]]), past_key_values=legacy)
        except AttributeError as e:
            seen.append(str(e))
        cache = T.DynamicCache(legacy, config=model.config)
        for token in (5, 8):
            seen.append(run(torch.tensor([[token]]), past_key_values=cache).logits)
    return seen + _layers(cache)
