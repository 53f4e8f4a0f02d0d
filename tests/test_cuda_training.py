"""Training steps on the CUDA path without a GPU: the demo GPT under ``torch.autocast("cuda",
bfloat16)`` and the GPU check's ``Block`` with bfloat16 parameters, on fake CUDA tensors
(``FakeTensorMode``), through the CUDA default executors (the stand-in ``nvfuser_direct``, claiming
CUDA tensors only, then torch) with the fused attention kernel torch chose on the H100 (cuDNN's).

On the H100 (``../shared/gpu-h100``, ``benchmarks/results/h100_failures_audit.md`` row 3) both failed
at their first backward: nvFuser regions handed on float32 where the trace has bfloat16, and the
backward's matmul refused it ("expected mat1 and mat2 to have the same dtype"). Fake tensors carry
no values (``test_nvfuser_ex.py`` compares them on the CPU); what runs here is every kernel's meta
computation, which checks dtypes as the CUDA kernels do. The compiled backward is called directly
(torch's autograd engine wants a CUDA context), and each gradient it returns must have the dtype and
shape the autograd node it flows into takes (``Node._input_metadata``: what the engine checks).
"""

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import thunder_rs
from thunder_rs.torch import fused_attention as fa

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import gpt  # noqa: E402
from gpt import GPT, Block, GPTConfig  # noqa: E402


@pytest.fixture
def cuda_ex(monkeypatch):
    """An nvFuser executor on the stand-in that claims CUDA tensors only, as the real one."""
    import fake_nvfuser_direct as fake  # noqa: PLC0415 (the nvFuser tests' fixtures: imported where used)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
        from thunder_rs.executors.nvfuser_ex import NvFuserExecutor  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    # Torch's choice needs a GPU (test_attention_kernels.py); the H100's eager bf16 step ran cuDNN's,
    # float32 takes the memory-efficient kernel (neither flash nor cuDNN has float32).
    monkeypatch.setattr(fa, "fused_sdp_choice", lambda q, *args: fa.CUDNN if q.element_size() == 2 else fa.EFFICIENT)
    # The weights' values do not matter on fake tensors; the seeded init draws on the CPU.
    monkeypatch.setattr(gpt, "init_weights", lambda model, seed: None)
    return NvFuserExecutor("nvfuser_stand_in_cuda", module=fake)


def _cuda_autocast(monkeypatch, dtype):
    """``torch.autocast("cuda")`` without a GPU: its constructor asks whether CUDA (and bf16) is
    there and disables itself otherwise (``test_cuda_contracts.py``)."""
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
        return torch.autocast("cuda", dtype=dtype)


def _metadata(t: torch.Tensor):
    return t.dtype, tuple(t.shape), t.stride(), t.device, t.requires_grad


def _compiled_node(output: torch.Tensor):
    """The compiled call's backward node ``output`` reaches through eager's ops after it."""
    nodes = [output.grad_fn]
    while nodes:
        node = nodes.pop(0)
        if hasattr(node, "_forward_cls"):
            return node
        nodes.extend(n for n, _ in node.next_functions if n is not None)
    raise AssertionError("no compiled call in the graph")


def _backward_checked(output: torch.Tensor) -> list:
    """The compiled backward run on ones: a gradient for every input requiring grad, of the dtype,
    shape and device its next node takes."""
    node = _compiled_node(output)
    cotangents = [torch.ones(m.shape, dtype=m.dtype, device=m.device) for m in node._input_metadata]
    with torch.no_grad():
        grads = node.apply(*cotangents)
    grads = grads if isinstance(grads, tuple) else (grads,)
    # One gradient per forward argument; ``next_functions`` has an edge per tensor argument, set
    # for those requiring grad (``needs_input_grad``).
    wanted = [g for g, needed in zip(grads, node.needs_input_grad, strict=True) if needed]
    edges = [(n, nr) for n, nr in node.next_functions if n is not None]
    assert len(wanted) == len(edges)
    taken = []
    for g, (next_node, nr) in zip(wanted, edges):
        assert g is not None, f"no gradient for {next_node} (every input here has one in eager)"
        meta = next_node._input_metadata[nr]
        assert (g.dtype, tuple(g.shape), g.device) == (meta.dtype, tuple(meta.shape), meta.device), next_node
        taken.append(g)
    return taken


def _assert_cuda_path(jfn, cuda_ex, attention: str | None = "cudnn") -> None:
    backward = thunder_rs.last_backward_traces(jfn)[-1]
    assert backward.regions(), "the backward ran in no nvFuser region"
    if attention is not None:
        assert f"torch_{attention}_attention_backward(" in str(backward)
    assert cuda_ex.stats["failures"] == 0, cuda_ex.fallbacks


