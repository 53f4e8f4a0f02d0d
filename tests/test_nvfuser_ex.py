"""The nvFuser executor on the CPU, backed by a stand-in ``nvfuser_direct`` (``fake_nvfuser_direct``)
that follows the real bindings' names and evaluates definitions with torch: every translated
prim against the torch executor, the per-layout definition cache, gradients through regions,
and what happens when nvFuser does not import. The CUDA tests with the real nvFuser are in
``test_cuda.py``."""

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch

import thunder_rs
from thunder_rs import prims
from thunder_rs.executors import nvfuser_default
from thunder_rs.errors import ThunderNotImplementedError

import fake_nvfuser_direct as fake

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt import GPT, Block, GPTConfig, random_tokens  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the named executor warns that the real nvfuser_direct is absent
    from thunder_rs.executors import nvfuser_ex
    from thunder_rs.executors.nvfuser_ex import TRANSLATIONS, NvFuserExecutor, NvFuserRegion


@pytest.fixture
def fake_ex(monkeypatch):
    """An nvFuser executor on the stand-in module, allowed CPU tensors; the stand-in is also
    what ``import nvfuser_direct`` finds."""
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    fake.definitions.clear()
    return NvFuserExecutor("nvfuser_fake", module=fake, allow_cpu=True)


def _regions(jfn):
    return [name for name, *_ in thunder_rs.last_traces(jfn)[-1].regions()]


# -- every translation against the torch executor --------------------------------------------------

X = torch.linspace(0.1, 0.9, 32).reshape(4, 8)
Y = torch.linspace(0.2, 1.4, 32).reshape(4, 8).flip(0)
IX = torch.arange(32).reshape(4, 8) % 7 + 1
IY = torch.arange(32).reshape(4, 8).flip(1) % 5 + 1
ALT = {"acosh": X + 1, "bitwise_not": IX}
BITWISE = {"bitwise_and", "bitwise_or", "bitwise_xor"}
#: prim -> (function of the inputs calling it, inputs)
SAMPLES = {
    "where": (lambda x, y: prims.where(prims.gt(x, 0.5), x, y), (X, Y)),
    "convert_element_type": (lambda x: prims.convert_element_type(x, torch.float16), (X,)),
    "broadcast_in_dim": (lambda v: prims.broadcast_in_dim(v, (4, 8), (1,)), (X[0].clone(),)),
    "reshape": (lambda x: prims.reshape(x, (8, 4)), (X,)),
    "transpose": (lambda x: prims.transpose(x, (1, 0)), (X,)),
    "slice": (lambda x: prims.slice(x, (0, 1), (4, 7), (1, 2)), (X,)),
    "squeeze": (lambda x: prims.squeeze(x, (0,)), (X[:1].clone(),)),
    "cat": (lambda x, y: prims.cat([x, y], 0), (X, Y)),
    "pad": (lambda x: prims.pad(x, 0.5, ((1, 2, 0), (0, 1, 0))), (X,)),
    "full": (lambda x: prims.add(x, prims.full((4, 8), 1.5, torch.device("cpu"), torch.float32)), (X,)),
    "iota": (lambda x: prims.add(x, prims.iota(8, 2, 3, torch.device("cpu"), torch.int64)), (IX[0].clone(),)),
    "sum": (lambda x: prims.sum(x, (1,)), (X,)),
    "prod": (lambda x: prims.prod(x, (0,)), (Y,)),
    "amax": (lambda x: prims.amax(x, (1,)), (Y,)),
    "amin": (lambda x: prims.amin(x, (0, 1)), (Y,)),
    "var": (lambda x: prims.var(x, (1,), 1), (Y,)),
    "var_mean": (lambda x: prims.var_mean(x, (0,), 0), (Y,)),
    "cumsum": (lambda x: prims.cumsum(x, 1), (Y,)),
    "cumprod": (lambda x: prims.cumprod(x, 0), (Y,)),
    "take": (lambda x, i: prims.take(x, i, 1), (Y, torch.tensor([3, 0, 7, 3]))),
    "take_along_axis": (lambda x, i: prims.take_along_axis(x, i, 1), (Y, IY % 8)),
    "gather": (lambda x, i: prims.gather(x, i, 1), (Y, IY[:, :3] % 8)),
}
#: The ``fd.ops`` name each prim becomes, where it is not the prim's own.
OP_NAMES = {"convert_element_type": "cast", "transpose": "permute", "amax": "max", "amin": "min",
            "take": "index_select"}


def _sample(name):
    if name in SAMPLES:
        return SAMPLES[name]
    fn = getattr(prims, name)
    if name in nvfuser_ex.UNARY:
        return fn, (ALT.get(name, X),)
    if name in BITWISE:
        return fn, (IX, IY)
    return fn, (X, Y)


