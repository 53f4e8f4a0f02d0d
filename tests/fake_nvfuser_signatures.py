"""The call signatures of ``nvfuser_direct`` 0.2.36 (NVIDIA/Fuser 81c4b22, whose ``python/version.txt``
is 0.2.36), as its pybind11 bindings check them, for the stand-in ``fake_nvfuser_direct``: every
``fd.ops`` function it has, ``define_tensor`` and ``define_scalar`` take the overloads the real
module registers (``python/python_direct/ops.cpp``, ``ir.cpp``), by position and by their
``py::arg`` names, and refuse other calls with pybind11's ``TypeError`` ("incompatible function
arguments"). Within a matched overload, the shape sequences (``py::list`` or ``py::tuple``: one
type for all of an overload's sequences) are read as ``define_vector_fn`` reads them: each item an
int or a ``Val`` (else ``RuntimeError`` "Unsupported iterable object type for define_vector!"),
an int of a shape at least -1.

Parameter kinds, as pybind11's casters load them:

- ``TV``: a ``TensorView``; ``VAL``: any ``Val``;
- ``SV``: ``ScalarVariant`` (``std::variant<Val*, PolymorphicValue::VariantType>``): a ``Val``, or
  a Python number, ``None`` or ``torch.Tensor`` (a ``PolymorphicValue``); ``PV`` the latter alone;
- ``INT``: ``int64_t``: an int or bool, or what has ``__index__`` (never a float);
- ``BOOL``: ``bool``: with pybind11's conversions anything with ``__bool__`` but a sequence;
- ``INTS``: ``std::vector<int64_t>``: any sequence but ``str`` of ``INT``s;
- ``SEQ``: ``py::list`` or ``py::tuple`` (a ``torch.Size`` is a tuple);
- ``DTYPE``: a ``DataType``; ``TVS``: a sequence of ``TensorView``s; ``OPT_BOOLS``:
  ``std::vector<std::optional<bool>>``; a ``?`` suffix: ``None`` too (``std::optional``).
"""

import functools
import numbers
import operator

import torch

from fake_nvfuser_recording import TensorView, Val

_NO_DEFAULT = object()


def _is_val(x) -> bool:
    return isinstance(x, Val)


def _is_tv(x) -> bool:
    return isinstance(x, TensorView)


def _is_int(x) -> bool:
    return not isinstance(x, float) and (isinstance(x, int) or hasattr(type(x), "__index__")) and not _is_val(x)


def _is_pv(x) -> bool:
    return x is None or isinstance(x, (numbers.Number, torch.Tensor))


def _is_sequence(x) -> bool:
    return isinstance(x, (list, tuple)) or (
        hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, str)
    )


def _is_dtype(x) -> bool:
    from fake_nvfuser_promotion import DataType  # noqa: PLC0415

    return isinstance(x, DataType)


KINDS = {
    "TV": _is_tv,
    "VAL": _is_val,
    "SV": lambda x: _is_val(x) or _is_pv(x),
    "PV": _is_pv,
    "INT": _is_int,
    "BOOL": lambda x: x is None or isinstance(x, numbers.Number),
    "INTS": lambda x: _is_sequence(x) and all(_is_int(i) for i in x),
    "SEQ": lambda x: isinstance(x, (list, tuple)),
    "DTYPE": _is_dtype,
    "TVS": lambda x: _is_sequence(x) and all(_is_tv(t) for t in x),
    "OPT_BOOLS": lambda x: _is_sequence(x) and all(i is None or isinstance(i, numbers.Number) for i in x),
}


def _param(text: str):
    """``"name:KIND"``, ``"name:KIND=default"`` (a Python literal) or a positional-only ``"KIND"``."""
    name, _, kind = text.rpartition(":")
    kind, _, default = kind.partition("=")
    return name or None, kind, _NO_DEFAULT if not default else eval(default)  # noqa: S307 (our literals)


def _overload(*params: str):
    return tuple(_param(p) for p in params)


#: What pybind11's casters take without conversions (its first pass over the overloads): a
#: ``bool`` only ``True`` or ``False`` (``type_caster<bool>`` converts other numbers and None in
#: its second pass only), so ``define_tensor([2, 3], [3, 1])`` is the ``sizes, strides`` overload,
#: an int contiguity not being a ``std::optional<bool>`` before conversions.
STRICT = {
    "BOOL": lambda x: isinstance(x, bool),
    "OPT_BOOLS": lambda x: _is_sequence(x) and all(i is None or isinstance(i, bool) for i in x),
}


def _matches(kind: str, value, strict: bool = False) -> bool:
    if kind.endswith("?"):
        return value is None or _matches(kind[:-1], value, strict)
    return (STRICT if strict and kind in STRICT else KINDS)[kind](value)


