"""``torch.autograd.functional``'s ``vjp``, ``jvp``, ``vhp``, ``hvp``, ``jacobian`` and ``hessian``
called while a program is traced: computed by the ``torch.func`` transforms thunder_rs traces
(``core.lang.traced_grads``, ``functorch_calls``), which eager's compute with
``torch.autograd.grad`` (refused while traced: the program differentiates inside itself). Each
returns eager's structure (a tensor or tuples, as the inputs and outputs were given). With
``create_graph=False`` the results are detached, as eager's (but a forward-mode jacobian's, which
eager leaves attached); with ``create_graph=True`` they carry the program's gradients. Unused
inputs get zeros, as eager's with ``strict=False``; eager's own argument checks (``_as_tuple``,
``_validate_v``, a ``v`` left out, a hessian's single element) run as they do. ``strict=True``
runs eager's function (whose ``torch.autograd.grad`` is refused naming the line): its checks ask
autograd which outputs depend on which inputs.
"""

import torch
from torch.autograd import functional as eager

#: eager's functions, which ``strict=True`` (and what eager refuses before differentiating) runs
EAGER = {name: getattr(eager, name) for name in ("vjp", "jvp", "vhp", "hvp", "jacobian", "hessian")}


def _post(tensors: tuple, create_graph: bool) -> tuple:
    return tuple(t if create_graph else t.detach() for t in tensors)


def _v_or_ones(v, others: tuple, is_tuple: bool, name: str, what: str) -> tuple:
    if v is not None:
        _, v = eager._as_tuple(v, "v", name)
        eager._validate_v(v, others, is_tuple)
        return v
    if len(others) != 1 or others[0].nelement() != 1:
        raise RuntimeError(f"The vector v can only be None if {what} is a single Tensor with a single element.")
    return (torch.ones_like(others[0]),)


def vjp(func, inputs, v=None, create_graph=False, strict=False):
    if strict:
        return EAGER["vjp"](func, inputs, v, create_graph, strict)
    is_inputs_tuple, inputs = eager._as_tuple(inputs, "inputs", "vjp")
    with torch.enable_grad():
        out, pull = torch.func.vjp(func, *inputs)
    is_outputs_tuple, outputs = eager._as_tuple(out, "outputs of the user-provided function", "vjp")
    v = _v_or_ones(v, outputs, is_outputs_tuple, "vjp", "the user-provided function returns")
    grads = pull(v if is_outputs_tuple else v[0])
    return (
        eager._tuple_postprocess(_post(outputs, create_graph), is_outputs_tuple),
        eager._tuple_postprocess(_post(tuple(grads), create_graph), is_inputs_tuple),
    )


def jvp(func, inputs, v=None, create_graph=False, strict=False):
    if strict:
        return EAGER["jvp"](func, inputs, v, create_graph, strict)
    is_inputs_tuple, inputs = eager._as_tuple(inputs, "inputs", "jvp")
    v = _v_or_ones(v, inputs, is_inputs_tuple, "jvp", "the input to the user-provided function")
    out, tangents = torch.func.jvp(func, inputs, v)
    is_outputs_tuple, outputs = eager._as_tuple(out, "outputs of the user-provided function", "jvp")
    tangents = tangents if is_outputs_tuple else (tangents,)
    return (
        eager._tuple_postprocess(_post(outputs, create_graph), is_outputs_tuple),
        eager._tuple_postprocess(_post(tuple(tangents), create_graph), is_outputs_tuple),
    )


def _scalar(func, name: str, with_output: bool = False):
    """``func`` checked as eager's hessian/hvp/vhp check it (a single Tensor of one element), as
    a 0-dim tensor (and the output as it was, ``with_output``)."""

    def single(*xs):
        out = func(*xs)
        is_tuple, _ = eager._as_tuple(out, "outputs of the user-provided function", name)
        if is_tuple or not isinstance(out, torch.Tensor):
            raise RuntimeError(f"The function given to {name} should return a single Tensor")
        if out.nelement() != 1:
            raise RuntimeError(f"The Tensor returned by the function given to {name} should contain a single element")
        return (out.reshape(()), out) if with_output else out.reshape(())

    return single