@pytest.mark.parametrize("name", sorted(TRANSLATIONS))
def test_translation_matches_the_torch_executor(name, fake_ex):
    fn, inputs = _sample(name)

    def program(*args):
        # Two more calls, so that the prim is in a region worth making even when it is a shape op.
        return fn(*args), prims.neg(args[0]), prims.abs(args[0])

    expected = thunder_rs.jit(program, executors=[])(*inputs)
    jfn = thunder_rs.jit(program, executors=[fake_ex])
    actual = jfn(*inputs)
    torch.testing.assert_close(actual, expected, equal_nan=True)
    assert _regions(jfn) == ["nvfuser_fake_fusion0"], thunder_rs.last_traces(jfn)[-1]
    recorded = [op for d in fake.definitions for op in d.recorded]
    # The views pass may turn a squeeze into the reshape it is.
    expected_ops = {"squeeze", "reshape"} if name == "squeeze" else {OP_NAMES.get(name, name)}
    assert expected_ops & set(recorded) and "neg" in recorded, recorded


def test_the_table_has_the_documented_size():
    # Every prim nvFuser computes as torch does (see the module docstring for the rest).
    assert len(TRANSLATIONS) >= 78
    assert set(TRANSLATIONS) <= set(prims.NAMES)


def test_numbers_scalar_inputs_and_composites(fake_ex):
    def f(x, y, s):
        return torch.nn.functional.gelu(x * s + y).softmax(-1), torch.where(x > 0.5, x, 2.0).sum()

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    jfn = thunder_rs.jit(f, executors=[fake_ex])
    for s in (0.5, 1.5):  # a number input: the definition takes it as a scalar input
        torch.testing.assert_close(jfn(x, y, s), f(x, y, s))
    assert _regions(jfn)


# -- refusals ---------------------------------------------------------------------------------------

def test_cpu_tensors_are_not_claimed_without_the_test_switch():
    ex = NvFuserExecutor("nvfuser_cpu_refused", module=fake)
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[ex])
    x = torch.randn(4)
    torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    assert _regions(jfn) == []


def test_unsupported_arguments_are_left_to_torch(fake_ex):
    def f(x, y):
        return (x + 1).flip(0) * 2, (y + 1) * 2  # flip has no translation; int8 no nvFuser dtype

    x, y = torch.randn(4), torch.arange(4, dtype=torch.int8)
    jfn = thunder_rs.jit(f, executors=[fake_ex])
    torch.testing.assert_close(jfn(x, y), f(x, y))
    trace = thunder_rs.last_traces(jfn)[-1]
    assert "prims.flip" not in "".join(c[0] for r in trace.region_calls() for c in r[1])
    assert all("int8" not in str(a) for r in trace.region_calls() for c in r[1] for a in c[1])


def test_a_region_nvfuser_cannot_define_runs_eagerly_with_a_warning(fake_ex, monkeypatch):
    def broken(arg):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(fake.ops, "sin", broken)
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[fake_ex])
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="runs eagerly.*no kernel"):
        torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    torch.testing.assert_close(jfn(x * 2), (x * 2).sin().add(1).exp())
    assert fake_ex.stats["failures"] == 1


def test_without_nvfuser_everything_runs_on_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", None)  # import raises ImportError
    ex = NvFuserExecutor("nvfuser_missing")
    assert not ex.available and "nvfuser_direct" in ex.unavailable and not ex.implmap
    jfn = thunder_rs.jit(lambda x: (x.sin() + 1).exp(), executors=[ex])
    x = torch.randn(4)
    torch.testing.assert_close(jfn(x), (x.sin() + 1).exp())
    assert _regions(jfn) == []


def test_defaults_are_unchanged_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = thunder_rs.executors.get_default_executors()
    assert not nvfuser_default.use_nvfuser_on_cuda()
    assert thunder_rs.executors.get_default_executors() == before
    assert all(e.name != "nvfuser" for e in before)


def test_nvfuser_becomes_a_default_on_cuda_when_it_imports(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nvfuser_default.importlib.util, "find_spec", lambda name: object())
    ready = NvFuserExecutor("nvfuser", module=fake)
    monkeypatch.setattr(nvfuser_ex, "nvfuser_executor", lambda: ready)
    try:
        assert nvfuser_default.use_nvfuser_on_cuda()
        defaults = thunder_rs.executors.get_default_executors()
        assert defaults[0] is ready and defaults[-1].name == "torch"
    finally:
        thunder_rs.executors.deregister_executor(ready)
    monkeypatch.setenv("THUNDER_RS_NVFUSER", "0")
    assert not nvfuser_default.use_nvfuser_on_cuda()