def _bound(overload, args, kwargs, strict: bool = False):
    """The arguments a call gives, by parameter (defaults left out), or None where ``overload``
    does not take them: too many, an unknown or repeated keyword, a required one missing, one of
    another kind (without conversions where ``strict``), or sequences of two types where the
    overload's are one ``ShapeType``."""
    names = [name for name, _, _ in overload]
    if len(args) > len(overload) or set(kwargs) - set(names[len(args) :]) or None in kwargs:
        return None
    bound = {
        name if name is not None else i: (kind, value) for i, ((name, kind, _), value) in enumerate(zip(overload, args))
    }
    for name, kind, default in overload[len(args) :]:
        if name in kwargs:
            bound[name] = (kind, kwargs[name])
        elif default is _NO_DEFAULT:
            return None
    if not all(_matches(kind, value, strict) for kind, value in bound.values()):
        return None
    sequences = {isinstance(v, list) for kind, v in bound.values() if kind.rstrip("?") == "SEQ" and v is not None}
    return bound if len(sequences) <= 1 else None


def _describe(overload) -> str:
    return ", ".join(f"{name or f'arg{i}'}: {kind}" for i, (name, kind, _) in enumerate(overload))


def check_call(name: str, overloads, args, kwargs) -> int:
    """The index of the overload of ``name`` pybind11 calls with the call's arguments: the first
    that takes them without conversions, else the first that takes them with (its two passes).
    Raises pybind11's ``TypeError`` where none takes them, and ``define_vector_fn``'s
    ``RuntimeError`` for a shape sequence it cannot read."""
    for strict in (True, False):
        for index, overload in enumerate(overloads):
            bound = _bound(overload, args, kwargs, strict)
            if bound is not None:
                for param, (kind, value) in bound.items():
                    if kind.rstrip("?") == "SEQ" and value is not None:
                        _vector(value, shape_check=name in SHAPE_CHECKED and param in ("shape", "new_shape"))
                return index
    supported = "\n".join(f"    {i}. ({_describe(o)})" for i, o in enumerate(overloads, 1))
    invoked = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    raise TypeError(
        f"{name}(): incompatible function arguments. The following argument types are supported:\n"
        f"{supported}\n\nInvoked with: {invoked}"
    )


def _vector(values, shape_check: bool) -> None:
    """``define_vector_fn``: each item an int (at least -1 in a shape) or a ``Val``."""
    from fake_nvfuser_binding import nvf_check  # noqa: PLC0415

    for i, item in enumerate(values):
        if isinstance(item, int) and not _is_val(item):
            nvf_check(
                not shape_check or item >= -1,
                "!shape_check || int_value >= -1",
                f"The value {item} at index {i} was neither symbolic(-1), zero_element(0), broadcast(1), "
                "or static(>1).",
            )
        else:
            nvf_check(_is_val(item), "false", f"Unsupported iterable object type for define_vector! Index:{i}")


#: The ops whose shape is checked (``SequenceAsVector`` with ``shape_check``): not pads or slices.
SHAPE_CHECKED = {"broadcast_in_dim", "reshape", "full", "expand"}

_UNARY = (_overload("SV"), _overload("TV"))
_BINARY = (_overload("SV", "SV"),)
_REDUCTION = (
    _overload("arg:TV", "dtype:DTYPE=None"),
    _overload("arg:TV", "dim:INT", "keepdim:BOOL=False", "dtype:DTYPE=None"),
    _overload("arg:TV", "dims:INTS", "keepdim:BOOL=False", "dtype:DTYPE=None"),
)
_VARIANCE = (_overload("arg:TV", "dims:INTS", "correction:INT=1", "keepdim:BOOL=False"),)
_SCAN = (_overload("arg:TV", "dim:INT", "init:VAL?=None"),)
_INDEXING = (_overload("arg:TV", "index:TV", "dim:INT"),)

