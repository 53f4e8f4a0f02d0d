"""``F.multi_head_attention_forward`` decomposed (``thunder_rs/torch/multihead_attention.py``)
against eager: ``nn.MultiheadAttention`` over its arguments (outputs, weights and every
gradient), the function's own arguments the module does not pass (``static_k``), torchvision's
VisionTransformer trained a few steps and ``nn.TransformerEncoderLayer`` over changing lengths."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.torch.symbols import ltorch
from twin_training import train_like_eager

L, S, N, E, HEADS = 5, 6, 3, 8, 2


def _causal(n: int, boolean: bool):
    if boolean:
        return torch.ones(n, n, dtype=torch.bool).triu(1)
    return nn.Transformer.generate_square_subsequent_mask(n)


def _inputs(case: dict, dtype, batch_first: bool):
    """query, key and value (one tensor for self-attention) and the call's masks."""
    g = torch.Generator().manual_seed(1)
    self_attn = case.get("self", False)
    src = L if self_attn else S
    lay = (lambda n, d: (N, n, d)) if batch_first else (lambda n, d: (n, N, d))
    query = torch.randn(lay(L, E), generator=g, dtype=dtype)
    if self_attn:
        key = value = query
    else:
        key = torch.randn(lay(S, case.get("kdim", E)), generator=g, dtype=dtype)
        value = key if case.get("kv_same") else torch.randn(lay(S, case.get("vdim", E)), generator=g, dtype=dtype)
    kwargs = {k: case[k] for k in ("need_weights", "average_attn_weights", "is_causal") if k in case}
    pad = case.get("key_padding_mask")
    if pad is not None:
        mask = torch.zeros(N, src, dtype=torch.bool)
        mask[0, -2:] = True
        mask[2, 0] = True
        kwargs["key_padding_mask"] = mask if pad == "bool" else torch.zeros(N, src, dtype=dtype).masked_fill(mask, -1e4)
    attn = case.get("attn_mask")
    if attn == "causal":
        kwargs["attn_mask"] = _causal(L, False).to(dtype)
    elif attn is not None:
        rank, kind = attn
        mask = torch.rand((N * HEADS, L, src) if rank == 3 else (L, src), generator=g) > 0.7
        mask[..., 0] = False  # every query sees a key
        kwargs["attn_mask"] = mask if kind == "bool" else torch.randn(mask.shape, generator=g, dtype=dtype)
    return (query, key, value), kwargs


def _leaves(inputs):
    """Fresh leaves requiring grad, one per distinct input tensor (self-attention keeps its identity)."""
    copies = {}
    return tuple(copies.setdefault(id(x), x.detach().clone().requires_grad_()) for x in inputs)


CASES = {
    "plain": {},
    "batch_first": {"batch_first": True},
    "self": {"self": True},
    "key_is_value": {"kv_same": True},
    "kdim_vdim": {"kdim": 4, "vdim": 6},
    "no_bias": {"bias": False},
    "bias_kv": {"add_bias_kv": True},
    "zero_attn": {"add_zero_attn": True},
    "bias_kv_zero_attn_masks": {
        "add_bias_kv": True,
        "add_zero_attn": True,
        "key_padding_mask": "bool",
        "attn_mask": (2, "bool"),
    },
    "padding_bool": {"key_padding_mask": "bool"},
    "padding_float": {"key_padding_mask": "float"},
    "mask_2d_bool": {"attn_mask": (2, "bool")},
    "mask_2d_float": {"attn_mask": (2, "float")},
    "mask_3d_bool": {"attn_mask": (3, "bool")},
    "mask_3d_float": {"attn_mask": (3, "float"), "key_padding_mask": "float"},
    "causal_weights": {"self": True, "attn_mask": "causal", "is_causal": True},
    "causal_no_weights": {"self": True, "attn_mask": "causal", "is_causal": True, "need_weights": False},
    "causal_padding_no_weights": {
        "self": True,
        "attn_mask": "causal",
        "is_causal": True,
        "need_weights": False,
        "key_padding_mask": "float",
    },
    "no_weights": {"need_weights": False, "key_padding_mask": "bool", "attn_mask": (2, "bool")},
    "no_weights_3d": {"need_weights": False, "attn_mask": (3, "float")},
    "per_head_weights": {"average_attn_weights": False, "attn_mask": (3, "bool")},
    "dropout": {"dropout": 0.3},
    "dropout_no_weights": {"dropout": 0.3, "need_weights": False, "key_padding_mask": "float"},
    "dropout_self_no_weights": {"dropout": 0.3, "self": True, "need_weights": False},
}

