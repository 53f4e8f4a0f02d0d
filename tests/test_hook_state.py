"""What forward hooks and a module's own forward read and write is program state: a hook's
closure variables and a hook object's attributes are guarded (changing them recompiles), and
attributes a hook sets on an object are set again by every call. Backward hooks on modules inside
the program are refused."""

import copy

import pytest
import torch
import torch.nn as nn

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


class Steer:
    """An activation-steering hook object."""

    def __init__(self):
        self.alpha = 1.0
        self.calls = 0

    def __call__(self, module, args, out):
        self.calls += 1
        return out * self.alpha


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def test_a_hook_objects_attributes_are_guarded_and_its_writes_repeated():
    model, x = _model(), torch.randn(3, 4)
    steer = Steer()
    model[1].register_forward_hook(steer)
    jmodel = thunder_rs.jit(model)
    torch.testing.assert_close(jmodel(x), model(x))
    steer.alpha = 0.0
    torch.testing.assert_close(jmodel(x), model(x))
    jmodel(x)
    assert steer.calls == 5  # two eager calls, three compiled ones


def test_a_hooks_closure_variable_is_guarded():
    model, x = _model(), torch.randn(3, 4)
    scale = 1.0
    model[0].register_forward_pre_hook(lambda module, args: (args[0] * scale,))
    jmodel = thunder_rs.jit(model)
    torch.testing.assert_close(jmodel(x), model(x))
    scale = 0.5  # noqa: F841 (read by the hook)
    torch.testing.assert_close(jmodel(x), model(x))


def test_a_forward_defined_in_a_function_reads_its_closure_on_every_call():
    def make():
        factor = [1.0]

        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 2)

            def forward(self, x):
                return self.lin(x) * factor[0]

        def set_factor(value):
            factor[0] = value

        return Scaled(), set_factor

    model, set_factor = make()
    jmodel, x = thunder_rs.jit(model), torch.randn(3, 4)
    torch.testing.assert_close(jmodel(x), model(x))
    set_factor(0.0)
    torch.testing.assert_close(jmodel(x), model(x))


def test_a_hook_that_appends_to_a_closure_list_appends_as_in_eager():
    # The list in the hook's closure is state, as a global list: each call appends once.
    model, calls = _model(), []
    model[0].register_forward_hook(lambda module, args, out: calls.append(1))
    jmodel, x = thunder_rs.jit(model), torch.randn(3, 4)
    for n in range(1, 4):
        torch.testing.assert_close(jmodel(x), model(x))
        assert calls == [1] * (2 * n)


def test_a_global_module_backward_hook_is_refused_naming_it():
    # It hooks every module's autograd nodes, which a jitted program's modules do not have; the
    # refusal named only the module's own register_full_backward_hook.
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None)
    try:
        with pytest.raises(ThunderNotImplementedError, match="register_module_full_backward_hook"):
            thunder_rs.jit(model)(torch.randn(2, 3, requires_grad=True))
    finally:
        handle.remove()


class _HookedInForward(nn.Module):
    """Registers a hook on a submodule in each forward and removes it after the submodule's call."""

    def __init__(self, pre: bool):
        super().__init__()
        self.lin, self.out, self.pre, self.seen = nn.Linear(4, 4), nn.Linear(4, 2), pre, []

    def forward(self, x):
        if self.pre:
            handle = self.lin.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
        else:
            handle = self.lin.register_forward_hook(lambda module, args, out: self.seen.append(out.shape) or out * 2)
        h = self.lin(x)
        handle.remove()
        return self.out(self.lin(h).relu())


@pytest.mark.parametrize("pre", [False, True], ids=["forward_hook", "pre_hook"])
def test_a_hook_registered_and_removed_in_forward_runs_on_every_call(pre):
    # The clone traced registered it in the user's module's hook dict, shared with the clone: its
    # closure over the clone escaped, and a hook's write through it (self.seen) was not replayed.
    torch.manual_seed(0)
    model, x = _HookedInForward(pre), torch.randn(3, 4)
    jmodel = thunder_rs.jit(model)
    for n in range(1, 4):
        torch.testing.assert_close(jmodel(x), model(x))
        assert len(model.seen) == (0 if pre else 2 * n)
        assert not model.lin._forward_hooks and not model.lin._forward_pre_hooks


def test_hooks_registered_in_forward_and_left_there_pile_up_as_in_eager():
    # Eager's forward adds one more hook on every call; compiled, the trace's one alone stayed.
    class Leaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin.register_forward_hook(lambda module, args, out: out * 2)
            return self.lin(x)

    torch.manual_seed(0)
    model, x = Leaky(), torch.randn(3, 4)
    compiled = copy.deepcopy(model)
    jmodel = thunder_rs.jit(compiled)
    for n in range(1, 4):
        torch.testing.assert_close(jmodel(x), model(x))
        assert len(compiled.lin._forward_hooks) == len(model.lin._forward_hooks) == n


