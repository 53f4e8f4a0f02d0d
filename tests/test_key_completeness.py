"""What about a call's tensor arguments may change from one call to the next without changing what
the cache key held (dtype, device, shape, requires_grad, layout, inference) and still change what
eager computes: each property is called first one way, then the other, against eager. A property
the key holds now (leaf or not, the tensor's type) recompiles; one no compiled call specialises on
(``_base``, ``_version``) is refused where the program reads it, naming the line; an argument
written in place that shares memory with the module's own tensors is refused, as one sharing it
with another argument is (``test_argument_aliases.py``, ``test_state_aliases.py``). A Python
attribute of a tensor argument (``x.scale``) is read as eager reads it and guarded; one set on a
traced tensor is refused."""

import pytest
import torch
from torch import nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


def _leaf():
    return torch.ones(3, requires_grad=True)


def _not_leaf():
    return torch.ones(3, requires_grad=True) * 1


def _is_leaf(x):
    return x * 2, x.is_leaf


def _grad_fn_or_leaf(x):
    return x * 2 if x.is_leaf else x * 3


@pytest.mark.parametrize("first", ["leaf", "not a leaf"])
@pytest.mark.parametrize("program", [_is_leaf, _grad_fn_or_leaf], ids=["reads", "branches"])
def test_a_leaf_and_a_tensor_that_is_not_one_answer_is_leaf_as_eager(first, program):
    jf = thunder_rs.jit(program)
    makes = {"leaf": _leaf, "not a leaf": _not_leaf}
    order = [first, *(m for m in makes if m != first)]
    for name in (*order, first):
        torch.testing.assert_close(jf(makes[name]()), program(makes[name]()), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 2
    reasons = thunder_rs.compile_stats(jf).miss_reasons
    assert ("requires_grad True -> True (not a leaf)" if first == "leaf" else "(not a leaf) -> True") in reasons[1]


def _scaled_if_parameter(x):
    return x * 2 if isinstance(x, nn.Parameter) else x * 3


@pytest.mark.parametrize("first", ["tensor", "parameter"])
def test_a_parameter_argument_and_a_plain_tensor_answer_isinstance_as_eager(first):
    makes = {"tensor": lambda: torch.ones(3), "parameter": lambda: nn.Parameter(torch.ones(3), requires_grad=False)}
    jf = thunder_rs.jit(_scaled_if_parameter)
    for name in (first, *(m for m in makes if m != first), first):
        torch.testing.assert_close(jf(makes[name]()), _scaled_if_parameter(makes[name]()), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 2
    assert "x: type " in thunder_rs.compile_stats(jf).miss_reasons[1]


class _ChecksItsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x) * (2 if isinstance(self.lin.weight, nn.Parameter) else 3)


def test_a_module_parameter_is_a_parameter_to_the_program():
    model = _ChecksItsWeight()
    x = torch.randn(2)
    torch.testing.assert_close(thunder_rs.jit(model)(x), model(x), rtol=0, atol=0)


class _OwnTorchFunction(torch.Tensor):
    """A subclass whose ``__torch_function__`` sees each torch call: a compile refuses it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_with_its_own_torch_function_after_a_plain_tensor_is_refused_as_on_a_first_call():
    jf = thunder_rs.jit(lambda x: x * 2)
    jf(torch.ones(3))
    with pytest.raises(ThunderNotImplementedError, match="_OwnTorchFunction defines its own __torch_function__"):
        jf(torch.ones(3).as_subclass(_OwnTorchFunction))


def _scaled_if_view(x):
    return x * 2 if x._base is None else x * 3


def _scaled_by_version(x):
    return x * x._version


@pytest.mark.parametrize(
    "program, name",
    [(_scaled_if_view, "_base"), (_scaled_by_version, "_version")],
    ids=["_base", "_version"],
)
def test_reads_no_compiled_call_specialises_on_are_refused_naming_the_line(program, name):
    jf = thunder_rs.jit(program)
    with pytest.raises(ThunderNotImplementedError, match=rf"Tensor\.{name}: read at .*test_key_completeness\.py"):
        jf(torch.ones(4)[:3].add_(1))


def _scaled_if_no_node(x):
    return x * 2 if x.grad_fn is None else x * 3


def test_grad_fn_is_none_where_eagers_is_and_refused_where_eager_has_a_node():
    jf = thunder_rs.jit(_scaled_if_no_node)
    for make in (torch.ones, _leaf):
        x = make(3) if make is torch.ones else make()
        torch.testing.assert_close(jf(x), _scaled_if_no_node(x), rtol=0, atol=0)
    with pytest.raises(ThunderNotImplementedError, match=r"Tensor\.grad_fn: read at .*test_key_completeness\.py"):
        jf(_not_leaf())
    with pytest.raises(ThunderNotImplementedError, match=r"Tensor\.grad_fn"):
        thunder_rs.jit(lambda x: _scaled_if_no_node(x * 2))(_leaf())


class _Holder:
    def __init__(self, t):
        self.t = t


def _held_is_leaf(x, holder):
    return x * 2 if holder.t.is_leaf else x * 3


@pytest.mark.parametrize("first", ["leaf", "not a leaf"])
def test_a_tensor_an_argument_object_holds_is_a_leaf_or_not_as_eager(first):
    makes = {"leaf": _leaf, "not a leaf": _not_leaf}
    jf = thunder_rs.jit(_held_is_leaf)
    x = torch.randn(3)
    for name in (first, *(m for m in makes if m != first), first):
        torch.testing.assert_close(jf(x, _Holder(makes[name]())), _held_is_leaf(x, _Holder(makes[name]())))
    assert thunder_rs.cache_misses(jf) == 2


class _WritesItsArgument(nn.Module):
    """Writes its argument in place, then reads its buffer and parameter: where the argument is the
    buffer (or a view of it), eager reads the written values."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.arange(4.0))
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        with torch.no_grad():
            x.add_(1)
        return self.buf * 2 + self.w


_ARGUMENTS = {
    "the buffer": lambda m: m.buf,
    "a view of the buffer": lambda m: m.buf[:],
    "a view of the parameter": lambda m: m.w.detach()[:],
}


@pytest.mark.parametrize("argument", list(_ARGUMENTS))
@pytest.mark.parametrize("first", [True, False], ids=["first", "after a fresh tensor"])
def test_an_argument_written_in_place_that_shares_the_modules_memory_is_refused(argument, first):
    model = _WritesItsArgument()
    jm = thunder_rs.jit(model)
    if not first:
        eager = _WritesItsArgument()
        torch.testing.assert_close(jm(torch.arange(4.0)), eager(torch.arange(4.0)), rtol=0, atol=0)
    with pytest.raises(ThunderNotImplementedError, match="parameter or buffer of the module, that shares its memory"):
        jm(_ARGUMENTS[argument](model))


def _tagged(**attributes):
    t = torch.ones(3)
    for name, v in attributes.items():
        setattr(t, name, v)
    return t


def _scaled_by_attribute(x):
    return x * getattr(x, "scale", 1.0)


def _scaled_if_tagged(x):
    return x * 2 if hasattr(x, "scale") else x * 3


@pytest.mark.parametrize("program", [_scaled_by_attribute, _scaled_if_tagged], ids=["getattr", "hasattr"])
def test_a_python_attribute_of_a_tensor_argument_is_read_as_eager_reads_it(program):
    jf = thunder_rs.jit(program)
    for attributes in ({"scale": 2.0}, {"scale": 3.0}, {}, {"scale": 2.0}, {}):
        torch.testing.assert_close(jf(_tagged(**attributes)), program(_tagged(**attributes)), rtol=0, atol=0)
    assert thunder_rs.cache_misses(jf) == 3  # (the value read is guarded, not only its presence)


def test_a_tensor_held_as_an_attribute_of_a_tensor_argument_is_that_calls():
    jf = thunder_rs.jit(lambda x: x * x.mask)
    for mask in (torch.zeros(3), torch.ones(3), torch.arange(3.0)):
        torch.testing.assert_close(jf(_tagged(mask=mask)), _tagged(mask=mask) * mask, rtol=0, atol=0)


def _tags_its_argument(x):
    x.seen = True
    return x * 2


def _tags_its_output(x):
    out = x * 2
    out.tag = "out"
    return out


@pytest.mark.parametrize("program", [_tags_its_argument, _tags_its_output], ids=["argument", "output"])
def test_setting_a_python_attribute_on_a_traced_tensor_is_refused_naming_the_line(program):
    with pytest.raises(ThunderNotImplementedError, match=r"sets '(seen|tag)' on a traced tensor at .*test_key_comp"):
        thunder_rs.jit(program)(torch.ones(3))


def test_a_tuple_then_a_list_recompiles_saying_the_structure_changed():
    jf = thunder_rs.jit(lambda x, s: (x * len(s), type(s).__name__))
    for s in ((1, 2), [1, 2]):
        out, kind = jf(torch.ones(2), s)
        assert kind == type(s).__name__
    assert "the arguments' structure changed" in thunder_rs.compile_stats(jf).miss_reasons[1]


class _ScaledByItsWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x) * getattr(self.lin.weight, "scale", 1.0)