def test_gpt_training_step_under_cuda_autocast_hands_on_eagers_dtypes(cuda_ex, monkeypatch):
    config = GPTConfig()
    with FakeTensorMode():
        with torch.device("cuda"):
            model = GPT(config)
        idx, targets = (torch.randint(0, config.vocab_size, (2, config.block_size), device="cuda") for _ in range(2))
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        with _cuda_autocast(monkeypatch, torch.bfloat16):
            (logits, loss), (logits_e, loss_e) = jmodel(idx, targets), model(idx, targets)
        assert [_metadata(t) for t in (logits, loss)] == [_metadata(t) for t in (logits_e, loss_e)]
        assert logits.dtype == torch.bfloat16
        grads = _backward_checked(loss)
    assert {g.dtype for g in grads} == {torch.bfloat16, torch.float32}  # the casts' and the norms'
    _assert_cuda_path(jmodel, cuda_ex)


def test_a_bf16_block_training_step_hands_on_eagers_dtypes(cuda_ex):
    """The GPU check's workload at a small size: every parameter bfloat16, no autocast."""
    config = GPTConfig()
    with FakeTensorMode():
        with _made_in(torch.bfloat16):
            block = Block(config)
        x = torch.randn(2, config.block_size, config.n_embd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        jblock = thunder_rs.jit(block, executors=[cuda_ex, "torch"])
        out, ref = jblock(x), block(x)
        assert _metadata(out) == _metadata(ref)
        grads = _backward_checked(out)
    assert len(grads) == 1 + len(list(block.parameters()))
    assert {g.dtype for g in grads} == {torch.bfloat16}
    _assert_cuda_path(jblock, cuda_ex)


@contextlib.contextmanager
def _made_in(dtype):
    """Modules made with ``dtype`` parameters on fake CUDA (``Module.to`` cannot swap fake tensors)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            yield
    finally:
        torch.set_default_dtype(before)


# -- models users train: the demo GPT, Hugging Face GPT-2 and Llama, torchvision's ResNet-18 ------------


def _hf(name: str):
    pytest.importorskip("transformers")
    from test_hf_models import tiny_model  # noqa: PLC0415 (imports transformers)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)  # (float32 already; see _made_in)
        model = tiny_model(name)
    ids = torch.randint(3, 99, (2, 8), device="cuda")
    # (no padding mask: HF reads a mask's values to decide whether it needs one, which fake tensors lack)
    return model, dict(input_ids=ids, labels=ids), lambda out: out.loss


def _resnet18():
    torchvision = pytest.importorskip("torchvision")

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=10)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.net(x), y)

    inputs = dict(x=torch.randn(2, 3, 32, 32, device="cuda"), y=torch.randint(0, 10, (2,), device="cuda"))
    return Step().train(), inputs, lambda loss: loss


def _gpt():
    config = GPTConfig()
    idx, targets = (torch.randint(0, config.vocab_size, (2, config.block_size), device="cuda") for _ in range(2))
    return GPT(config), dict(idx=idx, targets=targets), lambda out: out[1]


MODELS = {"gpt": _gpt, "gpt2": lambda: _hf("gpt2"), "llama": lambda: _hf("llama"), "resnet18": _resnet18}


@pytest.mark.parametrize(
    ("name", "autocast"),
    [
        pytest.param(name, autocast, id=f"{name}-{'bf16_autocast' if autocast else 'float32'}", marks=marks)
        for name in MODELS
        for autocast in (False, True)
        for marks in [() if (name, autocast) == ("llama", True) else pytest.mark.slow]
    ],
)
def test_a_models_training_step_takes_the_cuda_path_with_eagers_dtypes(name, autocast, cuda_ex, monkeypatch):
    """Float32 and under bfloat16 autocast: the loss's metadata is eager's, nvFuser regions and torch's
    fused attention kernel (the transformers) run the backward, every gradient of its input's dtype."""
    with FakeTensorMode():
        with torch.device("cuda"):
            model, inputs, loss_of = MODELS[name]()
        jmodel = thunder_rs.jit(model, executors=[cuda_ex, "torch"])
        with _cuda_autocast(monkeypatch, torch.bfloat16) if autocast else contextlib.nullcontext():
            loss, expected = loss_of(jmodel(**inputs)), loss_of(model(**inputs))
        assert _metadata(loss) == _metadata(expected)
        grads = _backward_checked(loss)
    assert len(grads) >= len(list(model.parameters()))
    attention = None if name == "resnet18" else "cudnn" if autocast else "efficient"
    _assert_cuda_path(jmodel, cuda_ex, attention)
