"""Model families trained next to eager under ``thunder_rs.jit`` and under
``torch.compile(backend="thunder_rs")`` (families in ``models_round10``), as ``test_models_round9``
trains its own: from the same seed, three AdamW steps with ``clip_grad_norm_`` in train mode
(dropout and drop path drawing from the seeded global generator), comparing the loss and every
output, the clipped norm, every gradient, AdamW's moments, the parameters and buffers after each
step, bit for bit (float32, one thread); evaluation under ``no_grad``; one step under
``torch.autocast("cpu", dtype=torch.bfloat16)`` next to eager's autocast step. Compile counts: one
per mode (train, eval) but where ``EVAL_COMPILES`` says; Dynamo's graphs compile once each and
none runs eagerly."""

import functools

import pytest
import torch


transformers = pytest.importorskip("transformers")
from models_round10 import FAMILIES  # noqa: E402
from test_models_round9 import MODES, _assert_equal, _compiled  # noqa: E402
from test_models_round9 import _train_and_evaluate as train_and_evaluate  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
QUICK = {"olmo", "swinv2", "unispeech_sat", "mobilebert"}
#: Evaluation compiles other than one: RWKV's first call in eval mode "rescales" its layers and
#: sets ``layers_are_rescaled``, which its next call reads (eager's takes the other branch too).
EVAL_COMPILES = {"rwkv": 2}
#: Families whose traced program is not eager's bit for bit, compared at float32's tolerance:
#: FalconMamba's selective scan takes its ``associative_scan`` path when ``is_compiling()`` answers
#: True, as it does under Dynamo and while thunder_rs traces (``core.lang.torch_overrides``: the
#: same recurrence summed in another order, a trace of 2 log2(n) rounds instead of n).
TOLERANT = {"falcon_mamba"}
#: Families Dynamo itself cannot capture (``torch.compile(backend="eager")`` neither): with no
#: padding mask, Nystromformer's fake-tensor run adds a mask of every key to the landmark scores
#: (shapes that do not broadcast), before a graph reaches a backend.
NOT_CAPTURED = {"nystromformer"}


def _matches(actual: list, expected: list, what: str, name: str) -> None:
    if name not in TOLERANT:
        return _assert_equal(actual, expected, what)
    assert len(actual) == len(expected), what
    for i, (a, e) in enumerate(zip(actual, expected)):
        torch.testing.assert_close(a, e, msg=lambda m: f"{what} #{i}: {m}")


def _train_and_evaluate(name: str, mode: str, autocast: bool) -> None:
    """Round 9's run (``test_models_round9``) over this round's families and expectations."""
    check = functools.partial(_matches, name=name)
    train_and_evaluate(name, mode, autocast, FAMILIES, check, train_compiles={}, eval_compiles=EVAL_COMPILES)


#: Families one of whose Dynamo graphs runs eagerly (their values still eager's): PEGASUS-X's
#: sinusoidal positions divide ``np.log(max_scale)`` by an int, which Dynamo's graph holds as
#: ``torch._dynamo.utils.wrapped_truediv`` (a NumPy operator run on ``torch._numpy`` arrays under
#: ``DisableTorchFunction``): the division reaches torch's dispatch with a traced tensor.
EAGER_GRAPH = pytest.mark.xfail(raises=AssertionError, strict=True, reason="a graph of NumPy operators runs eagerly")
EAGER_GRAPHS = {"pegasus_x"}


def _params(names, quick):
    return [
        pytest.param(
            n,
            mode,
            marks=[
                *(() if n in quick and mode == "jit" else [pytest.mark.slow]),
                *([EAGER_GRAPH] if mode == "compile" and n in EAGER_GRAPHS else []),
            ],
        )
        for n in names
        for mode in MODES
        if not (mode == "compile" and n in NOT_CAPTURED)
    ]


@pytest.mark.parametrize("name,mode", _params(FAMILIES, QUICK))
def test_family_trains_and_evaluates_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=False)


@pytest.mark.parametrize("name,mode", _params(FAMILIES, {"mobilebert"}))
def test_family_takes_an_autocast_step_as_eager(name, mode):
    _train_and_evaluate(name, mode, autocast=True)


# -- what differed -------------------------------------------------------------------------------


def _add_bias(h, b):
    h += b
    return h


def _sub_scaled_bias(h, b):
    return h.sub_(b, alpha=3.0)


def _mul_by(h, b):
    return h.mul_(other=b)


#: (a float32 operand of the same shape has its gradient in float32's already where it is added)
WRITTEN = [
    (_add_bias, (99,), torch.bfloat16),
    (_add_bias, (8, 99), torch.float16),
    (_sub_scaled_bias, (2, 8, 99), torch.bfloat16),
    (_mul_by, (99,), torch.bfloat16),
    (_mul_by, (2, 8, 99), torch.float16),
]


@pytest.mark.parametrize(
    "fn,shape,dtype,mode",
    [
        pytest.param(*case, mode, marks=pytest.mark.slow if mode == "compile" and i else ())
        for i, case in enumerate(WRITTEN)
        for mode in MODES
    ],
)
def test_a_wider_operand_written_in_place_has_eagers_gradient(fn, shape, dtype, mode):
    """MobileBERT's prediction head under autocast (``hidden_states += self.decoder.bias``, a
    bfloat16 matmul's result and a float32 bias): eager differentiates the in-place op in the
    written tensor's dtype, rounding ``grad * self`` and summing to the operand's shape there
    before casting; the trace summed (and multiplied) in float32."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 8, 16, generator=g), torch.randn(16, 99, generator=g)
    b, cotangent = torch.randn(shape, generator=g), torch.randn(2, 8, 99, generator=g)

    def program(x, w, b):
        return fn((x @ w).to(dtype), b)

    seen = []
    for call in (_compiled(program, mode), program):
        inputs = [t.clone().requires_grad_() for t in (x, w, b)]
        out = call(*inputs)
        seen.append([out, *torch.autograd.grad(out, inputs, cotangent.to(dtype))])
    _assert_equal(*seen, "output and gradients")