def test_unknown_prims_in_a_region_are_an_error_of_the_definition():
    region = nvfuser_ex.Region("r", "k", "", lambda x: (x,), ("prims.flip",), 1, 1, ("t0",),
                               (("prims.flip", ("t0", (0,)), ("t1",)),), ("t1",))
    with pytest.raises(ThunderNotImplementedError, match="no translation for prims.flip"):
        nvfuser_ex.define(fake, region, [torch.randn(3)])


# -- the definition cache ---------------------------------------------------------------------------

class Capturing(NvFuserExecutor):
    """Keeps the regions it fuses."""

    def fuse(self, region):
        fused = super().fuse(region)
        self.fused.append(fused)
        return fused


def test_one_definition_per_input_layout(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvfuser_direct", fake)
    ex = Capturing("nvfuser_capturing", module=fake, allow_cpu=True)
    ex.fused = []
    fake.definitions.clear()

    def f(x, y):
        return (x * y + 1).exp().sum(0)

    x, y = torch.randn(8, 6), torch.randn(8, 6)
    thunder_rs.jit(f, executors=[ex])(x, y)
    (region,) = ex.fused
    assert isinstance(region, NvFuserRegion) and len(fake.definitions) == 1
    ref = region.region.function
    layouts = [
        (x, y),
        (x.t().contiguous().t(), y),  # column-major: another stride order
        (torch.randn(8, 12)[:, ::2], y),  # non-contiguous
    ]
    for args in layouts + layouts:
        torch.testing.assert_close(region(*args), ref(*args))
    assert len(region.definitions) == 3 and len(fake.definitions) == 3
    assert [d.executions for d in fake.definitions] == [3, 2, 2]
    # The per-call path: the last layout is reused without a lookup.
    region(*layouts[-1])
    assert fake.definitions[-1].executions == 3


def test_a_lazily_negated_input_is_resolved(fake_ex):
    jfn = thunder_rs.jit(lambda x, y: (x + y).exp(), executors=[fake_ex])
    z = torch.randn(4, dtype=torch.float32)
    torch.testing.assert_close(jfn(z, z), (z + z).exp())


# -- gradients through regions -----------------------------------------------------------------------

def test_gpt_block_forward_and_gradients_match_eager(fake_ex):
    config = GPTConfig()
    torch.manual_seed(0)
    block = Block(config)
    eager = copy.deepcopy(block)
    x = torch.randn(2, 16, config.n_embd, requires_grad=True)
    xe = x.detach().clone().requires_grad_()
    jblock = thunder_rs.jit(block, executors=[fake_ex])
    out, ref = jblock(x), eager(xe)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xe.grad)
    for (name, p), pe in zip(block.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, pe.grad, msg=lambda m: f"grad of {name}: {m}")
    assert _regions(jblock) and [n for n, *_ in thunder_rs.last_backward_traces(jblock)[-1].regions()]
    assert fake_ex.stats["failures"] == 0


def test_gpt_training_step_matches_eager(fake_ex):
    config = GPTConfig()
    model = GPT(config, seed=0)
    eager = copy.deepcopy(model)
    jmodel = thunder_rs.jit(model, executors=[fake_ex])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    for step in range(3):
        idx = random_tokens(config, 2, config.block_size, seed=step)
        targets = random_tokens(config, 2, config.block_size, seed=100 + step)
        loss, loss_e = jmodel(idx, targets)[1], eager(idx, targets)[1]
        torch.testing.assert_close(loss, loss_e)
        loss.backward()
        loss_e.backward()
        opt.step(), opt_e.step(), opt.zero_grad(), opt_e.zero_grad()
    # Decomposed layer norms and softmaxes round differently from eager's kernels; AdamW's
    # normalised update turns that into differences up to lr * 2 in parameters of tiny gradient.
    for (name, p), pe in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, pe, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    assert fake_ex.stats["definitions"] >= 2 and fake_ex.stats["failures"] == 0


def test_checkers():
    add, full = nvfuser_ex.make_checker("add", False), nvfuser_ex.make_checker("full", False)
    x = torch.ones(2)
    assert not add(x, x)  # CPU tensors
    assert nvfuser_ex.make_checker("add", True)(x, x)  # the test switch
    assert not nvfuser_ex.make_checker("add", True)(2, 3)  # numbers alone
    assert not nvfuser_ex.make_checker("add", True)(x.to(torch.int8), 1)  # no nvFuser dtype
    assert not full((2,), 1.0, torch.device("cpu"), torch.float32)
    pad = nvfuser_ex.make_checker("pad", True)
    assert pad(x, 0.0, ((1, 1, 0),)) and not pad(x, 0.0, ((1, 1, 1),)) and not pad(x, 0.0, ((-1, 0, 0),))
    var = nvfuser_ex.make_checker("var", True)
    assert var(x, (0,), 1) and not var(x, (), 1) and not var(x, (0,), 0.5)
    assert not nvfuser_ex.make_checker("sum", True)(x.bool(), (0,))