def test_hooks_a_forward_installs_once_behind_a_flag_stay():
    # Hugging Face's output capture installs its hooks in the first forward and sets a flag.
    class Lazy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.installed, self.captured = nn.Linear(4, 4), False, []

        def forward(self, x):
            if not self.installed:
                self.lin.register_forward_hook(lambda module, args, out: self.captured.append(out.shape))
                self.installed = True
            return self.lin(x).relu()

    torch.manual_seed(0)
    model, x = Lazy(), torch.randn(3, 4)
    compiled = copy.deepcopy(model)
    jmodel = thunder_rs.jit(compiled)
    for _ in range(3):
        torch.testing.assert_close(jmodel(x), model(x))
    assert len(compiled.lin._forward_hooks) == len(model.lin._forward_hooks) == 1
    assert compiled.captured == model.captured and len(model.captured) == 3


class _Swaps(nn.Module):
    """Removes the hook its last call registered (through the handle it kept) and registers anew."""

    def __init__(self):
        super().__init__()
        self.lin, self.handle, self.calls = nn.Linear(4, 4), None, 0

    def forward(self, x):
        if self.handle is not None:
            self.handle.remove()
        self.calls += 1
        self.handle = self.lin.register_forward_hook(lambda module, args, out: out * (self.calls + 1))
        return self.lin(x)


def test_a_handle_kept_from_an_earlier_call_removes_that_calls_hook():
    # Handles pointed at the traced clone's copy of the hook store: the hooks piled up, silently.
    torch.manual_seed(0)
    model, x = _Swaps(), torch.randn(3, 4)
    compiled = copy.deepcopy(model)
    jmodel = thunder_rs.jit(compiled)
    for _ in range(3):
        torch.testing.assert_close(jmodel(x), model(x))
        assert len(compiled.lin._forward_hooks) == len(model.lin._forward_hooks) == 1
    compiled.handle.remove()
    model.handle.remove()
    assert not compiled.lin._forward_hooks  # removed outside the call: the user's module's hook
    model.handle = compiled.handle = None
    torch.testing.assert_close(jmodel(x), model(x))
    assert len(compiled.lin._forward_hooks) == len(model.lin._forward_hooks) == 1


_REGISTRATIONS = {
    "forward": lambda lin: lin.register_forward_hook(lambda m, args, out: out * 2),
    "pre": lambda lin: lin.register_forward_pre_hook(lambda m, args: (args[0] * 3,)),
    "with_kwargs": lambda lin: lin.register_forward_hook(lambda m, args, kwargs, out: out + 1, with_kwargs=True),
    "prepend": lambda lin: lin.register_forward_hook(lambda m, args, out: out - 1, prepend=True),
    "always_call": lambda lin: lin.register_forward_hook(lambda m, args, out: out * 4, always_call=True),
}


@pytest.mark.parametrize("kind", list(_REGISTRATIONS))
def test_a_hook_registered_and_removed_in_every_forward_compiles_once(kind):
    class Registers(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            handle = _REGISTRATIONS[kind](self.lin)
            y = self.lin(x).relu()
            handle.remove()
            return self.lin(y)

    torch.manual_seed(0)
    model = Registers()
    jmodel = thunder_rs.jit(model)
    for _ in range(5):
        x = torch.randn(3, 4)
        torch.testing.assert_close(jmodel(x), model(x))
    assert thunder_rs.cache_misses(jmodel) == 1


def test_a_trace_that_fails_leaves_the_modules_hooks_as_they_were():
    class Refused(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin.register_forward_hook(lambda m, args, out: out * 2)
            y = self.lin(x)
            print(f"{y}")  # refused: text formatted from a traced tensor
            return y

    model = Refused()
    kept = model.lin.register_forward_pre_hook(lambda m, args: None)
    with pytest.raises(ThunderNotImplementedError, match="formats a traced tensor"):
        thunder_rs.jit(model)(torch.randn(2, 4))
    assert not model.lin._forward_hooks and list(model.lin._forward_pre_hooks) == [kept.id]


def test_hooks_a_jitted_function_leaves_on_a_module_it_calls_pile_up_as_in_eager():
    # The trace registered its hook on the user's module itself, and the entry, whose hooks were
    # read after it, served the next calls: one hook ran where eager's ran two, three.
    def make(lin):
        def fn(x):
            lin.register_forward_hook(lambda module, args, out: out * 2)
            return lin(x).relu()

        return fn

    torch.manual_seed(0)
    lin, x = nn.Linear(4, 4), torch.randn(3, 4)
    compiled = copy.deepcopy(lin)
    eager, jfn = make(lin), thunder_rs.jit(make(compiled))
    for n in range(1, 4):
        torch.testing.assert_close(jfn(x), eager(x))
        assert len(compiled._forward_hooks) == len(lin._forward_hooks) == n
