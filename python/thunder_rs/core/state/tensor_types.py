"""``type(x)`` of a traced tensor, compared or read from, found in the program's bytecode.

While traced, a tensor is a ``TensorProxy``: ``isinstance`` and ``x.__class__`` answer as for a
tensor, but ``type(x)`` is the proxy's own class, so ``type(x) is torch.Tensor``, ``type(p) ==
nn.Parameter``, ``type(x) in (torch.Tensor, ...)`` or ``type(x).__name__`` took another path (or
made other text) than eager's on every call, silently. A proxy cannot be of eager's class, so
where a ``type`` call of a chain of a local (``type_reads.TypeCall``) is a traced tensor when the
code is entered, what the code does next with the class is read from its bytecode
(``type_use``): a comparison (``is``, ``==``, ``in`` and their negations) with classes it can
read (globals, locals, constants, their attributes, tuples, lists and sets of them) fails the
compile naming the line only where eager's answer differs from the proxy's (``type(x) is
np.ndarray`` answers False in both, and runs); an attribute of the class (``__name__``) fails
unless the text only builds an exception's message that a ``raise`` right after it raises (a path
that runs only when the check before it fails). Not seen: what ``type_reads`` does not see, a
class kept in a variable and compared later, a table keyed by the class.
"""

import builtins
import types
from typing import NamedTuple

import torch

from thunder_rs.core.base.proxies import TensorProxy
from thunder_rs.core.state.guards import attributes_of
from thunder_rs.errors import ThunderNotImplementedError

_COMPARISONS = frozenset({"IS_OP", "COMPARE_OP", "CONTAINS_OP"})
_ROOTS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CONST"})
_BUILDS = frozenset({"BUILD_TUPLE", "BUILD_LIST", "BUILD_SET"})
#: What may stand between reading the class's attribute and the ``raise`` of the message it builds.
_MESSAGE = frozenset(
    {
        "CACHE",
        "LOAD_CONST",
        "LOAD_FAST",
        "LOAD_DEREF",
        "LOAD_GLOBAL",
        "LOAD_ATTR",
        "LOAD_METHOD",
        "FORMAT_VALUE",
        "BUILD_STRING",
        "BINARY_OP",
        "PRECALL",
        "CALL",
        "KW_NAMES",
    }
)
_UNKNOWN = object()


class TypeUse(NamedTuple):
    """What the code does with the class a ``type`` call returns: ``kind`` "compare" (``op`` the
    comparison's name, ``operand`` the instructions that load the other side) or "attribute"
    (``op`` its name; ``message`` when the text is raised right after)."""

    kind: str
    op: str
    operand: tuple = ()
    message: bool = False


def type_use(listed: list, i: int, c: int) -> TypeUse | None:
    """The use of the class that the call at ``c`` of the ``type`` loaded at ``i`` returns; None
    when it is none of those ``TypeUse`` tells."""
    after = listed[c + 1] if c + 1 < len(listed) else None
    if after is None:
        return None
    if after.opname in ("LOAD_ATTR", "LOAD_METHOD"):
        j = c + 2
        while j < len(listed) and listed[j].opname in _MESSAGE:
            j += 1
        raised = j < len(listed) and listed[j].opname == "RAISE_VARARGS"
        return TypeUse("attribute", str(after.argval), message=raised)
    if after.opname in _COMPARISONS:  # (``torch.Tensor is type(x)``: the other side was loaded first)
        j = i - 1
        while j > 0 and listed[j].opname == "LOAD_ATTR":
            j -= 1
        operand = tuple(listed[j:i]) if j >= 0 and listed[j].opname in _ROOTS else ()
        return TypeUse("compare", _op_name(after), operand)
    j = c + 1
    while j < len(listed) and listed[j].opname not in _COMPARISONS:
        if listed[j].opname not in _ROOTS and listed[j].opname not in _BUILDS and listed[j].opname != "LOAD_ATTR":
            return None
        j += 1
    return TypeUse("compare", _op_name(listed[j]), tuple(listed[c + 1 : j])) if j < len(listed) else None


def _op_name(ins) -> str:
    if ins.opname == "IS_OP":
        return "is not" if ins.arg else "is"
    if ins.opname == "CONTAINS_OP":
        return "not in" if ins.arg else "in"
    return str(ins.argval)  # (``COMPARE_OP``'s: ``==``, ``!=``, ``<``...)


