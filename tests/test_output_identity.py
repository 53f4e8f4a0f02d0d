"""Every call returns tensors of its own, as eager does: a tensor the program builds from Python
values (``torch.tensor(0.)``) is made anew on every call, and two equal results are two tensors,
so a caller that writes to one output never changes another output or a later call's."""

import dataclasses

import pytest
import torch
import torch.nn as nn

import thunder_rs


def _returns_a_literal(x):
    aux = torch.tensor(0.0)
    return x.sum(), aux


def _returns_a_view_of_a_literal(x):
    return x * 2, torch.tensor([1.0, 2.0, 3.0, 4.0]).view(2, 2)


def _writes_into_a_literal(x):
    buf = torch.tensor([0.0, 0.0])
    buf[0] += x.sum()
    return buf


@pytest.mark.parametrize("program", [_returns_a_literal, _returns_a_view_of_a_literal, _writes_into_a_literal])
def test_a_literal_tensor_is_new_on_every_call(program):
    jprogram = thunder_rs.jit(program)
    x = torch.ones(3)
    seen = []
    for _ in range(3):
        outputs = jprogram(x)
        last = outputs[-1] if isinstance(outputs, tuple) else outputs
        seen.append(last.clone())
        last.add_(1.0)  # the caller accumulates into it, as into an aux loss
    expected = program(x)
    expected = expected[-1] if isinstance(expected, tuple) else expected
    for value in seen:
        torch.testing.assert_close(value, expected)


def test_a_literal_kept_as_a_module_attribute_is_new_on_every_call():
    class Aux(nn.Module):
        def forward(self, x):
            self.aux = torch.tensor(0.0)
            return x * 2

    model = Aux()
    jmodel = thunder_rs.jit(model)
    values = []
    for _ in range(3):
        jmodel(torch.ones(2))
        model.aux += 1
        values.append(model.aux.item())
    assert values == [1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "program",
    [
        lambda x: (torch.zeros(2, 3), torch.zeros(2, 3)),
        lambda x: (x.new_zeros(3), x.new_zeros(3)),
        lambda x: (x * 2, x * 2),
        lambda x: (x.relu(), x.relu()),
        lambda x: (torch.full((3,), 1.5), torch.ones(3) * 1.5, torch.full((3,), 1.5)),
    ],
)
def test_equal_results_are_separate_tensors(program):
    outputs = thunder_rs.jit(program)(torch.ones(3))
    expected = program(torch.ones(3))
    outputs[0].zero_()
    for out, ref in zip(outputs[1:], expected[1:]):
        torch.testing.assert_close(out, ref)
    assert len({o.data_ptr() for o in outputs}) == len(outputs)


def test_a_literal_read_by_the_program_keeps_its_value():
    def program(x):
        return x * torch.tensor([1.0, 2.0, 3.0])

    jprogram = thunder_rs.jit(program)
    for _ in range(2):
        torch.testing.assert_close(jprogram(torch.ones(3)), program(torch.ones(3)))


@pytest.mark.parametrize(
    "program",
    [
        lambda x: torch.empty_like(x).copy_(x),
        lambda x: x.t().contiguous(),
        lambda x: torch.nn.functional.pad(x, (0, 0)),
        lambda x: x.roll(0, 0),
        lambda x: x[True],
    ],
)
def test_a_copy_eager_makes_is_a_copy_even_when_the_trace_computes_nothing(program):
    x = torch.zeros(2, 2)
    out = thunder_rs.jit(program)(x)
    expected = program(torch.zeros(2, 2))
    assert out.is_contiguous() == expected.is_contiguous()
    out.add_(1.0)
    assert torch.equal(x, torch.zeros(2, 2))


@pytest.mark.parametrize(
    "program",
    [
        lambda x: x.detach(),
        lambda x: x.view_as(x),
        lambda x: x[:],
        lambda x: x.view(-1),
        lambda x: x.contiguous(),
    ],
)
def test_a_view_or_the_input_itself_still_aliases_the_input(program):
    x = torch.zeros(4)
    thunder_rs.jit(program)(x).add_(1.0)
    assert torch.equal(x, torch.ones(4))


@pytest.mark.parametrize("make", [torch.as_tensor, torch.asarray])
def test_a_tensor_made_from_a_numpy_array_still_shares_its_memory(make):
    import numpy as np

    array = np.zeros(3, dtype=np.float32)

    def program(x):
        return x + 1, make(array)

    thunder_rs.jit(program)(torch.zeros(3))[1].add_(5.0)
    assert array.tolist() == [5.0, 5.0, 5.0]


def _cache_step(cache, new, pos: int):
    cache[pos] = new
    return cache[: pos + 1]


