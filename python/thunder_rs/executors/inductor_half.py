"""Python numbers meeting half-precision tensors in an Inductor region's graph, read as eager's
kernels read them.

Eager's add, sub, mul and div of a bfloat16 or float16 tensor and a Python number compute in
float32 and round the result to the half dtype; what differs by op, side and device is the number.
On CUDA the kernel reads it as a float32 on either side (``opmath_symmetric_gpu_kernel_with_scalars``).
On the CPU, mul and div read it as a float32 where it is the second operand (``iter.is_scalar(2)``:
``original_scalar_value<opmath_t>``); add and sub, and a number first, take it as TensorIterator
casts a wrapped number to the common dtype, rounded to the half dtype (``x + 0.1`` adds
0.10009765625 in bfloat16, ``x * 0.1`` multiplies by 0.1 in float32). Inductor's emulation of
eager's casts (``PRECISION_POLICY``) reads every such number one way, so each of these ops is
rewritten to say which: on the tensor converted to float32, with the number as eager reads it,
the result rounded to the half dtype.
"""

import torch

_HALF = (torch.float16, torch.bfloat16)


def _number_node(a) -> bool:
    """Whether ``a`` is a node of a graph computing a Python number (a float the graph takes as an
    input, ``inductor_floats``, or a size)."""
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), (torch.SymFloat, torch.SymInt))


def _read_in_float32(target, number_first: bool, device_type: str) -> bool:
    """Whether eager's kernel reads the number of ``target`` as a float32 (else: rounded to the
    tensor's half dtype)."""
    aten = torch.ops.aten
    return device_type == "cuda" or (target in (aten.mul.Tensor, aten.div.Tensor) and not number_first)


def _rounded(graph, number, dtype, device):
    """``number`` rounded to ``dtype`` as eager casts a wrapped number, as a float32 operand: a
    Python float for a constant (computed here by torch's own cast), a float32 0-d tensor of the
    graph for a number the graph computes."""
    if not isinstance(number, torch.fx.Node):
        return float(torch.tensor(number, dtype=dtype))
    aten, convert = torch.ops.aten, torch.ops.prims.convert_element_type.default
    half = graph.call_function(aten.scalar_tensor.default, (number,), {"dtype": dtype, "device": device})
    return graph.call_function(convert, (half, torch.float32))


def numbers_read_as_eager(graph):
    """``graph`` with each half tensor's add, sub, mul or div by a Python number computed as
    eager's kernel computes it (see the module doc). A rewritten op's result keeps the op's
    ``meta["val"]``, so that an op on it (``x * 1.1 * 1.3``) is rewritten too."""
    aten, convert = torch.ops.aten, torch.ops.prims.convert_element_type.default
    targets = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)
    rewritten = False
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in targets or node.kwargs or len(node.args) != 2:
            continue
        numbers = [type(a) in (int, float) or _number_node(a) for a in node.args]
        tensor = next((a for a, n in zip(node.args, numbers) if not n), None)
        val = getattr(tensor, "meta", {}).get("val")
        if sum(numbers) != 1 or not isinstance(val, torch.Tensor) or val.dtype not in _HALF:
            continue
        number = node.args[numbers.index(True)]
        with graph.graph.inserting_before(node):
            if not _read_in_float32(node.target, numbers[0], val.device.type):
                number = _rounded(graph.graph, number, val.dtype, val.device)
            wide = graph.graph.call_function(convert, (tensor, torch.float32))
            args = (number, wide) if numbers[0] else (wide, number)
            computed = graph.graph.call_function(node.target, args)
            rounded = graph.graph.call_function(convert, (computed, val.dtype))
        rounded.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(rounded)
        graph.graph.erase_node(node)
        rewritten = True
    if rewritten:
        graph.recompile()
    return graph
