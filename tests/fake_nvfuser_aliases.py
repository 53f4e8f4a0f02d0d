"""Outputs aliased to inputs in the stand-in ``fake_nvfuser_direct``, as nvFuser's (NVIDIA/Fuser 81c4b22):

- ``fd.add_output(output, alias_input)`` (python_direct/runtime.cpp:148-169, the second overload of
  ``Fusion.add_output``, which ``FusionDefinition.add_output`` forwards its arguments to:
  nvfuser_direct/__init__.py:261-272) is ``Fusion::aliasOutputToInput(output, input, ReuseBuffer)``
  (csrc/fusion.cpp:929-976): the source must be a fusion input (an internal assert); an output that
  is a fusion input itself is first copied (``set``); both must be TensorViews; the input's
  allocation domain and contiguity are replayed on the output (``TransformReplay::selfReplay``,
  csrc/transform_replay.cpp:270-308: the ranks must agree, and the IterTypes, a broadcast with a
  broadcast). The output is hidden (not returned by ``execute``) unless it is a fusion output
  already; a later ``add_output(output)`` makes it visible, moved to the end (csrc/fusion.cpp:387-402).
- ``execute`` writes an aliased output into its input's memory (no version counter bump: the kernel
  writes it), and returns only the visible outputs (runtime/fusion_executor_cache.cpp:86-97), an
  aliased one as the input tensor itself (runtime/allocations.cpp:335-340).
- nvFuser checks neither dtypes nor extents here: an output of another dtype or of other extents
  would be written into the input's memory as it is. The stand-in refuses both, so that no test
  passes on what a GPU would compute wrongly.
- The pre-segmentation pass ``SegmentInplaceUpdate`` (preseg_passes/segment_inplace_update.cpp)
  puts the write of an aliased output into a copy kernel of its own (``segment_set`` + ``set``)
  where the output or its input is a producer or consumer of a broadcast, or the input has a
  broadcast concretized in the fusion: ``split_writes`` counts those, so that a count of launches
  sees the extra kernel.
"""

import fake_nvfuser_binding as binding
from fake_nvfuser_recording import TensorView, Val, _vals


def add_aliased_output(fd, output, alias_input) -> None:
    """``Fusion::aliasOutputToInput(output, alias_input, ReuseBuffer)`` on the stand-in ``fd``."""
    assert isinstance(output, Val) and output.fd is fd, "add_output: a value of this FusionDefinition"
    assert isinstance(alias_input, Val) and alias_input.fd is fd, "add_output: a value of this FusionDefinition"
    inputs = [v for v, _ in fd._inputs]
    binding.nvf_error(
        any(v is alias_input for v in inputs),
        "input->isFusionInput()",
        "alias source can only be a fusion input",
        at="csrc/fusion.cpp:947",
    )
    if any(v is output for v in inputs):  # (so that code generation writes the buffer)
        output = fd.ops.set(output)
    binding.nvf_check(
        isinstance(output, TensorView) and isinstance(alias_input, TensorView),
        "output->isA<TensorView>() && input->isA<TensorView>()",
        "aliasing output to input is only supported for TensorView",
    )
    binding.nvf_error(
        output.ndim == alias_input.ndim,
        "logical.size() == new_logical.size()",
        f"Expected {alias_input.ndim} == {output.ndim}",
        at="csrc/transform_replay.cpp:285",
    )
    spec = next(s for v, s in fd._inputs if v is alias_input)
    for d, (size, broadcast) in enumerate(zip(output.meta.shape, _broadcasts(spec))):
        binding.nvf_error(
            broadcast == (size == 1),
            "iter_types_match(id->getIterType(), new_id->getIterType())",
            f"Axes of dim {d} do not match for self replay.",
            at="csrc/transform_replay.cpp:302",
        )
    # (stricter than nvFuser, which writes whatever the output holds: see the module's doc)
    assert output.meta.dtype == alias_input.meta.dtype, (
        f"add_output: the stand-in refuses an alias of {output.meta.dtype} to an input of {alias_input.meta.dtype}"
    )
    assert output.meta.shape == alias_input.meta.shape, (
        f"add_output: the stand-in refuses an alias of extents {list(output.meta.shape)} to an input of "
        f"{list(alias_input.meta.shape)}"
    )
    visible = any(o is output for o in fd._outputs)
    fd.aliases.append((output, alias_input, visible))
    if not visible:
        fd._outputs.append(output)


def _broadcasts(spec) -> list:
    """Per logical dim of an input's ``define_tensor`` spec, whether it is a broadcast (extent 1)."""
    shape = spec[0]
    return [s == 1 for s in shape]


def add_visible_output(fd, output) -> None:
    """``Fusion::addOutput``: an output aliased but hidden is made visible, moved to the end."""
    for i, (out, source, visible) in enumerate(fd.aliases):
        if out is output and not visible:
            fd._outputs.remove(output)
            fd.aliases[i] = (out, source, True)
    fd._outputs.append(output)


def hidden(fd) -> set:
    """The slots of the aliased outputs ``execute`` does not return."""
    return {out.slot for out, _, visible in fd.aliases if not visible}


def write_aliases(fd, env: dict) -> None:
    """Writes each aliased output's value into its input's memory, as the kernel does: no version
    counter bump (``.data`` has a counter of its own)."""
    for out, source, _ in fd.aliases:
        target = env[source.slot]
        if env[out.slot] is not target:
            target.data.copy_(env[out.slot])
            env[out.slot] = target


def split_writes(fd) -> int:
    """How many aliased writes ``SegmentInplaceUpdate`` puts in copy kernels of their own."""
    if not fd.aliases:
        return 0
    visited: set = set()
    uses: dict = {}
    producers: dict = {}
    broadcasts = []
    for (_, args, made), name in zip(fd._ops, fd.recorded):
        operands = [v for v in _vals(args) if isinstance(v, TensorView)]
        for v in operands:
            uses.setdefault(v.slot, []).extend(made)
        for m in made:
            producers[m.slot] = operands
        if _is_broadcast(name, operands, made):
            broadcasts.append((operands[0], made[0]))
    for _, out in broadcasts:
        _walk(out, lambda v: uses.get(v.slot, ()), visited)
    for source, _ in broadcasts:
        _walk(source, lambda v: producers.get(v.slot, ()), visited)
    split = 0
    for out, source, _ in fd.aliases:
        spec = next(s for v, s in fd._inputs if v is source)
        if out.slot in visited or source.slot in visited or any(_broadcasts(spec)):
            split += 1
    return split


def _walk(start, step, visited: set) -> None:
    stack = [start]
    while stack:
        v = stack.pop()
        if v.slot not in visited:
            visited.add(v.slot)
            stack.extend(step(v))


def _is_broadcast(name: str, operands: list, made: tuple) -> bool:
    """Whether nvFuser's op makes a ``BroadcastOp``: a ``broadcast_in_dim`` that adds dims, a
    ``reshape`` that adds dims of extent 1 (``AnalyzeViewResult::broadcast_axes``), ``broadcast``."""
    if name == "broadcast":
        return True
    if name not in ("broadcast_in_dim", "reshape") or not operands or not made:
        return False
    before, after = operands[0].meta.shape, made[0].meta.shape
    if name == "broadcast_in_dim":
        return len(after) > len(before)
    return sum(s == 1 for s in after) > sum(s == 1 for s in before)