def test_a_view_of_a_written_input_is_a_view_of_the_callers_tensor():
    # A KV-cache step: the returned prefix aliases the cache, so a later step's write shows in it.
    cache, expected_cache = torch.zeros(3, 2), torch.zeros(3, 2)
    jstep = thunder_rs.jit(_cache_step)
    first, expected_first = jstep(cache, torch.ones(2), 0), _cache_step(expected_cache, torch.ones(2), 0)
    assert first.untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
    jstep(cache, torch.full((2,), 2.0), 1)
    _cache_step(expected_cache, torch.full((2,), 2.0), 1)
    first.mul_(10)
    expected_first.mul_(10)
    torch.testing.assert_close(cache, expected_cache)
    torch.testing.assert_close(first, expected_first)


@pytest.mark.parametrize(
    "view",
    [lambda x: x[:, 1], lambda x: x.t(), lambda x: x.view(4)[1:], lambda x: x[None]],
    ids=["column", "transpose", "flat_slice", "unsqueeze"],
)
def test_views_of_a_written_input_carry_gradients_as_in_eager(view):
    def program(x):
        x.mul_(2)
        return view(x)

    base, eager_base = (
        torch.randn(2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
        for _ in range(2)
    )
    x = base * 1
    out, expected = thunder_rs.jit(program)(x), program(eager_base * 1)
    torch.testing.assert_close(out, expected)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    g = torch.randn_like(expected)
    torch.testing.assert_close(torch.autograd.grad(out, base, g), torch.autograd.grad(expected, eager_base, g))


@dataclasses.dataclass
class _Result:
    logits: torch.Tensor
    info: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)


def test_containers_in_a_returned_object_are_new_on_every_call():
    def program(x):
        return _Result(x * 2, {"clipped": False})

    jprogram = thunder_rs.jit(program)
    first = jprogram(torch.ones(2))
    first.info["clipped"] = True
    first.notes.append("seen")
    second = jprogram(torch.ones(2))
    assert second.info == {"clipped": False} and second.notes == [] and second.info is not first.info


def test_a_tensor_made_from_a_numpy_array_reads_the_array_on_every_call():
    import numpy as np

    buffer = np.ones(2)

    def program(x):
        mask = torch.tensor(buffer)
        mask.mul_(2)  # eager's copy: the array is left as it is
        return x * mask, torch.tensor(buffer, dtype=torch.float32)

    jprogram = thunder_rs.jit(program)
    x = torch.ones(2, dtype=torch.float64)
    for value in (1.0, 7.0):
        buffer[:] = value  # refilled in place between calls
        out, expected = jprogram(x), program(x)
        torch.testing.assert_close(out, expected)
        assert buffer.tolist() == [value, value]


def _aliasing(outs: tuple) -> list:
    """Per pair of outputs: whether they share memory, and whether the first is the second's view."""
    memory = [o.untyped_storage().data_ptr() for o in outs]
    return [[(memory[i] == memory[j], a._base is b) for j, b in enumerate(outs)] for i, a in enumerate(outs)]


def _shares_one_intermediate(x, w):
    h = x @ w
    return h[:, 0], h.t()


def _returns_an_intermediate_and_its_view(x, w):
    h = x @ w
    return h.view(2, 3, 2).permute(0, 2, 1), h


def _one_view_twice(x, w):
    v, u = (x @ w).t(), x.view(3, 6).t()
    return v, v, u, u


@pytest.mark.parametrize(
    "program, write",
    [
        (lambda x, w: (x @ w).view(2, 3, 2).permute(0, 2, 1), lambda outs: outs[0].div_(2)),
        (_shares_one_intermediate, lambda outs: outs[0].mul_(3)),
        (_shares_one_intermediate, lambda outs: outs[1].add_(1)),
        (_returns_an_intermediate_and_its_view, lambda outs: outs[0].div_(2)),
        (lambda x, w: (x.view(3, 6).t(), x.sum() * w.sum()), lambda outs: outs[0].mul_(2)),
        (lambda x, w: (x, (x * 2) @ w), lambda outs: outs[0].mul_(2)),
        (_one_view_twice, lambda outs: outs[0].mul_(2)),
        (lambda x, w: (x @ w).diagonal(), lambda outs: outs[0].mul_(3)),
        (lambda x, w: torch.diagonal((x @ w).t(), -1), lambda outs: outs[0].mul_(3)),
        (lambda x, w: (x @ w).unfold(0, 2, 2), lambda outs: outs[0].div_(2)),
    ],
    ids=[
        "permuted_view",
        "two_views_write_first",
        "two_views_write_second",
        "base_and_view",
        "input_view",
        "input",
        "one_view_twice",
        "diagonal",
        "diagonal_of_a_view",
        "unfold",
    ],
)
def test_returned_views_carry_in_place_writes_and_gradients_as_in_eager(program, write):
    # Returned by the training call's autograd.Function, a view of a tensor it computed (or of
    # an input, or the input itself) was the Function's own view, which torch refuses to write.
    w, eager_w = (torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).requires_grad_() for _ in range(2))
    x, eager_x = (torch.randn(6, 3, generator=torch.Generator().manual_seed(1)).requires_grad_() for _ in range(2))
    outs, expected = thunder_rs.jit(program)(x * 1, w), program(eager_x * 1, eager_w)
    outs, expected = (tuple(o) if isinstance(o, tuple) else (o,) for o in (outs, expected))
    write(outs)
    write(expected)
    for out, e in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, e)
        assert (out.stride(), out._is_view()) == (e.stride(), e._is_view())
    # Aliasing as eager's: which outputs share memory, which one is another's ``_base``, and
    # which are one tensor returned twice.
    assert _aliasing(outs) == _aliasing(expected)
    assert [a is b for a in outs for b in outs] == [a is b for a in expected for b in expected]
    weights = [torch.randn(e.shape, generator=torch.Generator().manual_seed(2)) for e in expected]
    sum((o * g).sum() for o, g in zip(outs, weights)).backward()
    sum((e * g).sum() for e, g in zip(expected, weights)).backward()
    torch.testing.assert_close(w.grad, eager_w.grad)
    torch.testing.assert_close(x.grad, eager_x.grad)


