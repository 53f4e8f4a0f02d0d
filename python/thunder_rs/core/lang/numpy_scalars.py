"""NumPy scalars in torch calls, as torch's argument parser takes them.

torch reads a NumPy scalar where it takes a number as the Python number of its value: an
``np.float32`` or ``np.float16`` is a float (a wrapped number: ``bf16_tensor * np.float32(0.5)``
stays bfloat16, ``int_tensor * np.float16(2)`` is float32), an ``np.int64`` an int (a size in
``x.view(np.int64(2), -1)``), an ``np.bool_`` a float (``torch.full((2,), np.bool_(True))`` is
float32), an ``np.complex64`` a complex. A traced call hands ltorch those numbers
(``as_python``); the calls that make a tensor from data (``torch.tensor(np.float16(1))`` is
float16) keep the scalar, as eager's do. A NumPy scalar argument is keyed by its type and the
bits of its value (``state.guards.freeze``): each value compiles once.

An ``np.float64`` argument is a Python float to its arithmetic as well (a ``float`` subclass whose
operations round as Python's), so it is a float argument like a float (``acquisition.float_args``):
once seen to change, the next compile takes it as a float input, a ``SymFloat`` that answers as a
``numpy.float64`` (``SymFloat.numpy``), and every value hits that entry (keyed ``(numpy.float64,
None)``: a Python float there is another key). ``np.float32`` and ``np.float16`` are float inputs
too, which torch reads as the floats they are (``x * s``, ``torch.full((4,), s)``); their own
arithmetic and comparisons round to their precision (``np.float32(0.1) == 0.1``), which the trace's
double operations would not: those are made on the value, the input specialised
(``SymFloat.numpy``).
"""

import numpy
import torch

from thunder_rs.core.lang.symfloat import SymFloat

#: NumPy's scalar types, each with the Python type torch reads its value as.
PYTHON_TYPE: dict[type, type] = {
    **{t: float for t in (numpy.float16, numpy.float32, numpy.float64, numpy.longdouble, numpy.bool_)},
    **{t: int for t in numpy.sctypeDict.values() if isinstance(t, type) and issubclass(t, numpy.integer)},
    **{t: complex for t in (numpy.complex64, numpy.complex128, numpy.clongdouble)},
}

#: Calls that make a tensor from data: they read a NumPy scalar's dtype, as eager's do.
KEEPS_SCALARS = frozenset({torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor})


def _has_scalar(values) -> bool:
    for x in values:
        kind = type(x)
        if kind in PYTHON_TYPE or (kind in (list, tuple) and any(type(y) in PYTHON_TYPE for y in x)):
            return True
    return False


def _python(x):
    kind = type(x)
    if kind in (list, tuple):
        return kind(map(_python, x))
    convert = PYTHON_TYPE.get(kind)
    return x if convert is None else convert(x)


def _kept(x):
    return x.value() if type(x) is SymFloat and x.numpy else x


def as_python(func, args, kwargs) -> tuple:
    """``(args, kwargs)`` of a torch call with NumPy scalars (also in a list or tuple, a size) the
    Python numbers torch reads them as; a call making a tensor from data keeps them, and takes a
    ``numpy.float64`` float input's value (``torch.tensor(s)`` is float64, specialised)."""
    if func in KEEPS_SCALARS:
        return tuple(map(_kept, args)), {k: _kept(v) for k, v in kwargs.items()}
    if not (_has_scalar(args) or (kwargs and _has_scalar(kwargs.values()))):
        return args, kwargs
    return tuple(map(_python, args)), {k: _python(v) for k, v in kwargs.items()}
