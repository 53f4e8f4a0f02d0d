"""torch.func's transforms and complex values on CUDA, which no GPU had run (they were traced after
the last GPU check): on fake CUDA tensors (``FakeTensorMode``) with the CUDA default executors
(the nvFuser stand-in claiming CUDA tensors, then torch), each program has eager's output metadata
(eager's taken on the CPU: torch's autograd engine wants a GPU), its compiled backward gives the
input its gradient's metadata, nvFuser's regions define and compile without falling back, and no
complex value enters a definition (the executor leaves complex dtypes to torch). The GPU twin
compares values and gradients with eager's on a GPU (gpu_check's selection).
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs


def _loss(w, x):
    return (F.layer_norm(torch.tanh(x @ w), (w.shape[1],)) * x).pow(2).sum()


def _vjp(w, x):
    out, pullback = torch.func.vjp(lambda w: torch.sin(x @ w), w)
    return pullback(torch.ones_like(out))[0] + out.sum()


def _rope(w, x):
    angles = x[:, :2].float()
    freqs = torch.polar(torch.ones_like(angles), angles)
    pairs = torch.view_as_complex((x @ w).float().reshape(x.shape[0], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x).sigmoid() * 2


def _complex(w, x):
    z = torch.complex(w.float(), x.float())
    return torch.view_as_real(z * z - z).sum(-1).type_as(w) + w


#: Programs of (w, x): w (4, 4) requires grad, x (4, 4) does not.
PROGRAMS = {
    "grad": lambda w, x: torch.func.grad(_loss)(w, x) * 2,
    "grad_and_value": lambda w, x: sum(torch.func.grad_and_value(_loss)(w, x)),
    "vjp": _vjp,
    "gradient_penalty": lambda w, x: torch.func.grad(_loss)(w, x).pow(2).sum() + _loss(w, x),
    "vmap_of_grad": lambda w, x: torch.func.vmap(torch.func.grad(_loss), in_dims=(None, 0))(w, x[:, None]).sum(0),
    "rope": _rope,
    "complex": _complex,
}
DTYPES = (torch.float32, torch.bfloat16)


@pytest.fixture
def cuda_ex(fake_ex):
    from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
        return NvFuserExecutor("nvfuser_fake_cuda", module=fake_ex.module)


def _metadata(t):
    return (t.dtype, tuple(t.shape), t.stride(), t.requires_grad)


def _inputs(dtype, device):
    torch.manual_seed(0)
    w = torch.randn(4, 4, dtype=dtype, device=device).requires_grad_()
    return w, torch.randn(4, 4, dtype=dtype, device=device)


def _definitions_dtypes(definitions) -> set:
    """The dtypes of every tensor and scalar input and output of the stand-in's definitions."""
    found = {spec[2].value if isinstance(spec, tuple) else spec.value for d in definitions for _, spec in d._inputs}
    return found | {o.meta.dtype for d in definitions for o in d._outputs}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", PROGRAMS)
def test_on_fake_cuda_the_default_executors_trace_it_with_eagers_metadata(name, dtype, cuda_ex):
    fn = PROGRAMS[name]
    w, x = _inputs(dtype, "cpu")
    expected = fn(w, x)
    (expected_grad,) = torch.autograd.grad(expected, w, torch.ones_like(expected))
    definitions = cuda_ex.module.definitions
    with FakeTensorMode(allow_non_fake_inputs=True), warnings.catch_warnings():
        warnings.simplefilter("error")  # (an nvFuser region falling back warns)
        w, x = _inputs(dtype, "cuda")
        jf = thunder_rs.jit(fn, executors=[cuda_ex, "torch"])
        out = jf(w, x)
        assert (out.device, _metadata(out)) == (w.device, _metadata(expected))
        assert "eager_" not in str(thunder_rs.last_traces(jf)[-1])
        node = out.grad_fn
        cotangents = [torch.ones(m.shape, dtype=m.dtype, device=m.device) for m in node._input_metadata]
        with torch.no_grad():
            grads = node.apply(*cotangents)
    (grad,) = [g for g in (grads if isinstance(grads, tuple) else (grads,)) if g is not None]
    assert _metadata(grad) == _metadata(expected_grad.detach())
    assert definitions and all(d.executions for d in definitions[-1:])
    assert cuda_ex.stats["failures"] == 0
    assert not any(dtype.is_complex for dtype in _definitions_dtypes(definitions))


#: The GPU twin's tolerance, by dtype: the largest difference from eager relative to eager's largest
#: magnitude (nvFuser's fused arithmetic: its own tanh, a layer norm's reductions in another order).
TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
#: The programs the GPU twin runs in bfloat16 too. The traced grads are ill-conditioned there (a
#: layer norm of tanh's saturated outputs): on the CPU, eager's bfloat16 result is 25% of its
#: largest magnitude from float64's (on the same inputs), the trace's 8%, and the two 18% apart
#: (26% for the gradients): eager's rounding is no reference for them.
IN_BFLOAT16 = ("vjp", "rope", "complex")


def _assert_near(out, expected, dtype, where: str) -> None:
    difference = (out.float() - expected.float()).abs().max().item()
    assert difference <= TOLERANCES[dtype] * expected.float().abs().max().item(), f"{where}: {difference}"


@pytest.mark.gpu
def test_on_cuda_transforms_and_complex_values_match_eager():
    """Values and gradients of each program with the default executors (nvFuser's regions where
    it imports) against eager's on the GPU, within the dtype's tolerance."""
    for name, fn in PROGRAMS.items():
        for dtype in DTYPES if name in IN_BFLOAT16 else DTYPES[:1]:
            w, x = _inputs(dtype, "cuda")
            expected = fn(w, x)
            (expected_grad,) = torch.autograd.grad(expected, w, torch.ones_like(expected))
            w, x = _inputs(dtype, "cuda")
            out = thunder_rs.jit(fn)(w, x)
            (grad,) = torch.autograd.grad(out, w, torch.ones_like(out))
            assert _metadata(out) == _metadata(expected) and _metadata(grad) == _metadata(expected_grad)
            _assert_near(out, expected, dtype, f"{name} in {dtype}")
            _assert_near(grad, expected_grad, dtype, f"{name}'s gradient in {dtype}")