_MODULE_ARGS = ("batch_first", "kdim", "vdim", "bias", "add_bias_kv", "add_zero_attn", "dropout")


def _check_like_eager(module, inputs, kwargs, seed: int, **tol):
    """The jitted module's outputs and every gradient equal eager's, the random state seeded alike."""
    module.zero_grad(set_to_none=True)
    eager = copy.deepcopy(module)
    jitted = thunder_rs.jit(module)
    ours, theirs = _leaves(inputs), _leaves(inputs)
    torch.manual_seed(seed)
    out, weights = jitted(*ours, **kwargs)
    torch.manual_seed(seed)
    expected, expected_weights = eager(*theirs, **kwargs)
    torch.testing.assert_close(out, expected, **tol)
    if expected_weights is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, expected_weights, **tol)
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    loss = (out * probe).sum() + (0 if weights is None else (weights * weights).sum())
    expected_loss = (expected * probe).sum() + (0 if weights is None else (expected_weights * expected_weights).sum())
    loss.backward()
    expected_loss.backward()
    for (name, p), q in zip(module.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name, **tol)
    for i, (x, y) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(x.grad, y.grad, msg=f"input {i}", **tol)
    assert thunder_rs.examine(module, *ours, **kwargs).fallbacks == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_module_like_eager(name, dtype):
    case = CASES[name]
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, **{k: case[k] for k in _MODULE_ARGS if k in case}, dtype=dtype)
    inputs, kwargs = _inputs(case, dtype, case.get("batch_first", False))
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    for seed in (0, 1) if "dropout" in case else (0,):
        _check_like_eager(module, inputs, kwargs, seed, **tol)


@pytest.mark.parametrize("name", ["plain", "mask_3d_float", "no_weights"])
def test_bfloat16_like_eager(name):
    case = CASES[name]
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, dtype=torch.bfloat16)
    inputs, kwargs = _inputs(case, torch.bfloat16, False)
    _check_like_eager(module, inputs, kwargs, 0, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("need_weights", [True, False])
def test_eval_without_grad_like_eager_fast_path(need_weights):
    """In evaluation without grad eager takes its fused fast path (``torch._native_multi_head_attention``),
    which the trace runs too: bit for bit eager's."""
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, dropout=0.5, batch_first=True).eval()
    x = torch.randn(N, L, E)
    mask = torch.zeros(N, L, dtype=torch.bool)
    mask[1, -1] = True
    jitted = thunder_rs.jit(module)
    with torch.no_grad():
        out, weights = jitted(x, x, x, key_padding_mask=mask, need_weights=need_weights)
        expected, expected_weights = module(x, x, x, key_padding_mask=mask, need_weights=need_weights)
        assert thunder_rs.examine(module, x, x, x, key_padding_mask=mask).fallbacks == {}
    assert torch.equal(out, expected)
    if need_weights:
        assert torch.equal(weights, expected_weights)
    else:
        assert weights is None


