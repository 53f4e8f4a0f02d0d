"""End-to-end behaviour of thunder_rs.jit: caching, traces, errors, modules and fallbacks."""

import pytest
import torch

import thunder_rs
from custom_ops import running_sum
from thunder_rs.errors import ThunderError


def tiny(a, b):
    return ((a + b).sin() * 2.0 - b.exp()).tanh()


def test_matches_eager_and_hits_the_cache():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    jf = thunder_rs.jit(tiny)
    torch.testing.assert_close(jf(a, b), tiny(a, b))
    torch.testing.assert_close(jf(b, a), tiny(b, a))
    assert thunder_rs.cache_misses(jf) == 1
    assert thunder_rs.cache_hits(jf) == 1


def test_shape_change_recompiles_with_a_reason():
    jf = thunder_rs.jit(tiny)
    jf(torch.randn(4, 4), torch.randn(4, 4))
    jf(torch.randn(2, 4), torch.randn(2, 4))
    stats = thunder_rs.compile_stats(jf)
    assert stats.cache_misses == 2
    assert "shape" in stats.miss_reasons[-1]
    assert stats.last_compile_s > 0 and "acquire" in stats.stage_s


def test_dtype_and_number_values_are_part_of_the_key():
    jf = thunder_rs.jit(lambda a, s: a * s)
    a = torch.randn(3)
    torch.testing.assert_close(jf(a, 2.0), a * 2.0)
    torch.testing.assert_close(jf(a, 3.0), a * 3.0)
    torch.testing.assert_close(jf(a.double(), 3.0), a.double() * 3.0)
    assert thunder_rs.cache_misses(jf) == 3


def test_traces_are_readable_and_runnable_text():
    jf = thunder_rs.jit(tiny)
    jf(torch.randn(4, 4), torch.randn(4, 4))
    traces = thunder_rs.last_traces(jf)
    acquired, execution = str(traces[0]), str(traces[-1])
    assert "ltorch.sin(" in acquired and "# t" in acquired and "prims.sin(" in acquired
    assert "def computation(" in execution and (".sin()" in execution or ".sin_()" in execution)
    assert [t.label for t in traces] == ["acquired", "dce", "cse", "views", "claim", "lifetimes"]


def test_dce_and_cse_remove_work():
    def f(a):
        unused = a.cos()  # noqa: F841
        return a.exp() + a.exp()

    jf = thunder_rs.jit(f)
    a = torch.randn(5)
    torch.testing.assert_close(jf(a), f(a))
    execution = str(thunder_rs.last_traces(jf)[-1])
    assert "cos" not in execution
    assert execution.count(".exp()") == 1


def test_nested_outputs_keep_their_structure():
    def f(a):
        return {"x": a + 1, "y": (a * 2, 3)}

    out = thunder_rs.jit(f)(torch.ones(2))
    assert set(out) == {"x", "y"} and out["y"][1] == 3
    torch.testing.assert_close(out["y"][0], torch.full((2,), 2.0))


def test_kwargs_and_non_contiguous_inputs():
    def f(a, *, b):
        return a * b + 1

    jf = thunder_rs.jit(f)
    a = torch.randn(4, 6).t()
    b = torch.randn(6, 4)
    torch.testing.assert_close(jf(a, b=b), f(a, b=b))


def test_shape_errors_name_the_op_and_leave_the_cache_alone():
    jf = thunder_rs.jit(lambda a, b: a + b)
    with pytest.raises(RuntimeError, match="ltorch.add") as info:
        jf(torch.randn(3), torch.randn(4))
    assert isinstance(info.value, ThunderError)
    assert thunder_rs.cache_misses(jf) == 0
    torch.testing.assert_close(jf(torch.ones(3), torch.ones(3)), torch.full((3,), 2.0))


def test_a_value_read_thunder_rs_cannot_answer_names_the_user_line():
    # bool()/item() are answered with the call's values (tests/test_data_dependent.py); numpy() is not.
    def f(a):
        if a.sum().numpy() > 0:
            return a
        return -a

    with pytest.raises(RuntimeError, match="numpy: data-dependent.*test_jit.py"):
        thunder_rs.jit(f)(torch.randn(3))


