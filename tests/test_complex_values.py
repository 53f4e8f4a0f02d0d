"""Complex values in the trace: ``torch.polar``, ``torch.complex``, ``view_as_complex``,
``view_as_real`` and complex ``mul`` (between real and complex tensors too) are traced natively,
forward and backward, where they ran as eager fallbacks; outputs and gradients are eager's bit
for bit (torch's conjugate convention: ``mul``'s gradient is ``g * conj(other)``, ``polar``'s is
``polar_backward``), as Meta's Llama computes rotary embeddings."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thunder_rs

from test_native_ops_round2 import check_bit_equal


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis, x):
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    """Meta's Llama attention (without its KV cache): rotary embeddings by a complex buffer."""

    def __init__(self, dim: int = 32, n_heads: int = 4, max_seq_len: int = 16):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, max_seq_len), persistent=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq, xk, xv = (w(x).view(bsz, seqlen, self.n_heads, self.head_dim) for w in (self.wq, self.wk, self.wv))
        xq, xk = apply_rotary_emb(xq, xk, self.freqs_cis[:seqlen])
        xq, xk, xv = (t.transpose(1, 2) for t in (xq, xk, xv))
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)
        scores = F.softmax(scores.float() + mask, dim=-1).type_as(xq)
        out = torch.matmul(scores, xv).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)


def _training_step(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(x).pow(2).mean()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]


def test_llama_rotary_attention_training_step_matches_eager():
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(2, 7, 32)
    twin = Attention()
    twin.load_state_dict(model.state_dict())
    assert thunder_rs.examine(model, x).fallbacks == {}
    expected, actual = _training_step(model, x), _training_step(thunder_rs.jit(twin), x)
    assert torch.equal(actual[0], expected[0])
    for a, e in zip([*actual[1], *actual[2]], [*expected[1], *expected[2]], strict=True):
        assert torch.equal(a, e)


def rotary(x, angles, magnitudes):
    freqs_cis = torch.polar(magnitudes, angles)
    x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * freqs_cis.view(1, x_.shape[1], 1, x_.shape[-1])).flatten(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rotary_through_polar_is_native_with_eagers_gradients(dtype):
    """Gradients reach the angles and magnitudes (a zero one too: ``sgn(0)`` is 0) of ``polar``."""
    x = torch.randn(2, 5, 3, 8, dtype=dtype, requires_grad=True)
    angles = torch.randn(5, 4, dtype=dtype, requires_grad=True)
    magnitudes = torch.rand(5, 4, dtype=dtype)
    magnitudes[0, 0] = 0
    check_bit_equal(rotary, x, angles, magnitudes.requires_grad_())


def check_complex_bit_equal(fn, *args) -> None:
    """``fn``'s output (complex) under ``jit`` equals eager's bit for bit with no eager fallback,
    and so do the gradients of the inputs that require grad, from one complex cotangent."""
    assert thunder_rs.examine(fn, *args).fallbacks == {}
    expected, actual = fn(*args), thunder_rs.jit(fn)(*args)
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()
    leaves = [a for a in args if a.requires_grad]
    cotangent = torch.randn_like(expected)
    for e, a in zip(torch.autograd.grad(expected, leaves, cotangent), torch.autograd.grad(actual, leaves, cotangent)):
        assert torch.equal(a, e)


def test_complex_mul_gradients_conjugate_as_eagers():
    """``z * w`` of complex leaves, and of a real leaf and a complex one (whose gradient is the
    real part of ``g * conj(w)``)."""
    z, w = (torch.randn(3, 4, dtype=torch.complex64, requires_grad=True) for _ in range(2))
    check_complex_bit_equal(lambda a, b: a * b, z, w)
    check_complex_bit_equal(lambda a, b: (a * b) * 2.0 - a, z, w[0].detach().requires_grad_())
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    check_complex_bit_equal(lambda a, b: a * b, x, w.detach().cdouble().requires_grad_())
    re, im = (torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    check_bit_equal(lambda a, b: torch.view_as_real(torch.complex(a, b) * torch.complex(b, a)), re, im)


def _error(fn, *args) -> BaseException:
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(2, 3).mT,  # last stride 3
        lambda: torch.randn(3, 3)[:, 1:],  # stride 3 of the first dim
        lambda: torch.randn(8)[1:7].view(3, 2),  # storage offset 1
    ],
)
def test_view_as_complex_of_a_layout_eager_cannot_view_raises_eagers_error(make):
    x = make()
    expected = _error(torch.view_as_complex, x)
    actual = _error(thunder_rs.jit(lambda a: torch.view_as_complex(a) * 2), x)
    assert isinstance(actual, type(expected)) and str(expected) in str(actual)


