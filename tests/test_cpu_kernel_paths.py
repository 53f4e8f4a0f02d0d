"""Decompositions against eager's CPU kernels where eager's result depends on which kernel aten
picks for the tensor, or on a flaw of one: what a fusion executor running the decomposition
(``torch_ex.decomposing()``, as the nvFuser stand-in does) gives must be eager's.

- ``F.gelu`` of a contiguous float32 (bfloat16) tensor of two or more elements runs oneDNN, which
  gives NaN for +inf on AVX-512 where aten's own kernels give inf (``thunder_rs/torch/onednn.py``).
- Antialiased ``F.interpolate`` to a width of one: aten's CPU kernel gives every output row the
  first one's value where the output's rows have stride 1.
- Antialiased ``F.interpolate`` in half precision: eager's CPU kernel copies the input where no size
  changes (and has no backward); elsewhere it raises, as thunder_rs does.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError
from thunder_rs.executors.torch_ex import decomposing

SIZES = range(1, 34)


def _with_extremes(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Random values with +inf first, in the middle and last (vector body and tail positions of
    aten's kernels), -inf and NaN after the first."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    for at in (0, n // 2, n - 1):
        x[at] = math.inf
    if n > 3:
        x[1], x[2] = -math.inf, math.nan
    return x


def _decomposed(fn, *args):
    with decomposing():
        return thunder_rs.jit(fn)(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_gelu_decomposition_gives_eagers_value_at_inf(dtype, layout):
    xs = [_with_extremes(n, dtype) for n in SIZES]
    if layout == "strided":
        xs = [torch.stack([x, x], 1)[:, 0] for x in xs]

    def program(*xs):
        return [F.gelu(x) for x in xs]

    for n, actual, expected in zip(SIZES, _decomposed(program, *xs), program(*xs)):
        # (equal_nan: NaN where eager has NaN and nowhere else; inf exactly where eager has it)
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"size {n}: {m}")


def test_gelu_decomposition_follows_the_mkldnn_switch():
    """With ``torch.backends.mkldnn.enabled`` off eager's kernel gives inf at +inf: the entry traced
    with it on does not serve that call."""
    x = torch.tensor([math.inf, 1.0, -2.0, math.inf])
    jfn = thunder_rs.jit(lambda x: F.gelu(x) * 1)
    for switch in (True, False, True):
        # (the context manager: torch's test utilities, once imported, forbid setting the flag)
        with torch.backends.mkldnn.flags(enabled=switch), decomposing():
            actual = jfn(x)
            expected = F.gelu(x) * 1
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"switch {switch}: {m}")


def _layouts(shape, dtype):
    x = torch.randn(shape, dtype=dtype)
    return {
        "contiguous": x,
        "channels_last": x.to(memory_format=torch.channels_last),
        "transposed": x.transpose(-1, -2).contiguous().transpose(-1, -2),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (2, 1, 4, 8)])
def test_antialiased_resize_to_one_column_is_eagers(dtype, mode, shape):
    torch.manual_seed(0)
    for name, x in _layouts(shape, dtype).items():
        for size in ((3, 1), (12, 1), (1, 2), (3, 2)):

            def resize(x, size=size):
                return F.interpolate(x, size=size, mode=mode, antialias=True)

            torch.testing.assert_close(
                _decomposed(resize, x), resize(x), rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} {size}: {m}"
            )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_half_precision_antialiased_resize_is_eagers(dtype, mode):
    torch.manual_seed(0)
    for kwargs in ({"size": (7, 5)}, {"size": (7, 5), "align_corners": True}, {"scale_factor": 1.1}):

        def resize(x, kwargs=kwargs):
            return F.interpolate(x, mode=mode, antialias=True, **kwargs)

        for name, x in _layouts((2, 3, 7, 5), dtype).items():
            x[0, 0, 0, :3] = torch.tensor([math.inf, -math.inf, math.nan])
            expected, actual = resize(x), thunder_rs.jit(resize)(x)
            assert actual.stride() == expected.stride() and actual.data_ptr() != x.data_ptr(), name
            # (the decomposition's copy, a conversion to the same dtype, aliases under ``decomposing``)
            for actual in (actual, _decomposed(resize, x)):
                assert torch.equal(actual.view(torch.int16), expected.view(torch.int16)), f"{name} {kwargs}"
    x = torch.randn(2, 3, 7, 5, dtype=dtype)
    with pytest.raises(NotImplementedError):
        F.interpolate(x, size=(7, 4), mode=mode, antialias=True)
    with pytest.raises(ThunderNotImplementedError, match="interpolate.*where a size changes"):
        thunder_rs.jit(lambda x: F.interpolate(x, size=(7, 4), mode=mode, antialias=True))(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_antialiased_resize_has_no_backward_as_in_eager(dtype):
    """Eager's forward runs and its backward raises when it runs: so do thunder_rs's."""

    def program(x):
        return F.interpolate(x, size=(7, 5), mode="bilinear", antialias=True).sum()

    x = torch.randn(2, 3, 7, 5, dtype=dtype)
    expected, actual = program(x.clone().requires_grad_()), thunder_rs.jit(program)(x.clone().requires_grad_())
    assert torch.equal(actual.detach(), expected.detach())
    with pytest.raises(NotImplementedError, match="upsample_bilinear2d_aa_backward") as eager:
        expected.backward()
    with pytest.raises(NotImplementedError, match="upsample_bilinear2d_aa_backward") as ours:
        actual.backward()
    assert str(ours.value) == str(eager.value)
