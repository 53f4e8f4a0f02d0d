"""How the stand-in ``fake_nvfuser_direct`` binds ``fd.execute``'s inputs and picks its device, as
nvFuser does (NVIDIA/Fuser 81c4b22):

- errors are nvFuser's ``NVF_CHECK``/``NVF_ERROR`` failures: ``nvfError`` derives from
  ``std::exception`` and the bindings register no translator for it, so pybind11 raises a
  ``RuntimeError`` whose message starts ``Expected <condition> . `` (csrc/exceptions.h); the
  Python-level checks of ``nvfuser_direct/__init__.py`` are ``assert``s (``AssertionError``) and an
  empty definition a ``NotImplementedError``;
- a scalar input binds to a Python number of a compatible dtype (``hasCompatibleDataType``,
  csrc/type.h: both integral, both floating, or equal; a Python float is a Double, a bool a Bool),
  a tensor input to a tensor of its rank and dtype (``validateValWithConcreteValue``,
  csrc/expr_evaluator.cpp) whose constant extents are its sizes (``bind_``), whose expanded
  broadcasts have stride 0 where their size is not 1 (``bindTensorDomain``) and whose contiguous
  dims have the strides contiguity implies where their size is over 1
  (``validateAllocationSizesAndStrides``, csrc/tensor_metadata.cpp). A symbolic (-1) dim that is
  not a broadcast binds to any extent, 1 included: a size-1 dim's stride is never checked; a
  symbolic dim whose contiguity is None is a broadcast, expanded to the symbolic extent
  (``getExpanded``, python_utils.cpp), which binds to size 1, or to any size of stride 0;
- the device: ``fd.execute(inputs, device=...)`` takes an index, a ``torch.device`` or a string
  (``_get_device_index``: a CUDA one, or an ``AssertionError``); an index given is used as it is
  (``KernelArgumentHolder::setDeviceIndex``), else the tensor inputs' device, else device 0
  (``getCommonDeviceCUDA``, csrc/utils.cpp): a definition without tensor inputs makes its tensors
  on ``cuda:0`` unless told another.

The stand-in takes CPU tensors where nvFuser takes CUDA ones (``"nvfuser only supports cuda or meta
device"``): on the CPU it is its own GPU.
"""

import torch

from fake_nvfuser_promotion import PYTHON_TYPES, DataType


def nvf_check(ok: bool, condition: str, *message) -> None:
    """``NVF_CHECK(condition, message...)`` as the bindings raise it."""
    if not ok:
        raise RuntimeError(f"Expected {condition} . " + "".join(str(m) for m in message))


def nvf_error(ok: bool, condition: str, *message, at: str = "python/python_common/python_utils.cpp:233") -> None:
    """``NVF_ERROR(condition, message...)``: an internal assert's ``RuntimeError``, whose message
    starts with where it failed (``NVF_THROW``, csrc/exceptions.h)."""
    if not ok:
        raise RuntimeError(
            f" INTERNAL ASSERT FAILED at /workspace/Fuser/{at}, please report a bug with repro script to NVFuser at "
            f"https://github.com/NVIDIA/Fuser/issues. \nExpected {condition} . " + "".join(str(m) for m in message)
        )


def _name(dtype: torch.dtype) -> str:
    return DataType(dtype).name


def _kind(dtype):
    """A dtype's class for ``isCompatibleDataType``: floating, complex, bool or integral."""
    return "float" if dtype.is_floating_point else "complex" if dtype.is_complex else dtype == torch.bool


def _bind_scalar(spec: DataType, arg, i: int) -> None:
    where = f"input {i}, "
    if isinstance(arg, torch.Tensor):
        nvf_check(
            False,
            "!concrete_value.is<at::Tensor>()",
            f"Expected {where}d{i}, to be a scalar but got {_name(arg.dtype)} tensor of rank {arg.ndim}",
        )
    got = torch.bool if isinstance(arg, bool) else PYTHON_TYPES[type(arg)]
    nvf_check(
        _kind(got) == _kind(spec.value),
        "hasCompatibleDataType(concrete_value, value->dtype())",
        f"Scalar value {arg} is not compatible with the expected data type: {spec.name}.",
    )