def test_unbatched_like_eager():
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, add_bias_kv=True)
    q, k = torch.randn(L, E), torch.randn(S, E)
    pad = torch.zeros(S, dtype=torch.bool)
    pad[-1] = True
    mask = torch.rand(HEADS, L, S) > 0.8
    _check_like_eager(module, (q, k, k), {"key_padding_mask": pad, "attn_mask": mask}, 0, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("need_weights", [True, False])
def test_static_keys_and_separate_weights_like_eager(need_weights):
    """Arguments the module never passes: ``static_k``/``static_v`` with separate projection weights."""
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    query, key = leaf(L, N, E), leaf(S, N, E)
    static_k, static_v = leaf(N * HEADS, 7, E // HEADS), leaf(N * HEADS, 7, E // HEADS)
    weights = [leaf(E, E) for _ in range(4)]
    in_bias, out_bias = leaf(3 * E), leaf(E)
    args = (query, key, static_k, static_v, in_bias, out_bias, *weights)

    def fn(query, key, static_k, static_v, in_bias, out_bias, wq, wk, wv, wo):
        out, w = F.multi_head_attention_forward(
            query, key, key, E, HEADS, None, in_bias, None, None, True, 0.2, wo, out_bias,
            need_weights=need_weights, use_separate_proj_weight=True, q_proj_weight=wq, k_proj_weight=wk,
            v_proj_weight=wv, static_k=static_k, static_v=static_v,
        )  # fmt: skip
        return out if w is None else out + w.sum(-1, keepdim=True).transpose(0, 1)[..., :1]

    torch.manual_seed(3)
    out = thunder_rs.jit(fn)(*args)
    grads = torch.autograd.grad(out.square().sum(), args, allow_unused=True)
    torch.manual_seed(3)
    expected = fn(*args)
    expected_grads = torch.autograd.grad(expected.square().sum(), args, allow_unused=True)
    torch.testing.assert_close(out, expected)
    for i, (a, b) in enumerate(zip(grads, expected_grads)):
        torch.testing.assert_close(a, b, msg=f"argument {i}")
    assert thunder_rs.examine(fn, *args).fallbacks == {}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_vision_transformer_trains_like_eager(dropout):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=10,
        dropout=dropout, attention_dropout=dropout,
    )  # fmt: skip
    batches = [torch.randn(2, 3, 32, 32) for _ in range(3)]
    jmodel = train_like_eager(model, batches, atol=1e-5, rtol=1e-4)
    assert thunder_rs.examine(model, batches[0]).fallbacks == {}
    assert thunder_rs.compile_stats(jmodel).cache_misses == 1


@pytest.mark.parametrize("train", [True, False])
def test_encoder_layer_over_changing_lengths(train):
    """Two compiles over three lengths: the second keeps the length symbolic."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    layer.train(train)
    batches = [torch.randn(2, n, 16) for n in (5, 7, 9)]
    if train:
        jlayer = train_like_eager(layer, batches, atol=1e-5, rtol=1e-4)
    else:
        jlayer = thunder_rs.jit(layer)
        with torch.no_grad():
            for x in batches:
                torch.testing.assert_close(jlayer(x), layer(x), atol=1e-5, rtol=1e-4)
    assert thunder_rs.compile_stats(jlayer).cache_misses == 2
    assert jlayer._jfn._dynamic_off is None
    assert thunder_rs.examine(layer, batches[0]).fallbacks == {}


def test_autocast_runs_eagerly_like_eager():
    """Under autocast each op inside eager's Python function takes its own policy: the call runs eagerly."""
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, batch_first=True)
    x = torch.randn(N, L, E)

    def fn(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return module(x, x, x)

    out, weights = thunder_rs.jit(fn)(x)
    expected, expected_weights = fn(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert list(thunder_rs.examine(fn, x).fallbacks) == [
        "torch.nn.functional.multi_head_attention_forward.autocast_cpu_bfloat16.replayable"
    ]


@pytest.mark.gpu
def test_cuda_autocast_runs_eagerly_like_eager():
    """The same under CUDA float16 autocast (the CPU sweep of autocast policies leaves this op out:
    without a GPU torch turns CUDA autocast off where the fallback computes its dtypes)."""
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, batch_first=True).cuda()
    x = torch.randn(N, L, E, device="cuda")

    def fn(x):
        with torch.autocast("cuda", dtype=torch.float16):
            return module(x, x, x)

    out, weights = thunder_rs.jit(fn)(x)
    expected, expected_weights = fn(x)
    assert (out.dtype, weights.dtype) == (expected.dtype, expected_weights.dtype)
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


def test_a_refused_call_runs_eagerly(monkeypatch):
    """A symbol inside that refuses its arguments sends the whole call to eager's function."""

    def refuse(*args, **kwargs):
        raise ThunderNotImplementedError("ltorch.bmm: refused for the test")

    monkeypatch.setattr(ltorch, "bmm", refuse)
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, dropout=0.2)
    inputs, kwargs = _inputs({"key_padding_mask": "bool"}, torch.float32, False)
    eager = copy.deepcopy(module)
    torch.manual_seed(5)
    out, weights = thunder_rs.jit(module)(*inputs, **kwargs)
    torch.manual_seed(5)
    expected, expected_weights = eager(*inputs, **kwargs)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert list(thunder_rs.examine(module, *inputs, **kwargs).fallbacks) == [
        "torch.nn.functional.multi_head_attention_forward.replayable"
    ]


def test_weights_and_masks_over_changing_lengths():
    """The weights path with both masks, ``bias_k`` and a zero key, over three lengths: two compiles."""
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, HEADS, batch_first=True, add_bias_kv=True, add_zero_attn=True)
    jitted = thunder_rs.jit(module)
    for n in (5, 7, 9):
        x = torch.randn(N, n, E)
        pad = torch.zeros(N, n, dtype=torch.bool)
        pad[0, -1] = True
        mask = torch.rand(n, n) > 0.8
        out, weights = jitted(x, x, x, key_padding_mask=pad, attn_mask=mask)
        expected, expected_weights = module(x, x, x, key_padding_mask=pad, attn_mask=mask)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(weights, expected_weights)
    assert thunder_rs.compile_stats(jitted).cache_misses == 2
    assert jitted._jfn._dynamic_off is None