def test_unmapped_torch_calls_fall_back_to_eager():
    def f(a):
        return running_sum(a) * 2

    a = torch.randn(5)
    jf = thunder_rs.jit(f)
    torch.testing.assert_close(jf(a), f(a))
    report = thunder_rs.examine(f, a)
    name = "torch._ops.thunder_rs_tests.running_sum.default"
    assert report.fallbacks == {name: 1}
    assert report.supported.get("ltorch.mul") == 1
    assert name in str(report)


def test_captured_tensors_are_inputs_read_at_every_call():
    # A closure's tensors, a parameter outside any module and an index: each becomes a trace
    # input bound to that tensor, so in-place updates are seen without recompiling and
    # gradients reach a captured tensor that requires grad.
    scale, offset = torch.randn(4), torch.nn.Parameter(torch.randn(4))
    columns = torch.tensor([0, -1])

    def f(x):
        return torch.where(x > 0, x * scale + offset, 0.0)[:, columns].sum(0)

    jf = thunder_rs.jit(f)
    x = torch.randn(3, 4, requires_grad=True)
    torch.testing.assert_close(jf(x), f(x))
    with torch.no_grad():
        scale.mul_(-2.0)
        columns[1] = 2
    out = jf(x)
    torch.testing.assert_close(out, f(x))
    assert thunder_rs.cache_misses(jf) == 1
    out.sum().backward()
    got = (x.grad, offset.grad)
    x.grad = offset.grad = None
    f(x).sum().backward()
    torch.testing.assert_close(got, (x.grad, offset.grad))


def test_plain_tensor_attributes_of_a_module_are_captured():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.factor = torch.linspace(0.5, 2.0, 4)  # neither parameter nor buffer

        def forward(self, x):
            return self.linear(x) * self.factor

    model = Scaled()
    jm = thunder_rs.jit(model)
    x = torch.randn(2, 4)
    torch.testing.assert_close(jm(x), model(x))
    model.factor.fill_(3.0)
    torch.testing.assert_close(jm(x), model(x))


def test_module_matches_eager_and_sees_parameter_updates():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    jm = thunder_rs.jit(model)
    x = torch.randn(3, 8)
    torch.testing.assert_close(jm(x), model(x))
    with torch.no_grad():
        model[0].weight.add_(1.0)
    torch.testing.assert_close(jm(x), model(x))
    assert thunder_rs.cache_misses(jm) == 1
    assert isinstance(jm, torch.nn.Module)


def test_module_train_eval_switch_recompiles_once_each():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    jm = thunder_rs.jit(model)
    x = torch.randn(2, 4)
    model.eval()
    torch.testing.assert_close(jm(x), model(x))
    model.train()
    jm(x)
    model.eval()
    jm(x)
    assert thunder_rs.cache_misses(jm) == 2


def test_jit_rejects_non_callables():
    with pytest.raises(TypeError, match="jit"):
        thunder_rs.jit(3)