@pytest.mark.parametrize(
    "view",
    [torch.view_as_real, lambda z: z.real, lambda z: z.imag],
    ids=["view_as_real", "real", "imag"],
)
def test_returned_real_views_of_a_complex_intermediate_carry_writes_and_gradients_as_in_eager(view):
    """Eager's own ops compute complex values that carry gradients; their real views, returned,
    are taken again outside the call, so the caller can write them as eager's."""

    def program(x, w):
        h = x @ w
        return view(torch.complex(h, h * 2))

    w, eager_w = (torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).requires_grad_() for _ in range(2))
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    out, expected = thunder_rs.jit(program)(x, w), program(x, eager_w)
    out.mul_(3)
    expected.mul_(3)
    torch.testing.assert_close(out, expected)
    assert (out.stride(), out._is_view()) == (expected.stride(), expected._is_view())
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(w.grad, eager_w.grad)


@pytest.mark.parametrize(
    "program",
    [
        lambda x, w: (x @ w).unbind(1),
        lambda x, w: (x @ w).split(2)[1],
        lambda x, w: (x @ w).chunk(2, 1)[0].t(),
    ],
    ids=["unbind", "split", "view_of_a_chunk"],
)
def test_a_returned_view_of_a_multi_output_view_op_refuses_writes_as_eager(program):
    """Eager refuses in-place writes to the outputs of ``split``/``unbind`` (and views of them)
    that carry gradients: taken again of the trace's output, they are eager's."""
    w = torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).requires_grad_()
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    messages = []
    for fn in (program, thunder_rs.jit(program)):
        out = fn(x, w)
        with pytest.raises(RuntimeError) as error:
            (out[0] if isinstance(out, tuple) else out).mul_(2)
        messages.append(str(error.value))
    # (eager names the last view op; the trace's transposes are permutes)
    assert messages[1].partition(" is a view ")[2] == messages[0].partition(" is a view ")[2]
    assert messages[1].split(" of ")[0] == messages[0].split(" of ")[0]  # (which output)


def test_returned_views_of_symbolic_sizes_are_taken_at_each_calls_sizes():
    def program(x, w):
        h = x @ w
        return h.view(x.shape[0] // 2, 2, w.shape[1]).permute(0, 2, 1), h.t()

    jprogram = thunder_rs.jit(program)
    for n in (4, 6, 8):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
        w, eager_w = (torch.randn(3, 2, generator=torch.Generator().manual_seed(0)).requires_grad_() for _ in range(2))
        (view, t), (expected_view, expected_t) = jprogram(x, w), program(x, eager_w)
        view.div_(2)
        expected_view.div_(2)
        torch.testing.assert_close((view, t), (expected_view, expected_t))
        assert (view.stride(), t.stride()) == (expected_view.stride(), expected_t.stride())
        (view.sum() + (t * 2).sum()).backward()
        (expected_view.sum() + (expected_t * 2).sum()).backward()
        torch.testing.assert_close(w.grad, eager_w.grad)
    assert thunder_rs.compile_stats(jprogram).cache_misses == 2  # a constant-size compile, then a symbolic one


def test_a_view_made_inside_a_composite_of_its_own_intermediate_is_returned():
    """``tensordot(a, b, 0)`` returns a reshape of its matrix product, an intermediate of the
    composite that no top-level call of the trace reads: the trace cannot return it to take the
    view again outside the call. (Was: it returned it anyway, a name the execution trace never
    computed: NameError on the first call.) The output is the call's own, eager's values,
    strides and gradients."""

    def program(a, b):
        return torch.tensordot(a * 1.0, b, 0)

    a, b = torch.randn(2, 3, requires_grad=True), torch.randn(3, 4, requires_grad=True)
    out, expected = thunder_rs.jit(program)(a, b), program(a, b)
    torch.testing.assert_close(out, expected)
    assert out.stride() == expected.stride()
    cotangent = torch.randn(expected.shape)
    torch.testing.assert_close(
        torch.autograd.grad(out, (a, b), cotangent), torch.autograd.grad(expected, (a, b), cotangent)
    )
