"""Python state a compiled call cannot keep is refused with the user's line: gradients read or
set inside the program (a jitted optimizer step, ``zero_grad``), and changes to lists and dicts
reached through the arguments (an item appended to a cache's layers). Attributes set on objects
reached through them (a cache layer counting its tokens) are set again by every call."""

import collections
import copy

import pytest
import torch

import thunder_rs
from thunder_rs.errors import ThunderNotImplementedError


@pytest.mark.parametrize(
    "program",
    [
        lambda params, x: [p.sub_(0.1 * p.grad) for p in params if p.grad is not None] and x,
        lambda params, x: setattr(params[0], "grad", None) or x,
    ],
)
def test_reading_or_setting_grad_inside_a_program_is_refused(program):
    params = [torch.ones(3, requires_grad=True)]
    (params[0] * 2).sum().backward()
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"Tensor\.grad: the program (reads|sets) the \.grad of a "
        r"tensor at .*test_state_refusals\.py:\d+",
    ):
        thunder_rs.jit(program)(params, torch.ones(2))


def test_an_optimizer_zero_grad_inside_a_program_is_refused():
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 2)).sum().backward()

    def step(x):
        optimizer.zero_grad()
        return model(x).sum()

    with pytest.raises(ThunderNotImplementedError, match=r"Tensor\.grad: the program (reads|sets) the \.grad"):
        thunder_rs.jit(step)(torch.ones(1, 2))


