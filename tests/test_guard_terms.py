"""The per-call guard check computes some guards together (``core.state.guard_terms``): an argument
object's path read once, a dict's identity guards in one pass, one class's attributes with one read
of its MRO, closure cells in one pass, a held tensor's metadata field by field. Each change those
guards protect still recompiles between calls, so every call computes what eager computes."""

import types

import pytest
import torch

import thunder_rs
from thunder_rs.core.state.guard_terms import compile_check, unimplied
from thunder_rs.core.state.guards import MISSING, CellSource, Guard, InputSource, NamesGuard


def _recompiles_as_eager(fn, args_of, changes):
    """Each change between calls gives eager's result, through one recompile each."""
    jfn = thunder_rs.jit(fn, dynamic=False)
    torch.testing.assert_close(jfn(*args_of()), fn(*args_of()))
    torch.testing.assert_close(jfn(*args_of()), fn(*args_of()))
    for change in changes:
        change()
        for _ in range(2):  # the second call hits: the new entry's check is compiled now
            out, expected = jfn(*args_of()), fn(*args_of())
            torch.testing.assert_close(out, expected)
            assert out.dtype == expected.dtype
    assert thunder_rs.cache_misses(jfn) == len(changes) + 1


class Base:
    scale = 2.0
    shift = 1.0


class Config(Base):
    pass


class Other:
    scale = 7.0
    shift = -1.0


CONFIG = Config()


def _by_class(x):
    return x * CONFIG.scale + CONFIG.shift


def test_class_attributes_shadowed_rebound_or_reached_through_new_bases_recompile():
    x = torch.randn(5)
    changes = [
        lambda: setattr(Config, "scale", 5.0),  # now found on the class before the one traced
        lambda: setattr(Base, "shift", 3.0),
        lambda: delattr(Config, "scale"),
        lambda: setattr(Config, "__bases__", (Other,)),  # another MRO
    ]
    try:
        _recompiles_as_eager(_by_class, lambda: (x,), changes)
    finally:
        Config.__bases__ = (Base,)
        Base.shift = 1.0


def _closure():
    act, mode, times = torch.relu, "scale", 2

    def fn(x):
        y = act(x)
        return y * times if mode == "scale" else y + times

    def set_(name, value):
        nonlocal act, mode, times
        if name == "act":
            act = value
        elif name == "mode":
            mode = value
        else:
            times = value

    def clear():
        nonlocal act
        del act

    return fn, set_, clear


def test_closure_cells_rebound_to_other_objects_types_or_values_recompile():
    fn, set_, _ = _closure()
    x = torch.arange(-3, 4)
    changes = [
        lambda: set_("act", torch.abs),
        lambda: set_("mode", "shift"),
        lambda: set_("times", 2.0),  # equal to 2, but a float: a float result, as eager's
        lambda: set_("times", True),
    ]
    _recompiles_as_eager(fn, lambda: (x,), changes)


def test_a_cell_emptied_between_calls_fails_the_check_and_raises_as_eager():
    fn, _, clear = _closure()
    x = torch.randn(3)
    jfn = thunder_rs.jit(fn)
    torch.testing.assert_close(jfn(x), fn(x))
    clear()
    with pytest.raises(NameError):
        fn(x)
    with pytest.raises(NameError):
        jfn(x)


def test_the_grouped_cell_check_is_false_for_an_empty_cell():
    def make():
        value = object()

        def read():
            return value

        def clear():
            nonlocal value
            del value

        return read, clear

    read, clear = make()
    cell = read.__closure__[0]
    guards = [Guard(CellSource(cell, "value"), "cell_contents", cell.cell_contents, "here") for _ in range(3)]
    check = compile_check(guards)
    assert check([]) is True
    clear()
    assert check([]) is False
    assert all(g.read([]) is MISSING for g in guards)


A, B, C, D = torch.relu, torch.tanh, torch.sigmoid, torch.abs


def _by_globals(x):
    return A(x) + B(x) + C(x) + D(x)


def test_globals_checked_together_recompile_when_one_is_rebound():
    x = torch.randn(4)
    g = globals()
    changes = [lambda: g.update(C=torch.exp), lambda: g.update(A=torch.neg)]
    try:
        _recompiles_as_eager(_by_globals, lambda: (x,), changes)
    finally:
        g.update(A=torch.relu, C=torch.sigmoid)


class Layer:
    def __init__(self, keys):
        self.keys, self.scale = keys, 2.0

    def shift(self):
        return 1.0


class Holder:
    """An argument object holding its tensors in a list's objects (a KV cache's layers)."""

    def __init__(self, keys):
        self.layers = [Layer(keys)]


def _by_held(x, holder):
    layer = holder.layers[0]
    return x * layer.scale + layer.keys.sum(0)


@pytest.mark.parametrize(
    "other",
    [
        lambda k: k.double(),
        lambda k: k.requires_grad_(),
        lambda k: k[:, :2].clone(),
        lambda k: k.t().contiguous().t(),  # the same sizes, not contiguous
        lambda k: torch.nn.Parameter(k.clone(), requires_grad=False),  # a tensor subclass
    ],
    ids=["dtype", "requires_grad", "shape", "layout", "subclass"],
)
def test_a_tensor_an_argument_object_holds_is_checked_field_by_field(other):
    keys = torch.randn(3, 4)
    x = torch.randn(4)
    jfn = thunder_rs.jit(_by_held, dynamic=False)
    torch.testing.assert_close(jfn(x, Holder(keys)), _by_held(x, Holder(keys)))
    torch.testing.assert_close(jfn(x, Holder(keys.clone())), _by_held(x, Holder(keys)))
    assert thunder_rs.cache_misses(jfn) == 1
    new = other(keys.clone())
    x = torch.randn(new.shape[1])
    out, expected = jfn(x, Holder(new)), _by_held(x, Holder(new))
    torch.testing.assert_close(out, expected)
    assert (out.dtype, out.requires_grad) == (expected.dtype, expected.requires_grad)
    # (a Parameter too: the program may ask ``isinstance(t, nn.Parameter)``, as eager answers it)
    assert thunder_rs.cache_misses(jfn) == 2


