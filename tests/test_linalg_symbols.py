"""Opaque linear algebra symbols count as supported, and complex inputs of the real-only ops run
as eager's."""

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def test_opaque_linalg_is_supported_not_fallback():
    a = torch.randn(3, 3, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    b = torch.randn(3, 2, dtype=torch.float64)

    def f(a, b):
        u, s, vh = torch.linalg.svd(a)
        return torch.linalg.solve(a, b), torch.linalg.det(a), s, torch.linalg.lstsq(a, b).solution

    report = thunder_rs.examine(f, a, b)
    assert not report.fallbacks
    assert {"ltorch.linalg_svd", "ltorch.linalg_solve", "ltorch.linalg_det", "ltorch.linalg_lstsq"} <= set(
        report.supported
    )


def test_opaque_linalg_backward_runs_torch_derivative():
    a = (torch.randn(2, 3, 3, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)).requires_grad_()
    jf = thunder_rs.jit(lambda a: torch.linalg.inv(a).sum() + torch.linalg.slogdet(a).logabsdet.sum())
    (grad,) = torch.autograd.grad(jf(a), a)
    (expected,) = torch.autograd.grad(torch.linalg.inv(a).sum() + torch.linalg.slogdet(a).logabsdet.sum(), a)
    torch.testing.assert_close(grad, expected)
    assert "linalg_inv_outputs_vjp" in str(thunder_rs.last_backward_traces(jf)[-1])


@pytest.mark.parametrize("fn", [torch.conj, torch.conj_physical, torch.resolve_conj, torch.resolve_neg])
def test_conjugation_of_complex_is_eagers(fn):
    x = torch.randn(3, dtype=torch.complex64)
    torch.testing.assert_close(thunder_rs.jit(fn)(x), fn(x))


def test_lstsq_refuses_drivers_whose_outputs_depend_on_rank():
    a, b = torch.randn(5, 3), torch.randn(5, 2)
    with pytest.raises(ThunderNotImplementedError, match="linalg_lstsq.*gelsd"):
        thunder_rs.jit(lambda a, b: torch.linalg.lstsq(a, b, driver="gelsd"))(a, b)


@pytest.mark.parametrize(
    "fn",
    [
        torch.linalg.svdvals,
        lambda a: torch.linalg.eigvalsh(a + a.mT),
        lambda a: torch.linalg.matrix_norm(a, 2),
        lambda a: torch.linalg.matrix_norm(a, "nuc"),
        lambda a: torch.linalg.norm(a, -2),
        lambda a: torch.norm(a, p="nuc"),
        lambda a: a.norm(p="nuc"),
    ],
    ids=["svdvals", "eigvalsh", "norm_2", "norm_nuc", "linalg_norm", "torch_norm", "tensor_norm"],
)
def test_values_of_an_input_that_requires_grad_are_computed_with_the_vectors_as_eager(fn):
    """Eager's svdvals and eigvalsh compute the singular vectors (eigenvectors) too where the input
    requires grad, and LAPACK's values then differ in their last bits: the compiled call ran the
    values-only kernel (inside its no-grad forward; the norms too, run whole by the torch executor),
    so the values and gradients differed in float32."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        a = torch.randn(5, 5, generator=gen, requires_grad=True)
        expected, actual = fn(a), thunder_rs.jit(fn)(a)
        assert torch.equal(expected, actual)
        cotangent = torch.randn(expected.shape, generator=gen)
        (e,), (g,) = (torch.autograd.grad(out, a, cotangent) for out in (expected, actual))
        assert torch.equal(e, g)
        with torch.no_grad():  # (without grad: the values alone, as eager's)
            assert torch.equal(fn(a), thunder_rs.jit(fn)(a))


@pytest.mark.parametrize("device", ["cpu", "fake cuda"])
def test_a_half_precision_complex_result_is_refused_naming_the_op(device):
    """eigvals of a bfloat16 matrix (and stft on fake CUDA tensors): torch's meta kernel gives a
    bcomplex32 result, which the trace cannot carry. It raised a bare KeyError while recording;
    it is a NotImplementedError naming the op, the type eager's CPU kernel raises."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    with FakeTensorMode() if device == "fake cuda" else torch.device("cpu"):
        x = torch.randn(3, 3, dtype=torch.bfloat16, device="cuda" if device == "fake cuda" else "cpu")
        with pytest.raises(NotImplementedError, match=r"ltorch.linalg_eigvals: gives a torch.bcomplex32 result"):
            thunder_rs.jit(torch.linalg.eigvals)(x)