def test_a_python_attribute_of_a_module_parameter_is_read_as_eager_reads_it():
    model = _ScaledByItsWeight()
    jm, x = thunder_rs.jit(model), torch.randn(2)
    for scale in (None, 3.0, 4.0):
        if scale is not None:
            model.lin.weight.scale = scale
        torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    assert "tensor[2, 2].scale changed from 3.0 to 4.0" in thunder_rs.compile_stats(jm).miss_reasons[-1]


class _Style:
    def __init__(self):
        self.tag = "a"


STYLE = _Style()


class _Viewed:
    """An object whose Python ``__getattribute__`` reads a global object."""

    def __getattribute__(self, name):
        STYLE.tag  # noqa: B018 (a read, as a config's alias map or logger)
        return super().__getattribute__(name)


def _scaled_if_configured(x):
    return x * 2 if x.cfg is not None else x * 3


def test_a_tensor_attributes_value_is_guarded_without_observing_its_getattribute():
    # The observer read ``x.cfg``'s attributes outside its own work: the ``__getattribute__`` that read
    # ran as the program's, and STYLE.tag, which the program never reads, was guarded (each change recompiled).
    jf, cfg = thunder_rs.jit(_scaled_if_configured), _Viewed()
    try:
        for tag in "bcd":
            torch.testing.assert_close(jf(_tagged(cfg=cfg)), _scaled_if_configured(_tagged(cfg=cfg)), rtol=0, atol=0)
            STYLE.tag = tag
        assert thunder_rs.compile_stats(jf).miss_reasons == ["first call"]
        torch.testing.assert_close(jf(_tagged(cfg=None)), _tagged(cfg=None) * 3, rtol=0, atol=0)  # (still guarded)
    finally:
        STYLE.tag = "a"