def test_runtime_errors_name_the_call_and_keep_their_type():
    jf = thunder_rs.jit(lambda a, b: a // b)
    with pytest.raises(RuntimeError, match="floor_divide") as info:
        jf(torch.tensor([1, 2]), torch.tensor([0, 1]))
    assert isinstance(info.value, ThunderError)
    assert type(info.value) is thunder_rs.errors.ThunderRuntimeError  # the declared class, not a lookalike
    assert "execution trace line" in str(info.value)


def norm_net():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    net.temperature = 0.5
    return net.eval()


def test_jitted_module_forwards_attribute_access_to_the_wrapped_one():
    net = norm_net()
    jm = thunder_rs.jit(net)
    assert jm.temperature == 0.5
    net.temperature = 2.0
    assert jm.temperature == 2.0
    assert jm.extra_repr is not None and jm._model is net
    with pytest.raises(AttributeError, match="no_such"):
        jm.no_such


def test_jitted_module_state_dict_has_the_wrapped_modules_keys():
    net = norm_net()
    jm = thunder_rs.jit(net)
    state = jm.state_dict()
    assert list(state) == list(net.state_dict())
    assert dict(state._metadata) == dict(net.state_dict()._metadata)  # BatchNorm's version is kept
    # Loads in both directions: a checkpoint of the jitted module into the plain one, and back.
    other = norm_net()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    jm.load_state_dict(other.state_dict())
    x = torch.randn(5, 4)
    torch.testing.assert_close(jm(x), other(x))
    fresh = norm_net()
    fresh.load_state_dict(jm.state_dict())
    torch.testing.assert_close(fresh(x), other(x))


def test_jitted_submodule_keeps_keys_under_its_parent():
    outer = torch.nn.Module()
    outer.body = thunder_rs.jit(norm_net())
    plain = torch.nn.Module()
    plain.body = norm_net()
    assert list(outer.state_dict()) == list(plain.state_dict())
    result = outer.load_state_dict(plain.state_dict())
    assert not result.missing_keys and not result.unexpected_keys


class Holder:
    """An object that is not a pytree node, holding tensors in its attributes."""

    def __init__(self, tensors, label):
        self.tensors = tensors
        self.label = label


def test_returned_objects_holding_tensors_are_rebuilt_per_call():
    def f(x):
        return x.sin(), Holder([x * 2, (x + 1, x.exp())], "label")

    jf = thunder_rs.jit(f)
    first = jf(torch.ones(3))
    x = torch.randn(3)
    out, holder = jf(x)
    assert type(holder) is Holder and holder is not first[1] and holder.label == "label"
    _, expected = f(x)
    torch.testing.assert_close(holder.tensors, expected.tensors)
    assert all(type(t) is torch.Tensor for t in (holder.tensors[0], *holder.tensors[1]))
    torch.testing.assert_close(first[1].tensors[0], torch.full((3,), 2.0))  # an earlier result is kept


def test_an_argument_returned_after_storing_traced_tensors_in_it_is_that_calls_argument():
    def f(x, holder):
        holder.tensors = [x * 2]
        return holder, x + 1

    jf = thunder_rs.jit(f)
    for value in (1.0, 2.0):
        given = Holder([], "in")
        out, y = jf(torch.full((2,), value), given)
        assert out is given and type(given.tensors[0]) is torch.Tensor
        torch.testing.assert_close(given.tensors[0], torch.full((2,), 2 * value))
    assert thunder_rs.cache_misses(jf) == 1


def test_an_object_returned_twice_is_rebuilt_once_per_call():
    def f(x):
        holder = Holder([x * 2], "shared")
        return holder, {"again": holder}

    first, second = thunder_rs.jit(f)(torch.ones(2))
    assert second["again"] is first and type(first.tensors[0]) is torch.Tensor


def test_returned_objects_referring_to_themselves_are_new_each_call_and_refer_to_themselves():
    def f(x):
        holder = Holder([x * 2], "cyclic")
        holder.me = holder
        return holder

    jf = thunder_rs.jit(f)
    first, second = jf(torch.ones(2)), jf(torch.full((2,), 3.0))
    assert first is not second and first.me is first and second.me is second
    assert torch.equal(second.tensors[0], f(torch.full((2,), 3.0)).tensors[0])

    def g(x):  # a cycle that holds no traced tensor, made by each call too
        plain = Holder([], "plain")
        plain.me = plain
        return x * 2, Holder([x], plain)

    jg = thunder_rs.jit(g)
    (_, first), (_, holder) = jg(torch.ones(2)), jg(torch.ones(2))
    assert holder.label.me is holder.label and holder.label is not first.label


def test_fallbacks_of_one_name_are_different_symbols():
    # Property reads arrive as `getset_descriptor.__get__`: x.H and x.mH shared one fallback
    # symbol, so the second program ran the first's property.
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(thunder_rs.jit(lambda a: a.H)(x[0]), x[0].H)
    torch.testing.assert_close(thunder_rs.jit(lambda a: a.mH)(x), x.mH)


def test_a_data_dependent_refusal_the_program_catches_still_fails_the_trace():
    def program(x):
        try:
            n = int(x.sum().numpy())
        except Exception:  # noqa: BLE001 (the user's fallback, which eager never takes)
            n = 1
        return x * n

    with pytest.raises(
        thunder_rs.errors.ThunderRuntimeError, match="numpy: data-dependent .*The program caught this error"
    ):
        thunder_rs.jit(program)(torch.ones(2))