def test_an_argument_object_missing_a_step_of_a_path_misses_and_runs_as_eager():
    keys, x = torch.randn(3, 4), torch.randn(4)
    jfn = thunder_rs.jit(_by_held)
    torch.testing.assert_close(jfn(x, Holder(keys)), _by_held(x, Holder(keys)))
    holder = Holder(keys)
    holder.layers[0].scale = 3.0
    torch.testing.assert_close(jfn(x, holder), _by_held(x, holder))
    del holder.layers[0].scale
    with pytest.raises(AttributeError):
        _by_held(x, holder)
    with pytest.raises(AttributeError):
        jfn(x, holder)


class Steps:
    def first(self, x):
        return x + 1

    def second(self, x):
        return x * 2

    def run(self, x):
        return self.second(self.first(x))


STEPS = Steps()


def _by_methods(x, scale=2.0, shift=(1.0,)):
    return STEPS.run(x) * _scaled(x) + shift[0] * scale


def _scaled(x, factor=3.0):
    return x * factor


def test_methods_and_defaults_checked_together_recompile_when_one_is_rebound():
    x = torch.randn(3)
    changes = [
        lambda: setattr(Steps, "second", lambda self, x: x - 5),
        lambda: setattr(_scaled, "__defaults__", (4.0,)),
        lambda: setattr(_by_methods, "__defaults__", (2.0, (-1.0,))),
    ]
    saved = Steps.second, _scaled.__defaults__, _by_methods.__defaults__
    try:
        _recompiles_as_eager(_by_methods, lambda: (x,), changes)
    finally:
        Steps.second, _scaled.__defaults__, _by_methods.__defaults__ = saved


class OneStep:
    def step(self, x):
        return x + 1


ONE_STEP = OneStep()


def _by_one_method(x, scale=2.0):
    return ONE_STEP.step(x) * scale


def test_one_method_and_one_functions_defaults_checked_inline_recompile_when_rebound():
    """A method or defaults guard alone is one inline term (``guard_terms.INLINED``), not a pass."""
    x = torch.randn(3)
    changes = [
        lambda: setattr(OneStep, "step", lambda self, x: x - 5),
        lambda: setattr(_by_one_method, "__defaults__", (3.0,)),
        lambda: delattr(OneStep, "step") or setattr(OneStep, "step", lambda self, x: x * 7),
    ]
    saved = OneStep.step, _by_one_method.__defaults__
    try:
        _recompiles_as_eager(_by_one_method, lambda: (x,), changes)
    finally:
        OneStep.step, _by_one_method.__defaults__ = saved


TABLE = {"a": torch.relu, "b": torch.tanh}
ORDER = [torch.sigmoid, torch.abs]
KINDS = {torch.float32}


def _by_containers(x):
    y = TABLE["a"](x) + TABLE["b"](x) + ORDER[0](x) + ORDER[1](x)
    return y * 2 if x.dtype in KINDS else y


def test_containers_compared_by_identity_recompile_when_changed_in_place():
    x = torch.randn(4)
    changes = [
        lambda: TABLE.update(b=torch.exp),
        lambda: ORDER.reverse(),
        lambda: (KINDS.discard(torch.float32), KINDS.add(torch.float64)),  # another item, the same length
        lambda: TABLE.update(c=torch.neg),
    ]
    try:
        _recompiles_as_eager(_by_containers, lambda: (x,), changes)
    finally:
        TABLE.clear()
        TABLE.update(a=torch.relu, b=torch.tanh)
        ORDER[:] = [torch.sigmoid, torch.abs]
        KINDS.clear()
        KINDS.add(torch.float32)


def _by_flag(x, holder):
    layer = holder.layers[0]
    y = x * layer.scale + layer.keys.sum(0) + layer.shift()
    return y + layer.extra if hasattr(layer, "extra") else y


@pytest.mark.parametrize("name", ["extra", "shift"])
def test_an_attribute_an_argument_object_gains_recompiles_where_its_names_are_checked_whole(name):
    # (``shift``: an instance attribute now shadows the method: its absence, which the object's
    # names imply, is not checked again on its own)
    keys, x = torch.randn(3, 4), torch.randn(4)
    jfn = thunder_rs.jit(_by_flag)
    for value in (None, 5.0, None):
        holder = Holder(keys)
        if value is not None:
            setattr(holder.layers[0], name, 5.0 if name == "extra" else lambda: 5.0)
        for _ in range(2):
            torch.testing.assert_close(jfn(x, holder), _by_flag(x, holder))
    assert thunder_rs.cache_misses(jfn) == 2


def test_an_absence_the_names_of_its_object_imply_is_checked_by_them():
    source = InputSource(0, (), "obj")
    absent, names = Guard(source, "b", MISSING, "here"), NamesGuard(source, frozenset({"a"}), "here")
    other = Guard(InputSource(1, (), "other"), "b", MISSING, "here")  # another object's absence
    assert unimplied([absent, names, other]) == [names, other]
    assert unimplied([absent, other]) == [absent, other]
    obj = types.SimpleNamespace(a=1)
    check = compile_check([absent, names])
    assert check([obj]) is True
    obj.b = 2
    assert check([obj]) is False