def _gradient_and_value(func, count: int, name: str):
    scalar = _scalar(func, name, with_output=True)

    def gradient(*xs):
        grads, (_, out) = torch.func.grad_and_value(scalar, argnums=tuple(range(count)), has_aux=True)(*xs)
        return grads, out

    return gradient


def _second_order(name: str, func, inputs, v, create_graph: bool, strict: bool):
    if strict:
        return EAGER[name](func, inputs, v, create_graph, strict)
    is_inputs_tuple, inputs = eager._as_tuple(inputs, "inputs", name)
    v = _v_or_ones(v, inputs, is_inputs_tuple, name, "the input to the user-provided function")
    gradient = _gradient_and_value(func, len(inputs), name)
    with torch.enable_grad():
        if name == "hvp":
            _, product, value = torch.func.jvp(gradient, inputs, v, has_aux=True)  # type: ignore[misc]
        else:
            _, pull, value = torch.func.vjp(gradient, *inputs, has_aux=True)  # type: ignore[misc]
            product = pull(v)
    return (
        _post((value,), create_graph)[0],
        eager._tuple_postprocess(_post(tuple(product), create_graph), is_inputs_tuple),
    )


def vhp(func, inputs, v=None, create_graph=False, strict=False):
    return _second_order("vhp", func, inputs, v, create_graph, strict)


def hvp(func, inputs, v=None, create_graph=False, strict=False):
    return _second_order("hvp", func, inputs, v, create_graph, strict)


def _transform(strategy: str):
    return torch.func.jacfwd if strategy == "forward-mode" else torch.func.jacrev


def jacobian(func, inputs, create_graph=False, strict=False, vectorize=False, strategy="reverse-mode"):
    forward = strategy == "forward-mode"
    if strict or strategy not in ("forward-mode", "reverse-mode") or forward and (create_graph or not vectorize):
        return EAGER["jacobian"](func, inputs, create_graph, strict, vectorize, strategy)  # (eager's errors)
    is_inputs_tuple, inputs = eager._as_tuple(inputs, "inputs", "jacobian")
    found: list = []

    def noting(*xs):
        out = func(*xs)
        found.append(eager._as_tuple(out, "outputs of the user-provided function", "jacobian")[0])
        return out

    with torch.enable_grad():
        jac = _transform(strategy)(noting, argnums=tuple(range(len(inputs))))(*inputs)
    rows = jac if found[0] else (jac,)
    if forward:  # (eager's forward mode: not detached, lists of lists)
        return eager._tuple_postprocess([list(row) for row in rows], (found[0], is_inputs_tuple))
    res = tuple(_post(tuple(row), create_graph) for row in rows)
    return eager._tuple_postprocess(res, (found[0], is_inputs_tuple))


def hessian(func, inputs, create_graph=False, strict=False, vectorize=False, outer_jacobian_strategy="reverse-mode"):
    if strict or outer_jacobian_strategy not in ("forward-mode", "reverse-mode"):
        return EAGER["hessian"](func, inputs, create_graph, strict, vectorize, outer_jacobian_strategy)
    if outer_jacobian_strategy == "forward-mode" and (create_graph or not vectorize):
        return EAGER["hessian"](func, inputs, create_graph, strict, vectorize, outer_jacobian_strategy)
    is_inputs_tuple, inputs = eager._as_tuple(inputs, "inputs", "hessian")
    argnums = tuple(range(len(inputs)))
    scalar = _scalar(func, "hessian")
    with torch.enable_grad():
        hess = _transform(outer_jacobian_strategy)(torch.func.jacrev(scalar, argnums=argnums), argnums=argnums)(*inputs)
    res = tuple(_post(tuple(row), create_graph) for row in hess)
    return eager._tuple_postprocess(res, (is_inputs_tuple, is_inputs_tuple))


#: What tracing sets in ``torch.autograd.functional`` (``torch_overrides``).
OVERRIDES: dict[tuple[object, str], object] = {
    (eager, name): fn
    for name, fn in (
        ("vjp", vjp),
        ("jvp", jvp),
        ("vhp", vhp),
        ("hvp", hvp),
        ("jacobian", jacobian),
        ("hessian", hessian),
    )
}