def check_tensor_type(proxy: TensorProxy, use: TypeUse, chain: str, local: dict, globals_: dict, site: str) -> None:
    """Fails naming ``site`` where ``use`` of ``type()`` of the traced tensor ``proxy`` (the
    program's ``chain``) would answer otherwise than eager's (see the module doc)."""
    eager = _eager_class(proxy)
    if use.kind == "attribute":
        if use.message or (eager is not None and _attribute(eager, use.op) == _attribute(TensorProxy, use.op)):
            return
        construct = f"type({chain}).{use.op}"
    else:
        if use.op not in ("is", "is not", "==", "!=", "in", "not in"):
            return
        classes = _classes(_evaluate(use.operand, local, globals_))
        if classes is not None and not any(
            c is eager if eager is not None else isinstance(c, type) and issubclass(c, torch.Tensor) for c in classes
        ):
            return  # eager's answer is the proxy's (``type(x) is np.ndarray``)
        construct = f"type({chain}) {use.op} {_text(use.operand)}"
    known = f"{eager.__module__}.{eager.__qualname__}" if eager is not None else "its class (torch.Tensor, ...)"
    raise ThunderNotImplementedError(
        f"thunder_rs.jit: {construct} at {site}: type() of a tensor is {known} in eager, which the trace's "
        "stand-in for the tensor cannot be, so the program would take another path than eager's (or make "
        f"other text); decide outside the jitted function, or tell tensors from other values with isinstance({chain}, "
        "torch.Tensor)"
    )


def _eager_class(proxy: TensorProxy) -> type | None:
    """The class of the tensor ``proxy`` stands for in eager: a tensor the trace computed is a
    ``torch.Tensor``, a parameter or captured tensor is its own; None for an argument's."""
    source = proxy._source
    if source is None and proxy._held is None and proxy._input_vid is None:
        return torch.Tensor
    if callable(source):
        tensor = source()
        return type(tensor) if tensor is not None else None
    return None


def _attribute(cls: type, name: str):
    return getattr(cls, name, _UNKNOWN)


def _evaluate(operand: tuple, local: dict, globals_: dict):
    """The value the instructions ``operand`` load (roots, attributes, tuples, lists and sets of
    them), or ``_UNKNOWN``."""
    stack: list = []
    try:
        for ins in operand:
            op = ins.opname
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                stack.append(globals_.get(ins.argval, getattr(builtins, str(ins.argval), _UNKNOWN)))
            elif op == "LOAD_CONST":
                stack.append(ins.argval)
            elif op in _ROOTS:
                stack.append(local.get(ins.argval, _UNKNOWN))
            elif op == "LOAD_ATTR":
                stack.append(_attribute_of(stack.pop(), ins.argval))
            elif op in _BUILDS:
                items = stack[len(stack) - ins.arg :] if ins.arg else []
                del stack[len(stack) - len(items) :]
                stack.append(tuple(items))
            else:
                return _UNKNOWN
    except Exception:  # noqa: BLE001 (an operand read otherwise than it can: unknown)
        return _UNKNOWN
    return stack[0] if len(stack) == 1 else _UNKNOWN


def _text(operand: tuple) -> str:
    """The program's text of the instructions ``operand`` (``torch.Tensor``, ``(A, B)``), ``...``
    for what ``_evaluate`` does not read."""
    stack: list = []
    for ins in operand:
        if ins.opname == "LOAD_CONST":
            stack.append(repr(ins.argval))
        elif ins.opname in _ROOTS:
            stack.append(str(ins.argval))
        elif ins.opname == "LOAD_ATTR" and stack:
            stack.append(f"{stack.pop()}.{ins.argval}")
        elif ins.opname in _BUILDS and ins.arg is not None and len(stack) >= ins.arg:
            items = [stack.pop() for _ in range(ins.arg)][::-1]
            left, right = {"BUILD_TUPLE": ("(", ")"), "BUILD_LIST": ("[", "]")}.get(ins.opname, ("{", "}"))
            stack.append(f"{left}{', '.join(items)}{right}")
        else:
            return "..."
    return stack[0] if len(stack) == 1 else "..."


def _attribute_of(value, name: str):
    """``value.name`` where reading it runs none of the program's code: a module's or a class's
    attribute, an instance's from its dict or slots."""
    if value is _UNKNOWN:
        return value
    if isinstance(value, (types.ModuleType, type)):
        return getattr(value, name, _UNKNOWN)
    attributes = attributes_of(value)
    return attributes.get(name, _UNKNOWN) if attributes is not None else _UNKNOWN


def _classes(value) -> tuple | None:
    """The objects a comparison with ``value`` may find equal (it, or the items of a tuple, list,
    set or a dict's keys); None when it is not known."""
    if value is _UNKNOWN:
        return None
    if type(value) in (tuple, list, set, frozenset):
        return tuple(value) if all(v is not _UNKNOWN for v in value) else None
    if type(value) is dict:
        return tuple(value)
    return (value,)