def test_view_as_complex_of_non_contiguous_views_eager_takes():
    """Permuted dims and a slice at an even offset view as eager's do (its strides too)."""
    x = torch.randn(4, 3, 2, requires_grad=True)
    check_complex_bit_equal(lambda a: torch.view_as_complex(a.permute(1, 0, 2)) * 2, x)
    check_bit_equal(lambda a: torch.view_as_real(torch.view_as_complex(a[1:3]) * 3).sum(-1), x)
    out = thunder_rs.jit(lambda a: torch.view_as_complex(a.permute(1, 0, 2)))(x.detach())
    assert out.stride() == torch.view_as_complex(x.detach().permute(1, 0, 2)).stride()


def test_rotary_over_changing_sequence_lengths_compiles_symbolically():
    jf = thunder_rs.jit(rotary)
    for n in (5, 7, 9, 6):
        args = (torch.randn(2, n, 3, 8, requires_grad=True), torch.randn(n, 4, requires_grad=True), torch.rand(n, 4))
        expected, actual = rotary(*args), jf(*args)
        assert torch.equal(actual, expected)
        cotangent = torch.randn_like(expected)
        grads = (torch.autograd.grad(out, args[:2], cotangent) for out in (expected, actual))
        for e, a in zip(*grads):
            assert torch.equal(a, e)
    assert thunder_rs.compile_stats(jf).cache_misses == 2


def test_writes_through_the_views_reach_the_tensor_they_view():
    def scale_pairs(x):
        torch.view_as_complex(x).mul_(torch.complex(torch.tensor(0.0), torch.tensor(1.0)))
        return x.sum()

    def overwrite_real_parts(re, im):
        z = torch.complex(re, im)
        torch.view_as_real(z)[..., 0] = 5
        return z

    x = torch.randn(3, 2)
    expected_x, actual_x = x.clone(), x.clone()
    assert torch.equal(thunder_rs.jit(scale_pairs)(actual_x), scale_pairs(expected_x))
    assert torch.equal(actual_x, expected_x)
    re, im = torch.randn(3), torch.randn(3)
    assert torch.equal(thunder_rs.jit(overwrite_real_parts)(re, im), overwrite_real_parts(re, im))


def test_complex_calls_without_a_native_gradient_still_run_eagerly():
    """``angle`` of a complex value that requires grad has no rule for complex values here: eager's."""

    def f(x):
        return torch.view_as_complex(x).angle()

    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    assert list(thunder_rs.examine(f, x).fallbacks) == ["torch.Tensor.angle"]
    check = torch.autograd.grad(thunder_rs.jit(f)(x).sum(), x)[0]
    assert torch.equal(check, torch.autograd.grad(f(x).sum(), x)[0])


def test_complex_ops_stay_with_torch_in_nvfuser_partitions(fake_ex):
    """nvFuser's executor claims no complex value (its ``DataType``s here are real): the complex
    prims run on torch between its regions, with eager's results and gradients."""
    x, angles, magnitudes = torch.randn(2, 5, 3, 8, requires_grad=True), torch.randn(5, 4), torch.rand(5, 4)

    def f(x, angles, magnitudes):
        return rotary(torch.tanh(x) * 2, angles.sin() + 1, magnitudes).relu()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jf = thunder_rs.jit(f, executors=[fake_ex])
        actual = jf(x, angles, magnitudes)
    expected = f(x, angles, magnitudes)
    torch.testing.assert_close(actual, expected)
    cotangent = torch.randn_like(expected)
    torch.testing.assert_close(
        torch.autograd.grad(actual, x, cotangent)[0], torch.autograd.grad(expected, x, cotangent)[0]
    )
    trace = thunder_rs.last_traces(jf)[-1]
    regions = trace.regions()
    assert regions
    for region in regions:
        assert not any(dtype.is_complex for dtype in region.dtypes.values()), region.source
    assert "ltorch.polar" not in {name for region in regions for name in region.symbol_names}