#: ops.cpp's overloads by name (``DataType.Null`` defaults stand as None: the stand-in's
#: reductions read None as Null).
OPS = {
    **dict.fromkeys(
        "abs acos acosh asin asinh atan atanh ceil cos cosh exp exp2 expm1 erf erfc erfinv erfcinv floor frac "
        "lgamma log log10 log1p log2 neg logical_not bitwise_not relu reciprocal round rsqrt set segment_set sign "
        "sigmoid signbit silu sin sinh sqrt tan tanh trunc isfinite isinf isnan isneginf isposinf isreal real "
        "imag".split(),
        _UNARY,
    ),
    **dict.fromkeys(
        "add atan2 div truediv fmod mul nextafter pow remainder sub minimum maximum mod eq ge gt le lt ne "
        "logical_and logical_or bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift "
        "logical_right_shift gcd".split(),
        _BINARY,
    ),
    "where": (_overload("SV", "SV", "SV"),),
    **dict.fromkeys(("max", "min", "prod", "sum"), _REDUCTION),
    "var": _VARIANCE,
    "var_mean": _VARIANCE,
    "welford": (_overload("arg:TV", "dims:INTS"),),
    "cumsum": _SCAN,
    "cumprod": _SCAN,
    "cast": (_overload("arg:TV", "dtype:DTYPE"), _overload("arg:SV", "dtype:DTYPE")),
    "broadcast_in_dim": (_overload("arg:TV", "shape:SEQ", "broadcast_dims:INTS"),),
    "reshape": (_overload("arg:TV", "new_shape:SEQ"),),
    "permute": (_overload("arg:TV", "dims:INTS"),),
    "squeeze": (_overload("arg:TV", "dims:INTS", "squeeze_expanded:BOOL=False"),),
    "slice": (
        _overload(
            "arg:TV", "start_indices:SEQ", "end_indices:SEQ", "strides:SEQ?=None", "manual_normalization:BOOL=False"
        ),
    ),
    "size": (_overload("arg:TV", "dim:INT"),),
    "shape": (_overload("TV"),),
    "stride_order": (_overload("arg:TV", "stride_order:INTS"),),
    "index_select": _INDEXING,
    "gather": _INDEXING,
    "take_along_axis": _INDEXING,
    "pad": (_overload("arg:TV", "pad_widths:SEQ", "value:SV=None"),),
    "cat": (_overload("tensors:TVS", "dim:INT=0", "manual_padding:BOOL=False"),),
    "iota": (_overload("length:SV", "start:SV=None", "step:SV=None", "dtype:DTYPE=None"),),
    "full": (_overload("shape:SEQ", "fill_value:SV", "dtype:DTYPE"),),
}

#: ir.cpp's ``define_tensor`` (three overloads) and ``define_scalar`` (symbolic first, then a constant).
DEFINE_TENSOR = (
    _overload("shape:INTS", "contiguity:OPT_BOOLS", "dtype:DTYPE=None", "is_cpu:BOOL=False", "stride_order:INTS=[]"),
    _overload("shape:INTS", "contiguity:BOOL=False", "dtype:DTYPE=None", "is_cpu:BOOL=False", "stride_order:INTS=[]"),
    _overload("sizes:INTS", "strides:INTS", "dtype:DTYPE=None", "static_sizes:BOOL=False", "is_cpu:BOOL=False"),
)
DEFINE_SCALAR = (_overload("dtype:DTYPE=None"), _overload("value:PV", "dtype:DTYPE?=None"))


def checked(name: str, fn, overloads=None):
    """``fn`` called only with arguments one of ``name``'s overloads takes."""
    overloads = OPS[name] if overloads is None else overloads

    @functools.wraps(fn)
    def call(*args, **kwargs):
        overload = overloads[check_call(name, overloads, args, kwargs)]
        return fn(*_converted(overload, args), **_converted(overload, kwargs))

    return call


#: What pybind11's casters hand the C++ function for a value they took: ``bool`` (None is False:
#: ``type_caster<bool>``'s conversion pass), ``int64_t`` (a bool is 1 or 0: ``PyLong_Check``).
_CONVERSIONS = {"BOOL": bool, "INT": operator.index, "INTS": lambda v: [operator.index(i) for i in v]}


def _converted(overload, given):
    """``given`` (positional arguments, or keyword ones) as the overload's C++ parameters receive them."""
    kinds = {name if name is not None else i: kind for i, (name, kind, _) in enumerate(overload)}
    kinds.update(enumerate(kind for _, kind, _ in overload))

    def convert(key, value):
        kind = kinds[key]
        conversion = _CONVERSIONS.get(kind.rstrip("?"))
        return value if conversion is None or (value is None and kind.endswith("?")) else conversion(value)

    if isinstance(given, dict):
        return {key: convert(key, value) for key, value in given.items()}
    return tuple(convert(i, value) for i, value in enumerate(given))


def enforce(ops) -> None:
    """Makes each function of the stand-in's ``ops`` take only the calls the real one takes; an op
    the stand-in has that 0.2.36 lacks is an error here."""
    names = [n for n in dir(ops) if not n.startswith("_")]
    missing = sorted(set(names) - set(OPS))
    assert not missing, f"the stand-in has ops nvfuser_direct 0.2.36 does not: {missing}"
    for name in names:
        setattr(ops, name, checked(name, getattr(ops, name)))