def _bind_tensor(spec, arg, i: int) -> None:
    shape, contiguity, dtype, stride_order = spec
    where = f"input {i}, T{i}"
    nvf_check(
        isinstance(arg, torch.Tensor),
        "concrete_value.is<at::Tensor>()",
        f"Expected {where}, to be an at::Tensor but got scalar {arg}",
    )
    nvf_check(
        arg.ndim == len(shape),
        "t.dim() == expect_dim",
        f"Expected {where}, to be bound to a tensor of rank {len(shape)}, but got a tensor of rank {arg.ndim}",
    )
    nvf_check(
        arg.dtype == dtype.value,
        "(value->dtype() == DataType::Index && (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt)) || "
        "(t.scalar_type() == data_type_to_aten(value->dtype()))",
        f"Expected {where}, to be bound to a tensor of dtype {dtype.name}, "
        f"but got a tensor of dtype {_name(arg.dtype)}",
    )
    rank = len(shape)
    # Logical dim d is allocated at rank - 1 - stride_order[d]; contiguity is in allocation order.
    at = [rank - 1 - stride_order[d] if stride_order else d for d in range(rank)]
    for d, s in enumerate(shape):
        broadcast = contiguity[at[d]] is None
        size, stride = arg.shape[d], arg.stride(d)
        if broadcast and s != 1:  # expanded (getExpanded): size 1, or stride 0
            nvf_check(
                size == 1 or stride == 0,
                "logical_sizes[i] == 1 || t.stride(i) == 0",
                f"IterDomain bS{d} in {where} has expanded extent but input tensor has size {size} and stride "
                f"{stride} in dimension {d}",
            )
        elif s >= 0 and s != size:
            # A constant extent (1 for a broadcast: the stand-in checks it too, where nvFuser binds 1).
            nvf_check(False, "value->value() == concrete_value", f"Tried to bind to a constant value: {s} as {size}")
    expected = 1
    for p in reversed(range(rank)):
        d = at.index(p)
        size, stride = arg.shape[d], arg.stride(d)
        if contiguity[p] is None or size <= 1:
            continue
        nvf_check(
            not contiguity[p] or stride == expected,
            "(stride) == (expected_stride_if_contiguous)",
            f"Found {stride} vs {expected}. TensorView {where}'s stride mismatch with contiguity info. "
            f": sizes: {list(arg.shape)}: strides: {list(arg.stride())}; contiguity: {contiguity}; dim: {p}",
        )
        expected = stride * size


def bind(spec, arg, i: int) -> None:
    """Binds input ``i`` (a scalar's ``DataType`` or a tensor's define_tensor ``spec``) to ``arg``."""
    if isinstance(spec, DataType):
        _bind_scalar(spec, arg, i)
    else:
        _bind_tensor(spec, arg, i)


def device_index(device) -> int | None:
    """``FusionDefinition._get_device_index``: an int or None as it is, else a CUDA device's index."""
    if device is None or isinstance(device, int):
        return device
    device = torch.device(device)
    assert device.type == "cuda", "If device argument is passed it must be a CUDA device"
    return device.index


def execution_device(inputs, index: int | None):
    """The device a definition's tensors are made on: the index given (``from_pyiterable`` refuses
    one over 255), else the tensor inputs' device, else device 0. On the CPU, the stand-in's
    ``cuda:i`` is the CPU unless CUDA tensors can be made (fake ones, under ``FakeTensorMode``)."""
    nvf_check(index is None or index < 256, "device.value() < 256", "Maximum device index is 255")
    devices = [a.device for a in inputs if isinstance(a, torch.Tensor)]
    if index is None and devices:
        return devices[0]
    cuda = torch.device("cuda", 0 if index is None else index)
    if devices and devices[0].type != "cuda":
        return devices[0]  # CPU tensors: the stand-in's GPU
    return cuda if devices or _cuda_tensors_can_be_made() else torch.device("cpu")


def _cuda_tensors_can_be_made() -> bool:
    from torch._guards import detect_fake_mode  # noqa: PLC0415

    return torch.cuda.is_available() or detect_fake_mode() is not None