_W = torch.randn(3, 4, dtype=torch.complex64)
_R = torch.randn(3, 4)
#: Calls on a complex value that requires grad which the trace differentiates (no fallback).
NATIVE_COMPLEX_GRADS = {
    "mul": lambda a: torch.mul(a, _W),
    "number_times": lambda a: 2.5 * a,
    "times_real": lambda a: a * _R,
    "times_int": lambda a: a * torch.ones(3, 4, dtype=torch.int64),
    "add_alpha": lambda a: torch.add(a, _W, alpha=2),
    "sub_alpha": lambda a: torch.sub(a, _W, alpha=3),
    "neg": lambda a: -a,
    "reshape_view": lambda a: a.reshape(6, 4).view(-1) * 2,
    "flatten_unsqueeze": lambda a: torch.flatten(a, 1).unsqueeze(1),
    "permute_transpose": lambda a: a.permute(2, 0, 1).transpose(0, 2),
    "contiguous": lambda a: a.transpose(0, 1).contiguous(),
    "basic_indexing": lambda a: a[1:, ::2, -1] + a[0, 1:, None, 3],
}


@pytest.mark.parametrize("name", NATIVE_COMPLEX_GRADS)
def test_complex_values_with_gradients_through_the_marked_ops(name):
    z = torch.randn(2, 3, 4, dtype=torch.complex64, requires_grad=True)
    check_complex_bit_equal(NATIVE_COMPLEX_GRADS[name], z)


def test_gathering_a_complex_value_with_gradients_still_runs_eagerly():
    """Indexing by a tensor gathers, which has no rule for complex values: eager's getitem."""
    index = torch.tensor([0, 2])

    def f(a):
        return a[index] * 2

    z = torch.randn(4, 3, dtype=torch.complex64, requires_grad=True)
    assert dict(thunder_rs.examine(f, z).fallbacks) == {"torch.Tensor.__getitem__": 1}
    expected, actual = f(z), thunder_rs.jit(f)(z)
    cotangent = torch.randn_like(expected)
    assert torch.equal(torch.autograd.grad(actual, z, cotangent)[0], torch.autograd.grad(expected, z, cotangent)[0])


def test_learnable_rotary_frequencies_get_eagers_gradients():
    """A complex parameter sliced to the sequence length, as Llama's ``freqs_cis[:seqlen]``."""
    freqs_cis = precompute_freqs_cis(8, 16).requires_grad_()
    x = torch.randn(2, 7, 4, 8, requires_grad=True)
    check_bit_equal(lambda a, f: apply_rotary_emb(a, a * 2, f[: a.shape[1]]), x, freqs_cis)


def test_a_write_through_a_complex_view_with_gradients_is_refused_naming_the_line():
    def f(x):
        y = x * 1.0
        z = torch.view_as_complex(y)
        z += torch.ones_like(z)
        return y

    with pytest.raises(NotImplementedError, match=r"complex view of a real tensor.*test_complex_values\.py:\d+"):
        thunder_rs.jit(f)(torch.randn(3, 2, requires_grad=True))


@pytest.mark.parametrize("method", ["cfloat", "cdouble"])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128, torch.int64], ids=str
)
def test_complex_conversions_are_native_with_eagers_gradients(method: str, dtype: torch.dtype):
    """``Tensor.cfloat``/``cdouble``: a conversion (or the input itself, as eager aliases it),
    the gradient of a real input the real part of the complex one (``_to_copy_backward``)."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=torch.float64).mT.to(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        x.requires_grad_()

    def fn(a):
        return getattr(a, method)()

    assert thunder_rs.examine(fn, x).fallbacks == {}
    expected, actual = fn(x), thunder_rs.jit(fn)(x)
    assert torch.equal(actual, expected) and actual.dtype == expected.dtype
    assert actual.stride() == expected.stride() and (actual is x) == (expected is x)
    if x.requires_grad:
        cotangent = torch.randn_like(expected)
        grads = [torch.autograd.grad(out, x, cotangent)[0] for out in (expected, actual)]
        assert torch.equal(grads[1], grads[0]) and grads[1].dtype == grads[0].dtype