class _Router(torch.nn.Module):
    """Switch Transformers' router: its classifier converted to the router's dtype in every
    forward (``self.classifier = self.classifier.to(self.dtype)``), where it is that dtype."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.dtype, self.classifier = dtype, torch.nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x):
        self.classifier = self.classifier.to(self.dtype)
        return self.classifier(x.to(self.dtype)).softmax(-1)


def test_a_module_converted_to_the_dtype_it_has_inside_a_program_is_left_as_it_is():
    # Module._apply read each parameter's .grad: refused as reading gradients, after a backward.
    router = _Router()
    reference = copy.deepcopy(router)
    jrouter = thunder_rs.jit(router)
    for _ in range(2):
        x = torch.randn(2, 4, dtype=torch.float64)
        out, expected = jrouter(x), reference(x)
        torch.testing.assert_close(out, expected)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(router.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    assert router.classifier.weight.dtype == torch.float64
    assert thunder_rs.cache_misses(jrouter) == 1


def test_a_module_converted_to_another_dtype_inside_a_program_is_refused_with_the_line():
    router = _Router(torch.float32)
    where = r"Linear\.to \(Module\._apply\) at .*test_state_refusals\.py:\d+"
    with pytest.raises(ThunderNotImplementedError, match=where):
        thunder_rs.jit(router)(torch.randn(2, 4))
    assert router.classifier.weight.dtype == torch.float64


class _Layer:
    def __init__(self):
        self.length = 0


class _Cache:
    def __init__(self):
        self.layers = [_Layer()]


def test_a_write_to_an_object_reached_through_a_list_of_an_argument_is_repeated_by_every_call():
    def program(x, cache):
        cache.layers[0].length += 1  # as a Hugging Face sliding-window cache layer counts its tokens
        return x + cache.layers[0].length

    jf, cache, eager = thunder_rs.jit(program), _Cache(), _Cache()
    for _ in range(3):
        torch.testing.assert_close(jf(torch.ones(2), cache), program(torch.ones(2), eager))
    assert cache.layers[0].length == eager.layers[0].length == 3
    # Each count is a value the trace read: a new one recompiles, naming it.
    assert thunder_rs.compile_stats(jf).miss_reasons[-1].startswith("cache.layers[0].length changed from 1 to 2")


def test_a_list_reached_through_an_argument_changed_by_the_program_is_refused_and_undone():
    def program(x, cache):
        cache.layers.append(_Layer())  # as DynamicCache.update makes its layers on the first call
        return x + 1

    cache = _Cache()
    layers = list(cache.layers)
    with pytest.raises(
        ThunderNotImplementedError,
        match=r"changed the list cache\.layers, which it reached through "
        r"its arguments, leaving objects in it",
    ):
        thunder_rs.jit(program)(torch.ones(2), cache)
    assert cache.layers == layers


def test_items_set_in_a_dict_reached_through_an_argument_are_set_by_every_call():
    # As an encoder-decoder cache marks a layer's cross-attention cache filled (is_updated[i] = True).
    class Cache:
        def __init__(self):
            self.is_updated = {0: False}
            self.counts = [0, 0]

    def program(x, cache):
        y = x * 2 if cache.is_updated[0] else x + 1
        cache.is_updated[0] = True
        cache.counts[1] = y.sum()  # a tensor: each call's own
        return y

    jf = thunder_rs.jit(program)
    for _ in range(3):
        cache, eager = Cache(), Cache()
        x = torch.randn(2)
        torch.testing.assert_close(jf(x, cache), program(x, eager))
        assert cache.is_updated == eager.is_updated == {0: True}
        torch.testing.assert_close(cache.counts[1], eager.counts[1])


@pytest.mark.parametrize(
    "program",
    [
        lambda x: torch.autograd.grad((x * x).sum(), x, create_graph=True)[0].norm(),
        lambda x: (x * x).sum().backward() or x,
    ],
    ids=["autograd.grad", "backward"],
)
def test_differentiating_inside_a_program_is_refused_with_the_line(program):
    # A gradient penalty (WGAN-GP) differentiates inside the step: thunder_rs differentiates the
    # whole call instead, and says so rather than failing on its stand-ins.
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(
        ThunderNotImplementedError, match=r"the program differentiates at .*test_state_refusals\.py:\d+"
    ):
        thunder_rs.jit(program)(x)


def test_sparse_embedding_gradients_are_refused():
    # Eager's weight gradient is a sparse tensor (for SparseAdam); thunder_rs's would be dense.
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    with pytest.raises(ThunderNotImplementedError, match="sparse gradients are not supported"):
        thunder_rs.jit(embedding)(torch.tensor([1, 2]))
    with torch.no_grad():
        torch.testing.assert_close(thunder_rs.jit(embedding)(torch.tensor([1, 2])), embedding(torch.tensor([1, 2])))


def test_where_with_only_a_condition_is_sized_by_the_values():
    # torch.where(condition) is condition.nonzero(as_tuple=True): the trace is specialised on its size.
    x = torch.tensor([1.0, -2.0, 3.0])
    torch.testing.assert_close(thunder_rs.jit(lambda x: torch.where(x > 0))(x), torch.where(x > 0))


class _LazyWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = None

    def forward(self, x):
        if self.w is None:
            self.w = torch.nn.Parameter(torch.ones(x.shape[-1]))
        return x * self.w


class _LazyStatistic(torch.nn.Module):
    def forward(self, x):
        if not hasattr(self, "stat"):
            self.register_buffer("stat", x.detach().mean(0))
        return x * self.stat


def test_a_buffer_registered_in_forward_is_registered_as_eager_leaves_it():
    # (Was refused: the call now registers the buffer after it, as eager's leaves it.)
    model, eager = _LazyStatistic(), _LazyStatistic()
    run = thunder_rs.jit(model)
    for x in (torch.randn(2, 3), torch.randn(2, 3)):
        torch.testing.assert_close(run(x), eager(x))
    assert torch.equal(model.stat, eager.stat) and list(model.state_dict()) == list(eager.state_dict())


@pytest.mark.parametrize("make", [_LazyWeight])
def test_registering_parameters_in_forward_is_refused_and_leaves_the_module(make):
    model = make()
    before = dict(vars(model))
    with pytest.raises(ThunderNotImplementedError, match="forward registers or removes"):
        thunder_rs.jit(model)(torch.randn(2, 3))
    assert vars(model).keys() == before.keys() and not list(model.parameters()) and not list(model.buffers())
    model(torch.randn(2, 3))  # initialised eagerly, it then compiles
    x = torch.randn(2, 3)
    torch.testing.assert_close(thunder_rs.jit(model)(x), model(x))


def test_a_lazy_module_asks_for_one_eager_call_first():
    model = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    with pytest.raises(ThunderNotImplementedError, match="0.weight is not initialised yet"):
        thunder_rs.jit(model)(torch.randn(2, 3))
    x = torch.randn(2, 3)
    model(x)
    torch.testing.assert_close(thunder_rs.jit(model)(x), model(x))


@pytest.mark.parametrize(
    "program",
    [
        lambda x, metrics: metrics.__setitem__("aux", object()) or x * 2,
        lambda x, cache: cache.append(cache) or x,
        lambda x, metrics: metrics.__setitem__(x.sum(), 1) or x,
    ],
    ids=["object_made_stored", "list_stored_in_itself", "tensor_key"],
)
def test_changing_a_container_given_as_an_argument_in_a_way_no_call_repeats_is_refused(program):
    # Other changes are made on the caller's container (``test_argument_container_writes``).
    container = [] if "cache" in program.__code__.co_varnames else {"old": 1.0}
    with pytest.raises(ThunderNotImplementedError, match="changed a list or dict it was given as an argument"):
        thunder_rs.jit(program)(torch.ones(2), container)


def test_reading_a_container_given_as_an_argument_still_works():
    def program(x, options):
        return x * options["scale"] + len(options["names"])

    options = {"scale": 2.0, "names": ["a", "b"]}
    torch.testing.assert_close(thunder_rs.jit(program)(torch.ones(2), options), program(torch.ones(2), options))


class _Scaled(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.eye(2).to_sparse(),
        lambda: torch.eye(2).to_sparse_csr(),
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
        lambda: torch.eye(2).as_subclass(_Scaled),
    ],
    ids=["sparse_coo", "sparse_csr", "nested", "torch_function_subclass"],
)
def test_tensors_a_dense_trace_cannot_stand_for_are_refused(make):
    with pytest.raises(ThunderNotImplementedError, match="is not supported|defines its own __torch_function__"):
        thunder_rs.jit(lambda x: x * 2)(make())


def test_a_parametrization_cached_across_calls_is_refused_naming_torchs_cache():
    """Under ``parametrize.cached()`` the weight a call computes stays in torch's cache for later
    calls, which a compiled call cannot keep: refused, naming ``cached()`` and the call's line."""
    model = torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3))
    with (
        torch.nn.utils.parametrize.cached(),
        pytest.raises(
            thunder_rs.errors.ThunderNotImplementedError,
            match=r"parametrize\.cached\(\) around the jitted call at .*test_state_refusals\.py:\d+",
        ),
    ):
        thunder_rs.jit(model)(torch.randn(2, 4))
    assert torch.nn.utils.parametrize._cache == {}


