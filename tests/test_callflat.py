"""Keyword calls flatten through optree (torch's ``_cxx_pytree``) on the per-call path: the same
leaves, order and recompiles as torch's pytree, for every container users pass."""

import collections
import dataclasses

import pytest
import torch
from torch.utils import _pytree as pytree

import thunder_rs
from thunder_rs.core.run import callflat

NT = collections.namedtuple("NT", "a b")


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


if hasattr(pytree, "register_dataclass"):
    pytree.register_dataclass(Pair)


def _structures():
    x, y = torch.randn(3), torch.randn(3)
    yield (x,), {"b": y, "a": x}
    yield (), {"d": {"z": x, "a": [y, 2.0]}, "od": collections.OrderedDict(q=y, p=x)}
    yield (NT(x, None),), {"t": (y, [x])}


@pytest.mark.parametrize("case", range(3))
def test_same_leaves_as_torch_pytree(case):
    args, kwargs = list(_structures())[case]
    flat, _ = callflat.flatten_call(args, kwargs)
    leaves, _ = pytree.tree_flatten((args, kwargs))
    assert len(flat) == len(leaves) and all(a is b for a, b in zip(flat, leaves))


def test_keyword_calls_match_eager_and_key_on_order():
    def f(x, *, a, b):
        return x * a - b

    jf = thunder_rs.jit(f)
    x, a, b = torch.randn(4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(jf(x, a=a, b=b), f(x, a=a, b=b))
    torch.testing.assert_close(jf(x, b=b, a=a), f(x, b=b, a=a))
    torch.testing.assert_close(jf(x, a=b, b=a), f(x, a=b, b=a))


def test_nested_containers_through_jit():
    def f(x, *, d, od):
        return x + d["z"] * d["a"][0] + d["a"][1] - od["q"] * od["p"]

    jf = thunder_rs.jit(f)
    x = torch.randn(3)
    for _ in range(2):
        d = {"z": torch.randn(3), "a": [torch.randn(3), 2.0]}
        od = collections.OrderedDict(q=torch.randn(3), p=torch.randn(3))
        torch.testing.assert_close(jf(x, d=d, od=od), f(x, d=d, od=od))
    d["a"][1] = 3.0  # a changed Python number: eager's meaning, never the old constant
    torch.testing.assert_close(jf(x, d=d, od=od), f(x, d=d, od=od))


def test_hf_model_output_is_a_node_for_optree():
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")
    x = torch.randn(2)
    out = modeling_outputs.BaseModelOutput(last_hidden_state=x, hidden_states=(x, x))
    flat, _ = callflat.flatten_call((out,), {"k": out})
    assert len(flat) == 6 and all(leaf is x for leaf in flat)


def test_registered_dataclass_through_jit(monkeypatch):
    """torch's ``register_dataclass`` does not reach optree: the leaves differ, and the call
    falls back to torch's pytree rather than keying a dataclass object as one leaf."""
    if not hasattr(pytree, "register_dataclass"):
        pytest.skip("torch without pytree.register_dataclass")
    monkeypatch.setattr(callflat, "_flatten", [callflat._first_flatten])

    def f(x, *, p):
        return x * p.x + p.y

    jf = thunder_rs.jit(f)
    x = torch.randn(3)
    for _ in range(2):
        p = Pair(torch.randn(3), torch.randn(3))
        torch.testing.assert_close(jf(x, p=p), f(x, p=p))


class _Box:
    def __init__(self, t):
        self.t = t


def test_type_only_torch_knows_falls_back(monkeypatch):
    """A node type registered with torch's pytree alone (optree sees a leaf): the call still binds
    the contents, through torch's pytree from then on."""
    monkeypatch.setattr(callflat, "_flatten", [callflat._first_flatten])
    pytree._private_register_pytree_node(
        _Box,
        lambda b: ([b.t], None),
        lambda xs, _: _Box(xs[0]),
        flatten_with_keys_fn=lambda b: ([(pytree.GetAttrKey("t"), b.t)], None),
    )
    try:

        def f(x, *, box):
            return x + box.t

        jf = thunder_rs.jit(f)
        x = torch.randn(3)
        for _ in range(2):
            box = _Box(torch.randn(3))
            torch.testing.assert_close(jf(x, box=box), f(x, box=box))
        assert callflat._flatten == [pytree.tree_flatten]
    finally:
        pytree.SUPPORTED_NODES.pop(_Box, None)


def test_optree_loads_at_the_first_keyword_call():
    """``import thunder_rs`` leaves optree unloaded (about 20 ms, issue 25); the first keyword call
    loads it, and from then on keyword calls flatten through it."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = (
        "import sys, torch, thunder_rs\n"
        "from thunder_rs.core.run import callflat\n"
        "before = 'optree' in sys.modules\n"
        "f = thunder_rs.jit(lambda x, *, y: x + y)\n"
        "x = torch.randn(3)\n"
        "torch.testing.assert_close(f(x, y=x), x + x)\n"
        "print(before, 'optree' in sys.modules, callflat._flatten[0].__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "torch.utils._cxx_pytree"], out


def test_equal_specs_are_one_key_object():
    """A call's spec keys the cache as one object per distinct spec (``callflat.SpecKey``), whose
    hash and equality are its identity: a lookup does not hash the spec's tree."""
    first = callflat.flatten_call((torch.randn(2),), {"k": 1})[1]
    assert callflat.flatten_call((torch.randn(3),), {"k": 2.0})[1] is first
    assert callflat.flatten_call((torch.randn(2),), {"j": 1})[1] is not first
    assert callflat.flatten_call((torch.randn(2), 1), {})[1] is not first