@pytest.mark.parametrize(
    "program",
    [
        lambda x: torch.nn.functional.one_hot(x.argmax(-1)),  # sizes itself from the values
        lambda x: torch._assert((x > -10).all(), "in range") or x * 2,
    ],
    ids=["one_hot", "_assert"],
)
def test_ops_that_read_values_are_specialised_on_them(program):
    x = torch.randn(3, 4)
    torch.testing.assert_close(thunder_rs.jit(program)(x), program(x))


class _RecurrentState(torch.nn.Module):
    """As RecurrentGemma's blocks: the state a step leaves for the next, a module attribute."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.state = None

    def forward(self, x):
        state = torch.zeros_like(x) if self.state is None else self.state
        self.state = torch.tanh(self.lin(x) + state)
        return self.state * 2


def test_a_tensor_stored_on_a_module_whose_forward_is_jitted_names_the_attribute_and_the_way():
    # Its forward jitted, the module is state the program reached, not the jitted module whose
    # attributes every call sets again: the error named "entry 'state' of a dict".
    model = _RecurrentState()
    with pytest.raises(RuntimeError, match=r"attribute 'state' of a _RecurrentState .*thunder_rs.jit\(model\)"):
        thunder_rs.jit(model.forward)(torch.randn(2, 3))
    eager, x = _RecurrentState(), torch.randn(2, 3)
    eager.load_state_dict(model.state_dict())
    jmodel = thunder_rs.jit(model)
    model.state = None  # (the refused call took its stand-in out, and the attribute with it)
    for _ in range(2):
        torch.testing.assert_close(jmodel(x), eager(x))
        torch.testing.assert_close(model.state, eager.state)


def _counter():
    return collections.Counter(calls=0)


def _counts(state):
    def f(x):
        if isinstance(state, list):
            state.append(len(state))
            return x * len(state)
        state["calls"] += 1
        return x * state["calls"]

    return f


def test_a_list_subclass_a_closure_holds_changed_by_the_program_is_refused():
    # List subclasses were compared by identity only: the count went up once, while tracing, and
    # the compiled calls left it alone.
    with pytest.raises(ThunderNotImplementedError, match=r"the contents of closure variable 'state' changed"):
        thunder_rs.jit(_counts(_Log([0])))(torch.ones(2))


@pytest.mark.parametrize(
    "make", [_counter, lambda: collections.defaultdict(int), lambda: collections.OrderedDict(calls=0)]
)
def test_a_standard_dict_subclass_a_closure_holds_changed_by_the_program_counts_as_eager(make):
    # Counter, defaultdict and OrderedDict were refused (their items were not replayed; restoring
    # a Counter's with ``update`` added counts): their item writes are made again by every call.
    state, eager_state = make(), make()
    jitted, eager = thunder_rs.jit(_counts(state)), _counts(eager_state)
    for _ in range(3):
        torch.testing.assert_close(jitted(torch.ones(2)), eager(torch.ones(2)), rtol=0, atol=0)
    assert type(state) is type(eager_state) and list(state.items()) == list(eager_state.items())


class _Log(list):
    pass
